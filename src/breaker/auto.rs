//! The global breaker's automatic side: signals measured on this instance over a sliding
//! window, and a controller that trips the breaker when they go bad and recovers it through
//! a half-open probe.
//!
//! closed ──(slow or failed purchases ≥ the trip ratio, or failed or slow publishes ≥
//! their limit)──▶
//! open (level 2) ──(after the cool-down)──▶ half-open (level 1: throttled probes) ──(enough
//! good probes)──▶ closed; a bad probe re-opens it and doubles the cool-down (up to a
//! minute), so it never flaps. Each move is one compare-and-set in Redis
//! (`lua/breaker_auto.lua`): a level set by hand is never touched, and two instances never
//! make the same move twice.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::keys::Keys;
use crate::store::{Db, RedisConns};

use super::store::{self, AutoState, Setting, Source};
use super::{Level, Scope};

/// How often the controller looks at the signals.
const TICK: Duration = Duration::from_millis(250);
const MAX_COOL_DOWN: Duration = Duration::from_secs(60);

/// What purchases and publishes did on this instance, per second, over the window; and
/// the probes since the breaker went half-open.
pub struct Signals {
    window: Duration,
    slow: Duration,
    /// A ring of one-second buckets, one per second of the window (plus the current one);
    /// atomics, so the purchase path never waits on a lock to report.
    buckets: Vec<Bucket>,
    probes_good: AtomicU64,
    probes_bad: AtomicU64,
}

#[derive(Default)]
struct Bucket {
    second: AtomicU64,
    requests: AtomicU64,
    bad: AtomicU64,
    publish_failures: AtomicU64,
}

/// The window's totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub requests: u64,
    /// Slow or failed purchases.
    pub bad: u64,
    pub publish_failures: u64,
}

impl Signals {
    pub fn new(window: Duration, slow: Duration) -> Self {
        let slots = usize::try_from(window.as_secs()).unwrap_or(600) + 1;
        Self {
            window,
            slow,
            buckets: (0..slots).map(|_| Bucket::default()).collect(),
            probes_good: AtomicU64::new(0),
            probes_bad: AtomicU64::new(0),
        }
    }

    pub fn from_settings(settings: &Settings) -> Self {
        Self::new(
            Duration::from_secs(settings.breaker_window_s),
            Duration::from_millis(settings.breaker_slow_ms),
        )
    }

    /// A purchase that reached Redis: how long its Redis step took, and whether it failed.
    pub fn purchase(&self, took: Duration, failed: bool) {
        let bad = failed || took > self.slow;
        let bucket = self.bucket();
        bucket.requests.fetch_add(1, Ordering::Relaxed);
        if bad {
            bucket.bad.fetch_add(1, Ordering::Relaxed);
        }
        let probes = if bad {
            &self.probes_bad
        } else {
            &self.probes_good
        };
        probes.fetch_add(1, Ordering::Relaxed);
    }

    /// A batch sent to RabbitMQ on a live connection: how long its confirms took and
    /// whether any was missing. A broker that confirms slowly or not at all is drowning.
    pub fn published(&self, took: Duration, failed: bool) {
        if failed || took > self.slow {
            self.bucket()
                .publish_failures
                .fetch_add(1, Ordering::Relaxed);
            self.probes_bad.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// This second's bucket, emptied first if it last held an older second. (Two threads
    /// crossing into a new second together may lose a count or two: fine for a signal.)
    fn bucket(&self) -> &Bucket {
        let second = now_s();
        let slot = usize::try_from(second).unwrap_or(0) % self.buckets.len();
        let bucket = &self.buckets[slot];
        let held = bucket.second.load(Ordering::Relaxed);
        if held != second
            && bucket
                .second
                .compare_exchange(held, second, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            bucket.requests.store(0, Ordering::Relaxed);
            bucket.bad.store(0, Ordering::Relaxed);
            bucket.publish_failures.store(0, Ordering::Relaxed);
        }
        bucket
    }

    pub fn totals(&self) -> Totals {
        let oldest = now_s().saturating_sub(self.window.as_secs());
        self.buckets
            .iter()
            .filter(|b| b.second.load(Ordering::Relaxed) > oldest)
            .fold(Totals::default(), |t, b| Totals {
                requests: t.requests + b.requests.load(Ordering::Relaxed),
                bad: t.bad + b.bad.load(Ordering::Relaxed),
                publish_failures: t.publish_failures + b.publish_failures.load(Ordering::Relaxed),
            })
    }

    /// Forgets the window and the probes (on every move of the breaker).
    fn reset(&self) {
        for bucket in &self.buckets {
            bucket.second.store(0, Ordering::Relaxed);
        }
        self.probes_good.store(0, Ordering::Relaxed);
        self.probes_bad.store(0, Ordering::Relaxed);
    }
}

fn now_s() -> u64 {
    u64::try_from(crate::clock::now().timestamp()).unwrap_or(0)
}

/// When the signals trip a closed breaker: the reason, or `None`.
pub fn trip_reason(totals: Totals, settings: &Settings) -> Option<String> {
    if totals.publish_failures >= settings.breaker_publish_failures {
        return Some(format!(
            "{} batches to RabbitMQ were refused or slow to confirm in {} s",
            totals.publish_failures, settings.breaker_window_s
        ));
    }
    let enough = totals.requests >= settings.breaker_min_requests.max(1);
    let share = totals.bad as f64 / totals.requests.max(1) as f64;
    (enough && share >= settings.breaker_trip_ratio).then(|| {
        format!(
            "{} of {} purchases in {} s were slower than {} ms or failed",
            totals.bad, totals.requests, settings.breaker_window_s, settings.breaker_slow_ms
        )
    })
}

/// Drives the global breaker from this instance's signals until shutdown.
pub async fn control(
    signals: std::sync::Arc<Signals>,
    settings: std::sync::Arc<Settings>,
    redis: RedisConns,
    db: Db,
    keys: Keys,
    shutdown: CancellationToken,
) {
    let me = format!("instance {}", ulid::Ulid::new());
    let base = Duration::from_secs(settings.breaker_open_s);
    let mut seen = AutoState::Closed;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(TICK) => {}
        }
        let Ok(all) = store::load_all(&redis, &keys).await else {
            continue;
        };
        let current = all.get(&Scope::Global);
        if current.is_some_and(|s| s.source == Source::Manual) {
            continue;
        }
        // Whoever moved it, this instance judges the new state on what happens from now.
        if state_of(current) != seen {
            seen = state_of(current);
            signals.reset();
        }
        let Some(Move { from, to, reason }) = next_move(current, &signals, &settings, base) else {
            continue;
        };
        let setting = to.map(|to| Setting {
            level: to.level,
            source: Source::Auto,
            state: Some(to.state),
            cool_down_s: Some(to.cool_down.as_secs()),
            by: me.clone(),
            reason: reason.clone(),
            at: crate::clock::now(),
        });
        match store::move_auto(&redis, &keys, Scope::Global, from, setting.as_ref()).await {
            Ok(true) => {
                signals.reset();
                seen = setting
                    .as_ref()
                    .and_then(|s| s.state)
                    .unwrap_or(AutoState::Closed);
                let (old, new) = (
                    current.map_or(Level::Closed, |s| s.level),
                    setting.as_ref().map_or(Level::Closed, |s| s.level),
                );
                tracing::warn!(
                    from = from.as_str(),
                    level = new as u8,
                    reason,
                    "circuit breaker moved by itself"
                );
                let _ =
                    store::audit(&db, Scope::Global, old, new, Source::Auto, &me, &reason).await;
            }
            Ok(false) => {}
            Err(e) => tracing::debug!(error = %e, "cannot move the breaker now"),
        }
    }
}

fn state_of(current: Option<&Setting>) -> AutoState {
    current.map_or(AutoState::Closed, |s| s.state.unwrap_or(AutoState::Open))
}

/// A move of the automatic breaker.
struct Move {
    /// The state it is in now.
    from: AutoState,
    /// Where it goes; `None`: closed.
    to: Option<Target>,
    reason: String,
}

struct Target {
    state: AutoState,
    level: Level,
    cool_down: Duration,
}

/// Where the breaker should go from where it is, given the signals; `None`: stay.
fn next_move(
    current: Option<&Setting>,
    signals: &Signals,
    settings: &Settings,
    base: Duration,
) -> Option<Move> {
    let from = state_of(current);
    let cool_down = current
        .and_then(|s| s.cool_down_s)
        .map_or(base, Duration::from_secs);
    let target = |state, level, cool_down| {
        Some(Target {
            state,
            level,
            cool_down,
        })
    };
    let (to, reason) = match from {
        AutoState::Closed => {
            let why = trip_reason(signals.totals(), settings)?;
            (target(AutoState::Open, Level::Degrade, base), why)
        }
        AutoState::Open => {
            let since = current
                .map(|s| {
                    (crate::clock::now() - s.at)
                        .to_std()
                        .unwrap_or(Duration::ZERO)
                })
                .unwrap_or(Duration::ZERO);
            if since < cool_down {
                return None;
            }
            let why = format!("open for {} s: letting probes through", since.as_secs());
            (target(AutoState::HalfOpen, Level::Throttle, cool_down), why)
        }
        AutoState::HalfOpen => {
            let bad = signals.probes_bad.load(Ordering::Relaxed);
            let good = signals.probes_good.load(Ordering::Relaxed);
            if bad > 0 {
                let longer = (cool_down * 2).min(MAX_COOL_DOWN);
                let why = format!(
                    "a probe was slow or failed; open again for {} s",
                    longer.as_secs()
                );
                (target(AutoState::Open, Level::Degrade, longer), why)
            } else if good >= settings.breaker_probes {
                (None, format!("{good} probes in a row went well"))
            } else {
                return None;
            }
        }
    };
    Some(Move { from, to, reason })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        let mut s = Settings::from_env().unwrap();
        s.breaker_min_requests = 4;
        s.breaker_trip_ratio = 0.5;
        s.breaker_publish_failures = 3;
        s
    }

    #[test]
    fn slow_or_failed_purchases_trip_only_with_enough_of_them() {
        let signals = Signals::new(Duration::from_secs(10), Duration::from_millis(100));
        let s = settings();
        signals.purchase(Duration::from_millis(500), false);
        signals.purchase(Duration::from_millis(5), true);
        assert_eq!(trip_reason(signals.totals(), &s), None, "too few to judge");
        signals.purchase(Duration::from_millis(5), false);
        signals.purchase(Duration::from_millis(5), false);
        assert_eq!(
            signals.totals(),
            Totals {
                requests: 4,
                bad: 2,
                publish_failures: 0
            }
        );
        assert!(trip_reason(signals.totals(), &s).is_some());
        signals.reset();
        signals.published(Duration::from_millis(5), false);
        for _ in 0..3 {
            signals.published(Duration::from_millis(5), true);
        }
        assert_eq!(signals.totals().publish_failures, 3);
        signals.published(Duration::from_millis(500), false);
        assert_eq!(
            signals.totals().publish_failures,
            4,
            "a slow confirm counts too"
        );
        assert!(
            trip_reason(signals.totals(), &s)
                .unwrap()
                .contains("RabbitMQ")
        );
    }
}
