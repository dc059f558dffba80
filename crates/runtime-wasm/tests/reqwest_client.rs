//! A real `ResilientClient<ReqwestTransport, WasmRuntime>` (fetch underneath)
//! against the fault server (`examples/fault_server.rs`) on 127.0.0.1, in Node and
//! in headless Chromium. Empty on other targets.
//!
//! `scripts/wasm-test` starts the server and sets `VANTAGE_FAULT_SERVER` (for
//! example `http://127.0.0.1:38211`) when it compiles this file; compiled without it,
//! every test that talks to the server fails and says so (the refused-connection
//! test talks to none).
#![cfg(target_arch = "wasm32")]

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue, StatusCode};
use vantage_api_pool::auth::{AuthError, token_fn};
use vantage_api_pool::{
    CallPolicy, ClientBuilder, ClientError, ErrorKind, EventKind, ResilientClient, Runtime,
    TimeLimit, Transport, TransportError, TransportErrorKind, TransportEvent,
};
use vantage_api_pool_reqwest::{MAX_WASM_TIMEOUT, ReqwestResponse, ReqwestTransport, reqwest};
use vantage_api_pool_testkit::RecordingObserver;
use vantage_api_pool_wasm::WasmRuntime;
use wasm_bindgen::JsValue;
use wasm_bindgen::prelude::wasm_bindgen;
use wasm_bindgen_test::wasm_bindgen_test;

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = performance, js_name = now)]
    fn raw_performance_now() -> f64;
}

/// The fault server's origin, fixed when this file was compiled.
fn server() -> &'static str {
    match option_env!("VANTAGE_FAULT_SERVER") {
        Some(origin) if !origin.is_empty() => origin.trim_end_matches('/'),
        _ => panic!(
            "VANTAGE_FAULT_SERVER was not set when this test was compiled: run \
             scripts/wasm-test, which starts the fault server on 127.0.0.1 and sets it"
        ),
    }
}

/// True in a browser, on a page or in a Web Worker; false in Node (whose global
/// `process` has `versions.node`).
fn in_browser() -> bool {
    let versions = js_sys::Reflect::get(&js_sys::global(), &JsValue::from_str("process"))
        .and_then(|process| js_sys::Reflect::get(&process, &JsValue::from_str("versions")))
        .unwrap_or(JsValue::UNDEFINED);
    !(versions.is_object()
        && js_sys::Reflect::has(&versions, &JsValue::from_str("node")).unwrap_or(false))
}

/// The body of a response the loop did not read, as text, through the portable
/// `try_into_inner` (which also compiles natively).
async fn text_of(response: ReqwestResponse) -> String {
    response
        .try_into_inner()
        .expect("the body was not read by the loop")
        .text()
        .await
        .expect("a body")
}

/// A path no earlier run used, so counts start at zero even when the server is shared.
fn fresh(prefix: &str) -> String {
    let nonce = (js_sys::Math::random() * 9_007_199_254_740_992.0) as u64;
    format!("/{prefix}/{nonce:x}")
}

type Client = ResilientClient<ReqwestTransport, WasmRuntime>;

fn client(observer: &RecordingObserver) -> Client {
    builder(observer).build().expect("valid settings")
}

/// The builder of [`client`], for a client with more settings.
fn builder(observer: &RecordingObserver) -> ClientBuilder<ReqwestTransport, WasmRuntime> {
    ResilientClient::builder(
        ReqwestTransport::new(reqwest::Client::new()),
        WasmRuntime::new(),
    )
    .observer("fault-server", Arc::new(observer.clone()))
}

/// What the fault server counted for `path` at `/count`, `/preflights` or `/closed`
/// (or, at `/closed-port`, the port it closed).
async fn counted(what: &str, path: &str) -> u64 {
    let url = format!("{}/{what}?path={}", server(), path.replace('/', "%2F"));
    let text = reqwest::Client::new()
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("the fault server at {} answers: {e}", server()))
        .text()
        .await
        .expect("a count");
    text.parse()
        .unwrap_or_else(|_| panic!("a count, got {text:?}"))
}

/// How many of `path`'s stalled answers the server saw the client close, once that
/// is at least one or after about 5 s.
async fn closed_by_client(runtime: &WasmRuntime, path: &str) -> u64 {
    for _ in 0..100 {
        let n = counted("closed", path).await;
        if n > 0 {
            return n;
        }
        runtime.sleep(Duration::from_millis(50)).await;
    }
    counted("closed", path).await
}

/// A call of one attempt, cut after `limit_ms`, to a fresh path under `prefix`,
/// which fails: the client, the path, the error, and the call's raw milliseconds.
async fn one_failing_attempt(prefix: &str, limit_ms: u64) -> (Client, String, ClientError, f64) {
    let client = client(&RecordingObserver::new());
    let path = fresh(prefix);
    let url = format!("{}{path}", server());
    let policy = CallPolicy::background()
        .with_attempt_timeout(Duration::from_millis(limit_ms))
        .expect("a valid attempt timeout");
    let raw_start = raw_performance_now();
    let err = client
        .execute_with(&policy, |http| http.get(&url))
        .await
        .expect_err("the call fails");
    (client, path, err, raw_performance_now() - raw_start)
}

/// A bounded policy of `retries` retries, 5 ms apart.
fn retrying_every_5_ms(retries: u32) -> CallPolicy {
    CallPolicy::bounded(vantage_api_pool::RetryPolicy {
        max_retries: retries,
        base: Duration::from_millis(5),
        max: Duration::from_millis(5),
    })
}

fn events(observer: &RecordingObserver) -> Vec<TransportEvent> {
    observer.events().into_iter().map(|r| r.event).collect()
}

#[wasm_bindgen_test]
async fn a_503_with_retry_after_1_then_200_succeeds_no_earlier_than_a_second_later() {
    let observer = RecordingObserver::new();
    let client = client(&observer);
    let path = fresh("flaky");
    let url = format!("{}{path}", server());

    let raw_start = raw_performance_now();
    let start = client.runtime().now();
    // A custom header makes a browser send an OPTIONS preflight first.
    let response = client
        .execute(|http| http.get(&url).header("x-wasm-test", "1"))
        .await
        .expect("the retry after the 503 succeeds");
    let raw = raw_performance_now() - raw_start;

    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        raw >= 1_000.0,
        "succeeded after {raw} ms of performance.now()"
    );
    assert!(raw < 10_000.0, "took {raw} ms");
    assert_eq!(
        counted("count", &path).await,
        2,
        "two attempts reached the server"
    );
    if in_browser() {
        assert!(
            counted("preflights", &path).await >= 1,
            "the browser preflighted the custom header (and the server did not count it)"
        );
    }

    assert_eq!(
        observer.kinds(),
        [
            "started",
            "failed",
            "retry_scheduled",
            "started",
            "succeeded"
        ]
    );
    observer.check_contract().expect("observer contract");
    let events = events(&observer);
    let EventKind::Failed {
        error, sent: true, ..
    } = &events[1].kind
    else {
        panic!("a real failed send: {:?}", events[1]);
    };
    assert_eq!(error.status(), Some(StatusCode::SERVICE_UNAVAILABLE));
    assert_eq!(error.attempts(), 1);
    // Both exposed by the server's Access-Control-Expose-Headers.
    assert_eq!(error.retry_after(), Some(Duration::from_secs(1)));
    assert_eq!(
        error.request_id(),
        Some(format!("req-{}-1", path[1..].replace('/', "-")).as_str())
    );
    let EventKind::RetryScheduled { attempt: 2, after } = events[2].kind else {
        panic!("a retry: {:?}", events[2]);
    };
    // The server's delay, plus at most the default jitter of a quarter.
    assert!(
        after >= Duration::from_secs(1) && after <= Duration::from_millis(1_250),
        "{after:?}"
    );
    assert!(events[3].at - events[1].at >= Duration::from_secs(1));
    assert!(events[3].at - start >= Duration::from_secs(1));
    let EventKind::Succeeded {
        send: 2,
        attempt: 2,
        status,
        bytes,
        ..
    } = events[4].kind
    else {
        panic!("the second send succeeds: {:?}", events[4]);
    };
    assert_eq!(status, StatusCode::OK);
    // fetch's body length is not known at the head (see
    // `a_compressed_body_within_the_limit_is_read_…`).
    assert_eq!(bytes, None);
    assert_eq!(client.runtime().pending_timers(), 0);
}

#[wasm_bindgen_test]
async fn a_404_is_final_after_one_attempt_with_its_body() {
    let observer = RecordingObserver::new();
    let client = client(&observer);
    let path = fresh("missing");
    let url = format!("{}{path}", server());

    let err: ClientError = client
        .execute(|http| http.get(&url))
        .await
        .expect_err("a 404 is an error");

    assert_eq!(err.kind(), ErrorKind::Status(StatusCode::NOT_FOUND));
    assert_eq!(err.attempts(), 1);
    assert!(!err.is_retryable());
    assert_eq!(err.body_text().as_deref(), Some("no such order"));
    assert_eq!(
        err.request_id(),
        Some(format!("req-{}-1", path[1..].replace('/', "-")).as_str())
    );
    assert_eq!(err.to_string(), "HTTP 404 after 1 attempt");
    assert_eq!(observer.kinds(), ["started", "failed"]);
    observer.check_contract().expect("observer contract");
    assert_eq!(counted("count", &path).await, 1);
}

#[wasm_bindgen_test]
async fn a_refused_connection_is_interrupted_because_fetch_cannot_tell() {
    // Fetch reports a refused connection, a DNS failure, a reset and a CORS refusal
    // as the same TypeError: the adapter cannot say `Connect`, so it says
    // `Interrupted` (retried only for idempotent calls). The fault server hands out
    // a port of 127.0.0.1 it bound and closed, so nothing listens there.
    let port = counted("closed-port", "").await;
    assert_ne!(port, 0, "the fault server names a closed port");
    let url = format!("http://127.0.0.1:{port}/nothing-listens-here");
    let observer = RecordingObserver::new();
    let client = client(&observer);
    let err = client
        .execute_with(&CallPolicy::background(), |http| http.get(&url))
        .await
        .expect_err("nothing listens on that port");
    assert_eq!(
        err.kind(),
        ErrorKind::Transport(TransportErrorKind::Interrupted),
        "{err:?}"
    );
    assert_eq!(err.attempts(), 1);
    assert!(!err.to_string().contains("127.0.0.1"), "{err}");
    assert_eq!(observer.kinds(), ["started", "failed"]);
}

#[wasm_bindgen_test]
async fn a_body_is_read_by_the_caller_after_success() {
    let observer = RecordingObserver::new();
    let client = client(&observer);
    let path = fresh("plain");
    let url = format!("{}{path}", server());
    let response = client.execute(|http| http.get(&url)).await.expect("200");
    assert_eq!(response.status(), StatusCode::OK);
    // Unknown on wasm32: fetch decodes bodies, and its `Content-Length` may be the
    // encoded one's (see `a_compressed_body_within_the_limit_is_read_…`).
    assert_eq!(response.content_length(), None);
    // The portable forms, which also compile natively.
    assert_eq!(
        response.as_inner().map(|inner| inner.status()),
        Some(StatusCode::OK)
    );
    assert_eq!(text_of(response).await, "ok");
    assert_eq!(counted("count", &path).await, 1);
}

#[wasm_bindgen_test]
async fn a_request_timeout_longer_than_a_js_timer_takes_is_cut_to_it_not_a_panic() {
    // reqwest hands the timeout to `setTimeout` as an i32 of milliseconds and panics
    // past it, which on wasm32 aborts the whole instance: `send` cuts it to
    // `MAX_WASM_TIMEOUT`, whether it was set on the draft or changed after `prepare`
    // (through `DerefMut`). Without the cut each of these sends panics.
    let transport = ReqwestTransport::new(reqwest::Client::new());
    let url = format!("{}{}", server(), fresh("plain"));
    for asked in [
        Duration::MAX,
        Duration::from_secs(30 * 24 * 3600),
        // reqwest takes whole milliseconds, cut down: the first value it panics on.
        MAX_WASM_TIMEOUT + Duration::from_millis(1),
    ] {
        let draft = transport.handle().get(&url).timeout(asked);
        let prepared = transport.prepare(draft).expect("a valid request");
        let response = transport.send(prepared).await.expect("200");
        assert_eq!(response.status(), StatusCode::OK, "{asked:?}");
        let mut prepared = transport
            .prepare(transport.handle().get(&url))
            .expect("a valid request");
        *prepared.timeout_mut() = Some(asked);
        let response = transport.send(prepared).await.expect("200");
        assert_eq!(
            response.status(),
            StatusCode::OK,
            "{asked:?}, set after prepare"
        );
    }
    let observer = RecordingObserver::new();
    let client = client(&observer);
    let path = fresh("plain");
    let url = format!("{}{path}", server());
    let response = client
        .execute(|http| http.get(&url).timeout(Duration::MAX))
        .await
        .expect("200");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.bytes().await.expect("a body").as_ref(), b"ok");
    assert_eq!(counted("count", &path).await, 1);
}

/// Wraps `setTimeout` so that every delay it is given is kept, in order, in
/// `globalThis.__delays`; `restore` puts the real one back and returns the delays.
fn record_timer_delays(restore: bool) -> Vec<f64> {
    let body = "if (restore) {\
                    globalThis.setTimeout = globalThis.__realSetTimeout;\
                    const delays = globalThis.__delays;\
                    globalThis.__delays = [];\
                    return delays;\
                }\
                globalThis.__realSetTimeout = globalThis.__realSetTimeout || globalThis.setTimeout;\
                globalThis.__delays = [];\
                globalThis.setTimeout = function (f, delay, ...rest) {\
                    globalThis.__delays.push(delay);\
                    return globalThis.__realSetTimeout(f, delay, ...rest);\
                };\
                return [];";
    let delays = js_sys::Function::new_with_args("restore", body)
        .call1(&JsValue::NULL, &JsValue::from_bool(restore))
        .expect("the wrapper is installed");
    js_sys::Array::from(&delays)
        .iter()
        .filter_map(|d| d.as_f64())
        .collect()
}

#[wasm_bindgen_test]
async fn a_request_timeout_reaches_its_timer_rounded_up_never_cut_down() {
    // reqwest hands the timeout to `setTimeout` as whole milliseconds cut down, and a
    // Node timer can fire a millisecond early: `send` rounds it up, plus one.
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            record_timer_delays(true);
        }
    }
    let transport = ReqwestTransport::new(reqwest::Client::new());
    let url = format!("{}{}", server(), fresh("plain"));
    for (asked, armed) in [
        (Duration::from_micros(9_990), 11.0),
        (Duration::from_micros(900), 2.0),
        (Duration::from_secs(5), 5_001.0),
    ] {
        let restore = Restore;
        record_timer_delays(false);
        let draft = transport.handle().get(&url).timeout(asked);
        let prepared = transport.prepare(draft).expect("a valid request");
        // Answered or cut by its (short) timeout: only the timer it armed counts.
        let _ = transport.send(prepared).await;
        let delays = record_timer_delays(true);
        drop(restore);
        assert!(
            delays.contains(&armed),
            "{asked:?}: timers armed {delays:?}, none of {armed} ms"
        );
    }
}

/// Replaces `fetch` with one whose every answer is a 200 whose body fails after its
/// first chunk with a JavaScript error named `name` (an `Error`, or a `DOMException`
/// of that name) holding `message`; `restore` puts the real one back. Tests run one
/// at a time, so no other test sees the fake.
fn fake_fetch_with_failing_body(name: &str, message: &str, restore: bool) {
    let body = "if (restore) {\
                    globalThis.fetch = globalThis.__realFetch;\
                    return;\
                }\
                globalThis.__realFetch = globalThis.__realFetch || globalThis.fetch;\
                globalThis.fetch = async function (input) {\
                    let sent = false;\
                    const stream = new ReadableStream({\
                        pull(controller) {\
                            if (sent) {\
                                controller.error(name === 'Error'\
                                    ? new Error(message)\
                                    : new DOMException(message, name));\
                                return;\
                            }\
                            sent = true;\
                            controller.enqueue(new Uint8Array([111, 107]));\
                        }\
                    });\
                    const response = new Response(stream, { status: 200 });\
                    Object.defineProperty(response, 'url', { value: input.url || String(input) });\
                    return response;\
                };";
    js_sys::Function::new_with_args("name, message, restore", body)
        .call3(
            &JsValue::NULL,
            &JsValue::from_str(name),
            &JsValue::from_str(message),
            &JsValue::from_bool(restore),
        )
        .expect("the fake is installed");
}

/// Puts the real `fetch` back however a test that faked it ends.
struct RestoreFetch;

impl Drop for RestoreFetch {
    fn drop(&mut self) {
        fake_fetch_with_failing_body("", "", true);
    }
}

/// The error reading a body that a fake `fetch` fails after its first chunk with a
/// JavaScript error named `name` holding `message` (see
/// [`fake_fetch_with_failing_body`]), sent through the transport with `timeout` as
/// the request's own.
async fn body_failing_with(name: &str, message: &str, timeout: Option<Duration>) -> TransportError {
    fake_fetch_with_failing_body(name, message, false);
    let restore = RestoreFetch;
    let transport = ReqwestTransport::new(reqwest::Client::new());
    let mut draft = transport
        .handle()
        .get(format!("{}{}", server(), fresh("plain")));
    if let Some(timeout) = timeout {
        draft = draft.timeout(timeout);
    }
    let request = transport.prepare(draft).expect("a valid request");
    let sent = transport.send(request).await;
    let read = match sent {
        Ok(mut response) => vantage_api_pool::transport::read_body(&mut response, 1000).await,
        Err(e) => Err(e),
    };
    drop(restore);
    read.expect_err("the body fails")
}

/// A timeout that never passes in a test.
const LONG: Option<Duration> = Some(Duration::from_secs(60));

#[wasm_bindgen_test]
async fn a_body_error_that_only_quotes_the_timeout_abort_is_not_a_timeout() {
    // reqwest's own timeout aborts a fetch with exactly `JsValue("reqwest::errors::
    // TimedOut")`; a body error whose text merely holds those words (a proxy quoting
    // it, say) broke the exchange: `Interrupted`, though the request had a timeout.
    let err = body_failing_with("Error", "JsValue(\"reqwest::errors::TimedOut\")", LONG).await;
    assert_eq!(err.kind(), TransportErrorKind::Interrupted, "{err}");
    // Nor is an `Error` whose message only starts with an abort's name.
    let err = body_failing_with("Error", "AbortError: The user aborted a request.", LONG).await;
    assert_eq!(err.kind(), TransportErrorKind::Interrupted, "{err}");
}

#[wasm_bindgen_test]
async fn a_body_that_fails_with_an_abort_error_was_cut_by_the_timeout_if_it_had_one() {
    // Chromium errors the body of a fetch reqwest aborted (only the request's
    // timeout does, while the body is still read) with its own `AbortError`, not
    // the abort's reason: the adapter calls it `TimedOut` in every runtime, not only
    // where a browser happens to do so.
    let abort = "The user aborted a request.";
    let err = body_failing_with("AbortError", abort, LONG).await;
    assert_eq!(err.kind(), TransportErrorKind::TimedOut, "{err}");
    // Without a timeout no abort is reqwest's: the exchange was broken off.
    let err = body_failing_with("AbortError", abort, None).await;
    assert_eq!(err.kind(), TransportErrorKind::Interrupted, "{err}");
    // A response reqwest sent without the adapter cannot tell: its wrapper reads
    // the body as `body_error` does, the abort a timeout's. (Read in chunks:
    // Chromium's `arrayBuffer()` of a made-up response turns its stream's error
    // into a `TypeError`.)
    fake_fetch_with_failing_body("AbortError", abort, false);
    let restore = RestoreFetch;
    let sent = reqwest::Client::new()
        .get(format!("{}{}", server(), fresh("plain")))
        .send()
        .await;
    let read = match sent {
        Ok(response) => {
            let mut response = ReqwestResponse::new(response);
            vantage_api_pool::transport::read_body(&mut response, 1000).await
        }
        Err(e) => Err(vantage_api_pool_reqwest::transport_error(e)),
    };
    drop(restore);
    let err = read.expect_err("the body fails");
    assert_eq!(err.kind(), TransportErrorKind::TimedOut, "{err}");
}

#[wasm_bindgen_test]
async fn a_head_that_never_comes_is_timed_out_by_the_requests_timeout() {
    // The server takes the request and never answers: reqwest's own timeout aborts
    // the fetch before any head, which the adapter reports as `TimedOut`.
    let transport = ReqwestTransport::new(reqwest::Client::new());
    let path = fresh("stall-head");
    let draft = transport
        .handle()
        .get(format!("{}{path}", server()))
        .timeout(Duration::from_millis(300));
    let prepared = transport.prepare(draft).expect("a valid request");
    let Err(err) = transport.send(prepared).await else {
        panic!("no head comes, yet the send succeeded");
    };
    assert_eq!(err.kind(), TransportErrorKind::TimedOut, "{err}");
    assert!(!err.to_string().contains("127.0.0.1"), "{err}");
    assert_eq!(counted("count", &path).await, 1);
}

#[wasm_bindgen_test]
async fn a_header_fetch_cannot_carry_is_config_and_nothing_is_sent() {
    // `http` takes bytes above 0x7f in a header value; fetch's `Headers` takes only
    // text, so reqwest refuses the request as it sends it, before fetch is called.
    let observer = RecordingObserver::new();
    let client = client(&observer);
    let path = fresh("plain");
    let url = format!("{}{path}", server());
    let value = http::HeaderValue::from_bytes(b"caf\xc3\xa9").expect("obs-text is allowed");
    let err = client
        .execute(|http| http.get(&url).header("x-note", value.clone()))
        .await
        .expect_err("fetch cannot carry the header");
    assert_eq!(
        err.kind(),
        ErrorKind::Transport(TransportErrorKind::Config),
        "{err:?}"
    );
    assert_eq!(err.attempts(), 1);
    assert!(err.nothing_sent());
    assert_eq!(
        counted("count", &path).await,
        0,
        "nothing reached the server"
    );
}

#[wasm_bindgen_test]
async fn a_credential_a_browser_would_drop_is_config_there_and_goes_out_in_node() {
    // A browser's fetch drops a `cookie`, `cookie2` or `proxy-authorization` header,
    // and any `sec-*` one, set by a page or a worker, without an error: there the
    // adapter refuses the request before the fetch (a token under `cookie` would
    // otherwise end every call with its second 401). Node's fetch sends them, and
    // they reach the server; a token under `authorization` goes out everywhere. The
    // headers are set by the request, or are the token.
    let server_saw = |at: usize| {
        let mut seen = ["-"; 5];
        seen[at] = "s=1";
        seen.join("|")
    };
    for (name, by_token, dropped_by_browsers, echoed) in [
        ("cookie", false, true, server_saw(0)),
        ("cookie2", false, true, server_saw(1)),
        ("proxy-authorization", false, true, server_saw(2)),
        ("cookie", true, true, server_saw(0)),
        ("sec-token", true, true, server_saw(3)),
        ("authorization", true, false, server_saw(4)),
    ] {
        let case = format!("{name}{}", if by_token { " (token)" } else { "" });
        let observer = RecordingObserver::new();
        let path = fresh("credentials");
        let url = format!("{}{path}", server());
        let result = if by_token {
            let token = HeaderName::from_static(name);
            builder(&observer)
                .auth(token_fn(move || {
                    let token = token.clone();
                    async move { Ok::<_, AuthError>((token, HeaderValue::from_static("s=1"))) }
                }))
                .build()
                .expect("valid settings")
                .execute(|http| http.get(&url))
                .await
        } else {
            client(&observer)
                .execute(|http| http.get(&url).header(name, "s=1"))
                .await
        };
        if in_browser() && dropped_by_browsers {
            let err = result.expect_err("a browser would drop the header");
            assert_eq!(
                err.kind(),
                ErrorKind::Transport(TransportErrorKind::Config),
                "{case}: {err:?}"
            );
            assert_eq!(err.attempts(), 1, "{case}: final");
            assert!(err.nothing_sent(), "{case}");
            let message = std::error::Error::source(&err).map(ToString::to_string);
            assert!(
                message
                    .as_deref()
                    .is_some_and(|m| m.contains(&format!("`{name}`"))),
                "{case}: the error names the header: {message:?}"
            );
            // A cookie's refusal says how a browser sends cookies instead.
            let cookie_hint = message
                .as_deref()
                .is_some_and(|m| m.contains("sends its own cookies"));
            assert_eq!(
                cookie_hint,
                name.starts_with("cookie"),
                "{case}: {message:?}"
            );
            assert_eq!(counted("count", &path).await, 0, "{case}: nothing sent");
        } else {
            let response = result.expect("fetch sends the header");
            assert_eq!(text_of(response).await, echoed, "{case} reached the server");
            assert_eq!(counted("count", &path).await, 1, "{case}");
        }
        observer.check_contract().expect("observer contract");
    }
}

#[wasm_bindgen_test]
async fn execute_read_sends_a_get_again_when_its_body_is_cut_off() {
    // The first answer's body breaks off after 10 of 100 bytes (the connection
    // closes): fetch reports it mid-body, the adapter as `Interrupted`, and the loop,
    // reading the body inside the attempt, sends the GET again.
    let observer = RecordingObserver::new();
    let client = client(&observer);
    let path = fresh("cut-once");
    let url = format!("{}{path}", server());
    let policy = retrying_every_5_ms(2);
    let read = client
        .execute_read_with(&policy, 1000, |http| http.get(&url))
        .await
        .expect("the second answer is read whole");
    assert_eq!(read.status(), StatusCode::OK);
    assert_eq!(read.body().as_ref(), &[b'x'; 100][..]);
    assert_eq!(counted("count", &path).await, 2);
    assert_eq!(
        observer.kinds(),
        [
            "started",
            "failed",
            "retry_scheduled",
            "started",
            "succeeded"
        ]
    );
    observer.check_contract().expect("observer contract");
    let broke = events(&observer).into_iter().find_map(|e| match e.kind {
        EventKind::Failed { error, sent, .. } => Some((error.kind(), sent)),
        _ => None,
    });
    assert_eq!(
        broke,
        Some((ErrorKind::Transport(TransportErrorKind::Interrupted), true))
    );
}

#[wasm_bindgen_test]
async fn execute_read_cuts_a_stalled_body_at_the_attempt_timeout() {
    let observer = RecordingObserver::new();
    let client = client(&observer);
    let path = fresh("stall-body");
    let url = format!("{}{path}", server());
    let policy = CallPolicy::background()
        .with_attempt_timeout(Duration::from_millis(300))
        .expect("a valid attempt timeout");
    let err = client
        .execute_read_with(&policy, 1000, |http| http.get(&url))
        .await
        .expect_err("the body stalls");
    assert_eq!(err.kind(), ErrorKind::TimedOut, "{err:?}");
    assert_eq!(err.time_limit(), Some(TimeLimit::AttemptTimeout));
    assert_eq!(client.runtime().pending_timers(), 0);
    let closed = closed_by_client(client.runtime(), &path).await;
    assert_eq!(closed, 1, "the fetch was aborted: the server saw it close");
    observer.check_contract().expect("observer contract");
}

#[wasm_bindgen_test]
async fn a_body_cut_by_the_requests_timeout_is_timed_out() {
    // The head comes at once, then 10 of 100 body bytes, then nothing: the request's
    // own 500 ms timeout aborts the fetch mid-body, which reqwest reports as a decode
    // error; the adapter must still call it TimedOut, as on native.
    let observer = RecordingObserver::new();
    let client = client(&observer);
    let url = format!("{}{}", server(), fresh("stall-body"));
    let response = client
        .execute(|http| http.get(&url).timeout(Duration::from_millis(500)))
        .await
        .expect("the head arrives");
    assert_eq!(response.status(), StatusCode::OK);
    let err = response.bytes().await.expect_err("the body stalls");
    assert_eq!(err.kind(), TransportErrorKind::TimedOut, "{err}");
    assert!(!err.to_string().contains("127.0.0.1"), "{err}");
    // The same through `chunk()`, the path the loop's own body reads take (an
    // unread response's `bytes()` goes to reqwest directly).
    let url = format!("{}{}", server(), fresh("stall-body"));
    let mut response = client
        .execute(|http| http.get(&url).timeout(Duration::from_millis(500)))
        .await
        .expect("the head arrives");
    let err = vantage_api_pool::transport::read_body(&mut response, 1000)
        .await
        .expect_err("the body stalls");
    assert_eq!(err.kind(), TransportErrorKind::TimedOut, "{err}");
    assert!(!err.to_string().contains("127.0.0.1"), "{err}");
}

#[wasm_bindgen_test]
async fn the_attempt_timeout_aborts_a_fetch_whose_head_never_comes() {
    // No timeout of reqwest's own: only the loop's time limit ends the send, by
    // dropping its future, which must abort the fetch (or it would hold a connection
    // and the server's attention until the server gave up).
    let (client, path, err, raw) = one_failing_attempt("stall-head", 300).await;
    assert_eq!(err.kind(), ErrorKind::TimedOut, "{err:?}");
    assert_eq!(err.time_limit(), Some(TimeLimit::AttemptTimeout));
    assert!((300.0..5_000.0).contains(&raw), "ended after {raw} ms");
    assert_eq!(client.runtime().pending_timers(), 0);
    assert_eq!(counted("count", &path).await, 1);
    let closed = closed_by_client(client.runtime(), &path).await;
    assert_eq!(closed, 1, "the fetch was aborted: the server saw it close");
}

#[wasm_bindgen_test]
async fn an_error_body_is_read_to_2048_bytes_and_no_further() {
    // A 503 announcing a megabyte sends 4,096 bytes, then nothing: the loop keeps
    // 2,048 and lets the response go at once, long before its 20 s time limit,
    // which aborts the fetch.
    let (client, path, err, raw) = one_failing_attempt("long-error", 20_000).await;
    assert_eq!(
        err.status(),
        Some(StatusCode::SERVICE_UNAVAILABLE),
        "{err:?}"
    );
    assert_eq!(err.body(), Some(&[b'e'; 2048][..]));
    assert!(
        raw < 10_000.0,
        "took {raw} ms: it waited past the 2,048 bytes it keeps"
    );
    assert_eq!(client.runtime().pending_timers(), 0);
    let closed = closed_by_client(client.runtime(), &path).await;
    assert_eq!(
        closed, 1,
        "the unread rest was given up: the server saw it close"
    );
}

#[wasm_bindgen_test]
async fn an_error_body_that_stalls_is_cut_by_the_attempt_timeout_keeping_what_came() {
    // A 503 announcing 100 body bytes sends 10, then nothing: the attempt's time
    // limit cuts the read, and the call keeps the status and the 10 bytes.
    let (client, path, err, raw) = one_failing_attempt("stall-error", 500).await;
    assert_eq!(
        err.status(),
        Some(StatusCode::SERVICE_UNAVAILABLE),
        "{err:?}"
    );
    assert_eq!(err.body(), Some(&b"0123456789"[..]));
    assert_eq!(err.attempts(), 1);
    assert!((500.0..5_000.0).contains(&raw), "ended after {raw} ms");
    assert_eq!(client.runtime().pending_timers(), 0);
    assert_eq!(counted("count", &path).await, 1);
    let closed = closed_by_client(client.runtime(), &path).await;
    assert_eq!(
        closed, 1,
        "the stalled body was given up: the server saw it close"
    );
}

/// The fault server's count of requests to `path`: a POST the server answered with a
/// 303, whose GET met `then`, went out once.
async fn a_post_answered_by_a_303_goes_out_once<A: vantage_api_pool::TokenSource>(
    prefix: &str,
    client: ResilientClient<ReqwestTransport, WasmRuntime, A>,
) -> (u64, Result<StatusCode, ClientError>) {
    let path = fresh(prefix);
    let url = format!("{}{path}", server());
    let policy = retrying_every_5_ms(3);
    let result = client
        .execute_with(&policy, |http| http.post(&url).body("order #1"))
        .await
        .map(|response| response.status());
    (counted("count", &path).await, result)
}

#[wasm_bindgen_test]
async fn a_post_a_303_answered_is_not_sent_again_for_what_its_get_met() {
    // fetch follows the 303 out of sight; the final URL tells the adapter that the
    // response answers the GET it led to, so neither a 429 to that GET nor its 401
    // (a token refresh and a replay) sends the POST again. The same natively.
    let observer = RecordingObserver::new();
    let plain = builder(&observer).build().expect("valid settings");
    let (posts, result) = a_post_answered_by_a_303_goes_out_once("see-other-busy", plain).await;
    assert_eq!(posts, 1, "{result:?}");
    let err = result.expect_err("the 429 is final for the POST");
    assert_eq!(err.status(), Some(StatusCode::TOO_MANY_REQUESTS));
    assert!(err.answered_by_redirect());
    let token = token_fn(|| async {
        Ok::<_, AuthError>((
            http::header::AUTHORIZATION,
            HeaderValue::from_static("Bearer t"),
        ))
    });
    let with_token = builder(&RecordingObserver::new())
        .auth(token)
        .build()
        .expect("valid settings");
    let (posts, result) =
        a_post_answered_by_a_303_goes_out_once("see-other-unauth", with_token).await;
    assert_eq!(posts, 1, "{result:?}");
    let err = result.expect_err("the 401 is final for the POST");
    assert_eq!(err.status(), Some(StatusCode::UNAUTHORIZED));
    // A GET or HEAD that the 303 leads to the same 429 is sent again: fetch kept
    // its method, so the answer is its own, not marked as a redirect's.
    let client = client(&RecordingObserver::new());
    let policy = retrying_every_5_ms(1);
    for method in [http::Method::GET, http::Method::HEAD] {
        let path = fresh("see-other-busy");
        let url = format!("{}{path}", server());
        let err = client
            .execute_with(&policy, |http| http.request(method.clone(), &url))
            .await
            .expect_err("429 twice");
        assert_eq!(
            (err.attempts(), counted("count", &path).await),
            (2, 2),
            "{method}"
        );
        assert!(!err.answered_by_redirect(), "{method}: {err:?}");
    }
}

#[wasm_bindgen_test]
async fn a_compressed_body_within_the_limit_is_read_not_too_large() {
    // 100 bytes, gzip-encoded in 123: fetch hands over the 100, so a limit of 100
    // reads them, whatever the `Content-Length` of the encoded body says.
    let client = client(&RecordingObserver::new());
    let path = fresh("gzip-stored");
    let url = format!("{}{path}", server());
    let read = client
        .execute_read_with(&CallPolicy::background(), 100, |http| http.get(&url))
        .await
        .expect("100 bytes under a limit of 100");
    assert_eq!(read.body().as_ref(), &[b'x'; 100][..]);
}

#[wasm_bindgen_test]
async fn a_post_to_a_path_the_platform_encodes_otherwise_was_not_redirected() {
    // Chromium sends (and reports back in its final URL) a `|` in a path as `%7C`,
    // which reqwest's URL keeps as it is: the same place, so the POST's own 429 is
    // retried like any (an outside review's case: it was taken for a redirect).
    let client = client(&RecordingObserver::new());
    let path = format!("{}/auth0|123^x", fresh("busy"));
    let url = format!("{}{path}", server());
    let policy = retrying_every_5_ms(1);
    let err = client
        .execute_with(&policy, |http| http.post(&url).body("order #1"))
        .await
        .expect_err("429 twice");
    assert!(!err.answered_by_redirect(), "no redirect was followed");
    assert_eq!(err.attempts(), 2, "the POST's own 429 is retried");
}

#[wasm_bindgen_test]
async fn a_401_from_another_origin_a_redirect_led_to_is_final() {
    // fetch follows the 302 to the server's second port, another origin, dropping
    // `Authorization` on the way: the 401 there says nothing of the token, so no
    // token is fetched for it and the GET is not replayed.
    let fetches = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counted_fetches = Arc::clone(&fetches);
    let client = builder(&RecordingObserver::new())
        .auth(token_fn(move || {
            counted_fetches.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async {
                Ok::<_, AuthError>((
                    http::header::AUTHORIZATION,
                    HeaderValue::from_static("Bearer t"),
                ))
            }
        }))
        .build()
        .expect("valid settings");
    let target = fresh("unauth");
    let url = format!("{}/elsewhere{target}", server());
    let err = client
        .execute_with(&retrying_every_5_ms(2), |http| http.get(&url))
        .await
        .expect_err("a 401");
    assert_eq!(err.status(), Some(StatusCode::UNAUTHORIZED));
    assert!(err.credentials_dropped(), "{err:?}");
    assert_eq!(err.attempts(), 1, "not replayed");
    assert_eq!(
        fetches.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "no refresh"
    );
    assert_eq!(counted("count", &target).await, 1);
}
