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
    per_user: u8,
    release: Vec<(DateTime<Utc>, u32)>,
    draw_at: Option<DateTime<Utc>>,
    queue: Option<Value>,
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
            per_user: 1,
            release: Vec::new(),
            draw_at: None,
            queue: None,
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

    /// A buyer may hold up to `n` live orders.
    pub fn per_user(mut self, n: u8) -> Self {
        self.per_user = n;
        self
    }

    /// Waves: `units` added at each time.
    pub fn release(mut self, waves: &[(DateTime<Utc>, u32)]) -> Self {
        self.release = waves.to_vec();
        self
    }

    /// A draw at `draw_at`.
    pub fn draw(mut self, draw_at: DateTime<Utc>) -> Self {
        self.draw_at = Some(draw_at);
        self
    }

    /// A waiting room in front of the sale (`"queue": settings`).
    pub fn queued(mut self, settings: Value) -> Self {
        self.queue = Some(settings);
        self
    }

    /// The body of its `PUT /admin/items/{id}`.
    pub fn body(&self) -> Value {
        let release: Vec<Value> = self
            .release
            .iter()
            .map(|(at, units)| json!({ "at": at, "units": units }))
            .collect();
        let mut body = json!({
            "name": format!("item {}", self.id),
            "shop_id": 1,
            "total": self.total,
            "start_at": self.start_at,
            "end_at": self.end_at,
            "price_cents": 1999,
            "pay_timeout_s": self.pay_timeout_s,
            "buckets": self.buckets,
            "per_user": self.per_user,
            "release": release,
        });
        if let Some(draw_at) = self.draw_at {
            body["mode"] = json!("draw");
            body["draw_at"] = json!(draw_at);
        }
        if let Some(queue) = &self.queue {
            body["queue"] = queue.clone();
        }
        body
    }

    /// `PUT /admin/items/{id}`: its status and answer.
    pub async fn try_put(&self, server: &TestServer) -> (u16, Value) {
        let id = self.id;
        let response = self
            .env
            .admin(reqwest::Method::PUT, server, &format!("/admin/items/{id}"))
            .json(&self.body())
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// `PUT /admin/items/{id}`; its answer.
    pub async fn put(self, server: &TestServer) -> Value {
        let (status, json) = self.try_put(server).await;
        assert!((200..300).contains(&status), "PUT item: {status} {json}");
        json
    }

    /// Written and loaded; the warm-up's answer.
    pub async fn on_sale(self, server: &TestServer) -> Value {
        let (env, id) = (self.env, self.id);
        self.put(server).await;
        env.warmup(server, id).await
    }
}
