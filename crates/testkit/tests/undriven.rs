//! A `VirtualRuntime` sleep polled while nothing drives the runtime (the mistake of
//! awaiting a call under `#[tokio::test]`, which then waits forever): counted by
//! `undriven_sleeps()`, and explained once on stderr unless the test moves the clock
//! by hand. The stderr half runs this binary's own tests in a child process.

use std::future::Future;
use std::pin::pin;
use std::process::Command;
use std::task::{Context, Waker};
use std::time::Duration;

use vantage_api_pool::ResilientClient;
use vantage_api_pool_testkit::{Reply, ScriptedTransport, UNDRIVEN_HINT, VirtualRuntime};

/// Polls `future` once with a waker that does nothing, as an executor that is not
/// the runtime's would; `true` if it is still pending.
fn pending_after_one_poll<F: Future>(future: F) -> bool {
    let future = pin!(future);
    future
        .poll(&mut Context::from_waker(Waker::noop()))
        .is_pending()
}

/// A client whose every answer takes a second of virtual time, so a call waits on
/// the runtime's clock.
fn slow_client(rt: &VirtualRuntime) -> ResilientClient<ScriptedTransport, VirtualRuntime> {
    let transport = ScriptedTransport::new(rt);
    transport.default_reply(Reply::ok().after(Duration::from_secs(1)));
    ResilientClient::builder(transport, rt.clone())
        .build()
        .expect("valid settings")
}

#[test]
fn a_call_polled_outside_the_runtimes_driver_counts_an_undriven_sleep() {
    let rt = VirtualRuntime::new();
    let client = slow_client(&rt);
    assert!(pending_after_one_poll(
        client.execute(|http| http.get("/x"))
    ));
    // The answer's delay and the attempt's time limit.
    assert!(rt.undriven_sleeps() >= 1, "{}", rt.undriven_sleeps());
}

#[test]
fn calls_the_runtime_drives_count_none() {
    let rt = VirtualRuntime::new();
    let client = slow_client(&rt);
    assert!(
        rt.block_on(client.execute(|http| http.get("/x")))
            .unwrap()
            .is_ok()
    );

    let spawned = {
        let (rt, client) = (rt.clone(), slow_client(&rt));
        rt.clone().spawn(async move {
            rt.sleep(Duration::from_secs(3)).await;
            client.execute(|http| http.get("/y")).await.is_ok()
        })
    };
    rt.run_for(Duration::from_secs(2)).unwrap();
    rt.run().unwrap();
    assert!(rt.block_on(spawned).unwrap());
    assert_eq!(rt.undriven_sleeps(), 0);
}

#[test]
fn each_undriven_sleep_counts_once_however_often_it_is_polled() {
    let rt = VirtualRuntime::new();
    let mut first = pin!(rt.sleep(Duration::from_secs(1)));
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..3 {
        assert!(first.as_mut().poll(&mut cx).is_pending());
    }
    assert_eq!(rt.undriven_sleeps(), 1);
    assert!(pending_after_one_poll(rt.sleep(Duration::from_secs(1))));
    assert_eq!(rt.undriven_sleeps(), 2);
    // A sleep already due is never left waiting.
    assert!(!pending_after_one_poll(rt.sleep(Duration::ZERO)));
    assert_eq!(rt.undriven_sleeps(), 2);
}

/// Run in a child process by the test below, which reads its stderr: two undriven
/// sleeps of one runtime, one of another.
#[test]
fn child_undriven_sleeps_of_two_runtimes() {
    let (a, b) = (VirtualRuntime::new(), VirtualRuntime::new());
    assert!(pending_after_one_poll(a.sleep(Duration::from_secs(1))));
    assert!(pending_after_one_poll(a.sleep(Duration::from_secs(2))));
    assert!(pending_after_one_poll(b.sleep(Duration::from_secs(1))));
    assert_eq!((a.undriven_sleeps(), b.undriven_sleeps()), (2, 1));
}

/// Run in a child process by the test below: an undriven sleep after an `advance`,
/// as a test that moves the clock by hand from another executor makes.
#[test]
fn child_undriven_sleep_after_an_advance() {
    let rt = VirtualRuntime::new();
    rt.advance(Duration::from_millis(1));
    let mut sleep = pin!(rt.sleep(Duration::from_secs(1)));
    let mut cx = Context::from_waker(Waker::noop());
    assert!(sleep.as_mut().poll(&mut cx).is_pending());
    rt.advance(Duration::from_secs(1));
    assert!(sleep.as_mut().poll(&mut cx).is_ready());
    assert_eq!(rt.undriven_sleeps(), 1);
}

/// Runs one of this binary's tests alone in a child process and returns its stderr.
fn stderr_of(test: &str) -> String {
    let output = Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .output()
        .expect("the test binary runs");
    assert!(output.status.success(), "{test} failed: {output:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn the_hint_is_printed_once_per_runtime_and_not_after_an_advance() {
    let two_runtimes = stderr_of("child_undriven_sleeps_of_two_runtimes");
    assert_eq!(
        two_runtimes.matches(UNDRIVEN_HINT).count(),
        2,
        "{two_runtimes}"
    );
    let by_hand = stderr_of("child_undriven_sleep_after_an_advance");
    assert!(!by_hand.contains(UNDRIVEN_HINT), "{by_hand}");
    // The hint names the way out.
    assert!(UNDRIVEN_HINT.contains("rt.block_on"));
}
