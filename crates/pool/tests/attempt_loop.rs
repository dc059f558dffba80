//! The attempt loop's rules, each on virtual time with exact times.

mod common;

// On wasm32 the same tests run under wasm-bindgen-test, in Node and in a browser.
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use common::*;
use http::StatusCode;
use http::header::HeaderName;
use vantage_api_pool::health::HealthObserver;
use vantage_api_pool::{
    BreakerState, CallPolicy, ErrorKind, EventKind, Fanout, Jitter, ResilientClient, RetryMode,
    RetryPolicy, TimeLimit, TransportErrorKind, TransportEvent, TransportObserver,
};
use vantage_api_pool_testkit::{DriveError, Reply, VirtualRuntime};

#[test]
fn retry_after_ms_is_honoured_to_the_millisecond_with_jitter_off() {
    let w = World::new();
    w.transport
        .push(Reply::status(503).header("retry-after-ms", "1500"));
    w.transport.push(Reply::ok());
    let client = w.client();
    let policy = bounded(3, ms(250));
    let resp =
        w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
            .unwrap()
            .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(w.sent_at(), [ms(0), ms(1500)]);
    assert_eq!(scheduled(&w.events()), [ms(1500)]);
    w.assert_contract();
}

#[test]
fn retry_after_ms_with_default_jitter_leaves_within_a_quarter_more() {
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..50 {
        let w = World::new();
        let rt = w.rt.clone().with_seed(seed);
        w.transport
            .push(Reply::status(503).header("retry-after-ms", "1500"));
        w.transport.push(Reply::ok());
        let client = w.client();
        let policy = CallPolicy::bounded(RetryPolicy::default());
        assert_eq!(policy.jitter(), Jitter::Proportional(0.25));
        rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
            .unwrap()
            .unwrap();
        let second = w.sent_at()[1];
        assert!(
            second >= ms(1500) && second <= ms(1875),
            "seed {seed}: {second:?}"
        );
        seen.insert(second);
    }
    // The jitter is real: the seeds spread the retry over the window.
    assert!(seen.len() > 40, "{seen:?}");
    assert!(seen.iter().any(|d| *d > ms(1800)) && seen.iter().any(|d| *d < ms(1575)));
}

#[test]
fn three_503s_back_off_half_a_second_then_one_second() {
    let w = World::new();
    w.transport.push_many([
        Reply::status(503),
        Reply::status(503),
        Reply::status(503).body("down"),
    ]);
    let client = w.client();
    let err =
        w.rt.block_on(client.execute_with(&bounded(2, ms(500)), |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(w.sent_at(), [ms(0), ms(500), ms(1500)]);
    assert_eq!(err.status(), Some(StatusCode::SERVICE_UNAVAILABLE));
    assert_eq!(err.attempts(), 3);
    assert_eq!(err.body(), Some(&b"down"[..]));
    assert_eq!(err.to_string(), "HTTP 503 after 3 attempts");
    // The last Failed carries the returned error.
    w.assert_last_failed_is(&err);
    assert_eq!(
        w.kinds(),
        [
            "started",
            "failed",
            "retry_scheduled",
            "started",
            "failed",
            "retry_scheduled",
            "started",
            "failed"
        ]
    );
    w.assert_contract();
}

#[test]
fn a_stalled_attempt_costs_exactly_the_attempt_timeout() {
    let w = World::new();
    w.transport.push(Reply::stall());
    let client = w.client();
    let err = w.background_error(&client);
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert_eq!(err.time_limit(), Some(TimeLimit::AttemptTimeout));
    assert_eq!(
        err.to_string(),
        "timed out (attempt timeout) after 1 attempt"
    );
    assert_eq!(err.attempts(), 1);
    assert_eq!(w.now(), secs(10));
    assert_eq!(
        w.transport.distrusted(),
        1,
        "a timed-out connection is distrusted"
    );
    assert!(!err.nothing_sent());
    let failed_ms = w.events().iter().find_map(|e| match e.kind {
        EventKind::Failed { ms, sent, .. } => Some((ms, sent)),
        _ => None,
    });
    assert_eq!(failed_ms, Some((10_000, true)));
    w.assert_contract();
}

#[test]
fn three_stalls_spend_exactly_the_30_second_budget() {
    let w = World::new();
    w.transport.default_reply(Reply::stall());
    let client = w.client();
    // `execute` = bounded(default retry policy): 3 retries, 250 ms → 10 s, 30 s budget.
    let err =
        w.rt.block_on(client.execute(|h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    // The third send had only the budget's last 9.25 s, less than its 10 s.
    assert_eq!(err.time_limit(), Some(TimeLimit::Budget));
    assert_eq!(err.attempts(), 3);
    assert_eq!(w.now(), secs(30));
    assert_eq!(w.transport.request_count(), 3);
    assert_eq!(w.transport.distrusted(), 3);
    // The retry after the third stall could not start inside the budget: no sleep
    // was scheduled for it.
    assert_eq!(scheduled(&w.events()).len(), 2);
    w.assert_contract();
}

#[test]
fn an_attempt_never_runs_past_the_budget_left() {
    let w = World::new();
    w.transport.push(Reply::status(503).after(secs(7)));
    w.transport.push(Reply::stall());
    let client = w.client();
    let policy = bounded(5, secs(1)).with_budget(Some(secs(12))).unwrap();
    let err =
        w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    // 503 at 7 s, back-off 1 s, second attempt limited to the 4 s left.
    assert_eq!(w.sent_at(), [secs(0), secs(8)]);
    assert_eq!(w.now(), secs(12));
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert_eq!(err.time_limit(), Some(TimeLimit::Budget));
    assert_eq!(err.attempts(), 2);
}

#[test]
fn a_send_cut_names_the_attempt_timeout_unless_the_budget_left_was_shorter() {
    // 503 at 2 s, back-off 1 s: the second send starts at 3 s with 4 s of the
    // 7 s budget left. With a 4 s attempt timeout both limits end it at 7 s, and
    // the attempt timeout is named; 1 ms longer, and the budget cut it.
    for (attempt_timeout, limit) in [
        (secs(4), TimeLimit::AttemptTimeout),
        (secs(4) + ms(1), TimeLimit::Budget),
        (secs(3), TimeLimit::AttemptTimeout),
    ] {
        let w = World::new();
        w.transport.push(Reply::status(503).after(secs(2)));
        w.transport.push(Reply::stall());
        let client = w.client();
        let policy = bounded_within(1, secs(1), attempt_timeout, secs(7));
        let err =
            w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
                .unwrap()
                .unwrap_err();
        assert_eq!(w.sent_at(), [secs(0), secs(3)]);
        assert_eq!(err.kind(), ErrorKind::TimedOut);
        assert_eq!(err.time_limit(), Some(limit), "{attempt_timeout:?}");
        assert_eq!(w.now(), secs(3) + attempt_timeout.min(secs(4)));
    }
}

#[test]
fn a_retry_that_cannot_start_inside_the_budget_is_not_slept_for() {
    let w = World::new();
    w.transport.push(
        Reply::status(503)
            .header("retry-after", "20")
            .after(secs(1)),
    );
    let client = w.client();
    let policy = bounded(3, ms(100)).with_budget(Some(secs(15))).unwrap();
    let err =
        w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(
        w.now(),
        secs(1),
        "returned at once, no sleep into the budget's end"
    );
    assert_eq!(err.status(), Some(StatusCode::SERVICE_UNAVAILABLE));
    assert_eq!(err.retry_after(), Some(secs(20)));
    assert!(scheduled(&w.events()).is_empty());
    assert_eq!(w.kinds().last(), Some(&"failed"));
}

#[test]
fn server_delay_is_clamped_to_the_policy_ceiling() {
    let w = World::new();
    w.transport
        .push(Reply::status(429).header("retry-after", "3600"));
    w.transport.push(Reply::ok());
    let client = w.client();
    let policy = CallPolicy::bounded(RetryPolicy {
        max_retries: 1,
        base: ms(100),
        max: secs(5),
    })
    .with_jitter(Jitter::None)
    .unwrap();
    w.rt.block_on(client.execute_with(&policy, |h| h.post("/x")))
        .unwrap()
        .unwrap();
    assert_eq!(
        w.sent_at(),
        [secs(0), secs(5)],
        "429 is retried for a POST, after the ceiling"
    );
}

#[test]
fn a_404_is_final_after_one_attempt_under_every_policy_with_its_body_cut() {
    let body = "x".repeat(5000);
    for policy in [
        CallPolicy::bounded(RetryPolicy::default()),
        CallPolicy::essential(),
        CallPolicy::background(),
    ] {
        let w = World::new();
        w.transport.default_reply(
            Reply::status(404)
                .body(body.clone())
                .header("x-request-id", "req-42"),
        );
        let client = w.client();
        let err =
            w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
                .unwrap()
                .unwrap_err();
        assert_eq!(err.status(), Some(StatusCode::NOT_FOUND));
        assert_eq!(err.attempts(), 1);
        assert_eq!(err.body().map(<[u8]>::len), Some(2048));
        assert_eq!(err.request_id(), Some("req-42"));
        assert!(!err.is_retryable());
        assert!(!err.nothing_sent());
        assert!(!err.to_string().contains("req-42"));
        assert_eq!(w.transport.request_count(), 1);
        w.assert_contract();
    }
}

#[test]
fn an_error_body_is_read_only_to_its_limit_not_to_its_end() {
    // A 404 whose 1 MB body comes 100 bytes a second, under an hour's time limit:
    // the loop reads 21 chunks (the 21st crosses the 2,048-byte limit) and stops,
    // so the call ends after 21 s, not when the body or the time limit ends.
    let w = World::new();
    w.transport.default_reply(
        Reply::status(404)
            .body(vec![b'e'; 1 << 20])
            .chunk_size(100)
            .chunk_delay(secs(1)),
    );
    let client = w.client();
    let policy = CallPolicy::background()
        .with_attempt_timeout(secs(3600))
        .unwrap();
    let err =
        w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.status(), Some(StatusCode::NOT_FOUND));
    assert_eq!(err.body().map(<[u8]>::len), Some(2048));
    assert_eq!(w.now(), secs(21));
    w.assert_contract();
}

#[test]
fn an_error_body_that_reaches_its_limit_waits_for_nothing_more() {
    // 2,048 bytes at once, then a stall: the error keeps them at once; the read
    // does not wait for a byte past the limit (until the time limit, which would
    // also distrust the connection).
    let w = World::new();
    w.transport.default_reply(
        Reply::status(500)
            .body(vec![b'e'; 4096])
            .chunk_size(2048)
            .body_stalls_after(2048),
    );
    let client = w.client();
    let err = w.background_error(&client);
    assert_eq!(err.body().map(<[u8]>::len), Some(2048));
    assert_eq!((w.now(), w.transport.distrusted()), (ms(0), 0));

    // A slow body, 1 KiB a second: the limit is reached at 2 s, and the call ends
    // then, not a chunk later.
    let w = World::new();
    w.transport.default_reply(
        Reply::status(404)
            .body(vec![b'e'; 8192])
            .chunk_size(1024)
            .chunk_delay(secs(1)),
    );
    let client = w.client();
    assert_eq!(
        w.background_error(&client).body().map(<[u8]>::len),
        Some(2048)
    );
    assert_eq!(w.now(), secs(2));
}

#[test]
fn at_its_limit_an_error_body_looks_at_a_next_chunk_already_there_without_waiting() {
    let split = || {
        let mut text = "a".repeat(2047).into_bytes();
        text.extend_from_slice("é".as_bytes());
        text
    };
    // The end already there: a body of exactly 2,048 bytes is kept whole, though
    // it ends inside a character (as a body read to its end is).
    let w = World::new();
    w.transport.default_reply(
        Reply::status(404)
            .body(split()[..2048].to_vec())
            .chunk_size(1024),
    );
    let client = w.client();
    assert_eq!(
        w.background_error(&client).body().map(<[u8]>::len),
        Some(2048)
    );

    // The next byte already there finishes the character the limit splits: it is
    // dropped whole. Binary, where the next byte finishes nothing, is cut at the
    // limit.
    for (tail, kept) in [(&b"\xA9 tail"[..], 2047), (&b"\x00\x00"[..], 2048)] {
        let mut body = split()[..2048].to_vec();
        body.extend_from_slice(tail);
        let w = World::new();
        w.transport
            .default_reply(Reply::status(404).body(body).chunk_size(1024));
        let client = w.client();
        assert_eq!(
            w.background_error(&client).body().map(<[u8]>::len),
            Some(kept)
        );
    }

    // Nothing there yet: the read ends at the limit, less the unfinished character,
    // when the 2,048th byte comes, not when the next does.
    let mut body = split();
    body.extend_from_slice(b"tail");
    let w = World::new();
    w.transport.default_reply(
        Reply::status(404)
            .body(body)
            .chunk_size(1024)
            .chunk_delay(secs(1)),
    );
    let client = w.client();
    let err = w.background_error(&client);
    assert_eq!(err.body().map(<[u8]>::len), Some(2047));
    assert!(err.body_text().is_some());
    assert_eq!(w.now(), secs(2));
}

#[test]
fn a_status_the_policy_takes_as_an_answer_is_returned_whole_and_not_retried() {
    // A 409 with a 5,000-byte body: an error (body cut at 2,048) by default, the
    // response itself, body unread, under `with_answer_statuses`. A POST, sent once.
    let body = "v".repeat(5000);
    let w = World::new();
    w.transport
        .default_reply(Reply::status(409).body(body.clone()).after(ms(30)));
    let client = w.client();
    let plain = bounded(3, ms(10));
    let err =
        w.rt.block_on(client.execute_with(&plain, |h| h.post("/orders")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.status(), Some(StatusCode::CONFLICT));
    assert_eq!(err.body().map(<[u8]>::len), Some(2048));

    let answers = plain
        .clone()
        .with_answer_statuses([StatusCode::CONFLICT])
        .unwrap();
    let mut response =
        w.rt.block_on(client.execute_with(&answers, |h| h.post("/orders")))
            .unwrap()
            .unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);
    let read =
        w.rt.block_on(vantage_api_pool::transport::read_body(
            &mut response,
            10_000,
        ))
        .unwrap()
        .unwrap();
    assert_eq!(read, body.as_bytes());
    assert_eq!(w.transport.request_count(), 2);
    let last: Vec<_> = w
        .events()
        .iter()
        .rev()
        .take(2)
        .map(|e| e.kind.clone())
        .collect();
    assert!(
        matches!(
            last[..],
            [
                EventKind::Succeeded {
                    status: StatusCode::CONFLICT,
                    ms: 30,
                    ..
                },
                EventKind::Started { .. }
            ]
        ),
        "{last:?}"
    );
    w.assert_contract();
}

#[test]
fn the_breaker_counts_an_answer_status_as_the_api_answering() {
    // Threshold 2: 503, then a 404 taken as an answer, then 503. The answer keeps the
    // failure run (as any 4xx), so the second 503 opens the breaker.
    let w = World::new();
    w.transport
        .push_many([Reply::status(503), Reply::status(404), Reply::status(503)]);
    let client = w.builder().breaker(2, secs(5), secs(60)).build().unwrap();
    let policy = CallPolicy::background()
        .with_answer_statuses([StatusCode::NOT_FOUND])
        .unwrap();
    let outcomes: Vec<_> = (0..3)
        .map(|_| {
            w.rt.block_on(client.execute_with(&policy, |h| h.get("/orders/7")))
                .unwrap()
                .map(|r| r.status().as_u16())
                .map_err(|e| e.kind_name())
        })
        .collect();
    assert_eq!(outcomes, [Err("status"), Ok(404), Err("status")]);
    assert!(matches!(client.breaker_state(), BreakerState::Open { .. }));
    // And, as any answer, one to the probe closes the breaker.
    w.transport.push(Reply::status(404));
    w.rt.run_for(secs(5)).unwrap();
    let probe =
        w.rt.block_on(client.execute_with(&policy, |h| h.get("/orders/7")));
    assert_eq!(probe.unwrap().unwrap().status(), StatusCode::NOT_FOUND);
    assert_eq!(client.breaker_state(), BreakerState::Closed);
    w.assert_contract();
}

#[test]
fn a_post_answered_with_a_redirect_is_not_sent_again_for_the_next_hops_429_or_503() {
    // POST /orders → 303 → GET /receipt answered 429 (or 503 with a delay): the
    // POST itself was answered, so the call ends; a GET (idempotent) is retried.
    for reply in [
        Reply::status(429).header("retry-after-ms", "5"),
        Reply::status(503).header("retry-after-ms", "5"),
    ] {
        let w = World::new();
        w.transport.default_reply(reply.answered_by_redirect());
        let client = w.client();
        let err =
            w.rt.block_on(client.execute_with(&bounded(2, ms(10)), |h| h.post("/orders")))
                .unwrap()
                .unwrap_err();
        assert!(err.answered_by_redirect() && !err.credentials_dropped());
        assert_eq!((w.transport.request_count(), err.attempts()), (1, 1));
        assert!(!err.nothing_sent());
        let err =
            w.rt.block_on(client.execute_with(&bounded(2, ms(10)), |h| h.get("/orders")))
                .unwrap()
                .unwrap_err();
        assert_eq!((w.transport.request_count(), err.attempts()), (4, 3));
        w.assert_contract();
    }
    // Without the mark the same POST is retried: a 429 says it was not processed.
    let w = World::new();
    w.transport.default_reply(Reply::status(429));
    let client = w.client();
    let err =
        w.rt.block_on(client.execute_with(&bounded(2, ms(10)), |h| h.post("/orders")))
            .unwrap()
            .unwrap_err();
    assert!(!err.answered_by_redirect());
    assert_eq!(w.transport.request_count(), 3);
}

#[test]
fn a_post_is_not_retried_after_a_500_unless_it_carries_an_idempotency_key() {
    let w = World::new();
    w.transport.default_reply(Reply::status(500));
    let client = w.client();
    let policy = bounded(3, ms(10));
    let err =
        w.rt.block_on(client.execute_with(&policy, |h| h.post("/pay")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.attempts(), 1);

    let w = World::new();
    w.transport.push_many([Reply::status(500), Reply::ok()]);
    let client = w.client();
    w.rt.block_on(
        client.execute_with(&policy, |h| h.post("/pay").header("idempotency-key", "k-1")),
    )
    .unwrap()
    .unwrap();
    assert_eq!(w.sent_at(), [ms(0), ms(10)]);

    // An empty or blank key is no key.
    for blank in ["", "  "] {
        let w = World::new();
        w.transport.default_reply(Reply::status(500));
        let client = w.client();
        let err =
            w.rt.block_on(
                client.execute_with(&policy, |h| h.post("/pay").header("idempotency-key", blank)),
            )
            .unwrap()
            .unwrap_err();
        assert_eq!(err.attempts(), 1, "{blank:?}");
    }

    // A policy marked idempotent is retried too.
    let w = World::new();
    w.transport.push_many([Reply::status(502), Reply::ok()]);
    let client = w.client();
    w.rt.block_on(client.execute_with(&policy.clone().idempotent(true), |h| h.post("/pay")))
        .unwrap()
        .unwrap();
    assert_eq!(w.transport.request_count(), 2);
}

/// The scripted transport with requests that have no method (a transport for
/// something other than HTTP methods).
struct Methodless(vantage_api_pool_testkit::ScriptedTransport);

struct MethodlessRequest(vantage_api_pool_testkit::ScriptedRequest);

impl vantage_api_pool::PreparedRequest for MethodlessRequest {
    fn method(&self) -> Option<&http::Method> {
        None
    }
    fn header(&self, name: &http::HeaderName) -> Option<&http::HeaderValue> {
        self.0.header(name)
    }
    fn set_header(&mut self, name: http::HeaderName, value: http::HeaderValue) {
        self.0.set_header(name, value);
    }
}

impl vantage_api_pool::Transport for Methodless {
    type Handle = vantage_api_pool_testkit::ScriptedHttp;
    type Draft = vantage_api_pool_testkit::ScriptedRequestBuilder;
    type Request = MethodlessRequest;
    type Response = vantage_api_pool_testkit::ScriptedResponse;

    fn handle(&self) -> &Self::Handle {
        self.0.handle()
    }
    fn prepare(
        &self,
        draft: Self::Draft,
    ) -> Result<MethodlessRequest, vantage_api_pool::TransportError> {
        self.0.prepare(draft).map(MethodlessRequest)
    }
    fn send(
        &self,
        request: MethodlessRequest,
    ) -> impl std::future::Future<Output = Result<Self::Response, vantage_api_pool::TransportError>>
    {
        self.0.send(request.0)
    }
}

#[test]
fn a_request_without_a_method_is_retried_after_a_500_only_when_the_policy_says_so() {
    let policy = bounded(3, ms(10));
    let call = |policy: &CallPolicy| {
        let w = World::new();
        w.transport.push_many([Reply::status(500), Reply::ok()]);
        let client = vantage_api_pool::ResilientClient::builder(
            Methodless(w.transport.clone()),
            w.rt.clone(),
        )
        .build()
        .unwrap();
        let result = w
            .rt
            .block_on(client.execute_with(policy, |h| h.get("/x").header("idempotency-key", "k-1")))
            .unwrap();
        (result.map(|r| r.status()), w.transport.request_count())
    };
    // Even a GET's draft with an Idempotency-Key: without a method, neither counts.
    let (result, sent) = call(&policy);
    assert_eq!(
        result.unwrap_err().status(),
        Some(StatusCode::INTERNAL_SERVER_ERROR)
    );
    assert_eq!(sent, 1);
    let (result, sent) = call(&policy.clone().idempotent(true));
    assert_eq!(result.unwrap(), StatusCode::OK);
    assert_eq!(sent, 2);
}

#[test]
fn a_post_refused_with_connect_is_retried_but_not_one_interrupted() {
    let w = World::new();
    w.transport.push_many([
        Reply::fail(TransportErrorKind::Connect, "refused"),
        Reply::ok(),
    ]);
    let client = w.client();
    let policy = bounded(3, ms(10));
    w.rt.block_on(client.execute_with(&policy, |h| h.post("/pay")))
        .unwrap()
        .unwrap();
    assert_eq!(w.sent_at(), [ms(0), ms(10)]);

    let w = World::new();
    w.transport.push_many([
        Reply::fail(TransportErrorKind::Interrupted, "reset"),
        Reply::ok(),
    ]);
    let client = w.client();
    let err =
        w.rt.block_on(client.execute_with(&policy, |h| h.post("/pay")))
            .unwrap()
            .unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::Transport(TransportErrorKind::Interrupted)
    );
    assert!(
        !err.nothing_sent(),
        "an interrupted exchange may have reached the server"
    );
    assert_eq!(w.transport.request_count(), 1);
}

#[test]
fn a_503_with_a_server_delay_is_retried_for_a_post() {
    let w = World::new();
    w.transport
        .push_many([Reply::status(503).header("retry-after", "2"), Reply::ok()]);
    let client = w.client();
    w.rt.block_on(client.execute_with(&bounded(3, ms(10)), |h| h.post("/pay")))
        .unwrap()
        .unwrap();
    assert_eq!(w.sent_at(), [secs(0), secs(2)]);

    // A delay of any size that fits is a delay: retried at the ceiling.
    let w = World::new();
    w.transport.push_many([
        Reply::status(503).header("retry-after", "18446744073709551615"),
        Reply::ok(),
    ]);
    let client = w.client();
    let policy = CallPolicy::bounded(RetryPolicy::new(3, ms(10), secs(5)).unwrap())
        .with_jitter(Jitter::None)
        .unwrap();
    w.rt.block_on(client.execute_with(&policy, |h| h.post("/pay")))
        .unwrap()
        .unwrap();
    assert_eq!(w.sent_at(), [secs(0), secs(5)]);
}

/// A 503 whose delay the client ignores (zero, a past date, a fraction, a negative
/// or overflowing number) is no valid server delay: the server may have processed
/// the request, so a POST is not sent again. The retry would fit: the ceiling
/// (5 s) is well inside the budget.
#[test]
fn a_503_with_an_ignored_server_delay_is_final_for_a_post() {
    for (name, value) in [
        ("retry-after", "0"),
        ("retry-after", "Sun, 06 Nov 1994 08:49:37 GMT"),
        ("retry-after", "1.5"),
        ("retry-after", "99999999999999999999999"),
        ("retry-after-ms", "-5"),
        ("retry-after-ms", "999999999999999999999999999999"),
    ] {
        let w = World::new();
        w.transport
            .push_many([Reply::status(503).header(name, value), Reply::ok()]);
        let policy = CallPolicy::bounded(RetryPolicy::new(3, ms(10), secs(5)).unwrap());
        let err =
            w.rt.block_on(w.client().execute_with(&policy, |h| h.post("/pay")))
                .unwrap()
                .unwrap_err();
        assert_eq!(
            (err.kind(), err.attempts(), w.sent_at().len()),
            (ErrorKind::Status(StatusCode::SERVICE_UNAVAILABLE), 1, 1),
            "{name}: {value}"
        );
        assert_eq!(err.retry_after(), None, "{name}: {value}");
    }
}

/// An HTTP-date is measured against the wall clock when the response arrives, not
/// when the call began: a date 5 s after the start, on a response that took 2 s,
/// asks for 3 s more.
#[test]
fn an_http_date_is_read_against_the_wall_clock_at_the_response() {
    let w = World::new();
    let start = SystemTime::UNIX_EPOCH + secs(1_767_225_600); // 2026-01-01T00:00:00Z
    w.rt.set_wall_clock(start);
    w.transport.push_many([
        Reply::status(503)
            .header("retry-after", "Thu, 01 Jan 2026 00:00:05 GMT")
            .after(secs(2)),
        Reply::ok(),
    ]);
    let policy = CallPolicy::bounded(RetryPolicy::new(3, ms(10), secs(60)).unwrap())
        .with_jitter(Jitter::None)
        .unwrap();
    w.rt.block_on(w.client().execute_with(&policy, |h| h.post("/pay")))
        .unwrap()
        .unwrap();
    assert_eq!(w.sent_at(), [secs(0), secs(5)]);
}

#[test]
fn a_408_is_retried_only_when_idempotent() {
    let w = World::new();
    w.transport.default_reply(Reply::status(408));
    let client = w.client();
    let err =
        w.rt.block_on(client.execute_with(&bounded(2, ms(10)), |h| h.post("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.attempts(), 1);
    let err =
        w.rt.block_on(client.execute_with(&bounded(2, ms(10)), |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.attempts(), 3);
    // A POST marked idempotent is retried; the mark taken back, it is not.
    let marked = bounded(2, ms(10)).idempotent(true);
    for (policy, attempts) in [(marked.clone(), 3), (marked.idempotent(false), 1)] {
        let sent = w.transport.request_count();
        let err =
            w.rt.block_on(client.execute_with(&policy, |h| h.post("/x")))
                .unwrap()
                .unwrap_err();
        assert_eq!(err.attempts(), attempts);
        assert_eq!(w.transport.request_count() - sent, attempts as usize);
    }
}

#[test]
fn until_cancelled_keeps_going_through_1000_failures_until_dropped() {
    let w = World::new();
    w.transport.default_reply(Reply::status(503).after(ms(10)));
    let client = w.client();
    let policy = forever(ms(1));
    let call = w.spawn_call(&client, policy, "/x");
    // Each attempt takes 10 ms and is followed by a 1 ms back-off: after 1000
    // failures (11 s) the 1001st attempt is in flight at 11.005 s.
    w.rt.run_until(at(ms(11_005))).unwrap();
    assert!(!call.is_finished());
    assert_eq!(w.transport.in_flight(), 1);
    call.abort();
    let events = w.events();
    let failed = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Failed { .. }))
        .count();
    assert_eq!(failed, 1000);
    let last = events.last().unwrap();
    assert!(
        matches!(
            last.kind,
            EventKind::Cancelled {
                send: 1001,
                attempt: 1001
            }
        ),
        "{:?}",
        last.kind
    );
    assert_eq!(last.at, at(ms(11_005)));
    assert_eq!(w.transport.in_flight(), 0);
    // Nothing after the drop.
    w.rt.run_for(secs(60)).unwrap();
    assert_eq!(w.events().len(), events.len());
    w.assert_contract();
}

#[test]
fn an_essential_call_to_an_api_that_stays_down_ends_the_drive_after_a_day() {
    // The call never parks without a timer (each back-off or breaker cooldown moves
    // the clock on), so only the driver's time limit stops it: after a day of
    // virtual time and a few thousand sends, not millions.
    let w = World::new();
    w.transport.default_reply(Reply::status(503));
    let client = w.client();
    let outcome =
        w.rt.block_on(client.execute_with(&CallPolicy::essential(), |h| h.get("/x")));
    assert!(
        matches!(outcome, Err(DriveError::TimeLimit { now, .. }) if now.since_origin() <= secs(86_400)),
        "{outcome:?}"
    );
    let sent = w.transport.requests().len();
    assert!((100..20_000).contains(&sent), "{sent} sends in a day");
    w.assert_contract();
}

#[test]
fn dropping_a_call_mid_back_off_reports_nothing_more() {
    let w = World::new();
    w.transport.default_reply(Reply::status(503));
    let client = w.client();
    let policy = bounded(3, secs(5));
    let call = w.spawn_call(&client, policy, "/x");
    w.rt.run_until(at(secs(1))).unwrap();
    assert_eq!(w.kinds(), ["started", "failed", "retry_scheduled"]);
    call.abort();
    w.rt.run_for(secs(60)).unwrap();
    assert_eq!(w.kinds(), ["started", "failed", "retry_scheduled"]);
    assert_eq!(
        w.rt.pending_timers(),
        0,
        "the back-off timer went with the call"
    );
    w.assert_contract();
}

#[test]
fn not_sent_is_redialed_twice_for_free_then_treated_as_interrupted() {
    let w = World::new();
    let not_sent = || Reply::fail(TransportErrorKind::NotSent, "stale connection");
    w.transport.push_many([not_sent(), not_sent(), Reply::ok()]);
    let client = w.client();
    let resp =
        w.rt.block_on(client.execute_with(&bounded(0, ms(10)), |h| h.post("/x")))
            .unwrap();
    assert!(
        resp.is_ok(),
        "redials are free even for a POST with no retries"
    );
    assert_eq!(w.sent_at(), [ms(0), ms(0), ms(0)]);
    assert_eq!(
        w.kinds(),
        [
            "started",
            "failed",
            "redialing",
            "started",
            "failed",
            "redialing",
            "started",
            "succeeded"
        ]
    );
    let numbers = w.numbers();
    assert_eq!(
        numbers,
        [
            (1, 1),
            (1, 1),
            (2, 1),
            (2, 1),
            (2, 1),
            (3, 1),
            (3, 1),
            (3, 1)
        ]
    );
    w.assert_contract();

    // A third NotSent counts as Interrupted: final for a POST, with 1 attempt, and,
    // as it may have reached the server, not "nothing sent".
    let w = World::new();
    w.transport.default_reply(not_sent());
    let client = w.client();
    let err =
        w.rt.block_on(client.execute_with(&bounded(3, ms(10)), |h| h.post("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::Transport(TransportErrorKind::NotSent)
    );
    assert_eq!(err.attempts(), 1);
    assert!(!err.nothing_sent());
    assert_eq!(w.transport.request_count(), 3);
    // ...and retried with back-off for a GET.
    let w = World::new();
    w.transport
        .push_many([not_sent(), not_sent(), not_sent(), Reply::ok()]);
    let client = w.client();
    w.rt.block_on(client.execute_with(&bounded(3, ms(10)), |h| h.get("/x")))
        .unwrap()
        .unwrap();
    assert_eq!(w.sent_at(), [ms(0), ms(0), ms(0), ms(10)]);
}

#[test]
fn dropping_a_call_mid_redial_keeps_the_contract() {
    let w = World::new();
    w.transport
        .push(Reply::fail(TransportErrorKind::NotSent, "stale").after(ms(5)));
    w.transport.push(Reply::stall());
    let client = w.client();
    let call = w.spawn_call(&client, CallPolicy::background(), "/x");
    w.rt.run_until(at(ms(6))).unwrap();
    call.abort();
    assert_eq!(
        w.kinds(),
        ["started", "failed", "redialing", "started", "cancelled"]
    );
    w.assert_contract();
}

#[test]
fn a_zero_base_policy_still_waits_one_millisecond_per_retry() {
    // The 429's 5 s is clamped to the zero ceiling: still 1 ms, never a spin.
    let w = World::new();
    w.transport.push_many([
        Reply::status(503),
        Reply::status(429).header("retry-after", "5"),
        Reply::status(503),
        Reply::ok(),
    ]);
    let client = w.client();
    let policy = CallPolicy::bounded(RetryPolicy {
        max_retries: 3,
        base: Duration::ZERO,
        max: Duration::ZERO,
    })
    .with_jitter(Jitter::None)
    .unwrap();
    w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
        .unwrap()
        .unwrap();
    assert_eq!(w.sent_at(), [ms(0), ms(1), ms(2), ms(3)]);
    assert_eq!(scheduled(&w.events()), [ms(1); 3]);
    let forever = CallPolicy::essential()
        .with_retry(RetryMode::UntilCancelled {
            base: Duration::ZERO,
            max: Duration::ZERO,
        })
        .unwrap();
    let w = World::new();
    w.transport.push_many([Reply::status(503), Reply::ok()]);
    let client = w.client();
    w.rt.block_on(client.execute_with(&forever, |h| h.get("/x")))
        .unwrap()
        .unwrap();
    assert!(w.sent_at()[1] >= ms(1));
}

#[test]
fn a_server_delay_under_one_millisecond_still_waits_one_millisecond() {
    // The policy's own back-off is floored where it is computed; a server's delay
    // under 1 ms is honoured, floored where the retry is scheduled.
    for (status, value) in [(429, "0.25"), (503, "0.5"), (503, "0.000001")] {
        let w = World::new();
        w.transport.push_many([
            Reply::status(status).header("retry-after-ms", value),
            Reply::ok(),
        ]);
        let client = w.client();
        let policy = bounded(1, secs(2)).idempotent(true);
        w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
            .unwrap()
            .unwrap();
        assert_eq!(scheduled(&w.events()), [ms(1)], "{value}");
        assert_eq!(w.sent_at(), [ms(0), ms(1)], "{value}");
        w.assert_contract();
    }
}

#[test]
fn a_server_delay_shorter_than_the_backoff_replaces_it() {
    // The wait is the server's delay or the policy's back-off, not the longer one.
    let w = World::new();
    w.transport.push_many([
        Reply::status(503).header("retry-after-ms", "300"),
        Reply::ok(),
    ]);
    let client = w.client();
    let policy = bounded(1, secs(4)).idempotent(true);
    w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
        .unwrap()
        .unwrap();
    assert_eq!(scheduled(&w.events()), [ms(300)]);
    assert_eq!(w.sent_at(), [ms(0), ms(300)]);
}

#[test]
fn a_draft_that_cannot_be_prepared_is_final_with_nothing_sent() {
    let w = World::new();
    let client = w.client();
    let err =
        w.rt.block_on(client.execute_with(&CallPolicy::essential(), |h| h.get("/x").invalid()))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Transport(TransportErrorKind::Config));
    assert_eq!(err.attempts(), 0);
    assert!(err.nothing_sent());
    assert_eq!(w.transport.request_count(), 0);
    let events = w.events();
    assert_eq!(w.kinds(), ["started", "failed"]);
    assert!(matches!(
        events[1].kind,
        EventKind::Failed {
            ms: 0,
            sent: false,
            ..
        }
    ));
    w.assert_contract();
}

/// A request the transport refuses before anything leaves (`Config` at send: the
/// reqwest adapter's refusal of a URL that is not http or https, or on wasm32 of an
/// obs-text header or a credential a browser would drop) is one
/// that could not be built: its `Failed` is unsent, with no time of its own, even
/// after a real send of the same call.
#[test]
fn a_request_the_transport_refuses_as_config_is_reported_unsent() {
    let w = World::new();
    w.transport
        .push(Reply::status(503))
        .push(Reply::fail(TransportErrorKind::Config, "refused header").after(ms(5)));
    let client = w.client();
    let err =
        w.rt.block_on(client.execute_with(
            &CallPolicy::essential().with_jitter(Jitter::None).unwrap(),
            |h| h.get("/x"),
        ))
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Transport(TransportErrorKind::Config));
    // The 503 went out.
    assert!(!err.nothing_sent());
    assert_eq!(
        w.kinds(),
        ["started", "failed", "retry_scheduled", "started", "failed"]
    );
    let sent: Vec<(bool, u64)> = w
        .events()
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::Failed { sent, ms, .. } => Some((sent, ms)),
            _ => None,
        })
        .collect();
    assert_eq!(sent, [(true, 0), (false, 0)]);
    w.assert_contract();
}

#[test]
fn ms_runs_from_send_to_response_head_only() {
    let w = World::new();
    w.transport.push(
        Reply::ok()
            .after(ms(300))
            .header("content-length", "12")
            .body("hello, world"),
    );
    let client = w.client();
    w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
        .unwrap()
        .unwrap();
    let succeeded = w.events().into_iter().find_map(|e| match e.kind {
        EventKind::Succeeded {
            ms, bytes, status, ..
        } => Some((ms, bytes, status)),
        _ => None,
    });
    assert_eq!(succeeded, Some((300, Some(12), StatusCode::OK)));
}

#[test]
// On wasm32 observers need not be Send + Sync, and the client still takes an Arc.
#[cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]
fn a_slow_started_callback_is_not_counted_into_ms() {
    /// Moves the virtual clock while a `Started` callback runs.
    struct SlowOnStarted(vantage_api_pool_testkit::VirtualRuntime);
    impl TransportObserver for SlowOnStarted {
        fn on_event(&self, _: &str, e: &TransportEvent) {
            if matches!(e.kind, EventKind::Started { .. }) {
                self.0.advance(ms(100));
            }
        }
    }
    let w = World::new();
    w.transport.default_reply(Reply::ok().after(ms(40)));
    let both = Fanout::new([
        Arc::new(SlowOnStarted(w.rt.clone())) as Arc<dyn TransportObserver>,
        Arc::new(w.observer.clone()),
    ]);
    let client = ResilientClient::builder(w.transport.clone(), w.rt.clone())
        .observer("api", Arc::new(both))
        .build()
        .unwrap();
    w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
        .unwrap()
        .unwrap();
    let succeeded = w.events().into_iter().find_map(|e| match e.kind {
        EventKind::Succeeded { ms, .. } => Some((ms, e.at.since_origin())),
        _ => None,
    });
    assert_eq!(succeeded, Some((40, ms(140))));
}

#[test]
fn a_3xx_the_transport_did_not_follow_or_a_1xx_head_goes_to_the_caller() {
    // A 304, or an informational head a transport hands over (101 Switching
    // Protocols after an upgrade request): a success, sent once, never retried.
    for reply in [
        Reply::status(304).header("location", "/y"),
        Reply::status(101),
    ] {
        let status = reply.status_code().unwrap();
        let w = World::new();
        w.transport.default_reply(reply);
        let client = w.client();
        let resp =
            w.rt.block_on(client.execute_with(&bounded(3, ms(10)), |h| h.get("/x")))
                .unwrap()
                .unwrap_or_else(|e| panic!("a {status} is the caller's to handle: {e}"));
        assert_eq!(resp.status(), status);
        assert_eq!(w.transport.request_count(), 1);
        assert_eq!(w.kinds(), ["started", "succeeded"]);
    }
}

#[test]
fn a_3xx_shows_the_api_reachable_but_is_no_success_for_the_failure_run() {
    // Like a 404: the breaker closes nothing and forgets no failure for it, so three
    // 503s around two 304s open a breaker whose threshold is three.
    let w = World::new();
    w.transport.push_many([
        Reply::status(503),
        Reply::status(304),
        Reply::status(503),
        Reply::status(304),
        Reply::status(503),
    ]);
    let client = w.builder().breaker(3, secs(5), secs(60)).build().unwrap();
    for _ in 0..5 {
        let _ =
            w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")));
    }
    assert_eq!(w.transport.request_count(), 5);
    assert!(
        matches!(client.breaker_state(), BreakerState::Open { .. }),
        "{:?}",
        client.breaker_state()
    );
}

#[test]
fn the_request_id_comes_from_the_configured_header() {
    let w = World::new();
    w.transport.default_reply(
        Reply::status(404)
            .header("cf-ray", "ray-1")
            .header("x-request-id", "wrong"),
    );
    let client = w
        .builder()
        .request_id_header(HeaderName::from_static("cf-ray"))
        .build()
        .unwrap();
    let err = w.background_error(&client);
    assert_eq!(err.request_id(), Some("ray-1"));
}

#[test]
fn an_error_without_a_response_carries_the_request_id_of_the_last_response() {
    // The request id is the handle for a billing question: a call whose 503 had one
    // keeps it on the error it ends with, whatever ends it after that 503.
    let busy = |id: &'static str| Reply::status(503).header("x-request-id", id);
    let one_retry = bounded_within(1, ms(10), secs(1), secs(30));
    let cases = [
        (
            "a timed-out retry",
            busy("r1"),
            Reply::stall(),
            ErrorKind::TimedOut,
        ),
        (
            "a retry that could not connect",
            busy("r1"),
            Reply::fail(TransportErrorKind::Connect, "refused"),
            ErrorKind::Transport(TransportErrorKind::Connect),
        ),
    ];
    for (what, first, second, kind) in cases {
        let w = World::new();
        w.transport.push(first).push(second);
        let client = w.client();
        let err =
            w.rt.block_on(client.execute_with(&one_retry, |h| h.get("/x")))
                .unwrap()
                .unwrap_err();
        assert_eq!(err.kind(), kind, "{what}");
        assert_eq!(err.request_id(), Some("r1"), "{what}: {err:?}");
        assert_eq!(err.retry_after(), None, "{what}: waited out");
        // The failure the observer saw last is the error returned.
        w.assert_last_failed_is(&err);
        w.assert_contract();
    }

    // Through a redial, to the breaker's refusal of the retry.
    let w = World::new();
    w.transport.push_many([
        busy("r2"),
        Reply::fail(TransportErrorKind::NotSent, "stale connection"),
        Reply::fail(TransportErrorKind::Connect, "refused"),
    ]);
    let client = w.builder().breaker(2, secs(5), secs(60)).build().unwrap();
    let err =
        w.rt.block_on(client.execute_with(&bounded(3, ms(10)), |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BreakerOpen);
    assert_eq!(err.request_id(), Some("r2"), "{err:?}");
    w.assert_last_failed_is(&err);
    w.assert_contract();

    // The last response had no id: none, not an older response's.
    let w = World::new();
    w.transport
        .push_many([busy("r3"), Reply::status(503), Reply::stall()]);
    let client = w.client();
    let err =
        w.rt.block_on(
            client.execute_with(&bounded_within(2, ms(10), secs(1), secs(30)), |h| {
                h.get("/x")
            }),
        )
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert_eq!(err.request_id(), None, "{err:?}");

    // An error response of its own gives its own id, here none, never an older
    // response's.
    let w = World::new();
    w.transport.push(busy("r4")).push(Reply::status(500));
    let client = w.client();
    let err =
        w.rt.block_on(client.execute_with(&one_retry, |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::Status(http::StatusCode::INTERNAL_SERVER_ERROR)
    );
    assert_eq!(err.request_id(), None, "{err:?}");
    w.assert_last_failed_is(&err);
}

#[test]
fn a_status_error_keeps_its_own_responses_headers_and_only_those() {
    // A final 4xx: every header line of its response, in order.
    let w = World::new();
    w.transport.push(
        Reply::status(409)
            .header("location", "/orders/7")
            .header("link", "<a>")
            .header("link", "<b>"),
    );
    let client = w.client();
    let err = w.background_error(&client);
    let headers = err
        .headers()
        .expect("a status error has its response's headers");
    assert_eq!(headers["location"], "/orders/7");
    let links: Vec<_> = headers.get_all("link").iter().collect();
    assert_eq!(links, ["<a>", "<b>"]);
    // Debug shows how many, never a value.
    let debug = format!("{err:?}");
    assert!(debug.contains("header_count: Some(3)"), "{debug}");
    assert!(!debug.contains("/orders/7"), "{debug}");
    w.assert_last_failed_is(&err);

    // Retries: the last response's headers, not the first's.
    let w = World::new();
    w.transport.push_many([
        Reply::status(503).header("x-ratelimit-reset", "first"),
        Reply::status(503).header("x-ratelimit-reset", "last"),
    ]);
    let client = w.client();
    let err =
        w.rt.block_on(client.execute_with(&bounded(1, ms(10)), |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.headers().unwrap()["x-ratelimit-reset"], "last");

    // An error with no response of its own has none: a timed-out retry, or the
    // breaker's refusal of the retry, whose last failure keeps the 503's.
    let w = World::new();
    w.transport
        .push(Reply::status(503).header("x-ratelimit-reset", "soon"))
        .push(Reply::stall());
    let client = w.client();
    let err =
        w.rt.block_on(
            client.execute_with(&bounded_within(1, ms(10), secs(1), secs(30)), |h| {
                h.get("/x")
            }),
        )
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert!(err.headers().is_none(), "{err:?}");
    let w = World::new();
    w.transport
        .push(Reply::status(503).header("x-ratelimit-reset", "soon"));
    let client = w.builder().breaker(1, secs(5), secs(60)).build().unwrap();
    let err =
        w.rt.block_on(client.execute_with(&bounded(1, ms(10)), |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BreakerOpen);
    assert!(err.headers().is_none(), "{err:?}");
    let last = err.last_failure().expect("the 503 the breaker opened on");
    assert_eq!(last.headers().unwrap()["x-ratelimit-reset"], "soon");
}

#[test]
fn an_error_body_read_a_byte_at_a_time_is_cut_on_a_character_boundary() {
    // The character split by the 2,048-byte cut is seen whole only if the read
    // goes past the cut; then it is dropped whole.
    let mut text = "a".repeat(2047);
    text.push('é');
    text.push_str("tail");
    let w = World::new();
    w.transport
        .default_reply(Reply::status(404).body(text).chunk_size(1));
    let client = w.client();
    let err = w.background_error(&client);
    let body = err.body().unwrap();
    assert_eq!(body.len(), 2047);
    assert!(std::str::from_utf8(body).is_ok());
}

#[test]
fn an_error_body_cut_by_a_stall_inside_a_character_drops_that_character() {
    let w = World::new();
    w.transport
        .default_reply(Reply::status(500).body("aaaa€bbbb").body_stalls_after(5));
    let client = w.client();
    let err = w.background_error(&client);
    assert_eq!(err.body(), Some(&b"aaaa"[..]));
    assert_eq!(err.body_text().unwrap(), "aaaa");
}

#[test]
fn an_error_body_cut_by_a_read_error_inside_a_character_drops_that_character() {
    let w = World::new();
    // "aaaa" and the first byte of "€" come in the first chunk; the read then breaks.
    w.transport.default_reply(
        Reply::status(500)
            .body("aaaa€bbbb")
            .chunk_size(5)
            .body_fails_after(5, TransportErrorKind::Interrupted, "connection reset"),
    );
    let client = w.client();
    let err = w.background_error(&client);
    assert_eq!(err.status(), Some(StatusCode::INTERNAL_SERVER_ERROR));
    assert_eq!(err.body(), Some(&b"aaaa"[..]));
}

#[test]
fn nothing_sent_holds_only_when_no_attempt_reached_the_server() {
    let refused = || Reply::fail(TransportErrorKind::Connect, "refused");
    for (first, nothing_sent) in [(refused(), true), (Reply::status(503), false)] {
        let w = World::new();
        w.transport.push_many([first, refused()]);
        let client = w.client();
        let err =
            w.rt.block_on(client.execute_with(&bounded(1, ms(10)), |h| h.get("/x")))
                .unwrap()
                .unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::Transport(TransportErrorKind::Connect)
        );
        assert_eq!(err.attempts(), 2);
        assert_eq!(err.nothing_sent(), nothing_sent, "{err:?}");
        let debug = format!("{err:?}");
        assert!(
            debug.contains(&format!("nothing_sent: {nothing_sent}")),
            "{debug}"
        );
    }
}

#[test]
fn statuses_past_599_are_final_and_not_retryable() {
    for code in [600, 999] {
        let w = World::new();
        w.transport
            .push(Reply::status(code).header("x-request-id", "rid-1"));
        let client = w.client();
        let err =
            w.rt.block_on(client.execute_with(&bounded(3, ms(10)), |h| h.get("/x")))
                .unwrap()
                .unwrap_err();
        assert_eq!(err.attempts(), 1, "{code}");
        assert!(!err.is_retryable(), "{code}");
        let debug = format!("{err:?}");
        assert!(debug.contains("has_request_id: true"), "{debug}");
        assert!(!debug.contains("rid-1"), "{debug}");
    }
}

#[test]
fn a_transport_timeout_keeps_its_message_as_the_source() {
    let w = World::new();
    w.transport
        .default_reply(Reply::fail(TransportErrorKind::TimedOut, "read timed out"));
    let client = w.client();
    let err = w.background_error(&client);
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert_eq!(err.time_limit(), Some(TimeLimit::Transport));
    let source = std::error::Error::source(&err).expect("the transport's error");
    assert!(source.to_string().contains("read timed out"), "{source}");
}

#[test]
fn a_cancelled_send_leaves_nothing_in_flight_in_the_health_figures() {
    let w = World::new();
    w.transport.default_reply(Reply::stall());
    let health = Arc::new(HealthObserver::new(secs(60)));
    let client = ResilientClient::builder(w.transport.clone(), w.rt.clone())
        .observer("api", health.clone())
        .build()
        .unwrap();
    let call = w.spawn_call(&client, CallPolicy::background(), "/x");
    w.rt.run_until_idle().unwrap();
    assert_eq!(health.snapshot("api").unwrap().in_flight, 1);
    call.abort();
    w.rt.run_until_idle().unwrap();
    let api = health.snapshot("api").unwrap();
    assert_eq!((api.in_flight, api.cancelled), (0, 1));
}

#[test]
#[cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]
fn sends_dropped_mid_flight_count_toward_nothing_but_a_policy_limit_counts() {
    // README: "A dropped send counts for nothing: not toward the breaker, not against
    // its connection, not in a `HealthObserver`'s rates."
    let w = World::new();
    w.transport.default_reply(Reply::stall());
    let health = Arc::new(HealthObserver::new(secs(60)));
    let observers = Fanout::new([])
        .with(Arc::new(w.observer.clone()))
        .with(health.clone());
    let client = ResilientClient::builder(w.transport.clone(), w.rt.clone())
        .breaker(2, secs(5), secs(60))
        .observer("api", Arc::new(observers))
        .build()
        .unwrap();
    for _ in 0..5 {
        let call = w.spawn_call(&client, CallPolicy::background(), "/x");
        w.rt.run_for(secs(1)).unwrap();
        call.abort();
        w.rt.run_until_idle().unwrap();
    }
    assert_eq!(w.transport.request_count(), 5);
    assert_eq!(client.breaker_state(), BreakerState::Closed);
    assert_eq!(w.transport.distrusted(), 0);
    let api = health.snapshot("api").unwrap();
    assert_eq!((api.sends_in_window, api.cancelled), (0, 5));

    // The same stalls under the policy's own attempt timeout open the breaker.
    let policy = CallPolicy::background()
        .with_attempt_timeout(secs(1))
        .unwrap();
    for _ in 0..2 {
        let call = w.spawn_call(&client, policy.clone(), "/x");
        w.rt.run_for(secs(1)).unwrap();
        assert!(call.is_finished());
    }
    assert!(matches!(client.breaker_state(), BreakerState::Open { .. }));
    assert_eq!(health.snapshot("api").unwrap().sends_in_window, 2);
    w.assert_contract();
}

/// `distrust_connection` is the loop's answer to its own time limit cutting a send
/// only: a redial after `NotSent` goes back to the transport as it is, and a
/// `TimedOut` the transport reports of its own (its read timeout, say) has already
/// ended that connection's use as the transport saw fit.
#[test]
fn neither_a_redial_nor_the_transports_own_timeout_distrusts_the_connection() {
    for (kind, message) in [
        (TransportErrorKind::NotSent, "pooled connection closed"),
        (TransportErrorKind::TimedOut, "read timed out"),
    ] {
        let w = World::new();
        w.transport
            .push_many([Reply::fail(kind, message), Reply::ok()]);
        let client = w.client();
        w.rt.block_on(client.execute(|h| h.get("/x")))
            .unwrap()
            .unwrap();
        let sent = (w.transport.request_count(), w.transport.distrusted());
        assert_eq!(sent, (2, 0), "{kind:?}");
        w.assert_contract();
    }
}

/// `retry_after()` is the last send's: a transport failure after a 503 that asked
/// for a delay carries none (the 503 stays reachable through `last_failure`).
#[test]
fn retry_after_is_the_last_sends_not_an_earlier_ones() {
    let w = World::new();
    w.transport.push_many([
        Reply::status(503).header("retry-after-ms", "20"),
        Reply::fail(TransportErrorKind::Connect, "connection refused"),
    ]);
    let client = w.client();
    let policy = CallPolicy::bounded(RetryPolicy::new(1, ms(10), secs(5)).unwrap());
    let err =
        w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(
        (err.kind(), err.attempts()),
        (ErrorKind::Transport(TransportErrorKind::Connect), 2)
    );
    assert_eq!(err.retry_after(), None);
}

#[test]
fn an_error_body_that_stalls_is_cut_by_the_time_limit_and_keeps_the_status() {
    let w = World::new();
    w.transport.push(
        Reply::status(500)
            .body("partial body then nothing")
            .body_stalls_after(7),
    );
    let client = w.client();
    let err = w.background_error(&client);
    assert_eq!(err.status(), Some(StatusCode::INTERNAL_SERVER_ERROR));
    assert_eq!(err.body(), Some(&b"partial"[..]));
    assert_eq!(w.now(), secs(10));
    assert_eq!(
        w.transport.distrusted(),
        1,
        "a body cut by the time limit distrusts its connection"
    );
}

#[test]
fn the_retry_count_header_counts_retries_not_redials() {
    // A redial repeats the count of the attempt it sends again: none for the first.
    let not_sent = || Reply::fail(TransportErrorKind::NotSent, "stale");
    let cases = [
        (
            [
                Reply::status(503),
                not_sent(),
                Reply::status(503),
                Reply::ok(),
            ],
            [None, Some("1"), Some("1"), Some("2")],
        ),
        (
            [not_sent(), Reply::status(503), not_sent(), Reply::ok()],
            [None, None, Some("1"), Some("1")],
        ),
    ];
    for (replies, expected) in cases {
        let w = World::new();
        w.transport.push_many(replies);
        let client = w
            .builder()
            .retry_count_header(http::HeaderName::from_static("x-retry-count"))
            .build()
            .unwrap();
        w.rt.block_on(client.execute_with(&bounded(3, ms(10)), |h| h.get("/x")))
            .unwrap()
            .unwrap();
        let requests = w.transport.requests();
        let counts: Vec<_> = requests
            .iter()
            .map(|r| r.headers.get("x-retry-count").map(|v| v.to_str().unwrap()))
            .collect();
        assert_eq!(counts, expected);
    }
}

#[test]
fn admit_time_is_not_charged_to_the_budget() {
    let w = World::new();
    w.transport.admit_delay(secs(20));
    w.transport.push_many([Reply::status(503), Reply::ok()]);
    let client = w.client();
    let policy = bounded(3, secs(1)).with_budget(Some(secs(10))).unwrap();
    w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
        .unwrap()
        .unwrap();
    // Two admits of 20 s each and a 1 s back-off: 41 s, well past the 10 s budget.
    assert_eq!(w.sent_at(), [secs(20), secs(41)]);
}

#[test]
fn report_events_carry_no_call() {
    let w = World::new();
    let client = w.client();
    client.report(vantage_api_pool::Report::RowsPulled { n: 25 });
    client.report(vantage_api_pool::Report::WritePushed);
    let events = w.events();
    assert!(matches!(events[0].kind, EventKind::RowsPulled { n: 25 }));
    assert!(matches!(events[1].kind, EventKind::WritePushed));
    assert!(events.iter().all(|e| e.call.is_none()));
}

#[test]
fn call_ids_are_per_client_and_events_carry_them() {
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let client = w.client();
    for _ in 0..3 {
        w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
            .unwrap()
            .unwrap();
    }
    let calls: Vec<_> = w.events().iter().map(|e| e.call.unwrap().0).collect();
    assert_eq!(calls, [1, 1, 2, 2, 3, 3]);
}

#[test]
fn a_fail_fast_retry_goes_out_when_another_calls_answer_closes_the_breaker() {
    // No guessing at the retry's fate from the breaker's state at the failure: a
    // send already in flight can close the breaker before the retry wakes.
    let w = World::new();
    w.transport.push(Reply::ok().after(ms(50))); // call A: answers at 50 ms
    w.transport.push(Reply::status(503)); // call B: fails at once, opens the breaker
    w.transport.default_reply(Reply::ok());
    let client = w.builder().breaker(1, secs(5), secs(60)).build().unwrap();
    let a = w.spawn_call(&client, bounded(3, ms(250)), "/a");
    let b = w.spawn_call(&client, bounded(3, ms(250)), "/b");
    w.rt.run().unwrap();
    assert!(w.rt.block_on(a).unwrap().is_ok());
    assert!(
        w.rt.block_on(b).unwrap().is_ok(),
        "A's 200 at 50 ms closed the breaker; B's retry at 250 ms goes out"
    );
    assert_eq!(w.sent_at(), [Duration::ZERO, Duration::ZERO, ms(250)]);
    w.assert_contract();
}

#[test]
fn a_fail_fast_retry_meets_the_breaker_as_it_is_when_the_retry_wakes() {
    // The first send's 503 opens the breaker; the retry reaches the gate at 250 ms.
    for (cooldown, sends, last) in [
        // Still open: refused at the gate, nothing sent.
        (secs(5), 1, ["retry_scheduled", "started", "failed"]),
        // Cooldown over: the retry is the probe, and its 200 closes the breaker.
        (ms(100), 2, ["started", "succeeded", "breaker_closed"]),
    ] {
        let w = World::new();
        w.transport.push(Reply::status(503).body("down"));
        w.transport.default_reply(Reply::ok());
        let client = w.builder().breaker(1, cooldown, secs(60)).build().unwrap();
        let result =
            w.rt.block_on(client.execute_with(&bounded(3, ms(250)), |h| h.get("/x")))
                .unwrap();
        match sends {
            1 => {
                let err = result.unwrap_err();
                assert_eq!((err.kind(), err.attempts()), (ErrorKind::BreakerOpen, 1));
            }
            _ => assert!(result.is_ok()),
        }
        assert_eq!(w.transport.request_count(), sends);
        assert_eq!(w.now(), ms(250));
        assert_eq!(w.kinds()[..3], ["started", "failed", "breaker_opened"]);
        assert!(w.kinds().ends_with(&last), "{:?}", w.kinds());
        w.assert_contract();
    }
}

#[test]
fn a_waiting_call_sleeps_through_a_cooldown_that_ends_inside_its_budget() {
    let w = World::new();
    w.transport.push(Reply::status(503));
    w.transport.default_reply(Reply::ok());
    let client = w.builder().breaker(1, secs(5), secs(60)).build().unwrap();
    let policy = bounded(3, ms(250))
        .with_breaker_mode(vantage_api_pool::BreakerMode::WaitForProbe)
        .with_budget(Some(secs(30)))
        .unwrap();
    let resp =
        w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
            .unwrap();
    assert!(resp.is_ok());
    assert_eq!(
        w.sent_at(),
        [Duration::ZERO, secs(5)],
        "the probe at the cooldown's end"
    );
}

#[test]
fn a_retry_due_exactly_at_the_end_of_the_budget_is_not_slept_for() {
    // The server asks for 1 s, and 1 s is all the budget has: the retry could only
    // start as the budget ends, so the call returns the 503 at once.
    let w = World::new();
    w.transport
        .push(Reply::status(503).header("retry-after-ms", "1000"));
    let policy = bounded_within(3, ms(100), ms(500), secs(1));
    the_503_comes_back_at_once(&w, &w.client(), &policy, ms(0));
}

/// Runs one call under `policy` and checks that it returned its 503 at `answered`,
/// with no retry scheduled.
fn the_503_comes_back_at_once(w: &World, client: &Client, policy: &CallPolicy, answered: Duration) {
    let err =
        w.rt.block_on(client.execute_with(policy, |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(
        err.status(),
        Some(StatusCode::SERVICE_UNAVAILABLE),
        "{err:?}"
    );
    assert_eq!(w.now(), answered, "no sleep into the budget's end");
    assert!(scheduled(&w.events()).is_empty());
    w.assert_contract();
}

/// An observer that takes 5 s (virtual) on every `Started`.
struct SlowOnStart(VirtualRuntime);

impl TransportObserver for SlowOnStart {
    fn on_event(&self, _api: &str, event: &TransportEvent) {
        if matches!(event.kind, EventKind::Started { .. }) {
            self.0.advance(secs(5));
        }
    }
}

/// DESIGN: "An attempt's time limit is the smaller of its timeout and the budget
/// left"; ARCHITECTURE: "no call outlives its budget". A slow `Started` callback eats
/// budget, so the send gets only what is left after it.
#[test]
fn a_slow_started_callback_shortens_a_budget_limited_send() {
    let w = World::new();
    w.transport.push(Reply::stall());
    let client = ResilientClient::builder(w.transport.clone(), w.rt.clone())
        .observer("api", Arc::new(SlowOnStart(w.rt.clone())))
        .build()
        .unwrap();
    let policy = CallPolicy::background()
        .with_time_limits(secs(10), Some(secs(10)))
        .unwrap();
    let err =
        w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert_eq!(w.now(), secs(10), "the call outlived its 10 s budget");
}

/// DESIGN, "running out of time": "Before a retry sleep, if the next attempt could
/// not start before the budget ends, the call returns the last attempt's error at
/// once without sleeping." One rate token a minute: after the 503 at 0 s the next
/// token is due at 60 s, past the 30 s budget, so the next attempt cannot start.
#[test]
fn a_retry_that_the_rate_bucket_cannot_serve_inside_the_budget_is_not_slept_for() {
    let w = World::new();
    w.transport.push(Reply::status(503).body("down"));
    let client = w
        .builder()
        .rate_limit_with_burst(1.0 / 60.0, 1)
        .build()
        .unwrap();
    let policy = bounded_within(3, secs(1), secs(10), secs(30));
    let err =
        w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(
        (err.kind_name(), err.status().map(|s| s.as_u16()), w.now()),
        ("status", Some(503), secs(0)),
        "events: {:?}",
        w.kinds()
    );
    // No retry was announced, as none could go out.
    assert_eq!(w.kinds(), ["started", "failed"]);
    assert_eq!(err.attempts(), 1);
    w.assert_contract();
}

#[test]
fn a_retry_whose_rate_token_comes_inside_the_budget_is_slept_for() {
    // The same bucket with a budget that reaches the next token: the retry waits
    // for it and goes out at 60 s.
    let w = World::new();
    w.transport.push(Reply::status(503));
    w.transport.push(Reply::ok());
    let client = w
        .builder()
        .rate_limit_with_burst(1.0 / 60.0, 1)
        .build()
        .unwrap();
    let policy = bounded_within(3, secs(1), secs(10), secs(61));
    w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
        .unwrap()
        .unwrap();
    assert_eq!(w.sent_at(), [secs(0), secs(60)]);
    w.assert_contract();
}

#[test]
fn a_retry_whose_admission_waited_leaves_its_rate_token_to_the_sends_own_wait() {
    // Time in admit() is not charged to the budget: each admission wait moves its end
    // on. The 503's retry needs a token at 4 s, past the budget's end as it stands at
    // the failure (3.5 s), but the retry's own admission moves that end to 5.6 s.
    let w = World::new();
    w.transport.admit_delay(secs(2));
    w.transport.push(Reply::status(503));
    w.transport.push(Reply::ok());
    let client = w.builder().rate_limit_with_burst(0.5, 1).build().unwrap();
    let policy = bounded_within(3, ms(100), secs(1), ms(1500));
    w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
        .unwrap()
        .unwrap();
    assert_eq!(w.sent_at(), [secs(2), ms(4100)]);
    w.assert_contract();
}

/// README: "Jitter is added after the ceiling, so with the default a sleep can reach
/// 1.25 x max." A Retry-After of 120 s under a 10 s ceiling, default jitter.
#[test]
fn jitter_is_added_after_the_ceiling() {
    let mut longest = Duration::ZERO;
    for seed in 0..20 {
        let w = World::new();
        let rt = w.rt.clone().with_seed(seed);
        w.transport
            .push(Reply::status(429).header("retry-after", "120"));
        w.transport.push(Reply::ok());
        let client = w.client();
        let policy = CallPolicy::bounded(RetryPolicy::default())
            .with_budget(None)
            .unwrap();
        rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
            .unwrap()
            .unwrap();
        let after = scheduled(&w.events())[0];
        assert!(after >= secs(10) && after <= ms(12_500), "{after:?}");
        longest = longest.max(after);
    }
    assert!(
        longest > secs(11),
        "jitter never went past the ceiling: {longest:?}"
    );
}

/// `Jitter::Full` draws the policy's back-off anywhere in [1 ms, back-off], but a
/// server's delay only grows (by up to a quarter).
#[test]
fn full_jitter_draws_the_back_off_below_it_and_only_adds_to_a_server_delay() {
    let full = |base| {
        bounded(1, base)
            .with_jitter(Jitter::Full)
            .unwrap()
            .with_budget(None)
            .unwrap()
    };
    let (mut backoffs, mut server_waits) = (Vec::new(), Vec::new());
    for seed in 0..20 {
        for (first, into) in [
            (Reply::status(503), &mut backoffs),
            (
                Reply::status(503).header("retry-after", "1"),
                &mut server_waits,
            ),
        ] {
            let w = World::new();
            let rt = w.rt.clone().with_seed(seed);
            w.transport.push(first).push(Reply::ok());
            let client = w.client();
            rt.block_on(client.execute_with(&full(secs(1)), |h| h.get("/x")))
                .unwrap()
                .unwrap();
            let after = scheduled(&w.events())[0];
            assert_eq!(w.sent_at(), [Duration::ZERO, after], "seed {seed}");
            into.push(after);
        }
    }
    assert!(
        backoffs.iter().all(|d| (ms(1)..=secs(1)).contains(d)),
        "{backoffs:?}"
    );
    assert!(
        backoffs.iter().filter(|d| **d < ms(500)).count() >= 5,
        "a back-off drawn below it is often well below: {backoffs:?}"
    );
    assert!(
        server_waits
            .iter()
            .all(|d| (secs(1)..=ms(1250)).contains(d)),
        "{server_waits:?}"
    );
    assert!(
        server_waits.iter().any(|d| *d > secs(1)),
        "{server_waits:?}"
    );
}

/// Moves the virtual clock on by `by` when it hears the first `Failed`, then passes
/// every event on to `recorder`.
struct AdvanceOnFirstFailure {
    rt: VirtualRuntime,
    by: Duration,
    done: AtomicBool,
    recorder: vantage_api_pool_testkit::RecordingObserver,
}

impl AdvanceOnFirstFailure {
    fn new(w: &World, by: Duration) -> Self {
        AdvanceOnFirstFailure {
            rt: w.rt.clone(),
            by,
            done: AtomicBool::new(false),
            recorder: w.observer.clone(),
        }
    }
}

impl TransportObserver for AdvanceOnFirstFailure {
    fn on_event(&self, api: &str, event: &TransportEvent) {
        if matches!(event.kind, EventKind::Failed { .. }) && !self.done.swap(true, Ordering::SeqCst)
        {
            self.rt.advance(self.by);
        }
        self.recorder.on_event(api, event);
    }

    fn on_call_end(&self, api: &str, end: &vantage_api_pool::CallEnd) {
        self.recorder.on_call_end(api, end);
    }
}

/// A call under a 5 s budget whose first send is `NotSent` at 1 s, on a client with a
/// rate bucket (burst 2, 1/s) whose observer moves the clock on by `by` when it hears
/// that `Failed`, so the redial meets the gate with that much less time. Returns the
/// client, the call's error and how many requests the call built.
fn a_redial_after_a_slow_failed_callback(
    w: &World,
    by: Duration,
) -> (Client, vantage_api_pool::ClientError, u32) {
    w.transport
        .push(Reply::fail(TransportErrorKind::NotSent, "stale").after(secs(1)));
    w.transport.default_reply(Reply::ok());
    let observer = AdvanceOnFirstFailure::new(w, by);
    let client = ResilientClient::builder(w.transport.clone(), w.rt.clone())
        .observer("api", Arc::new(observer))
        .rate_limit_with_burst(1.0, 2)
        .build()
        .unwrap();
    let built = std::cell::Cell::new(0);
    let err =
        w.rt.block_on(
            client.execute_with(&bounded_within(3, ms(10), secs(5), secs(5)), |h| {
                built.set(built.get() + 1);
                h.get("/x")
            }),
        )
        .unwrap()
        .unwrap_err();
    (client, err, built.get())
}

#[test]
fn a_redial_that_finds_the_budget_spent_builds_no_request() {
    // The `Failed` callback takes a minute: the redial finds the budget spent at the
    // top of the gate, before the request closure runs again.
    let w = World::new();
    let (_, err, built) = a_redial_after_a_slow_failed_callback(&w, secs(60));
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert_eq!(err.time_limit(), Some(TimeLimit::Budget));
    assert_eq!(built, 1, "the redial built a request with no time left");
    assert_eq!(w.transport.request_count(), 1);
    // `Redialing` carries the failure's reading, as what a send's outcome caused
    // does, not the clock after the slow callback.
    assert_eq!(w.times_of("redialing"), [secs(1)]);
}

#[test]
fn a_redial_that_reaches_the_gate_exactly_at_the_budgets_end_builds_no_request() {
    // The `Failed` callback takes exactly the 4 s left: the redial reaches the gate at
    // the budget's end. The budget is spent *at* its end: no request is built, no
    // rate token is taken.
    let w = World::new();
    let (client, err, built) = a_redial_after_a_slow_failed_callback(&w, secs(4));
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert_eq!(err.time_limit(), Some(TimeLimit::Budget));
    assert_eq!(w.now(), secs(5));
    assert_eq!(built, 1, "the redial built a request with no time left");
    assert_eq!(w.transport.request_count(), 1);
    // The bucket (burst 2, 1/s) gave one token at 0 s and is full again by 5 s: two
    // calls go out at once now. A refused redial that took a token would leave one.
    for path in ["/a", "/b"] {
        w.rt.block_on(client.execute_with(&bounded(0, ms(10)), |h| h.get(path)))
            .unwrap()
            .unwrap();
    }
    assert_eq!(w.sent_at(), [ms(0), secs(5), secs(5)]);
}

#[test]
fn a_permit_or_a_token_that_comes_at_the_budgets_end_leaves_the_rate_token_and_the_closure_alone() {
    // The budget is spent at its end, whatever wait reaches it: a permit granted
    // then, a first token fetch that ends then, or the refresh a send holding its
    // permit waits for that ends then. Each wait's race against the budget looks at
    // the wait first, so the wait can win at that very instant; the call must still
    // end `TimedOut` at once, building no request and taking no rate token.
    let two_seconds = CallPolicy::background()
        .with_attempt_timeout(secs(1))
        .unwrap()
        .with_budget(Some(secs(2)))
        .unwrap();
    // B waits for the permit A holds until its 2 s reply.
    let w = World::new();
    w.transport.on_path("/a", [Reply::ok().after(secs(2))]);
    w.transport.default_reply(Reply::ok());
    let client = w
        .builder()
        .max_parallel(1)
        .rate_limit_with_burst(0.1, 2)
        .build()
        .unwrap();
    let a = w.spawn_call(&client, CallPolicy::background(), "/a");
    let b = w.spawn_call(&client, two_seconds.clone(), "/b");
    let (a, b) = w.rt.block_on(async { (a.await, b.await) }).unwrap();
    assert!(a.is_ok());
    let err = b.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert_eq!(err.time_limit(), Some(TimeLimit::Budget));
    assert!(err.nothing_sent());
    // The bucket's second token is still there for the next call.
    w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/c")))
        .unwrap()
        .unwrap();
    assert_eq!(w.sent_at(), [secs(0), secs(2)]);
    w.assert_contract();

    // The first token fetch takes the whole budget.
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let rt = w.rt.clone();
    let source = vantage_api_pool::auth::token_fn(move || {
        let rt = rt.clone();
        async move {
            rt.sleep(secs(2)).await;
            Ok::<_, vantage_api_pool::auth::AuthError>((
                http::header::AUTHORIZATION,
                http::HeaderValue::from_static("Bearer t1"),
            ))
        }
    });
    let client = w
        .builder()
        .rate_limit_with_burst(0.1, 1)
        .auth(source)
        .build()
        .unwrap();
    let mut built = 0;
    let err =
        w.rt.block_on(client.execute_with(&two_seconds, |h| {
            built += 1;
            h.get("/x")
        }))
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert_eq!(err.time_limit(), Some(TimeLimit::Budget));
    assert_eq!((w.now(), built), (secs(2), 0), "no request built");
    w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/y")))
        .unwrap()
        .unwrap();
    assert_eq!(w.sent_at(), [secs(2)], "the bucket's token was left");
    w.assert_contract();

    // B gets the permit at 1 s, when A's 401 rejects the token B's request carries:
    // B waits, holding the permit, for the refresh A started, which ends at B's
    // budget's end (2 s). A replays at 2 s with the new token; a third call finds
    // the bucket's last token (1 in 10 s, burst 3) still there.
    let w = World::new();
    w.transport
        .on_path("/a", [Reply::status(401).after(secs(1)), Reply::ok()]);
    w.transport.default_reply(Reply::ok());
    let (rt, fetches) = (w.rt.clone(), Arc::new(std::sync::atomic::AtomicU32::new(0)));
    let counted = Arc::clone(&fetches);
    let source = vantage_api_pool::auth::token_fn(move || {
        let rt = rt.clone();
        let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            if n > 1 {
                rt.sleep(secs(1)).await;
            }
            let value = if n == 1 { "Bearer t1" } else { "Bearer t2" };
            Ok::<_, vantage_api_pool::auth::AuthError>((
                http::header::AUTHORIZATION,
                http::HeaderValue::from_static(value),
            ))
        }
    });
    let client = w
        .builder()
        .max_parallel(1)
        .rate_limit_with_burst(0.1, 3)
        .auth(source)
        .build()
        .unwrap();
    let a = w.spawn_call(&client, CallPolicy::background(), "/a");
    let b = w.spawn_call(&client, two_seconds, "/b");
    let (a, b) = w.rt.block_on(async { (a.await, b.await) }).unwrap();
    assert!(a.is_ok(), "{a:?}");
    let err = b.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert_eq!(err.time_limit(), Some(TimeLimit::Budget));
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/c")))
        .unwrap()
        .unwrap();
    assert_eq!(w.sent_at(), [secs(0), secs(2), secs(2)]);
    w.assert_contract();
}

#[test]
fn started_carries_the_gates_reading_not_the_clock_after_a_slow_request_closure() {
    // The request closure takes 300 ms (say, signing a body): `Started` stands for
    // the gate's reading (0 ms), as `TransportEvent::at` documents.
    let w = World::new();
    w.transport.push(Reply::ok().after(ms(10)));
    let client = w.client();
    let rt = w.rt.clone();
    w.rt.block_on(client.execute_with(&bounded(0, ms(10)), |h| {
        rt.advance(ms(300));
        h.get("/x")
    }))
    .unwrap()
    .unwrap();
    assert_eq!(w.times_of("started"), [ms(0)]);
    assert_eq!(w.sent_at(), [ms(300)]);
    w.assert_contract();
}

#[test]
fn a_second_not_sent_is_still_free_and_leaves_nothing_sent() {
    // Two NotSent (the two free redials), then a Connect failure: no send can have
    // reached the server, so the POST's error says nothing was sent.
    let w = World::new();
    let not_sent = || Reply::fail(TransportErrorKind::NotSent, "stale connection");
    w.transport.push_many([
        not_sent(),
        not_sent(),
        Reply::fail(TransportErrorKind::Connect, "refused"),
    ]);
    let client = w.client();
    let err =
        w.rt.block_on(client.execute_with(&bounded(0, ms(10)), |h| h.post("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::Transport(TransportErrorKind::Connect)
    );
    assert_eq!(w.transport.request_count(), 3);
    assert!(
        err.nothing_sent(),
        "the second NotSent was taken as Interrupted"
    );
    w.assert_contract();
}

#[test]
fn an_error_after_a_redial_counts_attempts_not_sends() {
    let not_sent = || Reply::fail(TransportErrorKind::NotSent, "stale connection");
    for last in [Reply::status(503).body("down"), Reply::stall()] {
        let w = World::new();
        w.transport.push_many([not_sent(), last]);
        let client = w.client();
        let err =
            w.rt.block_on(client.execute_with(&bounded(0, ms(10)), |h| h.get("/x")))
                .unwrap()
                .unwrap_err();
        assert_eq!(w.transport.request_count(), 2);
        assert_eq!(err.attempts(), 1, "{err:?}");
        w.assert_contract();
    }
}

#[test]
fn a_retry_after_a_redialed_send_is_a_new_attempt() {
    let w = World::new();
    w.transport.push_many([
        Reply::fail(TransportErrorKind::NotSent, "stale connection"),
        Reply::status(503),
        Reply::status(503),
    ]);
    let client = w.client();
    let err =
        w.rt.block_on(client.execute_with(&bounded(1, ms(10)), |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(w.started(), [(1, 1), (2, 1), (3, 2)]);
    assert_eq!(err.attempts(), 2);
    w.assert_contract();
}

#[test]
fn a_retry_past_the_budget_is_not_slept_for_on_a_rate_limited_client_either() {
    let w = World::new();
    w.transport.push(
        Reply::status(503)
            .header("retry-after", "20")
            .after(secs(1)),
    );
    let client = w.builder().rate_limit(100.0).build().unwrap();
    let policy = bounded(3, ms(100)).with_budget(Some(secs(15))).unwrap();
    the_503_comes_back_at_once(&w, &client, &policy, secs(1));
}

/// Admissions wait 2 s, 0, 2 s; a token every 2 s, burst 2; a budget of 1.5 s. The
/// next token (at 4 s) is past the budget's end as it stands (3.5 s), but the third
/// admission moves that end to 5.5 s, so the retry goes out.
#[test]
fn once_an_admission_waited_a_later_retry_leaves_its_token_to_the_sends_own_wait() {
    let w = World::new();
    let n = std::sync::atomic::AtomicU32::new(0);
    w.transport
        .admit_with(move |_| match n.fetch_add(1, Ordering::SeqCst) {
            1 => Duration::ZERO,
            _ => secs(2),
        });
    w.transport
        .push_many([Reply::status(503), Reply::status(503), Reply::ok()]);
    let client = w.builder().rate_limit_with_burst(0.5, 2).build().unwrap();
    let policy = bounded_within(3, ms(100), secs(1), ms(1500));
    let res =
        w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
            .unwrap();
    assert!(res.is_ok(), "{:?} sent at {:?}", res.err(), w.sent_at());
    assert_eq!(w.sent_at(), [secs(2), ms(2100), ms(4300)]);
    w.assert_contract();
}

#[test]
fn an_error_body_read_to_its_end_is_kept_whole_even_if_it_ends_inside_a_character() {
    let w = World::new();
    w.transport
        .default_reply(Reply::status(404).body(&b"abc\xC3"[..]).chunk_size(2));
    let client = w.client();
    assert_eq!(w.background_error(&client).body(), Some(&b"abc\xC3"[..]));
}

#[test]
fn retry_scheduled_carries_the_failures_reading_not_the_clock_after_its_callback() {
    let w = World::new();
    w.transport
        .push_many([Reply::status(503).after(ms(30)), Reply::ok()]);
    let slow = AdvanceOnFirstFailure::new(&w, secs(1));
    let client = ResilientClient::builder(w.transport.clone(), w.rt.clone())
        .observer("api", Arc::new(slow))
        .build()
        .unwrap();
    w.rt.block_on(client.execute_with(&bounded(1, ms(100)), |h| h.get("/x")))
        .unwrap()
        .unwrap();
    let at = |kind: &str| {
        w.observer
            .events()
            .into_iter()
            .find(|r| r.event.kind.name() == kind)
            .map(|r| r.event.at.since_origin())
    };
    assert_eq!(at("failed"), Some(ms(30)));
    assert_eq!(at("retry_scheduled"), Some(ms(30)));
}

/// A transport whose every response is a 500 whose body comes in these chunks, each
/// ready when asked for.
struct ErrorInChunks(
    vantage_api_pool_testkit::ScriptedTransport,
    Vec<&'static str>,
);

impl vantage_api_pool::Transport for ErrorInChunks {
    type Handle = vantage_api_pool_testkit::ScriptedHttp;
    type Draft = vantage_api_pool_testkit::ScriptedRequestBuilder;
    type Request = vantage_api_pool_testkit::ScriptedRequest;
    type Response = Chunks;
    fn handle(&self) -> &Self::Handle {
        self.0.handle()
    }
    fn prepare(
        &self,
        draft: Self::Draft,
    ) -> Result<Self::Request, vantage_api_pool::TransportError> {
        self.0.prepare(draft)
    }
    fn send(
        &self,
        request: Self::Request,
    ) -> impl std::future::Future<Output = Result<Chunks, vantage_api_pool::TransportError>> {
        let sent = self.0.send(request);
        let chunks = self.1.clone();
        async move {
            sent.await?;
            let mut body = Chunks::new(chunks.into_iter().map(Ok));
            body.status = StatusCode::INTERNAL_SERVER_ERROR;
            Ok(body)
        }
    }
}

#[test]
fn an_empty_chunk_ends_the_error_body() {
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let chunks = vec!["ab", "", "cd"];
    let client = ResilientClient::builder(ErrorInChunks(w.transport.clone(), chunks), w.rt.clone())
        .build()
        .unwrap();
    let err = w.background_error(&client);
    assert_eq!(err.status(), Some(StatusCode::INTERNAL_SERVER_ERROR));
    assert_eq!(err.body(), Some(&b"ab"[..]));
}

#[test]
fn an_empty_chunk_right_after_an_error_body_of_exactly_the_limit_ends_it() {
    // At the limit the next chunk is looked at without waiting, for the first byte
    // of what follows: an empty one has none, and is the end.
    let limit = vantage_api_pool::MAX_ERROR_BODY;
    let full: &'static str = Box::leak("a".repeat(limit).into_boxed_str());
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let chunks = vec![full, "", "more"];
    let client = ResilientClient::builder(ErrorInChunks(w.transport.clone(), chunks), w.rt.clone())
        .build()
        .unwrap();
    let err = w.background_error(&client);
    assert_eq!(err.body().map(<[u8]>::len), Some(limit));
}
