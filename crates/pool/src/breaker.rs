//! The circuit breaker: stop sending to an API that is down, and find out when it is
//! back with a single probe.
//!
//! ```text
//!        threshold failures, no 2xx between
//!   Closed ─────────────────────────────────▶ Open(cooldown)
//!     ▲                                          │ cooldown elapses
//!     │ success / reachable answer               ▼
//!     │ (cooldown back to its base)           HalfOpen ── one caller granted the probe
//!     │                                          │
//!     └──────────────────────────────────────────┤ probe fails
//!                                                ▼
//!                                     Open(min(2 × cooldown, max))
//! ```
//!
//! **Probe epochs.** Every grant of the probe slot carries a fresh epoch. A
//! [`ProbeGuard`] frees the slot on drop only if its epoch is still the current one,
//! and a failure doubles the cooldown only when it is reported with the current
//! probe's epoch. So a cancelled prober cannot wedge the breaker, a stale guard
//! cannot free a newer grant's slot, and a failure from a request that started
//! before the breaker opened is not taken for a failed probe. A success or a
//! reachable answer from any epoch closes an open breaker: it proves the API answers.
//!
//! **Manual reset.** [`CircuitBreaker::reset`] closes the breaker whatever its state
//! (failures cleared, cooldown back to its base, probe slot freed) and wakes the
//! callers waiting out a cooldown; callers waiting for a probe in flight see it at
//! their next look, at most [`PROBE_RECHECK`] later. An answer that closes the
//! breaker (a straggler's while it is open, sent before it opened, or the probe's)
//! wakes the callers still waiting out a cooldown the same way, so they do not
//! sleep on while new callers go. Nothing else wakes anyone: callers waiting for a
//! probe in flight find its answer at their next look, and a cooldown that nothing
//! cuts short is slept out.
//!
//! The breaker is a synchronous state machine: it takes `now` and returns a decision.
//! Its lock is held only inside its methods, never across an `.await` or a callback.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::classify::BreakerEffect;
use crate::error::ConfigError;
use crate::sync::{
    AtomicBool, Mutex, MutexGuard, Ordering, PoisonError, ToWake, WakeOnDrop, Wakers,
};
use crate::time::Instant;

/// How long a caller that finds the probe slot taken waits before asking again:
/// 5 ms. Callers that wait for the probe ([`BreakerMode::WaitForProbe`]) are not woken
/// when it ends: they ask again every `PROBE_RECHECK`, so once a probe's answer has
/// closed the breaker they go at their first recheck at or after that moment (up to
/// 5 ms later), and when it failed they find the breaker open again and sleep out
/// the new cooldown. Which waiter sends the next probe is not specified. A
/// [`CircuitBreaker::reset`] is found at the next recheck too (a caller waiting out a
/// cooldown, a longer wait, is woken by it, and by any answer that closes the
/// breaker).
///
/// [`BreakerMode::WaitForProbe`]: crate::BreakerMode::WaitForProbe
pub const PROBE_RECHECK: Duration = Duration::from_millis(5);

/// The breaker's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BreakerConfig {
    threshold: u32,
    cooldown: Duration,
    max_cooldown: Duration,
}

impl Default for BreakerConfig {
    /// [`BreakerConfig::default_breaker`]: threshold 5, cooldown 5 s doubling to 60 s.
    fn default() -> Self {
        BreakerConfig::default_breaker()
    }
}

impl BreakerConfig {
    /// Opens after `threshold` failures with no success (2xx) between them, for
    /// `cooldown`, doubling after each failed probe up to `max_cooldown`.
    ///
    /// A reachable answer (a 1xx or 3xx, a 4xx other than 408 and 429) neither counts
    /// nor ends the run: `503, 404, 503, 404, 503` opens a breaker of threshold 3. It
    /// does close an open breaker (the API answers), keeping the run, so the next
    /// failure opens it again at once. 408, 429 and the other untouched outcomes (see
    /// [`classify`](crate::classify::classify)) leave the breaker as it is.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `breaker.threshold` for a threshold of 0, or
    /// `breaker.cooldown` for a zero cooldown or one above `max_cooldown`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool::breaker::BreakerConfig;
    /// assert!(BreakerConfig::new(5, Duration::from_secs(5), Duration::from_secs(60)).is_ok());
    /// let err = BreakerConfig::new(0, Duration::from_secs(5), Duration::from_secs(60)).unwrap_err();
    /// assert_eq!(err.setting(), "breaker.threshold");
    /// ```
    pub fn new(
        threshold: u32,
        cooldown: Duration,
        max_cooldown: Duration,
    ) -> Result<Self, ConfigError> {
        if threshold == 0 {
            return Err(ConfigError::new("breaker.threshold", "must be at least 1"));
        }
        if cooldown.is_zero() {
            return Err(ConfigError::new(
                "breaker.cooldown",
                "must be greater than zero",
            ));
        }
        if cooldown > max_cooldown {
            return Err(ConfigError::new(
                "breaker.cooldown",
                "must not exceed breaker.max_cooldown",
            ));
        }
        Ok(BreakerConfig {
            threshold,
            cooldown,
            max_cooldown,
        })
    }

    /// Threshold 5, cooldown 5 s doubling to 60 s (also [`BreakerConfig::default`]).
    #[must_use]
    pub fn default_breaker() -> Self {
        BreakerConfig {
            threshold: 5,
            cooldown: Duration::from_secs(5),
            max_cooldown: Duration::from_secs(60),
        }
    }

    /// Failures with no success between them that open the breaker.
    #[must_use]
    pub fn threshold(&self) -> u32 {
        self.threshold
    }

    /// The first cooldown.
    #[must_use]
    pub fn cooldown(&self) -> Duration {
        self.cooldown
    }

    /// The longest cooldown.
    #[must_use]
    pub fn max_cooldown(&self) -> Duration {
        self.max_cooldown
    }
}

/// What [`breaker_state`](crate::ResilientClient::breaker_state) reports.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BreakerState {
    /// Requests flow.
    Closed,
    /// Requests are refused until `until`.
    Open {
        /// When the cooldown ends and a probe may go.
        until: Instant,
    },
    /// The cooldown ended: one probe may go, or is in flight.
    HalfOpen,
}

/// The breaker's answer to "may I send?".
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Send. `probe: Some(epoch)` makes this send the half-open probe.
    Allow {
        /// The probe's epoch, when this send is the probe.
        probe: Option<u64>,
    },
    /// The breaker is open (or a probe is in flight): ask again after this long.
    OpenFor(Duration),
}

/// A change of the breaker's state, to report after the send's terminal event.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Opened, or a probe failed and it stays open for a cooldown twice the last
    /// (at most the configured maximum: once there, the same again).
    Opened {
        /// How long it stays open.
        cooldown: Duration,
    },
    /// Closed by a success or a reachable answer, or by [`CircuitBreaker::reset`].
    Closed,
}

#[derive(Debug)]
enum Mode {
    Closed,
    Open { until: Instant },
    HalfOpen,
}

#[derive(Debug)]
struct State {
    mode: Mode,
    consecutive_failures: u32,
    cooldown: Duration,
    epoch: u64,
    probe: Option<u64>,
    /// How many times the breaker was closed by a [`reset`](CircuitBreaker::reset)
    /// or by an answer while open: what callers waiting out a cooldown wait for.
    closes: u64,
    /// Callers waiting out a cooldown, to wake when the breaker closes that way.
    waiting: Wakers,
}

impl State {
    /// Counts a close (a reset, or an answer while open) and takes the callers
    /// waiting out a cooldown, to wake once the lock is released.
    fn closed(&mut self) -> ToWake {
        self.closes = self.closes.wrapping_add(1);
        self.waiting.take()
    }
}

/// Why [`CircuitBreaker::admit`] refused a send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Open for `wait` more. `closes` is the breaker's count of closes (resets, and
    /// answers while open) when it said so: a wait for
    /// [`CircuitBreaker::closed_since`] with it ends at the next one.
    Cooldown { wait: Duration, closes: u64 },
    /// Another caller's probe is out: look again after [`PROBE_RECHECK`] (no
    /// reset wakes such a caller; it sees one at its next look).
    ProbeOut,
}

/// A circuit breaker. See the module docs.
#[derive(Debug)]
pub struct CircuitBreaker {
    config: BreakerConfig,
    state: Mutex<State>,
    /// Whether the state is "closed, no failures in a row": then a check lets any
    /// send through and a success or a reachable answer changes nothing, so both
    /// skip the lock. Written under the lock after every change of the state.
    quiet: AtomicBool,
}

impl CircuitBreaker {
    /// A closed breaker with `config`.
    #[must_use]
    pub fn new(config: BreakerConfig) -> Self {
        CircuitBreaker {
            config,
            state: Mutex::new(State {
                mode: Mode::Closed,
                consecutive_failures: 0,
                cooldown: config.cooldown,
                epoch: 0,
                probe: None,
                closes: 0,
                waiting: Wakers::default(),
            }),
            quiet: AtomicBool::new(true),
        }
    }

    /// The settings.
    #[must_use]
    pub fn config(&self) -> BreakerConfig {
        self.config
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent even if a holder panicked: every method
        // writes whole fields.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Publishes whether `s` is quiet (see [`CircuitBreaker::quiet`]); called with
    /// the lock held, after a change.
    fn publish(&self, s: &State) {
        self.quiet.store(
            matches!(s.mode, Mode::Closed) && s.consecutive_failures == 0,
            Ordering::Release,
        );
    }

    /// May a send go at `now`? Grants the probe slot to exactly one caller once the
    /// cooldown has elapsed. A grant (`Allow { probe: Some(epoch) }`) holds the slot
    /// until [`record`](Self::record) with that epoch or
    /// [`release_probe`](Self::release_probe): wrap it in a [`ProbeGuard`] at once, so
    /// a send that is dropped or fails to start frees it.
    #[must_use]
    pub fn check(&self, now: Instant) -> Gate {
        match self.admit(now) {
            Ok(probe) => Gate::Allow { probe },
            Err(Refusal::Cooldown { wait, .. }) => Gate::OpenFor(wait),
            Err(Refusal::ProbeOut) => Gate::OpenFor(PROBE_RECHECK),
        }
    }

    /// [`check`](Self::check) as the attempt loop needs it: the probe's epoch if the
    /// send is the probe, or why it is refused, with what a wait for a
    /// [`reset`](Self::reset) needs, read under the same lock.
    #[inline]
    pub(crate) fn admit(&self, now: Instant) -> Result<Option<u64>, Refusal> {
        if self.quiet.load(Ordering::Acquire) {
            return Ok(None);
        }
        let mut s = self.lock();
        match s.mode {
            Mode::Closed => Ok(None),
            Mode::Open { until } if now < until => Err(Refusal::Cooldown {
                wait: until.saturating_duration_since(now),
                closes: s.closes,
            }),
            Mode::Open { .. } | Mode::HalfOpen => {
                if s.probe.is_some() {
                    return Err(Refusal::ProbeOut);
                }
                // Open to half-open: neither is quiet, so nothing to publish.
                s.mode = Mode::HalfOpen;
                s.epoch += 1;
                s.probe = Some(s.epoch);
                Ok(s.probe)
            }
        }
    }

    /// Whether `epoch` still holds the probe slot. A grant goes stale when the breaker
    /// closes (or closes and opens again) while its holder waits at the gate.
    #[must_use]
    pub fn holds_probe(&self, epoch: u64) -> bool {
        self.lock().probe == Some(epoch)
    }

    /// Records what a send proved. `probe` is the epoch it was granted, if it was the
    /// probe. Returns the transition to report, if any. Frees the probe slot when the
    /// epoch is current. An answer that closes the breaker wakes the callers waiting
    /// out its cooldown, once the lock is released.
    pub fn record(
        &self,
        effect: BreakerEffect,
        probe: Option<u64>,
        now: Instant,
    ) -> Option<Transition> {
        let (transition, wake) = self.record_then_wake(effect, probe, now);
        drop(wake);
        transition
    }

    /// [`record`](Self::record), leaving the callers a close woke to the returned
    /// guard: they are woken when it drops, after the caller has reported the send
    /// and the transition (so no waiter goes before the report, and a waker that
    /// panics cannot keep the report from being made).
    #[inline]
    pub(crate) fn record_then_wake(
        &self,
        effect: BreakerEffect,
        probe: Option<u64>,
        now: Instant,
    ) -> (Option<Transition>, Option<WakeOnDrop>) {
        if probe.is_none()
            && matches!(effect, BreakerEffect::Success | BreakerEffect::Reachable)
            && self.quiet.load(Ordering::Acquire)
        {
            // Closed with no failures in a row: nothing to change, nothing to report.
            return (None, None);
        }
        self.record_then_wake_locked(effect, probe, now)
    }

    /// [`record_then_wake`](Self::record_then_wake) past its lock-free look: out of
    /// line, so the look inlines into the loop without the locked path.
    #[inline(never)]
    fn record_then_wake_locked(
        &self,
        effect: BreakerEffect,
        probe: Option<u64>,
        now: Instant,
    ) -> (Option<Transition>, Option<WakeOnDrop>) {
        let mut s = self.lock();
        let transition = self.record_locked(&mut s, effect, probe, now);
        // An answer that closed it: the callers waiting out the cooldown go too (the
        // other callers already go at their next look).
        let waiting = (transition == Some(Transition::Closed)).then(|| s.closed());
        self.publish(&s);
        drop(s);
        (transition, waiting.map(ToWake::on_drop))
    }

    fn record_locked(
        &self,
        s: &mut State,
        effect: BreakerEffect,
        probe: Option<u64>,
        now: Instant,
    ) -> Option<Transition> {
        let is_current_probe = probe.is_some() && probe == s.probe;
        if is_current_probe {
            s.probe = None;
        }
        let was_closed = matches!(s.mode, Mode::Closed);
        match effect {
            BreakerEffect::Success | BreakerEffect::Reachable => {
                if effect == BreakerEffect::Success {
                    s.consecutive_failures = 0;
                }
                if was_closed {
                    return None;
                }
                s.mode = Mode::Closed;
                s.cooldown = self.config.cooldown;
                s.probe = None;
                Some(Transition::Closed)
            }
            BreakerEffect::Failure => {
                s.consecutive_failures = s.consecutive_failures.saturating_add(1);
                if is_current_probe && matches!(s.mode, Mode::HalfOpen) {
                    s.cooldown = s.cooldown.saturating_mul(2).min(self.config.max_cooldown);
                } else if !(was_closed && s.consecutive_failures >= self.config.threshold) {
                    return None;
                }
                let cooldown = s.cooldown;
                s.mode = Mode::Open {
                    until: now.saturating_add(cooldown),
                };
                Some(Transition::Opened { cooldown })
            }
            _ => None,
        }
    }

    /// Frees the probe slot if `epoch` is still the current grant (a dropped prober).
    pub fn release_probe(&self, epoch: u64) {
        let mut s = self.lock();
        if s.probe == Some(epoch) {
            s.probe = None;
        }
    }

    /// Closes the breaker now, whatever its state, as a manual override for an
    /// operator who knows the API is back: the run of failures is cleared, the
    /// cooldown goes back to its base, and the probe slot is freed (a probe in
    /// flight is no longer the probe: its answer counts as any send's). The attempt
    /// loop's callers waiting out a cooldown are woken to ask again. Returns
    /// [`Transition::Closed`] when the breaker was open or half-open (`None` when it
    /// was closed already: only its run of failures, if any, is cleared).
    pub fn reset(&self) -> Option<Transition> {
        self.reset_then(|_| ())
    }

    /// [`reset`](Self::reset), calling `report` with the transition once the lock is
    /// released and before the waiting callers are woken (who are woken all the
    /// same if `report` panics, and whose wakers, should one panic, cannot keep the
    /// report from being made).
    pub(crate) fn reset_then(&self, report: impl FnOnce(Option<Transition>)) -> Option<Transition> {
        let (transition, waiting) = {
            let mut s = self.lock();
            let was_closed = matches!(s.mode, Mode::Closed);
            s.mode = Mode::Closed;
            s.consecutive_failures = 0;
            s.cooldown = self.config.cooldown;
            s.probe = None;
            let waiting = s.closed();
            self.publish(&s);
            ((!was_closed).then_some(Transition::Closed), waiting)
        };
        let waiting = waiting.on_drop();
        report(transition);
        drop(waiting);
        transition
    }

    /// Ready at the first close (a [`reset`](Self::reset), or an answer while open)
    /// after the one that made the count `seen` (a [`Refusal::Cooldown`]'s `closes`,
    /// read under the lock that refused).
    pub(crate) fn closed_since(&self, seen: u64) -> CloseWait<'_> {
        CloseWait {
            breaker: self,
            seen,
            key: None,
        }
    }

    /// The state at `now`, for consumers that poll.
    #[must_use]
    pub fn state(&self, now: Instant) -> BreakerState {
        let s = self.lock();
        match s.mode {
            Mode::Closed => BreakerState::Closed,
            Mode::Open { until } if now < until => BreakerState::Open { until },
            Mode::Open { .. } | Mode::HalfOpen => BreakerState::HalfOpen,
        }
    }

    /// The current run of failures: those since the last success (2xx); reachable
    /// answers between them neither count nor end it.
    #[must_use]
    pub fn consecutive_failures(&self) -> u32 {
        self.lock().consecutive_failures
    }

    /// Whether a probe slot is currently granted.
    #[must_use]
    pub fn probe_in_flight(&self) -> bool {
        self.lock().probe.is_some()
    }
}

/// Waits for a close of the breaker (a [`CircuitBreaker::reset`], or an answer while
/// open) after the `seen`-th (made by [`CircuitBreaker::closed_since`]). Dropped while
/// it waits, it takes its waker back out, so a caller that gives up leaves nothing
/// behind.
#[must_use = "futures do nothing unless polled"]
#[derive(Debug)]
pub(crate) struct CloseWait<'a> {
    breaker: &'a CircuitBreaker,
    seen: u64,
    /// Its key among the breaker's waiting callers, once it registered.
    key: Option<u64>,
}

impl Future for CloseWait<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let breaker = self.breaker;
        let mut s = breaker.lock();
        // Under the lock closes are counted under: a close either came before this
        // look, or will find this waker registered.
        if s.closes != self.seen {
            return Poll::Ready(());
        }
        let replaced = s.waiting.register(&mut self.key, cx.waker());
        drop(s);
        drop(replaced);
        Poll::Pending
    }
}

impl Drop for CloseWait<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            // Gone already if a close woke it. Dropped after the lock.
            let removed = self.breaker.lock().waiting.remove(key);
            drop(removed);
        }
    }
}

/// Frees the probe slot of epoch `epoch` when dropped, if that epoch is still current.
#[must_use = "dropping the guard frees the probe slot at once"]
#[derive(Debug)]
pub struct ProbeGuard<'a> {
    breaker: &'a CircuitBreaker,
    epoch: u64,
}

impl<'a> ProbeGuard<'a> {
    /// Guards the probe slot of `epoch`.
    pub fn new(breaker: &'a CircuitBreaker, epoch: u64) -> Self {
        ProbeGuard { breaker, epoch }
    }

    /// The guarded epoch.
    #[must_use]
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        self.breaker.release_probe(self.epoch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use BreakerEffect::*;

    fn at(secs: u64) -> Instant {
        Instant::from_origin(Duration::from_secs(secs))
    }

    fn breaker() -> CircuitBreaker {
        CircuitBreaker::new(BreakerConfig::default_breaker())
    }

    #[test]
    fn keeps_the_settings_it_was_made_with() {
        let config =
            BreakerConfig::new(7, Duration::from_secs(3), Duration::from_secs(40)).unwrap();
        assert_ne!(config, BreakerConfig::default());
        assert_eq!(CircuitBreaker::new(config).config(), config);
    }

    #[test]
    fn the_lock_free_paths_follow_every_change_of_state() {
        let b = breaker();
        assert!(b.quiet.load(Ordering::Relaxed));
        // A failure below the threshold: no longer quiet, and a success (not a mere
        // reachable answer) makes it quiet again.
        assert_eq!(b.record(Failure, None, at(0)), None);
        assert!(!b.quiet.load(Ordering::Relaxed));
        assert_eq!(b.record(Reachable, None, at(0)), None);
        assert_eq!(b.consecutive_failures(), 1);
        assert!(!b.quiet.load(Ordering::Relaxed));
        assert_eq!(b.record(Success, None, at(0)), None);
        assert_eq!(b.consecutive_failures(), 0);
        assert!(b.quiet.load(Ordering::Relaxed));
        // Open: a check never takes the lock-free "allow".
        open_it(&b, at(1));
        assert!(!b.quiet.load(Ordering::Relaxed));
        assert!(matches!(b.check(at(2)), Gate::OpenFor(_)));
        // Half-open, then closed by the probe's success: quiet again.
        let Gate::Allow { probe: Some(epoch) } = b.check(at(100)) else {
            panic!("the probe slot after the cooldown")
        };
        assert!(!b.quiet.load(Ordering::Relaxed));
        assert_eq!(
            b.record(Success, Some(epoch), at(100)),
            Some(Transition::Closed)
        );
        assert!(b.quiet.load(Ordering::Relaxed));
        assert_eq!(b.check(at(100)), Gate::Allow { probe: None });
    }

    #[test]
    fn a_probe_grant_goes_stale_when_the_breaker_closes() {
        let b = breaker();
        open_it(&b, at(0));
        let Gate::Allow { probe: Some(epoch) } = b.check(at(5)) else {
            panic!("the probe slot after the cooldown")
        };
        assert!(b.holds_probe(epoch));
        // Closed by any answer: the grant goes stale, and stays stale.
        assert_eq!(b.record(Reachable, None, at(6)), Some(Transition::Closed));
        assert!(!b.holds_probe(epoch));
        // A reachable answer keeps the failure run: one more failure opens again.
        assert!(matches!(
            b.record(Failure, None, at(7)),
            Some(Transition::Opened { .. })
        ));
        assert!(!b.holds_probe(epoch));
    }

    fn open_it(b: &CircuitBreaker, now: Instant) {
        for i in 0..5 {
            assert_eq!(b.check(now), Gate::Allow { probe: None });
            let t = b.record(Failure, None, now);
            assert_eq!(t.is_some(), i == 4, "opens on the 5th failure");
        }
    }

    #[test]
    fn opens_after_threshold_and_doubles_on_failed_probes() {
        let b = breaker();
        open_it(&b, at(0));
        assert_eq!(b.state(at(1)), BreakerState::Open { until: at(5) });
        assert_eq!(b.check(at(4)), Gate::OpenFor(Duration::from_secs(1)));
        // At the end of the cooldown exactly, `state` and `check` agree: half-open.
        assert_eq!(b.state(at(5)), BreakerState::HalfOpen);
        let mut t = 5;
        for want in [10, 20, 40, 60, 60] {
            let Gate::Allow { probe: Some(epoch) } = b.check(at(t)) else {
                panic!("probe at {t}")
            };
            assert_eq!(
                b.check(at(t)),
                Gate::OpenFor(PROBE_RECHECK),
                "one probe at a time"
            );
            assert_eq!(
                b.record(Failure, Some(epoch), at(t)),
                Some(Transition::Opened {
                    cooldown: Duration::from_secs(want)
                })
            );
            t += want;
        }
        assert_eq!(t, 195);
        let Gate::Allow { probe: Some(epoch) } = b.check(at(t)) else {
            panic!()
        };
        assert_eq!(
            b.record(Success, Some(epoch), at(t)),
            Some(Transition::Closed)
        );
        assert_eq!(b.state(at(t)), BreakerState::Closed);
        // The next opening starts again at the base cooldown.
        open_it(&b, at(300));
        assert_eq!(b.state(at(300)), BreakerState::Open { until: at(305) });
    }

    #[test]
    fn reachable_closes_but_keeps_the_failure_run() {
        let b = CircuitBreaker::new(
            BreakerConfig::new(3, Duration::from_secs(5), Duration::from_secs(60)).unwrap(),
        );
        // 503, 404, 503, 404, 503 opens on the third 503.
        assert_eq!(b.record(Failure, None, at(0)), None);
        assert_eq!(b.record(Reachable, None, at(0)), None);
        assert_eq!(b.record(Failure, None, at(0)), None);
        assert_eq!(b.record(Reachable, None, at(0)), None);
        assert_eq!(
            b.record(Failure, None, at(0)),
            Some(Transition::Opened {
                cooldown: Duration::from_secs(5)
            })
        );
        // A reachable answer closes an open breaker, once.
        assert_eq!(b.record(Reachable, None, at(1)), Some(Transition::Closed));
        assert_eq!(b.record(Reachable, None, at(1)), None);
        assert_eq!(b.consecutive_failures(), 3);
        // Untouched says nothing.
        assert_eq!(b.record(Untouched, None, at(1)), None);
        assert_eq!(b.consecutive_failures(), 3);
    }

    #[test]
    fn a_reachable_answer_that_closes_it_sets_the_cooldown_back_to_its_base() {
        let b = CircuitBreaker::new(
            BreakerConfig::new(3, Duration::from_secs(5), Duration::from_secs(60)).unwrap(),
        );
        for _ in 0..3 {
            b.record(Failure, None, at(0));
        }
        // A failed probe doubles the cooldown to 10 s.
        let Gate::Allow { probe: Some(epoch) } = b.check(at(5)) else {
            panic!("probe at 5")
        };
        assert_eq!(
            b.record(Failure, Some(epoch), at(5)),
            Some(Transition::Opened {
                cooldown: Duration::from_secs(10)
            })
        );
        // A 404 (reachable, not a success) closes it: the failure run stays, so the
        // next failure opens it again at once, for the base cooldown.
        assert_eq!(b.record(Reachable, None, at(6)), Some(Transition::Closed));
        assert_eq!(
            b.record(Failure, None, at(7)),
            Some(Transition::Opened {
                cooldown: Duration::from_secs(5)
            })
        );
        assert_eq!(b.state(at(7)), BreakerState::Open { until: at(12) });
    }

    #[test]
    fn stale_epochs_cannot_free_or_fail_a_newer_probe() {
        let b = breaker();
        open_it(&b, at(0));
        let Gate::Allow { probe: Some(first) } = b.check(at(5)) else {
            panic!()
        };
        // The first prober is dropped: its guard frees the slot.
        drop(ProbeGuard::new(&b, first));
        let Gate::Allow {
            probe: Some(second),
        } = b.check(at(5))
        else {
            panic!("next caller gets the probe")
        };
        assert_ne!(first, second);
        // A stale guard cannot free the newer grant's slot.
        drop(ProbeGuard::new(&b, first));
        assert!(b.probe_in_flight());
        assert_eq!(b.check(at(5)), Gate::OpenFor(PROBE_RECHECK));
        // A failure reported with a stale epoch (or none) is not a failed probe.
        assert_eq!(b.record(Failure, Some(first), at(5)), None);
        assert_eq!(b.record(Failure, None, at(5)), None);
        assert!(b.probe_in_flight());
        // The current probe's failure doubles the cooldown.
        assert_eq!(
            b.record(Failure, Some(second), at(6)),
            Some(Transition::Opened {
                cooldown: Duration::from_secs(10)
            })
        );
        // A late success from a stale epoch still closes.
        assert_eq!(
            b.record(Success, Some(first), at(7)),
            Some(Transition::Closed)
        );
    }

    #[test]
    fn untouched_probe_outcome_frees_the_slot_without_transition() {
        let b = breaker();
        open_it(&b, at(0));
        let Gate::Allow { probe: Some(epoch) } = b.check(at(5)) else {
            panic!()
        };
        assert_eq!(b.record(Untouched, Some(epoch), at(5)), None);
        assert!(!b.probe_in_flight());
        assert!(matches!(b.check(at(5)), Gate::Allow { probe: Some(_) }));
    }

    #[test]
    fn extreme_cooldowns_saturate() {
        let b = CircuitBreaker::new(BreakerConfig::new(1, Duration::MAX, Duration::MAX).unwrap());
        assert_eq!(
            b.record(Failure, None, at(1)),
            Some(Transition::Opened {
                cooldown: Duration::MAX
            })
        );
        assert_eq!(
            b.state(at(1_000_000)),
            BreakerState::Open {
                until: Instant::FAR_FUTURE
            }
        );
        let b = CircuitBreaker::new(
            BreakerConfig::new(u32::MAX, Duration::from_nanos(1), Duration::MAX).unwrap(),
        );
        for _ in 0..10 {
            assert_eq!(b.record(Failure, None, at(0)), None);
        }
    }

    #[test]
    fn config_is_checked() {
        let s = |r: Result<BreakerConfig, ConfigError>| r.unwrap_err().setting();
        assert_eq!(
            s(BreakerConfig::new(
                0,
                Duration::from_secs(1),
                Duration::from_secs(2)
            )),
            "breaker.threshold"
        );
        assert_eq!(
            s(BreakerConfig::new(
                1,
                Duration::ZERO,
                Duration::from_secs(2)
            )),
            "breaker.cooldown"
        );
        assert_eq!(
            s(BreakerConfig::new(
                1,
                Duration::from_secs(3),
                Duration::from_secs(2)
            )),
            "breaker.cooldown"
        );
    }

    #[test]
    fn a_straggler_failure_in_half_open_with_no_probe_changes_nothing() {
        // The probe's prober was dropped (slot freed, still half-open); a failure
        // from a send that started before the breaker opened is no failed probe.
        let b = breaker();
        open_it(&b, at(0));
        let Gate::Allow { probe: Some(epoch) } = b.check(at(5)) else {
            panic!("the probe is granted")
        };
        b.release_probe(epoch);
        assert_eq!(b.record(Failure, None, at(6)), None);
        assert_eq!(b.state(at(6)), BreakerState::HalfOpen);
        // The next caller gets the probe at once.
        assert!(matches!(b.check(at(6)), Gate::Allow { probe: Some(_) }));
    }

    #[test]
    fn an_old_epoch_does_not_hold_a_newer_probe() {
        let b = breaker();
        open_it(&b, at(0));
        let Gate::Allow { probe: Some(first) } = b.check(at(5)) else {
            panic!()
        };
        b.release_probe(first);
        let Gate::Allow {
            probe: Some(second),
        } = b.check(at(5))
        else {
            panic!()
        };
        assert!(b.holds_probe(second));
        assert!(
            !b.holds_probe(first),
            "a stale grant would send a second probe"
        );
    }

    #[test]
    fn a_reset_closes_clears_and_frees_the_probe_slot() {
        let b = breaker();
        open_it(&b, at(0));
        // The probe fails: open for 10 s.
        let Gate::Allow { probe: Some(epoch) } = b.check(at(5)) else {
            panic!("the probe is granted")
        };
        assert_eq!(
            b.record(Failure, Some(epoch), at(5)),
            Some(Transition::Opened {
                cooldown: Duration::from_secs(10)
            })
        );
        // Half-open with a second probe out, then reset.
        let Gate::Allow { probe: Some(epoch) } = b.check(at(15)) else {
            panic!("the probe is granted")
        };
        assert_eq!(b.reset(), Some(Transition::Closed));
        assert_eq!(b.state(at(15)), BreakerState::Closed);
        assert!(b.quiet.load(Ordering::Relaxed), "the lock-free paths again");
        assert!(!b.holds_probe(epoch));
        // The old probe's failure counts as any send's: one of five.
        assert_eq!(b.record(Failure, Some(epoch), at(16)), None);
        assert_eq!(b.consecutive_failures(), 1);
        // A reset of a closed breaker clears the run and reports nothing.
        assert_eq!(b.reset(), None);
        assert_eq!(b.consecutive_failures(), 0);
        // The cooldown is back to its base.
        for _ in 0..4 {
            assert_eq!(b.record(Failure, None, at(20)), None);
        }
        assert_eq!(
            b.record(Failure, None, at(20)),
            Some(Transition::Opened {
                cooldown: Duration::from_secs(5)
            })
        );
    }

    #[test]
    fn a_reset_is_reported_before_its_waiters_are_woken_even_if_a_waker_panics() {
        use crate::sync::test_support::counting_waker;
        let b = breaker();
        for _ in 0..5 {
            let _ = b.record(Failure, None, at(0));
        }
        assert!(matches!(b.state(at(0)), BreakerState::Open { .. }));
        let seen = b.lock().closes;
        let ((bad_waker, bad), (good_waker, good)) = (counting_waker(true), counting_waker(false));
        let mut waits = [
            Box::pin(b.closed_since(seen)),
            Box::pin(b.closed_since(seen)),
        ];
        for (wait, waker) in waits.iter_mut().zip([&bad_waker, &good_waker]) {
            assert!(
                wait.as_mut()
                    .poll(&mut Context::from_waker(waker))
                    .is_pending()
            );
        }
        let mut heard = None;
        let reset = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            b.reset_then(|transition| {
                // Nobody is woken yet when the report is made.
                let woken = bad.load(Ordering::Relaxed) + good.load(Ordering::Relaxed);
                heard = Some((transition, woken));
            })
        }));
        assert!(reset.is_err(), "the waker's panic goes on");
        assert_eq!(heard, Some((Some(Transition::Closed), 0)));
        assert_eq!(good.load(Ordering::Relaxed), 1, "the other waiter is woken");
        assert_eq!(b.state(at(1)), BreakerState::Closed);
    }

    #[test]
    fn a_reset_wakes_the_callers_that_wait_for_one_and_only_those_after_it() {
        use crate::sync::test_support::{waker_dropping, without_deadlock};
        use std::sync::Arc;
        use std::sync::atomic::AtomicUsize;
        use std::task::{Wake, Waker};

        struct Count(AtomicUsize);
        impl Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        without_deadlock(|| {
            let b: &'static CircuitBreaker = Box::leak(Box::new(breaker()));
            let woken = Arc::new(Count(AtomicUsize::new(0)));
            let waker = Waker::from(Arc::clone(&woken));
            let mut cx = Context::from_waker(&waker);
            let waiting = || b.lock().waiting.len();
            let seen = b.lock().closes;
            let mut a = Box::pin(b.closed_since(seen));
            let mut gives_up = Box::pin(b.closed_since(seen));
            assert!(a.as_mut().poll(&mut cx).is_pending());
            assert!(gives_up.as_mut().poll(&mut cx).is_pending());
            // Polled again with a waker whose drop takes the breaker's lock (the
            // last reference to another registered waiter): replaced by the next
            // poll, and dropped after the lock.
            let mut registered = Box::pin(b.closed_since(seen));
            assert!(registered.as_mut().poll(&mut cx).is_pending());
            let other = waker_dropping(registered);
            assert!(
                a.as_mut()
                    .poll(&mut Context::from_waker(&other))
                    .is_pending()
            );
            drop(other);
            assert!(a.as_mut().poll(&mut cx).is_pending());
            assert_eq!(waiting(), 2);
            // One gives up: its waker goes with it.
            drop(gives_up);
            assert_eq!(waiting(), 1);
            // A reset of a closed breaker still wakes it (it may have looked just
            // before another reset closed it).
            assert_eq!(b.reset(), None);
            assert_eq!(woken.0.load(Ordering::Relaxed), 1);
            assert_eq!(waiting(), 0);
            assert!(a.as_mut().poll(&mut cx).is_ready());
            // A waiter that read the count before the reset is ready at once; one
            // that read it after waits for the next.
            assert!(
                Box::pin(b.closed_since(seen))
                    .as_mut()
                    .poll(&mut cx)
                    .is_ready()
            );
            let mut next = Box::pin(b.closed_since(b.lock().closes));
            assert!(next.as_mut().poll(&mut cx).is_pending());
            drop(next);
            assert_eq!(waiting(), 0);
        });
    }

    #[test]
    fn an_answer_that_closes_it_wakes_the_callers_waiting_out_the_cooldown_after_the_lock() {
        use crate::sync::test_support::without_deadlock;
        use std::sync::Arc;
        use std::sync::atomic::AtomicUsize;
        use std::task::{Wake, Waker};

        /// Looks at the breaker when woken: under its lock, that would deadlock.
        struct Looks(&'static CircuitBreaker, AtomicUsize);
        impl Wake for Looks {
            fn wake(self: Arc<Self>) {
                let _ = self.0.state(at(0));
                self.1.fetch_add(1, Ordering::Relaxed);
            }
        }
        without_deadlock(|| {
            let b: &'static CircuitBreaker = Box::leak(Box::new(breaker()));
            for ms in 0..5 {
                b.record(Failure, None, at(ms));
            }
            assert!(matches!(b.state(at(5)), BreakerState::Open { .. }));
            let looks = Arc::new(Looks(b, AtomicUsize::new(0)));
            let waker = Waker::from(Arc::clone(&looks));
            let mut wait = Box::pin(b.closed_since(b.lock().closes));
            assert!(
                wait.as_mut()
                    .poll(&mut Context::from_waker(&waker))
                    .is_pending()
            );
            // A straggler's reachable answer (a 404) closes it, and wakes the waiter.
            let (transition, wake) = b.record_then_wake(Reachable, None, at(10));
            assert_eq!(transition, Some(Transition::Closed));
            assert_eq!(
                looks.1.load(Ordering::Relaxed),
                0,
                "woken only as the guard drops"
            );
            drop(wake);
            assert_eq!(looks.1.load(Ordering::Relaxed), 1);
            assert!(
                wait.as_mut()
                    .poll(&mut Context::from_waker(&waker))
                    .is_ready()
            );
            // Through `record`, the same at once.
            for ms in 20..25 {
                b.record(Failure, None, at(ms));
            }
            let mut wait = Box::pin(b.closed_since(b.lock().closes));
            assert!(
                wait.as_mut()
                    .poll(&mut Context::from_waker(&waker))
                    .is_pending()
            );
            assert_eq!(b.record(Success, None, at(30)), Some(Transition::Closed));
            assert_eq!(looks.1.load(Ordering::Relaxed), 2);
            assert!(
                wait.as_mut()
                    .poll(&mut Context::from_waker(&waker))
                    .is_ready()
            );
        });
    }

    /// Under shuttle (the internal `shuttle` feature, on in `scripts/test` through
    /// `--all-features`): callers that find the breaker open wait for a reset with
    /// the count their refusal carried, as the attempt loop does, while another
    /// thread resets it at any point. Every caller is let through (shuttle fails a
    /// schedule in which one waits for ever), and no waker is left behind.
    #[test]
    #[cfg(feature = "shuttle")]
    fn a_reset_reaches_every_caller_waiting_out_the_cooldown_under_any_interleaving() {
        use std::sync::Arc;
        fn scenario() {
            let config = BreakerConfig::new(1, Duration::from_secs(5), Duration::from_secs(60));
            let b = Arc::new(CircuitBreaker::new(config.unwrap()));
            assert!(b.record(Failure, None, at(0)).is_some(), "open for 5 s");
            let callers: Vec<_> = (0..2)
                .map(|_| {
                    let b = Arc::clone(&b);
                    shuttle::future::spawn(async move {
                        loop {
                            match b.admit(at(1)) {
                                Ok(None) => return,
                                Err(Refusal::Cooldown { closes, .. }) => {
                                    b.closed_since(closes).await;
                                }
                                other => panic!("no probe before the cooldown ends: {other:?}"),
                            }
                        }
                    })
                })
                .collect();
            let resetting = Arc::clone(&b);
            let resetter = shuttle::thread::spawn(move || {
                assert_eq!(resetting.reset(), Some(Transition::Closed));
            });
            shuttle::future::block_on(async {
                for caller in callers {
                    caller.await.unwrap();
                }
            });
            resetter.join().unwrap();
            assert_eq!(b.lock().waiting.len(), 0, "a waker left behind");
        }
        shuttle::check_random(scenario, 2_000);
        shuttle::check_pct(scenario, 2_000, 3);
    }
}
