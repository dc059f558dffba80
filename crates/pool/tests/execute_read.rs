//! `execute_read`: the body read inside the attempt, so a body that breaks or stalls
//! is a failed send (retried when safe, counted by the breaker, cut by the send's
//! time limit), on virtual time with exact times.

mod common;

// On wasm32 the same tests run under wasm-bindgen-test, in Node and in a browser.
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

use std::time::Duration;

use common::*;
use http::StatusCode;
use vantage_api_pool::{
    BreakerState, CallPolicy, ErrorKind, EventKind, ReadResponse, TimeLimit, TransportErrorKind,
    TransportEvent,
};
use vantage_api_pool_testkit::{Reply, ScriptedResponse};

const BODY: &str = r#"{"orders": [1, 2, 3]}"#;

fn broken(n: usize) -> Reply {
    Reply::ok()
        .body(BODY)
        .body_fails_after(n, TransportErrorKind::Interrupted, "connection reset")
}

/// The `Failed` events' (kind of error, `sent`, `ms`), in order.
fn failures(events: &[TransportEvent]) -> Vec<(ErrorKind, bool, u64)> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Failed {
                error, sent, ms, ..
            } => Some((error.kind(), *sent, *ms)),
            _ => None,
        })
        .collect()
}

/// The `Succeeded` events' (`ms`, `bytes`) and when they were reported.
fn successes(events: &[TransportEvent]) -> Vec<(u64, Option<u64>, Duration)> {
    events
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::Succeeded { ms, bytes, .. } => Some((ms, bytes, e.at.since_origin())),
            _ => None,
        })
        .collect()
}

fn read(
    w: &World,
    client: &Client,
    policy: &CallPolicy,
    limit: usize,
    build: impl FnMut(
        &vantage_api_pool_testkit::ScriptedHttp,
    ) -> vantage_api_pool_testkit::ScriptedRequestBuilder,
) -> Result<ReadResponse<ScriptedResponse>, vantage_api_pool::ClientError> {
    w.rt.block_on(client.execute_read_with(policy, limit, build))
        .expect("the call finishes")
}

#[test]
fn a_get_whose_body_breaks_is_sent_again_and_read_whole() {
    let w = World::new();
    w.transport.push(broken(5));
    w.transport
        .push(Reply::ok().body(BODY).header("x-request-id", "r-2"));
    let client = w.client();
    let got = read(&w, &client, &bounded(3, ms(250)), 1024, |h| {
        h.get("/orders")
    })
    .unwrap();

    assert_eq!(got.status(), StatusCode::OK);
    assert_eq!(got.headers()["x-request-id"], "r-2");
    assert_eq!(client.request_id(got.response()), Some("r-2"));
    assert_eq!(got.body().as_ref(), BODY.as_bytes());
    let (response, body) = got.into_parts();
    assert_eq!(response.bytes_read(), BODY.len());
    assert_eq!(body, BODY);

    assert_eq!(w.sent_at(), [ms(0), ms(250)]);
    assert_eq!(
        w.kinds(),
        [
            "started",
            "failed",
            "retry_scheduled",
            "started",
            "succeeded"
        ]
    );
    let events = w.events();
    assert_eq!(
        failures(&events),
        [(
            ErrorKind::Transport(TransportErrorKind::Interrupted),
            true,
            0
        )]
    );
    let len = u64::try_from(BODY.len()).unwrap();
    assert_eq!(successes(&events), [(0, Some(len), ms(250))]);
    w.assert_contract();
}

#[test]
fn the_same_broken_body_through_execute_is_the_callers_to_read() {
    // The contrast: `execute` ends at the head, so the break reaches the caller and
    // nothing is sent again.
    let w = World::new();
    w.transport.push(broken(5));
    w.transport.push(Reply::ok().body(BODY));
    let client = w.client();
    let mut response =
        w.rt.block_on(client.execute_with(&bounded(3, ms(250)), |h| h.get("/orders")))
            .unwrap()
            .unwrap();
    let body =
        w.rt.block_on(vantage_api_pool::transport::read_body(&mut response, 1024))
            .unwrap();
    assert_eq!(body.unwrap_err().kind(), TransportErrorKind::Interrupted);
    assert_eq!(w.transport.request_count(), 1);
    assert_eq!(w.kinds(), ["started", "succeeded"]);
}

#[test]
fn a_post_whose_answer_broke_off_is_not_sent_again_unless_safe_to_repeat() {
    let w = World::new();
    w.transport
        .push_many([broken(5), broken(5), Reply::ok().body(BODY)]);
    let client = w.client();
    let policy = bounded(3, ms(250));

    let err = read(&w, &client, &policy, 1024, |h| h.post("/pay")).unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::Transport(TransportErrorKind::Interrupted)
    );
    assert_eq!(err.attempts(), 1);
    assert!(!err.nothing_sent());
    assert_eq!(w.transport.request_count(), 1);

    // With an Idempotency-Key the POST may go again.
    let got = read(&w, &client, &policy, 1024, |h| {
        h.post("/pay").header("idempotency-key", "k-1")
    })
    .unwrap();
    assert_eq!(got.into_body(), BODY);
    assert_eq!(w.transport.request_count(), 3);
    w.assert_contract();
}

#[test]
fn a_stalled_body_is_cut_by_the_attempt_timeout_then_retried() {
    let w = World::new();
    w.transport
        .push(Reply::ok().body(BODY).after(ms(300)).body_stalls_after(4));
    w.transport.push(Reply::ok().body(BODY));
    let client = w.client();
    let policy = bounded_within(2, ms(100), secs(2), secs(30));
    let got = read(&w, &client, &policy, 1024, |h| h.get("/orders")).unwrap();
    assert_eq!(got.body(), BODY);

    // The attempt timeout covers head and body: cut at 2 s, the retry 100 ms later.
    assert_eq!(w.sent_at(), [ms(0), ms(2100)]);
    assert_eq!(w.transport.distrusted(), 1);
    let events = w.events();
    assert_eq!(failures(&events), [(ErrorKind::TimedOut, true, 2000)]);
    let cut = events
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::Failed { error, .. } => Some((error.time_limit(), e.at.since_origin())),
            _ => None,
        })
        .unwrap();
    assert_eq!(cut, (Some(TimeLimit::AttemptTimeout), secs(2)));
    w.assert_contract();
}

#[test]
fn a_body_still_coming_when_the_budget_ends_names_the_budget() {
    let w = World::new();
    // The retry leaves at 800 ms with 700 ms of the budget left, less than its
    // attempt timeout: the stalled body is cut when the budget ends.
    w.transport.push(Reply::status(500).after(ms(700)));
    w.transport
        .push(Reply::ok().body(BODY).body_stalls_after(4));
    let client = w.client();
    let policy = bounded_within(2, ms(100), secs(1), ms(1500));
    let err = read(&w, &client, &policy, 1024, |h| h.get("/orders")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert_eq!(err.time_limit(), Some(TimeLimit::Budget));
    assert_eq!(err.attempts(), 2);
    assert_eq!(w.now(), ms(1500));
    assert_eq!(w.sent_at(), [ms(0), ms(800)]);
    assert_eq!(w.transport.distrusted(), 1);
    w.assert_contract();
}

#[test]
fn a_body_over_the_limit_ends_the_call_and_leaves_the_breaker_alone() {
    let w = World::new();
    let len = BODY.len();
    w.transport
        .default_reply(Reply::ok().body(BODY).chunk_size(4));
    let client = w.builder().breaker(1, secs(5), secs(60)).build().unwrap();
    let policy = bounded(3, ms(250));

    let err = read(&w, &client, &policy, len - 1, |h| h.get("/orders")).unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::Transport(TransportErrorKind::TooLarge)
    );
    assert_eq!(w.transport.request_count(), 1);
    assert_eq!(client.breaker_state(), BreakerState::Closed);
    assert_eq!(
        failures(&w.events()),
        [(ErrorKind::Transport(TransportErrorKind::TooLarge), true, 0)]
    );

    // A body of exactly the limit is read.
    let got = read(&w, &client, &policy, len, |h| h.get("/orders")).unwrap();
    assert_eq!(got.body().len(), len);
    assert_eq!(w.transport.request_count(), 2);
    w.assert_contract();
}

#[test]
fn a_body_declared_longer_than_the_limit_fails_at_its_head_unread() {
    // 100,000 bytes declared, coming 100 a second: against a limit of 1,000 the call
    // ends at the head with `TooLarge`, one send, rather than reading for the whole
    // attempt timeout, cutting it, and sending the GET again until the budget ends.
    let w = World::new();
    let declared = Reply::ok()
        .header("content-length", "100000")
        .body(vec![b'x'; 100_000])
        .chunk_size(100)
        .chunk_delay(secs(1));
    w.transport.push(declared.after(ms(20)));
    let client = w.builder().breaker(1, secs(5), secs(60)).build().unwrap();
    let policy = bounded(3, ms(250));
    let err = read(&w, &client, &policy, 1_000, |h| h.get("/export")).unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::Transport(TransportErrorKind::TooLarge)
    );
    assert_eq!(w.transport.request_count(), 1);
    assert_eq!(w.rt.elapsed(), ms(20), "ended at the head");
    assert_eq!(client.breaker_state(), BreakerState::Closed);
    assert_eq!(
        failures(&w.events()),
        [(ErrorKind::Transport(TransportErrorKind::TooLarge), true, 20)]
    );
    // An answer that has no body is read, whatever its length says: to a HEAD, and
    // a 204 or a 304 to a GET. A body of exactly its declared length, the limit, is
    // read too, and so is one whose length a `Transfer-Encoding` overrides.
    w.transport
        .push(Reply::ok().header("content-length", "100000"));
    w.transport
        .push(Reply::status(204).header("content-length", "100000"));
    w.transport
        .push(Reply::status(304).header("content-length", "100000"));
    w.transport.push(
        Reply::ok()
            .header("content-length", "1000")
            .body(vec![b'x'; 1_000]),
    );
    let head = read(&w, &client, &policy, 1_000, |h| h.head("/export")).unwrap();
    assert_eq!((head.status(), head.body().len()), (StatusCode::OK, 0));
    for status in [StatusCode::NO_CONTENT, StatusCode::NOT_MODIFIED] {
        let got = read(&w, &client, &policy, 1_000, |h| h.get("/export")).unwrap();
        assert_eq!((got.status(), got.body().len()), (status, 0));
    }
    let got = read(&w, &client, &policy, 1_000, |h| h.get("/export")).unwrap();
    assert_eq!(got.body().len(), 1_000);
    // A `Content-Length` beside a `Transfer-Encoding` says nothing of the body.
    w.transport.push(
        Reply::ok()
            .header("transfer-encoding", "chunked")
            .header("content-length", "100000")
            .body("abc"),
    );
    let got = read(&w, &client, &policy, 1_000, |h| h.get("/export")).unwrap();
    assert_eq!(got.body().as_ref(), b"abc");
    assert_eq!(w.transport.request_count(), 6);
    w.assert_contract();
}

#[test]
fn an_empty_body_fits_a_limit_of_zero() {
    let w = World::new();
    w.transport.push(Reply::status(204));
    w.transport.push(Reply::ok().body("x"));
    let client = w.client();
    let policy = bounded(0, ms(250));
    let got = read(&w, &client, &policy, 0, |h| h.delete("/orders/1")).unwrap();
    assert_eq!(got.status(), StatusCode::NO_CONTENT);
    assert!(got.body().is_empty());
    let err = read(&w, &client, &policy, 0, |h| h.get("/orders/1")).unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::Transport(TransportErrorKind::TooLarge)
    );
    assert_eq!(
        successes(&w.events())
            .iter()
            .map(|s| s.1)
            .collect::<Vec<_>>(),
        [Some(0)]
    );
}

#[test]
fn broken_bodies_count_toward_opening_the_breaker() {
    let w = World::new();
    w.transport.default_reply(broken(3));
    let client = w.builder().breaker(2, secs(5), secs(60)).build().unwrap();
    let policy = bounded(0, ms(250));
    for _ in 0..2 {
        let err = read(&w, &client, &policy, 1024, |h| h.get("/orders")).unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::Transport(TransportErrorKind::Interrupted)
        );
    }
    // Opened at the second failure, at 0 s, for 5 s.
    assert_eq!(
        client.breaker_state(),
        BreakerState::Open { until: at(secs(5)) }
    );
    assert_eq!(
        w.kinds(),
        ["started", "failed", "started", "failed", "breaker_opened"]
    );
    let err = read(&w, &client, &policy, 1024, |h| h.get("/orders")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BreakerOpen);
    assert_eq!(w.transport.request_count(), 2);
    w.assert_contract();
}

#[test]
fn a_half_open_probe_is_judged_on_its_whole_body() {
    let w = World::new();
    w.transport.push_many([
        Reply::status(500),
        // The probe's head is a 200, its body breaks: the breaker opens again, for
        // twice the cooldown.
        broken(3),
        Reply::ok().body(BODY),
    ]);
    let client = w.builder().breaker(1, secs(1), secs(60)).build().unwrap();
    let policy = bounded(0, ms(250));
    read(&w, &client, &policy, 1024, |h| h.get("/orders")).unwrap_err();
    assert_eq!(
        client.breaker_state(),
        BreakerState::Open { until: at(secs(1)) }
    );

    w.rt.advance(secs(1));
    read(&w, &client, &policy, 1024, |h| h.get("/orders")).unwrap_err();
    assert_eq!(
        client.breaker_state(),
        BreakerState::Open { until: at(secs(3)) }
    );
    let reopened = w
        .events()
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::BreakerOpened { cooldown } => Some(cooldown),
            _ => None,
        })
        .collect::<Vec<_>>();
    assert_eq!(reopened, [secs(1), secs(2)]);

    w.rt.advance(secs(2));
    let got = read(&w, &client, &policy, 1024, |h| h.get("/orders")).unwrap();
    assert_eq!(got.body(), BODY);
    assert_eq!(client.breaker_state(), BreakerState::Closed);
    assert_eq!(w.kinds().last(), Some(&"breaker_closed"));
    w.assert_contract();
}

#[test]
fn succeeded_runs_to_the_bodys_end_and_the_permit_goes_back_at_the_head() {
    let w = World::new();
    let slow = Reply::ok()
        .body("abcdef")
        .after(ms(100))
        .chunk_size(2)
        .chunk_delay(ms(50));
    w.transport.push(slow.clone());
    w.transport.push(slow);
    let client = w.client();
    let policy = bounded(0, ms(250));

    let call = {
        let client = client.clone();
        let policy = policy.clone();
        w.rt.spawn(async move {
            client
                .execute_read_with(&policy, 64, |h| h.get("/orders"))
                .await
                .map(ReadResponse::into_body)
        })
    };
    w.rt.run_for(ms(100)).unwrap();
    // The head is in; the body is being read without the permit.
    assert_eq!(w.now(), ms(100));
    assert_eq!(client.in_flight(), 0);
    assert_eq!(w.kinds(), ["started"]);
    assert_eq!(w.rt.block_on(call).unwrap().unwrap(), "abcdef");
    assert_eq!(successes(&w.events()), [(250, Some(6), ms(250))]);

    // `execute` reports at the head, with the body's length from its header, if any.
    w.observer.clear();
    let started = w.now();
    let response =
        w.rt.block_on(client.execute_with(&policy, |h| h.get("/orders")))
            .unwrap()
            .unwrap();
    drop(response);
    let head = successes(&w.events());
    assert_eq!(head.len(), 1);
    assert_eq!((head[0].0, head[0].2), (100, started + ms(100)));
}

#[test]
fn error_responses_end_the_call_as_for_execute_and_answers_are_read() {
    let w = World::new();
    w.transport.push_many([
        Reply::status(503).header("retry-after-ms", "700"),
        Reply::status(404).body("no such order"),
        Reply::status(404).body("no such order"),
    ]);
    let client = w.client();
    let policy = bounded(3, ms(250));
    let err = read(&w, &client, &policy, 1024, |h| h.get("/orders/9")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Status(StatusCode::NOT_FOUND));
    assert_eq!(err.body_text().as_deref(), Some("no such order"));
    assert_eq!(w.sent_at(), [ms(0), ms(700)]);

    // A 404 the policy takes as an answer is read as a success body.
    let answers = policy
        .with_answer_statuses([StatusCode::NOT_FOUND])
        .unwrap();
    let got = read(&w, &client, &answers, 1024, |h| h.get("/orders/9")).unwrap();
    assert_eq!(got.status(), StatusCode::NOT_FOUND);
    assert_eq!(got.body(), "no such order");
    w.assert_contract();
}

#[test]
fn a_call_dropped_while_it_reads_the_body_is_cancelled() {
    let w = World::new();
    w.transport
        .push(Reply::ok().body(BODY).body_stalls_after(4));
    let client = w.client();
    let call = {
        let client = client.clone();
        w.rt.spawn(async move {
            client
                .execute_read(1024, |h| h.get("/orders"))
                .await
                .map(|_| ())
        })
    };
    w.rt.run_for(secs(1)).unwrap();
    assert_eq!(w.kinds(), ["started"]);
    call.abort();
    w.rt.run_until_idle().unwrap();
    assert_eq!(w.kinds(), ["started", "cancelled"]);
    w.assert_contract();
}

#[test]
fn a_body_failure_that_says_nothing_left_counts_as_interrupted() {
    // The answer had begun, so the request reached the server: a POST whose body read
    // fails with a kind that says it never left is still not sent again.
    for kind in [
        TransportErrorKind::NotSent,
        TransportErrorKind::Connect,
        TransportErrorKind::Tls,
        TransportErrorKind::Config,
    ] {
        let w = World::new();
        w.transport
            .push(Reply::ok().body(BODY).body_fails_after(3, kind, "odd"));
        w.transport.push(Reply::ok().body(BODY));
        let client = w.client();
        let err = read(&w, &client, &bounded(3, ms(250)), 1024, |h| h.post("/pay")).unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::Transport(TransportErrorKind::Interrupted),
            "{kind:?}"
        );
        let source = std::error::Error::source(&err)
            .and_then(|s| s.downcast_ref::<vantage_api_pool::TransportError>())
            .map(vantage_api_pool::TransportError::message);
        assert_eq!(source, Some("odd"), "{kind:?}");
        assert!(!err.nothing_sent(), "{kind:?}");
        assert_eq!(w.transport.request_count(), 1, "{kind:?}");
        assert_eq!(failures(&w.events()).len(), 1);
        assert!(failures(&w.events())[0].1, "{kind:?}: reported unsent");
        w.assert_contract();
    }
}

#[test]
fn a_broken_body_carries_its_own_heads_request_id_never_an_older_one() {
    let w = World::new();
    w.transport.push(
        Reply::ok()
            .header("x-request-id", "r-pay")
            .body(BODY)
            .body_fails_after(5, TransportErrorKind::Interrupted, "reset"),
    );
    let client = w.client();
    let policy = bounded(1, ms(10));
    // A POST whose answer broke off: its id is how to ask whether it went through.
    let err = read(&w, &client, &policy, 1024, |h| h.post("/pay")).unwrap_err();
    assert_eq!(err.request_id(), Some("r-pay"));

    // After a 503 with an id of its own, the broken 200's id, or none if it had none.
    for (id, want) in [(Some("r-2"), Some("r-2")), (None, None)] {
        let broken =
            Reply::ok()
                .body(BODY)
                .body_fails_after(5, TransportErrorKind::Interrupted, "reset");
        let broken = match id {
            Some(id) => broken.header("x-request-id", id),
            None => broken,
        };
        w.transport
            .push_many([Reply::status(503).header("x-request-id", "r-1"), broken]);
        let err = read(&w, &client, &policy, 1024, |h| h.get("/orders")).unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::Transport(TransportErrorKind::Interrupted)
        );
        assert_eq!(err.request_id(), want);
        w.assert_last_failed_is(&err);
    }
    // A body cut by the time limit keeps its head's id too.
    w.transport.push(
        Reply::ok()
            .header("x-request-id", "r-3")
            .body(BODY)
            .body_stalls_after(5),
    );
    let short = bounded_within(0, ms(10), secs(1), secs(1));
    let err = read(&w, &client, &short, 1024, |h| h.get("/orders")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert_eq!(err.request_id(), Some("r-3"));
    w.assert_contract();
}

#[test]
fn the_retry_after_a_broken_body_waits_from_the_break() {
    let w = World::new();
    w.transport.push(
        Reply::ok()
            .after(ms(100))
            .body("abcdef")
            .chunk_size(2)
            .chunk_delay(ms(50))
            .body_fails_after(4, TransportErrorKind::Interrupted, "reset"),
    );
    w.transport.push(Reply::ok().body("abcdef"));
    let client = w.client();
    let got = read(&w, &client, &bounded(1, ms(250)), 1024, |h| h.get("/o")).unwrap();
    assert_eq!(got.body(), "abcdef");
    // Head at 100 ms, two chunks by 200 ms, the break at 250 ms: the retry 250 ms on.
    assert_eq!(w.sent_at(), [ms(0), ms(500)]);
    assert_eq!(
        failures(&w.events()),
        [(
            ErrorKind::Transport(TransportErrorKind::Interrupted),
            true,
            250
        )]
    );
    w.assert_contract();
}

#[test]
fn a_post_whose_body_stalls_is_cut_and_not_sent_again() {
    let w = World::new();
    w.transport
        .push(Reply::ok().body(BODY).body_stalls_after(4));
    w.transport.push(Reply::ok().body(BODY));
    let client = w.client();
    let policy = bounded_within(3, ms(10), secs(1), secs(30));
    let err = read(&w, &client, &policy, 1024, |h| h.post("/pay")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert_eq!(err.time_limit(), Some(TimeLimit::AttemptTimeout));
    assert_eq!(w.transport.request_count(), 1);
    assert_eq!(w.transport.distrusted(), 1);
    w.assert_contract();
}

#[test]
fn a_body_cut_by_a_short_rest_of_the_budget_says_nothing_about_the_api() {
    let w = World::new();
    // A 500 at 900 ms; the retry leaves at 910 ms with 90 ms of the budget left, less
    // than half the attempt timeout: its cut is not counted by the breaker.
    w.transport.push(Reply::status(500).after(ms(900)));
    w.transport
        .push(Reply::ok().body(BODY).body_stalls_after(4));
    let client = w.builder().breaker(2, secs(5), secs(60)).build().unwrap();
    let policy = bounded_within(2, ms(10), secs(1), secs(1));
    let err = read(&w, &client, &policy, 1024, |h| h.get("/o")).unwrap_err();
    assert_eq!(err.time_limit(), Some(TimeLimit::Budget));
    assert_eq!(client.breaker_state(), BreakerState::Closed);
    // One more failure opens it: the run was one, not two.
    w.transport.push(Reply::status(500));
    read(&w, &client, &bounded(0, ms(1)), 1024, |h| h.get("/o")).unwrap_err();
    assert!(matches!(client.breaker_state(), BreakerState::Open { .. }));
    w.assert_contract();
}

#[test]
fn a_probe_whose_body_is_too_large_or_dropped_frees_the_probe_slot() {
    let w = World::new();
    w.transport.push_many([
        Reply::status(500),
        // The probe's body is over the limit: no verdict on the API.
        Reply::ok().body(BODY),
        // The next probe is dropped while its body stalls.
        Reply::ok().body(BODY).body_stalls_after(4),
        Reply::ok().body("x"),
    ]);
    let client = w.builder().breaker(1, secs(1), secs(60)).build().unwrap();
    let policy = bounded(0, ms(250));
    read(&w, &client, &policy, 4, |h| h.get("/o")).unwrap_err();
    w.rt.advance(secs(1));
    let err = read(&w, &client, &policy, 4, |h| h.get("/o")).unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::Transport(TransportErrorKind::TooLarge)
    );
    assert_eq!(client.breaker_state(), BreakerState::HalfOpen);

    let call = {
        let (client, policy) = (client.clone(), policy.clone());
        w.rt.spawn(async move {
            client
                .execute_read_with(&policy, 4, |h| h.get("/o"))
                .await
                .map(|_| ())
        })
    };
    w.rt.run_for(ms(100)).unwrap();
    assert_eq!(client.breaker_state(), BreakerState::HalfOpen);
    call.abort();
    w.rt.run_until_idle().unwrap();
    assert_eq!(
        w.transport.distrusted(),
        0,
        "a dropped send distrusts nothing"
    );

    // The slot is free again: the next call is the probe, and its whole body closes
    // the breaker.
    let got = read(&w, &client, &policy, 4, |h| h.get("/o")).unwrap();
    assert_eq!(got.body(), "x");
    assert_eq!(client.breaker_state(), BreakerState::Closed);
    assert_eq!(w.transport.request_count(), 4);
    w.assert_contract();
}

#[test]
fn an_owned_policy_is_the_one_the_read_goes_by() {
    // One retry: the broken body is read again; none: the call ends with the break.
    for (retries, whole) in [(1, true), (0, false)] {
        let w = World::new();
        w.transport.push(broken(5));
        w.transport.push(Reply::ok().body(BODY));
        let client = w.client();
        let read =
            w.rt.block_on(
                client
                    .execute_read_with_owned(bounded(retries, ms(10)), 1024, |h| h.get("/orders")),
            )
            .expect("the call finishes");
        assert_eq!(read.is_ok(), whole, "{retries} retries: {read:?}");
        assert_eq!(w.transport.requests().len(), 1 + retries as usize);
        w.assert_contract();
    }
}
