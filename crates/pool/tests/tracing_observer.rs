//! `TracingObserver` emits each event as a `tracing` event with the API key.
#![cfg(feature = "tracing")]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use common::*;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};
use vantage_api_pool::tracing_observer::TracingObserver;
use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};

type FieldMap = BTreeMap<String, String>;

/// Keeps (level, fields) for every event, its target as the field `target`.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<(Level, FieldMap)>>>);

struct Fields(FieldMap);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields(FieldMap::new());
        event.record(&mut fields);
        let target = event.metadata().target().to_owned();
        fields.0.insert("target".to_owned(), target);
        self.0
            .lock()
            .unwrap()
            .push((*event.metadata().level(), fields.0));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// The lines of `event` (their `event` field) among `lines`: each one's level, the
/// values of `names` (empty where a line has none) and its message, as text.
fn lines_of<const N: usize>(
    lines: &[(Level, FieldMap)],
    event: &str,
    names: [&str; N],
) -> Vec<(String, [String; N], String)> {
    let event = format!("{event:?}");
    lines
        .iter()
        .filter(|(_, f)| f.get("event") == Some(&event))
        .map(|(level, f)| {
            let get = |name: &str| f.get(name).cloned().unwrap_or_default();
            (level.to_string(), names.map(get), get("message"))
        })
        .collect()
}

/// `rows` in the form [`lines_of`] returns.
fn rows<const N: usize>(rows: &[(&str, [&str; N], &str)]) -> Vec<(String, [String; N], String)> {
    rows.iter()
        .map(|(level, fields, message)| {
            (
                (*level).to_owned(),
                fields.map(str::to_owned),
                (*message).to_owned(),
            )
        })
        .collect()
}

/// A builder over `w` whose client a `TracingObserver` observes, keyed `orders-api`.
fn traced(w: &World) -> vantage_api_pool::ClientBuilder<ScriptedTransport, VirtualRuntime> {
    vantage_api_pool::ResilientClient::builder(w.transport.clone(), w.rt.clone())
        .observer("orders-api", Arc::new(TracingObserver::new()))
}

/// Runs one successful call under `policy` through a `TracingObserver` keyed
/// `orders-api`, and returns what it emitted.
fn one_traced_call(w: &World, policy: vantage_api_pool::CallPolicy) -> Vec<(Level, FieldMap)> {
    let client = traced(w).build().unwrap();
    let capture = Capture::default();
    tracing::subscriber::with_default(capture.clone(), || {
        w.rt.block_on(client.execute_with(&policy, |h| h.get("/x")))
            .unwrap()
            .unwrap();
    });
    capture.0.lock().unwrap().clone()
}

#[test]
fn events_become_tracing_events_with_the_api_key() {
    let w = World::new();
    w.transport
        .push_many([Reply::status(503).body("secret body"), Reply::ok()]);
    let lines = one_traced_call(&w, bounded(1, ms(5)));
    let names: Vec<_> = lines
        .iter()
        .map(|(level, f)| (level.to_string(), f["event"].clone()))
        .collect();
    let want = [
        ("TRACE", "\"started\""),
        ("WARN", "\"failed\""),
        ("DEBUG", "\"retry_scheduled\""),
        ("TRACE", "\"started\""),
        ("DEBUG", "\"succeeded\""),
        ("DEBUG", "\"call_end\""),
    ]
    .map(|(l, e)| (l.to_owned(), e.to_owned()));
    assert_eq!(names, want);
    let ended = &lines[5].1;
    assert_eq!(
        [
            &ended["outcome"],
            &ended["sends"],
            &ended["attempts"],
            &ended["status"]
        ],
        ["\"succeeded\"", "2", "2", "200"]
    );
    assert_eq!(
        (&ended["elapsed_ms"], &ended["at_ms"]),
        (&"5.0".to_owned(), &"5.0".to_owned())
    );
    assert!(!ended.contains_key("kind"));
    assert!(
        lines
            .iter()
            .all(|(_, f)| f["api"] == "\"orders-api\"" && f["call"] == "1"),
        "{lines:?}"
    );
    let failed = &lines[1].1;
    assert_eq!(failed["status"], "503");
    assert_eq!(failed["message"], "HTTP 503 after 1 attempt");
    assert_eq!(lines[4].1["attempt"], "2");
    assert!(
        lines
            .iter()
            .all(|(_, f)| f.values().all(|v| !v.contains("secret")))
    );
}

#[test]
fn every_kind_of_event_has_its_level_and_fields() {
    let w = World::new();
    w.transport.push_many([
        Reply::fail(
            vantage_api_pool::TransportErrorKind::NotSent,
            "stale connection",
        ),
        Reply::status(503),
        Reply::ok(),
        Reply::stall(),
        Reply::status(503),
    ]);
    let client = vantage_api_pool::ResilientClient::builder(w.transport.clone(), w.rt.clone())
        .observer("orders-api", Arc::new(TracingObserver::new()))
        .breaker(1, secs(1), secs(1))
        .build()
        .unwrap();
    let background = vantage_api_pool::CallPolicy::background();
    let capture = Capture::default();
    tracing::subscriber::with_default(capture.clone(), || {
        // A redial, then a 503 that opens the breaker; a call refused while it is
        // open; after the cooldown a success that closes it; a stalled call dropped;
        // a report; a 503 that opens it again, and a reset by hand.
        let call = || client.execute_with(&background, |h| h.get("/x"));
        let _ = w.rt.block_on(call()).unwrap().unwrap_err();
        let _ = w.rt.block_on(call()).unwrap().unwrap_err();
        w.rt.advance(secs(1));
        w.rt.block_on(call()).unwrap().unwrap();
        let stalled = {
            let client = client.clone();
            let background = background.clone();
            w.rt.spawn(async move {
                let _ = client.execute_with(&background, |h| h.get("/x")).await;
            })
        };
        w.rt.run_until_idle().unwrap();
        stalled.abort();
        w.rt.run_until_idle().unwrap();
        client.report(vantage_api_pool::Report::RowsPulled { n: 7 });
        client.report(vantage_api_pool::Report::WritePushed);
        let _ = w.rt.block_on(call()).unwrap().unwrap_err();
        assert!(client.reset_breaker());
    });
    // The calls' ends apart: each call's last line, a DEBUG.
    let (ends, lines): (Vec<_>, Vec<_>) = capture
        .0
        .lock()
        .unwrap()
        .clone()
        .into_iter()
        .partition(|(_, f)| f["event"] == "\"call_end\"");
    let ends: Vec<_> = ends
        .iter()
        .map(|(level, f)| {
            let get = |name: &str| f.get(name).map_or("-".to_owned(), |v| v.replace('"', ""));
            format!(
                "{level} {} {} {} {} sends={} attempts={}",
                get("call"),
                get("outcome"),
                get("status"),
                get("kind"),
                get("sends"),
                get("attempts")
            )
        })
        .collect();
    assert_eq!(
        ends,
        [
            "DEBUG 1 failed 503 status sends=2 attempts=1",
            "DEBUG 2 failed - breaker_open sends=1 attempts=1",
            "DEBUG 3 succeeded 200 - sends=1 attempts=1",
            "DEBUG 4 cancelled - - sends=1 attempts=1",
            "DEBUG 5 failed 503 status sends=1 attempts=1",
        ]
    );
    let names: Vec<_> = lines
        .iter()
        .map(|(level, f)| format!("{level} {}", f["event"].trim_matches('"')))
        .collect();
    assert_eq!(
        names,
        [
            "TRACE started",
            "WARN failed",
            "DEBUG redialing",
            "TRACE started",
            "WARN failed",
            "WARN breaker_opened",
            "TRACE started",
            "DEBUG failed",
            "TRACE started",
            "DEBUG succeeded",
            "INFO breaker_closed",
            "TRACE started",
            "DEBUG cancelled",
            "DEBUG rows_pulled",
            "DEBUG write_pushed",
            "TRACE started",
            "WARN failed",
            "WARN breaker_opened",
            "INFO breaker_reset",
        ]
    );
    assert!(lines.iter().all(|(_, f)| f["api"] == "\"orders-api\""));
    // One target, so `RUST_LOG=vantage_api_pool=debug` selects them all.
    assert!(lines.iter().all(|(_, f)| f["target"] == "vantage_api_pool"));
    let field = |i: usize, name: &str| lines[i].1.get(name).cloned();
    assert_eq!(field(1, "kind").as_deref(), Some("\"transport\""));
    assert_eq!(field(5, "cooldown_ms").as_deref(), Some("1000.0"));
    // A breaker change names the call whose send caused it.
    assert_eq!(field(5, "call").as_deref(), Some("1"));
    assert_eq!(field(10, "call").as_deref(), Some("3"));
    assert_eq!(field(9, "status").as_deref(), Some("200"));
    // The refusal: call 2's, unsent, no time, kind breaker_open.
    assert_eq!(field(7, "call").as_deref(), Some("2"));
    assert_eq!(field(7, "sent").as_deref(), Some("false"));
    assert_eq!(field(7, "ms").as_deref(), Some("0"));
    assert_eq!(field(7, "kind").as_deref(), Some("\"breaker_open\""));
    assert_eq!(field(12, "send").as_deref(), Some("1"));
    // The breaker's changes say so in their message too.
    assert_eq!(
        field(5, "message").as_deref(),
        Some("circuit breaker opened")
    );
    assert_eq!(
        field(10, "message").as_deref(),
        Some("circuit breaker closed")
    );
    assert_eq!(field(13, "n").as_deref(), Some("7"));
    assert_eq!(field(13, "call"), None, "a report belongs to no call");
    assert_eq!(field(14, "call"), None, "a report belongs to no call");
    assert_eq!(field(18, "call"), None, "a reset belongs to no call");
    assert_eq!(
        field(18, "message").as_deref(),
        Some("circuit breaker reset by hand")
    );
    // Every per-send event names its send and attempt, as the docs promise (the
    // redial announces the send it will be).
    let per_send = ["started", "succeeded", "failed", "cancelled", "redialing"];
    for (i, (_, f)) in lines.iter().enumerate() {
        if per_send.contains(&f["event"].trim_matches('"')) {
            assert!(
                f.contains_key("send") && f.contains_key("attempt"),
                "line {i} ({}) lacks send or attempt: {f:?}",
                names[i]
            );
        }
    }
    assert_eq!(
        (field(2, "send").as_deref(), field(2, "attempt").as_deref()),
        (Some("2"), Some("1")),
        "the redial is send 2 of attempt 1"
    );
    assert_eq!(field(12, "attempt").as_deref(), Some("1"));
}

#[test]
fn the_numbers_are_the_events_own_with_times_in_milliseconds() {
    let w = World::new();
    w.transport.push_many([
        Reply::fail(
            vantage_api_pool::TransportErrorKind::NotSent,
            "stale connection",
        ),
        Reply::status(503).after(ms(30)),
        Reply::ok().after(ms(40)).header("content-length", "0"),
    ]);
    let lines = one_traced_call(&w, bounded(1, ms(10)));
    let nth = |event: &str, n: usize| {
        lines
            .iter()
            .filter(|(_, f)| f["event"] == format!("{event:?}"))
            .nth(n)
            .unwrap_or_else(|| panic!("no {event} #{n} in {lines:?}"))
            .1
            .clone()
    };
    // The 503 after the redial: send 2 of attempt 1, 30 ms.
    let failed = nth("failed", 1);
    let numbers = ["send", "attempt", "ms"].map(|k| failed[k].clone());
    assert_eq!(numbers, ["2", "1", "30"]);
    let retry = nth("retry_scheduled", 0);
    assert_eq!([&retry["attempt"], &retry["after_ms"]], ["2", "10.0"]);
    // Sent at 40 ms (30 ms + 10 ms back-off), answered 40 ms later.
    // Send and attempt are told apart: the redial was send 2 of attempt 1, the
    // success is send 3 of attempt 2.
    let started = nth("started", 1);
    assert_eq!([&started["send"], &started["attempt"]], ["2", "1"]);
    let succeeded = nth("succeeded", 0);
    assert_eq!([&succeeded["send"], &succeeded["attempt"]], ["3", "2"]);
    assert_eq!(succeeded["ms"], "40");
    assert_eq!(succeeded["bytes"], "0");
    assert_eq!(succeeded["at_ms"], "80.0");
}

#[test]
fn times_keep_their_fraction_of_a_millisecond() {
    let w = World::new();
    w.transport
        .push(Reply::ok().after(std::time::Duration::from_micros(2_500)));
    let lines = one_traced_call(&w, bounded(0, ms(10)));
    let at_ms: Vec<_> = lines
        .iter()
        .map(|(_, f)| (f["event"].trim_matches('"').to_owned(), f["at_ms"].clone()))
        .collect();
    let want = [
        ("started", "0.0"),
        ("succeeded", "2.5"),
        ("call_end", "2.5"),
    ];
    assert_eq!(at_ms, want.map(|(e, t)| (e.to_owned(), t.to_owned())));
}

#[test]
fn a_call_refused_for_a_reason_of_its_own_is_a_warning() {
    // Only a refusal by an open breaker is DEBUG (its opening was the WARN); an
    // auth failure refuses the call for a reason of its own.
    let w = World::new();
    let client = vantage_api_pool::ResilientClient::builder(w.transport.clone(), w.rt.clone())
        .observer("orders-api", Arc::new(TracingObserver::new()))
        .auth(vantage_api_pool::auth::send_token_fn(|| async {
            let down = vantage_api_pool::auth::AuthError::from("token endpoint down");
            Err::<(http::HeaderName, http::HeaderValue), _>(down)
        }))
        .build()
        .unwrap();
    let capture = Capture::default();
    tracing::subscriber::with_default(capture.clone(), || {
        let call =
            client.execute_with_owned(vantage_api_pool::CallPolicy::background(), |h| h.get("/x"));
        assert!(w.rt.block_on(call).unwrap().is_err());
    });
    let lines = capture.0.lock().unwrap().clone();
    let failed: Vec<_> = lines
        .iter()
        .filter(|(_, f)| f["event"] == "\"failed\"")
        .map(|(level, f)| (level.to_string(), f["sent"].clone(), f["kind"].clone()))
        .collect();
    assert_eq!(
        failed,
        [("WARN".to_owned(), "false".to_owned(), "\"auth\"".to_owned())]
    );
}

#[test]
fn a_labelled_call_logs_its_label_on_every_line() {
    let w = World::new();
    w.transport.push_many([Reply::status(503), Reply::ok()]);
    let lines = one_traced_call(&w, bounded(1, ms(5)).with_label("orders.list"));
    assert_eq!(lines.len(), 6, "{lines:?}");
    assert!(
        lines
            .iter()
            .all(|(_, f)| f.get("label").map(String::as_str) == Some("\"orders.list\"")),
        "{lines:?}"
    );
    // Without one, no label field at all.
    w.transport.push(Reply::ok());
    let lines = one_traced_call(&w, bounded(0, ms(5)));
    assert!(
        lines.iter().all(|(_, f)| !f.contains_key("label")),
        "{lines:?}"
    );
}

#[test]
fn a_token_fetch_is_info_when_it_lands_and_a_warning_when_it_fails() {
    // The first fetch lands (generation 1); `refresh_token`'s fails.
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let fetches = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let client = traced(&w)
        .auth(vantage_api_pool::auth::send_token_fn(move || {
            let n = fetches.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                if n > 0 {
                    return Err(vantage_api_pool::auth::AuthError::from(
                        "token endpoint down",
                    ));
                }
                Ok((
                    http::header::AUTHORIZATION,
                    http::HeaderValue::from_static("Bearer t1"),
                ))
            }
        }))
        .build()
        .unwrap();
    let capture = Capture::default();
    tracing::subscriber::with_default(capture.clone(), || {
        w.rt.block_on(client.execute(|h| h.get("/x")))
            .unwrap()
            .unwrap();
        assert!(w.rt.block_on(client.refresh_token()).unwrap().is_err());
    });
    let lines = capture.0.lock().unwrap().clone();
    // No line, and no field of one, holds the source's text.
    for (_, fields) in &lines {
        for value in fields.values() {
            assert!(!value.contains("token endpoint down"), "{fields:?}");
        }
    }
    assert_eq!(
        lines_of(
            &lines,
            "token_fetch_ended",
            ["api", "reason", "outcome", "generation"]
        ),
        rows(&[
            (
                "INFO",
                ["\"orders-api\"", "\"first\"", "\"fetched\"", "1"],
                "auth token fetched"
            ),
            // The source's text stays out of the log.
            (
                "WARN",
                ["\"orders-api\"", "\"requested\"", "\"failed\"", ""],
                "auth token fetch failed"
            ),
        ])
    );
}

#[test]
fn a_call_a_panic_unwound_through_ends_with_a_warning() {
    // The request closure panics: the call is unwound, and its end says so.
    quiet_panics_starting_with("request closure panics");
    let w = World::new();
    let client = traced(&w).build().unwrap();
    let capture = Capture::default();
    tracing::subscriber::with_default(capture.clone(), || {
        let call = client.execute(|_| -> vantage_api_pool_testkit::ScriptedRequestBuilder {
            panic!("request closure panics")
        });
        let unwound =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.rt.block_on(call)));
        assert!(unwound.is_err());
    });
    let lines = capture.0.lock().unwrap().clone();
    assert_eq!(
        lines_of(
            &lines,
            "call_end",
            ["outcome", "sends", "attempts", "elapsed_ms"]
        ),
        rows(&[(
            "WARN",
            ["\"panicked\"", "0", "0", "0.0"],
            "call unwound by a panic"
        )])
    );
}

#[test]
fn a_token_fetch_given_up_is_info_and_one_a_panic_unwound_a_warning() {
    // Fetch 1 lands with a 90 s lifetime; fetch 2 (a refresh) takes 10 s and its
    // caller drops it; fetch 3 (another refresh) panics.
    quiet_panics_starting_with("token source panics");
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let (rt, fetches) = (w.rt.clone(), Arc::new(std::sync::atomic::AtomicU32::new(0)));
    let client = traced(&w)
        .auth(vantage_api_pool::auth::token_fn(move || {
            let rt = rt.clone();
            let n = fetches.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            async move {
                match n {
                    1 => Ok(vantage_api_pool::auth::AuthToken::bearer("t1")?.expires_in(secs(90))),
                    2 => {
                        rt.sleep(secs(10)).await;
                        vantage_api_pool::auth::AuthToken::bearer("t2")
                    }
                    _ => panic!("token source panics on fetch {n}"),
                }
            }
        }))
        .build()
        .unwrap();
    let capture = Capture::default();
    tracing::subscriber::with_default(capture.clone(), || {
        w.rt.block_on(client.execute(|h| h.get("/x")))
            .unwrap()
            .unwrap();
        let refresh = {
            let client = client.clone();
            w.rt.spawn(async move {
                let _ = client.refresh_token().await;
            })
        };
        w.rt.run_until_idle().unwrap();
        refresh.abort();
        w.rt.run_until_idle().unwrap();
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            w.rt.block_on(client.refresh_token())
        }));
        assert!(unwound.is_err());
    });
    let lines = capture.0.lock().unwrap().clone();
    assert_eq!(
        lines_of(
            &lines,
            "token_fetch_ended",
            ["reason", "outcome", "lifetime_ms"]
        ),
        rows(&[
            (
                "INFO",
                ["\"first\"", "\"fetched\"", "90000.0"],
                "auth token fetched",
            ),
            (
                "INFO",
                ["\"requested\"", "\"abandoned\"", ""],
                "auth token fetch given up by its caller",
            ),
            (
                "WARN",
                ["\"requested\"", "\"panicked\"", ""],
                "auth token fetch unwound by a panic",
            ),
        ])
    );
}
