//! Each instance's own breaker: signals measured on this instance over a sliding window,
//! and a controller that trips the breaker when they go bad and recovers it through a
//! half-open probe. It holds back this instance's purchases only: another instance whose
//! link to Redis is fine goes on selling (a Redis slow for everyone trips every instance's).
//!
//! closed ──(slow or failed purchases ≥ the trip ratio, or failed or slow publishes ≥
//! their limit)──▶
//! open (level 2) ──(after the cool-down)──▶ half-open (level 1: throttled probes) ──(enough
//! good probes)──▶ closed; a bad probe re-opens it and doubles the cool-down (up to a
//! minute), so it never flaps. Each move is one compare-and-set in Redis
//! (`lua/breaker_auto.lua`), so that operators see every instance's breaker (`GET
//! /admin/circuit`) and can close them all (with the global one); a move waits until Redis
//! takes it. Judged only on what was measured while this instance could reach Redis: a
//! link that was down says nothing about Redis, and its purchases already answered `503
//! unavailable`. While the global breaker is set by hand, the automatic one stands aside.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::deps::Deps;
use crate::signals::{Signals, Totals};

use super::store::{self, AutoState, Setting, Source};
use super::{Breakers, Level, Scope};

/// How often the controller looks at the signals.
const TICK: Duration = Duration::from_millis(250);
const MAX_COOL_DOWN: Duration = Duration::from_secs(60);

/// The `scope` label of this instance's automatic breaker in `seckill_breaker_level` (the
/// scraped `instance` says which one: an id would make a series per start).
const GAUGE_SCOPE: &str = "instance";

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

/// Drives this instance's automatic breaker from its own signals until shutdown.
pub async fn control(
    signals: Arc<Signals>,
    breakers: Breakers,
    deps: Deps,
    shutdown: CancellationToken,
) {
    let own = breakers.own_scope();
    let controller = Controller {
        me: format!("instance {}", breakers.instance()),
        own,
        signals,
        breakers,
        deps,
    };
    tracing::info!(scope = own.field(), "automatic breaker of this instance");
    let base = Duration::from_secs(controller.deps.settings.breaker_open_s);
    let mut seen = AutoState::Closed;
    // Whether the last look at Redis got an answer.
    let mut reached = true;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(TICK) => {}
        }
        let Ok((global, current)) =
            store::look(&controller.deps.redis, &controller.deps.keys, own).await
        else {
            reached = false;
            continue;
        };
        controller.obey(current.as_ref());
        if global.is_some() {
            // Set by hand: the operator's level holds, and what is measured under it
            // trips nothing later.
            if current.is_some() {
                let why = "the global breaker is set by hand";
                controller
                    .moved(current.as_ref(), None, why.to_owned())
                    .await;
            }
            seen = AutoState::Closed;
            reached = true;
            controller.signals.reset();
            continue;
        }
        // Closed by an operator meanwhile, it is judged on what happens from now; and what
        // was measured while Redis could not be reached is not judged at all (it says the
        // link was down, not that Redis is drowning).
        if state_of(current.as_ref()) != seen || !reached {
            seen = state_of(current.as_ref());
            reached = true;
            controller.signals.reset();
            continue;
        }
        let Some(Move { to, reason }) = next_move(
            current.as_ref(),
            &controller.signals,
            &controller.deps.settings,
            base,
        ) else {
            continue;
        };
        let to = to.map(|to| controller.setting(to, &reason));
        if let Some(now) = controller.moved(current.as_ref(), to, reason).await {
            seen = now;
        }
    }
    controller.let_go().await;
}

/// One instance's automatic breaker, as its controller moves it.
struct Controller {
    own: Scope,
    /// Who moves it, for the audit log: `instance ID`.
    me: String,
    signals: Arc<Signals>,
    breakers: Breakers,
    deps: Deps,
}

impl Controller {
    /// The stored form of a move `to` this level and state, for `reason`.
    fn setting(&self, to: Target, reason: &str) -> Setting {
        Setting {
            level: to.level,
            source: Source::Auto,
            state: Some(to.state),
            cool_down_s: Some(to.cool_down.as_secs()),
            by: self.me.clone(),
            reason: reason.to_owned(),
            at: crate::clock::now(),
        }
    }

    /// Stopping: the instance's breaker goes with it (a stopped instance holds nothing
    /// back).
    async fn let_go(&self) {
        let (_, current) = store::look(&self.deps.redis, &self.deps.keys, self.own)
            .await
            .unwrap_or_default();
        if current.is_some() {
            let why = "the instance stopped";
            self.moved(current.as_ref(), None, why.to_owned()).await;
        }
    }

    /// Holds this instance's purchases back as its entry says (an operator may have cleared
    /// it), and shows it.
    fn obey(&self, current: Option<&Setting>) {
        let level = current.map_or(Level::Closed, |s| s.level);
        self.breakers.set_own(level);
        self.deps
            .meters
            .breaker_level(GAUGE_SCOPE.to_owned(), level as u8);
    }

    /// Moves the breaker from `current` to `to` (`None`: closed), obeys and audits it;
    /// returns its new state, or `None` when it did not move (an operator closed it
    /// meanwhile, or Redis did not answer).
    async fn moved(
        &self,
        current: Option<&Setting>,
        to: Option<Setting>,
        reason: String,
    ) -> Option<AutoState> {
        let Deps {
            redis, keys, db, ..
        } = &self.deps;
        let from = state_of(current);
        match store::move_auto(redis, keys, self.own, from, to.as_ref()).await {
            Ok(true) => {}
            Ok(false) => return None,
            Err(e) => {
                tracing::debug!(error = %e, "cannot move the breaker now");
                return None;
            }
        }
        self.signals.reset();
        self.obey(to.as_ref());
        let (old, new) = (
            current.map_or(Level::Closed, |s| s.level),
            to.as_ref().map_or(Level::Closed, |s| s.level),
        );
        tracing::warn!(
            scope = self.own.field(),
            from = from.as_str(),
            level = new as u8,
            reason,
            "circuit breaker moved by itself"
        );
        let _ = store::audit(db, self.own, old, new, Source::Auto, &self.me, &reason).await;
        Some(to.and_then(|s| s.state).unwrap_or(AutoState::Closed))
    }
}

fn state_of(current: Option<&Setting>) -> AutoState {
    current.map_or(AutoState::Closed, |s| s.state.unwrap_or(AutoState::Open))
}

/// A move of the automatic breaker.
struct Move {
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
    Some(Move { to, reason })
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
        let signals = Signals::new(Duration::from_secs(10), Duration::from_millis(100));
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
