//! What every handler may reach: the process's connections, caches and limits, built once
//! by [`crate::app::Server::build`] and cloned into each request.

use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::auth::Jwt;
use crate::breaker::Breakers;
use crate::config::Settings;
use crate::deps::Deps;
use crate::http::Edge;
use crate::http::rate_limit::RateLimits;
use crate::items::catalog::Catalog;
use crate::outbox::publisher::OrderPublisher;
use crate::shops::cache::Shops;
use crate::signals::Signals;

/// Everything a handler may need, behind one `Arc`: a request clones one pointer rather
/// than a dozen (cloning and dropping the fields one by one, an atomic each, was 2–3% of
/// the sold-out path's CPU under `perf`). Fields are reached through `Deref`.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl AppState {
    pub fn new(shared: Shared) -> Self {
        Self(Arc::new(shared))
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// What [`AppState`] shares.
pub struct Shared {
    /// Settings, key names, stores, broker and meters: what background work runs against
    /// too, and what every operation a handler calls starts from.
    pub deps: Deps,
    pub catalog: Catalog,
    pub publisher: OrderPublisher,
    pub jwt: Arc<Jwt>,
    pub limits: Arc<RateLimits>,
    pub breakers: Breakers,
    /// What purchases and publishes measured, for the automatic breaker.
    pub signals: Arc<Signals>,
    /// Permits for purchases in flight (`SECKILL_MAX_INFLIGHT`).
    pub inflight: Arc<Semaphore>,
    pub shops: Shops,
    /// The waiting rooms' signing keys and event streams' watches.
    pub waiting: Arc<crate::queue::Waiting>,
}

impl Edge for AppState {
    fn settings(&self) -> &Settings {
        &self.deps.settings
    }

    fn jwt(&self) -> &Jwt {
        &self.jwt
    }

    fn limits(&self) -> &RateLimits {
        &self.limits
    }
}
