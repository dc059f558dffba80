//! `EventKind::TokenFetched`: every token fetch that ends is reported once, with no
//! call and no label, why it ran, how long it took and what it brought; a fetch
//! that does not end reports nothing. `HealthObserver` counts them, failed renewals
//! included (no call fails for one). On virtual time with exact times.

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
    CallPolicy, ErrorKind, EventKind, Fanout, ResilientClient, TokenFetchReason, TokenSource,
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

/// Every `TokenFetched` recorded: (at, reason, ms, generation or error text), after
/// checking that it carries no call and no label.
fn fetched(w: &World) -> Vec<(Duration, TokenFetchReason, u64, Result<u64, String>)> {
    w.events()
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::TokenFetched { reason, ms, result } => {
                assert_eq!(
                    (e.call, e.label),
                    (None, None),
                    "a fetch belongs to no call"
                );
                let result = result.map_err(|error| error.to_string());
                Some((e.at.since_origin(), reason, ms, result))
            }
            _ => None,
        })
        .collect()
}

fn down() -> Result<u64, String> {
    Err("identity provider down".to_owned())
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
            (ms(50), TokenFetchReason::First, 50, Ok(1)),
            (ms(110), TokenFetchReason::Rejected, 50, Ok(2)),
        ]
    );
    assert_eq!(
        w.kinds(),
        [
            "token_fetched",
            "started",
            "failed",
            "token_fetched",
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
    assert_eq!(fetched(&w), [(ms(50), TokenFetchReason::First, 50, Ok(1))]);
    assert_eq!(w.transport.requests().len(), 3);
    w.assert_contract();
}

#[test]
// On wasm32 observers need not be `Send`, so neither is a `Fanout` of them.
#[cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]
fn renewals_and_an_expired_token_are_reported_and_counted_even_when_no_call_fails() {
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let health = Arc::new(HealthObserver::new(secs(60)));
    let fanout = Fanout::default()
        .with(Arc::new(w.observer.clone()))
        .with(Arc::clone(&health));
    // t1 at 100 ms, living a minute: due from 30.1 s, expired from 60.1 s. Every
    // later fetch fails.
    let source = tokens(&w, |_| ms(100), Some(secs(60)), |n| n >= 2);
    let client = ResilientClient::builder(w.transport.clone(), w.rt.clone())
        .observer("api", Arc::new(fanout))
        .auth(source)
        .build()
        .unwrap();
    let get = || {
        w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
            .unwrap()
    };
    get().unwrap();
    // Due: this call renews t1, the renewal fails, and it sends t1.
    w.rt.run_until(at(secs(31))).unwrap();
    get().unwrap();
    let api = health.snapshot("api").unwrap();
    assert_eq!((api.token_fetches, api.token_fetches_failed), (2, 1));
    let last = api.last_token_error.expect("the failed renewal");
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
    // Expired: the call waits for a fetch, which fails, and fails with it.
    w.rt.run_until(at(secs(61))).unwrap();
    assert_eq!(get().unwrap_err().kind(), ErrorKind::Auth);
    assert_eq!(
        fetched(&w),
        [
            (ms(100), TokenFetchReason::First, 100, Ok(1)),
            (ms(31_100), TokenFetchReason::Renewal, 100, down()),
            (ms(61_100), TokenFetchReason::Expired, 100, down()),
        ]
    );
    let api = health.snapshot("api").unwrap();
    assert_eq!((api.token_fetches, api.token_fetches_failed), (3, 2));
    assert_eq!(
        api.last_token_error.map(|last| last.reason),
        Some(TokenFetchReason::Expired)
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
            (ms(20), TokenFetchReason::Requested, 20, Ok(1)),
            (ms(40), TokenFetchReason::Requested, 20, Ok(2)),
            (ms(60), TokenFetchReason::Requested, 20, down()),
        ]
    );
    w.assert_contract();
}

#[test]
fn a_fetch_its_caller_gave_up_on_reports_nothing_and_the_next_one_is_reported_once() {
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    // The first fetch takes 10 s; later ones 50 ms.
    let source = tokens(
        &w,
        |n| if n == 1 { secs(10) } else { ms(50) },
        None,
        |_| false,
    );
    let client = w.builder().auth(source).build().unwrap();
    let short = CallPolicy::background()
        .with_attempt_timeout(secs(1))
        .and_then(|p| p.with_budget(Some(secs(1))))
        .unwrap();
    let err =
        w.rt.block_on(client.execute_with(&short, |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert!(fetched(&w).is_empty(), "{:?}", fetched(&w));
    w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
        .unwrap()
        .unwrap();
    // Abandoned at 1 s; the next call fetches from 1 s to 1.05 s, still the first
    // token.
    assert_eq!(
        fetched(&w),
        [(ms(1_050), TokenFetchReason::First, 50, Ok(1))]
    );
    assert_eq!(client.token_fetches(), 2);
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
    let (at, reason, ms, result) = &fetched[0];
    assert_eq!(
        (*at, *reason, *ms),
        (Duration::ZERO, TokenFetchReason::First, 0)
    );
    let error = result.as_ref().unwrap_err();
    assert!(error.contains("content-type"), "{error}");
    assert!(w.transport.requests().is_empty());
    w.assert_contract();
}

#[test]
fn a_client_without_an_observer_fetches_as_before() {
    // The fetch's report costs nothing without an observer, and changes nothing.
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
