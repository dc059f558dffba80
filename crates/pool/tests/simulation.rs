//! Seeded simulation: thousands of generated fault schedules, policy mixes, numbers of
//! concurrent callers and cancellation points, with the client's promises checked on
//! every run, among them that `HealthObserver` shows what the events say.
//!
//! - CI runs `SIM_SEEDS` seeds (default 2,000).
//! - `SIM_SEEDS=100000 cargo test --release -p vantage-api-pool --test simulation`
//!   runs 100,000; `SIM_SEED_START=100000` starts there instead of at 0, so a long
//!   run can explore seeds no earlier run has.
//! - A failing seed is printed; `SIM_SEED=<seed> cargo test -p vantage-api-pool --test
//!   simulation` replays it alone.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Rng, ms, secs};
use http::{HeaderMap, HeaderName, HeaderValue, header::AUTHORIZATION};
use vantage_api_pool::auth::{AuthError, AuthToken, token_fn};
use vantage_api_pool::bytes::Bytes;
use vantage_api_pool::health::{ApiHealth, BreakerView, HealthObserver};
use vantage_api_pool::{
    BreakerMode, BreakerState, CallEnd, CallId, CallOutcome, CallPolicy, ClientError, ErrorKind,
    EventKind, Instant, Jitter, ResilientClient, RetryMode, RetryPolicy, TimeLimit,
    TokenFetchOutcome, TokenFetchReason, TransportError, TransportErrorKind, TransportEvent,
    TransportObserver,
};
use vantage_api_pool_testkit::{
    RecordedRequest, RecordingObserver, Reply, ScriptedHttp, ScriptedTransport, VirtualRuntime,
};

/// One call's plan and what became of it.
struct CallPlan {
    policy: CallPolicy,
    /// A POST (idempotent only if the policy says so), else a GET.
    post: bool,
    /// `execute_read_with` with this body limit, else `execute_with`.
    read: Option<usize>,
    start: Duration,
    drop_at: Option<Duration>,
}

#[derive(Default)]
struct CallRecord {
    /// The call's id: calls are numbered from 1 as `execute_with` is called.
    call: Option<CallId>,
    started: Option<Instant>,
    ended: Option<Instant>,
    result: Option<Result<(), ClientError>>,
    /// The body a call that read it (`execute_read_with`) returned.
    body: Option<Bytes>,
}

/// The success body the fault schedule sends whole, or breaks off or stalls part-way.
const FULL_BODY: [u8; 3000] = [b'z'; 3000];

/// The bodies of the two replies that ask for a delay, so the checks know what each
/// asked from the generator, not from the client's own parse of its headers.
const WAIT_1_S: &str = "retry-after: 1";
const WAIT_750_MS: &str = "retry-after-ms: 750";

/// The delay the reply behind `error` asked for, read from its body.
fn asked_delay(error: &ClientError) -> Option<Duration> {
    match error.body() {
        Some(body) if body == WAIT_1_S.as_bytes() => Some(Duration::from_secs(1)),
        Some(body) if body == WAIT_750_MS.as_bytes() => Some(ms(750)),
        _ => None,
    }
}

/// The fault schedule: what each send is answered with.
fn fault(rng: &mut Rng, auth_ok: bool) -> Reply {
    if !auth_ok {
        return Reply::status(401).after(rng.ms(50));
    }
    let reply = match rng.below(23) {
        0..=4 => Reply::ok(),
        // A success body: whole, broken off part-way as a reset would, or stalled.
        5 => {
            let body = Reply::ok()
                .body(Bytes::from_static(&FULL_BODY))
                .chunk_size(1024);
            let at = rng.below(FULL_BODY.len() as u64) as usize;
            match rng.below(3) {
                0 => body,
                1 => body.body_fails_after(at, TransportErrorKind::Interrupted, "reset mid-body"),
                _ => body.body_stalls_after(at),
            }
        }
        6 => Reply::status(500),
        7 => Reply::status(502),
        8 => Reply::status(503),
        9 => Reply::status(503).header("retry-after", "1").body(WAIT_1_S),
        10 => Reply::status(408),
        11 => Reply::status(429),
        12 => Reply::status(429)
            .header("retry-after-ms", "750")
            .body(WAIT_750_MS),
        13 => Reply::status(404).body("gone"),
        14 => Reply::status(401),
        15 => Reply::fail(
            [
                TransportErrorKind::NotSent,
                TransportErrorKind::Connect,
                TransportErrorKind::Interrupted,
                TransportErrorKind::TimedOut,
                TransportErrorKind::Tls,
                TransportErrorKind::TooLarge,
                // Refused by the transport before anything left: reported unsent.
                TransportErrorKind::Config,
            ][rng.below(7) as usize],
            "simulated",
        ),
        16 => Reply::fail(TransportErrorKind::NotSent, "stale"),
        17 => Reply::stall(),
        // An error body that stalls part-way: cut by the send's time limit, or
        // dropped mid-body by a caller.
        18 => Reply::status(500)
            .body("x".repeat(4096))
            .body_stalls_after(rng.below(2048) as usize),
        // An error body that breaks part-way, as a connection reset would.
        19 => Reply::status(502)
            .body("y".repeat(4096))
            .chunk_size(512)
            .body_fails_after(
                rng.below(4096) as usize,
                TransportErrorKind::Interrupted,
                "reset mid-body",
            ),
        // The GET a 303 led to, after the server took the request: a quota there
        // says nothing of the request itself.
        20 => Reply::status(429)
            .header("retry-after-ms", "750")
            .body(WAIT_750_MS)
            .answered_by_redirect(),
        _ => Reply::status(503).after(rng.ms(3000)),
    };
    reply.after(rng.ms(200))
}

fn policy(rng: &mut Rng) -> CallPolicy {
    // Labelled by preset (no draw of its own, so the seeds' schedules stay as
    // they were): every event and end of a call carries its label.
    let base = match rng.below(4) {
        0 => CallPolicy::essential().with_label("essential"),
        1 => CallPolicy::background().with_label("background"),
        _ => CallPolicy::bounded(RetryPolicy {
            max_retries: rng.below(5) as u32,
            base: rng.ms(500),
            max: ms(500) + rng.ms(5000),
        })
        .with_label("bounded"),
    };
    let base = if rng.chance(50) {
        base.with_breaker_mode(BreakerMode::WaitForProbe)
    } else {
        base.with_breaker_mode(BreakerMode::FailFast)
    };
    let jitter = [Jitter::None, Jitter::Proportional(0.25), Jitter::Full][rng.below(3) as usize];
    let base = base.with_jitter(jitter).unwrap();
    let timeout = ms(200) + rng.ms(3000);
    let base = match base.budget() {
        Some(_) => base.with_attempt_timeout(timeout).unwrap(),
        None => base
            .with_attempt_timeout(timeout)
            .unwrap()
            .with_budget(if rng.chance(30) {
                Some(timeout + rng.ms(20_000))
            } else {
                None
            })
            .unwrap(),
    };
    let base = base.idempotent(rng.chance(20));
    if rng.chance(15) {
        // The script's 404 ("gone") is then an answer: returned, not an error.
        base.with_answer_statuses([http::StatusCode::NOT_FOUND])
            .unwrap()
    } else {
        base
    }
}

/// Notes, at every `Started`, how many sends the transport has in flight, so that
/// [`LiveChecks::over_the_cap`] can check the real sends against the cap.
struct LiveChecks {
    transport: ScriptedTransport,
    max_parallel: usize,
    at_started: Mutex<Vec<AtStarted>>,
}

/// A send's (call, send), when it was announced, and the sends then in flight.
type AtStarted = ((CallId, u32), Instant, usize);

impl LiveChecks {
    /// Real sends announced while the others left them no place: the send announced
    /// is not in flight yet (the scripted transport counts it on its first poll), so
    /// at most `max_parallel - 1` others may be. Synthetic pairs (a fail-fast
    /// rejection, say) take no permit and are skipped.
    fn over_the_cap(&self, events: &[TransportEvent]) -> Vec<String> {
        let synthetic = synthetic_sends(events);
        self.at_started
            .lock()
            .unwrap()
            .iter()
            .filter(|(key, _, n)| *n >= self.max_parallel && !synthetic.contains(key))
            .map(|(key, at, n)| {
                format!(
                    "{key:?} started at {at:?} with {n} others in flight, cap {}",
                    self.max_parallel
                )
            })
            .collect()
    }
}

impl TransportObserver for LiveChecks {
    fn on_event(&self, _api: &str, event: &TransportEvent) {
        if let (EventKind::Started { send, .. }, Some(call)) = (&event.kind, event.call) {
            self.at_started.lock().unwrap().push((
                (call, *send),
                event.at,
                self.transport.in_flight(),
            ));
        }
    }
}

/// The most attempts a call under `policy` may make, its one 401 replay included;
/// `None` when it retries until cancelled.
fn attempt_limit(policy: &CallPolicy) -> Option<u32> {
    match policy.retry() {
        RetryMode::Bounded(p) => Some(p.max_retries + 2),
        RetryMode::None => Some(2),
        _ => None,
    }
}

/// The (call, send) of every synthetic pair: a `Failed` with `sent: false`, but for
/// a send the transport refused with `Config`, which is unsent too but went through
/// the permit, the rate bucket and the probe slot as a real send does.
fn synthetic_sends(events: &[TransportEvent]) -> HashSet<(CallId, u32)> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Failed {
                send,
                sent: false,
                error,
                ..
            } if error.kind() != ErrorKind::Transport(TransportErrorKind::Config) => {
                Some((e.call.unwrap(), *send))
            }
            _ => None,
        })
        .collect()
}

/// A send the transport refused with `Config` left nothing: its `Failed` is unsent,
/// with no time of its own.
fn check_config_refusals(events: &[TransportEvent], problems: &mut Vec<String>) {
    for e in events {
        if let EventKind::Failed {
            error, sent, ms, ..
        } = &e.kind
            && error.kind() == ErrorKind::Transport(TransportErrorKind::Config)
            && (*sent || *ms != 0)
        {
            problems.push(format!(
                "{:?}: a Config refusal reported sent: {sent}, ms: {ms}",
                e.call
            ));
        }
    }
}

/// At most one probe per epoch: while the breaker is open, no real send starts
/// before its cooldown ends, and after it at most one is in flight at a time. A
/// probe answered with a 5xx opens the breaker again, and while it is closed the
/// `threshold`th 5xx in a row opens it: `BreakerOpened`, of its call, is the next
/// event. (Other failures count toward the threshold too, and only a success breaks
/// the run; counting 5xx alone, from 0 at each success and each close, can only
/// come short of the breaker's own count, never over it.)
fn check_probes(events: &[TransportEvent], threshold: u32, problems: &mut Vec<String>) {
    let synthetic = synthetic_sends(events);
    let mut open: Option<(Instant, Duration)> = None;
    let mut in_flight: HashSet<(CallId, u32)> = HashSet::new();
    // The call whose probe a 5xx answered, or whose 5xx reached the threshold, and when.
    let mut reopen_owed: Option<(CallId, Instant)> = None;
    let mut server_errors_in_a_row = 0;
    for e in events {
        // The transition is reported right after the send's `Failed`, with nothing
        // between on this one thread: it is the next event of all.
        if let Some((call, at)) = reopen_owed.take()
            && (e.call != Some(call) || !matches!(e.kind, EventKind::BreakerOpened { .. }))
        {
            problems.push(format!(
                "{call:?}: a 5xx at {at:?} owed BreakerOpened, then {:?}",
                e.kind
            ));
        }
        let key = e.call.zip(e.kind.send_and_attempt().map(|(s, _)| s));
        let server_error = matches!(&e.kind, EventKind::Failed { sent: true, error, .. }
            if error.status().is_some_and(|s| s.is_server_error()));
        if server_error && open.is_none() {
            server_errors_in_a_row += 1;
        } else if matches!(e.kind, EventKind::Succeeded { .. }) {
            server_errors_in_a_row = 0;
        }
        let probe_failed = server_error && in_flight.contains(&key.unwrap());
        let run_reached = server_error && open.is_none() && server_errors_in_a_row >= threshold;
        if probe_failed || run_reached {
            reopen_owed = e.call.map(|call| (call, e.at));
        }
        match e.kind {
            EventKind::Started { .. } if !synthetic.contains(&key.unwrap()) => {
                if let Some((at, cooldown)) = open {
                    if e.at < at + cooldown {
                        problems.push(format!(
                            "a send at {:?} inside the cooldown until {:?}",
                            e.at,
                            at + cooldown
                        ));
                    }
                    if !in_flight.is_empty() {
                        problems.push(format!("a second probe at {:?}", e.at));
                    }
                    in_flight.extend(key);
                }
            }
            EventKind::Succeeded { .. }
            | EventKind::Failed { .. }
            | EventKind::Cancelled { .. } => {
                in_flight.remove(&key.unwrap());
            }
            EventKind::BreakerOpened { cooldown } => {
                open = Some((e.at, cooldown));
                in_flight.clear();
            }
            EventKind::BreakerClosed => {
                open = None;
                in_flight.clear();
                server_errors_in_a_row = 0;
            }
            _ => {}
        }
    }
    if let Some((call, at)) = reopen_owed {
        problems.push(format!(
            "{call:?}: a 5xx at {at:?} owed BreakerOpened, and the breaker never opened"
        ));
    }
}

/// Every completed fetch, in order.
type Replacements = Arc<Mutex<Vec<Replacement>>>;

/// A completed token fetch: the token it replaced (`None` for the first), when it
/// started and ended, and the token it brought.
struct Replacement {
    previous: Option<String>,
    start: Instant,
    end: Instant,
    token: String,
}

/// The header some seeds' sources put every other token under instead of
/// `Authorization`: a request built with a token under one name cannot take a newer
/// one under the other, and goes back through the gate if its own is refused.
const API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// The token a request carries, under either name.
fn token_in(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(AUTHORIZATION)
        .or_else(|| headers.get(API_KEY))
        .map(|v| v.to_str().unwrap())
}

/// Why each completed token fetch ran, by the generation it brought (1 for the first).
fn fetch_reasons(events: &[TransportEvent]) -> HashMap<u64, TokenFetchReason> {
    events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::TokenFetchEnded {
                reason,
                outcome: TokenFetchOutcome::Fetched { generation, .. },
                ..
            } => Some((*generation, *reason)),
            _ => None,
        })
        .collect()
}

/// No send leaves with a token a 401 rejected while the refresh it started runs, or
/// once a newer token is at hand:
/// - after a refresh a 401 started (`Rejected`) replaced a token, no request carries
///   it from that fetch's start, when the 401 was taken in;
/// - once a 401 for a token already replaced is taken in (its `Failed`), no request
///   carries it.
///
/// Only what happens strictly later counts: a send that left at the very instant the
/// 401 came may have been handed to the transport first.
fn check_rejected_tokens(
    requests: &[RecordedRequest],
    events: &[TransportEvent],
    fetches: &[Replacement],
    reasons: &HashMap<u64, TokenFetchReason>,
    problems: &mut Vec<String>,
) {
    let token_of = |request: &RecordedRequest| token_in(&request.headers).map(str::to_owned);
    let mut refused_from: HashMap<String, (Instant, String)> = HashMap::new();
    // The earliest refusal of each token counts.
    let mut refuse = |token: &String, at: Instant, why: String| {
        if refused_from.get(token).is_none_or(|(from, _)| at < *from) {
            refused_from.insert(token.clone(), (at, why));
        }
    };
    for (i, fetch) in fetches.iter().enumerate() {
        let generation = i as u64 + 1;
        if let (Some(previous), Some(TokenFetchReason::Rejected)) =
            (&fetch.previous, reasons.get(&generation))
        {
            let why = format!(
                "the 401 that started generation {generation}'s fetch at {:?}",
                fetch.start
            );
            refuse(previous, fetch.start, why);
        }
    }
    for event in events {
        let EventKind::Failed { error, .. } = &event.kind else {
            continue;
        };
        if error.status() != Some(http::StatusCode::UNAUTHORIZED) {
            continue;
        }
        let Some(token) = error
            .body()
            .map(|b| String::from_utf8_lossy(b).into_owned())
        else {
            continue;
        };
        if let Some(newer) = fetches
            .iter()
            .find(|fetch| fetch.previous.as_ref() == Some(&token))
            && newer.end < event.at
        {
            let why = format!(
                "a 401 taken in at {:?}, after {} replaced it at {:?}",
                event.at, newer.token, newer.end
            );
            refuse(&token, event.at, why);
        }
    }
    for request in requests {
        if let Some(token) = token_of(request)
            && let Some((from, why)) = refused_from.get(&token)
            && request.at > *from
        {
            problems.push(format!(
                "request {} left at {:?} with {token}, refused since {why}",
                request.index, request.at
            ));
        }
    }
}

/// What `HealthObserver` should show for one API (or one label of it), worked out
/// again from the recorded events and call ends, for a window that holds the whole
/// run: every count, sum and latest value it keeps.
#[derive(Debug, Default, PartialEq)]
struct Figures {
    in_flight: u32,
    sends: u32,
    successes: u32,
    refused: u32,
    latency_sum: u64,
    latency_max: Option<u64>,
    last_status: Option<http::StatusCode>,
    /// The last failure's time and `Debug`, and the last sent one's.
    last_error: Option<(Instant, String)>,
    last_send_error: Option<(Instant, String)>,
    retries: u64,
    redials: u64,
    cancelled: u64,
    calls: u32,
    call_successes: u32,
    call_ms_sum: u64,
    call_ms_max: Option<u64>,
    calls_cancelled: u64,
    tokens_fetched: u64,
    token_fetches_failed: u64,
    token_fetches_abandoned: u64,
    last_token_fetched_at: Option<Instant>,
    last_token_error: Option<(Instant, TokenFetchReason)>,
    breaker: Option<BreakerView>,
    /// The latest event's or end's time (or the client's attachment's).
    updated_at: Instant,
    /// Everything since the origin: the run is younger than the window.
    covered: Duration,
}

impl Figures {
    /// The figures of `events` and `ends` (in the order they were reported; this
    /// run has one thread, so that is time order).
    fn of(events: &[TransportEvent], ends: &[CallEnd]) -> Figures {
        let mut f = Figures::default();
        for event in events {
            f.updated_at = f.updated_at.max(event.at);
            match &event.kind {
                EventKind::Started { .. } => f.in_flight += 1,
                EventKind::Succeeded { status, ms, .. } => {
                    f.in_flight -= 1;
                    f.sends += 1;
                    f.successes += 1;
                    f.latency_sum += ms;
                    f.latency_max = f.latency_max.max(Some(*ms));
                    f.last_status = Some(*status);
                    f.breaker = Some(BreakerView::Closed);
                }
                EventKind::Failed {
                    error, ms, sent, ..
                } => {
                    f.in_flight -= 1;
                    let seen = Some((event.at, format!("{error:?}")));
                    if *sent {
                        f.sends += 1;
                        f.latency_sum += ms;
                        f.latency_max = f.latency_max.max(Some(*ms));
                        if let Some(status) = error.status() {
                            f.last_status = Some(status);
                        }
                        f.last_send_error = seen.clone();
                    } else {
                        f.refused += 1;
                    }
                    f.last_error = seen;
                }
                EventKind::Cancelled { .. } => {
                    f.in_flight -= 1;
                    f.cancelled += 1;
                }
                EventKind::Redialing { .. } => f.redials += 1,
                EventKind::RetryScheduled { .. } => f.retries += 1,
                EventKind::BreakerOpened { cooldown } => {
                    f.breaker = Some(BreakerView::Open {
                        since: event.at,
                        cooldown: *cooldown,
                    });
                }
                EventKind::BreakerClosed | EventKind::BreakerReset => {
                    f.breaker = Some(BreakerView::Closed);
                }
                EventKind::TokenFetchEnded {
                    reason, outcome, ..
                } => match outcome {
                    TokenFetchOutcome::Fetched { .. } => {
                        f.tokens_fetched += 1;
                        f.last_token_fetched_at = Some(event.at);
                    }
                    TokenFetchOutcome::Failed { .. } => {
                        f.token_fetches_failed += 1;
                        f.last_token_error = Some((event.at, *reason));
                    }
                    _ => f.token_fetches_abandoned += 1,
                },
                _ => {}
            }
        }
        for end in ends {
            f.updated_at = f.updated_at.max(end.at);
            // Whole milliseconds, cut.
            let ms = u64::try_from(end.elapsed().as_millis()).unwrap();
            match end.outcome {
                CallOutcome::Succeeded { .. } | CallOutcome::Failed { .. } => {
                    f.calls += 1;
                    f.call_ms_sum += ms;
                    f.call_ms_max = f.call_ms_max.max(Some(ms));
                    if matches!(end.outcome, CallOutcome::Succeeded { .. }) {
                        f.call_successes += 1;
                    }
                }
                _ => f.calls_cancelled += 1,
            }
        }
        f
    }

    /// The same figures read off a snapshot; the estimated percentiles are checked
    /// against the exact extremes.
    fn shown(h: &ApiHealth, problems: &mut Vec<String>, whose: &str) -> Figures {
        let mean = |sum: Option<f64>, n: u32| sum.map(|mean| (mean * f64::from(n)).round() as u64);
        for (name, p50, p90, p99, max) in [
            (
                "send",
                h.p50_latency_ms,
                h.p90_latency_ms,
                h.p99_latency_ms,
                h.max_latency_ms,
            ),
            (
                "call",
                h.p50_call_ms,
                h.p90_call_ms,
                h.p99_call_ms,
                h.max_call_ms,
            ),
        ] {
            let ordered = match (p50, p90, p99, max) {
                (Some(p50), Some(p90), Some(p99), Some(max)) => {
                    p50 <= p90 && p90 <= p99 && p99 <= max
                }
                (None, None, None, None) => true,
                _ => false,
            };
            if !ordered {
                problems.push(format!(
                    "{whose}: {name} percentiles {p50:?} {p90:?} {p99:?} out of order or past the slowest {max:?}"
                ));
            }
        }
        let rate = |n: u32, of: u32| (of > 0).then(|| f64::from(n) / f64::from(of));
        if h.success_rate != rate(h.successes_in_window, h.sends_in_window)
            || h.call_success_rate != rate(h.call_successes_in_window, h.calls_in_window)
        {
            problems.push(format!("{whose}: success rates do not match their counts"));
        }
        Figures {
            in_flight: h.in_flight,
            sends: h.sends_in_window,
            successes: h.successes_in_window,
            refused: h.refused_in_window,
            latency_sum: mean(h.mean_latency_ms, h.sends_in_window).unwrap_or(0),
            latency_max: h.max_latency_ms,
            last_status: h.last_status,
            last_error: h
                .last_error
                .as_ref()
                .map(|e| (e.at, format!("{:?}", e.error))),
            last_send_error: h
                .last_send_error
                .as_ref()
                .map(|e| (e.at, format!("{:?}", e.error))),
            retries: h.retries,
            redials: h.redials,
            cancelled: h.cancelled,
            calls: h.calls_in_window,
            call_successes: h.call_successes_in_window,
            call_ms_sum: mean(h.mean_call_ms, h.calls_in_window).unwrap_or(0),
            call_ms_max: h.max_call_ms,
            calls_cancelled: h.calls_cancelled,
            tokens_fetched: h.tokens_fetched,
            token_fetches_failed: h.token_fetches_failed,
            token_fetches_abandoned: h.token_fetches_abandoned,
            last_token_fetched_at: h.last_token_fetched_at,
            last_token_error: h.last_token_error.as_ref().map(|e| (e.at, e.reason)),
            breaker: Some(h.breaker),
            updated_at: h.updated_at,
            covered: h.covered,
        }
    }
}

/// `HealthObserver`'s figures, for the API and per label, are what the recorded
/// events and call ends say.
fn check_health(
    health: &HealthObserver,
    recorder: &RecordingObserver,
    now: Instant,
    problems: &mut Vec<String>,
) {
    let events: Vec<TransportEvent> = recorder.events().into_iter().map(|r| r.event).collect();
    let ends: Vec<CallEnd> = recorder.call_ends().into_iter().map(|r| r.end).collect();
    let compare = |whose: &str,
                   shown: Option<ApiHealth>,
                   mut expected: Figures,
                   problems: &mut Vec<String>| {
        let Some(shown) = shown else {
            problems.push(format!("{whose}: no figures"));
            return;
        };
        // A breaker no event has spoken of yet shows closed.
        expected.breaker.get_or_insert(BreakerView::Closed);
        expected.covered = now.since_origin();
        let shown = Figures::shown(&shown, problems, whose);
        if shown != expected {
            problems.push(format!(
                "{whose}: HealthObserver shows\n{shown:?}\nthe events say\n{expected:?}"
            ));
        }
    };
    let api = Figures::of(&events, &ends);
    // One breaker serves every label: each label's figures show the API's.
    let breaker = api.breaker.unwrap_or(BreakerView::Closed);
    compare("sim", health.snapshot_at("sim", now), api, problems);
    let labels: BTreeMap<&str, ApiHealth> =
        health.label_snapshots_at("sim", now).into_iter().collect();
    let mut expected_labels: Vec<&str> = ends.iter().filter_map(|end| end.label).collect();
    expected_labels.extend(events.iter().filter_map(|event| event.label));
    expected_labels.sort_unstable();
    expected_labels.dedup();
    if labels.keys().copied().collect::<Vec<_>>() != expected_labels {
        problems.push(format!(
            "labels {:?} in HealthObserver, {expected_labels:?} in the events",
            labels.keys().collect::<Vec<_>>()
        ));
    }
    for label in expected_labels {
        let events: Vec<TransportEvent> = events
            .iter()
            .filter(|event| event.label == Some(label))
            .cloned()
            .collect();
        let ends: Vec<CallEnd> = ends
            .iter()
            .filter(|end| end.label == Some(label))
            .cloned()
            .collect();
        let figures = Figures {
            breaker: Some(breaker),
            ..Figures::of(&events, &ends)
        };
        compare(
            &format!("label {label}"),
            labels.get(label).cloned(),
            figures,
            problems,
        );
    }
}

struct Both(RecordingObserver, Arc<LiveChecks>, Arc<HealthObserver>);

impl TransportObserver for Both {
    fn on_attach(&self, api: &str, at: Instant) {
        self.2.on_attach(api, at);
    }

    fn on_event(&self, api: &str, event: &TransportEvent) {
        self.0.on_event(api, event);
        self.1.on_event(api, event);
        self.2.on_event(api, event);
    }

    fn on_call_end(&self, api: &str, end: &CallEnd) {
        self.0.on_call_end(api, end);
        self.2.on_call_end(api, end);
    }
}

/// Runs one seed and checks its promises. `Ok` carries a digest of what happened (every
/// request: when, what, with which token; every event: what, of which call, when), so
/// two runs of one seed can be compared.
fn run_seed(seed: u64) -> Result<u64, String> {
    let mut rng = Rng(seed);
    let rt = VirtualRuntime::new().with_seed(seed);
    let transport = ScriptedTransport::new(&rt);
    let recorder = RecordingObserver::new();
    // A window longer than any run: every send and call counts in it.
    let health = Arc::new(HealthObserver::new(secs(86_400)).per_label());
    let max_parallel = 1 + rng.below(8) as usize;
    let threshold = 1 + rng.below(5) as u32;
    let cooldown = secs(1) + rng.ms(4000);
    let max_cooldown = cooldown * (1 + rng.below(8) as u32);
    let base_cooldown = cooldown;
    let rate = if rng.chance(50) {
        Some((1.0 + rng.below(50) as f64, 1 + rng.below(10) as u32))
    } else {
        None
    };
    let use_auth = rng.chance(40);
    // Half the seeds with auth give their tokens a lifetime, 2 s to 20 s (drawn from a
    // stream of their own, so the other draws stay as they were): renewals ahead of
    // the expiry, and expiries, join the 401s.
    let lifetime = {
        let mut draws = Rng(seed ^ 0x11FE);
        (use_auth && draws.chance(50)).then(|| secs(2) + draws.ms(18_000))
    };
    // Some seeds with auth also call `refresh_token()` now and then, or every 100 ms
    // to 2 s as a timer task would (some of those calls dropped part-way), and some
    // have a source that fails now and then though their tokens have no lifetime:
    // tokens are then replaced while requests built with the old ones wait, and
    // failed fetches follow successful refreshes. (A stream of its own again.)
    let mut refreshes = Rng(seed ^ 0x2EF2);
    let refresh_at: Vec<Duration> = match (use_auth, refreshes.below(4)) {
        (false, _) | (true, 0) => Vec::new(),
        (true, 1) => (0..1 + refreshes.below(4))
            .map(|_| refreshes.ms(20_000))
            .collect(),
        _ => {
            let period = ms(100) + refreshes.ms(1_900);
            let first = refreshes.ms(2_000);
            (0..)
                .map(|k| first + period * k)
                .take_while(|&at| at < secs(20))
                .collect()
        }
    };
    let refresh_at: Vec<(Duration, Option<Duration>)> = refresh_at
        .into_iter()
        .map(|at| (at, refreshes.chance(20).then(|| at + refreshes.ms(1_000))))
        .collect();
    let flaky_source = use_auth && refreshes.chance(30);
    let renames = use_auth && refreshes.chance(30);
    // Each token's fetch start, to tell when it was due for renewal and when it
    // expired; and the requests that went out with a token past its expiry.
    let issued: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    // The renewal margin of each token given one of its own (the others are renewed
    // a minute ahead); either way at most half its lifetime, as the checker caps it.
    let margins: Arc<Mutex<HashMap<String, Duration>>> = Arc::default();
    let sent_expired: Arc<Mutex<Vec<String>>> = Arc::default();

    // The server: faults drawn per send; with auth, the server's valid token changes
    // now and then, so 401s arrive for a token generation.
    let server_token = Arc::new(AtomicU32::new(1));
    let faults = Arc::new(Mutex::new(Rng(seed ^ 0xABCD)));
    let healthy = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let got_401: Arc<Mutex<HashSet<String>>> = Arc::default();
    {
        let (server_token, faults, healthy, got_401) = (
            server_token.clone(),
            faults.clone(),
            healthy.clone(),
            got_401.clone(),
        );
        let (issued, sent_expired, rt) = (issued.clone(), sent_expired.clone(), rt.clone());
        transport.respond_with(move |req, _| {
            if let (Some(lifetime), Some(token)) = (lifetime, token_in(req.headers())) {
                let start = issued.lock().unwrap().get(token).copied();
                if start.is_some_and(|start| rt.now() >= start.saturating_add(lifetime)) {
                    let at = rt.now().since_origin();
                    sent_expired
                        .lock()
                        .unwrap()
                        .push(format!("{token} at {at:?}"));
                }
            }
            if healthy.load(Ordering::SeqCst) {
                return Reply::ok();
            }
            let mut rng = faults.lock().unwrap();
            let auth_ok = !use_auth || {
                let want = format!("Bearer t{}-", server_token.load(Ordering::SeqCst));
                token_in(req.headers()).is_some_and(|token| token.starts_with(&want))
            };
            if use_auth && rng.chance(3) {
                server_token.fetch_add(1, Ordering::SeqCst);
            }
            let mut reply = fault(&mut rng, auth_ok);
            if reply.status_code().is_some_and(|s| s == 401)
                && let Some(token) = token_in(req.headers())
            {
                let token = token.to_owned();
                // The 401 names the token it answered, so the checks can tell from
                // its `Failed` when the client took that answer in.
                reply = reply.body(token.clone());
                got_401.lock().unwrap().insert(token);
            }
            reply
        });
    }
    let live = Arc::new(LiveChecks {
        transport: transport.clone(),
        max_parallel,
        at_started: Mutex::default(),
    });
    let fetches = Arc::new(AtomicUsize::new(0));
    let completed = Arc::new(AtomicUsize::new(0));
    let replaced: Replacements = Arc::default();
    let current: Arc<Mutex<Option<String>>> = Arc::default();
    let mut builder = ResilientClient::builder(transport.clone(), rt.clone())
        .max_parallel(max_parallel)
        .breaker(threshold, cooldown, max_cooldown)
        .observer(
            "sim",
            Arc::new(Both(recorder.clone(), live.clone(), health.clone())),
        );
    if let Some((rate, burst)) = rate {
        builder = builder.rate_limit_with_burst(rate, burst);
    }
    let source = {
        let (fetches, server_token, rt) = (fetches.clone(), server_token.clone(), rt.clone());
        let (completed, replaced, current) = (completed.clone(), replaced.clone(), current.clone());
        let (issued, healthy, margins) = (issued.clone(), healthy.clone(), margins.clone());
        token_fn(move || {
            let fetch = fetches.fetch_add(1, Ordering::SeqCst);
            let previous = current.lock().unwrap().clone();
            let start = rt.now();
            let (issued, healthy, margins) = (issued.clone(), healthy.clone(), margins.clone());
            // The source hands out the server's current token after a short delay.
            let (server_token, rt, completed) =
                (server_token.clone(), rt.clone(), completed.clone());
            let (replaced, current) = (replaced.clone(), current.clone());
            // From 20 ms to 1.5 s, varying by seed and fetch, so callers that need a
            // token pile up behind a fetch, and some are dropped while it runs.
            let mix = (seed ^ (fetch as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
                .wrapping_mul(0xBF58_476D_1CE4_E5B9);
            let latency = ms(20 + (mix >> 33) % 1_480);
            // With lifetimes, or a flaky source, one fetch in six fails until the
            // API recovers: failed renewals (and their back-off), expiries with no
            // new token, and failed refreshes after a 401's join in.
            let fails = (lifetime.is_some() || flaky_source) && (mix >> 20).is_multiple_of(6);
            async move {
                rt.sleep(latency).await;
                if fails && !healthy.load(Ordering::SeqCst) {
                    return Err(AuthError::from("identity provider down"));
                }
                completed.fetch_add(1, Ordering::SeqCst);
                let n = server_token.load(Ordering::SeqCst);
                let token = format!("Bearer t{n}-{fetch}");
                replaced.lock().unwrap().push(Replacement {
                    previous,
                    start,
                    end: rt.now(),
                    token: token.clone(),
                });
                *current.lock().unwrap() = Some(token.clone());
                issued.lock().unwrap().insert(token.clone(), start);
                let value = HeaderValue::from_str(&token).unwrap();
                // Seeds that rename put every other token under `x-api-key`.
                let name = if renames && (mix >> 50) & 1 == 1 {
                    API_KEY
                } else {
                    AUTHORIZATION
                };
                let auth = AuthToken::new(name, value);
                Ok::<_, AuthError>(match lifetime {
                    // One token in three keeps the default margin; the others get
                    // one of their own, from none to the whole lifetime (cut to
                    // half of it).
                    Some(lifetime) => {
                        let auth = auth.expires_in(lifetime);
                        if (mix >> 40).is_multiple_of(3) {
                            auth
                        } else {
                            let ahead = lifetime.mul_f64(((mix >> 44) % 1_000) as f64 / 1_000.0);
                            margins.lock().unwrap().insert(token, ahead);
                            auth.renew_ahead(ahead)
                        }
                    }
                    None => auth,
                })
            }
        })
    };
    let client = if use_auth {
        builder
            .auth(source)
            .build()
            .map(|c| Box::new(c) as Box<dyn SimClient>)
    } else {
        builder.build().map(|c| Box::new(c) as Box<dyn SimClient>)
    }
    .map_err(|e| format!("build: {e}"))?;

    let n_calls = 1 + rng.below(32) as usize;
    // Methods from a stream of their own, so they leave the other draws unchanged.
    let mut methods = Rng(seed ^ 0x9057);
    // And whether a call reads its body (with what limit: some under the whole body),
    // from another.
    let mut reads = Rng(seed ^ 0x4EAD);
    let plans: Vec<CallPlan> = (0..n_calls)
        .map(|_| {
            let policy = policy(&mut rng);
            let post = methods.chance(30);
            let read = reads.chance(40).then(|| 2000 + reads.below(2000) as usize);
            // Half the calls start within 300 ms of each other, so they meet at the
            // gate (a token fetch, the permits, the probe).
            let start = if rng.chance(50) {
                rng.ms(300)
            } else {
                rng.ms(20_000)
            };
            let forever = matches!(policy.retry(), RetryMode::UntilCancelled { .. });
            // A third of the drops come early, while the call is likely still waiting.
            let drop_at = (forever || rng.chance(30)).then(|| {
                start
                    + if rng.chance(30) {
                        rng.ms(1_500)
                    } else {
                        rng.ms(90_000)
                    }
            });
            CallPlan {
                policy,
                post,
                read,
                start,
                drop_at,
            }
        })
        .collect();
    let records: Vec<Arc<Mutex<CallRecord>>> = plans.iter().map(|_| Arc::default()).collect();
    let mut handles = Vec::new();
    let ids = Arc::new(AtomicU64::new(0));
    for (plan, record) in plans.iter().zip(&records) {
        let fut = client.call(plan, record.clone(), ids.clone(), rt.clone());
        handles.push((rt.spawn(fut), plan.drop_at));
    }
    for &(at, drop_at) in &refresh_at {
        handles.push((rt.spawn(client.refresh(at, rt.clone())), drop_at));
    }
    // Drop callers at their planned times, then let the rest finish (`run` returns
    // Ok only once every task has).
    let mut drops: Vec<_> = handles
        .into_iter()
        .filter_map(|(handle, at)| Some((handle, at?)))
        .collect();
    drops.sort_by_key(|&(_, at)| at);
    for (handle, at) in drops {
        rt.run_until(Instant::ORIGIN + at)
            .map_err(|e| e.to_string())?;
        handle.abort();
    }
    rt.run().map_err(|e| format!("drive: {e}"))?;

    let events: Vec<TransportEvent> = recorder.events().into_iter().map(|r| r.event).collect();
    let mut problems = live.over_the_cap(&events);
    check_health(&health, &recorder, rt.now(), &mut problems);
    if live.transport.peak_in_flight() > max_parallel {
        problems.push(format!(
            "{} sends in flight at once, over the cap of {max_parallel}",
            live.transport.peak_in_flight()
        ));
    }
    // Every Started has exactly one terminal event, nothing after it.
    if let Err(v) = recorder.check_contract() {
        if std::env::var("SIM_DEBUG").is_ok() {
            for e in recorder.for_call(v.call.unwrap_or(CallId(0))) {
                eprintln!("{:?} {:?}", e.at, e.kind);
            }
        }
        problems.push(format!("contract: {v}"));
    }
    if client.in_flight() != 0 {
        problems.push(format!(
            "in_flight() == {} after every call ended",
            client.in_flight()
        ));
    }

    // Attempts never exceed the policy's limit; no call outlives its budget.
    let mut by_call: BTreeMap<CallId, Vec<&TransportEvent>> = BTreeMap::new();
    for e in &events {
        if let Some(c) = e.call {
            by_call.entry(c).or_default().push(e);
        }
    }
    for (plan, record) in plans.iter().zip(&records) {
        let record = record.lock().unwrap();
        if let (Some(start), Some(end), Some(budget)) =
            (record.started, record.ended, plan.policy.budget())
            && end - start > budget
        {
            problems.push(format!(
                "a call took {:?}, over its budget {budget:?}",
                end - start
            ));
        }
        if let Some(Err(e)) = &record.result
            && let Some(limit) = attempt_limit(&plan.policy)
            && e.attempts() > limit
        {
            problems.push(format!(
                "{} attempts, over the limit of {limit} (+1 replay included)",
                e.attempts(),
            ));
        }
        // A time limit is named exactly when one ended the call, and a budget only
        // when the call had one; the transport's own timeout (scripted as
        // "simulated") and the client's cut ("time limit reached") are told apart.
        if let Some(Err(e)) = &record.result {
            let cut = std::error::Error::source(e)
                .and_then(|s| s.downcast_ref::<TransportError>())
                .map(TransportError::message);
            let wrong = (e.kind() == ErrorKind::TimedOut) != e.time_limit().is_some()
                || match e.time_limit() {
                    Some(TimeLimit::Budget) => plan.policy.budget().is_none(),
                    Some(TimeLimit::Transport) => cut != Some("simulated"),
                    Some(TimeLimit::AttemptTimeout) => cut != Some("time limit reached"),
                    _ => false,
                };
            if wrong {
                problems.push(format!("{e} names the time limit {:?}", e.time_limit()));
            }
        }
    }
    // Every call that started, whatever its end, by the attempt numbers of its sends.
    // The records number calls as the client does (from 1, as `execute_with` is
    // called); a call's events must lie within its record's start and end, or the
    // pairing of policies and calls below would check the wrong limits.
    let mut plan_of: HashMap<CallId, &CallPlan> = HashMap::new();
    for (plan, record) in plans.iter().zip(&records) {
        let record = record.lock().unwrap();
        let Some(call) = record.call else { continue };
        plan_of.insert(call, plan);
        // Every event of the call, and its end, carry its policy's label.
        let label = plan.policy.label();
        let mislabelled = by_call
            .get(&call)
            .into_iter()
            .flatten()
            .find(|e| e.label != label);
        if let Some(e) = mislabelled {
            problems.push(format!(
                "{call:?}: {} labelled {:?}, not {label:?}",
                e.kind.name(),
                e.label
            ));
        }
        if let Some(end) = recorder.call_end(call).filter(|end| end.label != label) {
            problems.push(format!(
                "{call:?}: its end labelled {:?}, not {label:?}",
                end.label
            ));
        }
        let outside = by_call.get(&call).into_iter().flatten().find(|e| {
            record.started.is_some_and(|s| e.at < s) || record.ended.is_some_and(|end| e.at > end)
        });
        if let Some(e) = outside {
            problems.push(format!(
                "{call:?}: an event at {:?} outside its record's {:?}..{:?}",
                e.at, record.started, record.ended
            ));
        }
        // A send the client cut names the limit that cut it: the budget when what was
        // left of it (from the call's start) was shorter than the attempt timeout,
        // the attempt timeout otherwise (also when both fall on the same instant).
        if let Some(call_start) = record.started {
            let mut sent_at: HashMap<u32, Instant> = HashMap::new();
            for e in by_call.get(&call).into_iter().flatten() {
                match &e.kind {
                    EventKind::Started { send, .. } => {
                        sent_at.insert(*send, e.at);
                    }
                    EventKind::Failed {
                        error,
                        send,
                        sent: true,
                        ..
                    } if matches!(
                        error.time_limit(),
                        Some(TimeLimit::AttemptTimeout | TimeLimit::Budget)
                    ) =>
                    {
                        let Some(&started) = sent_at.get(send) else {
                            continue;
                        };
                        let timeout = plan.policy.attempt_timeout();
                        let budget_first = plan.policy.budget().is_some_and(|budget| {
                            (call_start + budget).saturating_duration_since(started) < timeout
                        });
                        let want = if budget_first {
                            TimeLimit::Budget
                        } else {
                            TimeLimit::AttemptTimeout
                        };
                        if error.time_limit() != Some(want) {
                            problems.push(format!(
                                "{call:?}: send {send} cut at {:?} names {:?}, not {want:?}",
                                e.at,
                                error.time_limit()
                            ));
                        }
                    }
                    _ => {}
                }
            }
        }
        let Some(result) = &record.result else {
            continue;
        };
        let evs = by_call.get(&call).map_or(&[][..], Vec::as_slice);
        // A call that returned (not dropped) ended on a terminal event, and a breaker
        // transition after it at most: nothing it announced is left undone.
        let last = evs.iter().rev().find(|e| {
            !matches!(
                e.kind,
                EventKind::BreakerOpened { .. } | EventKind::BreakerClosed
            )
        });
        if !last.is_some_and(|e| {
            matches!(
                e.kind,
                EventKind::Succeeded { .. } | EventKind::Failed { .. }
            )
        }) {
            problems.push(format!(
                "{call:?} returned, its last event is {:?}",
                last.map(|e| e.kind.name())
            ));
        }
        // The last `Failed` carries the very error the call returned.
        if let Err(e) = result {
            let last_failed = evs.iter().rev().find_map(|ev| match &ev.kind {
                EventKind::Failed { error, .. } => Some(error),
                _ => None,
            });
            match last_failed.map(|last| common::error_difference(last, e)) {
                Some(None) => {}
                Some(Some(difference)) => problems.push(format!(
                    "{call:?}: its last Failed differs from its error: {difference}"
                )),
                None => problems.push(format!("{call:?}: returned {e} with no Failed")),
            }
        }
        // Its end says what it returned (a drop or a panic says `Cancelled`; neither
        // returns).
        match (recorder.call_end(call).map(|end| end.outcome), result) {
            (Some(CallOutcome::Succeeded { .. }), Ok(())) => {}
            (Some(CallOutcome::Failed { error }), Err(e)) => {
                if let Some(difference) = common::error_difference(&error, e) {
                    problems.push(format!("{call:?}: its end's error differs: {difference}"));
                }
            }
            (end, _) => problems.push(format!(
                "{call:?} returned {:?}, its end is {:?}",
                result.as_ref().map_err(|e| e.kind_name()),
                end.map(|outcome| outcome.name())
            )),
        }
        // A call that had an answer from the server never says nothing was sent.
        let answered = evs.iter().any(|e| match &e.kind {
            EventKind::Succeeded { .. } => true,
            EventKind::Failed { error, .. } => error.status().is_some(),
            _ => false,
        });
        if let Err(e) = result
            && answered
            && e.nothing_sent()
        {
            problems.push(format!(
                "{call:?}: {e} after an answer says nothing was sent"
            ));
        }
        // A call that read its body returned one whole, never the part of one that
        // broke off or stalled, within its limit; its `Succeeded` counts it.
        if let (Some(limit), Ok(())) = (plan.read, result) {
            let body = record.body.as_deref().unwrap_or_default();
            let whole = body.is_empty() || body == b"gone" || body == FULL_BODY;
            if !whole || body.len() > limit {
                problems.push(format!(
                    "{call:?}: read a body of {} bytes (limit {limit}), not a whole one",
                    body.len()
                ));
            }
            let counted = evs.iter().rev().find_map(|e| match e.kind {
                EventKind::Succeeded { bytes, .. } => Some(bytes),
                _ => None,
            });
            if counted != Some(u64::try_from(body.len()).ok()) {
                problems.push(format!(
                    "{call:?}: read {} bytes, its Succeeded counts {counted:?}",
                    body.len()
                ));
            }
        }
    }
    for (call, evs) in &by_call {
        let Some(plan) = plan_of.get(call) else {
            problems.push(format!("{call:?}: events of a call no plan made"));
            continue;
        };
        let limit = attempt_limit(&plan.policy);
        let attempts = evs
            .iter()
            .filter_map(|e| match e.kind {
                EventKind::Started { attempt, .. } => Some(attempt),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        if let Some(limit) = limit
            && attempts > limit
        {
            problems.push(format!(
                "{call:?}: {attempts} attempts, over its limit of {limit} (+1 replay included)"
            ));
        }
    }
    for (call, evs) in &by_call {
        let ceiling = plan_of
            .get(call)
            .and_then(|p| p.policy.retry().ceiling())
            .unwrap_or(Duration::MAX);
        let mut last_failed: Option<(&TransportEvent, Option<Duration>)> = None;
        // When the announced retry is due: its send may not start before.
        let mut retry_due: Option<Instant> = None;
        for e in evs {
            match &e.kind {
                EventKind::Started { .. } => {
                    if let Some(due) = retry_due.take()
                        && e.at < due
                    {
                        problems.push(format!(
                            "{call:?}: a retry started at {:?}, before it was due at {due:?}",
                            e.at
                        ));
                    }
                }
                EventKind::Failed {
                    error, sent: true, ..
                } => {
                    let asked = asked_delay(error);
                    if asked.is_some() && error.retry_after() != asked {
                        problems.push(format!(
                            "{call:?}: the server asked for {asked:?}, the error says {:?}",
                            error.retry_after()
                        ));
                    }
                    last_failed = Some((e, asked));
                }
                EventKind::RetryScheduled { after, .. } => {
                    retry_due = Some(e.at + *after);
                    // No retry leaves before the server's delay, clamped to the policy's
                    // ceiling.
                    if let Some((_, Some(wait))) = last_failed
                        && *after < wait.min(ceiling)
                    {
                        problems.push(format!(
                            "{call:?}: retry after {after:?} before the server's {wait:?}"
                        ));
                    }
                }
                _ => {}
            }
        }
    }

    // A POST not marked idempotent is never sent again once a send of it may have
    // been processed: a 408, a 5xx other than a 503 with a server delay, any status
    // that answered the GET a redirect led to, a cut or interrupted exchange.
    for (call, evs) in &by_call {
        let Some(plan) = plan_of.get(call) else {
            continue;
        };
        if !plan.post || plan.policy.is_idempotent() {
            continue;
        }
        let mut maybe_processed = None;
        for e in evs {
            match &e.kind {
                EventKind::Started { send, .. } => {
                    if let Some(after) = &maybe_processed {
                        problems.push(format!(
                            "{call:?}: a POST sent again (send {send}) after {after}"
                        ));
                    }
                }
                EventKind::Failed {
                    error, sent: true, ..
                } => {
                    let maybe = match error.kind() {
                        ErrorKind::Status(s) => {
                            s == 408
                                || error.answered_by_redirect()
                                || (s.is_server_error()
                                    && !(s == 503 && error.retry_after().is_some()))
                        }
                        ErrorKind::Transport(TransportErrorKind::Interrupted)
                        | ErrorKind::TimedOut => true,
                        _ => false,
                    };
                    if maybe {
                        maybe_processed = Some(error.to_string());
                    }
                }
                _ => {}
            }
        }
    }

    check_probes(&events, threshold, &mut problems);
    check_config_refusals(&events, &mut problems);

    // A failure only doubles the cooldown when it is the probe's: every re-opening is
    // caused by a send that started after the previous cooldown ended.
    let mut prev_open: Option<(Instant, Duration)> = None;
    let mut started_at: HashMap<(CallId, u32), Instant> = HashMap::new();
    let mut last_send_of: HashMap<CallId, u32> = HashMap::new();
    for e in &events {
        match e.kind {
            EventKind::Started { send, .. } => {
                started_at.insert((e.call.unwrap(), send), e.at);
            }
            EventKind::Failed { send, .. } | EventKind::Succeeded { send, .. } => {
                last_send_of.insert(e.call.unwrap(), send);
            }
            EventKind::BreakerOpened { cooldown } => {
                if let Some((at, prev)) = prev_open {
                    let call = e.call.unwrap();
                    let cause = started_at[&(call, last_send_of[&call])];
                    if cause < at + prev {
                        problems.push(format!(
                            "re-opened by a send from {cause:?}, before the probe time {:?}",
                            at + prev
                        ));
                    }
                    if cooldown != (prev * 2).min(max_cooldown) {
                        problems.push(format!("cooldown {cooldown:?} after {prev:?}"));
                    }
                } else if cooldown != base_cooldown {
                    // The first opening, and the first after a close, start afresh.
                    problems.push(format!(
                        "opened for {cooldown:?}, not the base {base_cooldown:?}"
                    ));
                }
                prev_open = Some((e.at, cooldown));
            }
            EventKind::BreakerClosed => prev_open = None,
            _ => {}
        }
    }

    // Sends started in any window of length T are at most burst + rate × T, also
    // while every permit is busy (a send takes its token after its permit).
    if let Some((rate, burst)) = rate {
        let times: Vec<Duration> = transport
            .requests()
            .iter()
            .map(|r| r.at.since_origin())
            .collect();
        for i in 0..times.len() {
            for j in i..times.len() {
                let window = (times[j] - times[i]).as_secs_f64();
                let n = (j - i + 1) as f64;
                if n > f64::from(burst) + rate * window + 1e-6 {
                    problems.push(format!("{n} sends in {window} s at {rate}/s burst {burst}"));
                }
            }
        }
    }

    // Token fetches: one first fetch, then at most one per generation that drew a 401.
    if use_auth {
        // The client counts every fetch it started, abandoned ones included.
        let started = fetches.load(Ordering::SeqCst);
        if client.token_fetches() as usize != started {
            problems.push(format!(
                "token_fetches() says {} but the source was called {started} times",
                client.token_fetches()
            ));
        }
        // Completed fetches: one abandoned by a dropped caller makes no generation.
        // (With lifetimes, renewals add fetches: the per-token check below holds;
        // `refresh_token()` adds its own.)
        let reasons = fetch_reasons(&events);
        let requested = reasons
            .values()
            .filter(|&&reason| reason == TokenFetchReason::Requested)
            .count();
        let fetched = completed.load(Ordering::SeqCst);
        let generations = got_401.lock().unwrap().len();
        if lifetime.is_none() && fetched > 1 + generations + requested {
            problems.push(format!(
                "{fetched} token fetches for {generations} generations that drew a 401 \
                 and {requested} refresh_token()"
            ));
        }
        // Per generation: each completed fetch replaced a token that drew a 401, or
        // was due for renewal when the fetch started (or was the first, or was asked
        // for by `refresh_token()`), and no token was replaced twice.
        let replaced = replaced.lock().unwrap();
        let got_401 = got_401.lock().unwrap();
        let issued = issued.lock().unwrap();
        let margins = margins.lock().unwrap();
        let due = |token: &str, at: Instant| {
            lifetime.is_some_and(|lifetime| {
                let margin = margins
                    .get(token)
                    .copied()
                    .unwrap_or(secs(60))
                    .min(lifetime / 2);
                let renew_after = lifetime.saturating_sub(margin);
                issued
                    .get(token)
                    .is_some_and(|&start| at >= start.saturating_add(renew_after))
            })
        };
        let mut seen = HashSet::new();
        for (
            generation,
            Replacement {
                previous, start, ..
            },
        ) in (1..).zip(replaced.iter())
        {
            if !seen.insert(previous.clone()) {
                problems.push(format!("{previous:?} was replaced twice"));
            }
            if let Some(token) = previous
                && reasons.get(&generation) != Some(&TokenFetchReason::Requested)
                && !got_401.contains(token)
                && !due(token, *start)
            {
                problems.push(format!(
                    "{token} was replaced without drawing a 401 or being due"
                ));
            }
        }
        check_rejected_tokens(
            &transport.requests(),
            &events,
            &replaced,
            &reasons,
            &mut problems,
        );
        // No request left with a token past its expiry.
        for sent in sent_expired.lock().unwrap().iter() {
            problems.push(format!("sent with an expired token: {sent}"));
        }
    }

    // Liveness: once the API recovers, one cooldown and one success close the breaker.
    healthy.store(true, Ordering::SeqCst);
    rt.run_for(max_cooldown).map_err(|e| e.to_string())?;
    let probe: Arc<Mutex<CallRecord>> = Arc::default();
    let plan = CallPlan {
        policy: CallPolicy::essential().with_breaker_mode(BreakerMode::WaitForProbe),
        post: false,
        read: None,
        start: Duration::ZERO,
        drop_at: None,
    };
    rt.block_on(client.call(&plan, probe.clone(), ids.clone(), rt.clone()))
        .map_err(|e| e.to_string())?;
    if !matches!(probe.lock().unwrap().result, Some(Ok(()))) {
        problems.push("the call after recovery did not succeed".into());
    }
    if client.breaker_state() != BreakerState::Closed {
        problems.push(format!(
            "breaker {:?} after recovery",
            client.breaker_state()
        ));
    }
    if client.in_flight() != 0 {
        problems.push("in flight after recovery".into());
    }
    check_health(&health, &recorder, rt.now(), &mut problems);
    if problems.is_empty() {
        Ok(digest(&transport, &recorder))
    } else {
        Err(problems.join("\n"))
    }
}

/// A digest of every request and every event a run saw.
fn digest(transport: &ScriptedTransport, recorder: &RecordingObserver) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    // `DefaultHasher::new()` has fixed keys: the same input, the same digest.
    let mut hasher = DefaultHasher::new();
    for request in transport.requests() {
        (request.at, request.method.as_str(), &*request.path).hash(&mut hasher);
        token_in(&request.headers).hash(&mut hasher);
    }
    for recorded in recorder.events() {
        let event = &recorded.event;
        (event.at, event.call, event.kind.name()).hash(&mut hasher);
    }
    hasher.finish()
}

/// The simulation runs clients with and without a token source through one interface.
trait SimClient {
    fn call(
        &self,
        plan: &CallPlan,
        record: Arc<Mutex<CallRecord>>,
        ids: Arc<AtomicU64>,
        rt: VirtualRuntime,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;
    /// `refresh_token()` at `at`, as a timer task of the service would.
    fn refresh(
        &self,
        at: Duration,
        rt: VirtualRuntime,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;
    fn in_flight(&self) -> usize;
    fn token_fetches(&self) -> u64;
    fn breaker_state(&self) -> BreakerState;
}

impl<A: vantage_api_pool::TokenSource + 'static> SimClient
    for ResilientClient<ScriptedTransport, VirtualRuntime, A>
{
    fn call(
        &self,
        plan: &CallPlan,
        record: Arc<Mutex<CallRecord>>,
        ids: Arc<AtomicU64>,
        rt: VirtualRuntime,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>> {
        let client = self.clone();
        let (policy, post, read, start) = (plan.policy.clone(), plan.post, plan.read, plan.start);
        Box::pin(async move {
            rt.sleep(start).await;
            {
                let mut r = record.lock().unwrap();
                r.started = Some(rt.now());
                r.call = Some(CallId(ids.fetch_add(1, Ordering::SeqCst) + 1));
            }
            let build = |h: &ScriptedHttp| if post { h.post("/sim") } else { h.get("/sim") };
            let result = match read {
                None => client.execute_with(&policy, build).await.map(|_| None),
                Some(limit) => client
                    .execute_read_with(&policy, limit, build)
                    .await
                    .map(|read| Some(read.into_body())),
            };
            let (result, body) = match result {
                Ok(body) => (Ok(()), body),
                Err(error) => (Err(error), None),
            };
            let mut r = record.lock().unwrap();
            r.ended = Some(rt.now());
            r.result = Some(result);
            r.body = body;
        })
    }
    fn refresh(
        &self,
        at: Duration,
        rt: VirtualRuntime,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>> {
        let client = self.clone();
        Box::pin(async move {
            rt.sleep(at).await;
            // A failed refresh leaves the token in use as it was; the checks read
            // what became of it from the events.
            let _ = client.refresh_token().await;
        })
    }
    fn in_flight(&self) -> usize {
        ResilientClient::in_flight(self)
    }
    fn breaker_state(&self) -> BreakerState {
        ResilientClient::breaker_state(self)
    }
    fn token_fetches(&self) -> u64 {
        ResilientClient::token_fetches(self)
    }
}

#[test]
fn seeded_fault_schedules_keep_every_promise() {
    let seeds: Vec<u64> = match std::env::var("SIM_SEED") {
        Ok(one) => vec![one.parse().expect("SIM_SEED is a number")],
        Err(_) => {
            let number = |name: &str, default: u64| {
                std::env::var(name).map_or(default, |value| {
                    value
                        .parse()
                        .unwrap_or_else(|_| panic!("{name} is a number, not {value:?}"))
                })
            };
            let (start, n) = (number("SIM_SEED_START", 0), number("SIM_SEEDS", 2000));
            (start..start.saturating_add(n)).collect()
        }
    };
    let mut failed = Vec::new();
    for &seed in &seeds {
        if let Err(problems) = run_seed(seed) {
            eprintln!(
                "seed {seed} failed (replay: SIM_SEED={seed} cargo test -p vantage-api-pool --test simulation):\n{problems}\n"
            );
            failed.push(seed);
            if failed.len() >= 5 {
                break;
            }
        }
    }
    assert!(failed.is_empty(), "failing seeds: {failed:?}");
    println!("{} seeds passed", seeds.len());
}

/// A seed replays exactly, which `SIM_SEED=<seed>` relies on: run twice in one
/// process, it makes the same requests at the same times with the same tokens, and
/// reports the same events. Nothing the client does may depend on a random hash
/// order or on the real clock: a waiter list kept in a `HashMap` (woken in its
/// random order) made several of these seeds run differently.
#[test]
fn a_seed_replays_exactly() {
    for seed in 0..64 {
        let first = run_seed(seed).unwrap_or_else(|problems| panic!("seed {seed}: {problems}"));
        assert_eq!(
            run_seed(seed).ok(),
            Some(first),
            "seed {seed} ran differently the second time"
        );
    }
}
