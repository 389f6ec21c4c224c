//! Opening hours in a shop's own time zone, and whether a shop is open at an instant.
//!
//! Pure: the instant is a parameter, so time zones and daylight-saving days are tested with
//! chosen instants. An operator's override wins over dated exceptions, which win over the
//! weekly hours; a shop with no weekly hours is open unless an exception or override says
//! otherwise.

use chrono::{DateTime, Datelike, Days, NaiveDate, NaiveTime, Utc};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};

/// A weekly opening: `weekday` 1 = Monday … 7 = Sunday, local times. A `close` at or
/// before `open` runs past midnight into the next day.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Weekly {
    #[schema(minimum = 1, maximum = 7)]
    pub weekday: u8,
    #[serde(with = "hh_mm")]
    #[schema(value_type = String, pattern = r"^([01][0-9]|2[0-3]):[0-5][0-9]$", example = "09:00")]
    pub open: NaiveTime,
    #[serde(with = "hh_mm")]
    #[schema(value_type = String, pattern = r"^([01][0-9]|2[0-3]):[0-5][0-9]$", example = "22:00")]
    pub close: NaiveTime,
}

/// A dated exception: closed all day, open all day, or open within its own hours.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Exception {
    pub date: NaiveDate,
    pub open: bool,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_hh_mm")]
    #[schema(value_type = Option<String>, pattern = r"^([01][0-9]|2[0-3]):[0-5][0-9]$")]
    pub from: Option<NaiveTime>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_hh_mm")]
    #[schema(value_type = Option<String>, pattern = r"^([01][0-9]|2[0-3]):[0-5][0-9]$")]
    pub until: Option<NaiveTime>,
}

/// A shop's hours as operators set them (`PUT /admin/shops/{id}/hours`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Hours {
    /// An IANA time zone, the shop's own.
    #[schema(value_type = String, example = "Asia/Shanghai")]
    pub timezone: Tz,
    #[serde(default)]
    pub weekly: Vec<Weekly>,
    #[serde(default)]
    pub exceptions: Vec<Exception>,
}

impl Default for Hours {
    /// No hours: open around the clock (a shop first seen through an item).
    fn default() -> Self {
        Self {
            timezone: Tz::UTC,
            weekly: Vec::new(),
            exceptions: Vec::new(),
        }
    }
}

/// An operator's word: open or closed, until an instant or until cleared.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Override {
    pub open: bool,
    pub until: Option<DateTime<Utc>>,
    pub reason: String,
}

impl Hours {
    /// What is wrong with these hours, if anything (for a `400` that names it).
    pub fn problem(&self) -> Option<String> {
        if let Some(w) = self.weekly.iter().find(|w| !(1..=7).contains(&w.weekday)) {
            return Some(format!(
                "`weekly`: weekday {} is not 1 (Monday) to 7 (Sunday)",
                w.weekday
            ));
        }
        if let Some(w) = self.weekly.iter().find(|w| w.open == w.close) {
            return Some(format!(
                "`weekly`: weekday {} opens and closes at the same time",
                w.weekday
            ));
        }
        let mut dates: Vec<NaiveDate> = self.exceptions.iter().map(|e| e.date).collect();
        dates.sort_unstable();
        if let Some(pair) = dates.windows(2).find(|p| p[0] == p[1]) {
            return Some(format!("`exceptions`: {} appears twice", pair[0]));
        }
        if let Some(e) = self
            .exceptions
            .iter()
            .find(|e| e.from.is_some() != e.until.is_some() || (!e.open && e.from.is_some()))
        {
            return Some(format!(
                "`exceptions`: {} needs both `from` and `until`, and only when open",
                e.date
            ));
        }
        None
    }

    /// Whether the hours say open at `now` (no override considered).
    pub fn open_at(&self, now: DateTime<Utc>) -> bool {
        let local = now.with_timezone(&self.timezone);
        let (date, time) = (local.date_naive(), local.time());
        if let Some(exception) = self.exceptions.iter().find(|e| e.date == date) {
            return match (exception.open, exception.from, exception.until) {
                (false, ..) => false,
                (true, Some(from), Some(until)) => within(time, from, until, true),
                (true, ..) => true,
            };
        }
        if self.weekly.is_empty() {
            return true;
        }
        let today = weekday(date);
        let yesterday = date.checked_sub_days(Days::new(1)).map(weekday);
        self.weekly.iter().any(|w| {
            let wraps = w.close <= w.open;
            (w.weekday == today && within(time, w.open, w.close, true))
                // The part after midnight of yesterday's opening that runs past it.
                || (wraps && Some(w.weekday) == yesterday && time < w.close)
        })
    }
}

/// Whether the shop is open at `now`: the override while it lasts, else the hours.
pub fn open_at(hours: &Hours, overridden: Option<&Override>, now: DateTime<Utc>) -> bool {
    match overridden {
        Some(o) if o.until.is_none_or(|until| now < until) => o.open,
        _ => hours.open_at(now),
    }
}

fn weekday(date: NaiveDate) -> u8 {
    date.weekday().number_from_monday() as u8
}

/// `from <= t < until` on one day; with `wrap`, an `until` at or before `from` means
/// "until midnight" (the rest belongs to the next day).
fn within(t: NaiveTime, from: NaiveTime, until: NaiveTime, wrap: bool) -> bool {
    if until > from || !wrap {
        from <= t && t < until
    } else {
        t >= from
    }
}

mod hh_mm {
    use chrono::NaiveTime;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &NaiveTime, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&t.format("%H:%M").to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<NaiveTime, D::Error> {
        let text = String::deserialize(d)?;
        NaiveTime::parse_from_str(&text, "%H:%M")
            .map_err(|_| serde::de::Error::custom(format!("{text:?} is not a time like \"09:30\"")))
    }
}

mod opt_hh_mm {
    use chrono::NaiveTime;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &Option<NaiveTime>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => super::hh_mm::serialize(t, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<NaiveTime>, D::Error> {
        #[derive(Deserialize)]
        struct Wrapped(#[serde(with = "super::hh_mm")] NaiveTime);
        Ok(Option::<Wrapped>::deserialize(d)?.map(|Wrapped(t)| t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(rfc3339: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(rfc3339)
            .unwrap()
            .with_timezone(&Utc)
    }

    fn hours(json: &str) -> Hours {
        let hours: Hours = serde_json::from_str(json).unwrap();
        assert_eq!(hours.problem(), None);
        hours
    }

    #[test]
    fn nine_to_ten_in_shanghai() {
        let h = hours(
            r#"{"timezone":"Asia/Shanghai","weekly":[{"weekday":1,"open":"09:00","close":"22:00"}]}"#,
        );
        // Monday 2026-11-30, 09:00 in Shanghai is 01:00 UTC.
        assert!(!h.open_at(at("2026-11-30T00:59:59Z")));
        assert!(h.open_at(at("2026-11-30T01:00:00Z")));
        assert!(h.open_at(at("2026-11-30T13:59:59Z")));
        assert!(!h.open_at(at("2026-11-30T14:00:00Z")));
        // Tuesday has no hours.
        assert!(!h.open_at(at("2026-12-01T02:00:00Z")));
    }

    #[test]
    fn new_york_across_daylight_saving_changes() {
        let h = hours(
            r#"{"timezone":"America/New_York","weekly":[{"weekday":7,"open":"01:00","close":"04:00"},{"weekday":1,"open":"09:00","close":"17:00"}]}"#,
        );
        // Sunday 2026-03-08: clocks jump from 02:00 to 03:00 EST→EDT. 01:30 EST is 06:30
        // UTC; 03:30 EDT is 07:30 UTC; 04:00 EDT (closing) is 08:00 UTC.
        assert!(h.open_at(at("2026-03-08T06:30:00Z")));
        assert!(h.open_at(at("2026-03-08T07:30:00Z")));
        assert!(!h.open_at(at("2026-03-08T08:00:00Z")));
        // Monday 09:00 is 13:00 UTC in summer time, 14:00 UTC in winter.
        assert!(h.open_at(at("2026-03-09T13:00:00Z")));
        assert!(!h.open_at(at("2026-03-02T13:00:00Z")));
        assert!(h.open_at(at("2026-03-02T14:00:00Z")));
        // Sunday 2026-11-01: 01:00–02:00 happens twice (EDT, then EST). Open through both:
        // 05:00 UTC (01:00 EDT) to 09:00 UTC (04:00 EST).
        assert!(!h.open_at(at("2026-11-01T04:59:00Z")));
        assert!(h.open_at(at("2026-11-01T05:30:00Z")));
        assert!(h.open_at(at("2026-11-01T06:30:00Z")));
        assert!(h.open_at(at("2026-11-01T08:59:00Z")));
        assert!(!h.open_at(at("2026-11-01T09:00:00Z")));
    }

    #[test]
    fn hours_past_midnight_belong_to_the_day_they_start() {
        let h =
            hours(r#"{"timezone":"UTC","weekly":[{"weekday":5,"open":"18:00","close":"02:00"}]}"#);
        assert!(h.open_at(at("2026-12-04T23:00:00Z"))); // Friday night
        assert!(h.open_at(at("2026-12-05T01:59:00Z"))); // Saturday, small hours
        assert!(!h.open_at(at("2026-12-05T02:00:00Z")));
        assert!(!h.open_at(at("2026-12-05T23:00:00Z"))); // Saturday night: no hours
    }

    #[test]
    fn exceptions_and_overrides_win_over_hours() {
        let h = hours(
            r#"{"timezone":"Asia/Shanghai",
                "weekly":[{"weekday":5,"open":"09:00","close":"22:00"}],
                "exceptions":[{"date":"2026-12-25","open":false},
                              {"date":"2026-12-26","open":true,"from":"10:00","until":"12:00"}]}"#,
        );
        // Friday 2026-12-25, noon in Shanghai: the hours say open, the exception closed.
        assert!(!h.open_at(at("2026-12-25T04:00:00Z")));
        assert!(h.open_at(at("2026-12-18T04:00:00Z")));
        // Saturday 2026-12-26 has no weekly hours, but the exception opens 10:00–12:00.
        assert!(h.open_at(at("2026-12-26T03:00:00Z")));
        assert!(!h.open_at(at("2026-12-26T04:00:00Z")));
        let closed = Override {
            open: false,
            until: Some(at("2026-12-18T05:00:00Z")),
            reason: "stock count".into(),
        };
        assert!(!open_at(&h, Some(&closed), at("2026-12-18T04:00:00Z")));
        assert!(
            open_at(&h, Some(&closed), at("2026-12-18T05:00:00Z")),
            "override ran out"
        );
        let open = Override {
            open: true,
            until: None,
            reason: "late night sale".into(),
        };
        assert!(open_at(&h, Some(&open), at("2026-12-25T04:00:00Z")));
    }

    #[test]
    fn no_hours_means_open_and_bad_hours_are_named() {
        assert!(Hours::default().open_at(at("2026-12-25T04:00:00Z")));
        let bad: Hours = serde_json::from_str(
            r#"{"timezone":"UTC","weekly":[{"weekday":8,"open":"09:00","close":"10:00"}]}"#,
        )
        .unwrap();
        assert!(bad.problem().unwrap().contains("weekday 8"));
        assert!(serde_json::from_str::<Hours>(r#"{"timezone":"Mars/Olympus"}"#).is_err());
        assert!(
            serde_json::from_str::<Hours>(
                r#"{"timezone":"UTC","weekly":[{"weekday":1,"open":"9am","close":"10:00"}]}"#
            )
            .is_err()
        );
    }
}
