//! Waiting for Redis replicas (`SECKILL_REDIS_WAIT_REPLICAS`, `SECKILL_REDIS_WAIT_POLICY`):
//! per master, one committer whose `INCR` + `WAIT` covers every win its master took before
//! it (group commit), sent to the master chosen before the write; and a watcher that reads
//! every [`WATCH_EVERY`] which master serves each slot and how many replicas it has in
//! step, so a purchase refuses before taking a unit where they are short — judged so that
//! a host too busy to answer in time is not taken for one that lost its replicas
//! ([`judge`]). Why and how: docs/architecture.md, "Failover and `WAIT`" and "A master
//! short of replicas".

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, Once, Weak};
use std::time::Duration;

use futures::future::join_all;
use metrics::{Counter, Gauge, Histogram};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, Value};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::config::{Settings, WaitPolicy};

use super::WAIT_FOR_REPLICAS;

/// How often the slot map and the masters' replicas are read.
const WATCH_EVERY: Duration = Duration::from_millis(250);
/// A replica whose last acknowledgement is older than this (in whole seconds, as `INFO`
/// gives it; replicas acknowledge every second) is not in step: it is cut off or stuck.
const MOST_LAG_S: u64 = 2;
/// How long a caller waits for the watcher's first look after the start.
const FIRST_LOOK_WITHIN: Duration = Duration::from_secs(1);
/// One call of the watcher or a committer to a node, at most (beyond a `WAIT`'s own time).
const NODE_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a master that does not answer the watcher keeps what it was last judged,
/// from its last answer: a starved host answers late, and its replicas may be in step
/// all along. Then it counts as short. (As long as a replica may go without
/// acknowledging, [`MOST_LAG_S`].)
const SILENT_AT_MOST: Duration = Duration::from_secs(2);
/// How long a `WAIT` that the replicas the rule asks for acknowledged proves them in step,
/// whatever the master's `INFO` said (or did not say) meanwhile: shorter than
/// [`MOST_LAG_S`], so it never outlives a replica that stopped acknowledging.
const PROOF_FOR: Duration = Duration::from_secs(1);
/// Writes waiting at one master's committer, at most: beyond, they count as not held.
const QUEUE: usize = 16_384;
/// `WAIT`s in flight at once per master, each on a connection of its own: a write that
/// arrives while one waits leaves with the next at once, rather than after it. (On the
/// 2-core VM a `WAIT` under a crowd took 2.8 ms, alone 0.1 ms; with 1, 2 and 3 in flight,
/// two runs each, 2 sold the most.)
const IN_FLIGHT: usize = 2;
/// Writes one `WAIT` answers, at most.
const BATCH: usize = 4_096;
/// Redis Cluster's slots.
const SLOTS: usize = 16_384;

/// What `SECKILL_REDIS_WAIT_REPLICAS` and `SECKILL_REDIS_WAIT_POLICY` ask for.
#[derive(Clone, Debug)]
pub struct WaitRule {
    pub replicas: u32,
    pub policy: WaitPolicy,
    /// Labels the meters (several servers share a process in tests).
    pub namespace: String,
}

impl WaitRule {
    pub fn from_settings(settings: &Settings) -> Self {
        Self {
            replicas: settings.redis_wait_replicas,
            policy: settings.redis_wait_policy,
            namespace: settings.namespace.clone(),
        }
    }
}

/// A master has fewer replicas in step than the rule asks for, and the policy refuses.
#[derive(Debug, thiserror::Error)]
#[error("the Redis master serving this item has {in_step} replicas in step, {required} required")]
pub struct ShortOfReplicas {
    pub in_step: u32,
    pub required: u32,
}

/// A Redis node's address.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Node {
    host: String,
    port: u16,
}

/// What the watcher last saw.
#[derive(Default)]
struct View {
    /// False until the first look.
    seen: bool,
    /// Per slot, the index of its master in `masters` ([`NO_MASTER`]: none known); empty
    /// for one server, which serves every key.
    slots: Vec<u16>,
    masters: Vec<Master>,
}

const NO_MASTER: u16 = u16::MAX;

#[derive(Clone, Debug)]
struct Master {
    node: Node,
    /// Replicas in step, as [`judge`] made of the node's answers and its `WAIT`s (0: short
    /// of any, or not a master).
    in_step: u32,
    /// Replicas a failover could promote: those the cluster lists as not failed (for one
    /// server, those connected at all). `None`: not known (the node did not answer, and
    /// nothing was known of it before) — then one might.
    could_take_over: Option<u32>,
    /// The node's last answer to `INFO` (`None`: it never answered).
    heard: Option<Heard>,
}

/// When a master last answered the watcher, and whether it then said it had fewer
/// replicas in step than the rule asks for.
#[derive(Clone, Copy, Debug)]
struct Heard {
    at: Instant,
    short: bool,
}

/// What a look makes of a master: `said` is how many replicas in step its `INFO` counts
/// now (`None`: no answer in time), `before` what the last look judged of the same node,
/// `held_at` when a `WAIT` there that the replicas acknowledged was last sent. A saturated
/// host answers `INFO` late and reads a replica's `lag` high while every replica
/// acknowledges, so:
/// - a `WAIT` acknowledged within [`PROOF_FOR`] proves `required` replicas in step;
/// - a master that does not answer keeps its last judgement for [`SILENT_AT_MOST`] from
///   its last answer (one never heard from counts as short);
/// - a master judged in step turns short only when two answers in a row say so.
///
/// Hence a master whose replicas stop acknowledging is short from the second look after
/// its `INFO` reads their last acknowledgement over [`MOST_LAG_S`] old (by 3 s, in whole
/// seconds): within 4 s while it answers; one that stops answering, from the first look
/// more than [`SILENT_AT_MOST`] after its last answer.
fn judge(
    required: u32,
    said: Option<u32>,
    before: Option<&Master>,
    held_at: Option<Instant>,
    now: Instant,
) -> (u32, Option<Heard>) {
    let proven = match held_at {
        Some(at) if now.saturating_duration_since(at) <= PROOF_FOR => required,
        _ => 0,
    };
    let kept = before.map_or(0, |m| m.in_step);
    let last = before.and_then(|m| m.heard);
    let (in_step, heard) = match said {
        Some(in_step) => {
            let heard = Heard {
                at: now,
                short: in_step < required,
            };
            // One short answer after one that was not: the next look confirms it or not.
            let unconfirmed = heard.short && kept >= required && last.is_some_and(|h| !h.short);
            (if unconfirmed { kept } else { in_step }, Some(heard))
        }
        None => {
            let lately =
                last.is_some_and(|h| now.saturating_duration_since(h.at) <= SILENT_AT_MOST);
            (if lately { kept } else { 0 }, last)
        }
    };
    (in_step.max(proven), heard)
}

impl View {
    fn master_of(&self, key: &str) -> Option<&Master> {
        if self.slots.is_empty() {
            return self.masters.first();
        }
        let index = *self.slots.get(usize::from(slot_of(key)))?;
        self.masters.get(usize::from(index))
    }
}

/// The Redis Cluster slot of a key (CRC16 of its hash tag, or of the whole key).
fn slot_of(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|b| *b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        let close = rest.iter().position(|b| *b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(bytes)) % SLOTS as u16
}

/// Where the watcher looks: one server, or a cluster through its seed nodes (connected to
/// as the first seed's URL says: password, TLS).
pub(super) enum Nodes {
    One(ConnectionInfo),
    Cluster {
        template: ConnectionInfo,
        seeds: Vec<ConnectionInfo>,
    },
}

/// The replicas' side of [`super::RedisConns`], present when the rule asks for any.
pub(super) struct Replicas {
    rule: WaitRule,
    nodes: Nodes,
    view: watch::Sender<Arc<View>>,
    committers: Mutex<HashMap<Node, Committers>>,
    watching: Once,
    meters: WaitMeters,
}

/// One master's committers: where writes ask for replicas, and when a `WAIT` of theirs
/// that the replicas acknowledged was last sent (the watcher's proof).
struct Committers {
    asks: mpsc::Sender<Ask>,
    held_at: Arc<Mutex<Option<Instant>>>,
}

/// A write that must be held by replicas before it counts.
struct Ask {
    /// A key on the master (bumped before the `WAIT`, which also checks the master still
    /// serves its slot).
    key: String,
    by: Instant,
    reply: oneshot::Sender<bool>,
}

struct WaitMeters {
    /// Each `WAIT` sent, with how long it took: with the writes' count (`held` +
    /// `not_held`), how many writes one `WAIT` answered.
    waits: Counter,
    wait_seconds: Histogram,
    held: Counter,
    not_held: Counter,
    degraded: Counter,
    refused: Counter,
    masters_short: Gauge,
    /// The second a degraded sale was last logged (once a second at most).
    logged_at_s: AtomicI64,
}

impl WaitMeters {
    fn new(namespace: &str) -> Self {
        let ns = namespace.to_owned();
        let outcome = |outcome: &'static str| metrics::counter!("seckill_redis_wait_total", "namespace" => ns.clone(), "outcome" => outcome);
        Self {
            waits: metrics::counter!("seckill_redis_waits_total", "namespace" => ns.clone()),
            wait_seconds: metrics::histogram!("seckill_stage_duration_seconds", "namespace" => ns.clone(), "stage" => "redis_wait"),
            held: outcome("held"),
            not_held: outcome("not_held"),
            degraded: outcome("degraded"),
            refused: outcome("refused"),
            masters_short: metrics::gauge!("seckill_redis_masters_short", "namespace" => ns.clone()),
            logged_at_s: AtomicI64::new(0),
        }
    }
}

impl Replicas {
    pub(super) fn new(rule: WaitRule, nodes: Nodes) -> Self {
        let meters = WaitMeters::new(&rule.namespace);
        Self {
            rule,
            nodes,
            view: watch::Sender::new(Arc::new(View::default())),
            committers: Mutex::default(),
            watching: Once::new(),
            meters,
        }
    }

    pub(super) fn rule(&self) -> &WaitRule {
        &self.rule
    }

    /// What the watcher last saw, once it has looked (it starts at the first call).
    async fn view(self: &Arc<Self>) -> Arc<View> {
        let now = self.view.borrow().clone();
        if now.seen {
            return now;
        }
        self.watching.call_once(|| {
            tokio::spawn(watch_replicas(Arc::downgrade(self)));
        });
        let mut seen = self.view.subscribe();
        let first = seen.wait_for(|view| view.seen);
        // A watcher that cannot look within the limit: every master counts as short.
        let _ = tokio::time::timeout(FIRST_LOOK_WITHIN, first).await;
        self.view.borrow().clone()
    }

    /// The replicas that must hold writes made from now on on the master of `key`.
    pub(super) async fn before_write(
        self: &Arc<Self>,
        key: &str,
    ) -> Result<Replication, ShortOfReplicas> {
        let view = self.view().await;
        let master = view.master_of(key);
        let in_step = master.map_or(0, |m| m.in_step);
        if in_step < self.rule.replicas && self.rule.policy == WaitPolicy::Refuse {
            self.meters.refused.increment(1);
            return Err(ShortOfReplicas {
                in_step,
                required: self.rule.replicas,
            });
        }
        let to = master.map(|m| Commit {
            key: key.to_owned(),
            asks: self.committer(&m.node),
        });
        Ok(Replication {
            wait: Some(Wait {
                replicas: self.clone(),
                to,
                short: in_step < self.rule.replicas,
            }),
        })
    }

    /// Whether the master of `key` has no replica a failover could promote: nothing can
    /// then undo its writes but the loss of the master itself.
    pub(super) async fn alone(self: &Arc<Self>, key: &str) -> bool {
        self.view()
            .await
            .master_of(key)
            .is_some_and(|m| m.could_take_over == Some(0))
    }

    /// Whether the master of `key` has fewer replicas in step than the rule asks for.
    pub(super) async fn short(self: &Arc<Self>, key: &str) -> bool {
        self.view()
            .await
            .master_of(key)
            .is_none_or(|m| m.in_step < self.rule.replicas)
    }

    /// The committer of `node`, started at its first use (and again if it ended).
    fn committer(&self, node: &Node) -> mpsc::Sender<Ask> {
        let mut committers = self.committers.lock().unwrap_or_else(|e| e.into_inner());
        let held_at = match committers.get(node) {
            Some(running) if !running.asks.is_closed() => return running.asks.clone(),
            Some(ended) => ended.held_at.clone(),
            None => Arc::default(),
        };
        let (asks, queue) = mpsc::channel(QUEUE);
        let queue = Arc::new(tokio::sync::Mutex::new(queue));
        for _ in 0..IN_FLIGHT {
            let meters = (self.meters.waits.clone(), self.meters.wait_seconds.clone());
            let committer = commit(
                self.info_for(node),
                self.rule.replicas,
                queue.clone(),
                held_at.clone(),
                meters,
            );
            tokio::spawn(committer);
        }
        let running = Committers {
            asks: asks.clone(),
            held_at,
        };
        committers.insert(node.clone(), running);
        asks
    }

    /// When a `WAIT` on `node` that the replicas acknowledged was last sent.
    fn held_at(&self, node: &Node) -> Option<Instant> {
        let committers = self.committers.lock().unwrap_or_else(|e| e.into_inner());
        let held_at = &committers.get(node)?.held_at;
        *held_at.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How to connect to `node`: as the configured URL does (password, TLS), at its address.
    fn info_for(&self, node: &Node) -> ConnectionInfo {
        match &self.nodes {
            Nodes::One(info) => info.clone(),
            Nodes::Cluster { template, .. } => {
                let addr = match template.addr() {
                    ConnectionAddr::TcpTls {
                        insecure,
                        tls_params,
                        ..
                    } => ConnectionAddr::TcpTls {
                        host: node.host.clone(),
                        port: node.port,
                        insecure: *insecure,
                        tls_params: tls_params.clone(),
                    },
                    _ => ConnectionAddr::Tcp(node.host.clone(), node.port),
                };
                template.clone().set_addr(addr)
            }
        }
    }

    /// One look: the masters (and, on a cluster, the slots they serve), then each
    /// master's replicas, as [`judge`] makes of them. What a node does not answer is taken
    /// as unknown, never as "no replica": a master it cannot see keeps its last judgement
    /// for a while, then counts as short, and as one a replica might still take over from.
    async fn look(&self, links: &mut Links) -> View {
        let before = self.view.borrow().clone();
        let (slots, masters) = match &self.nodes {
            Nodes::One(info) => (Vec::new(), vec![(node_of(info), None)]),
            Nodes::Cluster { seeds, .. } => {
                let known = before.masters.iter().map(|m| m.node.clone());
                let asked = known.chain(seeds.iter().map(node_of));
                match cluster_slots(self, links, asked).await {
                    Some(map) => map,
                    // No node answered: the last map stands, with what it knew.
                    None => (
                        before.slots.clone(),
                        before
                            .masters
                            .iter()
                            .map(|m| (m.node.clone(), m.could_take_over))
                            .collect(),
                    ),
                }
            }
        };
        let answers = join_all(masters.iter().map(|(node, _)| {
            let link = links.remove(node);
            let info = self.info_for(node);
            async move { replication_info(&info, link).await }
        }))
        .await;
        let now = Instant::now();
        let mut seen_masters = Vec::with_capacity(masters.len());
        for ((node, listed), (seen, link)) in masters.into_iter().zip(answers) {
            if let Some(link) = link {
                links.insert(node.clone(), link);
            }
            let was = before.masters.iter().find(|m| m.node == node);
            let said = seen.as_ref().map(|seen| seen.in_step);
            let held_at = self.held_at(&node);
            let (in_step, heard) = judge(self.rule.replicas, said, was, held_at, now);
            seen_masters.push(Master {
                could_take_over: listed
                    .or(seen.as_ref().map(|seen| seen.connected))
                    .or_else(|| was.and_then(|m| m.could_take_over)),
                in_step,
                heard,
                node,
            });
        }
        let short = seen_masters
            .iter()
            .filter(|m| m.in_step < self.rule.replicas)
            .count();
        self.meters.masters_short.set(short as f64);
        View {
            seen: true,
            slots,
            masters: seen_masters,
        }
    }

    /// Counts a write after its wait; under `degrade`, one not held counts as held.
    fn settled(&self, held: bool) -> bool {
        if held {
            self.meters.held.increment(1);
            return true;
        }
        if self.rule.policy == WaitPolicy::Refuse {
            self.meters.not_held.increment(1);
            return false;
        }
        self.meters.degraded.increment(1);
        let now_s = chrono::Utc::now().timestamp();
        if self.meters.logged_at_s.swap(now_s, Ordering::Relaxed) != now_s {
            tracing::warn!(
                required = self.rule.replicas,
                "SECKILL_REDIS_WAIT_POLICY=degrade: selling without the Redis replicas asked for (counted in seckill_redis_wait_total{{outcome=\"degraded\"}})"
            );
        }
        true
    }
}

/// Taken before a write whose replicas must hold it: [`Replication::held`] after the write
/// says whether they do.
pub struct Replication {
    /// `None`: no replicas are asked for.
    wait: Option<Wait>,
}

struct Wait {
    replicas: Arc<Replicas>,
    /// The master that served the key when this was taken (`None`: none known).
    to: Option<Commit>,
    /// The master was short of replicas already (under `degrade`): no `WAIT` can succeed.
    short: bool,
}

struct Commit {
    key: String,
    asks: mpsc::Sender<Ask>,
}

impl Replication {
    /// No replicas to wait for.
    pub(super) fn none() -> Self {
        Self { wait: None }
    }

    /// Waits (at most [`WAIT_FOR_REPLICAS`]) until the replicas hold every write made on
    /// the master so far. True at once when no replicas are asked for; under `degrade`,
    /// true whatever they hold (counted and logged).
    pub async fn held(self) -> bool {
        let Some(wait) = self.wait else {
            return true;
        };
        let held = match (&wait.to, wait.short) {
            (Some(to), false) => {
                let (reply, answer) = oneshot::channel();
                let ask = Ask {
                    key: to.key.clone(),
                    by: Instant::now() + WAIT_FOR_REPLICAS,
                    reply,
                };
                to.asks.try_send(ask).is_ok() && answer.await.unwrap_or(false)
            }
            (None, _) => {
                tracing::debug!("no master known for the key: not held");
                false
            }
            (Some(_), true) => false,
        };
        wait.replicas.settled(held)
    }
}

/// One of a master's committers: each `WAIT` answers every write asked for before it was
/// sent; while it waits, another takes the writes that arrive.
async fn commit(
    info: ConnectionInfo,
    replicas: u32,
    asks: Arc<tokio::sync::Mutex<mpsc::Receiver<Ask>>>,
    held_at: Arc<Mutex<Option<Instant>>>,
    (waits, wait_seconds): (Counter, Histogram),
) {
    let mut conn = None;
    let mut batch = Vec::with_capacity(BATCH);
    while asks.lock().await.recv_many(&mut batch, BATCH).await > 0 {
        let now = Instant::now();
        // Those whose time ran out while they queued are not held (their buyer hears so).
        batch.retain(|ask| ask.by > now);
        let held = match batch.iter().map(|ask| ask.by).min() {
            Some(by) => {
                let held = wait_once(&info, &mut conn, replicas, &batch, by - now).await;
                waits.increment(1);
                wait_seconds.record(now.elapsed());
                if held {
                    // As of when it was sent: the replicas held everything written before.
                    // (Another committer's later one may have answered first.)
                    let mut at = held_at.lock().unwrap_or_else(|e| e.into_inner());
                    *at = (*at).max(Some(now));
                }
                held
            }
            None => false,
        };
        for ask in batch.drain(..) {
            let _ = ask.reply.send(held);
        }
    }
}

/// `INCR` of each key the batch names, then `WAIT replicas within`, on this master's own
/// connection (made anew after any failure: a late answer must not be read as the next).
async fn wait_once(
    info: &ConnectionInfo,
    conn: &mut Option<MultiplexedConnection>,
    replicas: u32,
    batch: &[Ask],
    within: Duration,
) -> bool {
    let mut keys: Vec<&str> = batch.iter().map(|ask| ask.key.as_str()).collect();
    keys.sort_unstable();
    keys.dedup();
    let mut pipe = redis::pipe();
    for key in keys {
        pipe.incr(key, 1).ignore();
    }
    // `WAIT n 0` would block for ever.
    let ms = within.as_millis().max(1) as u64;
    pipe.cmd("WAIT").arg(replicas).arg(ms);
    let link = match conn.take() {
        Some(link) => Some(link),
        None => connect(info, within + NODE_TIMEOUT).await,
    };
    let Some(mut link) = link else {
        tracing::debug!(node = ?info.addr(), "no connection for WAIT");
        return false;
    };
    let answer =
        tokio::time::timeout(within + NODE_TIMEOUT, pipe.query_async::<(u64,)>(&mut link)).await;
    match answer {
        Ok(Ok((acked,))) => {
            *conn = Some(link);
            if acked < u64::from(replicas) {
                tracing::debug!(node = ?info.addr(), acked, writes = batch.len(), "WAIT: too few replicas acknowledged in time");
            }
            acked >= u64::from(replicas)
        }
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "WAIT for replicas failed");
            false
        }
        Err(_) => {
            tracing::debug!(node = ?info.addr(), "WAIT: no answer in time");
            false
        }
    }
}

async fn connect(info: &ConnectionInfo, respond_within: Duration) -> Option<MultiplexedConnection> {
    let client = Client::open(info.clone()).ok()?;
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(NODE_TIMEOUT))
        .set_response_timeout(Some(respond_within));
    tokio::time::timeout(
        NODE_TIMEOUT,
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
    .ok()?
    .ok()
}

fn node_of(info: &ConnectionInfo) -> Node {
    match info.addr() {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => Node {
            host: host.clone(),
            port: *port,
        },
        // A socket path (or an address kind this code does not know): one node.
        other => Node {
            host: other.to_string(),
            port: 0,
        },
    }
}

/// The watcher's connections, one per node it asks.
type Links = HashMap<Node, MultiplexedConnection>;

/// Per slot, the index of its master; and each master, with the replicas the cluster lists
/// for it (`None`: the map does not say; count those connected).
type SlotMap = (Vec<u16>, Vec<(Node, Option<u32>)>);

/// Looks every [`WATCH_EVERY`] until the connections it serves are dropped.
async fn watch_replicas(replicas: Weak<Replicas>) {
    let mut links = Links::new();
    loop {
        let Some(me) = replicas.upgrade() else {
            return;
        };
        let view = me.look(&mut links).await;
        me.view.send_replace(Arc::new(view));
        drop(me);
        tokio::time::sleep(WATCH_EVERY).await;
    }
}

/// The slot map from the first of `asked` that answers `CLUSTER SLOTS`: the masters, each
/// with the replicas the cluster lists for it (failed ones it leaves out).
async fn cluster_slots(
    replicas: &Replicas,
    links: &mut Links,
    asked: impl Iterator<Item = Node>,
) -> Option<SlotMap> {
    for node in asked {
        let info = replicas.info_for(&node);
        let (answer, link) = ask::<Value>(
            &info,
            links.remove(&node),
            redis::cmd("CLUSTER").arg("SLOTS"),
        )
        .await;
        if let Some(link) = link {
            links.insert(node.clone(), link);
        }
        if let Some(map) = answer.and_then(|value| parse_slots(&value, &node)) {
            return Some(map);
        }
    }
    None
}

/// `CLUSTER SLOTS`: `[[start, end, [host, port, id, …], [replica host, port, id, …]…]…]`.
/// An empty host means the node answering (`asked`).
fn parse_slots(value: &Value, asked: &Node) -> Option<SlotMap> {
    let Value::Array(ranges) = value else {
        return None;
    };
    let mut slots = vec![NO_MASTER; SLOTS];
    let mut masters: Vec<(Node, Option<u32>)> = Vec::new();
    for range in ranges {
        let Value::Array(fields) = range else {
            return None;
        };
        let (Some(start), Some(end), Some(master)) = (
            fields.first().and_then(int),
            fields.get(1).and_then(int),
            fields.get(2).and_then(|n| node_in(n, asked)),
        ) else {
            return None;
        };
        let listed = fields.len().saturating_sub(3) as u32;
        let index = match masters.iter().position(|(node, _)| *node == master) {
            Some(i) => i,
            None => {
                masters.push((master, Some(listed)));
                masters.len() - 1
            }
        };
        for slot in start.min(SLOTS as i64 - 1)..=end.min(SLOTS as i64 - 1) {
            slots[slot as usize] = index as u16;
        }
    }
    Some((slots, masters))
}

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        _ => None,
    }
}

fn node_in(value: &Value, asked: &Node) -> Option<Node> {
    let Value::Array(fields) = value else {
        return None;
    };
    let host = match fields.first()? {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::SimpleString(s) => s.clone(),
        _ => return None,
    };
    let host = if host.is_empty() || host == "?" {
        asked.host.clone()
    } else {
        host
    };
    let port = u16::try_from(int(fields.get(1)?)?).ok()?;
    Some(Node { host, port })
}

/// What `INFO replication` says of a master's replicas.
#[derive(Debug, Default, PartialEq)]
struct ReplicationInfo {
    connected: u32,
    in_step: u32,
}

/// One command to the node `info` names, on the watcher's link to it (made when there is
/// none), within [`NODE_TIMEOUT`]: its answer (`None`: none), and the link to keep (none
/// after a failure: made anew next time).
async fn ask<T: redis::FromRedisValue>(
    info: &ConnectionInfo,
    link: Option<MultiplexedConnection>,
    cmd: &redis::Cmd,
) -> (Option<T>, Option<MultiplexedConnection>) {
    let link = match link {
        Some(link) => Some(link),
        None => connect(info, NODE_TIMEOUT).await,
    };
    let Some(mut link) = link else {
        return (None, None);
    };
    match tokio::time::timeout(NODE_TIMEOUT, cmd.query_async::<T>(&mut link)).await {
        Ok(Ok(answer)) => (Some(answer), Some(link)),
        _ => (None, None),
    }
}

/// `INFO replication` of `info`'s node (`None`: no answer), and the link to keep. A node
/// that is not a master has no replicas of its own.
async fn replication_info(
    info: &ConnectionInfo,
    link: Option<MultiplexedConnection>,
) -> (Option<ReplicationInfo>, Option<MultiplexedConnection>) {
    let (text, link) = ask::<String>(info, link, redis::cmd("INFO").arg("replication")).await;
    (text.as_deref().map(parse_replication), link)
}

fn parse_replication(text: &str) -> ReplicationInfo {
    let mut seen = ReplicationInfo::default();
    if !text.lines().any(|line| line.trim() == "role:master") {
        return seen;
    }
    for line in text.lines() {
        let Some((name, fields)) = line.trim().split_once(':') else {
            continue;
        };
        if !name.starts_with("slave") || !name[5..].bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        seen.connected += 1;
        let field = |wanted: &str| {
            fields
                .split(',')
                .filter_map(|pair| pair.split_once('='))
                .find(|(name, _)| *name == wanted)
                .map(|(_, value)| value)
        };
        let online = field("state") == Some("online");
        let lag = field("lag").and_then(|lag| lag.parse::<u64>().ok());
        if online && lag.is_some_and(|lag| lag <= MOST_LAG_S) {
            seen.in_step += 1;
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_hash_tag_as_redis_computes_them() {
        // Values from `CLUSTER KEYSLOT`.
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of("{user1000}.following"), slot_of("user1000"));
        assert_eq!(slot_of("ns:{item:7}:v1:meta"), slot_of("item:7"));
        // An empty tag is no tag: the whole key is hashed.
        assert_ne!(slot_of("{}foo"), slot_of("foo"));
    }

    #[test]
    fn replicas_in_step_are_online_and_recent() {
        let text = "# Replication\r\nrole:master\r\nconnected_slaves:3\r\n\
            slave0:ip=10.0.0.2,port=7003,state=online,offset=120,lag=0\r\n\
            slave1:ip=10.0.0.3,port=7004,state=wait_bgsave,offset=0,lag=0\r\n\
            slave2:ip=10.0.0.4,port=7005,state=online,offset=100,lag=9\r\n\
            master_repl_offset:120\r\n";
        assert_eq!(
            parse_replication(text),
            ReplicationInfo {
                connected: 3,
                in_step: 1
            }
        );
        let replica = "role:slave\r\nmaster_host:10.0.0.1\r\nslave_repl_offset:1\r\n";
        assert_eq!(parse_replication(replica), ReplicationInfo::default());
    }

    /// A master as the last look judged it: `in_step`, last heard `heard`.
    fn judged(in_step: u32, heard: Option<Heard>) -> Master {
        Master {
            node: Node {
                host: "127.0.0.1".into(),
                port: 7000,
            },
            in_step,
            could_take_over: Some(1),
            heard,
        }
    }

    #[test]
    fn a_master_without_an_answer_keeps_its_judgement_until_silent_too_long() {
        let t0 = Instant::now();
        let heard = Some(Heard {
            at: t0,
            short: false,
        });
        let before = judged(1, heard);
        let later = |s: f64| t0 + Duration::from_secs_f64(s);
        assert_eq!(judge(1, None, Some(&before), None, later(1.9)).0, 1);
        assert_eq!(judge(1, None, Some(&before), None, later(2.1)).0, 0);
        // Never heard from: nothing to keep.
        assert_eq!(
            judge(1, None, Some(&judged(0, None)), None, later(0.1)).0,
            0
        );
        assert_eq!(judge(1, None, None, None, later(0.1)).0, 0);
        // It answers again: what it says counts.
        let (in_step, heard) = judge(1, Some(1), Some(&before), None, later(3.0));
        assert_eq!((in_step, heard.map(|h| h.at)), (1, Some(later(3.0))));
    }

    #[test]
    fn a_master_in_step_turns_short_when_two_answers_in_a_row_say_so() {
        let t0 = Instant::now();
        let before = judged(
            1,
            Some(Heard {
                at: t0,
                short: false,
            }),
        );
        let t1 = t0 + WATCH_EVERY;
        let (in_step, heard) = judge(1, Some(0), Some(&before), None, t1);
        assert_eq!(in_step, 1, "one short answer");
        let once = judged(in_step, heard);
        assert_eq!(judge(1, Some(0), Some(&once), None, t1 + WATCH_EVERY).0, 0);
        // A silent look between them does not reset the count.
        let silent = judged(1, heard);
        assert_eq!(
            judge(1, Some(0), Some(&silent), None, t1 + WATCH_EVERY).0,
            0
        );
        // A master seen for the first time (one just promoted): its first answer counts.
        assert_eq!(judge(1, Some(0), None, None, t1).0, 0);
        // Back in step: at once.
        let short = judged(
            0,
            Some(Heard {
                at: t1,
                short: true,
            }),
        );
        assert_eq!(judge(1, Some(1), Some(&short), None, t1 + WATCH_EVERY).0, 1);
    }

    #[test]
    fn a_wait_its_replicas_acknowledged_proves_them_in_step_for_a_while() {
        let t0 = Instant::now();
        let short = judged(
            0,
            Some(Heard {
                at: t0,
                short: true,
            }),
        );
        let sent = Some(t0);
        // INFO says short (a lag read high), or nothing at all: the WAIT says otherwise.
        assert_eq!(judge(1, Some(0), Some(&short), sent, t0 + PROOF_FOR).0, 1);
        assert_eq!(judge(2, None, None, sent, t0 + PROOF_FOR).0, 2);
        let after = t0 + PROOF_FOR + Duration::from_millis(1);
        assert_eq!(judge(1, Some(0), Some(&short), sent, after).0, 0);
    }

    #[test]
    fn the_slot_map_names_each_master_and_its_listed_replicas() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let node =
            |host: &str, port: i64| Value::Array(vec![bulk(host), Value::Int(port), bulk("id")]);
        let value = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(8191),
                node("127.0.0.1", 7000),
                node("127.0.0.1", 7003),
            ]),
            Value::Array(vec![Value::Int(8192), Value::Int(16383), node("", 7001)]),
        ]);
        let asked = Node {
            host: "10.1.1.1".into(),
            port: 7001,
        };
        let (slots, masters) = parse_slots(&value, &asked).unwrap();
        assert_eq!(slots[0], 0);
        assert_eq!(slots[16383], 1);
        assert_eq!(masters[0].1, Some(1));
        assert_eq!(masters[1], (asked, Some(0)));
    }
}
