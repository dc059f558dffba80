//! The runtime on JavaScript's clocks and timers.

use std::cell::Cell;
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
/// `setTimeout` and `Math.random()`.
///
/// Its instants are measured from the `performance.now()` of the moment it was made;
/// copies share that origin. Not `Send`: it lives on the JavaScript thread.
#[derive(Debug, Clone, Copy)]
pub struct WasmRuntime {
    origin_ms: f64,
}

impl WasmRuntime {
    /// A runtime whose origin is now.
    #[must_use]
    pub fn new() -> Self {
        WasmRuntime {
            origin_ms: performance_now(),
        }
    }
}

impl Default for WasmRuntime {
    fn default() -> Self {
        WasmRuntime::new()
    }
}

/// `ms` milliseconds as a duration; negative or NaN gives zero, too large saturates.
fn millis(ms: f64) -> Duration {
    // `as` saturates: NaN and negatives become 0.
    Duration::from_nanos((ms * 1_000_000.0) as u64)
}

impl Runtime for WasmRuntime {
    fn now(&self) -> Instant {
        Instant::from_origin(millis(performance_now() - self.origin_ms))
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
            runtime: *self,
            deadline,
            timer: None,
        }
    }

    /// A [`Sleep`] until now plus `duration`, saturating at [`Instant::FAR_FUTURE`].
    #[allow(refining_impl_trait)]
    fn sleep(&self, duration: Duration) -> Sleep {
        self.sleep_until(self.now().saturating_add(duration))
    }

    /// `Math.random()`, in `[0, 1)`.
    fn random(&self) -> f64 {
        let x = js_sys::Math::random();
        if (0.0..1.0).contains(&x) { x } else { 0.0 }
    }
}

/// The future of [`WasmRuntime::sleep_until`]: completes once the runtime's clock
/// reaches the deadline, never before.
///
/// The deadline is fixed when the sleep is made; the timer is armed when it is first
/// polled. JavaScript timers can fire a little early (Node's by about a
/// millisecond) and cannot wait longer than about 24.8 days, so when the timer fires
/// the sleep reads the clock again and, if the deadline has not come, arms a new
/// timer for the rest. [`Instant::FAR_FUTURE`] arms no timer and never completes.
/// Dropping the sleep clears its timer.
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
            _ => this.timer = Some(Timer::arm(this.deadline - now, cx.waker())),
        }
        Poll::Pending
    }
}

/// What a timer's callback shares with its sleep.
#[derive(Default)]
struct Shared {
    fired: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

impl Shared {
    fn set_waker(&self, waker: &Waker) {
        let old = self.waker.take();
        self.waker.set(Some(match old {
            Some(old) if old.will_wake(waker) => old,
            _ => waker.clone(),
        }));
    }
}

/// A `setTimeout`, cleared when dropped.
struct Timer {
    handle: JsValue,
    shared: Rc<Shared>,
    // Must outlive the JavaScript timer: `Drop` clears the timer before this drops.
    _callback: Closure<dyn FnMut()>,
}

impl Timer {
    /// Arms a timer for `left` (rounded up to whole milliseconds, at most
    /// [`MAX_TIMEOUT_MS`]) that wakes `waker`.
    fn arm(left: Duration, waker: &Waker) -> Timer {
        let shared = Rc::new(Shared::default());
        shared.set_waker(waker);
        let callback = {
            let shared = Rc::clone(&shared);
            Closure::new(move || {
                shared.fired.set(true);
                if let Some(waker) = shared.waker.take() {
                    waker.wake();
                }
            })
        };
        let ms = left.as_nanos().div_ceil(1_000_000).clamp(1, MAX_TIMEOUT_MS);
        let ms = i32::try_from(ms).unwrap_or(i32::MAX);
        Timer {
            handle: set_timeout(&callback, ms),
            shared,
            _callback: callback,
        }
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        clear_timeout(&self.handle);
    }
}

impl std::fmt::Debug for Timer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timer")
            .field("fired", &self.shared.fired.get())
            .finish_non_exhaustive()
    }
}
