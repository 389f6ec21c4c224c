//! The global breaker's automatic side: signals measured on this instance over a sliding
//! window, and a controller that trips the breaker when they go bad and recovers it through
//! a half-open probe.
//!
//! closed ──(slow or failed purchases ≥ the trip ratio, or publish failures ≥ their limit)──▶
//! open (level 2) ──(after the cool-down)──▶ half-open (level 1: throttled probes) ──(enough
//! good probes)──▶ closed; a bad probe re-opens it and doubles the cool-down (up to a
//! minute), so it never flaps. Each move is one compare-and-set in Redis
//! (`lua/breaker_auto.lua`): a level set by hand is never touched, and two instances never
//! make the same move twice.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::Utc;
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
    buckets: Mutex<VecDeque<Bucket>>,
    probes_good: AtomicU64,
    probes_bad: AtomicU64,
}

#[derive(Clone, Copy, Default)]
struct Bucket {
    second: u64,
    requests: u64,
    bad: u64,
    publish_failures: u64,
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
        Self {
            window,
            slow,
            buckets: Mutex::new(VecDeque::new()),
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
        self.add(|b| {
            b.requests += 1;
            b.bad += u64::from(bad);
        });
        let probes = if bad {
            &self.probes_bad
        } else {
            &self.probes_good
        };
        probes.fetch_add(1, Ordering::Relaxed);
    }

    /// A batch of orders RabbitMQ did not confirm (or no connection to send it on).
    pub fn publish_failed(&self) {
        self.add(|b| b.publish_failures += 1);
        self.probes_bad.fetch_add(1, Ordering::Relaxed);
    }

    fn add(&self, change: impl FnOnce(&mut Bucket)) {
        let second = now_s();
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.back().is_none_or(|b| b.second != second) {
            buckets.push_back(Bucket {
                second,
                ..Bucket::default()
            });
            let oldest = second.saturating_sub(self.window.as_secs());
            while buckets.front().is_some_and(|b| b.second <= oldest) {
                buckets.pop_front();
            }
        }
        if let Some(bucket) = buckets.back_mut() {
            change(bucket);
        }
    }

    pub fn totals(&self) -> Totals {
        let oldest = now_s().saturating_sub(self.window.as_secs());
        let buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        buckets
            .iter()
            .filter(|b| b.second > oldest)
            .fold(Totals::default(), |t, b| Totals {
                requests: t.requests + b.requests,
                bad: t.bad + b.bad,
                publish_failures: t.publish_failures + b.publish_failures,
            })
    }

    /// Forgets the window and the probes (on every move of the breaker).
    fn reset(&self) {
        self.buckets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.probes_good.store(0, Ordering::Relaxed);
        self.probes_bad.store(0, Ordering::Relaxed);
    }
}

fn now_s() -> u64 {
    u64::try_from(Utc::now().timestamp()).unwrap_or(0)
}

/// When the signals trip a closed breaker: the reason, or `None`.
pub fn trip_reason(totals: Totals, settings: &Settings) -> Option<String> {
    if totals.publish_failures >= settings.breaker_publish_failures {
        return Some(format!(
            "{} publishes to RabbitMQ failed in {} s",
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
        let Some((state, to, reason)) = next_step(current, &signals, &settings, base) else {
            continue;
        };
        let setting = to.map(|(state, level, cool_down)| Setting {
            level,
            source: Source::Auto,
            state: Some(state),
            cool_down_s: Some(cool_down.as_secs()),
            by: me.clone(),
            reason: reason.clone(),
            at: Utc::now(),
        });
        match store::move_auto(&redis, &keys, Scope::Global, state, setting.as_ref()).await {
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
                    from = state.as_str(),
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

/// The state the breaker is in, where it should go (`None`: closed; else state, level and
/// cool-down) and why; `None` when it should stay.
#[allow(clippy::type_complexity)]
fn next_step(
    current: Option<&Setting>,
    signals: &Signals,
    settings: &Settings,
    base: Duration,
) -> Option<(AutoState, Option<(AutoState, Level, Duration)>, String)> {
    let state = state_of(current);
    let cool_down = current
        .and_then(|s| s.cool_down_s)
        .map_or(base, Duration::from_secs);
    match state {
        AutoState::Closed => trip_reason(signals.totals(), settings)
            .map(|why| (state, Some((AutoState::Open, Level::Degrade, base)), why)),
        AutoState::Open => {
            let since = current
                .map(|s| (Utc::now() - s.at).to_std().unwrap_or(Duration::ZERO))
                .unwrap_or(Duration::ZERO);
            (since >= cool_down).then(|| {
                let why = format!("open for {} s: letting probes through", since.as_secs());
                (
                    state,
                    Some((AutoState::HalfOpen, Level::Throttle, cool_down)),
                    why,
                )
            })
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
                Some((state, Some((AutoState::Open, Level::Degrade, longer)), why))
            } else if good >= settings.breaker_probes {
                Some((state, None, format!("{good} probes in a row went well")))
            } else {
                None
            }
        }
    }
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
        for _ in 0..3 {
            signals.publish_failed();
        }
        assert!(
            trip_reason(signals.totals(), &s)
                .unwrap()
                .contains("publishes")
        );
    }
}
