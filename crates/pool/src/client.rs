//! `ResilientClient`: one client per remote API, cheap to clone.

use std::borrow::Borrow;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use http::HeaderName;
use pin_project_lite::pin_project;

use crate::attempt::Call;
use crate::auth::{AuthState, NoAuth, TokenSource};
use crate::breaker::{BreakerState, CircuitBreaker};
use crate::builder::ClientBuilder;
use crate::concurrency::Limiter;
use crate::error::ClientError;
use crate::observer::{CallId, EventKind, TransportEvent, TransportObserver};
use crate::policy::CallPolicy;
use crate::rate::TokenBucket;
use crate::runtime::Runtime;
use crate::time::Instant;
use crate::transport::Transport;

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
    #[inline]
    pub(crate) fn emit(
        &self,
        at: impl FnOnce() -> Instant,
        call: Option<CallId>,
        kind: impl FnOnce() -> EventKind,
    ) {
        if let Some((key, observer)) = &self.sink {
            observer.on_event(key, &TransportEvent::new(at(), call, kind()));
        }
    }
}

pin_project! {
    /// The future of one call ([`execute`](ResilientClient::execute),
    /// [`execute_with`](ResilientClient::execute_with),
    /// [`execute_with_owned`](ResilientClient::execute_with_owned)): it resolves to
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
    /// { let call = client.execute(build); (call.id(), call.await) }`.
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
    /// hears `Cancelled` for a send in flight.
    pub fn execute_with<'a, F>(
        &'a self,
        policy: &'a CallPolicy,
        build: F,
    ) -> CallFuture<impl Future<Output = Result<T::Response, ClientError>> + 'a>
    where
        F: FnMut(&T::Handle) -> T::Draft + 'a,
    {
        self.call(policy, build)
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
        self.call(policy, build)
    }

    /// One call under a policy the future borrows or keeps.
    fn call<'a, P, F>(
        &'a self,
        policy: P,
        build: F,
    ) -> CallFuture<impl Future<Output = Result<T::Response, ClientError>> + 'a>
    where
        P: Borrow<CallPolicy> + 'a,
        F: FnMut(&T::Handle) -> T::Draft + 'a,
    {
        let id = CallId(self.shared.next_call.fetch_add(1, Ordering::Relaxed) + 1);
        CallFuture {
            id,
            call: Call::new(&self.shared, policy, id).run(build),
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
        self.call(&self.shared.default_policy, build)
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

    /// Permits held right now: sends in flight, and sends about to leave that wait
    /// for their rate token (a send holds its permit through that wait).
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

    /// The most permits ever held at once ([`in_flight`](Self::in_flight)'s
    /// figure): sends in flight, and sends waiting for their rate token holding a
    /// permit.
    #[must_use]
    pub fn peak_in_flight(&self) -> usize {
        self.shared.limiter.peak_in_flight()
    }

    /// Token fetches started so far by the client's token source: the first fetch,
    /// refreshes, and fetches abandoned because their caller was dropped (the
    /// source was called, so its endpoint may have been reached).
    #[must_use]
    pub fn token_fetches(&self) -> u64 {
        self.shared.auth_state.fetches()
    }

    /// The API's name, the key its observer's events come under, if an observer is
    /// set. (Not a credential: tokens come from the client's token source.)
    #[must_use]
    pub fn api_name(&self) -> Option<&str> {
        self.shared.events.key()
    }
}
