//! Background work that repeats until shutdown. Every periodic task of the server — the
//! catalogue refresh, the scheduler's passes, the relay, the repairs — runs through
//! [`repeat`], which says once when its step starts failing and once when it works again,
//! rather than a line a second while a store is down, and stops at shutdown even mid-step.

use std::future::Future;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::error::cause_chain;

/// When a repeated step runs.
pub struct Schedule<'a> {
    /// The wait between two runs.
    pub every: Duration,
    /// Runs the step early when notified.
    pub wake: Option<&'a Notify>,
    /// Runs the step once at start, before the first wait.
    pub at_start: bool,
}

impl Schedule<'_> {
    /// A run every `every`, the first after one wait.
    pub fn every(every: Duration) -> Self {
        Self {
            every,
            wake: None,
            at_start: false,
        }
    }
}

/// Runs `step` on `schedule` until `shutdown`. A failure is logged as a warning once
/// (`"{what} failed; retrying"`) until the step works again, which is logged once too.
pub async fn repeat<E, F, Fut>(
    what: &str,
    schedule: Schedule<'_>,
    shutdown: &CancellationToken,
    mut step: F,
) where
    E: std::error::Error,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), E>>,
{
    let mut failing = false;
    let mut wait = !schedule.at_start;
    loop {
        if wait {
            let woken = async {
                match schedule.wake {
                    Some(wake) => wake.notified().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(schedule.every) => {}
                () = woken => {}
            }
        } else if shutdown.is_cancelled() {
            return;
        }
        wait = true;
        // A step cut off by shutdown is a crash as far as it can tell, which every step is
        // built to survive (leases, marks, idempotent writes); a stop does not wait for a
        // store that hangs.
        let result = tokio::select! {
            result = step() => result,
            () = shutdown.cancelled() => return,
        };
        match result {
            Ok(()) if failing => {
                tracing::info!("{what} works again");
                failing = false;
            }
            Ok(()) => {}
            Err(e) if !failing => {
                tracing::warn!(error = %cause_chain(&e), "{what} failed; retrying");
                failing = true;
            }
            Err(_) => {}
        }
    }
}
