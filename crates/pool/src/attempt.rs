//! The attempt loop: `wait_for_gate` → `send_once` → `record`, until the call
//! succeeds, ends, or its future is dropped.
//!
//! The loop owns every rule that needs time: time limits, back-off sleeps, redials
//! and the budget. What an outcome means comes from [`classify`](crate::classify);
//! how long to wait from [`backoff`](crate::backoff) and
//! [`server_delay`](crate::server_delay).

use std::borrow::Borrow;
use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderValue, Method};

use crate::auth::{self, SharedAuthError, Token, TokenSource};
use crate::backoff::{DelaySource, apply_jitter, backoff};
use crate::breaker::{CircuitBreaker, Gate, PROBE_RECHECK, ProbeGuard, Refusal, Transition};
use crate::classify::{
    Action, BreakerEffect, CallFacts, IDEMPOTENCY_KEY, Outcome, answer_breaker_effect, classify,
    is_idempotency_key, is_idempotent,
};
use crate::client::{CallTag, Events, ReadResponse, Shared, report_at_drop};
use crate::concurrency::Permit;
use crate::error::{
    ClientError, ErrorKind, ErrorResponseHead, MAX_ERROR_BODY, TimeLimit, trim_unfinished_char,
};
use crate::observer::{CallEnd, CallId, CallOutcome, EventKind};
use crate::policy::{BreakerMode, CallPolicy};
use crate::rate::TokenBucket;
use crate::runtime::{Elapsed, Runtime, timeout_at};
use crate::server_delay::server_delay;
use crate::sync::WakeOnDrop;
use crate::time::{Instant, millis_between};
use crate::transport::{
    PreparedRequest, Transport, TransportError, TransportErrorKind, TransportResponse, read_body,
};

/// The auth token a request carries: its generation, and when it expires
/// ([`Instant::FAR_FUTURE`] for a token without a lifetime).
#[derive(Debug, Clone, Copy)]
struct Held {
    generation: u64,
    expires_at: Instant,
}

impl Held {
    fn of(token: &Token) -> Self {
        Held {
            generation: token.generation,
            expires_at: token.expires_at,
        }
    }

    /// Whether it has a lifetime (one that can run out).
    fn has_lifetime(self) -> bool {
        self.expires_at != Instant::FAR_FUTURE
    }

    fn expired(self, now: Instant) -> bool {
        auth::expired(self.expires_at, now)
    }
}

/// What the gate hands to `send_once`.
struct Ticket<'c> {
    /// The probe slot, when this send is the half-open probe.
    probe: Option<ProbeGuard<'c>>,
    /// The clock as the gate let the send through.
    now: Instant,
    /// Whether the call may have given way to other tasks after the breaker let it
    /// through (an admission wait), so the breaker may have changed: it is asked
    /// again before a request is built.
    yielded: bool,
}

/// Polls `future` once, without waiting: `Pending` leaves it registered to wake this
/// task, so the caller can go on to await it.
async fn poll_once<F: Future + ?Sized>(mut future: Pin<&mut F>) -> Poll<F::Output> {
    poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx))).await
}

/// Where a call that got a response for the caller ends: at the response head
/// (`execute` and its kin), or once the body is read, inside the attempt
/// (`execute_read` and its kin). A type per kind, so the head-only loop carries no
/// body read.
pub(crate) trait Ending<Response> {
    type Output;
    /// The body's size limit when the attempt reads the body; `None` ends the call
    /// at the head.
    fn body_limit(&self) -> Option<usize>;
    /// The caller's answer: the response, and the body the attempt read (empty when
    /// it read none).
    fn output(response: Response, body: Bytes) -> Self::Output;
}

/// The call ends at the response head.
pub(crate) struct AtHead;

impl<Response> Ending<Response> for AtHead {
    type Output = Response;

    #[inline(always)]
    fn body_limit(&self) -> Option<usize> {
        None
    }

    #[inline(always)]
    fn output(response: Response, _unread: Bytes) -> Response {
        response
    }
}

/// The attempt reads the body, up to this many bytes.
pub(crate) struct ReadBody(pub(crate) usize);

impl<Response> Ending<Response> for ReadBody {
    type Output = ReadResponse<Response>;

    fn body_limit(&self) -> Option<usize> {
        Some(self.0)
    }

    fn output(response: Response, body: Bytes) -> ReadResponse<Response> {
        ReadResponse { response, body }
    }
}

/// One call's state, for the life of one `execute_with` future. Dropped before
/// [`run`](Call::run) reported its end, it reports the end: `Cancelled` when the
/// caller dropped the call's future, `Panicked` when a panic unwinds through it.
pub(crate) struct Call<'c, T, R: Runtime, A, P: Borrow<CallPolicy>> {
    client: &'c Shared<T, R, A>,
    /// The call's policy, borrowed (`&CallPolicy`) or kept (`CallPolicy`).
    policy: P,
    id: CallId,
    /// Sends made so far (redials and replays included).
    send: u32,
    /// Attempts made so far (a redial does not start a new one).
    attempt: u32,
    /// Retries made so far (back-off sleeps taken).
    retries: u32,
    /// `NotSent` redials made so far.
    redials: u32,
    /// Whether some send may have reached the server.
    reached: bool,
    /// Whether the next send redials the last attempt (after `NotSent`).
    redialing: bool,
    /// Where the call stands with its one 401 replay.
    replay: Replay,
    /// The auth token of the last send's request.
    token: Option<Held>,
    /// Whether the call reached the gate yet (the first visit turns the policy's
    /// budget into `deadline`) and has not reported its end: whether an end is
    /// still to be reported.
    gate_reached: bool,
    /// The clock at the call's first visit to the gate.
    began: Instant,
    /// The reading of the call's last `Started` or failure (`began` until its first
    /// send): what its end falls back on if the clock panics as a dropped call
    /// reports it (no event of the call is later, short of a success, after which
    /// it returns).
    last_at: Instant,
    /// When the budget ends ([`Instant::FAR_FUTURE`] for a policy without one, which
    /// no reading reaches); pushed later by time spent in `admit()`. Not an `Option`:
    /// that would make every call's future 8 bytes larger.
    deadline: Instant,
    /// Whether an admission of this call waited (so `deadline` may move again).
    admission_waited: bool,
    /// Whether the last send's request was a `HEAD` (its answer has no body,
    /// whatever its `Content-Length` says); kept only for calls that read the body.
    head_request: bool,
    /// The error of the last failed send that the call went on from (retry, redial,
    /// replay): the `source()` of a refusal that ends the call before its next send.
    last_failure: Option<Arc<ClientError>>,
}

/// Whether a response with this status goes to the caller (1xx, 2xx, 3xx); any
/// other status is an error response, unless the policy takes it as an answer. Only the status is read, so the call's state
/// never holds a borrowed head and the response is not moved to be sorted.
#[inline]
fn for_caller(status: http::StatusCode) -> bool {
    status.is_success() || status.is_informational() || status.is_redirection()
}

/// Where a call stands with its one 401 replay.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Replay {
    /// None decided yet.
    NotYet,
    /// Decided, its refresh (run or waited for) ended, and the gate has neither
    /// waited nor looked for a token since: at that look it takes the token the
    /// refresh brought (or a newer one) due for renewal or not, as a caller that
    /// waited for a fetch does.
    Refreshed,
    /// Decided (its refresh running, or a gate's wait or look after it made): no
    /// second replay.
    Made,
}

/// What comes after a failed send.
enum Next {
    /// The call ends with this error.
    Return(ClientError),
    /// Fetch a newer token, then send again (a 401 replay).
    Replay,
    /// Send the same attempt again at once (after `NotSent`).
    Redial,
    /// Sleep until `wake`, then retry.
    Retry { wake: Instant },
}

/// What the call keeps of an error response's head.
struct ErrorHead {
    status: http::StatusCode,
    /// The headers, in the allocation the error will keep them in.
    response: ErrorResponseHead,
    /// The server's requested delay, unclamped.
    wait: Option<Duration>,
    request_id: Option<Arc<str>>,
    /// It answers a hop that went out without the client's credentials (a redirect
    /// crossed origins).
    credentials_dropped: bool,
    /// The request was answered with a redirect the transport followed with another
    /// request, which this answers.
    answered_by_redirect: bool,
}

/// How a failed send ended, before classification (a 1xx, 2xx or 3xx head is
/// returned to the caller straight away).
enum Sent {
    /// Any other status, with what the call keeps of it.
    ErrorStatus { head: ErrorHead, body: Bytes },
    /// The transport failed, or the send's time limit cut it (`TimedOut`);
    /// `limit`: which of the client's limits cut it (`None`: the transport failed,
    /// a `TimedOut` of its own included); `cut_by_budget`: that limit was the rest of
    /// the call's budget, less than half the attempt timeout.
    Failed {
        error: TransportError,
        limit: Option<TimeLimit>,
        cut_by_budget: bool,
        /// It failed while the attempt read a success body (`execute_read`).
        in_body: Option<AfterHead>,
    },
}

/// What a send that failed in its success body's read keeps of the head.
struct AfterHead {
    /// The head's request id: the last response the call got.
    request_id: Option<Arc<str>>,
}

/// Emits `Cancelled` for a send whose future is dropped before its terminal event.
struct InFlight<'a, T, R: Runtime, A> {
    client: &'a Shared<T, R, A>,
    call: CallTag,
    /// The send's number (from 1), or 0 once the guard is disarmed: the guard
    /// reports nothing on drop then. (A flag of its own would make every call's
    /// future 8 bytes larger.)
    send: u32,
    attempt: u32,
    /// The send's permit, until the response head.
    permit: Option<Permit<'a>>,
    /// The probe slot, when the send is the probe, until the breaker is told.
    probe: Option<ProbeGuard<'a>>,
    /// When `Started` was reported: the reading a dropped send's `Cancelled` falls
    /// back on if the clock panics.
    started: Instant,
}

impl<T, R: Runtime, A> InFlight<'_, T, R, A> {
    /// Reports the send's terminal event (built by `kind`, only for an observer that
    /// listens, straight into the event) at `at`, then the breaker's `transition` it
    /// caused (told even if the observer panics on the terminal event); the guard
    /// then reports nothing on drop.
    #[inline(always)]
    fn finish(
        mut self,
        at: Instant,
        kind: impl FnOnce() -> EventKind,
        transition: Option<Transition>,
    ) {
        // Disarmed by taking it apart: what it still holds goes back once the events
        // are told (or as a panic of the observer's unwinds), as when the guard was
        // dropped here, and the send pays no call to its drop glue.
        let held = (self.permit.take(), self.probe.take());
        let (events, call) = (&self.client.events, self.call);
        std::mem::forget(self);
        match transition {
            None => events.emit(|| at, Some(call), kind),
            Some(t) => {
                let transition = Told::later(events, call, at, || told(t));
                events.emit(|| at, Some(call), kind);
                drop(transition);
            }
        }
        drop(held);
    }

    /// Takes the guard off: the send never left, and its permit and probe slot go
    /// back now.
    fn disarm(mut self) {
        self.send = 0;
    }
}

impl<T, R: Runtime, A> Drop for InFlight<'_, T, R, A> {
    #[inline]
    fn drop(&mut self) {
        if self.send != 0 {
            // The permit and the probe slot go back before the observer hears of it.
            drop(self.permit.take());
            drop(self.probe.take());
            let client = self.client;
            if !client.events.is_listening() {
                return;
            }
            let (send, attempt, call) = (self.send, self.attempt, self.call);
            // A clock that panics here leaves the `Started`'s reading in its place.
            report_at_drop(
                || client.runtime.now(),
                self.started,
                |at, _| {
                    let kind = || EventKind::Cancelled { send, attempt };
                    client.events.emit(|| at, Some(call), kind);
                },
            );
        }
    }
}

impl<T, R: Runtime, A, P: Borrow<CallPolicy>> Call<'_, T, R, A, P> {
    /// The id and label its events carry.
    fn tag(&self) -> CallTag {
        CallTag {
            id: self.id,
            label: self.policy.borrow().label(),
        }
    }

    /// Whether the call's end is still to be reported, to an observer that listens.
    /// The debt is taken at the first ask: whatever reports the end (a return, a
    /// drop) asks first, so a panic in the observer never reports it twice.
    #[inline(always)]
    fn end_owed(&mut self) -> bool {
        std::mem::take(&mut self.gate_reached) && self.client.events.is_listening()
    }

    /// Tells the observer the call ended at `at` with `outcome` (called once
    /// [`end_owed`](Self::end_owed) said one listens). Not inlined: the loop pays a
    /// call for it, not its body.
    #[inline(never)]
    fn report_end(&self, at: Instant, outcome: CallOutcome) {
        let tag = self.tag();
        self.client.events.end(&CallEnd {
            call: tag.id,
            label: tag.label,
            began: self.began,
            at,
            sends: self.send,
            attempts: self.attempt,
            outcome,
        });
    }

    /// Reports the end of a call dropped before it ended: `Panicked` while a panic
    /// unwinds or when the clock panics as it is read here (the call's last reading
    /// then stands in, so its end comes no earlier than its events), `Cancelled`
    /// otherwise.
    #[cold]
    fn dropped(&self) {
        let panicking = std::thread::panicking();
        report_at_drop(
            || self.client.runtime.now(),
            self.last_at,
            |at, clock_panicked| {
                let outcome = if panicking || clock_panicked {
                    CallOutcome::Panicked
                } else {
                    CallOutcome::Cancelled
                };
                self.report_end(at, outcome);
            },
        );
    }
}

impl<T, R: Runtime, A, P: Borrow<CallPolicy>> Drop for Call<'_, T, R, A, P> {
    #[inline]
    fn drop(&mut self) {
        // Dropped before the call reported its end: the caller dropped the call (its
        // send in flight, if any, reported `Cancelled` first), or a panic unwinds
        // through it.
        if self.end_owed() {
            self.dropped();
        }
    }
}

/// The event that tells a breaker transition.
fn told(transition: Transition) -> EventKind {
    match transition {
        Transition::Opened { cooldown } => EventKind::BreakerOpened { cooldown },
        Transition::Closed => EventKind::BreakerClosed,
    }
}

/// The `Failed { ms: 0, sent: false }` of a send that never went out.
fn unsent(send: u32, attempt: u32, error: &ClientError) -> EventKind {
    EventKind::Failed {
        send,
        attempt,
        error: error.clone(),
        ms: 0,
        sent: false,
    }
}

/// An event to report when this is dropped: after the one reported while it is
/// held, even if the observer panics on that one (the panic then goes on to the
/// caller once this is told).
struct Told<'a> {
    events: &'a Events,
    call: CallTag,
    at: Instant,
    kind: Option<EventKind>,
}

impl<'a> Told<'a> {
    /// `kind` is built only when an observer listens.
    fn later(
        events: &'a Events,
        call: CallTag,
        at: Instant,
        kind: impl FnOnce() -> EventKind,
    ) -> Self {
        let kind = events.is_listening().then(kind);
        Told {
            events,
            call,
            at,
            kind,
        }
    }
}

impl Drop for Told<'_> {
    fn drop(&mut self) {
        if let Some(kind) = self.kind.take() {
            self.events
                .emit_from_drop(|| self.at, Some(self.call), || kind);
        }
    }
}

impl<'c, T: Transport, R: Runtime, A: TokenSource, P: Borrow<CallPolicy>> Call<'c, T, R, A, P> {
    pub(crate) fn new(client: &'c Shared<T, R, A>, policy: P, id: CallId) -> Self {
        Call {
            client,
            policy,
            id,
            send: 0,
            attempt: 0,
            retries: 0,
            redials: 0,
            reached: false,
            redialing: false,
            replay: Replay::NotYet,
            token: None,
            gate_reached: false,
            began: Instant::ORIGIN,
            last_at: Instant::ORIGIN,
            deadline: Instant::FAR_FUTURE,
            admission_waited: false,
            head_request: false,
            last_failure: None,
        }
    }

    fn policy(&self) -> &CallPolicy {
        self.policy.borrow()
    }

    /// When the call's budget ends, if its policy has one.
    fn budget_end(&self) -> Option<Instant> {
        (self.deadline != Instant::FAR_FUTURE).then_some(self.deadline)
    }

    /// Whether `at` is at or past the end of the call's budget (never, without one:
    /// not even a wake-up that saturated to the far future).
    fn past_budget(&self, at: Instant) -> bool {
        self.deadline != Instant::FAR_FUTURE && at >= self.deadline
    }

    fn now(&self) -> Instant {
        self.client.runtime.now()
    }

    /// Reports an event at a time already read from the clock.
    fn emit_at(&self, at: Instant, kind: impl FnOnce() -> EventKind) {
        self.client.events.emit(|| at, Some(self.tag()), kind);
    }

    /// Ends the call before a send: a synthetic `Started` + `Failed { sent: false }`
    /// pair carrying `error`, then the call's end; `error` is returned.
    fn refuse(&mut self, error: ClientError) -> ClientError {
        let error = self.after_last_failure(error);
        let attempt = if self.redialing {
            self.attempt
        } else {
            self.attempt.saturating_add(1)
        };
        let send = self.send.saturating_add(1);
        // The pair is the call's last `Started`, for its end.
        (self.send, self.attempt) = (send, attempt);
        let events = &self.client.events;
        if events.is_listening() {
            // One reading for the pair. The `Failed` is told even if the observer
            // panics on the `Started`.
            let at = self.now();
            let failed = Told::later(events, self.tag(), at, || unsent(send, attempt, &error));
            self.emit_at(at, || EventKind::Started { send, attempt });
            drop(failed);
        }
        self.end_failed(error)
    }

    /// A refusal (time limit, open breaker, auth failure, a request that could not
    /// be built) that ends a call which had failed sends gets the last of their
    /// errors as its source, so the 503 and its body that led here are not lost, and
    /// the request id of the last response. An error with a source of its own keeps
    /// it.
    fn after_last_failure(&self, error: ClientError) -> ClientError {
        let error = self.with_last_request_id(error);
        match &self.last_failure {
            Some(last) if std::error::Error::source(&error).is_none() => {
                error.with_source(Arc::clone(last) as _)
            }
            _ => error,
        }
    }

    /// `error`, with the request id of the last response the call got if it has no
    /// response of its own and an earlier send got one.
    fn with_last_request_id(&self, error: ClientError) -> ClientError {
        match &self.last_failure {
            Some(last) => error.with_request_id_of(last),
            None => error,
        }
    }

    /// Reports the `Failed { ms: 0, sent: false }` of a send that never went out, at
    /// `at`.
    fn failed_unsent(&self, at: Instant, send: u32, attempt: u32, error: &ClientError) {
        self.emit_at(at, || unsent(send, attempt, error));
    }

    /// Sleeps `wait` from `now` at the gate, unless the budget would end first: then
    /// the call ends at once with `TimedOut` (waiting for a deadline it cannot meet
    /// helps nobody). Returns the clock after the sleep.
    async fn gate_sleep(&self, now: Instant, wait: Duration) -> Result<Instant, ClientError> {
        let wake = self.gate_wake(now, wait)?;
        self.client.runtime.sleep_until(wake).await;
        Ok(self.now())
    }

    /// When a gate wait of `wait` from `now` ends, or `TimedOut` if that is at or
    /// past the budget's end.
    fn gate_wake(&self, now: Instant, wait: Duration) -> Result<Instant, ClientError> {
        let wake = now.saturating_add(wait);
        if self.past_budget(wake) {
            return Err(self.timed_out_at_gate());
        }
        Ok(wake)
    }

    /// A `WaitForProbe` caller's wait out of the breaker's cooldown (`wait`): a gate
    /// wait of known length, cut short when the breaker closes (a
    /// [`reset`](CircuitBreaker::reset), or an answer while open) after the `seen`-th
    /// close (the count the refusal carried, read under its lock).
    async fn breaker_sleep(
        &self,
        breaker: &CircuitBreaker,
        now: Instant,
        wait: Duration,
        seen: u64,
    ) -> Result<Instant, ClientError> {
        let wake = self.gate_wake(now, wait)?;
        // Either way ends the wait: the close, or the cooldown's end (`Elapsed`).
        let _ = timeout_at(&self.client.runtime, wake, breaker.closed_since(seen)).await;
        Ok(self.now())
    }

    fn fails_fast(&self) -> bool {
        self.policy().breaker_mode() != BreakerMode::WaitForProbe
    }

    /// The refusal of a call that fails fast, with the rest of the cooldown as the
    /// error's `retry_after` (none while another call's probe is out: nobody knows
    /// when it will answer).
    fn breaker_open(&self, refusal: Refusal) -> ClientError {
        let wait = match refusal {
            Refusal::Cooldown { wait, .. } => Some(wait),
            Refusal::ProbeOut => None,
        };
        ClientError::new(ErrorKind::BreakerOpen, self.attempt)
            .with_reached(self.reached)
            .with_retry_after(wait)
    }

    fn timed_out_at_gate(&self) -> ClientError {
        ClientError::timed_out(TimeLimit::Budget, self.attempt).with_reached(self.reached)
    }

    /// Waits for a rate token: the bucket had none for `wait` from `now`. Each sleep
    /// is a gate wait of known length (it ends the call at once if it would reach
    /// the budget's end). Returns the clock when the token was taken.
    async fn wait_for_token(
        &self,
        bucket: &TokenBucket,
        mut now: Instant,
        mut wait: Duration,
    ) -> Result<Instant, ClientError> {
        loop {
            now = self.gate_sleep(now, wait).await?;
            match bucket.try_take(now) {
                Ok(()) => return Ok(now),
                Err(next) => wait = next,
            }
        }
    }

    /// `wait_for_gate`: the breaker (its cooldown waited out, its probe slot taken
    /// if this send is the probe), then the transport's shared limiter (not charged
    /// to the budget); the gate's last step, the auth token, is taken by `run` as
    /// soon as this future is done. Holds no permit; the rate token is taken later,
    /// after the permit (see `run`). Returns the clock as the gate let the send
    /// through; the clock is read again only after a wait (a cooldown, an admission,
    /// a token fetch), not for a token at hand.
    async fn wait_for_gate(&mut self) -> Result<Ticket<'c>, ClientError> {
        let mut now = self.now();
        // The budget starts when the call first reaches the gate.
        if !self.gate_reached {
            self.gate_reached = true;
            self.began = now;
            self.last_at = now;
            self.deadline = self
                .policy()
                .budget()
                .map_or(Instant::FAR_FUTURE, |budget| now.saturating_add(budget));
        }
        // The breaker comes before the transport's admission: a refused call queues
        // for none, a waiting one takes its admission when it can send, and the
        // probe takes its slot first, so callers the probe turns away do not queue
        // for admissions either. A change during the admission wait is caught by
        // the second look after the gate (`yielded`).
        let probe = loop {
            if self.past_budget(now) {
                return Err(self.timed_out_at_gate());
            }
            let Some(breaker) = &self.client.breaker else {
                break None;
            };
            match breaker.admit(now) {
                Ok(probe) => break probe.map(|epoch| ProbeGuard::new(breaker, epoch)),
                // Failing fast needs no future, so an outage's refusals allocate
                // nothing.
                Err(refusal) if self.fails_fast() => return Err(self.breaker_open(refusal)),
                // A re-check while another call's probe is out: a reset is seen at
                // the next look, so these frequent short waits register nothing.
                Err(Refusal::ProbeOut) => {
                    self.spend_replay_exemption();
                    now = Box::pin(self.gate_sleep(now, PROBE_RECHECK)).await?;
                }
                Err(Refusal::Cooldown { wait, closes }) => {
                    self.spend_replay_exemption();
                    now = Box::pin(self.breaker_sleep(breaker, now, wait, closes)).await?;
                }
            }
        };
        let mut admit = pin!(self.client.transport.admit());
        // An admission that waited counts as giving way even when the clock did not
        // move (a virtual or paused clock, a coarse browser clock).
        let admission_waited = poll_once(admit.as_mut()).await.is_pending();
        if admission_waited {
            self.admission_waited = true;
            self.spend_replay_exemption();
            admit.await;
            let after = self.now();
            // (The far future, no budget, stays where it is.)
            self.deadline = self
                .deadline
                .saturating_add(after.saturating_duration_since(now));
            now = after;
        }
        Ok(Ticket {
            probe,
            now,
            yielded: admission_waited,
        })
    }

    /// A wait at the gate (the breaker's, an admission's) spends a 401 replay's
    /// exemption: after it, the token its refresh brought has not just landed, and
    /// is renewed like any caller's if due.
    fn spend_replay_exemption(&mut self) {
        if self.replay == Replay::Refreshed {
            self.replay = Replay::Made;
        }
    }

    /// The current token, if one is at hand at `now` for this call without a wait: a
    /// usable token not due for renewal (or due, with a fetch running), or, at a
    /// 401's replay's first look after its refresh, with no wait at the gate in
    /// between, a usable token due or not. That look spends the exemption.
    #[inline(always)]
    fn token_at_hand(&mut self, now: Instant) -> Option<Token> {
        let just_refreshed = self.replay == Replay::Refreshed;
        self.spend_replay_exemption();
        let auth = &self.client.auth_state;
        if just_refreshed {
            auth.current_due_or_not(now)
        } else {
            auth.current(None, now)
        }
    }

    /// The auth token to apply, if the client has a token source: fetched on first
    /// use, newer than `stale` after a 401, or awaited while a refresh that a 401
    /// for the current token started is running. The wait counts toward the budget.
    async fn auth_token(&self, stale: Option<u64>) -> Result<Option<Token>, ClientError> {
        let client = self.client;
        if !client.auth.is_configured() {
            return Ok(None);
        }
        // The common case, a current token, needs no future at all; the fetch (first
        // use, refresh) is boxed so its state does not grow every call's future.
        if let Some(token) = client.auth_state.current(stale, self.now()) {
            return Ok(Some(token));
        }
        Box::pin(self.fetch_token(stale)).await
    }

    /// Fetches a token (single-flight), raced against the budget's end. With the
    /// budget already spent (a 401 whose error body ran to its end), no fetch starts:
    /// `timeout_at` polls its work once before it looks at the clock, and that poll
    /// would already reach the token endpoint, only to be dropped.
    async fn fetch_token(&self, stale: Option<u64>) -> Result<Option<Token>, ClientError> {
        let client = self.client;
        if self
            .budget_end()
            .is_some_and(|deadline| self.now() >= deadline)
        {
            return Err(self.timed_out_at_gate());
        }
        let env = client.fetch_env();
        let fetch = client.auth_state.token(&client.auth, stale, &env);
        let result = match self.budget_end() {
            Some(deadline) => match timeout_at(&client.runtime, deadline, fetch).await {
                Ok(result) => result,
                Err(_) => return Err(self.timed_out_at_gate()),
            },
            None => fetch.await,
        };
        match result {
            Ok(token) => Ok(Some(token)),
            Err(e) => Err(ClientError::new(ErrorKind::Auth, self.attempt)
                .with_reached(self.reached)
                .with_source(Arc::new(SharedAuthError(e)))),
        }
    }

    /// The waits of a send that could not leave at once, holding the prepared
    /// request: the permit queue, if `held` is no permit (the lock-free take found
    /// none, or callers queued), raced against the budget's end; then the rate token,
    /// taken holding the permit, each sleep a gate wait of known length. The breaker
    /// is asked again after each wait ([`still_allowed`](Self::still_allowed)): a
    /// send it turns back after its permit wait takes no rate token and does not
    /// wait for one. If a refresh brought a newer token meanwhile, and every token
    /// since the request's own came under its header name, the request goes out with
    /// it. If a 401 rejected the request's own token meanwhile and the refresh is
    /// still running, the send waits for it, holding the permit (a token rejected
    /// while its refresh runs is handed to nobody; a refresh that fails lets the
    /// request keep its own if it is still the cached token); so does one whose
    /// token expired. Returns the permit, the request, the token it now carries and
    /// the clock, or `None` if the breaker turned it back or the new token cannot
    /// replace the request's (turned back through the gate).
    async fn wait_to_send(
        &self,
        held: Option<Permit<'c>>,
        mut request: T::Request,
        mut now: Instant,
        probe: &mut Option<ProbeGuard<'c>>,
    ) -> Result<Option<(Permit<'c>, T::Request, Option<Held>, Instant)>, ClientError> {
        let client = self.client;
        let permit = match held {
            Some(permit) => permit,
            None => {
                let acquire = client.limiter.acquire();
                let permit = match self.budget_end() {
                    Some(deadline) => timeout_at(&client.runtime, deadline, acquire)
                        .await
                        .map_err(|_| self.timed_out_at_gate())?,
                    None => acquire.await,
                };
                now = self.now();
                // A permit granted at the budget's end (the race polls the wait
                // first): no time to send, so no rate token is taken for it.
                if self.past_budget(now) {
                    return Err(self.timed_out_at_gate());
                }
                if !self.still_allowed(probe, now) {
                    return Ok(None);
                }
                permit
            }
        };
        // Another call's 401 may have rejected the request's token while it waited
        // for the permit, or the token may have expired. If no newer one is at hand,
        // wait for the refresh here, holding the permit (whoever gets it next needs
        // the new token too), rather than send a token the API refused and spend the
        // call's one replay on it; and before the rate token, which stays the last
        // wait. A refresh that fails lowers the rejection to just below the cached
        // token, and a request that carries it keeps it, as the gate would hand it
        // out (not an expired one: the fetch's failure ends the call); one that
        // carries an older token is still refused. A new token under another header
        // name cannot replace the request's: back through the gate before taking a
        // rate token.
        let mut held = self.newer_token(self.token, &mut request, now);
        if self.refused(held, now) {
            Box::pin(self.fetch_token(None)).await?;
            now = self.now();
            if self.past_budget(now) {
                return Err(self.timed_out_at_gate());
            }
            if !self.still_allowed(probe, now) {
                return Ok(None);
            }
            held = self.newer_token(held, &mut request, now);
            if self.refused(held, now) {
                return Ok(None);
            }
        }
        // The rate token, last.
        if let Some(bucket) = &client.bucket
            && let Err(wait) = bucket.try_take(now)
        {
            now = self.wait_for_token(bucket, now, wait).await?;
            if !self.still_allowed(probe, now) {
                return Ok(None);
            }
        }
        // Refused now: a 401 rejected the token during the rate wait, or it expired
        // there (a token that lives less than the wait). Through the gate again,
        // for a fresh request with a valid token and a fresh rate token, the last
        // wait again, so sends keep to the rate (renewing here, holding the spent
        // one, would send everyone who waited for that renewal at once); the rate
        // token is not refunded, as for a send the breaker turns back. A token that,
        // once fetched, lives less than a rate interval never goes out: the call
        // goes round until its budget ends.
        let held = self.newer_token(held, &mut request, now);
        if self.refused(held, now) {
            return Ok(None);
        }
        Ok(Some((permit, request, held, now)))
    }

    /// Whether a request's token (after [`newer_token`](Self::newer_token)) must not
    /// go out: a 401 rejected it (with the refresh it asked for running or done), or
    /// it has expired by `now`.
    fn refused(&self, held: Option<Held>, now: Instant) -> bool {
        held.is_some_and(|held| self.rejected(held) || held.expired(now))
    }

    /// Whether a 401 rejected `held`, with the refresh it asked for running or done.
    fn rejected(&self, held: Held) -> bool {
        self.client.auth_state.rejected(held.generation)
    }

    /// Asks the breaker again after a wait, since it may have changed meanwhile. A
    /// probe grant goes stale if the breaker closed meanwhile (and maybe opened
    /// again): it is given up, since sending it could put a send inside a new
    /// cooldown or a second probe in flight. A send that is not the probe asks again,
    /// and may be granted the probe. `false`: the breaker turns the send back (it
    /// holds no probe then); the call goes back through the whole gate, and its
    /// request is dropped (the next pass builds a fresh one).
    fn still_allowed(&self, probe: &mut Option<ProbeGuard<'c>>, now: Instant) -> bool {
        let Some(breaker) = &self.client.breaker else {
            return true;
        };
        if probe
            .as_ref()
            .is_some_and(|held| !breaker.holds_probe(held.epoch()))
        {
            *probe = None;
        }
        if probe.is_none() {
            match breaker.check(now) {
                Gate::Allow { probe: granted } => {
                    *probe = granted.map(|epoch| ProbeGuard::new(breaker, epoch));
                }
                Gate::OpenFor(_) => return false,
            }
        }
        true
    }

    /// Takes a rate token now, if the client has a bucket and it has one.
    fn rate_token_now(&self, now: Instant) -> bool {
        self.client
            .bucket
            .as_ref()
            .is_none_or(|bucket| bucket.try_take(now).is_ok())
    }

    /// After a wait with the request prepared, carrying `carried` (the token it was
    /// built with, or one an earlier look put on it): the newest token goes out if a
    /// refresh brought one, and every token since the carried one came under its
    /// header name (a request cannot drop a header, so a token under another name
    /// would go out beside the old one, and overwrite a header of that name the
    /// request set). Returns the token the request now carries, which the next look
    /// starts from: a look from the one it was built with would find no newer token
    /// once the swapped-in one expired, and judge the request by the older token's
    /// expiry.
    fn newer_token(
        &self,
        carried: Option<Held>,
        request: &mut T::Request,
        now: Instant,
    ) -> Option<Held> {
        let held = carried?;
        match self
            .client
            .auth_state
            .newer_under_same_name(held.generation, now)
        {
            Some(newer) => {
                let held = Held::of(&newer);
                request.set_header(newer.name, newer.value);
                Some(held)
            }
            None => Some(held),
        }
    }

    /// Tells the breaker what a send proved, frees the probe slot, and returns the
    /// transition to report after the send's terminal event, and the guard that
    /// wakes the callers a close woke (to drop once both are reported).
    #[inline(always)]
    fn tell_breaker(
        &self,
        effect: BreakerEffect,
        probe: Option<ProbeGuard<'c>>,
        now: Instant,
    ) -> (Option<Transition>, Option<WakeOnDrop>) {
        let Some(breaker) = self.client.breaker.as_ref() else {
            return (None, None);
        };
        let recorded = breaker.record_then_wake(effect, probe.as_ref().map(ProbeGuard::epoch), now);
        drop(probe);
        recorded
    }

    /// Reports the end of a call that returns the response (of `status`) whose
    /// `Succeeded` was reported at `at`.
    #[inline(always)]
    fn end_succeeded(&mut self, at: Instant, status: http::StatusCode) {
        if self.end_owed() {
            self.report_end(at, CallOutcome::Succeeded { status });
        }
    }

    /// Reports the end of a call that returns `error`, and returns it.
    #[cold]
    fn end_failed(&mut self, error: ClientError) -> ClientError {
        if self.end_owed() {
            let at = self.now();
            let outcome = CallOutcome::Failed {
                error: error.clone(),
            };
            self.report_end(at, outcome);
        }
        error
    }

    /// The call: its sends, its end reported as it returns (a drop before that
    /// reports its own). Each return reports in place, so the response is moved
    /// no more than before. An `async` block rather than an `async fn`: an
    /// `async fn` moves its arguments into its body's locals as it starts, a copy of
    /// the call's state on every call, which then sits twice in its future.
    #[allow(clippy::manual_async_fn)]
    pub(crate) fn run<F, E>(
        mut self,
        mut build: F,
        ending: E,
    ) -> impl Future<Output = Result<E::Output, ClientError>>
    where
        F: FnMut(&T::Handle) -> T::Draft,
        E: Ending<T::Response>,
    {
        async move {
            // Named first, so captured (and dropped) first, before the call's state,
            // whose drop reports a dropped call's end: once polled, the order an
            // `async fn` drops its arguments in. (Dropped unpolled, the block drops
            // them in the other order, where nothing can tell: an unpolled call
            // reports nothing, and an `Ending` has no drop.)
            let _ = (&ending, &build);
            let client = self.client;
            loop {
                // ---- wait_for_gate.
                let Ticket {
                    mut probe,
                    mut now,
                    mut yielded,
                } = match self.wait_for_gate().await {
                    Ok(ticket) => ticket,
                    Err(error) => return Err(self.refuse(error)),
                };
                // The gate's last step, the auth token, here rather than in the gate's
                // own future, so the token is never moved out of it. A token at hand
                // takes no wait: the gate's reading still stands, and the call gave way
                // to nobody. A fetch counts as giving way even when its future was
                // ready at once.
                let token = if !client.auth.is_configured() {
                    None
                } else if let Some(token) = self.token_at_hand(now) {
                    Some(token)
                } else {
                    // `auth_token` would look for a token at hand again first.
                    match Box::pin(self.fetch_token(None)).await {
                        Ok(token) => {
                            now = self.now();
                            // A fetch that ended at the budget's end (its race
                            // against the budget polls the fetch first) leaves no
                            // time to send: no request is built.
                            if self.past_budget(now) {
                                drop(probe);
                                return Err(self.refuse(self.timed_out_at_gate()));
                            }
                            yielded = true;
                            token
                        }
                        Err(error) => {
                            drop(probe);
                            return Err(self.refuse(error));
                        }
                    }
                };

                // The gate asked the breaker before its admission and auth waits; after
                // them it is asked again, before a request is built. Turned back, the
                // call goes back through the whole gate.
                if yielded && !self.still_allowed(&mut probe, now) {
                    continue;
                }

                // ---- prepare a fresh request. A draft that cannot be prepared fails
                // here, at once, holding no permit. The transport's result is matched in
                // the loop, so the request moves out of it once (a helper's `Result`
                // around it was one more copy of it), and it is borrowed (decorated) only
                // inside this block: a local of the loop's that is ever borrowed is kept
                // in the call's future across its waits.
                let draft = build(client.transport.handle());
                let idempotent;
                let mut request = {
                    let mut prepared = client.transport.prepare(draft);
                    idempotent = match &mut prepared {
                        Ok(request) => {
                            if ending.body_limit().is_some() {
                                self.head_request = request.method() == Some(&Method::HEAD);
                            }
                            self.decorate(request, token)
                        }
                        Err(error) => {
                            drop(probe);
                            let error = self.unprepared(error);
                            return Err(self.refuse(error));
                        }
                    };
                    match prepared {
                        Ok(request) => request,
                        // Returned above; moving the error out here instead (to return it
                        // from this arm) would make the call's future 104 bytes larger.
                        Err(_) => unreachable!("an unprepared draft returned above"),
                    }
                };
                // The token is looked at again once the request closure and `prepare`
                // have run (they may take time, and other calls go on meanwhile): one
                // that expired, or that another call's 401 rejected, never goes out,
                // and the call goes back through the gate for a valid one. A token
                // without a lifetime costs no clock reading here, and the rejection
                // check no lock.
                if self.token.is_some_and(|held| {
                    (held.has_lifetime() && held.expired(self.now())) || self.rejected(held)
                }) {
                    drop(probe);
                    continue;
                }

                // ---- send_once: the permit (its wait counts toward the budget), then
                // the rate token, holding the permit, then Started, the send under its
                // time limit, and the permit back at the head. The token is the last
                // thing a send waits for, so the sends that start in any window obey the
                // bucket (a token taken before a permit wait would let every caller that
                // queued meanwhile leave at once when permits free). A send that has to
                // wait for either does so in one boxed wait that holds the request, and
                // asks the breaker again after each wait; turned back, it goes back
                // through the whole gate. A rate token taken for a pass the breaker then
                // turns back is not refunded (a held token would let sends bunch up when
                // the breaker closes, the moment the API is most fragile).
                let permit = match client.limiter.try_acquire() {
                    Some(permit) if self.rate_token_now(now) => permit,
                    held => match Box::pin(self.wait_to_send(held, request, now, &mut probe)).await
                    {
                        Ok(Some((permit, waited, held, after))) => {
                            request = waited;
                            now = after;
                            self.token = held;
                            permit
                        }
                        Ok(None) => continue,
                        Err(error) => {
                            drop(probe);
                            return Err(self.refuse(error));
                        }
                    },
                };
                if !self.redialing {
                    self.attempt = self.attempt.saturating_add(1);
                }
                self.send = self.send.saturating_add(1);
                let (send, attempt) = (self.send, self.attempt);
                // `Started` carries the gate's reading (or the one after a permit or rate
                // wait); the send's own clock starts after the
                // callback, so a slow observer counts neither into `ms` nor into the limit.
                // The guard first: if the observer panics on `Started`, its drop reports
                // `Cancelled` as the panic unwinds.
                let mut guard = InFlight {
                    client,
                    call: self.tag(),
                    send,
                    attempt,
                    permit: Some(permit),
                    probe,
                    started: now,
                };
                self.last_at = now;
                self.emit_at(now, || EventKind::Started { send, attempt });
                let started = self.now();
                // A permit or token wait, the request closure or the `Started` callback
                // used up the rest of the budget: a send with no time left could still
                // reach the server before its timer fires, so nothing goes out.
                if self.past_budget(started) {
                    guard.disarm();
                    return Err(self.no_time_left(send, attempt, started));
                }
                // The attempt timeout from `started`, or the budget's end if that comes
                // first (without a budget, the far future, which comes first only when
                // the timeout saturates to it too). Never `started`: the deadline lies
                // ahead, and a policy's limit is never zero. Compared as instants, not
                // as durations (each a division and a multiplication per send).
                let send_deadline = started
                    .saturating_add(self.policy().attempt_timeout())
                    .min(self.deadline);
                let head = timeout_at(
                    &client.runtime,
                    send_deadline,
                    client.transport.send(request),
                )
                .await;
                drop(guard.permit.take());
                // `ms` runs from just before the send to the response head.
                let head_at = self.now();
                let ms = millis_between(head_at, started);
                let sent = match head {
                    Ok(Ok(response))
                        if for_caller(response.status())
                            || self.policy().is_answer_status(response.status()) =>
                    {
                        self.reached = true;
                        let Some(limit) = ending.body_limit() else {
                            // ---- record a response for the caller: tell the breaker,
                            // free the probe slot, report Succeeded and any transition.
                            let bytes = response.content_length();
                            let status = response.status();
                            self.succeeded(guard, status, head_at, ms, bytes);
                            self.end_succeeded(head_at, status);
                            return Ok(E::output(response, Bytes::new()));
                        };
                        // ---- or read its body first, inside the send's time limit: a
                        // body that breaks or stalls is a failed send like any other.
                        // Boxed: only calls that read pay for this state.
                        // A body its head declares longer than the limit fails at once,
                        // unread (an answer that has no body is read: its length says
                        // nothing of one).
                        let declared = has_body(response.status(), self.head_request)
                            .then(|| response.content_length())
                            .flatten();
                        let (response, read) = Box::pin(read_whole(
                            &client.runtime,
                            send_deadline,
                            response,
                            limit,
                            declared,
                        ))
                        .await;
                        let after_head = |response: &T::Response| AfterHead {
                            request_id: client.request_id_in(response.headers()).map(Arc::from),
                        };
                        match read {
                            Ok(Ok(body)) => {
                                let done = self.now();
                                let ms = millis_between(done, started);
                                let bytes = u64::try_from(body.len()).ok();
                                let status = response.status();
                                self.succeeded(guard, status, done, ms, bytes);
                                self.end_succeeded(done, status);
                                return Ok(E::output(response, body));
                            }
                            Ok(Err(error)) => Sent::Failed {
                                error: judged_after_head(error),
                                limit: None,
                                cut_by_budget: false,
                                in_body: Some(after_head(&response)),
                            },
                            Err(_elapsed) => {
                                self.cut(send_deadline, started, Some(after_head(&response)))
                            }
                        }
                    }
                    Ok(Ok(response)) => {
                        // Read off by a sync helper, so no borrowed head sits in the
                        // call's state during the body read.
                        let (response, head) = self.error_head(response);
                        // Boxed: only error responses pay for this state.
                        let body = Box::pin(read_error_body(
                            &client.transport,
                            &client.runtime,
                            send_deadline,
                            response,
                        ))
                        .await;
                        Sent::ErrorStatus { head, body }
                    }
                    Ok(Err(error)) => Sent::Failed {
                        error,
                        limit: None,
                        cut_by_budget: false,
                        in_body: None,
                    },
                    Err(_elapsed) => self.cut(send_deadline, started, None),
                };
                // A body read after the head moves the clock; otherwise reuse it. A
                // success body that failed counts into `ms` as it would have succeeded.
                let (ended, ms) = match sent {
                    Sent::Failed { in_body: None, .. } => (head_at, ms),
                    Sent::ErrorStatus { .. } => (self.now(), ms),
                    Sent::Failed {
                        in_body: Some(_), ..
                    } => {
                        let ended = self.now();
                        (ended, millis_between(ended, started))
                    }
                };

                // ---- record, then decide (a sync helper: its error and verdict never
                // sit in the call's state across a wait).
                match self.record_failure(sent, guard, ended, ms, idempotent) {
                    Next::Return(error) => return Err(self.end_failed(error)),
                    Next::Replay => {
                        let stale = self.token.map(|held| held.generation);
                        if let Err(error) = self.auth_token(stale).await {
                            return Err(self.refuse(error));
                        }
                        self.replay = Replay::Refreshed;
                    }
                    Next::Redial => {}
                    Next::Retry { wake } => {
                        client.runtime.sleep_until(wake).await;
                        self.retries = self.retries.saturating_add(1);
                        self.redialing = false;
                    }
                }
            }
        }
    }

    /// Records a response for the caller: tells the breaker, frees the probe slot,
    /// reports `Succeeded` at `at` and any transition.
    #[inline(always)]
    fn succeeded(
        &self,
        mut guard: InFlight<'c, T, R, A>,
        status: http::StatusCode,
        at: Instant,
        ms: u64,
        bytes: Option<u64>,
    ) {
        let effect = answer_breaker_effect(status);
        let (transition, wake) = self.tell_breaker(effect, guard.probe.take(), at);
        let (send, attempt) = (guard.send, guard.attempt);
        guard.finish(
            at,
            || EventKind::Succeeded {
                send,
                attempt,
                status,
                ms,
                bytes,
            },
            transition,
        );
        // Reported: the calls a close woke may go now.
        drop(wake);
    }

    /// A send the client's time limit cut at `send_deadline` (`in_body`: while its
    /// success body was being read): the connection is distrusted.
    fn cut(&self, send_deadline: Instant, started: Instant, in_body: Option<AfterHead>) -> Sent {
        self.client.transport.distrust_connection();
        // The time the send was given, read off its deadline (which the call keeps
        // anyway; keeping `limit` too would grow every call's future): less than the
        // attempt timeout only when it was the rest of the budget. Less than half,
        // and the cut says nothing about the API.
        let given = send_deadline.saturating_duration_since(started);
        let timeout = self.policy().attempt_timeout();
        Sent::Failed {
            error: TransportError::new(TransportErrorKind::TimedOut, "time limit reached"),
            limit: Some(if given < timeout {
                TimeLimit::Budget
            } else {
                TimeLimit::AttemptTimeout
            }),
            cut_by_budget: given < timeout / 2,
            in_body,
        }
    }

    /// The error of a draft the transport could not prepare.
    #[cold]
    fn unprepared(&self, error: &TransportError) -> ClientError {
        ClientError::transport(
            TransportError::new(TransportErrorKind::Config, error.message()),
            self.attempt,
        )
        .with_reached(self.reached)
    }

    /// Decorates a prepared request (auth token, retry count). Returns whether the
    /// call counts as idempotent.
    #[inline(always)]
    fn decorate(&mut self, request: &mut T::Request, token: Option<Token>) -> bool {
        let client = self.client;
        // The header is looked up only when the method and the policy leave it open;
        // `is_idempotent` alone says what a key counts for.
        let idempotent = is_idempotent(request.method(), false, self.policy().is_idempotent())
            || is_idempotent(
                request.method(),
                request
                    .header(&IDEMPOTENCY_KEY)
                    .is_some_and(is_idempotency_key),
                false,
            );
        // The retry count first, so a token under the same name replaces it, never
        // the other way round.
        if self.retries > 0
            && let Some(name) = &client.retry_count_header
        {
            request.set_header(name.clone(), HeaderValue::from(self.retries));
        }
        self.token = token.map(|t| {
            let held = Held::of(&t);
            request.set_header(t.name, t.value);
            held
        });
        idempotent
    }

    /// Ends a send that found no time left before it went out (its permit and
    /// probe slot already given back): its `Failed` is `TimedOut` with `sent: false`,
    /// then the call's end.
    #[cold]
    fn no_time_left(&mut self, send: u32, attempt: u32, at: Instant) -> ClientError {
        let before = if self.redialing { attempt } else { attempt - 1 };
        let error = self.after_last_failure(
            ClientError::timed_out(TimeLimit::Budget, before).with_reached(self.reached),
        );
        self.failed_unsent(at, send, attempt, &error);
        self.end_failed(error)
    }

    /// What the call keeps of an error response's head. Hands the response back for
    /// its body.
    fn error_head(&self, mut response: T::Response) -> (T::Response, ErrorHead) {
        let client = self.client;
        let headers = response.headers();
        let wait = server_delay(headers, client.runtime.wall_clock());
        let request_id = client.request_id_in(headers).map(Arc::<str>::from);
        let (status, credentials_dropped, answered_by_redirect) = (
            response.status(),
            response.credentials_dropped(),
            response.answered_by_redirect(),
        );
        // Last: the headers move out of the response (its body is all the loop
        // reads of it from here on).
        let head = ErrorHead {
            status,
            response: ErrorResponseHead::new(response.take_headers()),
            wait,
            request_id,
            credentials_dropped,
            answered_by_redirect,
        };
        (response, head)
    }

    /// Records a failed send: tells the breaker, frees the probe slot, reports the
    /// terminal event and any breaker transition, then decides what comes next (and
    /// reports `Redialing` or `RetryScheduled`).
    fn record_failure(
        &mut self,
        sent: Sent,
        mut guard: InFlight<'c, T, R, A>,
        ended: Instant,
        ms: u64,
        idempotent: bool,
    ) -> Next {
        let client = self.client;
        self.last_at = ended;
        let (send, attempt) = (guard.send, guard.attempt);
        let (outcome, server_wait, error, cut_by_budget) = match sent {
            Sent::ErrorStatus {
                head:
                    ErrorHead {
                        status,
                        response,
                        wait,
                        request_id,
                        credentials_dropped,
                        answered_by_redirect,
                    },
                body,
            } => {
                self.reached = true;
                let error = ClientError::new(ErrorKind::Status(status), self.attempt)
                    .with_response_head(response, body)
                    .with_request_id(request_id)
                    .with_retry_after(wait)
                    .with_credentials_dropped(credentials_dropped)
                    .with_answered_by_redirect(answered_by_redirect)
                    .with_reached(true);
                (Outcome::Status(status), wait, error, false)
            }
            Sent::Failed {
                error: e,
                limit,
                cut_by_budget,
                in_body,
            } => {
                let outcome = Outcome::Transport(e.kind());
                // As the rules judge it: a `NotSent` past the free redials may have
                // reached the server.
                self.reached |= outcome.judged(self.redials).may_have_reached();
                let error = if e.kind() == TransportErrorKind::TimedOut {
                    ClientError::timed_out(limit.unwrap_or(TimeLimit::Transport), self.attempt)
                        .with_source(Arc::new(e))
                } else {
                    ClientError::transport(e, self.attempt)
                };
                // A failure in a success body's read has a response of its own, the
                // last the call got: its request id, never an older one's.
                let error = match in_body {
                    Some(AfterHead { request_id }) => error.with_request_id(request_id),
                    None => self.with_last_request_id(error),
                };
                (
                    outcome,
                    None,
                    error.with_reached(self.reached),
                    cut_by_budget,
                )
            }
        };
        let verdict = classify(
            outcome,
            &CallFacts {
                idempotent,
                // A 401 to a hop that went without the credentials (a redirect crossed
                // origins) is not about the client's token: no refresh helps.
                can_replay_401: client.auth.is_configured()
                    && self.replay == Replay::NotYet
                    && !error.credentials_dropped(),
                redials_used: self.redials,
                has_server_delay: server_wait.is_some(),
                cut_by_budget,
                answered_by_redirect: error.answered_by_redirect(),
            },
        );
        let (transition, wake) = self.tell_breaker(verdict.breaker, guard.probe.take(), ended);
        // A request the transport refused before anything left (`Config`) is one
        // that could not be built: reported as unsent, as a draft `prepare` refuses
        // is, so it stays out of request-rate and latency figures.
        let sent = outcome != Outcome::Transport(TransportErrorKind::Config);
        guard.finish(
            ended,
            || EventKind::Failed {
                send,
                attempt,
                error: error.clone(),
                ms: if sent { ms } else { 0 },
                sent,
            },
            transition,
        );
        // Reported: the calls a close (by a reachable answer) woke may go now.
        drop(wake);
        // A 401 for a token a newer one has replaced already (a renewal,
        // `refresh_token`, another 401's refresh) refuses it from now on, whether
        // this call replays or not (its final 401 starts no refresh), so no other
        // request still built with it goes out.
        if outcome == Outcome::Status(http::StatusCode::UNAUTHORIZED)
            && !error.credentials_dropped()
            && let Some(held) = self.token
        {
            self.client.auth_state.refuse_if_replaced(held.generation);
        }

        let next = match verdict.action {
            Action::Replay => {
                // A newer token than the one the 401 answered; no retry budget
                // spent, no RetryScheduled. The next gate applies it.
                self.replay = Replay::Made;
                self.redialing = false;
                Next::Replay
            }
            Action::Redial => {
                self.redials = self.redials.saturating_add(1);
                self.redialing = true;
                let next = self.send.saturating_add(1);
                // At the failure's reading, the call's last (`last_at`).
                self.emit_at(ended, || EventKind::Redialing {
                    send: next,
                    attempt,
                });
                Next::Redial
            }
            Action::Retry if self.policy().retry().allows_retry(self.retries) => {
                let delay = self.retry_delay(server_wait);
                let wake = ended.saturating_add(delay);
                // The retry cannot start before its wake-up, nor before the bucket's
                // next token, which other callers can only push later. The token is
                // taken after the admission, whose wait moves the deadline on: once an
                // admission of this call has waited, the send's rate wait decides
                // instead (it refuses a wait that would reach the budget's end).
                let starts = match &self.client.bucket {
                    Some(bucket) if !self.admission_waited => wake.max(bucket.next_token_at()),
                    _ => wake,
                };
                if self.past_budget(starts) {
                    return Next::Return(error);
                }
                let next = attempt.saturating_add(1);
                self.emit_at(ended, || EventKind::RetryScheduled {
                    attempt: next,
                    after: delay,
                });
                Next::Retry { wake }
            }
            _ => return Next::Return(error),
        };
        // The call goes on: this error is what a refusal before the next send
        // names as its source.
        self.last_failure = Some(Arc::new(error));
        next
    }

    /// The sleep before the next retry: the server's delay (clamped to the policy's
    /// ceiling) or the policy's back-off, jittered, never under 1 ms.
    fn retry_delay(&self, server_wait: Option<Duration>) -> Duration {
        let retry = self.policy().retry();
        let (base, max) = retry.schedule().unwrap_or((Duration::ZERO, Duration::ZERO));
        let (delay, source) = match server_wait {
            Some(wait) => (wait.min(max), DelaySource::Server),
            None => (backoff(base, max, self.retries), DelaySource::Policy),
        };
        let random = self.client.runtime.random();
        apply_jitter(self.policy().jitter(), delay, source, random).max(crate::backoff::MIN_BACKOFF)
    }
}

/// A success body's read failure as the rules judge it: the answer had begun, so
/// the request reached the server, and a kind that says it never left (`NotSent`,
/// `Connect`, `Tls`, `Config`: no transport should give one after a head) counts as
/// `Interrupted`.
fn judged_after_head(error: TransportError) -> TransportError {
    match error.kind() {
        TransportErrorKind::NotSent
        | TransportErrorKind::Connect
        | TransportErrorKind::Tls
        | TransportErrorKind::Config => {
            TransportError::new(TransportErrorKind::Interrupted, error.message())
        }
        _ => error,
    }
}

/// Reads a success body whole, up to `limit` bytes, giving up at `deadline`; hands
/// the response back with the outcome. A body whose `declared` length (the head's
/// `Content-Length` of an answer that has a body) is over the limit is `TooLarge` at
/// once, nothing read: a slow one would otherwise run into the time limit, and be
/// sent again, before the limit is passed.
async fn read_whole<R: Runtime, Response: TransportResponse>(
    runtime: &R,
    deadline: Instant,
    mut response: Response,
    limit: usize,
    declared: Option<u64>,
) -> (Response, Result<Result<Bytes, TransportError>, Elapsed>) {
    if declared.is_some_and(|length| length > limit as u64) {
        let error = TransportError::new(
            TransportErrorKind::TooLarge,
            "the body's declared length is longer than the limit",
        );
        return (response, Ok(Err(error)));
    }
    let read = timeout_at(runtime, deadline, read_body(&mut response, limit)).await;
    (response, read)
}

/// Whether an answer with `status` to a request that was (or was not) a `HEAD` has a
/// body, so its `Content-Length` gives that body's length: not one to a `HEAD`, a
/// 1xx, a 204 or a 304.
fn has_body(status: http::StatusCode, head_request: bool) -> bool {
    !(head_request
        || status.is_informational()
        || status == http::StatusCode::NO_CONTENT
        || status == http::StatusCode::NOT_MODIFIED)
}

/// Reads up to [`MAX_ERROR_BODY`] bytes of an error response's body, giving up at
/// `deadline`, at the body's end, or at a read error; whatever was read is kept,
/// less a character the cut left unfinished. A read cut by the deadline tells the
/// transport to distrust the connection. Once the limit is reached nothing more is
/// waited for: a next chunk already there is looked at (its first byte tells a
/// character split at the limit from binary, and an end already there lets the
/// connection be reused), one that is not ends the read.
async fn read_error_body<T: Transport, R: Runtime>(
    transport: &T,
    runtime: &R,
    deadline: Instant,
    mut response: T::Response,
) -> Bytes {
    let mut body = BytesMut::new();
    while body.len() < MAX_ERROR_BODY {
        match timeout_at(runtime, deadline, response.chunk()).await {
            // An empty chunk makes no progress: take it as the end rather than spin.
            Ok(Ok(Some(chunk))) if chunk.is_empty() => return body.freeze(),
            Ok(Ok(Some(chunk))) => {
                // One byte past the limit, if the chunk has it, tells truncation
                // there was more (it cuts to the limit).
                let room = MAX_ERROR_BODY + 1 - body.len();
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Ok(Ok(None)) => return body.freeze(),
            // A stall or a read error cut the body short.
            Ok(Err(_)) => return trim_unfinished_char(body.freeze()),
            Err(_elapsed) => {
                transport.distrust_connection();
                return trim_unfinished_char(body.freeze());
            }
        }
    }
    if body.len() > MAX_ERROR_BODY {
        return body.freeze();
    }
    // Exactly the limit: look at what is already there, without waiting.
    let next = pin!(response.chunk()).poll(&mut Context::from_waker(Waker::noop()));
    match next {
        Poll::Ready(Ok(None)) => body.freeze(),
        Poll::Ready(Ok(Some(chunk))) if chunk.is_empty() => body.freeze(),
        Poll::Ready(Ok(Some(chunk))) => {
            body.extend_from_slice(&chunk[..1]);
            body.freeze()
        }
        // More may follow (or the read failed): cut at the limit.
        Poll::Ready(Err(_)) | Poll::Pending => trim_unfinished_char(body.freeze()),
    }
}
