//! Background work until shutdown, in two shapes: [`repeat`] runs a periodic step (the
//! catalogue refresh, the scheduler's passes, the relay, the repairs), [`retry`] runs one
//! step until it works (the consumer's writes, the broker's connection). Both say once
//! when a step starts failing and once when it works again, rather than a line a second
//! while a store is down, and stop at shutdown.

use std::fmt::Display;
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

/// Runs `step` until it succeeds, pausing after each failure — 100 ms, then twice as long
/// each time, up to `longest`. The first failure is logged as a warning (and again at the
/// 2nd, 4th, 8th… with the count), the recovery once. `None` if shutdown came first.
pub async fn retry<T, E, F, Fut>(
    what: &str,
    longest: Duration,
    shutdown: &CancellationToken,
    mut step: F,
) -> Option<T>
where
    E: Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut pause = Duration::from_millis(100);
    let mut failures = 0u32;
    loop {
        let result = tokio::select! {
            result = step() => result,
            () = shutdown.cancelled() => return None,
        };
        match result {
            Ok(value) => {
                if failures > 0 {
                    tracing::info!(failures, "{what} works again");
                }
                return Some(value);
            }
            Err(e) => {
                failures += 1;
                if failures.is_power_of_two() {
                    tracing::warn!(failures, error = %e, "{what} failed; retrying");
                }
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return None,
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(longest);
    }
}
