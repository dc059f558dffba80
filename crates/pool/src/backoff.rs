//! Exponential back-off with a 1 ms floor, and jitter.
//!
//! Two pure functions the attempt loop calls before every retry sleep:
//!
//! 1. [`backoff`] gives the policy's own delay for a retry: `min(max, base × 2^retry)`,
//!    never below [`MIN_BACKOFF`], so a schedule written with a zero `base` or `max`
//!    cannot make the loop spin.
//! 2. [`apply_jitter`] spreads a delay out with a random number the
//!    [`Runtime`](crate::Runtime) supplies, treating the policy's back-off and a
//!    server's requested delay differently ([`DelaySource`]):
//!
//! | jitter | policy back-off `b` | server delay `d` |
//! |---|---|---|
//! | [`Jitter::None`] | `b` | `d` |
//! | [`Jitter::Proportional(f)`](Jitter::Proportional) | `b + f × b × r` | `d + f × d × r` |
//! | [`Jitter::Full`] | `1 ms + (b − 1 ms) × r`, in `[1 ms, b]` | `d + 0.25 × d × r` |
//!
//! where `r` is the random number in `[0, 1)`. A server's delay is never shortened.
//!
//! Neither function panics on any input: arithmetic is done on `u128` nanoseconds with
//! checked or saturating operations, and every result saturates at [`Duration::MAX`].

use std::time::Duration;

use crate::policy::Jitter;

/// The floor of every back-off: 1 ms.
pub const MIN_BACKOFF: Duration = Duration::from_millis(1);

/// The share of a server's delay that [`Jitter::Full`] may add on top of it.
const FULL_JITTER_SERVER_SHARE: f64 = 0.25;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// Where a delay came from, which decides how jitter treats it.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DelaySource {
    /// The policy's own exponential back-off (the result of [`backoff`]).
    Policy,
    /// A delay the server asked for through `retry-after-ms` or `Retry-After`; jitter
    /// only ever lengthens it.
    Server,
}

/// Back-off before retry number `retry` (0-based: the first retry waits `base`), i.e.
/// `min(max, base × 2^retry)`.
///
/// The doubling saturates instead of overflowing, so any `retry` (up to `u32::MAX`)
/// and any durations (up to [`Duration::MAX`]) are fine. The result is never under
/// [`MIN_BACKOFF`], even if `base` or `max` is zero. If `max < base`, the result is
/// `max` (still floored at 1 ms).
///
/// ```
/// use std::time::Duration;
/// use vantage_api_pool::backoff::backoff;
///
/// let ms = Duration::from_millis;
/// let schedule: Vec<_> = (0..5).map(|r| backoff(ms(500), ms(3000), r)).collect();
/// assert_eq!(schedule, [ms(500), ms(1000), ms(2000), ms(3000), ms(3000)]);
/// assert_eq!(backoff(Duration::ZERO, ms(3000), 0), ms(1));
/// ```
#[must_use]
pub fn backoff(base: Duration, max: Duration, retry: u32) -> Duration {
    let base_ns = base.as_nanos();
    let max_ns = max.as_nanos();
    let doubled = if base_ns == 0 {
        0
    } else {
        // `1 << retry` only fits for retry < 128; past that the product is huge anyway.
        1u128
            .checked_shl(retry)
            .and_then(|factor| base_ns.checked_mul(factor))
            .unwrap_or(u128::MAX)
    };
    from_nanos_saturating(doubled.min(max_ns)).max(MIN_BACKOFF)
}

/// Applies jitter to `delay`, with `random` a value in `[0, 1)` supplied by the caller
/// (the runtime). See the [module table](self) for what each mode does.
///
/// Defensive handling of inputs the policy and runtime should never produce:
/// - `random` is clamped into `[0, 1)`: NaN and anything below 0 count as 0, anything
///   at or above 1 (including infinity) counts as the largest `f64` below 1.
/// - a `Proportional` factor that is negative or not finite adds nothing.
///
/// The random share is rounded to the nearest nanosecond. [`Jitter::Full`] on a policy
/// back-off of 1 ms or less gives 1 ms. Results saturate at [`Duration::MAX`]; a
/// [`DelaySource::Server`] delay is never shortened by any mode.
///
/// ```
/// use std::time::Duration;
/// use vantage_api_pool::Jitter;
/// use vantage_api_pool::backoff::{DelaySource, apply_jitter};
///
/// let s = Duration::from_secs(1);
/// assert_eq!(
///     apply_jitter(Jitter::Proportional(0.25), s, DelaySource::Policy, 0.5),
///     Duration::from_millis(1125)
/// );
/// assert_eq!(
///     apply_jitter(Jitter::Full, s, DelaySource::Policy, 0.0),
///     Duration::from_millis(1)
/// );
/// assert_eq!(
///     apply_jitter(Jitter::Full, s, DelaySource::Server, 0.0),
///     s
/// );
/// ```
#[must_use]
pub fn apply_jitter(jitter: Jitter, delay: Duration, source: DelaySource, random: f64) -> Duration {
    let r = clamp_unit(random);
    match (jitter, source) {
        (Jitter::None, _) => delay,
        (Jitter::Proportional(f), _) => add_share(delay, f, r),
        (Jitter::Full, DelaySource::Server) => add_share(delay, FULL_JITTER_SERVER_SHARE, r),
        (Jitter::Full, DelaySource::Policy) => {
            if delay <= MIN_BACKOFF {
                return MIN_BACKOFF;
            }
            let span = delay.as_nanos() - MIN_BACKOFF.as_nanos();
            let offset = scale_nanos(span, r).min(span);
            from_nanos_saturating(MIN_BACKOFF.as_nanos().saturating_add(offset))
        }
    }
}

/// Clamps a caller-supplied random number into `[0, 1)`.
fn clamp_unit(random: f64) -> f64 {
    // The largest f64 below 1.0.
    const JUST_BELOW_ONE: f64 = 1.0 - f64::EPSILON / 2.0;
    if random.is_nan() || random < 0.0 {
        0.0
    } else if random >= 1.0 {
        JUST_BELOW_ONE
    } else {
        random
    }
}

/// `delay + factor × delay × r`, saturating; a bad factor adds nothing.
fn add_share(delay: Duration, factor: f64, r: f64) -> Duration {
    if !factor.is_finite() || factor <= 0.0 {
        return delay;
    }
    let nanos = delay.as_nanos();
    let extra = scale_nanos(nanos, factor * r);
    from_nanos_saturating(nanos.saturating_add(extra))
}

/// `nanos × scale`, rounded to the nearest nanosecond; 0 for a non-positive or NaN
/// scale, saturating at `u128::MAX`.
fn scale_nanos(nanos: u128, scale: f64) -> u128 {
    if scale.is_nan() || scale <= 0.0 {
        return 0;
    }
    // Precision loss for huge delays is fine: the result is a random share anyway.
    #[allow(clippy::cast_precision_loss)]
    let product = (nanos as f64 * scale).round();
    // Float-to-int `as` saturates: infinity becomes u128::MAX.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let out = product as u128;
    out
}

/// A `Duration` from `u128` nanoseconds, saturating at [`Duration::MAX`].
fn from_nanos_saturating(nanos: u128) -> Duration {
    let secs = nanos / NANOS_PER_SEC;
    match u64::try_from(secs) {
        Ok(secs) => {
            // Always below 1e9, so it fits in u32 and `Duration::new` cannot carry over.
            let sub = u32::try_from(nanos % NANOS_PER_SEC).unwrap_or(0);
            Duration::new(secs, sub)
        }
        Err(_) => Duration::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    const RANDOMS: [f64; 3] = [0.0, 0.5, 0.999_999];

    #[test]
    fn schedule_doubles_from_base_and_caps_at_max() {
        let got: Vec<Duration> = (0..8).map(|r| backoff(ms(500), ms(10_000), r)).collect();
        assert_eq!(
            got,
            [
                ms(500),
                ms(1000),
                ms(2000),
                ms(4000),
                ms(8000),
                ms(10_000),
                ms(10_000),
                ms(10_000)
            ]
        );
        // Sub-millisecond precision is kept.
        assert_eq!(backoff(Duration::from_micros(1500), ms(1000), 1), ms(3));
    }

    #[test]
    fn zero_base_or_max_is_floored_at_one_millisecond() {
        assert_eq!(backoff(Duration::ZERO, ms(10_000), 0), MIN_BACKOFF);
        assert_eq!(backoff(Duration::ZERO, ms(10_000), 40), MIN_BACKOFF);
        assert_eq!(
            backoff(Duration::ZERO, Duration::ZERO, u32::MAX),
            MIN_BACKOFF
        );
        assert_eq!(backoff(ms(500), Duration::ZERO, 0), MIN_BACKOFF);
        assert_eq!(backoff(Duration::from_micros(10), ms(10), 0), MIN_BACKOFF);
        // 10 µs doubled seven times is 1.28 ms: above the floor.
        assert_eq!(
            backoff(Duration::from_micros(10), ms(10), 7),
            Duration::from_micros(1280)
        );
    }

    #[test]
    fn max_below_base_gives_max() {
        assert_eq!(backoff(ms(5000), ms(1000), 0), ms(1000));
        assert_eq!(backoff(ms(5000), ms(1000), 3), ms(1000));
        assert_eq!(backoff(ms(5000), Duration::from_micros(10), 3), MIN_BACKOFF);
    }

    #[test]
    fn huge_retries_and_durations_saturate_without_panicking() {
        for retry in [63, 64, 127, 128, 10_000, u32::MAX] {
            assert_eq!(backoff(Duration::MAX, Duration::MAX, retry), Duration::MAX);
            assert_eq!(backoff(ms(500), ms(10_000), retry), ms(10_000));
            assert_eq!(backoff(Duration::from_nanos(1), Duration::MAX, retry), {
                // 2^retry ns, saturated at Duration::MAX.
                let ns = 1u128.checked_shl(retry).unwrap_or(u128::MAX);
                from_nanos_saturating(ns)
            });
        }
        assert_eq!(backoff(Duration::MAX, ms(10_000), 10_000), ms(10_000));
        assert_eq!(backoff(Duration::MAX, Duration::MAX, 0), Duration::MAX);
    }

    #[test]
    fn no_jitter_leaves_every_delay_alone() {
        for source in [DelaySource::Policy, DelaySource::Server] {
            for r in RANDOMS {
                assert_eq!(apply_jitter(Jitter::None, ms(1000), source, r), ms(1000));
                assert_eq!(
                    apply_jitter(Jitter::None, Duration::ZERO, source, r),
                    Duration::ZERO
                );
            }
        }
    }

    #[test]
    fn proportional_jitter_adds_exactly_f_times_delay_times_random() {
        let f = Jitter::Proportional(0.25);
        for source in [DelaySource::Policy, DelaySource::Server] {
            assert_eq!(apply_jitter(f, ms(1000), source, 0.0), ms(1000));
            assert_eq!(apply_jitter(f, ms(1000), source, 0.5), ms(1125));
            assert_eq!(
                apply_jitter(f, ms(1000), source, 0.999_999),
                Duration::from_nanos(1_249_999_750)
            );
        }
        assert_eq!(
            apply_jitter(Jitter::Proportional(1.0), ms(400), DelaySource::Policy, 0.5),
            ms(600)
        );
        assert_eq!(
            apply_jitter(Jitter::Proportional(0.0), ms(400), DelaySource::Policy, 0.9),
            ms(400)
        );
    }

    #[test]
    fn full_jitter_on_policy_backoff_is_uniform_from_one_millisecond_to_the_delay() {
        assert_eq!(
            apply_jitter(Jitter::Full, ms(1001), DelaySource::Policy, 0.0),
            ms(1)
        );
        assert_eq!(
            apply_jitter(Jitter::Full, ms(1001), DelaySource::Policy, 0.5),
            ms(501)
        );
        assert_eq!(
            apply_jitter(Jitter::Full, ms(1001), DelaySource::Policy, 0.999_999),
            Duration::from_micros(1_000_999)
        );
        // Range [1 ms, delay] over many draws and delays.
        for delay in [ms(1), ms(2), ms(250), ms(10_000), Duration::MAX] {
            for i in 0..=1000 {
                let r = f64::from(i) / 1000.0;
                let got = apply_jitter(Jitter::Full, delay, DelaySource::Policy, r);
                assert!(
                    got >= MIN_BACKOFF && got <= delay,
                    "{delay:?} at {r}: {got:?}"
                );
            }
        }
        // At or under 1 ms the draw collapses to the floor.
        for d in [Duration::ZERO, Duration::from_micros(500), ms(1)] {
            assert_eq!(
                apply_jitter(Jitter::Full, d, DelaySource::Policy, 0.7),
                ms(1)
            );
        }
    }

    #[test]
    fn full_jitter_on_server_delay_adds_up_to_a_quarter() {
        let d = ms(2000);
        assert_eq!(
            apply_jitter(Jitter::Full, d, DelaySource::Server, 0.0),
            ms(2000)
        );
        assert_eq!(
            apply_jitter(Jitter::Full, d, DelaySource::Server, 0.5),
            ms(2250)
        );
        assert_eq!(
            apply_jitter(Jitter::Full, d, DelaySource::Server, 0.999_999),
            Duration::from_nanos(2_499_999_500)
        );
    }

    #[test]
    fn a_random_number_out_of_range_is_clamped_into_zero_to_just_below_one() {
        // A runtime's `random()` should be in [0, 1); 1.0 itself counts as the largest
        // value below it, so Proportional(1.0) never doubles a delay outright.
        assert!(clamp_unit(1.0) < 1.0);
        assert_eq!(clamp_unit(1.0), clamp_unit(7.0));
        assert_eq!(clamp_unit(f64::INFINITY), clamp_unit(1.0));
        assert_eq!(clamp_unit(-0.5), 0.0);
        assert_eq!(clamp_unit(f64::NAN), 0.0);
        assert_eq!(clamp_unit(0.25), 0.25);
        let big = Duration::from_nanos(1 << 60);
        assert_eq!(
            apply_jitter(Jitter::Proportional(1.0), big, DelaySource::Policy, 1.0),
            Duration::from_nanos((1 << 61) - 128)
        );
    }

    #[test]
    fn server_delay_is_never_shortened() {
        let modes = [
            Jitter::None,
            Jitter::Proportional(0.0),
            Jitter::Proportional(0.25),
            Jitter::Proportional(3.0),
            Jitter::Proportional(-1.0),
            Jitter::Proportional(f64::NAN),
            Jitter::Full,
        ];
        let delays = [
            Duration::ZERO,
            Duration::from_nanos(1),
            ms(1),
            ms(1500),
            Duration::MAX,
        ];
        let randoms = [0.0, 0.5, 0.999_999, -1.0, 1.0, 7.0, f64::NAN, f64::INFINITY];
        for j in modes {
            for d in delays {
                for r in randoms {
                    assert!(
                        apply_jitter(j, d, DelaySource::Server, r) >= d,
                        "{j:?} {d:?} {r}"
                    );
                }
            }
        }
    }

    #[test]
    fn out_of_range_random_is_clamped() {
        let p = Jitter::Proportional(0.25);
        for bad_low in [f64::NAN, -0.5, -1.0, f64::NEG_INFINITY, -0.0] {
            assert_eq!(
                apply_jitter(p, ms(1000), DelaySource::Policy, bad_low),
                ms(1000)
            );
            assert_eq!(
                apply_jitter(Jitter::Full, ms(1000), DelaySource::Policy, bad_low),
                ms(1)
            );
        }
        for bad_high in [1.0, 1.5, f64::INFINITY] {
            // Just below 1: 1 s + 250 ms × (1 − 2⁻⁵³) rounds to 1.25 s.
            assert_eq!(
                apply_jitter(p, ms(1000), DelaySource::Policy, bad_high),
                ms(1250)
            );
            let full = apply_jitter(Jitter::Full, ms(1000), DelaySource::Policy, bad_high);
            assert!(full <= ms(1000) && full >= ms(999));
        }
    }

    #[test]
    fn bad_proportional_factor_adds_nothing() {
        for f in [-0.5, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            for source in [DelaySource::Policy, DelaySource::Server] {
                assert_eq!(
                    apply_jitter(Jitter::Proportional(f), ms(800), source, 0.5),
                    ms(800)
                );
            }
        }
    }

    #[test]
    fn jitter_saturates_at_duration_max() {
        for source in [DelaySource::Policy, DelaySource::Server] {
            assert_eq!(
                apply_jitter(Jitter::Proportional(0.25), Duration::MAX, source, 0.999_999),
                Duration::MAX
            );
            assert_eq!(
                apply_jitter(Jitter::Proportional(f64::MAX), ms(1), source, 0.999_999),
                Duration::MAX
            );
        }
        assert_eq!(
            apply_jitter(Jitter::Full, Duration::MAX, DelaySource::Server, 0.5),
            Duration::MAX
        );
    }

    #[test]
    fn a_zero_base_stays_at_the_floor_past_the_128th_retry() {
        // `UntilCancelled { base: ZERO, .. }` reaches these retries; 2^128 no longer
        // fits, and must not read as "past the ceiling".
        for retry in [127, 128, 1_000, u32::MAX] {
            assert_eq!(
                backoff(Duration::ZERO, ms(10_000), retry),
                MIN_BACKOFF,
                "retry {retry}"
            );
        }
    }
}
