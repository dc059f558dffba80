//! The pool's attempt loop on `TokioRuntime` under tokio's paused clock: back-offs,
//! server delays and attempt timeouts take no real time, and `now` reads the
//! jumps exactly.

mod common;

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Request, Response};
use vantage_api_pool::http::{HeaderMap, HeaderValue, StatusCode};
use vantage_api_pool::{
    CallPolicy, ErrorKind, Jitter, ResilientClient, RetryPolicy, Runtime, Transport,
    TransportError, TransportResponse,
};
use vantage_api_pool_testkit::RecordingObserver;
use vantage_api_pool_tokio::TokioRuntime;

/// What the canned transport answers to one send.
#[derive(Clone)]
enum Reply {
    Status(u16, Option<&'static str>),
    Hang,
}

/// A transport that answers from a list, at once, or never.
#[derive(Clone, Default)]
struct Canned(Arc<Mutex<VecDeque<Reply>>>);

impl Canned {
    fn new(replies: impl IntoIterator<Item = Reply>) -> Self {
        Canned(Arc::new(Mutex::new(replies.into_iter().collect())))
    }
}

impl Transport for Canned {
    type Handle = ();
    type Draft = ();
    type Request = Request;
    type Response = Response;

    fn handle(&self) -> &() {
        &()
    }

    fn prepare(&self, (): ()) -> Result<Request, TransportError> {
        Ok(Request(HeaderMap::new()))
    }

    fn send(&self, _request: Request) -> impl Future<Output = Result<Response, TransportError>> {
        let reply = self
            .0
            .lock()
            .unwrap()
            .pop_front()
            .expect("a reply is scripted");
        async move {
            match reply {
                Reply::Hang => std::future::pending().await,
                Reply::Status(code, retry_after) => {
                    let mut headers = HeaderMap::new();
                    if let Some(after) = retry_after {
                        headers.insert("retry-after", HeaderValue::from_static(after));
                    }
                    Ok(Response(StatusCode::from_u16(code).unwrap(), headers))
                }
            }
        }
    }
}

fn policy(retries: u32, base: Duration) -> CallPolicy {
    CallPolicy::bounded(RetryPolicy::new(retries, base, Duration::from_secs(60)).unwrap())
        .with_jitter(Jitter::None)
        .unwrap()
        .with_attempt_timeout(Duration::from_secs(5))
        .unwrap()
        .with_budget(Some(Duration::from_secs(300)))
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn back_offs_server_delays_and_timeouts_take_exact_virtual_time() {
    let transport = Canned::new([
        Reply::Status(503, None),
        Reply::Status(503, None),
        Reply::Status(429, Some("7")),
        Reply::Hang,
        Reply::Status(200, None),
    ]);
    let runtime = TokioRuntime::new();
    let observer = RecordingObserver::new();
    let client = ResilientClient::builder(transport, runtime.clone())
        .observer("paused", Arc::new(observer.clone()))
        .build()
        .unwrap();
    let start = runtime.now();
    let response = client
        .execute_with(&policy(4, Duration::from_secs(10)), |()| ())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    // Back-offs 10 s and 20 s, the server's 7 s, a 5 s attempt timeout, then a
    // back-off of 10 s x 2^3 capped at the policy's 60 s: to the nanosecond, which
    // only a paused clock gives (it moves by jumps, so nothing waited in real time).
    assert_eq!(
        runtime.now() - start,
        Duration::from_secs(10 + 20 + 7 + 5 + 60)
    );
    let sleeps: Vec<u64> = observer
        .events()
        .iter()
        .filter_map(|e| match e.event.kind {
            vantage_api_pool::EventKind::RetryScheduled { after, .. } => Some(after.as_secs()),
            _ => None,
        })
        .collect();
    assert_eq!(sleeps, [10, 20, 7, 60]);
    observer.check_contract().unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_attempt_timeout_ends_a_hung_send_at_exactly_its_deadline() {
    let runtime = TokioRuntime::new();
    let client = ResilientClient::builder(Canned::new([Reply::Hang]), runtime.clone())
        .build()
        .unwrap();
    let start = runtime.now();
    let error = client
        .execute_with(&policy(0, Duration::from_millis(1)), |()| ())
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::TimedOut);
    assert_eq!(
        error.time_limit(),
        Some(vantage_api_pool::TimeLimit::AttemptTimeout)
    );
    assert_eq!(runtime.now() - start, Duration::from_secs(5));
}
