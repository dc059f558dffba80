//! What the builder and the client promise about their settings and accessors, and
//! the ports' default and blanket methods (a mutation review found these unguarded).
mod common;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime};

use common::*;
use http::HeaderValue;
use http::header::{AUTHORIZATION, HeaderName};
use vantage_api_pool::auth::{AuthError, send_token_fn};
use vantage_api_pool::bytes::Bytes;
use vantage_api_pool::runtime::SendRuntime;
use vantage_api_pool::transport::SendTransportResponse;
use vantage_api_pool::transport::read_body;
use vantage_api_pool::{
    BreakerState, CallPolicy, ClientBuilder, EventKind, Instant, Jitter, Report, ResilientClient,
    RetryMode, RetryPolicy, Runtime, TransportError, TransportErrorKind, TransportResponse,
    timeout_at,
};
use vantage_api_pool_testkit::{RecordingObserver, Reply, ScriptedTransport, VirtualRuntime};

type Builder = ClientBuilder<ScriptedTransport, VirtualRuntime>;

/// `n` calls made at once through a client `configure` sets up, each answered
/// `reply`: when each send went out, and the most sends in flight at once.
fn calls_at_once(
    n: usize,
    reply: Reply,
    configure: impl FnOnce(Builder) -> Builder,
) -> (Vec<Duration>, usize) {
    let w = World::new();
    w.transport.default_reply(reply);
    let client = configure(w.builder()).build().unwrap();
    let calls: Vec<_> = (0..n)
        .map(|_| w.spawn_call(&client, CallPolicy::background(), "/x"))
        .collect();
    w.rt.run().unwrap();
    for c in calls {
        w.rt.block_on(c).unwrap().unwrap();
    }
    (w.sent_at(), client.peak_in_flight())
}

/// When four calls made at once go out, through a client `configure` sets up.
fn four_sends_at(configure: impl FnOnce(Builder) -> Builder) -> Vec<Duration> {
    calls_at_once(4, Reply::ok(), configure).0
}

#[test]
fn max_parallel_is_eight_unless_set() {
    let (sent_at, peak) = calls_at_once(9, Reply::ok().after(secs(1)), |b| b);
    assert_eq!(peak, 8);
    assert_eq!(sent_at, [vec![Duration::ZERO; 8], vec![secs(1)]].concat());
}

#[test]
fn take_peak_in_flight_gives_each_interval_its_own_peak() {
    let w = World::new();
    w.transport.default_reply(Reply::ok().after(secs(1)));
    let client = w.client();
    let scraper = client.clone();
    let burst = |n: usize| -> Vec<_> {
        (0..n)
            .map(|_| w.spawn_call(&client, CallPolicy::background(), "/x"))
            .collect()
    };
    // Five in flight at the first scrape; the figure is shared by clones.
    let first = burst(5);
    w.rt.run_for(ms(500)).unwrap();
    assert_eq!(scraper.take_peak_in_flight(), 5);
    // The next interval starts from the five still in flight, and they end in it.
    w.rt.run_for(secs(1)).unwrap();
    assert!(first.iter().all(|call| call.is_finished()));
    assert_eq!(client.peak_in_flight(), 5);
    assert_eq!(scraper.take_peak_in_flight(), 5);
    // A quiet interval: nothing held.
    assert_eq!(scraper.take_peak_in_flight(), 0);
    // Two in the next one, ended before the scrape.
    let second = burst(2);
    w.rt.run_for(secs(2)).unwrap();
    assert!(second.iter().all(|call| call.is_finished()));
    assert_eq!(client.in_flight(), 0);
    assert_eq!(scraper.take_peak_in_flight(), 2);
    assert_eq!(client.peak_in_flight(), 0);
}

#[test]
fn the_last_max_parallel_rate_limit_and_breaker_set_win() {
    let (_, peak) = calls_at_once(4, Reply::ok().after(secs(1)), |b| {
        b.max_parallel(2).max_parallel(3)
    });
    assert_eq!(peak, 3);
    // 2/s: a burst of 2, then one every 500 ms; 1/s with a burst of 1: one a second.
    let fast = [Duration::ZERO, Duration::ZERO, ms(500), secs(1)];
    let slow = [Duration::ZERO, secs(1), secs(2), secs(3)];
    assert_eq!(four_sends_at(|b| b.rate_limit(1.0).rate_limit(2.0)), fast);
    assert_eq!(
        four_sends_at(|b| b.rate_limit_with_burst(1.0, 1).rate_limit(2.0)),
        fast
    );
    assert_eq!(
        four_sends_at(|b| b.rate_limit(2.0).rate_limit_with_burst(1.0, 1)),
        slow
    );
    assert_eq!(
        four_sends_at(|b| b
            .rate_limit_with_burst(2.0, 2)
            .rate_limit_with_burst(1.0, 1)),
        slow
    );
    // One failure opens a breaker of threshold 1, not the default's (5).
    for (threshold_one_last, opens) in [(false, false), (true, true)] {
        let w = World::new();
        w.transport.default_reply(Reply::status(503));
        let builder = if threshold_one_last {
            w.builder().default_breaker().breaker(1, secs(1), secs(1))
        } else {
            w.builder().breaker(1, secs(1), secs(1)).default_breaker()
        };
        let client = builder.build().unwrap();
        let _ = w.background_error(&client);
        assert_eq!(
            client.breaker_state() != BreakerState::Closed,
            opens,
            "threshold 1 set last: {threshold_one_last}"
        );
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]
fn build_names_the_first_refused_setting_in_its_documented_order() {
    let w = World::new();
    let bad_retry = RetryPolicy {
        max_retries: 1,
        base: secs(2),
        max: secs(1),
    };
    // Each step adds a bad setting checked before all the ones already there.
    type AddBad = fn(Builder, RetryPolicy) -> Builder;
    let steps: [(AddBad, &str); 6] = [
        (|b, _| b.breaker(0, secs(1), secs(1)), "breaker.threshold"),
        (|b, _| b.rate_limit(f64::NAN), "rate_limit"),
        (|b, _| b.max_parallel(0), "max_parallel"),
        (|b, p| b.default_retry(p), "default_retry.max"),
        (
            |b, _| b.retry_count_header(AUTHORIZATION),
            "retry_count_header",
        ),
        (
            |b, _| b.observer(" \t", Arc::new(Heard::default())),
            "observer",
        ),
    ];
    for n in 1..=steps.len() {
        let builder = steps[..n]
            .iter()
            .fold(w.builder(), |b, (add, _)| add(b, bad_retry));
        assert_eq!(builder.build().unwrap_err().setting(), steps[n - 1].1);
    }
}

/// What an observer heard, in order: `attach api at_ms` or an event's name.
#[derive(Default)]
struct Heard(std::sync::Mutex<Vec<String>>);

impl vantage_api_pool::TransportObserver for Heard {
    fn on_event(&self, api: &str, event: &vantage_api_pool::TransportEvent) {
        let line = format!("{api} {}", event.kind.name());
        self.0.lock().unwrap().push(line);
    }

    fn on_attach(&self, api: &str, at: Instant) {
        let line = format!("attach {api} {}", at.since_origin().as_millis());
        self.0.lock().unwrap().push(line);
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]
fn an_observer_keyed_on_an_empty_or_blank_name_is_refused() {
    let w = World::new();
    let heard = Arc::new(Heard::default());
    for api in ["", " ", "\t\n", "\u{3000}"] {
        let err = w
            .builder()
            .observer(api, heard.clone())
            .build()
            .unwrap_err();
        assert_eq!(err.setting(), "observer", "{api:?}");
    }
    assert!(heard.0.lock().unwrap().is_empty(), "nothing attached");
    // A name with white space around it is still a name, kept as given.
    assert!(
        w.builder()
            .observer(" orders ", heard.clone())
            .build()
            .is_ok()
    );
    assert_eq!(*heard.0.lock().unwrap(), ["attach  orders  0"]);
}

#[test]
// On wasm32 observers need not be Send + Sync, and the client still takes an Arc.
#[cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]
fn build_attaches_its_observer_once_before_any_event_and_a_refused_build_never() {
    let w = World::new();
    let heard = Arc::new(Heard::default());
    let builder = || {
        ResilientClient::builder(w.transport.clone(), w.rt.clone())
            .observer("orders", heard.clone())
    };
    assert!(builder().max_parallel(0).build().is_err());
    assert!(
        heard.0.lock().unwrap().is_empty(),
        "a refused build attaches nothing"
    );
    w.rt.advance(secs(2));
    let client = builder().build().unwrap();
    let twin = client.clone();
    w.transport.push(Reply::ok());
    w.rt.block_on(twin.execute(|h| h.get("/x")))
        .unwrap()
        .unwrap();
    assert_eq!(
        *heard.0.lock().unwrap(),
        ["attach orders 2000", "orders started", "orders succeeded"]
    );

    // Through a `Fanout`, every observer is attached; a `HealthObserver` lists the
    // API before it has any traffic, and the default `on_attach` does nothing.
    let health = Arc::new(vantage_api_pool::health::HealthObserver::new(secs(60)));
    let recording = Arc::new(RecordingObserver::new());
    let both = vantage_api_pool::Fanout::default()
        .with(heard.clone())
        .with(health.clone())
        .with(recording.clone());
    let _quiet = ResilientClient::builder(w.transport.clone(), w.rt.clone())
        .observer("search", Arc::new(both))
        .build()
        .unwrap();
    assert_eq!(
        heard.0.lock().unwrap().last().unwrap(),
        "attach search 2000"
    );
    let listed = health.snapshots();
    assert_eq!(listed.len(), 1);
    let (api, figures) = &listed[0];
    assert_eq!(&**api, "search");
    assert_eq!(figures.sends_in_window, 0);
    assert_eq!(figures.success_rate, None);
    assert_eq!(figures.updated_at, at(secs(2)));
    assert!(recording.is_empty());
}

#[test]
fn a_default_retry_whose_max_equals_its_base_is_accepted() {
    let w = World::new();
    let p = RetryPolicy {
        max_retries: 1,
        base: secs(1),
        max: secs(1),
    };
    assert!(w.builder().default_retry(p).build().is_ok());
}

#[test]
fn no_retry_count_header_is_set_unless_asked() {
    let w = World::new();
    w.transport.push_many([Reply::status(503), Reply::ok()]);
    let client = w.client();
    w.rt.block_on(client.execute_with(&bounded(1, ms(10)), |h| h.get("/x")))
        .unwrap()
        .unwrap();
    let reqs = w.transport.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[1].headers, reqs[0].headers);
}

#[test]
fn a_retry_count_header_the_request_depends_on_is_refused() {
    let w = World::new();
    let reserved = vantage_api_pool::builder::RESERVED_RETRY_COUNT_HEADERS;
    // The ones whose loss does the most harm are on the list by name.
    for name in [
        "idempotency-key",
        "authorization",
        "content-length",
        "host",
        "expect",
    ] {
        assert!(reserved.iter().any(|r| r == name), "{name}");
    }
    for name in reserved {
        let err = w
            .builder()
            .retry_count_header(name.clone())
            .build()
            .unwrap_err();
        assert_eq!(err.setting(), "retry_count_header", "{name}");
    }
    // Any other name is taken.
    let ok = w
        .builder()
        .retry_count_header(HeaderName::from_static("x-retry-count"))
        .build();
    assert!(ok.is_ok());
}

#[test]
fn a_token_under_the_retry_count_headers_name_goes_out_on_the_retry() {
    let w = World::new();
    let key = HeaderName::from_static("x-api-key");
    let client = w
        .builder()
        .retry_count_header(key.clone())
        .auth(send_token_fn(|| async {
            Ok::<_, AuthError>((
                HeaderName::from_static("x-api-key"),
                HeaderValue::from_static("k-1"),
            ))
        }))
        .build()
        .unwrap();
    w.transport.push_many([Reply::status(503), Reply::ok()]);
    w.rt.block_on(client.execute_with(&bounded(1, ms(10)), |h| h.get("/x")))
        .unwrap()
        .unwrap();
    let sent: Vec<_> = w
        .transport
        .requests()
        .iter()
        .map(|r| r.headers[&key].clone())
        .collect();
    assert_eq!(sent, ["k-1", "k-1"]);
}

#[test]
fn a_401_replay_is_an_attempt_of_its_own_that_repeats_the_retry_count() {
    // 401 (replayed with a new token), 503 (retried), 200: three attempts, one retry.
    let w = World::new();
    let fetches = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&fetches);
    let client = w
        .builder()
        .retry_count_header(HeaderName::from_static("x-retry-count"))
        .auth(send_token_fn(move || {
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                let token = HeaderValue::from_str(&format!("Bearer t{n}")).unwrap();
                Ok::<_, AuthError>((AUTHORIZATION, token))
            }
        }))
        .build()
        .unwrap();
    w.transport
        .push_many([Reply::status(401), Reply::status(503), Reply::ok()]);
    w.rt.block_on(client.execute_with(&bounded(3, ms(10)), |h| h.get("/x")))
        .unwrap()
        .unwrap();
    let requests = w.transport.requests();
    let sent: Vec<_> = requests
        .iter()
        .map(|r| {
            let count = r.headers.get("x-retry-count");
            (r.headers[&AUTHORIZATION].clone(), count.cloned())
        })
        .collect();
    let value = HeaderValue::from_static;
    assert_eq!(
        sent,
        [
            (value("Bearer t1"), None),
            (value("Bearer t2"), None),
            (value("Bearer t2"), Some(value("1"))),
        ]
    );
    assert_eq!(w.started(), [(1, 1), (2, 2), (3, 3)]);
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
}

#[test]
fn auth_keeps_the_settings_made_before_it() {
    let w = World::new();
    let p = RetryPolicy {
        max_retries: 0,
        base: ms(10),
        max: ms(10),
    };
    let client = w
        .builder()
        .default_retry(p)
        .retry_count_header(HeaderName::from_static("x-retry-count"))
        .request_id_header(HeaderName::from_static("cf-ray"))
        .auth(send_token_fn(|| async {
            Ok::<_, AuthError>((AUTHORIZATION, HeaderValue::from_static("Bearer t")))
        }))
        .build()
        .unwrap();
    assert_eq!(client.default_policy().retry(), &RetryMode::Bounded(p));
    w.transport.push_many([Reply::status(503), Reply::ok()]);
    w.rt.block_on(client.execute_with(&bounded(1, ms(10)), |h| h.get("/x")))
        .unwrap()
        .unwrap();
    assert_eq!(w.transport.requests()[1].headers["x-retry-count"], "1");
    w.transport
        .push(Reply::status(404).header("cf-ray", "ray-1"));
    let err = w.background_error(&client);
    assert_eq!(err.request_id(), Some("ray-1"));
    // A success's request id comes from the same header; none when it is missing
    // or not visible ASCII.
    w.transport.push_many([
        Reply::ok()
            .header("cf-ray", "ray-2")
            .header("x-request-id", "other"),
        Reply::ok().header("x-request-id", "other"),
        Reply::ok().header("cf-ray", HeaderValue::from_bytes(b"r\xe9").unwrap()),
        // Valid UTF-8 (`r-é`), but not visible ASCII.
        Reply::ok().header("cf-ray", HeaderValue::from_bytes("r-é".as_bytes()).unwrap()),
    ]);
    let ids: Vec<_> = (0..4)
        .map(|_| {
            let response =
                w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
                    .unwrap()
                    .unwrap();
            client.request_id(&response).map(str::to_owned)
        })
        .collect();
    assert_eq!(ids, [Some("ray-2".to_owned()), None, None, None]);
    // An error's request id follows the same rule.
    w.transport.push(
        Reply::status(404).header("cf-ray", HeaderValue::from_bytes("r-é".as_bytes()).unwrap()),
    );
    assert_eq!(w.background_error(&client).request_id(), None);
}

#[test]
fn a_second_observer_replaces_the_first() {
    let w = World::new();
    let second = RecordingObserver::new();
    let client = w
        .builder()
        .observer("second", Arc::new(second.clone()))
        .build()
        .unwrap();
    assert_eq!(client.api_name(), Some("second"));
    client.report(Report::WritePushed);
    assert_eq!(second.events().len(), 1);
    assert!(w.events().is_empty());
}

#[test]
fn a_rate_limit_bursts_the_rate_rounded_up_then_spaces_sends() {
    // 2.5/s: a burst of 3 (2.5 rounded up), then one send every 400 ms.
    assert_eq!(
        calls_at_once(5, Reply::ok(), |b| b.rate_limit(2.5)).0,
        [
            Duration::ZERO,
            Duration::ZERO,
            Duration::ZERO,
            ms(400),
            ms(800)
        ]
    );
}

#[test]
fn execute_and_execute_with_share_one_call_numbering_from_1() {
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let client = w.client();
    w.rt.block_on(client.execute(|h| h.get("/x")))
        .unwrap()
        .unwrap();
    w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
        .unwrap()
        .unwrap();
    let calls: Vec<_> = w.events().iter().map(|e| e.call.unwrap().0).collect();
    assert_eq!(calls, [1, 1, 2, 2]);
}

#[test]
fn execute_uses_the_clients_default_retry() {
    let w = World::new();
    w.transport.push_many([Reply::status(503), Reply::ok()]);
    let p = RetryPolicy {
        max_retries: 0,
        base: ms(10),
        max: ms(10),
    };
    let client = w.builder().default_retry(p).build().unwrap();
    let err =
        w.rt.block_on(client.execute(|h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.status().map(|s| s.as_u16()), Some(503));
    assert_eq!(w.transport.request_count(), 1);
}

#[test]
fn execute_does_not_make_a_post_idempotent() {
    let w = World::new();
    w.transport
        .push(Reply::fail(TransportErrorKind::Interrupted, "reset"));
    w.transport.default_reply(Reply::ok());
    let client = w.client();
    assert!(
        w.rt.block_on(client.execute(|h| h.post("/x")))
            .unwrap()
            .is_err()
    );
    assert_eq!(w.transport.request_count(), 1);
}

#[test]
fn a_report_carries_the_runtimes_now() {
    let w = World::new();
    let client = w.client();
    w.rt.block_on(w.rt.sleep(secs(5))).unwrap();
    client.report(Report::RowsPulled { n: 3 });
    assert_eq!(w.events()[0].at, at(secs(5)));
}

#[test]
fn default_retry_reads_back_what_the_builder_set() {
    let w = World::new();
    let p = RetryPolicy {
        max_retries: 7,
        base: ms(1),
        max: ms(2),
    };
    let client = w.builder().default_retry(p).build().unwrap();
    assert_eq!(
        client.default_policy(),
        &CallPolicy::bounded(RetryPolicy::default())
            .with_retry(RetryMode::Bounded(p))
            .unwrap()
    );
}

#[test]
fn the_default_policy_is_bounded_with_the_default_retry_unless_set() {
    let w = World::new();
    assert_eq!(w.client().default_policy(), &CallPolicy::default());
    assert_eq!(
        CallPolicy::default(),
        CallPolicy::bounded(RetryPolicy::default())
    );
}

/// A minute per attempt and five for the whole call, a server's delay honoured up to
/// a minute.
fn slow_api_policy() -> CallPolicy {
    CallPolicy::bounded(RetryPolicy {
        max_retries: 3,
        base: ms(250),
        max: secs(60),
    })
    .with_jitter(Jitter::None)
    .unwrap()
    .with_time_limits(secs(60), Some(secs(300)))
    .unwrap()
}

#[test]
fn auth_keeps_the_default_policy_set_before_it() {
    let client = World::new()
        .builder()
        .default_policy(slow_api_policy())
        .auth(send_token_fn(|| async {
            Ok::<_, AuthError>((AUTHORIZATION, HeaderValue::from_static("Bearer t")))
        }))
        .build()
        .unwrap();
    assert_eq!(client.default_policy(), &slow_api_policy());
}

#[test]
fn execute_runs_under_the_builders_default_policy_time_limits() {
    let w = World::new();
    // 45 s for the head: past bounded's 10 s attempt limit, inside the policy's 60 s.
    // Then a 503 asking for 40 s: past bounded's 30 s budget, inside its 300 s.
    w.transport.push_many([
        Reply::status(503).after(secs(45)),
        Reply::status(503).header("retry-after", "40"),
        Reply::ok(),
    ]);
    let client = w
        .builder()
        .default_policy(slow_api_policy())
        .build()
        .unwrap();
    let response = w.rt.block_on(client.execute(|h| h.get("/x"))).unwrap();
    assert_eq!(response.unwrap().status(), 200);
    assert_eq!(
        w.sent_at(),
        [secs(0), secs(45) + ms(250), secs(85) + ms(250)]
    );
}

#[test]
fn a_default_retry_after_the_default_policy_changes_its_retry_only() {
    let w = World::new();
    let once = RetryPolicy {
        max_retries: 1,
        base: ms(10),
        max: ms(10),
    };
    let client = w
        .builder()
        .default_policy(slow_api_policy())
        .default_retry(once)
        .build()
        .unwrap();
    let policy = client.default_policy();
    assert_eq!(policy.retry(), &RetryMode::Bounded(once));
    assert_eq!(
        (policy.attempt_timeout(), policy.budget(), policy.jitter()),
        (secs(60), Some(secs(300)), Jitter::None)
    );
    // One retry, then the call ends on the second 503.
    w.transport.default_reply(Reply::status(503));
    let err =
        w.rt.block_on(client.execute(|h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.status().map(|s| s.as_u16()), Some(503));
    assert_eq!(w.sent_at(), [secs(0), ms(10)]);
}

#[test]
fn a_default_policy_replaces_an_earlier_default_retry() {
    let w = World::new();
    let bad = RetryPolicy {
        max_retries: 1,
        base: secs(2),
        max: secs(1),
    };
    // The refused schedule is gone with the retry it set, so nothing is refused.
    let client = w
        .builder()
        .default_retry(bad)
        .default_policy(slow_api_policy())
        .build()
        .unwrap();
    assert_eq!(client.default_policy(), &slow_api_policy());
}

#[test]
fn a_client_without_a_breaker_is_always_closed() {
    assert_eq!(World::new().client().breaker_state(), BreakerState::Closed);
}

#[test]
fn timeout_at_arms_no_timer_for_work_ready_on_its_first_poll() {
    let rt = VirtualRuntime::new();
    let mut fut = pin!(timeout_at(&rt, at(secs(5)), async { 7 }));
    let mut cx = Context::from_waker(Waker::noop());
    assert_eq!(fut.as_mut().poll(&mut cx), Poll::Ready(Ok(7)));
    assert_eq!(rt.pending_timers(), 0);
}

#[test]
fn timeout_at_arms_no_timer_for_a_deadline_that_never_comes() {
    let rt = VirtualRuntime::new();
    let mut fut = pin!(timeout_at(
        &rt,
        Instant::FAR_FUTURE,
        std::future::pending::<()>()
    ));
    let mut cx = Context::from_waker(Waker::noop());
    assert!(fut.as_mut().poll(&mut cx).is_pending());
    assert_eq!(rt.pending_timers(), 0);
}

/// A runtime of the plain port that keeps `Runtime::sleep`'s default.
struct Plain(VirtualRuntime);
impl Runtime for Plain {
    fn now(&self) -> Instant {
        self.0.now()
    }
    fn wall_clock(&self) -> SystemTime {
        self.0.wall_clock()
    }
    fn sleep_until(&self, d: Instant) -> impl Future<Output = ()> {
        Runtime::sleep_until(&self.0, d)
    }
    fn random(&self) -> f64 {
        self.0.random()
    }
}

#[test]
fn the_plain_ports_sleep_counts_from_now_by_default_and_over_a_send_runtime() {
    let rt = VirtualRuntime::new();
    rt.block_on(rt.sleep(secs(10))).unwrap();
    rt.block_on(Runtime::sleep(&Plain(rt.clone()), secs(1)))
        .unwrap();
    assert_eq!(rt.elapsed(), secs(11));
    rt.block_on(Runtime::sleep(&rt, secs(1))).unwrap();
    assert_eq!(rt.elapsed(), secs(12));
}

/// A `SendRuntime` that keeps `SendRuntime::sleep`'s default.
struct Bare(VirtualRuntime);
impl SendRuntime for Bare {
    fn now(&self) -> Instant {
        self.0.now()
    }
    fn wall_clock(&self) -> SystemTime {
        self.0.wall_clock()
    }
    fn sleep_until(&self, d: Instant) -> impl Future<Output = ()> + Send {
        SendRuntime::sleep_until(&self.0, d)
    }
    fn random(&self) -> f64 {
        self.0.random()
    }
}

#[test]
fn send_runtimes_default_sleep_counts_from_now() {
    let rt = VirtualRuntime::new();
    let bare = Bare(rt.clone());
    rt.block_on(rt.sleep(secs(10))).unwrap();
    rt.block_on(SendRuntime::sleep(&bare, secs(1))).unwrap();
    assert_eq!(rt.elapsed(), secs(11));
    rt.block_on(Runtime::sleep(&bare, secs(1))).unwrap();
    assert_eq!(rt.elapsed(), secs(12));
}

/// A `SendRuntime` whose own `sleep` counts its calls.
struct OwnSleep(VirtualRuntime, AtomicUsize);
impl SendRuntime for OwnSleep {
    fn now(&self) -> Instant {
        self.0.now()
    }
    fn wall_clock(&self) -> SystemTime {
        self.0.wall_clock()
    }
    fn sleep_until(&self, d: Instant) -> impl Future<Output = ()> + Send {
        SendRuntime::sleep_until(&self.0, d)
    }
    fn sleep(&self, d: Duration) -> impl Future<Output = ()> + Send {
        self.1.fetch_add(1, Ordering::Relaxed);
        SendRuntime::sleep(&self.0, d)
    }
    fn random(&self) -> f64 {
        self.0.random()
    }
}

#[test]
fn the_plain_ports_sleep_uses_the_send_runtimes_own() {
    let rt = VirtualRuntime::new();
    let own = OwnSleep(rt.clone(), AtomicUsize::new(0));
    rt.block_on(Runtime::sleep(&own, secs(1))).unwrap();
    assert_eq!(own.1.load(Ordering::Relaxed), 1);
}

/// A send response that knows its length better than its header says.
struct KnownLength(http::HeaderMap);
impl SendTransportResponse for KnownLength {
    fn status(&self) -> http::StatusCode {
        http::StatusCode::OK
    }
    fn headers(&self) -> &http::HeaderMap {
        &self.0
    }
    fn content_length(&self) -> Option<u64> {
        Some(42)
    }
    fn chunk(&mut self) -> impl Future<Output = Result<Option<Bytes>, TransportError>> + Send {
        std::future::ready(Ok(None))
    }
}

#[test]
fn the_plain_response_port_keeps_a_send_responses_own_content_length() {
    let mut headers = http::HeaderMap::new();
    headers.insert(http::header::CONTENT_LENGTH, HeaderValue::from_static("7"));
    assert_eq!(
        TransportResponse::content_length(&KnownLength(headers)),
        Some(42)
    );
}

/// A response that gives only what a response must: its head and an empty body.
struct HeadOnly(http::HeaderMap);
impl TransportResponse for HeadOnly {
    fn status(&self) -> http::StatusCode {
        http::StatusCode::OK
    }
    fn headers(&self) -> &http::HeaderMap {
        &self.0
    }
    async fn chunk(&mut self) -> Result<Option<Bytes>, TransportError> {
        Ok(None)
    }
}

/// The same, as a send response.
struct SendHeadOnly(http::HeaderMap);
impl SendTransportResponse for SendHeadOnly {
    fn status(&self) -> http::StatusCode {
        http::StatusCode::OK
    }
    fn headers(&self) -> &http::HeaderMap {
        &self.0
    }
    fn chunk(&mut self) -> impl Future<Output = Result<Option<Bytes>, TransportError>> + Send {
        std::future::ready(Ok(None))
    }
}

#[test]
fn the_response_ports_default_methods_read_the_headers() {
    let head = |pairs: &[(&'static str, &'static str)]| {
        let mut headers = http::HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, HeaderValue::from_static(value));
        }
        headers
    };
    let seven = head(&[("content-length", "7"), ("x-trace", "t1")]);
    let chunked = head(&[("content-length", "7"), ("transfer-encoding", "chunked")]);
    assert_eq!(
        TransportResponse::content_length(&HeadOnly(seven.clone())),
        Some(7)
    );
    assert_eq!(
        TransportResponse::content_length(&HeadOnly(chunked.clone())),
        None
    );
    assert_eq!(
        SendTransportResponse::content_length(&SendHeadOnly(seven.clone())),
        Some(7)
    );
    assert_eq!(
        SendTransportResponse::content_length(&SendHeadOnly(chunked.clone())),
        None
    );
    // Through the blanket impl, a send response's defaults are its plain ones.
    assert_eq!(
        TransportResponse::content_length(&SendHeadOnly(seven.clone())),
        Some(7)
    );

    // `take_headers` gives every header, by default a copy.
    assert_eq!(
        TransportResponse::take_headers(&mut HeadOnly(seven.clone())),
        seven
    );
    assert_eq!(
        SendTransportResponse::take_headers(&mut SendHeadOnly(chunked.clone())),
        chunked
    );
    assert_eq!(
        TransportResponse::take_headers(&mut SendHeadOnly(seven.clone())),
        seven
    );
}

#[test]
fn transport_error_kinds_have_stable_names() {
    use TransportErrorKind::*;
    assert_eq!(
        [
            NotSent,
            Connect,
            Interrupted,
            TimedOut,
            Tls,
            TooLarge,
            Config
        ]
        .map(TransportErrorKind::name),
        [
            "not_sent",
            "connect",
            "interrupted",
            "timed_out",
            "tls",
            "too_large",
            "config"
        ]
    );
}

#[test]
fn a_content_length_of_zero_is_reported_as_zero_bytes() {
    let w = World::new();
    w.transport
        .push(Reply::status(204).header("content-length", "0"));
    let client = w.client();
    w.rt.block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
        .unwrap()
        .unwrap();
    assert!(
        w.events()
            .iter()
            .any(|e| matches!(e.kind, EventKind::Succeeded { bytes: Some(0), .. }))
    );
}

#[test]
fn read_body_joins_the_chunks_up_to_its_limit_and_passes_a_broken_body_on() {
    let read = |body: &mut Chunks, limit| futures::executor::block_on(read_body(body, limit));
    let mut three = Chunks::new([Ok("ab"), Ok(""), Ok("cd"), Ok("e")]);
    assert_eq!(read(&mut three, 5).unwrap(), "abcde");
    assert_eq!(three.reads, 5, "read to the end");
    let mut empty_first = Chunks::new([Ok(""), Ok("xyz")]);
    assert_eq!(read(&mut empty_first, 3).unwrap(), "xyz");
    assert_eq!(read(&mut Chunks::new([]), 0).unwrap(), "");
    // Over the limit: refused as soon as it is passed, the rest left unread.
    let mut long = Chunks::new([Ok("ab"), Ok("cd"), Ok("e"), Ok("never read")]);
    let error = read(&mut long, 4).unwrap_err();
    assert_eq!(error.kind(), TransportErrorKind::TooLarge);
    assert_eq!(long.reads, 3);
    // A body that breaks fails with the transport's own error.
    let mut broken = Chunks::new([Ok("ab"), Err(TransportErrorKind::Interrupted)]);
    let error = read(&mut broken, 100).unwrap_err();
    assert_eq!(
        (error.kind(), error.message()),
        (TransportErrorKind::Interrupted, "broke")
    );
    // One chunk with data comes back as itself, not a copy.
    let body = Bytes::from_static(b"single");
    let mut single = Chunks::new([Ok("")]);
    single.chunks.push_back(Ok(body.clone()));
    single.chunks.push_back(Ok(Bytes::new()));
    assert_eq!(read(&mut single, 6).unwrap().as_ptr(), body.as_ptr());
}

#[test]
fn execute_with_takes_a_policy_behind_any_reference_and_execute_with_owned_keeps_one() {
    let w = World::new();
    w.transport.default_reply(Reply::ok());
    let client = w.client();
    // A policy the caller already holds by reference, or behind an `Arc`: `execute_with`
    // takes a `&CallPolicy`, so deref coercion applies.
    #[allow(
        clippy::needless_borrow,
        reason = "a `&&CallPolicy` is the point: it must coerce, as it did before"
    )]
    let by_ref = |policy: &CallPolicy| {
        w.rt.block_on(client.execute_with(&policy, |h| h.get("/ref")))
            .unwrap()
            .is_ok()
    };
    let shared = Arc::new(CallPolicy::background());
    assert!(by_ref(&CallPolicy::background()));
    assert!(
        w.rt.block_on(client.execute_with(&shared, |h| h.get("/arc")))
            .unwrap()
            .is_ok()
    );
    // A policy made for the call, kept by the future past its statement.
    let kept = client.execute_with_owned(CallPolicy::background(), |h| h.get("/owned"));
    assert!(w.rt.block_on(kept).unwrap().is_ok());
    let paths: Vec<_> = w.transport.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/ref", "/arc", "/owned"]);
}

#[test]
fn execute_with_owned_runs_under_the_policy_it_is_given() {
    let w = World::new();
    w.transport.push_many([Reply::status(503), Reply::ok()]);
    let client = w.client();
    // No retry, though the client's default policy would retry the 503.
    let err =
        w.rt.block_on(client.execute_with_owned(CallPolicy::background(), |h| h.get("/x")))
            .unwrap()
            .unwrap_err();
    assert_eq!(err.status().map(|s| s.as_u16()), Some(503));
    assert_eq!(w.transport.request_count(), 1);
}

#[test]
fn settings_states_and_their_errors_can_be_map_keys() {
    use std::collections::HashSet;
    use vantage_api_pool::breaker::BreakerConfig;
    use vantage_api_pool::{ErrorKind, TimeLimit};
    fn keys<T: std::hash::Hash + Eq>(values: impl IntoIterator<Item = T>) -> usize {
        values.into_iter().collect::<HashSet<T>>().len()
    }
    let secs = Duration::from_secs;
    assert_eq!(
        keys([
            BreakerState::Closed,
            BreakerState::HalfOpen,
            BreakerState::Closed
        ]),
        2
    );
    let config = BreakerConfig::new(3, secs(10), secs(80)).unwrap();
    assert_eq!(keys([config, config]), 1);
    let refused = RetryPolicy::new(1, secs(5), secs(1)).unwrap_err();
    assert_eq!(keys([refused.clone(), refused]), 1);
    assert_eq!(keys([ErrorKind::Auth, ErrorKind::BreakerOpen]), 2);
    assert_eq!(keys([TimeLimit::Budget, TimeLimit::Budget]), 1);
    assert_eq!(keys([RetryPolicy::default(), RetryPolicy::default()]), 1);
}

#[test]
fn a_calls_future_knows_the_id_its_events_carry() {
    let w = World::new();
    // The first call is answered 503 and opens the breaker, the second is refused
    // unsent while it is open, the third (a clone's) waits out the cooldown and
    // closes it.
    w.transport.push(Reply::status(503)).push(Reply::ok());
    let client = w
        .builder()
        .breaker(1, Duration::from_secs(1), Duration::from_secs(1))
        .default_policy(CallPolicy::essential())
        .build()
        .unwrap();
    let policy = CallPolicy::background();
    let first = client.execute_with(&policy, |http| http.get("/a"));
    let second = client.execute_with_owned(CallPolicy::background(), |http| http.get("/b"));
    let other = client.clone();
    let third = other.execute(|http| http.get("/c"));
    let ids = [first.id(), second.id(), third.id()];
    // Numbered in the order the futures were made, across the client's clones.
    assert_eq!(ids.map(|id| id.0), [1, 2, 3]);
    assert_eq!(format!("{first:?}"), "CallFuture { id: CallId(1), .. }");

    assert!(w.rt.block_on(first).unwrap().is_err());
    assert!(w.rt.block_on(second).unwrap().unwrap_err().nothing_sent());
    assert_eq!(w.rt.block_on(third).unwrap().unwrap().status(), 200);

    let kinds_of = |id| {
        w.observer
            .for_call(id)
            .iter()
            .map(|event| event.kind.name())
            .collect::<Vec<_>>()
    };
    assert_eq!(kinds_of(ids[0]), ["started", "failed", "breaker_opened"]);
    assert_eq!(kinds_of(ids[1]), ["started", "failed"]);
    assert_eq!(kinds_of(ids[2]), ["started", "succeeded", "breaker_closed"]);
    w.assert_contract();
}
