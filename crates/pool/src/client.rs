//! `ResilientClient`: one client per remote API, cheap to clone.

use std::borrow::Borrow;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, StatusCode};
use pin_project_lite::pin_project;

use crate::attempt::{AtHead, Call, Ending, ReadBody};
use crate::auth::{
    AuthError, AuthState, FetchEnded, FetchEnv, NoAuth, SharedAuthError, TokenSource,
};
use crate::breaker::{BreakerState, CircuitBreaker};
use crate::builder::ClientBuilder;
use crate::concurrency::Limiter;
use crate::error::ClientError;
use crate::observer::{CallEnd, CallId, EventKind, TransportEvent, TransportObserver};
use crate::policy::CallPolicy;
use crate::rate::TokenBucket;
use crate::runtime::Runtime;
use crate::time::{Instant, millis_between};
use crate::transport::{Transport, TransportResponse};

/// One resilient HTTP client for one remote API.
///
/// It owns what is decided per API: the transport and runtime it runs on, the default
/// retry schedule, and what the rest of the process is told through the observer.
/// Calls hand it a request closure and a [`CallPolicy`] and await a response.
///
/// Cloning is cheap (one `Arc`); clones share everything. The client is `Send + Sync`
/// when its transport, runtime and token source are, and the futures of
/// [`execute_with`](ResilientClient::execute_with) are `Send` when theirs are.
///
/// ```
/// use vantage_api_pool::{CallPolicy, ResilientClient};
/// use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
///
/// let rt = VirtualRuntime::new();
/// let transport = ScriptedTransport::new(&rt);
/// transport.push(Reply::status(503));
/// transport.push(Reply::ok());
/// let client = ResilientClient::builder(transport, rt.clone()).build()?;
///
/// let response = rt.block_on(client.execute(|http| http.get("/orders")))?;
/// assert_eq!(response?.status(), 200);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ResilientClient<T, R, A = NoAuth> {
    pub(crate) shared: Arc<Shared<T, R, A>>,
}

impl<T, R, A> Clone for ResilientClient<T, R, A> {
    fn clone(&self) -> Self {
        ResilientClient {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<T, R, A> fmt::Debug for ResilientClient<T, R, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResilientClient")
            .field("api", &self.shared.events.key())
            .field("default_policy", &self.shared.default_policy)
            .finish_non_exhaustive()
    }
}

/// Everything clones of one client share.
pub(crate) struct Shared<T, R, A> {
    pub(crate) transport: T,
    pub(crate) runtime: R,
    pub(crate) auth: A,
    pub(crate) auth_state: AuthState,
    pub(crate) default_policy: CallPolicy,
    pub(crate) request_id_header: HeaderName,
    pub(crate) retry_count_header: Option<HeaderName>,
    pub(crate) events: Events,
    pub(crate) breaker: Option<CircuitBreaker>,
    pub(crate) bucket: Option<TokenBucket>,
    pub(crate) limiter: Limiter,
    pub(crate) next_call: AtomicU64,
}

impl<T, R, A> Shared<T, R, A> {
    /// The request id among a response's `headers`, under the configured header
    /// name: `None` when it is missing or not visible ASCII. Errors and successes
    /// read it alike.
    pub(crate) fn request_id_in<'h>(&self, headers: &'h http::HeaderMap) -> Option<&'h str> {
        headers
            .get(&self.request_id_header)
            .and_then(|value| value.to_str().ok())
    }
}

impl<T, R: Runtime, A> Shared<T, R, A> {
    /// What the auth state's fetches need of this client.
    pub(crate) fn fetch_env(&self) -> ClientFetchEnv<'_, R> {
        ClientFetchEnv {
            runtime: &self.runtime,
            events: &self.events,
        }
    }
}

/// A client's side of its token fetches: its runtime's clock, and its observer,
/// which hears of each fetch that ends as a `TokenFetchEnded` with no call.
pub(crate) struct ClientFetchEnv<'a, R> {
    runtime: &'a R,
    events: &'a Events,
}

impl<R: Runtime> FetchEnv for ClientFetchEnv<'_, R> {
    fn now(&self) -> Instant {
        self.runtime.now()
    }

    /// Reported from `FetchGuard`'s drop too, when a fetch is abandoned.
    fn fetched(&self, ended: FetchEnded) {
        let at = ended.ended;
        self.events.emit_from_drop(
            || at,
            None,
            || EventKind::TokenFetchEnded {
                reason: ended.reason,
                ms: millis_between(at, ended.started),
                outcome: ended.outcome,
            },
        );
    }
}

/// Runs `report` (a call into the observer) from a destructor. While a panic
/// unwinds (an observer's, or one from the caller's own code), a second panic from
/// the observer is caught and dropped: out of a destructor it would abort the
/// process, and the first one goes on to the caller.
pub(crate) fn report_from_drop(report: impl FnOnce()) {
    if std::thread::panicking() {
        let _second_panic = std::panic::catch_unwind(AssertUnwindSafe(report));
    } else {
        report();
    }
}

/// Makes a report from a destructor at a reading of `now`, through
/// [`report_from_drop`]. A clock that panics there is caught and `fallback` (a
/// reading the caller kept) stands in, so the report is still made (`report` is told
/// the clock panicked); that panic then goes on, unless one already unwinds (a
/// second out of a destructor would abort the process).
#[cold]
pub(crate) fn report_at_drop(
    now: impl FnOnce() -> Instant,
    fallback: Instant,
    report: impl FnOnce(Instant, bool),
) {
    let reading = std::panic::catch_unwind(AssertUnwindSafe(now));
    let at = *reading.as_ref().unwrap_or(&fallback);
    report_from_drop(|| report(at, reading.is_err()));
    if let Err(clock_panic) = reading
        && !std::thread::panicking()
    {
        std::panic::resume_unwind(clock_panic);
    }
}

/// What an event of a call says of it: its id and its policy's label.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CallTag {
    pub(crate) id: CallId,
    pub(crate) label: Option<&'static str>,
}

/// The observer, if any, and the key it is given.
pub(crate) struct Events {
    sink: Option<(Arc<str>, Arc<dyn TransportObserver>)>,
}

impl Events {
    pub(crate) fn new(sink: Option<(Arc<str>, Arc<dyn TransportObserver>)>) -> Self {
        Events { sink }
    }

    /// Whether an observer listens.
    pub(crate) fn is_listening(&self) -> bool {
        self.sink.is_some()
    }

    pub(crate) fn key(&self) -> Option<&str> {
        self.sink.as_ref().map(|(k, _)| &**k)
    }

    /// Reports an event built by `kind`, which runs only when an observer listens.
    #[inline(always)]
    pub(crate) fn emit(
        &self,
        at: impl FnOnce() -> Instant,
        call: Option<CallTag>,
        kind: impl FnOnce() -> EventKind,
    ) {
        if let Some((key, observer)) = &self.sink {
            let event = TransportEvent {
                at: at(),
                call: call.map(|c| c.id),
                label: call.and_then(|c| c.label),
                kind: kind(),
            };
            observer.on_event(key, &event);
        }
    }

    /// [`emit`](Self::emit) from a destructor: see [`report_from_drop`].
    pub(crate) fn emit_from_drop(
        &self,
        at: impl FnOnce() -> Instant,
        call: Option<CallTag>,
        kind: impl FnOnce() -> EventKind,
    ) {
        report_from_drop(|| self.emit(at, call, kind));
    }

    /// Reports a call's end, to an observer if one listens. Built by the caller,
    /// which knows one does (a closure holding its outcome would be a copy of it).
    #[inline]
    pub(crate) fn end(&self, end: &CallEnd) {
        if let Some((key, observer)) = &self.sink {
            observer.on_call_end(key, end);
        }
    }
}

pin_project! {
    /// The future of one call ([`execute`](ResilientClient::execute),
    /// [`execute_with`](ResilientClient::execute_with),
    /// [`execute_with_owned`](ResilientClient::execute_with_owned),
    /// [`into_call`](ResilientClient::into_call),
    /// [`into_call_with`](ResilientClient::into_call_with)): it resolves to
    /// the response or the call's [`ClientError`], and knows the call's
    /// [`id`](CallFuture::id) from the start.
    ///
    /// Dropping it cancels the call. It is `Send` when the call's work is (the
    /// transport's, runtime's and token source's futures, and the request closure).
    ///
    /// ```
    /// use vantage_api_pool::{EventKind, ResilientClient};
    /// use vantage_api_pool_testkit::{RecordingObserver, Reply, ScriptedTransport, VirtualRuntime};
    ///
    /// let rt = VirtualRuntime::new();
    /// let transport = ScriptedTransport::new(&rt);
    /// transport.push(Reply::status(503)).push(Reply::ok());
    /// let events = RecordingObserver::new();
    /// let client = ResilientClient::builder(transport, rt.clone())
    ///     .observer("orders-api", std::sync::Arc::new(events.clone()))
    ///     .build()?;
    ///
    /// let call = client.execute(|http| http.get("/orders"));
    /// let id = call.id();
    /// assert_eq!(rt.block_on(call)??.status(), 200);
    /// // How many attempts this call made: its events carry its id. (Counting its
    /// // `Started` events would count sends: a redial repeats its attempt's number.)
    /// let attempts = events
    ///     .for_call(id)
    ///     .iter()
    ///     .filter_map(|event| match event.kind {
    ///         EventKind::Started { attempt, .. } => Some(attempt),
    ///         _ => None,
    ///     })
    ///     .max();
    /// assert_eq!(attempts, Some(2));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use = "a call does nothing unless it is awaited"]
    pub struct CallFuture<F> {
        id: CallId,
        #[pin]
        call: F,
    }
}

impl<F> CallFuture<F> {
    /// The id every event of this call carries ([`TransportEvent::call`]), known
    /// before the call starts: the observer's events of this call are the ones with
    /// it (the testkit's `RecordingObserver::for_call` picks them out). Ids are
    /// numbered per client (a client's clones share its numbering): an observer that
    /// hears several clients tells their calls apart by the API name too
    /// (`RecordingObserver::for_api_call`). A spawned
    /// call, made inside its task, can hand its id back with its result: `async move
    /// { let call = client.execute(build); (call.id(), call.await) }`; one made
    /// outside it with [`into_call`](ResilientClient::into_call) gives its id before
    /// it is spawned, which also serves when the task is aborted.
    #[must_use]
    pub fn id(&self) -> CallId {
        self.id
    }
}

impl<F: Future> Future for CallFuture<F> {
    type Output = F::Output;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.project().call.poll(cx)
    }
}

impl<F> fmt::Debug for CallFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallFuture")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// A response whose body the call read whole
/// ([`execute_read`](ResilientClient::execute_read)): the transport's response, its
/// body already taken, and the body. Its request id:
/// `client.request_id(read.response())`. Its `Debug` shows the body's length, never
/// the body (which may hold a token or personal data).
pub struct ReadResponse<R> {
    pub(crate) response: R,
    pub(crate) body: Bytes,
}

impl<R> ReadResponse<R> {
    /// The transport's response, for what else it tells (its status and headers,
    /// and whatever the transport's own type adds); its body has been read.
    #[must_use]
    pub fn response(&self) -> &R {
        &self.response
    }

    /// The body.
    #[must_use]
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The body, the rest dropped.
    #[must_use]
    pub fn into_body(self) -> Bytes {
        self.body
    }

    /// The transport's response (its body read) and the body.
    #[must_use]
    pub fn into_parts(self) -> (R, Bytes) {
        (self.response, self.body)
    }
}

impl<R: fmt::Debug> fmt::Debug for ReadResponse<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadResponse")
            .field("response", &self.response)
            .field("body_len", &self.body.len())
            .finish()
    }
}

impl<R: TransportResponse> ReadResponse<R> {
    /// The response's status.
    #[must_use]
    pub fn status(&self) -> StatusCode {
        self.response.status()
    }

    /// The response's headers.
    #[must_use]
    pub fn headers(&self) -> &HeaderMap {
        self.response.headers()
    }
}

/// What a caller can report through [`ResilientClient::report`] once it knows.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    /// `n` rows were parsed from a response.
    RowsPulled {
        /// How many rows.
        n: u64,
    },
    /// A write was acknowledged.
    WritePushed,
}

impl<T: Transport, R: Runtime> ResilientClient<T, R, NoAuth> {
    /// Starts building a client over `transport` and `runtime`.
    pub fn builder(transport: T, runtime: R) -> ClientBuilder<T, R, NoAuth> {
        ClientBuilder::new(transport, runtime)
    }
}

impl<T: Transport, R: Runtime, A: TokenSource> ResilientClient<T, R, A> {
    /// Runs one call under `policy`. `build` is called with the transport's handle
    /// for every send and returns a fresh draft request. It runs after the gate
    /// (breaker, admission, auth token; the breaker is asked again after the
    /// gate's waits: an admission that waited, a token fetch) and before the
    /// permit and rate-token waits. The breaker is asked again after each of those
    /// waits too; a request it turns back is dropped unsent, and `build` runs again
    /// when the call next passes the gate. So do once-per-call work (an
    /// `Idempotency-Key`, say) before the call, not in `build`.
    ///
    /// The future borrows `policy` (one policy shared by many calls). To hand it a
    /// policy made for this call, so that the future can be stored or collected before
    /// it is awaited, use [`execute_with_owned`](ResilientClient::execute_with_owned).
    ///
    /// Dropping the returned future cancels the call: the in-flight request, any
    /// pending back-off and everything the call holds go with it, and the observer
    /// hears `Cancelled` for a send in flight. A send dropped so counts toward
    /// nothing, the breaker included: a time limit meant to count a stalled API as
    /// failing belongs in the policy ([`CallPolicy::with_attempt_timeout`],
    /// [`CallPolicy::with_budget`]), not in a timeout around the call.
    ///
    /// The call ends at the response head: a success body that breaks or stalls
    /// while the caller reads it is not retried, and neither the breaker nor the
    /// policy's time limits hear of it. For a body read inside the call, and retried
    /// with it, use [`execute_read_with`](ResilientClient::execute_read_with).
    pub fn execute_with<'a, F>(
        &'a self,
        policy: &'a CallPolicy,
        build: F,
    ) -> CallFuture<impl Future<Output = Result<T::Response, ClientError>> + 'a>
    where
        F: FnMut(&T::Handle) -> T::Draft + 'a,
    {
        self.call(policy, build, AtHead)
    }

    /// [`execute_with`](ResilientClient::execute_with), with a policy the future keeps
    /// instead of borrowing.
    ///
    /// ```
    /// use vantage_api_pool::{CallPolicy, ResilientClient};
    /// use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
    ///
    /// let rt = VirtualRuntime::new();
    /// let transport = ScriptedTransport::new(&rt);
    /// transport.default_reply(Reply::ok());
    /// let client = ResilientClient::builder(transport, rt.clone()).build()?;
    /// // A policy made for each call: the futures are collected first, awaited later
    /// // (`execute_with(&CallPolicy::essential(), ..)` would borrow a temporary).
    /// let calls: Vec<_> = ["/a", "/b"]
    ///     .into_iter()
    ///     .map(|path| client.execute_with_owned(CallPolicy::essential(), move |http| http.get(path)))
    ///     .collect();
    /// for call in calls {
    ///     assert!(rt.block_on(call)?.is_ok());
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn execute_with_owned<'a, F>(
        &'a self,
        policy: CallPolicy,
        build: F,
    ) -> CallFuture<impl Future<Output = Result<T::Response, ClientError>> + 'a>
    where
        F: FnMut(&T::Handle) -> T::Draft + 'a,
    {
        self.call(policy, build, AtHead)
    }

    /// [`execute`](ResilientClient::execute) as a future that owns its client
    /// handle: it borrows nothing, so it can be made outside the task that runs it
    /// and handed to `tokio::spawn` (or kept) as it is, as reqwest's own request
    /// futures can. Call it on a clone (clones are cheap and share everything):
    /// `tokio::spawn(client.clone().into_call(move |http| http.get(&url)))`.
    ///
    /// It is `'static` when the transport, the runtime, the token source and `build`
    /// are, and `Send` when `execute`'s would be. Its [`id`](CallFuture::id) is known
    /// before it is spawned, so the events of a call whose task was aborted (which
    /// returns nothing) can still be found. Dropping it cancels the call, as for
    /// [`execute_with`](ResilientClient::execute_with).
    ///
    /// ```
    /// use vantage_api_pool::{EventKind, ResilientClient};
    /// use vantage_api_pool_testkit::{RecordingObserver, Reply, ScriptedTransport, VirtualRuntime};
    ///
    /// let rt = VirtualRuntime::new();
    /// let transport = ScriptedTransport::new(&rt);
    /// transport.default_reply(Reply::stall());
    /// let events = RecordingObserver::new();
    /// let client = ResilientClient::builder(transport, rt.clone())
    ///     .observer("orders-api", std::sync::Arc::new(events.clone()))
    ///     .build()?;
    ///
    /// let call = client.clone().into_call(|http| http.get("/orders"));
    /// let id = call.id();
    /// let task = rt.spawn(call);
    /// rt.run_until_idle()?;
    /// task.abort(); // an aborted task returns nothing, but its call's events are there
    /// rt.run_until_idle()?;
    /// let kinds: Vec<_> = events.for_call(id).iter().map(|e| e.kind.name()).collect();
    /// assert_eq!(kinds, ["started", "cancelled"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn into_call<F>(
        self,
        build: F,
    ) -> CallFuture<impl Future<Output = Result<T::Response, ClientError>>>
    where
        F: FnMut(&T::Handle) -> T::Draft,
    {
        let policy = self.shared.default_policy.clone();
        self.into_call_with(policy, build)
    }

    /// [`into_call`](ResilientClient::into_call) under `policy`: a future that owns
    /// its client handle and its policy
    /// ([`execute_with_owned`](ResilientClient::execute_with_owned) with the client
    /// owned too).
    pub fn into_call_with<F>(
        self,
        policy: CallPolicy,
        build: F,
    ) -> CallFuture<impl Future<Output = Result<T::Response, ClientError>>>
    where
        F: FnMut(&T::Handle) -> T::Draft,
    {
        self.into_call_ending(policy, build, AtHead)
    }

    /// [`execute_read`](ResilientClient::execute_read) as a future that owns its
    /// client handle, as [`into_call`](ResilientClient::into_call) is for
    /// `execute`: `tokio::spawn(client.clone().into_read_call(limit, move |http|
    /// http.get(&url)))`.
    pub fn into_read_call<F>(
        self,
        limit: usize,
        build: F,
    ) -> CallFuture<impl Future<Output = Result<ReadResponse<T::Response>, ClientError>>>
    where
        F: FnMut(&T::Handle) -> T::Draft,
    {
        let policy = self.shared.default_policy.clone();
        self.into_call_ending(policy, build, ReadBody(limit))
    }

    /// [`into_read_call`](ResilientClient::into_read_call) under `policy`, which the
    /// future keeps.
    pub fn into_read_call_with<F>(
        self,
        policy: CallPolicy,
        limit: usize,
        build: F,
    ) -> CallFuture<impl Future<Output = Result<ReadResponse<T::Response>, ClientError>>>
    where
        F: FnMut(&T::Handle) -> T::Draft,
    {
        self.into_call_ending(policy, build, ReadBody(limit))
    }

    /// A call that owns its client handle and its policy, ending as `ending` says.
    fn into_call_ending<F, E>(
        self,
        policy: CallPolicy,
        build: F,
        ending: E,
    ) -> CallFuture<impl Future<Output = Result<E::Output, ClientError>>>
    where
        F: FnMut(&T::Handle) -> T::Draft,
        E: Ending<T::Response>,
    {
        let id = self.next_call_id();
        CallFuture {
            id,
            call: async move { Call::new(&self.shared, policy, id).run(build, ending).await },
        }
    }

    /// The id of the next call this client (or a clone) makes.
    fn next_call_id(&self) -> CallId {
        CallId(self.shared.next_call.fetch_add(1, Ordering::Relaxed) + 1)
    }

    /// One call under a policy the future borrows or keeps, ending as `ending` says.
    fn call<'a, P, F, E>(
        &'a self,
        policy: P,
        build: F,
        ending: E,
    ) -> CallFuture<impl Future<Output = Result<E::Output, ClientError>> + 'a>
    where
        P: Borrow<CallPolicy> + 'a,
        F: FnMut(&T::Handle) -> T::Draft + 'a,
        E: Ending<T::Response> + 'a,
    {
        let id = self.next_call_id();
        CallFuture {
            id,
            call: Call::new(&self.shared, policy, id).run(build, ending),
        }
    }

    /// Runs one call under the client's [default policy](Self::default_policy).
    /// Unless the builder set another ([`default_policy`], [`default_retry`]), that
    /// is [`CallPolicy::default`]: `bounded` with 3 retries from 250 ms capped at
    /// 10 s, 10 s per attempt and 30 s for the whole call (a retry that could not
    /// start within the 30 s is not attempted). For another policy on one call, use
    /// [`execute_with`](ResilientClient::execute_with).
    ///
    /// [`default_policy`]: crate::ClientBuilder::default_policy
    /// [`default_retry`]: crate::ClientBuilder::default_retry
    ///
    /// Dropping the returned future cancels the call, as for
    /// [`execute_with`](ResilientClient::execute_with).
    pub fn execute<'a, F>(
        &'a self,
        build: F,
    ) -> CallFuture<impl Future<Output = Result<T::Response, ClientError>> + 'a>
    where
        F: FnMut(&T::Handle) -> T::Draft + 'a,
    {
        self.call(&self.shared.default_policy, build, AtHead)
    }

    /// [`execute`](ResilientClient::execute) that reads the body too, inside the
    /// attempt: the call succeeds once the whole body, at most `limit` bytes, has
    /// been read, so a body that breaks or stalls is a failed send like one that
    /// failed before its head.
    ///
    /// - The read runs under the send's own time limit (the smaller of the policy's
    ///   attempt timeout and the budget left): a body that stalls is cut there
    ///   (`TimedOut`, naming that limit; the connection is distrusted).
    /// - A body that breaks (the transport's read fails, `Interrupted` for a reset)
    ///   or stalls counts as a failure for the breaker, and the policy retries it as
    ///   any failed send: only a request that is safe to send again (an idempotent
    ///   method, an `Idempotency-Key`, or marked idempotent). A POST whose answer
    ///   broke off is not sent again: the server has processed it. (A read failure
    ///   of a kind that says the request never left, `NotSent`, `Connect`, `Tls` or
    ///   `Config`, counts as `Interrupted`: the answer had begun.)
    /// - A body longer than `limit` ends the call at once with `TooLarge` (final;
    ///   the breaker is not told, as for any `TooLarge`); what was read is dropped.
    ///   One whose head declares it longer (the transport's
    ///   [`content_length`](crate::TransportResponse::content_length), for an answer
    ///   that has a body: not one to a `HEAD`, a 1xx, 204 or 304) ends it at the
    ///   head, unread, so a slow one is not read until a time limit cuts it and the
    ///   request is sent again.
    /// - `Succeeded` is reported once the body is read: its `ms` runs from just
    ///   before the send to the body's end, and `bytes` is the body's length. A half-open
    ///   probe is judged on the whole body too. A body that fails reports `Failed`, its
    ///   `ms` to the failure.
    /// - The permit still goes back at the response head, as for every call: it
    ///   bounds requests waiting for their heads, not bodies being read.
    /// - An error response ends the call as it does for `execute` (its body, up to
    ///   [`MAX_ERROR_BODY`](crate::MAX_ERROR_BODY) bytes, in the error).
    /// - The error of a body that broke off, stalled or ran past the limit names the
    ///   request id of its own head ([`ClientError::request_id`]), none if that head
    ///   had none: it is the last response the call got.
    /// - Dropping the returned future cancels the call, as for
    ///   [`execute_with`](ResilientClient::execute_with); dropped during the body
    ///   read, the send reports `Cancelled`.
    ///
    /// For a body read piece by piece, or one larger than memory should hold, use
    /// `execute` and read the body from the response: that read is the caller's, and
    /// neither the breaker nor the policy hears of it.
    ///
    /// ```
    /// use vantage_api_pool::{ResilientClient, TransportErrorKind};
    /// use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
    ///
    /// let rt = VirtualRuntime::new();
    /// let transport = ScriptedTransport::new(&rt);
    /// // The first answer's body breaks off after 5 bytes; the GET is sent again.
    /// transport.push(
    ///     Reply::ok()
    ///         .body(r#"{"orders": []}"#)
    ///         .body_fails_after(5, TransportErrorKind::Interrupted, "connection reset"),
    /// );
    /// transport.push(Reply::ok().body(r#"{"orders": []}"#));
    /// let client = ResilientClient::builder(transport.clone(), rt.clone()).build()?;
    ///
    /// let read = rt.block_on(client.execute_read(64 * 1024, |http| http.get("/orders")))??;
    /// assert_eq!(read.status(), 200);
    /// assert_eq!(read.body().as_ref(), br#"{"orders": []}"#);
    /// assert_eq!(transport.request_count(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn execute_read<'a, F>(
        &'a self,
        limit: usize,
        build: F,
    ) -> CallFuture<impl Future<Output = Result<ReadResponse<T::Response>, ClientError>> + 'a>
    where
        F: FnMut(&T::Handle) -> T::Draft + 'a,
    {
        self.call(&self.shared.default_policy, build, ReadBody(limit))
    }

    /// [`execute_read`](ResilientClient::execute_read) under `policy`, which the
    /// future borrows (as [`execute_with`](ResilientClient::execute_with) does).
    pub fn execute_read_with<'a, F>(
        &'a self,
        policy: &'a CallPolicy,
        limit: usize,
        build: F,
    ) -> CallFuture<impl Future<Output = Result<ReadResponse<T::Response>, ClientError>> + 'a>
    where
        F: FnMut(&T::Handle) -> T::Draft + 'a,
    {
        self.call(policy, build, ReadBody(limit))
    }

    /// [`execute_read_with`](ResilientClient::execute_read_with), with a policy the
    /// future keeps instead of borrowing (as
    /// [`execute_with_owned`](ResilientClient::execute_with_owned) is to
    /// `execute_with`).
    ///
    /// ```
    /// use vantage_api_pool::{CallPolicy, ResilientClient};
    /// use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
    ///
    /// let rt = VirtualRuntime::new();
    /// let transport = ScriptedTransport::new(&rt);
    /// transport.default_reply(Reply::ok().body("[]"));
    /// let client = ResilientClient::builder(transport, rt.clone()).build()?;
    /// // A policy made for each call, the futures collected first and awaited later.
    /// let reads: Vec<_> = ["/a", "/b"]
    ///     .into_iter()
    ///     .map(|path| {
    ///         client.execute_read_with_owned(CallPolicy::essential(), 1024, move |http| http.get(path))
    ///     })
    ///     .collect();
    /// for read in reads {
    ///     assert_eq!(rt.block_on(read)??.body().as_ref(), b"[]");
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn execute_read_with_owned<'a, F>(
        &'a self,
        policy: CallPolicy,
        limit: usize,
        build: F,
    ) -> CallFuture<impl Future<Output = Result<ReadResponse<T::Response>, ClientError>> + 'a>
    where
        F: FnMut(&T::Handle) -> T::Draft + 'a,
    {
        self.call(policy, build, ReadBody(limit))
    }

    /// Reports something only the caller knows (rows parsed, a write acknowledged) to
    /// the observer. The event carries no call id.
    pub fn report(&self, report: Report) {
        let shared = &self.shared;
        shared.events.emit(
            || shared.runtime.now(),
            None,
            || match report {
                Report::RowsPulled { n } => EventKind::RowsPulled { n },
                Report::WritePushed => EventKind::WritePushed,
            },
        );
    }

    /// The transport.
    #[must_use]
    pub fn transport(&self) -> &T {
        &self.shared.transport
    }

    /// The runtime.
    #[must_use]
    pub fn runtime(&self) -> &R {
        &self.shared.runtime
    }

    /// The policy of [`execute`](ResilientClient::execute), as the builder set it.
    #[must_use]
    pub fn default_policy(&self) -> &CallPolicy {
        &self.shared.default_policy
    }

    /// The breaker's state now: `Closed`, `Open { until }` or `HalfOpen`. A client
    /// without a breaker is always `Closed`.
    #[must_use]
    pub fn breaker_state(&self) -> BreakerState {
        match &self.shared.breaker {
            Some(b) => b.state(self.shared.runtime.now()),
            None => BreakerState::Closed,
        }
    }

    /// Closes the breaker now, whatever its state: a manual override for an operator
    /// who knows the API is back (a deploy finished, a dependency came back) and
    /// will not wait for the cooldown and a probe. The run of failures is cleared
    /// and the cooldown goes back to its base; a probe in flight is no longer the
    /// probe (its answer counts as any send's); calls waiting out a cooldown
    /// ([`BreakerMode::WaitForProbe`](crate::BreakerMode::WaitForProbe)) are woken and
    /// go on through the rest of the gate at once, and calls waiting for a probe in
    /// flight at their next look (within
    /// [`PROBE_RECHECK`](crate::breaker::PROBE_RECHECK), 5 ms).
    ///
    /// Returns `true` when the breaker was open or half-open: the observer then
    /// hears [`BreakerReset`](EventKind::BreakerReset) (no call id), at the runtime's
    /// clock. `false`, and no event, when it was closed already (a run of failures
    /// short of the threshold is cleared all the same) or the client has no breaker.
    ///
    /// A `WaitForProbe` call whose budget could not cover the cooldown did not wait
    /// for it: it ended `TimedOut` at the gate, and a reset does not bring it back.
    /// Every waiting call goes at once: if the API is not back after all, they are
    /// the failures that open the breaker again.
    pub fn reset_breaker(&self) -> bool {
        let shared = &self.shared;
        let Some(breaker) = &shared.breaker else {
            return false;
        };
        // Reported before the calls waiting out the cooldown are woken, so none of
        // their sends comes ahead of it.
        breaker
            .reset_then(|transition| {
                if transition.is_some() {
                    shared
                        .events
                        .emit(|| shared.runtime.now(), None, || EventKind::BreakerReset);
                }
            })
            .is_some()
    }

    /// Permits held right now: sends in flight up to their response head, and sends
    /// about to leave that wait for their rate token (a send holds its permit
    /// through that wait, and through a wait for a token refresh a 401 started
    /// meanwhile). A send reading an error body, or a success body for
    /// [`execute_read`](Self::execute_read), has given its permit back, and
    /// calls in a back-off, a cooldown, an admission or a wait for a token at the
    /// gate hold none, so this is not a count of live calls: the client keeps none
    /// (to drain at shutdown, keep the calls' tasks and await or abort them).
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.shared.limiter.in_flight()
    }

    /// Calls queued for a permit right now: all `max_parallel` are held, or one was
    /// just freed and waits for the front of the queue to take it.
    #[must_use]
    pub fn waiting_for_permit(&self) -> usize {
        self.shared.limiter.waiting()
    }

    /// The most permits held at once ([`in_flight`](Self::in_flight)'s figure:
    /// sends in flight, and sends waiting for their rate token holding a permit)
    /// since the client was built, or since the last
    /// [`take_peak_in_flight`](Self::take_peak_in_flight) of it or a clone.
    #[must_use]
    pub fn peak_in_flight(&self) -> usize {
        self.shared.limiter.peak_in_flight()
    }

    /// [`peak_in_flight`](Self::peak_in_flight), and starts the next interval from
    /// the permits held now: for a metrics scrape, the busiest moment of each
    /// interval between two scrapes (a figure that only grows says little after the
    /// first burst). A send granted its permit while this runs may count in the next
    /// interval instead. Clones share the figure, so one scraper should take it.
    pub fn take_peak_in_flight(&self) -> usize {
        self.shared.limiter.take_peak_in_flight()
    }

    /// Fetches a new token from the client's token source now, before the API
    /// rejects the one in use: for a source that cannot tell its tokens' lifetime
    /// (one that can gives it with [`AuthToken::expires_in`](crate::AuthToken::expires_in),
    /// and the client renews ahead by itself), call it ahead of the expiry (from a
    /// timer task, say) so that no call meets the 401 and its replay.
    ///
    /// The token in use stays in use while the fetch runs: a call that just needs a
    /// token does not wait for it (one made before any token was fetched, or after
    /// the token in use expired, does).
    /// Calls that start after it get the new token, and so do sends already built
    /// and waiting for a permit or a rate token, when the new token comes under the
    /// same header name. A fetch already running (the first, or a refresh a 401
    /// asked for) is joined instead of doubled. It resolves to `Ok` once a token
    /// newer than the one in use when it was called has landed. The observer hears
    /// the fetch it ran end as [`TokenFetchEnded`](crate::EventKind::TokenFetchEnded)
    /// with the reason [`Requested`](crate::TokenFetchReason::Requested) (a fetch
    /// it joined reports under the reason it started for), and
    /// [`token_fetches`](Self::token_fetches) counts it.
    ///
    /// It has no time limit of its own: while its fetch runs, a call that needs a
    /// new token (its 401's replay) waits for that fetch, so a source that never
    /// answers holds those calls until their budgets end (under a policy without
    /// one, `essential` or `background`, until the fetch ends or this future is
    /// dropped). Give the source a timeout,
    /// or put one around this future: dropping it abandons the fetch, and the next
    /// caller that needs a token starts another.
    ///
    /// # Errors
    ///
    /// The token source's error, when the fetch it ran or joined failed and no newer
    /// token landed meanwhile; the token in use, if there is one, stays in use. On a
    /// client without a token source, an error that says so (nothing is fetched).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use vantage_api_pool::auth::{AuthError, send_token_fn};
    /// use vantage_api_pool::http::{HeaderValue, header::AUTHORIZATION};
    /// use vantage_api_pool::ResilientClient;
    /// use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
    ///
    /// let rt = VirtualRuntime::new();
    /// let transport = ScriptedTransport::new(&rt);
    /// transport.default_reply(Reply::ok());
    /// let issued = Arc::new(AtomicU32::new(0));
    /// let counter = Arc::clone(&issued);
    /// let client = ResilientClient::builder(transport.clone(), rt.clone())
    ///     .auth(send_token_fn(move || {
    ///         let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
    ///         async move {
    ///             Ok::<_, AuthError>((AUTHORIZATION, HeaderValue::from_str(&format!("Bearer t{n}"))?))
    ///         }
    ///     }))
    ///     .build()?;
    ///
    /// rt.block_on(client.execute(|http| http.get("/orders")))??;
    /// rt.block_on(client.refresh_token())??;
    /// rt.block_on(client.execute(|http| http.get("/orders")))??;
    /// let sent: Vec<_> = transport.requests().iter().map(|r| r.headers["authorization"].clone()).collect();
    /// assert_eq!(sent, ["Bearer t1", "Bearer t2"]);
    /// assert_eq!(client.token_fetches(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn refresh_token(&self) -> Result<(), SharedAuthError> {
        let shared = &self.shared;
        if !shared.auth.is_configured() {
            return Err(SharedAuthError(Arc::new(AuthError::from(
                "no token source to refresh: the client was built without `auth`",
            ))));
        }
        shared
            .auth_state
            .refresh(&shared.auth, &shared.fetch_env())
            .await
            .map_err(SharedAuthError)
    }

    /// Token fetches started so far by the client's token source: the first fetch,
    /// refreshes, and fetches abandoned because their caller was dropped (the
    /// source was called, so its endpoint may have been reached). Each is reported
    /// to the observer once, as it ends, as a
    /// [`TokenFetchEnded`](crate::EventKind::TokenFetchEnded), an abandoned one
    /// too: once no fetch runs, this count and those events agree, and a count
    /// above them says a fetch is running (or hangs).
    #[must_use]
    pub fn token_fetches(&self) -> u64 {
        self.shared.auth_state.fetches()
    }

    /// When the token fetch that runs now started (on the runtime's clock), or
    /// `None` if none runs. A fetch is reported to the observer only as it ends, so
    /// this is how a dashboard tells a token source that hangs (under policies
    /// without a budget its calls wait as long as it does, and nothing reaches the
    /// observer meanwhile) from a quiet API: the fetch's age is
    /// `runtime().now() - since`.
    #[must_use]
    pub fn token_fetch_running_since(&self) -> Option<Instant> {
        self.shared.auth_state.fetch_running_since()
    }

    /// The API's name, the key its observer's events come under, if an observer is
    /// set. (Not a credential: tokens come from the client's token source.)
    #[must_use]
    pub fn api_name(&self) -> Option<&str> {
        self.shared.events.key()
    }

    /// The request id of a response the client returned (read from the header the
    /// builder's [`request_id_header`](crate::ClientBuilder::request_id_header) names,
    /// `x-request-id` by default), the same way a
    /// [`ClientError::request_id`](crate::ClientError::request_id) is read from an
    /// error's response: `None` when it is missing or not visible ASCII. For the
    /// result of [`execute_read`](Self::execute_read):
    /// `client.request_id(read.response())`.
    ///
    /// ```
    /// use vantage_api_pool::ResilientClient;
    /// use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
    ///
    /// let rt = VirtualRuntime::new();
    /// let transport = ScriptedTransport::new(&rt);
    /// transport.push(Reply::ok().header("x-request-id", "r-42"));
    /// let client = ResilientClient::builder(transport, rt.clone()).build()?;
    /// let response = rt.block_on(client.execute(|http| http.get("/orders")))??;
    /// assert_eq!(client.request_id(&response), Some("r-42"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn request_id<'r>(&self, response: &'r T::Response) -> Option<&'r str> {
        self.shared.request_id_in(response.headers())
    }
}
