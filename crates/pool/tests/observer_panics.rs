//! An observer that panics: the panic reaches the caller of the call (it is never
//! swallowed), and the contract still holds for everyone else listening. A `Started`
//! gets its terminal event, a breaker transition is still told, and a second panic
//! while the first unwinds does not abort the process.
//!
//! Native only: wasm32 aborts on a panic.
#![cfg(not(target_arch = "wasm32"))]

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use common::*;
use http::{HeaderValue, header::AUTHORIZATION};
use vantage_api_pool::auth::{AuthError, token_fn};
use vantage_api_pool::health::{BreakerView, HealthObserver};
use vantage_api_pool::{
    BreakerState, CallPolicy, Fanout, ResilientClient, TransportEvent, TransportObserver,
};
use vantage_api_pool_testkit::{RecordingObserver, Reply};

/// Panics on the first `times` events named in `on` (names split by `|`; every
/// event: `"any"`).
struct Panicking {
    on: &'static str,
    times: AtomicU32,
}

impl Panicking {
    fn on(on: &'static str, times: u32) -> Arc<Self> {
        Arc::new(Panicking {
            on,
            times: AtomicU32::new(times),
        })
    }
}

impl TransportObserver for Panicking {
    fn on_event(&self, _api: &str, event: &TransportEvent) {
        let name = event.kind.name();
        let hit = self.on == "any" || self.on.split('|').any(|on| on == name);
        if hit && self.times.load(Ordering::SeqCst) > 0 {
            self.times.fetch_sub(1, Ordering::SeqCst);
            panic!("observer panics on {}", event.kind.name());
        }
    }
}

/// A world whose transport answers `first`, then 200s, and a client (breaker of one
/// failure) whose observer feeds a health observer, a recorder and then `last`.
fn set_up(
    first: Reply,
    last: Arc<Panicking>,
) -> (World, Arc<HealthObserver>, RecordingObserver, Client) {
    quiet_panics_starting_with("observer panics on");
    let w = World::new();
    w.transport.push(first).default_reply(Reply::ok());
    let (health, recorder) = (
        Arc::new(HealthObserver::new(secs(60))),
        RecordingObserver::new(),
    );
    let fanout = Fanout::default()
        .with(Arc::clone(&health))
        .with(Arc::new(recorder.clone()))
        .with(last);
    let client = ResilientClient::builder(w.transport.clone(), w.rt.clone())
        .observer("api", Arc::new(fanout))
        .breaker(1, secs(5), secs(60))
        .build()
        .unwrap();
    (w, health, recorder, client)
}

/// Runs one background call to `/x`; true when it panicked.
fn call_panics(w: &World, client: &Client) -> bool {
    let run = || {
        w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
    };
    catch_unwind(AssertUnwindSafe(run)).is_err()
}

#[test]
fn a_panic_on_started_reaches_the_caller_and_the_send_still_ends() {
    let (w, health, recorder, client) = set_up(Reply::ok(), Panicking::on("started", 1));

    assert!(
        call_panics(&w, &client),
        "the observer's panic reaches the caller"
    );
    assert_eq!(recorder.kinds(), ["started", "cancelled"]);
    recorder.check_contract().unwrap();
    assert_eq!(health.snapshot("api").unwrap().in_flight, 0);
    assert_eq!(client.in_flight(), 0);
    assert_eq!(w.transport.request_count(), 0, "the send never left");

    // The client goes on as before.
    assert!(!call_panics(&w, &client));
    assert_eq!(
        recorder.kinds(),
        ["started", "cancelled", "started", "succeeded"]
    );
    recorder.check_contract().unwrap();
}

#[test]
fn a_panic_on_a_terminal_event_still_lets_the_breaker_transition_be_told() {
    let (w, health, recorder, client) = set_up(Reply::status(503), Panicking::on("failed", 1));

    assert!(call_panics(&w, &client));
    // The 503 opened the breaker (threshold 1): everyone listening hears it.
    assert_eq!(recorder.kinds(), ["started", "failed", "breaker_opened"]);
    recorder.check_contract().unwrap();
    assert!(matches!(client.breaker_state(), BreakerState::Open { .. }));
    let figures = health.snapshot("api").unwrap();
    assert!(
        matches!(figures.breaker, BreakerView::Open { .. }),
        "{figures:?}"
    );
    assert_eq!(figures.in_flight, 0);
}

#[test]
fn a_refusal_whose_started_panics_still_reports_its_failure() {
    let panicking = Panicking::on("started", 0);
    let (w, health, recorder, client) = set_up(Reply::status(503), Arc::clone(&panicking));
    assert!(!call_panics(&w, &client), "the 503 opens the breaker");
    assert!(matches!(client.breaker_state(), BreakerState::Open { .. }));

    // The next call is refused at once (fail fast): its synthetic `Started` panics,
    // and its `Failed { sent: false }` still comes.
    panicking.times.store(1, Ordering::SeqCst);
    assert!(call_panics(&w, &client));
    assert_eq!(
        recorder.kinds(),
        ["started", "failed", "breaker_opened", "started", "failed"]
    );
    recorder.check_contract().unwrap();
    assert_eq!(health.snapshot("api").unwrap().in_flight, 0);
    assert_eq!(w.transport.request_count(), 1);
}

#[test]
fn an_observer_that_panics_on_every_event_does_not_abort_the_process() {
    // The `Started` panic unwinds through the send's guard, whose `Cancelled` panics
    // again: out of a destructor during unwinding, that would abort the process.
    let (w, health, recorder, client) = set_up(Reply::ok(), Panicking::on("any", u32::MAX));
    for _ in 0..3 {
        assert!(call_panics(&w, &client));
    }
    assert_eq!(
        recorder.kinds(),
        [
            "started",
            "cancelled",
            "started",
            "cancelled",
            "started",
            "cancelled"
        ]
    );
    recorder.check_contract().unwrap();
    assert_eq!(client.in_flight(), 0);
    assert_eq!(health.snapshot("api").unwrap().in_flight, 0);
}

#[test]
fn a_panic_on_a_terminal_event_and_again_on_its_transition_does_not_abort_the_process() {
    // The second panic comes from the transition's guard as the first unwinds.
    let (w, health, recorder, client) = set_up(
        Reply::status(503),
        Panicking::on("failed|breaker_opened", u32::MAX),
    );
    assert!(call_panics(&w, &client));
    assert_eq!(recorder.kinds(), ["started", "failed", "breaker_opened"]);
    recorder.check_contract().unwrap();
    assert!(matches!(client.breaker_state(), BreakerState::Open { .. }));
    assert_eq!(health.snapshot("api").unwrap().in_flight, 0);
}

#[test]
fn a_refusal_whose_started_and_failed_both_panic_does_not_abort_the_process() {
    // The refusal's `Failed` comes from its guard as the `Started` panic unwinds.
    let panicking = Panicking::on("started|failed", 0);
    let (w, health, recorder, client) = set_up(Reply::status(503), Arc::clone(&panicking));
    assert!(!call_panics(&w, &client), "the 503 opens the breaker");
    panicking.times.store(u32::MAX, Ordering::SeqCst);
    for _ in 0..3 {
        assert!(call_panics(&w, &client));
    }
    assert_eq!(
        recorder.kinds(),
        [
            "started",
            "failed",
            "breaker_opened",
            "started",
            "failed",
            "started",
            "failed",
            "started",
            "failed"
        ]
    );
    recorder.check_contract().unwrap();
    assert_eq!(health.snapshot("api").unwrap().in_flight, 0);
    assert_eq!(w.transport.request_count(), 1);
}

#[test]
fn a_fanout_feeds_every_observer_even_after_one_panics_then_passes_the_panic_on() {
    quiet_panics_starting_with("observer panics on");
    let recorder = RecordingObserver::new();
    let fanout = Fanout::default()
        .with(Panicking::on("any", u32::MAX))
        .with(Arc::new(recorder.clone()));
    let event = TransportEvent::new(
        vantage_api_pool::Instant::ORIGIN,
        None,
        vantage_api_pool::EventKind::WritePushed,
    );
    let heard = catch_unwind(AssertUnwindSafe(|| fanout.on_event("api", &event)));
    let panic = heard.expect_err("the first observer's panic goes on");
    assert_eq!(
        panic.downcast_ref::<String>().map(String::as_str),
        Some("observer panics on write_pushed")
    );
    assert_eq!(
        recorder.kinds(),
        ["write_pushed"],
        "the second one heard it"
    );
}

#[test]
fn a_panic_on_a_token_fetch_still_wakes_the_calls_that_waited_for_it() {
    quiet_panics_starting_with("observer panics on");
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let recorder = RecordingObserver::new();
    let fanout = Fanout::default()
        .with(Arc::new(recorder.clone()))
        .with(Panicking::on("token_fetch_ended", 1));
    let rt = w.rt.clone();
    let source = token_fn(move || {
        let rt = rt.clone();
        async move {
            rt.sleep(ms(50)).await;
            Ok::<_, AuthError>((AUTHORIZATION, HeaderValue::from_static("Bearer t1")))
        }
    });
    let client = ResilientClient::builder(w.transport.clone(), w.rt.clone())
        .observer("api", Arc::new(fanout))
        .auth(source)
        .build()
        .unwrap();
    // The first call runs the fetch, the second waits for it.
    let _fetching = w.spawn_call(&client, CallPolicy::background(), "/a");
    let waiting = w.spawn_call(&client, CallPolicy::background(), "/b");
    let run = catch_unwind(AssertUnwindSafe(|| w.rt.run_until(at(secs(1)))));
    assert!(
        run.is_err(),
        "the panic reaches the task that ran the fetch"
    );
    w.rt.run_until(at(secs(2))).unwrap();
    assert!(waiting.is_finished(), "the waiter was woken all the same");
    w.rt.block_on(waiting).unwrap().unwrap();
    let paths: Vec<_> = w
        .transport
        .requests()
        .iter()
        .map(|r| r.path.to_string())
        .collect();
    assert_eq!(paths, ["/b"]);
    assert_eq!(client.token_fetches(), 1, "the token it fetched is kept");
    assert!(recorder.kinds().contains(&"token_fetch_ended"));
    recorder.check_contract().unwrap();
}

/// A waker whose `wake` panics (an executor's bug).
struct PanickingWaker;

impl std::task::Wake for PanickingWaker {
    fn wake(self: Arc<Self>) {
        panic!("observer panics on: a waker panics");
    }
}

#[test]
fn a_waker_that_panics_as_an_answer_closes_the_breaker_cannot_keep_the_report_from_being_made() {
    // A GET sent at 0 is answered 200 at 2 s, after five 503s opened the breaker
    // for 60 s and a call began waiting out that cooldown under a waker that
    // panics. The answer closes the breaker and wakes that call: its send's
    // `Succeeded` and the `BreakerClosed` are reported first, then the waker's
    // panic reaches the caller.
    quiet_panics_starting_with("observer panics on");
    let w = World::new();
    w.transport.push(Reply::ok().after(secs(2)));
    w.transport.push_many((0..5).map(|_| Reply::status(503)));
    w.transport.default_reply(Reply::ok());
    let client = w.builder().breaker(5, secs(60), secs(60)).build().unwrap();
    let (background, essential) = (CallPolicy::background(), CallPolicy::essential());
    let mut noop = std::task::Context::from_waker(std::task::Waker::noop());
    let mut slow = Box::pin(client.execute_with(&background, |h| h.get("/slow")));
    assert!(slow.as_mut().poll(&mut noop).is_pending());
    for _ in 0..5 {
        let opening = client.execute_with(&background, |h| h.get("/x"));
        assert!(w.rt.block_on(opening).unwrap().is_err());
    }
    let mut waiting = Box::pin(client.execute_with(&essential, |h| h.get("/waiting")));
    let panicking = std::task::Waker::from(Arc::new(PanickingWaker));
    assert!(
        waiting
            .as_mut()
            .poll(&mut std::task::Context::from_waker(&panicking))
            .is_pending()
    );
    w.rt.run_until(at(secs(3))).unwrap();
    let polled = catch_unwind(AssertUnwindSafe(|| slow.as_mut().poll(&mut noop)));
    assert!(polled.is_err(), "the waker's panic reached the caller");
    assert_eq!(client.breaker_state(), BreakerState::Closed);
    let slow_call: Vec<_> = w
        .events()
        .iter()
        .filter(|e| e.call == Some(vantage_api_pool::CallId(1)))
        .map(|e| e.kind.name())
        .collect();
    assert_eq!(slow_call, ["started", "succeeded", "breaker_closed"]);
    drop((slow, waiting));
    w.assert_contract();
}
