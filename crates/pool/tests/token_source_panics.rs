//! A token source whose fetch panics: the panic reaches the caller that ran the fetch,
//! and the callers waiting on that fetch take it over instead of waiting for ever. A
//! clock that panics as a fetch ends or as a call is dropped: nothing aborts, and
//! the observer still hears every end it is owed.
//!
//! Native only: wasm32 aborts on a panic.
#![cfg(not(target_arch = "wasm32"))]

mod common;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::*;
use futures::FutureExt;
use http::{HeaderValue, header::AUTHORIZATION};
use vantage_api_pool::auth::{AuthError, token_fn};
use vantage_api_pool::{
    CallPolicy, EventKind, Fanout, Instant, ResilientClient, Runtime, TokenFetchOutcome,
    TokenFetchReason, TokenSource, TransportEvent, TransportObserver,
};
use vantage_api_pool_testkit::{Reply, ScriptedRequest, VirtualRuntime};

/// Fetch `n` (from 1) gives `Bearer t{n}` after 50 ms; the one numbered `panics_on`
/// panics instead.
fn source(
    rt: &VirtualRuntime,
    fetches: &Arc<AtomicU32>,
    panics_on: u32,
) -> impl TokenSource + use<> {
    quiet_panics_starting_with("token source panics");
    let (rt, fetches) = (rt.clone(), Arc::clone(fetches));
    token_fn(move || {
        let rt = rt.clone();
        let n = fetches.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            rt.sleep(ms(50)).await;
            if n == panics_on {
                panic!("token source panics on fetch {n}");
            }
            let value = HeaderValue::from_str(&format!("Bearer t{n}")).unwrap();
            Ok::<_, AuthError>((AUTHORIZATION, value))
        }
    })
}

/// The `Authorization` header of each request the server got, in order.
fn tokens_sent(w: &World) -> Vec<HeaderValue> {
    w.transport
        .requests()
        .iter()
        .map(|r| r.headers[AUTHORIZATION].clone())
        .collect()
}

fn bearer(request: &ScriptedRequest) -> Option<&str> {
    request.headers().get(AUTHORIZATION)?.to_str().ok()
}

/// A client whose token source panics on fetch `panics_on`; one call to `/a` (the
/// one that runs into the panic) and one to `/b` started together and driven to the
/// end. Whether the first panicked, whether the second succeeded, and how many fetches
/// there were.
fn two_calls(w: &World, panics_on: u32) -> (bool, bool, u32, Client<impl TokenSource + use<>>) {
    let fetches = Arc::new(AtomicU32::new(0));
    let client = w
        .builder()
        .auth(source(&w.rt, &fetches, panics_on))
        .build()
        .unwrap();
    let (panicked, succeeded) = race(w, &client);
    (panicked, succeeded, fetches.load(Ordering::SeqCst), client)
}

/// One call of `client` to `/a` and one to `/b`, started together and driven to
/// the end: whether the first panicked, whether the second succeeded.
fn race<A: TokenSource + 'static>(w: &World, client: &Client<A>) -> (bool, bool) {
    let running = client.clone();
    let first = w.rt.spawn(async move {
        AssertUnwindSafe(running.execute_with(&CallPolicy::background(), |h| h.get("/a")))
            .catch_unwind()
            .await
            .is_err()
    });
    let second = w.spawn_call(client, CallPolicy::background(), "/b");
    w.rt.run().unwrap();
    let panicked = w.rt.block_on(first).unwrap();
    (panicked, w.rt.block_on(second).unwrap().is_ok())
}

#[test]
fn a_first_fetch_that_panics_is_taken_over_by_a_waiting_caller() {
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let (panicked, succeeded, fetches, client) = two_calls(&w, 1);
    assert!(panicked, "the fetching caller panicked");
    assert!(succeeded);
    assert_eq!(fetches, 2);
    assert_eq!(tokens_sent(&w), ["Bearer t2"]);
    // The fetch that panicked is reported so, from its caller's drop; the waiter's
    // own fetch brought the first token.
    let fetch_ends: Vec<_> = w
        .events()
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::TokenFetchEnded {
                reason, outcome, ..
            } => Some((reason, outcome.name())),
            _ => None,
        })
        .collect();
    assert_eq!(
        fetch_ends,
        [
            (TokenFetchReason::First, "panicked"),
            (TokenFetchReason::First, "fetched")
        ]
    );
    // The token the waiter fetched is cached for the next call.
    w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
        .unwrap()
        .unwrap();
    assert_eq!(client.token_fetches(), 2);
    w.assert_contract();
}

#[test]
fn a_refresh_that_panics_is_taken_over_by_a_replay_waiting_on_it() {
    let w = World::new();
    w.transport
        .respond_with(|request, _| match bearer(request) {
            Some("Bearer t3") => Reply::ok().after(ms(10)),
            _ => Reply::status(401).after(ms(10)),
        });
    let (panicked, succeeded, fetches, _) = two_calls(&w, 2);
    assert!(panicked, "the refreshing caller panicked");
    assert!(succeeded);
    assert_eq!(fetches, 3);
    w.assert_contract();
}

/// Panics when it hears of a fetch that a panic unwound: while that first panic
/// still unwinds.
struct PanicsOnPanickedFetch;

impl TransportObserver for PanicsOnPanickedFetch {
    fn on_event(&self, _api: &str, event: &TransportEvent) {
        if let EventKind::TokenFetchEnded {
            outcome: TokenFetchOutcome::Panicked,
            ..
        } = event.kind
        {
            panic!("observer panics on a panicked fetch");
        }
    }
}

#[test]
fn an_observer_that_panics_on_the_panicked_fetch_does_not_abort_and_the_waiter_goes_on() {
    // The report comes from the fetching caller's drop while the source's panic
    // unwinds: a second panic there would abort the process, so it is caught.
    quiet_panics_starting_with("observer panics");
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let fetches = Arc::new(AtomicU32::new(0));
    let fanout = Fanout::default()
        .with(Arc::new(w.observer.clone()))
        .with(Arc::new(PanicsOnPanickedFetch));
    let client = ResilientClient::builder(w.transport.clone(), w.rt.clone())
        .observer("api", Arc::new(fanout))
        .auth(source(&w.rt, &fetches, 1))
        .build()
        .unwrap();
    let (panicked, succeeded) = race(&w, &client);
    assert!(panicked, "the source's panic reached its caller");
    assert!(succeeded);
    let outcomes: Vec<_> = w
        .events()
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::TokenFetchEnded { outcome, .. } => Some(outcome.name()),
            _ => None,
        })
        .collect();
    assert_eq!(outcomes, ["panicked", "fetched"]);
    w.assert_contract();
}

/// The testkit's clock, which panics on every reading while `broken` is set.
#[derive(Clone)]
struct BreakingClock {
    rt: VirtualRuntime,
    broken: Arc<std::sync::atomic::AtomicBool>,
}

impl Runtime for BreakingClock {
    fn now(&self) -> Instant {
        assert!(
            !self.broken.load(Ordering::SeqCst),
            "token source panics: the clock broke"
        );
        self.rt.now()
    }

    fn wall_clock(&self) -> std::time::SystemTime {
        self.rt.wall_clock()
    }

    fn sleep_until(&self, deadline: Instant) -> impl std::future::Future<Output = ()> {
        self.rt.sleep_until(deadline)
    }

    fn random(&self) -> f64 {
        self.rt.random()
    }
}

#[test]
fn a_clock_that_keeps_panicking_as_a_fetch_ends_aborts_nothing_and_leaves_no_fetch_running() {
    // The fetch's end reads the clock, which panics; so does every reading while
    // that panic unwinds (the fetch's guard, the call's end for its observer). Out
    // of a destructor any of them would abort the process.
    quiet_panics_starting_with("token source panics");
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let clock = BreakingClock {
        rt: w.rt.clone(),
        broken: Arc::new(std::sync::atomic::AtomicBool::new(false)),
    };
    let (rt, broken, fetches) = (
        w.rt.clone(),
        Arc::clone(&clock.broken),
        Arc::new(AtomicU32::new(0)),
    );
    let counted = Arc::clone(&fetches);
    let source = token_fn(move || {
        let (rt, broken) = (rt.clone(), Arc::clone(&broken));
        let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            rt.sleep(ms(50)).await;
            // The first fetch breaks the clock just as it ends.
            broken.store(n == 1, Ordering::SeqCst);
            let value = HeaderValue::from_str(&format!("Bearer t{n}")).unwrap();
            Ok::<_, AuthError>((AUTHORIZATION, value))
        }
    });
    let client = ResilientClient::builder(w.transport.clone(), clock.clone())
        .observer("api", Arc::new(w.observer.clone()))
        .auth(source)
        .build()
        .unwrap();
    let policy = CallPolicy::background();
    let call = || client.execute_with(&policy, |h| h.get("/a"));
    let unwound = std::panic::catch_unwind(AssertUnwindSafe(|| w.rt.block_on(call())));
    assert!(unwound.is_err(), "the clock's panic reached the caller");
    // The clock mended, the next call fetches anew and goes out with its token.
    clock.broken.store(false, Ordering::SeqCst);
    assert_eq!(client.token_fetch_running_since(), None);
    w.rt.block_on(call()).unwrap().unwrap();
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    assert_eq!(tokens_sent(&w), ["Bearer t2"]);
    // The first call reached the gate and owes an end, though it sent nothing (the
    // checker cannot miss the end of a call it never heard of): `Panicked`, at its
    // start, the last reading it kept.
    assert_eq!(
        end_outcomes(&w),
        [("panicked", ms(0)), ("succeeded", ms(100))]
    );
    w.assert_contract();
}

/// Each recorded call end's outcome and time.
fn end_outcomes(w: &World) -> Vec<(&'static str, Duration)> {
    w.observer
        .call_ends()
        .iter()
        .map(|e| {
            let at = e.end.at.saturating_duration_since(Instant::ORIGIN);
            (e.end.outcome.name(), at)
        })
        .collect()
}

/// A client over a [`BreakingClock`] whose one call, polled once at 10 ms, is
/// waiting at the gate (`at_gate`: for a cooldown) or in its send, and is dropped
/// while the clock panics; what the observer heard, and whether the clock's panic
/// reached the dropper.
fn dropped_while_the_clock_panics(at_gate: bool) -> (World, bool) {
    quiet_panics_starting_with("token source panics");
    let w = World::new();
    w.transport.default_reply(Reply::stall());
    let clock = BreakingClock {
        rt: w.rt.clone(),
        broken: Arc::new(std::sync::atomic::AtomicBool::new(false)),
    };
    let client = ResilientClient::builder(w.transport.clone(), clock.clone())
        .observer("api", Arc::new(w.observer.clone()))
        .breaker(1, secs(5), secs(60))
        .build()
        .unwrap();
    if at_gate {
        w.transport.push(Reply::status(503));
        let policy = CallPolicy::background();
        let opened = client.execute_with(&policy, |h| h.get("/a"));
        assert!(w.rt.block_on(opened).unwrap().is_err());
    }
    w.rt.run_until(Instant::ORIGIN + ms(10)).unwrap();
    let policy = CallPolicy::essential();
    let mut call = Box::pin(client.execute_with(&policy, |h| h.get("/b")));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(call.as_mut().poll(&mut cx).is_pending());
    w.rt.run_until(Instant::ORIGIN + ms(30)).unwrap();
    clock.broken.store(true, Ordering::SeqCst);
    let unwound = std::panic::catch_unwind(AssertUnwindSafe(|| drop(call))).is_err();
    clock.broken.store(false, Ordering::SeqCst);
    (w, unwound)
}

#[test]
fn a_call_dropped_in_its_send_while_the_clock_panics_still_reports_cancelled_and_its_end() {
    // Its send's `Cancelled` and its end fall back on the readings they kept (the
    // `Started`'s, the call's start, both 10 ms); the end is `Panicked`, and the
    // clock's panic goes on to whoever dropped the call.
    let (w, unwound) = dropped_while_the_clock_panics(false);
    assert!(unwound, "the clock's panic reached the dropper");
    let last = w.observer.events().last().cloned().unwrap();
    assert_eq!(w.observer.kinds(), ["started", "cancelled"]);
    assert_eq!(last.event.at, Instant::ORIGIN + ms(10));
    assert_eq!(end_outcomes(&w), [("panicked", ms(10))]);
    w.assert_contract();
}

#[test]
fn a_call_dropped_at_the_gate_while_the_clock_panics_still_reports_its_end() {
    let (w, unwound) = dropped_while_the_clock_panics(true);
    assert!(unwound, "the clock's panic reached the dropper");
    assert_eq!(w.observer.kinds(), ["started", "failed", "breaker_opened"]);
    assert_eq!(end_outcomes(&w)[1..], [("panicked", ms(10))]);
    w.assert_contract();
}

/// An essential call answered 503 at 50 ms (its retry's send stalls), polled by
/// hand at 0 and at each of `polls_at`, then dropped at 2 s while the clock panics:
/// what the observer heard (the events' kinds and times), and the call's end.
fn dropped_after_a_503_while_the_clock_panics(
    polls_at: &[u64],
) -> (World, Vec<(&'static str, Duration)>) {
    quiet_panics_starting_with("token source panics");
    let w = World::new();
    w.transport
        .push(Reply::status(503).after(ms(50)))
        .default_reply(Reply::stall());
    let clock = BreakingClock {
        rt: w.rt.clone(),
        broken: Arc::new(std::sync::atomic::AtomicBool::new(false)),
    };
    let client = ResilientClient::builder(w.transport.clone(), clock.clone())
        .observer("api", Arc::new(w.observer.clone()))
        .build()
        .unwrap();
    let policy = CallPolicy::essential();
    let mut call = Box::pin(client.execute_with(&policy, |h| h.get("/b")));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    for &at in [0].iter().chain(polls_at) {
        w.rt.run_until(Instant::ORIGIN + ms(at)).unwrap();
        assert!(call.as_mut().poll(&mut cx).is_pending());
    }
    w.rt.run_until(Instant::ORIGIN + secs(2)).unwrap();
    clock.broken.store(true, Ordering::SeqCst);
    let unwound = std::panic::catch_unwind(AssertUnwindSafe(|| drop(call))).is_err();
    clock.broken.store(false, Ordering::SeqCst);
    assert!(unwound, "the clock's panic reached the dropper");
    let heard = w
        .observer
        .events()
        .iter()
        .map(|e| (e.event.kind.name(), e.event.at.since_origin()))
        .collect();
    (w, heard)
}

#[test]
fn a_call_dropped_in_its_back_off_while_the_clock_panics_ends_at_its_last_event() {
    // The end falls back on the failure's reading (50 ms), not on the call's start.
    let (w, heard) = dropped_after_a_503_while_the_clock_panics(&[50]);
    assert_eq!(
        heard,
        [
            ("started", ms(0)),
            ("failed", ms(50)),
            ("retry_scheduled", ms(50))
        ]
    );
    assert_eq!(end_outcomes(&w), [("panicked", ms(50))]);
    w.assert_contract();
}

#[test]
fn a_call_dropped_in_a_later_send_while_the_clock_panics_ends_at_its_last_event() {
    // Polled again at 1 s, after its back-off: its second send starts then, and both
    // that send's `Cancelled` and the call's end fall back on that reading.
    let (w, heard) = dropped_after_a_503_while_the_clock_panics(&[50, 1_000]);
    assert_eq!(heard[3..], [("started", secs(1)), ("cancelled", secs(1))]);
    assert_eq!(end_outcomes(&w), [("panicked", secs(1))]);
    w.assert_contract();
}
