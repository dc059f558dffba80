//! Breaker, rate bucket, concurrency cap and auth, on virtual time under concurrency
//! and cancellation.

mod common;

// On wasm32 the same tests run under wasm-bindgen-test, in Node and in a browser.
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures::FutureExt;
use http::{HeaderValue, StatusCode, header::AUTHORIZATION};
use vantage_api_pool::auth::{AuthError, AuthToken, SharedAuthError, token_fn};
use vantage_api_pool::breaker::PROBE_RECHECK;
use vantage_api_pool::{
    BreakerMode, BreakerState, CallPolicy, ErrorKind, EventKind, ResilientClient, RetryMode,
    TimeLimit, TransportErrorKind, TransportEvent, TransportObserver,
};
use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};

fn opened(events: &[TransportEvent]) -> Vec<Duration> {
    events
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::BreakerOpened { cooldown } => Some(cooldown),
            _ => None,
        })
        .collect()
}

fn closed_count(events: &[TransportEvent]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::BreakerClosed))
        .count()
}

/// Five instant failures from background calls: the breaker opens at the current time.
fn open_breaker(w: &World, client: &Client) {
    for _ in 0..5 {
        let _ =
            w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
                .unwrap();
    }
}

#[test]
fn a_breaker_config_sets_threshold_cooldown_and_its_max() {
    let w = World::new();
    w.transport.default_reply(Reply::status(503));
    let config = vantage_api_pool::breaker::BreakerConfig::new(2, secs(3), secs(4)).unwrap();
    let client = w.builder().breaker_config(config).build().unwrap();
    let background = CallPolicy::background();
    for _ in 0..2 {
        let _ =
            w.rt.block_on(client.execute_with(&background, |h| h.get("/x")));
    }
    assert_eq!(
        client.breaker_state(),
        BreakerState::Open { until: at(secs(3)) }
    );
    // Two failed probes: 3 s doubled is capped at the max, 4 s.
    for probe_at in [secs(3), secs(7)] {
        w.rt.run_until(at(probe_at)).unwrap();
        let _ =
            w.rt.block_on(client.execute_with(&background, |h| h.get("/x")));
    }
    assert_eq!(
        client.breaker_state(),
        BreakerState::Open {
            until: at(secs(11))
        }
    );
    assert_eq!(w.sent_at(), [ms(0), ms(0), secs(3), secs(7)]);
    assert_eq!(
        vantage_api_pool::breaker::BreakerConfig::default(),
        vantage_api_pool::breaker::BreakerConfig::default_breaker()
    );
}

#[test]
fn cooldown_doubles_on_failed_probes_up_to_the_max() {
    let w = World::new();
    // 5 failures open it, 5 failed probes, then the 6th probe succeeds.
    w.transport.push_many((0..10).map(|_| Reply::status(503)));
    w.transport.push(Reply::ok());
    let client = w.builder().default_breaker().build().unwrap();
    open_breaker(&w, &client);
    assert_eq!(
        client.breaker_state(),
        BreakerState::Open { until: at(secs(5)) }
    );

    let policy = forever(ms(1));
    w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
        .unwrap()
        .unwrap();
    let probes: Vec<_> = w.sent_at().into_iter().skip(5).collect();
    assert_eq!(
        probes,
        [secs(5), secs(15), secs(35), secs(75), secs(135), secs(195)]
    );
    let events = w.events();
    assert_eq!(
        opened(&events),
        [secs(5), secs(10), secs(20), secs(40), secs(60), secs(60)]
    );
    assert_eq!(closed_count(&events), 1);
    assert_eq!(client.breaker_state(), BreakerState::Closed);

    // The next opening starts again at 5 s.
    w.transport.push_many((0..5).map(|_| Reply::status(503)));
    open_breaker(&w, &client);
    assert_eq!(opened(&w.events()).last(), Some(&secs(5)));
    assert_eq!(
        client.breaker_state(),
        BreakerState::Open {
            until: at(secs(200))
        }
    );
    w.assert_contract();
}

#[test]
fn breaker_transitions_follow_the_terminal_event_and_carry_the_call() {
    let w = World::new();
    w.transport.push_many((0..5).map(|_| Reply::status(503)));
    let client = w.builder().default_breaker().build().unwrap();
    open_breaker(&w, &client);
    let events = w.events();
    let n = events.len();
    assert!(matches!(events[n - 2].kind, EventKind::Failed { .. }));
    assert!(matches!(
        events[n - 1].kind,
        EventKind::BreakerOpened { .. }
    ));
    assert_eq!(events[n - 1].call, events[n - 2].call);
}

#[test]
fn fail_fast_rejects_at_once_with_nothing_sent() {
    let w = World::new();
    w.transport.push_many((0..5).map(|_| Reply::status(503)));
    let client = w.builder().default_breaker().build().unwrap();
    open_breaker(&w, &client);
    w.observer.clear();
    let err =
        w.rt.block_on(client.execute(|h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BreakerOpen);
    assert_eq!(err.attempts(), 0);
    assert!(err.nothing_sent());
    assert_eq!(w.now(), Duration::ZERO);
    assert_eq!(w.transport.request_count(), 5);
    assert_eq!(w.kinds(), ["started", "failed"]);
    assert!(matches!(
        w.events()[1].kind,
        EventKind::Failed {
            ms: 0,
            sent: false,
            ..
        }
    ));
    w.assert_contract();
}

#[test]
fn a_breaker_open_refusal_says_how_long_the_breaker_still_refuses() {
    let w = World::new();
    w.transport.push_many((0..5).map(|_| Reply::status(503)));
    let client = w.builder().default_breaker().build().unwrap();
    open_breaker(&w, &client);
    let refused = || {
        w.rt.block_on(client.execute(|h| h.get("/x")))
            .unwrap()
            .unwrap_err()
    };
    // Opened at 0 for 5 s: the rest of the cooldown, from the refusal.
    let err = refused();
    assert_eq!(err.kind(), ErrorKind::BreakerOpen);
    assert_eq!(err.retry_after(), Some(secs(5)));
    w.rt.run_for(ms(3_250)).unwrap();
    assert_eq!(refused().retry_after(), Some(ms(1_750)));

    // Cooldown over: a probe goes and takes 2 s. While it is out, nobody knows when
    // the breaker will answer: no delay to give.
    w.rt.run_for(ms(1_750)).unwrap();
    w.transport.push(Reply::status(503).after(secs(2)));
    let probe = w.spawn_call(&client, CallPolicy::background(), "/x");
    w.rt.run_for(secs(1)).unwrap();
    assert_eq!(w.transport.request_count(), 6, "the probe is out");
    let err = refused();
    assert_eq!(
        (err.kind(), err.retry_after()),
        (ErrorKind::BreakerOpen, None)
    );
    // It fails at 7 s: open again for twice as long.
    w.rt.run_for(secs(1)).unwrap();
    assert!(probe.is_finished());
    assert_eq!(refused().retry_after(), Some(secs(10)));

    // A retry that meets the open breaker: the refusal has the breaker's wait, the
    // 503 under it the server's own.
    let w = World::new();
    w.transport
        .push(Reply::status(503).header("retry-after", "1"));
    let client = w.builder().breaker(1, secs(5), secs(60)).build().unwrap();
    let err =
        w.rt.block_on(client.execute_with(&bounded(3, ms(250)), |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BreakerOpen);
    assert_eq!(w.now(), secs(1), "the retry waited as the 503 asked");
    assert_eq!(err.retry_after(), Some(secs(4)));
    assert_eq!(last_failure(&err).retry_after(), Some(secs(1)));
    w.assert_last_failed_is(&err);
    w.assert_contract();
}

/// The `at` of every `BreakerReset`.
fn resets(events: &[TransportEvent]) -> Vec<Duration> {
    events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::BreakerReset))
        .map(|e| e.at.since_origin())
        .collect()
}

#[test]
fn a_reset_closes_the_breaker_at_once_and_wakes_the_calls_waiting_for_it() {
    let w = World::new();
    w.transport.push_many((0..5).map(|_| Reply::status(503)));
    w.transport.default_reply(Reply::ok());
    let client = w.builder().default_breaker().build().unwrap();
    open_breaker(&w, &client);
    // Open at 0 for 5 s: a waiting call sleeps out the cooldown.
    let waiting = w.spawn_call(&client, CallPolicy::essential(), "/x");
    w.rt.run_for(secs(1)).unwrap();
    assert_eq!(w.transport.request_count(), 5);

    // The operator knows better at 1 s: closed, the waiting call goes at once, and
    // so does a fail-fast one.
    assert!(client.reset_breaker());
    assert_eq!(client.breaker_state(), BreakerState::Closed);
    w.rt.run_until_idle().unwrap();
    w.rt.block_on(waiting).unwrap().unwrap();
    assert_eq!(w.sent_at()[5..], [secs(1)]);
    w.rt.block_on(client.execute(|h| h.get("/x")))
        .unwrap()
        .unwrap();
    assert_eq!(resets(&w.events()), [secs(1)]);
    // Closed already: nothing to report.
    assert!(!client.reset_breaker());
    assert_eq!(resets(&w.events()).len(), 1);
    w.assert_contract();

    // Open again at 1 s; at 6 s a probe goes and is answered at 16 s, while a call
    // waits for it (looking again every 5 ms). A reset at 7.002 s, between two
    // looks, sends that call at its next look, and the probe's late 503 is one
    // failure of five: the breaker stays closed.
    w.transport.push_many((0..5).map(|_| Reply::status(503)));
    open_breaker(&w, &client);
    w.rt.run_until(at(secs(6))).unwrap();
    w.transport.push(Reply::status(503).after(secs(10)));
    let probe = w.spawn_call(&client, CallPolicy::background(), "/x");
    w.rt.run_until_idle().unwrap();
    let waiting = w.spawn_call(&client, CallPolicy::essential(), "/x");
    w.rt.run_until(at(ms(7_002))).unwrap();
    assert_eq!(w.transport.request_count(), 13, "the probe is out");
    assert!(client.reset_breaker());
    w.rt.run_until_idle().unwrap();
    w.rt.block_on(waiting).unwrap().unwrap();
    assert_eq!(w.sent_at()[13..], [ms(7_005)]);
    let late = w.rt.block_on(probe).unwrap().unwrap_err();
    assert_eq!(late.status(), Some(StatusCode::SERVICE_UNAVAILABLE));
    assert_eq!(w.now(), secs(16));
    assert_eq!(client.breaker_state(), BreakerState::Closed);
    assert_eq!(resets(&w.events()), [secs(1), ms(7_002)]);
    w.assert_contract();
}

#[test]
fn an_answer_that_closes_an_open_breaker_wakes_the_calls_waiting_out_its_cooldown() {
    // A slow GET sent at 0 is answered 200 at 2 s; meanwhile five 503s opened the
    // breaker for 60 s, and an essential call waits out that cooldown. The
    // straggler's answer closes the breaker at 2 s: the waiting call goes then, as
    // a new call would, not at 60 s.
    let w = World::new();
    w.transport.push(Reply::ok().after(secs(2)));
    w.transport.push_many((0..5).map(|_| Reply::status(503)));
    w.transport.default_reply(Reply::ok());
    let client = w.builder().breaker(5, secs(60), secs(60)).build().unwrap();
    let slow = w.spawn_call(&client, CallPolicy::background(), "/slow");
    w.rt.run_until_idle().unwrap();
    open_breaker(&w, &client);
    let waiting = w.spawn_call(&client, CallPolicy::essential(), "/waiting");
    w.rt.run_until(at(secs(1))).unwrap();
    assert!(matches!(client.breaker_state(), BreakerState::Open { .. }));
    w.rt.run_until(at(secs(3))).unwrap();
    assert_eq!(client.breaker_state(), BreakerState::Closed);
    assert!(
        waiting.is_finished(),
        "still waiting out the cooldown at 3 s"
    );
    w.rt.block_on(slow).unwrap().unwrap();
    w.rt.block_on(waiting).unwrap().unwrap();
    let requests = w.transport.requests();
    let last = requests.last().unwrap();
    assert_eq!((&*last.path, last.at), ("/waiting", at(secs(2))));
    w.assert_contract();
}

/// Counts its wakes; an observer over it notes how many there were at each
/// `BreakerReset`.
#[derive(Default)]
struct WakesAtReset {
    wakes: AtomicU32,
    at_reset: Mutex<Vec<u32>>,
}

impl std::task::Wake for WakesAtReset {
    fn wake(self: Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
    }
}

impl TransportObserver for WakesAtReset {
    fn on_event(&self, _api: &str, event: &TransportEvent) {
        if matches!(event.kind, EventKind::BreakerReset) {
            let wakes = self.wakes.load(Ordering::SeqCst);
            self.at_reset.lock().unwrap().push(wakes);
        }
    }
}

#[test]
fn reset_breaker_reports_the_reset_before_it_wakes_a_call_waiting_out_the_cooldown() {
    // On an executor that runs a woken task at once (another thread), a call woken
    // first could send, and report its `Started`, before `BreakerReset`.
    let w = World::new();
    w.transport
        .push(Reply::status(503))
        .default_reply(Reply::ok());
    let heard = Arc::new(WakesAtReset::default());
    let client = w
        .builder()
        .breaker(1, secs(5), secs(60))
        .observer("api", heard.clone())
        .build()
        .unwrap();
    let opening = CallPolicy::background();
    assert!(
        w.rt.block_on(client.execute_with(&opening, |h| h.get("/x")))
            .unwrap()
            .is_err()
    );
    let essential = CallPolicy::essential();
    let mut waiting = Box::pin(client.execute_with(&essential, |h| h.get("/x")));
    let waker = std::task::Waker::from(Arc::clone(&heard));
    let mut cx = std::task::Context::from_waker(&waker);
    assert!(waiting.as_mut().poll(&mut cx).is_pending());
    assert!(client.reset_breaker());
    assert_eq!(heard.wakes.load(Ordering::SeqCst), 1, "the call was woken");
    assert_eq!(
        *heard.at_reset.lock().unwrap(),
        [0],
        "woken before the reset was heard"
    );
}

#[test]
fn a_reset_puts_the_cooldown_back_to_its_base_and_clears_the_failure_run() {
    let w = World::new();
    w.transport.default_reply(Reply::status(503));
    let client = w.builder().breaker(2, secs(5), secs(60)).build().unwrap();
    let fail = || {
        w.background_error(&client);
    };
    fail();
    fail();
    w.rt.run_for(secs(5)).unwrap();
    fail(); // the probe: open for 10 s
    assert!(client.reset_breaker());
    // Two failures open it again, for the base cooldown.
    fail();
    fail();
    assert_eq!(opened(&w.events()), [secs(5), secs(10), secs(5)]);

    // A run of failures short of the threshold is cleared: after a reset, one more
    // failure does not open it.
    assert!(client.reset_breaker());
    fail();
    assert!(!client.reset_breaker(), "closed: nothing reported");
    fail();
    assert_eq!(client.breaker_state(), BreakerState::Closed);
    assert_eq!(resets(&w.events()).len(), 2);
    w.assert_contract();

    // A client without a breaker has nothing to reset.
    let w = World::new();
    assert!(!w.client().reset_breaker());
    assert!(w.events().is_empty());
}

#[test]
fn a_reachable_answer_closes_but_keeps_the_failure_run() {
    let w = World::new();
    w.transport
        .push_many([503, 404, 503, 404, 503].map(Reply::status));
    let client = w.builder().breaker(3, secs(5), secs(60)).build().unwrap();
    for _ in 0..5 {
        let _ =
            w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
                .unwrap();
    }
    assert_eq!(opened(&w.events()), [secs(5)], "opens on the third 503");
    // A 401 (reachable) closes it, once.
    w.transport.push(Reply::status(401));
    w.rt.run_for(secs(5)).unwrap();
    background_get(&w, &client);
    assert_eq!(closed_count(&w.events()), 1);
    assert_eq!(client.breaker_state(), BreakerState::Closed);
}

#[test]
fn a_408_or_429_leaves_the_breaker_untouched() {
    let w = World::new();
    w.transport
        .push_many([503, 503, 429, 408, 429, 503].map(Reply::status));
    let client = w.builder().breaker(3, secs(5), secs(60)).build().unwrap();
    for _ in 0..5 {
        let _ =
            w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
                .unwrap();
    }
    assert_eq!(client.breaker_state(), BreakerState::Closed);
    background_get(&w, &client);
    assert_eq!(
        opened(&w.events()),
        [secs(5)],
        "the third 503 opens it: 408/429 did not reset the run"
    );
}

#[test]
fn a_prober_dropped_mid_send_does_not_wedge_the_breaker() {
    let w = World::new();
    w.transport.push_many((0..5).map(|_| Reply::status(503)));
    w.transport.push(Reply::stall());
    w.transport.push(Reply::ok());
    let client = w.builder().default_breaker().build().unwrap();
    open_breaker(&w, &client);
    let prober = w.spawn_call(&client, CallPolicy::essential(), "/x");
    w.rt.run_until(at(secs(6))).unwrap();
    assert_eq!(
        w.sent_at().last(),
        Some(&secs(5)),
        "the probe left at 5 s and stalls"
    );
    assert_eq!(client.breaker_state(), BreakerState::HalfOpen);
    prober.abort();
    // The next caller after the drop gets the probe at once.
    let resp =
        w.rt.block_on(client.execute_with(&CallPolicy::essential(), |h| h.get("/x")))
            .unwrap();
    assert!(resp.is_ok());
    assert_eq!(w.sent_at().last(), Some(&secs(6)));
    assert_eq!(client.breaker_state(), BreakerState::Closed);
    w.assert_contract();
}

#[test]
fn a_failure_from_before_the_opening_is_not_a_failed_probe() {
    let w = World::new();
    // A slow request leaves first and fails late, after the breaker opened and a
    // probe is in flight.
    w.transport.push(Reply::status(503).after(secs(8)));
    w.transport.push_many((0..5).map(|_| Reply::status(503)));
    w.transport.push(Reply::ok().after(secs(4)));
    let client = w.builder().default_breaker().build().unwrap();
    let slow = w.spawn_call(&client, CallPolicy::background(), "/slow");
    w.rt.run_until_idle().unwrap();
    open_breaker(&w, &client);
    let probe = w.spawn_call(&client, CallPolicy::essential(), "/x");
    w.rt.run().unwrap();
    assert!(w.rt.block_on(slow).unwrap().is_err());
    assert!(w.rt.block_on(probe).unwrap().is_ok());
    // Probe left at 5 s, the stale 503 came at 8 s, the probe's 200 at 9 s.
    assert_eq!(w.sent_at()[6], secs(5));
    assert_eq!(
        opened(&w.events()),
        [secs(5)],
        "the stale failure did not double the cooldown"
    );
    assert_eq!(client.breaker_state(), BreakerState::Closed);
    w.assert_contract();
}

#[test]
fn fifty_waiting_callers_send_one_probe_per_cooldown_then_all_complete() {
    let w = World::new();
    w.transport.push_many((0..5).map(|_| Reply::status(503)));
    w.transport
        .push_many([Reply::status(503), Reply::status(503)]);
    w.transport.default_reply(Reply::ok());
    let client = w
        .builder()
        .default_breaker()
        .max_parallel(8)
        .build()
        .unwrap();
    open_breaker(&w, &client);
    let calls: Vec<_> = (0..50)
        .map(|_| w.spawn_call(&client, CallPolicy::essential(), "/x"))
        .collect();
    w.rt.run().unwrap();
    for call in calls {
        assert!(w.rt.block_on(call).unwrap().is_ok());
    }
    let sent = w.sent_at();
    // Probes at 5 s and 15 s fail; the one at 35 s recovers; then the other 49 go.
    assert_eq!(&sent[5..8], [secs(5), secs(15), secs(35)]);
    assert_eq!(sent.len(), 5 + 3 + 49);
    assert!(
        sent[8..]
            .iter()
            .all(|t| *t >= secs(35) && *t <= secs(35) + ms(10)),
        "{:?}",
        &sent[8..]
    );
    assert_eq!(client.in_flight(), 0);
    w.assert_contract();
}

/// The `ClientError` under `err`: the failed send a refusal ended the call after.
/// `err.last_failure()`, which must be there and be `err`'s source.
fn last_failure(err: &vantage_api_pool::ClientError) -> &vantage_api_pool::ClientError {
    let last = err
        .last_failure()
        .unwrap_or_else(|| panic!("no earlier failure under {err:?}"));
    let source = std::error::Error::source(err)
        .and_then(|s| s.downcast_ref::<vantage_api_pool::ClientError>());
    assert!(source.is_some_and(|source| std::ptr::eq(source, last)));
    last
}

#[test]
fn a_refusal_after_failed_sends_keeps_the_last_failure_as_its_source() {
    let maintenance = || {
        Reply::status(503)
            .body("down for maintenance")
            .header("x-request-id", "r-9")
    };
    // Waiting for the probe: the third cooldown (20 s) would end after the 30 s
    // budget, so the call ends at once at 16 s, as TimedOut, with the 503 under it.
    let w = World::new();
    w.transport.default_reply(maintenance());
    let client = w.builder().breaker(1, secs(5), secs(60)).build().unwrap();
    let waiting = bounded(3, ms(250)).with_breaker_mode(BreakerMode::WaitForProbe);
    let err =
        w.rt.block_on(client.execute_with(&waiting, |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert!(!err.nothing_sent(), "three 503s went out");
    assert_eq!(w.rt.now(), at(secs(16)));
    assert_eq!(w.sent_at(), [secs(0), secs(5), secs(15)]);
    let last = last_failure(&err);
    assert_eq!(last.status(), Some(StatusCode::SERVICE_UNAVAILABLE));
    assert_eq!(last.body_text().as_deref(), Some("down for maintenance"));
    assert_eq!(last.request_id(), Some("r-9"));
    assert_eq!(last.attempts(), 3);
    w.assert_last_failed_is(&err);
    w.assert_contract();

    // Failing fast: the retry meets the open breaker; BreakerOpen, the 503 under it.
    let w = World::new();
    w.transport.default_reply(maintenance());
    let client = w.builder().breaker(1, secs(5), secs(60)).build().unwrap();
    let err =
        w.rt.block_on(client.execute_with(&bounded(3, ms(250)), |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BreakerOpen);
    assert_eq!(
        last_failure(&err).status(),
        Some(StatusCode::SERVICE_UNAVAILABLE)
    );
    assert!(!err.nothing_sent(), "the first send got a 503");
    // The 503 itself has no earlier failure.
    assert!(last_failure(&err).last_failure().is_none());

    // The event reports the same error, source included.
    let failed: Vec<_> = w
        .events()
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::Failed { error, sent, .. } => Some((error, sent)),
            _ => None,
        })
        .collect();
    let (unsent, sent) = failed.last().unwrap();
    assert!(!sent);
    assert_eq!(
        last_failure(unsent).body_text().as_deref(),
        Some("down for maintenance")
    );

    // A call refused before any send has no earlier failure to show.
    let err =
        w.rt.block_on(client.execute_with(&bounded(3, ms(250)), |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BreakerOpen);
    assert!(std::error::Error::source(&err).is_none());
    assert!(err.last_failure().is_none());
}

#[test]
fn a_retry_whose_request_closure_uses_up_the_budget_keeps_the_503_as_its_source() {
    // The second pass's closure takes 3 s of a 2 s budget: no time left to send, so
    // TimedOut with nothing more sent, and the 503 (body included) under it.
    let w = World::new();
    w.transport.push(Reply::status(503).body("busy"));
    w.transport.default_reply(Reply::ok());
    let client = w.client();
    let policy = bounded_within(1, ms(10), secs(1), secs(2));
    let rt = w.rt.clone();
    let mut builds = 0;
    let err =
        w.rt.block_on(client.execute_with(&policy, |h| {
            builds += 1;
            if builds == 2 {
                rt.advance(secs(3));
            }
            h.get("/x")
        }))
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert_eq!(err.attempts(), 1);
    assert!(!err.nothing_sent());
    assert_eq!(w.transport.request_count(), 1);
    let last = last_failure(&err);
    assert_eq!(last.status(), Some(StatusCode::SERVICE_UNAVAILABLE));
    assert_eq!(last.body_text().as_deref(), Some("busy"));
    w.assert_last_failed_is(&err);
    w.assert_contract();
}

#[test]
fn a_fail_fast_caller_is_not_held_up_by_a_sleeping_caller() {
    let w = World::new();
    w.transport.push_many((0..5).map(|_| Reply::status(503)));
    let client = w
        .builder()
        .default_breaker()
        .max_parallel(1)
        .build()
        .unwrap();
    open_breaker(&w, &client);
    let sleeper = w.spawn_call(&client, CallPolicy::essential(), "/x");
    w.rt.run_until(at(secs(1))).unwrap();
    assert_eq!(
        client.in_flight(),
        0,
        "a caller waiting out the cooldown holds no permit"
    );
    let err =
        w.rt.block_on(client.execute(|h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BreakerOpen);
    assert_eq!(w.now(), secs(1), "answered at once");
    sleeper.abort();

    // Same while another caller sleeps in a back-off.
    let w = World::new();
    w.transport.push(Reply::status(503));
    w.transport.default_reply(Reply::ok());
    let client = w.builder().max_parallel(1).build().unwrap();
    let backing_off = {
        let client = client.clone();
        w.rt.spawn(async move {
            client
                .execute_with(&bounded(1, secs(30)), |h| h.get("/x"))
                .await
        })
    };
    w.rt.run_until(at(secs(1))).unwrap();
    assert_eq!(client.in_flight(), 0);
    assert!(
        w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/y")))
            .unwrap()
            .is_ok()
    );
    assert_eq!(w.now(), secs(1));
    backing_off.abort();
}

#[test]
fn a_success_ends_the_failure_run() {
    // Threshold 3: two 503s, a 200, two 503s leave it closed; the third 503 in a row
    // after the success opens it.
    let w = World::new();
    w.transport.push_many(
        [503, 503, 200, 503, 503, 503]
            .into_iter()
            .map(Reply::status),
    );
    let client = w.builder().breaker(3, secs(5), secs(60)).build().unwrap();
    let mut states = Vec::new();
    for _ in 0..6 {
        let _ =
            w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")));
        states.push(matches!(client.breaker_state(), BreakerState::Closed));
    }
    assert_eq!(states, [true, true, true, true, true, false]);
    assert_eq!(opened(&w.events()), [secs(5)]);
    w.assert_contract();
}

#[test]
fn budget_ending_while_waiting_for_the_probe_is_timed_out() {
    let w = World::new();
    w.transport.push_many((0..5).map(|_| Reply::status(503)));
    let client = w.builder().breaker(5, secs(60), secs(60)).build().unwrap();
    open_breaker(&w, &client);
    w.observer.clear();
    let policy = bounded(3, ms(10)).with_breaker_mode(BreakerMode::WaitForProbe);
    let err =
        w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert_eq!(err.time_limit(), Some(TimeLimit::Budget));
    assert_eq!(err.attempts(), 0);
    assert_eq!(w.kinds(), ["started", "failed"]);
    assert!(matches!(
        w.events()[1].kind,
        EventKind::Failed {
            sent: false,
            ms: 0,
            ..
        }
    ));
}

#[test]
fn rate_ten_per_second_sends_the_hundredth_request_at_nine_seconds() {
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let client = w
        .builder()
        .rate_limit_with_burst(10.0, 10)
        .max_parallel(100)
        .build()
        .unwrap();
    let calls: Vec<_> = (0..100)
        .map(|_| w.spawn_call(&client, CallPolicy::background(), "/x"))
        .collect();
    w.rt.run().unwrap();
    assert!(calls.into_iter().all(|c| w.rt.block_on(c).unwrap().is_ok()));
    let sent = w.sent_at();
    assert_eq!(
        sent.iter().filter(|t| **t == Duration::ZERO).count(),
        10,
        "the bucket starts full"
    );
    assert_eq!(sent[10], ms(100));
    assert_eq!(*sent.last().unwrap(), secs(9));
    // The token wait is not in `ms`.
    assert!(
        w.events()
            .iter()
            .all(|e| !matches!(e.kind, EventKind::Succeeded { ms, .. } if ms > 0))
    );
}

#[test]
fn redials_take_a_rate_token_each() {
    let w = World::new();
    w.transport.push(Reply::fail(
        vantage_api_pool::TransportErrorKind::NotSent,
        "stale",
    ));
    w.transport.push(Reply::ok());
    let client = w.builder().rate_limit_with_burst(1.0, 1).build().unwrap();
    w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
        .unwrap()
        .unwrap();
    assert_eq!(w.sent_at(), [secs(0), secs(1)]);
}

#[test]
fn sends_keep_to_the_rate_while_every_permit_is_busy() {
    // A send takes its rate token after its permit: callers queued behind a slow
    // send leave one per token when it frees the permit, not all at once.
    let w = World::new();
    w.transport.push(Reply::ok().after(secs(5)));
    w.transport.default_reply(Reply::ok());
    let client = w.builder().max_parallel(1).rate_limit_with_burst(1.0, 1);
    background_gets(&w, &client.build().unwrap(), 5);
    assert_eq!(w.sent_at(), [secs(0), secs(5), secs(6), secs(7), secs(8)]);
    w.assert_contract();

    // The quick start's settings: four slow sends hold every permit while forty
    // callers queue; afterwards no 100 ms holds more than burst + rate × 0.1 s.
    let w = World::new();
    for _ in 0..4 {
        w.transport.push(Reply::ok().after(secs(5)));
    }
    w.transport.default_reply(Reply::ok());
    let client = w.builder().max_parallel(4).rate_limit(10.0);
    background_gets(&w, &client.build().unwrap(), 44);
    let sent = w.sent_at();
    assert_eq!(sent.len(), 44);
    for (i, from) in sent.iter().enumerate() {
        let within = sent[i..]
            .iter()
            .take_while(|t| **t - *from <= ms(100))
            .count();
        assert!(within <= 11, "{within} sends within 100 ms of {from:?}");
    }
}

#[test]
fn max_parallel_caps_in_flight_and_cancelled_calls_give_permits_back() {
    let w = World::new();
    w.transport.default_reply(Reply::ok().after(secs(1)));
    let client = w.builder().max_parallel(4).build().unwrap();
    // Each call asks for a path of its own: /0, /1, ... in the order they arrive.
    let calls: Vec<_> = (0..32)
        .map(|i| {
            let path: &'static str = Box::leak(format!("/{i}").into_boxed_str());
            w.spawn_call(&client, CallPolicy::background(), path)
        })
        .collect();
    w.rt.run_until(at(ms(2500))).unwrap();
    assert_eq!(client.in_flight(), 4);
    assert_eq!(client.peak_in_flight(), 4);
    assert_eq!(w.transport.peak_in_flight(), 4);
    // 12 sent, 4 of them in flight; the other 20 queue for a permit.
    assert_eq!(client.waiting_for_permit(), 20);
    // Served in arrival order: 4 per second.
    assert_eq!(
        w.sent_at(),
        [[secs(0); 4], [secs(1); 4], [secs(2); 4]].concat()
    );
    let paths: Vec<String> = w
        .transport
        .requests()
        .iter()
        .map(|r| r.path.to_string())
        .collect();
    let arrival: Vec<String> = (0..12).map(|i| format!("/{i}")).collect();
    assert_eq!(paths, arrival);
    for call in calls {
        call.abort();
    }
    assert_eq!(client.in_flight(), 0);
    assert_eq!(client.waiting_for_permit(), 0);
    assert_eq!(w.transport.in_flight(), 0);
    w.assert_contract();
    // The permits are all back.
    w.transport.default_reply(Reply::ok());
    let many: Vec<_> = (0..4)
        .map(|_| w.spawn_call(&client, CallPolicy::background(), "/x"))
        .collect();
    w.rt.run().unwrap();
    assert!(many.into_iter().all(|c| w.rt.block_on(c).unwrap().is_ok()));
    assert_eq!(w.now(), ms(2500));
}

#[test]
fn the_permit_is_back_at_the_response_head_not_after_the_error_body() {
    let w = World::new();
    // An error body that takes a second to read: ten chunks of 10 bytes, 100 ms each.
    w.transport.push(
        Reply::status(500)
            .body(vec![b'e'; 100])
            .chunk_size(10)
            .chunk_delay(ms(100)),
    );
    w.transport.default_reply(Reply::ok());
    let client = w.builder().max_parallel(1).build().unwrap();
    let first = w.spawn_call(&client, CallPolicy::background(), "/a");
    let second = w.spawn_call(&client, CallPolicy::background(), "/b");
    w.rt.run().unwrap();
    // The second call took the only permit while the first read its body.
    assert_eq!(w.sent_at(), [Duration::ZERO, Duration::ZERO]);
    assert!(w.rt.block_on(second).unwrap().is_ok());
    assert_eq!(
        w.rt.block_on(first).unwrap().unwrap_err().status(),
        Some(StatusCode::INTERNAL_SERVER_ERROR)
    );
    assert_eq!(w.now(), secs(1), "the body took its second");
    assert_eq!(client.peak_in_flight(), 1);
    w.assert_contract();
}

/// A token source whose n-th fetch returns `Bearer t{n}` after 50 ms.
fn counting_tokens(
    rt: &VirtualRuntime,
    fetches: &Arc<AtomicU32>,
) -> impl vantage_api_pool::TokenSource + use<> {
    counting_tokens_after(rt, fetches, ms(50))
}

/// [`counting_tokens`], each fetch taking `delay`.
fn counting_tokens_after(
    rt: &VirtualRuntime,
    fetches: &Arc<AtomicU32>,
    delay: Duration,
) -> impl vantage_api_pool::TokenSource + use<> {
    let rt = rt.clone();
    let fetches = Arc::clone(fetches);
    token_fn(move || {
        let rt = rt.clone();
        let n = fetches.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            rt.sleep(delay).await;
            Ok::<_, AuthError>((
                AUTHORIZATION,
                HeaderValue::from_str(&format!("Bearer t{n}")).unwrap(),
            ))
        }
    })
}

/// A token source whose first fetch gives `Bearer t1` at once and whose later ones
/// fail ("identity provider down"), counting fetches.
fn t1_then_failing_tokens(fetches: &Arc<AtomicU32>) -> impl vantage_api_pool::TokenSource + use<> {
    let fetches = Arc::clone(fetches);
    token_fn(move || {
        let n = fetches.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            if n == 1 {
                Ok((AUTHORIZATION, HeaderValue::from_static("Bearer t1")))
            } else {
                Err(AuthError::from("identity provider down"))
            }
        }
    })
}

/// A client over `w` (`customize` applied to its builder) whose token source's n-th
/// fetch gives `Bearer t{n}`, valid for a minute, after `delay`; from fetch
/// `fails_from` on (if given), fetches fail ("identity provider down") instead.
/// Returns it with the fetch counter.
fn with_expiring_tokens<F: FnOnce(Builder) -> Builder>(
    w: &World,
    delay: Duration,
    fails_from: Option<u32>,
    customize: F,
) -> (
    Client<impl vantage_api_pool::TokenSource + use<F>>,
    Arc<AtomicU32>,
) {
    with_tokens_living(w, secs(60), delay, fails_from, customize)
}

/// [`with_expiring_tokens`], the tokens living `lifetime`.
fn with_tokens_living<F: FnOnce(Builder) -> Builder>(
    w: &World,
    lifetime: Duration,
    delay: Duration,
    fails_from: Option<u32>,
    customize: F,
) -> (
    Client<impl vantage_api_pool::TokenSource + use<F>>,
    Arc<AtomicU32>,
) {
    let rt = w.rt.clone();
    let fetches = Arc::new(AtomicU32::new(0));
    let counter = Arc::clone(&fetches);
    let source = token_fn(move || {
        let rt = rt.clone();
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            rt.sleep(delay).await;
            if fails_from.is_some_and(|first| n >= first) {
                return Err(AuthError::from("identity provider down"));
            }
            Ok(AuthToken::bearer(&format!("t{n}"))?.expires_in(lifetime))
        }
    });
    let client = customize(w.builder()).auth(source).build().unwrap();
    (client, fetches)
}

/// A policy whose sends may take two minutes.
fn patient() -> CallPolicy {
    CallPolicy::background()
        .with_attempt_timeout(secs(120))
        .unwrap()
}

/// Answers a request carrying `Bearer t1` 401 after `delay`, any other 200 at once.
fn t1_refused_after(w: &World, delay: Duration) {
    reply_by_path_and_token(w, move |_, token| {
        if token == "Bearer t1" {
            Reply::status(401).after(delay)
        } else {
            Reply::ok()
        }
    });
}

/// Answers each request as `reply` says, given its path and its `Authorization`
/// value.
fn reply_by_path_and_token(w: &World, reply: impl Fn(&str, &str) -> Reply + Send + Sync + 'static) {
    w.transport.respond_with(move |req, _| {
        let token = req.headers().get(AUTHORIZATION).unwrap();
        reply(req.path(), token.to_str().unwrap())
    });
}

/// Every request sent: when, to which path, with which token.
fn sent_tokens(w: &World) -> Vec<(Duration, String, String)> {
    w.transport
        .requests()
        .iter()
        .map(|r| {
            let token = r
                .headers
                .get(AUTHORIZATION)
                .map_or("", |v| v.to_str().unwrap());
            (r.at.since_origin(), r.path.to_string(), token.to_owned())
        })
        .collect()
}

fn sent(at: Duration, path: &str, token: &str) -> (Duration, String, String) {
    (at, path.to_owned(), format!("Bearer {token}"))
}

/// The tokens that three calls, `/a`, `/b` and `/c` at `wakes`, send when the token
/// source's n-th fetch gives `Bearer t{n}` after 1 s, living ten minutes and due for
/// renewal `ahead` of its end.
fn tokens_sent_renewing(ahead: Duration, wakes: [Duration; 3]) -> Vec<(Duration, String, String)> {
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let rt = w.rt.clone();
    let fetches = Arc::new(AtomicU32::new(0));
    let source = token_fn(move || {
        let rt = rt.clone();
        let n = fetches.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            rt.sleep(secs(1)).await;
            Ok::<_, AuthError>(
                AuthToken::bearer(&format!("t{n}"))?
                    .expires_in(secs(600))
                    .renew_ahead(ahead),
            )
        }
    });
    let client = w.builder().auth(source).build().unwrap();
    for (wake, path) in wakes.into_iter().zip(["/a", "/b", "/c"]) {
        w.rt.run_until(at(wake)).unwrap();
        w.rt.block_on(client.execute(|h| h.get(path)))
            .unwrap()
            .unwrap();
    }
    w.assert_contract();
    sent_tokens(&w)
}

#[test]
fn a_token_with_a_margin_of_its_own_is_renewed_that_far_ahead() {
    // Five minutes ahead: t1 (fetched from 0 s) is due at 300 s, not at 540 s.
    assert_eq!(
        tokens_sent_renewing(secs(300), [secs(0), secs(299), secs(301)]),
        [
            sent(secs(1), "/a", "t1"),
            sent(secs(299), "/b", "t1"),
            sent(secs(302), "/c", "t2"),
        ]
    );
}

#[test]
fn a_token_renewed_no_time_ahead_is_sent_until_it_expires() {
    // No margin: t1 (fetched from 0 s) is sent up to its expiry at 600 s, where the
    // default would have renewed it from 540 s.
    assert_eq!(
        tokens_sent_renewing(Duration::ZERO, [secs(0), secs(599), secs(600)]),
        [
            sent(secs(1), "/a", "t1"),
            sent(secs(599), "/b", "t1"),
            sent(secs(601), "/c", "t2"),
        ]
    );
}

#[test]
fn a_token_with_a_lifetime_is_renewed_ahead_by_one_call_while_the_others_send_it() {
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let (client, fetches) = with_expiring_tokens(&w, secs(1), None, |b| b);
    let get = |path: &'static str| w.spawn_call(&client, CallPolicy::background(), path);
    // t1, fetched from 0 s to 1 s: renewed from 30 s (a minute's lifetime, so half
    // of it ahead), expired from 60 s.
    let first = get("/a");
    w.rt.run_until(at(secs(29))).unwrap();
    let before = get("/b");
    w.rt.run_until(at(secs(31))).unwrap();
    // Due: this call renews it, and waits for t2 (31 s to 32 s) ...
    let renewing = get("/c");
    w.rt.run_until(at(ms(31_500))).unwrap();
    // ... while this one sends t1 at once.
    let meanwhile = get("/d");
    w.rt.run_until(at(secs(40))).unwrap();
    for call in [first, before, renewing, meanwhile] {
        assert!(call.is_finished());
    }
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    // t2 (renewed from 61 s, expired from 91 s) is not used before 95 s: expired,
    // so that call waits for t3, and t2 never goes out after 91 s.
    w.rt.run_until(at(secs(95))).unwrap();
    w.rt.block_on(client.execute(|h| h.get("/e")))
        .unwrap()
        .unwrap();
    assert_eq!(
        sent_tokens(&w),
        [
            sent(secs(1), "/a", "t1"),
            sent(secs(29), "/b", "t1"),
            sent(ms(31_500), "/d", "t1"),
            sent(secs(32), "/c", "t2"),
            sent(secs(96), "/e", "t3"),
        ]
    );
    assert_eq!(client.token_fetches(), 3);
    w.assert_contract();
}

#[test]
fn a_failed_renewal_sends_the_token_still_valid_and_an_expired_token_is_never_sent() {
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let (client, fetches) = with_expiring_tokens(&w, ms(100), Some(2), |b| b);
    let get = |path: &'static str| {
        w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get(path)))
            .unwrap()
    };
    get("/a").unwrap();
    // Due at 30 s: the call that looks renews it, fails, and sends t1. The next try
    // is due halfway to the expiry (45.55 s), so the next call sends t1 at once.
    w.rt.run_until(at(secs(31))).unwrap();
    get("/b").unwrap();
    get("/c").unwrap();
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    // The second try fails at 46.1 s (the next would be at 53.05 s).
    w.rt.run_until(at(secs(46))).unwrap();
    get("/d").unwrap();
    assert_eq!(fetches.load(Ordering::SeqCst), 3);
    // Expired from 60 s: the fetch fails and the call ends, nothing sent.
    w.rt.run_until(at(secs(60))).unwrap();
    let err = get("/e").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Auth);
    assert!(err.nothing_sent());
    assert_eq!(
        err.auth_error().map(ToString::to_string).as_deref(),
        Some("identity provider down")
    );
    assert_eq!(
        sent_tokens(&w),
        [
            sent(ms(100), "/a", "t1"),
            sent(ms(31_100), "/b", "t1"),
            sent(ms(31_100), "/c", "t1"),
            sent(ms(46_100), "/d", "t1"),
        ]
    );
    w.assert_contract();
}

#[test]
fn a_renewal_that_fails_with_4_s_left_tries_again_2_s_later_the_floor_itself() {
    // t1 lives 8 s, so it is due at 4 s (half its life, under the 60 s margin), and
    // every renewal fails. The one at 4 s leaves 4 s: halfway is exactly 2 s away,
    // which is the floor, not under it, so the next try is at 6 s (not at 5.999 s);
    // that one leaves 1 s, so none follows before the expiry.
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let (client, fetches) = with_tokens_living(&w, secs(8), Duration::ZERO, Some(2), |b| b);
    for (now_ms, fetched) in [(0, 1), (4_000, 2), (5_999, 2), (6_000, 3), (7_999, 3)] {
        w.rt.run_until(at(ms(now_ms))).unwrap();
        w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/a")))
            .unwrap()
            .unwrap();
        assert_eq!(fetches.load(Ordering::SeqCst), fetched, "at {now_ms} ms");
    }
    assert_eq!(w.transport.requests().len(), 5);
    w.assert_contract();
}

#[test]
fn failed_renewals_back_off_halfway_to_the_expiry_and_none_is_tried_in_its_last_2_s() {
    // t1 lives 60 s and every renewal fails at once. With a call every 125 ms,
    // renewals are tried at 30 s, 45 s, 52.5 s and 56.25 s; the next halfway point,
    // 58.125 s, would leave less than 2 s, so none is tried before the expiry.
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let (client, fetches) = with_expiring_tokens(&w, Duration::ZERO, Some(2), |b| b);
    for tick in 0..480 {
        w.rt.run_until(at(ms(tick * 125))).unwrap();
        w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/a")))
            .unwrap()
            .unwrap();
    }
    assert_eq!(fetches.load(Ordering::SeqCst), 5);
    assert_eq!(w.transport.requests().len(), 480);
    w.assert_contract();
}

#[test]
fn a_replay_that_finds_the_newer_token_due_renews_it_and_keeps_it_if_that_fails() {
    // A sends t1 at 0 s, answered 401 at 70 s. B renews t1 at 31 s (t2: due from
    // 61 s, expired from 91 s). A's replay at 70 s finds t2 due, renews it, the
    // fetch fails, and A replays with t2, which is still valid.
    let w = World::new();
    w.transport.respond_with(|req, _| {
        let token = req.headers().get(AUTHORIZATION).unwrap();
        if req.path() == "/a" && token == "Bearer t1" {
            Reply::status(401).after(secs(70))
        } else {
            Reply::ok()
        }
    });
    let (client, fetches) = with_expiring_tokens(&w, Duration::ZERO, Some(3), |b| b);
    let a = w.spawn_call(&client, patient(), "/a");
    w.rt.run_until(at(secs(31))).unwrap();
    let b = w.spawn_call(&client, CallPolicy::background(), "/b");
    w.rt.run_until(at(secs(80))).unwrap();
    assert!(b.is_finished());
    w.rt.block_on(a).unwrap().unwrap();
    // The replay's renewal failed; the gate, looking again before the send, finds
    // the next try not due yet.
    assert_eq!(fetches.load(Ordering::SeqCst), 3);
    assert_eq!(
        sent_tokens(&w),
        [
            sent(secs(0), "/a", "t1"),
            sent(secs(31), "/b", "t2"),
            sent(secs(70), "/a", "t2"),
        ]
    );
    w.assert_contract();
}

#[test]
fn a_token_that_expires_while_the_request_closure_runs_never_goes_out() {
    // t1 lives 60 s and renewals fail. At 59.995 s the gate hands out t1 (its
    // renewal failed), and the request closure takes 10 ms: t1 has expired when it
    // returns, so the call goes back through the gate, where the fetch fails too.
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let (client, _) = with_expiring_tokens(&w, Duration::ZERO, Some(2), |b| b);
    w.rt.block_on(client.execute(|h| h.get("/a")))
        .unwrap()
        .unwrap();
    w.rt.run_until(at(ms(59_995))).unwrap();
    let rt = w.rt.clone();
    let err =
        w.rt.block_on(client.execute_with(&CallPolicy::background(), move |h| {
            rt.advance(ms(10));
            h.get("/slow-build")
        }))
        .unwrap()
        .unwrap_err();
    assert_eq!((err.kind(), err.nothing_sent()), (ErrorKind::Auth, true));
    assert_eq!(sent_tokens(&w), [sent(secs(0), "/a", "t1")]);
    w.assert_contract();
}

#[test]
fn a_token_that_expires_before_its_fetch_ends_is_a_failed_fetch() {
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let (client, _) = with_tokens_living(&w, secs(1), secs(2), None, |b| b);
    let err = w.background_error(&client);
    assert_eq!(err.kind(), ErrorKind::Auth);
    assert!(err.nothing_sent());
    assert!(
        err.auth_error()
            .unwrap()
            .to_string()
            .contains("expired before its fetch ended")
    );
    assert_eq!(w.transport.request_count(), 0);
}

#[test]
fn a_token_that_lives_less_than_a_rate_interval_never_goes_out_and_the_budget_ends_it() {
    // t1 lives 500 ms; one send a second. B takes t1 at 0 s and waits for its rate
    // token until 1 s, past t1's expiry: it renews and waits for a fresh rate token
    // (the one it took is spent), and so on, each token dead before the next rate
    // token. Nothing goes out with an expired token, the rate holds, and B's 3 s
    // budget ends it.
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let (client, fetches) = with_tokens_living(&w, ms(500), Duration::ZERO, None, |b| {
        b.rate_limit_with_burst(1.0, 1)
    });
    let a = w.spawn_call(&client, CallPolicy::background(), "/a");
    let budgeted = CallPolicy::background()
        .with_attempt_timeout(secs(1))
        .and_then(|p| p.with_budget(Some(secs(3))))
        .unwrap();
    let b = w.spawn_call(&client, budgeted, "/b");
    w.rt.run_until(at(secs(10))).unwrap();
    w.rt.block_on(a).unwrap().unwrap();
    let err = w.rt.block_on(b).unwrap().unwrap_err();
    assert_eq!(err.time_limit(), Some(TimeLimit::Budget));
    assert!(err.nothing_sent());
    assert_eq!(sent_tokens(&w), [sent(secs(0), "/a", "t1")]);
    assert!(fetches.load(Ordering::SeqCst) >= 3, "renewed each lap");
    w.assert_contract();
}

#[test]
fn a_renewal_its_caller_gave_up_backs_off_as_a_failed_one_does() {
    // t1 (at once) lives a minute; every later fetch hangs. The renewer at 31 s has
    // a 2 s budget and gives up at 33 s: the next try is due halfway to the expiry
    // (46.5 s), so a call at 34 s sends t1 at once instead of hanging in a renewal
    // of its own; a call at 47 s tries (and gives up) again.
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let fetches = Arc::new(AtomicU32::new(0));
    let counter = Arc::clone(&fetches);
    let source = token_fn(move || {
        let first = counter.fetch_add(1, Ordering::SeqCst) == 0;
        async move {
            if !first {
                std::future::pending::<()>().await;
            }
            Ok::<_, AuthError>(AuthToken::bearer("t1")?.expires_in(secs(60)))
        }
    });
    let client = w.builder().auth(source).build().unwrap();
    let brief = CallPolicy::background()
        .with_attempt_timeout(secs(1))
        .and_then(|p| p.with_budget(Some(secs(2))))
        .unwrap();
    let call = |path: &'static str| {
        w.rt.block_on(client.execute_with(&brief, |h| h.get(path)))
            .unwrap()
    };
    call("/a").unwrap();
    w.rt.run_until(at(secs(31))).unwrap();
    assert_eq!(call("/b").unwrap_err().kind(), ErrorKind::TimedOut);
    w.rt.run_until(at(secs(34))).unwrap();
    call("/c").unwrap();
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    w.rt.run_until(at(secs(47))).unwrap();
    assert_eq!(call("/d").unwrap_err().kind(), ErrorKind::TimedOut);
    assert_eq!(fetches.load(Ordering::SeqCst), 3);
    assert_eq!(
        sent_tokens(&w),
        [sent(secs(0), "/a", "t1"), sent(secs(34), "/c", "t1")]
    );
}

#[test]
fn sends_whose_tokens_expired_in_their_rate_wait_still_keep_to_the_rate() {
    // One send a second; tokens live 5 s and take 3 s to fetch. Six calls queue for
    // rate tokens past t1's expiry and wait for one renewal together: each then
    // takes a fresh rate token, so they still leave a second apart.
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let (client, _) = with_tokens_living(&w, secs(5), secs(3), None, |b| {
        b.rate_limit_with_burst(1.0, 1)
    });
    let calls: Vec<_> = (0..6)
        .map(|_| w.spawn_call(&client, CallPolicy::background(), "/x"))
        .collect();
    w.rt.run_until(at(secs(60))).unwrap();
    let results: Vec<_> = calls
        .into_iter()
        .map(|call| w.rt.block_on(call).unwrap().map_err(|e| e.to_string()))
        .collect();
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    // Renewals at 5 s (t2, landing at 8 s) and 10 s (t3, at 13 s): every send
    // carries a token that has not expired, a second or more after the one before.
    assert_eq!(
        sent_tokens(&w),
        [
            sent(secs(3), "/x", "t1"),
            sent(secs(4), "/x", "t1"),
            sent(secs(8), "/x", "t2"),
            sent(secs(9), "/x", "t2"),
            sent(secs(13), "/x", "t3"),
            sent(secs(14), "/x", "t3"),
        ]
    );
}

#[test]
fn a_caller_that_waited_for_a_fetch_takes_its_token_even_when_it_is_due() {
    // t1 lives 4 s and its fetch takes 3 s: it lands due (renewal from 2 s). The
    // caller that waited for that fetch sends it, as the fetcher does, and does
    // not renew it at once.
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let (client, fetches) = with_tokens_living(&w, secs(4), secs(3), None, |b| b);
    let a = w.spawn_call(&client, CallPolicy::background(), "/a");
    let b = w.spawn_call(&client, CallPolicy::background(), "/b");
    w.rt.run_until(at(secs(10))).unwrap();
    assert!(a.is_finished() && b.is_finished());
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
    assert_eq!(
        sent_tokens(&w),
        [sent(secs(3), "/a", "t1"), sent(secs(3), "/b", "t1")]
    );
}

/// What `paths`, each called at once and answered 401 for `t1` after 1 s (200 for
/// any other token), send when tokens live 4 s, each fetch takes 3 s and every fetch
/// after the second fails; and how many fetches ran.
fn replays_of_tokens_that_land_due(
    paths: &[&'static str],
) -> (Vec<(Duration, String, String)>, u32) {
    let w = World::new();
    t1_refused_after(&w, secs(1));
    let (client, fetches) = with_tokens_living(&w, secs(4), secs(3), Some(3), |b| b);
    let calls: Vec<_> = paths
        .iter()
        .map(|path| w.spawn_call(&client, CallPolicy::background(), path))
        .collect();
    w.rt.run_until(at(secs(20))).unwrap();
    for call in calls {
        w.rt.block_on(call).unwrap().unwrap();
    }
    w.assert_contract();
    (sent_tokens(&w), fetches.load(Ordering::SeqCst))
}

#[test]
fn a_replay_sends_the_token_its_refresh_brought_even_when_it_lands_due() {
    // t1 is sent at 3 s and refused at 4 s. The replay's refresh runs from 4 s to
    // 7 s: t2 lives until 8 s and lands due (renewal from 6 s). The replay sends it,
    // as a caller that waited for a fetch does, rather than renewing it at once (a
    // third fetch, which fails at 10 s, after t2 expired, and would end the call
    // `Auth`).
    let (sent_by, fetches) = replays_of_tokens_that_land_due(&["/a"]);
    assert_eq!(
        sent_by,
        [sent(secs(3), "/a", "t1"), sent(secs(7), "/a", "t2")]
    );
    assert_eq!(fetches, 2);
}

#[test]
fn a_replay_that_waited_for_another_calls_refresh_sends_its_token_even_when_it_lands_due() {
    // As above, with /b's 401 at 4 s too: /b waits for /a's refresh and sends t2
    // at 7 s as well; neither renews it.
    let (sent_by, fetches) = replays_of_tokens_that_land_due(&["/a", "/b"]);
    assert_eq!(
        sent_by,
        [
            sent(secs(3), "/a", "t1"),
            sent(secs(3), "/b", "t1"),
            sent(secs(7), "/a", "t2"),
            sent(secs(7), "/b", "t2"),
        ]
    );
    assert_eq!(fetches, 2);
}

#[test]
fn a_replay_answered_503_renews_its_due_token_before_it_retries() {
    // As above, with t2 answered 503 (retry after 100 ms) the first time: the
    // retry, before t2 expires at 8 s, is the first call to look at t2 since its
    // send, so it renews it (a 3 s fetch) like any caller, and sends t3.
    let w = World::new();
    let t2_seen = Arc::new(AtomicU32::new(0));
    w.transport.respond_with(move |req, _| {
        let token = req.headers().get(AUTHORIZATION).unwrap();
        if token == "Bearer t1" {
            Reply::status(401).after(secs(1))
        } else if token == "Bearer t2" && t2_seen.fetch_add(1, Ordering::SeqCst) == 0 {
            Reply::status(503).header("retry-after-ms", "100")
        } else {
            Reply::ok()
        }
    });
    let (client, fetches) = with_tokens_living(&w, secs(4), secs(3), None, |b| b);
    w.rt.block_on(client.execute_with(&CallPolicy::essential(), |h| h.get("/a")))
        .unwrap()
        .unwrap();
    let sent_by = sent_tokens(&w);
    assert_eq!(
        sent_by[..2],
        [sent(secs(3), "/a", "t1"), sent(secs(7), "/a", "t2")]
    );
    let (last_at, _, last_token) = &sent_by[2];
    assert_eq!((sent_by.len(), last_token.as_str()), (3, "Bearer t3"));
    assert!(*last_at > ms(10_100) && *last_at < secs(11), "{last_at:?}");
    assert_eq!(fetches.load(Ordering::SeqCst), 3);
    w.assert_contract();
}

#[test]
fn a_replay_that_waits_at_the_gate_after_its_refresh_renews_a_token_due_by_then() {
    // Tokens live 120 s, fetches take 1 s. /a's t1 is refused at 3 s; its refresh
    // brings t2 at 4 s (due from 63 s), but /b's 503 opened the breaker at 3.5 s
    // for 119 s, and /a waits for the probe until 122.5 s. By then t2 has half a
    // second left: the gate renews it like any caller (t3 at 123.5 s) instead of
    // sending it as a token that just landed.
    let w = World::new();
    reply_by_path_and_token(&w, |path, token| match (path, token) {
        ("/a", "Bearer t1") => Reply::status(401).after(secs(2)),
        ("/b", _) => Reply::status(503).after(ms(2_500)),
        _ => Reply::ok(),
    });
    let (client, fetches) = with_tokens_living(&w, secs(120), secs(1), None, |b| {
        b.breaker(1, secs(119), secs(600))
    });
    let a = w.spawn_call(&client, CallPolicy::essential(), "/a");
    let b = w.spawn_call(&client, CallPolicy::background(), "/b");
    w.rt.run_until(at(secs(200))).unwrap();
    assert!(b.is_finished());
    w.rt.block_on(a).unwrap().unwrap();
    assert_eq!(
        sent_tokens(&w),
        [
            sent(secs(1), "/a", "t1"),
            sent(secs(1), "/b", "t1"),
            sent(ms(123_500), "/a", "t3"),
        ]
    );
    assert_eq!(fetches.load(Ordering::SeqCst), 3);
    w.assert_contract();
}

#[test]
fn a_replay_that_waits_for_another_calls_probe_after_its_refresh_renews_a_token_due_by_then() {
    // Tokens live 120 s from their fetch's start, fetches take 1 s. /a's t1 is
    // refused at 1.5 s; its refresh brings t2 at 2.5 s (due from 61.5 s, expired
    // from 121.5 s). Meanwhile /c's 503 at 1.7 s opened the breaker for 0.3 s, and
    // /b, at 2.1 s, took the probe (it sends t2 at 2.5 s and is answered at
    // 120.5 s). /a re-checks while that probe is out: at 120.5 s t2 has a second
    // left, and /a renews it like any caller (t3 at 121.5 s) instead of sending it
    // as a token that just landed.
    let w = World::new();
    reply_by_path_and_token(&w, |path, token| match (path, token) {
        ("/a", "Bearer t1") => Reply::status(401).after(ms(500)),
        ("/b", _) => Reply::ok().after(secs(118)),
        ("/c", _) => Reply::status(503).after(ms(700)),
        _ => Reply::ok(),
    });
    let (client, fetches) = with_tokens_living(&w, secs(120), secs(1), None, |b| {
        b.breaker(1, ms(300), secs(600))
    });
    let a = w.spawn_call(&client, CallPolicy::essential(), "/a");
    let c = w.spawn_call(&client, CallPolicy::background(), "/c");
    w.rt.run_until(at(ms(2_100))).unwrap();
    assert_eq!(client.breaker_state(), BreakerState::HalfOpen);
    let b = w.spawn_call(&client, patient(), "/b");
    w.rt.run_until(at(secs(200))).unwrap();
    assert!(c.is_finished());
    w.rt.block_on(b).unwrap().unwrap();
    w.rt.block_on(a).unwrap().unwrap();
    let sent_by = sent_tokens(&w);
    assert_eq!(
        sent_by[..3],
        [
            sent(secs(1), "/a", "t1"),
            sent(secs(1), "/c", "t1"),
            sent(ms(2_500), "/b", "t2"),
        ]
    );
    let (last_at, last_path, last_token) = &sent_by[3];
    assert_eq!(
        (sent_by.len(), last_path.as_str(), last_token.as_str()),
        (4, "/a", "Bearer t3")
    );
    // The first re-check after the probe's answer, then the 1 s fetch.
    assert!(
        *last_at >= ms(121_500) && *last_at <= ms(121_500) + PROBE_RECHECK,
        "{last_at:?}"
    );
    assert_eq!(fetches.load(Ordering::SeqCst), 3);
    w.assert_contract();
}

#[test]
fn a_replay_whose_admission_waits_after_its_refresh_renews_a_token_due_by_then() {
    // Tokens live 120 s from their fetch's start, fetches take 1 s. /a's t1 is
    // refused at 3 s and its refresh brings t2 at 4 s (due from 63 s, expired from
    // 123 s). The transport's admission then holds the replay until 122 s: t2 is
    // due by then, and the gate renews it like any caller's (t3 at 123 s) instead
    // of sending it as a token that just landed.
    let w = World::new();
    t1_refused_after(&w, secs(2));
    w.transport.admit_with(|now| {
        if now == at(secs(4)) {
            secs(118)
        } else {
            Duration::ZERO
        }
    });
    let (client, fetches) = with_tokens_living(&w, secs(120), secs(1), None, |b| b);
    w.rt.block_on(client.execute_with(&CallPolicy::essential(), |h| h.get("/a")))
        .unwrap()
        .unwrap();
    assert_eq!(
        sent_tokens(&w),
        [sent(secs(1), "/a", "t1"), sent(secs(123), "/a", "t3")]
    );
    assert_eq!(fetches.load(Ordering::SeqCst), 3);
    w.assert_contract();
}

#[test]
fn after_the_expiry_callers_wait_for_the_fetch_and_share_its_failure() {
    // t1 (fetched 0 s to 1 s) expires at 60 s. At 61 s A's fetch runs (it fails at
    // 62 s); B, at 61.5 s, is not handed the expired t1 meanwhile, nor after the
    // failure: both end as `Auth`, nothing sent.
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let (client, fetches) = with_expiring_tokens(&w, secs(1), Some(2), |b| b);
    w.rt.block_on(client.execute(|h| h.get("/first")))
        .unwrap()
        .unwrap();
    w.rt.run_until(at(secs(61))).unwrap();
    let a = w.spawn_call(&client, CallPolicy::background(), "/a");
    w.rt.run_until(at(ms(61_500))).unwrap();
    let b = w.spawn_call(&client, CallPolicy::background(), "/b");
    w.rt.run_until(at(secs(70))).unwrap();
    for call in [a, b] {
        let err = w.rt.block_on(call).unwrap().unwrap_err();
        assert_eq!((err.kind(), err.nothing_sent()), (ErrorKind::Auth, true));
    }
    // B shares A's failure: handed the expired t1 instead, it would find it
    // expired after its request closure and fetch again.
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    assert_eq!(sent_tokens(&w), [sent(secs(1), "/first", "t1")]);
    w.assert_contract();
}

#[test]
fn a_queued_request_whose_expired_token_was_renewed_under_another_name_is_rebuilt() {
    // t1 comes under `authorization`, later tokens under `x-api-key`. The queued
    // request, built with t1 at 20 s, waits for the only permit until 70 s; t1
    // expired at 60 s and its renewal (31 s) came under the other name, which the
    // request cannot take: it goes back through the gate and is built again.
    let w = World::new();
    w.transport.respond_with(|req, _| {
        if req.path() == "/slow" {
            Reply::ok().after(secs(70))
        } else {
            Reply::ok()
        }
    });
    let fetches = Arc::new(AtomicU32::new(0));
    let counter = Arc::clone(&fetches);
    let source = token_fn(move || {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            let name = if n == 1 {
                AUTHORIZATION
            } else {
                http::HeaderName::from_static("x-api-key")
            };
            let value = HeaderValue::from_str(&format!("t{n}")).unwrap();
            Ok::<_, AuthError>(AuthToken::new(name, value).expires_in(secs(60)))
        }
    });
    let client = w.builder().max_parallel(1).auth(source).build().unwrap();
    let slow = w.spawn_call(&client, patient(), "/slow");
    w.rt.run_until(at(secs(20))).unwrap();
    let queued = w.spawn_call(&client, patient(), "/queued");
    w.rt.run_until(at(secs(31))).unwrap();
    let renewing = w.spawn_call(&client, patient(), "/c");
    w.rt.run_until(at(secs(80))).unwrap();
    for call in [slow, queued, renewing] {
        w.rt.block_on(call).unwrap().unwrap();
    }
    let after_expiry: Vec<_> = w
        .transport
        .requests()
        .iter()
        .filter(|r| r.at >= at(secs(60)))
        .map(|r| (r.path.to_string(), r.headers.contains_key(AUTHORIZATION)))
        .collect();
    assert_eq!(after_expiry.len(), 2, "{after_expiry:?}");
    assert!(
        after_expiry.iter().all(|(_, old)| !old),
        "t1 went out after its expiry: {after_expiry:?}"
    );
}

#[test]
fn a_request_whose_token_expires_while_it_waits_for_a_permit_takes_a_new_one() {
    let w = World::new();
    w.transport.respond_with(|req, _| {
        if req.path() == "/slow" {
            Reply::ok().after(secs(60))
        } else {
            Reply::ok()
        }
    });
    let (client, _) = with_expiring_tokens(&w, secs(1), None, |b| b.max_parallel(1));
    // The slow call holds the only permit from 1 s to 61 s. The other is built at
    // 20 s with t1 (not due yet) and waits for the permit past t1's expiry (60 s):
    // it fetches t2 (61 s to 62 s) and goes out with it.
    let slow = w.spawn_call(&client, patient(), "/slow");
    w.rt.run_until(at(secs(20))).unwrap();
    let waiting = w.spawn_call(&client, CallPolicy::background(), "/x");
    w.rt.run_until(at(secs(70))).unwrap();
    assert!(slow.is_finished() && waiting.is_finished());
    assert_eq!(
        sent_tokens(&w),
        [sent(secs(1), "/slow", "t1"), sent(secs(62), "/x", "t2")]
    );
    w.assert_contract();
}

/// The builder the tests start from.
type Builder =
    vantage_api_pool::ClientBuilder<vantage_api_pool_testkit::ScriptedTransport, VirtualRuntime>;

/// A client whose token source is [`counting_tokens`], built from `w.builder()` with
/// `customize` applied first; returns it with the fetch counter.
fn client_with_counted_tokens<F: FnOnce(Builder) -> Builder>(
    w: &World,
    customize: F,
) -> (
    Client<impl vantage_api_pool::TokenSource + use<F>>,
    Arc<AtomicU32>,
) {
    let fetches = Arc::new(AtomicU32::new(0));
    let client = customize(w.builder())
        .auth(counting_tokens(&w.rt, &fetches))
        .build()
        .unwrap();
    (client, fetches)
}

/// Answers 401 unless the request carries `Bearer {valid}`.
fn require_token(w: &World, valid: &'static str) {
    w.transport.respond_with(move |req, _| {
        if req.headers().get(AUTHORIZATION).is_some_and(|v| v == valid) {
            Reply::ok().after(ms(10))
        } else {
            Reply::status(401).after(ms(10))
        }
    });
}

#[test]
fn a_401_refreshes_and_replays_without_spending_retry_budget() {
    let w = World::new();
    require_token(&w, "Bearer t2");
    let (client, fetches) = client_with_counted_tokens(&w, |b| {
        b.retry_count_header(http::HeaderName::from_static("x-retry-count"))
    });
    let policy = CallPolicy::background();
    assert_eq!(policy.retry(), &RetryMode::None);
    let resp =
        w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
            .unwrap()
            .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    assert_eq!(client.token_fetches(), 2);
    let events = w.events();
    assert!(
        scheduled(&events).is_empty(),
        "a replay reports no RetryScheduled"
    );
    assert!(events.iter().any(|e| matches!(
        e.kind,
        EventKind::Succeeded {
            attempt: 2,
            send: 2,
            ..
        }
    )));
    // Lazy fetch 50 ms, 401 at 60 ms, refresh 50 ms, replay leaves at 110 ms.
    assert_eq!(w.sent_at(), [ms(50), ms(110)]);
    // The replay is no retry: like the first send, it carries no retry count.
    let requests = w.transport.requests();
    assert!(
        requests
            .iter()
            .all(|r| r.headers.get("x-retry-count").is_none()),
        "{:?}",
        requests.iter().map(|r| &r.headers).collect::<Vec<_>>()
    );
    w.assert_contract();
}

#[test]
fn a_401_replay_leaves_the_retry_budget_and_the_back_off_where_they_were() {
    // 401 (replayed with a fresh token), then two 503s: both retries are still there,
    // and their back-offs are the first and second of the schedule.
    let w = World::new();
    w.transport.push_many([
        Reply::status(401),
        Reply::status(503),
        Reply::status(503),
        Reply::ok(),
    ]);
    let (client, fetches) = client_with_counted_tokens(&w, |b| b);
    let policy = bounded(2, ms(100)).idempotent(true);
    w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
        .unwrap()
        .expect("two retries remain after the replay");
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    assert_eq!(scheduled(&w.events()), [ms(100), ms(200)]);
    // Fetches take 50 ms: the first send at 50 ms, the replay after the refresh.
    assert_eq!(w.sent_at(), [ms(50), ms(100), ms(200), ms(400)]);
    w.assert_contract();
}

#[test]
fn the_token_sources_own_error_is_reachable_from_the_client_error() {
    #[derive(Debug)]
    struct Revoked(u32);
    impl std::fmt::Display for Revoked {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "credentials {} revoked", self.0)
        }
    }
    impl std::error::Error for Revoked {}

    let w = World::new();
    let client = w
        .builder()
        .auth(token_fn(|| async {
            Err::<(http::HeaderName, HeaderValue), _>(AuthError::from(Revoked(7)))
        }))
        .build()
        .unwrap();
    let err = w.background_error(&client);
    assert_eq!(err.kind(), ErrorKind::Auth);
    let shared = std::error::Error::source(&err)
        .and_then(|s| s.downcast_ref::<SharedAuthError>())
        .expect("a SharedAuthError under an Auth error");
    let revoked = shared.as_error().downcast_ref::<Revoked>();
    assert_eq!(revoked.map(|r| r.0), Some(7));
    assert_eq!(shared.to_string(), "credentials 7 revoked");
    // The short way reaches the same error.
    let direct = err.auth_error().and_then(|e| e.downcast_ref::<Revoked>());
    assert_eq!(direct.map(|r| r.0), Some(7));
}

#[test]
fn auth_error_is_none_for_other_kinds_even_with_a_source() {
    // A refused connection: its source is the transport's error, not a token
    // source's.
    let w = World::new();
    w.transport
        .default_reply(Reply::fail(TransportErrorKind::Connect, "refused"));
    let client = w.builder().build().unwrap();
    let err =
        w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::Transport(TransportErrorKind::Connect)
    );
    assert!(std::error::Error::source(&err).is_some());
    assert!(err.auth_error().is_none(), "{err:?}");
}

#[test]
fn a_refresh_that_fails_after_a_401_is_the_last_failed_event() {
    // The replay's refresh fails: the call ends with Auth, reported as a synthetic
    // unsent pair after the 401's Failed, so the last Failed carries the returned
    // error; the 401 proved the request arrived.
    let w = World::new();
    w.transport.default_reply(Reply::status(401));
    let fetches = Arc::new(AtomicU32::new(0));
    let client = w
        .builder()
        .auth(t1_then_failing_tokens(&fetches))
        .build()
        .unwrap();
    let err = w.background_error(&client);
    assert_eq!(err.kind(), ErrorKind::Auth);
    assert!(!err.nothing_sent());
    // Its source is the source's own error, not the 401 the call had before it
    // (which a refusal with no source of its own would get).
    assert_eq!(
        err.auth_error().map(ToString::to_string).as_deref(),
        Some("identity provider down")
    );
    assert_eq!(
        fetches.load(Ordering::SeqCst),
        2,
        "the first fetch, one refresh"
    );
    // Each fetch reported as it ends: the refresh's failure before the call's.
    assert_eq!(
        w.kinds(),
        [
            "token_fetch_ended",
            "started",
            "failed",
            "token_fetch_ended",
            "started",
            "failed"
        ]
    );
    match &w.events().last().unwrap().kind {
        EventKind::Failed {
            error,
            sent,
            ms,
            send,
            attempt,
        } => {
            assert_eq!((error.kind(), *sent, *ms), (ErrorKind::Auth, false, 0));
            assert_eq!((*send, *attempt), (2, 2));
        }
        other => panic!("{other:?}"),
    }
    w.assert_contract();
}

#[test]
fn a_second_401_is_final() {
    let w = World::new();
    require_token(&w, "never");
    let (client, fetches) = client_with_counted_tokens(&w, |b| b);
    let err =
        w.rt.block_on(client.execute(|h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.status(), Some(StatusCode::UNAUTHORIZED));
    assert_eq!(err.attempts(), 2);
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
}

#[test]
fn a_401_to_a_hop_without_the_credentials_is_final_and_refreshes_nothing() {
    // A redirect crossed origins and the transport dropped the credentials on that
    // hop (reqwest drops `Authorization`), which answered 401: a refresh cannot help.
    // Refreshing on every such call would hammer the token endpoint: each call's
    // 401 is for the current token.
    let w = World::new();
    w.transport
        .default_reply(Reply::status(401).credentials_dropped());
    let (client, fetches) = client_with_counted_tokens(&w, |b| b);
    for call in 1..=3 {
        let err =
            w.rt.block_on(client.execute_with(&bounded(2, ms(100)), |h| h.get("/x")))
                .unwrap()
                .unwrap_err();
        assert_eq!(err.status(), Some(StatusCode::UNAUTHORIZED), "call {call}");
        assert_eq!(err.attempts(), 1, "call {call}");
        assert!(err.credentials_dropped(), "call {call}: {err:?}");
    }
    assert_eq!(fetches.load(Ordering::SeqCst), 1, "the first fetch only");
    assert_eq!(w.transport.requests().len(), 3);
    // The same 401 to a request that carried the token is replayed once, after a
    // refresh.
    w.transport.default_reply(Reply::status(401));
    let err =
        w.rt.block_on(client.execute(|h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.attempts(), 2);
    assert!(!err.credentials_dropped(), "{err:?}");
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    w.assert_contract();
}

#[test]
fn a_401_to_a_hop_a_redirect_led_to_replays_only_an_idempotent_call() {
    // The same origin, credentials kept: a GET replays with a new token; a POST,
    // answered with the redirect before the 401, is not sent again and fetches
    // nothing.
    let w = World::new();
    w.transport
        .respond_with(|req, _| match (req.method().as_str(), bearer(req)) {
            (_, Some("Bearer t1")) => Reply::status(401).answered_by_redirect(),
            _ => Reply::ok(),
        });
    let (client, fetches) = client_with_counted_tokens(&w, |b| b);
    let err =
        w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.post("/orders")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.status(), Some(StatusCode::UNAUTHORIZED));
    assert!(err.answered_by_redirect());
    assert_eq!(
        (w.transport.request_count(), fetches.load(Ordering::SeqCst)),
        (1, 1)
    );
    w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/orders")))
        .unwrap()
        .unwrap();
    assert_eq!(
        tokens_sent(&w, None),
        ["Bearer t1", "Bearer t1", "Bearer t2"]
    );
    w.assert_contract();
}

#[test]
fn sixteen_concurrent_401s_share_one_refresh_and_one_first_fetch() {
    let w = World::new();
    require_token(&w, "Bearer t2");
    let (client, fetches) = client_with_counted_tokens(&w, |b| b.max_parallel(16));
    let calls: Vec<_> = (0..16)
        .map(|_| w.spawn_call(&client, CallPolicy::background(), "/x"))
        .collect();
    w.rt.run().unwrap();
    assert!(calls.into_iter().all(|c| w.rt.block_on(c).unwrap().is_ok()));
    assert_eq!(
        fetches.load(Ordering::SeqCst),
        2,
        "one first fetch, one refresh"
    );
    let requests = w.transport.requests();
    assert_eq!(requests.len(), 32);
    assert!(
        requests[..16]
            .iter()
            .all(|r| r.headers[AUTHORIZATION] == "Bearer t1" && r.at == at(ms(50)))
    );
    assert!(
        requests[16..]
            .iter()
            .all(|r| r.headers[AUTHORIZATION] == "Bearer t2" && r.at == at(ms(110)))
    );
    assert!(
        requests
            .iter()
            .all(|r| r.headers[AUTHORIZATION].is_sensitive())
    );
    w.assert_contract();
}

/// The `Authorization` value of a scripted request.
fn bearer(req: &vantage_api_pool_testkit::ScriptedRequest) -> Option<&str> {
    req.headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
}

/// `n` background GETs of `/x` on `client`, run to the end; every one succeeds.
fn background_gets(w: &World, client: &Client, n: usize) {
    let calls = (0..n)
        .map(|_| w.spawn_call(client, CallPolicy::background(), "/x"))
        .collect();
    all_succeed(w, calls);
}

/// Runs every spawned call to its end and checks that each succeeded.
fn all_succeed<E: std::fmt::Debug>(
    w: &World,
    calls: Vec<vantage_api_pool_testkit::JoinHandle<Result<(), E>>>,
) {
    w.rt.run().unwrap();
    for call in calls {
        w.rt.block_on(call).unwrap().unwrap();
    }
}

/// The tokens the transport saw, in send order, for `path` (all paths: `None`).
fn tokens_sent(w: &World, path: Option<&str>) -> Vec<String> {
    w.transport
        .requests()
        .iter()
        .filter(|r| path.is_none_or(|p| r.path == p))
        .map(|r| r.headers[AUTHORIZATION].to_str().unwrap().to_owned())
        .collect()
}

#[test]
fn a_send_that_waited_for_a_rate_token_goes_out_with_the_newest_token() {
    // Only t2 is accepted. The first send's 401 brings t2 at 110 ms; the other calls
    // picked t1 at the gate, then waited for rate tokens (1/s) past the refresh.
    let w = World::new();
    require_token(&w, "Bearer t2");
    let (client, fetches) = client_with_counted_tokens(&w, |b| b.rate_limit_with_burst(1.0, 1));
    let calls = (0..3)
        .map(|_| w.spawn_call(&client, CallPolicy::background(), "/x"))
        .collect();
    all_succeed(&w, calls);
    // One 401 in all: every send after the refresh carries t2.
    assert_eq!(
        tokens_sent(&w, None),
        ["Bearer t1", "Bearer t2", "Bearer t2", "Bearer t2"]
    );
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    w.assert_contract();
}

#[test]
fn a_send_that_waited_for_a_permit_goes_out_with_the_newest_token() {
    // One permit. P's t1 gets a 401 at 60 ms (refresh: t2 at 110 ms); X1 and X2,
    // built with t1 at 50 ms, queue for the permit. X1 gets it at 60 ms, while the
    // refresh runs: t1 was rejected, so X1 waits for t2 (holding the permit) and
    // sends it at 110 ms; X2 gets the permit at 310 ms and sends t2 too.
    let w = World::new();
    w.transport.respond_with(|req, _| {
        let token = bearer(req);
        match (req.path(), token) {
            ("/x", _) => Reply::ok().after(ms(200)),
            (_, Some("Bearer t2")) => Reply::ok().after(ms(10)),
            _ => Reply::status(401).after(ms(10)),
        }
    });
    let (client, fetches) = client_with_counted_tokens(&w, |b| b.max_parallel(1));
    let calls = ["/p", "/x", "/x"]
        .into_iter()
        .map(|path| w.spawn_call(&client, CallPolicy::background(), path))
        .collect();
    all_succeed(&w, calls);
    assert_eq!(tokens_sent(&w, Some("/x")), ["Bearer t2", "Bearer t2"]);
    assert_eq!(tokens_sent(&w, Some("/p")), ["Bearer t1", "Bearer t2"]);
    let sent_at: Vec<_> = w
        .transport
        .requests()
        .iter()
        .map(|r| r.at.since_origin())
        .collect();
    assert_eq!(sent_at, [ms(50), ms(110), ms(310), ms(510)]);
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    w.assert_contract();
}

#[test]
fn a_queued_send_whose_token_was_rejected_waits_for_the_refresh() {
    // One permit, four calls, each answer after 100 ms; t1 and t2 are refused, t3
    // taken. Every call picks t1 at the gate (50 ms) and queues for the permit.
    // A's t1 is refused at 150 ms (refresh: t2 at 200 ms); B gets the permit then,
    // and its t1 was rejected: it waits for t2 instead of sending t1. B's t2 is
    // refused at 300 ms (t3 at 350 ms); C gets the permit and waits for t3. No
    // request carries a token after a 401 refused it, so every call succeeds, with
    // at most its one replay.
    let w = World::new();
    w.transport.respond_with(|req, _| match bearer(req) {
        Some("Bearer t3") => Reply::ok().after(ms(100)),
        _ => Reply::status(401).after(ms(100)),
    });
    let (client, fetches) = client_with_counted_tokens(&w, |b| b.max_parallel(1));
    let calls = ["/a", "/b", "/c", "/d"]
        .into_iter()
        .map(|path| w.spawn_call(&client, CallPolicy::background(), path))
        .collect();
    all_succeed(&w, calls);
    assert_eq!(
        tokens_sent(&w, None),
        [
            "Bearer t1",
            "Bearer t2",
            "Bearer t3",
            "Bearer t3",
            "Bearer t3",
            "Bearer t3"
        ]
    );
    assert_eq!(fetches.load(Ordering::SeqCst), 3);
    w.assert_contract();
}

type Ended = Result<(), vantage_api_pool::ClientError>;

/// Runs `/a` and `/b`: `/a`, polled by hand at 0 s and 1 s, sends t1 as soon as its
/// fetch lands (and may take in a 401 at 1 s); at 2 s `/b` takes the token then
/// current at the gate, and its request closure runs `during`, handing it what
/// polls `/a` once more, to take in a 401 due by then (on a runtime with threads,
/// another thread may do so just then). Returns how `/a` and `/b` ended once both
/// are done.
fn b_builds_its_request_as_a_takes_its_401<A: vantage_api_pool::TokenSource + 'static>(
    w: &World,
    client: &Client<A>,
    during: impl FnOnce(&mut dyn FnMut()) + 'static,
) -> (Ended, Ended) {
    use std::cell::RefCell;
    use std::future::Future;
    use std::pin::Pin;
    use std::rc::Rc;
    use std::task::{Context, Poll, Waker};

    type Call = Pin<Box<dyn Future<Output = Ended>>>;
    /// `/a`'s future until it ends, then how it ended.
    enum A {
        Running(Call),
        Ended(Ended),
    }
    let a = {
        let client = client.clone();
        let call: Call = Box::pin(async move { client.execute(|h| h.get("/a")).await.map(|_| ()) });
        Rc::new(RefCell::new(Some(A::Running(call))))
    };
    let poll_a = {
        let a = Rc::clone(&a);
        move || {
            let mut cx = Context::from_waker(Waker::noop());
            let mut slot = a.borrow_mut();
            if let Some(A::Running(call)) = slot.as_mut()
                && let Poll::Ready(ended) = call.as_mut().poll(&mut cx)
            {
                *slot = Some(A::Ended(ended));
            }
        }
    };
    poll_a(); // the first fetch starts (or lands at once, and /a sends t1)
    w.rt.run_until(at(secs(1))).unwrap();
    poll_a(); // t1 lands and /a sends it (or /a waits for, or takes in, its answer)
    w.rt.run_until(at(secs(2))).unwrap();

    let b = {
        let client = client.clone();
        let mut first = Some((poll_a, during));
        w.rt.spawn(async move {
            let build = |h: &vantage_api_pool_testkit::ScriptedHttp| {
                if let Some((mut poll_a, during)) = first.take() {
                    during(&mut poll_a);
                }
                h.get("/b")
            };
            client.execute(build).await.map(|_| ())
        })
    };
    // /a, from then on, runs as a task of its own.
    let a = w.rt.spawn(async move {
        let slot = a.borrow_mut().take();
        match slot.expect("/a") {
            A::Running(call) => call.await,
            A::Ended(ended) => ended,
        }
    });
    w.rt.run_until(at(secs(10))).unwrap();
    (w.rt.block_on(a).unwrap(), w.rt.block_on(b).unwrap())
}

/// [`b_builds_its_request_as_a_takes_its_401`] where `/b`'s request closure first
/// has a `refresh_token()` bring a newer token (at once), then lets `/a` take in its
/// 401.
fn b_builds_its_request_as_a_refresh_and_a_401_come<A: vantage_api_pool::TokenSource + 'static>(
    w: &World,
    client: &Client<A>,
) -> (Ended, Ended) {
    let during = {
        let client = client.clone();
        move |poll_a: &mut dyn FnMut()| {
            refresh_at_once(&client, true);
            poll_a();
        }
    };
    b_builds_its_request_as_a_takes_its_401(w, client, during)
}

/// [`sent_tokens`], in time order (then by path).
fn sent_tokens_sorted(w: &World) -> Vec<(Duration, String, String)> {
    let mut sent_by = sent_tokens(w);
    sent_by.sort();
    sent_by
}

/// Polls `client.refresh_token()` once, which must end at once: `Ok` or not as
/// `succeeds` says.
fn refresh_at_once<A: vantage_api_pool::TokenSource>(client: &Client<A>, succeeds: bool) {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    let mut refresh = Box::pin(client.refresh_token());
    match refresh
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(result) => assert_eq!(result.is_ok(), succeeds, "{result:?}"),
        Poll::Pending => panic!("a fetch that ends at once"),
    }
}

#[test]
fn a_token_another_calls_401_rejects_while_the_request_closure_runs_never_goes_out() {
    // Tokens t1, t2 (fetches take 1 s); t1 is answered 401 after 1 s. /a sends t1
    // at 1 s; /b's request closure lets /a take in its 401 at 2 s: t1 is rejected
    // before /b's request leaves. /b must not send it (it would only be answered
    // 401, and spend /b's one replay): it goes back through the gate, waits for
    // /a's refresh, and sends t2 at 3 s.
    let w = World::new();
    t1_refused_after(&w, secs(1));
    let (client, fetches) = with_tokens_living(&w, secs(3_600), secs(1), None, |b| b);
    // /a takes in its 401 and starts the refresh.
    let (a, b) = b_builds_its_request_as_a_takes_its_401(&w, &client, |poll_a| poll_a());
    a.unwrap();
    b.unwrap();
    assert_eq!(
        sent_tokens_sorted(&w),
        [
            sent(secs(1), "/a", "t1"),
            sent(secs(3), "/a", "t2"),
            sent(secs(3), "/b", "t2"),
        ]
    );
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    w.assert_contract();
}

#[test]
fn a_token_a_401_rejected_never_goes_out_once_a_newer_one_is_at_hand() {
    // As above, with fetches that end at once (/a sends t1 at 0 s, answered 401
    // after 2 s), and a `refresh_token()` (a timer task's, say) in /b's request
    // closure besides /a's 401 for t1. /b, built with t1, must go back through the
    // gate and send t2 either way:
    // - /a's 401 first (its refresh brings t2), then the refresh_token fails: a
    //   failed fetch puts the cached token (t2) back in use, and nothing older
    //   (every failed fetch used to take back every rejection);
    // - the refresh_token first (it brings t2), then /a's 401 for t1, already
    //   replaced: that 401 refuses t1 too (it used to refuse nothing, as t2 was at
    //   hand).
    // Before either fix /b sent t1 at 2 s, drew a 401 and spent its replay on it.
    for refresh_first in [false, true] {
        let w = World::new();
        // Answered in 10 ms: /a, sending t2 while polled by hand, is still pending.
        reply_by_path_and_token(&w, |_, token| match token {
            "Bearer t1" => Reply::status(401).after(secs(2)),
            _ => Reply::ok().after(ms(10)),
        });
        let (client, fetches) = with_tokens_living(&w, secs(3_600), Duration::ZERO, Some(3), |b| b);
        let during = {
            let client = client.clone();
            move |poll_a: &mut dyn FnMut()| {
                if !refresh_first {
                    poll_a(); // /a takes in its 401: t2 comes at once; /a sends it
                }
                // Fetch 3 fails, fetch 2 brings t2.
                refresh_at_once(&client, refresh_first);
                if refresh_first {
                    poll_a(); // /a takes in its 401 and sends t2
                }
            }
        };
        let (a, b) = b_builds_its_request_as_a_takes_its_401(&w, &client, during);
        a.unwrap();
        b.unwrap();
        let expected = [
            sent(Duration::ZERO, "/a", "t1"),
            sent(secs(2), "/a", "t2"),
            sent(secs(2), "/b", "t2"),
        ];
        assert_eq!(
            sent_tokens_sorted(&w),
            expected,
            "refresh_token first: {refresh_first}"
        );
        let expected_fetches = if refresh_first { 2 } else { 3 };
        assert_eq!(fetches.load(Ordering::SeqCst), expected_fetches);
        w.assert_contract();
    }
}

#[test]
fn a_final_401_for_a_token_already_replaced_refuses_it_too() {
    // Fetches end at once; t1 and t2 are answered 401 after 1 s. /a sends t1 at
    // 0 s, takes its 401 at 1 s and replays with t2. At 2 s /b takes t2 at the
    // gate; in its request closure a `refresh_token()` brings t3, then /a takes in
    // its second, final 401, for t2. That 401 starts no refresh, but t2 has been
    // replaced: it refuses t2, and /b goes back through the gate and sends t3
    // (it sent t2, drew a 401 and spent its replay on it; from an outside review).
    let w = World::new();
    reply_by_path_and_token(&w, |_, token| match token {
        "Bearer t1" | "Bearer t2" => Reply::status(401).after(secs(1)),
        _ => Reply::ok().after(ms(10)),
    });
    let (client, fetches) = with_tokens_living(&w, secs(3_600), Duration::ZERO, None, |b| b);
    let (a, b) = b_builds_its_request_as_a_refresh_and_a_401_come(&w, &client);
    assert_eq!(
        a.map_err(|e| e.kind()),
        Err(ErrorKind::Status(StatusCode::UNAUTHORIZED))
    );
    b.unwrap();
    assert_eq!(
        sent_tokens_sorted(&w),
        [
            sent(Duration::ZERO, "/a", "t1"),
            sent(secs(1), "/a", "t2"),
            sent(secs(2), "/b", "t3"),
        ]
    );
    assert_eq!(fetches.load(Ordering::SeqCst), 3);
    w.assert_contract();
}

#[test]
fn a_401_replay_that_waited_on_a_failed_fetch_refuses_its_token_once_replaced() {
    // t1 comes at once; fetch 2, a `refresh_token()` at 500 ms, takes 1 s and
    // fails; fetch 3 brings t3 at once. /a sends t1 at 0 s; its 401 at 1 s waits
    // for fetch 2, whose failure at 1.5 s takes t1's rejection back (t1 is the
    // cached token again). At 2 s /b takes t1 at the gate; in its request closure
    // a `refresh_token()` brings t3 before /a looks again: /a's replay finds t1
    // replaced, refuses it, and sends t3, and /b goes back through the gate and
    // sends t3 too, not t1.
    let w = World::new();
    reply_by_path_and_token(&w, |_, token| match token {
        "Bearer t1" => Reply::status(401).after(secs(1)),
        _ => Reply::ok().after(ms(10)),
    });
    let rt = w.rt.clone();
    let fetches = Arc::new(AtomicU32::new(0));
    let counter = Arc::clone(&fetches);
    let client = w
        .builder()
        .auth(token_fn(move || {
            let rt = rt.clone();
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                if n == 2 {
                    rt.sleep(secs(1)).await;
                    return Err(AuthError::from("identity provider down"));
                }
                AuthToken::bearer(&format!("t{n}"))
            }
        }))
        .build()
        .unwrap();
    let refresh = {
        let (client, rt) = (client.clone(), w.rt.clone());
        w.rt.spawn(async move {
            rt.sleep(ms(500)).await;
            client.refresh_token().await
        })
    };
    let (a, b) = b_builds_its_request_as_a_refresh_and_a_401_come(&w, &client);
    assert!(w.rt.block_on(refresh).unwrap().is_err());
    a.unwrap();
    b.unwrap();
    assert_eq!(
        sent_tokens_sorted(&w),
        [
            sent(Duration::ZERO, "/a", "t1"),
            sent(secs(2), "/a", "t3"),
            sent(secs(2), "/b", "t3"),
        ]
    );
    assert_eq!(fetches.load(Ordering::SeqCst), 3);
    w.assert_contract();
}

#[test]
fn a_401_replay_never_gets_a_token_that_another_401_rejected() {
    // Tokens come 50 ms after they are asked for; only t3 is accepted.
    //   0 ms: A fetches t1 and sends it at 50 ms to a slow endpoint (401 at 230 ms).
    // 100 ms: B's t1 gets a 401; the refresh brings t2; B's replay with it: 401.
    // 200 ms: C sends t2: 401 at 210 ms, which starts the refresh to t3 (260 ms).
    // 230 ms: A's 401 for t1 arrives while t2, rejected, is still current: A must
    //         wait for t3, not replay with t2.
    let w = World::new();
    w.transport.respond_with(|req, _| {
        let token = bearer(req);
        let delay = if req.path() == "/slow" {
            ms(180)
        } else {
            ms(10)
        };
        match token {
            Some("Bearer t3") => Reply::ok().after(ms(10)),
            _ => Reply::status(401).after(delay),
        }
    });
    let (client, fetches) = client_with_counted_tokens(&w, |b| b);
    let call_at = |start, path| w.background_call_at(&client, start, path);
    let a = call_at(Duration::ZERO, "/slow");
    let b = call_at(ms(100), "/b");
    let c = call_at(ms(200), "/c");
    w.rt.run().unwrap();
    let unauthorized = ErrorKind::Status(StatusCode::UNAUTHORIZED);
    assert_eq!(
        w.rt.block_on(b).unwrap(),
        Err(unauthorized),
        "B: t1, then t2"
    );
    assert_eq!(w.rt.block_on(c).unwrap(), Ok(()));
    assert_eq!(w.rt.block_on(a).unwrap(), Ok(()), "A replays with t3");
    assert_eq!(tokens_sent(&w, Some("/slow")), ["Bearer t1", "Bearer t3"]);
    assert_eq!(fetches.load(Ordering::SeqCst), 3);
    w.assert_contract();
}

#[test]
fn when_the_refresh_after_a_401_fails_other_calls_still_use_the_cached_token() {
    // t1 is good for /x; /admin answers 401 to any token. After the first fetch the
    // identity provider is down.
    let w = World::new();
    w.transport
        .respond_with(|req, _| match (req.path(), bearer(req)) {
            ("/x", Some("Bearer t1")) => Reply::ok().after(ms(10)),
            _ => Reply::status(401).after(ms(10)),
        });
    let fetches = Arc::new(AtomicU32::new(0));
    let client = w
        .builder()
        .auth(t1_then_failing_tokens(&fetches))
        .build()
        .unwrap();
    let admin =
        w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/admin")))
            .unwrap()
            .unwrap_err();
    assert_eq!(admin.kind(), ErrorKind::Auth);
    // The failed refresh leaves t1 usable: calls that just need a token send it.
    let calls = (0..3)
        .map(|_| w.spawn_call(&client, CallPolicy::essential(), "/x"))
        .collect();
    all_succeed(&w, calls);
    assert_eq!(
        fetches.load(Ordering::SeqCst),
        2,
        "the first fetch and one refresh"
    );
    assert_eq!(
        tokens_sent(&w, Some("/x")),
        ["Bearer t1", "Bearer t1", "Bearer t1"]
    );
    w.assert_contract();
}

/// Spawns `client.refresh_token()` on the driver.
fn spawn_refresh<A: vantage_api_pool::TokenSource + 'static>(
    w: &World,
    client: &Client<A>,
) -> vantage_api_pool_testkit::JoinHandle<Result<(), vantage_api_pool::auth::SharedAuthError>> {
    let client = client.clone();
    w.rt.spawn(async move { client.refresh_token().await })
}

#[test]
fn refresh_token_fetches_a_new_token_while_the_one_in_use_stays_in_use() {
    // Fetches take 1 s. The first call fetches t1 and sends at 1 s. A refresh asked
    // at 1 s runs until 2 s; a call made meanwhile sends t1 at once, one made after
    // it sends t2, and nobody met a 401.
    let w = World::new();
    let (client, fetches) = client_with_slow_tokens(&w, secs(1));
    w.rt.block_on(client.execute(|h| h.get("/x")))
        .unwrap()
        .unwrap();
    let refresh = spawn_refresh(&w, &client);
    let during = w.spawn_call(&client, CallPolicy::background(), "/x");
    w.rt.run_for(ms(500)).unwrap();
    assert!(during.is_finished() && !refresh.is_finished());
    w.rt.run().unwrap();
    assert!(w.rt.block_on(refresh).unwrap().is_ok());
    assert_eq!(w.now(), secs(2));
    w.rt.block_on(client.execute(|h| h.get("/x")))
        .unwrap()
        .unwrap();
    assert_eq!(
        tokens_sent(&w, None),
        ["Bearer t1", "Bearer t1", "Bearer t2"]
    );
    assert_eq!(w.sent_at(), [secs(1), secs(1), secs(2)]);
    assert_eq!(
        (fetches.load(Ordering::SeqCst), client.token_fetches()),
        (2, 2)
    );
    w.assert_contract();
}

#[test]
fn refresh_token_joins_a_running_fetch_and_a_401_joins_a_refresh() {
    // A refresh asked while the first fetch runs joins it: one fetch, both end at
    // 50 ms.
    let w = World::new();
    require_token(&w, "Bearer t2");
    let (client, fetches) = client_with_counted_tokens(&w, |b| b);
    let call = w.spawn_call(&client, CallPolicy::background(), "/x");
    let refresh = spawn_refresh(&w, &client);
    w.rt.run_for(ms(50)).unwrap();
    assert!(refresh.is_finished());
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
    // The call sent t1 at 50 ms and meets a 401 at 60 ms; a refresh asked at 50 ms
    // (fetching t2 until 100 ms) serves its replay: still two fetches in all.
    let refresh = spawn_refresh(&w, &client);
    all_succeed(&w, vec![call]);
    assert!(w.rt.block_on(refresh).unwrap().is_ok());
    assert_eq!(tokens_sent(&w, None), ["Bearer t1", "Bearer t2"]);
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    assert_eq!(w.sent_at(), [ms(50), ms(100)]);
    w.assert_contract();
}

#[test]
fn a_failed_refresh_token_returns_the_error_and_the_token_in_use_stays() {
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let fetches = Arc::new(AtomicU32::new(0));
    let client = w
        .builder()
        .auth(t1_then_failing_tokens(&fetches))
        .build()
        .unwrap();
    w.rt.block_on(client.execute(|h| h.get("/x")))
        .unwrap()
        .unwrap();
    let err = w.rt.block_on(client.refresh_token()).unwrap().unwrap_err();
    assert_eq!(err.to_string(), "identity provider down");
    w.rt.block_on(client.execute(|h| h.get("/x")))
        .unwrap()
        .unwrap();
    assert_eq!(tokens_sent(&w, None), ["Bearer t1", "Bearer t1"]);
    assert_eq!(fetches.load(Ordering::SeqCst), 2);

    // Without a token source there is nothing to refresh, and it says so.
    let plain = w.client();
    let err = w.rt.block_on(plain.refresh_token()).unwrap().unwrap_err();
    assert!(err.to_string().contains("no token source"), "{err}");
    assert_eq!(plain.token_fetches(), 0);
}

#[test]
fn a_refresh_that_joined_a_fetch_reports_the_token_that_landed_not_a_later_failure() {
    // t1 at once, t2 after 1 s, later fetches fail. R0 starts the t2 fetch, R joins
    // it; at 1 s, as t2 lands, D asks for a refresh of its own, which fails before R
    // looks again. R waited for t2, which landed: Ok (an outside review found R
    // reporting D's failure).
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let fetches = Arc::new(AtomicU32::new(0));
    let (rt, counter) = (w.rt.clone(), Arc::clone(&fetches));
    let client = w
        .builder()
        .auth(token_fn(move || {
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            let rt = rt.clone();
            async move {
                match n {
                    1 => {}
                    2 => rt.sleep(secs(1)).await,
                    _ => return Err(AuthError::from("identity provider down")),
                }
                Ok::<_, AuthError>((
                    AUTHORIZATION,
                    HeaderValue::from_str(&format!("Bearer t{n}")).unwrap(),
                ))
            }
        }))
        .build()
        .unwrap();
    w.rt.block_on(client.execute(|h| h.get("/x")))
        .unwrap()
        .unwrap();
    let r0 = spawn_refresh(&w, &client);
    w.rt.run_until_idle().unwrap();
    let r = spawn_refresh(&w, &client);
    w.rt.run_until_idle().unwrap();
    let d = {
        let (client, rt) = (client.clone(), w.rt.clone());
        w.rt.spawn(async move {
            rt.sleep(secs(1)).await;
            client.refresh_token().await
        })
    };
    w.rt.run().unwrap();
    let outcome = |handle: vantage_api_pool_testkit::JoinHandle<Result<(), SharedAuthError>>| {
        w.rt.block_on(handle).unwrap().map_err(|e| e.to_string())
    };
    assert_eq!(outcome(r0), Ok(()));
    assert_eq!(outcome(d), Err("identity provider down".to_owned()));
    assert_eq!(outcome(r), Ok(()), "R waited for t2, which landed");
    assert_eq!(fetches.load(Ordering::SeqCst), 3);
    w.rt.block_on(client.execute(|h| h.get("/x")))
        .unwrap()
        .unwrap();
    assert_eq!(tokens_sent(&w, None), ["Bearer t1", "Bearer t2"]);
}

#[test]
fn a_dropped_refresh_token_abandons_its_fetch_and_the_next_one_fetches_again() {
    let w = World::new();
    let (client, fetches) = client_with_slow_tokens(&w, secs(1));
    let refresh = spawn_refresh(&w, &client);
    w.rt.run_for(ms(500)).unwrap();
    refresh.abort();
    w.rt.run_until_idle().unwrap();
    // A call now starts a fetch of its own (t2) rather than waiting for nothing.
    w.rt.block_on(client.execute(|h| h.get("/x")))
        .unwrap()
        .unwrap();
    assert_eq!(tokens_sent(&w, None), ["Bearer t2"]);
    assert!(w.rt.block_on(client.refresh_token()).unwrap().is_ok());
    assert_eq!(fetches.load(Ordering::SeqCst), 3);
    assert_eq!(w.rt.pending_timers(), 0);
}

#[test]
fn callers_that_waited_on_a_failed_refresh_fall_back_to_the_cached_token() {
    // t1 is good for /x; /a and /b answer 401 to anything. The first fetch is at
    // once; every later fetch fails after 50 ms.
    let w = World::new();
    w.transport
        .respond_with(|req, _| match (req.path(), bearer(req)) {
            ("/x", Some("Bearer t1")) => Reply::ok().after(ms(10)),
            _ => Reply::status(401).after(ms(10)),
        });
    let fetches = Arc::new(AtomicU32::new(0));
    let (counter, rt) = (Arc::clone(&fetches), w.rt.clone());
    let client = w
        .builder()
        .auth(token_fn(move || {
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            let rt = rt.clone();
            async move {
                if n == 1 {
                    return Ok((AUTHORIZATION, HeaderValue::from_static("Bearer t1")));
                }
                rt.sleep(ms(50)).await;
                Err(AuthError::from("identity provider down"))
            }
        }))
        .build()
        .unwrap();
    w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
        .unwrap()
        .unwrap();
    let call_at = |start, path| w.background_call_at(&client, start, path);
    // 10 ms: A's and B's t1 get 401s; A refreshes (fails at 70 ms), B waits.
    // 40 ms: E only needs a token and waits for that refresh too.
    // 100 ms: C comes after it all.
    let calls = [
        call_at(Duration::ZERO, "/a"),
        call_at(Duration::ZERO, "/b"),
        call_at(ms(40), "/x"),
        call_at(ms(100), "/x"),
    ];
    w.rt.run().unwrap();
    let results: Vec<_> = calls
        .into_iter()
        .map(|call| w.rt.block_on(call).unwrap())
        .collect();
    assert_eq!(
        results,
        [Err(ErrorKind::Auth), Err(ErrorKind::Auth), Ok(()), Ok(())]
    );
    assert_eq!(fetches.load(Ordering::SeqCst), 2, "one refresh, shared");
    w.assert_contract();
}

#[test]
fn a_newer_token_under_another_header_is_not_added_to_a_waiting_request() {
    // As in the permit test above, but the refresh comes under another header. A
    // waiting request cannot drop its t1, which the 401 rejected, nor carry the new
    // token beside it: it goes back through the gate and is built afresh, with the
    // new token under its name (replacing a header of that name the caller set), so
    // nothing goes out with t1 after its 401. The same for requests that wait for a
    // rate token (1/s) instead of the permit, also when another fetch (a
    // `refresh_token()` at 500 ms) fails while they wait: that puts k2 back in use,
    // not t1.
    let cases = [
        (None, false, false),
        (Some("app"), false, false),
        (None, true, false),
        (None, true, true),
    ];
    for (own_key, rate, failed_fetch) in cases {
        let w = World::new();
        let api_key = http::HeaderName::from_static("x-api-key");
        w.transport
            .respond_with(|req, _| match (req.path(), bearer(req)) {
                ("/x", _) => Reply::ok().after(ms(200)),
                (_, None) => Reply::ok().after(ms(10)),
                _ => Reply::status(401).after(ms(10)),
            });
        let counter = Arc::new(AtomicU32::new(0));
        let (rt, header) = (w.rt.clone(), api_key.clone());
        let builder = if rate {
            w.builder().rate_limit_with_burst(1.0, 1)
        } else {
            w.builder().max_parallel(1)
        };
        let client = builder
            .auth(token_fn(move || {
                let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                let (rt, header) = (rt.clone(), header.clone());
                async move {
                    rt.sleep(ms(50)).await;
                    match n {
                        1 => Ok((AUTHORIZATION, HeaderValue::from_static("Bearer t1"))),
                        2 => Ok((header, HeaderValue::from_static("k2"))),
                        _ => Err(AuthError::from("identity provider down")),
                    }
                }
            }))
            .build()
            .unwrap();
        let mut calls = vec![w.spawn_call(&client, CallPolicy::background(), "/p")];
        for _ in 0..2 {
            let (client, api_key) = (client.clone(), api_key.clone());
            calls.push(w.rt.spawn(async move {
                client
                    .execute_with(&CallPolicy::background(), |h| match own_key {
                        Some(key) => h.get("/x").header(api_key.clone(), key),
                        None => h.get("/x"),
                    })
                    .await
                    .map(|_| ())
            }));
        }
        if failed_fetch {
            w.rt.run_until(at(ms(500))).unwrap();
            let client = client.clone();
            let refresh = w.rt.spawn(async move { client.refresh_token().await });
            w.rt.run().unwrap();
            assert!(w.rt.block_on(refresh).unwrap().is_err());
        }
        all_succeed(&w, calls);
        let x: Vec<_> = w
            .transport
            .requests()
            .into_iter()
            .filter(|r| r.path == "/x")
            .collect();
        assert_eq!(x.len(), 2);
        if rate {
            // Both waited past the refresh (at 110 ms) for their tokens.
            assert!(x.iter().all(|r| r.at.since_origin() >= secs(1)), "{x:?}");
        }
        for request in x {
            assert_eq!(request.headers.get(AUTHORIZATION), None, "{request:?}");
            assert_eq!(request.headers[&api_key], "k2", "{request:?}");
        }
        w.assert_contract();
    }
}

#[test]
fn a_token_put_on_a_waiting_request_is_judged_by_its_own_expiry_at_the_next_look() {
    // t1 has no lifetime; the refresh at 100 ms brings t2, which lives 850 ms (later
    // tokens 10 s). B, built with t1, waits for the permit (A holds it until 900 ms),
    // takes t2 there, then waits for the rate token (1/s) until 1 s, when t2 has
    // expired. The look
    // after the rate wait must start from t2, not from t1: from t1 it finds nothing
    // newer that is still valid, judges the request by t1 (never expires), and sends
    // it with t2, 50 ms after t2 expired. B goes back through the gate instead, and
    // goes out with t3 at the next rate token (2 s).
    let w = World::new();
    w.transport.push(Reply::ok().after(ms(900)));
    w.transport.default_reply(Reply::ok());
    let counter = Arc::new(AtomicU32::new(0));
    let source = token_fn(move || {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            let token = AuthToken::bearer(&format!("t{n}"))?;
            Ok::<_, AuthError>(match n {
                1 => token,
                2 => token.expires_in(ms(850)),
                _ => token.expires_in(secs(10)),
            })
        }
    });
    let client = w
        .builder()
        .max_parallel(1)
        .rate_limit_with_burst(1.0, 1)
        .auth(source)
        .build()
        .unwrap();
    let policy = CallPolicy::background()
        .with_attempt_timeout(secs(2))
        .unwrap()
        .with_budget(Some(secs(5)))
        .unwrap();
    let a = w.spawn_call(&client, policy.clone(), "/a");
    let b = w.spawn_call(&client, policy, "/b");
    let (refresher, rt) = (client.clone(), w.rt.clone());
    let refresh = w.rt.spawn(async move {
        rt.sleep(ms(100)).await;
        refresher.refresh_token().await
    });
    all_succeed(&w, vec![a, b]);
    w.rt.block_on(refresh).unwrap().unwrap();
    let sent: Vec<_> = w
        .transport
        .requests()
        .iter()
        .map(|r| {
            (
                r.path.clone(),
                r.at.since_origin(),
                r.headers[AUTHORIZATION].clone(),
            )
        })
        .collect();
    assert_eq!(sent.len(), 2, "{sent:?}");
    let (path, at, token) = &sent[1];
    assert_eq!(path, "/b");
    assert_eq!(*at, secs(2), "B waited for two rate tokens: {sent:?}");
    assert_eq!(
        token, "Bearer t3",
        "B went out at {at:?}; t2 expired at 950 ms: {sent:?}"
    );
    w.assert_contract();
}

#[test]
fn a_dropped_fetching_caller_hands_the_fetch_to_a_waiter() {
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let (client, fetches) = client_with_counted_tokens(&w, |b| b);
    let first = w.spawn_call(&client, CallPolicy::background(), "/x");
    let second = w.spawn_call(&client, CallPolicy::background(), "/x");
    w.rt.run_until(at(ms(20))).unwrap();
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
    first.abort();
    w.rt.run().unwrap();
    assert!(w.rt.block_on(second).unwrap().is_ok());
    assert_eq!(fetches.load(Ordering::SeqCst), 2, "the waiter took over");
    assert_eq!(w.sent_at(), [ms(70)]);
}

/// A client that answers 200 to a request, over a token source whose fetches take
/// `delay`; returns it with the fetch counter.
fn client_with_slow_tokens(
    w: &World,
    delay: Duration,
) -> (
    Client<impl vantage_api_pool::TokenSource + use<>>,
    Arc<AtomicU32>,
) {
    w.transport.default_reply(Reply::ok());
    let fetches = Arc::new(AtomicU32::new(0));
    let client = w
        .builder()
        .auth(counting_tokens_after(&w.rt, &fetches, delay))
        .build()
        .unwrap();
    (client, fetches)
}

#[test]
fn a_token_source_slower_than_the_attempt_timeout_still_delivers() {
    // The attempt timeout limits sends, not the token wait: a 1.5 s source under a
    // 1 s attempt timeout (no budget), and a 15 s one within `execute`'s 30 s
    // budget, each deliver with one fetch.
    let w = World::new();
    let (client, fetches) = client_with_slow_tokens(&w, ms(1500));
    let policy = CallPolicy::essential()
        .with_attempt_timeout(secs(1))
        .unwrap();
    w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
        .unwrap()
        .unwrap();
    assert_eq!(w.sent_at(), [ms(1500)]);
    assert_eq!(fetches.load(Ordering::SeqCst), 1);

    let w = World::new();
    let (client, fetches) = client_with_slow_tokens(&w, secs(15));
    w.rt.block_on(client.execute(|h| h.get("/x")))
        .unwrap()
        .unwrap();
    assert_eq!(w.sent_at(), [secs(15)]);
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
}

#[test]
fn a_token_wait_ends_with_the_budget() {
    let w = World::new();
    let (client, _) = client_with_slow_tokens(&w, secs(60));
    let err =
        w.rt.block_on(client.execute(|h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert_eq!(w.now(), secs(30));
    assert_eq!(w.transport.request_count(), 0);
    // The fetch it gave up, then its refusal.
    assert_eq!(w.kinds(), ["token_fetch_ended", "started", "failed"]);
    w.assert_contract();
}

#[test]
fn a_401_whose_body_ends_the_budget_starts_no_refresh() {
    // Token at 50 ms, the 401's head at 150 ms, then its body stalls until the send's
    // time limit, the end of the 1 s budget: the replay finds no time left and fetches
    // nothing (a fetch polled once and then dropped would still reach the endpoint).
    let w = World::new();
    w.transport.push(
        Reply::status(401)
            .body("denied")
            .body_stalls_after(2)
            .after(ms(100)),
    );
    let (client, fetches) = client_with_counted_tokens(&w, |b| b);
    let err =
        w.rt.block_on(
            client.execute_with(&bounded_within(3, ms(10), secs(1), secs(1)), |h| {
                h.get("/x")
            }),
        )
        .unwrap()
        .unwrap_err();
    assert_eq!(
        fetches.load(Ordering::SeqCst),
        1,
        "a refresh started after the budget"
    );
    assert_eq!(client.token_fetches(), 1);
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert_eq!(err.time_limit(), Some(TimeLimit::Budget));
    assert_eq!(w.now(), secs(1));
    assert_eq!(w.transport.request_count(), 1);
    // The first token's fetch, then no other.
    assert_eq!(
        w.kinds(),
        [
            "token_fetch_ended",
            "started",
            "failed",
            "started",
            "failed"
        ]
    );
    w.assert_contract();
}

#[test]
fn a_token_source_error_is_final_with_a_synthetic_pair() {
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let client = w
        .builder()
        .auth(token_fn(|| async {
            Err::<(http::HeaderName, HeaderValue), AuthError>("identity provider down".into())
        }))
        .build()
        .unwrap();
    let err =
        w.rt.block_on(client.execute_with(&CallPolicy::essential(), |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Auth);
    assert_eq!(err.attempts(), 0);
    assert!(!err.is_retryable());
    assert_eq!(w.transport.request_count(), 0);
    assert_eq!(w.kinds(), ["token_fetch_ended", "started", "failed"]);
    assert!(matches!(
        w.events()[2].kind,
        EventKind::Failed {
            sent: false,
            ms: 0,
            ..
        }
    ));
    assert_eq!(
        std::error::Error::source(&err).unwrap().to_string(),
        "identity provider down"
    );
}

/// A client of `w` whose token source always gives `name: value`.
fn with_token(
    w: &World,
    name: http::HeaderName,
    value: &'static str,
) -> Client<impl vantage_api_pool::TokenSource + use<>> {
    let token = (name, HeaderValue::from_static(value));
    w.builder()
        .auth(token_fn(move || {
            let token = token.clone();
            async move { Ok::<_, AuthError>(token) }
        }))
        .build()
        .unwrap()
}

#[test]
fn a_token_under_a_framing_header_or_with_an_empty_value_is_an_auth_error() {
    use http::HeaderName;
    use vantage_api_pool::auth::RESERVED_TOKEN_HEADERS;
    let cases = [
        (http::header::HOST, "evil.example"),
        (http::header::CONTENT_LENGTH, "999"),
        (http::header::EXPECT, "100-continue"),
        (HeaderName::from_static("idempotency-key"), "k"),
        (AUTHORIZATION, ""),
        (AUTHORIZATION, "  "),
    ];
    for (name, value) in cases {
        assert_eq!(
            RESERVED_TOKEN_HEADERS.contains(&name),
            !value.trim().is_empty(),
            "{name}"
        );
        let w = World::new();
        w.transport.default_reply(Reply::ok());
        let client = with_token(&w, name.clone(), value);
        let err = w.background_error(&client);
        assert_eq!(err.kind(), ErrorKind::Auth, "{name}: {value:?}");
        assert_eq!(w.transport.request_count(), 0, "{name}: {value:?}");
        let reason = std::error::Error::source(&err).unwrap().to_string();
        assert!(reason.contains(name.as_str()), "{reason}");
    }
    // A credential in a cookie, or under a header of the API's own, goes out.
    for name in [http::header::COOKIE, HeaderName::from_static("x-api-key")] {
        let w = World::new();
        w.transport.default_reply(Reply::ok());
        let client = with_token(&w, name.clone(), "session=s3cr3t");
        w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
            .unwrap()
            .unwrap();
        assert_eq!(
            w.transport.requests()[0].headers[&name],
            "session=s3cr3t",
            "{name}"
        );
    }
}

#[test]
fn the_token_replaces_a_header_of_its_name_the_closure_set() {
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let client = with_token(&w, AUTHORIZATION, "Bearer from-the-source");
    w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| {
        h.get("/x")
            .header(AUTHORIZATION, "Bearer from-the-closure")
            .header(AUTHORIZATION, "Basic second-line")
            .header("x-other", "kept")
    }))
    .unwrap()
    .unwrap();
    let sent = &w.transport.requests()[0].headers;
    let auth: Vec<_> = sent.get_all(AUTHORIZATION).iter().collect();
    assert_eq!(auth, ["Bearer from-the-source"]);
    assert_eq!(sent["x-other"], "kept");
}

#[test]
fn the_token_never_appears_in_events_errors_or_debug() {
    let w = World::new();
    require_token(&w, "never");
    let secret = "Bearer s3cr3t-canary";
    let client = w
        .builder()
        .auth(token_fn(move || async move {
            Ok::<_, AuthError>((AUTHORIZATION, HeaderValue::from_static(secret)))
        }))
        .build()
        .unwrap();
    let err =
        w.rt.block_on(client.execute(|h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    let printed = format!("{err} {err:?} {:?} {client:?}", w.events());
    assert!(!printed.contains("s3cr3t"), "{printed}");
}

#[test]
fn invalid_settings_are_refused_by_build_with_the_setting_named() {
    let w = World::new();
    let refused = |b: vantage_api_pool::ClientBuilder<_, _>| b.build().unwrap_err().setting();
    assert_eq!(refused(w.builder().max_parallel(0)), "max_parallel");
    let too_many = vantage_api_pool::concurrency::MAX_PERMITS + 1;
    assert_eq!(refused(w.builder().max_parallel(too_many)), "max_parallel");
    assert_eq!(
        refused(w.builder().max_parallel(usize::MAX)),
        "max_parallel"
    );
    let most = vantage_api_pool::concurrency::MAX_PERMITS;
    assert!(w.builder().max_parallel(most).build().is_ok());
    for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert_eq!(
            refused(w.builder().rate_limit(rate)),
            "rate_limit",
            "{rate}"
        );
    }
    assert_eq!(
        refused(w.builder().rate_limit_with_burst(5.0, 0)),
        "rate_limit.burst"
    );
    // A burst that would take centuries to refill does not fit the bucket's clock.
    assert_eq!(
        refused(w.builder().rate_limit_with_burst(1e-9, 20)),
        "rate_limit"
    );
    assert_eq!(
        refused(w.builder().breaker(0, secs(5), secs(60))),
        "breaker.threshold"
    );
    assert_eq!(
        refused(w.builder().breaker(5, Duration::ZERO, secs(60))),
        "breaker.cooldown"
    );
    assert_eq!(
        refused(w.builder().breaker(5, secs(61), secs(60))),
        "breaker.cooldown"
    );
    let bad_retry = vantage_api_pool::RetryPolicy {
        max_retries: 1,
        base: secs(2),
        max: secs(1),
    };
    assert_eq!(
        refused(w.builder().default_retry(bad_retry)),
        "default_retry.max"
    );
}

/// The stale-probe scenario: the breaker opens at 1 ms (cooldown 5 s). At 5.1 s a
/// call is granted the probe, then waits for a rate token until 6 s. Meanwhile
/// answers to two older sends close the breaker (5.5 s) and open it again (5.7 s,
/// until 10.7 s). Returns the call's result and when `/probe` went out.
fn probe_granted_then_closed_and_reopened_while_it_waits(
    policy: CallPolicy,
) -> (Result<(), ErrorKind>, Vec<Duration>, Vec<Duration>) {
    let w = World::new();
    w.transport
        .on_path("/slow-ok", [Reply::ok().after(ms(5_500))]);
    w.transport
        .on_path("/slow-503", [Reply::status(503).after(ms(5_700))]);
    w.transport
        .on_path("/fail", [Reply::status(503).after(ms(1))]);
    w.transport.on_path("/probe", [Reply::ok().after(ms(10))]);
    let client = w
        .builder()
        .breaker(1, secs(5), secs(60))
        // Three tokens at 0 s, the next at 6 s, then one every 6 s.
        .rate_limit_with_burst(1.0 / 6.0, 3)
        .build()
        .unwrap();
    let background = CallPolicy::background();
    let _ok = w.spawn_call(&client, background.clone(), "/slow-ok");
    let _late = w.spawn_call(&client, background.clone(), "/slow-503");
    let _fail = w.spawn_call(&client, background, "/fail");
    w.rt.run_until(at(ms(5_100))).unwrap();
    assert_eq!(client.breaker_state(), BreakerState::HalfOpen);
    let probe = w.spawn_call(&client, policy, "/probe");
    w.rt.run().unwrap();
    let result = w.rt.block_on(probe).unwrap().map_err(|e| e.kind());
    w.assert_contract();
    let sent = w
        .transport
        .requests()
        .iter()
        .filter(|r| r.path == "/probe")
        .map(|r| r.at.since_origin())
        .collect();
    (result, sent, w.times_of("breaker_opened"))
}

#[test]
fn a_probe_grant_that_went_stale_while_waiting_for_a_token_is_given_up() {
    // Fail fast: at 6 s the grant is stale and the breaker open again, so the call is
    // refused; nothing goes out inside the new cooldown.
    let (result, sent, opened_at) =
        probe_granted_then_closed_and_reopened_while_it_waits(CallPolicy::background());
    assert_eq!(opened_at, [ms(1), ms(5_700)]);
    assert_eq!(result, Err(ErrorKind::BreakerOpen));
    assert_eq!(sent, []);
    // Waiting for the probe: it waits out the new cooldown (10.7 s), takes a fresh
    // grant, and goes out with the next rate token (12 s).
    let waiting = CallPolicy::background().with_breaker_mode(BreakerMode::WaitForProbe);
    let (result, sent, opened_at) = probe_granted_then_closed_and_reopened_while_it_waits(waiting);
    assert_eq!(opened_at, [ms(1), ms(5_700)]);
    assert_eq!(result, Ok(()));
    assert_eq!(sent, [secs(12)]);
}

#[test]
fn callers_queued_behind_the_send_that_opens_the_breaker_are_refused_before_their_rate_wait() {
    // One permit, one rate token per 5 s. Two fail-fast callers pass the closed
    // breaker and queue for the permit behind a send whose 503 opens it at 1 s. Each
    // is turned back as soon as it gets the permit: it neither waits for a rate token
    // it would not use (until 5 s, then 10 s) nor takes one, so the first is not
    // refused at 5 s and the second does not go out as the probe at 10 s.
    let w = World::new();
    w.transport
        .on_path("/fail", [Reply::status(503).after(secs(1))]);
    w.transport.default_reply(Reply::ok());
    let client = w
        .builder()
        .breaker(1, secs(5), secs(60))
        .max_parallel(1)
        .rate_limit_with_burst(0.2, 1)
        .build()
        .unwrap();
    let _fail = w.spawn_call(&client, CallPolicy::background(), "/fail");
    let queued: Vec<_> = (0..2)
        .map(|_| w.spawn_call(&client, CallPolicy::background(), "/x"))
        .collect();
    w.rt.run().unwrap();
    for call in queued {
        let result = w.rt.block_on(call).unwrap().map_err(|e| e.kind());
        assert_eq!(result, Err(ErrorKind::BreakerOpen));
    }
    assert_eq!(w.sent_at(), [secs(0)], "only /fail goes out");
    let refused_at: Vec<_> = w
        .events()
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Failed { sent: false, .. }))
        .map(|e| e.at.since_origin())
        .collect();
    assert_eq!(refused_at, [secs(1), secs(1)]);
    // The bucket still holds the token the refused callers left: a send at the end
    // of the cooldown (6 s) goes out at once, not at 10 s.
    w.rt.run_until(at(secs(6))).unwrap();
    w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
        .unwrap()
        .unwrap();
    assert_eq!(w.sent_at(), [secs(0), secs(6)]);
    w.assert_contract();
}

#[test]
fn a_send_that_waited_for_a_token_refresh_meets_the_breaker_that_opened_meanwhile() {
    // A call passes the closed breaker, then waits for a refresh another call's 401
    // started; meanwhile a 503 opens the breaker. Asked again after the wait, the
    // breaker refuses the fail-fast call: nothing goes out inside the cooldown.
    let w = World::new();
    w.transport
        .on_path("/fail", [Reply::status(503).after(ms(100))]);
    w.transport
        .on_path("/unauth", [Reply::status(401).after(ms(10))]);
    w.transport.on_path("/late", [Reply::ok()]);
    let rt = w.rt.clone();
    let fetches = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&fetches);
    let client = w
        .builder()
        .breaker(1, secs(5), secs(60))
        .auth(token_fn(move || {
            let rt = rt.clone();
            let n = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                // The first fetch is at once; the refresh after the 401 takes 1 s.
                if n > 0 {
                    rt.sleep(secs(1)).await;
                }
                Ok::<_, AuthError>((AUTHORIZATION, HeaderValue::from_static("Bearer t")))
            }
        }))
        .build()
        .unwrap();
    let _fail = w.spawn_call(&client, CallPolicy::background(), "/fail");
    let _unauth = w.spawn_call(&client, CallPolicy::background(), "/unauth");
    w.rt.run_until(at(ms(20))).unwrap();
    assert_eq!(client.breaker_state(), BreakerState::Closed);
    // The breaker's second look comes before the request is built: the pass it
    // turns back builds nothing.
    let built = Arc::new(AtomicU32::new(0));
    let late = {
        let (client, built) = (client.clone(), Arc::clone(&built));
        w.rt.spawn(async move {
            client
                .execute_with(&CallPolicy::background(), |h| {
                    built.fetch_add(1, Ordering::SeqCst);
                    h.get("/late")
                })
                .await
                .map(|_| ())
        })
    };
    w.rt.run().unwrap();
    let result = w.rt.block_on(late).unwrap().map_err(|e| e.kind());
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    assert_eq!(result, Err(ErrorKind::BreakerOpen));
    assert_eq!(
        built.load(Ordering::SeqCst),
        0,
        "a request built for nothing"
    );
    let late_sent = w
        .transport
        .requests()
        .iter()
        .filter(|r| r.path == "/late")
        .count();
    assert_eq!(late_sent, 0, "sent inside the cooldown");
    w.assert_contract();
}

#[test]
fn fail_fast_refusals_do_not_queue_for_the_transports_admission() {
    let w = World::new();
    w.transport.push(Reply::status(503));
    // A shared admission of one send per second.
    let next_free = std::sync::Mutex::new(vantage_api_pool::Instant::ORIGIN);
    w.transport.admit_with(move |now| {
        let mut next = next_free.lock().unwrap();
        let slot = (*next).max(now);
        *next = slot + secs(1);
        slot - now
    });
    let client = w.builder().breaker(1, secs(60), secs(60)).build().unwrap();
    let _ =
        w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")));
    assert!(matches!(client.breaker_state(), BreakerState::Open { .. }));
    let (admitted, started) = (w.transport.admitted(), w.now());
    w.observer.clear();
    let calls: Vec<_> = (0..10)
        .map(|_| w.spawn_call(&client, CallPolicy::background(), "/x"))
        .collect();
    w.rt.run().unwrap();
    for call in calls {
        let error = w.rt.block_on(call).unwrap().unwrap_err();
        assert_eq!(error.kind(), ErrorKind::BreakerOpen);
    }
    assert_eq!(w.now(), started, "the refusals waited");
    assert_eq!(
        w.transport.admitted(),
        admitted,
        "the refusals used admissions"
    );
    assert_eq!(w.kinds(), ["started", "failed"].repeat(10));
    w.assert_contract();
}

/// One 503 opens a breaker (threshold 1, `cooldown`); then a call under `policy`
/// (waiting for the probe) takes the probe, which the API would answer after
/// `answer_after` but which its time limit cuts first.
fn a_cut_probe(cooldown: Duration, answer_after: Duration, policy: CallPolicy) -> (World, Client) {
    let w = World::new();
    w.transport.push(Reply::status(503));
    w.transport.default_reply(Reply::ok().after(answer_after));
    let client = w.builder().breaker(1, cooldown, secs(60)).build().unwrap();
    let _ =
        w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")));
    let policy = policy.with_breaker_mode(BreakerMode::WaitForProbe);
    let error =
        w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::TimedOut);
    (w, client)
}

#[test]
fn a_call_waiting_for_the_probe_takes_its_admission_when_the_cooldown_ends() {
    let w = World::new();
    w.transport.push(Reply::status(503));
    // The probe takes 50 ms: meanwhile the others are turned away.
    w.transport.default_reply(Reply::ok().after(ms(50)));
    let admitted_at = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = Arc::clone(&admitted_at);
    // Each admission takes 100 ms.
    w.transport.admit_with(move |now| {
        log.lock().unwrap().push(now.since_origin());
        ms(100)
    });
    let client = w.builder().breaker(1, secs(10), secs(60)).build().unwrap();
    let _ =
        w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")));
    let opened = w.now();
    // Three callers wait out the cooldown; one probes, the others follow it.
    let waiting = CallPolicy::background().with_breaker_mode(BreakerMode::WaitForProbe);
    let calls: Vec<_> = (0..3)
        .map(|_| w.spawn_call(&client, waiting.clone(), "/x"))
        .collect();
    w.rt.run().unwrap();
    for call in calls {
        w.rt.block_on(call).unwrap().unwrap();
    }
    // No admission is taken before the cooldown ends, and one per send: the probe
    // claims its slot before its admission, so the callers it turns away take none.
    let admitted_at = admitted_at.lock().unwrap().clone();
    assert_eq!(w.transport.requests().len(), 4);
    assert_eq!(admitted_at.len(), 4, "{admitted_at:?}");
    assert_eq!(admitted_at[0], Duration::ZERO);
    assert!(
        admitted_at[1..].iter().all(|t| *t >= opened + secs(10)),
        "{admitted_at:?}"
    );
    w.assert_contract();
}

/// A ScriptedTransport whose first admission waits until the gate opens, on no
/// clock: the waiting call resumes at the same virtual instant.
struct HeldAdmission {
    inner: vantage_api_pool_testkit::ScriptedTransport,
    gate: Arc<AdmissionGate>,
}

#[derive(Default)]
struct AdmissionGate {
    open: std::sync::atomic::AtomicBool,
    held: std::sync::atomic::AtomicBool,
    waker: std::sync::Mutex<Option<std::task::Waker>>,
}

impl AdmissionGate {
    fn open(&self) {
        self.open.store(true, Ordering::SeqCst);
        if let Some(waker) = self.waker.lock().unwrap().take() {
            waker.wake();
        }
    }
}

/// Opens the gate when the breaker opens.
struct OpenOnBreakerOpened(Arc<AdmissionGate>);

impl vantage_api_pool::TransportObserver for OpenOnBreakerOpened {
    fn on_event(&self, _api: &str, event: &TransportEvent) {
        if matches!(event.kind, EventKind::BreakerOpened { .. }) {
            self.0.open();
        }
    }
}

impl vantage_api_pool::Transport for HeldAdmission {
    type Handle = vantage_api_pool_testkit::ScriptedHttp;
    type Draft = vantage_api_pool_testkit::ScriptedRequestBuilder;
    type Request = vantage_api_pool_testkit::ScriptedRequest;
    type Response = vantage_api_pool_testkit::ScriptedResponse;

    fn handle(&self) -> &Self::Handle {
        self.inner.handle()
    }

    fn prepare(
        &self,
        draft: Self::Draft,
    ) -> Result<Self::Request, vantage_api_pool::TransportError> {
        self.inner.prepare(draft)
    }

    fn send(
        &self,
        request: Self::Request,
    ) -> impl std::future::Future<Output = Result<Self::Response, vantage_api_pool::TransportError>>
    {
        self.inner.send(request)
    }

    fn admit(&self) -> impl std::future::Future<Output = ()> {
        let gate = Arc::clone(&self.gate);
        let hold = !gate.held.swap(true, Ordering::SeqCst);
        std::future::poll_fn(move |cx| {
            if !hold || gate.open.load(Ordering::SeqCst) {
                return std::task::Poll::Ready(());
            }
            *gate.waker.lock().unwrap() = Some(cx.waker().clone());
            if gate.open.load(Ordering::SeqCst) {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
    }
}

#[test]
// On wasm32 observers need not be Send + Sync, and the client still takes an Arc.
#[cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]
fn a_send_whose_admission_waited_asks_the_breaker_again_even_if_no_time_passed() {
    // N passes the closed breaker, then its admission waits; F's 503 opens the
    // breaker, which releases N's admission at the same instant. N must see the
    // open breaker and be refused, not go out inside the cooldown.
    let w = World::new();
    w.transport.on_path("/f", [Reply::status(503)]);
    w.transport.default_reply(Reply::ok());
    let gate = Arc::new(AdmissionGate::default());
    let transport = HeldAdmission {
        inner: w.transport.clone(),
        gate: Arc::clone(&gate),
    };
    let observer = vantage_api_pool::Fanout::new([
        Arc::new(w.observer.clone()) as Arc<dyn vantage_api_pool::TransportObserver>,
        Arc::new(OpenOnBreakerOpened(gate)),
    ]);
    let client = vantage_api_pool::ResilientClient::builder(transport, w.rt.clone())
        .observer("api", Arc::new(observer))
        .breaker(1, secs(60), secs(60))
        .build()
        .unwrap();
    let call = |path: &'static str| {
        let client = client.clone();
        w.rt.spawn(async move {
            client
                .execute_with(&CallPolicy::background(), |h| h.get(path))
                .await
                .map(|_| ())
                .map_err(|e| e.kind())
        })
    };
    let n = call("/n");
    let f = call("/f");
    w.rt.run().unwrap();
    assert_eq!(w.now(), Duration::ZERO);
    assert_eq!(
        w.rt.block_on(f).unwrap(),
        Err(ErrorKind::Status(StatusCode::SERVICE_UNAVAILABLE))
    );
    assert_eq!(w.rt.block_on(n).unwrap(), Err(ErrorKind::BreakerOpen));
    assert!(w.transport.requests().iter().all(|r| r.path != "/n"));
    w.assert_contract();
}

#[test]
fn a_probe_cut_by_the_end_of_its_budget_does_not_double_the_cooldown() {
    // The call waits out the 9.999 s cooldown and takes the probe with 1 ms of its
    // 10 s budget left; the API would answer in 50 ms.
    let budget = CallPolicy::background()
        .with_budget(Some(secs(10)))
        .unwrap();
    let (w, client) = a_cut_probe(ms(9_999), ms(50), budget);
    assert_eq!(w.now(), secs(10));
    // The cut proves nothing about the API: no doubled cooldown, and the probe slot
    // is free for the next caller, whose probe closes the breaker.
    assert_eq!(opened(&w.events()), [ms(9_999)]);
    assert_eq!(client.breaker_state(), BreakerState::HalfOpen);
    w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
        .unwrap()
        .unwrap();
    assert_eq!(closed_count(&w.events()), 1);
    w.assert_contract();
}

#[test]
fn a_budget_equal_to_the_attempt_timeout_still_opens_on_an_api_that_never_answers() {
    // Each call's budget is its attempt timeout (10 s); a 1000/s rate limit makes
    // the later calls wait 1 to 4 ms at the gate, so their sends get a little less
    // than 10 s, all cut at 10 s. Failures all the same: the breaker opens.
    let w = World::new();
    w.transport.default_reply(Reply::stall());
    let client = w
        .builder()
        .breaker(3, secs(5), secs(60))
        .rate_limit_with_burst(1_000.0, 1)
        .build()
        .unwrap();
    let policy = CallPolicy::background()
        .with_budget(Some(secs(10)))
        .unwrap();
    let calls: Vec<_> = (0..5)
        .map(|_| w.spawn_call(&client, policy.clone(), "/x"))
        .collect();
    w.rt.run().unwrap();
    for call in calls {
        let error = w.rt.block_on(call).unwrap().unwrap_err();
        assert_eq!(error.kind(), ErrorKind::TimedOut);
    }
    assert_eq!(w.transport.requests().len(), 5);
    assert_eq!(w.times_of("breaker_opened"), [secs(10)]);
    w.assert_contract();
}

#[test]
fn a_probe_cut_by_its_own_attempt_timeout_still_doubles_the_cooldown() {
    // The probe's limit is its whole attempt timeout (2 s); the budget has room.
    let policy = CallPolicy::background()
        .with_attempt_timeout(secs(2))
        .unwrap()
        .with_budget(Some(secs(60)))
        .unwrap();
    let (w, _client) = a_cut_probe(secs(5), secs(3), policy);
    assert_eq!(opened(&w.events()), [secs(5), secs(10)]);
    w.assert_contract();
}

#[test]
fn a_rate_wait_ending_exactly_at_the_end_of_the_budget_is_not_slept_for() {
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let client = w.builder().rate_limit_with_burst(1.0, 1).build().unwrap();
    let policy = bounded_within(0, ms(100), ms(500), secs(1));
    w.rt.block_on(client.execute_with(&policy, |h| h.get("/a")))
        .unwrap()
        .unwrap();
    // The next token is due in exactly 1 s, when the budget ends: TimedOut now,
    // and the token is left for the next call.
    let err =
        w.rt.block_on(client.execute_with(&policy, |h| h.get("/b")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert_eq!(w.now(), ms(0), "ended at once, not at the budget's end");
    w.rt.run_for(secs(1)).unwrap();
    w.rt.block_on(client.execute_with(&bounded(0, ms(100)), |h| h.get("/c")))
        .unwrap()
        .unwrap();
    assert_eq!(w.sent_at(), [ms(0), secs(1)]);
    w.assert_contract();
}

#[test]
fn a_send_cut_with_exactly_half_its_timeout_left_counts_against_the_breaker() {
    // "Less than half" is strict: a send the budget left exactly half its 2 s
    // timeout (1 s) says something about the API when it is cut.
    let w = World::new();
    w.transport.push(Reply::status(500).after(ms(900)));
    w.transport.default_reply(Reply::stall());
    let client = w.builder().breaker(2, secs(5), secs(60)).build().unwrap();
    let policy = bounded_within(1, ms(100), secs(2), secs(2));
    let err =
        w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert_eq!(w.sent_at(), [ms(0), secs(1)]);
    assert_eq!(opened(&w.events()), [secs(5)], "{:?}", w.kinds());
    w.assert_contract();
}

/// Seed 000: "While a probe is in flight every other caller sees OpenFor(5 ms) and
/// re-checks." A waiting caller must go out on the first 5 ms re-check after the
/// probe closes the breaker.
#[test]
fn a_waiting_caller_rechecks_every_5_ms_while_the_probe_is_in_flight() {
    let w = World::new();
    w.transport.push(Reply::status(503)); // opens (threshold 1) at 0 for 1 s
    w.transport.push(Reply::ok().after(ms(12))); // the probe: 1.000 -> 1.012
    w.transport.push(Reply::ok()); // the waiter
    let client = w.builder().breaker(1, secs(1), secs(8)).build().unwrap();
    let _ = w.background_error(&client);
    let a = w.spawn_call(&client, forever(ms(100)), "/a");
    let b = w.spawn_call(&client, forever(ms(100)), "/b");
    w.rt.run().unwrap();
    assert!(a.is_finished() && b.is_finished());
    assert_eq!(w.sent_at(), [ms(0), ms(1000), ms(1015)]);
    w.assert_contract();
}

type C = ResilientClient<ScriptedTransport, VirtualRuntime>;

/// Records `breaker_state()` as each terminal event is heard, and, on a terminal
/// event, whether a fail-fast call made right then would be refused with
/// `BreakerOpen` (i.e. whether the probe slot is still held).
struct Watcher {
    client: Mutex<Option<C>>,
    nesting: AtomicBool,
    probe_nested: AtomicBool,
    seen: Mutex<Vec<(&'static str, BreakerState, Option<ErrorKind>)>>,
    /// Moves this clock on by this much at every `Started`: a slow callback.
    slow_start: Mutex<Option<(VirtualRuntime, Duration)>>,
}

impl Watcher {
    // The client it holds is not `Send` on wasm32; observers are held in an `Arc`.
    #[cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]
    fn new(probe_nested: bool) -> Arc<Self> {
        Arc::new(Watcher {
            client: Mutex::new(None),
            nesting: AtomicBool::new(false),
            probe_nested: AtomicBool::new(probe_nested),
            seen: Mutex::new(Vec::new()),
            slow_start: Mutex::new(None),
        })
    }
}

impl Watcher {
    /// A client observed by this watcher (which keeps a clone of it), with a breaker
    /// that opens on one failure for a second and `max_parallel` permits.
    fn client_of(self: &Arc<Self>, w: &World, max_parallel: usize) -> C {
        let client = ResilientClient::builder(w.transport.clone(), w.rt.clone())
            .observer("api", self.clone())
            .breaker(1, secs(1), secs(8))
            .max_parallel(max_parallel)
            .build()
            .unwrap();
        *self.client.lock().unwrap() = Some(client.clone());
        client
    }

    /// What it saw; it lets go of its client (which holds it).
    fn finish(&self) -> Vec<(&'static str, BreakerState, Option<ErrorKind>)> {
        self.client.lock().unwrap().take();
        self.seen.lock().unwrap().clone()
    }
}

/// One `background()` GET of `/x`, whatever its outcome.
fn background_get(w: &World, client: &C) {
    let _ =
        w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
            .unwrap();
}

// It calls back into the client from its callback, which observers must not do
// (ARCHITECTURE), on purpose: that is how the test sees whether the slot is free.
impl TransportObserver for Watcher {
    fn on_event(&self, _api: &str, event: &TransportEvent) {
        if matches!(event.kind, EventKind::Started { .. })
            && let Some((rt, by)) = &*self.slow_start.lock().unwrap()
        {
            rt.advance(*by);
        }
        if !event.kind.is_terminal() || self.nesting.load(Ordering::SeqCst) {
            return;
        }
        let Some(client) = self.client.lock().unwrap().clone() else {
            return;
        };
        let state = client.breaker_state();
        let mut nested = None;
        if self.probe_nested.load(Ordering::SeqCst) {
            self.nesting.store(true, Ordering::SeqCst);
            // Polled once: refused at the gate (Some(Err(BreakerOpen))) only if the
            // probe slot is still held.
            let r = client
                .execute_with(&CallPolicy::background(), |h| h.get("/nested"))
                .now_or_never();
            self.nesting.store(false, Ordering::SeqCst);
            nested = match r {
                Some(Err(e)) => Some(e.kind()),
                _ => None,
            };
        }
        self.seen
            .lock()
            .unwrap()
            .push((event.kind.name(), state, nested));
    }
}

/// Seed 000, `record`: "Tell the breaker what the attempt proved, release the probe
/// slot, then report the terminal event and any breaker transition, in that order."
#[test]
fn the_breaker_is_told_before_the_terminal_event_is_reported() {
    let w = World::new();
    w.transport.push(Reply::status(503));
    w.transport.push(Reply::ok());
    let watcher = Watcher::new(false);
    let client = watcher.client_of(&w, 8);
    background_get(&w, &client);
    w.rt.advance(secs(1));
    background_get(&w, &client);
    let seen = watcher.finish();
    assert_eq!(
        seen,
        [
            ("failed", BreakerState::Open { until: at(secs(1)) }, None),
            ("succeeded", BreakerState::Closed, None),
        ]
    );
}

/// Seed 000, observer contract: "The probe slot is released before any callback
/// runs." A prober dropped mid-send: when `Cancelled` is heard the slot is free.
#[test]
fn the_probe_slot_is_free_when_cancelled_is_heard() {
    let w = World::new();
    w.transport.push(Reply::status(503));
    w.transport.push(Reply::stall());
    w.transport.default_reply(Reply::ok());
    let watcher = Watcher::new(true);
    let client = watcher.client_of(&w, 8);
    background_get(&w, &client);
    w.rt.advance(secs(1));
    let prober = w.spawn_call(&client, CallPolicy::background(), "/probe");
    w.rt.run_until(at(secs(2))).unwrap();
    prober.abort();
    let seen = watcher.finish();
    let at_cancel = seen.iter().find(|s| s.0 == "cancelled").expect("cancelled");
    assert_ne!(at_cancel.2, Some(ErrorKind::BreakerOpen), "{seen:?}");
}

/// Same rule on a refusal path: the probe's draft cannot be prepared; when its
/// synthetic `Failed` is heard the slot is free.
#[test]
fn the_probe_slot_is_free_when_a_refused_probes_failed_is_heard() {
    let w = World::new();
    w.transport.push(Reply::status(503));
    w.transport.default_reply(Reply::ok());
    let watcher = Watcher::new(false);
    let client = watcher.client_of(&w, 8);
    background_get(&w, &client);
    w.rt.advance(secs(1));
    watcher.probe_nested.store(true, Ordering::SeqCst);
    let err =
        w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/p").invalid()))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.kind_name(), "transport");
    let seen = watcher.finish();
    let last = seen.last().expect("an event");
    assert_eq!(last.0, "failed");
    assert_ne!(last.2, Some(ErrorKind::BreakerOpen), "{seen:?}");
}

/// The probe slot is free when the probe's refusal is heard, on the two refusal paths
/// between its grant and its send: the budget ending while it waits for a permit, and
/// a `Started` callback that uses up the budget.
#[test]
fn the_probe_slot_is_free_when_a_probe_refused_after_its_grant_is_heard() {
    for slow_started in [false, true] {
        let w = World::new();
        let watcher = Watcher::new(false);
        let client = watcher.client_of(&w, 1);
        if slow_started {
            // A 503 opens the breaker at 0 for 1 s.
            w.transport.push(Reply::status(503));
            let _ = w.background_error(&client);
        } else {
            // Only a send from before the opening can hold the permit while the probe
            // waits: the 503 whose error body stalls gives its permit back at the
            // head (to the stalled send behind it) and opens the breaker at 1 s, when
            // its time limit cuts the body.
            w.transport.push_many([
                Reply::status(503)
                    .body("x".repeat(100))
                    .body_stalls_after(10),
                Reply::stall(),
            ]);
            let opener = CallPolicy::background()
                .with_attempt_timeout(secs(1))
                .unwrap();
            w.spawn_call(&client, opener, "/open").detach();
            w.spawn_call(&client, CallPolicy::background(), "/hold")
                .detach();
            w.rt.run_until(at(secs(1))).unwrap();
            assert_eq!(w.transport.in_flight(), 1);
        }
        assert!(matches!(client.breaker_state(), BreakerState::Open { .. }));
        w.rt.advance(secs(1));
        watcher.probe_nested.store(true, Ordering::SeqCst);
        if slow_started {
            *watcher.slow_start.lock().unwrap() = Some((w.rt.clone(), secs(5)));
        }
        w.transport.default_reply(Reply::ok());
        let policy = CallPolicy::background()
            .with_time_limits(secs(2), Some(secs(2)))
            .unwrap();
        let probe = w.spawn_call(&client, policy, "/probe");
        let err = w.rt.block_on(probe).unwrap().unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::TimedOut,
            "slow Started: {slow_started}"
        );
        let seen = watcher.finish();
        let last = seen.last().expect("an event");
        assert_eq!(last.0, "failed");
        assert_ne!(
            last.2,
            Some(ErrorKind::BreakerOpen),
            "slow Started: {slow_started}: {seen:?}"
        );
    }
}

#[test]
fn a_401_for_a_send_that_waited_for_a_rate_token_still_refreshes_its_token() {
    // `/warm` takes any token; `/x` only t2. The warm-up call fetches t1 and spends
    // the bucket's only token, so the `/x` call waits ~1 s for a rate token holding
    // t1 with no refresh meanwhile. Its 401 must still ask for a token newer than
    // t1 (generation 1), not take the cached t1 again.
    let w = World::new();
    w.transport
        .respond_with(|req, _| match (req.path(), bearer(req)) {
            ("/warm", _) | (_, Some("Bearer t2")) => Reply::ok().after(ms(10)),
            _ => Reply::status(401).after(ms(10)),
        });
    let (client, fetches) = client_with_counted_tokens(&w, |b| b.rate_limit_with_burst(1.0, 1));
    let policy = CallPolicy::background();
    w.rt.block_on(client.execute_with(&policy, |h| h.get("/warm")))
        .unwrap()
        .unwrap();
    w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
        .unwrap()
        .expect("the replay goes out with a fresh token");
    assert_eq!(tokens_sent(&w, Some("/x")), ["Bearer t1", "Bearer t2"]);
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    w.assert_contract();
}

#[test]
fn a_transports_own_timeout_counts_against_the_breaker() {
    let w = World::new();
    w.transport.push(Reply::fail(
        vantage_api_pool::TransportErrorKind::TimedOut,
        "read timed out",
    ));
    let client = w.builder().breaker(1, secs(5), secs(60)).build().unwrap();
    let err = w.background_error(&client);
    assert_eq!(err.time_limit(), Some(TimeLimit::Transport));
    assert_eq!(opened(&w.events()), [secs(5)], "{:?}", w.kinds());
    assert!(matches!(client.breaker_state(), BreakerState::Open { .. }));
    w.assert_contract();
}

#[test]
fn a_401_replay_after_a_redial_is_a_new_attempt() {
    let w = World::new();
    w.transport.push_many([
        Reply::fail(
            vantage_api_pool::TransportErrorKind::NotSent,
            "stale connection",
        ),
        Reply::status(401),
        Reply::status(503),
    ]);
    let (client, _fetches) = client_with_counted_tokens(&w, |b| b);
    let err =
        w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(w.started(), [(1, 1), (2, 1), (3, 2)]);
    assert_eq!(err.status(), Some(StatusCode::SERVICE_UNAVAILABLE));
    assert_eq!(err.attempts(), 2);
    w.assert_contract();
}
