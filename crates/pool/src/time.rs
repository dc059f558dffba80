//! The crate's own monotonic [`Instant`].
//!
//! `std::time::Instant::now()` panics on `wasm32-unknown-unknown`, and a test on
//! virtual time needs instants that only move when the test says so. Every
//! [`Runtime`](crate::Runtime) therefore reports time as an [`Instant`]: a distance
//! from that runtime's own origin. Instants from two different runtimes are not
//! comparable in any meaningful way.

use std::fmt;
use std::ops::{Add, Sub};
use std::time::Duration;

/// A point on a runtime's monotonic clock, measured from that runtime's origin.
///
/// Arithmetic saturates instead of panicking: adding [`Duration::MAX`] gives the
/// latest representable instant, and subtracting a later instant gives zero.
///
/// ```
/// use std::time::Duration;
/// use vantage_api_pool::Instant;
///
/// let t = Instant::from_origin(Duration::from_millis(1500));
/// assert_eq!(t.since_origin(), Duration::from_millis(1500));
/// assert_eq!(t + Duration::from_millis(500), Instant::from_origin(Duration::from_secs(2)));
/// assert_eq!(Instant::ORIGIN - t, Duration::ZERO); // saturates
/// ```
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant {
    since_origin: Duration,
}

impl Instant {
    /// The runtime's origin (time zero).
    pub const ORIGIN: Instant = Instant {
        since_origin: Duration::ZERO,
    };

    /// The latest representable instant; a deadline that never comes.
    pub const FAR_FUTURE: Instant = Instant {
        since_origin: Duration::MAX,
    };

    /// The instant `since_origin` after the runtime's origin.
    #[must_use]
    pub const fn from_origin(since_origin: Duration) -> Self {
        Instant { since_origin }
    }

    /// How far this instant lies from the runtime's origin.
    #[must_use]
    pub const fn since_origin(self) -> Duration {
        self.since_origin
    }

    /// The time from `earlier` to `self`, or zero if `earlier` is later.
    #[must_use]
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        self.since_origin.saturating_sub(earlier.since_origin)
    }

    /// `self + d`, or `None` if it cannot be represented.
    #[must_use]
    pub fn checked_add(self, d: Duration) -> Option<Instant> {
        self.since_origin.checked_add(d).map(Instant::from_origin)
    }

    /// `self + d`, saturating at [`Instant::FAR_FUTURE`].
    #[must_use]
    pub fn saturating_add(self, d: Duration) -> Instant {
        Instant::from_origin(self.since_origin.saturating_add(d))
    }

    /// `self - d`, saturating at [`Instant::ORIGIN`].
    #[must_use]
    pub fn saturating_sub(self, d: Duration) -> Instant {
        Instant::from_origin(self.since_origin.saturating_sub(d))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    /// Saturating: never panics.
    fn add(self, rhs: Duration) -> Instant {
        self.saturating_add(rhs)
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    /// Saturating: a later `rhs` gives [`Duration::ZERO`].
    fn sub(self, rhs: Instant) -> Duration {
        self.saturating_duration_since(rhs)
    }
}

impl Sub<Duration> for Instant {
    type Output = Instant;
    /// Saturating at [`Instant::ORIGIN`].
    fn sub(self, rhs: Duration) -> Instant {
        self.saturating_sub(rhs)
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Instant(+{:?})", self.since_origin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_instead_of_panicking() {
        let t = Instant::from_origin(Duration::from_secs(5));
        assert_eq!(t + Duration::MAX, Instant::FAR_FUTURE);
        assert_eq!(t.checked_add(Duration::MAX), None);
        assert_eq!(Instant::ORIGIN - t, Duration::ZERO);
        assert_eq!(t - Duration::from_secs(9), Instant::ORIGIN);
        assert_eq!(t - Instant::ORIGIN, Duration::from_secs(5));
    }

    #[test]
    fn orders_by_distance_from_origin() {
        let a = Instant::from_origin(Duration::from_millis(1));
        let b = Instant::from_origin(Duration::from_millis(2));
        assert!(a < b && b < Instant::FAR_FUTURE && Instant::ORIGIN < a);
        assert_eq!(format!("{a:?}"), "Instant(+1ms)");
    }
}
