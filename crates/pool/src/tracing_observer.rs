//! `TracingObserver`: every event as a `tracing` event carrying the API name.
//!
//! Enabled by the `tracing` cargo feature. Levels: a real failure, a breaker opening
//! and a refused call are `WARN`; a success, a retry, a redial, a cancellation and a
//! breaker closing are `DEBUG`; a send starting is `TRACE`; reported rows and writes
//! are `DEBUG`. Every event has the fields `api`, `event` (its snake_case name) and,
//! for a call, `call`; per-send events add `send` and `attempt`. No URL, body or
//! header value is ever logged: errors are logged through their `Display`.

use crate::observer::{EventKind, TransportEvent, TransportObserver};

/// Emits every event as a `tracing` event (target `vantage_api_pool`).
///
/// ```
/// use std::sync::Arc;
/// use vantage_api_pool::{ResilientClient, tracing_observer::TracingObserver};
/// use vantage_api_pool_testkit::{ScriptedTransport, VirtualRuntime};
///
/// let rt = VirtualRuntime::new();
/// let client = ResilientClient::builder(ScriptedTransport::new(&rt), rt.clone())
///     .observer("orders-api", Arc::new(TracingObserver::new()))
///     .build()?;
/// # let _ = client;
/// # Ok::<(), vantage_api_pool::ConfigError>(())
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, Copy, Default)]
pub struct TracingObserver;

impl TracingObserver {
    /// The observer (`#[non_exhaustive]`, so settings can be added later without
    /// breaking its users).
    #[must_use]
    pub const fn new() -> Self {
        TracingObserver
    }
}

impl TransportObserver for TracingObserver {
    fn on_event(&self, api: &str, event: &TransportEvent) {
        let call = event.call.map(|c| c.0);
        let at_ms = event.at.since_origin().as_secs_f64() * 1000.0;
        let name = event.kind.name();
        match &event.kind {
            EventKind::Started { send, attempt } => {
                tracing::trace!(target: "vantage_api_pool", api, event = name, call, send, attempt, at_ms);
            }
            EventKind::Succeeded {
                send,
                attempt,
                status,
                ms,
                bytes,
            } => tracing::debug!(
                target: "vantage_api_pool",
                api, event = name, call, send, attempt, status = status.as_u16(), ms, bytes, at_ms
            ),
            EventKind::Failed {
                send,
                attempt,
                error,
                ms,
                sent,
            } => tracing::warn!(
                target: "vantage_api_pool",
                api, event = name, call, send, attempt, ms, sent, kind = error.kind_name(),
                status = error.status().map(|s| s.as_u16()), at_ms, "{error}"
            ),
            EventKind::Cancelled { send, attempt } | EventKind::Redialing { send, attempt } => {
                tracing::debug!(target: "vantage_api_pool", api, event = name, call, send, attempt, at_ms);
            }
            EventKind::RetryScheduled { attempt, after } => tracing::debug!(
                target: "vantage_api_pool",
                api, event = name, call, attempt, after_ms = after.as_secs_f64() * 1000.0, at_ms
            ),
            EventKind::BreakerOpened { cooldown } => tracing::warn!(
                target: "vantage_api_pool",
                api, event = name, call, cooldown_ms = cooldown.as_secs_f64() * 1000.0, at_ms
            ),
            EventKind::BreakerClosed | EventKind::WritePushed => {
                tracing::debug!(target: "vantage_api_pool", api, event = name, call, at_ms);
            }
            EventKind::RowsPulled { n } => {
                tracing::debug!(target: "vantage_api_pool", api, event = name, call, n, at_ms);
            }
        }
    }
}
