//! The scripted transport on the virtual clock.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, StatusCode};
use vantage_api_pool::{
    Elapsed, Instant, PreparedRequest, Transport, TransportErrorKind, TransportResponse, timeout_at,
};
use vantage_api_pool_testkit::{
    Reply, ScriptedRequest, ScriptedResponse, ScriptedTransport, VirtualRuntime,
};

fn at(ms: u64) -> Instant {
    Instant::ORIGIN + Duration::from_millis(ms)
}

fn get(transport: &ScriptedTransport, path: &'static str) -> ScriptedRequest {
    transport.prepare(transport.handle().get(path)).unwrap()
}

fn setup() -> (VirtualRuntime, ScriptedTransport) {
    let rt = VirtualRuntime::new();
    let transport = ScriptedTransport::new(&rt);
    (rt, transport)
}

#[test]
fn a_stalled_send_is_ended_by_timeout_at_at_exactly_ten_seconds() {
    let (rt, transport) = setup();
    transport.push(Reply::stall());
    rt.advance(Duration::from_secs(1));
    let request = get(&transport, "/slow");
    let result = rt
        .block_on(timeout_at(
            &rt,
            rt.now() + Duration::from_secs(10),
            transport.send(request),
        ))
        .unwrap();
    assert!(matches!(result, Err(Elapsed)));
    assert_eq!(rt.now(), at(11_000));
    assert_eq!(transport.in_flight(), 0, "the cut send was dropped");
    assert_eq!(transport.peak_in_flight(), 1);
    assert_eq!(rt.pending_timers(), 0);
    let requests = transport.requests();
    assert_eq!((requests.len(), requests[0].at), (1, at(1000)));
}

#[test]
fn a_stall_with_no_time_limit_is_a_deadlock() {
    let (rt, transport) = setup();
    transport.push(Reply::stall());
    let err = rt
        .block_on(transport.send(get(&transport, "/")))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "deadlock at +0ns: 1 task parked and no timer to wait for"
    );
}

#[test]
fn delayed_replies_arrive_at_exactly_their_virtual_time() {
    let (rt, transport) = setup();
    transport.on_path("/a", [Reply::ok().after(Duration::from_millis(700))]);
    transport.on_path("/b", [Reply::status(503).after(Duration::from_millis(250))]);
    transport.on_path(
        "/c",
        [Reply::fail(TransportErrorKind::Connect, "refused").after(Duration::from_secs(3))],
    );
    let log = Rc::new(RefCell::new(Vec::new()));
    for path in ["/a", "/b", "/c"] {
        let (t, rt2, log) = (transport.clone(), rt.clone(), Rc::clone(&log));
        rt.spawn(async move {
            let outcome = match t.send(get(&t, path)).await {
                Ok(response) => response.status().as_u16().to_string(),
                Err(e) => e.to_string(),
            };
            log.borrow_mut().push((path, outcome, rt2.now()));
        })
        .detach();
    }
    rt.run().unwrap();
    assert_eq!(
        *log.borrow(),
        [
            ("/b", "503".to_string(), at(250)),
            ("/a", "200".to_string(), at(700)),
            ("/c", "connect: refused".to_string(), at(3000)),
        ]
    );
    assert_eq!(transport.peak_in_flight(), 3);
    assert_eq!(transport.in_flight(), 0);
    // All three started at zero.
    assert!(transport.requests().iter().all(|r| r.at == Instant::ORIGIN));
}

async fn read_all(response: &mut ScriptedResponse) -> Vec<Bytes> {
    let mut chunks = Vec::new();
    while let Some(chunk) = response.chunk().await.unwrap() {
        chunks.push(chunk);
    }
    chunks
}

#[test]
fn a_body_stalls_after_n_bytes() {
    let (rt, transport) = setup();
    let body: Vec<u8> = (0..=255u8).cycle().take(5000).collect();
    transport.push(
        Reply::status(500)
            .body(body.clone())
            .chunk_size(1024)
            .body_stalls_after(2500),
    );
    let mut response = rt
        .block_on(transport.send(get(&transport, "/")))
        .unwrap()
        .unwrap();
    let (read, cut) = rt
        .block_on(async {
            let mut read = Vec::new();
            let deadline = rt.now() + Duration::from_secs(10);
            let cut = timeout_at(&rt, deadline, async {
                while let Some(chunk) = response.chunk().await.unwrap() {
                    read.extend_from_slice(&chunk);
                }
            })
            .await;
            (read, cut)
        })
        .unwrap();
    assert_eq!(cut, Err(Elapsed));
    assert_eq!(read, body[..2500]);
    assert_eq!(response.bytes_read(), 2500);
    assert_eq!(rt.now(), at(10_000));

    // Stalling after more bytes than the body has: all of it, then no end.
    let (rt, transport) = setup();
    transport.push(Reply::ok().body("short").body_stalls_after(100));
    let mut response = rt
        .block_on(transport.send(get(&transport, "/")))
        .unwrap()
        .unwrap();
    assert_eq!(
        rt.block_on(response.chunk()).unwrap().unwrap().unwrap(),
        "short"
    );
    let next = rt
        .block_on(timeout_at(&rt, at(1), response.chunk()))
        .unwrap();
    assert!(next.is_err(), "the end of the body never comes");

    // Zero: the very first read stalls.
    transport.push(Reply::ok().body("x").body_stalls_after(0));
    let mut response = rt
        .block_on(transport.send(get(&transport, "/")))
        .unwrap()
        .unwrap();
    assert!(
        rt.block_on(response.chunk()).is_err(),
        "deadlock: nothing to wait for"
    );
}

/// Every chunk read of one response to `reply`, until the end, an error, or a read
/// that is still pending after a minute: `Ok(Some(bytes))`, `Ok(None)` for the end,
/// `Err(kind)`, and the string "stalled".
fn reads(reply: Reply) -> Vec<String> {
    let (rt, transport) = setup();
    transport.push(reply);
    let mut response = rt
        .block_on(transport.send(get(&transport, "/")))
        .unwrap()
        .unwrap();
    let mut seen = Vec::new();
    for _ in 0..6 {
        let read = rt
            .block_on(timeout_at(
                &rt,
                rt.now() + Duration::from_secs(60),
                response.chunk(),
            ))
            .unwrap();
        let (text, last) = match read {
            Err(Elapsed) => ("stalled".to_owned(), true),
            Ok(Ok(Some(chunk))) => (String::from_utf8(chunk.to_vec()).unwrap(), false),
            Ok(Ok(None)) => ("end".to_owned(), true),
            Ok(Err(e)) => (format!("{:?}: {}", e.kind(), e.message()), false),
        };
        seen.push(text);
        if last {
            break;
        }
    }
    seen
}

#[test]
fn a_body_fails_after_n_bytes_and_keeps_failing() {
    let reset = |n| {
        Reply::ok().body("abcdefgh").chunk_size(3).body_fails_after(
            n,
            TransportErrorKind::Interrupted,
            "connection reset",
        )
    };
    let broken = "Interrupted: connection reset";
    assert_eq!(
        reads(reset(5)),
        ["abc", "de", broken, broken, broken, broken]
    );
    assert_eq!(reads(reset(0))[..2], [broken, broken]);
    // Past the body's end: the whole body, then the failure instead of the end.
    assert_eq!(reads(reset(100))[..4], ["abc", "def", "gh", broken]);
    // With a stall: the first cut wins; at the same byte, the failure.
    assert_eq!(reads(reset(5).body_stalls_after(2)), ["ab", "stalled"]);
    assert_eq!(
        reads(reset(5).body_stalls_after(7))[..3],
        ["abc", "de", broken]
    );
    assert_eq!(
        reads(reset(5).body_stalls_after(5))[..3],
        ["abc", "de", broken]
    );
    // Without it, the same body ends.
    assert_eq!(
        reads(Reply::ok().body("abcdefgh").chunk_size(3)),
        ["abc", "def", "gh", "end"]
    );
}

#[test]
fn a_slow_body_fails_after_its_chunk_delay_and_read_to_end_returns_the_error() {
    let (rt, transport) = setup();
    transport.push(
        Reply::ok()
            .body("abcdef")
            .chunk_size(2)
            .chunk_delay(Duration::from_secs(1))
            .body_fails_after(4, TransportErrorKind::Interrupted, "reset"),
    );
    let mut response = rt
        .block_on(transport.send(get(&transport, "/")))
        .unwrap()
        .unwrap();
    let error = rt.block_on(response.read_to_end()).unwrap().unwrap_err();
    assert_eq!(
        (error.kind(), error.message()),
        (TransportErrorKind::Interrupted, "reset")
    );
    assert_eq!(response.bytes_read(), 4);
    // Two chunks and the failed read, a second each.
    assert_eq!(rt.now(), at(3_000));
}

#[test]
fn a_stalled_send_polled_again_stays_in_flight() {
    // A stalled send raced against a sleep is polled again at every wake of its task.
    let (rt, transport) = setup();
    transport.push(Reply::stall());
    let request = get(&transport, "/hang");
    let counts = rt
        .block_on(async {
            let mut send = std::pin::pin!(transport.send(request));
            let mut counts = Vec::new();
            for _ in 0..3 {
                let sleep = std::pin::pin!(rt.sleep(Duration::from_secs(1)));
                let slept = futures::future::select(send.as_mut(), sleep).await;
                assert!(matches!(slept, futures::future::Either::Right(_)));
                counts.push(transport.in_flight());
            }
            counts
        })
        .unwrap();
    assert_eq!(counts, [1, 1, 1], "still stalled, so still in flight");
    assert_eq!(transport.in_flight(), 0, "dropped at the end of block_on");
}

#[test]
fn a_delayed_stall_starts_after_its_delay() {
    let (rt, transport) = setup();
    transport.push(Reply::stall().after(Duration::from_secs(5)));
    let send = transport.send(get(&transport, "/"));
    let err = rt.block_on(send).unwrap_err();
    assert_eq!(
        err.to_string(),
        "deadlock at +5s: 1 task parked and no timer to wait for"
    );
    assert_eq!(rt.now(), at(5_000));
}

#[test]
fn bodies_come_whole_or_in_chunks_on_the_clock() {
    let (rt, transport) = setup();
    transport.push(Reply::ok().body("hello world"));
    transport.push(
        Reply::ok()
            .body("abcdefg")
            .chunk_size(3)
            .chunk_delay(Duration::from_millis(100)),
    );
    transport.push(Reply::status(204));
    let mut whole = rt
        .block_on(transport.send(get(&transport, "/")))
        .unwrap()
        .unwrap();
    assert_eq!(rt.block_on(read_all(&mut whole)).unwrap(), ["hello world"]);
    let mut slow = rt
        .block_on(transport.send(get(&transport, "/")))
        .unwrap()
        .unwrap();
    assert_eq!(
        rt.block_on(read_all(&mut slow)).unwrap(),
        ["abc", "def", "g"]
    );
    assert_eq!(rt.now(), at(300));
    let mut empty = rt
        .block_on(transport.send(get(&transport, "/")))
        .unwrap()
        .unwrap();
    assert!(rt.block_on(read_all(&mut empty)).unwrap().is_empty());
}

#[test]
fn a_dropped_chunk_read_loses_nothing() {
    let (rt, transport) = setup();
    transport.push(
        Reply::ok()
            .body("abcdef")
            .chunk_size(3)
            .chunk_delay(Duration::from_secs(5)),
    );
    let mut response = rt
        .block_on(transport.send(get(&transport, "/")))
        .unwrap()
        .unwrap();
    let cut = rt
        .block_on(timeout_at(&rt, at(1000), response.chunk()))
        .unwrap();
    assert!(cut.is_err());
    assert_eq!(response.bytes_read(), 0);
    assert_eq!(
        rt.block_on(response.read_to_end()).unwrap().unwrap(),
        "abcdef"
    );
}

#[test]
fn content_length_comes_from_the_header_only() {
    let (rt, transport) = setup();
    transport.push(Reply::ok().body("12345").header("content-length", "5"));
    transport.push(Reply::ok().body("12345"));
    let with = rt
        .block_on(transport.send(get(&transport, "/")))
        .unwrap()
        .unwrap();
    let without = rt
        .block_on(transport.send(get(&transport, "/")))
        .unwrap()
        .unwrap();
    assert_eq!(with.content_length(), Some(5));
    assert_eq!(without.content_length(), None);
    assert_eq!(TransportResponse::status(&with), StatusCode::OK);
}

#[test]
fn answers_come_from_path_then_sequence_then_responder_then_default() {
    let (rt, transport) = setup();
    transport.on_path("/p", [Reply::status(201)]);
    transport.push_many([Reply::status(202), Reply::status(203)]);
    transport.respond_with(|request, index| {
        if request.path() == "/r" {
            Reply::status(if index == 4 { 205 } else { 206 })
        } else {
            Reply::status(299)
        }
    });
    let status = |path: &'static str| {
        rt.block_on(transport.send(get(&transport, path)))
            .unwrap()
            .map(|r| r.status().as_u16())
    };
    assert_eq!(status("/p").unwrap(), 201); // path script
    assert_eq!(status("/p").unwrap(), 202); // path script used up: sequence
    assert_eq!(status("/r").unwrap(), 203); // sequence, whatever the path
    assert_eq!(status("/q").unwrap(), 299); // responder
    assert_eq!(status("/r").unwrap(), 205); // responder sees the send index (4)
    assert_eq!(transport.scripted_remaining(), 0);

    transport.clear_script();
    transport.default_reply(Reply::status(207));
    assert_eq!(status("/p").unwrap(), 207);
    assert_eq!(
        status("/x").unwrap(),
        207,
        "the default is given every time"
    );

    transport.clear_script();
    let err = status("/p").unwrap_err();
    assert_eq!(err.kind(), TransportErrorKind::Config);
    assert_eq!(err.to_string(), "config: script exhausted");
    assert_eq!(transport.unanswered(), 1);
    assert_eq!(transport.request_count(), 8);
}

#[test]
fn a_responder_can_require_the_current_token() {
    let (rt, transport) = setup();
    let token = Arc::new(Mutex::new(String::from("Bearer one")));
    let current = Arc::clone(&token);
    transport.respond_with(move |request, _| {
        let expected = current.lock().unwrap().clone();
        match request.headers().get("authorization") {
            Some(value) if value == expected.as_str() => Reply::ok(),
            _ => Reply::status(401),
        }
    });
    let send = |auth: &'static str| {
        let mut request = get(&transport, "/me");
        request.set_header(
            HeaderName::from_static("authorization"),
            HeaderValue::from_static(auth),
        );
        rt.block_on(transport.send(request))
            .unwrap()
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(send("Bearer one"), 200);
    *token.lock().unwrap() = String::from("Bearer two");
    assert_eq!(send("Bearer one"), 401);
    assert_eq!(send("Bearer two"), 200);
    let recorded = transport.requests();
    assert_eq!(recorded[1].headers["authorization"], "Bearer one");
}

#[test]
fn a_responder_may_use_the_transport() {
    // The responder runs outside the transport's lock.
    let (rt, transport) = setup();
    let inner = transport.clone();
    transport.respond_with(move |_, _| {
        let _ = inner.requests();
        inner.push(Reply::status(418));
        Reply::ok()
    });
    let first = rt
        .block_on(transport.send(get(&transport, "/")))
        .unwrap()
        .unwrap();
    let second = rt
        .block_on(transport.send(get(&transport, "/")))
        .unwrap()
        .unwrap();
    assert_eq!(
        (first.status().as_u16(), second.status().as_u16()),
        (200, 418)
    );
}

#[test]
fn in_flight_counts_concurrent_sends_and_dropped_ones() {
    let (rt, transport) = setup();
    for i in 0..5u64 {
        transport.push(Reply::ok().after(Duration::from_secs(i + 1)));
    }
    let mut handles = Vec::new();
    for _ in 0..5 {
        let t = transport.clone();
        handles.push(rt.spawn(async move {
            let request = get(&t, "/");
            t.send(request).await.map(|r| r.status())
        }));
    }
    rt.run_until_idle().unwrap();
    assert_eq!(transport.in_flight(), 5);
    assert_eq!(transport.peak_in_flight(), 5);

    rt.run_until(at(2000)).unwrap();
    assert_eq!(transport.in_flight(), 3);

    // Dropping a caller mid-flight ends its send at once.
    let last = handles.pop().unwrap();
    last.abort();
    assert_eq!(transport.in_flight(), 2);
    rt.run().unwrap();
    assert_eq!(transport.in_flight(), 0);
    assert_eq!(transport.peak_in_flight(), 5);
    assert_eq!(
        rt.now(),
        at(4000),
        "the aborted send's delay no longer holds time"
    );
    // A later send alone does not lower the peak.
    transport.push(Reply::ok());
    rt.block_on(transport.send(get(&transport, "/")))
        .unwrap()
        .unwrap();
    assert_eq!((transport.in_flight(), transport.peak_in_flight()), (0, 5));
}

#[test]
fn recording_can_be_switched_off() {
    let (rt, transport) = setup();
    transport.default_reply(Reply::ok());
    let send = |path| {
        rt.block_on(transport.send(get(&transport, path)))
            .unwrap()
            .unwrap()
    };
    send("/one");
    transport.record(false);
    send("/two");
    send("/three");
    transport.record(true);
    send("/four");
    let recorded = transport.requests();
    let seen: Vec<(usize, &str)> = recorded
        .iter()
        .map(|r| (r.index, r.path.as_ref()))
        .collect();
    assert_eq!(seen, [(0, "/one"), (3, "/four")]);
    assert_eq!(transport.request_count(), 4);
    transport.clear_requests();
    assert!(transport.requests().is_empty());
    assert_eq!(transport.request_count(), 4);
}

#[test]
fn recorded_requests_keep_method_path_headers_body_and_time() {
    let (rt, transport) = setup();
    transport.default_reply(Reply::ok());
    let http = transport.handle();
    let drafts = [
        http.get("/g"),
        http.post("/p").body("payload"),
        http.put("/u"),
        http.delete("/d"),
        http.patch("/a"),
        http.head("/h"),
        http.request(Method::OPTIONS, String::from("/o")),
    ];
    for draft in drafts {
        rt.advance(Duration::from_millis(10));
        let request = transport.prepare(draft.header("x-trace", "t")).unwrap();
        rt.block_on(transport.send(request)).unwrap().unwrap();
    }
    let recorded = transport.requests();
    let methods: Vec<&str> = recorded.iter().map(|r| r.method.as_str()).collect();
    assert_eq!(
        methods,
        ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
    );
    assert_eq!(recorded[1].body, "payload");
    assert_eq!(recorded[6].path, "/o");
    assert_eq!(recorded[3].at, at(40));
    assert!(recorded.iter().all(|r| r.headers["x-trace"] == "t"));
}

#[test]
fn prepared_requests_expose_method_and_headers_to_the_loop() {
    let transport = ScriptedTransport::new(&VirtualRuntime::new());
    let mut request = transport
        .prepare(
            transport
                .handle()
                .post("/x")
                .header("idempotency-key", "k1")
                .header("x-a", "1")
                .header("x-a", "2"),
        )
        .unwrap();
    assert_eq!(PreparedRequest::method(&request), Some(&Method::POST));
    let key = HeaderName::from_static("idempotency-key");
    assert_eq!(PreparedRequest::header(&request, &key).unwrap(), "k1");
    assert_eq!(request.headers().get_all("x-a").iter().count(), 2);
    // set_header replaces every value.
    request.set_header(
        HeaderName::from_static("x-a"),
        HeaderValue::from_static("3"),
    );
    assert_eq!(request.headers().get_all("x-a").iter().count(), 1);
    assert_eq!(request.headers()["x-a"], "3");
}

#[test]
fn a_draft_that_cannot_be_built_fails_prepare_with_config() {
    let transport = ScriptedTransport::new(&VirtualRuntime::new());
    let http = transport.handle();
    let cases = [
        (http.get("/").invalid(), "config: request marked invalid"),
        (
            http.get("/").header("bad name", "v"),
            "config: invalid header name",
        ),
        (
            http.get("/").header("x-v", "new\nline"),
            "config: invalid value for header `x-v`",
        ),
        // The first problem is the one reported.
        (
            http.get("/").header("x-v", "\u{7f}").invalid(),
            "config: invalid value for header `x-v`",
        ),
        (
            http.get("/").header("x-a", "\n").header("x-b", "\n"),
            "config: invalid value for header `x-a`",
        ),
    ];
    for (draft, message) in cases {
        let err = transport.prepare(draft).unwrap_err();
        assert_eq!(err.kind(), TransportErrorKind::Config);
        assert_eq!(err.to_string(), message);
    }
    assert_eq!(transport.request_count(), 0, "nothing was sent");
}

#[test]
fn admit_waits_as_configured_and_counts_only_completed_admissions() {
    let (rt, transport) = setup();
    rt.block_on(transport.admit()).unwrap();
    assert_eq!((rt.now(), transport.admitted()), (Instant::ORIGIN, 1));

    transport.admit_delay(Duration::from_millis(300));
    rt.block_on(transport.admit()).unwrap();
    assert_eq!((rt.now(), transport.admitted()), (at(300), 2));

    // A dropped wait admits nothing.
    let cut = rt
        .block_on(timeout_at(&rt, at(400), transport.admit()))
        .unwrap();
    assert!(cut.is_err());
    assert_eq!(transport.admitted(), 2);

    // A closure: one sender per second. It is told the virtual time each asks at.
    let next = Arc::new(Mutex::new(Instant::ORIGIN));
    let asked = Arc::new(Mutex::new(Vec::new()));
    let asked_at = Arc::clone(&asked);
    transport.admit_with(move |now| {
        asked_at.lock().unwrap().push(now);
        let mut next = next.lock().unwrap();
        let slot = (*next).max(now);
        *next = slot + Duration::from_secs(1);
        slot - now
    });
    let start = rt.now();
    let times = Rc::new(RefCell::new(Vec::new()));
    for _ in 0..3 {
        let (t, rt2, times) = (transport.clone(), rt.clone(), Rc::clone(&times));
        rt.spawn(async move {
            t.admit().await;
            times.borrow_mut().push(rt2.now() - start);
        })
        .detach();
    }
    rt.run().unwrap();
    assert_eq!(
        *times.borrow(),
        [
            Duration::ZERO,
            Duration::from_secs(1),
            Duration::from_secs(2)
        ]
    );
    assert_eq!(transport.admitted(), 5);
    assert_eq!(*asked.lock().unwrap(), [start; 3]);
    assert_ne!(start, Instant::ORIGIN);

    transport.admit_delay(Duration::ZERO);
    let before = rt.now();
    rt.block_on(transport.admit()).unwrap();
    assert_eq!(rt.now(), before);
}

#[test]
fn distrust_connection_is_counted() {
    let transport = ScriptedTransport::new(&VirtualRuntime::new());
    let clone = transport.clone();
    transport.distrust_connection();
    clone.distrust_connection();
    assert_eq!(transport.distrusted(), 2);
}

#[test]
fn failures_carry_their_kind_and_message() {
    let (rt, transport) = setup();
    let kinds = [
        TransportErrorKind::NotSent,
        TransportErrorKind::Connect,
        TransportErrorKind::Interrupted,
        TransportErrorKind::TimedOut,
        TransportErrorKind::Tls,
        TransportErrorKind::TooLarge,
        TransportErrorKind::Config,
    ];
    for kind in kinds {
        transport.push(Reply::fail(kind, "scripted"));
    }
    for kind in kinds {
        let err = rt
            .block_on(transport.send(get(&transport, "/")))
            .unwrap()
            .unwrap_err();
        assert_eq!((err.kind(), err.message()), (kind, "scripted"));
    }
}

#[test]
#[should_panic(expected = "Reply::status(42): not a valid HTTP status code (100..=999)")]
fn an_invalid_status_panics_with_its_value() {
    let _ = Reply::status(42);
}

#[test]
#[should_panic(
    expected = "Reply::header on a failure reply: only responses have headers and bodies"
)]
fn a_header_on_a_failure_panics_clearly() {
    let _ = Reply::fail(TransportErrorKind::Connect, "x").header("a", "b");
}

#[test]
#[should_panic(expected = "Reply::body on a stall reply")]
fn a_body_on_a_stall_panics_clearly() {
    let _ = Reply::stall().body("x");
}

#[test]
#[should_panic(expected = "Reply::header: invalid value for header `retry-after`")]
fn an_invalid_scripted_header_panics_with_its_name() {
    let _ = Reply::ok().header("retry-after", "1\r\n2");
}

#[test]
fn non_ascii_header_values_can_be_scripted() {
    let (rt, transport) = setup();
    transport.push(Reply::status(503).header("retry-after", &b"\xe9"[..]));
    let response = rt
        .block_on(transport.send(get(&transport, "/")))
        .unwrap()
        .unwrap();
    assert_eq!(response.headers()["retry-after"].as_bytes(), b"\xe9");
    assert!(response.headers()["retry-after"].to_str().is_err());
}

#[test]
fn an_rc_based_transport_of_your_own_runs_on_the_driver() {
    // A transport whose futures are not Send, as in a single-threaded backend.
    struct RcTransport {
        inner: ScriptedTransport,
        sends: Rc<RefCell<u32>>,
    }
    impl Transport for RcTransport {
        type Handle = <ScriptedTransport as Transport>::Handle;
        type Draft = <ScriptedTransport as Transport>::Draft;
        type Request = ScriptedRequest;
        type Response = ScriptedResponse;
        fn handle(&self) -> &Self::Handle {
            self.inner.handle()
        }
        fn prepare(
            &self,
            draft: Self::Draft,
        ) -> Result<Self::Request, vantage_api_pool::TransportError> {
            self.inner.prepare(draft)
        }
        async fn send(
            &self,
            request: Self::Request,
        ) -> Result<Self::Response, vantage_api_pool::TransportError> {
            let counter = Rc::clone(&self.sends);
            let response = self.inner.send(request).await;
            *counter.borrow_mut() += 1;
            response
        }
    }
    let rt = VirtualRuntime::new();
    let transport = Rc::new(RcTransport {
        inner: ScriptedTransport::new(&rt),
        sends: Rc::default(),
    });
    transport
        .inner
        .default_reply(Reply::ok().after(Duration::from_millis(5)));
    for _ in 0..3 {
        let t = Rc::clone(&transport);
        rt.spawn(async move {
            let request = t.prepare(t.handle().get("/")).unwrap();
            t.send(request).await.unwrap();
        })
        .detach();
    }
    rt.run().unwrap();
    assert_eq!(*transport.sends.borrow(), 3);
    assert_eq!(rt.now(), at(5));
}

#[test]
fn debug_shows_header_names_but_no_values_or_bodies() {
    let rt = VirtualRuntime::new();
    let transport = ScriptedTransport::new(&rt);
    transport.push(
        Reply::ok()
            .header("x-echo", "v4lue-reply")
            .body("b0dy-reply"),
    );
    let draft = transport
        .handle()
        .post("/x")
        .header("x-api-key", "v4lue-request")
        .body("b0dy-request");
    let draft_debug = format!("{draft:?}");
    let request = transport.prepare(draft).unwrap();
    let request_debug = format!("{request:?}");
    let response = rt.block_on(transport.send(request)).unwrap().unwrap();
    let printed = format!(
        "{draft_debug} {request_debug} {response:?} {:?}",
        transport.requests()
    );
    assert!(
        printed.contains("x-api-key") && printed.contains("x-echo"),
        "{printed}"
    );
    assert!(
        !printed.contains("v4lue") && !printed.contains("b0dy"),
        "{printed}"
    );
}

/// The status a GET of `path` gets.
fn status_of(rt: &VirtualRuntime, transport: &ScriptedTransport, path: &'static str) -> u16 {
    let response = rt.block_on(transport.send(get(transport, path))).unwrap();
    response.unwrap().status().as_u16()
}

#[test]
fn path_scripts_match_the_exact_path_in_order_and_add_up() {
    let (rt, transport) = setup();
    transport.on_path("/items", [Reply::status(503), Reply::status(200)]);
    transport.on_path("/items", [Reply::status(201)]);
    transport.default_reply(Reply::status(299));
    assert_eq!(transport.scripted_remaining(), 3);
    // A longer path, or the same path with a query, is another path.
    assert_eq!(status_of(&rt, &transport, "/items/1"), 299);
    assert_eq!(status_of(&rt, &transport, "/items?page=2"), 299);
    // In the order given, the second on_path after the first.
    let statuses = [(); 3].map(|()| status_of(&rt, &transport, "/items"));
    assert_eq!(statuses, [503, 200, 201]);
}

#[test]
fn the_responder_answers_before_the_default() {
    let (rt, transport) = setup();
    transport.default_reply(Reply::status(207));
    transport.respond_with(|_, _| Reply::status(206));
    assert_eq!(status_of(&rt, &transport, "/x"), 206);
}

#[test]
fn after_replaces_the_delay() {
    let reply = Reply::ok()
        .after(Duration::from_secs(1))
        .after(Duration::from_secs(2));
    assert_eq!(reply.delay(), Duration::from_secs(2));
    let (rt, transport) = setup();
    transport.push(reply);
    status_of(&rt, &transport, "/");
    assert_eq!(rt.elapsed(), Duration::from_secs(2));
}

#[test]
fn a_stalled_send_stays_in_flight_until_dropped() {
    let (rt, transport) = setup();
    transport.push(Reply::stall().after(Duration::from_millis(100)));
    let sender = transport.clone();
    let task = rt.spawn(async move {
        let _ = sender.send(get(&sender, "/")).await;
    });
    rt.run_until(at(5_000)).unwrap();
    assert_eq!(transport.in_flight(), 1, "a stalled send is in flight");
    task.abort();
    assert_eq!((transport.in_flight(), transport.peak_in_flight()), (0, 1));
}

#[test]
fn requests_are_recorded_in_the_order_their_sends_started_across_threads() {
    // The first send's responder is held while a second send, on this thread, starts
    // and is recorded: the records still come in the order the sends started.
    use std::sync::Barrier;
    use std::task::{Context, Poll, Waker};
    let (_rt, transport) = setup();
    let gate = Arc::new(Barrier::new(2));
    let held = Arc::clone(&gate);
    transport.respond_with(move |req, _| {
        if req.path() == "/first" {
            held.wait();
            held.wait();
        }
        Reply::ok()
    });
    let send_once = |transport: &ScriptedTransport, path: &'static str| {
        let mut send = std::pin::pin!(transport.send(get(transport, path)));
        let ready = send.as_mut().poll(&mut Context::from_waker(Waker::noop()));
        assert!(matches!(ready, Poll::Ready(_)));
    };
    let first = {
        let transport = transport.clone();
        std::thread::spawn(move || send_once(&transport, "/first"))
    };
    gate.wait(); // /first is inside its responder, its index taken
    send_once(&transport, "/second");
    gate.wait();
    first.join().unwrap();
    let order: Vec<_> = transport
        .requests()
        .iter()
        .map(|r| (r.index, r.path.to_string()))
        .collect();
    assert_eq!(order, [(0, "/first".into()), (1, "/second".into())]);
}

#[test]
fn a_request_is_recorded_at_its_first_poll_not_when_its_future_was_made() {
    let (rt, transport) = setup();
    transport.push(Reply::ok().after(Duration::from_millis(200)));
    let send = transport.send(get(&transport, "/late"));
    let arrived = rt
        .block_on(async {
            // The future exists from 0 but is first polled at +1 s.
            rt.sleep(Duration::from_secs(1)).await;
            let response = send.await.unwrap();
            assert_eq!(response.status(), 200);
            rt.now()
        })
        .unwrap();
    assert_eq!(arrived, at(1_200));
    let requests = transport.requests();
    assert_eq!((requests.len(), requests[0].at), (1, at(1_000)));
    assert_eq!(requests[0].index, 0);
}

#[test]
fn take_headers_moves_a_pushed_reply_s_headers_and_copies_the_default_reply_s() {
    let (rt, transport) = setup();
    let reply = || Reply::status(503).header("x-a", "1").body("busy");
    transport.push(reply());
    transport.default_reply(reply());
    // The pushed reply, then the default one twice: the third has its headers only
    // if taking the second's left the shared ones alone.
    for _ in 0..3 {
        let mut response = rt
            .block_on(transport.send(get(&transport, "/")))
            .unwrap()
            .unwrap();
        let taken = response.take_headers();
        assert_eq!(taken["x-a"], "1");
        assert!(
            response.headers().is_empty(),
            "the headers were left behind"
        );
        assert!(response.take_headers().is_empty());
        // The body reads on, whole.
        let body = rt.block_on(response.chunk()).unwrap().unwrap();
        assert_eq!(body, Some(Bytes::from_static(b"busy")));
    }
}
