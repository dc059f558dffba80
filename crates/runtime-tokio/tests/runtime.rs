//! `TokioRuntime` on tokio's paused clock.

use std::collections::HashSet;
use std::time::Duration;

use vantage_api_pool::{Instant, Runtime, timeout_at};
use vantage_api_pool_tokio::TokioRuntime;

#[tokio::test(start_paused = true)]
async fn a_sleep_advances_the_paused_clock_and_now_follows() {
    let runtime = TokioRuntime::new();
    let start = runtime.now();
    let tokio_start = tokio::time::Instant::now();
    runtime.sleep(Duration::from_secs(5)).await;
    assert_eq!(runtime.now() - start, Duration::from_secs(5));
    assert_eq!(
        tokio::time::Instant::now() - tokio_start,
        Duration::from_secs(5)
    );
}

#[tokio::test(start_paused = true)]
async fn a_sleep_never_ends_before_its_deadline() {
    let runtime = TokioRuntime::new();
    let deadline = runtime.now() + Duration::from_micros(1500);
    runtime.sleep_until(deadline).await;
    let late = runtime.now() - deadline;
    assert!(runtime.now() >= deadline);
    assert!(late < Duration::from_millis(1), "{late:?}");
}

#[tokio::test(start_paused = true)]
async fn the_deadline_is_fixed_when_sleep_is_called() {
    let runtime = TokioRuntime::new();
    let start = runtime.now();
    let sleep = runtime.sleep(Duration::from_secs(2));
    tokio::time::advance(Duration::from_secs(1)).await;
    sleep.await;
    assert_eq!(runtime.now() - start, Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn a_deadline_in_the_past_ends_at_once() {
    let runtime = TokioRuntime::new();
    tokio::time::advance(Duration::from_secs(3)).await;
    let before = runtime.now();
    runtime.sleep_until(Instant::ORIGIN).await;
    runtime.sleep(Duration::ZERO).await;
    assert_eq!(runtime.now(), before);
}

#[tokio::test(start_paused = true)]
async fn far_deadlines_do_not_panic() {
    let runtime = TokioRuntime::new();
    let start = runtime.now();
    let far = [
        Instant::FAR_FUTURE,
        Instant::from_nanos(u64::MAX - 1),
        runtime.now() + Duration::from_secs(100 * 365 * 24 * 3600),
    ];
    for deadline in far {
        tokio::select! {
            () = runtime.sleep_until(deadline) => panic!("a far deadline came: {deadline:?}"),
            () = runtime.sleep(Duration::from_secs(1)) => {}
        }
    }
    let cut = timeout_at(
        &runtime,
        runtime.now() + Duration::from_secs(1),
        runtime.sleep(Duration::MAX),
    )
    .await;
    assert!(cut.is_err());
    // One second per far deadline raced, one for the cut.
    let raced = u64::try_from(far.len()).unwrap() + 1;
    assert_eq!(runtime.now() - start, Duration::from_secs(raced));
}

#[tokio::test(start_paused = true)]
async fn a_deadline_seventy_years_away_is_slept_exactly() {
    let runtime = TokioRuntime::new();
    let deadline = runtime.now() + Duration::from_secs(70 * 365 * 24 * 3600);
    runtime.sleep_until(deadline).await;
    let now = runtime.now();
    assert!(
        now >= deadline && now - deadline < Duration::from_millis(1),
        "{now:?}"
    );
}

#[test]
fn random_is_in_the_unit_interval_and_varies() {
    let runtime = TokioRuntime::new();
    let draws: Vec<f64> = (0..10_000).map(|_| runtime.random()).collect();
    assert!(draws.iter().all(|x| (0.0..1.0).contains(x)));
    let distinct: HashSet<u64> = draws.iter().map(|x| x.to_bits()).collect();
    assert_eq!(distinct.len(), draws.len());
    let mean = draws.iter().sum::<f64>() / draws.len() as f64;
    assert!((0.45..0.55).contains(&mean), "{mean}");
    let low = draws.iter().filter(|&&x| x < 0.1).count();
    assert!((800..1200).contains(&low), "{low}");
}

#[test]
fn runtimes_and_clones_draw_different_numbers_but_share_the_origin() {
    let a = TokioRuntime::new();
    let b = a.clone();
    let c = TokioRuntime::new();
    let draw = |r: &TokioRuntime| (0..4).map(|_| r.random().to_bits()).collect::<Vec<_>>();
    let (da, db, dc) = (draw(&a), draw(&b), draw(&c));
    assert_ne!(da, db);
    assert_ne!(da, dc);
    assert_eq!(a.origin(), b.origin());
}

#[test]
fn instants_convert_to_and_from_tokio() {
    let runtime = TokioRuntime::new();
    let at = Instant::from_origin(Duration::from_millis(1500));
    let tokio_at = runtime.to_tokio(at).unwrap();
    assert_eq!(tokio_at - runtime.origin(), Duration::from_millis(1500));
    assert_eq!(runtime.from_tokio(tokio_at), at);
    assert_eq!(runtime.to_tokio(Instant::FAR_FUTURE), None);
    assert_eq!(
        runtime.from_tokio(runtime.origin() - Duration::from_secs(1)),
        Instant::ORIGIN
    );
}

#[test]
fn the_runtime_and_its_futures_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync + 'static>(_: &T) {}
    fn assert_send<T: Send + 'static>(_: &T) {}
    let runtime = TokioRuntime::default();
    assert_send_sync(&runtime);
    assert_send(&runtime.sleep_until(Instant::ORIGIN));
    assert_send(&runtime.sleep(Duration::from_secs(1)));
}

#[test]
fn a_sleep_made_outside_a_runtime_runs_inside_one() {
    let runtime = TokioRuntime::new();
    let sleep = runtime.sleep(Duration::from_millis(5));
    let never = runtime.sleep_until(Instant::FAR_FUTURE);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        sleep.await;
        let cut = tokio::time::timeout(Duration::from_secs(3600), never).await;
        assert!(cut.is_err(), "FAR_FUTURE never comes");
    });
}

#[tokio::test]
async fn the_wall_clock_is_the_system_clock() {
    let runtime = TokioRuntime::new();
    let wall = runtime.wall_clock();
    let system = std::time::SystemTime::now();
    // Either order: the distance between the two readings, whichever came first.
    let skew = system.duration_since(wall).unwrap_or_else(|e| e.duration());
    assert!(skew < Duration::from_secs(1), "{wall:?} vs {system:?}");
}
