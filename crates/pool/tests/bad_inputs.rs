//! The bad-input catalogue: every malformed or extreme input we can name, each with
//! its documented outcome. Nothing here may panic, hang or clamp silently.

mod common;

use std::time::{Duration, SystemTime};

use common::*;
use http::StatusCode;
use vantage_api_pool::{CallPolicy, ErrorKind, Jitter, RetryMode, RetryPolicy};
use vantage_api_pool_testkit::Reply;

/// One 503 carrying `headers`, then a 200, under a policy whose own back-off is
/// 100 ms and whose ceiling is 5 s, jitter off: returns when the retry left.
type Headers<'a> = &'a [(&'a str, &'a [u8])];

fn retry_wait(headers: Headers<'_>) -> Duration {
    let w = World::new();
    w.rt.set_wall_clock(SystemTime::UNIX_EPOCH + secs(1_767_225_600)); // 2026-01-01T00:00:00Z
    let mut reply = Reply::status(503);
    for (name, value) in headers {
        reply = reply.header(*name, http::HeaderValue::from_bytes(value).unwrap());
    }
    w.transport.push_many([reply, Reply::ok()]);
    let client = w.client();
    let policy = CallPolicy::bounded(RetryPolicy {
        max_retries: 1,
        base: ms(100),
        max: secs(5),
    })
    .with_jitter(Jitter::None)
    .unwrap()
    .idempotent(true);
    w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
        .unwrap()
        .unwrap();
    w.sent_at()[1]
}

#[test]
fn server_delays_malformed_and_extreme() {
    let policy = ms(100); // the policy's own back-off: what a refused header leaves
    let ceiling = secs(5);
    let cases: &[(&str, Headers<'_>, Duration)] = &[
        ("valid seconds", &[("retry-after", b"2")], secs(2)),
        ("valid ms", &[("retry-after-ms", b"1500")], ms(1500)),
        (
            "decimal ms",
            &[("retry-after-ms", b"250.5")],
            Duration::from_micros(250_500),
        ),
        (
            "ms wins over seconds",
            &[("retry-after-ms", b"300"), ("retry-after", b"4")],
            ms(300),
        ),
        (
            "bad ms falls through to seconds",
            &[("retry-after-ms", b"abc"), ("retry-after", b"3")],
            secs(3),
        ),
        (
            "huge seconds: clamped to the ceiling",
            &[("retry-after", b"999999999")],
            ceiling,
        ),
        (
            "past u128 seconds (2^128 + 1): ignored, never wrapped to 1",
            &[("retry-after", b"340282366920938463463374607431768211457")],
            policy,
        ),
        (
            "past u128 ms (2^128 + 1): ignored, never wrapped to 1",
            &[("retry-after-ms", b"340282366920938463463374607431768211457")],
            policy,
        ),
        (
            "u64::MAX seconds: clamped",
            &[("retry-after", b"18446744073709551615")],
            ceiling,
        ),
        (
            "overflowing seconds: ignored",
            &[("retry-after", b"99999999999999999999999")],
            policy,
        ),
        (
            "overflowing ms: ignored",
            &[("retry-after-ms", b"999999999999999999999999999999")],
            policy,
        ),
        (
            "overflowing ms is ignored, so a valid Retry-After is read",
            &[
                ("retry-after-ms", b"999999999999999999999999999999"),
                ("retry-after", b"1"),
            ],
            secs(1),
        ),
        ("zero seconds", &[("retry-after", b"0")], policy),
        ("zero ms", &[("retry-after-ms", b"0")], policy),
        ("negative seconds", &[("retry-after", b"-1")], policy),
        ("negative ms", &[("retry-after-ms", b"-5")], policy),
        ("plus sign", &[("retry-after", b"+1")], policy),
        ("fractional seconds", &[("retry-after", b"1.5")], policy),
        ("inf", &[("retry-after-ms", b"inf")], policy),
        ("NaN", &[("retry-after-ms", b"NaN")], policy),
        ("exponent", &[("retry-after-ms", b"1e3")], policy),
        (
            "surrounding whitespace is trimmed",
            &[("retry-after", b" 2\t")],
            secs(2),
        ),
        ("inner whitespace", &[("retry-after", b"1 5")], policy),
        ("empty", &[("retry-after", b"")], policy),
        (
            "two headers",
            &[("retry-after", b"1"), ("retry-after", b"2")],
            policy,
        ),
        ("comma-joined", &[("retry-after", b"1, 2")], policy),
        ("non-ASCII", &[("retry-after", "２".as_bytes())], policy),
        ("non-UTF-8", &[("retry-after", b"\xff\xfe")], policy),
        (
            "date 3 s ahead",
            &[("retry-after", b"Thu, 01 Jan 2026 00:00:03 GMT")],
            secs(3),
        ),
        (
            "date in the past",
            &[("retry-after", b"Wed, 31 Dec 2025 23:59:00 GMT")],
            policy,
        ),
        (
            "date equal to now",
            &[("retry-after", b"Thu, 01 Jan 2026 00:00:00 GMT")],
            policy,
        ),
        (
            "date in 9999: clamped",
            &[("retry-after", b"Fri, 31 Dec 9999 23:59:59 GMT")],
            ceiling,
        ),
        (
            "RFC 850 date",
            &[("retry-after", b"Thursday, 01-Jan-26 00:00:04 GMT")],
            secs(4),
        ),
        (
            "asctime date",
            &[("retry-after", b"Thu Jan  1 00:00:01 2026")],
            secs(1),
        ),
        (
            "ISO 8601 is not an HTTP date",
            &[("retry-after", b"2026-01-01T00:00:05Z")],
            policy,
        ),
        ("garbage", &[("retry-after", b"soon")], policy),
    ];
    for (name, headers, want) in cases {
        assert_eq!(retry_wait(headers), *want, "{name}");
    }
}

#[test]
fn a_non_utf8_error_body_is_cut_at_exactly_2048_bytes() {
    let w = World::new();
    let body: Vec<u8> = (0..10_000u32).map(|i| 0x80 | (i % 64) as u8).collect();
    w.transport.push(Reply::status(500).body(body.clone()));
    let client = w.client();
    let err = w.background_error(&client);
    assert_eq!(err.body(), Some(&body[..2048]));
    assert!(err.body_text().unwrap().contains('\u{FFFD}'));
}

// A huge error body is read only to its limit: `attempt_loop.rs`
// (`an_error_body_is_read_only_to_its_limit_not_to_its_end`, which runs on wasm32 too).

#[test]
fn an_endless_error_body_ends_at_the_time_limit() {
    let w = World::new();
    w.transport.push(
        Reply::status(502)
            .body("a never-ending")
            .body_stalls_after(3),
    );
    let client = w.client();
    let policy = CallPolicy::background()
        .with_attempt_timeout(secs(2))
        .unwrap();
    let err =
        w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.status(), Some(StatusCode::BAD_GATEWAY));
    assert_eq!(err.body(), Some(&b"a n"[..]));
    assert_eq!(w.now(), secs(2));
}

#[test]
fn extreme_back_offs_saturate_without_panicking() {
    // A bounded call whose back-off is Duration::MAX: the retry cannot start inside
    // the budget, so the call returns at once.
    let w = World::new();
    w.transport.default_reply(Reply::status(503));
    let client = w.client();
    let policy = CallPolicy::bounded(RetryPolicy {
        max_retries: u32::MAX,
        base: Duration::MAX,
        max: Duration::MAX,
    });
    let err =
        w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.attempts(), 1);
    assert_eq!(w.now(), Duration::ZERO);

    // Without a budget it sleeps "forever" on virtual time until dropped.
    let policy = CallPolicy::essential()
        .with_retry(RetryMode::UntilCancelled {
            base: Duration::MAX,
            max: Duration::MAX,
        })
        .unwrap();
    let call = w.spawn_call(&client, policy, "/x");
    w.rt.run_for(secs(3600)).unwrap();
    assert!(!call.is_finished());
    call.abort();
    assert_eq!(client.in_flight(), 0);

    // An attempt timeout of Duration::MAX and a retry count at the top of u32.
    let policy = CallPolicy::background()
        .with_attempt_timeout(Duration::MAX)
        .unwrap();
    w.transport.default_reply(Reply::ok());
    assert!(
        w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
            .unwrap()
            .is_ok()
    );
}

#[test]
fn extreme_cooldowns_saturate_without_panicking() {
    let w = World::new();
    w.transport.default_reply(Reply::status(503));
    let client = w
        .builder()
        .breaker(1, Duration::MAX, Duration::MAX)
        .build()
        .unwrap();
    let _ =
        w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
            .unwrap();
    let err = w.background_error(&client);
    assert_eq!(err.kind(), ErrorKind::BreakerOpen);
    assert!(matches!(
        client.breaker_state(),
        vantage_api_pool::BreakerState::Open { .. }
    ));

    let w = World::new();
    w.transport.default_reply(Reply::status(503));
    let client = w
        .builder()
        .breaker(u32::MAX, Duration::from_nanos(1), Duration::MAX)
        .build()
        .unwrap();
    for _ in 0..100 {
        let _ =
            w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
                .unwrap();
    }
    assert_eq!(
        client.breaker_state(),
        vantage_api_pool::BreakerState::Closed
    );
}

/// A response whose body is `empties` ready empty chunks, then its end.
struct EmptyChunks {
    empties: usize,
    handed_out: usize,
    headers: http::HeaderMap,
}

impl vantage_api_pool::TransportResponse for EmptyChunks {
    fn status(&self) -> StatusCode {
        StatusCode::OK
    }
    fn headers(&self) -> &http::HeaderMap {
        &self.headers
    }
    async fn chunk(
        &mut self,
    ) -> Result<Option<vantage_api_pool::bytes::Bytes>, vantage_api_pool::TransportError> {
        if self.handed_out == self.empties {
            return Ok(None);
        }
        self.handed_out += 1;
        Ok(Some(vantage_api_pool::bytes::Bytes::new()))
    }
}

#[test]
fn read_body_gives_way_after_each_empty_chunk() {
    use std::future::Future;
    use std::task::{Context, Waker};
    // A transport that keeps handing out ready empty chunks must not hold one poll
    // (and a timeout_at around it, which polls its timer after the work) for ever.
    let mut response = EmptyChunks {
        empties: 1_000,
        handed_out: 0,
        headers: http::HeaderMap::new(),
    };
    {
        let mut read = std::pin::pin!(vantage_api_pool::transport::read_body(&mut response, 10));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(read.as_mut().poll(&mut cx).is_pending());
    }
    assert_eq!(response.handed_out, 1, "one empty chunk per poll");
    // Driven to the end, the empty chunks are skipped: an empty body.
    let rt = vantage_api_pool_testkit::VirtualRuntime::new();
    let body = rt
        .block_on(vantage_api_pool::transport::read_body(&mut response, 10))
        .unwrap()
        .unwrap();
    assert!(body.is_empty());
    assert_eq!(response.handed_out, 1_000);
}
