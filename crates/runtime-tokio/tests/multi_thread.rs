//! The pool on `TokioRuntime` under a multi-thread tokio runtime: thousands of
//! spawned calls, some aborted, over a flaky in-memory transport that answers after
//! up to 3 yields (no sleeping). Checks what single-threaded tests cannot: the observer
//! contract as events arrive from several worker threads, the permit cap, and that
//! nothing is left in flight or queued.
//!
//! A rate bucket (10,000/s, burst 8) makes sends wait for tokens holding their
//! permits (the aborts rarely land in that wait; `pool/tests/leak_check.rs` drops
//! calls there on virtual time).
//!
//! Real time is spent only on the pool's own short back-offs (1 ms), breaker
//! cooldowns (5 ms) and rate waits, so the test takes about a second.

mod common;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use common::{Request, Response};
use vantage_api_pool::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use vantage_api_pool::{
    CallPolicy, PreparedRequest, ResilientClient, RetryPolicy, Transport, TransportError,
    TransportErrorKind,
};
use vantage_api_pool_testkit::RecordingObserver;
use vantage_api_pool_tokio::TokioRuntime;

/// Answers after 0 to 3 yields: mostly 200, sometimes 503, a request that never
/// left, or a broken exchange. Counts the sends in flight, to check the permit cap
/// from the transport's side.
#[derive(Clone, Default)]
struct Flaky {
    next: Arc<AtomicU64>,
    in_flight: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
}

/// Marks a request whose send stalls until its call is aborted.
const HOLD: HeaderName = HeaderName::from_static("x-hold");

/// Decrements the in-flight count however the send ends (answered or dropped).
struct Sending(Arc<AtomicUsize>);

impl Drop for Sending {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Transport for Flaky {
    type Handle = ();
    /// `true`: the send stalls until its call is aborted.
    type Draft = bool;
    type Request = Request;
    type Response = Response;

    fn handle(&self) -> &() {
        &()
    }

    fn prepare(&self, hold: bool) -> Result<Request, TransportError> {
        let mut headers = HeaderMap::new();
        if hold {
            headers.insert(HOLD, HeaderValue::from_static("1"));
        }
        Ok(Request(headers))
    }

    fn send(&self, request: Request) -> impl Future<Output = Result<Response, TransportError>> {
        // SplitMix-style mixing of a shared counter: a different outcome per send.
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let roll = n.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29) % 100;
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        let guard = Sending(Arc::clone(&self.in_flight));
        async move {
            let _guard = guard;
            if request.header(&HOLD).is_some() {
                std::future::pending::<()>().await;
            }
            for _ in 0..roll % 4 {
                tokio::task::yield_now().await;
            }
            match roll {
                0..70 => Ok(Response(StatusCode::OK, HeaderMap::new())),
                70..80 => Ok(Response(StatusCode::SERVICE_UNAVAILABLE, HeaderMap::new())),
                80..90 => Err(TransportError::new(TransportErrorKind::NotSent, "stale")),
                _ => Err(TransportError::new(
                    TransportErrorKind::Interrupted,
                    "reset",
                )),
            }
        }
    }
}

#[test]
fn thousands_of_calls_on_four_workers_keep_the_contract_and_the_cap() {
    const CALLS: usize = 3_000;
    const CAP: usize = 4;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_time()
        .build()
        .unwrap();
    let transport = Flaky::default();
    let observer = RecordingObserver::new();
    let client = runtime.block_on(async {
        ResilientClient::builder(transport.clone(), TokioRuntime::new())
            .max_parallel(CAP)
            .rate_limit_with_burst(10_000.0, 8)
            .breaker(3, Duration::from_millis(5), Duration::from_millis(20))
            .observer("multi", Arc::new(observer.clone()))
            .build()
            .unwrap()
    });
    let policy = CallPolicy::bounded(
        RetryPolicy::new(2, Duration::from_millis(1), Duration::from_millis(2)).unwrap(),
    );
    let finished = runtime.block_on(async {
        let handles: Vec<_> = (0..CALLS)
            .map(|i| {
                let (client, policy) = (client.clone(), policy.clone());
                // Every fifth call stalls in its send and is aborted from another task
                // after a few yields: at its gate, in the permit queue, or mid-send.
                let hold = i % 5 == 0;
                let handle =
                    tokio::spawn(async move { client.execute_with(&policy, |()| hold).await });
                if hold {
                    let abort = handle.abort_handle();
                    tokio::spawn(async move {
                        for _ in 0..i % 11 {
                            tokio::task::yield_now().await;
                        }
                        abort.abort();
                    });
                }
                handle
            })
            .collect();
        let mut finished = 0;
        for handle in handles {
            match handle.await {
                Ok(_) => finished += 1,
                Err(e) => assert!(e.is_cancelled(), "a call panicked: {e}"),
            }
        }
        finished
    });
    assert!(finished >= CALLS * 4 / 5, "{finished} calls ran to the end");

    // Nothing in flight, nothing queued, the cap held on both sides.
    assert_eq!(client.in_flight(), 0);
    assert_eq!(client.waiting_for_permit(), 0);
    assert!(
        client.peak_in_flight() <= CAP,
        "{}",
        client.peak_in_flight()
    );
    assert_eq!(transport.in_flight.load(Ordering::SeqCst), 0);
    assert!(transport.peak.load(Ordering::SeqCst) <= CAP);
    // Every send has its terminal event, numbered and timed as the contract says
    // (time order per call and per reporting thread).
    if let Err(violation) = observer.check_contract() {
        panic!("observer contract broken: {violation}");
    }
    let threads: std::collections::HashSet<_> =
        observer.events().iter().map(|e| e.thread).collect();
    assert!(
        threads.len() > 1,
        "the events came from several worker threads"
    );
    let kinds = observer.kinds();
    for kind in [
        "succeeded",
        "failed",
        "redialing",
        "retry_scheduled",
        "cancelled",
    ] {
        assert!(kinds.contains(&kind), "no {kind} in {} events", kinds.len());
    }
}
