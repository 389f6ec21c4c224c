//! Each step of a history run for real against the world, and judged as it comes: a press
//! by the oracle, an operator's change by what the contract says it may do to the sale as
//! it stands, a quiescent moment by the stock.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::model::{Change, Op};
use super::oracle::{Answer, Sale};
use super::world::{ITEM, World, answer};

/// Reads of a quiescent stock before one that does not add up is a violation (see
/// `World::checkpoint`).
const STOCK_READS: usize = 5;

impl World {
    /// Runs step number `i` of the history.
    pub fn step(&mut self, i: usize, op: &Op) {
        let outcome = match op {
            Op::Press {
                user,
                key,
                pair,
                api,
            } => self.press(i, u64::from(*user), *key, *pair, *api),
            Op::Cancel { user } => self.end_order(i, u64::from(*user), "cancel"),
            Op::Pay { user } => self.end_order(i, u64::from(*user), "pay"),
            Op::LatePay { user } => self.late_pay(i, u64::from(*user)),
            Op::Refund { user } => self.refund(i, u64::from(*user)),
            Op::Read { user } => self.read(i, u64::from(*user)),
            Op::Put(change) => self.put(i, change),
            Op::Pause => self.pause(i, true),
            Op::Resume => self.pause(i, false),
            Op::Warmup { force } => self.warmup(i, *force),
            Op::Reconcile => {
                let path = format!("/admin/items/{ITEM}/reconcile");
                let (status, code, _) = self.block_on(self.admin(reqwest::Method::POST, &path));
                if status != 200 {
                    self.oracle
                        .violation(i, format!("reconcile answered {status} {code}"));
                }
                format!("{status} {code}")
            }
            Op::Circuit(level) => self.circuit(i, *level),
            Op::KillApi(api) => {
                self.kill_api(*api);
                self.oracle.fault_moved();
                "killed and started again".to_owned()
            }
            Op::KillWorker => {
                self.kill_worker();
                self.oracle.fault_moved();
                "killed and started again".to_owned()
            }
            Op::ClockOff { api, seconds } => {
                self.clock_off(*api, *seconds);
                self.oracle.fault_moved();
                "started again".to_owned()
            }
            Op::FreezeReplica => {
                self.freeze_replica();
                self.oracle.fault_moved();
                "frozen".to_owned()
            }
            Op::ThawReplica => {
                self.thaw_replica();
                self.oracle.fault_moved();
                "thawed, in step".to_owned()
            }
            Op::Failover => {
                self.fail_over();
                self.oracle.fault_moved();
                "failed over, whole again".to_owned()
            }
            Op::CutRabbit => {
                self.cut_rabbit();
                "cut".to_owned()
            }
            Op::RestoreRabbit => {
                self.restore_rabbit();
                "restored".to_owned()
            }
            Op::Wait { ms } => {
                std::thread::sleep(Duration::from_millis(u64::from(*ms)));
                "waited".to_owned()
            }
            Op::Quiesce => self.checkpoint(i, Duration::from_secs(30)),
        };
        self.log.push(format!("{i:>3}. {op:?} -> {outcome}"));
    }

    /// The sale as a press meets it now, by the record the server took last.
    pub fn sale(&self) -> Sale {
        let now = Utc::now();
        let at = |v: &Value| v.as_str().and_then(|s| s.parse::<DateTime<Utc>>().ok());
        let end_at = at(&self.record["end_at"]);
        let margin = chrono::Duration::seconds(3);
        Sale {
            ended: end_at.is_some_and(|end| end - margin <= now),
            wave_ahead: self.record["release"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|wave| at(&wave["at"]))
                .any(|wave| wave + margin > now),
            draw: self.record["mode"] == "draw",
            queued: self.record.get("queue").is_some(),
        }
    }

    /// A buyer's place in the item's waiting room (`GET …/queue/me`): status and body.
    async fn place_of(&self, user: u64) -> (u16, Value) {
        let me = self
            .http
            .get(self.api(0).url(&format!("/api/items/{ITEM}/queue/me")))
            .bearer_auth(self.env.token(user))
            .send()
            .await;
        let (status, _, place) = answer(me).await;
        (status, place)
    }

    /// A buyer joins the item's waiting room (again: the same place) and reads where they
    /// stand: with a `pass` once their turn came.
    async fn joined_place(&self, user: u64) -> Value {
        let joined = self
            .http
            .post(self.api(0).url(&format!("/api/items/{ITEM}/queue")))
            .bearer_auth(self.env.token(user))
            .send()
            .await;
        answer(joined).await;
        self.place_of(user).await.1
    }

    /// A buyer's pass for the item's waiting room, joining it first (`None`: still
    /// waiting, or it ran out).
    async fn pass_of(&self, user: u64) -> Option<String> {
        self.joined_place(user).await["pass"]
            .as_str()
            .map(str::to_owned)
    }

    fn press(&mut self, i: usize, user: u64, key: Option<u8>, pair: Option<u8>, api: u8) -> String {
        let token = self.env.token(user);
        let sale = self.sale();
        let pass = match sale.queued {
            true => self.block_on(self.pass_of(user)),
            false => None,
        };
        let send = |api: u8| {
            let mut request = self
                .http
                .post(self.api(api).url("/api/flashbuy"))
                .bearer_auth(&token)
                .header("x-client-time", Utc::now().timestamp_millis().to_string())
                .json(&json!({ "item_id": ITEM }));
            if let Some(key) = key {
                request = request.header("idempotency-key", format!("k{key}"));
            }
            if let Some(pass) = &pass {
                request = request.header("x-queue-pass", pass);
            }
            async move { press_answer(answer(request.send().await).await) }
        };
        let answers: Vec<Answer> = match pair {
            None => vec![self.block_on(send(api))],
            Some(other) => {
                let (a, b) = self.block_on(async { tokio::join!(send(api), send(other)) });
                vec![a, b]
            }
        };
        let faulty = self.replica_frozen() || self.rabbit_cut;
        // Twins pressed at once: a refusal may have come before its twin's win (an
        // instance that had not yet heard of a resume refused one while the other bought),
        // so it is judged first — against what the key bought in steps before, not its twin.
        let mut judged: Vec<&Answer> = answers.iter().collect();
        judged.sort_by_key(|answer| answer.order_sn.is_some());
        for answer in judged {
            if sale.queued && self.line_refused(i, user, key, pass.is_some(), answer) {
                continue;
            }
            self.oracle.press(i, user, key, answer, &sale, faulty);
        }
        if let [a, b] = answers.as_slice()
            && let (Some(x), Some(y)) = (&a.order_sn, &b.order_sn)
            && x != y
        {
            self.oracle.violation(
                i,
                format!("one Idempotency-Key of user {user}, pressed twice at once, named {x} and {y} (invariant 2)"),
            );
        }
        answers
            .iter()
            .map(Answer::label)
            .collect::<Vec<_>>()
            .join(" | ")
    }

    /// On a queued sale, what only its line answers (`true`: judged here): without a pass
    /// `403 queue_required` (or, for a key that won before, that win's `202` again), with
    /// one `403 pass_used` or `pass_expired`. A new unit without a pass breaks invariant 9.
    fn line_refused(
        &mut self,
        i: usize,
        user: u64,
        key: Option<u8>,
        had_pass: bool,
        answer: &Answer,
    ) -> bool {
        match (answer.status, answer.code.as_str()) {
            (403, "queue_required") => !had_pass,
            (403, "pass_used" | "pass_expired") => had_pass,
            (202, _) if !had_pass => {
                let repeated = answer.order_sn.as_deref().is_some()
                    && self.oracle.key_bought(user, key) == answer.order_sn.as_deref();
                if !repeated {
                    self.oracle.violation(
                        i,
                        format!(
                            "user {user} bought {} without a pass (invariant 9)",
                            answer.label()
                        ),
                    );
                }
                false
            }
            _ => false,
        }
    }

    /// The user's newest live order (pending or unpaid), by `my-orders` (`None`: none).
    async fn newest_live(&self, user: u64) -> Option<String> {
        self.newest(user, &["pending", "unpaid"]).await
    }

    /// The user's newest order in one of `statuses`, by `my-orders` (`None`: none).
    async fn newest(&self, user: u64, statuses: &[&str]) -> Option<String> {
        let sent = self
            .http
            .get(self.api(0).url(&format!("/api/items/{ITEM}/my-orders")))
            .bearer_auth(self.env.token(user))
            .send()
            .await;
        let (_, _, body) = answer(sent).await;
        body["orders"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|order| {
                order["status"]
                    .as_str()
                    .is_some_and(|status| statuses.contains(&status))
            })
            .and_then(|order| order["order_sn"].as_str())
            .map(str::to_owned)
    }

    /// A signed payment event (`payment.succeeded`, `payment.refunded`) for `sn`.
    fn payment_event(&self, kind: &str, sn: &str) -> reqwest::RequestBuilder {
        // Within the time the world's own client gives every request.
        self.env
            .signed_payment(self.api(1), &self.env.payment(kind, sn))
            .timeout(Duration::from_secs(5))
    }

    /// The provider refunds the user's newest paid order, whole (the charge that paid it).
    fn refund(&mut self, i: usize, user: u64) -> String {
        let Some(sn) = self.block_on(self.newest(user, &["paid"])) else {
            return "no paid order".to_owned();
        };
        let request = self.payment_event("payment.refunded", &sn);
        let (status, code, _) = self.block_on(async { answer(request.send().await).await });
        let faulty = self.replica_frozen() || self.rabbit_cut || self.oracle.settling();
        match (status, code.as_str()) {
            (200, "refunded") => {}
            (503, _) | (0, _) if faulty => {}
            _ => self.oracle.violation(
                i,
                format!("refund of {sn} (user {user}) answered {status} {code}"),
            ),
        }
        format!("{sn}: {status} {code}")
    }

    /// A payment that comes late, or races its order's end. With a live order, the buyer
    /// cancels it while the provider tells of its payment, at once: exactly one wins —
    /// paid and the cancel refused, or cancelled and the payment revives it or owes it
    /// back. Without, the provider tells of a payment for the user's newest cancelled order
    /// (else anyone's: cancelled orders are few): revived while a unit can be taken for it,
    /// else owed back — never dropped.
    fn late_pay(&mut self, i: usize, user: u64) -> String {
        if let Some(sn) = self.block_on(self.newest_live(user)) {
            return self.pay_racing_cancel(i, user, &sn);
        }
        let cancelled: Option<String> = self
            .block_on(
                sqlx::query_scalar(
                    "SELECT order_sn FROM orders WHERE item_id = ? AND status = 'cancelled'
                      ORDER BY user_id = ? DESC, updated_at DESC LIMIT 1",
                )
                .bind(ITEM)
                .bind(user)
                .fetch_optional(&self.env.db),
            )
            .unwrap_or_default();
        let Some(sn) = cancelled else {
            return "no order".to_owned();
        };
        let request = self.payment_event("payment.succeeded", &sn);
        let (status, code, _) = self.block_on(async { answer(request.send().await).await });
        self.oracle.named.insert(sn.clone());
        self.judge_late_payment(i, &sn, status, &code);
        format!("{sn}: {status} {code}")
    }

    /// The buyer's cancel and the provider's payment of `sn`, sent at once.
    fn pay_racing_cancel(&mut self, i: usize, user: u64, sn: &str) -> String {
        let pay = self.payment_event("payment.succeeded", sn);
        let cancel = self
            .http
            .post(self.api(0).url(&format!("/api/orders/{sn}/cancel")))
            .bearer_auth(self.env.token(user));
        let ((paid, pay_code, _), (cancelled, cancel_code, _)) = self.block_on(async {
            tokio::join!(async { answer(pay.send().await).await }, async {
                answer(cancel.send().await).await
            })
        });
        self.oracle.named.insert(sn.to_owned());
        let faulty = self.replica_frozen() || self.rabbit_cut || self.oracle.settling();
        let cancel_won = (cancelled, cancel_code.as_str()) == (200, "cancelled");
        if cancel_won {
            self.oracle.cancelled.insert(sn.to_owned());
        }
        let cancel_heard = match (cancelled, cancel_code.as_str()) {
            // Cancelled; or refused: the payment first, or the deadline's cancel.
            (200, "cancelled") | (409, "order_paid" | "order_cancelled") => true,
            (503, "circuit_open") => self.oracle.circuit == 3,
            (503, _) | (0, _) => faulty,
            _ => false,
        };
        let pay_heard = match (paid, pay_code.as_str()) {
            // Paid in time: then the cancel cannot have won.
            (200, "paid") => !cancel_won,
            // The cancel first (the buyer's or the deadline's): a late payment.
            (200, "revived" | "refund_due") | (503, _) | (0, _) => {
                self.judge_late_payment(i, sn, paid, &pay_code);
                true
            }
            // Still on its way to MySQL and not yet on the replica.
            (202, "held") => faulty,
            _ => false,
        };
        if !(cancel_heard && pay_heard) {
            self.oracle.violation(
                i,
                format!(
                    "{sn} (user {user}) paid and cancelled at once: the payment answered {paid} {pay_code}, the cancel {cancelled} {cancel_code}"
                ),
            );
        }
        format!("{sn}: pay {paid} {pay_code}, cancel {cancelled} {cancel_code}")
    }

    /// A payment of a cancelled order: revived (live again) or owed back (`refund_due`) —
    /// either way no longer the cancelled row the history's `200` left; or, while the sale
    /// is paused or a fault is on, sent again later. With no answer (or a `503` whose
    /// commit the server could not tell), MySQL may have either: the cancel is not judged.
    fn judge_late_payment(&mut self, i: usize, sn: &str, status: u16, code: &str) {
        let faulty = self.replica_frozen() || self.rabbit_cut || self.oracle.settling();
        self.oracle.cancelled.remove(sn);
        match (status, code) {
            (200, "revived" | "refund_due") => {}
            (503, "unavailable") if self.oracle.paused => {}
            (503, _) | (0, _) if faulty => {}
            _ => self
                .oracle
                .violation(i, format!("late payment of {sn} answered {status} {code}")),
        }
    }

    /// A pay or a cancel (`what`) of the user's newest live order.
    fn end_order(&mut self, i: usize, user: u64, what: &str) -> String {
        let Some(sn) = self.block_on(self.newest_live(user)) else {
            return "no live order".to_owned();
        };
        // A pay is the payment provider's signed event; a cancel the buyer's own.
        let request = if what == "pay" {
            self.payment_event("payment.succeeded", &sn)
        } else {
            self.http
                .post(self.api(1).url(&format!("/api/orders/{sn}/{what}")))
                .bearer_auth(self.env.token(user))
        };
        let (status, code, _) = self.block_on(async { answer(request.send().await).await });
        self.oracle.named.insert(sn.clone());
        // A replica thawed a moment ago may still count as missing for an instance until
        // its next look (a pending order cannot be landed meanwhile): as for presses.
        let faulty = self.replica_frozen() || self.rabbit_cut || self.oracle.settling();
        match (what, status, code.as_str()) {
            ("cancel", 200, "cancelled") => {
                self.oracle.cancelled.insert(sn.clone());
            }
            ("pay", 200, "paid") => {}
            // Cancelled by its deadline meanwhile: a late payment takes a unit again or is
            // owed back.
            ("pay", 200, "revived" | "refund_due") => {}
            // Still on its way to MySQL and not yet on the replica: applied once it lands.
            ("pay", 202, "held") if faulty => {}
            // Raced by its deadline, or paid/cancelled by a step before.
            (_, 409, "order_paid" | "order_cancelled") => {}
            // A breaker at level 3 stops pay and cancel too.
            (_, 503, "circuit_open") if self.oracle.circuit == 3 => {}
            (_, 503, _) | (_, 0, _) if faulty => {}
            _ => self.oracle.violation(
                i,
                format!("{what} of {sn} (user {user}) answered {status} {code}"),
            ),
        }
        format!("{sn}: {status} {code}")
    }

    fn read(&mut self, i: usize, user: u64) -> String {
        let token = self.env.token(user);
        let path = format!("/api/items/{ITEM}/my-order");
        let request = self.http.get(self.api(1).url(&path)).bearer_auth(&token);
        let (status, code, body) = self.block_on(async { answer(request.send().await).await });
        match (status, body["order_sn"].as_str()) {
            (200, Some(sn)) => {
                self.oracle.named.insert(sn.to_owned());
                if body["user_id"].as_u64() != Some(user) {
                    self.oracle
                        .violation(i, format!("user {user}'s my-order answered {body}"));
                }
            }
            (404, _) => {}
            (503, _) | (0, _)
                if self.replica_frozen() || self.rabbit_cut || self.oracle.settling() => {}
            _ => self.oracle.violation(
                i,
                format!("user {user}'s my-order answered {status} {code}"),
            ),
        }
        format!("{status} {code}")
    }

    fn pause(&mut self, i: usize, paused: bool) -> String {
        let what = if paused { "pause" } else { "resume" };
        let path = format!("/admin/items/{ITEM}/{what}");
        let (status, code, _) = self.block_on(self.admin(reqwest::Method::POST, &path));
        if status == 200 {
            self.oracle.paused = paused;
            self.oracle.changed();
        } else {
            self.oracle
                .violation(i, format!("{what} answered {status} {code}"));
        }
        format!("{status} {code}")
    }

    fn circuit(&mut self, i: usize, level: u8) -> String {
        let path = match level {
            0 => format!("/admin/circuit/close?item={ITEM}"),
            level => format!("/admin/circuit/open?item={ITEM}&level={level}"),
        };
        let (status, code, _) = self.block_on(self.admin(reqwest::Method::POST, &path));
        if status == 200 {
            self.oracle.circuit = level;
            self.oracle.changed();
        } else {
            self.oracle
                .violation(i, format!("breaker level {level} answered {status} {code}"));
        }
        format!("{status} {code}")
    }

    fn warmup(&mut self, i: usize, force: bool) -> String {
        let path = format!("/admin/items/{ITEM}/warmup?force={force}");
        // A forced one may wait for orders on their way (seconds): not the 5 s of a press.
        let request = self
            .http
            .post(self.api(0).url(&path))
            .bearer_auth(crate::support::ADMIN_TOKEN)
            .timeout(Duration::from_secs(60));
        let (status, code, _) = self.block_on(async { answer(request.send().await).await });
        let allowed = match (status, code.as_str()) {
            (200, _) => true,
            // The item is loaded: a warm-up that is not forced refuses.
            (409, "already_loaded") => !force,
            // A forced one refuses a live sale, or while orders may be on their way, or when
            // more units are held than the total, or when the item changed meanwhile.
            (409, "sale_live" | "orders_in_flight" | "over_held" | "raced" | "warmup_running") => {
                force
            }
            (503, _) | (0, _) => self.replica_frozen() || self.rabbit_cut,
            _ => false,
        };
        if !allowed {
            self.oracle.violation(
                i,
                format!("warm-up (force {force}) answered {status} {code}"),
            );
        }
        if status == 200 {
            self.oracle.changed();
            self.loaded_total = self.record["total"].as_u64().unwrap_or(0) as u32;
        }
        format!("{status} {code}")
    }

    /// An operator's `PUT` of the record with one change, judged by what the contract says
    /// a change may do to the sale as it stands now.
    fn put(&mut self, i: usize, change: &Change) -> String {
        let now = Utc::now();
        let mut next = self.record.clone();
        let total = next["total"].as_u64().unwrap_or(1);
        let stats = self.block_on(self.stats());
        // Units a sale has given out or holds for someone: they cannot be taken back.
        let committed = stats["pending"].as_u64().unwrap_or(0)
            + stats["orders"]["unpaid"].as_u64().unwrap_or(0)
            + stats["orders"]["paid"].as_u64().unwrap_or(0);
        let loaded = stats["loaded"] == true;
        // Why the contract has the server refuse this change (`None`: it takes it).
        let mut refuse: Option<String> = None;
        // The change may be taken or refused (what decides is not seen from here).
        let mut either = false;
        match change {
            // Taken; a forced warm-up refuses a total below what is held (`over_held`).
            Change::Total(delta) => {
                let total = (total as i64 + i64::from(*delta)).max(1) as u64;
                next["total"] = json!(total);
            }
            Change::EndsIn(s) => {
                next["end_at"] = json!(now + chrono::Duration::seconds((*s).into()));
            }
            Change::EndsLater => next["end_at"] = json!(now + chrono::Duration::hours(1)),
            Change::Wave(units) => {
                let at = next["release"][0]["at"]
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| (now + chrono::Duration::seconds(45)).to_rfc3339());
                let released = at.parse::<DateTime<Utc>>().ok().map(|at| at - now);
                let unchanged = self.record["release"][0]["units"] == json!(units);
                next["release"] = json!([{ "at": at, "units": units }]);
                // Units held back for the wave must be units no one holds.
                let unsold = stats["remaining"].as_u64().unwrap_or(0)
                    + stats["unreleased"].as_u64().unwrap_or(0);
                if unchanged {
                    // The same plan again: nothing changes.
                } else if released
                    .is_some_and(|to_come| to_come.abs() < chrono::Duration::seconds(1))
                {
                    // The server's clock and this one may differ by a little.
                    either = true;
                } else if released.is_some_and(|to_come| to_come < chrono::TimeDelta::zero()) {
                    refuse = Some("the wave is on sale already".to_owned());
                } else if loaded && u64::from(*units) > unsold {
                    refuse = Some(format!(
                        "a wave of {units} units where {unsold} are unsold (hole 4)"
                    ));
                } else if loaded && self.record["buckets"] != 1 {
                    // Each bucket of a split item holds back its share: one short of it
                    // refuses what the item as a whole could hold back.
                    either = true;
                }
            }
            Change::PerUser(n) => next["per_user"] = json!(n),
            Change::Draw(s) => {
                next["mode"] = json!("draw");
                next["draw_at"] = json!(now + chrono::Duration::seconds((*s).into()));
                if self.record["mode"] != "draw" {
                    let bought = !self.oracle.won.is_empty() || committed > 0;
                    refuse = Some(if bought {
                        "a sale with buyers turned into a draw (hole 2)".to_owned()
                    } else {
                        "a loaded sale turned into a draw".to_owned()
                    });
                } else if let Some(at) = draw_at(&self.record) {
                    // The server's clock and this one may differ by a little.
                    if (at - now).abs() < chrono::Duration::seconds(1) {
                        either = true;
                    } else if at < now {
                        refuse =
                            Some("a draw under way or made given a new time (hole 3)".to_owned());
                    }
                }
            }
            Change::FirstCome => {
                if let Some(body) = next.as_object_mut() {
                    body.remove("mode");
                    body.remove("draw_at");
                }
                if self.record["mode"] == "draw" {
                    refuse = Some("a loaded draw turned into a sale".to_owned());
                }
            }
            Change::Buckets(k) => {
                next["buckets"] = json!(k);
                if loaded && self.record["buckets"] != json!(k) {
                    refuse = Some("the buckets of a loaded item".to_owned());
                }
            }
        }
        if let Some(bad) = invalid(&next) {
            refuse = Some(format!("a bad record: {bad}"));
        }
        let (status, code, body) = self.block_on(self.put_record(&next));
        let taken = status == 200 || status == 201;
        if taken {
            self.record = next;
            self.oracle.total_max = self
                .oracle
                .total_max
                .max(self.record["total"].as_u64().unwrap_or(0) as u32);
            self.oracle.per_user_max = self
                .oracle
                .per_user_max
                .max(self.record["per_user"].as_u64().unwrap_or(1) as u8);
            self.oracle.changed();
        }
        match (&refuse, taken) {
            _ if either && (taken || status == 409) => {}
            (Some(why), true) => self
                .oracle
                .violation(i, format!("PUT {change:?} taken ({status} {code}): {why}")),
            (None, false) => self.oracle.violation(
                i,
                format!("PUT {change:?} refused: {status} {code} {}", body["detail"]),
            ),
            _ => {}
        }
        format!("{status} {code}")
    }

    /// Waits (up to `limit`) until nothing is on its way — no order pending in Redis, the
    /// orders queue empty — then judges the stock: on sale + still to come + unpaid + paid
    /// = total, and the server's `consistent` saying the same. With a fault on, nothing can
    /// be quiet: the step only waits a moment.
    pub fn checkpoint(&mut self, i: usize, limit: Duration) -> String {
        if self.replica_frozen() || self.rabbit_cut {
            std::thread::sleep(Duration::from_millis(500));
            return "a fault is on: not judged".to_owned();
        }
        // The pay deadlines go on passing while the history is quiet: a cancel between
        // MySQL's `cancelled` and its unit back in Redis (milliseconds) is caught by a read
        // of both as a unit missing. So a stock that does not add up is read again a few
        // times; a unit really lost stays lost.
        let mut broken = String::new();
        for _ in 0..STOCK_READS {
            let stats = match self.block_on(self.quiet(limit)) {
                Ok(stats) => stats,
                Err(last) => {
                    self.oracle
                        .violation(i, format!("never quiescent within {limit:?}: {last}"));
                    return "not quiescent".to_owned();
                }
            };
            match self.block_on(super::judge::stock(&self.env, &stats, self.loaded_total)) {
                Ok(said) => return said,
                Err(said) => broken = said,
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        self.oracle
            .violation(i, format!("{broken} ({STOCK_READS} reads 300 ms apart)"));
        broken
    }

    /// Nothing pending in Redis, the orders queue empty, twice in a row: the stats then.
    async fn quiet(&self, limit: Duration) -> Result<Value, String> {
        let queue = self.env.topology().orders_queue;
        let deadline = std::time::Instant::now() + limit;
        let mut calm = 0;
        loop {
            let stats = self.stats().await;
            let depth = crate::support::queue_depth_on(&crate::support::amqp_url(), &queue).await;
            if stats["pending"] == 0 && depth == Some(0) && stats["reloading"] == false {
                calm += 1;
                if calm == 2 {
                    return Ok(stats);
                }
            } else {
                calm = 0;
            }
            if std::time::Instant::now() > deadline {
                return Err(format!("{stats}, queue {depth:?}"));
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

/// A draw's time, by the record (its mode and time are final once it came).
fn draw_at(record: &Value) -> Option<DateTime<Utc>> {
    record["draw_at"]
        .as_str()
        .and_then(|at| at.parse::<DateTime<Utc>>().ok())
}

/// A press's answer as the oracle reads it.
fn press_answer((status, code, body): (u16, String, Value)) -> Answer {
    Answer {
        status,
        code,
        order_sn: body["order_sn"].as_str().map(str::to_owned),
        order_sns: body["order_sns"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|sn| sn.as_str().map(str::to_owned))
            .collect(),
    }
}

/// What in a record `PUT /admin/items/{id}` refuses as bad input (`400`), as the contract
/// states it: a wave within the window and no larger than the total, a draw's time within
/// the window, a draw without waves and with one unit per buyer.
fn invalid(record: &Value) -> Option<String> {
    let at = |v: &Value| v.as_str().and_then(|s| s.parse::<DateTime<Utc>>().ok());
    let (start, end) = (at(&record["start_at"])?, at(&record["end_at"])?);
    let total = record["total"].as_u64()?;
    for wave in record["release"].as_array().into_iter().flatten() {
        let wave_at = at(&wave["at"])?;
        if wave_at < start || wave_at >= end {
            return Some("a wave outside the window".to_owned());
        }
        if wave["units"].as_u64()? > total {
            return Some("a wave larger than the total".to_owned());
        }
    }
    if record["mode"] == "draw" && record.get("queue").is_some() {
        return Some("a draw with a waiting room".to_owned());
    }
    if record["mode"] == "draw" {
        let draw_at = at(&record["draw_at"])?;
        if draw_at <= start || draw_at > end {
            return Some("a draw outside the window".to_owned());
        }
        if record["release"].as_array().is_some_and(|r| !r.is_empty()) {
            return Some("a draw with waves".to_owned());
        }
        if record["per_user"] != 1 {
            return Some("a draw with per_user above 1".to_owned());
        }
    }
    None
}

/// How long after every fault healed a `503` may still be heard (an instance's automatic
/// breaker tripped by the fault: open 5 s, then ten good probes; a replica catching up).
const AFTER_THE_HEAL: Duration = Duration::from_secs(15);

impl World {
    /// The end of a history (numbered `i` in its report): every fault healed, the sale
    /// resumed and its breaker closed, a draw drawn; then the stock judged, the sale made to
    /// sell what it has left (liveness: every unit on sale is bought by fresh buyers, each
    /// hearing `202`, then `410` or `409 between_releases` — nothing else), the stock judged
    /// again, and every order against what the history heard.
    pub fn finish(&mut self, i: usize) {
        self.heal();
        self.oracle.fault_moved();
        for op in [Op::Resume, Op::Circuit(0)] {
            self.step(i, &op);
        }
        let stats = self.block_on(self.stats());
        if stats["reloading"] == true || stats["loaded"] == false {
            // A warm-up cut off or raced leaves the item fenced until one completes: the
            // operator's procedure is to run it again (docs/operations.md).
            for op in [Op::Pause, Op::Warmup { force: true }, Op::Resume] {
                self.step(i, &op);
            }
        }
        if self.sale().draw {
            self.block_on(self.drawn());
        }
        // Every instance has heard of the last change.
        std::thread::sleep(Duration::from_millis(2500));
        let end = self.checkpoint(i, Duration::from_secs(60));
        self.log.push(format!("{i:>3}. end: {end}"));
        let sale = self.sale();
        if !sale.ended && !sale.draw {
            if let Err(stats) = self.block_on(self.arrived()) {
                self.oracle.violation(
                    i,
                    format!(
                        "liveness: a unit still on its way between buckets {AFTER_THE_HEAL:?} after the heal: {stats}\n{}",
                        self.stores_report()
                    ),
                );
            }
            let outcome = self.sell_out(i);
            self.log.push(format!("{i:>3}. liveness: {outcome}"));
            let sold_out = self.checkpoint(i, Duration::from_secs(60));
            self.log.push(format!("{i:>3}. sold out: {sold_out}"));
        }
        let ctx = self.context();
        ctx.rt
            .block_on(super::judge::orders(&self.env, &mut self.oracle));
        if sale.queued {
            let broken = self.block_on(self.line_judged());
            for what in broken {
                self.oracle.violation(i, format!("at the end: {what}"));
            }
        }
    }

    /// Invariant 9 of a queued sale, at its end: every buyer who holds an order was let in
    /// (their place is behind the cursor), and the live passes reserve no more than the
    /// units on sale.
    async fn line_judged(&self) -> Vec<String> {
        let mut broken = Vec::new();
        let buyers: Vec<(i64,)> =
            sqlx::query_as("SELECT DISTINCT user_id FROM orders WHERE item_id = ?")
                .bind(ITEM)
                .fetch_all(&self.env.db)
                .await
                .unwrap_or_default();
        for (user,) in buyers {
            let (status, place) = self.place_of(user as u64).await;
            let let_in = matches!(
                place["state"].as_str(),
                Some("admitted" | "done" | "expired")
            );
            if status != 200 || !let_in {
                broken.push(format!(
                    "user {user} holds an order and was not let in: {status} {place} (invariant 9)"
                ));
            }
        }
        // A purchase cut off between its take and its win's count (an API killed) leaves
        // its unit counted until its pass runs out (30 s, and 5 s of grace): fewer let in
        // meanwhile, never more.
        let deadline = std::time::Instant::now() + Duration::from_secs(40);
        loop {
            let (_, _, line) = self
                .admin(reqwest::Method::GET, &format!("/admin/items/{ITEM}/queue"))
                .await;
            let stats = self.stats().await;
            let reserved = line["reserved_units"].as_u64().unwrap_or(0);
            let on_sale = stats["remaining"].as_u64().unwrap_or(0);
            if reserved <= on_sale {
                break;
            }
            if std::time::Instant::now() > deadline {
                broken.push(format!(
                    "the live passes reserve {reserved} units, {on_sale} on sale (invariant 9): {line}"
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        broken
    }

    /// Waits (up to 30 s past its time) until the draw is drawn.
    async fn drawn(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(40);
        while std::time::Instant::now() < deadline {
            let drawn: Option<(Option<DateTime<Utc>>,)> =
                sqlx::query_as("SELECT drawn_at FROM items WHERE id = ?")
                    .bind(ITEM)
                    .fetch_optional(&self.env.db)
                    .await
                    .ok()
                    .flatten();
            if drawn.is_some_and(|(at,)| at.is_some()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// Waits (up to [`AFTER_THE_HEAL`]) until no unit is on its way between the item's
    /// buckets (`moving` in the stats): one cut off by the fault is on no list, and sells
    /// only once the repair has given it back — within about 6.5 s of the heal
    /// (docs/architecture.md, "A hot item over many buckets").
    async fn arrived(&self) -> Result<(), Value> {
        let deadline = std::time::Instant::now() + AFTER_THE_HEAL;
        loop {
            let stats = self.stats().await;
            if stats["moving"].as_u64().unwrap_or(0) == 0 {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                return Err(stats);
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// A fresh buyer joins the line and waits (up to 45 s) for their turn: the pass, or
    /// where they were left.
    async fn turn_of(&self, buyer: u64) -> Result<String, Value> {
        let deadline = std::time::Instant::now() + Duration::from_secs(45);
        let mut place = Value::Null;
        while std::time::Instant::now() < deadline {
            place = self.joined_place(buyer).await;
            if let Some(pass) = place["pass"].as_str() {
                return Ok(pass.to_owned());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Err(place)
    }

    /// On a queued sale, the history's buyers in their turns: each let in presses with
    /// their pass until it is spent, for up to a minute, until `on_sale` units are sold or
    /// none of them waits any more. The units they bought.
    fn line_buys(&mut self, i: usize, on_sale: u64, heard: &mut Vec<String>) -> u64 {
        let sale = self.sale();
        let until = std::time::Instant::now() + Duration::from_secs(60);
        let mut wins = 0;
        while wins < on_sale && std::time::Instant::now() < until {
            let mut waiting = false;
            for user in 1..=u64::from(super::model::USERS) {
                let place = self.block_on(self.joined_place(user));
                let Some(pass) = place["pass"].as_str().map(str::to_owned) else {
                    waiting |= place["state"] == "waiting";
                    continue;
                };
                let request = self
                    .http
                    .post(self.api((user % 2) as u8).url("/api/flashbuy"))
                    .bearer_auth(self.env.token(user))
                    .header("x-client-time", Utc::now().timestamp_millis().to_string())
                    .header("x-queue-pass", pass)
                    .json(&json!({ "item_id": ITEM }));
                let answer =
                    press_answer(self.block_on(async { answer(request.send().await).await }));
                heard.push(format!("{user}: {}", answer.label()));
                if self.line_refused(i, user, None, true, &answer) {
                    continue;
                }
                self.oracle.press(i, user, None, &answer, &sale, true);
                if answer.status == 202 {
                    wins += 1;
                }
                waiting = true;
            }
            if !waiting {
                break;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        wins
    }

    /// Fresh buyers press, one at a time, until told nothing is left: every unit on sale
    /// must sell, and each press must hear a win or the end.
    fn sell_out(&mut self, i: usize) -> String {
        let on_sale = self.block_on(self.stats())["remaining"]
            .as_u64()
            .unwrap_or(0);
        let sale = self.sale();
        let mut wins = 0u64;
        let mut presses = 0u64;
        // An instance's automatic breaker, tripped by the fault, closes through half-open
        // probes: a `503` is pressed again, within this long of the heal.
        let healed_by = std::time::Instant::now() + AFTER_THE_HEAL;
        let mut buyer = 1_000;
        // What each press heard, for the report of a failure.
        let mut heard = Vec::new();
        // A queued sale: the history's own buyers come first in its line and buy in their
        // turns (their passes would otherwise hold units until they run out); then each
        // fresh buyer joins and waits for their turn and buys with the pass; once every
        // unit on sale is bought, the next would wait for units held by unpaid orders, so
        // none is sent.
        if sale.queued {
            wins = self.line_buys(i, on_sale, &mut heard);
        }
        let last = if sale.queued {
            1_000 + on_sale - wins.min(on_sale)
        } else {
            1_000 + on_sale + 5
        };
        while buyer < last {
            presses += 1;
            let token = self.env.token(buyer);
            let pass = match sale.queued {
                true => match self.block_on(self.turn_of(buyer)) {
                    Ok(pass) => Some(pass),
                    Err(place) => {
                        heard.push(format!("{buyer}: not let in: {place}"));
                        break;
                    }
                },
                false => None,
            };
            let mut request = self
                .http
                .post(self.api((buyer % 2) as u8).url("/api/flashbuy"))
                .bearer_auth(&token)
                .header("x-client-time", Utc::now().timestamp_millis().to_string())
                .json(&json!({ "item_id": ITEM }));
            if let Some(pass) = pass {
                request = request.header("x-queue-pass", pass);
            }
            let answer = press_answer(self.block_on(async { answer(request.send().await).await }));
            heard.push(format!("{buyer}: {}", answer.label()));
            let settling = std::time::Instant::now() < healed_by;
            if answer.status == 503 && settling {
                std::thread::sleep(Duration::from_millis(300));
                continue;
            }
            self.oracle.press(i, buyer, None, &answer, &sale, false);
            buyer += 1;
            match (answer.status, answer.code.as_str()) {
                (202, "queued") => wins += 1,
                (410, _) | (409, "between_releases") => break,
                _ => {
                    self.oracle.violation(
                        i,
                        format!(
                            "liveness: with every fault healed, a fresh buyer heard {}",
                            answer.label()
                        ),
                    );
                    break;
                }
            }
        }
        if wins < on_sale {
            let line = match sale.queued {
                true => {
                    let path = format!("/admin/items/{ITEM}/queue");
                    let (_, _, line) = self.block_on(self.admin(reqwest::Method::GET, &path));
                    format!("\nthe line: {line}")
                }
                false => String::new(),
            };
            self.oracle.violation(
                i,
                format!(
                    "liveness: {on_sale} units on sale, {wins} sold to fresh buyers; they heard {}{line}\n{}",
                    heard.join(", "),
                    self.stores_report()
                ),
            );
        }
        format!("{on_sale} on sale, {wins} sold in {presses} presses")
    }
}
