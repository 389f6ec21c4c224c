//! Shops in MySQL: the record every cache layer is filled from, and the change log.

use chrono::{DateTime, NaiveDate, NaiveTime, Utc};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};
use sqlx::QueryBuilder;

use crate::store::{Db, DbError, mysql_begin, mysql_timed};

use super::hours::{self, Exception, Hours, Override, Weekly};

/// A shop as every layer holds it: enough to tell whether it is open at any instant.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Shop {
    pub id: u64,
    pub hours: Hours,
    #[serde(rename = "override")]
    pub overridden: Option<Override>,
    pub updated_at: DateTime<Utc>,
}

impl Shop {
    pub fn open_at(&self, now: DateTime<Utc>) -> bool {
        hours::open_at(&self.hours, self.overridden.as_ref(), now)
    }
}

type ShopRow = (
    String,
    Option<bool>,
    Option<DateTime<Utc>>,
    Option<String>,
    DateTime<Utc>,
);

pub async fn load(db: &Db, id: u64) -> Result<Option<Shop>, DbError> {
    let row: Option<ShopRow> = mysql_timed(
        sqlx::query_as(
            "SELECT timezone, override_open, override_until, override_reason, updated_at
             FROM shops WHERE id = ?",
        )
        .bind(id)
        .fetch_optional(db),
    )
    .await?;
    let Some((timezone, open, until, reason, updated_at)) = row else {
        return Ok(None);
    };
    let weekly: Vec<(u8, NaiveTime, NaiveTime)> = mysql_timed(
        sqlx::query_as(
            "SELECT weekday, open_time, close_time FROM shop_hours
             WHERE shop_id = ? ORDER BY weekday, open_time",
        )
        .bind(id)
        .fetch_all(db),
    )
    .await?;
    let exceptions: Vec<(NaiveDate, bool, Option<NaiveTime>, Option<NaiveTime>)> = mysql_timed(
        sqlx::query_as(
            "SELECT day, open, from_time, until_time FROM shop_exceptions
             WHERE shop_id = ? ORDER BY day",
        )
        .bind(id)
        .fetch_all(db),
    )
    .await?;
    let timezone = timezone.parse::<Tz>().unwrap_or_else(|_| {
        tracing::error!(shop = id, timezone, "unknown time zone in MySQL; using UTC");
        Tz::UTC
    });
    Ok(Some(Shop {
        id,
        hours: Hours {
            timezone,
            weekly: weekly
                .into_iter()
                .map(|(weekday, open, close)| Weekly {
                    weekday,
                    open,
                    close,
                })
                .collect(),
            exceptions: exceptions
                .into_iter()
                .map(|(date, open, from, until)| Exception {
                    date,
                    open,
                    from,
                    until,
                })
                .collect(),
        },
        overridden: open.map(|open| Override {
            open,
            until,
            reason: reason.unwrap_or_default(),
        }),
        updated_at,
    }))
}

pub async fn all_ids(db: &Db) -> Result<Vec<u64>, DbError> {
    mysql_timed(sqlx::query_scalar("SELECT id FROM shops").fetch_all(db)).await
}

/// Replaces the shop's hours (creating the shop if it is new), in one transaction. Like
/// every change, it flags the shop for Redis (`redis_stale`) in the same write.
pub async fn set_hours(db: &Db, id: u64, hours: &Hours) -> Result<(), DbError> {
    let mut tx = mysql_begin(db).await?;
    mysql_timed(
        sqlx::query(
            "INSERT INTO shops (id, timezone, updated_at, redis_stale)
             VALUES (?, ?, UTC_TIMESTAMP(3), TRUE)
             ON DUPLICATE KEY UPDATE timezone = VALUES(timezone), updated_at = VALUES(updated_at),
               redis_stale = TRUE",
        )
        .bind(id)
        .bind(hours.timezone.name())
        .execute(&mut *tx),
    )
    .await?;
    for table in ["shop_hours", "shop_exceptions"] {
        let delete = format!("DELETE FROM {table} WHERE shop_id = ?");
        mysql_timed(
            sqlx::query(sqlx::AssertSqlSafe(delete))
                .bind(id)
                .execute(&mut *tx),
        )
        .await?;
    }
    if !hours.weekly.is_empty() {
        let mut insert =
            QueryBuilder::new("INSERT INTO shop_hours (shop_id, weekday, open_time, close_time) ");
        insert.push_values(&hours.weekly, |mut row, w| {
            row.push_bind(id)
                .push_bind(w.weekday)
                .push_bind(w.open)
                .push_bind(w.close);
        });
        mysql_timed(insert.build().execute(&mut *tx)).await?;
    }
    if !hours.exceptions.is_empty() {
        let mut insert = QueryBuilder::new(
            "INSERT INTO shop_exceptions (shop_id, day, open, from_time, until_time) ",
        );
        insert.push_values(&hours.exceptions, |mut row, e| {
            row.push_bind(id)
                .push_bind(e.date)
                .push_bind(e.open)
                .push_bind(e.from)
                .push_bind(e.until);
        });
        mysql_timed(insert.build().execute(&mut *tx)).await?;
    }
    mysql_timed(tx.commit()).await?;
    Ok(())
}

/// Sets or clears (`None`) the operator's override, creating the shop if it is new.
pub async fn set_override(db: &Db, id: u64, value: Option<&Override>) -> Result<(), DbError> {
    mysql_timed(
        sqlx::query(
            "INSERT INTO shops (id, override_open, override_until, override_reason, updated_at,
                                redis_stale)
             VALUES (?, ?, ?, ?, UTC_TIMESTAMP(3), TRUE)
             ON DUPLICATE KEY UPDATE override_open = VALUES(override_open),
               override_until = VALUES(override_until),
               override_reason = VALUES(override_reason), updated_at = VALUES(updated_at),
               redis_stale = TRUE",
        )
        .bind(id)
        .bind(value.map(|o| o.open))
        .bind(value.and_then(|o| o.until))
        .bind(value.map(|o| o.reason.as_str()))
        .execute(db),
    )
    .await?;
    Ok(())
}

/// Flags the shop for Redis: its record is to be pushed there (a refresh by hand).
pub async fn mark_redis_stale(db: &Db, id: u64) -> Result<(), DbError> {
    mysql_timed(
        sqlx::query("UPDATE shops SET redis_stale = TRUE WHERE id = ?")
            .bind(id)
            .execute(db),
    )
    .await?;
    Ok(())
}

/// Redis holds the shop as of `updated_at`: the flag goes, unless a newer change came.
pub async fn mark_redis_synced(db: &Db, id: u64, updated_at: DateTime<Utc>) -> Result<(), DbError> {
    mysql_timed(
        sqlx::query("UPDATE shops SET redis_stale = FALSE WHERE id = ? AND updated_at = ?")
            .bind(id)
            .bind(updated_at)
            .execute(db),
    )
    .await?;
    Ok(())
}

/// Shops changed in MySQL that Redis did not take yet.
pub async fn redis_stale_ids(db: &Db) -> Result<Vec<u64>, DbError> {
    mysql_timed(sqlx::query_scalar("SELECT id FROM shops WHERE redis_stale").fetch_all(db)).await
}

/// One row of the change log.
pub async fn log_change(
    db: &Db,
    id: u64,
    what: &str,
    old_open: bool,
    new_open: bool,
    actor: &str,
    reason: &str,
) -> Result<(), DbError> {
    mysql_timed(
        sqlx::query(
            "INSERT INTO shop_changes (shop_id, what, old_open, new_open, actor, reason)
             VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(id)
        .bind(what)
        .bind(old_open)
        .bind(new_open)
        .bind(actor)
        .bind(reason)
        .execute(db),
    )
    .await?;
    Ok(())
}
