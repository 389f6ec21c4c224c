//! Pipelines of work grouped by cluster slot. On a Redis Cluster a pipeline may touch the
//! keys of one slot only, so work that spans items (a consumer batch clearing the `pending`
//! hashes of several items, the catalogue reading every item's stock) is built one group
//! per item: on one Redis server the groups still travel as one pipeline, one round trip;
//! on a cluster each group is its own pipeline, all sent at once.

use futures::future::try_join_all;
use redis::{FromRedisValue, Pipeline, Value};

use super::{RedisConns, RedisError, redis_timed};

pub struct Grouped {
    cluster: bool,
    /// One pipeline (one server), or one per group (a cluster).
    pipes: Vec<Pipeline>,
    /// On one server: where each group's commands begin in the one pipeline.
    starts: Vec<usize>,
}

impl Grouped {
    pub fn new(redis: &RedisConns) -> Self {
        Self {
            cluster: redis.is_cluster(),
            pipes: Vec::new(),
            starts: Vec::new(),
        }
    }

    /// A new group: every key its commands touch must share one slot (one hash tag).
    /// For [`Grouped::query`], no command may be `ignore`d.
    pub fn group(&mut self) -> &mut Pipeline {
        if self.cluster || self.pipes.is_empty() {
            self.pipes.push(redis::pipe());
        }
        let last = self.pipes.len() - 1;
        self.starts.push(self.pipes[last].len());
        &mut self.pipes[last]
    }

    /// Sends every group; answers are dropped.
    pub async fn run(self, redis: &RedisConns) -> Result<(), RedisError> {
        self.send(redis).await.map(drop)
    }

    /// Sends every group and gives each group's answers as one `T` (read from the array
    /// of its commands' answers).
    pub async fn query<T: FromRedisValue>(self, redis: &RedisConns) -> Result<Vec<T>, RedisError> {
        let cluster = self.cluster;
        let starts = self.starts.clone();
        let answers = self.send(redis).await?;
        let groups: Vec<Vec<Value>> = if cluster {
            answers
        } else {
            let flat = answers.into_iter().next().unwrap_or_default();
            let mut ends: Vec<usize> = starts.iter().skip(1).copied().collect();
            ends.push(flat.len());
            let mut flat = flat.into_iter();
            starts
                .iter()
                .zip(ends)
                .map(|(start, end)| flat.by_ref().take(end - start).collect())
                .collect()
        };
        groups
            .into_iter()
            .map(|answers| {
                T::from_redis_value(Value::Array(answers))
                    .map_err(|e| RedisError::Unexpected(e.to_string()))
            })
            .collect()
    }

    /// Each pipeline's answers (an empty one is not sent: Redis clients refuse it).
    async fn send(self, redis: &RedisConns) -> Result<Vec<Vec<Value>>, RedisError> {
        try_join_all(self.pipes.into_iter().map(|pipe| async move {
            if pipe.is_empty() {
                return Ok(Vec::new());
            }
            let mut conn = redis.bulk().await?;
            redis_timed(pipe.query_async::<Vec<Value>>(&mut conn)).await
        }))
        .await
    }
}
