//! What one send's outcome means: whether the call succeeds, retries, redials, replays
//! or ends, and what the outcome tells the circuit breaker.
//!
//! The breaker measures reachability, not correctness: an answer a retry cannot fix
//! still proves the API is up. Retrying depends on whether the request may already
//! have been processed: "not processed for sure" outcomes are retried for any
//! method, "maybe processed" ones only for idempotent calls.
//!
//! | outcome | verdict | breaker |
//! |---|---|---|
//! | 2xx | success | success |
//! | 1xx, 3xx (not followed by the transport) | success: returned to the caller | reachable |
//! | 401, refresher present, first 401 of the call, answering a request that carried the credentials (and, when the call's request was answered by a redirect, an idempotent call) | replay after refreshing the token | reachable |
//! | 408 | retry if idempotent, else final | untouched |
//! | 429 | retry, any method (if idempotent, else final, when it answers the GET a redirect turned the request into, a 303 or a 301 or 302 to a POST: the call's request was answered with that redirect, [`TransportResponse::answered_by_redirect`](crate::TransportResponse::answered_by_redirect)) | untouched |
//! | a 4xx the call's policy takes as an answer ([`CallPolicy::with_answer_statuses`](crate::CallPolicy::with_answer_statuses): never 401, 408, 429; the attempt loop checks it before this table) | success: returned to the caller | reachable |
//! | other 4xx (a second 401, or one answering a hop a redirect sent without the credentials, included) | final | reachable |
//! | 503 with a valid server delay | retry, any method (if idempotent, else final, when it answers another request a redirect led to, as for 429) | failure |
//! | other 5xx | retry if idempotent, else final | failure |
//! | `NotSent`, fewer than 2 redials so far | redial: no back-off, no retry budget (it still passes the gate) | untouched |
//! | `NotSent` after 2 redials | as `Interrupted` | failure |
//! | `Connect` | retry, any method | failure |
//! | `Interrupted`, `TimedOut` | retry if idempotent, else final | failure |
//! | `TimedOut` from a time limit that was the rest of the call's budget, less than half the attempt timeout | retry if idempotent, else final | untouched (the API was given too little time) |
//! | `Tls` | final | failure |
//! | `TooLarge`, `Config` | final | untouched |
//!
//! Whether a retry actually happens also depends on the policy's retry budget and the
//! call's time budget; that is the attempt loop's decision, not this module's.

use http::{HeaderName, HeaderValue, Method, StatusCode};

use crate::transport::TransportErrorKind;

/// Redials allowed per call; a `NotSent` beyond them counts as `Interrupted`.
pub const MAX_REDIALS: u32 = 2;

/// The `Idempotency-Key` request header.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// How one send ended.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A response head arrived with this status.
    Status(StatusCode),
    /// The send failed in the transport, or a time limit cut it (`TimedOut`).
    Transport(TransportErrorKind),
}

impl Outcome {
    /// Whether the request may have reached the server (and been acted on).
    ///
    /// False only for failures that happen before a request can leave: `NotSent`,
    /// `Connect`, `Tls` and `Config`.
    #[must_use]
    pub fn may_have_reached(self) -> bool {
        match self {
            Outcome::Status(_) => true,
            Outcome::Transport(k) => !matches!(
                k,
                TransportErrorKind::NotSent
                    | TransportErrorKind::Connect
                    | TransportErrorKind::Tls
                    | TransportErrorKind::Config
            ),
        }
    }

    /// The outcome the rules go by once the call has used `redials_used` free
    /// redials: a `NotSent` past them is no longer taken at its word and counts as
    /// `Interrupted` (for the retry, the breaker, and whether the request may have
    /// reached the server).
    ///
    /// ```
    /// use vantage_api_pool::TransportErrorKind::{Interrupted, NotSent};
    /// use vantage_api_pool::classify::Outcome;
    /// assert_eq!(Outcome::Transport(NotSent).judged(1), Outcome::Transport(NotSent));
    /// assert_eq!(Outcome::Transport(NotSent).judged(2), Outcome::Transport(Interrupted));
    /// assert!(Outcome::Transport(NotSent).judged(2).may_have_reached());
    /// ```
    #[must_use]
    pub fn judged(self, redials_used: u32) -> Outcome {
        match self {
            Outcome::Transport(TransportErrorKind::NotSent) if redials_used >= MAX_REDIALS => {
                Outcome::Transport(TransportErrorKind::Interrupted)
            }
            other => other,
        }
    }
}

/// What the call knows when it classifies an outcome.
///
/// Built from [`CallFacts::default()`] (all false, no redials) and then set field by
/// field, so a fact added later is not a breaking change:
///
/// ```
/// use vantage_api_pool::classify::CallFacts;
/// let mut facts = CallFacts::default();
/// facts.idempotent = true;
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CallFacts {
    /// The request may be repeated safely (see [`is_idempotent`]).
    pub idempotent: bool,
    /// The client has a token refresher, this call has not replayed after a 401 yet,
    /// and the request the response answers carried the client's credentials
    /// ([`TransportResponse::credentials_dropped`](crate::TransportResponse::credentials_dropped)).
    pub can_replay_401: bool,
    /// Redials this call has made so far.
    pub redials_used: u32,
    /// The response carries a valid server delay (`retry-after-ms` or `Retry-After`).
    pub has_server_delay: bool,
    /// The send's own time limit cut it, and that limit was the rest of the call's
    /// budget, less than half the attempt timeout: the API was given too little time
    /// for the cut to say whether it is reachable. (A send given at least half its
    /// attempt timeout and not answered is a breaker failure: a budget equal to the
    /// attempt timeout, less a few milliseconds of waiting at the gate, must not
    /// hide an API that never answers.)
    pub cut_by_budget: bool,
    /// The call's request was answered with a redirect the transport followed with
    /// another request, which the response answers
    /// ([`TransportResponse::answered_by_redirect`](crate::TransportResponse::answered_by_redirect)):
    /// the request may have been processed, so a 429, a 503 with a server delay and
    /// a 401 are retried or replayed only when it is idempotent.
    pub answered_by_redirect: bool,
}

/// What the attempt loop does next.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Return the response to the caller.
    Success,
    /// Retry after a back-off, if the policy and the budget allow.
    Retry,
    /// Send the same attempt again with no back-off, back through the gate; not an
    /// attempt.
    Redial,
    /// Refresh the token and send again at once; an attempt, but no retry budget spent.
    Replay,
    /// Return the error to the caller.
    Final,
}

/// What the outcome tells the circuit breaker.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BreakerEffect {
    /// The API works: close if open, reset the cooldown and the failure run.
    Success,
    /// The API failed: counts toward the threshold; a failed probe doubles the cooldown.
    Failure,
    /// The API answered: close if open, but keep the failure run.
    Reachable,
    /// Says nothing about the API's health.
    Untouched,
}

/// An [`Action`] and a [`BreakerEffect`].
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Verdict {
    /// What the loop does next.
    pub action: Action,
    /// What the breaker is told.
    pub breaker: BreakerEffect,
}

const fn verdict(action: Action, breaker: BreakerEffect) -> Verdict {
    Verdict { action, breaker }
}

/// Whether an `Idempotency-Key` value counts as a key: one that is not empty or
/// blank. The attempt loop passes the result to [`is_idempotent`].
///
/// ```
/// use http::HeaderValue;
/// use vantage_api_pool::classify::is_idempotency_key;
///
/// assert!(is_idempotency_key(&HeaderValue::from_static("order-7")));
/// assert!(!is_idempotency_key(&HeaderValue::from_static("")));
/// assert!(!is_idempotency_key(&HeaderValue::from_static("  ")));
/// ```
#[must_use]
pub fn is_idempotency_key(value: &HeaderValue) -> bool {
    !value.as_bytes().trim_ascii().is_empty()
}

/// Whether a request may be sent more than once: an RFC 9110 idempotent method (GET,
/// HEAD, OPTIONS, TRACE, PUT, DELETE), an `Idempotency-Key` header (one that
/// [`is_idempotency_key`] accepts), or a policy that says so. A request without a
/// method is idempotent only if the policy says so.
///
/// ```
/// use http::Method;
/// use vantage_api_pool::classify::is_idempotent;
/// assert!(is_idempotent(Some(&Method::PUT), false, false));
/// assert!(!is_idempotent(Some(&Method::POST), false, false));
/// assert!(is_idempotent(Some(&Method::POST), true, false));
/// assert!(!is_idempotent(None, false, false));
/// assert!(!is_idempotent(None, true, false)); // a key alone does not do it
/// assert!(is_idempotent(None, false, true));
/// ```
#[must_use]
pub fn is_idempotent(
    method: Option<&Method>,
    has_idempotency_key: bool,
    policy_says: bool,
) -> bool {
    policy_says
        || method.is_some_and(|m| {
            has_idempotency_key
                || matches!(
                    *m,
                    Method::GET
                        | Method::HEAD
                        | Method::OPTIONS
                        | Method::TRACE
                        | Method::PUT
                        | Method::DELETE
                )
        })
}

/// Classifies one send's outcome. See the module docs for the table.
///
/// ```
/// use http::StatusCode;
/// use vantage_api_pool::classify::{classify, Action, BreakerEffect, CallFacts, Outcome};
///
/// let post = CallFacts::default(); // not idempotent
/// let v = classify(Outcome::Status(StatusCode::INTERNAL_SERVER_ERROR), &post);
/// assert_eq!((v.action, v.breaker), (Action::Final, BreakerEffect::Failure));
/// let mut get = CallFacts::default();
/// get.idempotent = true;
/// let v = classify(Outcome::Status(StatusCode::INTERNAL_SERVER_ERROR), &get);
/// assert_eq!((v.action, v.breaker), (Action::Retry, BreakerEffect::Failure));
/// ```
#[must_use]
pub fn classify(outcome: Outcome, facts: &CallFacts) -> Verdict {
    use Action::*;
    use BreakerEffect as B;
    let maybe_processed = if facts.idempotent { Retry } else { Final };
    // A status that says the request was not processed, unless it answers a hop a
    // redirect led to: the request itself was answered with that redirect.
    let not_processed = if facts.answered_by_redirect {
        maybe_processed
    } else {
        Retry
    };
    match outcome.judged(facts.redials_used) {
        Outcome::Status(s) if s.is_success() => verdict(Success, B::Success),
        Outcome::Status(s) if s.is_informational() || s.is_redirection() => {
            verdict(Success, B::Reachable)
        }
        Outcome::Status(StatusCode::UNAUTHORIZED)
            if facts.can_replay_401 && (facts.idempotent || !facts.answered_by_redirect) =>
        {
            verdict(Replay, B::Reachable)
        }
        Outcome::Status(StatusCode::REQUEST_TIMEOUT) => verdict(maybe_processed, B::Untouched),
        Outcome::Status(StatusCode::TOO_MANY_REQUESTS) => verdict(not_processed, B::Untouched),
        Outcome::Status(StatusCode::SERVICE_UNAVAILABLE) if facts.has_server_delay => {
            verdict(not_processed, B::Failure)
        }
        Outcome::Status(s) if s.is_server_error() => verdict(maybe_processed, B::Failure),
        // Every other status: 4xx, and codes outside 100..=599 that `http` accepts.
        Outcome::Status(_) => verdict(Final, B::Reachable),
        Outcome::Transport(kind) => match kind {
            TransportErrorKind::NotSent => verdict(Redial, B::Untouched),
            TransportErrorKind::TimedOut if facts.cut_by_budget => {
                verdict(maybe_processed, B::Untouched)
            }
            TransportErrorKind::Interrupted | TransportErrorKind::TimedOut => {
                verdict(maybe_processed, B::Failure)
            }
            TransportErrorKind::Connect => verdict(Retry, B::Failure),
            TransportErrorKind::Tls => verdict(Final, B::Failure),
            TransportErrorKind::TooLarge | TransportErrorKind::Config => {
                verdict(Final, B::Untouched)
            }
        },
    }
}

/// What a response for the caller (a status [`classify`] calls a success, or one the
/// policy takes as an answer) tells the breaker: the table's verdict, with a 2xx,
/// the common answer, read off at once (it is a success whatever the call's facts).
#[inline]
pub(crate) fn answer_breaker_effect(status: StatusCode) -> BreakerEffect {
    if status.is_success() {
        BreakerEffect::Success
    } else {
        classify(Outcome::Status(status), &CallFacts::default()).breaker
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Action::*;
    use BreakerEffect as B;
    use TransportErrorKind as T;

    fn facts(
        idempotent: bool,
        can_replay_401: bool,
        redials_used: u32,
        has_server_delay: bool,
    ) -> CallFacts {
        CallFacts {
            idempotent,
            can_replay_401,
            redials_used,
            has_server_delay,
            cut_by_budget: false,
            answered_by_redirect: false,
        }
    }

    fn st(code: u16) -> Outcome {
        Outcome::Status(StatusCode::from_u16(code).unwrap())
    }

    #[test]
    fn status_rows() {
        // (outcome, idempotent, refresher, server delay) -> (action, breaker)
        let rows: &[(u16, bool, bool, bool, Action, BreakerEffect)] = &[
            (200, false, false, false, Success, B::Success),
            (204, false, false, false, Success, B::Success),
            (101, false, false, false, Success, B::Reachable),
            (304, true, false, false, Success, B::Reachable),
            (401, false, true, false, Replay, B::Reachable),
            (401, true, false, false, Final, B::Reachable),
            (408, true, false, false, Retry, B::Untouched),
            (408, false, false, false, Final, B::Untouched),
            (429, false, false, false, Retry, B::Untouched),
            (429, true, false, true, Retry, B::Untouched),
            (400, true, true, false, Final, B::Reachable),
            (403, true, false, false, Final, B::Reachable),
            (404, true, false, true, Final, B::Reachable),
            (409, true, false, false, Final, B::Reachable),
            (503, false, false, true, Retry, B::Failure),
            (503, false, false, false, Final, B::Failure),
            (503, true, false, false, Retry, B::Failure),
            (500, false, false, true, Final, B::Failure),
            (500, true, false, false, Retry, B::Failure),
            (502, true, false, false, Retry, B::Failure),
            (504, false, false, false, Final, B::Failure),
            (599, true, false, false, Retry, B::Failure),
            (999, true, false, false, Final, B::Reachable),
        ];
        for &(code, idem, refresh, delay, action, breaker) in rows {
            let v = classify(st(code), &facts(idem, refresh, 0, delay));
            assert_eq!(
                v,
                Verdict { action, breaker },
                "status {code} idempotent={idem} refresh={refresh} delay={delay}"
            );
        }
    }

    #[test]
    fn transport_rows() {
        let rows: &[(T, bool, u32, Action, BreakerEffect)] = &[
            (T::NotSent, false, 0, Redial, B::Untouched),
            (T::NotSent, false, 1, Redial, B::Untouched),
            (T::NotSent, false, 2, Final, B::Failure),
            (T::NotSent, true, 2, Retry, B::Failure),
            (T::Connect, false, 0, Retry, B::Failure),
            (T::Connect, true, 0, Retry, B::Failure),
            (T::Interrupted, false, 0, Final, B::Failure),
            (T::Interrupted, true, 0, Retry, B::Failure),
            (T::TimedOut, false, 0, Final, B::Failure),
            (T::TimedOut, true, 0, Retry, B::Failure),
            (T::Tls, true, 0, Final, B::Failure),
            (T::TooLarge, true, 0, Final, B::Untouched),
            (T::Config, true, 0, Final, B::Untouched),
        ];
        for &(kind, idem, redials, action, breaker) in rows {
            let v = classify(Outcome::Transport(kind), &facts(idem, true, redials, false));
            assert_eq!(
                v,
                Verdict { action, breaker },
                "{kind} idempotent={idem} redials={redials}"
            );
        }
    }

    #[test]
    fn a_cut_by_the_budget_leaves_the_breaker_alone() {
        for (idem, action) in [(false, Final), (true, Retry)] {
            let cut = CallFacts {
                cut_by_budget: true,
                ..facts(idem, true, 0, false)
            };
            let v = classify(Outcome::Transport(T::TimedOut), &cut);
            assert_eq!(v, verdict(action, B::Untouched), "idempotent={idem}");
            // The fact concerns time limits only.
            let v = classify(Outcome::Transport(T::Interrupted), &cut);
            assert_eq!(v.breaker, B::Failure);
        }
    }

    #[test]
    fn a_status_of_a_hop_a_redirect_led_to_is_retried_only_when_idempotent() {
        // (status, server delay, refresher) -> verdict without / with idempotency.
        let rows: &[(u16, bool, bool, Action, Action, BreakerEffect)] = &[
            (429, false, false, Final, Retry, B::Untouched),
            (503, true, false, Final, Retry, B::Failure),
            (401, false, true, Final, Replay, B::Reachable),
            // Unchanged: already judged as maybe processed, or final.
            (503, false, false, Final, Retry, B::Failure),
            (500, false, false, Final, Retry, B::Failure),
            (408, false, false, Final, Retry, B::Untouched),
            (404, false, false, Final, Final, B::Reachable),
            (200, false, false, Success, Success, B::Success),
        ];
        for &(code, delay, refresh, plain, idem, breaker) in rows {
            for (idempotent, action) in [(false, plain), (true, idem)] {
                let redirected = CallFacts {
                    answered_by_redirect: true,
                    ..facts(idempotent, refresh, 0, delay)
                };
                assert_eq!(
                    classify(st(code), &redirected),
                    verdict(action, breaker),
                    "{code} idempotent={idempotent}"
                );
            }
        }
    }

    #[test]
    fn reach() {
        assert!(st(500).may_have_reached());
        for (k, want) in [
            (T::NotSent, false),
            (T::Connect, false),
            (T::Tls, false),
            (T::Config, false),
            (T::Interrupted, true),
            (T::TimedOut, true),
            (T::TooLarge, true),
        ] {
            assert_eq!(Outcome::Transport(k).may_have_reached(), want, "{k}");
        }
    }

    #[test]
    fn idempotency() {
        for m in [
            Method::GET,
            Method::HEAD,
            Method::OPTIONS,
            Method::TRACE,
            Method::PUT,
            Method::DELETE,
        ] {
            assert!(is_idempotent(Some(&m), false, false), "{m}");
        }
        for m in [Method::POST, Method::PATCH, Method::CONNECT] {
            assert!(!is_idempotent(Some(&m), false, false), "{m}");
            assert!(is_idempotent(Some(&m), true, false), "{m} with key");
            assert!(is_idempotent(Some(&m), false, true), "{m} by policy");
        }
        assert!(!is_idempotent(None, false, false));
        assert!(is_idempotent(None, false, true));
    }
}
