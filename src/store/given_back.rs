//! A connection given back to the MySQL pool: checked within a time limit before it is
//! pooled again (for one server and for a Galera cluster alike).

use std::time::Duration;

use sqlx::Connection;
use sqlx::mysql::MySqlConnection;

/// How long a connection given back to the pool has to answer a ping.
const RELEASE_WITHIN: Duration = Duration::from_secs(1);

/// Whether a connection given back to the pool answers a ping within [`RELEASE_WITHIN`];
/// one that does not is closed at once (`Err`), not pooled.
///
/// sqlx itself pings every returned connection, after this, with no time limit. A
/// statement cut off by its caller's time limit leaves its answer owed on the connection,
/// and the ping waits for it first. While MySQL was still at such statements (behind a row
/// lock for up to 50 s; on a Galera node cut off from its cluster, waiting for it) each of
/// their connections stayed counted against the pool's 16, and once 16 were waiting no
/// request could get a connection, even after the pool had moved to a node that answers.
pub(super) async fn answers_in_time(conn: &mut MySqlConnection) -> Result<bool, sqlx::Error> {
    match tokio::time::timeout(RELEASE_WITHIN, conn.ping()).await {
        Ok(answered) => answered.map(|()| true),
        Err(_) => Err(sqlx::Error::PoolTimedOut),
    }
}
