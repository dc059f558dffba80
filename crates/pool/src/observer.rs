//! The observer: what the rest of the process is told about a client's traffic.
//!
//! A [`TransportObserver`] is a synchronous callback that receives every
//! [`TransportEvent`] of a client, keyed by the API name the builder was given. The
//! contract it may rely on is in ARCHITECTURE.md ("Observer contract"), and rule by
//! rule in the docs of the testkit's `observer` module
//! (`vantage_api_pool_testkit::observer`: what its `RecordingObserver::check_contract`
//! checks); in short:
//! every `Started` is followed by exactly one `Succeeded`, `Failed` or `Cancelled`
//! for the same (call, send), the last `Failed` of a call carries the error the call
//! returns, every call that reached the gate ends with one
//! [`on_call_end`](TransportObserver::on_call_end) after its last event, and no lock
//! is held while the callback runs.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;

use crate::auth::SharedAuthError;
use crate::error::ClientError;
use crate::time::Instant;

/// `Send + Sync` on native targets, nothing on `wasm32`.
///
/// Observers are held as `Arc<dyn TransportObserver>`; this bound makes that `Arc`
/// shareable across threads on native targets, while a browser observer may hold a
/// `JsValue`. Blanket-implemented: there is nothing to implement by hand.
#[cfg(not(target_arch = "wasm32"))]
pub trait MaybeSendSync: Send + Sync {}
#[cfg(not(target_arch = "wasm32"))]
impl<T: Send + Sync + ?Sized> MaybeSendSync for T {}

/// `Send + Sync` on native targets, nothing on `wasm32`.
///
/// Observers are held as `Arc<dyn TransportObserver>`; this bound makes that `Arc`
/// shareable across threads on native targets, while a browser observer may hold a
/// `JsValue`. Blanket-implemented: there is nothing to implement by hand.
#[cfg(target_arch = "wasm32")]
pub trait MaybeSendSync {}
#[cfg(target_arch = "wasm32")]
impl<T: ?Sized> MaybeSendSync for T {}

/// Receives a client's events, synchronously, on the calling task.
///
/// Return quickly, never block or `.await`, and never call back into the client.
///
/// Every method does nothing unless implemented: implement the ones you need. An
/// observer that wraps others must pass on every method (today `on_event`,
/// `on_attach` and `on_call_end`), or those behind it miss what it drops with no
/// error (a
/// [`HealthObserver`](crate::health::HealthObserver) behind a wrapper that forwards
/// only `on_event` lists no API before its first event and counts no call);
/// [`Fanout`] passes on every one.
///
/// A panic in `on_event` is not swallowed: it unwinds out of the call to its caller
/// (the call's future panics). The client stays whole and the contract holds as it
/// unwinds: a `Started` whose callback panicked is followed by its `Cancelled` (or,
/// for a refusal, its `Failed`), and a breaker transition whose terminal event
/// panicked is still reported, so every other observer of a [`Fanout`] sees a
/// complete stream. Some events are reported from a destructor: a send's
/// `Cancelled` and a token fetch given up ([`TokenFetchOutcome::Abandoned`]) when
/// the caller drops a call (or a `refresh_token` future); a panic on one of those
/// leaves that `drop`, to whoever dropped the future. A report made from a
/// destructor while a panic unwinds (the observer's own first panic, or any other
/// that drops a call) catches a panic of the observer and drops it: out of a
/// destructor it would abort the process. On `wasm32` a panic aborts.
///
/// ```
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use vantage_api_pool::{EventKind, TransportEvent, TransportObserver};
///
/// #[derive(Default)]
/// struct CountFailures(AtomicU32);
///
/// impl TransportObserver for CountFailures {
///     fn on_event(&self, _api: &str, event: &TransportEvent) {
///         if let EventKind::Failed { sent: true, .. } = event.kind {
///             self.0.fetch_add(1, Ordering::Relaxed);
///         }
///     }
/// }
/// ```
pub trait TransportObserver: MaybeSendSync {
    /// Called once per event. `api` is the key the client's builder was given.
    /// Does nothing unless implemented (an observer may want only
    /// [`on_call_end`](TransportObserver::on_call_end)).
    fn on_event(&self, api: &str, event: &TransportEvent) {
        let _ = (api, event);
    }

    /// Called by [`ClientBuilder::build`](crate::ClientBuilder::build), once it has
    /// accepted the settings, with the key the builder was given and the runtime's
    /// clock: before any event of that client. Does nothing unless implemented.
    /// [`HealthObserver`](crate::health::HealthObserver) lists the API from then on,
    /// so a dashboard shows an API that has had no traffic yet. Every client built
    /// with this observer calls it, two for one key included (clones of a client do
    /// not: they are the same client). A panic here unwinds out of `build`.
    fn on_attach(&self, api: &str, at: Instant) {
        let _ = (api, at);
    }

    /// Called once per call, after its last event, when the call ends: it returned
    /// a response or an error, or it did not return (its caller dropped it, or a
    /// panic unwound through it: see [`CallOutcome::Cancelled`] and
    /// [`CallOutcome::Panicked`]). A call dropped
    /// before its first poll never reached the gate, and reports neither events
    /// nor an end. Does nothing unless implemented.
    ///
    /// This is where call-level figures come from (the latency a caller waited,
    /// retries and back-off included; how many calls failed, not sends): the events
    /// are per send, and no event marks a call's end. The same rules as for
    /// [`on_event`](TransportObserver::on_event) apply; a panic here unwinds out of
    /// the call's future as it returns, or out of its drop for a dropped call (and
    /// is dropped if another panic is already unwinding, as out of a destructor it
    /// would abort the process).
    fn on_call_end(&self, api: &str, end: &CallEnd) {
        let _ = (api, end);
    }
}

/// How a call ended, as [`TransportObserver::on_call_end`] hears it.
///
/// ```
/// use std::sync::Mutex;
/// use vantage_api_pool::{CallEnd, CallOutcome, TransportObserver};
///
/// /// Milliseconds each failed call kept its caller waiting, retries included.
/// #[derive(Default)]
/// struct FailedCallTimes(Mutex<Vec<u128>>);
///
/// impl TransportObserver for FailedCallTimes {
///     fn on_call_end(&self, _api: &str, end: &CallEnd) {
///         if let CallOutcome::Failed { .. } = end.outcome {
///             self.0.lock().unwrap().push(end.elapsed().as_millis());
///         }
///     }
/// }
/// ```
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct CallEnd {
    /// The call.
    pub call: CallId,
    /// The label of the call's policy, as its events carry it.
    pub label: Option<&'static str>,
    /// When it began: its first reading at the gate (where its budget starts).
    pub began: Instant,
    /// When it ended: for a call that returned a response, the `at` of its
    /// `Succeeded`; for one that returned an error, a reading taken after its last
    /// `Failed`; for one its caller dropped, a reading taken as it was dropped.
    pub at: Instant,
    /// The `send` of the call's last `Started`: every send counts, redials, 401
    /// replays and a synthetic `Started` + `Failed` pair (a refusal) included; 0
    /// for a call dropped before its first `Started`.
    pub sends: u32,
    /// The `attempt` of the call's last `Started` (0 before any). A refusal's
    /// synthetic `Started` counts here as it does in the events, so a call that
    /// ends refused before a send (the breaker open, a failed token fetch) can
    /// show one attempt more than its error's
    /// [`attempts`](crate::ClientError::attempts), which counts only sends that
    /// went through the transport: a call the breaker refused outright ends with 1
    /// here and 0 there. For that figure, read the error
    /// ([`CallOutcome::Failed`]).
    pub attempts: u32,
    /// What the caller got.
    pub outcome: CallOutcome,
}

impl CallEnd {
    /// The end of call `call`, which began at `began` (its first reading at the
    /// gate) and ended at `at`, after `sends` sends and `attempts` attempts (its
    /// last `Started`'s numbers), with `outcome` and no label: for an observer fed
    /// by hand, as in a test.
    #[must_use]
    pub fn new(
        call: CallId,
        began: Instant,
        at: Instant,
        sends: u32,
        attempts: u32,
        outcome: CallOutcome,
    ) -> Self {
        CallEnd {
            call,
            label: None,
            began,
            at,
            sends,
            attempts,
            outcome,
        }
    }

    /// The end with `label` as its call's label.
    #[must_use]
    pub fn with_label(mut self, label: Option<&'static str>) -> Self {
        self.label = label;
        self
    }

    /// From [`began`](CallEnd::began) to [`at`](CallEnd::at): everything the
    /// caller waited for, every send, wait, retry and back-off included.
    #[must_use]
    pub fn elapsed(&self) -> Duration {
        self.at.saturating_duration_since(self.began)
    }
}

/// What a call's caller got.
#[non_exhaustive]
#[derive(Debug, Clone)]
pub enum CallOutcome {
    /// A response: its status.
    Succeeded {
        /// The response status.
        status: StatusCode,
    },
    /// An error: the same one the call returned, and the call's last `Failed`
    /// carried.
    Failed {
        /// The error.
        error: ClientError,
    },
    /// The call did not return: its caller dropped the call's future before it
    /// ended (mid-send, its send having reported `Cancelled` first; in a wait at
    /// the gate; in a back-off).
    Cancelled,
    /// The call did not return: a panic unwound through it (an observer's, on any
    /// event, even the `Succeeded` of the response it was about to return; the
    /// request closure's; the token source's; or one elsewhere in the task that
    /// dropped the call as it unwound). A send in flight reported `Cancelled`
    /// first.
    Panicked,
}

impl CallOutcome {
    /// A stable snake_case name of the variant: `succeeded`, `failed`,
    /// `cancelled` or `panicked`.
    #[must_use]
    pub const fn name(&self) -> &'static str {
        match self {
            CallOutcome::Succeeded { .. } => "succeeded",
            CallOutcome::Failed { .. } => "failed",
            CallOutcome::Cancelled => "cancelled",
            CallOutcome::Panicked => "panicked",
        }
    }
}

/// Why the client's token source was asked for a token
/// ([`EventKind::TokenFetchEnded`]).
///
/// A fetch serves every caller that needs a token while it runs, so it is
/// reported under the reason it started for: a
/// [`refresh_token`](crate::ResilientClient::refresh_token) that joins a running
/// fetch adds no `Requested` one.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenFetchReason {
    /// The client had no token yet (a
    /// [`refresh_token`](crate::ResilientClient::refresh_token) before any is
    /// `Requested`).
    First,
    /// A 401 answered a send that carried the token in use (or the fetch such a
    /// 401 asked for was abandoned, and a call needed a token the API had
    /// refused).
    Rejected,
    /// The token in use is near its expiry ([`REFRESH_AHEAD`](crate::auth::REFRESH_AHEAD),
    /// or its own [`renew_ahead`](crate::auth::AuthToken::renew_ahead)): renewed
    /// while calls go on sending it.
    Renewal,
    /// The token in use has expired: calls wait for a new one.
    Expired,
    /// [`ResilientClient::refresh_token`](crate::ResilientClient::refresh_token)
    /// asked for one.
    Requested,
}

impl TokenFetchReason {
    /// A stable snake_case name of the variant: `first`, `rejected`, `renewal`,
    /// `expired` or `requested`.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            TokenFetchReason::First => "first",
            TokenFetchReason::Rejected => "rejected",
            TokenFetchReason::Renewal => "renewal",
            TokenFetchReason::Expired => "expired",
            TokenFetchReason::Requested => "requested",
        }
    }
}

/// How a token fetch ended ([`EventKind::TokenFetchEnded`]).
///
/// Its `Debug` shows no text of the token source's error, as
/// [`ClientError`]'s shows none of its source: the error's `Display` is the
/// source's own text, to print where you choose.
#[non_exhaustive]
#[derive(Debug, Clone)]
pub enum TokenFetchOutcome {
    /// The source gave a token the client took.
    Fetched {
        /// The token's generation: the client's tokens are numbered from 1, one
        /// more for each token fetched.
        generation: u64,
        /// How long the token lives from the fetch's start, as the source said
        /// ([`AuthToken::expires_in`](crate::AuthToken::expires_in)); `None`: until
        /// the API refuses it.
        lifetime: Option<Duration>,
    },
    /// The fetch brought no token: the token source's error, or the client's
    /// refusal of what it gave (a header the request depends on, an empty value,
    /// a lifetime that ran out before the fetch ended).
    Failed {
        /// The error, as the calls that waited for the fetch share it.
        error: SharedAuthError,
    },
    /// Its caller gave the fetch up before it ended: the call (or the
    /// `refresh_token` future) was dropped, or the call's budget ran out (a source
    /// slower than the budgets, or that hangs, shows as these, under policies with
    /// a budget).
    Abandoned,
    /// A panic unwound through the fetch before it ended: the token source's own,
    /// most likely (a panic elsewhere in the task that held the fetching caller
    /// shows so too, as does the runtime's clock panicking as the fetch ends or is
    /// given up: then the event's time is a reading taken as the fetch's guard is
    /// dropped, or, if the clock panics there too, the fetch's start, with `ms` 0).
    Panicked,
}

impl TokenFetchOutcome {
    /// A stable snake_case name of the variant: `fetched`, `failed`, `abandoned`
    /// or `panicked`.
    #[must_use]
    pub const fn name(&self) -> &'static str {
        match self {
            TokenFetchOutcome::Fetched { .. } => "fetched",
            TokenFetchOutcome::Failed { .. } => "failed",
            TokenFetchOutcome::Abandoned => "abandoned",
            TokenFetchOutcome::Panicked => "panicked",
        }
    }
}

/// Identifies one call of one client (`execute` / `execute_with`), numbered from 1
/// per client (its clones share the numbering): two clients' calls can have the same
/// id, so an observer that hears several tells them apart by the API name as well.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CallId(pub u64);

/// One thing that happened, when it happened, and which call it belongs to.
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct TransportEvent {
    /// The runtime's clock reading the event stands for, never later than its
    /// emission: for `Started`, the reading at which the gate let the send through
    /// (taken before the request closure ran, or after a permit or rate wait), so
    /// neither the closure nor the callback counts into `ms`; for a send's outcome
    /// and what it caused (`Succeeded`, `Failed`, `RetryScheduled`, `Redialing`, a
    /// breaker transition), the reading at its response head, at the end of its
    /// error body or failure, or (a call that reads its body) at the end of its
    /// success body; for `TokenFetchEnded`, the reading as the fetch ended;
    /// otherwise the reading as the event was emitted.
    pub at: Instant,
    /// The call the event is about; `None` for events reported through
    /// `ResilientClient::report`, for `BreakerReset` and for `TokenFetchEnded`.
    pub call: Option<CallId>,
    /// The label of the call's policy ([`CallPolicy::with_label`]), the same on
    /// every event of the call; `None` for a call whose policy has none, and for
    /// events of no call.
    ///
    /// [`CallPolicy::with_label`]: crate::CallPolicy::with_label
    pub label: Option<&'static str>,
    /// What happened.
    pub kind: EventKind,
}

impl TransportEvent {
    /// An event of `kind` at `at` for `call`, with no label.
    #[must_use]
    pub fn new(at: Instant, call: Option<CallId>, kind: EventKind) -> Self {
        TransportEvent {
            at,
            call,
            label: None,
            kind,
        }
    }

    /// The event with `label` as its call's label.
    ///
    /// ```
    /// use vantage_api_pool::{CallId, EventKind, Instant, TransportEvent};
    ///
    /// let event = TransportEvent::new(Instant::ORIGIN, Some(CallId(1)), EventKind::BreakerClosed)
    ///     .with_label(Some("orders.list"));
    /// assert_eq!(event.label, Some("orders.list"));
    /// ```
    #[must_use]
    pub fn with_label(mut self, label: Option<&'static str>) -> Self {
        self.label = label;
        self
    }
}

/// What happened.
///
/// `send` numbers every trip through the transport of a call (1, 2, …, redials and
/// 401 replays included); `attempt` numbers attempts (a redial repeats the number of
/// the attempt it redials; a 401 replay is an attempt of its own, which spends no
/// retry: after one, a retry's `attempt` is two more than the number its
/// [retry-count header](crate::ClientBuilder::retry_count_header) carries, not
/// one). A synthetic pair numbers the attempt the refused send would have been.
#[non_exhaustive]
#[derive(Debug, Clone)]
pub enum EventKind {
    /// A send is about to leave (or a synthetic one stands for a call refused before
    /// sending: see [`EventKind::Failed::sent`]).
    Started {
        /// Send number within the call.
        send: u32,
        /// Attempt number within the call.
        attempt: u32,
    },
    /// The send got a response the call returns to its caller.
    Succeeded {
        /// Send number within the call.
        send: u32,
        /// Attempt number within the call.
        attempt: u32,
        /// The response status.
        status: StatusCode,
        /// Milliseconds from just before the send to the response head; for a call
        /// that reads its body ([`execute_read`](crate::ResilientClient::execute_read)),
        /// to the body's end.
        ms: u64,
        /// The response's `Content-Length`, when known; for a call that reads its
        /// body, the body's length.
        bytes: Option<u64>,
    },
    /// The send failed; the call may still retry.
    Failed {
        /// Send number within the call.
        send: u32,
        /// Attempt number within the call.
        attempt: u32,
        /// What went wrong, with the attempts made so far. On a call's last `Failed`,
        /// the same error the call returns.
        error: ClientError,
        /// Milliseconds from just before the send to the response head or failure
        /// (a failure in a success body's read included); 0 for a synthetic failure.
        ms: u64,
        /// `false` for a synthetic pair (fail-fast rejection, auth failure, budget
        /// ending at the gate or before the send, in its permit or rate wait, a
        /// request that could not be built), and for a send the transport refused
        /// with [`Config`](crate::TransportErrorKind::Config) before anything left
        /// (its `ms` is 0 too): filter these out of request-rate figures. `true` for
        /// every other send the transport was given, even one that reached nothing,
        /// such as a refused connection (the error's
        /// [`nothing_sent`](ClientError::nothing_sent) tells whether any send of the
        /// call so far can have reached the API).
        sent: bool,
    },
    /// The send ended with no outcome: the caller dropped the call's future while it
    /// was in flight, or a panic unwound through it (the transport's `send`, an
    /// observer's `Started`, the clock read after it); the call then ends
    /// [`Panicked`](CallOutcome::Panicked).
    Cancelled {
        /// Send number within the call.
        send: u32,
        /// Attempt number within the call.
        attempt: u32,
    },
    /// The send failed with `NotSent` and is sent again with no back-off (back
    /// through the gate and the send's waits: breaker, admission, auth token,
    /// permit, rate token).
    /// Sits between that send's `Failed` and the next `Started`.
    Redialing {
        /// The number the redial will have.
        send: u32,
        /// The attempt being redialed.
        attempt: u32,
    },
    /// The call will sleep `after` and then make attempt `attempt`.
    ///
    /// Its reason is the call's `Failed` just before it among that call's events
    /// (the same [`call`](TransportEvent::call); a breaker transition that failure
    /// caused may sit between): to log a retry with its reason, keep each call's
    /// latest `Failed`. No event marks a call's end (a call dropped in its back-off
    /// reports no event more): [`TransportObserver::on_call_end`] does, once per
    /// call, after its last event.
    RetryScheduled {
        /// The attempt number the retry will have.
        attempt: u32,
        /// The sleep before it, jitter included.
        after: Duration,
    },
    /// The breaker opened, or a probe failed and it stays open for a cooldown twice
    /// the last (at most the configured maximum: once there, the same again).
    BreakerOpened {
        /// How long it stays open.
        cooldown: Duration,
    },
    /// A success or a reachable answer closed the breaker.
    BreakerClosed,
    /// `ResilientClient::reset_breaker` closed an open or half-open breaker by hand.
    /// It carries no call (no send caused it) and may come at any point, between a
    /// call's events too.
    BreakerReset,
    /// A fetch of the client's token source ended: it brought a token, which
    /// calls send from now on; it failed, and the token in use, if there is one
    /// and it has not expired, stays in use (a failed renewal fails no call but
    /// a 401's replay that waited for it, which needed the newer token it was to
    /// bring; a failed first fetch, one for an expired token, or a 401's refresh
    /// ends the calls that waited for it, 401 replays included, with
    /// [`ErrorKind::Auth`](crate::ErrorKind::Auth), each with its synthetic
    /// `Started` + `Failed`); or its caller gave it up (was dropped, or its budget
    /// ran out first) or a panic unwound through it, and the next caller that
    /// needs a token fetches again. A fetch no caller gives up and that never
    /// ends (a source that hangs, under policies without a budget) reports
    /// nothing: [`token_fetches`](crate::ResilientClient::token_fetches) counts it
    /// from its start.
    ///
    /// It carries no call and no label, like `BreakerReset`, and may come at any
    /// point, between a call's events too: one fetch serves every call that waits
    /// for it, and [`refresh_token`](crate::ResilientClient::refresh_token) runs
    /// one outside any call. It is reported once the fetch's result is in place,
    /// before the calls that waited for it are woken; on a multi-thread runtime a
    /// call polled for a reason of its own (one that was not waiting, or one whose
    /// budget's timer fired) may already be sending the new token. Each fetch
    /// that started ends once, so once no fetch runs these events number a
    /// client's [`token_fetches`](crate::ResilientClient::token_fetches).
    TokenFetchEnded {
        /// Why the fetch ran.
        reason: TokenFetchReason,
        /// Milliseconds from the fetch's start to its end, on the runtime's clock.
        ms: u64,
        /// What it brought.
        outcome: TokenFetchOutcome,
    },
    /// Reported by a caller through `ResilientClient::report`: rows parsed from a
    /// response.
    RowsPulled {
        /// How many rows.
        n: u64,
    },
    /// Reported by a caller through `ResilientClient::report`: a write was acknowledged.
    WritePushed,
}

impl EventKind {
    /// A stable snake_case name of the variant, for logs and metrics.
    #[must_use]
    pub const fn name(&self) -> &'static str {
        match self {
            EventKind::Started { .. } => "started",
            EventKind::Succeeded { .. } => "succeeded",
            EventKind::Failed { .. } => "failed",
            EventKind::Cancelled { .. } => "cancelled",
            EventKind::Redialing { .. } => "redialing",
            EventKind::RetryScheduled { .. } => "retry_scheduled",
            EventKind::BreakerOpened { .. } => "breaker_opened",
            EventKind::BreakerClosed => "breaker_closed",
            EventKind::BreakerReset => "breaker_reset",
            EventKind::TokenFetchEnded { .. } => "token_fetch_ended",
            EventKind::RowsPulled { .. } => "rows_pulled",
            EventKind::WritePushed => "write_pushed",
        }
    }

    /// `(send, attempt)` for the per-send variants.
    #[must_use]
    pub const fn send_and_attempt(&self) -> Option<(u32, u32)> {
        match *self {
            EventKind::Started { send, attempt }
            | EventKind::Succeeded { send, attempt, .. }
            | EventKind::Failed { send, attempt, .. }
            | EventKind::Cancelled { send, attempt }
            | EventKind::Redialing { send, attempt } => Some((send, attempt)),
            _ => None,
        }
    }

    /// Whether this event ends a send (`Succeeded`, `Failed` or `Cancelled`).
    #[must_use]
    pub const fn is_terminal(&self) -> bool {
        matches!(
            self,
            EventKind::Succeeded { .. } | EventKind::Failed { .. } | EventKind::Cancelled { .. }
        )
    }
}

/// An observer that ignores every event.
#[derive(Debug, Clone, Copy, Default)]
pub struct NullObserver;

impl TransportObserver for NullObserver {
    fn on_event(&self, _api: &str, _event: &TransportEvent) {}
}

/// Hands every event to several observers, in the order given. A client takes one
/// observer; this is how it feeds both a [`HealthObserver`] and a `TracingObserver`
/// (feature `tracing`), say.
///
/// [`HealthObserver`]: crate::health::HealthObserver
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use vantage_api_pool::{Fanout, NullObserver, TransportObserver};
/// use vantage_api_pool::health::HealthObserver;
///
/// let health = Arc::new(HealthObserver::new(Duration::from_secs(60)));
/// // Observers of different types, with no casts:
/// let both = Arc::new(Fanout::default().with(health.clone()).with(Arc::new(NullObserver)));
/// // ClientBuilder::observer("orders-api", both)
/// // Or from trait objects you already hold:
/// let tracer: Arc<dyn TransportObserver> = Arc::new(NullObserver);
/// let also = Fanout::new([health as Arc<dyn TransportObserver>, tracer]);
/// # drop((both, also));
/// ```
#[derive(Clone, Default)]
pub struct Fanout {
    observers: Vec<Arc<dyn TransportObserver>>,
}

impl Fanout {
    /// Feeds `observers`, in this order.
    #[must_use]
    pub fn new(observers: impl IntoIterator<Item = Arc<dyn TransportObserver>>) -> Self {
        Fanout {
            observers: observers.into_iter().collect(),
        }
    }

    /// Feeds `observer` too, after the ones already here. Takes an observer of any
    /// type, so a fan-out of different types needs no `as Arc<dyn TransportObserver>`.
    #[must_use]
    pub fn with<O: TransportObserver + 'static>(mut self, observer: Arc<O>) -> Self {
        self.observers.push(observer);
        self
    }
}

impl std::fmt::Debug for Fanout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fanout")
            .field("observers", &self.observers.len())
            .finish()
    }
}

/// Every observer hears the event (or the attachment, or the call's end), in order, even when one
/// before it panics; the first panic then goes on (the others' are dropped).
impl TransportObserver for Fanout {
    fn on_event(&self, api: &str, event: &TransportEvent) {
        self.each(|observer| observer.on_event(api, event));
    }

    fn on_attach(&self, api: &str, at: Instant) {
        self.each(|observer| observer.on_attach(api, at));
    }

    fn on_call_end(&self, api: &str, end: &CallEnd) {
        self.each(|observer| observer.on_call_end(api, end));
    }
}

impl Fanout {
    /// Calls `tell` with every observer in order, then passes the first panic on.
    fn each(&self, tell: impl Fn(&dyn TransportObserver)) {
        let mut first_panic = None;
        for observer in &self.observers {
            let heard = AssertUnwindSafe(|| tell(&**observer));
            if let Err(panic) = std::panic::catch_unwind(heard) {
                first_panic.get_or_insert(panic);
            }
        }
        if let Some(panic) = first_panic {
            std::panic::resume_unwind(panic);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    #[cfg(not(target_arch = "wasm32"))]
    fn observer_objects_are_shareable_on_native() {
        fn assert_send_sync<T: Send + Sync>(_: &T) {}
        let obs: Arc<dyn TransportObserver> = Arc::new(NullObserver);
        assert_send_sync(&obs);
        obs.on_event(
            "api",
            &TransportEvent::new(Instant::ORIGIN, None, EventKind::WritePushed),
        );
    }

    #[test]
    fn a_fanout_feeds_each_observer_in_order() {
        #[derive(Default)]
        struct Log(Mutex<Vec<String>>);
        struct Named(&'static str, Arc<Log>);
        impl TransportObserver for Named {
            fn on_event(&self, api: &str, event: &TransportEvent) {
                let line = format!("{} {api} {}", self.0, event.kind.name());
                self.1.0.lock().unwrap().push(line);
            }
        }
        let log = Arc::new(Log::default());
        let fanout = Fanout::new([
            Arc::new(Named("a", log.clone())) as Arc<dyn TransportObserver>,
            Arc::new(Named("b", log.clone())),
        ]);
        assert_eq!(format!("{fanout:?}"), "Fanout { observers: 2 }");
        let event = TransportEvent::new(Instant::ORIGIN, None, EventKind::BreakerClosed);
        fanout.on_event("orders", &event);
        fanout.on_event("search", &event);
        assert_eq!(
            *log.0.lock().unwrap(),
            [
                "a orders breaker_closed",
                "b orders breaker_closed",
                "a search breaker_closed",
                "b search breaker_closed"
            ]
        );

        // `with` appends, after what `new` was given.
        log.0.lock().unwrap().clear();
        let fanout = fanout.with(Arc::new(Named("c", log.clone())));
        assert_eq!(format!("{fanout:?}"), "Fanout { observers: 3 }");
        fanout.on_event("orders", &event);
        assert_eq!(
            *log.0.lock().unwrap(),
            [
                "a orders breaker_closed",
                "b orders breaker_closed",
                "c orders breaker_closed"
            ]
        );
        assert_eq!(
            format!("{:?}", Fanout::default()),
            "Fanout { observers: 0 }"
        );
    }

    #[test]
    fn names_and_send_numbers() {
        let k = EventKind::Redialing {
            send: 2,
            attempt: 1,
        };
        assert_eq!(k.name(), "redialing");
        assert_eq!(k.send_and_attempt(), Some((2, 1)));
        assert!(!k.is_terminal());
        assert!(
            EventKind::Cancelled {
                send: 1,
                attempt: 1
            }
            .is_terminal()
        );
        assert_eq!(EventKind::BreakerClosed.send_and_attempt(), None);
    }

    #[test]
    fn token_fetch_reasons_have_their_snake_case_names() {
        let names = [
            TokenFetchReason::First,
            TokenFetchReason::Rejected,
            TokenFetchReason::Renewal,
            TokenFetchReason::Expired,
            TokenFetchReason::Requested,
        ]
        .map(TokenFetchReason::name);
        assert_eq!(
            names,
            ["first", "rejected", "renewal", "expired", "requested"]
        );
    }

    #[test]
    fn token_fetch_outcomes_have_their_snake_case_names() {
        let names = [
            TokenFetchOutcome::Fetched {
                generation: 1,
                lifetime: None,
            },
            TokenFetchOutcome::Failed {
                error: crate::AuthError::from("no").into(),
            },
            TokenFetchOutcome::Abandoned,
            TokenFetchOutcome::Panicked,
        ]
        .map(|outcome| outcome.name());
        assert_eq!(names, ["fetched", "failed", "abandoned", "panicked"]);
    }

    #[test]
    fn a_call_end_made_by_hand_keeps_each_number_where_it_was_given() {
        let began = Instant::from_nanos(1_000);
        let at = Instant::from_nanos(5_000);
        let end = CallEnd::new(CallId(7), began, at, 3, 2, CallOutcome::Cancelled);
        assert_eq!(end.call, CallId(7));
        assert_eq!((end.began, end.at), (began, at));
        assert_eq!((end.sends, end.attempts), (3, 2));
        assert_eq!(end.label, None);
        assert_eq!(end.elapsed(), Duration::from_nanos(4_000));
        assert_eq!(end.with_label(Some("list")).label, Some("list"));
    }

    #[test]
    #[cfg(panic = "unwind")]
    fn a_fanout_passes_on_the_first_panic_after_every_observer_heard() {
        struct Panics(&'static str);
        impl TransportObserver for Panics {
            fn on_event(&self, _: &str, _: &TransportEvent) {
                std::panic::panic_any(self.0);
            }
        }
        #[derive(Default)]
        struct Counts(std::sync::atomic::AtomicU32);
        impl TransportObserver for Counts {
            fn on_event(&self, _: &str, _: &TransportEvent) {
                self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let last = Arc::new(Counts::default());
        let fanout = Fanout::new([
            Arc::new(Panics("first")) as Arc<dyn TransportObserver>,
            Arc::new(Panics("second")),
            last.clone(),
        ]);
        let event = TransportEvent::new(Instant::ORIGIN, None, EventKind::BreakerClosed);
        let panic = std::panic::catch_unwind(AssertUnwindSafe(|| fanout.on_event("api", &event)))
            .expect_err("the panics go on");
        assert_eq!(panic.downcast_ref::<&'static str>(), Some(&"first"));
        assert_eq!(last.0.load(std::sync::atomic::Ordering::Relaxed), 1);
    }
}
