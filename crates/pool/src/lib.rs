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
//! | [`breaker`] | [`CircuitBreaker`](breaker::CircuitBreaker) with probe epochs |
//! | [`rate`] | the token bucket |
//! | [`concurrency`] | the fair permit limiter behind `max_parallel` |
//! | [`auth`] | [`TokenSource`] (and [`SendTokenSource`](auth::SendTokenSource)), [`NoAuth`] |
//! | [`health`] | [`HealthObserver`](health::HealthObserver): per-API figures for a dashboard |
//! | `tracing_observer` (feature `tracing`) | `TracingObserver`: events as `tracing` events |
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

pub use auth::{AuthError, NoAuth, TokenSource};
pub use breaker::BreakerState;
pub use builder::ClientBuilder;
pub use client::{Report, ResilientClient};
pub use error::{ClientError, ConfigError, ErrorKind, MAX_ERROR_BODY, TimeLimit};
pub use observer::{
    CallId, EventKind, Fanout, MaybeSendSync, NullObserver, TransportEvent, TransportObserver,
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
