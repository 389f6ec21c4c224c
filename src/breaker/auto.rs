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

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::deps::Deps;
use crate::signals::{Signals, Totals};

use super::store::{self, AutoState, Setting, Source};
use super::{Level, Scope};

/// How often the controller looks at the signals.
const TICK: Duration = Duration::from_millis(250);
const MAX_COOL_DOWN: Duration = Duration::from_secs(60);

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
pub async fn control(signals: std::sync::Arc<Signals>, deps: Deps, shutdown: CancellationToken) {
    let Deps {
        settings,
        redis,
        db,
        keys,
        ..
    } = deps;
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
            let (good, bad) = signals.probes();
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
