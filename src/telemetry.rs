//! Logs: JSON lines on stdout, filtered by `RUST_LOG` (default `info`). Each line a request
//! logs carries its fields (trace id, user, item) under `span` ([`in_request`]).
//!
//! Metrics: the `metrics` facade, recorded for Prometheus and served at `/metrics`.

use std::cell::Cell;
use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics::{Counter, Histogram, SharedString, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_appender::non_blocking::WorkerGuard;
use tracing_log::NormalizeEvent;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// Installs the global subscriber. Keep the guard alive: dropping it flushes the writer.
///
/// Lines are written by a background thread, so a request never waits on stdout; if that
/// thread falls far behind (a pipe nobody reads), lines are dropped rather than slowing
/// purchases down. The thread writes whatever lines wait for it with one `write`
/// (through `Stdout` alone, flushed at every newline, each line was a system call of its
/// own) and then rests ([`Lingering`]).
pub fn init() -> WorkerGuard {
    let stdout = std::io::BufWriter::with_capacity(64 * 1024, std::io::stdout());
    let (writer, guard) = tracing_appender::non_blocking(Lingering(stdout));
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    json_lines(writer).with_env_filter(filter).init();
    guard
}

/// How long the log thread rests after each write: lines that come meanwhile wait in its
/// channel (128,000 at most) and go out together.
const LOG_LINGER: Duration = Duration::from_millis(20);

/// The log thread's writer: a flush — which tracing-appender's thread makes each time its
/// channel is empty — writes, then rests [`LOG_LINGER`]. Without the rest the thread went
/// back to waiting on an empty channel after nearly every line, and every won unit's line
/// paid for waking it: a system call in the request's thread, and the thread's own wake,
/// about 1.5 µs a line in all (`perf record`, 2026-12-04). Lines reach stdout up to 20 ms
/// later; a clean stop still writes every one (the guard waits for the thread).
struct Lingering<W>(W);

impl<W: std::io::Write> std::io::Write for Lingering<W> {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        self.0.write(line)
    }

    fn write_all(&mut self, line: &[u8]) -> std::io::Result<()> {
        self.0.write_all(line)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let flushed = self.0.flush();
        std::thread::sleep(LOG_LINGER);
        flushed
    }
}

/// The log format: one JSON object a line, the event's fields at its top level and the
/// innermost span's under `span` ([`JsonLine`]).
fn json_lines<W>(
    writer: W,
) -> tracing_subscriber::fmt::SubscriberBuilder<
    SpanFields,
    JsonLine,
    tracing::level_filters::LevelFilter,
    W,
>
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .fmt_fields(SpanFields)
        .event_format(JsonLine)
        .with_writer(writer)
}

/// One event as a JSON line: `timestamp`, `level`, the event's fields (`message` first),
/// `target`, and the innermost span's fields with its `name` under `span` — what
/// tracing-subscriber's JSON format writes with `flatten_event` and `with_current_span`,
/// built as text. That format reads each span's stored fields back into
/// `serde_json::Value`s and serializes them again, through an `io::Write` adaptor, for
/// every line: 19,300 instructions a line, a fifth of a purchase's when every won purchase
/// logs one (`redis_grab`; `loadtest/instructions.sh`). The span's fields are already a
/// JSON object ([`SpanFields`]), so they are copied as they are.
struct JsonLine;

impl<S, N> FormatEvent<S, N> for JsonLine
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        // Events from the `log` crate carry their origin as fields; they name it instead.
        let normalized = event.normalized_metadata();
        let meta = normalized.as_ref().unwrap_or_else(|| event.metadata());
        let mut line = String::with_capacity(256);
        line.push_str("{\"timestamp\":\"");
        push_timestamp(&mut line, std::time::SystemTime::now());
        line.push_str("\",\"level\":\"");
        line.push_str(meta.level().as_str());
        line.push('"');
        let mut entries = Entries::new(&mut line);
        event.record(&mut entries);
        entries.result?;
        line.push_str(",\"target\":");
        json_string(&mut line, meta.target());
        if let Some(span) = ctx.lookup_current() {
            line.push_str(",\"span\":");
            let extensions = span.extensions();
            let fields = extensions
                .get::<FormattedFields<N>>()
                .map_or("", |f| f.fields.as_str());
            // The object's text without its closing brace, then the name.
            match fields.strip_suffix('}') {
                Some(open) if open.len() > 1 => {
                    line.push_str(open);
                    line.push(',');
                }
                _ => line.push('{'),
            }
            line.push_str("\"name\":");
            json_string(&mut line, span.name());
            line.push('}');
        } else {
            let _ = REQUEST.try_with(|request| request.push_as_span(&mut line));
        }
        line.push_str("}\n");
        writer.write_str(&line)
    }
}

/// The request a task serves, as its log lines name it: `trace_id`, then `user_id` and
/// `item_id` once known. A tracing span per request held these before: opening it, writing
/// its fields as JSON, recording the buyer into it, entering it at every poll and closing
/// it cost every request — logged or not, and most are not — a tenth of the sold-out
/// path's instructions. Kept in a task-local, they cost a line only when it is written.
pub struct RequestFields {
    trace_id: Arc<str>,
    user_id: Cell<Option<u64>>,
    item_id: Cell<Option<u64>>,
}

tokio::task_local! {
    static REQUEST: RequestFields;
}

/// A future run by [`in_request`].
pub type InRequest<F> = tokio::task::futures::TaskLocalFuture<RequestFields, F>;

impl RequestFields {
    /// As the span they replace was written: `,"span":{…,"name":"request"}`.
    fn push_as_span(&self, line: &mut String) {
        line.push_str(",\"span\":{\"trace_id\":");
        json_string(line, &self.trace_id);
        for (name, value) in [
            (",\"user_id\":", &self.user_id),
            (",\"item_id\":", &self.item_id),
        ] {
            if let Some(value) = value.get() {
                line.push_str(name);
                line.push_str(itoa::Buffer::new().format(value));
            }
        }
        line.push_str(",\"name\":\"request\"}");
    }
}

/// Runs `serving` as the request `trace_id`: every line it logs names the request. (Not
/// an `async fn`, which would keep `serving` twice: see `http::request_id::serve`.)
pub fn in_request<F: Future>(trace_id: Arc<str>, serving: F) -> InRequest<F> {
    let fields = RequestFields {
        trace_id,
        user_id: Cell::new(None),
        item_id: Cell::new(None),
    };
    REQUEST.scope(fields, serving)
}

/// The id of the request this task serves, if it serves one.
pub fn trace_id() -> Option<Arc<str>> {
    REQUEST.try_with(|request| request.trace_id.clone()).ok()
}

/// Names the current request's buyer (and item) in the lines it logs from now on; nothing
/// outside a request.
pub fn record_buyer(user_id: u64, item_id: Option<u64>) {
    let _ = REQUEST.try_with(|request| {
        request.user_id.set(Some(user_id));
        if item_id.is_some() {
            request.item_id.set(item_id);
        }
    });
}

/// `at` in RFC 3339 to the microsecond, UTC (`2026-12-03T23:35:12.789304Z`, as
/// tracing-subscriber's `SystemTime` writes it). The date and time of day are formatted
/// once a second per thread and copied: formatting all of it took 2,100 of a won
/// purchase's 81,000 instructions.
fn push_timestamp(line: &mut String, at: std::time::SystemTime) {
    thread_local! {
        static SECOND: std::cell::RefCell<(u64, String)> = const {
            std::cell::RefCell::new((0, String::new()))
        };
    }
    let since_epoch = at.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let second = since_epoch.as_secs();
    SECOND.with_borrow_mut(|(formatted_for, text)| {
        if *formatted_for != second || text.is_empty() {
            text.clear();
            let utc = i64::try_from(second)
                .ok()
                .and_then(|s| chrono::DateTime::from_timestamp(s, 0))
                .unwrap_or_default();
            let _ = write!(text, "{}", utc.format("%Y-%m-%dT%H:%M:%S"));
            *formatted_for = second;
        }
        line.push_str(text);
    });
    let mut micros = since_epoch.subsec_micros();
    let mut digits = [b'0'; 6];
    for digit in digits.iter_mut().rev() {
        *digit = b'0' + (micros % 10) as u8;
        micros /= 10;
    }
    line.push('.');
    line.extend(digits.iter().map(|&d| char::from(d)));
    line.push('Z');
}

/// A span's fields as a JSON object, written out as they are visited. The JSON line
/// formatter stores each span's fields as text when the span opens and reads them back as
/// a JSON object for the lines it writes; tracing-subscriber's own `JsonFields` first
/// builds a map of `serde_json::Value`s and then serializes it (2.8k of a sold-out
/// answer's 57k instructions while every request had a span).
struct SpanFields;

impl<'w> FormatFields<'w> for SpanFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        // Built here and written once: the writer's text starts empty and would otherwise
        // grow (and move) several times.
        let mut text = String::with_capacity(64);
        text.push('{');
        let mut entries = Entries::new(&mut text);
        fields.record(&mut entries);
        entries.result?;
        text.push('}');
        writer.write_str(&text)
    }

    /// Fields recorded later go inside the object already written.
    fn add_fields(
        &self,
        current: &'w mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        let text = &mut current.fields;
        if text.pop() != Some('}') {
            text.clear();
            text.push('{');
        }
        let mut entries = Entries::new(text);
        fields.record(&mut entries);
        entries.result?;
        text.push('}');
        Ok(())
    }
}

/// Appends each field visited as `"name":value` to a JSON object's text left open.
struct Entries<'a> {
    text: &'a mut String,
    result: fmt::Result,
}

impl<'a> Entries<'a> {
    fn new(text: &'a mut String) -> Self {
        Self {
            text,
            result: Ok(()),
        }
    }

    fn entry(&mut self, field: &Field, value: impl FnOnce(&mut String) -> fmt::Result) {
        // `log.target` and its kind: a `log` record's origin, named by the line already.
        if self.result.is_err() || field.name().starts_with("log.") {
            return;
        }
        if !self.text.ends_with('{') {
            self.text.push(',');
        }
        let name = field.name();
        json_string(self.text, name.strip_prefix("r#").unwrap_or(name));
        self.text.push(':');
        self.result = value(self.text);
    }
}

impl Visit for Entries<'_> {
    // Integers by itoa, as serde_json writes them: a line is written for every won unit.
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.entry(field, |text| {
            text.write_str(itoa::Buffer::new().format(value))
        });
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.entry(field, |text| {
            text.write_str(itoa::Buffer::new().format(value))
        });
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.entry(field, |text| write!(text, "{value}"));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        match value.is_finite() {
            // ryu, as serde_json writes numbers: `Display` took about 800 instructions for
            // each won unit's `duration_ms` (callgrind, 2026-12-04), ryu a fraction of it.
            true => self.entry(field, |text| {
                text.write_str(ryu::Buffer::new().format_finite(value))
            }),
            false => self.entry(field, |text| text.write_str("null")),
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.entry(field, |text| {
            json_string(text, value);
            Ok(())
        });
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.entry(field, |text| {
            text.push('"');
            write!(Escaped(text), "{value:?}")?;
            text.push('"');
            Ok(())
        });
    }
}

fn json_string(text: &mut String, value: &str) {
    text.push('"');
    Escaped(text).escape(value);
    text.push('"');
}

/// Text written through it lands escaped for the inside of a JSON string.
struct Escaped<'a>(&'a mut String);

impl Escaped<'_> {
    fn escape(&mut self, text: &str) {
        let out = &mut *self.0;
        if !text.bytes().any(needs_escape) {
            out.push_str(text);
            return;
        }
        // Byte by byte: every character that needs escaping is ASCII, and no byte of a
        // longer UTF-8 character is.
        let mut plain = 0;
        for (at, &byte) in text.as_bytes().iter().enumerate() {
            if !needs_escape(byte) {
                continue;
            }
            out.push_str(&text[plain..at]);
            match byte {
                b'"' => out.push_str("\\\""),
                b'\\' => out.push_str("\\\\"),
                b'\n' => out.push_str("\\n"),
                byte => out.push_str(&format!("\\u{byte:04x}")),
            }
            plain = at + 1;
        }
        out.push_str(&text[plain..]);
    }
}

fn needs_escape(byte: u8) -> bool {
    byte == b'"' || byte == b'\\' || byte < b' '
}

impl fmt::Write for Escaped<'_> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        self.escape(text);
        Ok(())
    }
}

/// How long a gauge may go unset before it leaves /metrics.
const GAUGE_IDLE_FOR: Duration = Duration::from_secs(600);

/// Latency buckets, in seconds: from well under a millisecond to the one-second budget.
const BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// The process's Prometheus recorder, installed on first use. Every server in the process
/// shares it (tests run several), so every series carries a `namespace` label; that also
/// keeps deployments apart in one Prometheus.
pub fn metrics() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            // A gauge nobody sets any more (an item's levels once its sale is over, a
            // closed item breaker) leaves /metrics: series do not grow with the items.
            .idle_timeout(MetricKindMask::GAUGE, Some(GAUGE_IDLE_FOR))
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)
            .map(PrometheusBuilder::build_recorder);
        let recorder = match recorder {
            Ok(recorder) => recorder,
            Err(e) => {
                tracing::warn!(error = %e, "latency buckets refused; latencies become summaries");
                PrometheusBuilder::new().build_recorder()
            }
        };
        let handle = recorder.handle();
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!("another metrics recorder was installed first; /metrics stays empty");
        }
        describe();
        handle
    })
}

/// What each metric is, for `/metrics`' `# HELP` lines.
fn describe() {
    describe_sale();
    describe_stores();
    describe_operations();
}

/// The waiting room's, the purchases', the payments' and the orders' way through.
fn describe_sale() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "seckill_queue_joined_total",
        "Buyers who took a place in a waiting room, by item"
    );
    describe_counter!(
        "seckill_queue_admitted_total",
        "Buyers let in by a waiting room, by item"
    );
    describe_gauge!(
        "seckill_queue_waiting",
        "Buyers in a waiting room not yet let in, by item"
    );
    describe_gauge!(
        "seckill_queue_passes_reserved_units",
        "Units the live passes of a waiting room may still buy, by item"
    );
    describe_gauge!(
        "seckill_queue_available_units",
        "Units unsold (listed and still to come in waves) as a waiting room's last step read them, by item"
    );
    describe_counter!("seckill_purchases_total", "Purchase answers, by code");
    describe_counter!(
        "seckill_payment_signature_failures_total",
        "Payment events refused (401) before they were read, by reason"
    );
    describe_counter!(
        "seckill_payment_events_total",
        "Verified payment events, by what they did (the answer's code)"
    );
    describe_counter!(
        "seckill_funnel_total",
        "Orders through each stage: started (purchase requests), won, published (confirmed by RabbitMQ), written (in MySQL)"
    );
    describe_histogram!(
        "seckill_purchase_duration_seconds",
        Unit::Seconds,
        "Time to answer a purchase"
    );
    describe_histogram!(
        "seckill_stage_duration_seconds",
        Unit::Seconds,
        "Time of each stage: redis_grab (per purchase), mq_publish and mysql_insert (per batch), redis_wait (per WAIT for replicas)"
    );
}

/// What the stores hold and how they answer.
fn describe_stores() {
    use metrics::{describe_counter, describe_gauge};
    describe_counter!(
        "seckill_redis_waits_total",
        "WAITs sent for replicas (SECKILL_REDIS_WAIT_REPLICAS); each answers every write its master took before it"
    );
    describe_counter!(
        "seckill_redis_wait_total",
        "Writes that waited for replicas, by outcome: held, not_held, degraded (sold without them), refused (before the write)"
    );
    describe_gauge!(
        "seckill_redis_masters_short",
        "Redis masters with fewer replicas in step than SECKILL_REDIS_WAIT_REPLICAS"
    );
    describe_gauge!(
        "seckill_stock_remaining",
        "Units on sale in Redis, per item"
    );
    describe_gauge!(
        "seckill_outbox_orders",
        "Won orders waiting for the relay (not confirmed by RabbitMQ when sent), per item"
    );
    describe_gauge!(
        "seckill_pending_orders",
        "Won orders not yet in MySQL, per item"
    );
    describe_gauge!(
        "seckill_delay_queue_tasks",
        "Deadlines and reminders waiting, per item"
    );
}

/// Breakers, cancels, dependencies, shedding, the catalogue and retirement.
fn describe_operations() {
    use metrics::{describe_counter, describe_gauge};
    describe_gauge!(
        "seckill_breaker_level",
        "Circuit breaker level (0 closed … 3 stop), per scope (`instance`: this instance's automatic breaker)"
    );
    describe_counter!(
        "seckill_orders_cancelled_total",
        "Orders cancelled, by reason"
    );
    describe_counter!(
        "seckill_cut_off_cancels_total",
        "Cancels cut off between MySQL and Redis whose unit a scheduler's sweep returned"
    );
    describe_gauge!(
        "seckill_dependency_up",
        "Whether Redis, MySQL and RabbitMQ answered this instance's last look (every 5 s)"
    );
    describe_gauge!(
        "seckill_redis_memory_used_bytes",
        "Redis used_memory, of the fullest master"
    );
    describe_gauge!(
        "seckill_redis_memory_used_ratio",
        "Redis used_memory / maxmemory, of the fullest master (absent without a limit)"
    );
    describe_gauge!(
        "seckill_queue_messages",
        "Messages ready in RabbitMQ, by queue (orders, dead_letters)"
    );
    describe_counter!(
        "seckill_shed_total",
        "Purchases answered 503 at once because SECKILL_MAX_INFLIGHT were in hand"
    );
    describe_counter!(
        "seckill_dead_letters_total",
        "Orders or messages set aside in the dead-letter queue"
    );
    describe_gauge!(
        "seckill_catalogue_items",
        "Items in this instance's catalogue: current (on sale, coming, ended within a day) and others (older, looked up lately)"
    );
    describe_counter!(
        "seckill_sales_retired_total",
        "Ended sales whose Redis state was retired (SECKILL_SALE_RETENTION_S after reconciliation)"
    );
    describe_counter!(
        "seckill_reconcile_mismatches_total",
        "Reconciliations that found Redis and MySQL disagreeing, per item"
    );
}

/// Every `code` a purchase can be answered with, registered up front so that counting an
/// answer is a map lookup and an atomic add, with no lock.
const PURCHASE_CODES: &[&str] = &[
    "queued",
    "bad_request",
    "clock_skew",
    "unauthorized",
    "item_not_found",
    "not_started",
    "ended",
    "duplicate",
    "sold_out",
    "rate_limited",
    "paused",
    "circuit_open",
    "unavailable",
    "internal",
    "shop_closed",
    "not_found",
    "method_not_allowed",
];

/// Keeps histograms small: the recorder keeps raw samples until they are folded into
/// buckets, which happens at a scrape or here — whichever comes first.
pub async fn upkeep(shutdown: tokio_util::sync::CancellationToken) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
        metrics().run_upkeep();
    }
}

/// One server's meters, all labelled with its namespace; cheap to share.
pub struct Meters {
    namespace: SharedString,
    /// Purchase answers by code.
    purchases: HashMap<&'static str, Counter>,
    pub started: Counter,
    pub won: Counter,
    pub published: Counter,
    pub written: Counter,
    pub purchase_seconds: Histogram,
    /// Purchases answered `503` at once because `SECKILL_MAX_INFLIGHT` were in hand.
    pub shed: Counter,
    pub redis_grab_seconds: Histogram,
    pub mq_publish_seconds: Histogram,
    pub mysql_insert_seconds: Histogram,
}

impl Meters {
    pub fn new(namespace: &str) -> Self {
        metrics();
        let ns = SharedString::from(namespace.to_owned());
        let funnel = |stage: &'static str| metrics::counter!("seckill_funnel_total", "namespace" => ns.clone(), "stage" => stage);
        let stage = |stage: &'static str| metrics::histogram!("seckill_stage_duration_seconds", "namespace" => ns.clone(), "stage" => stage);
        let purchases = PURCHASE_CODES
            .iter()
            .map(|&code| {
                let counter = metrics::counter!("seckill_purchases_total", "namespace" => ns.clone(), "code" => code);
                (code, counter)
            })
            .collect();
        Self {
            purchases,
            started: funnel("started"),
            won: funnel("won"),
            published: funnel("published"),
            written: funnel("written"),
            purchase_seconds: metrics::histogram!("seckill_purchase_duration_seconds", "namespace" => ns.clone()),
            shed: metrics::counter!("seckill_shed_total", "namespace" => ns.clone()),
            redis_grab_seconds: stage("redis_grab"),
            mq_publish_seconds: stage("mq_publish"),
            mysql_insert_seconds: stage("mysql_insert"),
            namespace: ns,
        }
    }

    /// A purchase was answered with `code` after `took`.
    pub fn purchase_answered(&self, code: &'static str, took: Duration) {
        self.purchase_seconds.record(took);
        match self.purchases.get(code) {
            Some(counter) => counter.increment(1),
            None => metrics::counter!("seckill_purchases_total", "namespace" => self.namespace.clone(), "code" => code)
                .increment(1),
        }
    }

    /// An item's queues and stock as last read from Redis.
    pub fn item_levels(&self, item: crate::domain::ItemId, levels: ItemLevels) {
        let item = SharedString::from(item.to_string());
        let gauge = |name: &'static str, value: u64| {
            metrics::gauge!(name, "namespace" => self.namespace.clone(), "item" => item.clone())
                .set(value as f64);
        };
        gauge("seckill_stock_remaining", levels.remaining);
        gauge("seckill_outbox_orders", levels.outbox);
        gauge("seckill_pending_orders", levels.pending);
        gauge("seckill_delay_queue_tasks", levels.delayed);
    }

    pub fn breaker_level(&self, scope: String, level: u8) {
        metrics::gauge!("seckill_breaker_level", "namespace" => self.namespace.clone(), "scope" => scope)
            .set(f64::from(level));
    }

    /// A buyer took a place in an item's waiting room.
    pub fn queue_joined(&self, item: crate::domain::ItemId) {
        metrics::counter!("seckill_queue_joined_total", "namespace" => self.namespace.clone(), "item" => item.to_string())
            .increment(1);
    }

    /// Buyers let in by an item's waiting room.
    pub fn queue_admitted(&self, item: crate::domain::ItemId, admitted: u64) {
        metrics::counter!("seckill_queue_admitted_total", "namespace" => self.namespace.clone(), "item" => item.to_string())
            .increment(admitted);
    }

    /// What an item's waiting room holds.
    pub fn queue_levels(&self, item: crate::domain::ItemId, levels: QueueLevels) {
        let item = SharedString::from(item.to_string());
        let gauge = |name: &'static str, value: u64| {
            metrics::gauge!(name, "namespace" => self.namespace.clone(), "item" => item.clone())
                .set(value as f64);
        };
        gauge("seckill_queue_waiting", levels.waiting);
        gauge("seckill_queue_passes_reserved_units", levels.reserved);
        gauge("seckill_queue_available_units", levels.available);
    }

    pub fn cancelled(&self, reason: &'static str, orders: u64) {
        metrics::counter!("seckill_orders_cancelled_total", "namespace" => self.namespace.clone(), "reason" => reason)
            .increment(orders);
    }

    /// A sweep returned the units of cancels that were cut off between MySQL and Redis.
    pub fn cancelled_units_recovered(&self, units: u64) {
        if units > 0 {
            metrics::counter!("seckill_cut_off_cancels_total", "namespace" => self.namespace.clone())
                .increment(units);
        }
    }

    /// A shop was read into this instance's cache from `from` (`redis`, `mysql`,
    /// `last_known`).
    pub fn shop_fill(&self, from: &'static str) {
        metrics::counter!("seckill_shop_cache_fills_total", "namespace" => self.namespace.clone(), "from" => from)
            .increment(1);
    }

    /// A layer of the shop status disagreed with MySQL and was repaired.
    pub fn shop_repair(&self, layer: &'static str) {
        metrics::counter!("seckill_shop_repairs_total", "namespace" => self.namespace.clone(), "layer" => layer)
            .increment(1);
    }

    /// Whether a dependency answered this instance's last look.
    pub fn dependency_up(&self, dependency: &'static str, up: bool) {
        metrics::gauge!("seckill_dependency_up", "namespace" => self.namespace.clone(), "dependency" => dependency)
            .set(if up { 1.0 } else { 0.0 });
    }

    /// Redis memory, of the fullest master: bytes used, and the share of `maxmemory`
    /// (shown only when a limit is set).
    pub fn redis_memory(&self, masters: &[(u64, u64)]) {
        let used = masters.iter().map(|(used, _)| *used).max().unwrap_or(0);
        metrics::gauge!("seckill_redis_memory_used_bytes", "namespace" => self.namespace.clone())
            .set(used as f64);
        let ratio = masters
            .iter()
            .filter(|(_, max)| *max > 0)
            .map(|(used, max)| *used as f64 / *max as f64)
            .fold(None, |worst: Option<f64>, r| {
                Some(worst.map_or(r, |w| w.max(r)))
            });
        if let Some(ratio) = ratio {
            metrics::gauge!("seckill_redis_memory_used_ratio", "namespace" => self.namespace.clone())
                .set(ratio);
        }
    }

    /// Messages waiting in a RabbitMQ queue (`orders`, `dead_letters`).
    pub fn queue_messages(&self, queue: &'static str, messages: u32) {
        metrics::gauge!("seckill_queue_messages", "namespace" => self.namespace.clone(), "queue" => queue)
            .set(f64::from(messages));
    }

    /// Orders set aside in the dead-letter queue.
    pub fn dead_lettered(&self, orders: u64) {
        metrics::counter!("seckill_dead_letters_total", "namespace" => self.namespace.clone())
            .increment(orders);
    }

    /// Items in this instance's catalogue: current ones, and older ones looked up lately.
    pub fn catalogue_size(&self, current: u64, others: u64) {
        for (kind, n) in [("current", current), ("others", others)] {
            metrics::gauge!("seckill_catalogue_items", "namespace" => self.namespace.clone(), "kind" => kind)
                .set(n as f64);
        }
    }

    /// Ended sales whose Redis state was retired.
    pub fn sales_retired(&self, sales: u64) {
        metrics::counter!("seckill_sales_retired_total", "namespace" => self.namespace.clone())
            .increment(sales);
    }

    /// A payment event refused before it was read: `reason` is `missing`, `malformed`,
    /// `stale` (its time too far from ours) or `mismatch` (no secret signs it so).
    pub fn payment_refused(&self, reason: &'static str) {
        metrics::counter!("seckill_payment_signature_failures_total", "namespace" => self.namespace.clone(), "reason" => reason)
            .increment(1);
    }

    /// A verified payment event applied (or answered again), by what it did.
    pub fn payment_event(&self, outcome: &'static str) {
        metrics::counter!("seckill_payment_events_total", "namespace" => self.namespace.clone(), "outcome" => outcome)
            .increment(1);
    }

    pub fn reconcile_mismatch(&self, item: crate::domain::ItemId) {
        metrics::counter!("seckill_reconcile_mismatches_total", "namespace" => self.namespace.clone(), "item" => item.to_string())
            .increment(1);
    }
}

/// What a waiting room holds after an admission step.
#[derive(Clone, Copy, Debug, Default)]
pub struct QueueLevels {
    pub waiting: u64,
    pub reserved: u64,
    pub available: u64,
}

/// What [`Meters::item_levels`] shows of an item.
#[derive(Clone, Copy, Debug, Default)]
pub struct ItemLevels {
    pub remaining: u64,
    pub outbox: u64,
    pub pending: u64,
    pub delayed: u64,
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Lines written, for reading back.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// What `body` logs, in the server's format.
    fn logged(body: impl FnOnce()) -> String {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = json_lines(move || writer.clone()).finish();
        tracing::subscriber::with_default(subscriber, body);
        String::from_utf8(captured.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn lines_carry_the_span_fields_as_json_whatever_their_text() {
        let text = logged(|| {
            let odd = "a \"quoted\" \\ back\nslash\t\u{7}ü";
            let span = tracing::info_span!(
                "request",
                trace_id = %odd,
                r#type = "plain",
                user_id = tracing::field::Empty,
                item_id = tracing::field::Empty,
            );
            let _entered = span.enter();
            tracing::info!("before");
            span.record("user_id", 7u64);
            span.record("item_id", -3i64);
            tracing::info!(share = 0.5, tiny = 1.25e-7, none = f64::NAN, "after");
        });
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
            .collect();
        let odd = "a \"quoted\" \\ back\nslash\t\u{7}ü";
        assert_eq!(
            lines[0]["span"],
            serde_json::json!({"name": "request", "trace_id": odd, "type": "plain"})
        );
        assert_eq!(
            lines[1]["span"],
            serde_json::json!({
                "name": "request", "trace_id": odd, "type": "plain", "user_id": 7, "item_id": -3
            })
        );
        assert_eq!(
            (lines[1]["message"].as_str(), lines[1]["share"].as_f64()),
            (Some("after"), Some(0.5))
        );
        assert_eq!(
            (lines[1]["tiny"].as_f64(), &lines[1]["none"]),
            (Some(1.25e-7), &serde_json::Value::Null)
        );
        assert_eq!(lines[1]["level"], "INFO");
        assert_eq!(lines[1]["target"], module_path!());
        let timestamp = lines[1]["timestamp"].as_str().unwrap();
        assert!(
            chrono::DateTime::parse_from_rfc3339(timestamp).is_ok(),
            "{timestamp}"
        );
    }

    #[tokio::test]
    async fn a_request_s_lines_name_it_and_its_buyer_once_known() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = json_lines(move || writer.clone()).finish();
        let _default = tracing::subscriber::set_default(subscriber);
        in_request(Arc::from("01J\"odd"), async {
            tracing::info!("before");
            record_buyer(7, Some(3));
            tracing::info!(share = 0.5, tiny = 1.25e-7, none = f64::NAN, "after");
        })
        .await;
        tracing::info!("outside");
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        let spans: Vec<serde_json::Value> = text
            .lines()
            .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap()["span"].clone())
            .collect();
        assert_eq!(
            spans,
            [
                serde_json::json!({"trace_id": "01J\"odd", "name": "request"}),
                serde_json::json!({"trace_id": "01J\"odd", "user_id": 7, "item_id": 3, "name": "request"}),
                serde_json::Value::Null,
            ],
            "{text}"
        );
    }

    #[test]
    fn timestamps_are_rfc_3339_to_the_microsecond_across_seconds() {
        let base = std::time::UNIX_EPOCH + Duration::from_secs(1_796_340_912);
        for (later, expected) in [
            (
                Duration::from_micros(789_304),
                "2026-12-03T23:35:12.789304Z",
            ),
            (
                Duration::from_micros(999_999),
                "2026-12-03T23:35:12.999999Z",
            ),
            (
                Duration::from_micros(1_000_007),
                "2026-12-03T23:35:13.000007Z",
            ),
            (Duration::from_secs(86_400), "2026-12-04T23:35:12.000000Z"),
        ] {
            let mut line = String::new();
            push_timestamp(&mut line, base + later);
            assert_eq!(line, expected);
        }
    }

    #[test]
    fn a_line_outside_a_span_has_its_fields_and_no_span() {
        let text = logged(|| {
            tracing::warn!(orders = 3u64, outcome = "partly", "mq_publish");
        });
        let line: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
        let mut keys: Vec<&str> = line
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "level",
                "message",
                "orders",
                "outcome",
                "target",
                "timestamp"
            ],
            "{text}"
        );
        assert_eq!(
            (&line["level"], &line["message"], &line["orders"]),
            (
                &serde_json::json!("WARN"),
                &serde_json::json!("mq_publish"),
                &serde_json::json!(3)
            )
        );
        assert_eq!(text.lines().count(), 1, "{text}");
    }
}
