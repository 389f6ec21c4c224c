//! Redis connections: one multiplexed connection for the purchase path and a small pool for
//! everything else.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::{PoolConfig, Runtime, Timeouts};
use futures::StreamExt;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio_util::sync::CancellationToken;

use super::STORE_TIMEOUT;

#[derive(Debug, thiserror::Error)]
pub enum RedisError {
    #[error("Redis did not answer within {0:?}")]
    Timeout(Duration),
    #[error("Redis command failed")]
    Command(#[from] redis::RedisError),
    #[error("no Redis connection available")]
    Pool(#[from] deadpool_redis::PoolError),
    #[error("Redis answered something unexpected: {0}")]
    Unexpected(String),
}

/// Runs one Redis call with the store time limit.
pub async fn timed<T, E>(call: impl Future<Output = Result<T, E>>) -> Result<T, RedisError>
where
    RedisError: From<E>,
{
    match tokio::time::timeout(STORE_TIMEOUT, call).await {
        Ok(result) => result.map_err(RedisError::from),
        Err(_) => Err(RedisError::Timeout(STORE_TIMEOUT)),
    }
}

#[derive(Clone)]
pub struct RedisConns {
    /// One multiplexed connection shared by every purchase: commands from all requests are
    /// pipelined on it, with no checkout and no PING per request (a pooled checkout costs a
    /// round trip, measured at about 40% of the purchase path).
    pub hot: ConnectionManager,
    /// Pooled connections for bulk and background work (warm-up, relay, consumer, stats),
    /// so that a large pipeline never queues ahead of purchases on the hot connection.
    pool: deadpool_redis::Pool,
    /// For pub/sub, which needs a connection of its own. (Behind an Arc: this struct is
    /// cloned with every handler's state, and a client clone copies its connection info.)
    client: Arc<redis::Client>,
}

impl RedisConns {
    /// Builds the connections without touching the network: a server starts while Redis is
    /// down and reports it on `/readyz`; each call then fails fast until Redis is back.
    pub fn new(url: &str) -> anyhow::Result<Self> {
        let client = redis::Client::open(url)?;
        let hot = ConnectionManager::new_lazy_with_config(
            client.clone(),
            ConnectionManagerConfig::new()
                .set_connection_timeout(Some(Duration::from_millis(500)))
                .set_response_timeout(Some(STORE_TIMEOUT))
                .set_max_delay(Duration::from_secs(1)),
        )?;
        let mut config = deadpool_redis::Config::from_url(url);
        let mut pool = PoolConfig::new(16);
        pool.timeouts = Timeouts {
            wait: Some(STORE_TIMEOUT),
            create: Some(STORE_TIMEOUT),
            recycle: Some(STORE_TIMEOUT),
        };
        config.pool = Some(pool);
        let pool = config.create_pool(Some(Runtime::Tokio1))?;
        Ok(Self {
            hot,
            pool,
            client: Arc::new(client),
        })
    }

    /// A pooled connection for background work.
    pub async fn bulk(&self) -> Result<deadpool_redis::Connection, RedisError> {
        Ok(self.pool.get().await?)
    }

    /// The database number of the URL (keyspace notification channels name it).
    pub fn db(&self) -> i64 {
        self.client.get_connection_info().redis_settings().db()
    }

    pub async fn pubsub(&self) -> Result<redis::aio::PubSub, RedisError> {
        timed(self.client.get_async_pubsub()).await
    }

    /// Listens on a pub/sub channel until shutdown, subscribing again whenever the
    /// connection is lost. `on_message` gets each message, and `None` after every
    /// (re)subscription: messages sent while nobody listened are lost, so the caller should
    /// look for itself then.
    pub async fn listen(
        &self,
        channel: &str,
        shutdown: &CancellationToken,
        mut on_message: impl FnMut(Option<&redis::Msg>),
    ) {
        while !shutdown.is_cancelled() {
            let subscribed = async {
                let mut pubsub = self.pubsub().await?;
                timed(pubsub.subscribe(channel)).await?;
                Ok::<_, RedisError>(pubsub)
            }
            .await;
            match subscribed {
                Ok(pubsub) => {
                    on_message(None);
                    let mut messages = pubsub.into_on_message();
                    loop {
                        tokio::select! {
                            () = shutdown.cancelled() => return,
                            message = messages.next() => match message {
                                Some(m) => on_message(Some(&m)),
                                None => break,
                            },
                        }
                    }
                }
                Err(e) => tracing::debug!(channel, error = %e, "cannot subscribe yet"),
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    pub async fn ping(&self) -> Result<(), RedisError> {
        let mut conn = self.hot.clone();
        timed(redis::cmd("PING").query_async::<()>(&mut conn)).await
    }
}
