//! Waves: an item's units released in tranches at set times (`"release"` on
//! `PUT /admin/items/{id}`), on top of the units on sale from `start_at`.
//!
//! Nothing is pushed at a wave's time. Every unit is loaded at warm-up; each bucket's meta
//! holds its schedule (`waves`: how many of its units are still held back until each
//! time), and `grab.lua` and `lend.lua` sell or lend only the units above what is held back
//! at Redis's own `TIME`. So a wave opens on every instance at once and never early by
//! any host's clock, a scheduler has nothing to do (and nothing to crash in the middle of),
//! unsold units roll over, and a cancelled order's unit is on sale at once.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::BucketId;

/// One tranche.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Wave {
    /// When the tranche goes on sale (within the sale window).
    pub at: DateTime<Utc>,
    /// Units it adds (at least 1).
    #[schema(minimum = 1)]
    pub units: u32,
}

/// An item's tranches, in time order (empty: every unit on sale from `start_at`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(transparent)]
pub struct Waves(Vec<Wave>);

impl Waves {
    pub fn new(waves: Vec<Wave>) -> Self {
        Self(waves)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Wave> {
        self.0.iter()
    }

    /// Units of tranches still to come at `now` (not yet on sale).
    pub fn unreleased(&self, now: DateTime<Utc>) -> u64 {
        self.0
            .iter()
            .filter(|w| w.at > now)
            .map(|w| u64::from(w.units))
            .sum()
    }

    /// When the next tranche goes on sale, if one is still to come.
    pub fn next_at(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.0.iter().map(|w| w.at).find(|at| *at > now)
    }

    /// The plan with its times to the millisecond, as MySQL keeps the sale window: a plan
    /// sent again compares equal to the one stored.
    pub fn to_millis(&self) -> Self {
        Self(
            self.0
                .iter()
                .map(|w| Wave {
                    at: crate::store::to_millis(w.at),
                    units: w.units,
                })
                .collect(),
        )
    }

    /// When the last tranche goes on sale (`None`: no waves).
    pub fn last_at(&self) -> Option<DateTime<Utc>> {
        self.0.last().map(|w| w.at)
    }

    /// Checks a plan against its item: each `at` within `[start_at, end_at)` and later
    /// than the one before, each at least one unit, no more units than `total`. The error
    /// names the field.
    pub fn check(
        &self,
        start_at: DateTime<Utc>,
        end_at: DateTime<Utc>,
        total: u32,
    ) -> Result<(), String> {
        let mut before: Option<DateTime<Utc>> = None;
        let mut units: u64 = 0;
        for (i, wave) in self.0.iter().enumerate() {
            if wave.at < start_at || wave.at >= end_at {
                return Err(format!(
                    "`release[{i}].at`: within the sale window [start_at, end_at)"
                ));
            }
            if before.is_some_and(|b| wave.at <= b) {
                return Err(format!(
                    "`release[{i}].at`: later than the tranche before it"
                ));
            }
            if wave.units == 0 {
                return Err(format!("`release[{i}].units`: at least 1"));
            }
            before = Some(wave.at);
            units += u64::from(wave.units);
        }
        if units > u64::from(total) {
            return Err(format!(
                "`release`: {units} units in all, more than `total` ({total})"
            ));
        }
        Ok(())
    }

    /// Tranches released by `now` that `next` drops or changes: what a live item's update
    /// may not do. Returns the first such tranche's time.
    pub fn released_changed(&self, next: &Waves, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.0
            .iter()
            .filter(|w| w.at <= now)
            .find(|w| !next.0.contains(w))
            .map(|w| w.at)
            .or_else(|| {
                // A tranche added in the past would be released the moment it is written.
                next.0
                    .iter()
                    .filter(|w| w.at <= now)
                    .find(|w| !self.0.contains(w))
                    .map(|w| w.at)
            })
    }

    /// The `waves` field of one bucket's meta: `at_ms:held` pairs, space separated, where
    /// `held` is how many of the bucket's units stay off sale until `at_ms` (its share of
    /// every tranche from that one on, spread as the units are spread; a share never
    /// exceeds the bucket's units, see [`BucketId::spread`]). Empty for an item without waves.
    pub fn meta_field(&self, buckets: u8, bucket: u8) -> String {
        self.holds(buckets, bucket).to_string()
    }

    /// What one bucket of the item holds back, as its meta's `waves` field lists it
    /// ([`Waves::meta_field`]).
    pub fn holds(&self, buckets: u8, bucket: u8) -> Holds {
        let mut pairs = Vec::with_capacity(self.0.len());
        for (i, wave) in self.0.iter().enumerate() {
            let from_here: u64 = self.0[i..].iter().map(|w| u64::from(w.units)).sum();
            let held = BucketId::spread(from_here, usize::from(buckets))
                .get(usize::from(bucket))
                .copied()
                .unwrap_or(0);
            pairs.push((wave.at.timestamp_millis(), held));
        }
        Holds(pairs)
    }

    /// As MySQL's `items.release_plan` holds it (`None`: no waves).
    pub fn to_column(&self) -> Option<String> {
        if self.0.is_empty() {
            return None;
        }
        serde_json::to_string(&self.0).ok()
    }
}

/// What one bucket holds back for waves: `(at_ms, held)` pairs in time order, each
/// `held` of its listed units off sale until `at_ms` (`lua/lib/waves.lua` reads them so).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holds(Vec<(i64, u64)>);

impl Holds {
    /// Units held back at `now_ms`: those of the first pair still to come.
    pub fn at(&self, now_ms: i64) -> u64 {
        self.first_from(now_ms + 1)
    }

    /// The `held` of the first pair at or after `at_ms` (0: none).
    fn first_from(&self, at_ms: i64) -> u64 {
        self.0
            .iter()
            .find(|(at, _)| *at >= at_ms)
            .map_or(0, |(_, held)| *held)
    }

    /// At every instant, the more of what `self` and `other` hold back: what a bucket may
    /// hold while one plan replaces the other, so that it never holds less than either.
    pub fn most(&self, other: &Holds) -> Holds {
        let mut times: Vec<i64> = self.0.iter().chain(&other.0).map(|(at, _)| *at).collect();
        times.sort_unstable();
        times.dedup();
        Holds(
            times
                .into_iter()
                .map(|at| (at, self.first_from(at).max(other.first_from(at))))
                .collect(),
        )
    }
}

/// As the meta's `waves` field writes it: `at_ms:held` pairs, space separated.
impl fmt::Display for Holds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (at, held)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{at}:{held}")?;
        }
        Ok(())
    }
}

impl TryFrom<Option<String>> for Waves {
    type Error = serde_json::Error;

    fn try_from(column: Option<String>) -> Result<Self, Self::Error> {
        match column.as_deref() {
            None | Some("") => Ok(Self::default()),
            Some(json) => serde_json::from_str(json).map(Self),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap_or_default()
    }

    fn plan(waves: &[(i64, u32)]) -> Waves {
        Waves::new(
            waves
                .iter()
                .map(|&(s, units)| Wave { at: at(s), units })
                .collect(),
        )
    }

    #[test]
    fn what_is_held_back_follows_the_clock() {
        let waves = plan(&[(10, 30), (20, 20)]);
        assert_eq!(waves.unreleased(at(0)), 50);
        assert_eq!(waves.next_at(at(0)), Some(at(10)));
        assert_eq!(
            waves.unreleased(at(10)),
            20,
            "a tranche is on sale at its time"
        );
        assert_eq!(waves.next_at(at(10)), Some(at(20)));
        assert_eq!(waves.unreleased(at(20)), 0);
        assert_eq!(waves.next_at(at(20)), None);
    }

    #[test]
    fn a_bad_plan_is_named() {
        let check = |w: &Waves| w.check(at(0), at(100), 100);
        assert!(check(&plan(&[(10, 30), (20, 70)])).is_ok());
        assert!(
            check(&plan(&[(-1, 1)]))
                .unwrap_err()
                .contains("release[0].at")
        );
        assert!(
            check(&plan(&[(100, 1)]))
                .unwrap_err()
                .contains("release[0].at")
        );
        assert!(
            check(&plan(&[(10, 1), (10, 1)]))
                .unwrap_err()
                .contains("release[1].at")
        );
        assert!(
            check(&plan(&[(10, 0)]))
                .unwrap_err()
                .contains("release[0].units")
        );
        assert!(
            check(&plan(&[(10, 60), (20, 41)]))
                .unwrap_err()
                .contains("more than `total`")
        );
    }

    #[test]
    fn each_buckets_share_never_exceeds_its_units() {
        // Three tranches of one unit over two buckets: shares of what is still to come,
        // not of each tranche (which would hold 3 back in bucket 0, holding 2 units).
        let waves = plan(&[(10, 1), (20, 1), (30, 1)]);
        assert_eq!(
            waves.meta_field(2, 0),
            format!(
                "{}:2 {}:1 {}:1",
                at(10).timestamp_millis(),
                at(20).timestamp_millis(),
                at(30).timestamp_millis()
            )
        );
        assert_eq!(
            waves.meta_field(2, 1),
            format!(
                "{}:1 {}:1 {}:0",
                at(10).timestamp_millis(),
                at(20).timestamp_millis(),
                at(30).timestamp_millis()
            )
        );
        let units = BucketId::spread(3, 2);
        for bucket in 0..2u8 {
            let first: u64 = waves
                .meta_field(2, bucket)
                .split(' ')
                .next()
                .and_then(|f| f.split(':').nth(1))
                .and_then(|h| h.parse().ok())
                .unwrap_or(u64::MAX);
            assert!(first <= units[usize::from(bucket)]);
        }
        assert_eq!(Waves::default().meta_field(4, 1), "");
    }

    #[test]
    fn a_bucket_holds_back_its_share_until_each_wave() {
        let ms = |s: i64| at(s).timestamp_millis();
        let holds = plan(&[(10, 1), (20, 3)]).holds(1, 0);
        assert_eq!(holds.to_string(), format!("{}:4 {}:3", ms(10), ms(20)));
        assert_eq!(
            (
                holds.at(ms(0)),
                holds.at(ms(10)),
                holds.at(ms(15)),
                holds.at(ms(20))
            ),
            (4, 3, 3, 0),
            "a wave's units are on sale at its time"
        );
        assert_eq!(Holds::default().at(ms(0)), 0);
    }

    #[test]
    fn while_one_plan_replaces_another_a_bucket_holds_the_more_of_both() {
        let ms = |s: i64| at(s).timestamp_millis();
        // 5 held until 10; then 1 at 10 and 3 at 20 instead (4 held until 10, 3 until 20).
        let old = plan(&[(10, 5)]).holds(1, 0);
        let new = plan(&[(10, 1), (20, 3)]).holds(1, 0);
        assert_eq!((old.at(ms(0)), old.at(ms(10))), (5, 0), "open at its time");
        assert_eq!((new.at(ms(0)), new.at(ms(15)), new.at(ms(20))), (4, 3, 0));
        let most = old.most(&new);
        assert_eq!(most.to_string(), format!("{}:5 {}:3", ms(10), ms(20)));
        for s in [0, 9, 10, 15, 19, 20, 30] {
            assert_eq!(most.at(ms(s)), old.at(ms(s)).max(new.at(ms(s))), "at {s}");
        }
        assert_eq!(old.most(&old), old);
        assert_eq!(old.most(&Holds::default()), old);
        assert_eq!(Holds::default().at(ms(0)), 0);
    }

    #[test]
    fn released_tranches_are_fixed() {
        let waves = plan(&[(10, 30), (20, 20)]);
        assert_eq!(
            waves.released_changed(&plan(&[(10, 30), (25, 5)]), at(15)),
            None
        );
        assert_eq!(
            waves.released_changed(&plan(&[(10, 31), (20, 20)]), at(15)),
            Some(at(10))
        );
        assert_eq!(
            waves.released_changed(&plan(&[(5, 1), (10, 30)]), at(15)),
            Some(at(5))
        );
        assert_eq!(waves.released_changed(&plan(&[]), at(5)), None);
    }
}
