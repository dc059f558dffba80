//! What a call allocates, counted by a global allocator that counts this thread's
//! allocations while a test asks it to.
//!
//! The claim under test (README, "Speed"): a send that waits for nothing and
//! succeeds allocates nothing in the loop, with every per-API control on (breaker,
//! rate bucket, permit cap, an observer, a token source whose token is at hand), over
//! a send that is not ready on its first poll (so the attempt's time limit arms its
//! timer, as over a network). Every wait is a boxed future that only a waiting call
//! pays for: the last test shows the counter sees that one. The first also holds the
//! README's count of clock readings on that path: three a send.
//!
//! The transport, runtime and observer here allocate nothing themselves, so every
//! allocation counted is the client's. Native only (the wasm suites do not run it).

// A global allocator is an `unsafe impl`; the libraries themselves forbid unsafe code.
#![allow(unsafe_code)]

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime};

use common::Chunks;
use vantage_api_pool::auth::{AuthError, TokenSource, token_fn};
use vantage_api_pool::http::header::AUTHORIZATION;
use vantage_api_pool::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use vantage_api_pool::{
    CallPolicy, EventKind, Instant, PreparedRequest, ResilientClient, Runtime, Transport,
    TransportError, TransportEvent, TransportObserver, TransportResponse,
};

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count_one() {
    // `try_with`: the allocator also runs while this thread's locals are torn down.
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        }
    });
}

// SAFETY: every method forwards to `System` unchanged; counting touches only
// const-initialised thread-locals, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The allocations this thread makes while `f` runs.
fn allocations_in<T>(f: impl FnOnce() -> T) -> (u64, T) {
    ALLOCATIONS.with(|n| n.set(0));
    COUNTING.with(|on| on.set(true));
    let out = f();
    COUNTING.with(|on| on.set(false));
    (ALLOCATIONS.with(Cell::get), out)
}

/// A request that is a method and at most one header (the auth token), kept without
/// a `HeaderMap`, whose first insertion allocates.
struct Req {
    method: Method,
    header: Option<(HeaderName, HeaderValue)>,
}

impl Req {
    fn of(method: Method) -> Req {
        Req {
            method,
            header: None,
        }
    }
}

impl PreparedRequest for Req {
    fn method(&self) -> Option<&Method> {
        Some(&self.method)
    }

    fn header(&self, name: &HeaderName) -> Option<&HeaderValue> {
        self.header
            .as_ref()
            .filter(|(n, _)| n == name)
            .map(|(_, value)| value)
    }

    fn set_header(&mut self, name: HeaderName, value: HeaderValue) {
        assert!(
            self.header.is_none() || self.header.as_ref().is_some_and(|(n, _)| *n == name),
            "a second header: {name}"
        );
        self.header = Some((name, value));
    }
}

/// Answers 200 on the second poll of each send, as a network send is never ready on
/// its first; counts its sends and the ones that carried the token.
#[derive(Default)]
struct Quiet {
    sends: Cell<u64>,
    with_token: Cell<u64>,
}

/// Pending once (waking its task at once), then the answer.
struct SecondPoll<R> {
    answer: Option<R>,
    polled: bool,
}

impl<R> SecondPoll<R> {
    fn new(answer: R) -> Self {
        SecondPoll {
            answer: Some(answer),
            polled: false,
        }
    }
}

impl<R: Unpin> Future for SecondPoll<R> {
    type Output = Result<R, TransportError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.polled {
            Poll::Ready(Ok(self.answer.take().expect("polled after its answer")))
        } else {
            self.polled = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

impl Transport for Quiet {
    type Handle = ();
    type Draft = Method;
    type Request = Req;
    type Response = Chunks;

    fn handle(&self) -> &() {
        &()
    }

    fn prepare(&self, method: Method) -> Result<Req, TransportError> {
        Ok(Req::of(method))
    }

    fn send(&self, request: Req) -> impl Future<Output = Result<Chunks, TransportError>> {
        self.sends.set(self.sends.get() + 1);
        if request.header(&AUTHORIZATION) == Some(&HeaderValue::from_static(TOKEN)) {
            self.with_token.set(self.with_token.get() + 1);
        }
        // A 200 with an empty body: no header map or chunk queue to allocate.
        SecondPoll::new(Chunks::new([]))
    }
}

/// A clock that moves 1 µs per reading; its sleeps never end (nothing here should
/// wait for one) and allocate nothing. A sleep keeps its deadline, so it has a size,
/// as a real runtime's does: boxing one would call the allocator (a zero-sized value
/// boxes without it).
#[derive(Default)]
struct Ticking {
    micros: Cell<u64>,
}

struct Never {
    _deadline: Instant,
}

impl Future for Never {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        Poll::Pending
    }
}

impl Runtime for Ticking {
    fn now(&self) -> Instant {
        self.micros.set(self.micros.get() + 1);
        Instant::from_origin(Duration::from_micros(self.micros.get()))
    }

    fn wall_clock(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH
    }

    fn sleep_until(&self, deadline: Instant) -> impl Future<Output = ()> {
        Never {
            _deadline: deadline,
        }
    }

    fn random(&self) -> f64 {
        0.5
    }
}

/// Counts the events it hears, by kind; allocates nothing.
#[derive(Default)]
struct Tally {
    started: AtomicU64,
    succeeded: AtomicU64,
    token_fetch_ended: AtomicU64,
    other: AtomicU64,
}

impl TransportObserver for Tally {
    fn on_event(&self, _api: &str, event: &TransportEvent) {
        let counter = match event.kind {
            EventKind::Started { .. } => &self.started,
            EventKind::Succeeded { .. } => &self.succeeded,
            EventKind::TokenFetchEnded { .. } => &self.token_fetch_ended,
            _ => &self.other,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Polls `future` with a waker that does nothing until it is ready; the transport
/// wakes its own task, so a pending poll is simply polled again.
fn run<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..1_000 {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
    }
    panic!("the call did not finish within 1,000 polls");
}

const TOKEN: &str = "Bearer t";

/// A client with every per-API control on: a breaker, a rate bucket, a permit cap,
/// an observer and a token source (whose token, fetched by the first call, is then
/// only applied).
fn client(tally: &Arc<Tally>) -> ResilientClient<Quiet, Ticking, impl TokenSource> {
    ResilientClient::builder(Quiet::default(), Ticking::default())
        .default_breaker()
        .rate_limit(1e9)
        .max_parallel(1024)
        .observer("api", tally.clone())
        .auth(token_fn(|| async {
            Ok::<_, AuthError>((AUTHORIZATION, HeaderValue::from_static(TOKEN)))
        }))
        .build()
        .expect("valid settings")
}

const CALLS: u64 = 1_000;

#[test]
fn a_send_that_waits_for_nothing_and_succeeds_allocates_nothing_and_reads_the_clock_thrice() {
    let tally = Arc::new(Tally::default());
    let client = client(&tally);
    let policy = CallPolicy::essential();
    // The first call may set up what lives as long as the client.
    // The request closures capture what they send, so they have a size, as real
    // ones do: boxing one would call the allocator.
    let get = Method::GET;
    assert!(run(client.execute_with(&policy, |_| get.clone())).is_ok());

    let readings_before = client.runtime().micros.get();
    let (allocated, ok) = allocations_in(|| {
        (0..CALLS)
            .filter(|_| run(client.execute_with(&policy, |_| get.clone())).is_ok())
            .count()
    });
    assert_eq!(ok as u64, CALLS);
    assert_eq!(allocated, 0, "allocations over {CALLS} calls");
    // The calls really went through the loop: one send, a Started and a Succeeded each.
    assert_eq!(client.transport().sends.get(), CALLS + 1);
    assert_eq!(client.transport().with_token.get(), CALLS + 1);
    assert_eq!(tally.started.load(Ordering::Relaxed), CALLS + 1);
    assert_eq!(tally.succeeded.load(Ordering::Relaxed), CALLS + 1);
    // The token was fetched once, by the first call.
    assert_eq!(tally.token_fetch_ended.load(Ordering::Relaxed), 1);
    assert_eq!(tally.other.load(Ordering::Relaxed), 0);
    // The README's other claim for this path: three clock readings a send (at the
    // gate, just before the send, at the response head), the token at hand included.
    let readings = client.runtime().micros.get() - readings_before;
    assert_eq!(readings, 3 * CALLS);
}

#[test]
fn a_call_under_the_default_policy_or_an_owned_one_or_owning_its_client_allocates_nothing_either() {
    let tally = Arc::new(Tally::default());
    let client = client(&tally);
    let post = Method::POST;
    assert!(run(client.execute(|_| post.clone())).is_ok());

    let (allocated, ok) = allocations_in(|| {
        (0..CALLS)
            .filter(|i| {
                let call = |_: &()| post.clone();
                match i % 3 {
                    0 => run(client.execute(call)).is_ok(),
                    1 => run(client.execute_with_owned(CallPolicy::background(), call)).is_ok(),
                    // A future that owns a clone of the client allocates nothing either.
                    _ => run(client.clone().into_call(|_: &()| Method::POST)).is_ok(),
                }
            })
            .count()
    });
    assert_eq!(ok as u64, CALLS);
    assert_eq!(allocated, 0, "allocations over {CALLS} calls");
    assert_eq!(tally.succeeded.load(Ordering::Relaxed), CALLS + 1);
}

/// The counter is not blind: a call that waits for a permit boxes its wait.
#[test]
fn a_call_that_waits_for_a_permit_allocates_its_wait() {
    let tally = Arc::new(Tally::default());
    let client = ResilientClient::builder(Quiet::default(), Ticking::default())
        .max_parallel(1)
        .observer("api", tally.clone())
        .build()
        .expect("valid settings");
    let policy = CallPolicy::essential();
    assert!(run(client.execute_with(&policy, |_| Method::GET)).is_ok());

    let (allocated, ()) = allocations_in(|| {
        let mut first = pin!(client.execute_with(&policy, |_| Method::GET));
        let mut second = pin!(client.execute_with(&policy, |_| Method::GET));
        let mut cx = Context::from_waker(Waker::noop());
        // The first takes the only permit and leaves its send pending; the second
        // queues for the permit.
        assert!(first.as_mut().poll(&mut cx).is_pending());
        assert!(second.as_mut().poll(&mut cx).is_pending());
        assert_eq!(tally.started.load(Ordering::Relaxed), 2);
        assert!(matches!(first.as_mut().poll(&mut cx), Poll::Ready(Ok(_))));
        for _ in 0..10 {
            if let Poll::Ready(result) = second.as_mut().poll(&mut cx) {
                assert!(result.is_ok());
                return;
            }
        }
        panic!("the second call did not get the permit");
    });
    assert!(allocated >= 1, "a permit wait allocated nothing");
    assert_eq!(tally.succeeded.load(Ordering::Relaxed), 3);
}

/// An error response whose headers are built before the count starts, moved out by
/// `take_headers`, with an empty body.
#[derive(Debug)]
struct Headed {
    headers: HeaderMap,
}

impl TransportResponse for Headed {
    fn status(&self) -> StatusCode {
        StatusCode::INTERNAL_SERVER_ERROR
    }

    fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    fn take_headers(&mut self) -> HeaderMap {
        std::mem::take(&mut self.headers)
    }

    async fn chunk(&mut self) -> Result<Option<bytes::Bytes>, TransportError> {
        Ok(None)
    }
}

/// Hands out the responses it was given, one a send, each on its send's second poll.
#[derive(Default)]
struct Prepared {
    responses: RefCell<VecDeque<Headed>>,
}

impl Transport for Prepared {
    type Handle = ();
    type Draft = Method;
    type Request = Req;
    type Response = Headed;

    fn handle(&self) -> &() {
        &()
    }

    fn prepare(&self, method: Method) -> Result<Req, TransportError> {
        Ok(Req::of(method))
    }

    fn send(&self, _request: Req) -> impl Future<Output = Result<Headed, TransportError>> {
        let response = self.responses.borrow_mut().pop_front();
        SecondPoll::new(response.expect("a response for every send"))
    }
}

/// The headers of an error response move into its `ClientError` (the loop takes
/// them with `take_headers`): a 500 with three headers allocates no more than one
/// with none (a copy of a header map allocates its index and its entries).
#[test]
fn an_error_response_s_headers_move_into_its_error_uncopied() {
    let with_three = || {
        let mut headers = HeaderMap::new();
        for (name, value) in [("x-a", "1"), ("x-b", "2"), ("content-type", "text/plain")] {
            headers.insert(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        Headed { headers }
    };
    let client = ResilientClient::builder(Prepared::default(), Ticking::default())
        .build()
        .expect("valid settings");
    let policy = CallPolicy::background();
    let count = |response: Headed| {
        client
            .transport()
            .responses
            .borrow_mut()
            .push_back(response);
        allocations_in(|| run(client.execute_with(&policy, |_| Method::GET)))
    };
    // The first call may set up what lives as long as the client.
    let _ = count(with_three());

    let (bare, err) = count(Headed {
        headers: HeaderMap::new(),
    });
    assert_eq!(
        err.expect_err("a 500").headers().map(HeaderMap::len),
        Some(0)
    );
    let (headed, err) = count(with_three());
    let err = err.expect_err("a 500");
    let headers = err.headers().expect("the 500's headers");
    assert_eq!(headers.len(), 3);
    assert_eq!(headers["x-b"], "2");
    assert_eq!(headers["content-type"], "text/plain");
    assert_eq!(headed, bare, "allocations with three headers and with none");
    // The `Arc` the error keeps its response in, and the boxed read of the (empty)
    // body: a third would be a copy of the headers on the way (a boxed map, say).
    assert_eq!(bare, 2, "allocations of an error response with no headers");
}
