//! The ports carry no `Send` bound: a call's future is `Send` exactly when its
//! transport, runtime and token source are, and a non-`Send` transport still works.

mod common;

// On wasm32 the same tests run under wasm-bindgen-test, in Node and in a browser.
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

use std::cell::Cell;
use std::future::Future;
use std::rc::Rc;

use common::*;
use http::{HeaderName, HeaderValue};
#[cfg(not(target_arch = "wasm32"))]
use vantage_api_pool::CallPolicy;
use vantage_api_pool::auth::{AuthError, token_fn};
use vantage_api_pool::{ResilientClient, Transport, TransportError};
use vantage_api_pool_testkit::{
    Reply, ScriptedHttp, ScriptedRequest, ScriptedRequestBuilder, ScriptedResponse,
    ScriptedTransport,
};

#[cfg(not(target_arch = "wasm32"))]
fn assert_send<T: Send>(_: &T) {}
#[cfg(not(target_arch = "wasm32"))]
fn assert_send_sync<T: Send + Sync>() {}

/// Native only: on wasm32 observers need not be `Send + Sync` (`MaybeSendSync`), so
/// no client is `Send` there.
#[cfg(not(target_arch = "wasm32"))]
#[test]
fn the_call_future_is_send_over_send_ports() {
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let client = w.client();
    assert_send_sync::<Client>();
    let policy = CallPolicy::background();
    let call = client.execute_with(&policy, |h| h.get("/x"));
    assert_send(&call);
    let plain = client.execute(|h| h.get("/x"));
    assert_send(&plain);
    assert!(w.rt.block_on(call).unwrap().is_ok());
    drop(plain);
    // So is a call that reads the body, and what it returns.
    let read = client.execute_read_with(&policy, 64, |h| h.get("/x"));
    assert_send(&read);
    let body = client.execute_read(64, |h| h.get("/x"));
    assert_send(&body);
    let read = w.rt.block_on(read).unwrap().unwrap();
    assert_send(&read);
    drop(body);

    // A Send token source keeps the future Send.
    let authed = w
        .builder()
        .auth(token_fn(|| async {
            Ok::<_, AuthError>((
                http::header::AUTHORIZATION,
                HeaderValue::from_static("Bearer t"),
            ))
        }))
        .build()
        .unwrap();
    let call = authed.execute_with(&policy, |h| h.get("/x"));
    assert_send(&call);
    assert!(w.rt.block_on(call).unwrap().is_ok());
    // So is a refresh, which a timer task spawns ahead of a token's expiry.
    let refresh = authed.refresh_token();
    assert_send(&refresh);
    assert!(w.rt.block_on(refresh).unwrap().is_ok());
}

/// Client code generic over the Send variants of the ports: the compiler proves the
/// call's future `Send + 'static` inside the generic function.
/// (Not an `async fn`: the `Send` in the signature is what the compiler must prove.)
#[cfg(not(target_arch = "wasm32"))]
#[allow(clippy::manual_async_fn)]
fn spawnable<T, R, A>(
    client: ResilientClient<T, R, A>,
    build: fn(&T::Handle) -> T::Draft,
) -> impl Future<Output = Result<T::Response, vantage_api_pool::ClientError>> + Send + 'static
where
    T: vantage_api_pool::transport::SendTransport + 'static,
    R: vantage_api_pool::runtime::SendRuntime + 'static,
    A: vantage_api_pool::auth::SendTokenSource + 'static,
{
    async move {
        let policy = bounded(2, ms(100));
        client.execute_with(&policy, build).await
    }
}

/// The same, with the future a client handle makes of itself: no `async` block, the
/// future is handed on as it is.
#[cfg(not(target_arch = "wasm32"))]
fn spawnable_owned<T, R, A>(
    client: ResilientClient<T, R, A>,
    build: fn(&T::Handle) -> T::Draft,
) -> impl Future<Output = Result<T::Response, vantage_api_pool::ClientError>> + Send + 'static
where
    T: vantage_api_pool::transport::SendTransport + 'static,
    R: vantage_api_pool::runtime::SendRuntime + 'static,
    A: vantage_api_pool::auth::SendTokenSource + 'static,
{
    client.into_call_with(bounded(2, ms(100)), build)
}

/// The same for a call that reads the body.
#[cfg(not(target_arch = "wasm32"))]
fn spawnable_read<T, R, A>(
    client: ResilientClient<T, R, A>,
    build: fn(&T::Handle) -> T::Draft,
) -> impl Future<
    Output = Result<vantage_api_pool::ReadResponse<T::Response>, vantage_api_pool::ClientError>,
> + Send
+ 'static
where
    T: vantage_api_pool::transport::SendTransport + 'static,
    R: vantage_api_pool::runtime::SendRuntime + 'static,
    A: vantage_api_pool::auth::SendTokenSource + 'static,
{
    client.into_read_call_with(bounded(2, ms(100)), 64, build)
}

#[cfg(not(target_arch = "wasm32"))]
#[test]
fn a_call_that_owns_its_client_is_send_and_static_and_runs() {
    fn assert_send_static<T: Send + 'static>(_: &T) {}
    let w = World::new();
    w.transport
        .push_many([Reply::status(503), Reply::ok(), Reply::ok()]);
    let client = w.client();
    let call = spawnable_owned(client.clone(), |h| h.get("/x"));
    assert!(w.rt.block_on(call).unwrap().is_ok());
    assert_eq!(w.sent_at(), [ms(0), ms(100)]);

    let plain = client.clone().into_call(|h| h.get("/y"));
    assert_send_static(&plain);
    let id = plain.id();
    drop(client); // the future keeps the client alive
    assert!(w.rt.block_on(plain).unwrap().is_ok());
    assert_eq!(w.transport.requests()[2].path, "/y");
    assert_eq!(w.observer.for_call(id).len(), 2, "its id is the call's");

    // A call that reads its body: a body that breaks is sent again, under the policy
    // the future keeps (100 ms), or under the client's default (250 ms, jittered).
    let client = w.client();
    let broken = || {
        Reply::ok().body("whole").body_fails_after(
            2,
            vantage_api_pool::TransportErrorKind::Interrupted,
            "reset",
        )
    };
    w.transport.clear_requests();
    w.observer.clear(); // the new client numbers its calls from 1 again
    w.transport
        .push_many([broken(), Reply::ok().body("whole"), broken()]);
    w.transport.push(Reply::ok().body("whole"));
    let read = spawnable_read(client.clone(), |h| h.get("/r"));
    assert_eq!(w.rt.block_on(read).unwrap().unwrap().body(), "whole");
    let start = w.now();
    let read = client.clone().into_read_call(64, |h| h.get("/d"));
    assert_send_static(&read);
    let id = read.id();
    drop(client);
    assert_eq!(w.rt.block_on(read).unwrap().unwrap().into_body(), "whole");
    let sent = w.sent_at();
    assert_eq!(sent.len(), 4);
    assert_eq!(sent[1] - sent[0], ms(100));
    assert!((ms(250)..=ms(313)).contains(&(sent[3] - start)), "{sent:?}");
    assert_eq!(w.observer.for_call(id).len(), 5, "its id is the call's");
}

/// The testkit implements the Send variants, so service code generic over them runs
/// on virtual time in tests, with or without a token source.
#[cfg(not(target_arch = "wasm32"))]
#[test]
fn generic_code_over_the_send_ports_runs_over_the_testkit() {
    use vantage_api_pool::auth::send_token_fn;
    let w = World::new();
    w.transport.push_many([Reply::status(503), Reply::ok()]);
    let call = spawnable(w.client(), |h| h.get("/x"));
    assert!(w.rt.block_on(call).unwrap().is_ok());
    assert_eq!(w.sent_at(), [ms(0), ms(100)]);

    let authed = w
        .builder()
        .auth(send_token_fn(|| async {
            Ok::<_, AuthError>((
                http::header::AUTHORIZATION,
                HeaderValue::from_static("Bearer s"),
            ))
        }))
        .build()
        .unwrap();
    w.transport.push(Reply::ok());
    let call = spawnable(authed, |h| h.get("/y"));
    assert!(w.rt.block_on(call).unwrap().is_ok());
    let requests = w.transport.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[2].headers["authorization"], "Bearer s");
}

/// A transport that is not `Send`: it counts sends in an `Rc<Cell<_>>`, as a
/// single-threaded backend's transport might hold thread-bound state.
struct RcTransport {
    inner: ScriptedTransport,
    sends: Rc<Cell<u32>>,
}

impl Transport for RcTransport {
    type Handle = ScriptedHttp;
    type Draft = ScriptedRequestBuilder;
    type Request = ScriptedRequest;
    type Response = ScriptedResponse;

    fn handle(&self) -> &ScriptedHttp {
        self.inner.handle()
    }

    fn prepare(&self, draft: ScriptedRequestBuilder) -> Result<ScriptedRequest, TransportError> {
        self.inner.prepare(draft)
    }

    fn send(
        &self,
        request: ScriptedRequest,
    ) -> impl Future<Output = Result<ScriptedResponse, TransportError>> {
        let sends = Rc::clone(&self.sends);
        let send = self.inner.send(request);
        async move {
            sends.set(sends.get() + 1);
            send.await
        }
    }
}

#[test]
fn an_rc_transport_and_an_rc_token_source_run_on_the_driver() {
    let w = World::new();
    w.transport.push_many([Reply::status(503), Reply::ok()]);
    let sends = Rc::new(Cell::new(0));
    let fetches = Rc::new(Cell::new(0));
    let counter = Rc::clone(&fetches);
    let client = ResilientClient::builder(
        RcTransport {
            inner: w.transport.clone(),
            sends: Rc::clone(&sends),
        },
        w.rt.clone(),
    )
    .auth(token_fn(move || {
        let counter = Rc::clone(&counter);
        async move {
            counter.set(counter.get() + 1);
            Ok::<_, AuthError>((
                HeaderName::from_static("x-api-key"),
                HeaderValue::from_static("k"),
            ))
        }
    }))
    .build()
    .unwrap();
    let resp =
        w.rt.block_on(client.execute_with(&bounded(2, ms(100)), |h| h.get("/x")))
            .unwrap();
    assert!(resp.is_ok());
    assert_eq!(sends.get(), 2);
    assert_eq!(fetches.get(), 1, "the token is fetched once and reused");
    assert_eq!(w.sent_at(), [ms(0), ms(100)]);
    // A call that owns its client: `'static` though not `Send`, so the driver (a
    // single-threaded executor) takes it as it is.
    w.transport.push(Reply::ok());
    let task = w.rt.spawn(client.into_call(|h| h.get("/z")));
    w.rt.run().unwrap();
    assert!(task.is_finished());
    assert_eq!(sends.get(), 3);
    assert!(
        w.transport
            .requests()
            .iter()
            .all(|r| r.headers["x-api-key"] == "k")
    );
}

#[test]
fn errors_are_error_send_sync_static() {
    fn assert_error<E: std::error::Error + Send + Sync + 'static>() {}
    assert_error::<vantage_api_pool::ClientError>();
    assert_error::<vantage_api_pool::ConfigError>();
    assert_error::<vantage_api_pool::TransportError>();
}

/// The values a caller keeps or hands to another thread (a policy in a shared
/// config, a health figure sent to a dashboard task, an event forwarded over a
/// channel): an `Rc` slipped into one would show only in a user's `tokio::spawn`.
/// Native only, as the client test above.
#[cfg(not(target_arch = "wasm32"))]
#[test]
fn kept_values_are_send_sync_static() {
    fn assert_value<T: Send + Sync + 'static>() {}
    fn assert_error<E: std::error::Error + Send + Sync + 'static>() {}
    assert_error::<vantage_api_pool::auth::SharedAuthError>();
    assert_error::<vantage_api_pool::Elapsed>();
    assert_value::<AuthError>();
    assert_value::<vantage_api_pool::AuthToken>();
    assert_value::<vantage_api_pool::CallPolicy>();
    assert_value::<vantage_api_pool::RetryPolicy>();
    assert_value::<vantage_api_pool::BreakerState>();
    assert_value::<vantage_api_pool::TransportEvent>();
    assert_value::<vantage_api_pool::health::HealthObserver>();
    assert_value::<vantage_api_pool::health::ApiHealth>();
}
