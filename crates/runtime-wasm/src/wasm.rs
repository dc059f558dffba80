//! The runtime on JavaScript's clocks and timers.

use std::cell::Cell;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime};

use vantage_api_pool::{Instant, Runtime};
use wasm_bindgen::JsValue;
use wasm_bindgen::prelude::{Closure, wasm_bindgen};

#[wasm_bindgen]
extern "C" {
    /// `performance.now()`: milliseconds on a monotonic clock.
    #[wasm_bindgen(js_namespace = performance, js_name = now)]
    fn performance_now() -> f64;

    /// `setTimeout(handler, ms)`: a number in browsers, a `Timeout` object in Node.
    #[wasm_bindgen(js_name = setTimeout)]
    fn set_timeout(handler: &Closure<dyn FnMut()>, ms: i32) -> JsValue;

    /// `clearTimeout(handle)`; harmless on a timer that already fired.
    #[wasm_bindgen(js_name = clearTimeout)]
    fn clear_timeout(handle: &JsValue);
}

/// The longest delay `setTimeout` takes (2^31 - 1 ms, about 24.8 days); longer ones
/// fire at once in browsers and Node, so longer sleeps re-arm in steps.
const MAX_TIMEOUT_MS: u128 = i32::MAX as u128;

/// The [`Runtime`] port on JavaScript's clocks: `performance.now()`, `Date.now()`,
/// `setTimeout` and `Math.random()` (or a seeded generator).
///
/// Its instants are measured from the `performance.now()` of the moment it was made;
/// clones share that origin, the count of [pending timers](WasmRuntime::pending_timers)
/// and the seeded generator if there is one. Cloning is one reference count.
///
/// Not `Send`: it and its sleeps live on the JavaScript thread that made them.
///
/// ```no_run
/// use std::time::Duration;
/// use vantage_api_pool::Runtime;
/// use vantage_api_pool_wasm::WasmRuntime;
///
/// # async fn demo() {
/// let rt = WasmRuntime::new();
/// let start = rt.now();
/// rt.sleep(Duration::from_millis(50)).await;
/// assert!(rt.now() - start >= Duration::from_millis(50));
/// # }
/// ```
#[derive(Clone)]
pub struct WasmRuntime {
    shared: Rc<RuntimeShared>,
}

/// What clones of one runtime share.
struct RuntimeShared {
    /// `performance.now()` when the runtime was made.
    origin_ms: f64,
    /// Timers armed and neither fired nor cleared yet.
    pending: Cell<usize>,
    /// `Some` for a seeded runtime: the SplitMix64 state.
    seed: Option<Cell<u64>>,
}

impl WasmRuntime {
    /// A runtime whose origin is now, with jitter from `Math.random()`.
    ///
    /// It reads `performance.now()` at once, and a sleep calls `setTimeout` when
    /// first polled: where a global is missing (Node before 16 has no `performance`
    /// global; some embedded engines and worklets have no timers) that call throws a
    /// JavaScript exception. [`WasmRuntime::try_new`] checks first and returns an
    /// error instead.
    #[must_use]
    pub fn new() -> Self {
        WasmRuntime::with_random(None)
    }

    /// A runtime whose origin is now, with jitter from a generator seeded with `seed`
    /// (SplitMix64), so the jitter of a run can be replayed. Clones share the
    /// generator. Needs the same globals as [`WasmRuntime::new`].
    #[must_use]
    pub fn with_seed(seed: u64) -> Self {
        WasmRuntime::with_random(Some(seed))
    }

    /// As [`WasmRuntime::new`], after checking that `performance.now`, `setTimeout`
    /// and `clearTimeout` are functions in this JavaScript context.
    ///
    /// # Errors
    ///
    /// [`MissingGlobal`], naming the first of them that is missing or not a function.
    pub fn try_new() -> Result<Self, MissingGlobal> {
        check_globals()?;
        Ok(WasmRuntime::new())
    }

    /// As [`WasmRuntime::with_seed`], after the checks of [`WasmRuntime::try_new`].
    ///
    /// # Errors
    ///
    /// [`MissingGlobal`], as [`WasmRuntime::try_new`].
    pub fn try_with_seed(seed: u64) -> Result<Self, MissingGlobal> {
        check_globals()?;
        Ok(WasmRuntime::with_seed(seed))
    }

    fn with_random(seed: Option<u64>) -> Self {
        WasmRuntime {
            shared: Rc::new(RuntimeShared {
                origin_ms: performance_now(),
                pending: Cell::new(0),
                seed: seed.map(Cell::new),
            }),
        }
    }

    /// How many JavaScript timers this runtime's sleeps (and its clones' sleeps) have
    /// armed that have neither fired nor been cleared.
    ///
    /// A sleep arms a timer when it is first polled and clears it (`clearTimeout`)
    /// when dropped. This is the runtime's own count of those timers; the tests also
    /// count the `clearTimeout` calls themselves.
    #[must_use]
    pub fn pending_timers(&self) -> usize {
        self.shared.pending.get()
    }

    /// `performance.now()` minus the origin, in whole nanoseconds, rounded down
    /// (`ceil == false`) or up.
    fn elapsed(&self, ceil: bool) -> Duration {
        let ns = (performance_now() - self.shared.origin_ms) * 1_000_000.0;
        let ns = if ceil { ns.ceil() } else { ns.floor() };
        // `as` saturates: NaN and negatives become 0.
        Duration::from_nanos(ns as u64)
    }
}

impl Default for WasmRuntime {
    fn default() -> Self {
        WasmRuntime::new()
    }
}

impl fmt::Debug for WasmRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WasmRuntime")
            .field("origin_ms", &self.shared.origin_ms)
            .field("pending_timers", &self.shared.pending.get())
            .field("seeded", &self.shared.seed.is_some())
            .finish()
    }
}

/// A JavaScript global that [`WasmRuntime`] calls is missing or not a function in
/// this context: returned by [`WasmRuntime::try_new`] and
/// [`WasmRuntime::try_with_seed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MissingGlobal {
    name: &'static str,
}

impl MissingGlobal {
    /// The global as JavaScript names it: `performance.now`, `setTimeout` or
    /// `clearTimeout`.
    #[must_use]
    pub fn name(&self) -> &'static str {
        self.name
    }
}

impl fmt::Display for MissingGlobal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the JavaScript global `{}` is missing or not a function (WasmRuntime \
             needs performance.now, setTimeout and clearTimeout)",
            self.name
        )
    }
}

impl std::error::Error for MissingGlobal {}

/// The first global the runtime calls that is not a function here.
fn check_globals() -> Result<(), MissingGlobal> {
    let global = JsValue::from(js_sys::global());
    // `Reflect.get` throws on a non-object target, and a getter may throw: both read
    // as missing.
    let get = |target: &JsValue, key: &str| {
        js_sys::Reflect::get(target, &JsValue::from_str(key))
            .ok()
            .filter(|value| !value.is_undefined() && !value.is_null())
    };
    let is_function =
        |target: &JsValue, key: &str| get(target, key).is_some_and(|v| v.is_function());
    let performance_now = get(&global, "performance")
        .filter(JsValue::is_object)
        .is_some_and(|performance| is_function(&performance, "now"));
    if !performance_now {
        return Err(MissingGlobal {
            name: "performance.now",
        });
    }
    for name in ["setTimeout", "clearTimeout"] {
        if !is_function(&global, name) {
            return Err(MissingGlobal { name });
        }
    }
    Ok(())
}

/// `ms` milliseconds as a duration; negative or NaN gives zero, too large saturates.
fn millis(ms: f64) -> Duration {
    // `as` saturates: NaN and negatives become 0.
    Duration::from_nanos((ms * 1_000_000.0) as u64)
}

impl Runtime for WasmRuntime {
    /// `performance.now()` since the runtime's origin, rounded down to whole
    /// nanoseconds. Never goes backwards: `performance.now()` is monotonic.
    fn now(&self) -> Instant {
        Instant::from_origin(self.elapsed(false))
    }

    /// `Date.now()`; a time before 1970 reads as the Unix epoch.
    fn wall_clock(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH
            .checked_add(millis(js_sys::Date::now()))
            .unwrap_or(SystemTime::UNIX_EPOCH)
    }

    /// A [`Sleep`] until `deadline` (this signature promises the named type).
    #[allow(refining_impl_trait)]
    fn sleep_until(&self, deadline: Instant) -> Sleep {
        Sleep {
            runtime: self.clone(),
            deadline,
            timer: None,
        }
    }

    /// A [`Sleep`] until `duration` after now, saturating at [`Instant::FAR_FUTURE`].
    ///
    /// "Now" is rounded up here and down when the sleep checks the clock, so the
    /// sleep lasts at least `duration` of raw `performance.now()`.
    #[allow(refining_impl_trait)]
    fn sleep(&self, duration: Duration) -> Sleep {
        self.sleep_until(Instant::from_origin(self.elapsed(true)).saturating_add(duration))
    }

    /// `Math.random()`, or the next number of the seeded generator; in `[0, 1)`.
    fn random(&self) -> f64 {
        let x = match &self.shared.seed {
            Some(state) => {
                let (next, x) = splitmix64(state.get());
                state.set(next);
                // The top 53 bits as a fraction: exactly representable, below 1.
                (x >> 11) as f64 / (1u64 << 53) as f64
            }
            None => js_sys::Math::random(),
        };
        if (0.0..1.0).contains(&x) { x } else { 0.0 }
    }
}

/// One SplitMix64 step: the next state and the output.
fn splitmix64(state: u64) -> (u64, u64) {
    let next = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = next;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (next, z ^ (z >> 31))
}

/// The future of [`WasmRuntime::sleep_until`]: completes once the runtime's clock
/// reaches the deadline, never before.
///
/// The deadline is fixed when the sleep is made; the timer is armed when it is first
/// polled. JavaScript timers can fire a little early (Node's by about a
/// millisecond) and cannot wait longer than about 24.8 days, so when the timer fires
/// the sleep reads the clock again and, if the deadline has not come, arms a new
/// timer for the rest. [`Instant::FAR_FUTURE`] arms no timer and never completes.
///
/// Dropping the sleep clears its timer (`clearTimeout`) and takes it off
/// [`WasmRuntime::pending_timers`], the runtime's own count.
#[must_use = "futures do nothing unless polled"]
#[derive(Debug)]
pub struct Sleep {
    runtime: WasmRuntime,
    deadline: Instant,
    timer: Option<Timer>,
}

impl Sleep {
    /// The instant this sleep ends at, on its runtime's clock.
    #[must_use]
    pub fn deadline(&self) -> Instant {
        self.deadline
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if this.deadline == Instant::FAR_FUTURE {
            return Poll::Pending;
        }
        let now = this.runtime.now();
        if now >= this.deadline {
            this.timer = None;
            return Poll::Ready(());
        }
        match &this.timer {
            Some(timer) if !timer.shared.fired.get() => timer.shared.set_waker(cx.waker()),
            // Not armed yet, or fired before the deadline: arm for the rest.
            _ => {
                this.timer = Some(Timer::arm(
                    &this.runtime.shared,
                    this.deadline - now,
                    cx.waker(),
                ));
            }
        }
        Poll::Pending
    }
}

/// What a timer's callback shares with its sleep.
#[derive(Default)]
struct TimerShared {
    fired: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

impl TimerShared {
    fn set_waker(&self, waker: &Waker) {
        let old = self.waker.take();
        self.waker.set(Some(match old {
            Some(old) if old.will_wake(waker) => old,
            _ => waker.clone(),
        }));
    }
}

/// A `setTimeout`, cleared when dropped before it fires.
struct Timer {
    handle: JsValue,
    shared: Rc<TimerShared>,
    runtime: Rc<RuntimeShared>,
    // Must outlive the JavaScript timer: `Drop` clears the timer before this drops.
    _callback: Closure<dyn FnMut()>,
}

impl Timer {
    /// Arms a timer for `left` (rounded up to whole milliseconds, at least 1, at most
    /// [`MAX_TIMEOUT_MS`]) that wakes `waker`, counted in `runtime`'s pending timers.
    fn arm(runtime: &Rc<RuntimeShared>, left: Duration, waker: &Waker) -> Timer {
        let shared = Rc::new(TimerShared::default());
        shared.set_waker(waker);
        let callback = {
            let shared = Rc::clone(&shared);
            let runtime = Rc::clone(runtime);
            Closure::new(move || {
                if !shared.fired.replace(true) {
                    runtime.pending.set(runtime.pending.get().saturating_sub(1));
                }
                if let Some(waker) = shared.waker.take() {
                    waker.wake();
                }
            })
        };
        let ms = left.as_nanos().div_ceil(1_000_000).clamp(1, MAX_TIMEOUT_MS);
        let ms = i32::try_from(ms).unwrap_or(i32::MAX);
        let handle = set_timeout(&callback, ms);
        runtime.pending.set(runtime.pending.get() + 1);
        Timer {
            handle,
            shared,
            runtime: Rc::clone(runtime),
            _callback: callback,
        }
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        if !self.shared.fired.replace(true) {
            clear_timeout(&self.handle);
            let pending = &self.runtime.pending;
            pending.set(pending.get().saturating_sub(1));
        }
    }
}

impl fmt::Debug for Timer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Timer")
            .field("fired", &self.shared.fired.get())
            .finish_non_exhaustive()
    }
}
