//! Logs: JSON lines on stdout, filtered by `RUST_LOG` (default `info`). Each line carries
//! the request's span (trace id, method, path, user, item) when it has one.
//!
//! Metrics: the `metrics` facade, recorded for Prometheus and served at `/metrics`.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use tracing_appender::non_blocking::WorkerGuard;
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. Keep the guard alive: dropping it flushes the writer.
///
/// Lines are written by a background thread, so a request never waits on stdout; if that
/// thread falls far behind (a pipe nobody reads), lines are dropped rather than slowing
/// purchases down.
pub fn init() -> WorkerGuard {
    let (writer, guard) = tracing_appender::non_blocking(std::io::stdout());
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_current_span(true)
        .with_span_list(false)
        .with_env_filter(filter)
        .with_writer(writer)
        .init();
    guard
}

/// The process's Prometheus recorder, installed on first use. Every server in the process
/// shares it (tests run several), so metrics that must be told apart carry a `namespace`
/// label.
pub fn metrics() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!("another metrics recorder was installed first; /metrics stays empty");
        }
        handle
    })
}
