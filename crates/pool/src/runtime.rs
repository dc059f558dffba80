//! The `Runtime` port: monotonic time, wall-clock time, sleeping and randomness.
//!
//! The attempt loop never touches a real clock or an executor. Everything it needs
//! from the outside world about time comes through this trait, so the same loop runs
//! on tokio, in a browser, and on the testkit's virtual clock where minutes pass in
//! microseconds.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use std::time::{Duration, SystemTime};

use crate::time::Instant;

/// What the attempt loop needs from an async runtime.
///
/// The trait deliberately has no `Send` bounds: the futures an implementation returns
/// are `Send` when the implementation's are (auto-trait leakage through the concrete
/// type), so a client over `TokioRuntime` can be `tokio::spawn`ed while one over a
/// browser runtime holding `JsValue`s still compiles. The port never spawns. A runtime
/// whose sleeps are `Send` should implement [`SendRuntime`] instead (it gets this trait
/// from a blanket impl), so that code generic over it can spawn its calls.
///
/// # Implementing
///
/// Every method keeps a contract the loop relies on: `now` never goes backwards and
/// stays below [`Instant::FAR_FUTURE`]; a sleep never ends before its deadline, and
/// one until `FAR_FUTURE` (or any deadline the runtime's own clock cannot hold) never
/// ends and never panics: the loop asks for one when a wait has no end (a call
/// under [`RetryMode::UntilCancelled`](crate::RetryMode::UntilCancelled) with an
/// unbounded ceiling, say); `random` is in `[0, 1)`. A runtime that breaks one
/// breaks the loop's timing (a sleep that ends early times every send out at once),
/// not its memory safety. The testkit's `VirtualRuntime` and the adapters'
/// runtimes are complete examples; the smallest one that keeps every rule:
///
/// ```
/// use std::future::Future;
/// use std::task::Poll;
/// use std::time::SystemTime;
/// use vantage_api_pool::{Instant, Runtime};
///
/// /// A runtime whose time never moves: a deadline that has not come never will, so
/// /// its sleeps stay pending (a call on it must never wait).
/// struct Frozen;
///
/// impl Runtime for Frozen {
///     fn now(&self) -> Instant { Instant::ORIGIN }
///     fn wall_clock(&self) -> SystemTime { SystemTime::UNIX_EPOCH }
///     fn sleep_until(&self, deadline: Instant) -> impl Future<Output = ()> {
///         let due = deadline <= self.now();
///         std::future::poll_fn(move |_| if due { Poll::Ready(()) } else { Poll::Pending })
///     }
///     fn random(&self) -> f64 { 0.5 }
/// }
///
/// assert_eq!(Frozen.now(), Instant::ORIGIN);
/// ```
pub trait Runtime {
    /// The current instant on this runtime's monotonic clock. Never goes backwards.
    fn now(&self) -> Instant;

    /// The current wall-clock time, used only to read HTTP-date `Retry-After` values.
    fn wall_clock(&self) -> SystemTime;

    /// A future that completes at or after `deadline` on this runtime's clock, and
    /// never before it.
    ///
    /// The deadline is fixed when this method is called, not when the future is first
    /// polled. Dropping the future cancels the timer and releases whatever the runtime
    /// held for it; nothing else happens.
    ///
    /// A deadline of [`Instant::FAR_FUTURE`], or one past what the runtime's own clock
    /// can hold, never comes: the future stays pending, and neither this method nor a
    /// poll panics. The loop asks for such a sleep when a wait has no end.
    fn sleep_until(&self, deadline: Instant) -> impl Future<Output = ()>;

    /// A future that completes `duration` after now (as read when this is called).
    ///
    /// Dropping it cancels the timer, as for [`Runtime::sleep_until`].
    fn sleep(&self, duration: Duration) -> impl Future<Output = ()> {
        self.sleep_until(self.now().saturating_add(duration))
    }

    /// A uniformly distributed number in `[0, 1)`, used for jitter.
    ///
    /// It need not be cryptographically strong; a test runtime returns a seeded
    /// sequence so a run can be replayed. A value outside `[0, 1)` is not refused:
    /// jitter reads NaN or a negative number as 0 and one at or above 1 as the largest
    /// below 1 ([`apply_jitter`](crate::backoff::apply_jitter)). So a generator that
    /// gives NaN quietly changes the waits: `Proportional` adds nothing, and `Full`
    /// shrinks every policy back-off to its 1 ms floor.
    fn random(&self) -> f64;
}

/// [`Runtime`] whose sleeps are `Send`, for generic code that spawns its calls (see
/// [`SendTransport`](crate::transport::SendTransport)). A blanket impl provides [`Runtime`].
///
/// `TokioRuntime` and the testkit's `VirtualRuntime` implement this trait; a type
/// implements one of the two, never both.
pub trait SendRuntime: Send + Sync {
    /// As [`Runtime::now`].
    fn now(&self) -> Instant;

    /// As [`Runtime::wall_clock`].
    fn wall_clock(&self) -> SystemTime;

    /// As [`Runtime::sleep_until`], with a `Send` future.
    fn sleep_until(&self, deadline: Instant) -> impl Future<Output = ()> + Send;

    /// As [`Runtime::sleep`], with a `Send` future.
    fn sleep(&self, duration: Duration) -> impl Future<Output = ()> + Send {
        self.sleep_until(self.now().saturating_add(duration))
    }

    /// As [`Runtime::random`].
    fn random(&self) -> f64;
}

impl<R: SendRuntime> Runtime for R {
    #[inline]
    fn now(&self) -> Instant {
        SendRuntime::now(self)
    }

    #[inline]
    fn wall_clock(&self) -> SystemTime {
        SendRuntime::wall_clock(self)
    }

    #[inline]
    fn sleep_until(&self, deadline: Instant) -> impl Future<Output = ()> {
        SendRuntime::sleep_until(self, deadline)
    }

    #[inline]
    fn sleep(&self, duration: Duration) -> impl Future<Output = ()> {
        SendRuntime::sleep(self, duration)
    }

    #[inline]
    fn random(&self) -> f64 {
        SendRuntime::random(self)
    }
}

/// The error of [`timeout_at`]: the deadline came first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("deadline elapsed")]
pub struct Elapsed;

/// Runs `work` until it finishes or the runtime's clock reaches `deadline`,
/// whichever comes first.
///
/// This is a select of the work against the runtime's own sleep, so virtual time
/// covers it. When the deadline wins, the future resolves to `Err(Elapsed)`; the
/// work stays inside it, unpolled, until it is dropped, and dropping it cancels the
/// work (drop the future at once to cancel the work at once). Work that is ready on
/// its first poll never arms a timer. Dropping the returned future drops the work
/// and the timer.
///
/// ```
/// use std::time::Duration;
/// use vantage_api_pool::{Instant, Runtime, timeout_at};
/// use vantage_api_pool_testkit::VirtualRuntime;
///
/// let rt = VirtualRuntime::new();
/// // Work that never finishes is cut off at the deadline, on the runtime's clock...
/// let deadline = Instant::ORIGIN + Duration::from_secs(1);
/// let cut = rt.block_on(timeout_at(&rt, deadline, std::future::pending::<()>()))?;
/// assert!(cut.is_err());
/// assert_eq!(rt.now(), deadline);
/// // ...and work that finishes first keeps its output.
/// let later = deadline + Duration::from_secs(1);
/// let done = rt.block_on(timeout_at(&rt, later, rt.sleep(Duration::from_millis(10))))?;
/// assert!(done.is_ok());
/// assert_eq!(rt.elapsed(), Duration::from_millis(1010));
/// # Ok::<(), vantage_api_pool_testkit::DriveError>(())
/// ```
pub fn timeout_at<R, F>(
    runtime: &R,
    deadline: Instant,
    work: F,
) -> impl Future<Output = Result<F::Output, Elapsed>>
where
    R: Runtime,
    F: Future,
{
    Timeout {
        work,
        sleep: None,
        arm: Some(move || runtime.sleep_until(deadline)),
        forever: deadline == Instant::FAR_FUTURE,
    }
}

/// Makes the timer of a [`Timeout`], once the work turned out not to be ready.
trait Arm {
    type Sleep: Future<Output = ()>;
    fn arm(self) -> Self::Sleep;
}

impl<M, S> Arm for M
where
    M: FnOnce() -> S,
    S: Future<Output = ()>,
{
    type Sleep = S;
    fn arm(self) -> S {
        self()
    }
}

pin_project! {
    /// The future of [`timeout_at`]: the work and, once armed, the timer, side by side
    /// (no copy of the work is made).
    struct Timeout<F, M>
    where
        M: Arm,
    {
        #[pin]
        work: F,
        #[pin]
        sleep: Option<M::Sleep>,
        arm: Option<M>,
        forever: bool,
    }
}

impl<F: Future, M: Arm> Future for Timeout<F, M> {
    type Output = Result<F::Output, Elapsed>;

    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Poll::Ready(output) = this.work.poll(cx) {
            return Poll::Ready(Ok(output));
        }
        if *this.forever {
            return Poll::Pending;
        }
        if let Some(arm) = this.arm.take() {
            this.sleep.set(Some(arm.arm()));
        }
        match this.sleep.as_pin_mut() {
            Some(sleep) => sleep.poll(cx).map(|()| Err(Elapsed)),
            None => Poll::Pending,
        }
    }
}
