//! A server under test (in this process, or a child process's address), and purchases
//! sent to one.

use std::net::SocketAddr;
use std::time::Duration;

use chrono::Utc;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// A running server.
pub struct TestServer {
    pub addr: SocketAddr,
    /// Set when the server has a separate admin listener.
    pub admin_addr: Option<SocketAddr>,
    pub(super) shutdown: CancellationToken,
    pub(super) handle: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl TestServer {
    /// A server this test did not start in-process (a child process, say).
    pub fn external(addr: SocketAddr) -> Self {
        Self {
            addr,
            admin_addr: None,
            shutdown: CancellationToken::new(),
            handle: None,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Graceful shutdown, as on SIGTERM; fails the test if the server reports an error.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(handle) = self.handle.take() {
            // Generous: on a loaded 2-core machine (private clusters booting beside) a
            // stop that waits for its publisher's confirms can take seconds; a hang cannot.
            tokio::time::timeout(Duration::from_secs(60), handle)
                .await
                .expect("server stops within 60 s")
                .expect("server task")
                .expect("server ends cleanly");
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

pub async fn buy(http: &reqwest::Client, addr: SocketAddr, token: &str, item: u64) -> (u16, Value) {
    let response = buy_response(http, addr, token, item).await;
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// A purchase's whole answer (for its headers).
pub async fn buy_response(
    http: &reqwest::Client,
    addr: SocketAddr,
    token: &str,
    item: u64,
) -> reqwest::Response {
    http.post(format!("http://{addr}/api/flashbuy"))
        .bearer_auth(token)
        .header("x-client-time", Utc::now().timestamp_millis().to_string())
        .json(&json!({ "item_id": item }))
        .send()
        .await
        .unwrap()
}
