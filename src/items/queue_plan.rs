//! A queued item's settings (`"queue": {…}` on `PUT /admin/items/{id}`), their checks,
//! and how MySQL keeps them (one JSON column, like the waves).

use serde::{Deserialize, Serialize};

/// The most buyers one queue may let in a second.
const MAX_ADMIT_PER_S: u32 = 100_000;
const PASS_TTL_S: std::ops::RangeInclusive<u32> = 30..=3_600;
const MAX_OPENS_BEFORE_S: u32 = 86_400;
const MAX_POW_BITS: u8 = 28;

/// The waiting room of an item, as an operator sets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QueuePlan {
    /// The most buyers let in per second (1–100,000).
    #[schema(minimum = 1, maximum = 100_000, example = 200)]
    pub admit_per_s: u32,
    /// How long an admission (a pass) lasts, in seconds (30–3,600).
    #[serde(default = "default_pass_ttl")]
    #[schema(minimum = 30, maximum = 3600, default = 300)]
    pub pass_ttl_s: u32,
    /// The pre-queue opens this long before `start_at`, in seconds (0–86,400).
    #[serde(default = "default_opens_before")]
    #[schema(minimum = 0, maximum = 86_400, default = 1800)]
    pub opens_before_s: u32,
    /// Leading zero bits of the proof-of-work a join costs (0–28; 0: none).
    #[serde(default)]
    #[schema(minimum = 0, maximum = 28, default = 0)]
    pub pow_bits: u8,
}

fn default_pass_ttl() -> u32 {
    300
}

fn default_opens_before() -> u32 {
    1800
}

impl QueuePlan {
    /// The first field out of its bounds, named (the edge answers it `400`).
    pub fn check(&self) -> Result<(), String> {
        if !(1..=MAX_ADMIT_PER_S).contains(&self.admit_per_s) {
            return Err(format!("`queue.admit_per_s`: 1 to {MAX_ADMIT_PER_S}"));
        }
        if !PASS_TTL_S.contains(&self.pass_ttl_s) {
            return Err(format!(
                "`queue.pass_ttl_s`: {} to {}",
                PASS_TTL_S.start(),
                PASS_TTL_S.end()
            ));
        }
        if self.opens_before_s > MAX_OPENS_BEFORE_S {
            return Err(format!("`queue.opens_before_s`: 0 to {MAX_OPENS_BEFORE_S}"));
        }
        if self.pow_bits > MAX_POW_BITS {
            return Err(format!("`queue.pow_bits`: 0 to {MAX_POW_BITS}"));
        }
        Ok(())
    }
}

/// The column's value: a plan, or none (no waiting room).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct QueueSetting(pub Option<QueuePlan>);

impl QueueSetting {
    pub fn to_column(self) -> Option<String> {
        self.0.and_then(|plan| serde_json::to_string(&plan).ok())
    }
}

impl TryFrom<Option<String>> for QueueSetting {
    type Error = serde_json::Error;

    fn try_from(column: Option<String>) -> Result<Self, Self::Error> {
        match column.as_deref() {
            None | Some("") => Ok(Self(None)),
            Some(json) => serde_json::from_str(json).map(|plan| Self(Some(plan))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(json: &str) -> QueuePlan {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn defaults_fill_what_is_left_out() {
        assert_eq!(
            plan(r#"{"admit_per_s": 5}"#),
            QueuePlan {
                admit_per_s: 5,
                pass_ttl_s: 300,
                opens_before_s: 1800,
                pow_bits: 0
            }
        );
    }

    #[test]
    fn each_bound_is_named() {
        for (json, field) in [
            (r#"{"admit_per_s": 0}"#, "admit_per_s"),
            (r#"{"admit_per_s": 100001}"#, "admit_per_s"),
            (r#"{"admit_per_s": 1, "pass_ttl_s": 29}"#, "pass_ttl_s"),
            (r#"{"admit_per_s": 1, "pass_ttl_s": 3601}"#, "pass_ttl_s"),
            (
                r#"{"admit_per_s": 1, "opens_before_s": 86401}"#,
                "opens_before_s",
            ),
            (r#"{"admit_per_s": 1, "pow_bits": 29}"#, "pow_bits"),
        ] {
            let message = plan(json).check().unwrap_err().to_string();
            assert!(message.contains(field), "{json}: {message}");
        }
        assert!(
            plan(r#"{"admit_per_s": 100000, "pow_bits": 28}"#)
                .check()
                .is_ok()
        );
    }

    #[test]
    fn the_column_keeps_a_plan() {
        let kept = QueueSetting(Some(plan(r#"{"admit_per_s": 7, "pow_bits": 3}"#)));
        assert_eq!(QueueSetting::try_from(kept.to_column()).unwrap(), kept);
        assert_eq!(QueueSetting::try_from(None).unwrap(), QueueSetting(None));
    }
}
