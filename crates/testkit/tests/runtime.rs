//! The virtual clock and its driver.

use std::cell::{Cell, RefCell};
use std::future::{Future, poll_fn};
use std::pin::pin;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, SystemTime};

use vantage_api_pool::{Elapsed, Instant, Runtime, Transport, timeout_at};
use vantage_api_pool_testkit::{DriveError, Reply, ScriptedTransport, VirtualRuntime};

fn at(ms: u64) -> Instant {
    Instant::ORIGIN + Duration::from_millis(ms)
}

/// Spawns one task per deadline; each records `(its index, when it woke)`.
fn spawn_sleepers(rt: &VirtualRuntime, deadlines: &[u64]) -> Rc<RefCell<Vec<(usize, Instant)>>> {
    let log = Rc::new(RefCell::new(Vec::new()));
    for (i, &ms) in deadlines.iter().enumerate() {
        let (rt2, log) = (rt.clone(), Rc::clone(&log));
        rt.spawn(async move {
            rt2.sleep_until(at(ms)).await;
            log.borrow_mut().push((i, rt2.now()));
        })
        .detach();
    }
    log
}

#[test]
fn equal_deadlines_fire_in_creation_order() {
    let rt = VirtualRuntime::new();
    let log = spawn_sleepers(&rt, &[500, 500, 500, 500, 500]);
    rt.run().unwrap();
    let order: Vec<usize> = log.borrow().iter().map(|&(i, _)| i).collect();
    assert_eq!(order, [0, 1, 2, 3, 4]);
    assert!(log.borrow().iter().all(|&(_, t)| t == at(500)));
}

#[test]
fn timers_fire_in_deadline_then_creation_order() {
    let rt = VirtualRuntime::new();
    let log = spawn_sleepers(&rt, &[300, 100, 300, 200, 100]);
    rt.run().unwrap();
    let order: Vec<(usize, Instant)> = log.borrow().clone();
    assert_eq!(
        order,
        [
            (1, at(100)),
            (4, at(100)),
            (3, at(200)),
            (0, at(300)),
            (2, at(300))
        ]
    );
}

#[test]
fn creation_order_is_call_order_not_first_poll_order() {
    // Two sleeps with one deadline, created b-then-a but awaited a-then-b.
    let rt = VirtualRuntime::new();
    let log = Rc::new(RefCell::new(Vec::new()));
    let first = rt.sleep_until(at(10));
    let second = rt.sleep_until(at(10));
    let (l1, l2) = (Rc::clone(&log), Rc::clone(&log));
    let _b = rt.spawn(async move {
        second.await;
        l2.borrow_mut().push("second");
    });
    let _a = rt.spawn(async move {
        first.await;
        l1.borrow_mut().push("first");
    });
    rt.run().unwrap();
    assert_eq!(*log.borrow(), ["first", "second"]);
}

#[test]
fn ten_thousand_sleepers_finish_in_deadline_then_creation_order() {
    let rt = VirtualRuntime::new().with_seed(42);
    // Deadlines on a 1 ms grid over 2 s: many ties.
    let deadlines: Vec<u64> = (0..10_000)
        .map(|_| (rt.random() * 2000.0) as u64 + 1)
        .collect();
    let log = spawn_sleepers(&rt, &deadlines);
    rt.run().unwrap();

    let mut expected: Vec<usize> = (0..deadlines.len()).collect();
    expected.sort_by_key(|&i| (deadlines[i], i));
    let log = log.borrow();
    let order: Vec<usize> = log.iter().map(|&(i, _)| i).collect();
    assert_eq!(order, expected);
    assert!(log.iter().all(|&(i, t)| t == at(deadlines[i])));
    assert_eq!(rt.now(), at(*deadlines.iter().max().unwrap()));
    assert_eq!(rt.pending_timers(), 0);
    assert_eq!(rt.live_tasks(), 0);
}

#[test]
fn a_dropped_sleep_is_removed_never_fires_and_never_holds_time_back() {
    let rt = VirtualRuntime::new();
    let early = rt.sleep(Duration::from_secs(1));
    let late = rt.sleep(Duration::from_secs(5));
    assert_eq!(rt.pending_timers(), 2);
    drop(early);
    assert_eq!(rt.pending_timers(), 1);
    assert_eq!(rt.next_timer(), Some(at(5000)));
    rt.block_on(late).unwrap();
    // Time went straight to the live timer; the dropped one did not stop it at 1 s.
    assert_eq!(rt.now(), at(5000));

    // A task whose only timer is dropped mid-flight is not woken by it.
    let rt = VirtualRuntime::new();
    let woken = Rc::new(Cell::new(false));
    let flag = Rc::clone(&woken);
    let sleeper = rt.clone();
    let handle = rt.spawn(async move {
        sleeper.sleep(Duration::from_secs(3)).await;
        flag.set(true);
    });
    rt.run_until_idle().unwrap();
    handle.abort();
    assert_eq!(rt.pending_timers(), 0);
    // Nothing left: driving another sleep goes straight to its deadline.
    rt.block_on(rt.sleep(Duration::from_secs(7))).unwrap();
    assert_eq!(rt.now(), at(7000));
    assert!(!woken.get());
}

#[test]
fn a_past_deadline_is_ready_at_once_without_a_timer() {
    let rt = VirtualRuntime::new();
    rt.advance(Duration::from_secs(2));
    let sleep = rt.sleep_until(at(1000));
    assert_eq!(rt.pending_timers(), 0);
    assert!(sleep.is_elapsed());
    rt.block_on(sleep).unwrap();
    let zero = rt.sleep(Duration::ZERO);
    assert_eq!(rt.pending_timers(), 0);
    rt.block_on(zero).unwrap();
    assert_eq!(rt.now(), at(2000));
}

#[test]
fn deadlock_is_an_error_not_a_hang() {
    let rt = VirtualRuntime::new();
    let sleeper = rt.clone();
    let err = rt
        .block_on(async move {
            sleeper.sleep(Duration::from_millis(12_500)).await;
            std::future::pending::<()>().await;
        })
        .unwrap_err();
    assert_eq!(
        err,
        DriveError::Deadlock {
            now: at(12_500),
            parked_tasks: 1
        }
    );
    assert_eq!(
        err.to_string(),
        "deadlock at +12.5s: 1 task parked and no timer to wait for"
    );

    // Spawned tasks count too.
    let rt = VirtualRuntime::new();
    for _ in 0..2 {
        rt.spawn(std::future::pending::<()>()).detach();
    }
    let err = rt.block_on(std::future::pending::<()>()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "deadlock at +0ns: 3 tasks parked and no timer to wait for"
    );
    let err = rt.run().unwrap_err();
    assert!(matches!(
        err,
        DriveError::Deadlock {
            parked_tasks: 2,
            ..
        }
    ));
    let as_error: &dyn std::error::Error = &err;
    assert!(as_error.source().is_none());
}

#[test]
fn a_sleep_until_far_future_is_a_deadlock_not_a_jump() {
    let rt = VirtualRuntime::new();
    let err = rt
        .block_on(rt.sleep_until(Instant::FAR_FUTURE))
        .unwrap_err();
    assert!(matches!(err, DriveError::Deadlock { now, .. } if now == Instant::ORIGIN));
    assert_eq!(rt.now(), Instant::ORIGIN);
}

#[test]
fn no_move_of_the_clock_reaches_far_future() {
    let rt = VirtualRuntime::new();
    let never = rt.sleep_until(Instant::FAR_FUTURE);
    let last = rt.sleep_until(Instant::FAR_FUTURE.saturating_sub(Duration::from_nanos(1)));
    let waiting = rt.spawn(rt.sleep_until(Instant::FAR_FUTURE));
    rt.advance(Duration::MAX);
    rt.run_until(Instant::FAR_FUTURE).unwrap();
    rt.run_for(Duration::MAX).unwrap();
    assert!(last.is_elapsed());
    assert!(!never.is_elapsed());
    assert!(!waiting.is_finished());
    assert_eq!(rt.pending_timers(), 2);
}

#[test]
fn step_limit_stops_a_task_that_wakes_itself_forever() {
    let rt = VirtualRuntime::new().with_step_limit(10_000);
    let _spinner = rt.spawn(std::future::poll_fn(|cx| {
        cx.waker().wake_by_ref();
        Poll::<()>::Pending
    }));
    let err = rt.run().unwrap_err();
    assert_eq!(
        err,
        DriveError::StepLimit {
            limit: 10_000,
            now: Instant::ORIGIN
        }
    );
    assert!(
        err.to_string()
            .starts_with("step limit of 10000 polls reached at +0ns")
    );
    assert!(matches!(
        rt.run_until_idle(),
        Err(DriveError::StepLimit { .. })
    ));

    // A task that sleeps in a loop forever is caught the same way: time is no escape.
    let rt = VirtualRuntime::new().with_step_limit(1_000);
    let ticker = rt.clone();
    let _ticker = rt.spawn(async move {
        loop {
            ticker.sleep(Duration::from_secs(1)).await;
        }
    });
    assert!(matches!(rt.run(), Err(DriveError::StepLimit { now, .. }) if now > Instant::ORIGIN));
}

#[test]
fn time_limit_stops_a_task_that_keeps_waiting_for_the_next_timer() {
    // With the default limit, a loop of one-hour sleeps stops after a day.
    let rt = VirtualRuntime::new();
    let ticker = rt.clone();
    let turns = Rc::new(Cell::new(0u32));
    let counted = Rc::clone(&turns);
    let _ticker = rt.spawn(async move {
        loop {
            ticker.sleep(Duration::from_secs(3600)).await;
            counted.set(counted.get() + 1);
        }
    });
    let err = rt.run().unwrap_err();
    let day = Instant::ORIGIN + vantage_api_pool_testkit::DEFAULT_TIME_LIMIT;
    assert_eq!(
        err,
        DriveError::TimeLimit {
            limit: Duration::from_secs(86_400),
            now: day
        }
    );
    assert_eq!(turns.get(), 24);
    assert_eq!(
        rt.now(),
        day,
        "the clock stays at the last timer within the limit"
    );
    assert!(
        err.to_string()
            .starts_with("time limit of 86400s reached at +86400s: the next timer lies beyond it")
    );
    // The limit counts from where each driver call begins: the next run gets a day.
    assert!(matches!(rt.run(), Err(DriveError::TimeLimit { .. })));
    assert_eq!(turns.get(), 48);
}

#[test]
fn time_limit_applies_to_block_on_and_can_be_raised_or_removed() {
    let rt = VirtualRuntime::new().with_time_limit(Duration::from_secs(10));
    let sleeper = rt.clone();
    let long = async move { sleeper.sleep(Duration::from_secs(11)).await };
    let mut long = Box::pin(long);
    assert_eq!(
        rt.block_on(long.as_mut()),
        Err(DriveError::TimeLimit {
            limit: Duration::from_secs(10),
            now: Instant::ORIGIN
        })
    );
    // A timer exactly at the limit still fires.
    let rt = rt.with_time_limit(Duration::from_secs(11));
    rt.block_on(long.as_mut()).unwrap();
    assert_eq!(rt.elapsed(), Duration::from_secs(11));
    // Duration::MAX removes the limit.
    let rt = rt.with_time_limit(Duration::MAX);
    rt.block_on(rt.sleep(Duration::from_secs(400 * 86_400)))
        .unwrap();
    assert_eq!(rt.elapsed(), Duration::from_secs(400 * 86_400 + 11));
}

#[test]
fn run_until_and_run_for_are_not_held_by_the_time_limit() {
    let rt = VirtualRuntime::new().with_time_limit(Duration::from_secs(1));
    let ticks = Rc::new(Cell::new(0u32));
    let (ticker, counted) = (rt.clone(), Rc::clone(&ticks));
    let _ticker = rt.spawn(async move {
        loop {
            ticker.sleep(Duration::from_secs(60)).await;
            counted.set(counted.get() + 1);
        }
    });
    rt.run_for(Duration::from_secs(600)).unwrap();
    assert_eq!(ticks.get(), 10);
    rt.run_until(at(3_600_000)).unwrap();
    assert_eq!(ticks.get(), 60);
    // A task still parked with nothing due is a deadlock, not a time limit.
    let stuck = VirtualRuntime::new().with_time_limit(Duration::from_secs(1));
    assert!(matches!(
        stuck.block_on(std::future::pending::<()>()),
        Err(DriveError::Deadlock { .. })
    ));
}

#[test]
fn after_a_step_limit_the_remaining_work_is_kept() {
    let rt = VirtualRuntime::new().with_step_limit(3);
    let handles: Vec<_> = (0..5).map(|i| rt.spawn(async move { i })).collect();
    assert!(matches!(rt.run(), Err(DriveError::StepLimit { .. })));
    assert_eq!(handles.iter().filter(|h| h.is_finished()).count(), 3);
    assert!(matches!(rt.run(), Ok(())));
    assert!(handles.iter().all(|h| h.is_finished()));
}

/// Many tasks draw jitter, sleep it, and send through a transport whose replies
/// are delayed at random too. Returns the random draws, the (task, wake time)
/// trace and the transport's record as (index, path, time).
type Run = (
    Vec<f64>,
    Vec<(usize, Instant)>,
    Vec<(usize, String, Instant)>,
);

fn jittery_run(seed: u64) -> Run {
    let rt = VirtualRuntime::new().with_seed(seed);
    let transport = ScriptedTransport::new(&rt);
    let jitter = rt.clone();
    transport.respond_with(move |_, _| {
        Reply::ok().after(Duration::from_millis((jitter.random() * 100.0) as u64))
    });
    let trace = Rc::new(RefCell::new(Vec::new()));
    let draws = Rc::new(RefCell::new(Vec::new()));
    for task in 0..50 {
        let (rt2, trace, draws, t) = (
            rt.clone(),
            Rc::clone(&trace),
            Rc::clone(&draws),
            transport.clone(),
        );
        rt.spawn(async move {
            for round in 0..4 {
                let jitter = rt2.random();
                draws.borrow_mut().push(jitter);
                rt2.sleep(Duration::from_secs_f64(jitter)).await;
                let path = format!("/task/{task}/{round}");
                let request = t.prepare(t.handle().get(path)).unwrap();
                t.send(request).await.unwrap();
                trace.borrow_mut().push((task, rt2.now()));
            }
        })
        .detach();
    }
    rt.run().unwrap();
    let draws = draws.borrow().clone();
    let trace = trace.borrow().clone();
    let record = transport
        .requests()
        .into_iter()
        .map(|r| (r.index, r.path.into_owned(), r.at))
        .collect();
    (draws, trace, record)
}

#[test]
fn one_seed_one_run() {
    let a = jittery_run(7);
    let b = jittery_run(7);
    assert_eq!(a, b);
    assert_eq!((a.1.len(), a.2.len()), (200, 200));
    let c = jittery_run(8);
    assert_ne!(a.0, c.0);
    assert_ne!(a.1, c.1);
    assert_ne!(a.2, c.2);

    let x: Vec<u64> = {
        let rt = VirtualRuntime::new();
        (0..5).map(|_| rt.random_u64()).collect()
    };
    let y: Vec<u64> = {
        let rt = VirtualRuntime::new();
        (0..5).map(|_| rt.random_u64()).collect()
    };
    assert_eq!(x, y, "the default seed is fixed");
}

#[test]
fn random_is_in_the_unit_interval_and_roughly_uniform() {
    let rt = VirtualRuntime::new().with_seed(1);
    let n = 100_000;
    let mut sum = 0.0;
    let mut below_tenth = 0;
    for _ in 0..n {
        let x = Runtime::random(&rt);
        assert!((0.0..1.0).contains(&x), "{x}");
        sum += x;
        below_tenth += usize::from(x < 0.1);
    }
    let mean = sum / f64::from(n);
    assert!((mean - 0.5).abs() < 0.01, "{mean}");
    assert!((9_000..11_000).contains(&below_tenth), "{below_tenth}");
}

#[test]
fn clones_share_clock_timers_and_random_sequence() {
    let rt = VirtualRuntime::new().with_seed(3);
    let clone = rt.clone();
    clone.advance(Duration::from_secs(1));
    assert_eq!(rt.now(), at(1000));
    let _sleep = clone.sleep(Duration::from_secs(1));
    assert_eq!(rt.pending_timers(), 1);
    let reference = VirtualRuntime::new().with_seed(3);
    let expected = [reference.random_u64(), reference.random_u64()];
    assert_eq!([rt.random_u64(), clone.random_u64()], expected);
}

#[test]
fn timeout_at_selects_against_the_virtual_sleep() {
    let rt = VirtualRuntime::new();
    // The work wins.
    let work = rt.sleep(Duration::from_secs(2));
    let result = rt.block_on(timeout_at(&rt, at(5000), async {
        work.await;
        "done"
    }));
    assert_eq!(result.unwrap(), Ok("done"));
    assert_eq!(rt.now(), at(2000));
    assert_eq!(rt.pending_timers(), 0, "the losing sleep was dropped");

    // The deadline wins, at exactly the deadline; the work is dropped.
    let work = rt.sleep(Duration::from_secs(60));
    let result = rt.block_on(timeout_at(&rt, at(12_000), work));
    assert_eq!(result.unwrap(), Err(Elapsed));
    assert_eq!(rt.now(), at(12_000));
    assert_eq!(rt.pending_timers(), 0);

    // Through the trait, as the attempt loop calls it.
    fn generic<R: Runtime>(rt: &R) -> impl std::future::Future<Output = Result<(), Elapsed>> + '_ {
        timeout_at(
            rt,
            rt.now() + Duration::from_secs(1),
            std::future::pending(),
        )
    }
    assert_eq!(rt.block_on(generic(&rt)).unwrap(), Err(Elapsed));
    assert_eq!(rt.now(), at(13_000));
}

#[test]
fn advance_fires_due_timers_without_polling() {
    let rt = VirtualRuntime::new();
    let log = spawn_sleepers(&rt, &[100, 200, 300]);
    rt.run_until_idle().unwrap();
    assert_eq!(rt.now(), Instant::ORIGIN);
    rt.advance(Duration::from_millis(250));
    assert_eq!(rt.pending_timers(), 1);
    assert!(log.borrow().is_empty(), "advance polls nothing");
    rt.run_until_idle().unwrap();
    // Both woke after the jump, so both see +250 ms, in deadline order.
    assert_eq!(*log.borrow(), [(0, at(250)), (1, at(250))]);
    assert_eq!(rt.now(), at(250));
}

#[test]
fn run_until_stops_at_the_deadline_and_keeps_unfinished_tasks() {
    let rt = VirtualRuntime::new();
    let log = spawn_sleepers(&rt, &[1000, 2000, 9000]);
    rt.run_until(at(2000)).unwrap();
    assert_eq!(*log.borrow(), [(0, at(1000)), (1, at(2000))]);
    assert_eq!(rt.now(), at(2000));
    assert_eq!(rt.live_tasks(), 1);
    rt.run_for(Duration::from_secs(1)).unwrap();
    assert_eq!(rt.now(), at(3000));
    // Never backwards.
    rt.run_until(at(10)).unwrap();
    assert_eq!(rt.now(), at(3000));
    rt.run().unwrap();
    assert_eq!(rt.now(), at(9000));
}

#[test]
fn wall_clock_is_settable_and_moves_with_virtual_time() {
    let rt = VirtualRuntime::new();
    let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600);
    assert_eq!(rt.wall_clock(), start);
    assert_eq!(Runtime::wall_clock(&rt), start);
    rt.advance(Duration::from_millis(1500));
    assert_eq!(rt.wall_clock(), start + Duration::from_millis(1500));

    let set = SystemTime::UNIX_EPOCH + Duration::from_secs(86_400);
    rt.set_wall_clock(set);
    assert_eq!(rt.wall_clock(), set);
    assert_eq!(rt.now(), at(1500), "the monotonic clock is untouched");
    rt.block_on(rt.sleep(Duration::from_secs(10))).unwrap();
    assert_eq!(rt.wall_clock(), set + Duration::from_secs(10));

    // Earlier than the epoch works too.
    let before = SystemTime::UNIX_EPOCH - Duration::from_secs(10);
    let rt = VirtualRuntime::new().with_wall_clock(before);
    rt.advance(Duration::from_millis(9_999));
    assert_eq!(
        rt.wall_clock(),
        SystemTime::UNIX_EPOCH - Duration::from_millis(1)
    );
    rt.advance(Duration::from_millis(1));
    assert_eq!(rt.wall_clock(), SystemTime::UNIX_EPOCH);

    // The last virtual instant (about 584 years on, 1 ns before the deadline that
    // never comes): the wall clock follows it...
    let rt = VirtualRuntime::new();
    rt.advance(Duration::MAX);
    let last = Instant::FAR_FUTURE.saturating_sub(Duration::from_nanos(1));
    assert_eq!(rt.now(), last);
    assert_eq!(rt.wall_clock(), start + last.since_origin());
    // ...and a sum past what `SystemTime` holds leaves the value set: documented, no
    // panic.
    let last = SystemTime::UNIX_EPOCH + Duration::from_secs(i64::MAX as u64);
    let rt = VirtualRuntime::new().with_wall_clock(last);
    rt.advance(Duration::from_secs(1));
    assert_eq!(rt.wall_clock(), last);
}

#[test]
fn an_rc_based_future_runs_on_the_driver() {
    // Rc and RefCell: neither Send nor Sync.
    let rt = VirtualRuntime::new();
    let counter = Rc::new(RefCell::new(0u32));
    let mut handles = Vec::new();
    for i in 0..3u64 {
        let (rt2, counter) = (rt.clone(), Rc::clone(&counter));
        handles.push(rt.spawn(async move {
            rt2.sleep(Duration::from_millis(10 * i)).await;
            *counter.borrow_mut() += 1;
            Rc::new(i)
        }));
    }
    let rt2 = rt.clone();
    let total = rt
        .block_on(async move {
            let mut sum = 0;
            for h in handles {
                sum += *h.await;
            }
            rt2.sleep(Duration::from_millis(1)).await;
            sum
        })
        .unwrap();
    assert_eq!(total, 3);
    assert_eq!(*counter.borrow(), 3);
    assert_eq!(rt.now(), at(21));
}

#[test]
fn tasks_can_spawn_tasks_and_read_the_clock() {
    let rt = VirtualRuntime::new();
    let rt2 = rt.clone();
    let outer = rt.spawn(async move {
        rt2.sleep(Duration::from_secs(1)).await;
        let rt3 = rt2.clone();
        let inner = rt2.spawn(async move {
            rt3.sleep(Duration::from_secs(1)).await;
            rt3.now()
        });
        inner.await
    });
    assert_eq!(rt.block_on(outer).unwrap(), at(2000));
}

/// Wakes its own task and yields once, as a busy task between steps does.
async fn yield_once() {
    let mut yielded = false;
    poll_fn(|cx| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
}

#[test]
fn the_clock_stands_still_while_a_task_is_runnable() {
    let rt = VirtualRuntime::new();
    let sleeper = rt.clone();
    rt.spawn(async move { sleeper.sleep(Duration::from_secs(1)).await })
        .detach();
    let rt2 = rt.clone();
    let busy = rt.spawn(async move {
        let mut seen = Vec::new();
        for _ in 0..6 {
            yield_once().await;
            seen.push(rt2.elapsed());
        }
        seen
    });
    assert_eq!(rt.block_on(busy).unwrap(), vec![Duration::ZERO; 6]);
    assert_eq!(rt.run(), Ok(()));
    assert_eq!(rt.elapsed(), Duration::from_secs(1));
    // A spawned task that wakes itself in its poll is polled again, to its end.
    let done = rt.spawn(async {
        yield_once().await;
        7
    });
    assert_eq!(rt.run(), Ok(()));
    assert!(done.is_finished());
    assert_eq!(rt.block_on(done), Ok(7));
}

struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn abort_drops_the_task_synchronously() {
    let rt = VirtualRuntime::new();
    let dropped = Arc::new(AtomicBool::new(false));
    let guard = SetOnDrop(Arc::clone(&dropped));
    let sleeper = rt.clone();
    let handle = rt.spawn(async move {
        let _guard = guard;
        sleeper.sleep(Duration::from_secs(10)).await;
    });
    rt.run_until_idle().unwrap();
    assert!(!dropped.load(Ordering::SeqCst));
    handle.abort();
    assert!(
        dropped.load(Ordering::SeqCst),
        "Drop ran before abort returned"
    );
    assert_eq!(rt.pending_timers(), 0);
    assert_eq!(rt.live_tasks(), 0);
    rt.run().unwrap();
    assert_eq!(rt.now(), Instant::ORIGIN);

    // Aborting before the first poll drops it too.
    let dropped = Arc::new(AtomicBool::new(false));
    let guard = SetOnDrop(Arc::clone(&dropped));
    let handle = rt.spawn(async move {
        let _guard = guard;
    });
    handle.abort();
    assert!(dropped.load(Ordering::SeqCst));

    // Aborting a finished task does nothing.
    let handle = rt.spawn(async {});
    rt.run().unwrap();
    assert!(handle.is_finished());
    handle.abort();
}

#[test]
fn a_task_that_aborts_itself_is_dropped_after_its_poll() {
    let rt = VirtualRuntime::new();
    let slot: Rc<RefCell<Option<vantage_api_pool_testkit::JoinHandle<()>>>> = Rc::default();
    let dropped = Arc::new(AtomicBool::new(false));
    let guard = SetOnDrop(Arc::clone(&dropped));
    let (slot2, rt2) = (Rc::clone(&slot), rt.clone());
    let handle = rt.spawn(async move {
        let _guard = guard;
        rt2.sleep(Duration::from_secs(1)).await;
        let me = slot2.borrow_mut().take().unwrap();
        me.abort();
        rt2.sleep(Duration::from_secs(1)).await;
        unreachable!("dropped at the await above");
    });
    *slot.borrow_mut() = Some(handle);
    rt.run().unwrap();
    assert!(dropped.load(Ordering::SeqCst));
    assert_eq!(rt.now(), at(1000));
    assert_eq!(rt.pending_timers(), 0);
}

#[test]
fn dropping_a_join_handle_detaches_the_task() {
    let rt = VirtualRuntime::new();
    let done = Rc::new(Cell::new(false));
    let (flag, rt2) = (Rc::clone(&done), rt.clone());
    drop(rt.spawn(async move {
        rt2.sleep(Duration::from_secs(1)).await;
        flag.set(true);
    }));
    rt.run().unwrap();
    assert!(done.get());
}

#[test]
fn abort_all_drops_every_unfinished_task() {
    let rt = VirtualRuntime::new();
    let flags: Vec<Arc<AtomicBool>> = (0..3).map(|_| Arc::new(AtomicBool::new(false))).collect();
    for flag in &flags {
        let guard = SetOnDrop(Arc::clone(flag));
        rt.spawn(async move {
            let _guard = guard;
            std::future::pending::<()>().await;
        })
        .detach();
    }
    rt.run_until_idle().unwrap();
    assert_eq!(rt.abort_all(), 3);
    assert!(flags.iter().all(|f| f.load(Ordering::SeqCst)));
    rt.run().unwrap();
}

#[test]
#[should_panic(expected = "its task was dropped before finishing (by VirtualRuntime::abort_all")]
fn awaiting_a_handle_of_an_aborted_task_panics_clearly() {
    let rt = VirtualRuntime::new();
    let handle = rt.spawn(std::future::pending::<()>());
    rt.abort_all();
    let _ = rt.block_on(handle);
}

#[test]
fn a_driver_call_inside_a_task_is_refused() {
    let rt = VirtualRuntime::new();
    let inner = rt.clone();
    let nested = rt
        .block_on(async move { inner.block_on(async { 1 }) })
        .unwrap();
    assert_eq!(nested, Err(DriveError::AlreadyDriving));
    // The runtime is usable again afterwards.
    assert_eq!(rt.block_on(async { 2 }).unwrap(), 2);
}

#[test]
fn tasks_stay_on_their_thread() {
    let rt = VirtualRuntime::new();
    let _local = rt.spawn(async {});
    let other = rt.clone();
    let spawned_elsewhere = std::thread::spawn(move || {
        let err = other.run().unwrap_err();
        assert!(matches!(err, DriveError::WrongThread { .. }));
        assert!(
            err.to_string()
                .contains("drive it on the thread that spawned them")
        );
        // The clock itself works from any thread.
        other.advance(Duration::from_secs(1));
        other.spawn(async {}).detach();
    })
    .join();
    let panic = spawned_elsewhere.unwrap_err();
    let message = panic.downcast_ref::<String>().unwrap();
    assert!(
        message.contains("VirtualRuntime::spawn called on thread"),
        "{message}"
    );
    assert_eq!(rt.now(), at(1000));
    rt.run().unwrap();
}

#[test]
fn the_tasks_of_a_runtime_dropped_on_another_thread_are_dropped_on_their_own() {
    // The last clone goes on another thread, which cannot reach this thread's
    // tasks: the next runtime made here drops them (here, where they live).
    struct Guard(Rc<Cell<bool>>);
    impl Drop for Guard {
        fn drop(&mut self) {
            self.0.set(true);
        }
    }
    let dropped = Rc::new(Cell::new(false));
    let rt = VirtualRuntime::new();
    let guard = Guard(Rc::clone(&dropped));
    let _handle = rt.spawn(async move {
        let _guard = guard;
        std::future::pending::<()>().await;
    });
    rt.run_until_idle().unwrap();
    assert_eq!(rt.live_tasks(), 1);
    std::thread::spawn(move || drop(rt)).join().unwrap();
    assert!(!dropped.get(), "nothing ran here yet");
    let next = VirtualRuntime::new();
    next.block_on(async {}).unwrap();
    assert!(dropped.get(), "the orphaned task was dropped");
}

#[test]
fn a_runtime_without_tasks_can_be_driven_from_any_thread() {
    let rt = VirtualRuntime::new();
    let other = rt.clone();
    std::thread::spawn(move || {
        other.block_on(other.sleep(Duration::from_secs(1))).unwrap();
    })
    .join()
    .unwrap();
    assert_eq!(rt.now(), at(1000));
}

#[test]
fn an_advance_on_another_thread_is_never_taken_for_a_deadlock() {
    // `advance` takes the due timers under the clock lock and wakes their tasks
    // after it: a driver that looks in between finds no timer and an empty queue,
    // and must wait for the wake rather than report a deadlock. A stress test of
    // real threads: on a loaded machine it may not hit the race (the unit test in
    // `runtime.rs` makes it every time; this one also catches the driver looking
    // at the counter and the queue in the wrong order).
    for round in 0..40 {
        let rt = VirtualRuntime::new().with_time_limit(Duration::MAX);
        let stop = Arc::new(AtomicBool::new(false));
        let pusher = {
            let (rt, stop) = (rt.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    rt.advance(Duration::from_micros(700));
                }
            })
        };
        let sleeper = rt.clone();
        let result = rt.block_on(async move {
            for _ in 0..2_000 {
                sleeper.sleep(Duration::from_millis(1)).await;
            }
        });
        stop.store(true, Ordering::Relaxed);
        pusher.join().unwrap();
        assert_eq!(result, Ok(()), "round {round}");
    }
}

#[test]
fn wakes_from_foreign_wakers_are_honoured() {
    // A task parked on something a sibling completes: the wake goes through the
    // queue even though no timer is involved.
    let rt = VirtualRuntime::new();
    let (tx, rx) = futures::channel::oneshot::channel::<u32>();
    let rt2 = rt.clone();
    let _sender = rt.spawn(async move {
        rt2.sleep(Duration::from_millis(5)).await;
        tx.send(9).unwrap();
    });
    assert_eq!(rt.block_on(rx).unwrap(), Ok(9));
    assert_eq!(rt.now(), at(5));
}

#[test]
fn debug_output_is_informative() {
    let rt = VirtualRuntime::new();
    let sleep = rt.sleep(Duration::from_secs(1));
    let text = format!("{rt:?}");
    assert!(text.contains("pending_timers: 1"), "{text}");
    assert!(format!("{sleep:?}").contains("deadline"));
    let handle = rt.spawn(async {});
    assert!(format!("{handle:?}").contains("finished: false"));
}

#[test]
fn a_task_that_panics_does_not_leave_a_ghost() {
    let rt = VirtualRuntime::new();
    let _boom = rt.spawn(async { panic!("boom") });
    let rt2 = rt.clone();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt2.run()));
    assert!(
        caught.is_err(),
        "the panic reaches the caller of the driver"
    );
    assert_eq!(rt.live_tasks(), 0);
    // The runtime is still usable.
    rt.run().unwrap();
    assert_eq!(rt.block_on(async { 5 }).unwrap(), 5);
}

/// A `block_on` that ends at its step limit leaves its main waker's wake behind; a
/// later `block_on` reusing that waker must still be woken by its timers.
#[test]
fn block_on_after_a_step_limit_is_still_woken() {
    use std::future::poll_fn;
    use std::task::Poll;
    let rt = VirtualRuntime::new().with_step_limit(10);
    // Wakes itself forever: ends at the step limit with a wake pending.
    let spin = poll_fn(|cx| {
        cx.waker().wake_by_ref();
        Poll::<()>::Pending
    });
    assert!(rt.block_on(spin).is_err());
    rt.run_until_idle().unwrap();
    let rt2 = rt.clone();
    assert_eq!(
        rt.block_on(async move { rt2.sleep(Duration::from_secs(1)).await }),
        Ok(())
    );
    assert_eq!(rt.elapsed(), Duration::from_secs(1));
}

#[test]
fn a_panic_does_not_lose_the_wakes_queued_behind_it() {
    // Both tasks wake at +1 s, in one batch; the first panics. The second's wake must
    // survive, or the next run reports a deadlock that is not there.
    let rt = VirtualRuntime::new();
    let r = rt.clone();
    rt.spawn(async move {
        r.sleep(Duration::from_secs(1)).await;
        panic!("boom");
    })
    .detach();
    let (r, done) = (rt.clone(), Rc::new(Cell::new(false)));
    let d = Rc::clone(&done);
    rt.spawn(async move {
        r.sleep(Duration::from_secs(1)).await;
        d.set(true);
    })
    .detach();
    let rt2 = rt.clone();
    assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt2.run())).is_err());
    assert_eq!(rt.run(), Ok(()));
    assert!(done.get());
}

#[test]
fn a_timer_nobody_waits_on_yet_does_not_end_the_run() {
    // The 1 s sleep is registered now but first polled at +2 s: when it fires it
    // wakes nobody, and the run must go on to the 2 s timer, not call it a deadlock.
    let rt = VirtualRuntime::new();
    let later = rt.sleep(Duration::from_secs(1));
    let r = rt.clone();
    let woke = rt
        .block_on(async move {
            r.sleep(Duration::from_secs(2)).await;
            later.await;
            r.now()
        })
        .expect("two timers pending: not a deadlock");
    assert_eq!(woke, at(2000));
}

#[test]
fn tasks_woken_with_the_finishing_main_future_still_run() {
    // The main future and a task wake at the same instant; main finishes first. The
    // task's wake, in the same batch, must be kept for the next run.
    let rt = VirtualRuntime::new();
    let main_sleep = rt.sleep(Duration::from_secs(1)); // created first: fires first
    let done = Rc::new(Cell::new(false));
    let (r, d) = (rt.clone(), Rc::clone(&done));
    rt.spawn(async move {
        r.sleep(Duration::from_secs(1)).await;
        d.set(true);
    })
    .detach();
    rt.block_on(main_sleep).unwrap();
    rt.run().expect("the task's wake was kept");
    assert!(done.get());
}

#[test]
fn a_dropped_sleeps_leftover_key_does_not_fire_the_timer_that_reuses_its_slot() {
    let rt = VirtualRuntime::new();
    drop(rt.sleep(Duration::from_secs(1))); // stale key (1 s) stays in the heap
    let later = rt.sleep(Duration::from_secs(10)); // reuses the slot
    rt.advance(Duration::from_secs(2));
    assert_eq!(rt.pending_timers(), 1);
    assert_eq!(rt.next_timer(), Some(at(10_000)));
    assert!(!later.is_elapsed());
}

/// A waker whose clones are counted by its `Arc`.
struct Counted;
impl Wake for Counted {
    // Waking lets go of this reference and does nothing else (`Waker::noop` would
    // have no count to read).
    fn wake(self: Arc<Self>) {
        drop(self);
    }
}
#[test]
fn a_removed_or_fired_timer_lets_go_of_its_waker_at_once() {
    let rt = VirtualRuntime::new();
    let w = Arc::new(Counted);
    let waker = Waker::from(Arc::clone(&w));
    {
        let mut s = pin!(rt.sleep(Duration::from_secs(1)));
        assert!(
            s.as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
        );
        assert_eq!(Arc::strong_count(&w), 3);
    }
    assert_eq!(
        Arc::strong_count(&w),
        2,
        "the removed timer kept a clone of the waker"
    );
    let mut s = pin!(rt.sleep(Duration::from_secs(1)));
    assert!(
        s.as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending()
    );
    rt.advance(Duration::from_secs(1));
    assert_eq!(
        Arc::strong_count(&w),
        2,
        "the fired timer kept a clone of the waker"
    );
}

#[test]
fn after_a_step_limit_the_remaining_tasks_run_in_wake_order() {
    let rt = VirtualRuntime::new().with_step_limit(2);
    let log = Rc::new(RefCell::new(Vec::new()));
    for i in 0..5 {
        let log = Rc::clone(&log);
        rt.spawn(async move { log.borrow_mut().push(i) }).detach();
    }
    assert!(matches!(rt.run(), Err(DriveError::StepLimit { .. })));
    let rt = rt.with_step_limit(u64::MAX);
    rt.run().unwrap();
    assert_eq!(*log.borrow(), [0, 1, 2, 3, 4]);
}

#[test]
fn a_task_woken_twice_before_its_poll_is_polled_once() {
    let rt = VirtualRuntime::new();
    let polls = Rc::new(Cell::new(0));
    let p = Rc::clone(&polls);
    rt.spawn(poll_fn(move |cx| {
        p.set(p.get() + 1);
        if p.get() == 1 {
            cx.waker().wake_by_ref();
            cx.waker().wake_by_ref();
        }
        Poll::<()>::Pending
    }))
    .detach();
    rt.run_until_idle().unwrap();
    assert_eq!(polls.get(), 2);
}

#[test]
fn a_deadline_equal_to_now_registers_no_timer() {
    let rt = VirtualRuntime::new();
    let s = rt.sleep_until(rt.now());
    assert_eq!(rt.pending_timers(), 0);
    rt.block_on(s).unwrap();
    rt.advance(Duration::from_secs(1));
    let s = rt.sleep_until(rt.now());
    assert_eq!(rt.pending_timers(), 0);
    drop(s);
}

#[test]
fn a_sleep_polled_again_with_another_waker_wakes_the_latest() {
    let rt = VirtualRuntime::new();
    let mut s = Box::pin(rt.sleep(Duration::from_secs(1)));
    assert!(
        s.as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_pending()
    );
    rt.block_on(s).unwrap();
    assert_eq!(rt.now(), at(1000));
}

/// Spawns a task that never finishes and counts its polls.
fn spawn_poll_counter(rt: &VirtualRuntime) -> Rc<Cell<u32>> {
    let polls = Rc::new(Cell::new(0));
    let p = Rc::clone(&polls);
    rt.spawn(poll_fn(move |_| {
        p.set(p.get() + 1);
        Poll::<()>::Pending
    }))
    .detach();
    polls
}

#[test]
fn a_stale_wake_of_an_aborted_task_does_not_poll_the_next_task_in_its_slot() {
    let rt = VirtualRuntime::new();
    let a = rt.spawn(std::future::pending::<()>()); // queued, never polled
    a.abort();
    let polls = spawn_poll_counter(&rt);
    rt.run_until_idle().unwrap();
    assert_eq!(polls.get(), 1);
}

#[test]
fn aborting_a_finished_tasks_handle_spares_the_next_task_in_its_slot() {
    let rt = VirtualRuntime::new();
    let a = rt.spawn(async {});
    rt.run().unwrap();
    assert!(a.is_finished());
    let b = rt.spawn(rt.sleep(Duration::from_secs(1)));
    a.abort();
    assert_eq!(rt.live_tasks(), 1);
    rt.run().unwrap();
    assert!(b.is_finished());
}

#[test]
fn a_finished_tasks_surviving_waker_does_not_wake_the_next_task_in_its_slot() {
    let rt = VirtualRuntime::new();
    let kept: Rc<RefCell<Option<Waker>>> = Rc::default();
    let k = Rc::clone(&kept);
    rt.spawn(poll_fn(move |cx| {
        *k.borrow_mut() = Some(cx.waker().clone());
        Poll::Ready(())
    }))
    .detach();
    rt.run().unwrap();
    let polls = spawn_poll_counter(&rt);
    rt.run_until_idle().unwrap();
    kept.borrow_mut().take().unwrap().wake();
    rt.run_until_idle().unwrap();
    assert_eq!(polls.get(), 1);
}

#[test]
fn the_random_sequence_is_splitmix64s_reference_sequence() {
    let rt = VirtualRuntime::new().with_seed(0);
    let got: Vec<u64> = (0..3).map(|_| rt.random_u64()).collect();
    assert_eq!(
        got,
        [
            0xE220_A839_7B1D_CDAF,
            0x6E78_9E6A_A1B9_65F4,
            0x06C4_5D18_8009_454F
        ]
    );
    let rt = VirtualRuntime::new().with_seed(1_234_567);
    let got: Vec<u64> = (0..5).map(|_| rt.random_u64()).collect();
    assert_eq!(
        got,
        [
            6_457_827_717_110_365_317,
            3_203_168_211_198_807_973,
            9_817_491_932_198_370_423,
            4_593_380_528_125_082_431,
            16_408_922_859_458_223_821
        ]
    );
}

#[test]
fn a_step_limit_of_zero_is_one() {
    let rt = VirtualRuntime::new().with_step_limit(0);
    let h = rt.spawn(async { 3 });
    assert_eq!(rt.run(), Ok(()));
    assert!(h.is_finished());
}

#[test]
fn a_wall_clock_set_centuries_away_moves_from_when_it_was_set() {
    let rt = VirtualRuntime::new();
    rt.advance(Duration::from_secs(10));
    let far = SystemTime::UNIX_EPOCH + Duration::from_secs(400 * 365 * 86_400);
    rt.set_wall_clock(far);
    assert_eq!(rt.wall_clock(), far);
    rt.advance(Duration::from_secs(5));
    assert_eq!(rt.wall_clock(), far + Duration::from_secs(5));
}

#[test]
fn a_join_handle_polled_again_with_another_waker_wakes_the_latest() {
    let rt = VirtualRuntime::new();
    let mut h = Box::pin(rt.spawn(rt.sleep(Duration::from_secs(1))));
    assert!(
        h.as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_pending()
    );
    rt.block_on(h).unwrap();
}

#[test]
#[should_panic(expected = "dropped before finishing")]
fn an_awaited_handle_whose_task_abort_all_drops_panics_instead_of_deadlocking() {
    let rt = VirtualRuntime::new();
    let h = rt.spawn(std::future::pending::<()>());
    let rt2 = rt.clone();
    let r = rt.block_on(async move {
        let rt3 = rt2.clone();
        rt2.spawn(async move {
            rt3.abort_all();
        })
        .detach();
        h.await
    });
    panic!("driver returned {r:?} instead of panicking");
}

#[test]
fn the_driver_reaches_the_last_instant_before_far_future() {
    let rt = VirtualRuntime::new().with_time_limit(Duration::MAX);
    let last = Instant::from_nanos(u64::MAX - 1);
    rt.block_on(rt.sleep_until(last)).unwrap();
    assert_eq!(rt.now(), last);
}

#[test]
fn abort_all_does_not_count_a_running_task_that_aborted_itself() {
    let rt = VirtualRuntime::new();
    let slot: Rc<RefCell<Option<vantage_api_pool_testkit::JoinHandle<()>>>> = Rc::default();
    let count = Rc::new(Cell::new(usize::MAX));
    let (s2, c2, rt2) = (Rc::clone(&slot), Rc::clone(&count), rt.clone());
    let h = rt.spawn(async move {
        s2.borrow_mut().take().unwrap().abort();
        c2.set(rt2.abort_all());
        std::future::pending::<()>().await;
    });
    *slot.borrow_mut() = Some(h);
    rt.run().unwrap();
    assert_eq!(count.get(), 0);
}

#[test]
fn the_first_poll_of_block_on_counts_toward_the_step_limit() {
    let rt = VirtualRuntime::new().with_step_limit(5);
    let polls = Cell::new(0);
    let err = rt.block_on(poll_fn(|cx| {
        polls.set(polls.get() + 1);
        cx.waker().wake_by_ref();
        Poll::<()>::Pending
    }));
    assert!(matches!(err, Err(DriveError::StepLimit { limit: 5, .. })));
    assert_eq!(polls.get(), 5);
}

#[test]
fn an_earlier_block_ons_surviving_waker_does_not_wake_the_next_one() {
    let rt = VirtualRuntime::new();
    let kept: Rc<RefCell<Option<Waker>>> = Rc::default();
    rt.block_on(poll_fn(|cx| {
        *kept.borrow_mut() = Some(cx.waker().clone());
        Poll::Ready(())
    }))
    .unwrap();
    let old = kept.borrow_mut().take().unwrap();
    rt.spawn(async move { old.wake() }).detach();
    let polls = Cell::new(0);
    let mut sleep = Box::pin(rt.sleep(Duration::from_secs(1)));
    rt.block_on(poll_fn(|cx| {
        polls.set(polls.get() + 1);
        sleep.as_mut().poll(cx)
    }))
    .unwrap();
    assert_eq!(polls.get(), 2);
}

#[test]
fn a_handle_stays_finished_after_its_output_was_taken() {
    let rt = VirtualRuntime::new();
    let mut h = rt.spawn(async { 1 });
    assert_eq!(rt.block_on(&mut h).unwrap(), 1);
    assert!(h.is_finished());
}

#[test]
fn stale_wakes_left_after_the_last_poll_do_not_count_toward_the_step_limit() {
    let rt = VirtualRuntime::new().with_step_limit(1);
    let a = rt.spawn(async {});
    let b = rt.spawn(std::future::pending::<()>());
    b.abort(); // its key stays queued, stale
    let r = rt.run();
    assert!(a.is_finished());
    assert_eq!(rt.live_tasks(), 0);
    assert_eq!(r, Ok(()), "all work done after 1 poll");
}

#[test]
fn a_far_future_timer_alone_is_a_deadlock_with_nothing_to_wait_for() {
    let rt = VirtualRuntime::new();
    let _never = rt.sleep_until(Instant::FAR_FUTURE);
    let err = rt.block_on(std::future::pending::<()>()).unwrap_err();
    assert_eq!(rt.pending_timers(), 1);
    assert_eq!(
        err.to_string(),
        "deadlock at +0ns: 1 task parked and no timer to wait for"
    );
}

/// A waker whose drop uses the runtime, as the last waker of a task on another
/// executor does when it drops the task and, with it, the task's sleeps.
struct ReadsOnDrop {
    rt: VirtualRuntime,
    seen: Arc<std::sync::Mutex<Vec<usize>>>,
}

impl Wake for ReadsOnDrop {
    // Waking lets go of this reference and does nothing else; the last one's drop
    // is what the tests watch.
    fn wake(self: Arc<Self>) {
        drop(self);
    }
}

impl Drop for ReadsOnDrop {
    fn drop(&mut self) {
        let pending = self.rt.pending_timers();
        // A sleep made and dropped on the same runtime takes the clock's lock twice.
        drop(self.rt.sleep(Duration::from_secs(5)));
        self.seen.lock().unwrap().push(pending);
    }
}

#[test]
fn a_sleep_drops_the_wakers_it_lets_go_of_outside_the_clocks_lock() {
    // Run where a regression (a drop under the lock, locking it again) would only
    // block its own thread: the test then fails instead of hanging.
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = VirtualRuntime::new();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let waker = |rt: &VirtualRuntime| {
            Waker::from(Arc::new(ReadsOnDrop {
                rt: rt.clone(),
                seen: Arc::clone(&seen),
            }))
        };
        let mut sleep = Box::pin(rt.sleep(Duration::from_secs(1)));
        for _ in 0..2 {
            // The timer keeps the only clone of each waker; polling again with a new
            // one drops the old, and dropping the sleep drops the last.
            let w = waker(&rt);
            assert!(
                sleep
                    .as_mut()
                    .poll(&mut Context::from_waker(&w))
                    .is_pending()
            );
        }
        drop(sleep);
        done.send(seen.lock().unwrap().clone()).unwrap();
    });
    let seen = finished
        .recv_timeout(Duration::from_secs(10))
        .expect("a waker was dropped under the clock's lock");
    // The replaced waker was dropped with the timer still registered, the last one
    // once the sleep had removed it.
    assert_eq!(seen, [1, 0]);
}

/// A sleep polled one nanosecond before its deadline is still pending, on both of
/// its paths (the lock-free reading and the one under the clock's lock).
#[test]
fn a_sleep_polled_one_nanosecond_before_its_deadline_is_pending() {
    let rt = VirtualRuntime::new();
    let mut sleep = pin!(rt.sleep(Duration::from_secs(1)));
    rt.advance(Duration::from_secs(1) - Duration::from_nanos(1));
    let ready = rt
        .block_on(poll_fn(|cx| {
            Poll::Ready(sleep.as_mut().poll(cx).is_ready())
        }))
        .unwrap();
    assert!(!ready, "ready at {:?}", rt.now());
    assert_eq!(rt.pending_timers(), 1);
    rt.advance(Duration::from_nanos(1));
    let ready = rt
        .block_on(poll_fn(|cx| {
            Poll::Ready(sleep.as_mut().poll(cx).is_ready())
        }))
        .unwrap();
    assert!(ready);
    assert_eq!(rt.pending_timers(), 0);
}
