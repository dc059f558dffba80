//! `EventKind::TokenFetchEnded`: every token fetch that ends is reported once, with no
//! call and no label, why it ran, how long it took and what it brought: a token,
//! an error, or nothing because its caller gave it up. `HealthObserver` counts
//! them, failed renewals included (no call fails for one). On virtual time with
//! exact times.

mod common;

// On wasm32 the same tests run under wasm-bindgen-test, in Node and in a browser.
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::*;
use http::header::{AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderValue, StatusCode};
use vantage_api_pool::auth::{AuthError, AuthToken, token_fn};
use vantage_api_pool::health::HealthObserver;
use vantage_api_pool::{
    CallPolicy, ErrorKind, EventKind, Fanout, ResilientClient, TokenFetchOutcome, TokenFetchReason,
    TokenSource,
};
use vantage_api_pool_testkit::Reply;

/// A token source whose n-th fetch takes `delay(n)` and then gives `Bearer t{n}`
/// living `lifetime` (if given), or fails ("identity provider down") when `fails(n)`.
fn tokens<D, F>(
    w: &World,
    delay: D,
    lifetime: Option<Duration>,
    fails: F,
) -> impl TokenSource + use<D, F>
where
    D: Fn(u32) -> Duration + Send + Sync + 'static,
    F: Fn(u32) -> bool + Send + Sync + 'static,
{
    let rt = w.rt.clone();
    let fetches = Arc::new(AtomicU32::new(0));
    let (delay, fails) = (Arc::new(delay), Arc::new(fails));
    token_fn(move || {
        let (rt, delay, fails) = (rt.clone(), Arc::clone(&delay), Arc::clone(&fails));
        let n = fetches.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            rt.sleep(delay(n)).await;
            if fails(n) {
                return Err(AuthError::from("identity provider down"));
            }
            let token = AuthToken::bearer(&format!("t{n}"))?;
            Ok(match lifetime {
                Some(lifetime) => token.expires_in(lifetime),
                None => token,
            })
        }
    })
}

/// A fetch's outcome, comparable: a token's generation and lifetime, or the
/// error's text.
#[derive(Debug, PartialEq)]
enum Out {
    Token(u64, Option<Duration>),
    Failed(String),
    Abandoned,
    Panicked,
}

/// Every `TokenFetchEnded` recorded: (at, reason, ms, outcome), after checking that
/// it carries no call and no label.
fn fetched(w: &World) -> Vec<(Duration, TokenFetchReason, u64, Out)> {
    w.events()
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::TokenFetchEnded {
                reason,
                ms,
                outcome,
            } => {
                assert_eq!(
                    (e.call, e.label),
                    (None, None),
                    "a fetch belongs to no call"
                );
                let out = match outcome {
                    TokenFetchOutcome::Fetched {
                        generation,
                        lifetime,
                    } => Out::Token(generation, lifetime),
                    TokenFetchOutcome::Failed { error } => Out::Failed(error.to_string()),
                    TokenFetchOutcome::Abandoned => Out::Abandoned,
                    TokenFetchOutcome::Panicked => Out::Panicked,
                    other => panic!("{other:?}"),
                };
                Some((e.at.since_origin(), reason, ms, out))
            }
            _ => None,
        })
        .collect()
}

fn down() -> Out {
    Out::Failed("identity provider down".to_owned())
}

/// A token without a lifetime.
fn token(generation: u64) -> Out {
    Out::Token(generation, None)
}

/// A client over `w`'s transport and runtime, with `source`, observed by `w`'s
/// recorder and a health observer (returned with it).
// On wasm32 observers need not be `Send`, so neither is a `Fanout` of them.
#[cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]
fn observed_by_health<A: TokenSource>(w: &World, source: A) -> (Client<A>, Arc<HealthObserver>) {
    let health = Arc::new(HealthObserver::new(secs(60)));
    let fanout = Fanout::default()
        .with(Arc::new(w.observer.clone()))
        .with(Arc::clone(&health));
    let client = ResilientClient::builder(w.transport.clone(), w.rt.clone())
        .observer("api", Arc::new(fanout))
        .auth(source)
        .build()
        .unwrap();
    (client, health)
}

/// A policy whose budget, and so its token waits, ends after a second.
fn one_second() -> CallPolicy {
    CallPolicy::background()
        .with_attempt_timeout(secs(1))
        .and_then(|p| p.with_budget(Some(secs(1))))
        .unwrap()
}

/// (tokens fetched, fetches failed, fetches abandoned) of `api`.
fn counts(health: &HealthObserver) -> (u64, u64, u64) {
    let api = health.snapshot("api").unwrap();
    (
        api.tokens_fetched,
        api.token_fetches_failed,
        api.token_fetches_abandoned,
    )
}

#[test]
fn the_first_fetch_and_a_401_refresh_are_reported_before_the_sends_that_use_them() {
    let w = World::new();
    w.transport
        .push(Reply::status(401).after(ms(10)))
        .default_reply(Reply::ok());
    let source = tokens(&w, |_| ms(50), None, |_| false);
    let client = w.builder().auth(source).build().unwrap();
    let policy = CallPolicy::background().with_label("orders.list");
    let response =
        w.rt.block_on(client.execute_with(&policy, |h| h.get("/orders")))
            .unwrap()
            .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    // First: 0 to 50 ms; the 401 at 60 ms asks for t2: 60 to 110 ms.
    assert_eq!(
        fetched(&w),
        [
            (ms(50), TokenFetchReason::First, 50, token(1)),
            (ms(110), TokenFetchReason::Rejected, 50, token(2)),
        ]
    );
    assert_eq!(
        w.kinds(),
        [
            "token_fetch_ended",
            "started",
            "failed",
            "token_fetch_ended",
            "started",
            "succeeded"
        ]
    );
    assert_eq!(client.token_fetches(), 2);
    w.assert_contract();
}

#[test]
fn callers_that_share_one_fetch_hear_of_it_once() {
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let source = tokens(&w, |_| ms(50), None, |_| false);
    let client = w.builder().auth(source).build().unwrap();
    let calls: Vec<_> = (0..3)
        .map(|_| w.spawn_call(&client, CallPolicy::background(), "/x"))
        .collect();
    w.rt.run_until(at(secs(1))).unwrap();
    for call in calls {
        assert!(call.is_finished());
    }
    assert_eq!(
        fetched(&w),
        [(ms(50), TokenFetchReason::First, 50, token(1))]
    );
    assert_eq!(w.transport.requests().len(), 3);
    w.assert_contract();
}

#[test]
fn failed_renewals_and_an_expired_token_are_reported_and_counted_though_no_call_fails() {
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    // t1 at 100 ms, living a minute: due from 30.1 s, expired from 60.1 s. Every
    // later fetch fails.
    let source = tokens(&w, |_| ms(100), Some(secs(60)), |n| n >= 2);
    let (client, health) = observed_by_health(&w, source);
    let get = || {
        w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
            .unwrap()
    };
    get().unwrap();
    // Due: this call renews t1, the renewal fails, and it sends t1.
    w.rt.run_until(at(secs(31))).unwrap();
    get().unwrap();
    assert_eq!(counts(&health), (1, 1, 0));
    let api = health.snapshot("api").unwrap();
    assert_eq!(api.last_token_fetched_at, Some(at(ms(100))));
    let last = api.last_token_error.clone().expect("the failed renewal");
    assert_eq!(
        (
            last.at.since_origin(),
            last.reason,
            last.error.to_string().as_str()
        ),
        (
            ms(31_100),
            TokenFetchReason::Renewal,
            "identity provider down"
        )
    );
    assert!(api.last_error.is_none(), "no call failed");
    // Printed with `{:?}`, neither the snapshot nor the events show the source's
    // text.
    for debug in [format!("{api:?}"), format!("{:?}", w.events())] {
        assert!(debug.contains("SharedAuthError"), "{debug}");
        assert!(!debug.contains("provider"), "{debug}");
    }
    // Expired: the call waits for a fetch, which fails, and fails with it.
    w.rt.run_until(at(secs(61))).unwrap();
    assert_eq!(get().unwrap_err().kind(), ErrorKind::Auth);
    assert_eq!(
        fetched(&w),
        [
            (
                ms(100),
                TokenFetchReason::First,
                100,
                Out::Token(1, Some(secs(60)))
            ),
            (ms(31_100), TokenFetchReason::Renewal, 100, down()),
            (ms(61_100), TokenFetchReason::Expired, 100, down()),
        ]
    );
    assert_eq!(counts(&health), (1, 2, 0));
    let last = health.snapshot("api").unwrap().last_token_error;
    assert_eq!(
        last.map(|last| (last.at, last.reason)),
        Some((at(ms(61_100)), TokenFetchReason::Expired))
    );
    w.assert_contract();
}

#[test]
fn a_successful_renewal_is_reported_with_the_new_tokens_lifetime() {
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let source = tokens(&w, |_| ms(100), Some(secs(60)), |_| false);
    let client = w.builder().auth(source).build().unwrap();
    let get = || {
        w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
            .unwrap()
            .unwrap()
    };
    get();
    w.rt.run_until(at(secs(31))).unwrap();
    get();
    let living = |generation| Out::Token(generation, Some(secs(60)));
    assert_eq!(
        fetched(&w),
        [
            (ms(100), TokenFetchReason::First, 100, living(1)),
            (ms(31_100), TokenFetchReason::Renewal, 100, living(2)),
        ]
    );
    w.assert_contract();
}

#[test]
fn a_replay_whose_newer_token_has_expired_fetches_for_the_expiry() {
    // A sends t1 (living 1 s) at 0 s and is answered 401 at 3 s. Meanwhile B, at
    // 1.5 s, found t1 expired and fetched t2, which expired at 2.5 s. A's 401 asks
    // for a token newer than t1: t2 is, so the fetch runs because t2 expired.
    let w = World::new();
    w.transport
        .push(Reply::status(401).after(secs(3)))
        .default_reply(Reply::ok());
    let source = tokens(&w, |_| Duration::ZERO, Some(secs(1)), |_| false);
    let client = w.builder().auth(source).build().unwrap();
    let a = w.spawn_call(&client, CallPolicy::background(), "/a");
    w.rt.run_until(at(ms(1_500))).unwrap();
    let b = w.spawn_call(&client, CallPolicy::background(), "/b");
    w.rt.run_until(at(secs(5))).unwrap();
    assert!(a.is_finished() && b.is_finished());
    let living = |generation| Out::Token(generation, Some(secs(1)));
    assert_eq!(
        fetched(&w),
        [
            (Duration::ZERO, TokenFetchReason::First, 0, living(1)),
            (ms(1_500), TokenFetchReason::Expired, 0, living(2)),
            (secs(3), TokenFetchReason::Expired, 0, living(3)),
        ]
    );
    w.assert_contract();
}

#[test]
fn refresh_token_reports_a_requested_fetch_whether_it_lands_or_fails() {
    let w = World::new();
    let source = tokens(&w, |_| ms(20), None, |n| n == 3);
    let client = w.builder().auth(source).build().unwrap();
    w.rt.block_on(client.refresh_token()).unwrap().unwrap();
    w.rt.block_on(client.refresh_token()).unwrap().unwrap();
    w.rt.block_on(client.refresh_token()).unwrap().unwrap_err();
    assert_eq!(
        fetched(&w),
        [
            (ms(20), TokenFetchReason::Requested, 20, token(1)),
            (ms(40), TokenFetchReason::Requested, 20, token(2)),
            (ms(60), TokenFetchReason::Requested, 20, down()),
        ]
    );
    w.assert_contract();
}

#[test]
fn a_refresh_that_joins_a_running_fetch_adds_no_fetch_of_its_own() {
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let source = tokens(&w, |_| ms(50), None, |_| false);
    let client = w.builder().auth(source).build().unwrap();
    // The call starts the first fetch; the refresh, asked for meanwhile, joins it.
    let call = w.spawn_call(&client, CallPolicy::background(), "/x");
    w.rt.run_until(at(ms(10))).unwrap();
    w.rt.block_on(client.refresh_token()).unwrap().unwrap();
    w.rt.run_until(at(secs(1))).unwrap();
    assert!(call.is_finished());
    assert_eq!(
        fetched(&w),
        [(ms(50), TokenFetchReason::First, 50, token(1))]
    );
    assert_eq!(client.token_fetches(), 1);
    w.assert_contract();
}

#[test]
fn a_fetch_its_caller_gave_up_is_reported_abandoned_and_the_next_one_once() {
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    // The first fetch takes 10 s; later ones 50 ms.
    let source = tokens(
        &w,
        |n| if n == 1 { secs(10) } else { ms(50) },
        None,
        |_| false,
    );
    let (client, health) = observed_by_health(&w, source);
    let err =
        w.rt.block_on(client.execute_with(&one_second(), |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert_eq!(
        counts(&health),
        (0, 0, 1),
        "a source slower than the budget"
    );
    // Given up at 1 s; the next call fetches from 1 s to 1.05 s, still the first
    // token.
    w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
        .unwrap()
        .unwrap();
    assert_eq!(
        fetched(&w),
        [
            (secs(1), TokenFetchReason::First, 1_000, Out::Abandoned),
            (ms(1_050), TokenFetchReason::First, 50, token(1)),
        ]
    );
    assert_eq!(client.token_fetches(), 2);
    assert_eq!(counts(&health), (1, 0, 1));
    w.assert_contract();
}

#[test]
fn a_call_that_needs_the_token_a_401_refused_after_its_refresh_was_given_up_fetches_for_the_401() {
    // A's 401 at 10 ms starts a refresh that hangs; A's budget ends it at 1 s. C
    // then needs a token: t1 is the one the 401 refused, so C's fetch is for that.
    let w = World::new();
    w.transport
        .push(Reply::status(401).after(ms(10)))
        .default_reply(Reply::ok());
    let source = tokens(
        &w,
        |n| match n {
            1 => Duration::ZERO,
            2 => secs(10),
            _ => ms(50),
        },
        None,
        |_| false,
    );
    let client = w.builder().auth(source).build().unwrap();
    let err =
        w.rt.block_on(client.execute_with(&one_second(), |h| h.get("/a")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/c")))
        .unwrap()
        .unwrap();
    assert_eq!(
        fetched(&w),
        [
            (Duration::ZERO, TokenFetchReason::First, 0, token(1)),
            (secs(1), TokenFetchReason::Rejected, 990, Out::Abandoned),
            (ms(1_050), TokenFetchReason::Rejected, 50, token(2)),
        ]
    );
    assert_eq!(client.token_fetches(), 3);
    w.assert_contract();
}

#[test]
fn a_token_the_client_refuses_is_reported_as_a_failed_fetch() {
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let source = token_fn(|| async {
        Ok::<_, AuthError>((CONTENT_TYPE, HeaderValue::from_static("text/plain")))
    });
    let client = w.builder().auth(source).build().unwrap();
    let err = w.background_error(&client);
    assert_eq!(err.kind(), ErrorKind::Auth);
    let fetched = fetched(&w);
    assert_eq!(fetched.len(), 1, "{fetched:?}");
    let (at, reason, ms, out) = &fetched[0];
    assert_eq!(
        (*at, *reason, *ms),
        (Duration::ZERO, TokenFetchReason::First, 0)
    );
    let Out::Failed(error) = out else {
        panic!("{out:?}")
    };
    assert!(error.contains("content-type"), "{error}");
    assert!(w.transport.requests().is_empty());
    w.assert_contract();
}

#[test]
fn a_client_without_an_observer_fetches_and_sends_as_with_one() {
    // With no observer to report to, a fetch runs and its token goes out the same.
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let source = tokens(&w, |_| ms(50), None, |_| false);
    let client = ResilientClient::builder(w.transport.clone(), w.rt.clone())
        .auth(source)
        .build()
        .unwrap();
    w.rt.block_on(client.execute(|h| h.get("/x")))
        .unwrap()
        .unwrap();
    let sent = w.transport.requests();
    assert_eq!(sent[0].headers[AUTHORIZATION], "Bearer t1");
    assert_eq!(sent[0].at.since_origin(), ms(50));
}

#[test]
fn a_running_fetch_shows_its_start_until_it_ends_or_is_given_up() {
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    // The first fetch would take an hour; the next one 50 ms.
    let source = tokens(
        &w,
        |n| if n == 1 { secs(3_600) } else { ms(50) },
        None,
        |_| false,
    );
    let client = w.builder().auth(source).build().unwrap();
    let no_budget = CallPolicy::background().with_budget(None).unwrap();
    w.rt.run_until(at(secs(5))).unwrap();
    assert_eq!(client.token_fetch_running_since(), None);
    let hung = w.spawn_call(&client, no_budget.clone(), "/x");
    // A minute on, the call still waits and the observer has heard nothing: the
    // client says since when its fetch runs.
    w.rt.run_until(at(secs(65))).unwrap();
    assert!(!hung.is_finished());
    assert_eq!(w.kinds(), Vec::<&str>::new());
    assert_eq!(client.token_fetch_running_since(), Some(at(secs(5))));
    // Given up, it runs no more.
    hung.abort();
    assert_eq!(client.token_fetch_running_since(), None);
    // The next one shows its own start while it runs, and nothing once it ends.
    let next = w.spawn_call(&client, no_budget, "/x");
    w.rt.run_until(at(ms(65_020))).unwrap();
    assert_eq!(client.token_fetch_running_since(), Some(at(secs(65))));
    w.rt.run_until(at(secs(66))).unwrap();
    assert!(next.is_finished());
    assert_eq!(client.token_fetch_running_since(), None);
    assert_eq!(
        fetched(&w),
        [
            (secs(65), TokenFetchReason::First, 60_000, Out::Abandoned),
            (ms(65_050), TokenFetchReason::First, 50, token(1)),
        ]
    );
    w.assert_contract();
}

#[test]
fn a_failed_renewal_fails_the_401_replay_that_waited_for_it_and_no_other_call() {
    let w = World::new();
    // `/admin` refuses every token, half a second after it is sent.
    w.transport.respond_with(|request, _| match request.path() {
        "/admin" => Reply::status(401).after(ms(500)),
        _ => Reply::ok(),
    });
    // t1 at once, living two minutes (due for renewal from 60 s); every later
    // fetch takes 2 s and fails.
    let source = tokens(
        &w,
        |n| if n == 1 { Duration::ZERO } else { secs(2) },
        Some(secs(120)),
        |n| n >= 2,
    );
    let client = w.builder().auth(source).build().unwrap();
    let call_at = |start, path| w.background_call_at(&client, start, path);
    let (first, renewer, refused) = (
        call_at(Duration::ZERO, "/x"),
        call_at(secs(60), "/x"),
        call_at(ms(60_100), "/admin"),
    );
    w.rt.run().unwrap();
    // The call at 60 s renews t1 (60 s to 62 s); `/admin` answers t1 401 at
    // 60.6 s, and its replay, which needs a newer token, waits for the renewal and
    // shares its failure. The renewer sends t1, and succeeds.
    assert_eq!(
        fetched(&w),
        [
            (
                Duration::ZERO,
                TokenFetchReason::First,
                0,
                Out::Token(1, Some(secs(120)))
            ),
            (secs(62), TokenFetchReason::Renewal, 2_000, down()),
        ]
    );
    for (call, expected) in [
        (first, Ok(())),
        (renewer, Ok(())),
        (refused, Err(ErrorKind::Auth)),
    ] {
        assert_eq!(w.rt.block_on(call).unwrap(), expected);
    }
    w.assert_contract();
}
