//! # vantage-api-pool
//!
//! One resilient HTTP client per remote API: how many requests may be in flight, how
//! fast they may leave, when to stop trying because the API is down, how a failed
//! attempt is retried, how long anything may take, and what the rest of the process
//! is told about it.
//!
//! This crate is the core. It never touches an executor, a real clock or an HTTP
//! library: it talks to the world through two ports, [`Transport`] (send one request)
//! and [`Runtime`] (now, wall clock, sleep, randomness). Adapters live in sibling
//! crates: `vantage-api-pool-reqwest`, `vantage-api-pool-tokio`,
//! `vantage-api-pool-wasm`, and `vantage-api-pool-testkit` for virtual time.
//!
//! # A first call
//!
//! A tokio service builds the client over `vantage-api-pool-reqwest`'s
//! `ReqwestTransport` and `TokioRuntime` (`ReqwestTransport::tokio_default()`; see
//! that crate and the README's quick start). The same attempt loop runs here on the
//! testkit's scripted API and virtual clock: the first send is answered `503` with
//! `Retry-After: 2`, the call waits the two seconds the server asked for and up to a
//! quarter more (the default jitter, which never shortens a server's delay; virtual
//! seconds, which pass at once), and the second send succeeds.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use vantage_api_pool::{CallPolicy, EventKind, ResilientClient, RetryPolicy};
//! use vantage_api_pool_testkit::{RecordingObserver, Reply, ScriptedTransport, VirtualRuntime};
//!
//! let rt = VirtualRuntime::new();
//! let api = ScriptedTransport::new(&rt);
//! api.push(Reply::status(503).header("retry-after", "2"));
//! api.push(Reply::ok().body("[]"));
//! let observer = RecordingObserver::new();
//! let client = ResilientClient::builder(api.clone(), rt.clone())
//!     .max_parallel(4)
//!     .rate_limit(10.0)
//!     .default_breaker()
//!     .observer("orders-api", Arc::new(observer.clone()))
//!     .build()?;
//!
//! let policy = CallPolicy::bounded(RetryPolicy::default());
//! let response = rt.block_on(client.execute_with(&policy, |http| http.get("/orders")))??;
//! assert_eq!(response.status(), 200);
//! let sent = api.requests();
//! assert_eq!(sent.len(), 2);
//! let waited = sent[1].at - sent[0].at;
//! assert!((Duration::from_secs(2)..=Duration::from_millis(2500)).contains(&waited));
//! // What the rest of the process was told, in the order of the observer contract.
//! let events = observer.events();
//! let names: Vec<_> = events.iter().map(|e| e.event.kind.name()).collect();
//! assert_eq!(names, ["started", "failed", "retry_scheduled", "started", "succeeded"]);
//! let EventKind::RetryScheduled { after, .. } = events[2].event.kind else { unreachable!() };
//! assert_eq!(after, waited); // the sleep it announced is the one it slept
//! observer.check_contract()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! `execute_with` ends the call at the response head, its body streaming to the
//! caller. [`ResilientClient::execute_read`] reads the body too, inside the attempt,
//! so a body that breaks off or stalls is retried like any failed send (when the
//! request is safe to repeat) and a half-open probe is judged on the whole body.
//!
//! Modules, one per concept (see ARCHITECTURE.md):
//!
//! | module | concept |
//! |---|---|
//! | [`time`] | the crate's own monotonic [`Instant`] |
//! | [`runtime`] | the [`Runtime`] port (and [`SendRuntime`](runtime::SendRuntime)) and [`timeout_at`] |
//! | [`transport`] | the [`Transport`] port (and [`SendTransport`](transport::SendTransport)), [`PreparedRequest`], [`TransportResponse`], [`TransportError`] |
//! | [`policy`] | [`CallPolicy`], [`RetryMode`], [`RetryPolicy`], [`BreakerMode`], [`Jitter`] |
//! | [`backoff`] | exponential back-off with a 1 ms floor, and jitter |
//! | [`server_delay`] | `retry-after-ms` and `Retry-After` parsing |
//! | [`classify`] | what an outcome means: the verdict and the breaker effect (its types are not at the crate root: `Action`, `Outcome` and the rest are the loop's vocabulary, and would crowd a glob import) |
//! | [`client`] | [`ResilientClient`], [`Report`]; [`builder`]: [`ClientBuilder`] |
//! | `attempt` (private) | the attempt loop: `wait_for_gate` → `send_once` → `record` (the last two are sections of `Call::run`) |
//! | [`breaker`] | [`CircuitBreaker`](breaker::CircuitBreaker) with probe epochs and a manual reset |
//! | [`rate`] | the token bucket |
//! | [`concurrency`] | the fair permit limiter behind `max_parallel` |
//! | [`auth`] | [`TokenSource`] (and [`SendTokenSource`](auth::SendTokenSource)), [`AuthToken`] (a token and its lifetime), [`NoAuth`] |
//! | [`health`] | [`HealthObserver`](health::HealthObserver): per-API figures for a dashboard |
#![cfg_attr(
    feature = "tracing",
    doc = "| [`tracing_observer`] (feature `tracing`) | \
           [`TracingObserver`](tracing_observer::TracingObserver): events as `tracing` events |"
)]
#![cfg_attr(
    not(feature = "tracing"),
    doc = "| `tracing_observer` (feature `tracing`; not in these docs: `cargo doc \
           --features vantage-api-pool/tracing` shows it) | `TracingObserver`: events as \
           `tracing` events |"
)]
//! | [`error`] | [`ClientError`], [`ErrorKind`], [`ConfigError`] |
//! | [`observer`] | [`TransportObserver`], [`TransportEvent`], [`EventKind`] |
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![warn(clippy::missing_errors_doc)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod attempt;
pub mod auth;
pub mod backoff;
pub mod breaker;
pub mod builder;
pub mod classify;
pub mod client;
pub mod concurrency;
pub mod error;
pub mod health;
pub mod observer;
pub mod policy;
pub mod rate;
pub mod runtime;
pub mod server_delay;
mod sync;
pub mod time;
#[cfg(feature = "tracing")]
#[cfg_attr(docsrs, doc(cfg(feature = "tracing")))]
pub mod tracing_observer;
pub mod transport;

pub use auth::{AuthError, AuthToken, NoAuth, TokenSource};
pub use breaker::BreakerState;
pub use builder::ClientBuilder;
pub use client::{CallFuture, ReadResponse, Report, ResilientClient};
pub use error::{ClientError, ConfigError, ErrorKind, MAX_ERROR_BODY, TimeLimit};
pub use observer::{
    CallEnd, CallId, CallOutcome, EventKind, Fanout, MaybeSendSync, NullObserver,
    TokenFetchOutcome, TokenFetchReason, TransportEvent, TransportObserver,
};
pub use policy::{BreakerMode, CallPolicy, Jitter, RetryMode, RetryPolicy};
pub use runtime::{Elapsed, Runtime, timeout_at};
pub use time::Instant;
pub use transport::{
    PreparedRequest, Transport, TransportError, TransportErrorKind, TransportResponse,
};

/// Re-exported so adapters and users name the same `Bytes` the ports use.
pub use bytes;
/// Re-exported so adapters and users name the same `http` types the ports use.
pub use http;
