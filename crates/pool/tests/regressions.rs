//! Cases the seeded simulation found, kept as plain scenarios.

mod common;

use common::*;
use vantage_api_pool::{CallPolicy, ErrorKind, EventKind, TransportErrorKind};
use vantage_api_pool_testkit::Reply;

#[test]
fn a_redial_refused_at_the_gate_keeps_its_attempt_number() {
    let w = World::new();
    w.transport
        .push(Reply::fail(TransportErrorKind::NotSent, "stale").after(secs(1)));
    let client = w.client();
    let policy = bounded(3, ms(10))
        .with_attempt_timeout(secs(1))
        .unwrap()
        .with_budget(Some(secs(1)))
        .unwrap();
    let err =
        w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert_eq!(err.attempts(), 1);
    let numbers: Vec<_> = w
        .events()
        .iter()
        .filter_map(|e| e.kind.send_and_attempt())
        .collect();
    // Started, Failed (NotSent), Redialing, then the synthetic pair of the redial.
    assert_eq!(numbers, [(1, 1), (1, 1), (2, 1), (2, 1), (2, 1)]);
    assert!(matches!(
        w.events().last().unwrap().kind,
        EventKind::Failed { sent: false, .. }
    ));
}

#[test]
fn a_send_that_waited_for_a_permit_while_the_breaker_opened_does_not_go_out() {
    let w = World::new();
    w.transport.push(Reply::status(503).after(secs(1)));
    w.transport.default_reply(Reply::ok());
    let client = w
        .builder()
        .max_parallel(1)
        .breaker(1, secs(5), secs(5))
        .build()
        .unwrap();
    let first = w.spawn_call(&client, CallPolicy::background(), "/a");
    let second = w.spawn_call(&client, CallPolicy::background(), "/b");
    w.rt.run().unwrap();
    assert!(w.rt.block_on(first).unwrap().is_err());
    let err = w.rt.block_on(second).unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BreakerOpen);
    assert_eq!(err.attempts(), 0);
    assert_eq!(
        w.transport.request_count(),
        1,
        "only the first call reached the API"
    );
    w.assert_contract();
}

#[test]
fn ms_excludes_the_error_body_read() {
    let w = World::new();
    w.transport.push(
        Reply::status(500)
            .after(ms(40))
            .body("abcdef")
            .chunk_size(2)
            .chunk_delay(ms(100)),
    );
    let client = w.client();
    let err =
        w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.body(), Some(&b"abcdef"[..]));
    let failed = w.events().into_iter().find_map(|e| match e.kind {
        EventKind::Failed { ms, .. } => Some((ms, e.at)),
        _ => None,
    });
    // The head came at 40 ms; the body took until 340 ms.
    assert_eq!(failed, Some((40, at(ms(340)))));
}
