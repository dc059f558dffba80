//! The same client code, spawned on tokio's thread pool with `ReqwestTransport` +
//! `TokioRuntime` (its future is `Send`), and run on a `LocalSet` with an `Rc`-based
//! transport (its future is not).
#![cfg(not(target_arch = "wasm32"))]

mod common;

use std::cell::Cell;
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;

use common::*;
use vantage_api_pool::auth::{AuthError, TokenSource, token_fn};
use vantage_api_pool::http::{HeaderValue, StatusCode, header::AUTHORIZATION};
use vantage_api_pool::{
    CallPolicy, ClientError, ResilientClient, Runtime, Transport, TransportError, TransportResponse,
};
use vantage_api_pool_reqwest::{ReqwestRequest, ReqwestResponse, ReqwestTransport};
use vantage_api_pool_testkit::RecordingObserver;
use vantage_api_pool_tokio::TokioRuntime;

/// The client code under test, generic over the transport and runtime: one GET, and
/// the status.
async fn fetch_status<T, R, A>(
    client: &ResilientClient<T, R, A>,
    url: &str,
) -> Result<StatusCode, ClientError>
where
    T: Transport<Handle = reqwest::Client, Draft = reqwest::RequestBuilder>,
    R: Runtime,
    A: TokenSource,
{
    let response = client
        .execute_with(&policy(1), |http| http.get(url))
        .await?;
    Ok(response.status())
}

fn assert_send<F: Future + Send>(future: F) -> F {
    future
}

/// Compile-time proof: the futures of `execute_with`, `execute` and the generic client
/// code are `Send` over `ReqwestTransport` + `TokioRuntime`, with and without auth.
/// (Never called: it only has to compile.)
#[allow(dead_code)]
fn call_futures_are_send(
    client: &ResilientClient<ReqwestTransport, TokioRuntime>,
    policy: &CallPolicy,
) {
    fn assert_send_sync<T: Send + Sync>(_: &T) {}
    assert_send_sync(client);
    drop(assert_send(
        client.execute_with(policy, |http| http.get("http://127.0.0.1/")),
    ));
    drop(assert_send(
        client.execute(|http| http.get("http://127.0.0.1/")),
    ));
    drop(assert_send(fetch_status(client, "http://127.0.0.1/")));

    let with_auth = ResilientClient::builder(
        ReqwestTransport::new(reqwest::Client::new()),
        TokioRuntime::new(),
    )
    .auth(token_fn(|| async {
        Ok::<_, AuthError>((AUTHORIZATION, HeaderValue::from_static("Bearer t")))
    }))
    .build()
    .unwrap();
    assert_send_sync(&with_auth);
    drop(assert_send(
        with_auth.execute_with(policy, |http| http.get("http://127.0.0.1/")),
    ));
}

/// What a call's future over `ReqwestTransport` + `TokioRuntime` may weigh, with
/// room for another compiler's layout: when last measured, 656 bytes with a request
/// closure that borrows its URL, as the peers bench's does (README, "Speed"), and
/// 648 with one that captures nothing (the closure is part of the future). At 768
/// it held the call's state twice, as an `async fn` copies its arguments
/// (ARCHITECTURE.md, `Call::run`); every call in flight keeps its future.
const CALL_FUTURE_BOUND: usize = 720;

#[test]
fn a_call_future_over_reqwest_and_tokio_stays_small() {
    let client = ResilientClient::builder(
        ReqwestTransport::new(reqwest::Client::new()),
        TokioRuntime::new(),
    )
    .build()
    .unwrap();
    let policy = CallPolicy::bounded(vantage_api_pool::RetryPolicy::default());
    let url = String::from("http://127.0.0.1/");
    let url = url.as_str();
    let sizes = [
        std::mem::size_of_val(&client.execute_with(&policy, |http| http.get("http://127.0.0.1/"))),
        std::mem::size_of_val(&client.execute(|http| http.get("http://127.0.0.1/"))),
        std::mem::size_of_val(&client.execute_with(&policy, |http| http.get(url))),
    ];
    for size in sizes {
        assert!(
            size <= CALL_FUTURE_BOUND,
            "a call's future is {size} bytes, over {CALL_FUTURE_BOUND}"
        );
    }
}

#[cfg(feature = "tokio")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_over_reqwest_and_tokio_can_be_spawned() {
    let server = FaultServer::start(|n, _| match n {
        0 => Act::Respond(response("503 Service Unavailable", &[], "")),
        _ => Act::Respond(ok("spawned")),
    })
    .await;
    let observer = RecordingObserver::new();
    let client = ReqwestTransport::tokio_builder(reqwest_client())
        .max_parallel(4)
        .rate_limit(10.0)
        .default_breaker()
        .observer("orders-api", Arc::new(observer.clone()))
        .build()
        .unwrap();
    let url = server.url("/orders");
    let handle = tokio::spawn({
        let client = client.clone();
        async move {
            let policy = policy(2);
            let response = client.execute_with(&policy, |http| http.get(&url)).await?;
            let text = response.into_inner().text().await.unwrap();
            let status = fetch_status(&client, &url).await?;
            // A call that reads the body inside the attempt is Send too.
            let read = client.execute_read(1024, |http| http.get(&url)).await?;
            Ok::<_, ClientError>((text, status, read.into_body()))
        }
    });
    let (text, status, body) = handle.await.unwrap().unwrap();
    assert_eq!((text.as_str(), status), ("spawned", StatusCode::OK));
    assert_eq!(body.as_ref(), b"spawned");
    assert_eq!(
        trace(&observer),
        [
            "started s1 a1",
            "failed s1 a1 503",
            "retry a2 after 5ms",
            "started s2 a2",
            "ok s2 a2 200",
            "started s1 a1",
            "ok s1 a1 200",
            "started s1 a1",
            "ok s1 a1 200",
        ]
    );
    assert_eq!(server.requests().len(), 4);
}

/// A call that owns its client handle goes to `tokio::spawn` as it is, made outside
/// the task, and its id finds its events.
#[cfg(feature = "tokio")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_owns_its_client_is_spawned_as_it_is() {
    let server = FaultServer::start(|_, _| Act::Respond(ok("owned"))).await;
    let observer = RecordingObserver::new();
    let client = ReqwestTransport::tokio_builder(reqwest_client())
        .observer("orders-api", Arc::new(observer.clone()))
        .build()
        .unwrap();
    let url = server.url("/orders");
    let call = client
        .clone()
        .into_call_with(policy(1), move |http| http.get(&url));
    let id = call.id();
    let response = tokio::spawn(call).await.unwrap().unwrap();
    assert_eq!(response.into_inner().text().await.unwrap(), "owned");
    assert_eq!(observer.for_call(id).len(), 2);
    assert_eq!(server.requests().len(), 1);
}

/// Client code generic over the Send variants of the ports spawns its own calls: the
/// compiler proves the call's future `Send` inside the generic function, with no
/// concrete transport in sight.
#[cfg(feature = "tokio")]
fn spawn_fetch<T, R, A>(
    client: ResilientClient<T, R, A>,
    url: String,
) -> tokio::task::JoinHandle<Result<(StatusCode, String), ClientError>>
where
    T: vantage_api_pool::transport::SendTransport<
            Handle = reqwest::Client,
            Draft = reqwest::RequestBuilder,
            Response = ReqwestResponse,
        > + 'static,
    R: vantage_api_pool::runtime::SendRuntime + 'static,
    A: vantage_api_pool::auth::SendTokenSource + 'static,
{
    tokio::spawn(async move {
        let response = client
            .execute_with(&policy(1), |http| http.get(&url))
            .await?;
        let status = response.status();
        Ok((status, response.text().await.unwrap()))
    })
}

#[cfg(feature = "tokio")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generic_code_over_the_send_ports_spawns_its_calls() {
    let server = FaultServer::start(|n, _| match n {
        0 => Act::Respond(response("503 Service Unavailable", &[], "")),
        _ => Act::Respond(ok("generic")),
    })
    .await;
    let client = ReqwestTransport::tokio_builder(reqwest_client())
        .auth(vantage_api_pool::auth::send_token_fn(|| async {
            Ok::<_, AuthError>((AUTHORIZATION, HeaderValue::from_static("Bearer g")))
        }))
        .build()
        .unwrap();
    let (status, text) = spawn_fetch(client, server.url("/orders"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((status, text.as_str()), (StatusCode::OK, "generic"));
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "the 503 was retried");
    assert!(
        requests
            .iter()
            .all(|r| r.header("authorization").as_deref() == Some("bearer g")),
        "{requests:?}"
    );
}

/// `ReqwestTransport` with an `Rc` counter of sends: neither it nor its futures are
/// `Send`.
struct RcTransport {
    inner: ReqwestTransport,
    sends: Rc<Cell<u32>>,
}

impl Transport for RcTransport {
    type Handle = reqwest::Client;
    type Draft = reqwest::RequestBuilder;
    type Request = ReqwestRequest;
    type Response = ReqwestResponse;

    fn handle(&self) -> &reqwest::Client {
        self.inner.handle()
    }

    fn prepare(&self, draft: reqwest::RequestBuilder) -> Result<ReqwestRequest, TransportError> {
        self.inner.prepare(draft)
    }

    fn send(
        &self,
        request: ReqwestRequest,
    ) -> impl Future<Output = Result<ReqwestResponse, TransportError>> {
        let sends = Rc::clone(&self.sends);
        let sending = self.inner.send(request);
        async move {
            let response = sending.await;
            // The Rc lives across the await: this future is not Send.
            sends.set(sends.get() + 1);
            response
        }
    }

    fn distrust_connection(&self) {
        self.inner.distrust_connection();
    }
}

#[tokio::test]
async fn the_same_client_code_runs_an_rc_transport_on_a_local_set() {
    let server = FaultServer::start(|n, _| match n {
        0 => Act::Close,
        _ => Act::Respond(ok("local")),
    })
    .await;
    let sends = Rc::new(Cell::new(0));
    let observer = RecordingObserver::new();
    let client = ResilientClient::builder(
        RcTransport {
            inner: ReqwestTransport::new(reqwest_client()),
            sends: Rc::clone(&sends),
        },
        TokioRuntime::new(),
    )
    .observer("local-api", Arc::new(observer.clone()))
    .build()
    .unwrap();
    let url = server.url("/orders");
    let local = tokio::task::LocalSet::new();
    let status = local
        .run_until(async move {
            tokio::task::spawn_local(async move { fetch_status(&client, &url).await })
                .await
                .unwrap()
        })
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(sends.get(), 2);
    assert_eq!(trace(&observer), INTERRUPTED_THEN_OK);
    assert_eq!(server.requests().len(), 2);
}

/// A token source written as a closure returning an `async` block: spawning a call
/// on its client must compile (a bare `Box<dyn Error>` in the source's output once
/// tripped the compiler's higher-ranked lifetime check here).
#[cfg(feature = "tokio")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_with_a_closure_token_source_can_be_spawned() {
    let server = FaultServer::start(|_, _| Act::Respond(ok("authed"))).await;
    let client = ReqwestTransport::tokio_builder(reqwest_client())
        .auth(token_fn(|| async {
            Ok::<_, AuthError>((AUTHORIZATION, HeaderValue::from_static("Bearer t")))
        }))
        .build()
        .unwrap();
    let url = server.url("/orders");
    let status = tokio::spawn(async move {
        let policy = policy(0);
        let response = client.execute_with(&policy, |http| http.get(&url)).await?;
        Ok::<_, ClientError>(response.status())
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(server.requests().len(), 1);
}

/// A glob import of the pool's root brings one trait of each pair (the `Send`
/// variants live in their modules), so the adapters' port methods stay unambiguous.
mod glob_import {
    use vantage_api_pool::*;
    use vantage_api_pool_reqwest::ReqwestTransport;
    use vantage_api_pool_tokio::TokioRuntime;

    #[test]
    fn the_adapters_port_methods_resolve_under_a_glob_import() {
        let rt = TokioRuntime::new();
        assert!(rt.now() < Instant::FAR_FUTURE);
        assert!((0.0..1.0).contains(&rt.random()));
        assert!(rt.wall_clock() > std::time::SystemTime::UNIX_EPOCH);
        let transport = ReqwestTransport::new(reqwest::Client::new());
        let request = transport
            .prepare(transport.handle().get("http://127.0.0.1:9/"))
            .unwrap();
        assert_eq!(request.method(), Some(&http::Method::GET));
        assert!(!NoAuth.is_configured());
    }
}
