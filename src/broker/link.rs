//! The connection to RabbitMQ, kept alive by a supervisor task. With several nodes (a
//! cluster), it connects to the first that answers and, when that one is lost, tries the
//! next ones first.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lapin::options::ConfirmSelectOptions;
use lapin::{Channel, Connection, ConnectionProperties};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::Topology;
use crate::background::retry;

/// How long a connect to the only node may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a connect to one of several nodes may take before the next is tried. A
/// healthy node answers in milliseconds; a silent one (its host cut off) held every
/// fresh server's first connection for the full three seconds, and orders won meanwhile
/// reached MySQL after their pay deadline was due.
const NODE_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// The heartbeat asked for when the URL names none (`?heartbeat=N` does). A node that
/// stops answering without closing the socket (a host cut off, a paused VM) is noticed
/// after two heartbeats: with RabbitMQ's own 60 s, a consumer waited two minutes on a
/// silent node while its orders queued up elsewhere.
const HEARTBEAT_S: u16 = 5;
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How long a question to the broker (a queue's depth) may take.
const ASK_WITHIN: Duration = Duration::from_secs(2);
/// How often the supervisor looks at the connection's health.
const CHECK_EVERY: Duration = Duration::from_millis(250);
/// How long a close waits for the broker's close-ok. Closing is a courtesy (the broker
/// requeues what a dead channel held), and an unanswered close must not hold up a
/// reconnect or a stop: a close whose socket went first has been seen never to finish.
pub const CLOSE_WITHIN: Duration = Duration::from_secs(2);

#[derive(Clone)]
pub struct Broker {
    inner: Arc<Inner>,
}

struct Inner {
    /// The nodes, in the order given.
    urls: Vec<String>,
    /// Which node to try first.
    next: AtomicUsize,
    topology: Topology,
    link: watch::Sender<Option<Link>>,
}

/// A consumer's channel, and word of when its connection is given up.
pub struct Opened {
    pub channel: Channel,
    pub gone: Gone,
}

/// Tells when the link has given up the connection a channel lives on.
pub struct Gone {
    on: Arc<Connection>,
    link: watch::Receiver<Option<Link>>,
}

impl Gone {
    /// Resolves once the link no longer uses the connection (lost, or left for a node gone
    /// silent). A consumer must then open a channel again: a connection given up while its
    /// node is silent stays closing for good, its heartbeat no longer watched, and a
    /// consumer on it waited for deliveries that never came.
    pub async fn wait(&mut self) {
        let on = self.on.clone();
        let current =
            |l: &Option<Link>| l.as_ref().is_some_and(|l| Arc::ptr_eq(&l.connection, &on));
        let _ = self.link.wait_for(|l| !current(l)).await;
    }
}

/// A live connection, with the channel all publishes share (publisher confirms on).
#[derive(Clone)]
pub struct Link {
    connection: Arc<Connection>,
    publish: Channel,
}

impl Link {
    /// Connected, and the publishing channel still open (a channel can be closed by the
    /// broker on its own, for instance when its queue is deleted).
    fn is_healthy(&self) -> bool {
        self.connection.status().connected() && self.publish.status().connected()
    }
}

impl Broker {
    /// `urls`: one node's URL, or several, comma-separated (nodes of one cluster).
    pub fn new(urls: &str, topology: Topology) -> Self {
        Self {
            inner: Arc::new(Inner {
                urls: urls
                    .split(',')
                    .map(str::trim)
                    .filter(|u| !u.is_empty())
                    .map(str::to_owned)
                    .collect(),
                next: AtomicUsize::new(0),
                topology,
                link: watch::Sender::new(None),
            }),
        }
    }

    pub fn topology(&self) -> &Topology {
        &self.inner.topology
    }

    pub fn is_connected(&self) -> bool {
        self.inner
            .link
            .borrow()
            .as_ref()
            .is_some_and(Link::is_healthy)
    }

    /// The publishing channel, if connected now. Never waits.
    pub fn publish_channel(&self) -> Option<Channel> {
        self.inner
            .link
            .borrow()
            .as_ref()
            .filter(|l| l.is_healthy())
            .map(|l| l.publish.clone())
    }

    /// The publishing channel, waiting up to `limit` for a connection (one that is being
    /// made right now, at start or after a loss).
    pub async fn publish_channel_within(&self, limit: Duration) -> Option<Channel> {
        if let Some(channel) = self.publish_channel() {
            return Some(channel);
        }
        let mut link = self.inner.link.subscribe();
        let healthy = |l: &Option<Link>| l.as_ref().is_some_and(Link::is_healthy);
        let found = tokio::time::timeout(limit, link.wait_for(healthy)).await;
        found.ok()?.ok()?.as_ref().map(|l| l.publish.clone())
    }

    /// Messages ready in the order queue (not counting those a consumer holds unacked),
    /// or `None` when the broker cannot tell now.
    pub async fn queue_depth(&self) -> Option<u32> {
        self.depth_of(&self.inner.topology.orders_queue).await
    }

    /// Dead letters waiting for a human, or `None` when the broker cannot tell now.
    pub async fn dead_letters(&self) -> Option<u32> {
        self.depth_of(&self.inner.topology.dead_queue).await
    }

    async fn depth_of(&self, queue: &str) -> Option<u32> {
        // A node gone silent answers neither the channel's open nor the declare: without a
        // limit the health watch waited on it for good, and held up the server's stop.
        tokio::time::timeout(ASK_WITHIN, self.ask_depth(queue))
            .await
            .ok()
            .flatten()
    }

    async fn ask_depth(&self, queue: &str) -> Option<u32> {
        let connection = self.inner.link.borrow().as_ref()?.connection.clone();
        // A channel of its own: a failed passive declare closes the channel it ran on.
        let channel = connection.create_channel().await.ok()?;
        let queue = channel
            .queue_declare(
                queue.into(),
                lapin::options::QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                lapin::types::FieldTable::default(),
            )
            .await
            .ok();
        let _ = tokio::time::timeout(CLOSE_WITHIN, channel.close(200, "done".into())).await;
        Some(queue?.message_count())
    }

    /// A new channel (for a consumer), waiting for a connection; `None` on shutdown.
    pub async fn open_channel(
        &self,
        shutdown: &CancellationToken,
    ) -> Option<lapin::Result<Opened>> {
        let mut link = self.inner.link.subscribe();
        let connection = tokio::select! {
            () = shutdown.cancelled() => return None,
            found = link.wait_for(Option::is_some) => found.ok()?.as_ref()?.connection.clone(),
        };
        let channel = match connection.create_channel().await {
            Ok(channel) => channel,
            Err(e) => return Some(Err(e)),
        };
        Some(Ok(Opened {
            channel,
            gone: Gone {
                on: connection,
                link,
            },
        }))
    }

    /// Connects, declares the topology, and reconnects whenever the connection is lost,
    /// until shutdown.
    pub async fn run(self, shutdown: CancellationToken) {
        let what = "connecting to RabbitMQ (orders wait in the Redis outbox meanwhile)";
        while let Some(link) = retry(what, MAX_BACKOFF, &shutdown, || self.connect()).await {
            let connection = link.connection.clone();
            self.inner.link.send_replace(Some(link.clone()));
            while link.is_healthy() && !shutdown.is_cancelled() {
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    () = tokio::time::sleep(CHECK_EVERY) => {}
                }
            }
            self.inner.link.send_replace(None);
            // Closes a connection whose publishing channel died; fails harmlessly on one
            // that is already gone. Waited for only on a stop: a silent node never answers
            // it, and the orders in the outbox should not wait for that.
            let closing = async move {
                let closing = connection.close(200, "reconnecting".into());
                let _ = tokio::time::timeout(CLOSE_WITHIN, closing).await;
            };
            if shutdown.is_cancelled() {
                closing.await;
                return;
            }
            tokio::spawn(closing);
            // The node may be gone: another one first.
            self.inner.next.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                "lost the RabbitMQ connection; reconnecting (orders wait in the Redis outbox)"
            );
        }
    }

    /// Connects to the first node that answers, starting with the one to try first.
    async fn connect(&self) -> Result<Link, String> {
        let urls = &self.inner.urls;
        let first = self.inner.next.load(Ordering::Relaxed);
        let mut failures = Vec::new();
        let within = if urls.len() > 1 {
            NODE_CONNECT_TIMEOUT
        } else {
            CONNECT_TIMEOUT
        };
        for i in (0..urls.len()).map(|k| (first + k) % urls.len()) {
            match tokio::time::timeout(within, self.connect_to(&urls[i])).await {
                Ok(Ok(link)) => {
                    tracing::info!(node = i + 1, of = urls.len(), "connected to RabbitMQ");
                    self.inner.next.store(i, Ordering::Relaxed);
                    return Ok(link);
                }
                Ok(Err(e)) => failures.push(format!("node {}: {e}", i + 1)),
                Err(_) => failures.push(format!("node {}: no answer within {within:?}", i + 1)),
            }
        }
        Err(failures.join("; "))
    }

    async fn connect_to(&self, url: &str) -> Result<Link, String> {
        let mut uri: lapin::uri::AMQPUri =
            url.parse().map_err(|e| format!("not an AMQP URL: {e}"))?;
        uri.query.heartbeat.get_or_insert(HEARTBEAT_S);
        self.open(uri)
            .await
            .map_err(|e| crate::error::cause_chain(&e))
    }

    async fn open(&self, uri: lapin::uri::AMQPUri) -> lapin::Result<Link> {
        let connection = Connection::connect_uri(uri, ConnectionProperties::default()).await?;
        let publish = connection.create_channel().await?;
        self.inner.topology.declare(&publish).await?;
        publish
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(Link {
            connection: Arc::new(connection),
            publish,
        })
    }
}
