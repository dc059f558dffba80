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
    let policy = bounded_within(3, ms(10), secs(1), secs(1));
    let err =
        w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert_eq!(err.attempts(), 1);
    let numbers = w.numbers();
    // Started, Failed (NotSent), Redialing, then the synthetic pair of the redial.
    assert_eq!(numbers, [(1, 1), (1, 1), (2, 1), (2, 1), (2, 1)]);
    assert!(matches!(
        w.events().last().unwrap().kind,
        EventKind::Failed { sent: false, .. }
    ));
}

/// One permit, a breaker that opens at the first failure for 5 s: `/a` holds the
/// permit and fails at 1 s, while a second call under `policy`, its request built,
/// waits for the permit. Returns the second call's result and how often its request
/// closure ran.
fn breaker_opens_during_a_permit_wait(
    w: &World,
    policy: CallPolicy,
) -> (Result<(), vantage_api_pool::ClientError>, u32) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    w.transport.push(Reply::status(503).after(secs(1)));
    w.transport.default_reply(Reply::ok());
    let client = w
        .builder()
        .max_parallel(1)
        .breaker(1, secs(5), secs(5))
        .build()
        .unwrap();
    let first = w.spawn_call(&client, CallPolicy::background(), "/a");
    let builds = Arc::new(AtomicU32::new(0));
    let second = {
        let (client, builds) = (client.clone(), builds.clone());
        w.rt.spawn(async move {
            client
                .execute_with(&policy, |h| {
                    builds.fetch_add(1, Ordering::SeqCst);
                    h.get("/b")
                })
                .await
                .map(|_| ())
        })
    };
    w.rt.run_until(w.rt.now() + ms(10)).unwrap();
    // The second call's request is built (outside any permit) and waits for one.
    assert_eq!(client.waiting_for_permit(), 1);
    assert_eq!(builds.load(Ordering::SeqCst), 1);
    w.rt.run().unwrap();
    assert!(w.rt.block_on(first).unwrap().is_err());
    let result = w.rt.block_on(second).unwrap();
    w.assert_contract();
    (result, builds.load(Ordering::SeqCst))
}

#[test]
fn a_send_that_waited_for_a_permit_while_the_breaker_opened_does_not_go_out() {
    let w = World::new();
    let (result, builds) = breaker_opens_during_a_permit_wait(&w, CallPolicy::background());
    let err = result.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BreakerOpen);
    assert_eq!(err.attempts(), 0);
    // The pass went back to the gate, which refused it: its request was dropped
    // unsent and nothing was built again.
    assert_eq!(builds, 1);
    assert_eq!(
        w.transport.request_count(),
        1,
        "only the first call reached the API"
    );
}

#[test]
fn a_request_the_breaker_turned_back_after_its_permit_wait_is_built_again_for_its_send() {
    // As above, but the second call waits for the probe: the closure runs once for
    // the request dropped unsent and once for the send (documented on
    // `execute_with`: once per pass through the gate, not once per send).
    let w = World::new();
    let (result, builds) = breaker_opens_during_a_permit_wait(&w, CallPolicy::essential());
    assert!(result.is_ok());
    assert_eq!(builds, 2);
    // One send of the second call, at the end of the cooldown, as the probe.
    assert_eq!(w.sent_at(), [secs(0), secs(6)]);
    let started = w
        .events()
        .iter()
        .filter(|e| e.call.map(|c| c.0) == Some(2) && matches!(e.kind, EventKind::Started { .. }))
        .count();
    assert_eq!(started, 1);
}

#[test]
fn a_draft_that_cannot_be_prepared_fails_at_once_even_with_every_permit_held() {
    let w = World::new();
    w.transport.push(Reply::ok().after(secs(10)));
    let client = w.builder().max_parallel(1).build().unwrap();
    let slow = w.spawn_call(&client, CallPolicy::background(), "/slow");
    w.rt.run_until(w.rt.now() + ms(1)).unwrap();
    assert_eq!(client.in_flight(), 1);
    let bad = {
        let client = client.clone();
        w.rt.spawn(async move {
            client
                .execute_with(&CallPolicy::essential(), |h| h.get("/bad").invalid())
                .await
                .map(|_| ())
        })
    };
    w.rt.run_until(w.rt.now() + ms(1)).unwrap();
    assert!(bad.is_finished(), "failed without waiting for the permit");
    let err = w.rt.block_on(bad).unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Transport(TransportErrorKind::Config));
    assert_eq!(client.waiting_for_permit(), 0);
    w.rt.run().unwrap();
    assert!(w.rt.block_on(slow).unwrap().is_ok());
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
    let err = w.background_error(&client);
    assert_eq!(err.body(), Some(&b"abcdef"[..]));
    let failed = w.events().into_iter().find_map(|e| match e.kind {
        EventKind::Failed { ms, .. } => Some((ms, e.at)),
        _ => None,
    });
    // The head came at 40 ms; the body took until 340 ms.
    assert_eq!(failed, Some((40, at(ms(340)))));
}

#[test]
fn a_budget_that_ends_during_the_permit_wait_sends_nothing() {
    let w = World::new();
    w.transport.push(Reply::stall());
    w.transport.default_reply(Reply::ok());
    let client = w.builder().max_parallel(1).build().unwrap();
    let policy = bounded_within(0, ms(10), secs(10), secs(10));
    let first = w.spawn_call(&client, policy.clone(), "/a");
    let second = w.spawn_call(&client, policy, "/b");
    w.rt.run().unwrap();
    assert_eq!(
        w.rt.block_on(first).unwrap().unwrap_err().kind(),
        ErrorKind::TimedOut
    );
    let err = w.rt.block_on(second).unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert_eq!(err.attempts(), 0);
    assert!(err.nothing_sent());
    assert_eq!(
        w.transport.request_count(),
        1,
        "the queued call sent nothing"
    );
    let second_call = w.events().iter().filter_map(|e| e.call).max().unwrap();
    let kinds: Vec<_> = w
        .observer
        .for_call(second_call)
        .iter()
        .map(|e| e.kind.name())
        .collect();
    assert_eq!(kinds, ["started", "failed"]);
    assert!(matches!(
        w.observer.for_call(second_call)[1].kind,
        EventKind::Failed {
            sent: false,
            ms: 0,
            ..
        }
    ));
    w.assert_contract();
}

/// Reads the client's in-flight count when it hears `Cancelled`.
struct InFlightAtCancel {
    client: std::sync::Mutex<Option<Client>>,
    seen: std::sync::Mutex<Vec<usize>>,
}

impl vantage_api_pool::TransportObserver for InFlightAtCancel {
    fn on_event(&self, _api: &str, event: &vantage_api_pool::TransportEvent) {
        if matches!(event.kind, EventKind::Cancelled { .. })
            && let Some(client) = &*self.client.lock().unwrap()
        {
            self.seen.lock().unwrap().push(client.in_flight());
        }
    }
}

#[test]
// On wasm32 observers need not be Send + Sync, and the client still takes an Arc.
#[cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]
fn cancelled_is_reported_after_the_permit_is_back() {
    let w = World::new();
    w.transport.push(Reply::stall());
    let watcher = std::sync::Arc::new(InFlightAtCancel {
        client: std::sync::Mutex::new(None),
        seen: std::sync::Mutex::new(Vec::new()),
    });
    let client = vantage_api_pool::ResilientClient::builder(w.transport.clone(), w.rt.clone())
        .observer("api", watcher.clone())
        .build()
        .unwrap();
    *watcher.client.lock().unwrap() = Some(client.clone());
    let call = w.spawn_call(&client, CallPolicy::background(), "/x");
    w.rt.run_until(at(secs(1))).unwrap();
    assert_eq!(client.in_flight(), 1);
    call.abort();
    assert_eq!(*watcher.seen.lock().unwrap(), [0]);
    // Break the observer's cycle with the client.
    watcher.client.lock().unwrap().take();
}

/// An observer that takes its time on `Started` (it moves the virtual clock), and
/// keeps the `ms` of each `Succeeded`.
struct SlowOnStart(
    vantage_api_pool_testkit::VirtualRuntime,
    std::sync::Mutex<Vec<u64>>,
);

impl vantage_api_pool::TransportObserver for SlowOnStart {
    fn on_event(&self, _api: &str, event: &vantage_api_pool::TransportEvent) {
        match event.kind {
            EventKind::Started { .. } => self.0.advance(secs(5)),
            EventKind::Succeeded { ms, .. } => self.1.lock().unwrap().push(ms),
            _ => {}
        }
    }
}

#[test]
fn a_slow_started_callback_counts_neither_into_ms_nor_into_the_time_limit() {
    let w = World::new();
    w.transport.push(Reply::ok().after(ms(100)));
    let slow = std::sync::Arc::new(SlowOnStart(w.rt.clone(), Default::default()));
    let client = vantage_api_pool::ResilientClient::builder(w.transport.clone(), w.rt.clone())
        .observer("api", slow.clone())
        .build()
        .unwrap();
    let policy = CallPolicy::background()
        .with_attempt_timeout(ms(500))
        .unwrap();
    let resp =
        w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
            .unwrap();
    assert!(
        resp.is_ok(),
        "the 100 ms answer came inside the 500 ms limit"
    );
    assert_eq!(w.sent_at(), [secs(5)]);
    assert_eq!(w.now(), secs(5) + ms(100));
    assert_eq!(
        *slow.1.lock().unwrap(),
        [100],
        "the callback's 5 s are not in `ms`"
    );
}

/// One attempt of at most 1 s, within a 2 s budget.
fn one_attempt_in_two_seconds() -> CallPolicy {
    CallPolicy::background()
        .with_attempt_timeout(secs(1))
        .unwrap()
        .with_budget(Some(secs(2)))
        .unwrap()
}

#[test]
fn a_request_closure_that_uses_up_the_budget_sends_nothing() {
    let w = World::new();
    w.transport.default_reply(Reply::ok().after(ms(10)));
    let client = w.builder().max_parallel(1).build().unwrap();
    let policy = one_attempt_in_two_seconds();
    let rt = w.rt.clone();
    let err =
        w.rt.block_on(client.execute_with(&policy, |h| {
            rt.advance(secs(2)); // a slow closure: the budget ends while it runs
            h.get("/x")
        }))
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert_eq!(err.attempts(), 0, "no attempt went out");
    assert!(err.nothing_sent());
    assert_eq!(w.transport.request_count(), 0, "nothing reached the server");
    assert_eq!(client.in_flight(), 0, "the permit is back");
    assert!(matches!(
        w.events().last().unwrap().kind,
        EventKind::Failed {
            sent: false,
            ms: 0,
            send: 1,
            attempt: 1,
            ..
        }
    ));
    w.assert_contract();
    // The client is whole afterwards: the next call goes out.
    let ok =
        w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/y")))
            .unwrap();
    assert!(ok.is_ok());
}

#[test]
fn a_redial_whose_closure_uses_up_the_budget_keeps_its_attempt_count() {
    let w = World::new();
    w.transport.push(Reply::fail(
        TransportErrorKind::NotSent,
        "stale pooled connection",
    ));
    w.transport.default_reply(Reply::ok());
    let client = w.client();
    let policy = one_attempt_in_two_seconds();
    let rt = w.rt.clone();
    let mut builds = 0;
    let err =
        w.rt.block_on(client.execute_with(&policy, |h| {
            builds += 1;
            if builds == 2 {
                rt.advance(secs(3)); // the redial's closure outlasts the budget
            }
            h.get("/x")
        }))
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert_eq!(
        err.attempts(),
        1,
        "the first send went out; its redial did not"
    );
    assert_eq!(w.transport.request_count(), 1);
    let numbers = w.numbers();
    // Started, Failed (NotSent), Redialing, then the redial's Started and Failed.
    assert_eq!(numbers, [(1, 1), (1, 1), (2, 1), (2, 1), (2, 1)]);
    assert!(matches!(
        w.events().last().unwrap().kind,
        EventKind::Failed { sent: false, .. }
    ));
    w.assert_contract();
}

/// Counts wake-ups; its reference count shows whether anyone still holds its waker.
struct CountingWaker(std::sync::atomic::AtomicUsize);

impl futures::task::ArcWake for CountingWaker {
    fn wake_by_ref(this: &std::sync::Arc<Self>) {
        this.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn calls_that_give_up_waiting_for_a_token_fetch_leave_no_waker_behind() {
    use std::future::Future;
    use std::sync::Arc;
    use std::task::Context;

    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let client = w
        .builder()
        .auth(vantage_api_pool::auth::token_fn(|| {
            std::future::pending::<
                Result<(http::HeaderName, http::HeaderValue), vantage_api_pool::AuthError>,
            >()
        }))
        .build()
        .unwrap();
    // The fetcher: an essential call (no budget) whose fetch never ends.
    let essential = CallPolicy::essential();
    let fetcher_waker = futures::task::waker(Arc::new(CountingWaker(Default::default())));
    let mut fetcher = Box::pin(client.execute_with(&essential, |h| h.get("/x")));
    assert!(
        fetcher
            .as_mut()
            .poll(&mut Context::from_waker(&fetcher_waker))
            .is_pending()
    );
    // A thousand calls wait for that fetch, then their callers drop them.
    let background = CallPolicy::background();
    let wakers: Vec<_> = (0..1000)
        .map(|_| {
            let counter = Arc::new(CountingWaker(Default::default()));
            let waker = futures::task::waker(counter.clone());
            let mut call = Box::pin(client.execute_with(&background, |h| h.get("/x")));
            assert!(
                call.as_mut()
                    .poll(&mut Context::from_waker(&waker))
                    .is_pending()
            );
            drop(call);
            counter
        })
        .collect();
    let held = wakers.iter().filter(|c| Arc::strong_count(c) > 1).count();
    assert_eq!(held, 0, "{held} wakers of dropped calls are still held");
    // A caller that is still waiting keeps its place: the fetcher's drop wakes it.
    let counter = Arc::new(CountingWaker(Default::default()));
    let waker = futures::task::waker(counter.clone());
    let mut waiting = Box::pin(client.execute_with(&background, |h| h.get("/x")));
    assert!(
        waiting
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending()
    );
    drop(fetcher);
    assert_eq!(
        counter.0.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the waiter is woken to take the fetch over"
    );
}
