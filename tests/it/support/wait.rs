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
