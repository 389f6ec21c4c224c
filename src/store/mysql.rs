//! MySQL/MariaDB: the pool, creating the database, and migrations.

use std::future::Future;

use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{ConnectOptions, Connection, MySqlPool};

use super::STORE_TIMEOUT;

pub type Db = MySqlPool;

/// Whether MySQL can store an instant: sqlx sends a `DateTime<Utc>` as a `TIMESTAMP`,
/// whose range is 1970-01-01T00:00:01Z to 2038-01-19T03:14:07Z (MariaDB writes NULL past
/// it), so an input outside is refused with a 400 up front.
pub fn storable(at: chrono::DateTime<chrono::Utc>) -> bool {
    (1..=i64::from(i32::MAX)).contains(&at.timestamp())
}

/// An instant to the millisecond, as MySQL's `DATETIME(3)` keeps it: a time sent again
/// compares equal to the one stored.
pub fn to_millis(at: chrono::DateTime<chrono::Utc>) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp_millis(at.timestamp_millis()).unwrap_or(at)
}

/// [`storable`]'s range, for the refusal.
pub const STORABLE: &str = "between 1970-01-01T00:00:01Z and 2038-01-19T03:14:07Z";

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("MySQL did not answer within {0:?}")]
    Timeout(Duration),
    #[error("MySQL query failed")]
    Sql(#[from] sqlx::Error),
    /// One failure reported to several waiters of a coalesced read.
    #[error(transparent)]
    Shared(std::sync::Arc<DbError>),
    /// Too many look-ups of unknown ids at once (see `MissLimit`).
    #[error("too many look-ups of unknown ids at once")]
    Busy,
}

impl DbError {
    /// Whether MySQL chose this transaction as a deadlock's victim and rolled it back
    /// (SQLSTATE 40001, error 1213; on Galera also a commit that lost certification to
    /// another node's write): running it again is safe.
    pub fn is_deadlock(&self) -> bool {
        match self {
            DbError::Sql(sqlx::Error::Database(e)) => e.code().as_deref() == Some("40001"),
            DbError::Shared(e) => e.is_deadlock(),
            _ => false,
        }
    }

    /// Whether MySQL refused the data itself (SQLSTATE class 22: a value it cannot store;
    /// 23: a constraint; 45: a trigger's signal), or it could not even be encoded: the
    /// same write fails the same way every time, so trying it again cannot help.
    pub fn is_refusal(&self) -> bool {
        match self {
            DbError::Sql(sqlx::Error::Database(e)) => e
                .code()
                .is_some_and(|code| ["22", "23", "45"].iter().any(|c| code.starts_with(c))),
            DbError::Sql(sqlx::Error::Encode(_)) => true,
            DbError::Shared(e) => e.is_refusal(),
            _ => false,
        }
    }

    /// Whether the database could not be reached (retry later), as opposed to a query that
    /// MySQL refused (a bug or bad data).
    pub fn is_unavailable(&self) -> bool {
        match self {
            DbError::Timeout(_) | DbError::Busy => true,
            // SQLSTATE class 08, a connection exception: also a Galera node outside the
            // primary component (error 1047, 08S01); 70100: the connection was killed;
            // 1205: a lock wait (or a Galera read waiting for the cluster) timed out.
            DbError::Sql(sqlx::Error::Database(e)) => {
                e.code()
                    .is_some_and(|code| code.starts_with("08") || code == "70100")
                    || e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                        .is_some_and(|e| e.number() == 1205)
            }
            DbError::Sql(e) => matches!(
                e,
                sqlx::Error::Io(_)
                    | sqlx::Error::PoolTimedOut
                    | sqlx::Error::PoolClosed
                    | sqlx::Error::WorkerCrashed
                    | sqlx::Error::Protocol(_)
                    | sqlx::Error::Tls(_)
            ),
            DbError::Shared(e) => e.is_unavailable(),
        }
    }
}

/// Runs one MySQL call with the store time limit.
pub async fn timed<T>(call: impl Future<Output = Result<T, sqlx::Error>>) -> Result<T, DbError> {
    timed_within(STORE_TIMEOUT, call).await
}

/// Runs one MySQL call that may wait for other transactions' locks, within `limit`.
pub async fn timed_within<T>(
    limit: Duration,
    call: impl Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, DbError> {
    tokio::time::timeout(limit, call)
        .await
        .map_err(|_| DbError::Timeout(limit))?
        .map_err(DbError::from)
}

/// Begins a transaction within the store time limit. Not `timed(db.begin())`: a `BEGIN`
/// cut off after it was sent leaves its connection inside a transaction sqlx does not know
/// of, and back in the pool every read on it sees the snapshot of that moment (seen when a
/// Galera cluster stalled for seconds evicting a node: a stats read counted the orders of
/// before the stall for minutes). Here the `BEGIN` runs on in its own task when the caller
/// gives up, and the transaction it opens is dropped there, which rolls it back.
pub async fn begin(db: &Db) -> Result<sqlx::Transaction<'static, sqlx::MySql>, DbError> {
    let begin = tokio::spawn({
        let db = db.clone();
        async move { db.begin().await }
    });
    match tokio::time::timeout(STORE_TIMEOUT, begin).await {
        Ok(Ok(begun)) => begun.map_err(DbError::from),
        Ok(Err(_)) => Err(DbError::Sql(sqlx::Error::WorkerCrashed)),
        Err(_) => Err(DbError::Timeout(STORE_TIMEOUT)),
    }
}

/// How often a transaction that lost a deadlock is run again.
const DEADLOCK_RETRIES: u32 = 5;

/// Runs a whole transaction again while MySQL picks it as a deadlock's victim (it was
/// rolled back whole, so running it again is safe), after a short pause that grows each
/// time so the two contenders do not meet again at once. `what` names it in the log.
pub async fn retrying_deadlocks<T, F, Fut>(what: &str, mut once: F) -> Result<T, DbError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, DbError>>,
{
    let mut attempt = 0;
    loop {
        match once().await {
            Err(e) if e.is_deadlock() && attempt < DEADLOCK_RETRIES => {
                attempt += 1;
                tracing::debug!(what, attempt, "lost a deadlock; trying again");
                // A few ms, more each time, jittered by the clock's nanoseconds.
                let jitter = u64::from(chrono::Utc::now().timestamp_subsec_nanos() % 5);
                let pause = Duration::from_millis(u64::from(attempt) * 5 + jitter);
                tokio::time::sleep(pause).await;
            }
            outcome => return outcome,
        }
    }
}

/// Connects, creating the database named in the URL first when it does not exist. Several
/// comma-separated URLs are the nodes of one Galera cluster (see `galera`).
pub async fn connect_mysql(url: &str) -> anyhow::Result<MySqlPool> {
    let urls: Vec<&str> = url.split(',').map(str::trim).collect();
    let nodes = super::galera::parse(&urls)?;
    let database = nodes[0]
        .get_database()
        .context("SECKILL_DATABASE_URL names no database (…:3306/seckill)")?
        .to_owned();
    anyhow::ensure!(
        !database.is_empty()
            && database
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_'),
        "database name {database:?}: use only A-Z, a-z, 0-9 and '_'"
    );
    // On a cluster the first node that answers creates it; Galera replicates the DDL.
    let mut created = Err(anyhow::anyhow!("no URL"));
    for url in &urls {
        created = create_database(url, &database).await;
        if created.is_ok() {
            break;
        }
    }
    created?;
    let pool = MySqlPoolOptions::new()
        .max_connections(16)
        .min_connections(1)
        // Fail fast: a request waits at most this long for a connection, never forever.
        .acquire_timeout(Duration::from_secs(1))
        .after_release(|conn, _| Box::pin(super::given_back::answers_in_time(conn)));
    if nodes.len() > 1 {
        return super::galera::connect(nodes, pool).await;
    }
    pool.connect_with(nodes[0].clone())
        .await
        .with_context(|| format!("cannot connect to MySQL database {database}"))
}

async fn create_database(url: &str, database: &str) -> anyhow::Result<()> {
    let mut server = url::Url::parse(url).context("SECKILL_DATABASE_URL is not a URL")?;
    server.set_path("");
    let mut conn = MySqlConnectOptions::from_str(server.as_str())?
        .connect()
        .await
        .with_context(|| format!("cannot connect to MySQL at {}", redacted(&server)))?;
    // The name was checked above to hold only [A-Za-z0-9_]; identifiers cannot be bound.
    let ddl = format!(
        "CREATE DATABASE IF NOT EXISTS `{database}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    Ok(())
}

fn redacted(url: &url::Url) -> String {
    format!(
        "{}:{}",
        url.host_str().unwrap_or("?"),
        url.port().unwrap_or(3306)
    )
}

/// Applies pending migrations (safe to run from several instances at once: sqlx takes a
/// database lock).
pub async fn migrate(db: &MySqlPool) -> anyhow::Result<()> {
    sqlx::migrate!("./migrations")
        .run(db)
        .await
        .context("applying migrations")
}
