//! Per-call policies: how a call is retried, what it does while the breaker is open,
//! how its delays are jittered and how long it may take.

use std::fmt;
use std::time::Duration;

use http::StatusCode;

use crate::error::ConfigError;

/// The default per-attempt time limit of every preset: 10 s.
pub const DEFAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// The default budget of [`CallPolicy::bounded`]: 30 s for the whole call.
pub const DEFAULT_BOUNDED_BUDGET: Duration = Duration::from_secs(30);

/// How retry delays are randomised, so that many clients that failed together do not
/// retry together.
///
/// The random source is the [`Runtime`](crate::Runtime), so a test runtime can seed it.
/// A server's delay (`Retry-After`, `retry-after-ms`) is never shortened by jitter.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Jitter {
    /// No randomness: every delay is exactly the policy's back-off or the server's delay.
    None,
    /// Adds up to `f` × the delay, never subtracts: `f` is from 0.0 to 1.0, so a wait
    /// at most doubles. `Proportional(0.25)` is the default.
    Proportional(f64),
    /// Draws the policy's back-off uniformly in `[1 ms, back-off]`; on a server's
    /// delay `d` it waits `d` plus up to `0.25 × d`.
    Full,
}

impl Default for Jitter {
    fn default() -> Self {
        Jitter::Proportional(0.25)
    }
}

impl Jitter {
    /// Checks that a `Proportional` factor is from 0.0 to 1.0 (a larger one could
    /// stretch a wait without bound: at `f64::MAX`, to a retry that never comes).
    pub(crate) fn validate(self) -> Result<Self, ConfigError> {
        match self {
            Jitter::Proportional(f) if !(0.0..=1.0).contains(&f) => Err(ConfigError::new(
                "jitter",
                "the proportional factor must be from 0.0 to 1.0",
            )),
            other => Ok(other),
        }
    }
}

/// The classic bounded retry schedule: at most `max_retries` retries after the first
/// attempt, exponential from `base`, capped at `max`.
///
/// The fields are public plain data (this struct is deliberately exhaustive) so that
/// any schedule can be written down, including a zero `base`: the attempt loop treats
/// any back-off under 1 ms as 1 ms, so a misconfigured policy cannot spin. Use
/// [`RetryPolicy::new`] to have values checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RetryPolicy {
    /// Retries after the first attempt: `3` means at most 4 attempts.
    pub max_retries: u32,
    /// The first back-off.
    pub base: Duration,
    /// The ceiling of the back-off, and of a server's requested delay: the longest
    /// any wait for a retry can be. Nothing bounds it further, so a huge one (up to
    /// `Duration::MAX`) lets a server's `Retry-After` park the call for as long as
    /// it asks, within the call's budget (a retry the budget has no room for is not
    /// waited for); without a budget, until the call is dropped.
    pub max: Duration,
}

impl Default for RetryPolicy {
    /// 3 retries, from 250 ms, capped at 10 s.
    fn default() -> Self {
        RetryPolicy {
            max_retries: 3,
            base: Duration::from_millis(250),
            max: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    /// A checked schedule: `max` must not be below `base`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool::RetryPolicy;
    ///
    /// let p = RetryPolicy::new(2, Duration::from_millis(500), Duration::from_secs(4)).unwrap();
    /// assert_eq!(p.max_retries, 2);
    /// let err = RetryPolicy::new(2, Duration::from_secs(5), Duration::from_secs(1)).unwrap_err();
    /// assert_eq!(err.setting(), "retry.max");
    /// ```
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `retry.max` if `max` is below `base`.
    pub fn new(max_retries: u32, base: Duration, max: Duration) -> Result<Self, ConfigError> {
        if max < base {
            return Err(ConfigError::new(
                "retry.max",
                "must not be below retry.base",
            ));
        }
        Ok(RetryPolicy {
            max_retries,
            base,
            max,
        })
    }
}

/// How often a call is tried.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RetryMode {
    /// One attempt (a 401 replay after a token refresh still happens).
    None,
    /// Retry until the caller drops the future, exponential from `base` capped at `max`.
    UntilCancelled {
        /// The first back-off.
        base: Duration,
        /// The ceiling of the back-off and of a server's requested delay. With no
        /// budget, nothing else bounds a wait: a huge ceiling lets a server's
        /// `Retry-After` park the call until it is dropped.
        max: Duration,
    },
    /// A bounded schedule.
    Bounded(RetryPolicy),
}

impl RetryMode {
    /// The ceiling of back-offs and server delays, if the mode retries at all.
    #[must_use]
    pub fn ceiling(&self) -> Option<Duration> {
        match self {
            RetryMode::None => None,
            RetryMode::UntilCancelled { max, .. } => Some(*max),
            RetryMode::Bounded(p) => Some(p.max),
        }
    }

    /// `(base, max)` of the exponential schedule, if the mode retries at all.
    #[must_use]
    pub fn schedule(&self) -> Option<(Duration, Duration)> {
        match self {
            RetryMode::None => None,
            RetryMode::UntilCancelled { base, max } => Some((*base, *max)),
            RetryMode::Bounded(p) => Some((p.base, p.max)),
        }
    }

    /// Whether another retry is allowed after `retries_done` retries.
    #[must_use]
    pub fn allows_retry(&self, retries_done: u32) -> bool {
        match self {
            RetryMode::None => false,
            RetryMode::UntilCancelled { .. } => true,
            RetryMode::Bounded(p) => retries_done < p.max_retries,
        }
    }

    fn validate(self) -> Result<Self, ConfigError> {
        if let Some((base, max)) = self.schedule()
            && max < base
        {
            return Err(ConfigError::new(
                "retry.max",
                "must not be below retry.base",
            ));
        }
        Ok(self)
    }
}

/// What a call does while the circuit breaker is open.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BreakerMode {
    /// At the gate, fail at once with `ErrorKind::BreakerOpen`, nothing sent. A call
    /// whose own failure opened the breaker still sleeps the back-off it scheduled,
    /// and is refused when its retry reaches the gate.
    FailFast,
    /// Sleep until the breaker lets a probe through, and ask again. While another
    /// call's probe is out, ask again every [`PROBE_RECHECK`](crate::breaker::PROBE_RECHECK)
    /// (5 ms): a probe's answer wakes no waiter. A
    /// [`reset_breaker`](crate::ResilientClient::reset_breaker), or an answer that
    /// closes the breaker (a straggler's while it is open), wakes the callers
    /// waiting out a cooldown; those waiting for a probe see it at their next
    /// recheck.
    WaitForProbe,
}

/// Everything decided per call: retries, breaker behaviour, jitter, time limits and
/// idempotency.
///
/// Start from a preset and adjust with the `with_*` methods; those that take custom
/// values check them and return a [`ConfigError`] naming the setting.
///
/// | preset | retry | breaker | attempt timeout | budget |
/// |---|---|---|---|---|
/// | [`bounded(p)`](CallPolicy::bounded) | `Bounded(p)` | `FailFast` | 10 s | 30 s |
/// | [`essential()`](CallPolicy::essential) | `UntilCancelled { 250 ms, 10 s }` | `WaitForProbe` | 10 s | none |
/// | [`background()`](CallPolicy::background) | `None` | `FailFast` | 10 s | none |
///
/// All presets use [`Jitter::Proportional(0.25)`](Jitter::Proportional) and are not
/// marked idempotent (idempotency then comes from the method or an
/// `Idempotency-Key` header that is not empty or blank).
///
/// ```
/// use std::time::Duration;
/// use vantage_api_pool::{CallPolicy, Jitter, RetryPolicy};
///
/// let policy = CallPolicy::bounded(RetryPolicy::default())
///     .with_jitter(Jitter::None)?
///     .with_attempt_timeout(Duration::from_secs(2))?
///     .idempotent(true);
/// assert_eq!(policy.attempt_timeout(), Duration::from_secs(2));
/// assert!(CallPolicy::background().with_attempt_timeout(Duration::ZERO).is_err());
/// # Ok::<(), vantage_api_pool::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct CallPolicy {
    retry: RetryMode,
    breaker: BreakerMode,
    jitter: Jitter,
    attempt_timeout: Duration,
    budget: Option<Duration>,
    idempotent: bool,
    answers: AnswerStatuses,
    label: Option<&'static str>,
}

/// The 4xx statuses a policy takes as answers
/// ([`CallPolicy::with_answer_statuses`]): bit `i % 64` of word `i / 64` stands for
/// status `400 + i` (two words rather than a `u128`, whose 16-byte alignment would
/// pad every policy).
#[derive(Clone, Copy, PartialEq, Eq, Default)]
struct AnswerStatuses([u64; 2]);

impl AnswerStatuses {
    /// The word and bit of a 4xx `code`.
    fn place(code: u16) -> (usize, u16) {
        let i = code - 400;
        (usize::from(i / 64), i % 64)
    }

    fn insert(&mut self, code: u16) {
        let (word, bit) = Self::place(code);
        self.0[word] |= 1 << bit;
    }

    fn contains(self, code: u16) -> bool {
        (400..500).contains(&code) && {
            let (word, bit) = Self::place(code);
            (self.0[word] >> bit) & 1 == 1
        }
    }
}

impl fmt::Debug for AnswerStatuses {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries((400..500u16).filter(|&code| self.contains(code)))
            .finish()
    }
}

/// [`CallPolicy::bounded`] with [`RetryPolicy::default`]: what
/// [`execute`](crate::ResilientClient::execute) uses on a client whose builder set
/// no [`default_policy`](crate::ClientBuilder::default_policy) or
/// [`default_retry`](crate::ClientBuilder::default_retry).
impl Default for CallPolicy {
    fn default() -> Self {
        CallPolicy::bounded(RetryPolicy::default())
    }
}

impl CallPolicy {
    fn preset(retry: RetryMode, breaker: BreakerMode, budget: Option<Duration>) -> Self {
        CallPolicy {
            retry,
            breaker,
            jitter: Jitter::default(),
            attempt_timeout: DEFAULT_ATTEMPT_TIMEOUT,
            budget,
            idempotent: false,
            answers: AnswerStatuses::default(),
            label: None,
        }
    }

    /// The classic bounded retry with `FailFast`, a 10 s attempt timeout and a 30 s budget.
    ///
    /// A preset, so infallible: `retry` is taken as written. A schedule whose `max` is
    /// below its `base` waits `max` before every retry (the back-off is capped at the
    /// ceiling, and never under 1 ms); build it with [`RetryPolicy::new`] to have that
    /// refused instead.
    #[must_use]
    pub fn bounded(retry: RetryPolicy) -> Self {
        Self::preset(
            RetryMode::Bounded(retry),
            BreakerMode::FailFast,
            Some(DEFAULT_BOUNDED_BUDGET),
        )
    }

    /// Someone is waiting: retry until the future is dropped (250 ms → 10 s), wait for
    /// the breaker's probe, no overall budget.
    #[must_use]
    pub fn essential() -> Self {
        Self::preset(
            RetryMode::UntilCancelled {
                base: Duration::from_millis(250),
                max: Duration::from_secs(10),
            },
            BreakerMode::WaitForProbe,
            None,
        )
    }

    /// Nobody is waiting: one attempt, fail fast while the breaker is open.
    #[must_use]
    pub fn background() -> Self {
        Self::preset(RetryMode::None, BreakerMode::FailFast, None)
    }

    /// Replaces the retry mode.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `retry.max` if the mode's `max` is below its `base`.
    pub fn with_retry(mut self, retry: RetryMode) -> Result<Self, ConfigError> {
        self.retry = retry.validate()?;
        Ok(self)
    }

    /// Replaces the breaker mode.
    #[must_use]
    pub fn with_breaker_mode(mut self, breaker: BreakerMode) -> Self {
        self.breaker = breaker;
        self
    }

    /// Replaces the jitter.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `jitter` for a `Proportional` factor outside 0.0 to
    /// 1.0 (negative, above 1, NaN or infinite).
    pub fn with_jitter(mut self, jitter: Jitter) -> Result<Self, ConfigError> {
        self.jitter = jitter.validate()?;
        Ok(self)
    }

    /// Sets the per-attempt time limit, checked against the budget already set: to
    /// change both so that the new pair fits but a half-changed one would not (60 s
    /// attempts in a 120 s budget, from the 10 s / 30 s of `bounded`), use
    /// [`with_time_limits`](Self::with_time_limits).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `attempt_timeout` if it is zero or longer than the
    /// budget.
    pub fn with_attempt_timeout(mut self, timeout: Duration) -> Result<Self, ConfigError> {
        if timeout.is_zero() {
            return Err(ConfigError::new(
                "attempt_timeout",
                "must be greater than zero",
            ));
        }
        if self.budget.is_some_and(|b| timeout > b) {
            return Err(ConfigError::new(
                "attempt_timeout",
                "must not exceed the policy's budget (to change both, set them together \
                 with with_time_limits)",
            ));
        }
        self.attempt_timeout = timeout;
        Ok(self)
    }

    /// Sets the whole call's time budget (`None`: no budget), checked against the
    /// attempt timeout already set (see [`with_time_limits`](Self::with_time_limits)
    /// to set both at once). The call ends at a success's response head, so the
    /// budget does not cover the success body the caller then reads: limit that read
    /// yourself (reqwest: the request's own `timeout`, which covers the body too, or
    /// the client's `read_timeout`).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `budget` if it is zero or shorter than the attempt
    /// timeout; its reason points to [`with_time_limits`](Self::with_time_limits).
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool::{CallPolicy, RetryPolicy};
    /// let five = Some(Duration::from_secs(5));
    /// // Under the presets' 10 s attempt timeout: refused, with the way out.
    /// let refused = CallPolicy::bounded(RetryPolicy::default()).with_budget(five);
    /// let error = refused.unwrap_err();
    /// assert_eq!(error.setting(), "budget");
    /// assert!(error.reason().contains("with_time_limits"), "{error}");
    /// ```
    pub fn with_budget(mut self, budget: Option<Duration>) -> Result<Self, ConfigError> {
        if let Some(b) = budget {
            if b.is_zero() {
                return Err(ConfigError::new("budget", "must be greater than zero"));
            }
            if b < self.attempt_timeout {
                return Err(ConfigError::new(
                    "budget",
                    "must not be shorter than the policy's attempt timeout (10 s unless \
                     set; to change both, set them together with with_time_limits)",
                ));
            }
        }
        self.budget = budget;
        Ok(self)
    }

    /// Sets the per-attempt time limit and the whole call's budget together, checked
    /// as a pair, so the order in which they change does not matter.
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool::{CallPolicy, RetryPolicy};
    /// let secs = Duration::from_secs;
    /// // From bounded's 10 s / 30 s: 60 s attempts alone would exceed the old budget.
    /// let bounded = CallPolicy::bounded(RetryPolicy::default());
    /// assert!(bounded.clone().with_attempt_timeout(secs(60)).is_err());
    /// let p = bounded.with_time_limits(secs(60), Some(secs(120))).unwrap();
    /// assert_eq!((p.attempt_timeout(), p.budget()), (secs(60), Some(secs(120))));
    /// ```
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `attempt_timeout` if it is zero, or `budget` if the
    /// budget is zero or shorter than the attempt timeout. The policy is consumed
    /// either way: clone it first to keep it.
    pub fn with_time_limits(
        self,
        attempt_timeout: Duration,
        budget: Option<Duration>,
    ) -> Result<Self, ConfigError> {
        // The pair first, with a reason of its own (the single setter's would send the
        // caller back here).
        if budget.is_some_and(|b| !b.is_zero() && b < attempt_timeout) {
            return Err(ConfigError::new(
                "budget",
                "must not be shorter than the attempt timeout given with it",
            ));
        }
        // Checked from no budget at all, so the old budget does not interfere.
        self.with_budget(None)?
            .with_attempt_timeout(attempt_timeout)?
            .with_budget(budget)
    }

    /// Marks every request of the call as safe to repeat, whatever its method.
    #[must_use]
    pub fn idempotent(mut self, idempotent: bool) -> Self {
        self.idempotent = idempotent;
        self
    }

    /// Names what the call is for (an endpoint, an operation: `"orders.list"`), for
    /// the observer: every event of a call under this policy, and its end, carry it
    /// ([`TransportEvent::label`](crate::TransportEvent::label),
    /// [`CallEnd::label`](crate::CallEnd::label)), so figures can be kept per
    /// endpoint within one API. It is never sent. None by default; a later label
    /// replaces an earlier one. It is part of the policy: two policies that differ
    /// only in their label are not equal.
    ///
    /// ```
    /// use vantage_api_pool::CallPolicy;
    ///
    /// let list_orders = CallPolicy::default().with_label("orders.list");
    /// assert_eq!(list_orders.label(), Some("orders.list"));
    /// assert_eq!(CallPolicy::default().label(), None);
    /// ```
    #[must_use]
    pub fn with_label(mut self, label: &'static str) -> Self {
        self.label = Some(label);
        self
    }

    /// Statuses the call takes as answers: a response with one of them is returned
    /// to the caller as `Ok`, its body unread, as a 2xx is, instead of ending the
    /// call as a [`Status`](crate::ErrorKind::Status) error whose body is cut at
    /// 2048 bytes. For a 404 that means "no such order", or a 409 whose body the
    /// caller reads in full. Replaces the statuses set before (none by default; an
    /// empty list sets none again).
    ///
    /// Such an answer is not retried, and the breaker counts it as any other 4xx:
    /// the API answered (an open breaker closes, a run of failures is kept). The
    /// observer hears `Succeeded` with its status, so a
    /// [`HealthObserver`](crate::health::HealthObserver) counts it as a success.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `answer_statuses` for a status outside 400 to 499,
    /// or for 401 (its token refresh and replay), 408 or 429 (their retries), which
    /// keep their own handling.
    ///
    /// ```
    /// use vantage_api_pool::{CallPolicy, RetryPolicy};
    /// use vantage_api_pool::http::StatusCode;
    ///
    /// let policy = CallPolicy::bounded(RetryPolicy::default())
    ///     .with_answer_statuses([StatusCode::NOT_FOUND, StatusCode::CONFLICT])?;
    /// assert!(policy.is_answer_status(StatusCode::CONFLICT));
    /// assert!(!policy.is_answer_status(StatusCode::BAD_REQUEST));
    /// assert!(CallPolicy::background().with_answer_statuses([StatusCode::TOO_MANY_REQUESTS]).is_err());
    /// # Ok::<(), vantage_api_pool::ConfigError>(())
    /// ```
    pub fn with_answer_statuses(
        mut self,
        statuses: impl IntoIterator<Item = StatusCode>,
    ) -> Result<Self, ConfigError> {
        let mut answers = AnswerStatuses::default();
        for status in statuses {
            let code = status.as_u16();
            if !(400..500).contains(&code) {
                return Err(ConfigError::new(
                    "answer_statuses",
                    "must be 4xx statuses (400 to 499)",
                ));
            }
            if matches!(code, 401 | 408 | 429) {
                return Err(ConfigError::new(
                    "answer_statuses",
                    "must not be 401, 408 or 429, which keep their own handling",
                ));
            }
            answers.insert(code);
        }
        self.answers = answers;
        Ok(self)
    }

    /// Whether the call takes `status` as an answer
    /// ([`with_answer_statuses`](Self::with_answer_statuses)).
    #[must_use]
    pub fn is_answer_status(&self, status: StatusCode) -> bool {
        self.answers.contains(status.as_u16())
    }

    /// The retry mode.
    #[must_use]
    pub fn retry(&self) -> &RetryMode {
        &self.retry
    }

    /// The breaker mode.
    #[must_use]
    pub fn breaker_mode(&self) -> BreakerMode {
        self.breaker
    }

    /// The jitter.
    #[must_use]
    pub fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// The per-attempt time limit.
    #[must_use]
    pub fn attempt_timeout(&self) -> Duration {
        self.attempt_timeout
    }

    /// The whole call's budget, if any.
    #[must_use]
    pub fn budget(&self) -> Option<Duration> {
        self.budget
    }

    /// Whether the policy marks every request as idempotent.
    #[must_use]
    pub fn is_idempotent(&self) -> bool {
        self.idempotent
    }

    /// The label the policy's calls carry to the observer
    /// ([`with_label`](CallPolicy::with_label)).
    #[must_use]
    pub fn label(&self) -> Option<&'static str> {
        self.label
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_limits_set_together_are_checked_as_a_pair() {
        let secs = Duration::from_secs;
        let b = CallPolicy::bounded(RetryPolicy::default());
        // Either order of the single setters fails one way; the pair does not.
        assert!(b.clone().with_attempt_timeout(secs(60)).is_err());
        let p = b
            .clone()
            .with_time_limits(secs(60), Some(secs(120)))
            .unwrap();
        assert_eq!(
            (p.attempt_timeout(), p.budget()),
            (secs(60), Some(secs(120)))
        );
        let tight = b.clone().with_budget(Some(secs(10))).unwrap();
        let p = tight.with_time_limits(secs(2), Some(secs(5))).unwrap();
        assert_eq!((p.attempt_timeout(), p.budget()), (secs(2), Some(secs(5))));
        let p = b.clone().with_time_limits(secs(5), None).unwrap();
        assert_eq!((p.attempt_timeout(), p.budget()), (secs(5), None));
        let name = |r: Result<CallPolicy, ConfigError>| r.unwrap_err().setting();
        assert_eq!(
            name(b.clone().with_time_limits(Duration::ZERO, None)),
            "attempt_timeout"
        );
        assert_eq!(
            b.clone()
                .with_time_limits(secs(60), Some(secs(30)))
                .unwrap_err()
                .reason(),
            "must not be shorter than the attempt timeout given with it"
        );
        assert_eq!(
            name(b.clone().with_time_limits(secs(10), Some(secs(9)))),
            "budget"
        );
        assert_eq!(
            name(b.with_time_limits(secs(10), Some(Duration::ZERO))),
            "budget"
        );
    }

    #[test]
    fn the_ceiling_is_the_schedules_max() {
        let forever = RetryMode::UntilCancelled {
            base: Duration::from_millis(250),
            max: Duration::from_secs(10),
        };
        assert_eq!(forever.ceiling(), Some(Duration::from_secs(10)));
        let bounded = RetryMode::Bounded(RetryPolicy {
            max_retries: 3,
            base: Duration::from_millis(100),
            max: Duration::from_secs(7),
        });
        assert_eq!(bounded.ceiling(), Some(Duration::from_secs(7)));
        assert_eq!(RetryMode::None.ceiling(), None);
    }

    #[test]
    fn presets_match_the_design() {
        let b = CallPolicy::bounded(RetryPolicy::default());
        assert_eq!(b.retry(), &RetryMode::Bounded(RetryPolicy::default()));
        assert_eq!(b.breaker_mode(), BreakerMode::FailFast);
        assert_eq!(b.budget(), Some(Duration::from_secs(30)));
        assert_eq!(b.attempt_timeout(), Duration::from_secs(10));
        assert_eq!(b.jitter(), Jitter::Proportional(0.25));
        assert_eq!(CallPolicy::default(), b);

        let e = CallPolicy::essential();
        assert_eq!(
            e.retry(),
            &RetryMode::UntilCancelled {
                base: Duration::from_millis(250),
                max: Duration::from_secs(10)
            }
        );
        assert_eq!(e.breaker_mode(), BreakerMode::WaitForProbe);
        assert_eq!(e.budget(), None);

        let g = CallPolicy::background();
        assert_eq!(g.retry(), &RetryMode::None);
        assert_eq!(g.breaker_mode(), BreakerMode::FailFast);
        assert_eq!(g.budget(), None);
        assert!(!g.is_idempotent());

        let d = RetryPolicy::default();
        assert_eq!(
            (d.max_retries, d.base, d.max),
            (3, Duration::from_millis(250), Duration::from_secs(10))
        );
    }

    #[test]
    fn custom_values_are_checked_and_named() {
        let b = CallPolicy::bounded(RetryPolicy::default());
        let name = |r: Result<CallPolicy, ConfigError>| r.unwrap_err().setting();
        assert_eq!(
            name(b.clone().with_attempt_timeout(Duration::ZERO)),
            "attempt_timeout"
        );
        assert_eq!(
            name(b.clone().with_attempt_timeout(Duration::from_secs(31))),
            "attempt_timeout"
        );
        // Equal to the budget (30 s) is allowed: one attempt may use all of it.
        let whole = b
            .clone()
            .with_attempt_timeout(Duration::from_secs(30))
            .unwrap();
        assert_eq!(whole.attempt_timeout(), Duration::from_secs(30));
        assert_eq!(name(b.clone().with_budget(Some(Duration::ZERO))), "budget");
        // Refused for being zero, not (as well) for being under the attempt timeout.
        assert_eq!(
            b.clone()
                .with_budget(Some(Duration::ZERO))
                .unwrap_err()
                .reason(),
            "must be greater than zero"
        );
        assert_eq!(
            name(b.clone().with_budget(Some(Duration::from_secs(9)))),
            "budget"
        );
        assert_eq!(
            name(b.clone().with_jitter(Jitter::Proportional(f64::NAN))),
            "jitter"
        );
        assert_eq!(
            name(b.clone().with_jitter(Jitter::Proportional(-0.1))),
            "jitter"
        );
        assert_eq!(
            name(b.clone().with_jitter(Jitter::Proportional(f64::INFINITY))),
            "jitter"
        );
        for too_large in [1.000_001, 2.0, 1e6, f64::MAX] {
            assert_eq!(
                name(b.clone().with_jitter(Jitter::Proportional(too_large))),
                "jitter",
                "{too_large}"
            );
        }
        for edge in [0.0, 1.0] {
            let p = b.clone().with_jitter(Jitter::Proportional(edge)).unwrap();
            assert_eq!(p.jitter(), Jitter::Proportional(edge));
        }
        assert_eq!(
            name(b.clone().with_retry(RetryMode::UntilCancelled {
                base: Duration::from_secs(2),
                max: Duration::from_secs(1)
            })),
            "retry.max"
        );
        // Valid custom values pass through unchanged.
        let ok = b
            .with_budget(None)
            .unwrap()
            .with_attempt_timeout(Duration::from_secs(600))
            .unwrap()
            .with_jitter(Jitter::Full)
            .unwrap();
        assert_eq!(ok.attempt_timeout(), Duration::from_secs(600));
        assert_eq!(ok.jitter(), Jitter::Full);
    }

    #[test]
    fn answer_statuses_are_4xx_without_401_408_429_and_replace_the_set_before() {
        let b = CallPolicy::background();
        let name = |r: Result<CallPolicy, ConfigError>| r.unwrap_err().setting();
        for refused in [100, 200, 204, 302, 399, 401, 408, 429, 500, 503, 599, 999] {
            let status = StatusCode::from_u16(refused).unwrap();
            assert_eq!(
                name(
                    b.clone()
                        .with_answer_statuses([StatusCode::CONFLICT, status])
                ),
                "answer_statuses",
                "{refused}"
            );
        }
        assert!(
            !b.is_answer_status(StatusCode::NOT_FOUND),
            "none by default"
        );
        let edges =
            [400, 402, 404, 409, 422, 463, 464, 499].map(|c| StatusCode::from_u16(c).unwrap());
        let p = b.clone().with_answer_statuses(edges).unwrap();
        for code in 100..1000 {
            let status = StatusCode::from_u16(code).unwrap();
            assert_eq!(
                p.is_answer_status(status),
                edges.contains(&status),
                "{code}"
            );
        }
        assert_eq!(
            format!("{p:?}").split("answers: ").nth(1).unwrap(),
            "{400, 402, 404, 409, 422, 463, 464, 499}, label: None }"
        );
        let replaced = p.with_answer_statuses([StatusCode::GONE]).unwrap();
        assert!(replaced.is_answer_status(StatusCode::GONE));
        assert!(!replaced.is_answer_status(StatusCode::NOT_FOUND));
        let none = replaced.with_answer_statuses([]).unwrap();
        assert_eq!(none, b);
    }

    #[test]
    fn retry_mode_counts_retries() {
        let bounded =
            RetryMode::Bounded(RetryPolicy::new(2, Duration::ZERO, Duration::ZERO).unwrap());
        assert!(bounded.allows_retry(0) && bounded.allows_retry(1) && !bounded.allows_retry(2));
        assert!(!RetryMode::None.allows_retry(0));
        let forever = RetryMode::UntilCancelled {
            base: Duration::ZERO,
            max: Duration::ZERO,
        };
        assert!(forever.allows_retry(u32::MAX));
        assert_eq!(RetryMode::None.ceiling(), None);
        assert_eq!(forever.schedule(), Some((Duration::ZERO, Duration::ZERO)));
    }
}
