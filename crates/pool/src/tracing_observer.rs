//! `TracingObserver`: every event as a `tracing` event carrying the API name.
//!
//! Enabled by the `tracing` cargo feature. Levels, so that a `WARN` filter shows an
//! outage begin and an `INFO` one its end too:
//!
//! | level | events |
//! |---|---|
//! | `WARN` | a call a panic unwound through (`call_end`, `outcome="panicked"`), a failed send (`failed`, `sent=true`), a breaker opening (`breaker_opened`), a call refused for a reason of its own (`failed`, `sent=false`: an auth failure, a budget spent before the send, a request that could not be built), a token fetch that failed or that a panic unwound (`token_fetch_ended`, `outcome="failed"` or `"panicked"`; the token source's error text is not logged, as a `ClientError`'s `Display` leaves it out) |
//! | `INFO` | a breaker closing (`breaker_closed`): the API answers again; a breaker reset by hand (`breaker_reset`); a new auth token, or a token fetch its caller gave up (`token_fetch_ended`) |
//! | `DEBUG` | a call's end (`call_end`), a call refused because the breaker is open (`failed`, `sent=false`, `kind="breaker_open"`: its opening was a `WARN`, and during an outage there is one such refusal per call), a success, a retry, a redial, a cancellation, reported rows and writes |
//! | `TRACE` | a send starting (`started`) |
//!
//! Fields (all events have `api`, `event`, its snake_case name, and `at_ms`; an
//! event of a call has `call`, and `label` when its policy has one:
//! [`CallPolicy::with_label`](crate::CallPolicy::with_label)):
//!
//! | event | fields |
//! |---|---|
//! | `started`, `cancelled`, `redialing` | `send`, `attempt` |
//! | `succeeded` | `send`, `attempt`, `status`, `ms`, `bytes` (when known) |
//! | `failed` | `send`, `attempt`, `ms`, `sent`, `kind` (the error's `kind_name()`), `status` (for an HTTP status), and the error's `Display` as the message |
//! | `retry_scheduled` | `attempt` (the retry's), `after_ms` |
//! | `breaker_opened` | `cooldown_ms` |
//! | `rows_pulled` | `n` |
//! | `token_fetch_ended` (no `call`, no `label`) | `reason` (`first`, `rejected`, `renewal`, `expired` or `requested`), `outcome` (`fetched`, `failed`, `abandoned` or `panicked`), `ms`, and for a new token `generation` and `lifetime_ms` (when its source gave one) |
//! | `call_end` ([`TransportObserver::on_call_end`]) | `call`, `label` (when the call has one), `outcome` (`succeeded`, `failed`, `cancelled` or `panicked`), `sends`, `attempts`, `elapsed_ms` (the caller's wait, a float), `status` (a response's, or a failure's HTTP status), `kind` (a failure's `kind_name()`) |
//!
//! `at_ms` is the event's time in milliseconds since the client's runtime began (its
//! [`Instant`](crate::Instant) origin), not wall-clock time; it, `after_ms`,
//! `cooldown_ms` and `lifetime_ms` are floats and keep fractions of a millisecond,
//! `ms` (a send's latency, a token fetch's time) is a whole number. No URL, body or
//! header value is ever logged: errors are logged through their `Display`, and a
//! token source's error not at all.

use crate::error::ErrorKind;
use crate::observer::{
    CallEnd, CallOutcome, EventKind, TokenFetchOutcome, TransportEvent, TransportObserver,
};

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
        let label = event.label;
        let at_ms = event.at.since_origin().as_secs_f64() * 1000.0;
        let name = event.kind.name();
        match &event.kind {
            EventKind::Started { send, attempt } => {
                tracing::trace!(target: "vantage_api_pool", api, event = name, call, label, send, attempt, at_ms);
            }
            EventKind::Succeeded {
                send,
                attempt,
                status,
                ms,
                bytes,
            } => tracing::debug!(
                target: "vantage_api_pool",
                api, event = name, call, label, send, attempt, status = status.as_u16(), ms, bytes, at_ms
            ),
            EventKind::Failed {
                send,
                attempt,
                error,
                ms,
                sent,
            } => {
                let status = error.status().map(|s| s.as_u16());
                let kind = error.kind_name();
                if !*sent && matches!(error.kind(), ErrorKind::BreakerOpen) {
                    tracing::debug!(
                        target: "vantage_api_pool",
                        api, event = name, call, label, send, attempt, ms, sent, kind, status, at_ms,
                        "{error}"
                    );
                } else {
                    tracing::warn!(
                        target: "vantage_api_pool",
                        api, event = name, call, label, send, attempt, ms, sent, kind, status, at_ms,
                        "{error}"
                    );
                }
            }
            EventKind::Cancelled { send, attempt } | EventKind::Redialing { send, attempt } => {
                tracing::debug!(target: "vantage_api_pool", api, event = name, call, label, send, attempt, at_ms);
            }
            EventKind::RetryScheduled { attempt, after } => tracing::debug!(
                target: "vantage_api_pool",
                api, event = name, call, label, attempt, after_ms = after.as_secs_f64() * 1000.0, at_ms
            ),
            EventKind::BreakerOpened { cooldown } => tracing::warn!(
                target: "vantage_api_pool",
                api, event = name, call, label, cooldown_ms = cooldown.as_secs_f64() * 1000.0, at_ms,
                "circuit breaker opened"
            ),
            EventKind::BreakerClosed => tracing::info!(
                target: "vantage_api_pool",
                api, event = name, call, label, at_ms, "circuit breaker closed"
            ),
            EventKind::BreakerReset => tracing::info!(
                target: "vantage_api_pool",
                api, event = name, at_ms, "circuit breaker reset by hand"
            ),
            EventKind::TokenFetchEnded {
                reason,
                ms,
                outcome,
            } => {
                let (reason, outcome_name) = (reason.name(), outcome.name());
                match outcome {
                    TokenFetchOutcome::Fetched {
                        generation,
                        lifetime,
                    } => {
                        let lifetime_ms = lifetime.map(|l| l.as_secs_f64() * 1000.0);
                        tracing::info!(
                            target: "vantage_api_pool",
                            api, event = name, reason, outcome = outcome_name, ms, generation, lifetime_ms, at_ms,
                            "auth token fetched"
                        );
                    }
                    // The source's own text stays out of the log, as it does out of
                    // a `ClientError`'s `Display`: it may name what the source
                    // reached.
                    TokenFetchOutcome::Failed { .. } => tracing::warn!(
                        target: "vantage_api_pool",
                        api, event = name, reason, outcome = outcome_name, ms, at_ms,
                        "auth token fetch failed"
                    ),
                    TokenFetchOutcome::Abandoned => tracing::info!(
                        target: "vantage_api_pool",
                        api, event = name, reason, outcome = outcome_name, ms, at_ms,
                        "auth token fetch given up by its caller"
                    ),
                    TokenFetchOutcome::Panicked => tracing::warn!(
                        target: "vantage_api_pool",
                        api, event = name, reason, outcome = outcome_name, ms, at_ms,
                        "auth token fetch unwound by a panic"
                    ),
                }
            }
            EventKind::WritePushed => {
                tracing::debug!(target: "vantage_api_pool", api, event = name, call, label, at_ms);
            }
            EventKind::RowsPulled { n } => {
                tracing::debug!(target: "vantage_api_pool", api, event = name, call, label, n, at_ms);
            }
        }
    }

    /// An event named `call_end`, a `DEBUG` (a failed call's error was already a
    /// `WARN`, its last `Failed`, or a `DEBUG` for a breaker's refusal), or a
    /// `WARN` for a call a panic unwound through.
    fn on_call_end(&self, api: &str, end: &CallEnd) {
        let call = end.call.0;
        let label = end.label;
        let at_ms = end.at.since_origin().as_secs_f64() * 1000.0;
        let elapsed_ms = end.elapsed().as_secs_f64() * 1000.0;
        let (sends, attempts, outcome) = (end.sends, end.attempts, end.outcome.name());
        let (status, kind) = match &end.outcome {
            CallOutcome::Succeeded { status } => (Some(status.as_u16()), None),
            CallOutcome::Failed { error } => {
                (error.status().map(|s| s.as_u16()), Some(error.kind_name()))
            }
            CallOutcome::Cancelled => (None, None),
            CallOutcome::Panicked => {
                tracing::warn!(
                    target: "vantage_api_pool",
                    api, event = "call_end", call, label, outcome, sends, attempts, elapsed_ms, at_ms,
                    "call unwound by a panic"
                );
                return;
            }
        };
        tracing::debug!(
            target: "vantage_api_pool",
            api, event = "call_end", call, label, outcome, sends, attempts, elapsed_ms, status, kind, at_ms
        );
    }
}
