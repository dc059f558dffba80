//! How fast the real attempt loop runs on virtual time.
//!
//! Drives `ResilientClient` over the testkit's `VirtualRuntime` and
//! `ScriptedTransport` (recording off) through a long failure/success script: three
//! sends in four get a 503 and the fourth a 200, with a 1 ms back-off before every
//! retry, from 64 concurrent callers. Two set-ups run interleaved, in the same process:
//!
//! - `bare`: no breaker, no rate bucket, the default permit cap, a null observer;
//! - `full`: a breaker (threshold high enough not to open), a rate bucket with a huge rate, a cap of 1024 and a
//!   `RecordingObserver` that records every event (cleared after each batch).
//!
//! Prints simulated attempts per wall-clock second (median of the rounds) and the
//! cost of a `full` attempt relative to a `bare` one.
//!
//! Run: `cargo bench -p vantage-api-pool --bench virtual_loop`

use std::sync::Arc;
use std::time::Duration;

use vantage_api_pool::{CallPolicy, Jitter, NullObserver, ResilientClient, RetryPolicy};
use vantage_api_pool_testkit::{RecordingObserver, Reply, ScriptedTransport, VirtualRuntime};

const CALLS_PER_BATCH: usize = 64;
const ROUNDS: usize = 7;

/// Batches of 64 calls per round; `VIRTUAL_LOOP_BATCHES` overrides (for a short run
/// under `valgrind --tool=callgrind`, which counts instructions instead of time).
fn batches() -> usize {
    std::env::var("VIRTUAL_LOOP_BATCHES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(400)
}

#[derive(Clone, Copy, PartialEq)]
enum Setup {
    Bare,
    Full,
}

/// Runs one round and returns (attempts, wall seconds).
#[allow(clippy::disallowed_methods, clippy::disallowed_types)] // the benchmark measures real time on purpose
fn round(setup: Setup) -> (usize, f64) {
    let rt = VirtualRuntime::new();
    let transport = ScriptedTransport::new(&rt);
    transport.record(false);
    // Every fourth send succeeds, the others get a 503. Each success ends one call,
    // so a batch of 64 calls makes exactly 256 attempts, whatever the interleaving.
    transport.respond_with(|_, n| {
        if n % 4 == 3 {
            Reply::ok()
        } else {
            Reply::status(503)
        }
    });
    let recorder = RecordingObserver::new();
    let builder = ResilientClient::builder(transport.clone(), rt.clone());
    let client = match setup {
        Setup::Bare => builder.observer("bench", Arc::new(NullObserver)).build(),
        Setup::Full => builder
            // A breaker that counts every failure but, with 64 calls failing together,
            // is not meant to open during the run.
            .breaker(1_000_000, Duration::from_secs(5), Duration::from_secs(60))
            .rate_limit(1e9)
            .max_parallel(1024)
            .observer("bench", Arc::new(recorder.clone()))
            .build(),
    }
    .expect("valid settings");
    let policy = CallPolicy::bounded(RetryPolicy {
        max_retries: 1000,
        base: Duration::from_millis(1),
        max: Duration::from_millis(1),
    })
    .with_jitter(Jitter::None)
    .expect("valid jitter");

    let start = std::time::Instant::now();
    // 64 callers, each making `batches()` calls one after another; the first also
    // empties the recording observer now and then so memory stays flat.
    let calls = batches();
    for caller in 0..CALLS_PER_BATCH {
        let (client, policy, recorder) = (client.clone(), policy.clone(), recorder.clone());
        rt.spawn(async move {
            for call in 0..calls {
                let response = client
                    .execute_with(&policy, |http| http.get("/orders"))
                    .await;
                assert!(response.is_ok());
                if caller == 0 && call % 16 == 0 {
                    recorder.clear();
                }
            }
        })
        .detach();
    }
    rt.run().expect("every caller finishes");
    let wall = start.elapsed().as_secs_f64();
    (transport.request_count(), wall)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // `VIRTUAL_LOOP_ONLY=bare|full`: one round of one set-up, nothing printed but the
    // attempt count (for instruction counting).
    if let Ok(only) = std::env::var("VIRTUAL_LOOP_ONLY") {
        let (attempts, _) = round(if only == "full" {
            Setup::Full
        } else {
            Setup::Bare
        });
        println!("{attempts} attempts");
        return;
    }
    // Warm up both paths once.
    round(Setup::Bare);
    round(Setup::Full);
    let (mut bare, mut full) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        for (setup, out) in [(Setup::Bare, &mut bare), (Setup::Full, &mut full)] {
            let (attempts, wall) = round(setup);
            assert_eq!(attempts, batches() * CALLS_PER_BATCH * 4);
            out.push(attempts as f64 / wall);
        }
    }
    let (bare, full) = (median(bare), median(full));
    println!(
        "virtual-time attempt loop, {ROUNDS} interleaved rounds of {} attempts each",
        batches() * CALLS_PER_BATCH * 4
    );
    println!(
        "  bare (null observer, no breaker/bucket):        {:>12.0} attempts/s",
        bare
    );
    println!(
        "  full (breaker, bucket, cap, recording observer): {:>12.0} attempts/s",
        full
    );
    println!(
        "  cost per attempt, full / bare:                   {:>12.2}x",
        bare / full
    );
}
