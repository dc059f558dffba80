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
async fn a_sleep_registers_a_timer_the_paused_clock_can_reach() {
    // A sleep that registered no tokio timer would leave a paused runtime parked for
    // good (every other paused test would hang); raced against tokio's own timer, it
    // fails instead.
    let runtime = TokioRuntime::new();
    let slept = tokio::time::timeout(
        Duration::from_secs(10),
        runtime.sleep(Duration::from_secs(5)),
    );
    slept
        .await
        .expect("the 5 s sleep ended before tokio's 10 s timer");
    assert_eq!(runtime.now(), Instant::ORIGIN + Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn a_deadline_just_past_a_millisecond_is_not_cut_short() {
    // tokio's timers have millisecond ticks; a deadline a few nanoseconds past one
    // must not end on that tick.
    let runtime = TokioRuntime::new();
    for extra in [1, 999_999, 1_000_001] {
        let deadline = runtime.now() + Duration::from_millis(1) + Duration::from_nanos(extra);
        runtime.sleep_until(deadline).await;
        assert!(
            runtime.now() >= deadline,
            "{:?} < {deadline:?}",
            runtime.now()
        );
    }
}

#[tokio::test(start_paused = true)]
async fn far_future_never_comes_even_when_the_paused_clock_jumps_centuries() {
    // FAR_FUTURE is "never", not a timer 584 years away that auto-advance would reach.
    let runtime = TokioRuntime::new();
    let millennium = Duration::from_secs(1000 * 365 * 24 * 3600);
    let never = tokio::time::timeout(millennium, runtime.sleep_until(Instant::FAR_FUTURE));
    assert!(never.await.is_err(), "FAR_FUTURE came");
}

#[tokio::test(start_paused = true)]
async fn a_new_runtime_reads_the_origin_now() {
    let runtime = TokioRuntime::new();
    assert_eq!(runtime.origin(), tokio::time::Instant::now());
    assert_eq!(runtime.now(), Instant::ORIGIN);
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
fn a_seeded_runtime_draws_the_splitmix64_sequence_with_53_bits_as_wasm_does() {
    let unit = |x: u64| (x >> 11) as f64 / (1u64 << 53) as f64;
    // SplitMix64's reference outputs for the seed 0.
    let runtime = TokioRuntime::with_seed(0);
    for want in [
        0xE220_A839_7B1D_CDAF_u64,
        0x6E78_9E6A_A1B9_65F4,
        0x06C4_5D18_8009_454F,
    ] {
        assert_eq!(runtime.random(), unit(want));
    }
    // The draw runtime-wasm's tests pin for WasmRuntime::with_seed(1_234_567).
    assert_eq!(
        TokioRuntime::with_seed(1_234_567).random(),
        unit(6_457_827_717_110_365_317)
    );
}

#[test]
fn fresh_runtimes_in_two_processes_draw_different_numbers() {
    // A fleet of clients must not retry in step: the seed comes from the wall clock,
    // not only from a per-process counter. The test runs itself in two child
    // processes, each of which prints its first draw.
    const CHILD: &str = "VANTAGE_TOKIO_PRINT_FIRST_DRAW";
    if std::env::var_os(CHILD).is_some() {
        println!("draw={}", TokioRuntime::new().random().to_bits());
        return;
    }
    let draw = || {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "fresh_runtimes_in_two_processes_draw_different_numbers",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let draw = text
            .split("draw=")
            .nth(1)
            .and_then(|t| t.split_whitespace().next());
        draw.map(str::to_owned)
            .unwrap_or_else(|| panic!("no draw in {text:?}"))
    };
    assert_ne!(draw(), draw());
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
    // 600 years on (a paused clock can go there): the latest reading, never the
    // deadline that never comes.
    let latest = Instant::from_nanos(u64::MAX - 1);
    let far = runtime.origin() + Duration::from_secs(600 * 365 * 86_400);
    assert_eq!(runtime.from_tokio(far), latest);
    assert_eq!(
        runtime.from_tokio(runtime.origin() + Duration::from_nanos(u64::MAX)),
        latest
    );
    assert_eq!(
        runtime.from_tokio(runtime.origin() + Duration::from_nanos(u64::MAX - 2)),
        Instant::from_nanos(u64::MAX - 2)
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
