//! Waiting for a condition instead of sleeping for a guess.

use std::time::{Duration, Instant};

/// Waits (up to `limit`) until `check` gives `Some`, polling every 100 ms; panics with
/// `what` and the last value seen otherwise.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + limit;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(last) => assert!(
                Instant::now() < deadline,
                "after {limit:?}, still not {what}: {last}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A read of the test's own database, asked again until it answers (up to a minute and a
/// half), each try given up after two seconds, as the server gives up its own. The checker
/// reads MySQL through the server's own pool: on a Galera cluster a read sent to a node
/// just cut off waits for its cluster, even once the node knows it is alone, and answers
/// 1205 only after Galera's 30 s `causal_read_timeout`, while the pool moves to another
/// node within a second; one such answer is not what MySQL holds.
pub async fn read_patiently<T, F, Fut>(what: &str, read: F) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    eventually(Duration::from_secs(90), what, || async {
        match tokio::time::timeout(Duration::from_secs(2), read()).await {
            Ok(answer) => answer.map_err(|e| e.to_string()),
            Err(_) => Err("no answer within 2 s".to_owned()),
        }
    })
    .await
}
