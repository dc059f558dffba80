//! A token source whose fetch panics: the panic reaches the caller that ran the fetch,
//! and the callers waiting on that fetch take it over instead of waiting for ever.
//!
//! Native only: wasm32 aborts on a panic.
#![cfg(not(target_arch = "wasm32"))]

mod common;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use common::*;
use futures::FutureExt;
use http::{HeaderValue, header::AUTHORIZATION};
use vantage_api_pool::auth::{AuthError, token_fn};
use vantage_api_pool::{CallPolicy, TokenSource};
use vantage_api_pool_testkit::{Reply, ScriptedRequest, VirtualRuntime};

/// Fetch `n` (from 1) gives `Bearer t{n}` after 50 ms; the one numbered `panics_on`
/// panics instead.
fn source(
    rt: &VirtualRuntime,
    fetches: &Arc<AtomicU32>,
    panics_on: u32,
) -> impl TokenSource + use<> {
    quiet_panics();
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

/// Keeps the token source's own panics out of the test output.
fn quiet_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let own = info
                .payload()
                .downcast_ref::<String>()
                .is_some_and(|m| m.starts_with("token source panics"));
            if !own {
                report(info);
            }
        }));
    });
}

fn bearer(request: &ScriptedRequest) -> Option<&str> {
    request.headers().get(AUTHORIZATION)?.to_str().ok()
}

#[test]
fn a_first_fetch_that_panics_is_taken_over_by_a_waiting_caller() {
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let fetches = Arc::new(AtomicU32::new(0));
    let client = w
        .builder()
        .auth(source(&w.rt, &fetches, 1))
        .build()
        .unwrap();
    let fetching = client.clone();
    let first = w.rt.spawn(async move {
        AssertUnwindSafe(fetching.execute_with(&CallPolicy::background(), |h| h.get("/x")))
            .catch_unwind()
            .await
            .is_err()
    });
    let second = w.spawn_call(&client, CallPolicy::background(), "/x");
    w.rt.run().unwrap();
    assert!(
        w.rt.block_on(first).unwrap(),
        "the fetching caller panicked"
    );
    assert!(w.rt.block_on(second).unwrap().is_ok());
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    let sent: Vec<_> = w
        .transport
        .requests()
        .iter()
        .map(|r| r.headers[AUTHORIZATION].clone())
        .collect();
    assert_eq!(sent, ["Bearer t2"]);
    // The token the waiter fetched is cached for the next call.
    w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
        .unwrap()
        .unwrap();
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
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
    let fetches = Arc::new(AtomicU32::new(0));
    let client = w
        .builder()
        .auth(source(&w.rt, &fetches, 2))
        .build()
        .unwrap();
    let refreshing = client.clone();
    let first = w.rt.spawn(async move {
        AssertUnwindSafe(refreshing.execute_with(&CallPolicy::background(), |h| h.get("/a")))
            .catch_unwind()
            .await
            .is_err()
    });
    let second = w.spawn_call(&client, CallPolicy::background(), "/b");
    w.rt.run().unwrap();
    assert!(
        w.rt.block_on(first).unwrap(),
        "the refreshing caller panicked"
    );
    assert!(w.rt.block_on(second).unwrap().is_ok());
    assert_eq!(fetches.load(Ordering::SeqCst), 3);
    w.assert_contract();
}
