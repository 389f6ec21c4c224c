//! Breaker levels in Redis: those set by hand (the truth every instance follows), their
//! announcement and the background refresh of each instance's view; every instance's
//! automatic breaker (each obeys its own); and the audit log in MySQL.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::background::{Schedule, repeat};
use crate::deps::Deps;
use crate::keys::Keys;
use crate::lua::BREAKER_AUTO;
use crate::store::{Db, DbError, RedisConn, RedisConns, RedisError, mysql_timed, redis_timed};

use super::{Breakers, Level, Scope};

/// How often each instance re-reads the levels, whatever it heard.
const REFRESH_EVERY: Duration = Duration::from_millis(500);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Manual,
    Auto,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Manual => "manual",
            Source::Auto => "auto",
        }
    }
}

/// Where an automatic breaker stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AutoState {
    Closed,
    Open,
    HalfOpen,
}

impl AutoState {
    pub fn as_str(self) -> &'static str {
        match self {
            AutoState::Closed => "closed",
            AutoState::Open => "open",
            AutoState::HalfOpen => "half_open",
        }
    }
}

/// A breaker that is not closed, as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Setting {
    pub level: Level,
    pub source: Source,
    /// For automatic settings: open or half-open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<AutoState>,
    /// For automatic settings: how long it stays open before probing (grows with each
    /// failed probe).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cool_down_s: Option<u64>,
    pub by: String,
    pub reason: String,
    pub at: DateTime<Utc>,
}

/// Every breaker every instance obeys that is not closed (those set by hand). An entry that
/// cannot be read is reported and treated as absent (closed), never as a reason to refuse
/// every purchase.
pub async fn load_all(
    redis: &RedisConns,
    keys: &Keys,
) -> Result<HashMap<Scope, Setting>, RedisError> {
    load_hash(redis, &keys.breakers()).await
}

/// Every instance's automatic breaker that is not closed.
pub async fn load_automatic(
    redis: &RedisConns,
    keys: &Keys,
) -> Result<HashMap<Scope, Setting>, RedisError> {
    load_hash(redis, &keys.automatic_breakers()).await
}

async fn load_hash(redis: &RedisConns, key: &str) -> Result<HashMap<Scope, Setting>, RedisError> {
    let mut conn = redis.bulk().await?;
    let raw: HashMap<String, String> = redis_timed(conn.hgetall(key)).await?;
    Ok(raw
        .into_iter()
        .filter_map(|(field, json)| {
            let parsed = Scope::parse(&field).zip(serde_json::from_str(&json).ok());
            if parsed.is_none() {
                tracing::error!(key, field, json, "unreadable breaker entry; ignored");
            }
            parsed
        })
        .collect())
}

/// What an automatic breaker's controller looks at: the global breaker (set by hand, when
/// set) and its own entry.
pub async fn look(
    redis: &RedisConns,
    keys: &Keys,
    own: Scope,
) -> Result<(Option<Setting>, Option<Setting>), RedisError> {
    let mut conn = redis.bulk().await?;
    let global: Option<String> =
        redis_timed(conn.hget(keys.breakers(), Scope::Global.field())).await?;
    let mine: Option<String> =
        redis_timed(conn.hget(keys.automatic_breakers(), own.field())).await?;
    let read = |json: Option<String>| json.and_then(|json| serde_json::from_str(&json).ok());
    Ok((read(global), read(mine)))
}

/// The levels of these settings.
pub fn levels(settings: &HashMap<Scope, Setting>) -> HashMap<Scope, Level> {
    settings
        .iter()
        .map(|(scope, s)| (*scope, s.level))
        .collect()
}

/// What an operator's setting of a breaker works with.
pub struct ByHand<'a> {
    pub deps: &'a Deps,
    pub breakers: &'a Breakers,
}

impl ByHand<'_> {
    /// Sets `scope`'s breaker to `level` in Redis and the audit log, and has this instance
    /// obey it before returning (the others follow within a second). Returns the level it
    /// replaced and whether the audit log took the change.
    pub async fn set(
        &self,
        scope: Scope,
        level: Level,
        by: &str,
        reason: &str,
    ) -> Result<(Level, bool), RedisError> {
        let (previous, audited) = set_manual(
            &self.deps.redis,
            &self.deps.db,
            &self.deps.keys,
            scope,
            level,
            by,
            reason,
        )
        .await?;
        let settings = load_all(&self.deps.redis, &self.deps.keys).await?;
        self.breakers.set_all(&levels(&settings));
        if scope == Scope::Global {
            // Its automatic breaker was cleared with the others (its controller sees it).
            self.breakers.set_own(Level::Closed);
        }
        tracing::warn!(
            scope = scope.field(),
            previous = previous as u8,
            level = level as u8,
            by,
            reason,
            "circuit breaker set by hand"
        );
        Ok((previous, audited.is_ok()))
    }
}

/// Sets (or, with [`Level::Closed`], clears) a breaker by hand, announces it, and keeps it
/// in the audit log. Returns the level it had. The global breaker set by hand, either way,
/// also closes every instance's automatic breaker (each row in the audit log): the
/// operator's level is the one that holds, as when the automatic trips were global.
pub async fn set_manual(
    redis: &RedisConns,
    db: &Db,
    keys: &Keys,
    scope: Scope,
    level: Level,
    by: &str,
    reason: &str,
) -> Result<(Level, Result<(), DbError>), RedisError> {
    let field = scope.field();
    let mut conn = redis.bulk().await?;
    let previous: Option<String> = redis_timed(conn.hget(keys.breakers(), &field)).await?;
    let old = previous
        .and_then(|json| serde_json::from_str::<Setting>(&json).ok())
        .map_or(Level::Closed, |s| s.level);
    if level == Level::Closed {
        redis_timed(conn.hdel::<_, _, ()>(keys.breakers(), &field)).await?;
    } else {
        let setting = Setting {
            level,
            source: Source::Manual,
            state: None,
            cool_down_s: None,
            by: by.to_owned(),
            reason: reason.to_owned(),
            at: crate::clock::now(),
        };
        let json = serde_json::to_string(&setting)
            .map_err(|e| RedisError::Unexpected(format!("breaker setting: {e}")))?;
        redis_timed(conn.hset::<_, _, _, ()>(keys.breakers(), &field, json)).await?;
    }
    let cleared = match scope {
        Scope::Global => clear_automatic(redis, keys).await?,
        Scope::Item(_) | Scope::Instance(_) => HashMap::new(),
    };
    announce(&mut conn, keys).await;
    let mut audited = audit(db, scope, old, level, Source::Manual, by, reason).await;
    for (instance, setting) in cleared {
        let written = audit(
            db,
            instance,
            setting.level,
            Level::Closed,
            Source::Manual,
            by,
            reason,
        );
        audited = audited.and(written.await);
    }
    Ok((old, audited))
}

/// Closes every instance's automatic breaker; returns those it closed.
async fn clear_automatic(
    redis: &RedisConns,
    keys: &Keys,
) -> Result<HashMap<Scope, Setting>, RedisError> {
    let open = load_automatic(redis, keys).await?;
    if !open.is_empty() {
        let fields: Vec<String> = open.keys().map(|scope| scope.field()).collect();
        let mut conn = redis.bulk().await?;
        redis_timed(conn.hdel::<_, _, ()>(keys.automatic_breakers(), fields)).await?;
    }
    Ok(open)
}

/// Moves this instance's automatic breaker (`scope`) from the state `from` to `to`
/// (`None`: closed), unless an operator closed it meanwhile. Returns whether it moved.
/// Nothing is announced: no other instance obeys it.
pub async fn move_auto(
    redis: &RedisConns,
    keys: &Keys,
    scope: Scope,
    from: AutoState,
    to: Option<&Setting>,
) -> Result<bool, RedisError> {
    let json = match to {
        None => String::new(),
        Some(setting) => serde_json::to_string(setting)
            .map_err(|e| RedisError::Unexpected(format!("breaker setting: {e}")))?,
    };
    let mut conn = redis.bulk().await?;
    let moved: i64 = redis_timed(
        BREAKER_AUTO
            .key(keys.automatic_breakers())
            .arg(scope.field())
            .arg(from.as_str())
            .arg(json)
            .invoke_async(&mut conn),
    )
    .await?;
    Ok(moved == 1)
}

/// Tells every instance to re-read the levels now (a lost message costs one refresh period).
async fn announce(conn: &mut RedisConn, keys: &Keys) {
    let sent: Result<(), RedisError> =
        redis_timed(conn.publish(keys.breaker_events_channel(), 1)).await;
    if let Err(e) = sent {
        tracing::warn!(error = %e, "could not announce a breaker change; instances see it within a second anyway");
    }
}

/// One row of the audit log.
pub async fn audit(
    db: &Db,
    scope: Scope,
    old: Level,
    new: Level,
    source: Source,
    by: &str,
    reason: &str,
) -> Result<(), DbError> {
    let written = mysql_timed(
        sqlx::query(
            "INSERT INTO circuit_changes (scope, old_level, new_level, source, actor, reason)
             VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(scope.field())
        .bind(old as u8)
        .bind(new as u8)
        .bind(source.as_str())
        .bind(by)
        .bind(reason)
        .execute(db),
    )
    .await;
    if let Err(e) = &written {
        tracing::error!(scope = scope.field(), old = old as u8, new = new as u8, error = %crate::error::cause_chain(e), "breaker change not written to the audit log");
    }
    written.map(|_| ())
}

/// Keeps `breakers` in step with Redis: every half second, and at once on an announcement.
pub async fn follow(breakers: Breakers, deps: Deps, shutdown: CancellationToken) {
    let Deps {
        redis,
        keys,
        meters,
        ..
    } = deps;
    let wake = Arc::new(tokio::sync::Notify::new());
    let listener = {
        let (redis, wake, shutdown) = (redis.clone(), wake.clone(), shutdown.clone());
        let channel = keys.breaker_events_channel();
        tokio::spawn(async move {
            redis
                .listen(&channel, &shutdown, |_| wake.notify_one())
                .await
        })
    };
    // The breakers shown: the gauge of one that closed goes back to 0 (then idles away).
    let shown = std::sync::Mutex::new(HashSet::from([Scope::Global]));
    let (breakers, redis, keys, meters, shown) = (&breakers, &redis, &keys, &meters, &shown);
    let schedule = Schedule {
        every: REFRESH_EVERY,
        wake: Some(&wake),
        at_start: true,
    };
    // Failing, the last known levels stay.
    repeat(
        "reading breaker levels",
        schedule,
        &shutdown,
        || async move {
            let levels = levels(&load_all(redis, keys).await?);
            breakers.set_all(&levels);
            let mut shown = shown.lock().unwrap_or_else(|e| e.into_inner());
            shown.extend(levels.keys().copied());
            for scope in shown.iter() {
                let level = levels.get(scope).copied().unwrap_or(Level::Closed);
                meters.breaker_level(scope.field(), level as u8);
            }
            // A closed item breaker was shown at 0 once: forgotten here, its series
            // leaves /metrics when idle (so the set does not grow with every item).
            shown.retain(|scope| *scope == Scope::Global || levels.contains_key(scope));
            Ok::<_, RedisError>(())
        },
    )
    .await;
    let _ = listener.await;
}
