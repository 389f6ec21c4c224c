//! What background work and every operation run against: this process's settings, key
//! names, stores, broker and meters. `app.rs` builds it once; each role's tasks are built
//! from it whole, each taking what it needs, and `AppState` holds it for the handlers to
//! hand to the operations they call. Cheap to clone: every field is a handle.

use std::sync::Arc;

use crate::broker::Broker;
use crate::config::Settings;
use crate::keys::Keys;
use crate::store::{Db, RedisConns};
use crate::telemetry::Meters;

#[derive(Clone)]
pub struct Deps {
    pub settings: Arc<Settings>,
    pub keys: Keys,
    pub db: Db,
    pub redis: RedisConns,
    pub broker: Broker,
    pub meters: Arc<Meters>,
}
