//! Look-ups of ids this instance does not know — an item or a shop nobody has asked for
//! yet, or one that does not exist — share a few of MySQL's connections, so that a flood
//! of made-up ids from the open internet never takes the pool from buyers paying,
//! cancelling and having their orders written.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::DbError;

/// Look-ups of unknown ids running at once (of the pool's 16 connections).
const PERMITS: usize = 4;
/// How long a look-up waits for its turn before the reader hears `503`.
const WAIT: Duration = Duration::from_millis(200);

#[derive(Clone)]
pub struct MissLimit(Arc<Semaphore>);

impl Default for MissLimit {
    fn default() -> Self {
        Self(Arc::new(Semaphore::new(PERMITS)))
    }
}

impl MissLimit {
    /// Runs `lookup` once it has a turn; [`DbError::Busy`] when none came in time.
    pub async fn run<T>(
        &self,
        lookup: impl Future<Output = Result<T, DbError>>,
    ) -> Result<T, DbError> {
        let _turn = tokio::time::timeout(WAIT, self.0.acquire())
            .await
            .map_err(|_| DbError::Busy)?
            .map_err(|_| DbError::Busy)?;
        lookup.await
    }
}
