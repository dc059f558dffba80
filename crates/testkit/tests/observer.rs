//! The recording observer and its contract check, on hand-built event sequences.
//!
//! `EventKind::Failed` carries a `ClientError`, which only the pool can build, so the
//! rules about failures are exercised here through their violations, through
//! `Succeeded` / `Cancelled`, and (for redials) through a `Failed` recorded from a
//! real call.

use std::time::Duration;

use http::StatusCode;
use vantage_api_pool::auth::AuthError;
use vantage_api_pool::{
    CallEnd, CallId, CallOutcome, EventKind, Instant, TokenFetchOutcome, TokenFetchReason,
    TransportErrorKind, TransportEvent, TransportObserver,
};
use vantage_api_pool_testkit::{ContractRule, RecordingObserver, Reply};

fn at(ms: u64) -> Instant {
    Instant::ORIGIN + Duration::from_millis(ms)
}

fn started(send: u32, attempt: u32) -> EventKind {
    EventKind::Started { send, attempt }
}

fn succeeded(send: u32, attempt: u32) -> EventKind {
    EventKind::Succeeded {
        send,
        attempt,
        status: StatusCode::OK,
        ms: 1,
        bytes: None,
    }
}

fn cancelled(send: u32, attempt: u32) -> EventKind {
    EventKind::Cancelled { send, attempt }
}

/// Feeds `(ms, call, kind)` events for api "api" into a fresh observer.
fn observe(events: Vec<(u64, u64, EventKind)>) -> RecordingObserver {
    let observer = RecordingObserver::new();
    for (ms, call, kind) in events {
        observer.on_event(
            "api",
            &TransportEvent::new(at(ms), Some(CallId(call)), kind),
        );
    }
    observer
}

/// Ends every call in `observer`'s record as `Cancelled` (which agrees with any
/// events), numbered by its last `Started`, at its last event: a record fed by hand
/// then keeps the rule that every call has its end.
fn end_calls(observer: &RecordingObserver) {
    /// (api, call) -> (first at, last at, last send, last attempt).
    type Seen = ((String, CallId), (Instant, Instant, u32, u32));
    // In order of first appearance.
    let mut calls: Vec<Seen> = Vec::new();
    for recorded in observer.events() {
        let event = recorded.event;
        let counts = event.kind.send_and_attempt().is_some()
            || matches!(event.kind, EventKind::RetryScheduled { .. });
        let Some(call) = event.call.filter(|_| counts) else {
            continue;
        };
        let key = (recorded.api.to_string(), call);
        let i = match calls.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                calls.push((key, (event.at, event.at, 0, 0)));
                calls.len() - 1
            }
        };
        let state = &mut calls[i].1;
        state.1 = event.at;
        if let EventKind::Started { send, attempt } = event.kind {
            (state.2, state.3) = (send, attempt);
        }
    }
    for ((api, call), (first, last, sends, attempts)) in calls {
        let end = CallEnd::new(call, first, last, sends, attempts, CallOutcome::Cancelled);
        observer.on_call_end(&api, &end);
    }
}

/// [`observe`], every call then ended by [`end_calls`].
fn observe_ended(events: Vec<(u64, u64, EventKind)>) -> RecordingObserver {
    let observer = observe(events);
    end_calls(&observer);
    observer
}

fn retry(attempt: u32) -> EventKind {
    EventKind::RetryScheduled {
        attempt,
        after: Duration::from_millis(1),
    }
}

/// The events of one real call (only the pool builds a `ClientError`): `replies` in
/// order, then 200s, under a policy of two retries 1 ms apart; with `auth`, a token
/// source that can refresh after a 401 (its fetches, which carry no call, left
/// out). Checked against the contract.
fn recorded(replies: &[Reply], auth: bool) -> Vec<EventKind> {
    recorded_with(replies, auth, false)
}

/// [`recorded`], with a breaker that opens on the first failure (for a minute) when
/// `breaker`.
fn recorded_with(replies: &[Reply], auth: bool, breaker: bool) -> Vec<EventKind> {
    use std::sync::Arc;
    use vantage_api_pool::auth::token_fn;
    use vantage_api_pool::http::HeaderValue;
    use vantage_api_pool::{CallPolicy, ResilientClient, RetryPolicy};
    use vantage_api_pool_testkit::{ScriptedHttp, ScriptedTransport, VirtualRuntime};

    let rt = VirtualRuntime::new();
    let transport = ScriptedTransport::new(&rt);
    transport.push_many(replies.iter().cloned());
    transport.default_reply(Reply::ok());
    let observer = RecordingObserver::new();
    let mut builder =
        ResilientClient::builder(transport, rt.clone()).observer("api", Arc::new(observer.clone()));
    if breaker {
        builder = builder.breaker(1, Duration::from_secs(60), Duration::from_secs(60));
    }
    let policy = CallPolicy::bounded(
        RetryPolicy::new(2, Duration::from_millis(1), Duration::from_millis(1)).unwrap(),
    );
    let get = |h: &ScriptedHttp| h.get("/x");
    if auth {
        let client = builder
            .auth(token_fn(|| async {
                Ok((
                    vantage_api_pool::http::header::AUTHORIZATION,
                    HeaderValue::from_static("Bearer t"),
                ))
            }))
            .build()
            .unwrap();
        let _ = rt.block_on(client.execute_with(&policy, get)).unwrap();
    } else {
        let client = builder.build().unwrap();
        let _ = rt.block_on(client.execute_with(&policy, get)).unwrap();
    }
    observer.check_contract().unwrap();
    observer
        .events()
        .into_iter()
        // The call's own events: a token fetch (with `auth`) belongs to no call.
        .filter(|r| r.event.call.is_some())
        .map(|r| r.event.kind)
        .collect()
}

/// The rule, index and send of the first violation.
fn first_violation(events: Vec<(u64, u64, EventKind)>) -> (ContractRule, usize, Option<u32>) {
    let v = observe(events).check_contract().unwrap_err();
    (v.rule, v.index, v.send)
}

#[test]
fn keeps_events_in_order_with_their_api_key() {
    let observer = RecordingObserver::new();
    observer.on_event(
        "a",
        &TransportEvent::new(at(0), Some(CallId(1)), started(1, 1)),
    );
    observer.on_event(
        "b",
        &TransportEvent::new(at(1), Some(CallId(1)), started(1, 1)),
    );
    observer.on_event(
        "a",
        &TransportEvent::new(at(2), Some(CallId(1)), succeeded(1, 1)),
    );
    observer.on_event(
        "b",
        &TransportEvent::new(at(3), None, EventKind::RowsPulled { n: 3 }),
    );
    let events = observer.events();
    let apis: Vec<&str> = events.iter().map(|e| &*e.api).collect();
    assert_eq!(apis, ["a", "b", "a", "b"]);
    assert_eq!(
        observer.kinds(),
        ["started", "started", "succeeded", "rows_pulled"]
    );
    assert_eq!(events[2].event.at, at(2));
    assert_eq!(observer.for_call(CallId(1)).len(), 3);
    assert_eq!(observer.len(), 4);
    // Call 1 of api "b" is still in flight.
    let v = observer.check_contract().unwrap_err();
    assert_eq!(
        (v.rule, v.index, &*v.api),
        (ContractRule::NeverEnded, 1, "b")
    );
    assert!(observer.check_contract_so_far().is_ok());

    observer.clear();
    assert!(observer.is_empty());
    assert_eq!(observer.seen(), 4);
    assert!(observer.check_contract().is_ok());
}

#[test]
fn recording_off_keeps_only_the_count() {
    let observer = RecordingObserver::new();
    let clone = observer.clone();
    clone.record(false);
    observer.on_event(
        "a",
        &TransportEvent::new(at(0), None, EventKind::WritePushed),
    );
    clone.record(true);
    observer.on_event(
        "a",
        &TransportEvent::new(at(0), None, EventKind::BreakerClosed),
    );
    assert_eq!(observer.kinds(), ["breaker_closed"]);
    assert_eq!(clone.seen(), 2);
}

#[test]
fn valid_sequences_pass() {
    // Interleaved calls, a cancel, breaker events carrying a call, reports.
    let observer = observe(vec![
        (0, 1, started(1, 1)),
        (0, 2, started(1, 1)),
        (5, 2, cancelled(1, 1)),
        (7, 1, succeeded(1, 1)),
        (7, 1, EventKind::BreakerClosed),
    ]);
    observer.on_event(
        "api",
        &TransportEvent::new(at(9), None, EventKind::WritePushed),
    );
    // Another api may run on its own clock.
    observer.on_event(
        "other",
        &TransportEvent::new(at(0), Some(CallId(1)), started(1, 1)),
    );
    observer.on_event(
        "other",
        &TransportEvent::new(at(0), Some(CallId(1)), succeeded(1, 1)),
    );
    end_calls(&observer);
    assert_eq!(observer.check_contract(), Ok(()));
}

#[test]
fn time_never_goes_backwards_within_a_call() {
    assert_eq!(
        first_violation(vec![(10, 1, started(1, 1)), (9, 1, succeeded(1, 1)),]),
        (ContractRule::TimeWentBackwards, 1, Some(1))
    );
    // Reported from one thread, two calls' events keep time order too.
    assert_eq!(
        first_violation(vec![(10, 1, started(1, 1)), (9, 2, started(1, 1))]),
        (ContractRule::TimeWentBackwards, 1, Some(1))
    );
    // From two threads (two tasks on a multi-thread runtime), they may interleave
    // out of time order.
    let observer = observe(vec![(10, 1, started(1, 1)), (12, 1, succeeded(1, 1))]);
    let other = observer.clone();
    std::thread::spawn(move || {
        for (ms, kind) in [(9, started(1, 1)), (11, succeeded(1, 1))] {
            other.on_event("api", &TransportEvent::new(at(ms), Some(CallId(2)), kind));
        }
    })
    .join()
    .unwrap();
    end_calls(&observer);
    assert_eq!(observer.check_contract(), Ok(()));
}

#[test]
fn per_send_events_need_a_call_id() {
    let observer = RecordingObserver::new();
    observer.on_event("api", &TransportEvent::new(at(0), None, started(1, 1)));
    let v = observer.check_contract().unwrap_err();
    assert_eq!((v.rule, v.call), (ContractRule::MissingCallId, None));
    assert_eq!(
        v.to_string(),
        "observer contract broken at event #0 (api `api`, send 1, started at +0ns): \
         per-send events and RetryScheduled carry a call id"
    );
}

#[test]
fn sends_are_numbered_one_two_three() {
    assert_eq!(
        first_violation(vec![(0, 1, started(2, 1))]),
        (ContractRule::SendOutOfOrder, 0, Some(2))
    );
    assert_eq!(
        first_violation(vec![(0, 1, started(0, 1))]),
        (ContractRule::SendOutOfOrder, 0, Some(0))
    );
}

#[test]
fn a_send_starts_only_after_the_previous_one_ended() {
    assert_eq!(
        first_violation(vec![(0, 1, started(1, 1)), (1, 1, started(2, 2))]),
        (ContractRule::StartedWhileInFlight, 1, Some(2))
    );
}

#[test]
fn a_terminal_needs_its_started() {
    assert_eq!(
        first_violation(vec![(0, 1, succeeded(1, 1))]),
        (ContractRule::TerminalWithoutStarted, 0, Some(1))
    );
    // Send 2 never started while send 1 is in flight.
    assert_eq!(
        first_violation(vec![(0, 1, started(1, 1)), (0, 1, cancelled(2, 1))]),
        (ContractRule::TerminalWithoutStarted, 1, Some(2))
    );
    // Another call's Started does not count.
    assert_eq!(
        first_violation(vec![(0, 1, started(1, 1)), (0, 2, succeeded(1, 1))]),
        (ContractRule::TerminalWithoutStarted, 1, Some(1))
    );
    // There is no send 0.
    assert_eq!(
        first_violation(vec![(0, 1, cancelled(0, 0))]),
        (ContractRule::TerminalWithoutStarted, 0, Some(0))
    );
}

#[test]
fn a_send_has_one_terminal() {
    assert_eq!(
        first_violation(vec![
            (0, 1, started(1, 1)),
            (1, 1, succeeded(1, 1)),
            (2, 1, cancelled(1, 1)),
        ]),
        (ContractRule::SecondTerminal, 2, Some(1))
    );
    // A terminal for an earlier send while a later one is in flight: that earlier
    // send already ended.
    let failed = recorded(&[Reply::status(503)], false)[1].clone();
    assert_eq!(
        first_violation(vec![
            (0, 1, started(1, 1)),
            (1, 1, failed),
            (1, 1, retry(2)),
            (2, 1, started(2, 2)),
            (3, 1, cancelled(1, 1)),
        ]),
        (ContractRule::SecondTerminal, 4, Some(1))
    );
}

#[test]
fn attempts_follow() {
    // The first attempt is 1.
    assert_eq!(
        first_violation(vec![(0, 1, started(1, 2))]),
        (ContractRule::AttemptMismatch, 0, Some(1))
    );
    // A terminal repeats its Started's attempt.
    assert_eq!(
        first_violation(vec![(0, 1, started(1, 1)), (1, 1, succeeded(1, 2))]),
        (ContractRule::AttemptMismatch, 1, Some(1))
    );
    // A retry is announced with the next attempt.
    let failed = recorded(&[Reply::status(503)], false)[1].clone();
    assert_eq!(
        first_violation(vec![
            (0, 1, started(1, 1)),
            (1, 1, failed),
            (1, 1, retry(3)),
        ]),
        (ContractRule::AttemptMismatch, 2, None)
    );
}

#[test]
fn a_redial_follows_a_failure_of_the_previous_send() {
    let redial = |send, attempt| EventKind::Redialing { send, attempt };
    assert_eq!(
        first_violation(vec![(0, 1, redial(2, 1))]),
        (ContractRule::RedialNotAfterFailure, 0, Some(2))
    );
    assert_eq!(
        first_violation(vec![(0, 1, started(1, 1)), (0, 1, redial(2, 1))]),
        (ContractRule::RedialNotAfterFailure, 1, Some(2))
    );
    // After a success the call is over.
    assert_eq!(
        first_violation(vec![
            (0, 1, started(1, 1)),
            (0, 1, succeeded(1, 1)),
            (0, 1, redial(2, 1)),
        ]),
        (ContractRule::EventAfterCallEnded, 2, Some(2))
    );
    // A redial announces the very next send, and repeats the failed attempt.
    let not_sent = recorded(
        &[Reply::fail(
            vantage_api_pool::TransportErrorKind::NotSent,
            "closed",
        )],
        false,
    )[1]
    .clone();
    assert_eq!(
        first_violation(vec![
            (0, 1, started(1, 1)),
            (0, 1, not_sent.clone()),
            (0, 1, redial(3, 1)),
        ]),
        (ContractRule::RedialNotAfterFailure, 2, Some(3))
    );
    assert_eq!(
        first_violation(vec![
            (0, 1, started(1, 1)),
            (0, 1, not_sent.clone()),
            (0, 1, redial(2, 2)),
            (0, 1, started(2, 2)),
            (0, 1, succeeded(2, 2)),
        ]),
        (ContractRule::AttemptMismatch, 2, Some(2))
    );
    // The failure was retried and send 2 has started: a Redialing for send 2 now is
    // not "right after a failure of send 1", whatever that failure was.
    assert_eq!(
        first_violation(timed(vec![
            started(1, 1),
            not_sent.clone(),
            retry(2),
            started(2, 2),
            redial(2, 1),
        ])),
        (ContractRule::RedialNotAfterFailure, 4, Some(2))
    );
}

#[test]
fn a_retry_is_scheduled_only_between_sends() {
    let retry = EventKind::RetryScheduled {
        attempt: 2,
        after: Duration::from_millis(250),
    };
    assert_eq!(
        first_violation(vec![(0, 1, started(1, 1)), (0, 1, retry)]),
        (ContractRule::RetryWhileInFlight, 1, None)
    );
}

/// `events` with each event at its index in ms, for call 1.
fn timed(events: Vec<EventKind>) -> Vec<(u64, u64, EventKind)> {
    events
        .into_iter()
        .enumerate()
        .map(|(i, kind)| (i as u64, 1, kind))
        .collect()
}

#[test]
fn a_retry_is_announced_once_right_after_its_failure() {
    // A 503, its RetryScheduled, the retry's send: valid as recorded.
    let real = recorded(&[Reply::status(503)], false);
    assert_eq!(
        real.iter().map(EventKind::name).collect::<Vec<_>>(),
        [
            "started",
            "failed",
            "retry_scheduled",
            "started",
            "succeeded"
        ]
    );
    // Without its RetryScheduled, the retry is unannounced.
    let mut unannounced = real.clone();
    unannounced.remove(2);
    assert_eq!(
        first_violation(timed(unannounced)),
        (ContractRule::RetryUnannounced, 2, Some(2))
    );
    // Announced twice.
    let mut twice = real.clone();
    twice.insert(2, retry(2));
    assert_eq!(
        first_violation(timed(twice)),
        (ContractRule::RetryNotAfterFailure, 3, None)
    );
    // A redial after a retry was scheduled.
    let mut redialed = real;
    redialed.insert(
        3,
        EventKind::Redialing {
            send: 2,
            attempt: 1,
        },
    );
    assert_eq!(
        first_violation(timed(redialed)),
        (ContractRule::RedialNotAfterFailure, 3, Some(2))
    );
}

#[test]
fn a_401_replay_needs_no_announcement_and_gets_none() {
    let real = recorded(&[Reply::status(401)], true);
    assert_eq!(
        real.iter().map(EventKind::name).collect::<Vec<_>>(),
        ["started", "failed", "started", "succeeded"]
    );
    let mut announced = real;
    announced.insert(2, retry(2));
    assert_eq!(
        first_violation(timed(announced)),
        (ContractRule::RetryNotAfterFailure, 2, None)
    );
}

/// `kind` (a per-send event) with another send and attempt number.
fn renumber(kind: &EventKind, new_send: u32, new_attempt: u32) -> EventKind {
    let mut kind = kind.clone();
    match &mut kind {
        EventKind::Started { send, attempt }
        | EventKind::Succeeded { send, attempt, .. }
        | EventKind::Failed { send, attempt, .. }
        | EventKind::Cancelled { send, attempt }
        | EventKind::Redialing { send, attempt } => {
            (*send, *attempt) = (new_send, new_attempt);
        }
        other => panic!("not a per-send event: {other:?}"),
    }
    kind
}

#[test]
fn a_call_replays_one_401_at_most() {
    // A real call: started, failed (401), started (the replay), succeeded.
    let real = recorded(&[Reply::status(401)], true);
    let (failed_401, succeeded) = (&real[1], &real[3]);
    let replays = |n: u32| {
        let mut events = Vec::new();
        for send in 1..=n {
            events.push(started(send, send));
            events.push(renumber(failed_401, send, send));
        }
        events.push(started(n + 1, n + 1));
        events.push(renumber(succeeded, n + 1, n + 1));
        timed(events)
    };
    assert!(observe_ended(replays(1)).check_contract().is_ok());
    // A second 401 in the call is final: a send after it breaks the rule.
    assert_eq!(
        first_violation(replays(2)),
        (ContractRule::SecondReplay, 4, Some(3))
    );
    // Also when a retry came between the two 401s.
    let mut events = vec![started(1, 1), renumber(failed_401, 1, 1), started(2, 2)];
    let failed_503 = recorded(&[Reply::status(503)], false)[1].clone();
    events.push(renumber(&failed_503, 2, 2));
    events.push(retry(3));
    events.push(started(3, 3));
    events.push(renumber(failed_401, 3, 3));
    events.push(started(4, 4));
    assert_eq!(
        first_violation(timed(events)),
        (ContractRule::SecondReplay, 7, Some(4))
    );
}

#[test]
fn a_call_redials_twice_at_most() {
    // A real call: started, failed (NotSent), redialing, started, succeeded.
    let real = recorded(&[Reply::fail(TransportErrorKind::NotSent, "stale")], false);
    assert_eq!(
        real.iter().map(EventKind::name).collect::<Vec<_>>(),
        ["started", "failed", "redialing", "started", "succeeded"]
    );
    let not_sent = &real[1];
    let redials = |n: u32| {
        let mut events = vec![started(1, 1), renumber(not_sent, 1, 1)];
        for send in 2..=n + 1 {
            events.push(EventKind::Redialing { send, attempt: 1 });
            events.push(started(send, 1));
            events.push(renumber(not_sent, send, 1));
        }
        timed(events)
    };
    assert_eq!(vantage_api_pool::classify::MAX_REDIALS, 2);
    assert!(observe_ended(redials(2)).check_contract().is_ok());
    assert_eq!(
        first_violation(redials(3)),
        (ContractRule::TooManyRedials, 8, Some(4))
    );
    // The pool keeps it: three NotSent in a row make two redials, then a retry.
    let real = recorded(
        &[
            Reply::fail(TransportErrorKind::NotSent, "stale"),
            Reply::fail(TransportErrorKind::NotSent, "stale"),
            Reply::fail(TransportErrorKind::NotSent, "stale"),
        ],
        false,
    );
    assert_eq!(
        real.iter().map(EventKind::name).collect::<Vec<_>>(),
        [
            "started",
            "failed",
            "redialing",
            "started",
            "failed",
            "redialing",
            "started",
            "failed",
            "retry_scheduled",
            "started",
            "succeeded"
        ]
    );
}

#[test]
fn only_a_not_sent_failure_is_redialed() {
    let mut real = recorded(&[Reply::status(503)], false);
    real.truncate(2); // started, failed (503)
    real.push(EventKind::Redialing {
        send: 2,
        attempt: 1,
    });
    assert_eq!(
        first_violation(timed(real)),
        (ContractRule::RedialNotAfterFailure, 2, Some(2))
    );
}

#[test]
fn an_unsent_failure_ends_the_call_and_took_no_time() {
    // A 503 opens the breaker (threshold 1); the retry is refused at the gate.
    let mut refused = recorded_with(&[Reply::status(503)], false, true);
    assert_eq!(
        refused.iter().map(EventKind::name).collect::<Vec<_>>(),
        [
            "started",
            "failed",
            "breaker_opened",
            "retry_scheduled",
            "started",
            "failed"
        ]
    );
    refused.remove(2);
    let unsent = refused[4].clone();
    assert!(matches!(
        unsent,
        EventKind::Failed {
            sent: false,
            ms: 0,
            ..
        }
    ));
    // Anything of the call after it breaks the contract.
    let mut after = refused.clone();
    after.push(started(3, 3));
    assert_eq!(
        first_violation(timed(after)),
        (ContractRule::EventAfterCallEnded, 5, Some(3))
    );
    let mut retried = refused;
    retried.push(retry(3));
    assert_eq!(
        first_violation(timed(retried)),
        (ContractRule::EventAfterCallEnded, 5, None)
    );
    // The same failure claiming time spent sending, even the least.
    let EventKind::Failed { error, .. } = unsent else {
        unreachable!("checked above")
    };
    for ms in [1, 1234] {
        let timed_unsent = EventKind::Failed {
            send: 1,
            attempt: 1,
            error: error.clone(),
            ms,
            sent: false,
        };
        assert_eq!(
            first_violation(timed(vec![started(1, 1), timed_unsent])),
            (ContractRule::UnsentFailureWithTime, 1, Some(1)),
            "ms: {ms}"
        );
    }
}

#[test]
fn a_breaker_transition_comes_right_after_the_send_that_caused_it() {
    // A real call: a 503 opens the breaker (threshold 1), then its retry is refused.
    let real = recorded_with(&[Reply::status(503)], false, true);
    assert_eq!(real[2].name(), "breaker_opened");
    // Before the failure it reports, or after another event of the call: refused.
    let mut early = real.clone();
    early.swap(1, 2);
    assert_eq!(
        first_violation(timed(early)),
        (ContractRule::TransitionNotAfterTerminal, 1, None)
    );
    let mut late = real.clone();
    late.swap(2, 3);
    assert_eq!(
        first_violation(timed(late)),
        (ContractRule::TransitionNotAfterTerminal, 3, None)
    );
    let closed = EventKind::BreakerClosed;
    for (events, index) in [
        // While its send is in flight.
        (vec![(0, 1, started(1, 1)), (1, 1, closed.clone())], 1),
        // Two for one send.
        (
            vec![
                (0, 1, started(1, 1)),
                (1, 1, succeeded(1, 1)),
                (1, 1, closed.clone()),
                (1, 1, closed.clone()),
            ],
            3,
        ),
        // After a cancelled send, which told the breaker nothing.
        (
            vec![
                (0, 1, started(1, 1)),
                (1, 1, cancelled(1, 1)),
                (1, 1, closed.clone()),
            ],
            2,
        ),
        // For a call that never sent.
        (vec![(0, 2, closed.clone())], 0),
        // After another call's send.
        (
            vec![
                (0, 1, started(1, 1)),
                (1, 1, succeeded(1, 1)),
                (1, 2, closed.clone()),
            ],
            2,
        ),
    ] {
        assert_eq!(
            first_violation(events),
            (ContractRule::TransitionNotAfterTerminal, index, None)
        );
    }
    // Without the call that caused it.
    for transition in [
        closed,
        EventKind::BreakerOpened {
            cooldown: Duration::from_secs(5),
        },
    ] {
        let observer = observe(vec![(0, 1, started(1, 1)), (1, 1, succeeded(1, 1))]);
        observer.on_event("api", &TransportEvent::new(at(1), None, transition));
        let v = observer.check_contract().unwrap_err();
        assert_eq!(
            (v.rule, v.index),
            (ContractRule::TransitionNotAfterTerminal, 2)
        );
    }
}

#[test]
fn a_reset_carries_no_call_and_may_come_anywhere() {
    // `reset_breaker` reports `BreakerReset` with no call: while a send is in
    // flight, and between a send's answer and the transition it caused, which then
    // still follows that answer.
    let observer = observe(vec![(0, 1, started(1, 1))]);
    let reset = || TransportEvent::new(at(1), None, EventKind::BreakerReset);
    observer.on_event("api", &reset());
    for (call, kind) in [(1, succeeded(1, 1)), (1, EventKind::BreakerClosed)] {
        observer.on_event("api", &TransportEvent::new(at(1), Some(CallId(call)), kind));
        observer.on_event("api", &reset());
    }
    end_calls(&observer);
    assert_eq!(observer.check_contract(), Ok(()));
    // With a call, it is refused.
    observer.on_event(
        "api",
        &TransportEvent::new(at(1), Some(CallId(1)), EventKind::BreakerReset),
    );
    let v = observer.check_contract().unwrap_err();
    assert_eq!((v.rule, v.index), (ContractRule::ResetWithCall, 6));
}

#[test]
fn a_token_fetch_carries_no_call_and_reports_each_generation_once() {
    let fetched = |generation: Option<u64>| EventKind::TokenFetchEnded {
        reason: TokenFetchReason::First,
        ms: 5,
        outcome: match generation {
            Some(generation) => TokenFetchOutcome::Fetched {
                generation,
                lifetime: None,
            },
            None => TokenFetchOutcome::Failed {
                error: AuthError::from("identity provider down").into(),
            },
        },
    };
    // Anywhere, even while a send is in flight; failures carry no generation (nor
    // do fetches given up), and another api numbers its tokens on its own.
    let observer = observe(vec![(0, 1, started(1, 1))]);
    for (api, generation) in [
        ("api", Some(1)),
        ("api", None),
        ("api", None),
        ("api", Some(2)),
    ] {
        observer.on_event(api, &TransportEvent::new(at(1), None, fetched(generation)));
    }
    observer.on_event("other", &TransportEvent::new(at(1), None, fetched(Some(1))));
    observer.on_event(
        "api",
        &TransportEvent::new(at(2), Some(CallId(1)), succeeded(1, 1)),
    );
    end_calls(&observer);
    assert_eq!(observer.check_contract(), Ok(()));
    // A generation reported again: one fetch reported twice.
    observer.on_event("api", &TransportEvent::new(at(3), None, fetched(Some(2))));
    let v = observer.check_contract().unwrap_err();
    assert_eq!(
        (v.rule, v.index),
        (ContractRule::TokenGenerationRepeated, 7)
    );
    // With a call, or a label.
    assert_eq!(
        first_violation(vec![(0, 1, fetched(Some(1)))]),
        (ContractRule::TokenFetchWithCall, 0, None)
    );
    let observer = RecordingObserver::new();
    let labelled = TransportEvent::new(at(0), None, fetched(None)).with_label(Some("orders.list"));
    observer.on_event("api", &labelled);
    let v = observer.check_contract().unwrap_err();
    assert_eq!((v.rule, v.index), (ContractRule::TokenFetchWithCall, 0));
}

#[test]
fn no_breaker_transition_after_an_unsent_failure() {
    // A 503 opens the breaker; the retry is refused at the gate (sent: false), which
    // told the breaker nothing, so no transition may follow it.
    let mut real = recorded_with(&[Reply::status(503)], false, true);
    assert!(matches!(real[5], EventKind::Failed { sent: false, .. }));
    for transition in [
        EventKind::BreakerClosed,
        EventKind::BreakerOpened {
            cooldown: Duration::from_secs(60),
        },
    ] {
        real.truncate(6);
        real.push(transition);
        assert_eq!(
            first_violation(timed(real.clone())),
            (ContractRule::TransitionNotAfterTerminal, 6, None)
        );
    }
}

#[test]
fn a_report_carries_no_call() {
    for kind in [EventKind::RowsPulled { n: 3 }, EventKind::WritePushed] {
        let observer = RecordingObserver::new();
        observer.on_event("api", &TransportEvent::new(at(0), None, kind.clone()));
        assert_eq!(observer.check_contract(), Ok(()));
        assert_eq!(
            first_violation(vec![(0, 1, kind.clone())]),
            (ContractRule::ReportWithCall, 0, None)
        );
        // Nor a call's label.
        let labelled = TransportEvent::new(at(0), None, kind).with_label(Some("orders.list"));
        observer.on_event("api", &labelled);
        let v = observer.check_contract().unwrap_err();
        assert_eq!((v.rule, v.index), (ContractRule::ReportWithCall, 1));
    }
    // A reset neither.
    let observer = RecordingObserver::new();
    let reset = TransportEvent::new(at(0), None, EventKind::BreakerReset);
    observer.on_event("api", &reset.clone().with_label(Some("orders.list")));
    let v = observer.check_contract().unwrap_err();
    assert_eq!((v.rule, v.index), (ContractRule::ResetWithCall, 0));
}

#[test]
fn nothing_is_sent_for_a_call_after_it_ended() {
    assert_eq!(
        first_violation(vec![
            (0, 1, started(1, 1)),
            (1, 1, cancelled(1, 1)),
            (2, 1, started(2, 2)),
        ]),
        (ContractRule::EventAfterCallEnded, 2, Some(2))
    );
}

#[test]
fn the_earliest_open_send_is_reported_at_the_end() {
    let v = observe(vec![
        (0, 1, started(1, 1)),
        (0, 2, started(1, 1)),
        (0, 1, succeeded(1, 1)),
        (0, 3, started(1, 1)),
    ])
    .check_contract()
    .unwrap_err();
    assert_eq!(
        (v.rule, v.index, v.call),
        (ContractRule::NeverEnded, 1, Some(CallId(2)))
    );
    assert_eq!((v.kind, v.at), ("started", Instant::ORIGIN));
}

#[test]
fn the_first_violation_wins() {
    let v = observe(vec![
        (0, 1, started(1, 1)),
        (0, 1, started(3, 1)),   // out of order (and in flight): first
        (0, 1, succeeded(9, 1)), // would be another violation
    ])
    .check_contract()
    .unwrap_err();
    assert_eq!((v.rule, v.index), (ContractRule::StartedWhileInFlight, 1));
    let as_error: &dyn std::error::Error = &v;
    assert!(as_error.to_string().contains("event #1"));
}

#[test]
fn a_redial_is_followed_by_the_start_it_announced() {
    use std::sync::Arc;
    use vantage_api_pool::{ResilientClient, TransportErrorKind};
    use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};

    // A real NotSent failure and its Redialing (only the pool builds a ClientError).
    let rt = VirtualRuntime::new();
    let transport = ScriptedTransport::new(&rt);
    transport.push(Reply::fail(TransportErrorKind::NotSent, "stale connection"));
    transport.default_reply(Reply::ok());
    let recorded = RecordingObserver::new();
    let client = ResilientClient::builder(transport, rt.clone())
        .observer("api", Arc::new(recorded.clone()))
        .build()
        .unwrap();
    rt.block_on(client.execute(|h| h.get("/x")))
        .unwrap()
        .unwrap();
    let kinds: Vec<EventKind> = recorded
        .events()
        .into_iter()
        .map(|r| r.event.kind)
        .collect();
    let (failed, redialing) = (kinds[1].clone(), kinds[2].clone());
    assert!(matches!(failed, EventKind::Failed { send: 1, .. }));
    assert!(matches!(
        redialing,
        EventKind::Redialing {
            send: 2,
            attempt: 1
        }
    ));

    let head = vec![(0, 1, started(1, 1)), (1, 1, failed), (1, 1, redialing)];
    // The announced send starts: fine; nothing after it: fine too (the caller may
    // drop the call while the redial waits at the gate).
    let mut good = head.clone();
    good.push((2, 1, started(2, 1)));
    good.push((3, 1, succeeded(2, 1)));
    assert!(observe_ended(good).check_contract().is_ok());
    assert!(observe_ended(head.clone()).check_contract().is_ok());
    // Any other per-send event next breaks the rule.
    let mut skipped = head.clone();
    skipped.push((2, 1, started(3, 1)));
    assert_eq!(
        first_violation(skipped).0,
        ContractRule::RedialNotFollowedByStart
    );
    let mut ended = head;
    ended.push((2, 1, cancelled(2, 1)));
    assert_eq!(
        first_violation(ended),
        (ContractRule::RedialNotFollowedByStart, 3, Some(2))
    );
}

#[test]
fn a_redial_after_a_retry_scheduled_is_refused() {
    // A NotSent failure is followed by a redial, never by a retry and then a redial.
    let mut real = recorded(
        &[Reply::fail(
            vantage_api_pool::TransportErrorKind::NotSent,
            "pooled connection closed",
        )],
        false,
    );
    real.truncate(2); // started, failed (NotSent)
    real.push(retry(2));
    real.push(EventKind::Redialing {
        send: 2,
        attempt: 1,
    });
    assert_eq!(
        first_violation(timed(real)),
        (ContractRule::RedialNotAfterFailure, 3, Some(2))
    );
}

#[test]
fn one_calls_events_keep_time_order_across_threads() {
    // Two threads report for one call; the per-thread order holds, the call's not.
    let observer = RecordingObserver::new();
    observer.on_event(
        "api",
        &TransportEvent::new(at(10), Some(CallId(1)), started(1, 1)),
    );
    let other = observer.clone();
    std::thread::spawn(move || {
        other.on_event(
            "api",
            &TransportEvent::new(
                at(5),
                Some(CallId(1)),
                EventKind::Cancelled {
                    send: 1,
                    attempt: 1,
                },
            ),
        );
    })
    .join()
    .unwrap();
    let v = observer.check_contract().unwrap_err();
    assert_eq!((v.rule, v.index), (ContractRule::TimeWentBackwards, 1));
}

#[test]
fn a_retry_needs_a_failure_before_it_even_as_the_first_event() {
    // Nothing failed yet: there is nothing to retry, whatever follows.
    assert_eq!(
        first_violation(vec![
            (0, 1, retry(1)),
            (1, 1, started(1, 1)),
            (2, 1, succeeded(1, 1)),
        ]),
        (ContractRule::RetryNotAfterFailure, 0, None)
    );
}

/// The end of call 1 of api "api" at `ms`, `elapsed_ms` after it began.
fn end(ms: u64, elapsed_ms: u64, sends: u32, attempts: u32, outcome: CallOutcome) -> CallEnd {
    let began = at(ms - elapsed_ms);
    CallEnd::new(CallId(1), began, at(ms), sends, attempts, outcome)
}

/// The rule and index of the first violation of `events` (call 1 of api "api"), then
/// `ends`, then `after`.
fn end_violation(
    events: Vec<(u64, u64, EventKind)>,
    ends: &[CallEnd],
    after: Vec<(u64, u64, EventKind)>,
) -> Option<(ContractRule, usize)> {
    let observer = observe(events);
    for end in ends {
        observer.on_call_end("api", end);
    }
    for (ms, call, kind) in after {
        observer.on_event(
            "api",
            &TransportEvent::new(at(ms), Some(CallId(call)), kind),
        );
    }
    observer.check_contract().err().map(|v| (v.rule, v.index))
}

#[test]
fn a_call_ends_once_after_its_events() {
    let ok = || CallOutcome::Succeeded {
        status: StatusCode::OK,
    };
    let sent = || vec![(0, 1, started(1, 1)), (7, 1, succeeded(1, 1))];
    // Ended once, agreeing: fine; the end is kept with its place.
    let observer = observe(sent());
    observer.on_call_end("api", &end(7, 7, 1, 1, ok()));
    assert_eq!(observer.check_contract(), Ok(()));
    let ends = observer.call_ends();
    assert_eq!((ends.len(), ends[0].after, &*ends[0].api), (1, 2, "api"));
    assert_eq!(observer.call_end(CallId(1)).unwrap().sends, 1);
    assert!(observer.call_end(CallId(2)).is_none());
    // `clear` forgets ends too.
    observer.clear();
    assert!(observer.call_ends().is_empty());

    // Twice.
    let end_ok = end(7, 7, 1, 1, ok());
    assert_eq!(
        end_violation(sent(), &[end_ok.clone(), end_ok.clone()], vec![]),
        Some((ContractRule::SecondCallEnd, 2))
    );
    // An event of the call after its end, a breaker transition included; another
    // call's events go on.
    assert_eq!(
        end_violation(
            sent(),
            std::slice::from_ref(&end_ok),
            vec![(7, 1, EventKind::BreakerClosed)]
        ),
        Some((ContractRule::EventAfterCallEnd, 2))
    );
    assert_eq!(
        end_violation(
            vec![(0, 1, started(1, 1))],
            &[end(1, 1, 1, 1, CallOutcome::Cancelled)],
            vec![(2, 1, cancelled(1, 1))]
        ),
        Some((ContractRule::CallEndMismatch, 1))
    );
    assert_eq!(
        end_violation(
            sent(),
            std::slice::from_ref(&end_ok),
            vec![(8, 2, started(1, 1)), (9, 2, cancelled(1, 1))]
        ),
        Some((ContractRule::CallNeverEnded, 2))
    );
    // A call with events and no end, at the end of the record only.
    let observer = observe(sent());
    assert_eq!(
        observer.check_contract().map_err(|v| (v.rule, v.index)),
        Err((ContractRule::CallNeverEnded, 0))
    );
    assert_eq!(observer.check_contract_so_far(), Ok(()));
    // A call dropped at the gate before any send: an end with no event.
    assert_eq!(
        end_violation(vec![], &[end(3, 3, 0, 0, CallOutcome::Cancelled)], vec![]),
        None
    );
    assert_eq!(
        end_violation(vec![], &[end(3, 3, 1, 1, CallOutcome::Cancelled)], vec![]),
        Some((ContractRule::CallEndMismatch, 0))
    );
    assert_eq!(
        end_violation(vec![], &[end(3, 3, 0, 0, ok())], vec![]),
        Some((ContractRule::CallEndMismatch, 0))
    );
}

#[test]
fn a_call_end_agrees_with_its_events() {
    let ok = |code: u16| CallOutcome::Succeeded {
        status: StatusCode::from_u16(code).unwrap(),
    };
    let sent = || vec![(2, 1, started(1, 1)), (7, 1, succeeded(1, 1))];
    let mismatch = |events, end| end_violation(events, &[end], vec![]);
    let agrees = Some((ContractRule::CallEndMismatch, 2));
    assert_eq!(mismatch(sent(), end(7, 5, 1, 1, ok(200))), None);
    // Not the last Started's numbers.
    assert_eq!(mismatch(sent(), end(7, 5, 2, 1, ok(200))), agrees);
    assert_eq!(mismatch(sent(), end(7, 5, 1, 2, ok(200))), agrees);
    // Another status, or not the time of the Succeeded.
    assert_eq!(mismatch(sent(), end(7, 5, 1, 1, ok(201))), agrees);
    assert_eq!(mismatch(sent(), end(8, 6, 1, 1, ok(200))), agrees);
    // Earlier than the call's last event, or shorter than its events span.
    assert_eq!(
        mismatch(sent(), end(6, 6, 1, 1, CallOutcome::Cancelled)),
        agrees
    );
    assert_eq!(mismatch(sent(), end(7, 4, 1, 1, ok(200))), agrees);
    // With no event to go by, an end before its beginning.
    let ended_before_it_began = CallEnd::new(CallId(1), at(8), at(7), 0, 0, CallOutcome::Cancelled);
    assert_eq!(
        mismatch(vec![], ended_before_it_began),
        Some((ContractRule::CallEndMismatch, 0))
    );
    // A success whose last terminal was no `Succeeded`.
    let dropped = vec![(2, 1, started(1, 1)), (7, 1, cancelled(1, 1))];
    assert_eq!(mismatch(dropped.clone(), end(7, 5, 1, 1, ok(200))), agrees);
    assert_eq!(
        mismatch(dropped, end(9, 9, 1, 1, CallOutcome::Cancelled)),
        None
    );
    // With a send in flight.
    assert_eq!(
        mismatch(
            vec![(2, 1, started(1, 1))],
            end(7, 5, 1, 1, CallOutcome::Cancelled)
        ),
        Some((ContractRule::CallEndMismatch, 1))
    );
}

#[test]
fn a_failed_call_ends_with_its_last_failure() {
    // Real calls end as they returned: a 404 is final, `Failed` with its error.
    let real = recorded(&[Reply::status(404)], false);
    assert_eq!(real.len(), 2);
    let failed_404 = real[1].clone();
    let failed_503 = recorded(&[Reply::status(503)], false)[1].clone();
    let EventKind::Failed { error, .. } = failed_404.clone() else {
        panic!("{failed_404:?}");
    };
    let events = || vec![(0, 1, started(1, 1)), (4, 1, failed_404.clone())];
    let failed = CallOutcome::Failed { error };
    assert_eq!(
        end_violation(events(), &[end(5, 5, 1, 1, failed.clone())], vec![]),
        None
    );
    // The error of another failure.
    let EventKind::Failed { error: other, .. } = failed_503 else {
        panic!();
    };
    assert_eq!(
        end_violation(
            events(),
            &[end(5, 5, 1, 1, CallOutcome::Failed { error: other })],
            vec![]
        ),
        Some((ContractRule::CallEndMismatch, 2))
    );
    // A failure right after a retry or a redial was announced: the call would have
    // sent again, or reported a refusal's pair; only a drop ends it there.
    let with_503 = recorded(&[Reply::status(503)], false);
    let with_not_sent = recorded(&[Reply::fail(TransportErrorKind::NotSent, "stale")], false);
    for (real, next) in [(with_503, "retry_scheduled"), (with_not_sent, "redialing")] {
        assert_eq!(real[2].name(), next);
        let EventKind::Failed { error, .. } = real[1].clone() else {
            panic!("{:?}", real[1]);
        };
        let events = timed(real[..3].to_vec());
        let last_ms = events.last().unwrap().0;
        let failed = CallOutcome::Failed { error };
        assert_eq!(
            end_violation(
                events.clone(),
                &[end(last_ms, last_ms, 1, 1, failed)],
                vec![]
            ),
            Some((ContractRule::CallEndMismatch, 3)),
            "after {next}"
        );
        let dropped = end(last_ms, last_ms, 1, 1, CallOutcome::Cancelled);
        assert_eq!(
            end_violation(events, &[dropped], vec![]),
            None,
            "after {next}"
        );
    }
    // A failure where the call's last terminal was a success.
    assert_eq!(
        end_violation(
            vec![(0, 1, started(1, 1)), (4, 1, succeeded(1, 1))],
            &[end(5, 5, 1, 1, failed)],
            vec![]
        ),
        Some((ContractRule::CallEndMismatch, 2))
    );
}

#[test]
fn a_call_keeps_one_label() {
    let labelled = |ms, kind, label| {
        (
            ms,
            TransportEvent::new(at(ms), Some(CallId(1)), kind).with_label(label),
        )
    };
    let feed = |events: Vec<(u64, TransportEvent)>, end_label| {
        let observer = RecordingObserver::new();
        for (_, event) in &events {
            observer.on_event("api", event);
        }
        let last = events.last().map_or(0, |(ms, _)| *ms);
        let ok = CallOutcome::Succeeded {
            status: StatusCode::OK,
        };
        observer.on_call_end(
            "api",
            &CallEnd::new(CallId(1), at(0), at(last), 1, 1, ok).with_label(end_label),
        );
        observer.check_contract().map_err(|v| (v.rule, v.index))
    };
    let list = Some("orders.list");
    let sent = |second| {
        vec![
            labelled(0, started(1, 1), list),
            labelled(5, succeeded(1, 1), second),
        ]
    };
    // One label throughout, or none throughout: fine.
    assert_eq!(feed(sent(list), list), Ok(()));
    let unlabelled = vec![
        labelled(0, started(1, 1), None),
        labelled(5, succeeded(1, 1), None),
    ];
    assert_eq!(feed(unlabelled, None), Ok(()));
    // An event, a transition or the end with another.
    assert_eq!(feed(sent(None), list), Err((ContractRule::LabelChanged, 1)));
    let mut closed = sent(list);
    closed.push(labelled(5, EventKind::BreakerClosed, Some("orders.get")));
    assert_eq!(feed(closed, list), Err((ContractRule::LabelChanged, 2)));
    assert_eq!(
        feed(sent(list), Some("orders.get")),
        Err((ContractRule::LabelChanged, 2))
    );
}

#[test]
fn after_a_calls_end_a_repeat_of_an_old_send_number_or_a_new_one_is_an_event_after_the_end() {
    let ended = || vec![(0, 1, started(1, 1)), (0, 1, succeeded(1, 1))];
    // A `Started` that reuses the ended send's number is no repeated terminal.
    let mut events = ended();
    events.push((1, 1, started(1, 1)));
    assert_eq!(
        first_violation(events),
        (ContractRule::EventAfterCallEnded, 2, Some(1))
    );
    // Terminals of a send the call never had, after its end: send 2, and send 0.
    for send in [2, 0] {
        let mut events = ended();
        events.push((1, 1, cancelled(send, 1)));
        assert_eq!(
            first_violation(events),
            (ContractRule::EventAfterCallEnded, 2, Some(send)),
            "send {send}"
        );
    }
}

#[test]
fn the_observer_tells_how_much_it_holds_and_shares_one_api_key_per_run() {
    let observer = RecordingObserver::new();
    assert!(observer.is_empty());
    assert_eq!(
        format!("{observer:?}"),
        "RecordingObserver { events: 0, seen: 0, recording: true }"
    );
    for call in [1, 2] {
        observer.on_event(
            "api",
            &TransportEvent::new(at(0), Some(CallId(call)), started(1, 1)),
        );
    }
    assert!(!observer.is_empty());
    let events = observer.events();
    assert!(
        std::sync::Arc::ptr_eq(&events[0].api, &events[1].api),
        "one allocation for a run of the same key"
    );
    observer.record(false);
    observer.on_event(
        "api",
        &TransportEvent::new(at(0), Some(CallId(3)), started(1, 1)),
    );
    assert_eq!(
        format!("{observer:?}"),
        "RecordingObserver { events: 2, seen: 3, recording: false }"
    );
}

#[test]
fn a_check_so_far_still_finds_a_broken_rule() {
    // A terminal without its `Started` breaks the contract however the record ends.
    let observer = observe(vec![(0, 1, cancelled(1, 1))]);
    let v = observer.check_contract_so_far().unwrap_err();
    assert_eq!((v.rule, v.index), (ContractRule::TerminalWithoutStarted, 0));
}

#[test]
fn nothing_of_a_call_comes_after_its_end_whatever_its_last_event_was() {
    // A call that ended on a sent failure (a final 404) or a success: neither a
    // retry nor another send of it may follow its end.
    let real = recorded(&[Reply::status(404)], false);
    let EventKind::Failed { error, .. } = real[1].clone() else {
        panic!("{:?}", real[1]);
    };
    let failed = end(5, 5, 1, 1, CallOutcome::Failed { error });
    assert_eq!(
        end_violation(
            vec![(0, 1, started(1, 1)), (4, 1, real[1].clone())],
            &[failed],
            vec![(6, 1, retry(2))]
        ),
        Some((ContractRule::EventAfterCallEnd, 2))
    );
    let ok = CallOutcome::Succeeded {
        status: StatusCode::OK,
    };
    assert_eq!(
        end_violation(
            vec![(0, 1, started(1, 1)), (7, 1, succeeded(1, 1))],
            &[end(7, 7, 1, 1, ok)],
            vec![(8, 1, started(2, 2))]
        ),
        Some((ContractRule::EventAfterCallEnd, 2))
    );
}

#[test]
fn every_event_of_a_call_needs_its_call_id_not_only_a_start() {
    let real = recorded(&[Reply::fail(TransportErrorKind::NotSent, "stale")], false);
    assert_eq!(real[2].name(), "redialing");
    for kind in [retry(2), cancelled(1, 1), real[2].clone()] {
        let observer = RecordingObserver::new();
        observer.on_event("api", &TransportEvent::new(at(0), None, kind.clone()));
        let v = observer.check_contract().unwrap_err();
        assert_eq!(
            (v.rule, v.index, v.call),
            (ContractRule::MissingCallId, 0, None),
            "{kind:?}"
        );
    }
    // A terminal without its call after a start with one: the terminal is what
    // lacks the id, not the start its end.
    let observer = observe(vec![(0, 1, started(1, 1))]);
    observer.on_event("api", &TransportEvent::new(at(1), None, succeeded(1, 1)));
    let v = observer.check_contract().unwrap_err();
    assert_eq!((v.rule, v.index), (ContractRule::MissingCallId, 1));
}

#[test]
fn events_without_a_call_keep_time_order_on_their_thread() {
    // One thread's events of an api keep time order, a call's or not.
    let observer = RecordingObserver::new();
    observer.on_event(
        "api",
        &TransportEvent::new(at(10), None, EventKind::RowsPulled { n: 1 }),
    );
    observer.on_event(
        "api",
        &TransportEvent::new(at(5), None, EventKind::WritePushed),
    );
    let v = observer.check_contract().unwrap_err();
    assert_eq!((v.rule, v.index), (ContractRule::TimeWentBackwards, 1));
    // A call's event after a reset that came later.
    let observer = RecordingObserver::new();
    observer.on_event(
        "api",
        &TransportEvent::new(at(10), None, EventKind::BreakerReset),
    );
    observer.on_event(
        "api",
        &TransportEvent::new(at(5), Some(CallId(1)), started(1, 1)),
    );
    let v = observer.check_contract_so_far().unwrap_err();
    assert_eq!((v.rule, v.index), (ContractRule::TimeWentBackwards, 1));
}

#[test]
fn a_call_unwound_by_a_panic_may_end_after_any_event() {
    let panicked =
        |ms, elapsed, sends, attempts| end(ms, elapsed, sends, attempts, CallOutcome::Panicked);
    // After a success, before any event, after an announced retry or redial.
    assert_eq!(
        end_violation(
            vec![(2, 1, started(1, 1)), (7, 1, succeeded(1, 1))],
            &[panicked(9, 7, 1, 1)],
            vec![]
        ),
        None
    );
    assert_eq!(end_violation(vec![], &[panicked(3, 3, 0, 0)], vec![]), None);
    let with_503 = recorded(&[Reply::status(503)], false);
    let with_not_sent = recorded(&[Reply::fail(TransportErrorKind::NotSent, "stale")], false);
    for (real, next) in [(with_503, "retry_scheduled"), (with_not_sent, "redialing")] {
        assert_eq!(real[2].name(), next);
        let events = timed(real[..3].to_vec());
        let last_ms = events.last().unwrap().0;
        assert_eq!(
            end_violation(events, &[panicked(last_ms, last_ms, 1, 1)], vec![]),
            None,
            "after {next}"
        );
    }
}

#[test]
fn the_first_call_left_without_an_end_is_the_one_reported() {
    let v = observe(vec![
        (0, 1, started(1, 1)),
        (1, 1, cancelled(1, 1)),
        (2, 2, started(1, 1)),
        (3, 2, cancelled(1, 1)),
    ])
    .check_contract()
    .unwrap_err();
    assert_eq!(
        (v.rule, v.index, v.call),
        (ContractRule::CallNeverEnded, 0, Some(CallId(1)))
    );
}

#[test]
fn a_retry_right_after_a_redial_breaks_the_redial_rule() {
    // The redial announced a start; a retry in its place breaks that promise first.
    let real = recorded(&[Reply::fail(TransportErrorKind::NotSent, "stale")], false);
    assert_eq!(real[2].name(), "redialing");
    let mut events = timed(real[..3].to_vec());
    let last_ms = events.last().unwrap().0;
    events.push((last_ms, 1, retry(2)));
    assert_eq!(
        first_violation(events),
        (ContractRule::RedialNotFollowedByStart, 3, None)
    );
}
