//! The crate's own monotonic [`Instant`].
//!
//! `std::time::Instant::now()` panics on `wasm32-unknown-unknown`, and a test on
//! virtual time needs instants that only move when the test says so. Every
//! [`Runtime`](crate::Runtime) therefore reports time as an [`Instant`]: a distance
//! from that runtime's own origin. Instants from two different runtimes are not
//! comparable in any meaningful way.

use std::fmt;
use std::ops::{Add, AddAssign, Sub};
use std::time::Duration;

/// A point on a runtime's monotonic clock, measured from that runtime's origin in
/// whole nanoseconds (a `u64`: about 584 years; settings that could reach past it,
/// such as a rate bucket refilling over centuries, are refused where they are made).
///
/// Arithmetic saturates instead of panicking: adding [`Duration::MAX`] gives the
/// latest representable instant, [`Instant::FAR_FUTURE`], and subtracting a later
/// instant gives zero. [`Instant::from_origin`] saturates a distance beyond the
/// range at `FAR_FUTURE` too.
///
/// ```
/// use std::time::Duration;
/// use vantage_api_pool::Instant;
///
/// let t = Instant::from_origin(Duration::from_millis(1500));
/// assert_eq!(t.since_origin(), Duration::from_millis(1500));
/// assert_eq!(t.as_nanos(), 1_500_000_000);
/// assert_eq!(t + Duration::from_millis(500), Instant::from_origin(Duration::from_secs(2)));
/// assert_eq!(Instant::ORIGIN - t, Duration::ZERO); // saturates
/// assert_eq!(Instant::from_origin(Duration::MAX), Instant::FAR_FUTURE); // saturates
/// let mut later = t;
/// later += Duration::MAX;
/// assert_eq!(later, Instant::FAR_FUTURE);
/// ```
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant {
    /// Nanoseconds since the origin. A plain integer keeps every comparison and
    /// sum on the attempt loop's hot path a single instruction or two.
    nanos: u64,
}

/// `d` in whole nanoseconds, saturating at `u64::MAX`.
const fn saturating_nanos(d: Duration) -> u64 {
    match d.as_secs().checked_mul(1_000_000_000) {
        Some(secs) => secs.saturating_add(d.subsec_nanos() as u64),
        None => u64::MAX,
    }
}

impl Instant {
    /// The runtime's origin (time zero).
    pub const ORIGIN: Instant = Instant { nanos: 0 };

    /// The latest representable instant; a deadline that never comes.
    pub const FAR_FUTURE: Instant = Instant { nanos: u64::MAX };

    /// The instant `since_origin` after the runtime's origin, saturating at
    /// [`Instant::FAR_FUTURE`].
    #[must_use]
    pub const fn from_origin(since_origin: Duration) -> Self {
        Instant {
            nanos: saturating_nanos(since_origin),
        }
    }

    /// The instant `nanos` nanoseconds after the runtime's origin.
    #[must_use]
    pub const fn from_nanos(nanos: u64) -> Self {
        Instant { nanos }
    }

    /// How far this instant lies from the runtime's origin.
    #[must_use]
    pub const fn since_origin(self) -> Duration {
        Duration::from_nanos(self.nanos)
    }

    /// How far this instant lies from the runtime's origin, in nanoseconds.
    #[must_use]
    pub const fn as_nanos(self) -> u64 {
        self.nanos
    }

    /// The time from `earlier` to `self`, or zero if `earlier` is later.
    #[must_use]
    pub const fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.nanos.saturating_sub(earlier.nanos))
    }

    /// `self + d`, or `None` if it cannot be represented.
    #[must_use]
    pub fn checked_add(self, d: Duration) -> Option<Instant> {
        let d = u64::try_from(d.as_nanos()).ok()?;
        self.nanos.checked_add(d).map(Instant::from_nanos)
    }

    /// `self + d`, saturating at [`Instant::FAR_FUTURE`].
    #[must_use]
    pub const fn saturating_add(self, d: Duration) -> Instant {
        Instant::from_nanos(self.nanos.saturating_add(saturating_nanos(d)))
    }

    /// `self - d`, saturating at [`Instant::ORIGIN`].
    #[must_use]
    pub const fn saturating_sub(self, d: Duration) -> Instant {
        Instant::from_nanos(self.nanos.saturating_sub(saturating_nanos(d)))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    /// Saturating: never panics.
    fn add(self, rhs: Duration) -> Instant {
        self.saturating_add(rhs)
    }
}

impl AddAssign<Duration> for Instant {
    /// Saturating, as `+`.
    fn add_assign(&mut self, rhs: Duration) {
        *self = self.saturating_add(rhs);
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
        write!(f, "Instant(+{:?})", self.since_origin())
    }
}

/// `d` in whole milliseconds (cut, not rounded), saturating at `u64::MAX`: the
/// `ms` of events and call figures.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `millis(later.saturating_duration_since(earlier))`, on the nanoseconds: whole
/// milliseconds from `earlier` to `later` (0 if `later` is earlier), without the
/// detour through a `Duration` (a division into seconds, then a 128-bit product).
#[inline]
pub(crate) fn millis_between(later: Instant, earlier: Instant) -> u64 {
    later.nanos.saturating_sub(earlier.nanos) / 1_000_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_between_reads_as_millis_of_the_duration_between() {
        let at = |nanos: u64| Instant::from_nanos(nanos);
        let nanos = [
            0,
            1,
            999_999,
            1_000_000,
            1_999_999_999,
            3_000_000_001,
            u64::MAX - 1,
            u64::MAX,
        ];
        for later in nanos {
            for earlier in nanos {
                assert_eq!(
                    millis_between(at(later), at(earlier)),
                    millis(at(later).saturating_duration_since(at(earlier))),
                    "{later} {earlier}"
                );
            }
        }
    }

    #[test]
    fn arithmetic_saturates_instead_of_panicking() {
        let t = Instant::from_origin(Duration::from_secs(5));
        assert_eq!(t + Duration::MAX, Instant::FAR_FUTURE);
        assert_eq!(t.checked_add(Duration::MAX), None);
        assert_eq!(Instant::ORIGIN - t, Duration::ZERO);
        assert_eq!(t - Duration::from_secs(9), Instant::ORIGIN);
        assert_eq!(
            t - Duration::from_secs(2),
            Instant::from_origin(Duration::from_secs(3))
        );
        assert_eq!(t - Instant::ORIGIN, Duration::from_secs(5));
        assert_eq!(
            Instant::FAR_FUTURE.checked_add(Duration::from_nanos(1)),
            None
        );
        assert_eq!(
            Instant::FAR_FUTURE.checked_add(Duration::ZERO),
            Some(Instant::FAR_FUTURE)
        );
        assert_eq!(Instant::from_origin(Duration::MAX), Instant::FAR_FUTURE);
        assert_eq!(
            Instant::from_origin(Duration::from_nanos(u64::MAX)),
            Instant::FAR_FUTURE
        );
        // Durations past the range that are not Duration::MAX (whose nanoseconds a
        // wrapping or truncating conversion would happen to map to u64::MAX).
        assert_eq!(
            Instant::from_origin(Duration::new(18_446_744_073, 999_999_999)),
            Instant::FAR_FUTURE
        );
        assert_eq!(
            Instant::from_origin(Duration::from_secs(u64::MAX / 2)),
            Instant::FAR_FUTURE
        );
        let far = Duration::from_secs(1 << 40);
        assert_eq!(Instant::ORIGIN + far, Instant::FAR_FUTURE);
        assert_eq!(Instant::ORIGIN.checked_add(far), None);
        assert_eq!(Instant::ORIGIN.checked_add(Duration::MAX), None);
    }

    #[test]
    fn keeps_whole_nanoseconds() {
        let d = Duration::new(3, 999_999_999);
        let t = Instant::from_origin(d);
        assert_eq!(t.since_origin(), d);
        assert_eq!(t.as_nanos(), 3_999_999_999);
        assert_eq!(Instant::from_nanos(t.as_nanos()), t);
        assert_eq!(
            t.saturating_duration_since(Instant::from_nanos(1)),
            d - Duration::from_nanos(1)
        );
    }

    #[test]
    fn orders_by_distance_from_origin() {
        let a = Instant::from_origin(Duration::from_millis(1));
        let b = Instant::from_origin(Duration::from_millis(2));
        assert!(a < b && b < Instant::FAR_FUTURE && Instant::ORIGIN < a);
        assert_eq!(format!("{a:?}"), "Instant(+1ms)");
    }
}
