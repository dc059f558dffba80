//! `WasmRuntime` on JavaScript's real clock and timers. Runs in Node and in headless
//! Chromium (`scripts/wasm-test`); empty on other targets.
#![cfg(target_arch = "wasm32")]

use std::future::Future;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::{Either, select};
// Through the runtime's re-export: the same crate a caller of this runtime names.
use vantage_api_pool_wasm::vantage_api_pool::{Instant, Runtime, timeout_at};
use vantage_api_pool_wasm::{MissingGlobal, WasmRuntime};
use wasm_bindgen::JsValue;
use wasm_bindgen::prelude::wasm_bindgen;
use wasm_bindgen_test::wasm_bindgen_test;

#[wasm_bindgen]
extern "C" {
    /// The raw clock, to check the runtime against.
    #[wasm_bindgen(js_namespace = performance, js_name = now)]
    fn raw_performance_now() -> f64;
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[wasm_bindgen_test]
async fn a_50_ms_sleep_takes_at_least_50_ms_of_performance_now() {
    let rt = WasmRuntime::new();
    for _ in 0..3 {
        let raw_start = raw_performance_now();
        let start = rt.now();
        rt.sleep(ms(50)).await;
        let raw = raw_performance_now() - raw_start;
        let elapsed = rt.now() - start;
        assert!(raw >= 50.0, "performance.now() moved only {raw} ms");
        assert!(
            elapsed >= ms(50),
            "the runtime's clock moved only {elapsed:?}"
        );
        assert!(raw < 5_000.0, "a 50 ms sleep took {raw} ms");
    }
    assert_eq!(rt.pending_timers(), 0);
}

#[wasm_bindgen_test]
async fn the_clock_starts_at_the_runtime_and_runs_at_the_rate_of_performance_now() {
    let first = WasmRuntime::new();
    first.sleep(ms(100)).await;
    let second = WasmRuntime::new();
    let (a, b) = (first.now(), second.now());
    // Each runtime counts from when it was made: the first is 100 ms ahead.
    assert!(
        a.saturating_duration_since(b) >= ms(90),
        "{a:?} vs {b:?}: one origin for both"
    );
    // Each reading of the runtime's clock is bracketed by two of performance.now(),
    // so what it moved lies between what the inner and the outer pair moved
    // (within 1 µs of rounding to whole nanoseconds), however the reads are timed.
    for _ in 0..3 {
        let outer_start = raw_performance_now();
        let start = first.now();
        let inner_start = raw_performance_now();
        first.sleep(ms(50)).await;
        let inner_end = raw_performance_now();
        let end = first.now();
        let outer_end = raw_performance_now();
        let moved = (end - start).as_secs_f64() * 1_000.0;
        let (least, most) = (inner_end - inner_start, outer_end - outer_start);
        assert!(
            least - 0.001 <= moved && moved <= most + 0.001,
            "the clock moved {moved} ms while performance.now() moved {least} to {most} ms"
        );
    }
}

#[wasm_bindgen_test]
async fn a_sleep_on_punctual_timers_arms_few_timers() {
    // A timer that fires on time ends its sleep: a sleep re-arms only for a timer
    // that fired early (or the setTimeout limit).
    let rt = WasmRuntime::new();
    for _ in 0..3 {
        let before = timers_fire_early(0.0);
        rt.sleep(ms(100)).await;
        let armed = timers_fire_early(0.0) - before;
        assert!(armed <= 3.0, "a 100 ms sleep armed {armed} timers");
    }
}

#[wasm_bindgen_test]
async fn short_sleeps_never_end_before_their_deadline() {
    // Node's timers fire up to about a millisecond early; the sleep re-arms then.
    let rt = WasmRuntime::new();
    for i in 0..60u64 {
        let deadline = rt.now() + Duration::from_micros(i * 97 % 3_000 + 1);
        rt.sleep_until(deadline).await;
        let now = rt.now();
        assert!(
            now >= deadline,
            "sleep {i} ended at {now:?}, before {deadline:?}"
        );
    }
    for i in 0..30u64 {
        let raw_start = raw_performance_now();
        rt.sleep(ms(i % 4)).await;
        let raw = raw_performance_now() - raw_start;
        assert!(raw >= (i % 4) as f64, "a {} ms sleep took {raw} ms", i % 4);
    }
    assert_eq!(rt.pending_timers(), 0);
}

#[wasm_bindgen_test]
async fn now_never_goes_backwards() {
    let rt = WasmRuntime::new();
    let clone = rt.clone();
    let mut last = rt.now();
    for round in 0..20 {
        for _ in 0..5_000 {
            for now in [rt.now(), clone.now()] {
                assert!(now >= last, "round {round}: {now:?} after {last:?}");
                last = now;
            }
        }
        rt.sleep(ms(1)).await;
    }
    assert!(
        last >= Instant::ORIGIN + ms(20),
        "20 sleeps of 1 ms, clock at {last:?}"
    );
}

#[wasm_bindgen_test]
async fn a_dropped_sleep_clears_its_timer() {
    let rt = WasmRuntime::new();

    // Armed when first polled, not when made.
    let mut sleep = Box::pin(rt.sleep(Duration::from_secs(60)));
    assert_eq!(rt.pending_timers(), 0);
    assert_eq!(futures::poll!(sleep.as_mut()), Poll::Pending);
    assert_eq!(rt.pending_timers(), 1);
    // Polling again keeps the one timer.
    assert_eq!(futures::poll!(sleep.as_mut()), Poll::Pending);
    assert_eq!(rt.pending_timers(), 1);
    drop(sleep);
    assert_eq!(
        rt.pending_timers(),
        0,
        "dropping the sleep cleared its timer"
    );

    // The loser of a race holds its timer until it is dropped.
    let race = select(rt.sleep(ms(5)), rt.sleep(Duration::from_secs(3_600))).await;
    let Either::Left(((), long)) = race else {
        panic!("the hour-long sleep won the race");
    };
    assert_eq!(rt.pending_timers(), 1, "the hour-long sleep is still armed");
    drop(long);
    assert_eq!(rt.pending_timers(), 0);

    // A time limit that loses to the work clears its sleep's timer.
    let done = timeout_at(&rt, rt.now() + Duration::from_secs(3_600), async {
        rt.sleep(ms(2)).await;
        7
    })
    .await;
    assert_eq!(done, Ok(7));
    assert_eq!(rt.pending_timers(), 0);
}

/// How many times `clearTimeout` has been called since this was first called (it
/// wraps the global `clearTimeout` with a counter, once).
fn clear_timeout_calls() -> f64 {
    let body = "if (globalThis.__clearTimeoutCalls === undefined) {\
                    globalThis.__clearTimeoutCalls = 0;\
                    const clear = globalThis.clearTimeout;\
                    globalThis.clearTimeout = function (handle) {\
                        globalThis.__clearTimeoutCalls += 1;\
                        return clear(handle);\
                    };\
                }\
                return globalThis.__clearTimeoutCalls;";
    js_sys::Function::new_no_args(body)
        .call0(&JsValue::NULL)
        .expect("the counter runs")
        .as_f64()
        .expect("a number")
}

/// Makes every `setTimeout` fire `early_by` ms before its delay (0: on time) and
/// returns how many it was asked for so far. The wrapper is installed once and
/// reads its lead at each call.
fn timers_fire_early(early_by: f64) -> f64 {
    let body = "if (globalThis.__setTimeoutCalls === undefined) {\
                    globalThis.__setTimeoutCalls = 0;\
                    globalThis.__earlyBy = 0;\
                    const set = globalThis.setTimeout;\
                    globalThis.setTimeout = function (f, ms, ...rest) {\
                        globalThis.__setTimeoutCalls += 1;\
                        return set(f, Math.max(0, ms - globalThis.__earlyBy), ...rest);\
                    };\
                }\
                globalThis.__earlyBy = earlyBy;\
                return globalThis.__setTimeoutCalls;";
    js_sys::Function::new_with_args("earlyBy", body)
        .call1(&JsValue::NULL, &JsValue::from_f64(early_by))
        .expect("the wrapper runs")
        .as_f64()
        .expect("a number")
}

#[wasm_bindgen_test]
async fn a_timer_that_fires_early_is_armed_again_until_the_deadline() {
    // Node's timers fire up to about a millisecond early, at random: here every
    // timer fires 150 ms early, so a sleep that took the first fire for its end would
    // end 150 ms short, every time (short of a timer 150 ms late, which then also
    // leaves a second timer unarmed).
    let rt = WasmRuntime::new();
    let before = timers_fire_early(150.0);
    let raw_start = raw_performance_now();
    rt.sleep(ms(200)).await;
    let raw = raw_performance_now() - raw_start;
    let armed = timers_fire_early(0.0) - before;
    assert!(raw >= 200.0, "a 200 ms sleep took {raw} ms");
    assert!(
        armed >= 2.0,
        "{armed} timer(s) armed for a sleep whose first fired early"
    );
    assert_eq!(rt.pending_timers(), 0);
}

/// Wraps the global `setTimeout`, once, to remember the delay it was last asked for;
/// returns that delay and forgets it (NaN when no timer was armed since the last
/// call, so a read never sees an older timer's delay).
fn last_set_timeout_delay() -> f64 {
    let body = "if (globalThis.__lastDelay === undefined) {\
                    globalThis.__lastDelay = NaN;\
                    const set = globalThis.setTimeout;\
                    globalThis.setTimeout = function (f, ms, ...rest) {\
                        globalThis.__lastDelay = ms;\
                        return set(f, ms, ...rest);\
                    };\
                }\
                const delay = globalThis.__lastDelay;\
                globalThis.__lastDelay = NaN;\
                return delay;";
    js_sys::Function::new_no_args(body)
        .call0(&JsValue::NULL)
        .expect("the wrapper runs")
        .as_f64()
        .expect("a number")
}

#[wasm_bindgen_test]
async fn a_sleep_arms_its_timer_for_the_time_left_rounded_up_to_whole_ms() {
    // 2.999 ms left, less by the little the first poll comes later: a timer for
    // 2 ms would fire before the deadline, and be armed again for nothing. A try
    // whose poll came 0.9 ms or more after the sleep was made (the thread was
    // preempted) leaves under 2.1 ms, so it does not count; one of ten is enough.
    let rt = WasmRuntime::new();
    let mut delays = Vec::new();
    for _ in 0..10 {
        let _ = last_set_timeout_delay();
        let made = rt.now();
        let mut sleep = Box::pin(rt.sleep(Duration::from_micros(2_999)));
        assert_eq!(futures::poll!(sleep.as_mut()), Poll::Pending);
        let late = rt.now() - made >= Duration::from_micros(900);
        let delay = last_set_timeout_delay();
        sleep.await;
        if !late {
            delays.push(delay);
            break;
        }
    }
    assert_eq!(delays, [3.0], "the delay of the one try polled in time");
    assert_eq!(rt.pending_timers(), 0);
}

#[wasm_bindgen_test]
async fn a_sleep_that_ends_before_its_timer_fired_gives_the_timer_up_at_once() {
    // The deadline passes while the thread is busy, so the timer has not fired
    // when the sleep is polled again: the sleep ends, and its timer with it, not
    // only when the sleep is dropped.
    let rt = WasmRuntime::new();
    let mut sleep = Box::pin(rt.sleep(ms(2)));
    assert_eq!(futures::poll!(sleep.as_mut()), Poll::Pending);
    assert_eq!(rt.pending_timers(), 1);
    let deadline = sleep.deadline();
    while rt.now() < deadline {
        std::hint::spin_loop();
    }
    let cleared = clear_timeout_calls();
    assert_eq!(futures::poll!(sleep.as_mut()), Poll::Ready(()));
    assert_eq!(
        rt.pending_timers(),
        0,
        "the ended sleep still holds its timer"
    );
    assert_eq!(
        clear_timeout_calls() - cleared,
        1.0,
        "JavaScript's timer is cleared when the sleep ends"
    );
}

#[wasm_bindgen_test]
async fn dropping_an_armed_sleep_really_calls_clear_timeout() {
    // pending_timers() is the runtime's own count: this checks JavaScript's side.
    let rt = WasmRuntime::new();
    let before = clear_timeout_calls();
    let mut sleep = Box::pin(rt.sleep(Duration::from_secs(60)));
    assert_eq!(futures::poll!(sleep.as_mut()), Poll::Pending);
    // A second poll before the timer fired keeps the timer it armed.
    assert_eq!(futures::poll!(sleep.as_mut()), Poll::Pending);
    assert_eq!(clear_timeout_calls(), before, "cleared while armed");
    drop(sleep);
    assert_eq!(clear_timeout_calls(), before + 1.0);
}

/// Wraps the global `setTimeout` and `clearTimeout`, once, to remember the last
/// handle each saw; returns whether the last one cleared is the last one armed.
fn last_cleared_timer_is_last_armed() -> bool {
    let body = "if (globalThis.__lastArmed === undefined) {\
                    globalThis.__lastArmed = null;\
                    globalThis.__lastCleared = undefined;\
                    const set = globalThis.setTimeout;\
                    const clear = globalThis.clearTimeout;\
                    globalThis.setTimeout = function (...args) {\
                        const handle = set(...args);\
                        globalThis.__lastArmed = handle;\
                        return handle;\
                    };\
                    globalThis.clearTimeout = function (handle) {\
                        globalThis.__lastCleared = handle;\
                        return clear(handle);\
                    };\
                }\
                return globalThis.__lastCleared === globalThis.__lastArmed;";
    js_sys::Function::new_no_args(body)
        .call0(&JsValue::NULL)
        .expect("the wrapper runs")
        .as_bool()
        .expect("a boolean")
}

#[wasm_bindgen_test]
async fn a_dropped_sleep_clears_the_timer_it_armed_which_then_never_fires() {
    let rt = WasmRuntime::new();
    // Installs the wrappers; nothing armed or cleared since.
    let _ = last_cleared_timer_is_last_armed();
    let mut sleep = Box::pin(rt.sleep(ms(20)));
    assert_eq!(futures::poll!(sleep.as_mut()), Poll::Pending);
    assert!(!last_cleared_timer_is_last_armed(), "cleared while armed");
    drop(sleep);
    assert!(
        last_cleared_timer_is_last_armed(),
        "the drop cleared some other handle than the one its sleep armed"
    );
    // Past the dropped sleep's deadline. Had its timer stayed armed, it would call
    // the freed closure, which wasm-bindgen refuses with an exception thrown from
    // the timer's callback: an uncaught error that fails the run.
    rt.sleep(ms(100)).await;
    assert_eq!(rt.pending_timers(), 0);
}

#[wasm_bindgen_test]
async fn a_sleep_past_the_set_timeout_limit_keeps_its_timer_armed() {
    // setTimeout takes at most 2^31-1 ms; a longer delay given as is fires at once
    // (and a sleep re-arming it every millisecond would spin).
    let rt = WasmRuntime::new();
    for long in [
        ms(i32::MAX as u64 + 1),
        Duration::from_secs(30 * 24 * 3600),
        Duration::from_secs(300 * 365 * 24 * 3600),
    ] {
        let mut sleep = Box::pin(rt.sleep(long));
        assert_eq!(futures::poll!(sleep.as_mut()), Poll::Pending);
        rt.sleep(ms(30)).await;
        assert_eq!(rt.pending_timers(), 1, "a {long:?} sleep's timer fired");
        assert_eq!(futures::poll!(sleep.as_mut()), Poll::Pending);
        drop(sleep);
        assert_eq!(rt.pending_timers(), 0);
    }
}

#[wasm_bindgen_test]
async fn a_sleep_polled_by_another_task_first_wakes_the_task_awaiting_it() {
    let rt = WasmRuntime::new();
    let start = rt.now();
    let mut sleep = Box::pin(rt.sleep(ms(20)));
    let elsewhere = futures::task::noop_waker();
    assert!(
        sleep
            .as_mut()
            .poll(&mut Context::from_waker(&elsewhere))
            .is_pending()
    );
    let raced = select(sleep, rt.sleep(ms(2_000))).await;
    assert!(
        matches!(raced, Either::Left(_)),
        "the 20 ms sleep never woke"
    );
    let took = rt.now() - start;
    assert!(took < ms(1_000), "woke only after {took:?}");
}

#[wasm_bindgen_test]
async fn a_time_limit_that_wins_drops_the_work_and_its_timer() {
    let rt = WasmRuntime::new();
    let start = rt.now();
    let cut = timeout_at(&rt, start + ms(20), rt.sleep(Duration::from_secs(3_600))).await;
    assert!(cut.is_err());
    assert!(rt.now() - start >= ms(20));
    assert_eq!(rt.pending_timers(), 0, "the cut sleep cleared its timer");
}

#[wasm_bindgen_test]
async fn a_sleep_to_the_far_future_arms_nothing_and_a_past_deadline_is_ready() {
    let rt = WasmRuntime::new();
    let mut never = Box::pin(rt.sleep_until(Instant::FAR_FUTURE));
    assert_eq!(futures::poll!(never.as_mut()), Poll::Pending);
    assert_eq!(rt.pending_timers(), 0);
    assert_eq!(never.deadline(), Instant::FAR_FUTURE);

    let mut past = Box::pin(rt.sleep_until(Instant::ORIGIN));
    assert_eq!(futures::poll!(past.as_mut()), Poll::Ready(()));
    let mut zero = Box::pin(rt.sleep(Duration::ZERO));
    // Rounded up when made, so it may need one tick; it never arms more than one timer.
    if futures::poll!(zero.as_mut()).is_pending() {
        zero.as_mut().await;
    }
    assert_eq!(rt.pending_timers(), 0);
}

#[wasm_bindgen_test]
async fn concurrent_sleeps_each_end_at_their_own_deadline() {
    let rt = WasmRuntime::new();
    let start = rt.now();
    let order = std::cell::RefCell::new(Vec::new());
    let sleeper = |n: u64| {
        let (rt, order) = (&rt, &order);
        async move {
            rt.sleep(ms(n)).await;
            order.borrow_mut().push((n, rt.now() - start));
        }
    };
    futures::join!(sleeper(30), sleeper(10), sleeper(20));
    let order = order.into_inner();
    assert_eq!(
        order.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        [10, 20, 30]
    );
    for (n, at) in order {
        assert!(at >= ms(n), "the {n} ms sleep ended at {at:?}");
    }
    assert_eq!(rt.pending_timers(), 0);
}

#[wasm_bindgen_test]
fn the_wall_clock_is_date_now() {
    let rt = WasmRuntime::new();
    let wall = rt
        .wall_clock()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        * 1_000.0;
    let date = js_sys::Date::now();
    assert!(
        (wall - date).abs() < 1_000.0,
        "wall {wall} ms, Date.now() {date} ms"
    );
    // After 2020-01-01: it is really the calendar, not the monotonic clock.
    assert!(wall > 1_577_836_800_000.0);
}

#[wasm_bindgen_test]
fn jitter_is_in_the_unit_interval_and_a_seed_replays_it() {
    let seeded = WasmRuntime::with_seed(1_234_567);
    // SplitMix64's first output for seed 1234567 is 6457827717110365317.
    let first = (6_457_827_717_110_365_317_u64 >> 11) as f64 / (1u64 << 53) as f64;
    assert_eq!(seeded.random(), first);

    let a = WasmRuntime::with_seed(42);
    let b = WasmRuntime::with_seed(42);
    let b_clone = b.clone();
    let xs: Vec<f64> = (0..200).map(|_| a.random()).collect();
    let ys: Vec<f64> = (0..200)
        .map(|i| {
            if i % 2 == 0 {
                b.random()
            } else {
                b_clone.random()
            }
        })
        .collect();
    assert_eq!(xs, ys, "clones share the generator");
    assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
    assert!(xs.iter().any(|x| *x < 0.1) && xs.iter().any(|x| *x > 0.9));

    let unseeded = WasmRuntime::new();
    let zs: Vec<f64> = (0..200).map(|_| unseeded.random()).collect();
    assert!(zs.iter().all(|x| (0.0..1.0).contains(x)));
    assert!(zs.windows(2).any(|w| w[0] != w[1]), "Math.random() varies");
}

/// Puts `replacement` in place of the global `name` and returns the function that
/// puts the original back (or removes the stand-in where the global was inherited).
fn replace_global(name: &str, replacement: &JsValue) -> js_sys::Function {
    let body = "const descriptor = Object.getOwnPropertyDescriptor(globalThis, name);\
                Object.defineProperty(globalThis, name, \
                    { value: replacement, configurable: true, writable: true });\
                return () => {\
                    if (descriptor === undefined) { delete globalThis[name]; }\
                    else { Object.defineProperty(globalThis, name, descriptor); }\
                };";
    js_sys::Function::new_with_args("name, replacement", body)
        .call2(&JsValue::NULL, &JsValue::from_str(name), replacement)
        .expect("the global is replaced")
        .into()
}

#[wasm_bindgen_test]
fn try_new_names_the_global_that_is_missing_or_not_a_function() {
    assert!(WasmRuntime::try_new().is_ok());
    assert!(WasmRuntime::try_with_seed(7).is_ok());
    let no_now = JsValue::from(js_sys::Object::new());
    let cases = [
        ("performance", JsValue::UNDEFINED, "performance.now"),
        ("performance", no_now, "performance.now"),
        ("setTimeout", JsValue::from_f64(42.0), "setTimeout"),
        ("setTimeout", JsValue::NULL, "setTimeout"),
        ("clearTimeout", JsValue::UNDEFINED, "clearTimeout"),
    ];
    for (global, replacement, named) in cases {
        let restore = replace_global(global, &replacement);
        // Nothing here may throw before the original is back.
        let plain = WasmRuntime::try_new().map(drop);
        let seeded = WasmRuntime::try_with_seed(7).map(drop);
        restore
            .call0(&JsValue::NULL)
            .expect("the global is restored");
        let error: MissingGlobal = plain.expect_err(global);
        assert_eq!(error.name(), named, "{global} replaced by {replacement:?}");
        assert_eq!(seeded, Err(error));
        assert!(error.to_string().contains(&format!("`{named}`")), "{error}");
    }
    // Every global is back.
    let rt = WasmRuntime::try_new().expect("all globals restored");
    assert_eq!(rt.pending_timers(), 0);
}

#[wasm_bindgen_test]
fn says_which_global_scope_it_runs_in() {
    // scripts/wasm-test reads this line to check that its worker run ran in a
    // dedicated worker, not in the page.
    let global = js_sys::global();
    let name = String::from(global.constructor().name());
    wasm_bindgen_test::console_log!("global scope: {name}");
    let has = |key: &str| js_sys::Reflect::has(&global, &JsValue::from_str(key)).unwrap_or(false);
    match name.as_str() {
        "Window" => assert!(has("document"), "a window has a document"),
        "DedicatedWorkerGlobalScope" => {
            assert!(
                !has("document") && has("postMessage"),
                "a worker posts messages"
            );
        }
        // Node's global object is a plain `Object`.
        _ => assert!(
            !has("document") && has("process"),
            "{name}: not Node either"
        ),
    }
}
