//! [`VirtualRuntime`]: a virtual monotonic clock, a seeded random source, a settable
//! wall clock and a deterministic single-threaded driver.
//!
//! # How time moves
//!
//! The clock starts at [`Instant::ORIGIN`] and moves only in two ways:
//!
//! * a driver ([`VirtualRuntime::block_on`], [`run`](VirtualRuntime::run),
//!   [`run_until`](VirtualRuntime::run_until), [`run_for`](VirtualRuntime::run_for))
//!   finds every task parked, and jumps the clock to the earliest pending timer;
//! * a test calls [`advance`](VirtualRuntime::advance).
//!
//! Either way every timer whose deadline is reached fires, in (deadline, creation
//! order), and the tasks they wake are polled in the order they were woken.
//!
//! # Where tasks live
//!
//! Tasks need not be `Send` (an `Rc`-based transport must run here), while the
//! runtime itself is `Send + Sync` so that a client built over it is. The two are
//! reconciled by keeping spawned tasks with the thread that spawned them: the first
//! [`spawn`](VirtualRuntime::spawn) binds the runtime's tasks to the calling thread,
//! and from then on spawning and driving must happen on that thread (spawning
//! elsewhere panics, driving elsewhere returns [`DriveError::WrongThread`]). Reading
//! the clock, sleeping, drawing random numbers and [`advance`](VirtualRuntime::advance)
//! work from any thread.
//!
//! Unfinished tasks are dropped with the runtime's last clone (tasks that hold a
//! clone keep it alive: see [`abort_all`](VirtualRuntime::abort_all)). Dropped on
//! another thread, the runtime cannot reach them: they are dropped on their own
//! thread the next time a runtime new to that thread spawns or calls `block_on`
//! there, or when that thread ends.
//!
//! ```
//! use std::time::Duration;
//! use vantage_api_pool_testkit::VirtualRuntime;
//!
//! let rt = VirtualRuntime::new();
//! // Three "calls" at once, each waiting its own back-off.
//! let handles: Vec<_> = [300u64, 100, 200]
//!     .into_iter()
//!     .map(|ms| {
//!         let rt2 = rt.clone();
//!         rt.spawn(async move {
//!             rt2.sleep(Duration::from_millis(ms)).await;
//!             rt2.elapsed()
//!         })
//!     })
//!     .collect();
//! rt.run()?;
//! assert_eq!(rt.elapsed(), Duration::from_millis(300));
//! let woke: Vec<Duration> = handles.into_iter().map(|h| rt.block_on(h)).collect::<Result<_, _>>()?;
//! assert_eq!(woke, [300, 100, 200].map(Duration::from_millis));
//! # Ok::<(), vantage_api_pool_testkit::DriveError>(())
//! ```

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::{Pin, pin};
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::ThreadId;
use std::time::{Duration, SystemTime};

// The docs name the plain port, which `VirtualRuntime` has through `SendRuntime`.
use vantage_api_pool::Instant;
use vantage_api_pool::runtime::SendRuntime;

use crate::timers::{TimerId, Timers};

/// The seed of [`VirtualRuntime::new`].
///
/// ```
/// use vantage_api_pool_testkit::{DEFAULT_SEED, VirtualRuntime};
/// let a = VirtualRuntime::new();
/// let b = VirtualRuntime::new().with_seed(DEFAULT_SEED);
/// assert_eq!(a.random_u64(), b.random_u64());
/// ```
pub const DEFAULT_SEED: u64 = 0x7E57_C10C_5EED_0001;

/// The default of [`VirtualRuntime::with_step_limit`]: polls per driver call.
///
/// A poll costs from well under a microsecond (a task that only wakes itself) to a
/// few microseconds (a client call in a debug build), so a task that wakes itself
/// forever is stopped within seconds. A benchmark that drives hundreds of thousands
/// of calls in one `block_on` raises it.
///
/// ```
/// use vantage_api_pool_testkit::{DEFAULT_STEP_LIMIT, VirtualRuntime};
/// let bench = VirtualRuntime::new().with_step_limit(u64::MAX);
/// # let _ = (bench, DEFAULT_STEP_LIMIT);
/// ```
pub const DEFAULT_STEP_LIMIT: u64 = 10_000_000;

/// The default of [`VirtualRuntime::with_time_limit`]: one day of virtual time per
/// [`block_on`](VirtualRuntime::block_on) or [`run`](VirtualRuntime::run).
///
/// A call that retries forever against an API that stays down (an `essential()`
/// call, say) never parks without a timer: each back-off moves the clock on. One day
/// of that is a few thousand sends, over in milliseconds, instead of a test that runs
/// for minutes and records millions of events before the step limit stops it.
///
/// ```
/// use std::time::Duration;
/// use vantage_api_pool_testkit::{DEFAULT_TIME_LIMIT, VirtualRuntime};
/// assert_eq!(DEFAULT_TIME_LIMIT, Duration::from_secs(24 * 60 * 60));
/// let a_month_of_token_refreshes = VirtualRuntime::new().with_time_limit(Duration::from_secs(31 * 86_400));
/// # let _ = a_month_of_token_refreshes;
/// ```
pub const DEFAULT_TIME_LIMIT: Duration = Duration::from_secs(24 * 60 * 60);

/// The wall clock a new runtime reports: 2026-01-01T00:00:00Z.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use vantage_api_pool_testkit::DEFAULT_WALL_CLOCK_SECS;
///
/// let start = SystemTime::UNIX_EPOCH + Duration::from_secs(DEFAULT_WALL_CLOCK_SECS);
/// assert_eq!(vantage_api_pool_testkit::VirtualRuntime::new().wall_clock(), start);
/// ```
pub const DEFAULT_WALL_CLOCK_SECS: u64 = 1_767_225_600;

/// `duration` in nanoseconds, or `u64::MAX` (no limit) if it does not fit.
fn nanos_or_max(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// `Shared::now_nanos` when the time must be read under the lock.
const NOW_IN_CLOCK: u64 = u64::MAX;

/// `Shared::wall_at_origin` when the wall clock must be read under the lock.
const WALL_IN_CLOCK: i64 = i64::MIN;

/// Signed nanoseconds from the Unix epoch, if they fit in an `i128`'s safe range.
fn nanos_from_wall(wall: SystemTime) -> Option<i128> {
    match wall.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(after) => i128::try_from(after.as_nanos()).ok(),
        Err(before) => i128::try_from(before.duration().as_nanos())
            .ok()
            .map(|n| -n),
    }
}

/// The `SystemTime` `nanos` nanoseconds from the Unix epoch, if representable.
fn wall_from_nanos(nanos: i128) -> Option<SystemTime> {
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    let magnitude = nanos.unsigned_abs();
    let secs = u64::try_from(magnitude / NANOS_PER_SEC).ok()?;
    let subsec = u32::try_from(magnitude % NANOS_PER_SEC).ok()?;
    let offset = Duration::new(secs, subsec);
    if nanos >= 0 {
        SystemTime::UNIX_EPOCH.checked_add(offset)
    } else {
        SystemTime::UNIX_EPOCH.checked_sub(offset)
    }
}

/// Index value reserved for the future passed to `block_on`.
const MAIN_INDEX: u32 = u32::MAX;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic in a test must not turn every later `Drop` into a second panic.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn task_key(index: u32, generation: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(index)
}

fn key_parts(key: u64) -> (u32, u32) {
    // Truncation is the point: the low half is the index, the high half the generation.
    (key as u32, (key >> 32) as u32)
}

/// The state every clone of one runtime shares.
struct Shared {
    id: u64,
    clock: Mutex<Clock>,
    /// `clock.now` in nanoseconds, for lock-free reads; [`NOW_IN_CLOCK`] when it
    /// does not fit (after 584 years of virtual time). Written only under the lock.
    now_nanos: AtomicU64,
    /// The wall clock at the origin, in signed nanoseconds from the Unix epoch, for
    /// lock-free reads; [`WALL_IN_CLOCK`] when it does not fit. Written under the lock.
    wall_at_origin: AtomicI64,
    queue: Arc<ReadyQueue>,
    rng: AtomicU64,
    seed: AtomicU64,
    step_limit: AtomicU64,
    /// [`VirtualRuntime::with_time_limit`] in nanoseconds (`u64::MAX`: none).
    time_limit_nanos: AtomicU64,
    driving: AtomicBool,
    /// Sleeps that were pending when polled while no driver ran (each counted once).
    undriven_sleeps: AtomicU64,
    /// Whether [`VirtualRuntime::advance`] was ever called: a test that moves the
    /// clock by hand gets no hint about undriven sleeps.
    advanced_by_hand: AtomicBool,
    /// Whether the hint about an undriven sleep has been printed.
    hinted: AtomicBool,
    home: OnceLock<ThreadId>,
    main_generation: AtomicU32,
    /// Calls of [`VirtualRuntime::advance`] that have taken timers out and not yet
    /// woken all of their tasks. Raised under the clock lock, so a driver that finds
    /// the timers gone also finds it raised; it waits for it to fall before it takes
    /// an empty ready queue for "nothing happens".
    waking: AtomicUsize,
    /// Times a driver waited for `waking` to fall: lets a unit test see that it did.
    #[cfg(test)]
    waited_for_wakes: AtomicUsize,
    /// Run once just before the driver next moves the clock (a unit test's stand-in
    /// for another thread acting at that moment).
    #[cfg(test)]
    before_fire: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

struct Clock {
    now: Instant,
    timers: Timers,
    wall_base: SystemTime,
    wall_base_at: Instant,
}

/// The latest instant the virtual clock can show: 1 ns before
/// [`Instant::FAR_FUTURE`], the deadline that never comes.
const LATEST: Instant = Instant::from_nanos(u64::MAX - 1);

impl Clock {
    /// Moves the clock to `now` (never backwards, never to [`Instant::FAR_FUTURE`]),
    /// keeping the lock-free mirror in step.
    fn set_now(&mut self, now: Instant, mirror: &AtomicU64) {
        let now = now.min(LATEST);
        if now <= self.now {
            return;
        }
        self.now = now;
        let nanos = u64::try_from(now.since_origin().as_nanos())
            .ok()
            .filter(|&n| n != NOW_IN_CLOCK)
            .unwrap_or(NOW_IN_CLOCK);
        mirror.store(nanos, Ordering::Release);
    }

    /// Removes every timer due at or before `self.now`, in (deadline, creation order),
    /// moving their wakers into `out`.
    fn take_due(&mut self, out: &mut Vec<Waker>) {
        self.timers.take_due(self.now, out);
    }

    fn wall_clock(&self) -> SystemTime {
        let elapsed = self.now.saturating_duration_since(self.wall_base_at);
        self.wall_base
            .checked_add(elapsed)
            .unwrap_or(self.wall_base)
    }
}

/// The FIFO of woken tasks, written by wakers from anywhere.
struct ReadyQueue {
    keys: Mutex<VecDeque<u64>>,
    /// Whether `keys` may hold something; written under the lock, read without it
    /// so the driver skips the lock when nothing was woken (exact on one thread).
    nonempty: AtomicBool,
}

impl ReadyQueue {
    fn push(&self, key: u64) {
        let mut keys = lock(&self.keys);
        keys.push_back(key);
        self.nonempty.store(true, Ordering::Release);
    }

    /// Moves every queued key into `batch` (which must be empty).
    fn take_all(&self, batch: &mut VecDeque<u64>) {
        if !self.nonempty.load(Ordering::Acquire) {
            return;
        }
        let mut keys = lock(&self.keys);
        std::mem::swap(&mut *keys, batch);
        self.nonempty.store(false, Ordering::Release);
    }

    /// Puts `batch` back at the front, keeping its order.
    fn requeue_front(&self, batch: &mut VecDeque<u64>) {
        if batch.is_empty() {
            return;
        }
        let mut keys = lock(&self.keys);
        while let Some(key) = batch.pop_back() {
            keys.push_front(key);
        }
        self.nonempty.store(true, Ordering::Release);
    }

    fn is_empty(&self) -> bool {
        lock(&self.keys).is_empty()
    }
}

/// The waker of one task: pushes the task's key once until the task is polled again.
struct TaskWaker {
    queue: Arc<ReadyQueue>,
    /// Changed only while no clone of the waker exists (see `Executor::insert`).
    key: AtomicU64,
    queued: AtomicBool,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            self.queue.push(self.key.load(Ordering::Relaxed));
        }
    }
}

/// Lowers [`Shared::waking`] when an `advance` has woken its tasks, or unwinds
/// from a waker that panicked.
struct WakingGuard<'a>(&'a AtomicUsize);

impl Drop for WakingGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

static NEXT_RUNTIME_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's id, without `thread::current()`'s reference counting.
    static THREAD_ID: ThreadId = std::thread::current().id();
}

pub(crate) fn current_thread() -> ThreadId {
    THREAD_ID
        .try_with(|id| *id)
        .unwrap_or_else(|_| std::thread::current().id())
}

thread_local! {
    /// The spawned tasks of every runtime bound to this thread.
    static EXECUTORS: RefCell<Vec<ExecutorEntry>> = const { RefCell::new(Vec::new()) };
}

/// A runtime's executor on one thread.
struct ExecutorEntry {
    id: u64,
    /// Gone once the runtime is: a runtime dropped on another thread cannot reach
    /// this thread's list, so the entry is taken out (and its tasks dropped, here)
    /// when this thread next makes an executor.
    runtime: std::sync::Weak<Shared>,
    executor: Rc<Executor>,
}

impl Shared {
    /// Whether an `advance` on another thread has taken timers out and not yet woken
    /// their tasks; if so, yields the thread once, so the caller looks again after.
    fn yield_to_wakes_in_transit(&self) -> bool {
        if self.waking.load(Ordering::SeqCst) == 0 {
            return false;
        }
        #[cfg(test)]
        self.waited_for_wakes.fetch_add(1, Ordering::SeqCst);
        std::thread::yield_now();
        true
    }

    fn now(&self) -> Instant {
        match self.now_nanos.load(Ordering::Acquire) {
            NOW_IN_CLOCK => lock(&self.clock).now,
            nanos => Instant::from_origin(Duration::from_nanos(nanos)),
        }
    }

    /// Counts a sleep left waiting while no driver ran, and the first time (unless
    /// the test moves the clock by hand) says on stderr why it may wait forever.
    /// `eprintln!`, so the test harness keeps it with the test's captured output:
    /// shown when the test fails, or under `--nocapture` (a test that hangs shows it
    /// only there); a green run stays quiet.
    fn sleep_polled_undriven(&self) {
        self.undriven_sleeps.fetch_add(1, Ordering::Relaxed);
        if !self.advanced_by_hand.load(Ordering::Relaxed)
            && !self.hinted.swap(true, Ordering::Relaxed)
        {
            // wasm32-unknown-unknown has no stderr.
            #[cfg(not(target_arch = "wasm32"))]
            eprintln!("{UNDRIVEN_HINT}");
        }
    }
}

/// What a test sees on stderr when a sleep of a runtime nothing drives is left
/// waiting (see [`VirtualRuntime::undriven_sleeps`]).
pub const UNDRIVEN_HINT: &str = "vantage-api-pool-testkit: a VirtualRuntime sleep was \
    polled while nothing drove the runtime. Its clock moves only under rt.block_on, \
    rt.run, rt.run_for, rt.run_until and rt.run_until_idle (which also run \
    rt.spawn's tasks), or by rt.advance: awaited under #[tokio::test] or another \
    executor, a call on this runtime may wait forever. Await it inside \
    rt.block_on(..) instead. (Printed once per runtime, not after an rt.advance; \
    ignore it if the test drives the runtime later.)";

impl Drop for Shared {
    fn drop(&mut self) {
        let id = self.id;
        // Take the executor out first and drop it after the borrow ends: dropping
        // tasks runs user code, which may spawn on another runtime.
        let taken = EXECUTORS
            .try_with(|list| {
                let mut list = list.try_borrow_mut().ok()?;
                let pos = list.iter().position(|entry| entry.id == id)?;
                Some(list.swap_remove(pos))
            })
            .ok()
            .flatten();
        drop(taken);
    }
}

/// A virtual clock, a seeded random source, a settable wall clock and a deterministic
/// single-threaded driver, implementing [`Runtime`](vantage_api_pool::Runtime).
///
/// Cheap to clone: clones share one clock, one set of timers, one random sequence
/// and one set of tasks. `Send + Sync`, so a client built over it is too; the tasks
/// it drives need not be `Send` (see the [module docs](crate::runtime) for how).
///
/// ```
/// use std::time::Duration;
/// use vantage_api_pool::Instant;
/// use vantage_api_pool_testkit::VirtualRuntime;
///
/// let rt = VirtualRuntime::new();
/// let sleeper = rt.clone();
/// let woke_at = rt.block_on(async move {
///     sleeper.sleep(Duration::from_secs(30)).await;
///     sleeper.now()
/// })?;
/// // Thirty virtual seconds, no real waiting.
/// assert_eq!(woke_at, Instant::ORIGIN + Duration::from_secs(30));
/// # Ok::<(), vantage_api_pool_testkit::DriveError>(())
/// ```
#[derive(Clone)]
pub struct VirtualRuntime {
    shared: Arc<Shared>,
}

impl Default for VirtualRuntime {
    /// Same as [`VirtualRuntime::new`].
    ///
    /// ```
    /// use vantage_api_pool_testkit::VirtualRuntime;
    /// assert_eq!(VirtualRuntime::default().seed(), VirtualRuntime::new().seed());
    /// ```
    fn default() -> Self {
        VirtualRuntime::new()
    }
}

impl fmt::Debug for VirtualRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let clock = lock(&self.shared.clock);
        f.debug_struct("VirtualRuntime")
            .field("now", &clock.now)
            .field("pending_timers", &clock.timers.len())
            .field("seed", &self.shared.seed.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl VirtualRuntime {
    /// A runtime at [`Instant::ORIGIN`], seeded with [`DEFAULT_SEED`], whose wall
    /// clock reads 2026-01-01T00:00:00Z, with a step limit of [`DEFAULT_STEP_LIMIT`]
    /// and a time limit of [`DEFAULT_TIME_LIMIT`].
    ///
    /// ```
    /// use vantage_api_pool::Instant;
    /// use vantage_api_pool_testkit::VirtualRuntime;
    /// assert_eq!(VirtualRuntime::new().now(), Instant::ORIGIN);
    /// ```
    #[must_use]
    pub fn new() -> Self {
        VirtualRuntime {
            shared: Arc::new(Shared {
                id: NEXT_RUNTIME_ID.fetch_add(1, Ordering::Relaxed),
                clock: Mutex::new(Clock {
                    now: Instant::ORIGIN,
                    timers: Timers::default(),
                    wall_base: SystemTime::UNIX_EPOCH
                        + Duration::from_secs(DEFAULT_WALL_CLOCK_SECS),
                    wall_base_at: Instant::ORIGIN,
                }),
                now_nanos: AtomicU64::new(0),
                wall_at_origin: AtomicI64::new(
                    i64::try_from(DEFAULT_WALL_CLOCK_SECS * 1_000_000_000)
                        .expect("the default wall clock fits"),
                ),
                queue: Arc::new(ReadyQueue {
                    keys: Mutex::new(VecDeque::new()),
                    nonempty: AtomicBool::new(false),
                }),
                rng: AtomicU64::new(DEFAULT_SEED),
                seed: AtomicU64::new(DEFAULT_SEED),
                step_limit: AtomicU64::new(DEFAULT_STEP_LIMIT),
                time_limit_nanos: AtomicU64::new(nanos_or_max(DEFAULT_TIME_LIMIT)),
                driving: AtomicBool::new(false),
                undriven_sleeps: AtomicU64::new(0),
                advanced_by_hand: AtomicBool::new(false),
                hinted: AtomicBool::new(false),
                home: OnceLock::new(),
                main_generation: AtomicU32::new(0),
                waking: AtomicUsize::new(0),
                #[cfg(test)]
                waited_for_wakes: AtomicUsize::new(0),
                #[cfg(test)]
                before_fire: Mutex::new(None),
            }),
        }
    }

    /// Restarts the random sequence from `seed`: the same seed gives the same
    /// sequence, so the same run. Affects every clone.
    ///
    /// ```
    /// use vantage_api_pool_testkit::VirtualRuntime;
    /// let a = VirtualRuntime::new().with_seed(7);
    /// let b = VirtualRuntime::new().with_seed(7);
    /// assert_eq!(a.random(), b.random());
    /// assert_eq!(a.seed(), 7);
    /// ```
    #[must_use]
    pub fn with_seed(self, seed: u64) -> Self {
        self.reseed(seed);
        self
    }

    /// [`with_seed`](VirtualRuntime::with_seed) through a shared reference: restarts
    /// the random sequence of this runtime and every clone from `seed`, for a runtime
    /// already handed out (to a client, say).
    ///
    /// ```
    /// use vantage_api_pool_testkit::VirtualRuntime;
    /// let rt = VirtualRuntime::new();
    /// let held_by_a_client = rt.clone();
    /// rt.reseed(7);
    /// assert_eq!(held_by_a_client.random(), VirtualRuntime::new().with_seed(7).random());
    /// assert_eq!(held_by_a_client.seed(), 7);
    /// ```
    pub fn reseed(&self, seed: u64) {
        self.shared.seed.store(seed, Ordering::Relaxed);
        self.shared.rng.store(seed, Ordering::Relaxed);
    }

    /// Sets the most polls one driver call may make before it gives up with
    /// [`DriveError::StepLimit`] (default [`DEFAULT_STEP_LIMIT`]); the guard against a
    /// task that wakes itself forever. `0` is treated as 1. Affects every clone.
    ///
    /// ```
    /// use vantage_api_pool_testkit::{DriveError, VirtualRuntime};
    ///
    /// let rt = VirtualRuntime::new().with_step_limit(1_000);
    /// // A future that wakes itself forever never finishes...
    /// let err = rt.block_on(std::future::poll_fn(|cx| {
    ///     cx.waker().wake_by_ref();
    ///     std::task::Poll::<()>::Pending
    /// }));
    /// // ...but the driver gives up instead of hanging.
    /// assert!(matches!(err, Err(DriveError::StepLimit { limit: 1_000, .. })));
    /// ```
    #[must_use]
    pub fn with_step_limit(self, polls: u64) -> Self {
        self.shared
            .step_limit
            .store(polls.max(1), Ordering::Relaxed);
        self
    }

    /// Sets how far one [`block_on`](VirtualRuntime::block_on) or
    /// [`run`](VirtualRuntime::run) may move the virtual clock (default
    /// [`DEFAULT_TIME_LIMIT`], one day): when the next timer lies further than `limit`
    /// past where the clock stood as the call began, the call stops with
    /// [`DriveError::TimeLimit`] and leaves the clock where it is. That is the guard
    /// against a call that keeps retrying forever, which the step limit would stop only
    /// after millions of sends. [`Duration::MAX`] removes the limit.
    /// [`run_until`](VirtualRuntime::run_until) and
    /// [`run_for`](VirtualRuntime::run_for) name their own end and are not limited.
    /// Affects every clone.
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool_testkit::{DriveError, VirtualRuntime};
    ///
    /// let rt = VirtualRuntime::new().with_time_limit(Duration::from_secs(60));
    /// // A loop that never ends, but waits between turns...
    /// let task_rt = rt.clone();
    /// let err = rt.block_on(async move {
    ///     loop {
    ///         task_rt.sleep(Duration::from_secs(7)).await;
    ///     }
    /// });
    /// // ...is stopped at the last timer within the minute.
    /// match err {
    ///     Err(DriveError::TimeLimit { now, .. }) => assert_eq!(now.since_origin(), Duration::from_secs(56)),
    ///     other => panic!("expected a time limit, got {other:?}"),
    /// }
    /// ```
    #[must_use]
    pub fn with_time_limit(self, limit: Duration) -> Self {
        self.shared
            .time_limit_nanos
            .store(nanos_or_max(limit), Ordering::Relaxed);
        self
    }

    /// Starts the wall clock at `wall` instead of 2026-01-01T00:00:00Z.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use vantage_api_pool_testkit::VirtualRuntime;
    /// let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
    /// assert_eq!(VirtualRuntime::new().with_wall_clock(t).wall_clock(), t);
    /// ```
    #[must_use]
    pub fn with_wall_clock(self, wall: SystemTime) -> Self {
        self.set_wall_clock(wall);
        self
    }

    /// The seed the random sequence started from.
    ///
    /// ```
    /// use vantage_api_pool_testkit::{DEFAULT_SEED, VirtualRuntime};
    /// assert_eq!(VirtualRuntime::new().seed(), DEFAULT_SEED);
    /// ```
    #[must_use]
    pub fn seed(&self) -> u64 {
        self.shared.seed.load(Ordering::Relaxed)
    }

    /// The current virtual instant.
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool_testkit::VirtualRuntime;
    /// let rt = VirtualRuntime::new();
    /// rt.advance(Duration::from_millis(1500));
    /// assert_eq!(rt.now().since_origin(), Duration::from_millis(1500));
    /// ```
    #[must_use]
    pub fn now(&self) -> Instant {
        self.shared.now()
    }

    /// Virtual time since [`Instant::ORIGIN`]; `rt.now().since_origin()`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool_testkit::VirtualRuntime;
    /// let rt = VirtualRuntime::new();
    /// rt.advance(Duration::from_secs(3));
    /// assert_eq!(rt.elapsed(), Duration::from_secs(3));
    /// ```
    #[must_use]
    pub fn elapsed(&self) -> Duration {
        self.now().since_origin()
    }

    /// The wall clock: the last value set (by default 2026-01-01T00:00:00Z) plus the
    /// virtual time elapsed since it was set. Should the sum overflow `SystemTime`,
    /// the value set is returned unchanged.
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool_testkit::VirtualRuntime;
    /// let rt = VirtualRuntime::new();
    /// let start = rt.wall_clock();
    /// rt.advance(Duration::from_secs(90));
    /// assert_eq!(rt.wall_clock(), start + Duration::from_secs(90));
    /// ```
    #[must_use]
    pub fn wall_clock(&self) -> SystemTime {
        // Lock-free when both halves fit in 64 bits (always, short of centuries).
        let origin = self.shared.wall_at_origin.load(Ordering::Acquire);
        let now = self.shared.now_nanos.load(Ordering::Acquire);
        if origin != WALL_IN_CLOCK && now != NOW_IN_CLOCK {
            let nanos = i128::from(origin) + i128::from(now);
            if let Some(wall) = wall_from_nanos(nanos) {
                return wall;
            }
        }
        lock(&self.shared.clock).wall_clock()
    }

    /// Makes [`wall_clock`](VirtualRuntime::wall_clock) return `wall` now; it keeps
    /// moving with virtual time afterwards. The monotonic clock is not touched, so
    /// this is how a test makes an HTTP-date `Retry-After` lie in the past or future.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use vantage_api_pool_testkit::VirtualRuntime;
    /// let rt = VirtualRuntime::new();
    /// rt.advance(Duration::from_secs(5));
    /// let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    /// rt.set_wall_clock(t);
    /// rt.advance(Duration::from_secs(2));
    /// assert_eq!(rt.wall_clock(), t + Duration::from_secs(2));
    /// ```
    pub fn set_wall_clock(&self, wall: SystemTime) {
        let mut clock = lock(&self.shared.clock);
        clock.wall_base = wall;
        clock.wall_base_at = clock.now;
        // The wall time at the origin, in signed nanoseconds from the Unix epoch.
        let origin = nanos_from_wall(wall)
            .map(|base| base - clock.now.since_origin().as_nanos() as i128)
            .and_then(|origin| i64::try_from(origin).ok())
            .filter(|&origin| origin != WALL_IN_CLOCK)
            .unwrap_or(WALL_IN_CLOCK);
        self.shared.wall_at_origin.store(origin, Ordering::Release);
    }

    /// A uniformly distributed number in `[0, 1)` from the seeded sequence
    /// (splitmix64, 53 bits). Clones draw from the same sequence.
    ///
    /// ```
    /// use vantage_api_pool_testkit::VirtualRuntime;
    /// let rt = VirtualRuntime::new();
    /// let x = rt.random();
    /// assert!((0.0..1.0).contains(&x));
    /// ```
    #[must_use]
    pub fn random(&self) -> f64 {
        const TWO_POW_53: f64 = 9_007_199_254_740_992.0;
        // 53 significant bits: exactly representable, so the result is < 1.
        #[allow(clippy::cast_precision_loss)]
        let x = (self.random_u64() >> 11) as f64 / TWO_POW_53;
        x
    }

    /// The next 64 random bits of the seeded sequence (splitmix64).
    ///
    /// ```
    /// use vantage_api_pool_testkit::VirtualRuntime;
    /// let a = VirtualRuntime::new().with_seed(1);
    /// let b = VirtualRuntime::new().with_seed(1);
    /// assert_eq!(a.random_u64(), b.random_u64());
    /// ```
    #[must_use]
    pub fn random_u64(&self) -> u64 {
        const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut z = self
            .shared
            .rng
            .fetch_add(GAMMA, Ordering::Relaxed)
            .wrapping_add(GAMMA);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A future that completes when the virtual clock reaches `deadline`.
    ///
    /// The timer is registered now, when this is called (so creation order, which
    /// breaks ties between equal deadlines, is call order); a deadline at or before
    /// now gives a future that is ready at once and registers nothing. Dropping the
    /// future removes its timer. A sleep until [`Instant::FAR_FUTURE`] never ends: the
    /// driver does not jump there, and reports a deadlock if nothing else is pending.
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool::Instant;
    /// use vantage_api_pool_testkit::VirtualRuntime;
    ///
    /// let rt = VirtualRuntime::new();
    /// let at = Instant::ORIGIN + Duration::from_secs(2);
    /// let sleep = rt.sleep_until(at);
    /// assert_eq!(rt.pending_timers(), 1);
    /// rt.block_on(sleep)?;
    /// assert_eq!(rt.now(), at);
    /// assert_eq!(rt.pending_timers(), 0);
    /// # Ok::<(), vantage_api_pool_testkit::DriveError>(())
    /// ```
    pub fn sleep_until(&self, deadline: Instant) -> Sleep {
        Sleep {
            core: TimerCore::until(&self.shared, deadline),
            shared: Arc::clone(&self.shared),
        }
    }

    /// A future that completes `duration` after now (read when this is called); see
    /// [`sleep_until`](VirtualRuntime::sleep_until).
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool_testkit::VirtualRuntime;
    /// let rt = VirtualRuntime::new();
    /// rt.block_on(rt.sleep(Duration::from_millis(250)))?;
    /// assert_eq!(rt.elapsed(), Duration::from_millis(250));
    /// # Ok::<(), vantage_api_pool_testkit::DriveError>(())
    /// ```
    pub fn sleep(&self, duration: Duration) -> Sleep {
        Sleep {
            core: TimerCore::after(&self.shared, duration),
            shared: Arc::clone(&self.shared),
        }
    }

    /// A sleep that borrows the runtime instead of holding a clone: what the
    /// [`Runtime`](vantage_api_pool::Runtime) impl and the scripted transport use (no
    /// reference counting).
    pub(crate) fn sleep_ref(&self, duration: Duration) -> SleepRef<'_> {
        SleepRef {
            core: TimerCore::after(&self.shared, duration),
            shared: &self.shared,
        }
    }

    /// How many timers are registered and not yet fired or dropped.
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool_testkit::VirtualRuntime;
    /// let rt = VirtualRuntime::new();
    /// let a = rt.sleep(Duration::from_secs(1));
    /// let b = rt.sleep(Duration::from_secs(2));
    /// assert_eq!(rt.pending_timers(), 2);
    /// drop(a);
    /// assert_eq!(rt.pending_timers(), 1);
    /// # drop(b);
    /// ```
    #[must_use]
    pub fn pending_timers(&self) -> usize {
        lock(&self.shared.clock).timers.len()
    }

    /// How many of this runtime's sleeps were left waiting when polled while none of
    /// its drivers ran (each sleep counted once; one call can leave several, such as
    /// a scripted reply's delay and its send's time limit): polled by another
    /// executor, such as
    /// `#[tokio::test]`'s, where only [`advance`](VirtualRuntime::advance) can end
    /// them. The first one also prints [`UNDRIVEN_HINT`] on stderr (captured by the
    /// test harness: shown when the test fails, or under `--nocapture`), unless
    /// `advance` was called before. A test that drives its calls with
    /// [`block_on`](VirtualRuntime::block_on) or [`run`](VirtualRuntime::run) counts
    /// none, so `assert_eq!(rt.undriven_sleeps(), 0)` finds the one that does not. A
    /// sleep polled by hand before it is driven (a `now_or_never` look, say) counts
    /// too, though the driver ends it later.
    ///
    /// ```
    /// use std::future::Future;
    /// use std::pin::pin;
    /// use std::task::{Context, Waker};
    /// use std::time::Duration;
    /// use vantage_api_pool_testkit::VirtualRuntime;
    ///
    /// let rt = VirtualRuntime::new();
    /// rt.block_on(rt.sleep(Duration::from_secs(1)))?;
    /// assert_eq!(rt.undriven_sleeps(), 0);
    ///
    /// // Polled by hand, as another executor would: nothing moves its clock.
    /// let mut sleep = pin!(rt.sleep(Duration::from_secs(1)));
    /// assert!(sleep.as_mut().poll(&mut Context::from_waker(Waker::noop())).is_pending());
    /// assert_eq!(rt.undriven_sleeps(), 1);
    /// # Ok::<(), vantage_api_pool_testkit::DriveError>(())
    /// ```
    #[must_use]
    pub fn undriven_sleeps(&self) -> u64 {
        self.shared.undriven_sleeps.load(Ordering::Relaxed)
    }

    /// The deadline of the earliest pending timer, if any.
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool::Instant;
    /// use vantage_api_pool_testkit::VirtualRuntime;
    /// let rt = VirtualRuntime::new();
    /// let _late = rt.sleep(Duration::from_secs(9));
    /// let _soon = rt.sleep(Duration::from_secs(4));
    /// assert_eq!(rt.next_timer(), Some(Instant::ORIGIN + Duration::from_secs(4)));
    /// ```
    #[must_use]
    pub fn next_timer(&self) -> Option<Instant> {
        lock(&self.shared.clock).timers.first()
    }

    /// Moves the clock forward by `by` (saturating 1 ns short of
    /// [`Instant::FAR_FUTURE`], which never comes, so a sleep until it never ends) and
    /// fires every timer due by then, in (deadline, creation order). It polls
    /// nothing: woken tasks run at the next driver call, for example
    /// [`run_until_idle`](VirtualRuntime::run_until_idle). Works from any thread, and
    /// from inside a task.
    ///
    /// To let tasks react at each intermediate deadline, use
    /// [`run_for`](VirtualRuntime::run_for) instead.
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool_testkit::VirtualRuntime;
    ///
    /// let rt = VirtualRuntime::new();
    /// let handle = rt.spawn(rt.sleep(Duration::from_secs(5)));
    /// rt.run_until_idle()?;
    /// assert!(!handle.is_finished());
    /// rt.advance(Duration::from_secs(5));
    /// rt.run_until_idle()?;
    /// assert!(handle.is_finished());
    /// # Ok::<(), vantage_api_pool_testkit::DriveError>(())
    /// ```
    pub fn advance(&self, by: Duration) {
        self.shared.advanced_by_hand.store(true, Ordering::Relaxed);
        let mut wakers = Vec::new();
        {
            let mut clock = lock(&self.shared.clock);
            let target = clock.now.saturating_add(by);
            self.move_clock(&mut clock, target, &mut wakers);
            if wakers.is_empty() {
                return;
            }
            self.shared.waking.fetch_add(1, Ordering::SeqCst);
        }
        // Woken outside the lock (a waker may run anything); a driver on another
        // thread waits for `waking` to fall rather than see nothing to do meanwhile.
        let _woken = WakingGuard(&self.shared.waking);
        for waker in wakers {
            waker.wake();
        }
    }

    /// Moves the clock to `to` (never backwards) and takes every timer due by then.
    /// Every move of the clock goes through here: the lock-free fast path of
    /// [`Sleep`] relies on "the clock is past a deadline" implying "its timer is gone".
    fn move_clock(&self, clock: &mut Clock, to: Instant, wakers: &mut Vec<Waker>) {
        clock.set_now(to, &self.shared.now_nanos);
        clock.take_due(wakers);
    }

    /// Jumps to the earliest timer before [`Instant::FAR_FUTURE`] (not past `limit`)
    /// and fires every timer at that deadline, unless a task was woken since the
    /// driver found none ([`woken_meanwhile`](Self::woken_meanwhile)).
    fn fire_next(&self, limit: Option<Instant>, wakers: &mut Vec<Waker>) -> Fired {
        #[cfg(test)]
        self.run_before_fire_hook();
        {
            let mut clock = lock(&self.shared.clock);
            if self.woken_meanwhile() {
                return Fired::LookAgain;
            }
            let Some(deadline) = clock.timers.first() else {
                return Fired::Nothing;
            };
            if deadline == Instant::FAR_FUTURE {
                return Fired::Nothing;
            }
            if limit.is_some_and(|limit| deadline > limit) {
                return Fired::Beyond;
            }
            self.move_clock(&mut clock, deadline, wakers);
        }
        for waker in wakers.drain(..) {
            waker.wake();
        }
        Fired::Some
    }

    /// Whether a task was woken, or an `advance` on another thread is waking one,
    /// since the driver found the ready queue empty. Asked holding the clock lock,
    /// before the clock moves: `advance` counts its wakes in transit under that
    /// lock and they reach the queue before the count falls, so one of the two
    /// shows an `advance` that ran, wholly or in part, after the driver looked. A
    /// task it woke then runs at the time it was woken, not after a later timer.
    fn woken_meanwhile(&self) -> bool {
        self.shared.waking.load(Ordering::SeqCst) != 0 || !self.shared.queue.is_empty()
    }

    /// Runs the hook a unit test set to act just before the driver moves the clock
    /// (where another thread's `advance` could run), once.
    #[cfg(test)]
    fn run_before_fire_hook(&self) {
        let hook = lock(&self.shared.before_fire).take();
        if let Some(hook) = hook {
            hook();
        }
    }

    /// Spawns `future` as a task of this runtime's driver and returns its handle.
    ///
    /// The task runs only while a driver call runs ([`block_on`](Self::block_on),
    /// [`run`](Self::run), [`run_until`](Self::run_until), …). It need not be
    /// `Send`. Spawning from inside a task is fine. Dropping the [`JoinHandle`]
    /// detaches the task (it keeps running); [`JoinHandle::abort`] drops it.
    ///
    /// # Panics
    ///
    /// Tasks stay with the thread that spawned the first one: spawning on another
    /// thread afterwards panics with a message saying so.
    ///
    /// ```
    /// use std::rc::Rc;
    /// use std::time::Duration;
    /// use vantage_api_pool_testkit::VirtualRuntime;
    ///
    /// let rt = VirtualRuntime::new();
    /// let shared = Rc::new(41); // not Send: fine on this driver
    /// let task_rt = rt.clone();
    /// let handle = rt.spawn(async move {
    ///     task_rt.sleep(Duration::from_secs(1)).await;
    ///     *shared + 1
    /// });
    /// assert_eq!(rt.block_on(handle)?, 42);
    /// # Ok::<(), vantage_api_pool_testkit::DriveError>(())
    /// ```
    pub fn spawn<F>(&self, future: F) -> JoinHandle<F::Output>
    where
        F: Future + 'static,
        F::Output: 'static,
    {
        let current = current_thread();
        let home = *self.shared.home.get_or_init(|| current);
        assert!(
            home == current,
            "VirtualRuntime::spawn called on thread {current:?}, but this runtime's tasks \
             live on thread {home:?} (tasks need not be Send, so they stay on the thread \
             that spawned the first one); spawn and drive on that thread"
        );
        let join = Rc::new(JoinInner {
            state: RefCell::new(JoinState::Running(None)),
        });
        let guard = JoinGuard {
            join: Rc::clone(&join),
            done: false,
        };
        let task = async move {
            let mut guard = guard;
            let output = future.await;
            guard.complete(output);
        };
        match self.executor(true) {
            Some(executor) => {
                let key = executor.insert(Box::pin(task), &self.shared.queue);
                JoinHandle {
                    join,
                    executor: Rc::downgrade(&executor),
                    key,
                }
            }
            // Only while this thread is being torn down: nothing can run the task.
            None => JoinHandle {
                join,
                executor: Weak::new(),
                key: 0,
            },
        }
    }

    /// This runtime's executor on the current thread, created if `create`. Making
    /// one first takes out the entries of runtimes dropped on other threads, and
    /// drops their tasks (after the list is released: a task's `Drop` may spawn).
    fn executor(&self, create: bool) -> Option<Rc<Executor>> {
        let id = self.shared.id;
        let mut dead = Vec::new();
        let found = EXECUTORS
            .try_with(|list| {
                let mut list = list.borrow_mut();
                if let Some(entry) = list.iter().find(|entry| entry.id == id) {
                    return Some(Rc::clone(&entry.executor));
                }
                if !create {
                    return None;
                }
                let mut i = 0;
                while i < list.len() {
                    if list[i].runtime.strong_count() == 0 {
                        dead.push(list.swap_remove(i));
                    } else {
                        i += 1;
                    }
                }
                let executor = Rc::new(Executor::default());
                list.push(ExecutorEntry {
                    id,
                    runtime: Arc::downgrade(&self.shared),
                    executor: Rc::clone(&executor),
                });
                Some(executor)
            })
            .ok()
            .flatten();
        drop(dead);
        found
    }

    /// How many spawned tasks have not finished (nor been aborted). Tasks live on
    /// the thread that spawned them: asked from another thread, this is 0.
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool_testkit::VirtualRuntime;
    /// let rt = VirtualRuntime::new();
    /// let _h = rt.spawn(rt.sleep(Duration::from_secs(1)));
    /// assert_eq!(rt.live_tasks(), 1);
    /// rt.run()?;
    /// assert_eq!(rt.live_tasks(), 0);
    /// # Ok::<(), vantage_api_pool_testkit::DriveError>(())
    /// ```
    #[must_use]
    pub fn live_tasks(&self) -> usize {
        self.executor(false).map_or(0, |e| e.live.get())
    }

    /// Drops every spawned task that has not finished, running their `Drop`s now,
    /// and returns how many there were (a running task that already aborted itself
    /// is not counted again). Awaiting the [`JoinHandle`] of such a task
    /// panics. Only the calling thread's tasks (those it spawned): from another
    /// thread this drops nothing and returns 0.
    ///
    /// Tasks that never finish keep a clone of whatever they captured (often this
    /// runtime) alive until the thread ends; this frees them sooner, for example
    /// between the iterations of a benchmark.
    ///
    /// ```
    /// use vantage_api_pool_testkit::VirtualRuntime;
    /// let rt = VirtualRuntime::new();
    /// let _h = rt.spawn(std::future::pending::<()>());
    /// assert_eq!(rt.abort_all(), 1);
    /// assert_eq!(rt.live_tasks(), 0);
    /// ```
    pub fn abort_all(&self) -> usize {
        match self.executor(false) {
            Some(executor) => executor.abort_all(),
            None => 0,
        }
    }

    /// Runs `future` to completion on this runtime, together with every spawned task,
    /// moving virtual time whenever everything is parked. Returns as soon as
    /// `future` completes (spawned tasks that have not finished stay spawned).
    ///
    /// The driver assumes that whatever its tasks wait for is driven by it (timers,
    /// scripted sends, other tasks): a task waiting on a real thread or real I/O
    /// looks parked for good, and ends in [`DriveError::Deadlock`].
    ///
    /// # Errors
    ///
    /// * [`DriveError::Deadlock`]: `future` is not done, every task is parked and no
    ///   timer could fire (none is pending, or only ones at [`Instant::FAR_FUTURE`]),
    ///   so nothing could ever happen again.
    /// * [`DriveError::StepLimit`]: more polls than the step limit.
    /// * [`DriveError::TimeLimit`]: the next timer lies further than the time limit
    ///   ahead of where the clock stood as the call began.
    /// * [`DriveError::AlreadyDriving`]: called from inside a task, or while another
    ///   thread drives this runtime.
    /// * [`DriveError::WrongThread`]: this runtime's tasks live on another thread.
    ///
    /// ```
    /// use vantage_api_pool_testkit::{DriveError, VirtualRuntime};
    /// let rt = VirtualRuntime::new();
    /// assert_eq!(rt.block_on(async { 7 })?, 7);
    /// // A future that waits for nothing that could ever happen is a deadlock:
    /// let err = rt.block_on(std::future::pending::<()>()).unwrap_err();
    /// assert_eq!(err.to_string(), "deadlock at +0ns: 1 task parked and no timer to wait for");
    /// # Ok::<(), DriveError>(())
    /// ```
    pub fn block_on<F: Future>(&self, future: F) -> Result<F::Output, DriveError> {
        // The waker of the main future is reused from one block_on to the next (no
        // allocation per call) whenever no clone of it survived the previous call.
        // Not on a thread the runtime's tasks do not live on (`drive` says so): an
        // executor made there would only sit in that thread's list.
        let executor = match self.shared.home.get() {
            Some(&home) if home != current_thread() => None,
            _ => self.executor(true),
        };
        let (flag, waker) = executor
            .as_ref()
            .and_then(|e| e.main_waker.take())
            .filter(|(flag, _)| Arc::strong_count(flag) == 2)
            .unwrap_or_else(|| self.new_main_waker());
        // A wake left over from the previous block_on (dropped as stale by another
        // driver) may have left the flag set; cleared, this future's wakes queue it.
        // A duplicate queue entry only costs one extra poll.
        flag.queued.store(false, Ordering::Release);
        let key = flag.key.load(Ordering::Relaxed);
        let mut future = pin!(future);
        let mut output = None;
        let mut poll_main = |cx: &mut Context<'_>| match future.as_mut().poll(cx) {
            Poll::Ready(value) => {
                output = Some(value);
                true
            }
            Poll::Pending => false,
        };
        let main = Main {
            key,
            flag: &flag,
            waker: &waker,
            poll: &mut poll_main,
        };
        let driven = self.drive(Some(main), Until::MainDone);
        if let Some(executor) = &executor {
            executor.main_waker.set(Some((flag, waker)));
        }
        driven?;
        Ok(output.expect("the driver returns Ok only once the main future is done"))
    }

    fn new_main_waker(&self) -> (Arc<TaskWaker>, Waker) {
        let generation = self.shared.main_generation.fetch_add(1, Ordering::Relaxed);
        let flag = Arc::new(TaskWaker {
            queue: Arc::clone(&self.shared.queue),
            key: AtomicU64::new(task_key(MAIN_INDEX, generation)),
            queued: AtomicBool::new(false),
        });
        let waker = Waker::from(Arc::clone(&flag));
        (flag, waker)
    }

    /// Runs spawned tasks, moving virtual time whenever everything is parked, until
    /// every spawned task has finished.
    ///
    /// # Errors
    ///
    /// As [`block_on`](VirtualRuntime::block_on); a deadlock means some task waits
    /// for something that can never happen.
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool_testkit::VirtualRuntime;
    /// let rt = VirtualRuntime::new();
    /// for secs in [3, 1, 2] {
    ///     rt.spawn(rt.sleep(Duration::from_secs(secs))).detach();
    /// }
    /// rt.run()?;
    /// assert_eq!(rt.elapsed(), Duration::from_secs(3));
    /// # Ok::<(), vantage_api_pool_testkit::DriveError>(())
    /// ```
    pub fn run(&self) -> Result<(), DriveError> {
        self.drive(None, Until::AllTasksDone)
    }

    /// Polls spawned tasks until every one is parked, without moving time.
    ///
    /// # Errors
    ///
    /// [`DriveError::StepLimit`] (a task that keeps waking itself),
    /// [`DriveError::AlreadyDriving`] or [`DriveError::WrongThread`]; never a deadlock.
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool::Instant;
    /// use vantage_api_pool_testkit::VirtualRuntime;
    /// let rt = VirtualRuntime::new();
    /// let h = rt.spawn(rt.sleep(Duration::from_secs(1)));
    /// rt.run_until_idle()?;
    /// assert_eq!(rt.now(), Instant::ORIGIN); // time did not move
    /// assert!(!h.is_finished());
    /// # Ok::<(), vantage_api_pool_testkit::DriveError>(())
    /// ```
    pub fn run_until_idle(&self) -> Result<(), DriveError> {
        self.drive(None, Until::Idle)
    }

    /// Runs spawned tasks and moves virtual time, never past `deadline`, until every
    /// task is parked and no timer is due by `deadline`; then sets the clock to
    /// `deadline` (if it is later than now). Unfinished tasks stay spawned, and no
    /// deadlock is reported: the test decides what a quiet period means.
    ///
    /// # Errors
    ///
    /// [`DriveError::StepLimit`], [`DriveError::AlreadyDriving`] or
    /// [`DriveError::WrongThread`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool::Instant;
    /// use vantage_api_pool_testkit::VirtualRuntime;
    /// let rt = VirtualRuntime::new();
    /// let soon = rt.spawn(rt.sleep(Duration::from_secs(1)));
    /// let late = rt.spawn(rt.sleep(Duration::from_secs(10)));
    /// rt.run_until(Instant::ORIGIN + Duration::from_secs(5))?;
    /// assert!(soon.is_finished() && !late.is_finished());
    /// assert_eq!(rt.elapsed(), Duration::from_secs(5));
    /// # Ok::<(), vantage_api_pool_testkit::DriveError>(())
    /// ```
    pub fn run_until(&self, deadline: Instant) -> Result<(), DriveError> {
        self.drive(None, Until::Time(deadline))
    }

    /// [`run_until`](VirtualRuntime::run_until) `now + by`.
    ///
    /// # Errors
    ///
    /// As [`run_until`](VirtualRuntime::run_until).
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool_testkit::VirtualRuntime;
    /// let rt = VirtualRuntime::new();
    /// rt.run_for(Duration::from_secs(2))?;
    /// assert_eq!(rt.elapsed(), Duration::from_secs(2));
    /// # Ok::<(), vantage_api_pool_testkit::DriveError>(())
    /// ```
    pub fn run_for(&self, by: Duration) -> Result<(), DriveError> {
        let deadline = self.now().saturating_add(by);
        self.run_until(deadline)
    }

    /// The driver: polls woken tasks in FIFO order and, when none is woken, jumps
    /// the clock to the next timer.
    fn drive(&self, mut main: Option<Main<'_>>, until: Until) -> Result<(), DriveError> {
        let shared = &*self.shared;
        if let Some(&home) = shared.home.get() {
            let current = current_thread();
            if home != current {
                return Err(DriveError::WrongThread { home, current });
            }
        }
        if shared.driving.swap(true, Ordering::AcqRel) {
            return Err(DriveError::AlreadyDriving);
        }
        let _driving = DrivingGuard(&shared.driving);

        let limit = shared.step_limit.load(Ordering::Relaxed);
        let mut steps: u64 = 0;
        // The main future is polled first, straight away; afterwards only when woken.
        if let Some(main) = main.as_mut() {
            steps += 1;
            let mut cx = Context::from_waker(main.waker);
            if (main.poll)(&mut cx) {
                return Ok(());
            }
        }
        let mut executor = self.executor(false);
        let mut batch = Batch {
            queue: &shared.queue,
            keys: VecDeque::new(),
        };
        let mut foreign = Foreign {
            queue: &shared.queue,
            keys: VecDeque::new(),
        };
        let mut wakers: Vec<Waker> = Vec::new();
        // The clock moves no further than `until`'s own end, or for a call that has
        // none (block_on, run), than the time limit past where it stands now.
        let limit_nanos = shared.time_limit_nanos.load(Ordering::Relaxed);
        let time_limit = match until {
            Until::Time(t) => Some(t),
            Until::Idle => None,
            Until::MainDone | Until::AllTasksDone => match limit_nanos {
                u64::MAX => None,
                nanos => Some(self.now().saturating_add(Duration::from_nanos(nanos))),
            },
        };

        loop {
            if matches!(until, Until::AllTasksDone)
                && executor.as_ref().is_none_or(|e| e.live.get() == 0)
            {
                // A task spawned since we looked is in the queue; look again.
                executor = executor.or_else(|| self.executor(false));
                if executor.as_ref().is_none_or(|e| e.live.get() == 0) {
                    return Ok(());
                }
            }
            shared.queue.take_all(&mut batch.keys);
            if batch.keys.is_empty() {
                // An `advance` on another thread is between taking its timers and
                // waking their tasks: the queue is empty only for now.
                if shared.yield_to_wakes_in_transit() {
                    continue;
                }
                if matches!(until, Until::Idle) {
                    return Ok(());
                }
                let fired = self.fire_next(time_limit, &mut wakers);
                if let Fired::Some | Fired::LookAgain = fired {
                    continue;
                }
                if let Until::Time(t) = until {
                    {
                        #[cfg(test)]
                        self.run_before_fire_hook();
                        let mut clock = lock(&shared.clock);
                        if self.woken_meanwhile() {
                            continue;
                        }
                        self.move_clock(&mut clock, t, &mut wakers);
                    }
                    for waker in wakers.drain(..) {
                        waker.wake();
                    }
                    return Ok(());
                }
                // An `advance` on another thread may have taken the timers just
                // looked for: wait for its wakes, then look at the queue (in this
                // order: its wakes reach the queue before `waking` falls).
                if shared.yield_to_wakes_in_transit() {
                    continue;
                }
                if !shared.queue.is_empty() {
                    continue; // woken from another thread just now
                }
                if let Fired::Beyond = fired {
                    return Err(DriveError::TimeLimit {
                        limit: Duration::from_nanos(limit_nanos),
                        now: self.now(),
                    });
                }
                let live = executor
                    .as_ref()
                    .or(self.executor(false).as_ref())
                    .map_or(0, |e| e.live.get());
                return Err(DriveError::Deadlock {
                    now: self.now(),
                    parked_tasks: live + usize::from(main.is_some()),
                });
            }
            while let Some(key) = batch.keys.pop_front() {
                // Stale keys (an earlier block_on's, a finished or aborted task's, a
                // task already running) are skipped before the limit is looked at:
                // only a poll that would happen counts.
                let is_main = main.as_ref().is_some_and(|main| main.key == key);
                let mut taken = None;
                if !is_main {
                    if key_parts(key).0 == MAIN_INDEX {
                        continue; // a stale wake of an earlier block_on
                    }
                    if executor.is_none() {
                        executor = self.executor(false);
                    }
                    let Some(task) = executor.as_ref().and_then(|e| e.take(key)) else {
                        if shared
                            .home
                            .get()
                            .is_some_and(|&home| home != current_thread())
                        {
                            // A task another thread spawned first while this driver
                            // ran (binding the runtime to that thread): its key
                            // waits for that thread's driver.
                            foreign.keys.push_back(key);
                        }
                        continue;
                    };
                    taken = Some(task);
                }
                if steps >= limit {
                    if let (Some(executor), Some(task)) = (&executor, taken) {
                        executor.put_back(task);
                    }
                    batch.keys.push_front(key);
                    self.requeue_front(&mut batch.keys);
                    return Err(DriveError::StepLimit {
                        limit,
                        now: self.now(),
                    });
                }
                if let Some(main) = main.as_mut()
                    && is_main
                {
                    steps += 1;
                    main.flag.queued.store(false, Ordering::Release);
                    let mut cx = Context::from_waker(main.waker);
                    if (main.poll)(&mut cx) {
                        self.requeue_front(&mut batch.keys);
                        return Ok(());
                    }
                    continue;
                }
                if let (Some(executor), Some(task)) = (&executor, taken) {
                    steps += 1;
                    executor.poll_taken(task);
                }
            }
        }
    }

    /// Puts unprocessed keys back at the front of the shared queue, keeping order.
    fn requeue_front(&self, batch: &mut VecDeque<u64>) {
        self.shared.queue.requeue_front(batch);
    }
}

/// The keys the driver took off the queue to poll in turn. If a poll panics, the
/// keys not polled yet go back to the front of the queue: their tasks are marked
/// queued, so no later wake would queue them again and the next run would see a
/// deadlock that is not there.
struct Batch<'q> {
    queue: &'q ReadyQueue,
    keys: VecDeque<u64>,
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.queue.requeue_front(&mut self.keys);
        }
    }
}

/// The keys of tasks another thread spawned while a driver with no task of its own
/// ran on this one (the first spawn binds the runtime to its thread, so that
/// driver's own start checked nothing). Polling them here is impossible (their
/// executor is that thread's) and dropping them would lose them: they are marked
/// queued, so no later wake would queue them again. They go back to the queue when
/// the driver ends, for the thread they belong to.
struct Foreign<'q> {
    queue: &'q ReadyQueue,
    keys: VecDeque<u64>,
}

impl Drop for Foreign<'_> {
    fn drop(&mut self) {
        self.queue.requeue_front(&mut self.keys);
    }
}

impl SendRuntime for VirtualRuntime {
    fn now(&self) -> Instant {
        VirtualRuntime::now(self)
    }

    fn wall_clock(&self) -> SystemTime {
        VirtualRuntime::wall_clock(self)
    }

    /// Same timer as [`VirtualRuntime::sleep_until`], borrowing the runtime.
    fn sleep_until(&self, deadline: Instant) -> impl Future<Output = ()> + Send {
        SleepRef {
            core: TimerCore::until(&self.shared, deadline),
            shared: &self.shared,
        }
    }

    /// Same timer as [`VirtualRuntime::sleep`], borrowing the runtime.
    fn sleep(&self, duration: Duration) -> impl Future<Output = ()> + Send {
        self.sleep_ref(duration)
    }

    fn random(&self) -> f64 {
        VirtualRuntime::random(self)
    }
}

enum Fired {
    /// A timer fired: the clock moved to it.
    Some,
    /// No timer could ever fire (none, or only ones at `FAR_FUTURE`).
    Nothing,
    /// The next timer lies past the limit given.
    Beyond,
    /// A task was woken meanwhile: the clock did not move; run it first.
    LookAgain,
}

#[derive(Clone, Copy)]
enum Until {
    MainDone,
    AllTasksDone,
    Idle,
    Time(Instant),
}

/// The future of `block_on`, seen by the driver.
struct Main<'a> {
    key: u64,
    flag: &'a Arc<TaskWaker>,
    waker: &'a Waker,
    poll: &'a mut dyn FnMut(&mut Context<'_>) -> bool,
}

struct DrivingGuard<'a>(&'a AtomicBool);

impl Drop for DrivingGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The future of [`VirtualRuntime::sleep`] and [`VirtualRuntime::sleep_until`]:
/// completes when the virtual clock reaches its deadline.
///
/// Its timer is registered when the future is created, and removed when it fires or
/// when the future is dropped; a dropped sleep never holds time back.
///
/// Only this runtime's drivers and [`VirtualRuntime::advance`] move its clock: a
/// sleep awaited on some other executor, with nothing driving the runtime, waits
/// forever. Await it on the runtime's own driver.
///
/// ```
/// use std::time::Duration;
/// use vantage_api_pool_testkit::{Sleep, VirtualRuntime};
///
/// let rt = VirtualRuntime::new();
/// let sleep: Sleep = rt.sleep(Duration::from_secs(1));
/// assert_eq!(sleep.deadline(), rt.now() + Duration::from_secs(1));
/// assert!(!sleep.is_elapsed());
/// rt.block_on(sleep)?;
/// # Ok::<(), vantage_api_pool_testkit::DriveError>(())
/// ```
#[must_use = "a sleep does nothing unless awaited"]
pub struct Sleep {
    shared: Arc<Shared>,
    core: TimerCore,
}

impl Sleep {
    /// When this sleep ends.
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool::Instant;
    /// use vantage_api_pool_testkit::VirtualRuntime;
    /// let rt = VirtualRuntime::new();
    /// let at = Instant::ORIGIN + Duration::from_secs(3);
    /// assert_eq!(rt.sleep_until(at).deadline(), at);
    /// ```
    #[must_use]
    pub fn deadline(&self) -> Instant {
        self.core.deadline
    }

    /// Whether the clock has reached the deadline.
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool_testkit::VirtualRuntime;
    /// let rt = VirtualRuntime::new();
    /// let sleep = rt.sleep(Duration::from_secs(1));
    /// rt.advance(Duration::from_secs(1));
    /// assert!(sleep.is_elapsed());
    /// ```
    #[must_use]
    pub fn is_elapsed(&self) -> bool {
        self.core.timer.is_none() || self.shared.now() >= self.core.deadline
    }
}

impl fmt::Debug for Sleep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sleep")
            .field("deadline", &self.core.deadline)
            .field("seq", &self.core.timer.map(|t| t.seq))
            .finish_non_exhaustive()
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        this.core.poll(&this.shared, cx)
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        self.core.cancel(&self.shared);
    }
}

/// [`Sleep`] borrowing its runtime: the same timer without reference counting.
pub(crate) struct SleepRef<'a> {
    shared: &'a Shared,
    core: TimerCore,
}

impl Future for SleepRef<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        this.core.poll(this.shared, cx)
    }
}

impl Drop for SleepRef<'_> {
    fn drop(&mut self) {
        self.core.cancel(self.shared);
    }
}

/// The timer behind a sleep; its owner supplies the runtime state.
struct TimerCore {
    deadline: Instant,
    /// `None` once the sleep is over (or if it never needed a timer).
    timer: Option<TimerId>,
    /// Counted in [`Shared::undriven_sleeps`] already.
    undriven: bool,
}

impl TimerCore {
    /// Registers a timer for `deadline` now, unless it is already due.
    fn until(shared: &Shared, deadline: Instant) -> TimerCore {
        let mut clock = lock(&shared.clock);
        let timer = (deadline > clock.now).then(|| clock.timers.insert(deadline));
        TimerCore {
            deadline,
            timer,
            undriven: false,
        }
    }

    /// Registers a timer `duration` after now (one lock for both).
    fn after(shared: &Shared, duration: Duration) -> TimerCore {
        let mut clock = lock(&shared.clock);
        let deadline = clock.now.saturating_add(duration);
        let timer = (deadline > clock.now).then(|| clock.timers.insert(deadline));
        TimerCore {
            deadline,
            timer,
            undriven: false,
        }
    }

    fn poll(&mut self, shared: &Shared, cx: &mut Context<'_>) -> Poll<()> {
        let Some(timer) = self.timer else {
            return Poll::Ready(());
        };
        // Lock-free fast path: once the clock is past the deadline, the timer has
        // been taken out of the set by whoever moved the clock.
        if shared.now() >= self.deadline {
            self.timer = None;
            return Poll::Ready(());
        }
        let mut clock = lock(&shared.clock);
        if clock.now >= self.deadline {
            drop(clock);
            self.timer = None;
            return Poll::Ready(());
        }
        // The new waker is cloned under the lock (a clone that reaches back into the
        // runtime would be a waker of its own making); the one it replaces is dropped
        // after.
        let replaced = match clock.timers.waker_mut(timer) {
            Some(Some(waker)) if waker.will_wake(cx.waker()) => None,
            Some(slot) => slot.replace(cx.waker().clone()),
            // Unreachable in practice (a timer leaves the set only by firing, which
            // moves the clock past it, or by drop); re-register rather than hang.
            None => {
                let timer = clock.timers.insert(self.deadline);
                if let Some(slot) = clock.timers.waker_mut(timer) {
                    *slot = Some(cx.waker().clone());
                }
                self.timer = Some(timer);
                None
            }
        };
        // A replaced waker is dropped once the lock is released: its drop may run
        // anything, a sleep's drop on this runtime included.
        drop(clock);
        drop(replaced);
        if !self.undriven && !shared.driving.load(Ordering::Acquire) {
            self.undriven = true;
            shared.sleep_polled_undriven();
        }
        Poll::Pending
    }

    fn cancel(&mut self, shared: &Shared) {
        if let Some(timer) = self.timer.take() {
            // The lock is released at the end of this statement, before the waker
            // it hands back is dropped.
            let waker = lock(&shared.clock).timers.remove(timer);
            drop(waker);
        }
    }
}

/// Why a driver call ([`VirtualRuntime::block_on`], [`run`](VirtualRuntime::run), …)
/// stopped without finishing.
///
/// ```
/// use vantage_api_pool_testkit::{DriveError, VirtualRuntime};
/// let rt = VirtualRuntime::new();
/// let _stuck = rt.spawn(std::future::pending::<()>());
/// match rt.run() {
///     Err(DriveError::Deadlock { parked_tasks, .. }) => assert_eq!(parked_tasks, 1),
///     other => panic!("expected a deadlock, got {other:?}"),
/// }
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriveError {
    /// Every task is parked, the work is not done, and no timer could fire (none is
    /// pending, or only ones at [`Instant::FAR_FUTURE`], which never comes): nothing
    /// can ever happen again.
    Deadlock {
        /// The virtual time at which it was detected.
        now: Instant,
        /// Tasks parked (the future of `block_on` counts as one).
        parked_tasks: usize,
    },
    /// The driver polled `limit` times without finishing: probably a task that wakes
    /// itself forever, or a loop that never ends.
    StepLimit {
        /// The limit reached ([`VirtualRuntime::with_step_limit`]).
        limit: u64,
        /// The virtual time at which it stopped.
        now: Instant,
    },
    /// The next timer lies further than the time limit
    /// ([`VirtualRuntime::with_time_limit`]) past where the clock stood when the
    /// driver call began: probably a call that retries forever. The clock is left at
    /// `now`; the tasks stay as they were, and another driver call goes on from there.
    TimeLimit {
        /// The limit reached.
        limit: Duration,
        /// The virtual time at which it stopped.
        now: Instant,
    },
    /// The runtime is already being driven: a driver call from inside a task, or
    /// from a second thread at the same time.
    AlreadyDriving,
    /// This runtime's tasks live on another thread (see [`VirtualRuntime::spawn`]).
    WrongThread {
        /// The thread the tasks live on.
        home: ThreadId,
        /// The thread that tried to drive them.
        current: ThreadId,
    },
}

impl fmt::Display for DriveError {
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool::Instant;
    /// use vantage_api_pool_testkit::DriveError;
    /// let e = DriveError::Deadlock {
    ///     now: Instant::ORIGIN + Duration::from_millis(12_500),
    ///     parked_tasks: 3,
    /// };
    /// assert_eq!(e.to_string(), "deadlock at +12.5s: 3 tasks parked and no timer to wait for");
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DriveError::Deadlock { now, parked_tasks } => {
                let plural = if *parked_tasks == 1 { "" } else { "s" };
                write!(
                    f,
                    "deadlock at +{:?}: {parked_tasks} task{plural} parked and no timer to wait for",
                    now.since_origin()
                )
            }
            DriveError::StepLimit { limit, now } => write!(
                f,
                "step limit of {limit} polls reached at +{:?} without finishing \
                 (a task that wakes itself forever? raise it with VirtualRuntime::with_step_limit)",
                now.since_origin()
            ),
            DriveError::TimeLimit { limit, now } => write!(
                f,
                "time limit of {limit:?} reached at +{:?}: the next timer lies beyond it \
                 (a call that retries forever? raise it with VirtualRuntime::with_time_limit)",
                now.since_origin()
            ),
            DriveError::AlreadyDriving => f.write_str(
                "this VirtualRuntime is already being driven (a driver call from inside a task, \
                 or from two threads at once)",
            ),
            DriveError::WrongThread { home, current } => write!(
                f,
                "this VirtualRuntime's tasks live on thread {home:?}, not on {current:?}: \
                 drive it on the thread that spawned them"
            ),
        }
    }
}

impl std::error::Error for DriveError {}

type TaskFuture = Pin<Box<dyn Future<Output = ()>>>;

struct Task {
    future: TaskFuture,
    flag: Arc<TaskWaker>,
    waker: Waker,
}

/// A task taken out of its slot (now marked running) to be polled.
struct Taken {
    index: u32,
    task: Task,
}

enum SlotState {
    Vacant,
    Idle(Task),
    Running { aborted: bool },
}

struct Slot {
    generation: u32,
    state: SlotState,
    /// The waker of the slot's last task, reused by the next one when no clone of
    /// it survived (spawning then allocates no waker).
    spare: Option<(Arc<TaskWaker>, Waker)>,
}

/// The spawned tasks of one runtime on one thread.
#[derive(Default)]
struct Executor {
    slots: RefCell<Vec<Slot>>,
    free: RefCell<Vec<u32>>,
    live: Cell<usize>,
    /// The waker of `block_on`'s future, kept for the next call.
    main_waker: Cell<Option<(Arc<TaskWaker>, Waker)>>,
}

impl Executor {
    fn insert(&self, future: TaskFuture, queue: &Arc<ReadyQueue>) -> u64 {
        let mut slots = self.slots.borrow_mut();
        let index = match self.free.borrow_mut().pop() {
            Some(index) => index,
            None => {
                let index = u32::try_from(slots.len())
                    .ok()
                    .filter(|&i| i != MAIN_INDEX)
                    .expect("more than 4 billion live tasks on one VirtualRuntime");
                slots.push(Slot {
                    generation: 0,
                    state: SlotState::Vacant,
                    spare: None,
                });
                index
            }
        };
        let slot = &mut slots[index as usize];
        let key = task_key(index, slot.generation);
        let (flag, waker) = match slot.spare.take() {
            // Only the slot holds it (the Arc and the Waker's clone): nobody can wake
            // it with the old key any more, so it can take the new one.
            Some((flag, waker)) if Arc::strong_count(&flag) == 2 => {
                flag.key.store(key, Ordering::Relaxed);
                flag.queued.store(true, Ordering::Release);
                (flag, waker)
            }
            _ => {
                let flag = Arc::new(TaskWaker {
                    queue: Arc::clone(queue),
                    key: AtomicU64::new(key),
                    queued: AtomicBool::new(true),
                });
                let waker = Waker::from(Arc::clone(&flag));
                (flag, waker)
            }
        };
        slot.state = SlotState::Idle(Task {
            future,
            flag,
            waker,
        });
        self.live.set(self.live.get() + 1);
        drop(slots);
        queue.push(key);
        key
    }

    /// Frees the slot of `task`, keeping its waker for the next task; returns the
    /// future, to be dropped once no borrow is held (its Drop may spawn).
    fn retire(&self, slot: &mut Slot, index: u32, task: Task) -> TaskFuture {
        self.vacate(slot, index);
        slot.spare = Some((task.flag, task.waker));
        task.future
    }

    /// Frees a slot whose task is gone.
    fn vacate(&self, slot: &mut Slot, index: u32) {
        slot.state = SlotState::Vacant;
        slot.generation = slot.generation.wrapping_add(1);
        self.free.borrow_mut().push(index);
        self.live.set(self.live.get() - 1);
    }

    /// Takes the task with `key` out of its slot to be polled, marking the slot
    /// running; `None` for a stale key (its slot holds another generation, or a task
    /// that is running or gone).
    fn take(&self, key: u64) -> Option<Taken> {
        let (index, generation) = key_parts(key);
        let mut slots = self.slots.borrow_mut();
        let slot = slots.get_mut(index as usize)?;
        if slot.generation != generation {
            return None;
        }
        match std::mem::replace(&mut slot.state, SlotState::Running { aborted: false }) {
            SlotState::Idle(task) => Some(Taken { index, task }),
            other => {
                slot.state = other;
                None
            }
        }
    }

    /// Puts back a task taken but not polled (the step limit came first).
    fn put_back(&self, taken: Taken) {
        self.slots.borrow_mut()[taken.index as usize].state = SlotState::Idle(taken.task);
    }

    /// Polls a task [`take`](Executor::take) gave, then puts it back or retires it.
    fn poll_taken(&self, taken: Taken) {
        let Taken { index, mut task } = taken;
        task.flag.queued.store(false, Ordering::Release);
        // Should the task panic, its slot must not stay `Running` forever.
        let mut unwinding = VacateOnUnwind {
            executor: self,
            index,
            armed: true,
        };
        let mut cx = Context::from_waker(&task.waker);
        let done = task.future.as_mut().poll(&mut cx).is_ready();
        unwinding.armed = false;
        let finished = {
            let mut slots = self.slots.borrow_mut();
            let slot = &mut slots[index as usize];
            if done || matches!(slot.state, SlotState::Running { aborted: true }) {
                Some(self.retire(slot, index, task))
            } else {
                slot.state = SlotState::Idle(task);
                None
            }
        };
        // Dropped outside the borrow: a task's Drop may spawn.
        drop(finished);
    }

    /// Drops the task with `key` now (or, if it is running, right after its poll).
    fn abort(&self, key: u64) {
        let (index, generation) = key_parts(key);
        let task = {
            let mut slots = self.slots.borrow_mut();
            let Some(slot) = slots.get_mut(index as usize) else {
                return;
            };
            if slot.generation != generation {
                return;
            }
            match std::mem::replace(&mut slot.state, SlotState::Vacant) {
                SlotState::Idle(task) => self.retire(slot, index, task),
                SlotState::Running { .. } => {
                    slot.state = SlotState::Running { aborted: true };
                    return;
                }
                SlotState::Vacant => return,
            }
        };
        drop(task);
    }

    fn abort_all(&self) -> usize {
        let mut running = 0;
        let tasks: Vec<TaskFuture> = {
            let mut slots = self.slots.borrow_mut();
            let mut tasks = Vec::new();
            for (index, slot) in slots.iter_mut().enumerate() {
                match std::mem::replace(&mut slot.state, SlotState::Vacant) {
                    SlotState::Idle(task) => {
                        let index = u32::try_from(index).expect("slot indices fit in u32");
                        tasks.push(self.retire(slot, index, task));
                    }
                    SlotState::Running { aborted } => {
                        running += usize::from(!aborted);
                        slot.state = SlotState::Running { aborted: true };
                    }
                    SlotState::Vacant => {}
                }
            }
            tasks
        };
        let aborted = tasks.len() + running;
        // Dropped outside the borrow: a task's Drop may spawn or abort.
        drop(tasks);
        aborted
    }
}

/// Frees the slot of a task whose poll panicked.
struct VacateOnUnwind<'a> {
    executor: &'a Executor,
    index: u32,
    armed: bool,
}

impl Drop for VacateOnUnwind<'_> {
    fn drop(&mut self) {
        if self.armed
            && let Ok(mut slots) = self.executor.slots.try_borrow_mut()
            && let Some(slot) = slots.get_mut(self.index as usize)
        {
            self.executor.vacate(slot, self.index);
        }
    }
}

/// The shared completion state of a spawned task.
struct JoinInner<T> {
    state: RefCell<JoinState<T>>,
}

enum JoinState<T> {
    /// Not finished; the waker of whoever awaits the handle.
    Running(Option<Waker>),
    Finished(T),
    Taken,
    Aborted,
}

/// Lives inside the task's future: publishes its output, or its abortion on drop.
struct JoinGuard<T> {
    join: Rc<JoinInner<T>>,
    done: bool,
}

impl<T> JoinGuard<T> {
    fn complete(&mut self, output: T) {
        self.done = true;
        let previous = self.join.state.replace(JoinState::Finished(output));
        if let JoinState::Running(Some(waker)) = previous {
            waker.wake();
        }
    }
}

impl<T> Drop for JoinGuard<T> {
    fn drop(&mut self) {
        if !self.done {
            let previous = self.join.state.replace(JoinState::Aborted);
            if let JoinState::Running(Some(waker)) = previous {
                waker.wake();
            }
        }
    }
}

/// The handle of a task spawned with [`VirtualRuntime::spawn`]: a future of the
/// task's output.
///
/// Dropping the handle detaches the task: it keeps running. [`abort`](JoinHandle::abort)
/// drops the task's future instead, which is how a test drops a caller mid-flight.
/// Not `Send` (the task it refers to need not be).
///
/// # Panics
///
/// Awaiting a handle again after it returned its output panics, and so does awaiting
/// the handle of a task dropped by [`VirtualRuntime::abort_all`] or by its own panic.
///
/// ```
/// use vantage_api_pool_testkit::VirtualRuntime;
/// let rt = VirtualRuntime::new();
/// let handle = rt.spawn(async { "done" });
/// assert!(!handle.is_finished());
/// assert_eq!(rt.block_on(handle)?, "done");
/// # Ok::<(), vantage_api_pool_testkit::DriveError>(())
/// ```
#[must_use = "dropping a JoinHandle detaches its task; call abort() to cancel it"]
pub struct JoinHandle<T> {
    join: Rc<JoinInner<T>>,
    executor: Weak<Executor>,
    key: u64,
}

impl<T> JoinHandle<T> {
    /// Whether the task has finished (its output is waiting in the handle, or was
    /// already taken by awaiting it).
    ///
    /// ```
    /// use vantage_api_pool_testkit::VirtualRuntime;
    /// let rt = VirtualRuntime::new();
    /// let handle = rt.spawn(async {});
    /// rt.run()?;
    /// assert!(handle.is_finished());
    /// # Ok::<(), vantage_api_pool_testkit::DriveError>(())
    /// ```
    #[must_use]
    pub fn is_finished(&self) -> bool {
        matches!(
            *self.join.state.borrow(),
            JoinState::Finished(_) | JoinState::Taken
        )
    }

    /// Drops the task's future now, synchronously, so its `Drop` (and the `Drop` of
    /// everything it holds: sleeps, sends, permits) runs before this returns. If the
    /// task is the one running (it aborts itself), it is dropped right after its
    /// current poll. Aborting a finished task does nothing.
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool_testkit::VirtualRuntime;
    ///
    /// let rt = VirtualRuntime::new();
    /// let handle = rt.spawn(rt.sleep(Duration::from_secs(60)));
    /// rt.run_until_idle()?;
    /// assert_eq!(rt.pending_timers(), 1);
    /// handle.abort();
    /// // The sleep was dropped with the task, so its timer is gone.
    /// assert_eq!(rt.pending_timers(), 0);
    /// assert_eq!(rt.live_tasks(), 0);
    /// # Ok::<(), vantage_api_pool_testkit::DriveError>(())
    /// ```
    pub fn abort(self) {
        if let Some(executor) = self.executor.upgrade() {
            executor.abort(self.key);
        }
    }
}

impl<T> JoinHandle<T> {
    /// Lets the task run on without a handle: the same as dropping the handle, but
    /// says so (and keeps `clippy::let_underscore_future` quiet).
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool_testkit::VirtualRuntime;
    /// let rt = VirtualRuntime::new();
    /// rt.spawn(rt.sleep(Duration::from_secs(1))).detach();
    /// rt.run()?;
    /// assert_eq!(rt.elapsed(), Duration::from_secs(1));
    /// # Ok::<(), vantage_api_pool_testkit::DriveError>(())
    /// ```
    pub fn detach(self) {}
}

impl<T> fmt::Debug for JoinHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinHandle")
            .field("finished", &self.is_finished())
            .finish_non_exhaustive()
    }
}

impl<T> Future for JoinHandle<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let mut state = self.join.state.borrow_mut();
        match std::mem::replace(&mut *state, JoinState::Taken) {
            JoinState::Finished(output) => Poll::Ready(output),
            JoinState::Running(waker) => {
                let waker = match waker {
                    Some(w) if w.will_wake(cx.waker()) => w,
                    _ => cx.waker().clone(),
                };
                *state = JoinState::Running(Some(waker));
                Poll::Pending
            }
            JoinState::Taken => panic!("JoinHandle polled again after it returned its output"),
            JoinState::Aborted => {
                *state = JoinState::Aborted;
                panic!(
                    "JoinHandle awaited, but its task was dropped before finishing \
                     (by VirtualRuntime::abort_all, or because it panicked)"
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Does what an `advance` by one second on another thread does before its
    /// wakes: takes the one timer due and counts its wake as in transit. The
    /// returned thread makes the wake once a driver waits for it, or returns
    /// without it once `done` is set (a driver that gave up without waiting).
    fn advance_with_its_wake_in_transit(
        rt: &VirtualRuntime,
        done: &Arc<AtomicBool>,
    ) -> std::thread::JoinHandle<()> {
        let mut wakers = Vec::new();
        {
            let mut clock = lock(&rt.shared.clock);
            let target = clock.now.saturating_add(Duration::from_secs(1));
            rt.move_clock(&mut clock, target, &mut wakers);
            rt.shared.waking.fetch_add(1, Ordering::SeqCst);
        }
        assert_eq!(wakers.len(), 1);
        let (shared, done) = (Arc::clone(&rt.shared), Arc::clone(done));
        std::thread::spawn(move || {
            let _woken = WakingGuard(&shared.waking);
            while shared.waited_for_wakes.load(Ordering::SeqCst) == 0 {
                if done.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::yield_now();
            }
            for waker in wakers {
                waker.wake();
            }
        })
    }

    /// The race of an `advance` on another thread, made to happen every time: the
    /// due timer is taken (as `advance` does under the clock lock) and its wake
    /// made only once the driver has found nothing else to do and waits.
    #[test]
    fn a_driver_waits_for_the_wakes_an_advance_has_not_made_yet() {
        let rt = VirtualRuntime::new();
        let sleeper = rt.clone();
        let handle = rt.spawn(async move { sleeper.sleep(Duration::from_secs(1)).await });
        rt.run_until_idle().unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let waker_thread = advance_with_its_wake_in_transit(&rt, &done);
        let result = rt.run();
        done.store(true, Ordering::SeqCst);
        waker_thread.join().unwrap();
        assert_eq!(result, Ok(()));
        assert!(handle.is_finished());
    }

    /// A task that sleeps one second and returns when it woke, beside a detached one
    /// sleeping five, both parked.
    fn sleeping_one_second_with_a_later_timer(rt: &VirtualRuntime) -> JoinHandle<Duration> {
        let sleeper = rt.clone();
        let first = rt.spawn(async move {
            sleeper.sleep(Duration::from_secs(1)).await;
            sleeper.elapsed()
        });
        let later = rt.clone();
        rt.spawn(async move { later.sleep(Duration::from_secs(5)).await })
            .detach();
        rt.run_until_idle().unwrap();
        first
    }

    /// As above, with a later timer: the driver waits for the wake in transit before
    /// it looks for the next timer, so the woken task runs at the time it was due.
    #[test]
    fn a_wake_in_transit_runs_before_the_clock_moves_to_a_later_timer() {
        let rt = VirtualRuntime::new();
        let first = sleeping_one_second_with_a_later_timer(&rt);
        let done = Arc::new(AtomicBool::new(false));
        let waker_thread = advance_with_its_wake_in_transit(&rt, &done);
        let woke_at = rt.block_on(first);
        done.store(true, Ordering::SeqCst);
        waker_thread.join().unwrap();
        assert_eq!(
            woke_at,
            Ok(Duration::from_secs(1)),
            "the clock jumped ahead"
        );
        assert_eq!(rt.run(), Ok(()));
        assert_eq!(rt.elapsed(), Duration::from_secs(5));
    }

    /// Sets what runs just before the driver next moves the clock, once.
    fn before_the_clock_moves(rt: &VirtualRuntime, hook: impl FnOnce() + Send + 'static) {
        *lock(&rt.shared.before_fire) = Some(Box::new(hook));
    }

    /// Another thread's `advance` made wholly between the driver finding no task
    /// woken and its move to the next timer: the task it woke runs at the time it
    /// was woken, not after the later timer.
    #[test]
    fn a_wake_made_just_before_the_clock_moves_runs_before_a_later_timer() {
        let rt = VirtualRuntime::new();
        let first = sleeping_one_second_with_a_later_timer(&rt);
        let advancer = rt.clone();
        before_the_clock_moves(&rt, move || advancer.advance(Duration::from_secs(1)));
        assert_eq!(
            rt.block_on(first),
            Ok(Duration::from_secs(1)),
            "the clock jumped ahead"
        );
        assert_eq!(rt.run(), Ok(()));
        assert_eq!(rt.elapsed(), Duration::from_secs(5));
    }

    /// An `advance` on another thread that takes its timer, just before the driver
    /// moves the clock, and has not woken its task yet: the driver waits for that
    /// wake and runs the task at the time it was due, not after the later timer.
    #[test]
    fn a_wake_in_transit_made_just_before_the_clock_moves_runs_first() {
        let rt = VirtualRuntime::new();
        let first = sleeping_one_second_with_a_later_timer(&rt);
        let done = Arc::new(AtomicBool::new(false));
        let waker_thread = Arc::new(Mutex::new(None));
        let (advancer, advance_done, slot) =
            (rt.clone(), Arc::clone(&done), Arc::clone(&waker_thread));
        before_the_clock_moves(&rt, move || {
            *lock(&slot) = Some(advance_with_its_wake_in_transit(&advancer, &advance_done));
        });
        let woke_at = rt.block_on(first);
        done.store(true, Ordering::SeqCst);
        let waker_thread = lock(&waker_thread).take();
        waker_thread.expect("the hook ran").join().unwrap();
        assert_eq!(
            woke_at,
            Ok(Duration::from_secs(1)),
            "the clock jumped ahead"
        );
    }

    /// The same for `run_until`'s last move, to its end: a task woken from another
    /// thread just before it runs at the time it was woken, before `run_until`
    /// returns.
    #[test]
    fn a_wake_made_just_before_run_until_moves_to_its_end_runs_first() {
        let rt = VirtualRuntime::new();
        let (tx, rx) = futures::channel::oneshot::channel::<()>();
        let waiter = rt.clone();
        let task = rt.spawn(async move {
            rx.await.unwrap();
            waiter.elapsed()
        });
        rt.run_until_idle().unwrap();
        // The first look for a timer finds none; the wake comes just before the
        // move to the end.
        let again = rt.clone();
        before_the_clock_moves(&rt, move || {
            before_the_clock_moves(&again, move || tx.send(()).unwrap());
        });
        rt.run_until(Instant::from_origin(Duration::from_secs(10)))
            .unwrap();
        assert!(task.is_finished(), "run_until returned with a woken task");
        assert_eq!(rt.block_on(task), Ok(Duration::ZERO));
        assert_eq!(rt.elapsed(), Duration::from_secs(10));
    }

    /// A first spawn on another thread while a driver with no task of its own runs
    /// here: that driver leaves the task's key alone (the task lives on the other
    /// thread), and the other thread's driver runs the task.
    #[test]
    fn a_task_spawned_first_on_another_thread_while_a_driver_runs_is_not_lost() {
        let rt = VirtualRuntime::new();
        let running = Arc::new(AtomicBool::new(false));
        let spawned = Arc::new(AtomicBool::new(false));
        let driver_done = Arc::new(AtomicBool::new(false));
        let other = {
            let (rt, running, spawned, driver_done) = (
                rt.clone(),
                Arc::clone(&running),
                Arc::clone(&spawned),
                Arc::clone(&driver_done),
            );
            std::thread::spawn(move || {
                while !running.load(Ordering::SeqCst) {
                    std::thread::yield_now();
                }
                let task = rt.spawn(async { 42 });
                spawned.store(true, Ordering::SeqCst);
                while !driver_done.load(Ordering::SeqCst) {
                    std::thread::yield_now();
                }
                rt.block_on(task)
            })
        };
        // The driver here spins until the spawn is made, then polls once more, so
        // it has taken the task's key off the queue before it returns.
        let mut seen = false;
        let here = rt.block_on(std::future::poll_fn(|cx| {
            running.store(true, Ordering::SeqCst);
            if seen {
                return Poll::Ready(());
            }
            seen = spawned.load(Ordering::SeqCst);
            cx.waker().wake_by_ref();
            Poll::Pending
        }));
        driver_done.store(true, Ordering::SeqCst);
        assert_eq!(here, Ok(()));
        assert_eq!(other.join().unwrap(), Ok(42));
    }
}
