//! The rate bucket: how fast sends may leave.
//!
//! A token bucket that starts full with `burst` tokens and refills continuously at
//! `per_second`. It is kept as a generic cell rate algorithm over whole nanoseconds
//! (a "theoretical arrival time" instead of a float token count), so waits come out
//! exact: at 10/s with a burst of 10, the 100th of 100 sends that all ask at t = 0
//! leaves at exactly 9 s.
//!
//! Tokens granted in any window of length `T` are at most `burst + per_second × T`.
//! A caller that waits is not holding a reservation: it sleeps until the next token
//! is due and asks again, so a caller dropped while waiting takes nothing with it.

use std::time::Duration;

use crate::error::ConfigError;
use crate::sync::{AtomicU64, Ordering};
use crate::time::Instant;

/// The longest a [`RateLimit`]'s burst may take to refill: 2^62 ns, about 146 years.
/// The bucket keeps its time in 64-bit nanoseconds; this bound keeps every sum it
/// makes (the clock, plus the burst's tolerance, plus one interval) inside them for
/// the first 290 years of a runtime's clock.
pub const MAX_REFILL: Duration = Duration::from_nanos(1 << 62);

/// The bucket's settings: a rate and a burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    interval: Duration,
    burst: u32,
}

impl RateLimit {
    /// `per_second` sends per second with a burst of `ceil(per_second)` (at least 1).
    ///
    /// The bucket counts whole nanoseconds, so a rate above 10⁹ per second acts as
    /// 10⁹ per second (one token per nanosecond: in effect no limit), and the burst
    /// is at most `u32::MAX`. Both are accepted, not refused: a huge rate is the usual
    /// way to ask for a bucket that never waits. The interval between tokens is
    /// rounded up to whole nanoseconds, so the bucket never grants faster than the
    /// rate, but a very high rate is slowed to 10⁹/n per second: 7×10⁸/s refills
    /// every 2 ns, as 5×10⁸/s does (below 10⁶/s the difference is under 0.1%).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `rate_limit` for a rate that is 0, negative, NaN,
    /// infinite, or so small that refilling the burst would take longer than
    /// [`MAX_REFILL`] (the bucket keeps its time in 64-bit nanoseconds).
    ///
    /// ```
    /// use vantage_api_pool::rate::RateLimit;
    /// let r = RateLimit::per_second(2.5).unwrap();
    /// assert_eq!(r.burst(), 3);
    /// assert_eq!(RateLimit::per_second(2.2).unwrap().burst(), 3, "rounded up");
    /// let two_ns = std::time::Duration::from_nanos(2);
    /// assert_eq!(RateLimit::per_second(7e8).unwrap().interval(), two_ns);
    /// assert_eq!(RateLimit::per_second(f64::NAN).unwrap_err().setting(), "rate_limit");
    /// ```
    pub fn per_second(per_second: f64) -> Result<Self, ConfigError> {
        let interval = interval(per_second)?;
        // ceil of a finite positive f64 fits u32 after clamping; rates above
        // u32::MAX per second get a burst of u32::MAX.
        let burst = per_second.ceil().clamp(1.0, f64::from(u32::MAX)) as u32;
        RateLimit { interval, burst }.checked()
    }

    /// `per_second` sends per second with an explicit `burst`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `rate_limit` for the rates
    /// [`per_second`](RateLimit::per_second) refuses and for a burst that would take
    /// longer than [`MAX_REFILL`] to refill, or `rate_limit.burst` for a burst of 0.
    ///
    /// ```
    /// use vantage_api_pool::rate::RateLimit;
    /// assert!(RateLimit::with_burst(1.0, 1000).is_ok());
    /// let year = 365.25 * 24.0 * 3600.0;
    /// // One token a year, a burst of 1,000: a millennium to refill.
    /// assert_eq!(RateLimit::with_burst(1.0 / year, 1000).unwrap_err().setting(), "rate_limit");
    /// ```
    pub fn with_burst(per_second: f64, burst: u32) -> Result<Self, ConfigError> {
        let interval = interval(per_second)?;
        if burst == 0 {
            return Err(ConfigError::new("rate_limit.burst", "must be at least 1"));
        }
        RateLimit { interval, burst }.checked()
    }

    /// Refuses a burst whose refill would not fit the bucket's clock.
    fn checked(self) -> Result<Self, ConfigError> {
        if self.interval.saturating_mul(self.burst) > MAX_REFILL {
            return Err(ConfigError::new(
                "rate_limit",
                "is too slow for its burst: refilling the burst must take under 146 years",
            ));
        }
        Ok(self)
    }

    /// The time one token takes to refill: `1 / per_second`, rounded up to whole
    /// nanoseconds (at least 1 ns), so tokens never come faster than the rate.
    #[must_use]
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The most tokens the bucket holds.
    #[must_use]
    pub fn burst(&self) -> u32 {
        self.burst
    }
}

fn interval(per_second: f64) -> Result<Duration, ConfigError> {
    if !per_second.is_finite() || per_second <= 0.0 {
        return Err(ConfigError::new(
            "rate_limit",
            "must be a finite number above zero",
        ));
    }
    // Whole nanoseconds, rounded up so the bucket never grants faster than the rate
    // (3/s refills every 333,333,334 ns, not 333,333,333). A quotient within a few
    // ulps of a whole number is that number: 1/49 per second divides into
    // 49,000,000,000.00001 in f64, and is 49 s, not 49 s and 1 ns.
    let exact = 1e9 / per_second;
    let nanos = if (exact - exact.round()).abs() <= exact * 4.0 * f64::EPSILON {
        exact.round()
    } else {
        exact.ceil()
    };
    if nanos >= u64::MAX as f64 {
        return Err(ConfigError::new("rate_limit", "is too small"));
    }
    Ok(Duration::from_nanos((nanos as u64).max(1)))
}

/// A token bucket shared by every caller of one client.
#[derive(Debug)]
pub struct TokenBucket {
    limit: RateLimit,
    /// Tolerance: how far ahead of `now` the theoretical arrival time may run.
    tolerance: Duration,
    /// Theoretical arrival time of the next token, in nanoseconds since the
    /// runtime's origin (0 before the first take: any `now` is at or past it). One
    /// atomic word, so taking a token is a load and a compare-exchange, no lock.
    tat: AtomicU64,
}

impl TokenBucket {
    /// A full bucket.
    #[must_use]
    pub fn new(limit: RateLimit) -> Self {
        TokenBucket {
            limit,
            tolerance: limit.interval.saturating_mul(limit.burst - 1),
            tat: AtomicU64::new(0),
        }
    }

    /// The settings.
    #[must_use]
    pub fn limit(&self) -> RateLimit {
        self.limit
    }

    /// The earliest instant at which [`try_take`](TokenBucket::try_take) could
    /// succeed, if nobody takes a token first: an instant at or before the clock
    /// while the bucket holds a token ([`Instant::ORIGIN`] before the first take).
    /// Taking only ever moves it later, so a caller that needs a token before some
    /// deadline knows it cannot have one when this is past the deadline.
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool::Instant;
    /// use vantage_api_pool::rate::{RateLimit, TokenBucket};
    ///
    /// let bucket = TokenBucket::new(RateLimit::with_burst(2.0, 1)?);
    /// assert_eq!(bucket.next_token_at(), Instant::ORIGIN);
    /// bucket.try_take(Instant::ORIGIN).unwrap();
    /// assert_eq!(bucket.next_token_at(), Instant::ORIGIN + Duration::from_millis(500));
    /// # Ok::<(), vantage_api_pool::ConfigError>(())
    /// ```
    #[must_use]
    pub fn next_token_at(&self) -> Instant {
        Instant::from_nanos(self.tat.load(Ordering::Acquire)).saturating_sub(self.tolerance)
    }

    /// Takes one token at `now`.
    ///
    /// # Errors
    ///
    /// No token is due at `now`: the error is how long until one is (nothing taken).
    #[inline]
    pub fn try_take(&self, now: Instant) -> Result<(), Duration> {
        let mut tat = self.tat.load(Ordering::Acquire);
        loop {
            let theoretical = Instant::from_nanos(tat).max(now);
            let allowed_at = theoretical.saturating_sub(self.tolerance);
            if allowed_at > now {
                return Err(allowed_at.saturating_duration_since(now));
            }
            let next = theoretical.saturating_add(self.limit.interval).as_nanos();
            match self
                .tat
                .compare_exchange_weak(tat, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(()),
                Err(current) => tat = current,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at_ms(ms: u64) -> Instant {
        Instant::from_origin(Duration::from_millis(ms))
    }

    #[test]
    fn a_burst_that_would_outrun_the_clock_is_refused() {
        let year = 365.25 * 24.0 * 3600.0;
        for (rate, burst) in [(1.0 / year, 1000), (1e-10, 3), (1e-9, 20)] {
            let err = RateLimit::with_burst(rate, burst).unwrap_err();
            assert_eq!(err.setting(), "rate_limit", "{rate} {burst}");
        }
        assert_eq!(
            RateLimit::per_second(1e-10).unwrap_err().setting(),
            "rate_limit"
        );
        // On the bound (interval × burst exactly MAX_REFILL) accepted, one past it not.
        let on_the_bound = RateLimit::with_burst(1e9 / f64::from(1u32 << 31), 1 << 31).unwrap();
        assert_eq!(on_the_bound.interval().as_nanos(), 1 << 31);
        assert_eq!(on_the_bound.interval() * on_the_bound.burst(), MAX_REFILL);
        assert!(RateLimit::with_burst(1e9 / f64::from(1u32 << 31), (1 << 31) + 1).is_err());
        // Just inside the bound: granted as promised, the burst and no more.
        let limit = RateLimit::with_burst(1.0 / (100.0 * year), 1).unwrap();
        let b = TokenBucket::new(limit);
        let late = at_ms(200 * 365 * 24 * 3600 * 1000);
        assert_eq!(b.try_take(late), Ok(()));
        assert!(b.try_take(late).is_err());
        let b = TokenBucket::new(RateLimit::with_burst(1.0 / year, 140).unwrap());
        let taken = (0..1000).filter(|_| b.try_take(late).is_ok()).count();
        assert_eq!(taken, 140);
    }

    #[test]
    fn racing_takers_get_exactly_the_burst() {
        let b = std::sync::Arc::new(TokenBucket::new(RateLimit::with_burst(1.0, 1000).unwrap()));
        let taken: usize = (0..4)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || {
                    (0..500).filter(|_| b.try_take(at_ms(0)).is_ok()).count()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .sum();
        assert_eq!(taken, 1000);
        assert_eq!(b.try_take(at_ms(0)), Err(Duration::from_secs(1)));
    }

    #[test]
    fn next_token_at_is_when_try_take_first_succeeds() {
        let b = TokenBucket::new(RateLimit::with_burst(10.0, 3).unwrap());
        for _ in 0..3 {
            assert!(b.next_token_at() <= at_ms(0));
            assert_eq!(b.try_take(at_ms(0)), Ok(()));
        }
        assert_eq!(b.next_token_at(), at_ms(100));
        assert_eq!(b.try_take(at_ms(99)), Err(Duration::from_millis(1)));
        assert_eq!(b.try_take(at_ms(100)), Ok(()));
        assert_eq!(b.next_token_at(), at_ms(200));
        // After a quiet spell the bucket refills, and the instant lies in the past.
        assert!(b.next_token_at() <= at_ms(5_000));
        for _ in 0..3 {
            assert_eq!(b.try_take(at_ms(5_000)), Ok(()));
        }
        assert_eq!(b.next_token_at(), at_ms(5_100));
    }

    #[test]
    fn starts_full_then_refills_at_the_rate() {
        let b = TokenBucket::new(RateLimit::per_second(10.0).unwrap());
        for _ in 0..10 {
            assert_eq!(b.try_take(at_ms(0)), Ok(()));
        }
        assert_eq!(b.try_take(at_ms(0)), Err(Duration::from_millis(100)));
        assert_eq!(b.try_take(at_ms(50)), Err(Duration::from_millis(50)));
        assert_eq!(b.try_take(at_ms(100)), Ok(()));
        assert_eq!(b.try_take(at_ms(100)), Err(Duration::from_millis(100)));
    }

    #[test]
    fn hundredth_token_of_a_burst_of_ten_at_nine_seconds() {
        let b = TokenBucket::new(RateLimit::with_burst(10.0, 10).unwrap());
        let mut now = at_ms(0);
        let mut granted = Vec::new();
        // Each refusal names a wait after which the next take succeeds: 90 waits.
        for _ in 0..190 {
            match b.try_take(now) {
                Ok(()) => granted.push(now),
                Err(wait) => {
                    assert!(!wait.is_zero(), "a refusal with no wait at {now:?}");
                    now += wait;
                }
            }
            if granted.len() == 100 {
                break;
            }
        }
        assert_eq!(granted.len(), 100);
        assert_eq!(granted[9], at_ms(0));
        assert_eq!(granted[10], at_ms(100));
        assert_eq!(granted[99], at_ms(9_000));
    }

    #[test]
    fn grants_in_any_window_stay_within_burst_plus_rate() {
        let b = TokenBucket::new(RateLimit::with_burst(4.0, 3).unwrap());
        let mut grants = Vec::new();
        // Ask every 30 ms for 10 s.
        for step in 0..=333u64 {
            let now = at_ms(step * 30);
            while b.try_take(now).is_ok() {
                grants.push(now);
            }
        }
        for (i, start) in grants.iter().enumerate() {
            for window_ms in [0u64, 100, 250, 1000, 5000] {
                let end = *start + Duration::from_millis(window_ms);
                let n = grants[i..].iter().take_while(|t| **t <= end).count() as f64;
                assert!(
                    n <= 3.0 + 4.0 * window_ms as f64 / 1000.0 + 1e-9,
                    "{n} grants in {window_ms} ms"
                );
            }
        }
        // And the long-run rate holds.
        assert!((39..=44).contains(&grants.len()), "{}", grants.len());
    }

    #[test]
    fn the_interval_is_rounded_up_to_whole_nanoseconds() {
        let nanos = |rate: f64| RateLimit::per_second(rate).unwrap().interval().as_nanos();
        // Never faster than the rate: 3/s would grant a fourth token inside a second
        // with 333,333,333 ns.
        assert_eq!(nanos(3.0), 333_333_334);
        assert_eq!(nanos(23.0), 43_478_261);
        assert_eq!(nanos(2.4e8), 5);
        assert_eq!(nanos(7e8), 2);
        // Exact quotients stay exact, also through float error (1e9 / (1/49) is
        // 49,000,000,000.00001 in f64; 1/6 happens to divide exactly).
        assert_eq!(nanos(1.0 / 49.0), 49_000_000_000);
        assert_eq!(nanos(1.0 / 6.0), 6_000_000_000);
        assert_eq!(nanos(10.0), 100_000_000);
        assert_eq!(nanos(1e9), 1);
        // Faster than one a nanosecond: one a nanosecond.
        assert_eq!(nanos(5e9), 1);
        // 3/s never grants more than 3 + 3 × T tokens in a window of T.
        let bucket = TokenBucket::new(RateLimit::with_burst(3.0, 1).unwrap());
        let t0 = Instant::from_origin(Duration::from_secs(1));
        // Asked at every instant a grant could fall on, rounded down or up.
        let mut asks: Vec<u64> = (0..4u64)
            .flat_map(|k| [k * 333_333_333, k * 333_333_334])
            .filter(|&ns| ns <= 999_999_999)
            .collect();
        asks.sort_unstable();
        let granted = asks
            .into_iter()
            .filter(|&ns| {
                bucket
                    .try_take(t0.saturating_add(Duration::from_nanos(ns)))
                    .is_ok()
            })
            .count();
        assert_eq!(granted, 3, "1 + 3 × 0.999999999 < 4");
    }

    #[test]
    fn refuses_bad_rates_and_bursts() {
        for bad in [
            0.0,
            // 1e9 / -0.0 is -inf, which would cast to a 0 ns interval: refused as a
            // rate, not taken for the fastest one.
            -0.0,
            -1.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            1e-300,
        ] {
            assert_eq!(
                RateLimit::per_second(bad).unwrap_err().setting(),
                "rate_limit",
                "{bad}"
            );
        }
        assert_eq!(
            RateLimit::with_burst(1.0, 0).unwrap_err().setting(),
            "rate_limit.burst"
        );
        assert_eq!(RateLimit::per_second(0.5).unwrap().burst(), 1);
        // Rounded up, not to the nearest.
        assert_eq!(RateLimit::per_second(2.2).unwrap().burst(), 3);
        // A rate whose interval does not fit the bucket's nanoseconds says so.
        assert_eq!(
            RateLimit::per_second(1e-300).unwrap_err().reason(),
            "is too small"
        );
        assert_eq!(
            RateLimit::per_second(1e12).unwrap().interval(),
            Duration::from_nanos(1)
        );
        assert_eq!(RateLimit::per_second(1e300).unwrap().burst(), u32::MAX);
    }
}
