//! Settings: every `SECKILL_*` variable of the contract, with its default, parsed and
//! validated once at start. Each one is also a command-line flag (`seckill serve --help`
//! lists them all), which is how tests give every server its own namespace and database
//! without touching the process environment.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use clap::{Args, ValueEnum};
use ipnet::IpNet;

/// The default JWT secret: fine on a laptop, announced loudly in the log anywhere else.
pub const DEV_JWT_SECRET: &str = "seckill-dev-secret-change-me";

#[derive(Args, Clone, Debug)]
pub struct Settings {
    /// Listen address of the HTTP API (port 0 = any free port).
    #[arg(long, env = "SECKILL_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    pub http_addr: SocketAddr,

    /// A separate listen address for `/admin` and `/metrics`; unset = the main listener.
    #[arg(long, env = "SECKILL_ADMIN_ADDR")]
    pub admin_addr: Option<SocketAddr>,

    /// Redis URL; several, comma-separated, are the seed nodes of a Redis Cluster.
    #[arg(
        long,
        env = "SECKILL_REDIS_URL",
        default_value = "redis://127.0.0.1:6379"
    )]
    pub redis_url: Secret,

    /// Replicas that must hold a won unit (Redis `WAIT`) before it is answered `202` and
    /// its order published; when they do not in time, `503 unavailable`. 0 = do not wait.
    #[arg(long, env = "SECKILL_REDIS_WAIT_REPLICAS", default_value_t = 0)]
    pub redis_wait_replicas: u32,

    /// What a purchase meets while its Redis master has fewer replicas in step than
    /// `SECKILL_REDIS_WAIT_REPLICAS`: `refuse` (503, no unit taken) or `degrade` (sold
    /// without the replicas, logged and counted).
    #[arg(long, env = "SECKILL_REDIS_WAIT_POLICY", value_enum, default_value_t = WaitPolicy::Refuse)]
    pub redis_wait_policy: WaitPolicy,

    /// MySQL/MariaDB URL; the database is created if missing.
    #[arg(
        long,
        env = "SECKILL_DATABASE_URL",
        default_value = "mysql://root@127.0.0.1:3306/seckill"
    )]
    pub database_url: Secret,

    /// RabbitMQ URL; several, comma-separated, are nodes of one cluster, tried in turn.
    #[arg(
        long,
        env = "SECKILL_AMQP_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    pub amqp_url: Secret,

    /// The kind of queue orders and their dead letters wait in: `classic`, or `quorum`
    /// (replicated over a RabbitMQ cluster's nodes).
    #[arg(long, env = "SECKILL_QUEUE_TYPE", value_enum, default_value_t = QueueType::Classic)]
    pub queue_type: QueueType,

    /// Prefix of every Redis key and every RabbitMQ exchange and queue.
    #[arg(long, env = "SECKILL_NAMESPACE", default_value = "seckill", value_parser = parse_namespace)]
    pub namespace: String,

    /// HS256 secret for user tokens.
    #[arg(long, env = "SECKILL_JWT_SECRET", default_value = DEV_JWT_SECRET, hide_default_value = true)]
    pub jwt_secret: Secret,

    /// Bearer token for `/admin/*`; unset = the admin API answers 401.
    #[arg(long, env = "SECKILL_ADMIN_TOKEN")]
    pub admin_token: Option<Secret>,

    /// Tolerated difference between `X-Client-Time` and server time, in milliseconds.
    #[arg(long, env = "SECKILL_CLOCK_SKEW_MS", default_value_t = 5000)]
    pub clock_skew_ms: u64,

    /// Purchase attempts per second per user (bursts of twice that); 0 = off.
    #[arg(long, env = "SECKILL_RATE_PER_USER", default_value_t = 5)]
    pub rate_per_user: u32,

    /// Purchase attempts per second per client IP; 0 = off.
    #[arg(long, env = "SECKILL_RATE_PER_IP", default_value_t = 0)]
    pub rate_per_ip: u32,

    /// Reads without a token (`GET /api/items/{id}`, `GET /api/shops/{id}/status`) per
    /// second per client IP (bursts of twice that); 0 = off.
    #[arg(long, env = "SECKILL_READ_RATE_PER_IP", default_value_t = 100)]
    pub read_rate_per_ip: u32,

    /// Proxies whose `X-Forwarded-For` is believed, as comma-separated CIDRs.
    #[arg(
        long,
        env = "SECKILL_TRUSTED_PROXIES",
        default_value = "127.0.0.1/32,::1/128",
        value_delimiter = ','
    )]
    pub trusted_proxies: Vec<IpNet>,

    /// How long an ended, reconciled sale's state stays in Redis before it is retired
    /// (MySQL then answers for it alone), in seconds; 0 = at once after reconciliation.
    #[arg(long, env = "SECKILL_SALE_RETENTION_S", default_value_t = 86_400)]
    pub sale_retention_s: u64,

    /// How often a scheduler looks for due deadlines and reminders when nothing wakes it
    /// earlier, in milliseconds.
    #[arg(long, env = "SECKILL_SCHEDULER_POLL_MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pub scheduler_poll_ms: u64,

    /// How long a scheduler holds the delay-queue entries it took before another may take
    /// them (a scheduler that dies mid-work delays them by at most this), in milliseconds.
    #[arg(long, env = "SECKILL_SCHEDULER_LEASE_MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pub scheduler_lease_ms: u64,

    /// Reminder stages, as percentages of the pay timeout elapsed (comma-separated, 1 to
    /// 99), each publishing one `order.remind` event per unpaid order; `off` = none.
    #[arg(long, env = "SECKILL_REMIND_AT_PERCENT", default_value = "50")]
    pub remind_at_percent: RemindStages,

    /// Wake schedulers early with Redis keyspace notifications (turned on in Redis where
    /// the server allows `CONFIG SET`); the delay queue is polled either way.
    #[arg(long, env = "SECKILL_KEYSPACE_EVENTS", default_value_t = true, action = clap::ArgAction::Set)]
    pub keyspace_events: bool,

    /// How often the compensation scan looks in MySQL for unpaid orders past their
    /// deadline that the delay queue lost, in seconds.
    #[arg(long, env = "SECKILL_COMPENSATE_EVERY_S", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub compensate_every_s: u64,

    /// Purchases handled at once per instance; beyond that a purchase is answered `503
    /// unavailable` at once instead of queueing.
    #[arg(long, env = "SECKILL_MAX_INFLIGHT", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_inflight: u32,

    /// Purchases a second admitted per breaker scope and instance at level 1 (throttle).
    #[arg(long, env = "SECKILL_BREAKER_THROTTLE_RPS", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub breaker_throttle_rps: u32,

    /// Whether this instance's own breaker trips by itself on the signals below (it holds
    /// back this instance's purchases only).
    #[arg(long, env = "SECKILL_BREAKER_AUTO", default_value_t = true, action = clap::ArgAction::Set)]
    pub breaker_auto: bool,

    /// The sliding window the signals are measured over, in seconds.
    #[arg(long, env = "SECKILL_BREAKER_WINDOW_S", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub breaker_window_s: u64,

    /// Purchases the window must hold before their latency or errors can trip it.
    #[arg(long, env = "SECKILL_BREAKER_MIN_REQUESTS", default_value_t = 20)]
    pub breaker_min_requests: u64,

    /// A Redis step slower than this, in milliseconds, counts as slow.
    #[arg(long, env = "SECKILL_BREAKER_SLOW_MS", default_value_t = 250)]
    pub breaker_slow_ms: u64,

    /// Share of slow or failed purchases in the window that trips the breaker (0 to 1).
    #[arg(long, env = "SECKILL_BREAKER_TRIP_RATIO", default_value_t = 0.5)]
    pub breaker_trip_ratio: f64,

    /// Batches RabbitMQ did not confirm, or confirmed slower than the slow threshold, on a
    /// live connection, in the window that trip it (no connection at all does not count:
    /// orders then wait in the outbox and sales go on).
    #[arg(long, env = "SECKILL_BREAKER_PUBLISH_FAILURES", default_value_t = 5)]
    pub breaker_publish_failures: u64,

    /// How long a tripped breaker stays open before it lets probes through (half-open),
    /// in seconds; doubled after each failed probe, up to a minute.
    #[arg(long, env = "SECKILL_BREAKER_OPEN_S", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=60))]
    pub breaker_open_s: u64,

    /// Good probes in a row that close a half-open breaker.
    #[arg(long, env = "SECKILL_BREAKER_PROBES", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub breaker_probes: u64,

    /// How often the scheduler compares every shop's status in Redis (and its own cache)
    /// with MySQL and repairs what differs, in seconds.
    #[arg(long, env = "SECKILL_SHOP_REPAIR_EVERY_S", default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..))]
    pub shop_repair_every_s: u64,

    /// Who may say an order is paid: `events` (only a payment event signed with
    /// `SECKILL_PAYMENT_SECRET`) or `trust_buyer` (the buyer's own `pay`, for development:
    /// refused at start with a real `SECKILL_JWT_SECRET`).
    #[arg(long, env = "SECKILL_PAYMENTS", value_enum, default_value_t = Payments::Events)]
    pub payments: Payments,

    /// Secrets payment events are signed with (HMAC-SHA256), comma-separated: every one is
    /// accepted, so a new one can be added before the old one goes. Unset = every event is
    /// refused (`401`).
    #[arg(long, env = "SECKILL_PAYMENT_SECRET", value_delimiter = ',')]
    pub payment_secret: Vec<Secret>,

    /// What a payment for an order already cancelled by its deadline does: `honour` (paid,
    /// if a unit can be taken for it now, else `refund_due`) or `refund` (`refund_due`).
    #[arg(long, env = "SECKILL_LATE_PAYMENT", value_enum, default_value_t = LatePayment::Honour)]
    pub late_payment: LatePayment,

    /// The currency prices are in (ISO 4217): payment events in another are refused.
    #[arg(long, env = "SECKILL_CURRENCY", default_value = "CNY", value_parser = parse_currency)]
    pub currency: String,
}

impl Settings {
    /// The settings as the environment gives them, without any flag: the base that tests
    /// adjust field by field.
    pub fn from_env() -> Result<Self, clap::Error> {
        #[derive(clap::Parser)]
        struct Only {
            #[command(flatten)]
            settings: Settings,
        }
        <Only as clap::Parser>::try_parse_from(["seckill"]).map(|o| o.settings)
    }

    pub fn is_trusted_proxy(&self, ip: IpAddr) -> bool {
        self.trusted_proxies.iter().any(|net| net.contains(&ip))
    }
}

/// The kind of RabbitMQ queue the orders wait in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum QueueType {
    /// A queue on one node (its messages persisted there).
    Classic,
    /// A Raft-replicated queue: it survives the loss of a minority of a cluster's nodes.
    Quorum,
}

/// What a purchase meets while its Redis master has fewer replicas in step than
/// `SECKILL_REDIS_WAIT_REPLICAS` asks for (docs/architecture.md: "A master short of replicas").
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WaitPolicy {
    /// The operator asked for replicas: no unit is taken there until they are back
    /// (`503 unavailable`).
    Refuse,
    /// Sell on without them, as a single Redis would: every unit sold so is logged and
    /// counted (`seckill_redis_wait_total{outcome="degraded"}`).
    Degrade,
}

/// Who may say an order is paid (docs/contract.md, "Payments").
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Payments {
    /// A payment event signed by the party that took the money.
    Events,
    /// The buyer's own `POST /api/orders/{sn}/pay` (development only).
    TrustBuyer,
}

/// What a payment for an order already cancelled by its deadline does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LatePayment {
    /// Revived as paid if a unit can be taken for it now (as a purchase would), else
    /// `refund_due`.
    Honour,
    /// Always `refund_due`.
    Refund,
}

/// Which parts of the server this process runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, ValueEnum)]
pub enum Role {
    /// The HTTP API: purchases, reads, operators.
    Api,
    /// Takes orders off RabbitMQ and writes them to MySQL.
    Consumer,
    /// Background work: the outbox relay, pay deadlines and reminders, the compensation
    /// scan and end-of-sale reconciliation.
    Scheduler,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Api, Role::Consumer, Role::Scheduler];
}

fn parse_currency(s: &str) -> Result<String, String> {
    if s.len() == 3 && s.bytes().all(|b| b.is_ascii_uppercase()) {
        Ok(s.to_owned())
    } else {
        Err("a currency is three capital letters (ISO 4217), such as CNY or EUR".into())
    }
}

fn parse_namespace(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(s.to_owned())
    } else {
        Err("a namespace is 1 to 64 characters of A-Z, a-z, 0-9, '_' and '-'".into())
    }
}

/// Reminder stages: percentages of an order's pay timeout, ascending, without repeats.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RemindStages(Vec<u8>);

impl RemindStages {
    pub fn new(mut percents: Vec<u8>) -> Self {
        percents.sort_unstable();
        percents.dedup();
        Self(percents)
    }

    pub fn percents(&self) -> &[u8] {
        &self.0
    }
}

impl FromStr for RemindStages {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() || s.eq_ignore_ascii_case("off") {
            return Ok(Self::default());
        }
        s.split(',')
            .map(|part| match part.trim().parse::<u8>() {
                Ok(p) if (1..=99).contains(&p) => Ok(p),
                _ => Err(format!(
                    "{part:?} is not a percentage from 1 to 99 (write `off` for no reminders)"
                )),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Self::new)
    }
}

/// A value that must never reach a log line: URLs with passwords, secrets, tokens.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(…)")
    }
}

impl FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `docs/configuration.md` lists every variable the server reads, each with the
    /// default it has, and nothing else (its server tables: those before "## Logging").
    #[test]
    fn the_configuration_page_lists_every_variable_with_its_default() {
        let page = include_str!("../docs/configuration.md");
        let server = page.split("## Logging").next().unwrap_or_default();
        let documented: std::collections::BTreeMap<&str, &str> = server
            .lines()
            .filter_map(|line| {
                let mut cells = line.strip_prefix("| `")?.split(" | ");
                let name = cells.next()?.strip_suffix('`')?;
                Some((name, cells.next()?))
            })
            .collect();
        let command = Settings::augment_args(clap::Command::new("serve"));
        let mut read = std::collections::BTreeSet::new();
        for arg in command.get_arguments() {
            let Some(env) = arg.get_env().and_then(|e| e.to_str()) else {
                continue;
            };
            read.insert(env);
            let Some(default) = documented.get(env) else {
                panic!("{env} is read but docs/configuration.md does not list it");
            };
            if arg.is_hide_default_value_set() {
                continue;
            }
            let values: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect();
            if values.is_empty() {
                assert!(
                    default.starts_with("unset"),
                    "{env}: no default, the page says {default}"
                );
            } else {
                assert_eq!(
                    *default,
                    format!("`{}`", values.join(",")),
                    "{env}'s default"
                );
            }
        }
        let listed: std::collections::BTreeSet<&str> = documented.keys().copied().collect();
        assert_eq!(
            listed, read,
            "listed in docs/configuration.md but not read, or the reverse"
        );
    }

    #[test]
    fn defaults_match_the_contract() {
        let s = Settings::from_env().unwrap();
        assert_eq!(s.http_addr.to_string(), "127.0.0.1:8080");
        assert_eq!(s.namespace, "seckill");
        assert_eq!(s.clock_skew_ms, 5000);
        assert_eq!(s.rate_per_user, 5);
        assert_eq!(s.rate_per_ip, 0);
        assert_eq!(s.read_rate_per_ip, 100);
        assert!(s.admin_token.is_none());
        assert!(s.is_trusted_proxy("127.0.0.1".parse().unwrap()));
        assert!(s.is_trusted_proxy("::1".parse().unwrap()));
        assert!(!s.is_trusted_proxy("10.0.0.1".parse().unwrap()));
        assert_eq!(s.remind_at_percent.percents(), &[50]);
        assert!(s.keyspace_events);
    }

    #[test]
    fn remind_stages_parse() {
        let stages: RemindStages = "75, 25,50,25".parse().unwrap();
        assert_eq!(stages.percents(), &[25, 50, 75]);
        assert!("off".parse::<RemindStages>().unwrap().percents().is_empty());
        assert!("0".parse::<RemindStages>().is_err());
        assert!("100".parse::<RemindStages>().is_err());
        assert!("half".parse::<RemindStages>().is_err());
    }

    #[test]
    fn namespaces_are_checked() {
        assert!(parse_namespace("t_abc-1").is_ok());
        assert!(parse_namespace("").is_err());
        assert!(parse_namespace("a:b").is_err());
        assert!(parse_namespace("a b").is_err());
    }

    #[test]
    fn secrets_do_not_print() {
        let s = Secret::new("hunter2");
        assert!(!format!("{s:?}").contains("hunter2"));
    }
}
