//! What purchases and publishes measured on this instance, over a sliding window: the
//! facts the automatic breaker (`breaker::auto`) judges. Below the features so that the
//! publisher, which reports into it, does not name the breaker.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::config::Settings;

/// What purchases and publishes did on this instance, per second, over the window; and
/// the probes since the breaker went half-open. Only what began after the last
/// [`Signals::reset`] counts.
pub struct Signals {
    window: Duration,
    slow: Duration,
    /// The zero of `since_us`.
    base: Instant,
    /// The last reset, in µs from `base`: what began before it was measured in a state
    /// judged no longer (a purchase cut off from Redis that gave up after the link came
    /// back, one sent before the breaker moved).
    since_us: AtomicU64,
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
            base: Instant::now(),
            since_us: AtomicU64::new(0),
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
        if !self.began_since_reset(took) {
            return;
        }
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
        if (failed || took > self.slow) && self.began_since_reset(took) {
            self.bucket()
                .publish_failures
                .fetch_add(1, Ordering::Relaxed);
            self.probes_bad.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether something that ends now after `took` began after the last reset.
    fn began_since_reset(&self, took: Duration) -> bool {
        let began = self.base.elapsed().saturating_sub(took);
        micros(began) >= self.since_us.load(Ordering::Relaxed)
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

    /// The probes since the breaker went half-open: (good, bad).
    pub fn probes(&self) -> (u64, u64) {
        (
            self.probes_good.load(Ordering::Relaxed),
            self.probes_bad.load(Ordering::Relaxed),
        )
    }

    /// Forgets the window and the probes, and what is still on its way (on every move of
    /// the breaker, and when Redis answers again after it could not be reached).
    pub fn reset(&self) {
        self.since_us
            .store(micros(self.base.elapsed()), Ordering::Relaxed);
        for bucket in &self.buckets {
            bucket.second.store(0, Ordering::Relaxed);
        }
        self.probes_good.store(0, Ordering::Relaxed);
        self.probes_bad.store(0, Ordering::Relaxed);
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn now_s() -> u64 {
    u64::try_from(crate::clock::now_ms().div_euclid(1000)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_began_before_a_reset_is_not_judged() {
        let signals = Signals::new(Duration::from_secs(10), Duration::from_millis(100));
        signals.purchase(Duration::ZERO, true);
        assert_eq!(signals.totals().requests, 1);
        signals.reset();
        // Sent before the reset (a purchase that gave up after its link came back).
        signals.purchase(Duration::from_secs(1), true);
        signals.published(Duration::from_secs(1), true);
        assert_eq!(signals.totals(), Totals::default());
        assert_eq!(signals.probes(), (0, 0));
        signals.purchase(Duration::ZERO, true);
        signals.published(Duration::ZERO, true);
        assert_eq!(
            signals.totals(),
            Totals {
                requests: 1,
                bad: 1,
                publish_failures: 1
            }
        );
        assert_eq!(signals.probes(), (0, 2));
    }
}
