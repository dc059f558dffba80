//! [`RecordingObserver`]: keeps every event with its virtual timestamp and checks
//! the observer contract.
//!
//! # The contract, as [`RecordingObserver::check_contract`] checks it
//!
//! Calls are identified by (api name, [`CallId`]). Call ids are numbered per client,
//! so give each client that shares one `RecordingObserver` its own api name: two
//! clients under one key would mix their calls 1, 2, 3, ... and break rules they
//! both keep. A *per-send event* is `Started`,
//! `Succeeded`, `Failed`, `Cancelled` or `Redialing`; a *terminal* is `Succeeded`,
//! `Failed` or `Cancelled`. Other kinds (`RetryScheduled`, breaker events, reports)
//! are only checked where a rule names them. A call's end (reported through
//! [`TransportObserver::on_call_end`], kept beside the events: see
//! [`RecordingObserver::call_ends`]) is checked in its place among them.
//!
//! | rule ([`ContractRule`]) | what must hold |
//! |---|---|
//! | `TimeWentBackwards` | the `at` of one call's events never decreases, nor that of the events one thread reports for one api (so on a single-threaded executor, such as the testkit's, the `at` of all of an api's events) |
//! | `MissingCallId` | every per-send event and `RetryScheduled` carries a call id |
//! | `SendOutOfOrder` | a call's `Started` events number their sends 1, 2, 3, … |
//! | `StartedWhileInFlight` | a call starts a send only after its previous send's terminal |
//! | `TerminalWithoutStarted` | a terminal ends the send in flight: same send number, started before |
//! | `SecondTerminal` | a send has at most one terminal |
//! | `AttemptMismatch` | a call's first `Started` has attempt 1; a `Started` right after `Redialing` repeats the redialed attempt; any other `Started` (and a `RetryScheduled`) has the previous attempt + 1; a terminal has its `Started`'s attempt |
//! | `RedialNotAfterFailure` | `Redialing { send: s }` comes right after a `Failed` of send s − 1 (no per-send event or `RetryScheduled` between), with the same attempt, and that failure is `Transport(NotSent)` |
//! | `RedialNotFollowedByStart` | the next per-send event or `RetryScheduled` after `Redialing { send: s }`, if any, is `Started { send: s }` (none at all is fine: the caller may drop the call while the redial waits at the gate) |
//! | `RetryWhileInFlight` | `RetryScheduled` comes only while no send of the call is in flight |
//! | `RetryNotAfterFailure` | `RetryScheduled` comes right after a sent `Failed` of the call (not a second time, and never after a 401, which is replayed at once or final) |
//! | `RetryUnannounced` | a `Started` with the next attempt after a `Failed` comes after its `RetryScheduled`, unless that `Failed` was a 401 (a replay after a token refresh) |
//! | `SecondReplay` | a call replays a 401 at most once (its first; a later 401 is final) |
//! | `TooManyRedials` | a call redials at most [`MAX_REDIALS`] times (a later `NotSent` is taken as `Interrupted`) |
//! | `UnsentFailureWithTime` | a `Failed` with `sent: false` (a send refused before it went out) reports `ms: 0` |
//! | `EventAfterCallEnded` | after a call's `Succeeded`, `Cancelled` or `Failed` with `sent: false` (which always ends the call), no per-send event or `RetryScheduled` of that call |
//! | `TransitionNotAfterTerminal` | `BreakerOpened` and `BreakerClosed` carry the call whose send caused them and come right after that send's `Succeeded` or sent `Failed` (no event of the call between), one per send |
//! | `ReportWithCall` | `RowsPulled` and `WritePushed` (from `ResilientClient::report`) carry no call id, nor a label |
//! | `ResetWithCall` | `BreakerReset` (from `ResilientClient::reset_breaker`) carries no call id, nor a label; it may come at any point |
//! | `TokenFetchWithCall` | `TokenFetchEnded` (a token fetch that ended) carries no call id, nor a label; it may come at any point |
//! | `TokenGenerationRepeated` | the `TokenFetchEnded` events of an api that brought a token each bring another generation (one fetch is reported once) |
//! | `NeverEnded` | (end of the record) every `Started` has its terminal |
//! | `SecondCallEnd` | a call's end ([`TransportObserver::on_call_end`]) is reported once |
//! | `EventAfterCallEnd` | no event of a call (breaker transitions included) after its end |
//! | `CallEndMismatch` | a call's end agrees with its events: it comes with no send in flight; a `Succeeded` or `Failed` end comes with no retry or redial announced and not started; its `sends` and `attempts` are its last `Started`'s (0 with none); `Succeeded` carries the status and the `at` of the call's last terminal, a `Succeeded`; `Failed` carries the error (its `Display`) of the call's last terminal, a `Failed`; its `at` is no earlier than the call's last event, and its `began` no later than the call's first event or its own `at` |
//! | `CallNeverEnded` | (end of the record) every call that has an event has its end |
//! | `LabelChanged` | every event of a call (a breaker transition it caused included) and its end carry the same label ([`CallPolicy::with_label`](vantage_api_pool::CallPolicy::with_label)) |
//!
//! Whether the breaker's transitions alternate is not checked: two sends on two
//! threads can report theirs in either order. Across calls, time order is checked per
//! reporting thread: on a multi-thread runtime each task reads the clock and reports
//! on its own, so events of different calls reported from different threads can reach
//! an observer out of time order.
//!
//! ```
//! use std::sync::Arc;
//! use vantage_api_pool::TransportObserver;
//! use vantage_api_pool_testkit::RecordingObserver;
//!
//! let observer = RecordingObserver::new();
//! // Give the client a clone (`.observer("orders", Arc::new(observer.clone()))`),
//! // run the calls, then:
//! let for_client: Arc<dyn TransportObserver> = Arc::new(observer.clone());
//! # drop(for_client);
//! observer.check_contract()?;
//! # Ok::<(), vantage_api_pool_testkit::ContractViolation>(())
//! ```

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use http::StatusCode;
use vantage_api_pool::classify::MAX_REDIALS;
use vantage_api_pool::{
    CallEnd, CallId, CallOutcome, ErrorKind, EventKind, Instant, TokenFetchOutcome,
    TransportErrorKind, TransportEvent, TransportObserver,
};

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One event as the observer received it.
///
/// ```
/// use vantage_api_pool::{EventKind, Instant, TransportEvent, TransportObserver};
/// use vantage_api_pool_testkit::RecordingObserver;
///
/// let observer = RecordingObserver::new();
/// observer.on_event("billing", &TransportEvent::new(Instant::ORIGIN, None, EventKind::WritePushed));
/// let recorded = &observer.events()[0];
/// assert_eq!(&*recorded.api, "billing");
/// assert_eq!(recorded.event.kind.name(), "write_pushed");
/// ```
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct RecordedEvent {
    /// The api name of the client that emitted it.
    pub api: Arc<str>,
    /// The event.
    pub event: TransportEvent,
    /// The thread that reported it.
    pub thread: std::thread::ThreadId,
}

/// One call's end as the observer received it ([`TransportObserver::on_call_end`]).
///
/// ```
/// use vantage_api_pool::{CallOutcome, ResilientClient};
/// use vantage_api_pool_testkit::{RecordingObserver, Reply, ScriptedTransport, VirtualRuntime};
///
/// let rt = VirtualRuntime::new();
/// let transport = ScriptedTransport::new(&rt);
/// transport.push(Reply::status(404));
/// let observer = RecordingObserver::new();
/// let client = ResilientClient::builder(transport, rt.clone())
///     .observer("orders", std::sync::Arc::new(observer.clone()))
///     .build()?;
/// let _ = rt.block_on(client.execute(|r| r.get("/orders/7")));
/// let ended = &observer.call_ends()[0];
/// assert_eq!((&*ended.api, ended.after), ("orders", 2)); // after Started and Failed
/// assert!(matches!(ended.end.outcome, CallOutcome::Failed { .. }));
/// # Ok::<(), vantage_api_pool::ConfigError>(())
/// ```
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct RecordedCallEnd {
    /// The api name of the client that reported it.
    pub api: Arc<str>,
    /// The end.
    pub end: CallEnd,
    /// Its place among the events: how many were recorded before it.
    pub after: usize,
    /// The thread that reported it.
    pub thread: std::thread::ThreadId,
}

#[derive(Default)]
struct ObserverState {
    events: Vec<RecordedEvent>,
    ends: Vec<RecordedCallEnd>,
    last_api: Option<Arc<str>>,
}

impl ObserverState {
    /// `api`, sharing one allocation per run of the same key.
    fn api(&mut self, api: &str) -> Arc<str> {
        match &self.last_api {
            Some(last) if **last == *api => Arc::clone(last),
            _ => {
                let fresh: Arc<str> = Arc::from(api);
                self.last_api = Some(Arc::clone(&fresh));
                fresh
            }
        }
    }
}

#[derive(Default)]
struct ObserverShared {
    state: Mutex<ObserverState>,
    /// Recording switched off: events are only counted, without taking the lock.
    off: AtomicBool,
    seen: AtomicUsize,
}

/// A [`TransportObserver`] that keeps every `(api name, event)` in order.
///
/// Cheap to clone; clones share one record, so a test keeps a clone of the observer
/// it gave the client. `Send + Sync`. Recording can be switched off
/// ([`record`](RecordingObserver::record)) so a benchmark pays only a counter.
///
/// ```
/// use std::time::Duration;
/// use vantage_api_pool::{
///     CallEnd, CallId, CallOutcome, EventKind, Instant, TransportEvent, TransportObserver,
/// };
/// use vantage_api_pool_testkit::{ContractRule, RecordingObserver};
///
/// let observer = RecordingObserver::new();
/// let t = |ms| Instant::ORIGIN + Duration::from_millis(ms);
/// let call = Some(CallId(1));
/// observer.on_event("api", &TransportEvent::new(t(0), call, EventKind::Started { send: 1, attempt: 1 }));
/// observer.on_event("api", &TransportEvent::new(t(40), call, EventKind::Cancelled { send: 1, attempt: 1 }));
/// assert_eq!(observer.kinds(), ["started", "cancelled"]);
/// // Every call ends, after its events:
/// assert_eq!(observer.check_contract().unwrap_err().rule, ContractRule::CallNeverEnded);
/// let dropped = CallEnd::new(CallId(1), t(0), t(40), 1, 1, CallOutcome::Cancelled);
/// observer.on_call_end("api", &dropped);
/// assert!(observer.check_contract().is_ok());
/// ```
#[derive(Clone, Default)]
pub struct RecordingObserver {
    shared: Arc<ObserverShared>,
}

impl fmt::Debug for RecordingObserver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordingObserver")
            .field("events", &self.len())
            .field("seen", &self.seen())
            .field("recording", &!self.shared.off.load(Ordering::Relaxed))
            .finish()
    }
}

impl TransportObserver for RecordingObserver {
    fn on_event(&self, api: &str, event: &TransportEvent) {
        self.shared.seen.fetch_add(1, Ordering::Relaxed);
        if self.shared.off.load(Ordering::Relaxed) {
            return;
        }
        let mut state = self.state();
        let api = state.api(api);
        state.events.push(RecordedEvent {
            api,
            event: event.clone(),
            thread: crate::runtime::current_thread(),
        });
    }

    fn on_call_end(&self, api: &str, end: &CallEnd) {
        if self.shared.off.load(Ordering::Relaxed) {
            return;
        }
        let mut state = self.state();
        let api = state.api(api);
        let after = state.events.len();
        state.ends.push(RecordedCallEnd {
            api,
            end: end.clone(),
            after,
            thread: crate::runtime::current_thread(),
        });
    }
}

impl RecordingObserver {
    fn state(&self) -> MutexGuard<'_, ObserverState> {
        lock(&self.shared.state)
    }

    /// An empty observer, recording.
    ///
    /// ```
    /// use vantage_api_pool_testkit::RecordingObserver;
    /// assert!(RecordingObserver::new().is_empty());
    /// ```
    #[must_use]
    pub fn new() -> RecordingObserver {
        RecordingObserver::default()
    }

    /// Switches recording on or off (on by default). Off, events are only counted
    /// ([`seen`](RecordingObserver::seen)).
    ///
    /// ```
    /// use vantage_api_pool::{EventKind, Instant, TransportEvent, TransportObserver};
    /// use vantage_api_pool_testkit::RecordingObserver;
    /// let observer = RecordingObserver::new();
    /// observer.record(false);
    /// observer.on_event("api", &TransportEvent::new(Instant::ORIGIN, None, EventKind::BreakerClosed));
    /// assert_eq!((observer.len(), observer.seen()), (0, 1));
    /// ```
    pub fn record(&self, on: bool) -> &Self {
        self.shared.off.store(!on, Ordering::Relaxed);
        self
    }

    /// Every recorded event, in order.
    ///
    /// ```
    /// use vantage_api_pool_testkit::RecordingObserver;
    /// assert!(RecordingObserver::new().events().is_empty());
    /// ```
    #[must_use]
    pub fn events(&self) -> Vec<RecordedEvent> {
        self.state().events.clone()
    }

    /// Every recorded call end ([`TransportObserver::on_call_end`]), in order, each
    /// with its place among the [`events`](RecordingObserver::events).
    ///
    /// ```
    /// use vantage_api_pool_testkit::RecordingObserver;
    /// assert!(RecordingObserver::new().call_ends().is_empty());
    /// ```
    #[must_use]
    pub fn call_ends(&self) -> Vec<RecordedCallEnd> {
        self.state().ends.clone()
    }

    /// The recorded end of call `call` (of any api name; the first, if it has
    /// several), or `None` while it has none. With one observer over several
    /// clients, whose call ids repeat, ask
    /// [`api_call_end`](RecordingObserver::api_call_end).
    ///
    /// ```
    /// use vantage_api_pool::{CallId, ResilientClient};
    /// use vantage_api_pool_testkit::{RecordingObserver, Reply, ScriptedTransport, VirtualRuntime};
    ///
    /// let rt = VirtualRuntime::new();
    /// let transport = ScriptedTransport::new(&rt);
    /// transport.push(Reply::ok());
    /// let observer = RecordingObserver::new();
    /// let client = ResilientClient::builder(transport, rt.clone())
    ///     .observer("orders", std::sync::Arc::new(observer.clone()))
    ///     .build()?;
    /// let call = client.execute(|r| r.get("/orders"));
    /// let id = call.id();
    /// assert!(observer.call_end(id).is_none());
    /// rt.block_on(call).unwrap();
    /// assert_eq!(observer.call_end(id).unwrap().outcome.name(), "succeeded");
    /// # Ok::<(), vantage_api_pool::ConfigError>(())
    /// ```
    #[must_use]
    pub fn call_end(&self, call: CallId) -> Option<CallEnd> {
        self.end_where(|e| e.end.call == call)
    }

    /// The recorded end of call `call` of the client keyed `api` (as
    /// [`for_api_call`](RecordingObserver::for_api_call) picks events), or `None`
    /// while it has none.
    ///
    /// ```
    /// use vantage_api_pool::{CallEnd, CallId, CallOutcome, Instant, TransportObserver};
    /// use vantage_api_pool_testkit::RecordingObserver;
    ///
    /// let observer = RecordingObserver::new();
    /// let dropped = CallEnd::new(CallId(1), Instant::ORIGIN, Instant::ORIGIN, 0, 0, CallOutcome::Cancelled);
    /// observer.on_call_end("search-api", &dropped);
    /// assert!(observer.api_call_end("orders-api", CallId(1)).is_none());
    /// assert!(observer.api_call_end("search-api", CallId(1)).is_some());
    /// ```
    #[must_use]
    pub fn api_call_end(&self, api: &str, call: CallId) -> Option<CallEnd> {
        self.end_where(|e| e.end.call == call && &*e.api == api)
    }

    /// The first recorded end that `pick` picks.
    fn end_where(&self, pick: impl Fn(&RecordedCallEnd) -> bool) -> Option<CallEnd> {
        let state = self.state();
        state.ends.iter().find(|e| pick(e)).map(|e| e.end.clone())
    }

    /// The recorded events of call `call` (of any api name), in order. A call's id is
    /// its future's [`CallFuture::id`](vantage_api_pool::CallFuture::id). Ids are
    /// numbered per client: with one observer over several clients, two clients'
    /// calls can share one, so ask [`for_api_call`](RecordingObserver::for_api_call).
    ///
    /// ```
    /// use vantage_api_pool::{CallId, EventKind, Instant, TransportEvent, TransportObserver};
    /// use vantage_api_pool_testkit::RecordingObserver;
    /// let observer = RecordingObserver::new();
    /// for call in [1, 2, 1] {
    ///     observer.on_event("api", &TransportEvent::new(Instant::ORIGIN, Some(CallId(call)), EventKind::BreakerClosed));
    /// }
    /// assert_eq!(observer.for_call(CallId(1)).len(), 2);
    /// ```
    #[must_use]
    pub fn for_call(&self, call: CallId) -> Vec<TransportEvent> {
        self.events_where(|e| e.event.call == Some(call))
    }

    /// The recorded events of call `call` of the client keyed `api` (the name its
    /// builder's `observer` was given), in order: one call's events when one
    /// observer hears several clients, whose call ids repeat.
    ///
    /// ```
    /// use vantage_api_pool::{CallId, EventKind, Instant, TransportEvent, TransportObserver};
    /// use vantage_api_pool_testkit::RecordingObserver;
    /// let observer = RecordingObserver::new();
    /// for api in ["orders-api", "search-api", "orders-api"] {
    ///     observer.on_event(api, &TransportEvent::new(Instant::ORIGIN, Some(CallId(1)), EventKind::BreakerClosed));
    /// }
    /// assert_eq!(observer.for_call(CallId(1)).len(), 3);
    /// assert_eq!(observer.for_api_call("orders-api", CallId(1)).len(), 2);
    /// ```
    #[must_use]
    pub fn for_api_call(&self, api: &str, call: CallId) -> Vec<TransportEvent> {
        self.events_where(|e| e.event.call == Some(call) && &*e.api == api)
    }

    /// The recorded events that `keep` picks, in order.
    fn events_where(&self, keep: impl Fn(&RecordedEvent) -> bool) -> Vec<TransportEvent> {
        self.state()
            .events
            .iter()
            .filter(|e| keep(e))
            .map(|e| e.event.clone())
            .collect()
    }

    /// The names ([`EventKind::name`]) of the recorded events, in order.
    ///
    /// ```
    /// use vantage_api_pool::{EventKind, Instant, TransportEvent, TransportObserver};
    /// use vantage_api_pool_testkit::RecordingObserver;
    /// let observer = RecordingObserver::new();
    /// observer.on_event("api", &TransportEvent::new(Instant::ORIGIN, None, EventKind::RowsPulled { n: 5 }));
    /// assert_eq!(observer.kinds(), ["rows_pulled"]);
    /// ```
    #[must_use]
    pub fn kinds(&self) -> Vec<&'static str> {
        self.state()
            .events
            .iter()
            .map(|e| e.event.kind.name())
            .collect()
    }

    /// How many events are recorded.
    ///
    /// ```
    /// use vantage_api_pool_testkit::RecordingObserver;
    /// assert_eq!(RecordingObserver::new().len(), 0);
    /// ```
    #[must_use]
    pub fn len(&self) -> usize {
        self.state().events.len()
    }

    /// Whether no event is recorded.
    ///
    /// ```
    /// use vantage_api_pool_testkit::RecordingObserver;
    /// assert!(RecordingObserver::new().is_empty());
    /// ```
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.state().events.is_empty()
    }

    /// How many events were received, recorded or not, since creation (not reset by
    /// [`clear`](RecordingObserver::clear)).
    ///
    /// ```
    /// use vantage_api_pool_testkit::RecordingObserver;
    /// assert_eq!(RecordingObserver::new().seen(), 0);
    /// ```
    #[must_use]
    pub fn seen(&self) -> usize {
        self.shared.seen.load(Ordering::Relaxed)
    }

    /// Forgets the recorded events and call ends, and with them what the contract
    /// check knows:
    /// [`check_contract`](RecordingObserver::check_contract) afterwards sees only later
    /// events. So clear between calls. A call still in flight at the clear has its
    /// `Started` forgotten, and its terminal then breaks
    /// [`ContractRule::TerminalWithoutStarted`]. To keep a phase's verdict, check it
    /// ([`check_contract_so_far`](RecordingObserver::check_contract_so_far)) before
    /// clearing.
    ///
    /// ```
    /// use vantage_api_pool::{CallId, EventKind, Instant, TransportEvent, TransportObserver};
    /// use vantage_api_pool_testkit::{ContractRule, RecordingObserver};
    ///
    /// let observer = RecordingObserver::new();
    /// let event = |kind| TransportEvent::new(Instant::ORIGIN, Some(CallId(1)), kind);
    /// observer.on_event("api", &event(EventKind::Started { send: 1, attempt: 1 }));
    /// assert!(observer.check_contract_so_far().is_ok());
    /// observer.clear();
    /// assert!(observer.is_empty());
    /// // The call was in flight: its end now looks like the end of a send never started.
    /// observer.on_event("api", &event(EventKind::Cancelled { send: 1, attempt: 1 }));
    /// let broken = observer.check_contract().unwrap_err();
    /// assert_eq!(broken.rule, ContractRule::TerminalWithoutStarted);
    /// ```
    pub fn clear(&self) -> &Self {
        let mut state = self.state();
        state.events.clear();
        state.ends.clear();
        drop(state);
        self
    }

    /// Checks the recorded events against the observer contract (see the
    /// [module docs](crate::observer) for the rules) and names the first violation.
    /// Call it when every call has finished: a send still in flight is a violation
    /// ([`ContractRule::NeverEnded`]), and so is a call with events but no end
    /// ([`ContractRule::CallNeverEnded`]). For a check in the middle of a run, use
    /// [`check_contract_so_far`](RecordingObserver::check_contract_so_far).
    ///
    /// # Errors
    ///
    /// The first [`ContractViolation`], in event order.
    ///
    /// ```
    /// use vantage_api_pool::{CallId, EventKind, Instant, TransportEvent, TransportObserver};
    /// use vantage_api_pool_testkit::{ContractRule, RecordingObserver};
    ///
    /// let observer = RecordingObserver::new();
    /// let ev = |kind| TransportEvent::new(Instant::ORIGIN, Some(CallId(7)), kind);
    /// observer.on_event("api", &ev(EventKind::Started { send: 1, attempt: 1 }));
    /// observer.on_event("api", &ev(EventKind::Cancelled { send: 1, attempt: 1 }));
    /// observer.on_event("api", &ev(EventKind::Cancelled { send: 1, attempt: 1 }));
    /// let violation = observer.check_contract().unwrap_err();
    /// assert_eq!(violation.rule, ContractRule::SecondTerminal);
    /// assert_eq!((violation.index, violation.call, violation.send), (2, Some(CallId(7)), Some(1)));
    /// assert_eq!(
    ///     violation.to_string(),
    ///     "observer contract broken at event #2 (api `api`, call 7, send 1, cancelled at +0ns): \
    ///      a send has at most one terminal event"
    /// );
    /// ```
    pub fn check_contract(&self) -> Result<(), ContractViolation> {
        let state = self.state();
        check(&state.events, &state.ends, true)
    }

    /// [`check_contract`](RecordingObserver::check_contract) without the end-of-record
    /// rules: sends still in flight, and calls not yet ended, are fine.
    ///
    /// # Errors
    ///
    /// The first [`ContractViolation`], in event order.
    ///
    /// ```
    /// use vantage_api_pool::{CallId, EventKind, Instant, TransportEvent, TransportObserver};
    /// use vantage_api_pool_testkit::RecordingObserver;
    /// let observer = RecordingObserver::new();
    /// observer.on_event("api", &TransportEvent::new(
    ///     Instant::ORIGIN, Some(CallId(1)), EventKind::Started { send: 1, attempt: 1 }));
    /// assert!(observer.check_contract_so_far().is_ok());
    /// assert!(observer.check_contract().is_err());
    /// ```
    pub fn check_contract_so_far(&self) -> Result<(), ContractViolation> {
        let state = self.state();
        check(&state.events, &state.ends, false)
    }
}

/// Which rule of the observer contract an event broke. See the
/// [module docs](crate::observer) for the rules.
///
/// ```
/// use vantage_api_pool_testkit::ContractRule;
/// assert_eq!(ContractRule::NeverEnded.description(), "every Started has a terminal event");
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ContractRule {
    /// One call's events, or the events one thread reported for one api, went back
    /// in time.
    TimeWentBackwards,
    /// A per-send event or `RetryScheduled` without a call id.
    MissingCallId,
    /// A `Started` whose send number is not the call's previous one + 1.
    SendOutOfOrder,
    /// A `Started` while the call's previous send had no terminal yet.
    StartedWhileInFlight,
    /// A terminal for a send that was never started.
    TerminalWithoutStarted,
    /// A second terminal for the same send.
    SecondTerminal,
    /// An attempt number that does not follow.
    AttemptMismatch,
    /// A `Redialing` not right after a `Failed` of the previous send.
    RedialNotAfterFailure,
    /// A `Redialing` not followed by the `Started` of the send it announced.
    RedialNotFollowedByStart,
    /// A `RetryScheduled` while a send of the call was in flight.
    RetryWhileInFlight,
    /// A `RetryScheduled` not right after a sent `Failed` (a second one, or one after
    /// a 401).
    RetryNotAfterFailure,
    /// A retry's `Started` without the `RetryScheduled` that announces it.
    RetryUnannounced,
    /// A second `Started` of a call that replays a 401 without announcing a retry.
    SecondReplay,
    /// A `Redialing` past the call's free redials.
    TooManyRedials,
    /// A `Failed` with `sent: false` that reports time spent sending.
    UnsentFailureWithTime,
    /// A per-send event or `RetryScheduled` after the call's `Succeeded`, `Cancelled`
    /// or unsent `Failed`.
    EventAfterCallEnded,
    /// At the end of the record, a send without its terminal.
    NeverEnded,
    /// A `BreakerOpened` or `BreakerClosed` without a call, or not right after a
    /// `Succeeded` or sent `Failed` of its call.
    TransitionNotAfterTerminal,
    /// A `RowsPulled` or `WritePushed` with a call id.
    ReportWithCall,
    /// A `BreakerReset` with a call id.
    ResetWithCall,
    /// A `TokenFetchEnded` with a call id or a label.
    TokenFetchWithCall,
    /// A `TokenFetchEnded` that brought a generation an earlier one of its api brought.
    TokenGenerationRepeated,
    /// A call's second end.
    SecondCallEnd,
    /// An event of a call after its end.
    EventAfterCallEnd,
    /// A call's end that does not agree with its events.
    CallEndMismatch,
    /// At the end of the record, a call with events but no end.
    CallNeverEnded,
    /// An event or the end of a call with another label than the call's first event.
    LabelChanged,
}

impl ContractRule {
    /// The rule, in a few words.
    ///
    /// ```
    /// use vantage_api_pool_testkit::ContractRule;
    /// assert_eq!(
    ///     ContractRule::SendOutOfOrder.description(),
    ///     "a call numbers its sends 1, 2, 3, ... in order"
    /// );
    /// ```
    #[must_use]
    pub const fn description(self) -> &'static str {
        match self {
            ContractRule::TimeWentBackwards => {
                "the `at` of one call's events, and of one thread's events for one api, never decreases"
            }
            ContractRule::MissingCallId => "per-send events and RetryScheduled carry a call id",
            ContractRule::SendOutOfOrder => "a call numbers its sends 1, 2, 3, ... in order",
            ContractRule::StartedWhileInFlight => {
                "a call starts a send only after its previous send ended"
            }
            ContractRule::TerminalWithoutStarted => {
                "a terminal event ends the send in flight, which must have started"
            }
            ContractRule::SecondTerminal => "a send has at most one terminal event",
            ContractRule::AttemptMismatch => {
                "attempts number 1, 2, 3, ...; a redial repeats its attempt; a terminal has its Started's attempt"
            }
            ContractRule::RedialNotAfterFailure => {
                "Redialing comes right after a NotSent Failed of the previous send, with its attempt"
            }
            ContractRule::RedialNotFollowedByStart => {
                "Redialing is followed by the Started of the send it announced"
            }
            ContractRule::RetryWhileInFlight => {
                "RetryScheduled comes only when no send is in flight"
            }
            ContractRule::RetryNotAfterFailure => {
                "RetryScheduled comes once, right after a sent Failed that is not a 401"
            }
            ContractRule::RetryUnannounced => {
                "a retry starts after its RetryScheduled (only a 401 replay needs none)"
            }
            ContractRule::SecondReplay => "a call replays a 401 at most once",
            ContractRule::TooManyRedials => "a call redials at most twice",
            ContractRule::UnsentFailureWithTime => "a Failed with sent: false reports ms 0",
            ContractRule::EventAfterCallEnded => {
                "nothing is sent or scheduled for a call after its Succeeded, Cancelled or unsent Failed"
            }
            ContractRule::NeverEnded => "every Started has a terminal event",
            ContractRule::TransitionNotAfterTerminal => {
                "a breaker transition comes right after the Succeeded or sent Failed of the send that caused it, with its call"
            }
            ContractRule::ReportWithCall => "RowsPulled and WritePushed carry no call id nor label",
            ContractRule::ResetWithCall => "BreakerReset carries no call id nor label",
            ContractRule::TokenFetchWithCall => "TokenFetchEnded carries no call id nor label",
            ContractRule::TokenGenerationRepeated => {
                "each token fetch that brought a token brings a generation of its own"
            }
            ContractRule::SecondCallEnd => "a call's end is reported once",
            ContractRule::EventAfterCallEnd => "no event of a call comes after its end",
            ContractRule::CallEndMismatch => {
                "a call's end agrees with its events: no send in flight, its last Started's numbers, its last terminal's outcome, no earlier than its events"
            }
            ContractRule::CallNeverEnded => "every call that has an event has its end",
            ContractRule::LabelChanged => "a call's events and its end carry one label",
        }
    }
}

impl fmt::Display for ContractRule {
    /// The [`description`](ContractRule::description).
    ///
    /// ```
    /// use vantage_api_pool_testkit::ContractRule;
    /// assert_eq!(ContractRule::SecondTerminal.to_string(), "a send has at most one terminal event");
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.description())
    }
}

/// The first event that broke the observer contract.
///
/// ```
/// use vantage_api_pool::{CallId, EventKind, Instant, TransportEvent, TransportObserver};
/// use vantage_api_pool_testkit::{ContractRule, RecordingObserver};
///
/// let observer = RecordingObserver::new();
/// observer.on_event("api", &TransportEvent::new(
///     Instant::ORIGIN, Some(CallId(3)), EventKind::Started { send: 2, attempt: 1 }));
/// let v = observer.check_contract().unwrap_err();
/// assert_eq!((v.index, v.rule), (0, ContractRule::SendOutOfOrder));
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContractViolation {
    /// The position of the offending event in [`RecordingObserver::events`]. For
    /// [`ContractRule::NeverEnded`], the `Started` left open. For a call's end
    /// ([`SecondCallEnd`](ContractRule::SecondCallEnd),
    /// [`CallEndMismatch`](ContractRule::CallEndMismatch)), its place among the
    /// events ([`RecordedCallEnd::after`]); for
    /// [`CallNeverEnded`](ContractRule::CallNeverEnded), the call's first event.
    pub index: usize,
    /// The api name of the offending event.
    pub api: Arc<str>,
    /// The call of the offending event, if it has one.
    pub call: Option<CallId>,
    /// The send number of the offending event, if it has one.
    pub send: Option<u32>,
    /// The offending event's kind ([`EventKind::name`]); `call_end` for a call's
    /// end.
    pub kind: &'static str,
    /// The offending event's time.
    pub at: Instant,
    /// The rule broken.
    pub rule: ContractRule,
}

impl fmt::Display for ContractViolation {
    /// ```
    /// use vantage_api_pool::{CallId, EventKind, Instant, TransportEvent, TransportObserver};
    /// use vantage_api_pool_testkit::RecordingObserver;
    /// let observer = RecordingObserver::new();
    /// observer.on_event("api", &TransportEvent::new(
    ///     Instant::ORIGIN, Some(CallId(1)), EventKind::Started { send: 1, attempt: 1 }));
    /// assert_eq!(
    ///     observer.check_contract().unwrap_err().to_string(),
    ///     "observer contract broken at event #0 (api `api`, call 1, send 1, started at +0ns): \
    ///      every Started has a terminal event"
    /// );
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "observer contract broken at event #{} (api `{}`",
            self.index, self.api
        )?;
        if let Some(CallId(call)) = self.call {
            write!(f, ", call {call}")?;
        }
        if let Some(send) = self.send {
            write!(f, ", send {send}")?;
        }
        write!(
            f,
            ", {} at +{:?}): {}",
            self.kind,
            self.at.since_origin(),
            self.rule.description()
        )
    }
}

impl std::error::Error for ContractViolation {}

/// A call's last `Failed`, as far as the rules after it care.
#[derive(Clone, Copy)]
struct LastFailed {
    send: u32,
    attempt: u32,
    /// The failure was `Transport(NotSent)`: the only one that is redialed.
    not_sent: bool,
    /// The failure was a 401: replayed at once or final, never scheduled for a retry.
    unauthorized: bool,
}

/// What the checker knows about one call.
#[derive(Default)]
struct CallState {
    /// Highest send number started.
    last_send: u32,
    /// Attempt of the last `Started`.
    last_attempt: u32,
    /// The send in flight: (send, attempt, index of its `Started`).
    in_flight: Option<(u32, u32, usize)>,
    /// The last per-send event, when it was a (sent) `Failed`.
    last_failed: Option<LastFailed>,
    /// A `RetryScheduled` came after the last `Failed`.
    retry_announced: bool,
    /// A `Redialing` waiting for its `Started`: (send, attempt).
    redial: Option<(u32, u32)>,
    /// `Redialing` events so far.
    redials: u32,
    /// A 401 was replayed.
    replayed: bool,
    /// The call ended: `Succeeded`, `Cancelled` or an unsent `Failed`.
    ended: bool,
    /// The call's last event was a `Succeeded` or a sent `Failed`, with no breaker
    /// transition after it yet: one may come now.
    transition_due: bool,
    /// The index of the call's first event.
    first: Option<usize>,
    /// The index of the call's last terminal.
    last_terminal: Option<usize>,
    /// The call's end was reported.
    end_reported: bool,
    /// The label of the call's first event.
    label: Option<Option<&'static str>>,
}

impl CallState {
    /// Whether `label` is the call's, the first one seen becoming it.
    fn keeps_label(&mut self, label: Option<&'static str>) -> bool {
        *self.label.get_or_insert(label) == label
    }
}

/// Whether a call's end agrees with what its events (`state`, `None` with none;
/// `latest`, the time of the latest) said.
fn end_agrees(
    events: &[RecordedEvent],
    state: Option<&CallState>,
    latest: Option<Instant>,
    end: &CallEnd,
) -> bool {
    if end.began > end.at {
        return false;
    }
    let Some(state) = state else {
        // No event: dropped before its first `Started`.
        return matches!(end.outcome, CallOutcome::Cancelled | CallOutcome::Panicked)
            && (end.sends, end.attempts) == (0, 0);
    };
    if state.in_flight.is_some()
        || (end.sends, end.attempts) != (state.last_send, state.last_attempt)
        || latest.is_some_and(|latest| end.at < latest)
        || state
            .first
            .is_some_and(|first| end.began > events[first].event.at)
    {
        return false;
    }
    // A retry or a redial announced and not yet started: only a drop ends the call
    // there (a refusal would report its own pair first).
    let announced = state.retry_announced || state.redial.is_some();
    let last = state.last_terminal.map(|index| &events[index].event);
    match (&end.outcome, last) {
        (CallOutcome::Cancelled | CallOutcome::Panicked, _) => true,
        _ if announced => false,
        (CallOutcome::Succeeded { status }, Some(last)) => {
            matches!(last.kind, EventKind::Succeeded { status: s, .. } if s == *status)
                && end.at == last.at
        }
        (CallOutcome::Failed { error }, Some(last)) => {
            matches!(&last.kind, EventKind::Failed { error: e, .. } if e.to_string() == error.to_string())
        }
        _ => false,
    }
}

fn check<'a>(
    events: &'a [RecordedEvent],
    ends: &'a [RecordedCallEnd],
    complete: bool,
) -> Result<(), ContractViolation> {
    // Per call, the time of its latest event (it never goes back).
    let mut last_at: HashMap<(&'a str, CallId), Instant> = HashMap::new();
    let mut last_on_thread: HashMap<(&str, std::thread::ThreadId), Instant> = HashMap::new();
    let mut calls: HashMap<(&'a str, CallId), CallState> = HashMap::new();
    // Per api, the token generations its fetches brought.
    let mut generations: HashSet<(&'a str, u64)> = HashSet::new();
    let mut ends = ends.iter().peekable();
    // The ends recorded before event `index` (all that are left, at the end of the
    // record), checked in their place.
    let mut check_ends = |index: usize,
                          calls: &mut HashMap<(&'a str, CallId), CallState>,
                          last_at: &HashMap<(&'a str, CallId), Instant>|
     -> Result<(), ContractViolation> {
        while let Some(ended) = ends.next_if(|e| e.after <= index) {
            let end = &ended.end;
            let key = (&*ended.api, end.call);
            let violation = |rule| ContractViolation {
                index: ended.after,
                api: Arc::clone(&ended.api),
                call: Some(end.call),
                send: None,
                kind: "call_end",
                at: end.at,
                rule,
            };
            let state = calls.get(&key);
            if state.is_some_and(|state| state.end_reported) {
                return Err(violation(ContractRule::SecondCallEnd));
            }
            if !end_agrees(events, state, last_at.get(&key).copied(), end) {
                return Err(violation(ContractRule::CallEndMismatch));
            }
            let state = calls.entry(key).or_default();
            if !state.keeps_label(end.label) {
                return Err(violation(ContractRule::LabelChanged));
            }
            state.end_reported = true;
        }
        Ok(())
    };
    for (index, recorded) in events.iter().enumerate() {
        check_ends(index, &mut calls, &last_at)?;
        let event = &recorded.event;
        let api: &str = &recorded.api;
        let violation = |rule: ContractRule| violation_at(events, index, rule);

        let went_back = |previous: &mut Instant| {
            let back = event.at < *previous;
            *previous = (*previous).max(event.at);
            back
        };
        if went_back(
            last_on_thread
                .entry((api, recorded.thread))
                .or_insert(event.at),
        ) || event
            .call
            .is_some_and(|call| went_back(last_at.entry((api, call)).or_insert(event.at)))
        {
            return Err(violation(ContractRule::TimeWentBackwards));
        }
        // (A report, a reset or a token fetch with a call breaks a rule of its own,
        // below.)
        let own_rule = matches!(
            event.kind,
            EventKind::RowsPulled { .. }
                | EventKind::WritePushed
                | EventKind::BreakerReset
                | EventKind::TokenFetchEnded { .. }
        );
        if !own_rule
            && event
                .call
                .and_then(|call| calls.get(&(api, call)))
                .is_some_and(|state| state.end_reported)
        {
            return Err(violation(ContractRule::EventAfterCallEnd));
        }

        match event.kind {
            EventKind::BreakerOpened { .. } | EventKind::BreakerClosed => {
                let mut state = event.call.and_then(|call| calls.get_mut(&(api, call)));
                let due = state
                    .as_mut()
                    .is_some_and(|state| std::mem::take(&mut state.transition_due));
                if !due {
                    return Err(violation(ContractRule::TransitionNotAfterTerminal));
                }
                if state.is_some_and(|state| !state.keeps_label(event.label)) {
                    return Err(violation(ContractRule::LabelChanged));
                }
                continue;
            }
            EventKind::RowsPulled { .. } | EventKind::WritePushed => {
                if event.call.is_some() || event.label.is_some() {
                    return Err(violation(ContractRule::ReportWithCall));
                }
                continue;
            }
            // A reset by hand: no send caused it, so it may come anywhere.
            EventKind::BreakerReset => {
                if event.call.is_some() || event.label.is_some() {
                    return Err(violation(ContractRule::ResetWithCall));
                }
                continue;
            }
            // One fetch serves every call that waited for it: it may come anywhere.
            EventKind::TokenFetchEnded { ref outcome, .. } => {
                if event.call.is_some() || event.label.is_some() {
                    return Err(violation(ContractRule::TokenFetchWithCall));
                }
                if let TokenFetchOutcome::Fetched { generation, .. } = outcome
                    && !generations.insert((api, *generation))
                {
                    return Err(violation(ContractRule::TokenGenerationRepeated));
                }
                continue;
            }
            _ => {}
        }
        let per_send = event.kind.send_and_attempt().is_some();
        let retry = matches!(event.kind, EventKind::RetryScheduled { .. });
        if !per_send && !retry {
            continue;
        }
        let Some(call) = event.call else {
            return Err(violation(ContractRule::MissingCallId));
        };
        let state = calls.entry((api, call)).or_default();
        if !state.keeps_label(event.label) {
            return Err(violation(ContractRule::LabelChanged));
        }
        state.first.get_or_insert(index);
        // A repeated terminal of the last send is reported as such, not as "after the end".
        let repeats_terminal = event.kind.is_terminal()
            && event
                .kind
                .send_and_attempt()
                .is_some_and(|(send, _)| send >= 1 && send <= state.last_send);
        if state.ended && !repeats_terminal {
            return Err(violation(ContractRule::EventAfterCallEnded));
        }
        state.transition_due = false;
        if let Some((redial_send, _)) = state.redial
            && !matches!(event.kind, EventKind::Started { send, .. } if send == redial_send)
        {
            return Err(violation(ContractRule::RedialNotFollowedByStart));
        }
        match event.kind {
            EventKind::Started { send, attempt } => {
                if state.in_flight.is_some() {
                    return Err(violation(ContractRule::StartedWhileInFlight));
                }
                if send != state.last_send.wrapping_add(1) {
                    return Err(violation(ContractRule::SendOutOfOrder));
                }
                let expected = match state.redial.take() {
                    Some((_, redialed)) => redialed,
                    None => state.last_attempt.wrapping_add(1),
                };
                if attempt != expected {
                    return Err(violation(ContractRule::AttemptMismatch));
                }
                // Not a redial and not the first send: the previous send failed, and
                // this is its retry (or the replay after a 401).
                if send > 1 && expected != state.last_attempt && !state.retry_announced {
                    if !state.last_failed.is_some_and(|failed| failed.unauthorized) {
                        return Err(violation(ContractRule::RetryUnannounced));
                    }
                    if std::mem::replace(&mut state.replayed, true) {
                        return Err(violation(ContractRule::SecondReplay));
                    }
                }
                state.last_send = send;
                state.last_attempt = attempt;
                state.in_flight = Some((send, attempt, index));
                state.last_failed = None;
                state.retry_announced = false;
            }
            EventKind::Succeeded { send, attempt, .. }
            | EventKind::Failed { send, attempt, .. }
            | EventKind::Cancelled { send, attempt } => {
                match state.in_flight {
                    Some((open, open_attempt, _)) if open == send => {
                        if attempt != open_attempt {
                            return Err(violation(ContractRule::AttemptMismatch));
                        }
                    }
                    Some((open, _, _)) if send < open => {
                        return Err(violation(ContractRule::SecondTerminal));
                    }
                    None if send >= 1 && send <= state.last_send => {
                        return Err(violation(ContractRule::SecondTerminal));
                    }
                    _ => return Err(violation(ContractRule::TerminalWithoutStarted)),
                }
                state.in_flight = None;
                state.last_failed = None;
                state.last_terminal = Some(index);
                match &event.kind {
                    EventKind::Failed {
                        sent: false, ms, ..
                    } => {
                        if *ms != 0 {
                            return Err(violation(ContractRule::UnsentFailureWithTime));
                        }
                        state.ended = true;
                    }
                    EventKind::Failed { error, .. } => {
                        state.last_failed = Some(LastFailed {
                            send,
                            attempt,
                            not_sent: error.kind()
                                == ErrorKind::Transport(TransportErrorKind::NotSent),
                            unauthorized: error.status() == Some(StatusCode::UNAUTHORIZED),
                        });
                    }
                    _ => state.ended = true,
                }
                state.transition_due = matches!(
                    event.kind,
                    EventKind::Succeeded { .. } | EventKind::Failed { sent: true, .. }
                );
            }
            EventKind::Redialing { send, attempt } => {
                match state.last_failed {
                    Some(failed)
                        if failed.send.wrapping_add(1) == send
                            && failed.not_sent
                            && !state.retry_announced =>
                    {
                        if attempt != failed.attempt {
                            return Err(violation(ContractRule::AttemptMismatch));
                        }
                    }
                    _ => return Err(violation(ContractRule::RedialNotAfterFailure)),
                }
                state.redials = state.redials.saturating_add(1);
                if state.redials > MAX_REDIALS {
                    return Err(violation(ContractRule::TooManyRedials));
                }
                state.last_failed = None;
                state.redial = Some((send, attempt));
            }
            EventKind::RetryScheduled { attempt, .. } => {
                if state.in_flight.is_some() {
                    return Err(violation(ContractRule::RetryWhileInFlight));
                }
                match state.last_failed {
                    Some(failed) if !failed.unauthorized && !state.retry_announced => {}
                    _ => return Err(violation(ContractRule::RetryNotAfterFailure)),
                }
                if attempt != state.last_attempt.wrapping_add(1) {
                    return Err(violation(ContractRule::AttemptMismatch));
                }
                state.retry_announced = true;
            }
            _ => {}
        }
    }
    check_ends(events.len(), &mut calls, &last_at)?;
    if complete {
        // The earliest open send, so the report is deterministic. A redial still
        // waiting for its `Started` is not open: its call may have been dropped at
        // the gate, where no send is in flight to be cancelled.
        let open = calls
            .values()
            .filter_map(|state| state.in_flight.map(|(_, _, index)| index))
            .min();
        if let Some(index) = open {
            return Err(violation_at(events, index, ContractRule::NeverEnded));
        }
        // The call whose first event came earliest, of those with no end.
        let unended = calls
            .values()
            .filter(|state| !state.end_reported)
            .filter_map(|state| state.first)
            .min();
        if let Some(index) = unended {
            return Err(violation_at(events, index, ContractRule::CallNeverEnded));
        }
    }
    Ok(())
}

/// A violation of `rule` named by the event at `index`.
fn violation_at(events: &[RecordedEvent], index: usize, rule: ContractRule) -> ContractViolation {
    let recorded = &events[index];
    ContractViolation {
        index,
        api: Arc::clone(&recorded.api),
        call: recorded.event.call,
        send: recorded.event.kind.send_and_attempt().map(|(send, _)| send),
        kind: recorded.event.kind.name(),
        at: recorded.event.at,
        rule,
    }
}
