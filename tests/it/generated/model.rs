//! The reference model: what a generated history may do next. It knows the sale's shape and,
//! coarsely, where the history stands (which faults are on, paused, the breaker, whether a
//! draw was asked for), so that it generates steps that make sense there — a thaw only of a
//! frozen replica, presses crowding in while a replica is frozen — and so that a shrunk
//! history stays one the model allows. What each step may *answer* is judged by the
//! oracle (`oracle.rs`) against what the server was seen to hold, not predicted here: a
//! real server's timing decides which of two racing presses wins.

use std::cell::Cell;

use proptest::prelude::*;
use proptest_state_machine::ReferenceStateMachine;

/// Where the sale's Redis state lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stores {
    /// One private Redis with one replica (`WAIT` 0 or 1).
    OneRedis,
    /// The test binary's private Redis Cluster (3 masters, 3 replicas; `WAIT 1`).
    Cluster,
}

thread_local! {
    /// The stores the histories of this thread run on (set by the test before it runs).
    pub static STORES: Cell<Stores> = const { Cell::new(Stores::OneRedis) };
}

/// Buyers a history presses for: few, so that limits, duplicates and sell-outs happen.
pub const USERS: u8 = 6;

/// The sale a history starts with.
#[derive(Clone, Debug)]
pub struct Shape {
    pub total: u32,
    pub per_user: u8,
    pub buckets: u8,
    /// A wave: `units` held back until `at_s` seconds after the history begins.
    pub wave: Option<Wave>,
    /// A draw, drawn this many seconds after the history begins (one unit a buyer, no
    /// waves).
    pub draw_in_s: Option<u32>,
    pub pay_timeout_s: u32,
    /// `SECKILL_REDIS_WAIT_REPLICAS`.
    pub wait_replicas: u32,
    /// A waiting room in front of the sale (not with a draw): presses join it, and buy
    /// with a pass once let in.
    pub queue: bool,
}

#[derive(Clone, Copy, Debug)]
pub struct Wave {
    pub units: u32,
    pub at_s: u32,
}

/// The model's state: the shape, and where the history stands.
#[derive(Clone, Debug)]
pub struct Model {
    pub stores: Stores,
    pub shape: Shape,
    pub replica_frozen: bool,
    pub rabbit_cut: bool,
    pub paused: bool,
    pub circuit: u8,
    /// A `PUT` asked for a draw (whether the server took it is the oracle's business).
    pub draw_asked: bool,
}

/// A change an operator's `PUT /admin/items/1` makes to the record as it stands.
#[derive(Clone, Debug)]
pub enum Change {
    /// `total` moved by this many units.
    Total(i8),
    /// The sale ends this many seconds from now.
    EndsIn(u8),
    /// The sale ends in an hour again.
    EndsLater,
    /// The wave (one at `Shape::wave`'s time, or 45 s from now) holds this many units.
    Wave(u32),
    PerUser(u8),
    /// `"mode": "draw"`, drawn this many seconds from now.
    Draw(u8),
    /// First come, first served again.
    FirstCome,
    Buckets(u8),
}

/// One step of a history.
#[derive(Clone, Debug)]
pub enum Op {
    /// A press of `user` at API `api`: with an `Idempotency-Key` (`key`), and with a second
    /// press carrying the same key sent at the same moment (`pair`, to API `pair_api`).
    Press {
        user: u8,
        key: Option<u8>,
        pair: Option<u8>,
        api: u8,
    },
    /// The user cancels their newest live order.
    Cancel {
        user: u8,
    },
    /// The user's newest live order paid: the payment provider's signed event.
    Pay {
        user: u8,
    },
    /// The user's newest cancelled order paid after all (a late payment: revived while a
    /// unit can be taken for it, else owed back): the provider's signed event.
    LatePay {
        user: u8,
    },
    /// The user's newest paid order refunded whole: the provider's signed event (its unit
    /// goes back on sale).
    Refund {
        user: u8,
    },
    /// The user reads `my-order` and `my-orders`.
    Read {
        user: u8,
    },
    Put(Change),
    Pause,
    Resume,
    Warmup {
        force: bool,
    },
    Reconcile,
    /// The item's breaker at this level (0 closes it).
    Circuit(u8),
    /// An API process killed (SIGKILL) and started again.
    KillApi(u8),
    /// The worker (consumer and scheduler) killed and started again.
    KillWorker,
    /// The replica of the item's master frozen (SIGSTOP) / thawed.
    FreezeReplica,
    ThawReplica,
    /// The item's master killed; its replica takes over; it comes back as a replica.
    Failover,
    /// The line to RabbitMQ cut / restored.
    CutRabbit,
    RestoreRabbit,
    /// An API process started again with its host clock this many seconds off.
    ClockOff {
        api: u8,
        seconds: i8,
    },
    /// Time passes.
    Wait {
        ms: u16,
    },
    /// Everything drains; the stock is judged (a quiescent moment of the contract's §7).
    Quiesce,
}

impl Op {
    /// The steps that are faults, by [`Op::kind`].
    pub const FAULTS: [&'static str; 8] = [
        "KillApi",
        "KillWorker",
        "ClockOff",
        "FreezeReplica",
        "ThawReplica",
        "Failover",
        "CutRabbit",
        "RestoreRabbit",
    ];

    /// The step's kind (its variant's name), for a run's report.
    pub fn kind(&self) -> &'static str {
        match self {
            Op::Press { .. } => "Press",
            Op::Cancel { .. } => "Cancel",
            Op::Pay { .. } => "Pay",
            Op::LatePay { .. } => "LatePay",
            Op::Refund { .. } => "Refund",
            Op::Read { .. } => "Read",
            Op::Put(_) => "Put",
            Op::Pause => "Pause",
            Op::Resume => "Resume",
            Op::Warmup { .. } => "Warmup",
            Op::Reconcile => "Reconcile",
            Op::Circuit(_) => "Circuit",
            Op::KillApi(_) => "KillApi",
            Op::KillWorker => "KillWorker",
            Op::FreezeReplica => "FreezeReplica",
            Op::ThawReplica => "ThawReplica",
            Op::Failover => "Failover",
            Op::CutRabbit => "CutRabbit",
            Op::RestoreRabbit => "RestoreRabbit",
            Op::ClockOff { .. } => "ClockOff",
            Op::Wait { .. } => "Wait",
            Op::Quiesce => "Quiesce",
        }
    }
}

impl ReferenceStateMachine for Model {
    type State = Model;
    type Transition = Op;

    fn init_state() -> BoxedStrategy<Model> {
        let stores = STORES.with(Cell::get);
        let buckets = match stores {
            Stores::OneRedis => prop_oneof![3 => Just(1u8), 1 => Just(2u8)].boxed(),
            // On the cluster a split item's buckets sit on several masters.
            Stores::Cluster => prop_oneof![2 => Just(1u8), 1 => Just(3u8)].boxed(),
        };
        let wait = match stores {
            Stores::OneRedis => prop_oneof![1 => Just(0u32), 3 => Just(1u32)].boxed(),
            Stores::Cluster => Just(1u32).boxed(),
        };
        let wave = prop_oneof![
            2 => Just(None),
            // Still to come when the history ends, or opening during it.
            1 => (1u32..4, prop_oneof![Just(60u32), Just(6u32)])
                .prop_map(|(units, at_s)| Some(Wave { units, at_s })),
        ];
        // A draw is one shape among the others: a sale never turns into one once loaded.
        let draw = prop_oneof![5 => Just(None), 1 => (4u32..10).prop_map(Some)];
        (
            3u32..10,
            prop_oneof![3 => Just(1u8), 1 => Just(2u8)],
            buckets,
            wave,
            prop_oneof![3 => Just(1800u32), 1 => Just(3u32)],
            wait,
            draw,
            prop_oneof![3 => Just(false), 1 => Just(true)],
        )
            .prop_map(
                move |(
                    total,
                    per_user,
                    buckets,
                    wave,
                    pay_timeout_s,
                    wait_replicas,
                    draw,
                    queue,
                )| Model {
                    stores,
                    shape: Shape {
                        total,
                        per_user: if draw.is_some() { 1 } else { per_user },
                        buckets,
                        wave: if draw.is_some() { None } else { wave },
                        draw_in_s: draw,
                        pay_timeout_s,
                        wait_replicas,
                        queue: queue && draw.is_none(),
                    },
                    replica_frozen: false,
                    rabbit_cut: false,
                    paused: false,
                    circuit: 0,
                    draw_asked: draw.is_some(),
                },
            )
            .boxed()
    }

    fn transitions(state: &Model) -> BoxedStrategy<Op> {
        let user = 1..=USERS;
        let api = 0u8..2;
        let press = (
            user.clone(),
            prop_oneof![2 => Just(None), 3 => (1u8..3).prop_map(Some)],
            prop_oneof![3 => Just(None), 2 => api.clone().prop_map(Some)],
            api.clone(),
        )
            .prop_map(|(user, key, pair, api)| Op::Press {
                user,
                // A pair shares a key: it is a retried or doubled press.
                key: key.or(pair.map(|_| 1)),
                pair,
                api,
            });
        // While a replica is frozen, a crowd presses: that is when a win and its retry race
        // the replica's confirmation.
        let press_weight = if state.replica_frozen { 12 } else { 8 };
        let change = prop_oneof![
            (-3i8..=3).prop_map(Change::Total),
            (3u8..9).prop_map(Change::EndsIn),
            Just(Change::EndsLater),
            (1u32..8).prop_map(Change::Wave),
            (1u8..=3).prop_map(Change::PerUser),
            (3u8..6).prop_map(Change::Draw),
            Just(Change::FirstCome),
            (1u8..=3).prop_map(Change::Buckets),
        ];
        let mut steps: Vec<(u32, BoxedStrategy<Op>)> = vec![
            (press_weight, press.boxed()),
            (1, user.clone().prop_map(|user| Op::Cancel { user }).boxed()),
            (1, user.clone().prop_map(|user| Op::Pay { user }).boxed()),
            (
                1,
                user.clone().prop_map(|user| Op::LatePay { user }).boxed(),
            ),
            (1, user.clone().prop_map(|user| Op::Refund { user }).boxed()),
            (1, user.prop_map(|user| Op::Read { user }).boxed()),
            (2, change.prop_map(Op::Put).boxed()),
            (
                1,
                any::<bool>().prop_map(|force| Op::Warmup { force }).boxed(),
            ),
            (1, Just(Op::Reconcile).boxed()),
            (1, (0u8..=3).prop_map(Op::Circuit).boxed()),
            (1, api.clone().prop_map(Op::KillApi).boxed()),
            (1, Just(Op::KillWorker).boxed()),
            (
                1,
                (api, prop_oneof![Just(-3i8), Just(3i8)])
                    .prop_map(|(api, seconds)| Op::ClockOff { api, seconds })
                    .boxed(),
            ),
            (1, (200u16..2500).prop_map(|ms| Op::Wait { ms }).boxed()),
            (1, Just(Op::Quiesce).boxed()),
        ];
        steps.push(if state.paused {
            (2, Just(Op::Resume).boxed())
        } else {
            (1, Just(Op::Pause).boxed())
        });
        if state.shape.wait_replicas > 0 {
            steps.push(if state.replica_frozen {
                (3, Just(Op::ThawReplica).boxed())
            } else {
                (2, Just(Op::FreezeReplica).boxed())
            });
        }
        if state.stores == Stores::Cluster && !state.replica_frozen {
            steps.push((1, Just(Op::Failover).boxed()));
        }
        steps.push(if state.rabbit_cut {
            (3, Just(Op::RestoreRabbit).boxed())
        } else {
            (1, Just(Op::CutRabbit).boxed())
        });
        proptest::strategy::Union::new_weighted(steps).boxed()
    }

    /// Steps that only make sense in some states (kept true while a history shrinks).
    fn preconditions(state: &Model, op: &Op) -> bool {
        match op {
            Op::ThawReplica => state.replica_frozen,
            Op::FreezeReplica => !state.replica_frozen && state.shape.wait_replicas > 0,
            Op::Failover => state.stores == Stores::Cluster && !state.replica_frozen,
            Op::RestoreRabbit => state.rabbit_cut,
            Op::CutRabbit => !state.rabbit_cut,
            _ => true,
        }
    }

    fn apply(mut state: Model, op: &Op) -> Model {
        match op {
            Op::FreezeReplica => state.replica_frozen = true,
            Op::ThawReplica => state.replica_frozen = false,
            Op::CutRabbit => state.rabbit_cut = true,
            Op::RestoreRabbit => state.rabbit_cut = false,
            Op::Pause => state.paused = true,
            Op::Resume => state.paused = false,
            Op::Circuit(level) => state.circuit = *level,
            Op::Put(Change::Draw(_)) => state.draw_asked = true,
            Op::Put(Change::FirstCome) => state.draw_asked = false,
            _ => {}
        }
        state
    }
}
