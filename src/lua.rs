//! The Lua scripts under `lua/`, compiled into the binary. Each file's header gives its
//! KEYS, ARGV and return values.
//!
//! They run by `EVALSHA`; redis-rs loads a script again and retries when Redis answers
//! `NOSCRIPT` (its script cache is empty after a restart or failover), so a flushed cache
//! costs one extra round trip, not an outage. The purchase, `grab.lua`, runs as a Redis
//! Function ([`Function`]), loaded again alike when Redis does not know it.

use std::sync::LazyLock;

use redis::Script;

use crate::store::{RedisError, redis_timed};

/// Sells one unit: see `lua/grab.lua` (the meta's packed rules: `lua/lib/rules.lua`;
/// waves: `lua/lib/waves.lua`; the buyer record: `lua/lib/places.lua`; a repeated key's
/// claim: `lua/lib/repeats.lua`). A Redis Function, the only one: it is the call the crowd
/// makes ([`Function`]).
pub static GRAB: LazyLock<Function> = LazyLock::new(|| {
    Function::new(
        "grab",
        &[
            include_str!("../lua/lib/rules.lua"),
            include_str!("../lua/lib/waves.lua"),
            include_str!("../lua/lib/places.lua"),
            include_str!("../lua/lib/repeats.lua"),
        ],
        include_str!("../lua/grab.lua"),
    )
});

/// Arguments and bytes an `FCALL` of `grab.lua` takes, about: `FCALL`, the name, the key
/// count, up to six keys and five arguments; each key under 60 bytes, the order's JSON
/// under 200.
const CALL_ARGS: usize = 16;
const CALL_BYTES: usize = 640;

/// A script run as a Redis Function (`FUNCTION LOAD`, `FCALL`). A script defines its
/// helpers (`lua/lib/`) anew on every call; a Function's library defines them once, at
/// load: a won grab ran 90,724 instructions of Redis as a script and 84,217 as a Function
/// (`loadtest/grab_anatomy.sh`).
///
/// Its name carries a hash of its code, as a script's SHA does: during a rolling upgrade
/// servers of two releases call their own side by side, and a load never replaces another
/// release's. So each release leaves a library of a few KB behind in Redis (`FUNCTION
/// LIST`; docs/operations.md says how to delete the old ones).
pub struct Function {
    /// What `FCALL` names: `<what>_<16 hex digits of its code's SHA-1>`.
    name: String,
    /// The library `FUNCTION LOAD` takes: the helpers, the body wrapped in a function of
    /// `KEYS` and `ARGV`, and its registration.
    library: String,
}

impl Function {
    fn new(what: &str, helpers: &[&str], body: &str) -> Self {
        let helpers = helpers.concat();
        let sha = Script::new(&format!("{helpers}{body}"))
            .get_hash()
            .to_owned();
        let name = format!("{what}_{}", &sha[..16]);
        let library = format!(
            "#!lua name=seckill_{name}\n{helpers}\nlocal function {what}(KEYS, ARGV)\n{body}\nend\n\
             redis.register_function('{name}', {what})\n"
        );
        Self { name, library }
    }

    /// An `FCALL` of it with `keys` keys: add the keys, then the arguments, and run it with
    /// [`Function::invoke`].
    pub fn call(&self, keys: usize) -> redis::Cmd {
        // Room for a purchase's keys and arguments (the order's JSON among them) from the
        // start: grown from empty, the command's buffer was reallocated five times a call.
        let mut cmd = redis::Cmd::with_capacity(CALL_ARGS, CALL_BYTES);
        cmd.arg("FCALL").arg(&self.name).arg(keys);
        cmd
    }

    /// Runs `cmd` (from [`Function::call`]). A Redis that does not know the function — it
    /// restarted without its data, was flushed, or is a master added since — gets it loaded
    /// and the call once more, as `EVALSHA` does on `NOSCRIPT`.
    pub async fn invoke<T, C>(&self, cmd: &redis::Cmd, conn: &mut C) -> Result<T, RedisError>
    where
        T: redis::FromRedisValue,
        C: redis::aio::ConnectionLike,
    {
        match redis_timed(cmd.query_async(conn)).await {
            Err(RedisError::Command(e)) if not_found(&e) => {
                self.load(conn).await?;
                redis_timed(cmd.query_async(conn)).await
            }
            answer => answer,
        }
    }

    /// Loads it into Redis (on a cluster, every master) unless it is there already.
    pub async fn load<C>(&self, conn: &mut C) -> Result<(), RedisError>
    where
        C: redis::aio::ConnectionLike,
    {
        let mut load = redis::cmd("FUNCTION");
        load.arg("LOAD").arg(&self.library);
        match redis_timed(load.query_async::<redis::Value>(conn)).await {
            Err(RedisError::Command(e)) if already_there(&e) => Ok(()),
            loaded => loaded.map(|_| ()),
        }
    }
}

/// Redis's answer to an `FCALL` of a function it does not have.
fn not_found(e: &redis::RedisError) -> bool {
    e.detail()
        .is_some_and(|d| d.starts_with("Function not found"))
}

/// Redis's answer to a `FUNCTION LOAD` of a library it has (without `REPLACE`).
fn already_there(e: &redis::RedisError) -> bool {
    e.detail().is_some_and(|d| d.contains("already exists"))
}

/// Enters a buyer into a draw: see `lua/enter.lua`.
pub static ENTER: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/enter.lua")));

/// Gives a draw's winner a unit: see `lua/award.lua`.
pub static AWARD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/lib/places.lua"),
        include_str!("../lua/award.lua")
    ))
});

/// The order an `Idempotency-Key` bought, claimed while pending, for a press memory
/// refused: see `lua/bought.lua`.
pub static BOUGHT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/lib/repeats.lua"),
        include_str!("../lua/bought.lua")
    ))
});

/// Undoes a win its replicas did not confirm: see `lua/give_back.lua`.
pub static GIVE_BACK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/lib/places.lua"),
        include_str!("../lua/give_back.lua")
    ))
});

/// Gives the units of ended orders back: see `lua/release.lua`.
pub static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/lib/places.lua"),
        include_str!("../lua/release.lua")
    ))
});

/// Takes a unit again for a cancelled order paid late: see `lua/revive.lua`.
pub static REVIVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/lib/rules.lua"),
        include_str!("../lua/lib/waves.lua"),
        include_str!("../lua/lib/places.lua"),
        include_str!("../lua/revive.lua")
    ))
});

/// Takes a buyer's place in a waiting room: see `lua/queue_join.lua`.
pub static QUEUE_JOIN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/lib/queue_where.lua"),
        include_str!("../lua/queue_join.lua")
    ))
});

/// Where a buyer stands in a waiting room: see `lua/queue_where.lua`.
pub static QUEUE_WHERE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/lib/queue_where.lua"),
        include_str!("../lua/queue_where.lua")
    ))
});

/// One admission step of a waiting room: see `lua/queue_step.lua`.
pub static QUEUE_STEP: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/lib/queue_where.lua"),
        include_str!("../lua/queue_step.lua")
    ))
});

/// A forced warm-up holds a waiting room and reads what its passes reserve, or lets it
/// go: see `lua/queue_reload.lua`.
pub static QUEUE_RELOAD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/lib/queue_where.lua"),
        include_str!("../lua/queue_reload.lua")
    ))
});

/// Shows those let in up to a cursor: see `lua/queue_show.lua`.
pub static QUEUE_SHOW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/queue_show.lua")));

/// A purchase with a pass takes one of its units first: see `lua/queue_take.lua`.
pub static QUEUE_TAKE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/queue_take.lua")));

/// A purchase with a pass that won nothing gives its unit back: see `lua/queue_give.lua`.
pub static QUEUE_GIVE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/queue_give.lua")));

/// A win bought with a pass spends its reservation: see `lua/queue_used.lua`.
pub static QUEUE_USED: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/queue_used.lua")));

/// Records cancels as begun, timed by Redis's clock: see `lua/ending_begin.lua`.
pub static ENDING_BEGIN: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/ending_begin.lua")));

/// The cancels begun long enough ago, by Redis's clock: see `lua/ending_due.lua`.
pub static ENDING_DUE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/ending_due.lua")));

/// Looks again later at cancels whose order is still unpaid: see `lua/ending_keep.lua`.
pub static ENDING_KEEP: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/ending_keep.lua")));

/// Drops cancels begun that a sweep found finished or moot: see `lua/forget.lua`.
pub static FORGET: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/forget.lua")));

/// Ends or puts back delay-queue tasks still held under a lease: see `lua/finish.lua`.
pub static FINISH: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/finish.lua")));

/// Puts a warm-up's units, buyer records and meta in place: see `lua/swap.lua`.
pub static SWAP: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/lib/rules.lua"),
        include_str!("../lua/swap.lua")
    ))
});

/// Loads a fresh bucket's units and meta (the bulk warm-up's fast path): see
/// `lua/load_fresh.lua`. Run in pipelines of `EVALSHA`, loaded first with
/// [`RedisConns::load_script`](crate::store::RedisConns::load_script).
pub static LOAD_FRESH: LazyLock<Script> = LazyLock::new(|| Script::new(LOAD_FRESH_CODE));
pub const LOAD_FRESH_CODE: &str = concat!(
    include_str!("../lua/lib/rules.lua"),
    include_str!("../lua/load_fresh.lua")
);

/// Writes fields of a bucket's meta and packs what `grab.lua` checks of it: see
/// `lua/rules_set.lua` (the packing: `lua/lib/rules.lua`). Run in pipelines too, like
/// [`LOAD_FRESH`].
pub static RULES_SET: LazyLock<Script> = LazyLock::new(|| Script::new(RULES_SET_CODE));
pub const RULES_SET_CODE: &str = concat!(
    include_str!("../lua/lib/rules.lua"),
    include_str!("../lua/rules_set.lua")
);

/// Holds more of a bucket's units back for waves, if its list covers them: see
/// `lua/waves_raise.lua`.
pub static WAVES_RAISE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/lib/rules.lua"),
        include_str!("../lua/lib/waves.lua"),
        include_str!("../lua/waves_raise.lua")
    ))
});

/// Takes due delay-queue entries under a lease: see `lua/claim.lua`.
pub static CLAIM: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/claim.lua")));

/// Releases a lock only for its owner: see `lua/unlock.lua`. Run in pipelines too, like
/// [`LOAD_FRESH`].
pub static UNLOCK: LazyLock<Script> = LazyLock::new(|| Script::new(UNLOCK_CODE));
pub const UNLOCK_CODE: &str = include_str!("../lua/unlock.lua");

/// Moves an instance's automatic breaker between states: see `lua/breaker_auto.lua`.
pub static BREAKER_AUTO: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/breaker_auto.lua")));

/// Lends a unit to another bucket of a split item: see `lua/lend.lua`.
pub static LEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/lib/waves.lua"),
        include_str!("../lua/lend.lua")
    ))
});

/// Takes in a lent unit, once, unless voided: see `lua/receive.lua`.
pub static RECEIVE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/receive.lua")));

/// Settles a transfer on the lending side: see `lua/unlend.lua`.
pub static UNLEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/unlend.lua")));

/// Takes the buckets due for a kind of background work: see `lua/marks_take.lua`.
pub static MARKS_TAKE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/marks_take.lua")));

/// Sets when each bucket a pass took next needs a look: see `lua/marks_settle.lua`.
pub static MARKS_SETTLE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/marks_settle.lua")));

/// Loads every script into Redis's cache ahead of the first request.
pub async fn preload<C>(conn: &mut C) -> Result<(), RedisError>
where
    C: redis::aio::ConnectionLike + Send,
{
    GRAB.load(conn).await?;
    for script in [
        &*BOUGHT,
        &*GIVE_BACK,
        &*RELEASE,
        &*SWAP,
        &*LOAD_FRESH,
        &*RULES_SET,
        &*WAVES_RAISE,
        &*FORGET,
        &*ENDING_BEGIN,
        &*ENDING_DUE,
        &*ENDING_KEEP,
        &*CLAIM,
        &*FINISH,
        &*UNLOCK,
        &*BREAKER_AUTO,
        &*LEND,
        &*RECEIVE,
        &*UNLEND,
        &*MARKS_TAKE,
        &*MARKS_SETTLE,
    ] {
        redis_timed(script.prepare_invoke().load_async(conn)).await?;
    }
    Ok(())
}
