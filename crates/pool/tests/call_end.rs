//! `TransportObserver::on_call_end`: one end per call, after its last event, on
//! every path (a response, an error, a refusal, a drop mid-send, in a back-off or
//! at the gate, a panicking observer), with the call's own time: every wait,
//! retry and back-off included. On virtual time with exact times.

mod common;

// On wasm32 the same tests run under wasm-bindgen-test, in Node and in a browser.
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use http::StatusCode;
use vantage_api_pool::{CallId, CallOutcome, ErrorKind, EventKind, Fanout};
use vantage_api_pool_testkit::{RecordingObserver, Reply};

/// The only recorded end: (call, at, elapsed, sends, attempts, outcome name), and
/// its place among the events.
fn only_end(w: &World) -> ((CallId, Duration, Duration, u32, u32, &'static str), usize) {
    let ends = w.observer.call_ends();
    assert_eq!(ends.len(), 1, "{ends:?}");
    let e = &ends[0].end;
    (
        (
            e.call,
            e.at.since_origin(),
            e.elapsed(),
            e.sends,
            e.attempts,
            e.outcome.name(),
        ),
        ends[0].after,
    )
}

#[test]
fn a_call_that_retries_ends_once_with_its_whole_time() {
    let w = World::new();
    w.transport.push(Reply::status(503).after(ms(30)));
    w.transport.push(Reply::ok().after(ms(20)));
    let client = w.client();
    let policy = bounded(2, secs(1));
    let call = client.execute_with(&policy, |h| h.get("/x"));
    let id = call.id();
    // Nothing is reported before the call is polled.
    assert!(w.observer.call_ends().is_empty());
    let response = w.rt.block_on(call).unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::OK);

    // 30 ms, a 1 s back-off, 20 ms: the caller's wait, where each send's `ms`
    // counts only its own.
    let (end, after) = only_end(&w);
    assert_eq!(end, (id, ms(1050), ms(1050), 2, 2, "succeeded"));
    // After every event of the call, the Succeeded last.
    assert_eq!(after, w.observer.len());
    assert_eq!(w.kinds().last(), Some(&"succeeded"));
    let CallOutcome::Succeeded { status } = w.observer.call_end(id).unwrap().outcome else {
        panic!("not a success");
    };
    assert_eq!(status, StatusCode::OK);
    w.assert_contract();
}

#[test]
fn the_time_runs_from_the_first_reading_at_the_gate_waits_included() {
    // A rate of one a second: the second call waits for its token, a wait its
    // `Started` and `ms` leave out and its end keeps.
    let w = World::new();
    w.transport.default_reply(Reply::ok().after(ms(10)));
    let client = w.builder().rate_limit(1.0).build().unwrap();
    let first = w.spawn_call(&client, bounded(0, ms(1)), "/a");
    let second = w.spawn_call(&client, bounded(0, ms(1)), "/b");
    w.rt.run().unwrap();
    assert!(first.is_finished() && second.is_finished());
    let ends = w.observer.call_ends();
    let times: Vec<_> = ends
        .iter()
        .map(|e| (e.end.call, e.end.at.since_origin(), e.end.elapsed()))
        .collect();
    assert_eq!(
        times,
        [(CallId(1), ms(10), ms(10)), (CallId(2), ms(1010), ms(1010))]
    );
    assert_eq!(w.times_of("started"), [ms(0), ms(1000)]);
    w.assert_contract();
}

#[test]
fn a_failed_call_ends_with_the_error_it_returns() {
    let w = World::new();
    w.transport.push(Reply::status(503));
    w.transport.push(Reply::status(404).after(ms(5)));
    let client = w.client();
    let error =
        w.rt.block_on(client.execute_with(&bounded(3, ms(100)), |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(error.status(), Some(StatusCode::NOT_FOUND));
    let (end, after) = only_end(&w);
    assert_eq!(end, (CallId(1), ms(105), ms(105), 2, 2, "failed"));
    assert_eq!(after, w.observer.len());
    let CallOutcome::Failed { error: ended } = w.observer.call_end(CallId(1)).unwrap().outcome
    else {
        panic!("not a failure");
    };
    assert_eq!(error_difference(&ended, &error), None);
    w.assert_contract();
}

#[test]
fn a_refused_call_counts_its_synthetic_send() {
    // The breaker opens on the first failure; the next call is refused at once.
    let w = World::new();
    w.transport.push(Reply::status(503));
    let client = w.builder().breaker(1, secs(30), secs(60)).build().unwrap();
    let _ = w.background_error(&client);
    w.rt.advance(secs(2));
    let refused = w.background_error(&client);
    assert_eq!(refused.kind(), ErrorKind::BreakerOpen);
    let ends = w.observer.call_ends();
    assert_eq!(ends.len(), 2);
    let second = &ends[1].end;
    assert_eq!(
        (
            second.sends,
            second.attempts,
            second.elapsed(),
            second.outcome.name()
        ),
        (1, 1, Duration::ZERO, "failed")
    );
    let CallOutcome::Failed { error } = &second.outcome else {
        panic!()
    };
    assert_eq!(error.kind(), ErrorKind::BreakerOpen);
    // The error counts only sends that went through the transport: none.
    assert_eq!((error.attempts(), error.nothing_sent()), (0, true));
    w.assert_contract();
}

#[test]
fn a_call_dropped_mid_send_ends_cancelled_after_its_send() {
    let w = World::new();
    w.transport.push(Reply::ok().after(secs(10)));
    let client = w.client();
    let call = w.spawn_call(&client, bounded(0, ms(1)), "/x");
    w.rt.run_until(at(secs(3))).unwrap();
    assert!(w.observer.call_ends().is_empty());
    call.abort();
    assert_eq!(w.kinds(), ["started", "cancelled"]);
    let (end, after) = only_end(&w);
    assert_eq!(end, (CallId(1), secs(3), secs(3), 1, 1, "cancelled"));
    assert_eq!(after, 2, "after the send's Cancelled");
    w.assert_contract();
}

#[test]
fn a_call_dropped_in_its_back_off_ends_cancelled() {
    let w = World::new();
    w.transport.default_reply(Reply::status(503).after(ms(40)));
    let client = w.client();
    let call = w.spawn_call(&client, bounded(3, secs(5)), "/x");
    w.rt.run_until(at(secs(1))).unwrap();
    assert_eq!(w.kinds(), ["started", "failed", "retry_scheduled"]);
    call.abort();
    let (end, after) = only_end(&w);
    assert_eq!(end, (CallId(1), secs(1), secs(1), 1, 1, "cancelled"));
    assert_eq!(after, 3);
    w.assert_contract();
}

#[test]
fn a_call_dropped_at_the_gate_before_any_send_ends_with_no_send() {
    // One permit, held by a slow call: the second waits for it and is dropped.
    let w = World::new();
    w.transport.default_reply(Reply::ok().after(secs(5)));
    let client = w.builder().max_parallel(1).build().unwrap();
    let holder = w.spawn_call(&client, bounded(0, ms(1)), "/slow");
    let waiter = w.spawn_call(&client, bounded(0, ms(1)), "/queued");
    w.rt.run_until(at(secs(2))).unwrap();
    waiter.abort();
    w.rt.run().unwrap();
    assert!(holder.is_finished());
    let ends: Vec<_> = w
        .observer
        .call_ends()
        .into_iter()
        .map(|e| {
            let e = e.end;
            (e.call, e.elapsed(), e.sends, e.attempts, e.outcome.name())
        })
        .collect();
    assert_eq!(
        ends,
        [
            (CallId(2), secs(2), 0, 0, "cancelled"),
            (CallId(1), secs(5), 1, 1, "succeeded"),
        ]
    );
    assert!(w.observer.for_call(CallId(2)).is_empty());
    w.assert_contract();
}

#[test]
fn a_call_never_polled_reports_no_end() {
    let w = World::new();
    let client = w.client();
    let call = client.execute(|h| h.get("/x"));
    drop(call);
    let future = client.into_call(|h| h.get("/y"));
    drop(future);
    assert!(w.observer.call_ends().is_empty());
    assert!(w.observer.is_empty());
    w.assert_contract();
}

#[test]
fn a_call_that_reads_its_body_ends_at_the_body_end() {
    let w = World::new();
    w.transport.push(
        Reply::ok()
            .after(ms(10))
            .body("0123456789")
            .chunk_size(2)
            .chunk_delay(ms(3)),
    );
    let client = w.client();
    let read =
        w.rt.block_on(client.execute_read_with(&bounded(0, ms(1)), 64, |h| h.get("/x")))
            .unwrap()
            .unwrap();
    assert_eq!(read.body().len(), 10);
    let succeeded_at = w
        .events()
        .iter()
        .find(|e| matches!(e.kind, EventKind::Succeeded { .. }))
        .map(|e| e.at.since_origin())
        .unwrap();
    let (end, _) = only_end(&w);
    assert_eq!(end.1, succeeded_at);
    assert!(
        succeeded_at > ms(10),
        "the body took time: {succeeded_at:?}"
    );
    assert_eq!(end.2, succeeded_at);
    w.assert_contract();
}

/// A panic unwinds only on native targets (on `wasm32` it aborts).
#[cfg(not(target_arch = "wasm32"))]
mod panics {
    use super::*;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};
    use vantage_api_pool::{CallEnd, TransportEvent, TransportObserver};

    /// Panics on the first event of kind `on`, or on the first call end.
    struct PanicsOn {
        on: Option<&'static str>,
        done: AtomicBool,
        ends: Mutex<Vec<CallEnd>>,
    }

    impl PanicsOn {
        fn new(on: Option<&'static str>) -> Arc<Self> {
            Arc::new(PanicsOn {
                on,
                done: AtomicBool::new(false),
                ends: Mutex::new(Vec::new()),
            })
        }
    }

    impl TransportObserver for PanicsOn {
        fn on_event(&self, _api: &str, event: &TransportEvent) {
            if Some(event.kind.name()) == self.on && !self.done.swap(true, Ordering::SeqCst) {
                panic!("observer panics on {}", event.kind.name());
            }
        }

        fn on_call_end(&self, _api: &str, end: &CallEnd) {
            self.ends.lock().unwrap().push(end.clone());
            if self.on.is_none() && !self.done.swap(true, Ordering::SeqCst) {
                panic!("observer panics on the call's end");
            }
        }
    }

    #[test]
    fn a_panic_in_the_observer_ends_the_call_once() {
        use std::panic::{AssertUnwindSafe, catch_unwind};

        // A panic on `Succeeded` unwinds out of the call: the call ends as unwound
        // by it, once, reported to every observer of the fan-out.
        for (on, outcome) in [(Some("succeeded"), "panicked"), (None, "succeeded")] {
            let w = World::new();
            w.transport.push(Reply::ok().after(ms(7)));
            let panics = PanicsOn::new(on);
            let both = Fanout::default()
                .with(panics.clone())
                .with(Arc::new(w.observer.clone()));
            let client =
                vantage_api_pool::ResilientClient::builder(w.transport.clone(), w.rt.clone())
                    .observer("api", Arc::new(both))
                    .build()
                    .unwrap();
            let policy = bounded(0, ms(1));
            let call = client.execute_with(&policy, |h| h.get("/x"));
            let unwound = catch_unwind(AssertUnwindSafe(|| w.rt.block_on(call)));
            assert!(unwound.is_err(), "{on:?}: the panic reaches the caller");
            let ends: Vec<_> = panics
                .ends
                .lock()
                .unwrap()
                .iter()
                .map(|e| (e.at.since_origin(), e.outcome.name()))
                .collect();
            assert_eq!(ends, [(ms(7), outcome)], "{on:?}");
            assert_eq!(w.observer.call_ends().len(), 1, "{on:?}");
            w.assert_contract();
        }
    }

    #[test]
    fn a_call_whose_request_closure_panics_ends_panicked_with_no_event() {
        use std::panic::{AssertUnwindSafe, catch_unwind};

        // It passed the gate, so it ends; no send started, so it has no event, and
        // the record still keeps the contract.
        quiet_panics_starting_with("request closure panics");
        let w = World::new();
        let client = w.client();
        let call = client.execute(|_| -> vantage_api_pool_testkit::ScriptedRequestBuilder {
            panic!("request closure panics")
        });
        let unwound = catch_unwind(AssertUnwindSafe(|| w.rt.block_on(call)));
        assert!(unwound.is_err());
        assert!(w.events().is_empty());
        let ((_, _, _, sends, attempts, outcome), _) = only_end(&w);
        assert_eq!((sends, attempts, outcome), (0, 0, "panicked"));
        w.assert_contract();
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]
fn every_observer_of_a_fanout_hears_the_end() {
    let w = World::new();
    w.transport.push(Reply::ok());
    let second = RecordingObserver::new();
    let both = Fanout::default()
        .with(Arc::new(w.observer.clone()))
        .with(Arc::new(second.clone()));
    let client = vantage_api_pool::ResilientClient::builder(w.transport.clone(), w.rt.clone())
        .observer("api", Arc::new(both))
        .build()
        .unwrap();
    w.rt.block_on(client.execute(|h| h.get("/x")))
        .unwrap()
        .unwrap();
    assert_eq!(w.observer.call_ends().len(), 1);
    assert_eq!(second.call_ends().len(), 1);
}

#[test]
fn a_labelled_call_carries_its_label_on_every_event_and_its_end() {
    // A 503 opens the breaker (threshold 1, cooldown 500 ms); the retry a second
    // later is its probe, and closes it: every kind of a call's events.
    let w = World::new();
    w.transport.push(Reply::status(503));
    w.transport.push(Reply::ok());
    let client = w
        .builder()
        .breaker(1, ms(500), secs(60))
        .default_policy(bounded(0, ms(1)).with_label("orders.default"))
        .build()
        .unwrap();
    let list = bounded(2, secs(1)).with_label("orders.list");
    let first = client.execute_with(&list, |h| h.get("/orders"));
    let first_id = first.id();
    w.rt.block_on(first).unwrap().unwrap();
    assert_eq!(
        w.kinds(),
        [
            "started",
            "failed",
            "breaker_opened",
            "retry_scheduled",
            "started",
            "succeeded",
            "breaker_closed"
        ]
    );
    assert!(
        w.events().iter().all(|e| e.label == Some("orders.list")),
        "{:?}",
        w.events()
    );
    assert_eq!(
        w.observer.call_end(first_id).unwrap().label,
        Some("orders.list")
    );

    // A policy without a label: none; `execute` goes by the default policy's.
    w.observer.clear();
    w.transport.push_many([Reply::ok(), Reply::ok()]);
    let plain =
        w.rt.block_on(client.execute_with(&bounded(0, ms(1)), |h| h.get("/a")));
    assert!(plain.unwrap().is_ok());
    let by_default = client.execute(|h| h.get("/b"));
    let default_id = by_default.id();
    w.rt.block_on(by_default).unwrap().unwrap();
    let labels: Vec<_> = w.events().iter().map(|e| (e.call, e.label)).collect();
    assert_eq!(
        labels,
        [
            (Some(CallId(2)), None),
            (Some(CallId(2)), None),
            (Some(default_id), Some("orders.default")),
            (Some(default_id), Some("orders.default"))
        ]
    );
    let ends: Vec<_> = w.observer.call_ends().iter().map(|e| e.end.label).collect();
    assert_eq!(ends, [None, Some("orders.default")]);
    w.assert_contract();
}

#[test]
fn a_dropped_or_refused_call_keeps_its_label() {
    let w = World::new();
    w.transport.push(Reply::ok().after(secs(5)));
    let client = w.client();
    let labelled = bounded(0, ms(1)).with_label("orders.slow");
    let call = {
        let client = client.clone();
        let labelled = labelled.clone();
        w.rt.spawn(async move {
            let _ = client.execute_with(&labelled, |h| h.get("/slow")).await;
        })
    };
    w.rt.run_until(at(secs(1))).unwrap();
    call.abort();
    // Refused before sending: a request that cannot be built.
    let refused =
        w.rt.block_on(client.execute_with(&labelled, |h| h.get("/x").invalid()))
            .unwrap();
    assert!(refused.is_err());
    assert_eq!(w.kinds(), ["started", "cancelled", "started", "failed"]);
    assert!(w.events().iter().all(|e| e.label == Some("orders.slow")));
    let ends: Vec<_> = w
        .observer
        .call_ends()
        .iter()
        .map(|e| (e.end.outcome.name(), e.end.label))
        .collect();
    assert_eq!(
        ends,
        [
            ("cancelled", Some("orders.slow")),
            ("failed", Some("orders.slow"))
        ]
    );
    w.assert_contract();
}

#[test]
fn a_redial_keeps_the_label_too() {
    let w = World::new();
    w.transport.push(Reply::fail(
        vantage_api_pool::TransportErrorKind::NotSent,
        "stale connection",
    ));
    w.transport.push(Reply::ok());
    let client = w.client();
    let policy = bounded(0, ms(1)).with_label("orders.get");
    w.rt.block_on(client.execute_with(&policy, |h| h.get("/orders/7")))
        .unwrap()
        .unwrap();
    assert_eq!(
        w.kinds(),
        ["started", "failed", "redialing", "started", "succeeded"]
    );
    assert!(w.events().iter().all(|e| e.label == Some("orders.get")));
    w.assert_contract();
}
