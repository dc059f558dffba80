//! # vantage-api-pool-tokio
//!
//! [`TokioRuntime`]: the [`Runtime`](vantage_api_pool::Runtime) port of `vantage-api-pool`
//! on tokio's clock.
//!
//! | port method | here |
//! |---|---|
//! | [`Runtime::now`](vantage_api_pool::Runtime::now) | [`tokio::time::Instant::now`], measured from an origin taken when the runtime is made |
//! | [`Runtime::wall_clock`](vantage_api_pool::Runtime::wall_clock) | [`SystemTime::now`] |
//! | [`Runtime::sleep_until`](vantage_api_pool::Runtime::sleep_until) | [`tokio::time::sleep_until`] at `origin + deadline` (checked: an unrepresentable deadline never comes) |
//! | [`Runtime::random`](vantage_api_pool::Runtime::random) | a per-runtime SplitMix64 generator seeded from the wall clock and a counter (or a seed of yours: [`TokioRuntime::with_seed`]); a clone's is seeded by one draw from the original's |
//!
//! Because time is read through [`tokio::time::Instant`], a test on tokio's paused
//! clock (`#[tokio::test(start_paused = true)]`, feature `test-util`) sees every
//! sleep of the pool jump forward at once:
//!
//! ```
//! use std::time::Duration;
//! use vantage_api_pool::Runtime;
//! use vantage_api_pool_tokio::TokioRuntime;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap().block_on(async {
//! let runtime = TokioRuntime::new();
//! let start = runtime.now();
//! runtime.sleep(Duration::from_secs(5)).await; // no real wait on a paused clock
//! assert_eq!(runtime.now() - start, Duration::from_secs(5));
//! # });
//! ```
//!
//! A paused clock suits transports that wait on nothing real (a scripted or in-memory
//! one). tokio moves a paused clock on whenever every task waits, a wait on a real
//! socket included, so over a real network each send's time limit would end it at
//! once.
//!
//! A `TokioRuntime` reads the clock of whichever tokio runtime is current, against
//! the origin it took when it was made. Real clocks share one timeline, so a runtime
//! (or a client over it) can serve any number of tokio runtimes. A paused clock is a
//! timeline of its own, which starts at the real time its runtime was built and
//! moves by jumps: a `TokioRuntime` made or used under one belongs to that test. Used
//! under another clock, its readings stand still (clamped at its origin) or move
//! back, and its sleeps end on the wrong timeline. So with `start_paused`, build the
//! runtime and the client inside each test, not in a `static` shared by tests.
//!
//! The futures are `Send`, so a call on this runtime (with a `Send` transport) can be
//! `tokio::spawn`ed. Sleeping needs a tokio runtime with its time driver enabled
//! (`enable_time` or `enable_all`); [`Runtime::now`](vantage_api_pool::Runtime::now) and
//! [`Runtime::random`](vantage_api_pool::Runtime::random) work anywhere.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![warn(clippy::missing_errors_doc)]

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use pin_project_lite::pin_project;
// The docs name the plain port, which `TokioRuntime` has through `SendRuntime`.
use vantage_api_pool::Instant;
use vantage_api_pool::runtime::SendRuntime;

/// Re-exported so callers name the same `vantage-api-pool` as this runtime:
///
/// ```
/// use vantage_api_pool_tokio::vantage_api_pool::Runtime;
/// let _ = vantage_api_pool_tokio::TokioRuntime::new().now();
/// ```
pub use vantage_api_pool;

/// Counts runtimes made in this process, so two made in the same nanosecond still
/// get different seeds.
static RUNTIMES: AtomicU64 = AtomicU64::new(0);

/// The latest reading of the clock: 1 ns before [`Instant::FAR_FUTURE`].
const LATEST: Instant = Instant::from_nanos(u64::MAX - 1);

/// The golden-ratio increment of SplitMix64.
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The [`Runtime`](vantage_api_pool::Runtime) port on tokio.
///
/// Instants are measured from an origin taken from [`tokio::time::Instant::now`] when
/// the runtime is made; clones share it, so their instants compare. Each value (and
/// each clone) has its own random generator, so clones do not draw the same jitter; a
/// clone's is seeded by one draw from the original's, so clones of a seeded runtime
/// replay too.
///
/// `Send + Sync`, cheap to clone.
#[derive(Debug)]
pub struct TokioRuntime {
    origin: tokio::time::Instant,
    random: AtomicU64,
}

impl TokioRuntime {
    /// A runtime whose origin is now.
    ///
    /// It can be made outside a tokio runtime; on a paused tokio clock, make it inside
    /// so its origin is read from that clock.
    #[must_use]
    pub fn new() -> Self {
        TokioRuntime::with_origin(tokio::time::Instant::now())
    }

    /// A runtime whose origin is now and whose jitter is the SplitMix64 sequence of
    /// `seed`: two runtimes made with the same seed draw the same numbers, so a run
    /// can be replayed. A clone draws its own seed from this sequence, so it replays
    /// as well, with numbers of its own.
    ///
    /// ```
    /// use vantage_api_pool::Runtime;
    /// use vantage_api_pool_tokio::TokioRuntime;
    ///
    /// let (a, b) = (TokioRuntime::with_seed(7), TokioRuntime::with_seed(7));
    /// assert_eq!(a.random(), b.random());
    /// let (a2, b2) = (a.clone(), b.clone());
    /// assert_eq!(a2.random(), b2.random());
    /// assert_ne!(a2.random(), a.random());
    /// ```
    #[must_use]
    pub fn with_seed(seed: u64) -> Self {
        TokioRuntime {
            origin: tokio::time::Instant::now(),
            random: AtomicU64::new(seed),
        }
    }

    fn with_origin(origin: tokio::time::Instant) -> Self {
        TokioRuntime {
            origin,
            random: AtomicU64::new(fresh_seed()),
        }
    }

    /// The tokio instant at which this runtime's [`Instant::ORIGIN`] lies.
    #[must_use]
    pub fn origin(&self) -> tokio::time::Instant {
        self.origin
    }

    /// `at` as a tokio instant, or `None` for [`Instant::FAR_FUTURE`] (the deadline
    /// that never comes) and for instants tokio cannot represent.
    #[must_use]
    pub fn to_tokio(&self, at: Instant) -> Option<tokio::time::Instant> {
        if at == Instant::FAR_FUTURE {
            return None;
        }
        self.origin.checked_add(at.since_origin())
    }

    /// The tokio instant `at` on this runtime's clock; instants before the origin
    /// give [`Instant::ORIGIN`], and instants 584 years or more after it (a paused
    /// clock can be moved that far) give the instant 1 ns before
    /// [`Instant::FAR_FUTURE`], which is the deadline that never comes and so never
    /// a reading of the clock.
    #[must_use]
    #[inline]
    pub fn from_tokio(&self, at: tokio::time::Instant) -> Instant {
        Instant::from_origin(at.saturating_duration_since(self.origin)).min(LATEST)
    }

    /// Sleeps with [`tokio::time::sleep_until`] until `deadline`, never before it:
    /// the port's [`sleep_until`](vantage_api_pool::Runtime::sleep_until), as an
    /// inherent method so that a method call (`runtime.sleep_until(d)`) gives a
    /// [`TokioSleep`] whichever port trait is in scope. So does
    /// `SendRuntime::sleep_until(&runtime, d)`; called through the plain trait,
    /// `Runtime::sleep_until(&runtime, d)` gives the blanket impl's opaque future,
    /// which borrows the runtime.
    ///
    /// [`Instant::FAR_FUTURE`], and any deadline tokio's instant cannot represent,
    /// never completes; the deadline is converted with checked arithmetic, so none
    /// can overflow it, and the clock is not read. Dropping the future drops the
    /// tokio timer. Panics, as tokio does, if polled outside a tokio runtime with
    /// time enabled.
    ///
    /// The future is `Send + 'static`: it does not borrow the runtime.
    #[inline]
    pub fn sleep_until(&self, deadline: Instant) -> TokioSleep {
        sleep_until(self.origin, deadline)
    }

    /// [`TokioRuntime::sleep_until`] now plus `duration` (saturating at
    /// [`Instant::FAR_FUTURE`]); `Send + 'static` as well.
    pub fn sleep(&self, duration: Duration) -> TokioSleep {
        sleep_until(self.origin, self.now().saturating_add(duration))
    }
}

impl Default for TokioRuntime {
    fn default() -> Self {
        TokioRuntime::new()
    }
}

impl Clone for TokioRuntime {
    /// The same origin, and a random generator seeded by one draw from this one's (so
    /// a seeded runtime's clones replay, and no two draw the same jitter).
    fn clone(&self) -> Self {
        TokioRuntime {
            origin: self.origin,
            random: AtomicU64::new(mix(self.next_state())),
        }
    }
}

impl SendRuntime for TokioRuntime {
    #[inline]
    fn now(&self) -> Instant {
        self.from_tokio(tokio::time::Instant::now())
    }

    fn wall_clock(&self) -> SystemTime {
        SystemTime::now()
    }

    /// [`TokioRuntime::sleep_until`].
    #[allow(refining_impl_trait)]
    #[inline]
    fn sleep_until(&self, deadline: Instant) -> TokioSleep {
        TokioRuntime::sleep_until(self, deadline)
    }

    /// [`TokioRuntime::sleep`].
    #[allow(refining_impl_trait)]
    fn sleep(&self, duration: Duration) -> TokioSleep {
        TokioRuntime::sleep(self, duration)
    }

    /// The next number of a SplitMix64 sequence, in `[0, 1)` with 53 random bits.
    fn random(&self) -> f64 {
        unit_interval(mix(self.next_state()))
    }
}

impl TokioRuntime {
    /// Advances the generator one step and returns its new state.
    fn next_state(&self) -> u64 {
        self.random
            .fetch_add(GAMMA, Ordering::Relaxed)
            .wrapping_add(GAMMA)
    }
}

/// A sleep on tokio's clock until `deadline`, an instant measured from `origin`.
///
/// The deadline is turned into a tokio instant once, without reading the clock; a
/// deadline that tokio's clock cannot represent (`Instant::FAR_FUTURE`, or one past
/// what `tokio::time::Instant` can hold) never comes, so the sleep never ends.
#[inline]
fn sleep_until(origin: tokio::time::Instant, deadline: Instant) -> TokioSleep {
    let at = if deadline == Instant::FAR_FUTURE {
        None
    } else {
        origin.checked_add(deadline.since_origin())
    };
    TokioSleep { at, sleep: None }
}

pin_project! {
    /// The future of [`TokioRuntime`]'s sleeps: a [`tokio::time::Sleep`], or, for a
    /// deadline tokio's clock cannot hold, a sleep that never ends. `Send + 'static`.
    ///
    /// It can be made anywhere; tokio's timer is made and registered on the first
    /// poll, which must happen inside a tokio runtime whose time driver is on.
    #[derive(Debug)]
    #[must_use = "futures do nothing unless polled"]
    pub struct TokioSleep {
        // When it ends; `None`: never.
        at: Option<tokio::time::Instant>,
        #[pin]
        sleep: Option<tokio::time::Sleep>,
    }
}

impl Future for TokioSleep {
    type Output = ();

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        if this.sleep.is_none() {
            match *this.at {
                Some(at) => this.sleep.set(Some(tokio::time::sleep_until(at))),
                None => return Poll::Pending,
            }
        }
        match this.sleep.as_pin_mut() {
            Some(sleep) => sleep.poll(cx),
            None => Poll::Pending,
        }
    }
}

/// A seed from the wall clock and the process-wide runtime counter.
fn fresh_seed() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64); // the low 64 bits are the ones that vary
    fresh_seed_at(nanos)
}

/// The seed of a runtime made at wall-clock `nanos`; counts it, so the next one
/// made at the same reading gets another.
fn fresh_seed_at(nanos: u64) -> u64 {
    seed_from(nanos, RUNTIMES.fetch_add(1, Ordering::Relaxed))
}

/// The seed of the `count`th runtime made at wall-clock `nanos`: runtimes made in
/// the same nanosecond (a coarse clock) still draw different jitter.
fn seed_from(nanos: u64, count: u64) -> u64 {
    mix(nanos ^ mix(count.wrapping_mul(GAMMA)))
}

/// SplitMix64's output function.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The top 53 bits of `bits` as a number in `[0, 1)`.
fn unit_interval(bits: u64) -> f64 {
    (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_interval_stays_below_one() {
        assert_eq!(unit_interval(0), 0.0);
        assert!(unit_interval(u64::MAX) < 1.0);
    }

    #[test]
    fn runtimes_made_at_the_same_instant_get_different_seeds() {
        for nanos in [0, 1_700_000_000_000_000_000, u64::MAX] {
            let seeds: std::collections::HashSet<u64> =
                (0..64).map(|count| seed_from(nanos, count)).collect();
            assert_eq!(seeds.len(), 64, "a seed repeats at {nanos}");
        }
        // The counter is what tells them apart: each runtime made counts.
        assert_ne!(fresh_seed_at(5), fresh_seed_at(5));
    }

    #[test]
    fn runtimes_made_at_neighbouring_instants_and_counts_get_different_seeds() {
        // The count is spread over all 64 bits before it meets the clock (not
        // added to it or XORed in as it is), so (1 ns, 0th) and (0 ns, 1st), made a
        // nanosecond apart, do not draw the same jitter.
        let base = 1_700_000_000_000_000_000;
        let seeds: std::collections::HashSet<u64> = (0..64)
            .flat_map(|nanos| (0..64).map(move |count| seed_from(base + nanos, count)))
            .collect();
        assert_eq!(seeds.len(), 64 * 64);
    }

    #[test]
    fn splitmix_matches_its_reference_output() {
        // SplitMix64 seeded with 0: first output 0xE220A8397B1DCDAF.
        assert_eq!(mix(GAMMA), 0xE220_A839_7B1D_CDAF);
    }
}
