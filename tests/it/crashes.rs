//! The fault suite: a real process dies with work in its hands — an API instance, a
//! consumer, a scheduler, RabbitMQ, MariaDB, Redis (with its append-only file, or its
//! data gone altogether) — and afterwards every `202` is exactly one row in MySQL, no row
//! is there that no answer explains, and the contract's invariants hold. Every fault is
//! made on a process the test started: `seckill serve` children and private servers on
//! spare ports, never the machine's shared services.
//!
//! `SOAK=1 cargo test crashes::soak -- --ignored` runs faults at random moments in a loop
//! for `SOAK_MINUTES` (default 10); docs/faults.md has its last result.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use seckill::Role;
use seckill::config::Secret;

use crate::history::*;
use crate::support::*;

/// An API process killed (SIGKILL) mid-burst while units still sell: its buyers press
/// again at the other instance; what it had won and not yet published is sent by the
/// relay from the Redis outbox (entered there by its publisher, or by the safety sweep).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_api_instance_killed_mid_burst_loses_nothing() {
    let env = TestEnv::new("crash_api").await;
    let workers = env.server(&[Role::Consumer, Role::Scheduler]).await;
    let (mut doomed, a, _lines_a, _reader_a) =
        serve(seckill(&env).args(["serve", "--roles", "api"]));
    let (survivor, b, _lines_b, reader_b) = serve(seckill(&env).args(["serve", "--roles", "api"]));
    const UNITS: u32 = 400;
    env.item(1, UNITS).on_sale(&b).await;

    let answered = AtomicU64::new(0);
    let killed = AtomicU64::new(0);
    let target = |user: u64, attempt: u32| {
        // Half the crowd starts on A; after A died, everyone presses at B.
        if user.is_multiple_of(2) && attempt == 0 && killed.load(Ordering::Relaxed) == 0 {
            a.addr
        } else {
            b.addr
        }
    };
    let (mut ledger, began) = tokio::join!(
        crowd(&env, 1, 1..1_501, &target, &answered),
        mid_burst(&answered, 250, async {
            kill_hard(&mut doomed);
            killed.store(1, Ordering::Relaxed);
        }),
    );
    // docs/faults.md (the measured figures): requests in flight break, pressing again sells
    // or names the order; a win its publisher had not entered waits for the safety sweep
    // (8 s) and the relay. Allowed here: the broken answers within 2 s of the kill, the
    // orders within 15 s, for a loaded 2-core machine.
    let liveness = Liveness {
        fault: "API instance killed",
        allowed: &["202 queued", "409 duplicate", "410 sold_out", "transport"],
        trouble_within: Duration::from_secs(2),
        drained_within: Duration::from_secs(15),
    };
    after_fault(&env, &b, UNITS, &amqp_url(), began, &mut ledger, &liveness).await;
    stop_process(survivor, reader_b);
    workers.stop().await;
}

/// A consumer killed mid-batch while draining thousands of orders (some committed, not
/// all acked): the next consumer gets the redeliveries, and each order is one row.
/// Wins whose API process died right after its grab, before its publisher delivered them
/// (played by this test calling the server's own `grab.lua`): they are in `pending` alone,
/// and the scheduler's safety sweep enters them for the relay. Each reaches MySQL once,
/// within seconds, and its buyer holds it (`409` naming it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wins_no_publisher_took_are_found_and_sent_within_seconds() {
    use seckill::domain::{BucketId, ItemId, OrderPlaced, OrderSn, UserId};
    let env = TestEnv::new("unsent").await;
    let server = env.server(ALL_ROLES).await;
    env.item(1, 10).on_sale(&server).await;
    let item = ItemId::new(1).unwrap();
    let mut won = Vec::new();
    let grabbed = Instant::now();
    for user in 1..=5 {
        let now = chrono::Utc::now().timestamp_millis();
        let order = OrderPlaced {
            order_sn: OrderSn::generate(BucketId::whole(item), false),
            item_id: item,
            user_id: UserId::new(user),
            created_at_ms: now,
            pay_deadline_ms: now + 1_800_000,
            slot: 0,
        };
        let outcome = seckill::testing::grab(
            &mut env.redis.clone(),
            &env.item_keys(1),
            (order.user_id, 1),
            &order.order_sn,
            &serde_json::to_string(&order).unwrap(),
            None,
            false,
        )
        .await
        .unwrap()
        .0;
        assert_eq!(outcome.as_str(), "won");
        won.push(order.order_sn.to_string());
    }
    env.wait_for_orders(&server, 1, 5, Duration::from_secs(30))
        .await;
    eprintln!(
        "wins no publisher took: in MySQL {:?} after the grab",
        grabbed.elapsed()
    );
    // User 3 won the third.
    let (status, json) = env.buy(&server, 3, 1).await;
    assert_eq!(
        (status, json["order_sn"].as_str()),
        (409, Some(won[2].as_str())),
        "{json}"
    );
    let mut in_mysql: Vec<String> = env.orders(1).await.into_iter().map(|o| o.0).collect();
    in_mysql.sort();
    won.sort();
    assert_eq!(in_mysql, won);
    env.assert_invariants(&server, 1, 10, &won).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_consumer_killed_mid_batch_leaves_every_order_exactly_once() {
    let env = TestEnv::new("crash_consumer").await;
    let api = env.server(&[Role::Api, Role::Scheduler]).await;
    const UNITS: u32 = 4_000;
    env.item(1, UNITS).on_sale(&api).await;
    let answered = AtomicU64::new(0);
    let at = |_: u64, _: u32| api.addr;
    let mut ledger = crowd(&env, 1, 1..4_001, &at, &answered).await;
    assert_eq!(ledger.won.len(), UNITS as usize, "{:?}", ledger.answers);
    // Every order confirmed by RabbitMQ, none written: thousands wait in the queue.
    eventually(Duration::from_secs(20), "every order queued", || async {
        match env.confirmed(1).await {
            confirmed if confirmed == u64::from(UNITS) => Ok(()),
            confirmed => Err(format!(
                "{} confirmed {confirmed}",
                env.stats(&api, 1).await
            )),
        }
    })
    .await;

    // Its MySQL slowed (80 ms an answer) so the drain takes ten seconds or more: with 20 ms
    // a loaded CI machine once let it finish all 4,000 between two looks at the count.
    let slow_mysql = TcpProxy::start(mysql_addr()).await;
    slow_mysql.set_delay(Duration::from_millis(80));
    let (mut first, _server, _lines, _reader) =
        serve(seckill(&env).args(["serve", "--roles", "consumer"]).env(
            "SECKILL_DATABASE_URL",
            env.database_url_via(slow_mysql.addr).expose(),
        ));
    // Killed at its first commit: each worker's first batch is the message or two that
    // had arrived when it looked, its second everything else it was sent (up to 1.5 MB
    // of messages), which takes several slowed answers more. Waiting for hundreds
    // written instead once saw both second batches commit between looks.
    let watching = Instant::now();
    while env.order_count(1).await == 0 {
        assert!(
            watching.elapsed() < Duration::from_secs(30),
            "after 30 s the consumer had written nothing"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let began = Instant::now();
    kill_hard(&mut first);
    let written = env.order_count(1).await;
    eprintln!("consumer killed with {written} of {UNITS} orders written");
    assert!(
        written < u64::from(UNITS),
        "the consumer finished before it was killed ({written})"
    );

    let (second, _server, _lines, reader) =
        serve(seckill(&env).args(["serve", "--roles", "consumer"]));
    // docs/faults.md (the measured figures): buyers notice nothing (the crowd was answered
    // before the kill). Allowed: every order in MySQL within 10 s of the second consumer's
    // start, for 4,000 redeliveries on a loaded 2-core machine.
    let liveness = Liveness::unnoticed("consumer killed, another started", Duration::from_secs(10));
    after_fault(
        &env,
        &api,
        UNITS,
        &amqp_url(),
        began,
        &mut ledger,
        &liveness,
    )
    .await;
    stop_process(second, reader);
    api.stop().await;
}

/// A scheduler killed in the middle of a pass over a thousand due deadlines (its MySQL
/// slowed so the pass takes seconds): another scheduler finishes after the lease, and
/// every unit comes back exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_scheduler_killed_mid_pass_returns_every_unit_exactly_once() {
    let env = TestEnv::new("crash_scheduler").await;
    let api = env.server(&[Role::Api, Role::Consumer]).await;
    const UNITS: u32 = 1_000;
    env.item(1, UNITS).paying_within(1).on_sale(&api).await;
    let answered = AtomicU64::new(0);
    let at = |_: u64, _: u32| api.addr;
    let mut ledger = crowd(&env, 1, 1..1_001, &at, &answered).await;
    assert_eq!(ledger.won.len(), UNITS as usize);
    quiet(&env, &api, 1, &amqp_url(), Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;

    let slow_mysql = TcpProxy::start(mysql_addr()).await;
    slow_mysql.set_delay(Duration::from_millis(150));
    let (mut first, _server, _lines, _reader) = serve(
        seckill(&env)
            .args(["serve", "--roles", "scheduler"])
            .env(
                "SECKILL_DATABASE_URL",
                env.database_url_via(slow_mysql.addr).expose(),
            )
            .env("SECKILL_SCHEDULER_LEASE_MS", "3000")
            .env("SECKILL_SCHEDULER_POLL_MS", "100"),
    );
    let cancelled = || async {
        env.orders(1)
            .await
            .iter()
            .filter(|(_, _, status)| status == "cancelled")
            .count()
    };
    eventually(Duration::from_secs(30), "the first cancels", || async {
        let n = cancelled().await;
        if n > 0 { Ok(()) } else { Err(format!("{n}")) }
    })
    .await;
    let began = Instant::now();
    kill_hard(&mut first);
    let when_killed = cancelled().await;
    assert!(
        when_killed < UNITS as usize,
        "the pass ended before the kill"
    );

    let (second, _server, _lines, reader) = serve(
        seckill(&env)
            .args(["serve", "--roles", "scheduler"])
            .env("SECKILL_SCHEDULER_POLL_MS", "100"),
    );
    // docs/faults.md (the measured figures): every unit back after the lease (3 s here).
    // Allowed: the lease and 5 s, for a loaded 2-core machine (the wait for it below gives
    // up at 30 s).
    let liveness = Liveness::unnoticed(
        "scheduler killed mid-pass (lease 3 s)",
        Duration::from_secs(8),
    );
    eventually(
        Duration::from_secs(30),
        "every deadline met, every unit back",
        || async {
            let n = cancelled().await;
            let remaining = env.remaining(1).await;
            if n == UNITS as usize && remaining == u64::from(UNITS) {
                Ok(())
            } else {
                Err(format!("{n} cancelled, {remaining} on sale"))
            }
        },
    )
    .await;
    // Each unit came back once: no more on sale than the total, Redis's count at zero.
    let stats = env.stats(&api, 1).await;
    assert_eq!(
        (stats["remaining"].as_u64(), stats["sold"].as_u64()),
        (Some(1_000), Some(0)),
        "{stats}"
    );
    // No scheduler from here on: the top-up crowd's orders would time out within a second
    // of their win, and the stock moving under the checks.
    stop_process(second, reader);
    after_fault(
        &env,
        &api,
        UNITS,
        &amqp_url(),
        began,
        &mut ledger,
        &liveness,
    )
    .await;
    api.stop().await;
}

/// RabbitMQ (a private node) killed and started again mid-burst: purchases go on (orders
/// wait in the Redis outbox), the relay sends them once it is back, and persistent
/// messages in its queue survive the crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rabbitmq_restarted_mid_burst_loses_nothing() {
    let env = TestEnv::new("crash_rabbit").await;
    let mut rabbit = PrivateRabbit::start().await;
    let amqp = rabbit.url();
    let server = env
        .server_with(ALL_ROLES, |s| s.amqp_url = Secret::new(&amqp))
        .await;
    // How long the broker took to boot: not the server's to shorten.
    let mut boot = Duration::ZERO;
    let fault = async {
        rabbit.kill();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let restarted = Instant::now();
        rabbit.restart().await;
        boot = restarted.elapsed();
    };
    env.item(1, BURST_UNITS).on_sale(&server).await;
    let answered = AtomicU64::new(0);
    let at = |_: u64, _: u32| server.addr;
    let (mut ledger, began) = tokio::join!(
        crowd(&env, 1, 1..1_501, &at, &answered),
        mid_burst(&answered, 200, fault),
    );
    // docs/faults.md (the measured figures): nothing for buyers, every unit sold during it;
    // the broker's boot takes ~4 s of the way back (allowed: the boot, then 11 s; a bound
    // fixed from the kill failed with the whole suite on two cores, the boot being the
    // broker's and not the server's to shorten).
    let liveness = Liveness::unnoticed("RabbitMQ restarted", boot + Duration::from_secs(11));
    eprintln!("RabbitMQ booted again in {boot:?}");
    after_fault(
        &env,
        &server,
        BURST_UNITS,
        &amqp,
        began,
        &mut ledger,
        &liveness,
    )
    .await;
    assert_eq!(
        (ledger.won.len(), ledger.topped_up),
        (BURST_UNITS as usize, 0),
        "every unit sold during the fault's burst, none left for the top-up: {:?}",
        ledger.answers
    );
    server.stop().await;
}

/// MariaDB (a private server) killed while the consumer drains, and started again: sales
/// go on, the consumer waits and catches up, InnoDB keeps what was committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_killed_mid_drain_loses_nothing() {
    let mut mariadb = PrivateMariaDb::start().await;
    let env = TestEnv::on_mysql("crash_mariadb", &mariadb.url()).await;
    let server = env.server(ALL_ROLES).await;
    const UNITS: u32 = 3_000;
    env.item(1, UNITS).on_sale(&server).await;
    let answered = AtomicU64::new(0);
    let at = |_: u64, _: u32| server.addr;
    let (mut ledger, began) = tokio::join!(crowd(&env, 1, 1..3_001, &at, &answered), async {
        // Mid-drain: once some orders are written and more keep coming.
        eventually(Duration::from_secs(30), "a drain under way", || async {
            let written = env.orders(1).await.len();
            if written >= 300 {
                Ok(())
            } else {
                Err(format!("{written}"))
            }
        })
        .await;
        let began = Instant::now();
        mariadb.kill();
        tokio::time::sleep(Duration::from_secs(2)).await;
        mariadb.restart().await;
        began
    });
    // docs/faults.md (the measured figures): purchases go on (allowed: every order in MySQL
    // within 12 s, the restart and the consumer's growing pauses on a loaded 2-core machine).
    let liveness = Liveness::unnoticed("MariaDB killed for 2 s", Duration::from_secs(12));
    after_fault(
        &env,
        &server,
        UNITS,
        &amqp_url(),
        began,
        &mut ledger,
        &liveness,
    )
    .await;
    server.stop().await;
}

/// Redis (a private one, with its append-only file) killed and started again mid-burst:
/// purchases answer `503` while it is down, nothing it acknowledged is lost, and the
/// recovery procedure run afterwards (pause, warm-up, resume) changes nothing.
async fn redis_restarted_mid_burst(appendfsync: &str) {
    let env = TestEnv::new(&format!("crash_redis_{appendfsync}")).await;
    let mut redis = PrivateRedis::start_persistent(appendfsync).await;
    let url = redis.url();
    let server = env
        .server_with(ALL_ROLES, |s| s.redis_url = Secret::new(&url))
        .await;
    let fault = async {
        redis.kill();
        tokio::time::sleep(Duration::from_millis(500)).await;
        redis.restart().await;
    };
    // docs/faults.md (the measured figures): purchases answer `503 unavailable` for up to a
    // second, pressing again sells or names the order; a win whose answer the kill cut off
    // waits for the safety sweep, which enters it 8 s after the win. Allowed: the last
    // `503` within 3 s of the kill (Redis is down 0.5 s, then starts and loads its file),
    // the orders within 15 s — for a loaded 2-core machine.
    let name = format!("Redis killed, appendfsync {appendfsync}");
    let liveness = Liveness {
        fault: &name,
        allowed: &[
            "202 queued",
            "409 duplicate",
            "410 sold_out",
            "503 unavailable",
        ],
        trouble_within: Duration::from_secs(3),
        drained_within: Duration::from_secs(15),
    };
    let ledger = fault_mid_burst(&env, &server, &amqp_url(), fault, &liveness).await;

    // The procedure in docs/operations.md after a Redis restart: harmless when nothing was lost.
    let before = env.stats(&server, 1).await;
    assert_eq!(env.admin_post(&server, "/admin/items/1/pause").await.0, 200);
    let (status, report) = env
        .admin_post(&server, "/admin/items/1/warmup?force=true")
        .await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(
        report["rebuilt"], true,
        "Redis restarted since the load: {report}"
    );
    assert_eq!(
        report["remaining"], before["remaining"],
        "{report} {before}"
    );
    assert_eq!(
        env.admin_post(&server, "/admin/items/1/resume").await.0,
        200
    );
    total_check(&env, &server, 1, BURST_UNITS, &ledger).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_mid_burst_with_appendfsync_everysec_loses_nothing() {
    redis_restarted_mid_burst("everysec").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_mid_burst_with_appendfsync_always_loses_nothing() {
    redis_restarted_mid_burst("always").await;
}

/// Redis loses everything mid-sale (a flush): purchases answer `503`, then the
/// recovery procedure — pause, warm-up (a rebuild that waits for the orders in flight),
/// resume — and the sale goes on to the last unit without selling one twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_flushed_mid_sale_is_recovered_by_the_procedure() {
    let env = TestEnv::new("crash_flush").await;
    let redis = PrivateRedis::start().await;
    let url = redis.url();
    let server = env
        .server_with(ALL_ROLES, |s| s.redis_url = Secret::new(&url))
        .await;
    // More units than the first crowd has buyers, so the sale is still on whenever the
    // flush lands (with 500 units it landed after the last had sold, on a loaded machine).
    const UNITS: u32 = 1_000;
    env.item(1, UNITS).on_sale(&server).await;
    let answered = AtomicU64::new(0);
    let at = |_: u64, _: u32| server.addr;
    let (mut ledger, began) = tokio::join!(
        crowd(&env, 1, 1..801, &at, &answered),
        mid_burst(&answered, 100, async {
            redis.cmd(&["FLUSHALL"]).await;
        }),
    );
    let sold_before = ledger.won.len();
    assert!(sold_before < UNITS as usize, "sold out before the loss");

    // The procedure (docs/operations.md, "Recovering a Redis that lost data").
    assert_eq!(env.admin_post(&server, "/admin/items/1/pause").await.0, 200);
    let (status, report) = env.admin_post(&server, "/admin/items/1/warmup").await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["rebuilt"], true, "{report}");
    assert_eq!(
        env.admin_post(&server, "/admin/items/1/resume").await.0,
        200
    );
    let resumed = began.elapsed();

    // Everyone who pressed before presses again, and newcomers: the rest sells.
    let more = crowd(&env, 1, 1..2_001, &at, &answered).await;
    ledger.merge(more);
    // docs/faults.md: `503 unavailable` until the procedure has run, none after it; every
    // order in MySQL within seconds of the resume (allowed: 15 s after it, the crowd of
    // 2,000 pressing included, on a loaded 2-core machine).
    let liveness = Liveness {
        fault: "Redis flushed, then the recovery procedure",
        allowed: &[
            "202 queued",
            "409 duplicate",
            "410 sold_out",
            "503 unavailable",
        ],
        trouble_within: resumed,
        drained_within: resumed + Duration::from_secs(15),
    };
    after_fault(
        &env,
        &server,
        UNITS,
        &amqp_url(),
        began,
        &mut ledger,
        &liveness,
    )
    .await;
    server.stop().await;
}

/// The faults a soak round picks from.
#[derive(Clone, Copy, Debug)]
enum Fault {
    KillApi,
    KillConsumer,
    KillScheduler,
    RestartRabbit,
    RestartMariaDb,
    RestartRedis,
}

const FAULTS: [Fault; 6] = [
    Fault::KillApi,
    Fault::KillConsumer,
    Fault::KillScheduler,
    Fault::RestartRabbit,
    Fault::RestartMariaDb,
    Fault::RestartRedis,
];

/// A `seckill serve` child of the soak, with the command that starts it again.
struct Proc {
    roles: &'static str,
    child: std::process::Child,
    server: TestServer,
}

fn start(env: &TestEnv, roles: &'static str, vars: &[(&str, String)]) -> Proc {
    let mut command = seckill(env);
    command
        .args(["serve", "--roles", roles])
        .envs(vars.iter().cloned());
    let (child, server, _lines, _reader) = serve(&mut command);
    Proc {
        roles,
        child,
        server,
    }
}

/// Faults at random moments, in a loop, for `SOAK_MINUTES` (default 10): each round a new
/// item of 300 units, a crowd of 1,000, one fault on a real process at a random point of
/// the burst; then the answers the fault matrix allows, a top-up crowd selling what is
/// left, and the total check. By hand (see docs/faults.md):
/// `SOAK=1 cargo test crashes::soak -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a soak of minutes, run by hand: SOAK=1 cargo test crashes::soak -- --ignored"]
async fn soak() {
    // Asked for by `--ignored` without its switch: a failure, not a pass that did nothing.
    assert_eq!(
        std::env::var("SOAK").as_deref(),
        Ok("1"),
        "the soak runs with SOAK=1"
    );
    let minutes: u64 = std::env::var("SOAK_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(10);
    let mut redis = PrivateRedis::start_persistent("always").await;
    let mut rabbit = PrivateRabbit::start().await;
    let mut mariadb = PrivateMariaDb::start().await;
    let env = TestEnv::on_mysql("soak", &mariadb.url()).await;
    let vars = vec![
        ("SECKILL_REDIS_URL", redis.url()),
        ("SECKILL_AMQP_URL", rabbit.url()),
        ("SECKILL_SCHEDULER_POLL_MS", "200".to_owned()),
    ];
    let mut api = [start(&env, "api", &vars), start(&env, "api", &vars)];
    let mut consumer = start(&env, "consumer", &vars);
    let mut scheduler = start(&env, "scheduler", &vars);

    let until = Instant::now() + Duration::from_secs(minutes * 60);
    let mut tally: BTreeMap<String, u64> = BTreeMap::new();
    let mut round = 0u64;
    while Instant::now() < until {
        round += 1;
        let item = round;
        let dice = ulid::Ulid::new().random() as u64;
        let fault = FAULTS[(dice % FAULTS.len() as u64) as usize];
        let after = (dice >> 8) % 600;
        const UNITS: u32 = 300;
        env.item(item, UNITS).on_sale(&api[1].server).await;
        let answered = AtomicU64::new(0);
        let targets: std::sync::Mutex<[SocketAddr; 2]> =
            std::sync::Mutex::new([api[0].server.addr, api[1].server.addr]);
        let target = |user: u64, attempt: u32| {
            targets.lock().unwrap()[((user + u64::from(attempt)) % 2) as usize]
        };
        let started = Instant::now();
        let (mut ledger, ()) =
            tokio::join!(crowd(&env, item, 1..1_001, &target, &answered), async {
                let deadline = Instant::now() + Duration::from_secs(30);
                while answered.load(Ordering::Relaxed) < after && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                match fault {
                    Fault::KillApi => {
                        kill_hard(&mut api[0].child);
                        api[0] = start(&env, api[0].roles, &vars);
                        targets.lock().unwrap()[0] = api[0].server.addr;
                    }
                    Fault::KillConsumer => {
                        kill_hard(&mut consumer.child);
                        consumer = start(&env, consumer.roles, &vars);
                    }
                    Fault::KillScheduler => {
                        kill_hard(&mut scheduler.child);
                        scheduler = start(&env, scheduler.roles, &vars);
                    }
                    Fault::RestartRabbit => {
                        rabbit.kill();
                        rabbit.restart().await;
                    }
                    Fault::RestartMariaDb => {
                        mariadb.kill();
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        mariadb.restart().await;
                    }
                    Fault::RestartRedis => {
                        redis.kill();
                        redis.restart().await;
                    }
                }
            },);
        let survivor = &api[1].server;
        ask_uncertain(&env, survivor, item, &mut ledger).await;
        quiet(&env, survivor, item, &rabbit.url(), Duration::from_secs(60)).await;
        // What the fault matrix allows for any of the faults, then the rest sells.
        assert_answers(
            &format!("soak round {round}, {fault:?}"),
            &[
                "202 queued",
                "409 duplicate",
                "410 sold_out",
                "503 unavailable",
                "transport",
            ],
            &ledger,
        );
        sells_out(&env, survivor, item, UNITS, &rabbit.url(), &mut ledger).await;
        total_check(&env, survivor, item, UNITS, &ledger).await;
        *tally.entry(format!("{fault:?}")).or_default() += 1;
        eprintln!(
            "soak round {round}: {fault:?} after {after} answers, {} won, checked in {:?}",
            ledger.won.len(),
            started.elapsed()
        );
    }
    eprintln!("soak: {round} rounds in {minutes} min, every check passed: {tally:?}");
    for proc in [consumer, scheduler].into_iter().chain(api) {
        let mut child = proc.child;
        kill_hard(&mut child);
    }
}
