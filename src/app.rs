//! Putting the server together: the shared state, the roles, start and clean shutdown.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower::util::MapResponseLayer;
use utoipa_axum::router::OpenApiRouter;

use crate::auth::Jwt;
use crate::breaker::{self, Breakers};
use crate::broker::{Broker, Topology};
use crate::config::{DEV_JWT_SECRET, Payments, Role, Settings};
use crate::deps::Deps;
use crate::http::rate_limit::RateLimits;
use crate::items::catalog::Catalog;
use crate::keys::Keys;
use crate::orders::consumer::Consumer;
use crate::outbox::publisher::OrderPublisher;
use crate::scheduler::Scheduler;
use crate::shops::cache::Shops;
use crate::signals::Signals;
use crate::state::{AppState, Shared};
use crate::store::{Db, MissLimit, RedisConns, WaitRule, connect_mysql, migrate};
use crate::telemetry::Meters;
use crate::{health, http, items, lua, orders, purchase, shops, warmup};

/// How long a stop waits for background work, and then for the broker connection, after
/// HTTP has drained: twice the broker's confirm timeout.
const STOP_WITHIN: Duration = Duration::from_secs(10);

/// A server that has connected, migrated and bound its listeners, ready to [`Server::run`].
pub struct Server {
    state: AppState,
    roles: HashSet<Role>,
    listener: TcpListener,
    admin_listener: Option<TcpListener>,
    /// Stops the background roles once HTTP has drained.
    workers: CancellationToken,
    publisher_task: tokio::task::JoinHandle<()>,
    /// What every role's background tasks are built from.
    deps: Deps,
}

impl Server {
    pub async fn build(settings: Settings, roles: &[Role]) -> anyhow::Result<Self> {
        refuse_unsafe(&settings)?;
        warn_of_defaults(&settings);
        // Before anything records a metric.
        let meters = Arc::new(Meters::new(&settings.namespace));
        let db = connect_mysql(settings.database_url.expose()).await?;
        migrate(&db).await?;

        let redis = connect_redis(&settings).await?;
        // Before anything decides by the time (`clock`).
        if let Err(e) = crate::clock::measure(&redis).await {
            tracing::warn!(error = %crate::error::cause_chain(&e), "cannot measure this host's clock against Redis yet; trusting it until then");
        }
        let keys = Keys::new(&settings.namespace);
        let broker = Broker::new(
            settings.amqp_url.expose(),
            Topology::new(&settings.namespace).with_queue_type(settings.queue_type),
        );
        let (shops, catalog) = caches(&db, &redis, &keys, &meters);
        let roles: HashSet<Role> = roles.iter().copied().collect();
        if roles.contains(&Role::Api)
            && let Err(e) = catalog.refresh().await
        {
            tracing::warn!(error = %crate::error::cause_chain(&e), "first item catalogue load failed; retrying in the background");
        }

        let listener = bind(settings.http_addr, "listening").await?;
        let admin_listener = match settings.admin_addr {
            Some(addr) => Some(bind(addr, "admin listening").await?),
            None => None,
        };

        let workers = CancellationToken::new();
        let signals = Arc::new(Signals::from_settings(&settings));
        let deps = Deps {
            settings: Arc::new(settings),
            keys,
            db,
            redis,
            broker,
            meters,
        };
        let (publisher, publisher_task) =
            OrderPublisher::spawn(&deps, signals.clone(), workers.clone());
        let Deps {
            settings,
            keys,
            redis,
            ..
        } = deps.clone();
        let breakers = Breakers::new(settings.breaker_throttle_rps);
        if roles.contains(&Role::Api) {
            obey_stored_levels(&breakers, &redis, &keys).await;
        }
        let state = AppState::new(Shared {
            breakers,
            signals,
            inflight: Arc::new(Semaphore::new(settings.max_inflight as usize)),
            shops,
            jwt: Arc::new(Jwt::new(&settings.jwt_secret)),
            waiting: Arc::new(crate::queue::Waiting::new(
                settings.jwt_secret.expose(),
                &redis,
                &keys,
            )),
            limits: Arc::new(RateLimits::new(&settings)),
            deps: deps.clone(),
            catalog,
            publisher,
        });
        Ok(Self {
            state,
            roles,
            listener,
            admin_listener,
            workers,
            publisher_task,
            deps,
        })
    }

    /// The address the main listener is bound to (useful with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .unwrap_or_else(|_| self.state.deps.settings.http_addr)
    }

    /// The admin listener's address, when `SECKILL_ADMIN_ADDR` is set.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_listener
            .as_ref()
            .and_then(|l| l.local_addr().ok())
    }

    /// Serves until `shutdown`: then stops accepting, finishes in-flight requests, lets
    /// the consumer finish (and ack) its batch and the publisher send its buffer, and
    /// closes the broker connection last.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let Server {
            state,
            roles,
            listener,
            admin_listener,
            workers,
            publisher_task,
            deps,
        } = self;
        let broker_stop = CancellationToken::new();
        let broker_task = tokio::spawn(state.deps.broker.clone().run(broker_stop.clone()));

        let mut background = JoinSet::new();
        background.spawn(crate::telemetry::upkeep(workers.clone()));
        background.spawn(keep_the_clock(state.deps.redis.clone(), workers.clone()));
        background.spawn(crate::health::watch(state.clone(), workers.clone()));
        if roles.contains(&Role::Api) {
            spawn_api_upkeep(&state, &deps, &workers, &mut background);
        }
        if roles.contains(&Role::Consumer) {
            background.spawn(Consumer::new(&deps).run(workers.clone()));
        }
        if roles.contains(&Role::Scheduler) {
            let scheduler = Scheduler::new(&deps, state.shops.clone());
            background.spawn(scheduler.run(workers.clone()));
        }

        let (main, admin) = routers(&state, &roles, admin_listener.is_some());
        let mut servers = JoinSet::new();
        servers.spawn(serve(listener, main, shutdown.clone()));
        if let (Some(listener), Some(admin)) = (admin_listener, admin) {
            servers.spawn(serve(listener, admin, shutdown.clone()));
        }
        let mut result = Ok(());
        while let Some(done) = servers.join_next().await {
            if let Err(e) = done.map_err(anyhow::Error::from).and_then(|r| r) {
                // One listener failed: stop the whole server rather than run half of it.
                shutdown.cancel();
                result = Err(e);
            }
        }
        tracing::info!("HTTP drained; stopping background work");
        workers.cancel();
        // Each task ends at the cancel, finishing what it holds (a consumer's batch, the
        // publisher's buffer: both bounded by the broker's confirm timeout). One stuck in
        // a broker call that never answers is cut off: every task survives that (leases,
        // marks, idempotent writes, the outbox), and a stop must not hang on a dead node.
        let finished = tokio::time::timeout(STOP_WITHIN, async {
            while background.join_next().await.is_some() {}
            let _ = publisher_task.await;
        })
        .await;
        if finished.is_err() {
            tracing::warn!(
                "background work still running {} s after the stop began; cut off",
                STOP_WITHIN.as_secs()
            );
            background.shutdown().await;
        }
        broker_stop.cancel();
        if tokio::time::timeout(STOP_WITHIN, broker_task)
            .await
            .is_err()
        {
            tracing::warn!("the broker connection did not close; cut off");
        }
        tracing::info!("stopped");
        result
    }
}

/// Measures this host's clock against Redis's again and again (`clock`), until `shutdown`.
async fn keep_the_clock(redis: RedisConns, shutdown: CancellationToken) {
    crate::background::repeat(
        "measuring the clock against Redis",
        crate::background::Schedule::every(crate::clock::MEASURE_EVERY),
        &shutdown,
        || crate::clock::measure(&redis),
    )
    .await;
}

/// Redis, with the Lua scripts loaded when it answers (else they load on first use).
async fn connect_redis(settings: &Settings) -> anyhow::Result<RedisConns> {
    let redis = RedisConns::new(settings.redis_url.expose())
        .context("SECKILL_REDIS_URL is not a Redis URL")?
        .waiting_for(WaitRule::from_settings(settings));
    let preloaded = async { lua::preload(&mut redis.hot().await?).await }.await;
    if let Err(e) = preloaded {
        tracing::warn!(error = %e, "cannot preload Lua scripts yet (Redis down?); they load on first use");
    }
    Ok(redis)
}

/// The in-memory shops and item catalogue, sharing one limit on look-ups of unknown ids.
fn caches(db: &Db, redis: &RedisConns, keys: &Keys, meters: &Arc<Meters>) -> (Shops, Catalog) {
    let misses = MissLimit::default();
    let shops = Shops::new(
        db.clone(),
        redis.clone(),
        keys.clone(),
        meters.clone(),
        misses.clone(),
    );
    let catalog = Catalog::new(
        db.clone(),
        redis.clone(),
        keys.clone(),
        meters.clone(),
        shops.clone(),
        misses,
    );
    (shops, catalog)
}

/// Refuses to start what must never run in production: buyers paying their own orders
/// (`SECKILL_PAYMENTS=trust_buyer`) beside a real JWT secret — tokens real buyers hold.
fn refuse_unsafe(settings: &Settings) -> anyhow::Result<()> {
    if settings.payments == Payments::TrustBuyer && settings.jwt_secret.expose() != DEV_JWT_SECRET {
        anyhow::bail!(
            "SECKILL_PAYMENTS=trust_buyer lets every buyer mark their own orders paid: it runs only with the development JWT secret (unset SECKILL_JWT_SECRET), never with real tokens"
        );
    }
    Ok(())
}

/// Says what runs on a development default.
fn warn_of_defaults(settings: &Settings) {
    if settings.payments == Payments::TrustBuyer {
        tracing::warn!(
            "SECKILL_PAYMENTS=trust_buyer: BUYERS MARK THEIR OWN ORDERS PAID WITHOUT PAYING; development only"
        );
    }
    if settings.payments == Payments::Events && settings.payment_secret.is_empty() {
        tracing::warn!(
            "SECKILL_PAYMENT_SECRET is not set: every payment event is refused (401), so no order can be paid"
        );
    }
    if settings.jwt_secret.expose() == DEV_JWT_SECRET {
        tracing::warn!(
            "SECKILL_JWT_SECRET is not set: using the built-in development secret; anyone can mint tokens"
        );
    }
    if settings.admin_token.is_none() {
        tracing::warn!("SECKILL_ADMIN_TOKEN is not set: the admin API answers 401");
    }
}

/// A restarted instance obeys the breaker levels from its first request.
async fn obey_stored_levels(breakers: &Breakers, redis: &RedisConns, keys: &Keys) {
    match breaker::store::load_all(redis, keys).await {
        Ok(settings) => breakers.set_all(&breaker::store::levels(&settings)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read breaker levels yet; following them in the background")
        }
    }
}

/// The `api` role's upkeep: the catalogue and shops kept fresh, breaker changes followed
/// (and this instance's automatic breaker, when on), the rate limits' housekeeping.
fn spawn_api_upkeep(
    state: &AppState,
    deps: &Deps,
    workers: &CancellationToken,
    background: &mut JoinSet<()>,
) {
    background.spawn(state.catalog.clone().run(workers.clone()));
    background.spawn(state.shops.clone().flush_stale(workers.clone()));
    let shops = state.shops.clone();
    background.spawn(crate::shops::changes::follow(
        shops,
        deps.clone(),
        workers.clone(),
    ));
    let breakers = state.breakers.clone();
    background.spawn(breaker::store::follow(
        breakers,
        deps.clone(),
        workers.clone(),
    ));
    if state.deps.settings.breaker_auto {
        let signals = state.signals.clone();
        background.spawn(breaker::auto::control(
            signals,
            state.breakers.clone(),
            deps.clone(),
            workers.clone(),
        ));
    }
    let limits = state.limits.clone();
    let stop = workers.clone();
    background.spawn(async move { limits.housekeeping(stop).await });
}

/// The main router and, when the admin API has a listener of its own, the admin router:
/// every feature's routes, merged here and nowhere else. The OpenAPI document describes
/// them all, whichever roles this instance serves.
fn routers(state: &AppState, roles: &HashSet<Role>, admin_apart: bool) -> (Router, Option<Router>) {
    let (health, health_doc) = health::router().split_for_parts();
    let (api, api_doc) = OpenApiRouter::new()
        .merge(purchase::api::router())
        .merge(orders::api::router())
        .merge(items::api::router())
        .merge(crate::draw::api::router())
        .merge(shops::api::router())
        .merge(crate::payments::api::router())
        .merge(crate::queue::api::router())
        .split_for_parts();
    let (admin, admin_doc) = OpenApiRouter::new()
        .merge(items::admin::router())
        .merge(warmup::admin::router())
        .merge(orders::admin::router())
        .merge(shops::admin::router())
        .merge(breaker::admin::router())
        .merge(crate::payments::admin::router())
        .merge(crate::queue::admin::router())
        .merge(health::metrics_router())
        .split_for_parts();
    let mut main = health;
    if roles.contains(&Role::Api) {
        let document = http::openapi::document([health_doc, api_doc, admin_doc]);
        main = main.merge(api).merge(http::openapi::router(&document));
    }
    let finish = |routes| http::finish(routes, state.clone());
    if admin_apart {
        (finish(main), Some(finish(admin)))
    } else {
        (finish(main.merge(admin)), None)
    }
}

/// Connections the kernel holds for the server before it accepts them. `TcpListener::bind`
/// asks for 128, as the standard library does: when a sale opens, nginx (or a crowd
/// without it) opens hundreds of connections in the same instant, and while the server's
/// cores are busy selling, the 129th SYN was dropped — its sender waits a second to try
/// again, past nginx's one-second connect limit, and two such timeouts take the instance
/// out of nginx's rotation. The kernel caps this at `net.core.somaxconn`.
const LISTEN_BACKLOG: u32 = 4096;

async fn bind(addr: SocketAddr, what: &'static str) -> anyhow::Result<TcpListener> {
    let listener = listen(addr).with_context(|| format!("cannot listen on {addr}"))?;
    let bound = listener.local_addr()?;
    tracing::info!(addr = %bound, "{what}");
    Ok(listener)
}

/// A listener on `addr` with room for a crowd's connections ([`LISTEN_BACKLOG`]).
pub fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // As `TcpListener::bind` does: a restarted server can listen again at once, while
    // connections of the one before are still in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let make = router.into_make_service_with_connect_info::<SocketAddr>();
    // Each connection's service with the edge around it.
    let edged = tower::Layer::layer(&MapResponseLayer::new(http::EdgeService::around), make);
    axum::serve(listener, edged)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
        .context("HTTP server failed")
}
