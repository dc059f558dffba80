//! Model checking of the concurrency-critical parts with shuttle: the breaker's
//! probe slot with epochs, the permit limiter's in-flight accounting, queue and
//! lock-free path, the rate bucket's compare-exchange, and the single-flight token
//! fetch.
//!
//! The code under test is the real code: with the internal-testing feature `shuttle`
//! the pool's locks and atomics (`src/sync.rs`) are shuttle's inside a shuttle
//! execution, so every lock and atomic access is a point where shuttle may switch
//! threads or tasks. Each test runs its scenario under shuttle's random scheduler
//! and under its PCT scheduler (probabilistic concurrency testing, depth 3), each
//! for `MODEL_ITERATIONS` schedules (default 2,000), from a fixed seed so a run is
//! reproducible. A failure prints the schedule to replay.
//!
//! ```text
//! cargo test -p vantage-api-pool --features shuttle --test model_check
//! MODEL_ITERATIONS=20000 cargo test --release -p vantage-api-pool --features shuttle --test model_check
//! SHUTTLE_RANDOM_SEED=7 cargo test -p vantage-api-pool --features shuttle --test model_check   # other schedules
//! ```
//!
//! Ghost state (what the test believes) is kept in shuttle primitives too. Where a
//! property is checked against ghost state updated outside the code's own lock, the
//! ghost's interval is taken inside the real one (taken after the real grant,
//! given back before the real release), so the check is sound: a ghost overlap
//! can only come from a real one.
#![cfg(feature = "shuttle")]

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, SystemTime};

use http::header::AUTHORIZATION;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use shuttle::future::{block_on, spawn, yield_now};
use shuttle::rand::{RngCore, thread_rng};
use shuttle::scheduler::{PctScheduler, RandomScheduler};
use shuttle::sync::Mutex;
use shuttle::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use shuttle::{Config, Runner};
use vantage_api_pool::auth::{AuthError, AuthToken};
use vantage_api_pool::breaker::{
    BreakerConfig, CircuitBreaker, Gate, PROBE_RECHECK, ProbeGuard, Transition,
};
use vantage_api_pool::bytes::Bytes;
use vantage_api_pool::classify::BreakerEffect;
use vantage_api_pool::concurrency::Limiter;
use vantage_api_pool::rate::{RateLimit, TokenBucket};
use vantage_api_pool::{
    BreakerState, CallPolicy, EventKind, Instant, PreparedRequest, ResilientClient, Runtime,
    TokenFetchOutcome, TokenFetchReason, TokenSource, Transport, TransportError, TransportEvent,
    TransportObserver, TransportResponse,
};

// ------------------------------------------------------------------------------------
// Running a scenario under both schedulers.

/// Schedules per scheduler and test (`MODEL_ITERATIONS`, default 2,000).
fn iterations() -> usize {
    std::env::var("MODEL_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000)
}

/// Runs `scenario` under the random scheduler and the PCT scheduler (depth 3), each
/// for [`iterations`] schedules from `seed` (`SHUTTLE_RANDOM_SEED` overrides it).
///
/// The exploration runs on a thread of its own, watched: one that has not finished
/// after [`watchdog_limit`] fails the test instead of hanging the suite. Shuttle runs
/// every task of a schedule on one thread, so a task that blocks outside its control
/// (a `std` lock taken inside an execution, held by another task) blocks them all.
fn explore(name: &str, seed: u64, scenario: impl Fn() + Send + Sync + 'static) {
    let n = iterations();
    let limit = watchdog_limit(n);
    let (done, finished) = std::sync::mpsc::channel();
    let explorer = std::thread::spawn(move || {
        let scenario = Arc::new(scenario);
        let s = Arc::clone(&scenario);
        let random =
            Runner::new(RandomScheduler::new_from_seed(seed, n), Config::new()).run(move || s());
        let s = Arc::clone(&scenario);
        let pct =
            Runner::new(PctScheduler::new_from_seed(seed, 3, n), Config::new()).run(move || s());
        let _ = done.send((random, pct));
    });
    match finished.recv_timeout(limit) {
        Ok((random, pct)) => {
            explorer.join().expect("the exploring thread");
            println!("{name}: {random} random + {pct} PCT schedules passed");
            assert_eq!((random, pct), (n, n), "{name}: every schedule ran");
        }
        // The exploring thread panicked (a schedule broke a property): its panic,
        // with the schedule to replay, is the test's failure.
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(panic) = explorer.join() {
                std::panic::resume_unwind(panic);
            }
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!(
            "{name}: {n} + {n} schedules not explored after {limit:?}: a task blocked where \
             shuttle cannot switch (a std lock inside an execution?)"
        ),
    }
}

/// How long [`explore`] waits for `n` schedules per scheduler: 60 s, or 10 ms a
/// schedule if that is longer (a debug build explores about 2 a millisecond here).
fn watchdog_limit(n: usize) -> Duration {
    let per_schedule = Duration::from_millis(10);
    Duration::from_secs(60)
        .max(per_schedule.saturating_mul(u32::try_from(2 * n).unwrap_or(u32::MAX)))
}

/// A number in `0..n` drawn from shuttle's (replayable) random source.
fn pick(n: u64) -> u64 {
    thread_rng().next_u64() % n
}

fn at_ms(ms: u64) -> Instant {
    Instant::from_origin(Duration::from_millis(ms))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap()
}

// ------------------------------------------------------------------------------------
// (a) The breaker's probe slot.

const COOLDOWN: Duration = Duration::from_secs(1);
const MAX_COOLDOWN: Duration = Duration::from_secs(8);

/// What the probers believe: the epoch whose holder is between its grant and its
/// release, and how many probes failed so far.
#[derive(Default)]
struct ProbeGhost {
    held: Option<u64>,
    latest: u64,
    failed_probes: u32,
}

/// Probers race `check`, `record` and their `ProbeGuard`s on an open breaker, with
/// no lock of the test around the breaker's own. A prober's outcome is a failure
/// (recorded, then its guard dropped: a stale guard whenever another prober got the
/// slot in between), an untouched outcome, or a cancellation (only the guard's drop).
/// A straggler reports failures of sends that started before the breaker opened.
///
/// Checked: at most one probe is granted at a time and every grant has a fresh
/// epoch; a stale guard never frees a newer grant (else a third prober would be
/// granted while the second holds the slot); every failed probe doubles the cooldown
/// exactly once (1, 2, 4, 8, 8 s) and the straggler's failures never do; at the end
/// no slot is leaked and a success closes the breaker.
#[test]
fn probe_slot_is_exclusive_and_stale_guards_free_nothing() {
    explore("probe slot", 0xB4EA_0001, || {
        let breaker = Arc::new(CircuitBreaker::new(
            BreakerConfig::new(1, COOLDOWN, MAX_COOLDOWN).unwrap(),
        ));
        assert_eq!(
            breaker.record(BreakerEffect::Failure, None, at_ms(0)),
            Some(Transition::Opened { cooldown: COOLDOWN })
        );
        // Virtual milliseconds; a caller told to wait moves it on ("sleeps").
        let clock = Arc::new(AtomicU64::new(0));
        let ghost = Arc::new(Mutex::new(ProbeGhost::default()));

        let mut threads = Vec::new();
        for prober in 0..3u64 {
            let (breaker, clock, ghost) = (breaker.clone(), clock.clone(), ghost.clone());
            threads.push(shuttle::thread::spawn(move || {
                for round in 0..3u64 {
                    let now = clock.load(SeqCst);
                    let epoch = match breaker.check(at_ms(now)) {
                        Gate::OpenFor(wait) => {
                            clock.fetch_max(now + millis(wait), SeqCst);
                            continue;
                        }
                        Gate::Allow { probe: None } => {
                            panic!("a breaker that never closed let a plain send through")
                        }
                        Gate::Allow { probe: Some(epoch) } => epoch,
                        other => panic!("a gate answer this test does not know: {other:?}"),
                    };
                    let guard = ProbeGuard::new(&breaker, epoch);
                    {
                        let mut g = ghost.lock().unwrap();
                        assert_eq!(
                            g.held, None,
                            "epoch {epoch} granted while epoch {:?} holds the probe slot",
                            g.held
                        );
                        assert!(epoch > g.latest, "epoch {epoch} is not fresh");
                        g.held = Some(epoch);
                        g.latest = epoch;
                    }
                    match (prober + round) % 3 {
                        0 | 1 => {
                            // A failed probe: the cooldown doubles, capped.
                            let expected = {
                                let mut g = ghost.lock().unwrap();
                                g.held = None;
                                g.failed_probes += 1;
                                COOLDOWN
                                    .saturating_mul(1 << g.failed_probes.min(16))
                                    .min(MAX_COOLDOWN)
                            };
                            let now = clock.load(SeqCst);
                            assert_eq!(
                                breaker.record(BreakerEffect::Failure, Some(epoch), at_ms(now)),
                                Some(Transition::Opened { cooldown: expected }),
                                "the failure of probe {epoch}"
                            );
                            // The guard is dropped after the record, as in the attempt
                            // loop: stale if another prober got the slot meanwhile.
                            drop(guard);
                        }
                        _ if round % 2 == 0 => {
                            // Untouched (a 429, a `TooLarge`): the slot is freed, no
                            // transition.
                            ghost.lock().unwrap().held = None;
                            let now = clock.load(SeqCst);
                            assert_eq!(
                                breaker.record(BreakerEffect::Untouched, Some(epoch), at_ms(now)),
                                None
                            );
                            drop(guard);
                        }
                        _ => {
                            // Cancelled: only the guard's drop frees the slot.
                            ghost.lock().unwrap().held = None;
                            drop(guard);
                        }
                    }
                }
            }));
        }
        {
            let (breaker, clock) = (breaker.clone(), clock.clone());
            threads.push(shuttle::thread::spawn(move || {
                for _ in 0..3 {
                    let now = clock.load(SeqCst);
                    assert_eq!(
                        breaker.record(BreakerEffect::Failure, None, at_ms(now)),
                        None,
                        "a straggler's failure changed an open breaker"
                    );
                }
            }));
        }
        for t in threads {
            t.join().unwrap();
        }

        // No slot leaked: once the longest cooldown has passed, the probe is free, and
        // its success closes the breaker.
        assert!(!breaker.probe_in_flight(), "a probe slot leaked");
        let later = clock.load(SeqCst) + millis(MAX_COOLDOWN);
        let Gate::Allow { probe: Some(epoch) } = breaker.check(at_ms(later)) else {
            panic!("no probe after the longest cooldown")
        };
        assert!(epoch > ghost.lock().unwrap().latest);
        assert_eq!(
            breaker.record(BreakerEffect::Success, Some(epoch), at_ms(later)),
            Some(Transition::Closed)
        );
        assert_eq!(breaker.check(at_ms(later)), Gate::Allow { probe: None });
        assert_eq!(breaker.consecutive_failures(), 0);
    });
}

/// The breaker as the specification describes it (ARCHITECTURE.md, "Breaker state
/// machine"), to compare every answer of the real one with.
struct BreakerSpec {
    threshold: u32,
    closed: bool,
    until: u64,
    cooldown: Duration,
    failures: u32,
    latest: u64,
    slot: Option<u64>,
}

/// The spec, the clock, and counts of what the schedule exercised, behind one lock.
struct World {
    spec: BreakerSpec,
    now: u64,
}

/// Threads run random programs of breaker operations: ask the gate (and wait when
/// told to), record every kind of outcome with the current epoch, a stale epoch or
/// none, drop guards (current or stale) with or without a record, and report plain
/// sends while closed. Each operation and the matching step of the spec run under
/// one test lock, so every answer is compared with the spec in the order the
/// breaker saw the operations (each breaker method is a single critical section of
/// its own lock, so ordering whole operations loses no behaviour, except on the
/// lock-free paths of a quiet breaker, whose flag the next two checks race).
///
/// Checked on every operation: a grant only when no slot is held, with a fresh
/// epoch; a stale guard's drop frees nothing; a stale epoch's failure never doubles
/// the cooldown (it opens a closed breaker at the base cooldown once the failure run
/// reaches the threshold, like any failure, and is ignored otherwise); the current
/// probe's failure doubles it, capped; a success or reachable answer from any epoch
/// closes an open breaker. At the end the breaker can always be closed.
#[test]
fn breaker_matches_its_specification_under_every_interleaving() {
    explore("breaker spec", 0xB4EA_0002, || {
        let breaker = Arc::new(CircuitBreaker::new(
            BreakerConfig::new(2, COOLDOWN, MAX_COOLDOWN).unwrap(),
        ));
        for _ in 0..2 {
            breaker.record(BreakerEffect::Failure, None, at_ms(0));
        }
        let world = Arc::new(Mutex::new(World {
            spec: BreakerSpec {
                threshold: 2,
                closed: false,
                until: millis(COOLDOWN),
                cooldown: COOLDOWN,
                failures: 2,
                latest: 0,
                slot: None,
            },
            now: 0,
        }));
        let mut threads = Vec::new();
        for _ in 0..3 {
            let (breaker, world) = (breaker.clone(), world.clone());
            threads.push(shuttle::thread::spawn(move || {
                let b = &*breaker;
                let mut held: Option<ProbeGuard<'_>> = None;
                let mut stale: Vec<ProbeGuard<'_>> = Vec::new();
                let mut old_epochs: Vec<u64> = Vec::new();
                for _ in 0..6 {
                    let mut w = world.lock().unwrap();
                    let w = &mut *w;
                    match held.take() {
                        Some(guard) => {
                            let epoch = guard.epoch();
                            old_epochs.push(epoch);
                            match pick(7) {
                                0 | 1 => {
                                    spec_record(b, w, BreakerEffect::Failure, Some(epoch));
                                    stale.push(guard); // dropped in a later step
                                }
                                2 => {
                                    spec_record(b, w, BreakerEffect::Success, Some(epoch));
                                    spec_drop(b, w, guard);
                                }
                                3 => {
                                    spec_record(b, w, BreakerEffect::Reachable, Some(epoch));
                                    spec_drop(b, w, guard);
                                }
                                4 => {
                                    spec_record(b, w, BreakerEffect::Untouched, Some(epoch));
                                    spec_drop(b, w, guard);
                                }
                                5 => spec_drop(b, w, guard), // cancelled
                                _ => {
                                    old_epochs.pop();
                                    held = Some(guard); // still in flight
                                }
                            }
                        }
                        None => match pick(10) {
                            0 if !old_epochs.is_empty() => {
                                // A late failure reported with an epoch that is no
                                // longer (or never again) the probe's.
                                let old = old_epochs[pick(old_epochs.len() as u64) as usize];
                                spec_record(b, w, BreakerEffect::Failure, Some(old));
                            }
                            8 => {
                                // A late answer: from an old probe's epoch, or from a
                                // send that left while the breaker was closed.
                                let epoch = (!old_epochs.is_empty() && pick(2) == 0)
                                    .then(|| old_epochs[pick(old_epochs.len() as u64) as usize]);
                                let effect = if pick(2) == 0 {
                                    BreakerEffect::Success
                                } else {
                                    BreakerEffect::Reachable
                                };
                                spec_record(b, w, effect, epoch);
                            }
                            1 if !stale.is_empty() => {
                                let guard = stale.swap_remove(0);
                                spec_drop(b, w, guard);
                            }
                            2 => spec_record(b, w, BreakerEffect::Failure, None),
                            9 => spec_reset(b, w),
                            _ => {
                                if let Some(epoch) = spec_check(b, w) {
                                    held = Some(ProbeGuard::new(b, epoch));
                                }
                            }
                        },
                    }
                }
                let mut w = world.lock().unwrap();
                for guard in held.into_iter().chain(stale) {
                    spec_drop(b, &mut w, guard);
                }
            }));
        }
        for t in threads {
            t.join().unwrap();
        }
        // Always closable: after the longest cooldown a probe goes (or the breaker is
        // closed already) and a success leaves it closed.
        let mut w = world.lock().unwrap();
        assert_eq!(w.spec.slot, None);
        assert!(!breaker.probe_in_flight(), "a probe slot leaked");
        w.now += millis(MAX_COOLDOWN);
        if !w.spec.closed {
            let probe = spec_check(&breaker, &mut w).expect("a probe after the longest cooldown");
            spec_record(&breaker, &mut w, BreakerEffect::Success, Some(probe));
        }
        assert!(w.spec.closed);
        assert_eq!(breaker.check(at_ms(w.now)), Gate::Allow { probe: None });
    });
}

/// `check` at the world's now, compared with the spec; waits (moves the clock) when
/// told to. Returns the granted epoch.
fn spec_check(b: &CircuitBreaker, w: &mut World) -> Option<u64> {
    let s = &mut w.spec;
    let got = b.check(at_ms(w.now));
    let want = if s.closed {
        Gate::Allow { probe: None }
    } else if w.now < s.until {
        Gate::OpenFor(Duration::from_millis(s.until - w.now))
    } else if s.slot.is_some() {
        Gate::OpenFor(PROBE_RECHECK)
    } else {
        Gate::Allow {
            probe: Some(s.latest + 1),
        }
    };
    assert_eq!(got, want, "check at {} ms (held: {:?})", w.now, s.slot);
    match got {
        Gate::OpenFor(wait) => {
            w.now += millis(wait);
            None
        }
        Gate::Allow { probe: None } => {
            // A plain send while closed; its outcome is reported at once.
            let effect = [
                BreakerEffect::Failure,
                BreakerEffect::Failure,
                BreakerEffect::Reachable,
                BreakerEffect::Success,
            ][pick(4) as usize];
            spec_record(b, w, effect, None);
            None
        }
        Gate::Allow { probe: Some(epoch) } => {
            w.spec.latest = epoch;
            w.spec.slot = Some(epoch);
            Some(epoch)
        }
        other => panic!("a gate answer the spec does not know: {other:?}"),
    }
}

/// `record` at the world's now, compared with the spec.
fn spec_record(b: &CircuitBreaker, w: &mut World, effect: BreakerEffect, probe: Option<u64>) {
    let s = &mut w.spec;
    let current = probe.is_some() && probe == s.slot;
    let got = b.record(effect, probe, at_ms(w.now));
    if current {
        s.slot = None;
    }
    let want = match effect {
        BreakerEffect::Success | BreakerEffect::Reachable => {
            if effect == BreakerEffect::Success {
                s.failures = 0;
            }
            if s.closed {
                None
            } else {
                // From any epoch, or none: the API answers.
                s.closed = true;
                s.cooldown = COOLDOWN;
                s.slot = None;
                Some(Transition::Closed)
            }
        }
        BreakerEffect::Failure => {
            s.failures += 1;
            if current {
                // Only the current probe's failure doubles the cooldown.
                s.cooldown = (s.cooldown * 2).min(MAX_COOLDOWN);
                s.until = w.now + millis(s.cooldown);
                Some(Transition::Opened {
                    cooldown: s.cooldown,
                })
            } else if s.closed && s.failures >= s.threshold {
                s.closed = false;
                s.until = w.now + millis(s.cooldown);
                Some(Transition::Opened {
                    cooldown: s.cooldown,
                })
            } else {
                None
            }
        }
        _ => None,
    };
    assert_eq!(
        got, want,
        "record {effect:?} with epoch {probe:?} at {} ms (current probe: {current})",
        w.now
    );
    if let (Some(Transition::Opened { cooldown }), false) = (got, current) {
        assert_eq!(
            cooldown, COOLDOWN,
            "a failure that was not the probe's doubled"
        );
    }
    assert_eq!(b.probe_in_flight(), s.slot.is_some());
}

/// A manual `reset`, compared with the spec: closed, failures cleared, the cooldown
/// back to its base, the slot freed; a transition only if it was not closed.
fn spec_reset(b: &CircuitBreaker, w: &mut World) {
    let s = &mut w.spec;
    let want = (!s.closed).then_some(Transition::Closed);
    assert_eq!(b.reset(), want, "reset at {} ms", w.now);
    s.closed = true;
    s.failures = 0;
    s.cooldown = COOLDOWN;
    s.slot = None;
    assert!(!b.probe_in_flight());
}

/// Drops a guard, compared with the spec: only the current epoch's guard frees the
/// slot.
fn spec_drop(b: &CircuitBreaker, w: &mut World, guard: ProbeGuard<'_>) {
    let epoch = guard.epoch();
    drop(guard);
    if w.spec.slot == Some(epoch) {
        w.spec.slot = None;
    }
    assert_eq!(
        b.probe_in_flight(),
        w.spec.slot.is_some(),
        "dropping the guard of epoch {epoch} (slot: {:?})",
        w.spec.slot
    );
}

// ------------------------------------------------------------------------------------
// (b) Permits.

/// Counts a permit holder in from after its grant to before its release.
struct Holding<'a>(&'a AtomicUsize);

impl<'a> Holding<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        let now = count.fetch_add(1, SeqCst) + 1;
        assert!(now <= 2, "{now} holders of 2 permits");
        Holding(count)
    }
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

/// The breaker's quiet flag (closed, no failure in a row: `admit` and `record` of a
/// success skip the lock) after `first` and `second` race on a breaker of threshold
/// 1, with no test lock around them: whatever order the schedule gives, a breaker
/// whose state is open says so at its gate, and one closed with no failure in a row
/// lets a send through.
fn quiet_flag_agrees_after(
    name: &str,
    seed: u64,
    first: fn(&CircuitBreaker),
    second: fn(&CircuitBreaker),
) {
    explore(name, seed, move || {
        let b = Arc::new(CircuitBreaker::new(
            BreakerConfig::new(1, COOLDOWN, MAX_COOLDOWN).unwrap(),
        ));
        assert!(b.record(BreakerEffect::Failure, None, at_ms(0)).is_some());
        let threads: Vec<_> = [first, second]
            .into_iter()
            .map(|op| {
                let b = b.clone();
                shuttle::thread::spawn(move || op(&b))
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let (state, gate) = (b.state(at_ms(10)), b.check(at_ms(10)));
        match state {
            BreakerState::Open { .. } => {
                assert!(
                    matches!(gate, Gate::OpenFor(_)),
                    "{state:?}, but the gate says {gate:?}"
                );
            }
            BreakerState::Closed if b.consecutive_failures() == 0 => {
                assert!(
                    matches!(gate, Gate::Allow { probe: None }),
                    "{state:?}, but the gate says {gate:?}"
                );
            }
            _ => {}
        }
    });
}

#[test]
fn the_quiet_flag_agrees_with_the_state_after_a_close_and_a_reopen_race() {
    quiet_flag_agrees_after(
        "quiet: success against failure",
        0xB4EA_000B,
        |b| {
            b.record(BreakerEffect::Success, None, at_ms(10));
        },
        |b| {
            b.record(BreakerEffect::Failure, None, at_ms(10));
        },
    );
}

#[test]
fn the_quiet_flag_agrees_with_the_state_after_a_reset_and_a_reopen_race() {
    quiet_flag_agrees_after(
        "quiet: reset against failure",
        0xB4EA_000C,
        |b| {
            b.reset();
        },
        |b| {
            b.record(BreakerEffect::Failure, None, at_ms(10));
        },
    );
}

/// Holders take permits (twice each) and keep them across a yield; a quitter queues
/// and gives up (once right after queueing, once after it may have been woken as
/// the front of the queue); the main task aborts one holder at a random point.
///
/// Checked: the permits held never exceed `max` (by the limiter's figure and by the
/// holders' own count); nobody is left waiting for a wake-up that never comes
/// (shuttle fails a schedule in which every task is blocked); at the end nothing is
/// in flight, nobody waits, and all `max` permits can be taken at once.
#[test]
fn permits_stay_within_the_cap_and_come_back() {
    explore("permits", 0xB4EA_0003, || {
        const MAX: usize = 2;
        let limiter = Arc::new(Limiter::new(MAX).unwrap());
        let holding = Arc::new(AtomicUsize::new(0));
        block_on(async {
            let mut tasks = Vec::new();
            for _ in 0..3 {
                let (limiter, holding) = (limiter.clone(), holding.clone());
                tasks.push(spawn(async move {
                    for _ in 0..2 {
                        let permit = limiter.acquire().await;
                        // Declared after the permit, so an abort drops it first.
                        let held = Holding::new(&holding);
                        assert!(limiter.in_flight() <= MAX, "in_flight above the cap");
                        yield_now().await;
                        drop(held);
                        drop(permit);
                    }
                }));
            }
            for polls in [1, 3] {
                let limiter = limiter.clone();
                tasks.push(spawn(async move {
                    let mut acquire = pin!(limiter.acquire());
                    for _ in 0..polls {
                        let polled = poll_fn(|cx| Poll::Ready(acquire.as_mut().poll(cx))).await;
                        if let Poll::Ready(permit) = polled {
                            drop(permit);
                            return;
                        }
                        yield_now().await;
                    }
                    // Gives up while queued, possibly just after being woken.
                }));
            }
            for _ in 0..pick(6) {
                yield_now().await;
            }
            tasks[pick(3) as usize].abort();
            for task in tasks {
                let _ = task.await; // the aborted one ends `Cancelled`
            }
        });
        assert_eq!(limiter.in_flight(), 0);
        assert_eq!(limiter.waiting(), 0);
        assert!(limiter.peak_in_flight() <= MAX);
        let all: Vec<_> = (0..MAX)
            .map(|_| futures::FutureExt::now_or_never(limiter.acquire()).expect("a permit is free"))
            .collect();
        assert_eq!(limiter.in_flight(), MAX);
        drop(all);
        assert_eq!(limiter.in_flight(), 0);
    });
}

/// One permit, held by the main task while A, B and C queue in that order; B may be
/// aborted while queued; then the permit is freed, a newcomer D arrives at once, and
/// E calls `try_acquire` once at a random point.
///
/// Checked (what `concurrency.rs` promises): permits go in arrival order, A before
/// B before C, and D after all of them: a newcomer never jumps the queue, even while
/// the front of it is being woken; E gets a permit only after everyone else. At the
/// end nothing is in flight or waiting.
#[test]
fn permits_go_in_arrival_order() {
    explore("permit order", 0xB4EA_0004, || {
        let limiter = Arc::new(Limiter::new(1).unwrap());
        let order = Arc::new(Mutex::new(Vec::new()));
        block_on(async {
            let first = limiter.acquire().await;
            let take = |name: char| {
                let (limiter, order) = (limiter.clone(), order.clone());
                spawn(async move {
                    let permit = limiter.acquire().await;
                    order.lock().unwrap().push(name);
                    yield_now().await;
                    drop(permit);
                })
            };
            let mut queued = Vec::new();
            for (i, name) in ['A', 'B', 'C'].into_iter().enumerate() {
                queued.push(take(name));
                while limiter.waiting() < i + 1 {
                    yield_now().await;
                }
            }
            let abort_b = pick(2) == 0;
            if abort_b {
                queued[1].abort();
            }
            drop(first);
            let newcomer = take('D');
            // E tries the lock-free path once, at a random point: it may only win
            // when nobody is queued, that is after everyone else.
            let opportunist = {
                let (limiter, order) = (limiter.clone(), order.clone());
                let delay = pick(8);
                spawn(async move {
                    for _ in 0..delay {
                        yield_now().await;
                    }
                    if let Some(permit) = limiter.try_acquire() {
                        order.lock().unwrap().push('E');
                        drop(permit);
                    }
                })
            };
            for task in queued {
                let _ = task.await;
            }
            newcomer.await.unwrap();
            opportunist.await.unwrap();
            let mut order = order.lock().unwrap().clone();
            if order.last() == Some(&'E') {
                order.pop();
            }
            assert!(
                !order.contains(&'E'),
                "try_acquire jumped the queue: {order:?}"
            );
            let expected: &[char] = if order.contains(&'B') {
                &['A', 'B', 'C', 'D']
            } else {
                assert!(abort_b, "B lost its turn without being aborted: {order:?}");
                &['A', 'C', 'D']
            };
            assert_eq!(order, expected, "permits out of arrival order");
        });
        assert_eq!((limiter.in_flight(), limiter.waiting()), (0, 0));
    });
}

/// Two permits, both held by the main task while A and B queue; the main task frees
/// both back to back, and A and B must then hold one each at the same time (each
/// waits for the other at a barrier while holding its permit).
///
/// Checked: a freed permit reaches a waiter even when both wake-ups went to the
/// front of the queue before it was polled (the front, once served, wakes the next
/// in line while a permit is still free). A lost wake-up leaves B parked and A at
/// the barrier, which shuttle reports as a deadlock.
#[test]
fn permits_freed_together_reach_every_waiter() {
    explore("permits freed together", 0xB4EA_0008, || {
        let limiter = Arc::new(Limiter::new(2).unwrap());
        let both = Arc::new(shuttle::sync::Barrier::new(2));
        block_on(async {
            let first = limiter.acquire().await;
            let second = limiter.acquire().await;
            let mut queued = Vec::new();
            for i in 0..2 {
                let (mine, both) = (limiter.clone(), both.clone());
                queued.push(spawn(async move {
                    let permit = mine.acquire().await;
                    both.wait();
                    drop(permit);
                }));
                while limiter.waiting() < i + 1 {
                    yield_now().await;
                }
            }
            drop(first);
            drop(second);
            for task in queued {
                task.await.unwrap();
            }
        });
        assert_eq!((limiter.in_flight(), limiter.waiting()), (0, 0));
        assert_eq!(limiter.peak_in_flight(), 2);
    });
}

/// A burst-4 bucket, three tasks taking two tokens each at the same instant, the
/// compare-exchange loop interleaved at every atomic access.
///
/// Checked: exactly the burst is handed out, and the next token is due one interval
/// after the instant.
#[test]
fn the_rate_bucket_hands_out_exactly_its_burst() {
    explore("rate bucket", 0xB4EA_0009, || {
        let bucket = Arc::new(TokenBucket::new(RateLimit::with_burst(1.0, 4).unwrap()));
        let at = Instant::from_origin(Duration::from_secs(7));
        let granted = Arc::new(AtomicUsize::new(0));
        block_on(async {
            let tasks: Vec<_> = (0..3)
                .map(|_| {
                    let (bucket, granted) = (bucket.clone(), granted.clone());
                    spawn(async move {
                        for _ in 0..2 {
                            if bucket.try_take(at).is_ok() {
                                granted.fetch_add(1, SeqCst);
                            }
                            yield_now().await;
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
        });
        assert_eq!(granted.load(SeqCst), 4, "the burst, no more, no less");
        assert_eq!(bucket.try_take(at), Err(Duration::from_secs(1)));
    });
}

// ------------------------------------------------------------------------------------
// (c) Single-flight token fetch, through a client over a tiny transport and runtime
// that run under shuttle.

/// A transport whose server accepts every token except `t1` (when `reject_first`),
/// answering after a yield so sends overlap.
struct ModelTransport {
    reject_first: bool,
    sends: AtomicUsize,
}

struct ModelRequest {
    headers: HeaderMap,
}

struct ModelResponse {
    status: StatusCode,
    headers: HeaderMap,
}

impl PreparedRequest for ModelRequest {
    fn method(&self) -> Option<&Method> {
        Some(&Method::GET)
    }
    fn header(&self, name: &HeaderName) -> Option<&HeaderValue> {
        self.headers.get(name)
    }
    fn set_header(&mut self, name: HeaderName, value: HeaderValue) {
        self.headers.insert(name, value);
    }
}

impl TransportResponse for ModelResponse {
    fn status(&self) -> StatusCode {
        self.status
    }
    fn headers(&self) -> &HeaderMap {
        &self.headers
    }
    fn chunk(&mut self) -> impl Future<Output = Result<Option<Bytes>, TransportError>> {
        std::future::ready(Ok(None))
    }
}

impl Transport for ModelTransport {
    type Handle = ();
    type Draft = ();
    type Request = ModelRequest;
    type Response = ModelResponse;

    fn handle(&self) -> &() {
        &()
    }
    fn prepare(&self, _draft: ()) -> Result<ModelRequest, TransportError> {
        Ok(ModelRequest {
            headers: HeaderMap::new(),
        })
    }
    async fn send(&self, request: ModelRequest) -> Result<ModelResponse, TransportError> {
        self.sends.fetch_add(1, SeqCst);
        yield_now().await;
        let token = request
            .headers
            .get(AUTHORIZATION)
            .expect("every send carries the token");
        let status = if self.reject_first && token == "t1" {
            StatusCode::UNAUTHORIZED
        } else {
            StatusCode::OK
        };
        Ok(ModelResponse {
            status,
            headers: HeaderMap::new(),
        })
    }
}

/// A runtime whose clock stands still and whose sleeps never end: these calls have
/// no budget and never back off, so a sleep that ends matters nowhere, and a call
/// that waited on one would hang (shuttle reports a schedule where every task is
/// blocked).
struct ModelRuntime;

impl Runtime for ModelRuntime {
    fn now(&self) -> Instant {
        Instant::ORIGIN
    }
    fn wall_clock(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH
    }
    fn sleep_until(&self, _deadline: Instant) -> impl Future<Output = ()> {
        std::future::pending()
    }
    fn random(&self) -> f64 {
        0.5
    }
}

/// What the token source saw: fetches started, running at once, completed and
/// abandoned.
#[derive(Default)]
struct FetchStats {
    started: AtomicUsize,
    running: AtomicUsize,
    completed: AtomicUsize,
    abandoned: AtomicUsize,
}

/// Counts a fetch out when its future ends or is dropped.
struct Running {
    stats: Arc<FetchStats>,
    completed: bool,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stats.running.fetch_sub(1, SeqCst);
        if !self.completed {
            self.stats.abandoned.fetch_add(1, SeqCst);
        }
    }
}

/// Each token fetch that ended: why it ran, and whether it brought a token.
#[derive(Default)]
struct FetchEnds(std::sync::Mutex<Vec<(TokenFetchReason, bool)>>);

impl TransportObserver for FetchEnds {
    fn on_event(&self, _api: &str, event: &TransportEvent) {
        if let EventKind::TokenFetchEnded {
            reason, outcome, ..
        } = &event.kind
        {
            let fetched = matches!(outcome, TokenFetchOutcome::Fetched { .. });
            self.0.lock().unwrap().push((*reason, fetched));
        }
    }
}

/// A token source that takes two yields to fetch and hands out `t<n>` for the n-th
/// fetch to complete; with its flag set, every fetch after the first fails.
struct ModelSource(Arc<FetchStats>, bool);

impl TokenSource for ModelSource {
    fn fetch(&self) -> impl Future<Output = Result<AuthToken, AuthError>> {
        let (stats, fail_refreshes) = (self.0.clone(), self.1);
        async move {
            stats.started.fetch_add(1, SeqCst);
            let running = stats.running.fetch_add(1, SeqCst) + 1;
            assert_eq!(running, 1, "two token fetches at once");
            let mut guard = Running {
                stats: stats.clone(),
                completed: false,
            };
            yield_now().await;
            yield_now().await;
            let n = stats.completed.fetch_add(1, SeqCst) + 1;
            guard.completed = true;
            drop(guard);
            if fail_refreshes && n > 1 {
                return Err(AuthError::from("identity provider down"));
            }
            let value = HeaderValue::from_str(&format!("t{n}")).unwrap();
            Ok(AuthToken::new(AUTHORIZATION, value))
        }
    }
}

/// Concurrent calls through a client whose token source takes two yields to fetch
/// (token `t<n>` for the n-th fetch to complete). With `reject_first`, the server
/// answers `t1` with 401, so every call that sent with it needs a refresh. With
/// `abort_one`, the main task aborts one call at a random point: in its fetch, its
/// wait for another's fetch, its permit wait, its send or its replay.
///
/// Returns the stats after checking: never two fetches at once; every call that was
/// not aborted succeeded; nothing in flight at the end; the client's fetch count is
/// the source's completed count.
fn run_callers(callers: usize, reject_first: bool, abort_one: bool) -> Arc<FetchStats> {
    run_callers_with(callers, reject_first, abort_one, false, false)
}

/// [`run_callers`]; with `fail_refreshes`, every fetch after the first fails, and a
/// call may then end with an auth error (or the 401 it could not replay) instead of
/// succeeding; with `refresh`, one more task asks `refresh_token()` meanwhile (its
/// fetch succeeds unless `fail_refreshes`).
fn run_callers_with(
    callers: usize,
    reject_first: bool,
    abort_one: bool,
    fail_refreshes: bool,
    refresh: bool,
) -> Arc<FetchStats> {
    let stats = Arc::new(FetchStats::default());
    let source = ModelSource(stats.clone(), fail_refreshes);
    let transport = ModelTransport {
        reject_first,
        sends: AtomicUsize::new(0),
    };
    let fetch_ends = Arc::new(FetchEnds::default());
    let client = ResilientClient::builder(transport, ModelRuntime)
        .max_parallel(2)
        .auth(source)
        .observer("model", fetch_ends.clone())
        .build()
        .unwrap();
    let fetch_ends = &fetch_ends.0;
    block_on(async {
        let calls: Vec<_> = (0..callers)
            .map(|_| {
                let client = client.clone();
                spawn(async move {
                    // No retries, one 401 replay, no budget.
                    let policy = CallPolicy::background();
                    client
                        .execute_with(&policy, |_| ())
                        .await
                        .map(|r| r.status.as_u16())
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        let refresher = refresh.then(|| {
            let client = client.clone();
            spawn(async move { client.refresh_token().await.map_err(|e| e.to_string()) })
        });
        let aborted = abort_one.then(|| pick(callers as u64) as usize);
        if let Some(i) = aborted {
            for _ in 0..pick(8) {
                yield_now().await;
            }
            calls[i].abort();
        }
        for (i, call) in calls.into_iter().enumerate() {
            match call.await {
                // Sent with t1 (a 401 it could not replay for a new token) or
                // failed at its refresh.
                Ok(result) if fail_refreshes => assert!(
                    result == Ok(200)
                        || result
                            .as_ref()
                            .is_err_and(|e| e.contains("HTTP 401") || e.contains("auth")),
                    "call {i}: {result:?}"
                ),
                Ok(result) => assert_eq!(result, Ok(200), "call {i}"),
                Err(_cancelled) => assert_eq!(Some(i), aborted, "call {i} was cancelled"),
            }
        }
        if let Some(refresher) = refresher {
            let result = refresher.await.expect("the refresh is not aborted");
            // A fetch of its own (`Requested`: no other caller asks for one) that
            // failed fails it, as no other token can land once the first has; a
            // fetch it joined (the first, or a 401's) decides it as well.
            let ran_and_failed = fetch_ends
                .lock()
                .unwrap()
                .contains(&(TokenFetchReason::Requested, false));
            match result {
                Ok(()) => assert!(!ran_and_failed, "its own fetch failed, yet Ok"),
                Err(e) => assert!(
                    fail_refreshes && e.contains("identity provider down"),
                    "refresh: {e}"
                ),
            }
        }
    });
    assert_eq!(stats.running.load(SeqCst), 0);
    assert!(
        client.transport().sends.load(SeqCst) <= 2 * callers,
        "a call sent more than once and its one 401 replay"
    );
    assert_eq!(client.in_flight(), 0, "a permit leaked");
    assert_eq!(
        client.token_fetches(),
        stats.started.load(SeqCst) as u64,
        "the client's count of fetches (abandoned ones included)"
    );
    assert_eq!(
        stats.started.load(SeqCst),
        stats.completed.load(SeqCst) + stats.abandoned.load(SeqCst)
    );
    stats
}

/// Concurrent first callers cause exactly one fetch.
#[test]
fn concurrent_first_callers_share_one_fetch() {
    explore("first fetch", 0xB4EA_0005, || {
        let stats = run_callers(3, false, false);
        assert_eq!(stats.started.load(SeqCst), 1, "fetches for the first token");
    });
}

/// Concurrent 401s for generation 1 cause exactly one refresh, to generation 2; a
/// 401 that arrives after the refresh replays with generation 2 and fetches nothing.
#[test]
fn concurrent_401s_refresh_once_per_generation() {
    explore("401 refresh", 0xB4EA_0006, || {
        let stats = run_callers(3, true, false);
        assert_eq!(stats.started.load(SeqCst), 2, "one fetch per generation");
    });
}

/// Refreshes that fail, under every interleaving of three callers (one of them
/// maybe dropped): never two fetches at once, nobody left waiting, nothing in
/// flight at the end, at most one fetch started per call plus the first.
#[test]
fn failing_refreshes_end_every_call_without_overlapping_fetches() {
    explore("failing refreshes", 0xB4EA_0009, || {
        let stats = run_callers_with(3, true, false, true, false);
        assert!(stats.started.load(SeqCst) <= 1 + 3, "fetches");
        let stats = run_callers_with(3, true, true, true, false);
        assert!(stats.started.load(SeqCst) <= 1 + 3, "fetches");
    });
}

/// `refresh_token()` among callers whose first token the server refuses, one of
/// them maybe dropped, its refreshes succeeding or failing: never two fetches at
/// once, every call not dropped ends (and succeeds when refreshes succeed), nothing
/// leaks, and the refresh adds at most one fetch.
#[test]
fn refresh_token_among_401s_never_overlaps_a_fetch() {
    explore("refresh_token", 0xB4EA_000A, || {
        let stats = run_callers_with(2, true, false, false, true);
        assert!(stats.completed.load(SeqCst) <= 3, "fetches");
        let stats = run_callers_with(2, true, true, false, true);
        assert!(stats.started.load(SeqCst) <= 4, "fetches");
        let stats = run_callers_with(2, true, true, true, true);
        assert!(stats.started.load(SeqCst) <= 1 + 2 + 1 + 1, "fetches");
    });
}

/// A caller dropped at a random point, fetching or not: the fetch it abandons is
/// taken over by a waiting caller, so the rest still succeed with exactly one
/// completed fetch per generation, and at most the abandoned one more started.
#[test]
fn a_fetcher_dropped_mid_fetch_hands_over() {
    explore("dropped fetcher", 0xB4EA_0007, || {
        let stats = run_callers(3, true, true);
        assert_eq!(stats.completed.load(SeqCst), 2, "one fetch per generation");
        assert!(stats.abandoned.load(SeqCst) <= 1);
    });
}
