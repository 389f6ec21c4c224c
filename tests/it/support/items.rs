//! Items as a test wants them: `env.item(id, total)` is on sale now for an hour, paid
//! within 30 minutes, in one bucket, unless told otherwise; `.put(&server)` writes it,
//! `.on_sale(&server)` writes and loads it.

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::env::TestEnv;
use super::server::TestServer;

pub struct ItemSpec<'e> {
    env: &'e TestEnv,
    id: u64,
    total: u32,
    start_at: DateTime<Utc>,
    end_at: DateTime<Utc>,
    pay_timeout_s: u32,
    buckets: u8,
}

impl TestEnv {
    /// An item of `total` units; see the module's header for what it is unless told.
    pub fn item(&self, id: u64, total: u32) -> ItemSpec<'_> {
        let now = Utc::now();
        ItemSpec {
            env: self,
            id,
            total,
            start_at: now - chrono::Duration::seconds(5),
            end_at: now + chrono::Duration::hours(1),
            pay_timeout_s: 1800,
            buckets: 1,
        }
    }
}

impl ItemSpec<'_> {
    /// Orders must be paid within `seconds`.
    pub fn paying_within(mut self, seconds: u32) -> Self {
        self.pay_timeout_s = seconds;
        self
    }

    /// On sale from `start_at` to `end_at`.
    pub fn window(mut self, start_at: DateTime<Utc>, end_at: DateTime<Utc>) -> Self {
        self.start_at = start_at;
        self.end_at = end_at;
        self
    }

    /// Split over `buckets` Redis buckets.
    pub fn buckets(mut self, buckets: u8) -> Self {
        self.buckets = buckets;
        self
    }

    /// `PUT /admin/items/{id}`; its answer.
    pub async fn put(self, server: &TestServer) -> Value {
        let id = self.id;
        let response = self
            .env
            .admin(reqwest::Method::PUT, server, &format!("/admin/items/{id}"))
            .json(&json!({
                "name": format!("item {id}"),
                "shop_id": 1,
                "total": self.total,
                "start_at": self.start_at,
                "end_at": self.end_at,
                "price_cents": 1999,
                "pay_timeout_s": self.pay_timeout_s,
                "buckets": self.buckets,
            }))
            .send()
            .await
            .unwrap();
        let status = response.status();
        let json: Value = response.json().await.unwrap_or(Value::Null);
        assert!(status.is_success(), "PUT item: {status} {json}");
        json
    }

    /// Written and loaded; the warm-up's answer.
    pub async fn on_sale(self, server: &TestServer) -> Value {
        let (env, id) = (self.env, self.id);
        self.put(server).await;
        env.warmup(server, id).await
    }
}
