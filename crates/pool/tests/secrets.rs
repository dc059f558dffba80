//! A random canary token, run through every path that handles it, never appears in
//! any output: errors, events, `Debug` of the public types, the health view.

mod common;

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Arc;

use common::*;
use http::{HeaderValue, header::AUTHORIZATION};
use vantage_api_pool::auth::{AuthError, token_fn};
use vantage_api_pool::health::HealthObserver;
use vantage_api_pool::{CallPolicy, ResilientClient};
use vantage_api_pool_testkit::Reply;

#[test]
fn the_canary_token_never_appears_in_any_output() {
    let canary = format!(
        "canary-{:016x}",
        RandomState::new().hash_one(std::process::id())
    );
    let bearer: &'static str = Box::leak(format!("Bearer {canary}").into_boxed_str());
    let w = World::new();
    // The server rejects the first token (echoing it in the body, as some do), then
    // accepts the refreshed one; a later call fails with a 500 that echoes it too.
    w.transport.push(
        Reply::status(401)
            .body(format!("bad token {bearer}"))
            .header("x-request-id", "r-1"),
    );
    w.transport.push(Reply::ok());
    w.transport
        .push(Reply::status(500).body(format!("upstream saw {bearer}")));
    w.transport.push(Reply::status(401).body(bearer));
    w.transport.push(Reply::status(401).body(bearer));
    let health = Arc::new(HealthObserver::new(secs(60)));
    let builder = ResilientClient::builder(w.transport.clone(), w.rt.clone())
        .observer("api", Arc::new(w.observer.clone()))
        .auth(token_fn(move || async move {
            Ok::<_, AuthError>((AUTHORIZATION, HeaderValue::from_static(bearer)))
        }));
    let builder_debug = format!("{builder:?}");
    let client = builder.build().unwrap();
    let client2 = ResilientClient::builder(w.transport.clone(), w.rt.clone())
        .observer("health", health.clone())
        .build()
        .unwrap();

    let ok =
        w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
            .unwrap();
    let ok_debug = format!("{:?}", ok.as_ref().map(|r| r.status()));
    let failed = w.background_error(&client);
    let unauthorized =
        w.rt.block_on(client.execute(|h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    w.transport.push(Reply::status(500).body(bearer));
    let _ =
        w.rt.block_on(client2.execute_with(&CallPolicy::background(), |h| h.get("/x")))
            .unwrap();
    // A body read whole that echoes the token: its `Debug` shows the length only.
    w.transport.push(Reply::ok().body(format!("echo {bearer}")));
    let read =
        w.rt.block_on(client2.execute_read(1024, |h| h.get("/echo")))
            .unwrap()
            .unwrap();

    // The token did reach the server, marked sensitive.
    let requests = w.transport.requests();
    assert!(requests.iter().any(|r| {
        r.headers
            .get(AUTHORIZATION)
            .is_some_and(|v| v == bearer && v.is_sensitive())
    }));

    let mut outputs = vec![
        builder_debug,
        ok_debug,
        format!("{client:?}"),
        format!("{failed} {failed:?}"),
        format!("{unauthorized} {unauthorized:?}"),
        format!("{:?}", std::error::Error::source(&failed)),
        format!("{:?}", w.observer.events()),
        format!("{:?}", health.snapshots()),
        format!("{requests:?}"),
        format!("{:?}", CallPolicy::essential()),
        format!("{read:?}"),
    ];
    for (i, e) in w.observer.events().iter().enumerate() {
        outputs.push(format!("{i}: {:?} {:?}", e.event, e.event.kind));
        if let vantage_api_pool::EventKind::Failed { error, .. } = &e.event.kind {
            outputs.push(error.to_string());
        }
    }
    for out in &outputs {
        assert!(!out.contains(&canary), "the canary leaked: {out}");
    }
    // What the `Debug`s do show: the settings, the API name, the body's length.
    assert!(
        outputs[0].starts_with("ClientBuilder {")
            && outputs[0].contains("api: Some(\"api\")")
            && outputs[0].contains("max_parallel: 8"),
        "{}",
        outputs[0]
    );
    assert!(
        outputs[2].starts_with("ResilientClient { api: Some(\"api\"), default_policy: "),
        "{}",
        outputs[2]
    );
    let read_debug = &outputs[10];
    let body_len = format!("body_len: {} }}", read.body().len());
    assert!(
        read_debug.starts_with("ReadResponse { response: ") && read_debug.ends_with(&body_len),
        "{read_debug}"
    );
    // The body stays reachable on purpose, through `body()` only.
    assert!(failed.body_text().unwrap().contains(&canary));
    assert!(String::from_utf8_lossy(read.body()).contains(&canary));
}
