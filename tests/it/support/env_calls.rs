//! What a test asks of its servers and its stores through its [`TestEnv`]: admin and
//! buyer calls, orders and stock, and the contract's invariants judged on them.

use std::collections::HashMap;
use std::time::Duration;

use chrono::Utc;
use redis::AsyncCommands;
use serde_json::{Value, json};

use seckill::domain::{BucketId, ItemId, UserId};
use seckill::testing::OrderStatus;
use seckill::testing::invariants::{self, InRedis, Orders, Outcome};

use super::env::{ADMIN_TOKEN, TestEnv};
use super::server::{TestServer, buy};
use super::wait::{eventually, read_patiently};

impl TestEnv {
    pub fn token(&self, user: u64) -> String {
        self.jwt
            .mint(UserId::new(user), Duration::from_secs(600))
            .unwrap()
    }

    pub async fn warmup(&self, server: &TestServer, id: u64) -> Value {
        let response = self
            .admin(
                reqwest::Method::POST,
                server,
                &format!("/admin/items/{id}/warmup"),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "warmup");
        response.json().await.unwrap()
    }

    /// `POST path` as `user` (pay, cancel): status and JSON body.
    pub async fn post_as(&self, server: &TestServer, path: &str, user: u64) -> (u16, Value) {
        let response = self
            .http
            .post(server.url(path))
            .bearer_auth(self.token(user))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// Sends a payment event as its provider would: `event` signed now with this test's
    /// payment secret. The answer.
    pub async fn payment_event(&self, server: &TestServer, event: &Value) -> (u16, Value) {
        let response = self.signed_payment(server, event).send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// The request that sends `event` to `server` as its provider would: signed now with
    /// this test's payment secret.
    pub fn signed_payment(&self, server: &TestServer, event: &Value) -> reqwest::RequestBuilder {
        let body = event.to_string();
        let secret = self.settings.payment_secret[0].expose();
        let header =
            seckill::testing::sign_payment(secret, chrono::Utc::now().timestamp(), body.as_bytes());
        self.http
            .post(server.url("/api/payments/events"))
            .header(seckill::testing::PAYMENT_SIGNATURE, header)
            .header("Content-Type", "application/json")
            .body(body)
    }

    /// A `payment.succeeded` event for `order_sn`, for its item's price (test items cost
    /// 1999), from a charge of its own.
    pub fn payment(&self, kind: &str, order_sn: &str) -> Value {
        let id = ulid::Ulid::new();
        serde_json::json!({
            "event_id": format!("evt_{id}"),
            "type": kind,
            "order_sn": order_sn,
            "amount_cents": 1999,
            "currency": "CNY",
            "occurred_at": chrono::Utc::now(),
            "provider_ref": format!("ch_{order_sn}"),
        })
    }

    /// Pays `order_sn` as the payment provider would (`payment.succeeded`): the answer.
    pub async fn pay(&self, server: &TestServer, order_sn: &str) -> (u16, Value) {
        let event = self.payment("payment.succeeded", order_sn);
        self.payment_event(server, &event).await
    }

    /// Status of an order in MySQL (`None`: not there).
    pub async fn order_status(&self, order_sn: &str) -> Option<String> {
        sqlx::query_scalar("SELECT status FROM orders WHERE order_sn = ?")
            .bind(order_sn)
            .fetch_optional(&self.db)
            .await
            .unwrap()
    }

    /// Units on sale in Redis, over every bucket of the item (waves still to come among
    /// them), as [`TestEnv::in_redis`] counts them.
    pub async fn remaining(&self, item: u64) -> u64 {
        self.in_redis(item).await.remaining
    }

    /// Writes fields of the item's meta (its only bucket) as the server writes them: with
    /// what `grab.lua` checks packed again (`lua/rules_set.lua`). A plain `HSET` is what a
    /// server of an earlier release writes.
    pub async fn set_meta(&self, item: u64, fields: &[(&str, &str)]) {
        let mut call = seckill::testing::lua::RULES_SET.key(self.item_keys(item).meta);
        for (field, value) in fields {
            call.arg(*field).arg(*value);
        }
        call.invoke_async::<()>(&mut self.redis.clone())
            .await
            .unwrap();
    }

    /// How many buckets the item's record splits it over.
    /// (Read patiently, as every helper here reads MySQL: a Galera node just cut off or
    /// killed makes a read wait on its locks, and the galera test once failed on it.)
    async fn buckets_of(&self, item: u64) -> u8 {
        let (buckets,): (u8,) = read_patiently("the item's buckets", || {
            sqlx::query_as("SELECT buckets FROM items WHERE id = ?")
                .bind(item)
                .fetch_one(&self.db)
        })
        .await;
        buckets
    }

    /// The item's units on sale and orders pending in Redis, over its buckets (one command
    /// a key: a cluster's client follows a moved slot for those). Units on sale are those
    /// listed and those lent between two buckets and not arrived (docs/contract.md §7,
    /// invariant 4), read here apart from the server's own count.
    pub async fn in_redis(&self, item: u64) -> InRedis {
        let buckets = self.buckets_of(item).await;
        let all = self.keys();
        let mut held = InRedis {
            remaining: 0,
            pending: 0,
        };
        let id = ItemId::new(item).expect("an item id");
        for stock in BucketId::all(id, buckets) {
            let keys = all.bucket(stock);
            let listed: u64 = self.redis.clone().llen(&keys.tokens).await.unwrap();
            let pending: u64 = self.redis.clone().hlen(&keys.pending).await.unwrap();
            held.remaining += listed;
            held.pending += pending;
            // Lent to another bucket and not arrived: on sale, on no list. A loan whose
            // home bucket decided it `in` is on the home list already.
            let loans: HashMap<String, String> =
                self.redis.clone().hgetall(&keys.lent).await.unwrap();
            for (transfer, record) in loans {
                let home: u8 = record.split('|').next().unwrap().parse().unwrap();
                let home = all.bucket(BucketId::new(id, home));
                let decided: Option<String> = self
                    .redis
                    .clone()
                    .hget(&home.transfers, &transfer)
                    .await
                    .unwrap();
                if decided.as_deref() != Some("in") {
                    held.remaining += 1;
                }
            }
        }
        held
    }

    /// Each of the item's buckets as Redis holds it, one line each, for the report of a
    /// failing test: its meta's sale fields, the units listed, its loans and the transfers
    /// it decided.
    pub async fn buckets_report(&self, item: u64) -> String {
        let buckets = self.buckets_of(item).await;
        let all = self.keys();
        let id = ItemId::new(item).expect("an item id");
        let mut report = Vec::new();
        for stock in BucketId::all(id, buckets) {
            let keys = all.bucket(stock);
            let mut redis = self.redis.clone();
            let meta: Vec<Option<String>> = redis::cmd("HMGET")
                .arg(&keys.meta)
                .arg(&["loaded", "paused", "fenced", "total", "waves", "lends"])
                .query_async(&mut redis)
                .await
                .unwrap_or_default();
            let listed: u64 = redis.llen(&keys.tokens).await.unwrap_or(0);
            let lent: HashMap<String, String> = redis.hgetall(&keys.lent).await.unwrap_or_default();
            let transfers: HashMap<String, String> =
                redis.hgetall(&keys.transfers).await.unwrap_or_default();
            report.push(format!(
                "bucket {}: listed {listed}; loaded, paused, fenced, total, waves, lends {meta:?}; lent {lent:?}; transfers {transfers:?}",
                stock.index
            ));
        }
        report.join("\n")
    }

    /// Runs `refused` (presses the test expects refused: paused, shop closed, a breaker
    /// open, …) and asserts that they took nothing: the item's units on sale and orders
    /// pending in Redis are the same after as before. The caller makes sure nothing else
    /// moves them meanwhile (the orders before it landed). Returns what `refused` gave.
    pub async fn takes_nothing<T>(
        &self,
        item: u64,
        refused: impl std::future::Future<Output = T>,
    ) -> T {
        let before = self.in_redis(item).await;
        let answer = refused.await;
        let after = self.in_redis(item).await;
        assert_eq!(
            (after.remaining, after.pending),
            (before.remaining, before.pending),
            "a refused press moved item {item}'s stock (units on sale, orders pending)"
        );
        answer
    }

    /// Locks the row of shop 1 (every test item's) in a transaction of the test's own: an
    /// item write of the server then stops at its MySQL transaction, everything before it
    /// done (its checks, its locks and steps in Redis), until the returned transaction ends
    /// — for at most the server's store time limit (0.8 s), after which the write fails.
    /// [`TestEnv::until_an_item_write_waits`] tells when one does. For races a test cannot
    /// time otherwise.
    pub async fn hold_shop_row(&self) -> sqlx::Transaction<'static, sqlx::MySql> {
        let mut tx = self.db.begin().await.unwrap();
        sqlx::query("SELECT id FROM shops WHERE id = 1 FOR UPDATE")
            .fetch_all(&mut *tx)
            .await
            .unwrap();
        tx
    }

    /// Waits (up to 5 s) until an item write of the server waits for the shop row
    /// [`TestEnv::hold_shop_row`] holds.
    pub async fn until_an_item_write_waits(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let (waiting,): (i64,) = sqlx::query_as(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                 WHERE DB = ? AND INFO LIKE 'INSERT INTO shops%'",
            )
            .bind(self.database())
            .fetch_one(&self.db)
            .await
            .unwrap();
            if waiting > 0 {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no item write came to the shop row"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub fn admin(
        &self,
        method: reqwest::Method,
        server: &TestServer,
        path: &str,
    ) -> reqwest::RequestBuilder {
        self.http
            .request(method, server.url(path))
            .bearer_auth(ADMIN_TOKEN)
    }

    /// The server's `/metrics` text.
    pub async fn metrics_text(&self, server: &TestServer) -> String {
        let response = self.http.get(server.url("/metrics")).send().await.unwrap();
        assert_eq!(response.status(), 200);
        response.text().await.unwrap()
    }

    /// `GET path` with the admin token: status and JSON body.
    pub async fn admin_get(&self, server: &TestServer, path: &str) -> (u16, Value) {
        let response = self
            .admin(reqwest::Method::GET, server, path)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// `POST path` with the admin token: status and JSON body.
    pub async fn admin_post(&self, server: &TestServer, path: &str) -> (u16, Value) {
        let response = self
            .admin(reqwest::Method::POST, server, path)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// Deletes every Redis key of this test's namespace: what this deployment sees of a
    /// Redis that lost its data (the shared Redis itself is never flushed).
    pub async fn lose_redis_state(&self) {
        let mut redis = self.redis.clone();
        let keys: Vec<String> = redis.keys(format!("{}:*", self.namespace)).await.unwrap();
        if !keys.is_empty() {
            redis.del::<_, ()>(keys).await.unwrap();
        }
    }

    pub async fn stats(&self, server: &TestServer, id: u64) -> Value {
        self.admin(
            reqwest::Method::GET,
            server,
            &format!("/admin/items/{id}/stats"),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
    }

    /// `POST /api/flashbuy` as `user`.
    pub async fn buy(&self, server: &TestServer, user: u64, item: u64) -> (u16, Value) {
        buy(&self.http, server.addr, &self.token(user), item).await
    }

    /// A purchase request ready to send (token, client time, body), for tests that add to it.
    pub fn purchase(&self, server: &TestServer, user: u64, item: u64) -> reqwest::RequestBuilder {
        self.http
            .post(server.url("/api/flashbuy"))
            .bearer_auth(self.token(user))
            .header("x-client-time", Utc::now().timestamp_millis().to_string())
            .json(&json!({ "item_id": item }))
    }

    /// `GET path`, as `user` when given: status and JSON body.
    pub async fn get(&self, server: &TestServer, path: &str, user: Option<u64>) -> (u16, Value) {
        let mut request = self.http.get(server.url(path));
        if let Some(user) = user {
            request = request.bearer_auth(self.token(user));
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// Orders in MySQL for an item.
    pub async fn orders(&self, item: u64) -> Vec<(String, u64, String)> {
        read_patiently("the orders of an item", || {
            sqlx::query_as("SELECT order_sn, user_id, status FROM orders WHERE item_id = ?")
                .bind(item)
                .fetch_all(&self.db)
        })
        .await
    }

    /// How many orders MySQL has for an item (one round trip, however many there are).
    pub async fn order_count(&self, item: u64) -> u64 {
        let (count,): (i64,) = read_patiently("a count of the orders", || {
            sqlx::query_as("SELECT COUNT(*) FROM orders WHERE item_id = ?")
                .bind(item)
                .fetch_one(&self.db)
        })
        .await;
        count as u64
    }

    /// Waits (up to `limit`) until MySQL has `expected` orders for the item and nothing is
    /// pending in Redis.
    pub async fn wait_for_orders(
        &self,
        server: &TestServer,
        item: u64,
        expected: usize,
        limit: Duration,
    ) {
        eventually(limit, "every order in MySQL", || async {
            let stats = self.stats(server, item).await;
            let in_mysql = self.order_count(item).await;
            if in_mysql == expected as u64 && stats["pending"] == 0 {
                Ok(())
            } else {
                Err(format!(
                    "{in_mysql} orders in MySQL (want {expected}); stats {stats}"
                ))
            }
        })
        .await;
    }

    /// docs/contract.md section 7, invariants 1 to 5, for a quiescent item, judged by
    /// `seckill::testing::invariants` (as `seckill rehearse` judges a rehearsal) from every row in
    /// MySQL and the stock in Redis: `won` are the order numbers of every `202` the test
    /// saw; the cancelled orders of invariant 5 are those MySQL has cancelled by their
    /// buyer, their deadline or a reconciliation. Then the server's own stats must agree.
    pub async fn assert_invariants(
        &self,
        server: &TestServer,
        item: u64,
        total: u32,
        won: &[String],
    ) {
        self.assert_invariants_cancelling(server, item, total, won, &[])
            .await;
    }

    /// [`TestEnv::assert_invariants`], where `cancelled` are the order numbers of every
    /// cancel the test was answered `200`: each must be cancelled in MySQL too.
    pub async fn assert_invariants_cancelling(
        &self,
        server: &TestServer,
        item: u64,
        total: u32,
        won: &[String],
        cancelled: &[String],
    ) {
        let mut cancelled = [cancelled, &self.cancelled_orders(item).await].concat();
        cancelled.sort_unstable();
        cancelled.dedup();
        let orders = self
            .order_facts_cancelling(item, total, won, &cancelled)
            .await;
        let stock = self.in_redis(item).await;
        let checks = invariants::judge(&stock, &orders, won, &cancelled, Duration::ZERO);
        if let Some(check) = checks
            .iter()
            .find(|c| c.outcome != Outcome::NotExercised && c.number == 5)
        {
            eprintln!(
                "invariants, item {item}: 5. {:?}: {}",
                check.outcome, check.detail
            );
        }
        let broken: Vec<_> = checks
            .into_iter()
            .filter(|check| check.outcome == Outcome::Broken)
            .map(|check| format!("{}. {}: {}", check.number, check.name, check.detail))
            .collect();
        assert!(broken.is_empty(), "invariants broken: {broken:#?}");
        let stats = self.stats(server, item).await;
        assert_eq!(stats["consistent"], true, "stats: {stats}");
        assert_eq!(stats["pending"], 0, "stats: {stats}");
    }

    /// The item's orders in MySQL as `seckill::testing::invariants` judges them: `total` units,
    /// `answered` the order numbers of every `202` seen.
    pub async fn order_facts(&self, item: u64, total: u32, answered: &[String]) -> Orders {
        self.order_facts_cancelling(item, total, answered, &[])
            .await
    }

    /// [`TestEnv::order_facts`], with `cancelled` the orders invariant 5 judges.
    pub async fn order_facts_cancelling(
        &self,
        item: u64,
        total: u32,
        answered: &[String],
        cancelled: &[String],
    ) -> Orders {
        let rows = self.orders(item).await;
        let (per_user,): (u8,) = read_patiently("the item's per_user", || {
            sqlx::query_as("SELECT per_user FROM items WHERE id = ?")
                .bind(item)
                .fetch_one(&self.db)
        })
        .await;
        let id = ItemId::new(item).expect("an item id");
        let over_time = read_patiently("what the orders held over time", || async {
            seckill::testing::held_over_time(&self.db, id, per_user)
                .await
                .map_err(|e| sqlx::Error::Protocol(e.to_string()))
        })
        .await;
        let rows = rows.iter().map(|(sn, user, status)| {
            let status = OrderStatus::try_from(status.clone()).expect("an order status");
            (sn.as_str(), *user, status)
        });
        Orders::from_rows(
            total.into(),
            per_user,
            rows,
            over_time,
            (answered, cancelled),
        )
    }

    /// The item's orders MySQL has cancelled by their buyer, their deadline or a
    /// reconciliation: each gave its unit back. (An order the consumer wrote cancelled at
    /// once, a second live order MySQL refused, never held a unit of MySQL's: `refused`.)
    pub async fn cancelled_orders(&self, item: u64) -> Vec<String> {
        read_patiently("the cancelled orders of an item", || {
            sqlx::query_scalar(
                "SELECT order_sn FROM orders WHERE item_id = ? AND status = 'cancelled' \
                 AND cancel_reason IN ('user', 'timeout', 'reconcile')",
            )
            .bind(item)
            .fetch_all(&self.db)
        })
        .await
    }
}
