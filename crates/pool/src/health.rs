//! `HealthObserver`: per-API health figures for a dashboard, kept from the observer
//! events alone.
//!
//! Register one `HealthObserver` (behind an `Arc`) with every client whose API it
//! should watch; it keys its figures by the API name each client was built with. A
//! dashboard reads [`HealthObserver::snapshot`] whenever it redraws. Time comes from
//! the events' `at`, so the figures work the same on virtual time.
//!
//! Several clients may report under one API name (their figures add up), but only
//! on one clock: build them over clones of one runtime. A runtime made apart may
//! have its own origin (each `TokioRuntime::new()` counts from when it was made), so
//! its client's events are shifted by the gap between the origins: a client whose
//! clock lags the others' by more than the window shows in none of the window's
//! figures and loses every "latest wins" comparison (the all-time counts still add
//! up).
//!
//! Events of different calls can reach an observer out of order (two tasks on a
//! multi-thread runtime report at nearly the same moment), so the figures go by each
//! event's `at`, not by when it arrived: a send counts in the slice of the window
//! its end's `at` falls in (see [`HealthObserver::new`]), and the breaker view, the
//! last status and the last errors are those of the latest `at` (on a tie, the one
//! heard last). A send's `at` is read just before the breaker hears of it, so two sends
//! told apart by less than that gap, on two threads, can still show their breaker
//! changes in the wrong order until the next answer (a `Succeeded` shows the breaker
//! closed: an answer closes it) or breaker change;
//! [`ResilientClient::breaker_state`] is exact.
//!
//! [`ResilientClient::breaker_state`]: crate::ResilientClient::breaker_state

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::StatusCode;

use crate::auth::SharedAuthError;
use crate::error::ClientError;
use crate::observer::{
    CallEnd, CallOutcome, EventKind, TokenFetchOutcome, TokenFetchReason, TransportEvent,
    TransportObserver,
};
use crate::time::{Instant, millis};

/// The breaker as the events describe it.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerView {
    /// No `BreakerOpened` since the last `BreakerClosed`, `BreakerReset` or
    /// `Succeeded` (or ever).
    Closed,
    /// Opened at `since` for `cooldown`; a probe may go from `since + cooldown`.
    Open {
        /// When it (re)opened.
        since: Instant,
        /// How long it stays open.
        cooldown: Duration,
    },
}

/// A failure reported for an API, and when.
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct LastError {
    /// When it was reported.
    pub at: Instant,
    /// The error (its `Display` never holds a URL, body or header value).
    pub error: ClientError,
}

/// A token fetch that failed ([`EventKind::TokenFetchEnded`]), and when.
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct LastTokenError {
    /// When the fetch ended.
    pub at: Instant,
    /// Why it ran.
    pub reason: TokenFetchReason,
    /// The token source's error, or the client's refusal of what it gave.
    pub error: SharedAuthError,
}

/// One API's figures at the time of the snapshot.
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct ApiHealth {
    /// The breaker, from `BreakerOpened` / `BreakerClosed` (and closed by any later
    /// `Succeeded`: an answer for the caller means the breaker let a send through).
    pub breaker: BreakerView,
    /// Sends started and not yet ended (from their `Started` to their terminal
    /// event, an error body's read included, and a success body's for a call that
    /// reads it). Not the client's
    /// [`ResilientClient::in_flight`](crate::ResilientClient::in_flight), which
    /// counts permits: those are held from before the rate wait to the response
    /// head.
    pub in_flight: u32,
    /// Sends that got an answer or failed in the window's slices (synthetic failures
    /// excluded): they cover [`covered`](ApiHealth::covered), a little less than the
    /// window.
    /// A `NotSent` failure (a pooled connection the server had closed; the call
    /// redials it for free) is a sent `Failed` in the event contract, so it counts
    /// here as a failed send, and its few milliseconds in the latency. So does a
    /// body over an [`execute_read`](crate::ResilientClient::execute_read) limit
    /// (`TooLarge`), which the breaker is not told of.
    pub sends_in_window: u32,
    /// Of those, the ones that succeeded.
    pub successes_in_window: u32,
    /// Sends that never went out, in the window: each `Failed { sent: false }`. A send
    /// refused at the gate or before it left (breaker open, auth, a budget that ended
    /// there or in its permit or rate wait), in a call refused outright or
    /// in one that had sent before (a retry), a budget used up by the request closure,
    /// or a request that could not be built (by `prepare`, or refused by the
    /// transport with `Config` at its send).
    pub refused_in_window: u32,
    /// `successes / sends` over the window; `None` with no sends in it.
    pub success_rate: Option<f64>,
    /// Mean send latency (`ms` of `Succeeded` and real `Failed`) over the window.
    pub mean_latency_ms: Option<f64>,
    /// The slowest send in the window.
    pub max_latency_ms: Option<u64>,
    /// The median send latency over the window, estimated (see
    /// [`p99_latency_ms`](ApiHealth::p99_latency_ms)); `None` with no sends in it.
    pub p50_latency_ms: Option<u64>,
    /// The latency 90 % of the window's sends took at most, estimated.
    pub p90_latency_ms: Option<u64>,
    /// The latency 99 % of the window's sends took at most, estimated from a
    /// histogram of two buckets per doubling (0, 1, 2, 3, 4, 6, 8, 12, 16, 24 ms
    /// and on, to 35 minutes): the nearest-rank send's place in its bucket, spread
    /// evenly over the bucket and kept within the window's fastest and slowest
    /// send. So it is off by less than its bucket's width (under half the value)
    /// where the nearest-rank send took under 35 minutes (sends past that share one
    /// bucket, which reaches to the slowest send: a rough figure), and exact when
    /// every send in the window took the same time.
    pub p99_latency_ms: Option<u64>,
    /// The status of the last answered send.
    pub last_status: Option<StatusCode>,
    /// The last failure reported, real or synthetic: after an outage whose calls
    /// the breaker refused, the refusal (`breaker_open`), not the API's own error
    /// ([`last_send_error`](ApiHealth::last_send_error) keeps that).
    pub last_error: Option<LastError>,
    /// The last failure of a send that went out (`Failed { sent: true }`): the API's
    /// own error or the transport's, which refusals after it do not hide.
    pub last_send_error: Option<LastError>,
    /// Retries scheduled, all time (one whose call was dropped in its back-off, and
    /// so never sent, counts too).
    pub retries: u64,
    /// Redials, all time.
    pub redials: u64,
    /// Sends that ended `Cancelled`, all time: their calls were dropped, or a panic
    /// unwound through them (an observer's, say: see
    /// [`CallOutcome::Panicked`]).
    pub cancelled: u64,
    /// Calls that ended in the window ([`TransportObserver::on_call_end`]) with a
    /// response or an error, whatever their sends did: what callers saw. A call
    /// the breaker refused counts as a failed call; a call its caller dropped
    /// does not count here ([`calls_cancelled`](ApiHealth::calls_cancelled)).
    pub calls_in_window: u32,
    /// Of those, the ones that returned a response.
    pub call_successes_in_window: u32,
    /// `call_successes / calls` over the window; `None` with no call in it. Next to
    /// [`success_rate`](ApiHealth::success_rate) (per send), it shows what retries
    /// hid from the callers.
    pub call_success_rate: Option<f64>,
    /// The mean time those calls kept their callers waiting, from the call's first
    /// reading at the gate to its end: every wait, send, retry and back-off. Each
    /// call counts in whole milliseconds (cut, not rounded), as a send's `ms` does.
    pub mean_call_ms: Option<f64>,
    /// The longest of those calls, in milliseconds.
    pub max_call_ms: Option<u64>,
    /// The median time of those calls, estimated as
    /// [`p99_latency_ms`](ApiHealth::p99_latency_ms) is for sends (the same
    /// histogram, kept for calls); `None` with no call in the window.
    pub p50_call_ms: Option<u64>,
    /// The time 90 % of those calls took at most, estimated.
    pub p90_call_ms: Option<u64>,
    /// The time 99 % of those calls took at most, estimated: what an SLO on the
    /// callers' wait reads.
    pub p99_call_ms: Option<u64>,
    /// Calls that did not return, all time: dropped by their callers (a call
    /// dropped mid-send also counts its send in [`cancelled`](ApiHealth::cancelled)),
    /// or unwound by a panic ([`CallOutcome::Cancelled`],
    /// [`CallOutcome::Panicked`]). Their time counts in no
    /// figure: a caller that gives up on slow calls (a `tokio::time::timeout`
    /// around them) keeps its slowest calls out of `mean_call_ms` and
    /// `max_call_ms`, so watch this count beside them.
    pub calls_cancelled: u64,
    /// Token fetches that brought a token, all time
    /// ([`EventKind::TokenFetchEnded`]). With the two counts below, the fetches
    /// that ended; [`ResilientClient::token_fetches`](crate::ResilientClient::token_fetches)
    /// counts those that started (the same once none runs, for an API name only
    /// one client reports under). All three stay 0 for an API without a token
    /// source, and in a label's figures ([`HealthObserver::per_label`]): a fetch
    /// belongs to no call.
    pub tokens_fetched: u64,
    /// Token fetches that failed, all time. A failed renewal leaves calls sending
    /// the old token, so no call fails for it (but a 401's replay that waited for
    /// it, needing a newer token): this count and
    /// [`last_token_error`](ApiHealth::last_token_error) are where it shows.
    pub token_fetches_failed: u64,
    /// Token fetches that ended with no result, all time: given up by their
    /// callers, or unwound by a panic. A token source slower than the calls'
    /// budgets shows here (its calls end `TimedOut`, not `Auth`); one that hangs
    /// under policies without a budget does not (its fetch never ends: compare
    /// the three counts with `token_fetches()`).
    pub token_fetches_abandoned: u64,
    /// When the latest fetch that brought a token ended.
    pub last_token_fetched_at: Option<Instant>,
    /// The latest token fetch that failed. It stays once a later one brings a
    /// token: it is current while its `at` is after
    /// [`last_token_fetched_at`](ApiHealth::last_token_fetched_at).
    pub last_token_error: Option<LastTokenError>,
    /// The time of the latest event seen for this API, or, before any, when the
    /// first client of it was built.
    pub updated_at: Instant,
    /// The time the `*_in_window` figures cover: from the start of the window's
    /// oldest slice to the window's end (see [`HealthObserver::new`]). At least the
    /// window less one slice and at most the window (up to 59 ns more for a window
    /// cut unevenly; less while the runtime is younger than the window; zero for a
    /// zero window): divide by it, not by the window, for a rate per second that
    /// does not read low.
    pub covered: Duration,
}

/// The most slices a window is cut into.
const SLICES: usize = 60;
/// The fewest slices a window is cut into when a number of slices from this to
/// [`SLICES`] divides it into whole nanoseconds.
const FEWEST_EVEN_SLICES: u128 = 30;

/// Latency buckets: `[0, 1)` and `[1, 2)` ms, then two a doubling, `[2^k, 1.5 ×
/// 2^k)` and `[1.5 × 2^k, 2^(k+1))` for k from 1 to 20, then one for 2^21 ms (about
/// 35 minutes) and more.
const BUCKETS: usize = 43;

/// The bucket of a latency of `ms`.
fn bucket(ms: u64) -> usize {
    match ms {
        0 | 1 => ms as usize,
        _ => {
            let k = ms.ilog2(); // at least 1
            if k > 20 {
                return BUCKETS - 1;
            }
            let upper_half = (ms >> (k - 1)) & 1; // the bit below the top one
            2 + 2 * (k as usize - 1) + upper_half as usize
        }
    }
}

/// The latencies bucket `b` holds: from `lo` up to but not including `hi` (`None`
/// for the last bucket, which has no end).
fn bucket_range(b: usize) -> (u64, Option<u64>) {
    match b {
        0 | 1 => (b as u64, Some(b as u64 + 1)),
        _ if b == BUCKETS - 1 => (1 << 21, None),
        _ => {
            let k = (b - 2) / 2 + 1;
            let octave = 1u64 << k;
            let half = octave >> 1;
            if (b - 2).is_multiple_of(2) {
                (octave, Some(octave + half))
            } else {
                (octave + half, Some(octave << 1))
            }
        }
    }
}

/// The times, in milliseconds, of a set of sends or calls: how many, their sum,
/// the fastest and the slowest, and how many fell in each bucket.
#[derive(Debug, Clone, Copy)]
struct Latencies {
    count: u64,
    total_ms: u128,
    max_ms: Option<u64>,
    min_ms: Option<u64>,
    /// As wide as `count`, so the two always agree.
    buckets: [u64; BUCKETS],
}

impl Default for Latencies {
    fn default() -> Self {
        Latencies {
            count: 0,
            total_ms: 0,
            max_ms: None,
            min_ms: None,
            buckets: [0; BUCKETS],
        }
    }
}

impl Latencies {
    fn add(&mut self, ms: u64) {
        self.count += 1;
        self.total_ms += u128::from(ms);
        self.max_ms = self.max_ms.max(Some(ms));
        self.min_ms = Some(self.min_ms.map_or(ms, |min| min.min(ms)));
        self.buckets[bucket(ms)] += 1;
    }

    fn merge(&mut self, other: &Latencies) {
        self.count += other.count;
        self.total_ms += other.total_ms;
        self.max_ms = self.max_ms.max(other.max_ms);
        self.min_ms = self.min_ms.into_iter().chain(other.min_ms).min();
        for (total, &n) in self.buckets.iter_mut().zip(&other.buckets) {
            *total += n;
        }
    }

    fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.total_ms as f64 / self.count as f64)
    }

    /// The time at quantile `q`: the nearest-rank one's place in its bucket,
    /// spread evenly over the bucket, within the fastest and the slowest; `None`
    /// with none.
    fn quantile(&self, q: f64) -> Option<u64> {
        // None counted, no fastest or slowest.
        let (min, max) = (self.min_ms?, self.max_ms?);
        // 1-based nearest rank; `q` is one of this module's constants, in (0, 1].
        // The buckets hold `count` between them.
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut below = 0u64;
        for (b, &n) in self.buckets.iter().enumerate() {
            if n == 0 || below + n < rank {
                below += n;
                continue;
            }
            // The last bucket has no end: it ends at the slowest.
            let (lo, hi) = bucket_range(b);
            let hi = hi.unwrap_or(max.max(lo).saturating_add(1));
            // The i-th of the bucket's n (0-based) at the middle of the i-th of n
            // equal parts of the bucket.
            let i = u128::from(rank - below - 1);
            let width = u128::from(hi - lo);
            let offset = (width * (2 * i + 1)) / (2 * u128::from(n));
            let estimate = lo.saturating_add(u64::try_from(offset).unwrap_or(u64::MAX));
            return Some(estimate.clamp(min, max));
        }
        None
    }
}

/// The figures of the sends and calls whose `at` falls in one slice of time.
#[derive(Debug, Clone, Copy, Default)]
struct Slice {
    /// Which slice of time this is (`at / width`), `None` while the slot is unused.
    index: Option<u64>,
    /// Sends that got an answer or failed (synthetic failures excluded), by `ms`.
    sends: Latencies,
    /// Of those, the ones that succeeded.
    successes: u64,
    /// `Failed { sent: false }`.
    refused: u64,
    /// Calls that ended with a response or an error, by the time they took.
    calls: Latencies,
    /// Of those, the ones that returned a response.
    call_successes: u64,
}

/// How a window is cut: slices of `width` nanoseconds, `span` of them (at most
/// [`SLICES`]) to a window.
#[derive(Debug, Clone, Copy)]
struct Slicing {
    width: u128,
    span: u64,
}

impl Slicing {
    /// `None` for a zero window, which holds no send.
    fn new(window: Duration) -> Option<Self> {
        let nanos = window.as_nanos();
        if nanos == 0 {
            return None;
        }
        // The most slices, from 30 to 60, that cut the window evenly (60 for a
        // minute, 50 for ten seconds or one), so a slice's sends leave exactly one
        // window after the slice began; otherwise slices of a sixtieth rounded up to
        // whole nanoseconds (at least 1 ns, so fewer than 60 of them for a window of
        // a few microseconds or less).
        let even = (FEWEST_EVEN_SLICES..=SLICES as u128)
            .rev()
            .find(|&slices| nanos.is_multiple_of(slices));
        let width = nanos.div_ceil(even.unwrap_or(SLICES as u128));
        // `nanos / width` is at most SLICES, so the cast keeps every bit.
        let span = nanos.div_ceil(width) as u64;
        Some(Slicing { width, span })
    }

    /// The slice that holds `at`.
    fn index(self, at: Instant) -> u64 {
        // A slice wider than u64 nanoseconds holds every instant there is.
        u64::try_from(self.width).map_or(0, |width| at.as_nanos() / width)
    }

    /// Whether slice `index` is in the window whose end lies in slice `end`: that
    /// slice and the `span - 1` before it.
    fn holds(self, index: u64, end: u64) -> bool {
        end.checked_sub(index).is_some_and(|back| back < self.span)
    }

    /// The time from the start of the oldest slice of the window that ends at `end`
    /// to `end`.
    fn covered(self, end: Instant) -> Duration {
        let oldest = self.index(end).saturating_sub(self.span - 1);
        // The start of a slice at or before `end`, so within u64 nanoseconds.
        let start = u64::try_from(u128::from(oldest) * self.width).unwrap_or(0);
        Duration::from_nanos(end.as_nanos() - start)
    }
}

#[derive(Debug)]
struct ApiState {
    breaker: BreakerView,
    /// The `at` of the breaker event behind `breaker`.
    breaker_at: Instant,
    /// `Started` heard minus terminal events heard: signed, so a terminal event
    /// heard before its `Started` (events relayed out of order) evens out.
    in_flight: i64,
    /// Ends still to come of sends that were in flight when the API was forgotten
    /// (their `Started` went with the old figures): each is taken off this, not
    /// off `in_flight`. Never below zero.
    orphans: i64,
    /// A ring: slice `i` lives in slot `i % SLICES`, so the newest `SLICES` slices
    /// seen are kept, whatever the rate.
    slices: Box<[Slice; SLICES]>,
    /// The status and the `at` of the event that carried it.
    last_status: Option<(StatusCode, Instant)>,
    last_error: Option<LastError>,
    last_send_error: Option<LastError>,
    retries: u64,
    redials: u64,
    cancelled: u64,
    calls_cancelled: u64,
    tokens_fetched: u64,
    token_fetches_failed: u64,
    token_fetches_abandoned: u64,
    last_token_fetched_at: Option<Instant>,
    last_token_error: Option<LastTokenError>,
    updated_at: Instant,
}

impl ApiState {
    fn new(at: Instant) -> Self {
        ApiState {
            breaker: BreakerView::Closed,
            breaker_at: Instant::ORIGIN,
            in_flight: 0,
            orphans: 0,
            slices: Box::new([Slice::default(); SLICES]),
            last_status: None,
            last_error: None,
            last_send_error: None,
            retries: 0,
            redials: 0,
            cancelled: 0,
            calls_cancelled: 0,
            tokens_fetched: 0,
            token_fetches_failed: 0,
            token_fetches_abandoned: 0,
            last_token_fetched_at: None,
            last_token_error: None,
            updated_at: at,
        }
    }

    /// A state for an API (or label) listed anew, given what its forget left
    /// `owed`: the ends of that many sends still in flight, or, below zero, that
    /// many ends heard before their `Started`, whose starts are still to come.
    fn listed(at: Instant, owed: Option<i64>) -> Self {
        let owed = owed.unwrap_or(0);
        ApiState {
            orphans: owed.max(0),
            in_flight: owed.min(0),
            ..ApiState::new(at)
        }
    }

    /// A terminal event: an orphan's end while any are owed, else a send of these
    /// figures leaving.
    fn send_ended(&mut self) {
        if self.orphans > 0 {
            self.orphans -= 1;
        } else {
            self.in_flight -= 1;
        }
    }

    /// What a forget of these figures leaves owed, if anything: the ends still to
    /// come (of the sends in flight and the orphans still owed), or, below zero, the
    /// starts still to come of ends heard first. (While orphans are owed no end is
    /// taken off `in_flight`, so the two never offset each other.)
    fn ends_owed(&self) -> Option<i64> {
        let owed = self.in_flight + self.orphans;
        (owed != 0).then_some(owed)
    }

    /// Takes `status` as the last one unless a later one is already known.
    fn saw_status(&mut self, status: StatusCode, at: Instant) {
        if self.last_status.is_none_or(|(_, seen)| seen <= at) {
            self.last_status = Some((status, at));
        }
    }

    /// Takes a breaker event's view unless a later breaker event was already heard.
    fn saw_breaker(&mut self, view: BreakerView, at: Instant) {
        if self.breaker_at <= at {
            self.breaker = view;
            self.breaker_at = at;
        }
    }

    /// The slice that counts an event at `at`, emptied first if its slot still holds
    /// an older slice. `None` for a zero window, or when a newer slice holds the slot:
    /// then `at`'s slice has left every window a read can ask for (a read's window
    /// ends at the latest event or later, and slots are `SLICES` slices apart).
    fn slice_at(&mut self, slicing: Option<Slicing>, at: Instant) -> Option<&mut Slice> {
        let index = slicing?.index(at);
        let slot = &mut self.slices[(index % SLICES as u64) as usize];
        match slot.index {
            Some(held) if held > index => return None,
            Some(held) if held == index => {}
            _ => {
                *slot = Slice {
                    index: Some(index),
                    ..Slice::default()
                };
            }
        }
        Some(slot)
    }

    /// Counts a send that got an answer (`ok`) or failed.
    fn saw_send(&mut self, slicing: Option<Slicing>, at: Instant, ok: bool, ms: u64) {
        if let Some(slice) = self.slice_at(slicing, at) {
            slice.sends.add(ms);
            slice.successes += u64::from(ok);
        }
    }

    /// Counts a call that ended with a response (`ok`) or an error, after `ms`.
    fn saw_call(&mut self, slicing: Option<Slicing>, at: Instant, ok: bool, ms: u64) {
        if let Some(slice) = self.slice_at(slicing, at) {
            slice.calls.add(ms);
            slice.call_successes += u64::from(ok);
        }
    }

    /// Counts a send that never went out.
    fn saw_refusal(&mut self, slicing: Option<Slicing>, at: Instant) {
        if let Some(slice) = self.slice_at(slicing, at) {
            slice.refused += 1;
        }
    }
}

/// Keeps per-API health figures from the events of any number of clients.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use vantage_api_pool::{CallPolicy, ResilientClient};
/// use vantage_api_pool::health::HealthObserver;
/// use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
///
/// let rt = VirtualRuntime::new();
/// let transport = ScriptedTransport::new(&rt);
/// transport.push_many([Reply::status(503), Reply::ok().after(Duration::from_millis(40))]);
/// let health = Arc::new(HealthObserver::new(Duration::from_secs(60)));
/// let client = ResilientClient::builder(transport, rt.clone())
///     .observer("orders-api", health.clone())
///     .build()?;
/// rt.block_on(client.execute(|http| http.get("/orders")))??;
///
/// let orders = health.snapshot("orders-api").unwrap();
/// assert_eq!((orders.sends_in_window, orders.successes_in_window), (2, 1));
/// assert_eq!(orders.success_rate, Some(0.5));
/// // One call, which succeeded on its retry: what the caller saw.
/// assert_eq!((orders.calls_in_window, orders.call_success_rate), (1, Some(1.0)));
/// assert_eq!(orders.last_status.map(|s| s.as_u16()), Some(200));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct HealthObserver {
    slicing: Option<Slicing>,
    apis: Mutex<HashMap<Arc<str>, ApiState>>,
    /// With [`per_label`](HealthObserver::per_label): the figures of each API's
    /// labelled calls, per label.
    labels: Option<Mutex<Labels>>,
    /// The ends still to come of sends in flight at a [`forget`](Self::forget),
    /// until the API (or label) is listed anew. Locked last, inside `apis` or
    /// `labels`.
    orphans: Mutex<Orphans>,
}

/// Per API forgotten with sends in flight (and per label of it), how many ends of
/// those sends are still to come; below zero, how many starts of ends heard before
/// them.
#[derive(Debug, Default)]
struct Orphans {
    apis: HashMap<Arc<str>, i64>,
    labels: HashMap<(Arc<str>, &'static str), i64>,
}

/// Per API, per label, the figures of the calls with that label.
type Labels = HashMap<Arc<str>, HashMap<&'static str, ApiState>>;

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl HealthObserver {
    /// Figures over a sliding `window` of event time (success rate, latency, sends
    /// and refusals), ending at the API's latest event (or at the time a
    /// `snapshot_at` names).
    ///
    /// The window is counted in slices (resilience4j's and Hystrix's rolling windows
    /// work the same way): a send counts in the slice its end falls in (the `at` of
    /// its `Succeeded` or `Failed`: a send in flight is not counted yet, and a
    /// refusal counts at its synthetic `Failed`), and a window
    /// holds the slice its end falls in and the ones before it that make up its
    /// length. A window is cut into the most slices, from 30 to 60, that divide it
    /// into whole nanoseconds (60 for a minute, 50 for ten seconds), so a send counts
    /// from its `at` for at most the window and more than the window less one slice,
    /// and leaves with its slice (a one-minute window drops a second's sends at a
    /// time). A window that no such number divides is cut into slices of a sixtieth
    /// rounded up to whole nanoseconds (fewer than 60 of them for a window of a few
    /// microseconds or less), and holds a send up to 59 ns longer. The figures
    /// therefore cover a little less than the window ([`ApiHealth::covered`] says
    /// how much).
    ///
    /// Memory is fixed per API (60 slices, about 50 KB with their latency
    /// histograms of sends and calls) whatever the rate, and kept for every API
    /// name ever attached or seen until [`forget`](HealthObserver::forget) drops
    /// it: name APIs, not users, and forget the names of clients dropped for good
    /// (or give such clients an observer each). An
    /// event or a snapshot, which both hold the lock every client's events take,
    /// costs the same at ten sends a second or a hundred thousand.
    /// `Duration::MAX` counts every send for ever. A zero window holds no send: its
    /// rates and latencies read `None`.
    #[must_use]
    pub fn new(window: Duration) -> Self {
        HealthObserver {
            slicing: Slicing::new(window),
            apis: Mutex::new(HashMap::new()),
            labels: None,
            orphans: Mutex::new(Orphans::default()),
        }
    }

    /// Keeps figures per label too: for each API, the events and ends of its calls
    /// whose policy has a label ([`CallPolicy::with_label`]) also count apart, per
    /// label, read with [`label_snapshots`](HealthObserver::label_snapshots). Each
    /// (API, label) pair seen takes as much memory as an API (about 50 KB: one
    /// label used by three APIs, about 150 KB), so keep labels to endpoints or
    /// operations, not ids. A labelled event then takes a second lock, after the
    /// API's is released. Off by default.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use vantage_api_pool::{CallPolicy, ResilientClient};
    /// use vantage_api_pool::health::HealthObserver;
    /// use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
    ///
    /// let rt = VirtualRuntime::new();
    /// let transport = ScriptedTransport::new(&rt);
    /// transport.push_many([Reply::status(503), Reply::ok(), Reply::ok()]);
    /// let health = Arc::new(HealthObserver::new(Duration::from_secs(60)).per_label());
    /// let client = ResilientClient::builder(transport, rt.clone())
    ///     .observer("orders-api", health.clone())
    ///     .build()?;
    /// let list = CallPolicy::default().with_label("orders.list");
    /// let get = CallPolicy::default().with_label("orders.get");
    /// rt.block_on(client.execute_with(&list, |http| http.get("/orders")))??;
    /// rt.block_on(client.execute_with(&get, |http| http.get("/orders/7")))??;
    ///
    /// let labels = health.label_snapshots("orders-api");
    /// let (names, rates): (Vec<_>, Vec<_>) =
    ///     labels.iter().map(|(label, h)| (*label, h.success_rate)).unzip();
    /// assert_eq!(names, ["orders.get", "orders.list"]);
    /// // The list's first send failed; its call did not.
    /// assert_eq!(rates, [Some(1.0), Some(0.5)]);
    /// assert_eq!(labels[1].1.call_success_rate, Some(1.0));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// [`CallPolicy::with_label`]: crate::CallPolicy::with_label
    #[must_use]
    pub fn per_label(mut self) -> Self {
        self.labels = Some(Mutex::new(HashMap::new()));
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, ApiState>> {
        lock(&self.apis)
    }

    /// The figures of each label of `api`'s calls, sorted by label, each with the
    /// window ending at its latest event; empty unless the observer keeps figures
    /// [`per_label`](HealthObserver::per_label), or before a labelled call of
    /// `api`. Each holds what the calls with that label did: their sends, their
    /// ends, their last error, their retries, its
    /// [`updated_at`](ApiHealth::updated_at) the label's latest event; its
    /// [`breaker`](ApiHealth::breaker) is the API's (one breaker serves every
    /// label).
    #[must_use]
    pub fn label_snapshots(&self, api: &str) -> Vec<(&'static str, ApiHealth)> {
        self.collect_labels(api, None)
    }

    /// [`label_snapshots`](HealthObserver::label_snapshots) with each window ending
    /// at `now` (see [`snapshot_at`](HealthObserver::snapshot_at)).
    #[must_use]
    pub fn label_snapshots_at(&self, api: &str, now: Instant) -> Vec<(&'static str, ApiHealth)> {
        self.collect_labels(api, Some(now))
    }

    fn collect_labels(&self, api: &str, now: Option<Instant>) -> Vec<(&'static str, ApiHealth)> {
        let Some(labels) = &self.labels else {
            return Vec::new();
        };
        // The API's breaker, read first: the two locks are never held together.
        let breaker = self.lock().get(api).map(|state| state.breaker);
        let labels = lock(labels);
        let Some(of_api) = labels.get(api) else {
            return Vec::new();
        };
        let mut all = self.sorted(of_api.iter().map(|(&label, state)| (label, state)), now);
        if let Some(breaker) = breaker {
            for (_, health) in &mut all {
                health.breaker = breaker;
            }
        }
        all
    }

    /// The figures of `api`, or `None` if no client of it was built with this
    /// observer and no event of it was seen (a client lists its API when it is
    /// built: see [`TransportObserver::on_attach`]).
    #[must_use]
    pub fn snapshot(&self, api: &str) -> Option<ApiHealth> {
        let apis = self.lock();
        let state = apis.get(api)?;
        Some(figures(state, self.window_end(state, None), self.slicing))
    }

    /// The figures of `api` with the window ending at `now` (the clock of the
    /// runtime of the client that reports `api`), so figures age out while an API is
    /// quiet, for example while its breaker is open and nothing is sent. `None` as
    /// for [`snapshot`](HealthObserver::snapshot).
    ///
    /// A `now` before the API's latest event reads as that event's time (as
    /// [`snapshot`](HealthObserver::snapshot) does): slices are kept for the window
    /// before the latest event only, and a clock read just before another thread's
    /// report must not hide it. A read changes nothing: a later read still sees every
    /// send of its own window.
    #[must_use]
    pub fn snapshot_at(&self, api: &str, now: Instant) -> Option<ApiHealth> {
        let apis = self.lock();
        let state = apis.get(api)?;
        Some(figures(
            state,
            self.window_end(state, Some(now)),
            self.slicing,
        ))
    }

    /// The figures of every API listed (a client of it built with this observer, or
    /// an event of it seen), sorted by name, each with the window ending at its
    /// latest event.
    #[must_use]
    pub fn snapshots(&self) -> Vec<(Arc<str>, ApiHealth)> {
        self.collect(None)
    }

    /// The figures of every API listed, sorted by name, with the window ending at `now`
    /// (see [`snapshot_at`](HealthObserver::snapshot_at)). One `now` for all: use it
    /// when the clients share one runtime clock (two `TokioRuntime`s made apart have
    /// different origins); otherwise ask [`snapshot_at`](HealthObserver::snapshot_at)
    /// per API with its client's clock.
    #[must_use]
    pub fn snapshots_at(&self, now: Instant) -> Vec<(Arc<str>, ApiHealth)> {
        self.collect(Some(now))
    }

    /// Forgets `api`: its figures, and its labels' with
    /// [`per_label`](HealthObserver::per_label). Returns whether it was listed.
    ///
    /// For observers that outlive some of their APIs (a client per tenant, dropped
    /// when the tenant leaves): forget an API once its clients are dropped. An event
    /// of `api` heard after this lists it anew, from nothing. A send in flight at the
    /// forget ends without its `Started`: the observer keeps how many sends were in
    /// flight (per label too) until the API is listed anew, and that many ends are
    /// then taken off what is owed, not off the sends in flight, so once they have
    /// come the in-flight figure is exact again (until then, a send started after
    /// the forget that ends first stands in for one of them). So are the starts
    /// still owed of ends heard before them (events relayed out of order). What the
    /// forgotten figures hold (the last errors, whose sources may be a token
    /// source's own errors) is dropped once the locks are released.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use vantage_api_pool::ResilientClient;
    /// use vantage_api_pool::health::HealthObserver;
    /// use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
    ///
    /// let rt = VirtualRuntime::new();
    /// let health = Arc::new(HealthObserver::new(Duration::from_secs(60)));
    /// let tenant = ResilientClient::builder(ScriptedTransport::new(&rt), rt.clone())
    ///     .observer("tenant-42", health.clone())
    ///     .build()?;
    /// assert!(health.snapshot("tenant-42").is_some());
    /// drop(tenant);
    /// assert!(health.forget("tenant-42"));
    /// assert!(health.snapshot("tenant-42").is_none());
    /// assert!(!health.forget("tenant-42"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn forget(&self, api: &str) -> bool {
        let state = {
            let mut apis = self.lock();
            let state = apis.remove(api);
            if let Some(owed) = state.as_ref().and_then(ApiState::ends_owed) {
                lock(&self.orphans).apis.insert(Arc::from(api), owed);
            }
            state
        };
        let labels = self.labels.as_ref().and_then(|labels| {
            let mut labels = lock(labels);
            let of_api = labels.remove(api)?;
            let mut orphans = lock(&self.orphans);
            for (label, state) in &of_api {
                if let Some(owed) = state.ends_owed() {
                    orphans.labels.insert((Arc::from(api), *label), owed);
                }
            }
            Some(of_api)
        });
        let listed = state.is_some() || labels.is_some();
        drop((state, labels));
        listed
    }

    /// The state of `api`, listed (anew) at `at`, with what a forget of it left owed.
    /// Called under the `apis` lock.
    fn listed_anew(&self, api: &Arc<str>, at: Instant) -> ApiState {
        ApiState::listed(at, lock(&self.orphans).apis.remove(api))
    }

    /// Where the window of `state` ends: at `now`, or at the API's latest event when
    /// `now` is earlier or not given.
    fn window_end(&self, state: &ApiState, now: Option<Instant>) -> Instant {
        now.map_or(state.updated_at, |n| n.max(state.updated_at))
    }

    fn collect(&self, now: Option<Instant>) -> Vec<(Arc<str>, ApiHealth)> {
        let apis = self.lock();
        self.sorted(
            apis.iter().map(|(name, state)| (Arc::clone(name), state)),
            now,
        )
    }

    /// The figures of each of `states`, each window ending at `now` or its latest
    /// event, sorted by key.
    fn sorted<'s, K: Ord>(
        &self,
        states: impl Iterator<Item = (K, &'s ApiState)>,
        now: Option<Instant>,
    ) -> Vec<(K, ApiHealth)> {
        let mut all: Vec<_> = states
            .map(|(key, state)| {
                (
                    key,
                    figures(state, self.window_end(state, now), self.slicing),
                )
            })
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }
}

/// Makes `error` at `at` the one `last` holds, unless it holds a later one (on a tie,
/// the one heard last wins); gives back the one it replaced.
fn keep_if_latest(
    last: &mut Option<LastError>,
    at: Instant,
    error: &ClientError,
) -> Option<LastError> {
    keep_unless_later(
        last,
        at,
        |last| last.at,
        || LastError {
            at,
            error: error.clone(),
        },
    )
}

/// Puts what `make` builds (from an event at `at`) in `last`, unless what `last`
/// holds came later (its time read by `at_of`): events relayed out of order keep
/// the latest. Gives back what it replaced, for the caller to drop once its lock
/// is released.
fn keep_unless_later<T>(
    last: &mut Option<T>,
    at: Instant,
    at_of: impl Fn(&T) -> Instant,
    make: impl FnOnce() -> T,
) -> Option<T> {
    if last.as_ref().is_none_or(|last| at_of(last) <= at) {
        return last.replace(make());
    }
    None
}

/// What an update replaced. The errors in it may hold the user's types (a token
/// source's error, as an `Auth` error's source or a failed fetch's), whose `Drop`
/// may read this observer or panic: they are dropped once the lock is released.
#[derive(Default)]
struct Replaced {
    error: Option<LastError>,
    send_error: Option<LastError>,
    token_error: Option<LastTokenError>,
}

/// The figures of `state` over the window that ends at `end`.
fn figures(state: &ApiState, end: Instant, slicing: Option<Slicing>) -> ApiHealth {
    let mut sum = Slice::default();
    if let Some(slicing) = slicing {
        let last = slicing.index(end);
        let held = state
            .slices
            .iter()
            .filter(|slice| slice.index.is_some_and(|index| slicing.holds(index, last)));
        for slice in held {
            sum.sends.merge(&slice.sends);
            sum.successes += slice.successes;
            sum.refused += slice.refused;
            sum.calls.merge(&slice.calls);
            sum.call_successes += slice.call_successes;
        }
    }
    let saturating = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    let rate = |ok: u64, of: &Latencies| (of.count > 0).then(|| ok as f64 / of.count as f64);
    let (sends, calls) = (&sum.sends, &sum.calls);
    ApiHealth {
        breaker: state.breaker,
        in_flight: u32::try_from(state.in_flight.max(0)).unwrap_or(u32::MAX),
        sends_in_window: saturating(sends.count),
        successes_in_window: saturating(sum.successes),
        refused_in_window: saturating(sum.refused),
        success_rate: rate(sum.successes, sends),
        mean_latency_ms: sends.mean(),
        max_latency_ms: sends.max_ms,
        p50_latency_ms: sends.quantile(0.5),
        p90_latency_ms: sends.quantile(0.9),
        p99_latency_ms: sends.quantile(0.99),
        last_status: state.last_status.map(|(status, _)| status),
        last_error: state.last_error.clone(),
        last_send_error: state.last_send_error.clone(),
        retries: state.retries,
        redials: state.redials,
        cancelled: state.cancelled,
        calls_in_window: saturating(calls.count),
        call_successes_in_window: saturating(sum.call_successes),
        call_success_rate: rate(sum.call_successes, calls),
        mean_call_ms: calls.mean(),
        max_call_ms: calls.max_ms,
        p50_call_ms: calls.quantile(0.5),
        p90_call_ms: calls.quantile(0.9),
        p99_call_ms: calls.quantile(0.99),
        calls_cancelled: state.calls_cancelled,
        tokens_fetched: state.tokens_fetched,
        token_fetches_failed: state.token_fetches_failed,
        token_fetches_abandoned: state.token_fetches_abandoned,
        last_token_fetched_at: state.last_token_fetched_at,
        last_token_error: state.last_token_error.clone(),
        updated_at: state.updated_at,
        covered: slicing.map_or(Duration::ZERO, |slicing| slicing.covered(end)),
    }
}

impl TransportObserver for HealthObserver {
    /// Lists `api` with no figures yet (closed, nothing sent, updated at `at`), if
    /// it is not listed already.
    fn on_attach(&self, api: &str, at: Instant) {
        let mut apis = self.lock();
        if !apis.contains_key(api) {
            let name = Arc::from(api);
            let state = self.listed_anew(&name, at);
            apis.insert(name, state);
        }
    }

    /// Counts the call in the window of its end, or as cancelled.
    fn on_call_end(&self, api: &str, end: &CallEnd) {
        let ms = millis(end.elapsed());
        self.update(api, end.label, end.at, |state, _| match end.outcome {
            CallOutcome::Succeeded { .. } => state.saw_call(self.slicing, end.at, true, ms),
            CallOutcome::Failed { .. } => state.saw_call(self.slicing, end.at, false, ms),
            CallOutcome::Cancelled | CallOutcome::Panicked => state.calls_cancelled += 1,
        });
    }

    fn on_event(&self, api: &str, event: &TransportEvent) {
        self.update(api, event.label, event.at, |state, replaced| {
            self.count(state, event, replaced);
        });
    }
}

impl HealthObserver {
    /// Runs `update` on the state of `api` (listed now if it was not), then, when
    /// the observer keeps figures per label, on that of `label` of `api`; each
    /// one's latest time first moved on to `at`. What each replaces is dropped
    /// after its lock is released.
    fn update(
        &self,
        api: &str,
        label: Option<&'static str>,
        at: Instant,
        update: impl Fn(&mut ApiState, &mut Replaced),
    ) {
        let touch = |state: &mut ApiState, replaced: &mut Replaced| {
            state.updated_at = state.updated_at.max(at);
            update(state, replaced);
        };
        let mut replaced = Replaced::default();
        {
            let mut apis = self.lock();
            match apis.get_mut(api) {
                Some(state) => touch(state, &mut replaced),
                None => touch(
                    apis.entry(Arc::from(api))
                        .or_insert_with_key(|name| self.listed_anew(name, at)),
                    &mut replaced,
                ),
            }
        }
        drop(replaced);
        if let (Some(labels), Some(label)) = (&self.labels, label) {
            let mut replaced = Replaced::default();
            {
                let mut labels = lock(labels);
                let of_api = match labels.get_mut(api) {
                    Some(of_api) => of_api,
                    None => labels.entry(Arc::from(api)).or_default(),
                };
                let state = of_api.entry(label).or_insert_with(|| {
                    let orphans = lock(&self.orphans).labels.remove(&(Arc::from(api), label));
                    ApiState::listed(at, orphans)
                });
                touch(state, &mut replaced);
            }
            drop(replaced);
        }
    }

    /// Counts `event` into `state`; the errors it replaces go to `replaced`.
    fn count(&self, state: &mut ApiState, event: &TransportEvent, replaced: &mut Replaced) {
        match &event.kind {
            EventKind::Started { .. } => state.in_flight += 1,
            EventKind::Succeeded { status, ms, .. } => {
                state.send_ended();
                state.saw_status(*status, event.at);
                // An answer for the caller closes an open breaker (of any epoch), with
                // or without its own `BreakerClosed`: a close reported before an
                // earlier opening from another thread is not left showing `Open`.
                state.saw_breaker(BreakerView::Closed, event.at);
                state.saw_send(self.slicing, event.at, true, *ms);
            }
            EventKind::Failed {
                error, ms, sent, ..
            } => {
                state.send_ended();
                if *sent {
                    state.saw_send(self.slicing, event.at, false, *ms);
                    if let Some(status) = error.status() {
                        state.saw_status(status, event.at);
                    }
                    replaced.send_error =
                        keep_if_latest(&mut state.last_send_error, event.at, error);
                } else {
                    state.saw_refusal(self.slicing, event.at);
                }
                replaced.error = keep_if_latest(&mut state.last_error, event.at, error);
            }
            EventKind::Cancelled { .. } => {
                state.send_ended();
                state.cancelled += 1;
            }
            EventKind::Redialing { .. } => state.redials += 1,
            EventKind::RetryScheduled { .. } => state.retries += 1,
            EventKind::BreakerOpened { cooldown } => state.saw_breaker(
                BreakerView::Open {
                    since: event.at,
                    cooldown: *cooldown,
                },
                event.at,
            ),
            EventKind::BreakerClosed | EventKind::BreakerReset => {
                state.saw_breaker(BreakerView::Closed, event.at);
            }
            EventKind::TokenFetchEnded {
                reason, outcome, ..
            } => match outcome {
                TokenFetchOutcome::Fetched { .. } => {
                    state.tokens_fetched += 1;
                    let latest = state
                        .last_token_fetched_at
                        .map_or(event.at, |at| at.max(event.at));
                    state.last_token_fetched_at = Some(latest);
                }
                TokenFetchOutcome::Failed { error } => {
                    state.token_fetches_failed += 1;
                    let at = event.at;
                    replaced.token_error = keep_unless_later(
                        &mut state.last_token_error,
                        at,
                        |last| last.at,
                        || LastTokenError {
                            at,
                            reason: *reason,
                            error: error.clone(),
                        },
                    );
                }
                TokenFetchOutcome::Abandoned | TokenFetchOutcome::Panicked => {
                    state.token_fetches_abandoned += 1;
                }
            },
            EventKind::RowsPulled { .. } | EventKind::WritePushed => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::observer::{CallEnd, CallId, CallOutcome};
    use std::sync::atomic::AtomicUsize;

    fn at(ms: u64) -> Instant {
        Instant::from_origin(Duration::from_millis(ms))
    }

    fn ev(ms: u64, kind: EventKind) -> TransportEvent {
        TransportEvent::new(at(ms), Some(CallId(1)), kind)
    }

    #[test]
    fn an_attached_api_is_listed_empty_and_a_second_attachment_changes_nothing() {
        let h = HealthObserver::new(Duration::from_secs(60));
        h.on_attach("a", at(1_000));
        let a = h.snapshot("a").expect("listed once attached");
        assert_eq!(
            (a.sends_in_window, a.refused_in_window, a.in_flight),
            (0, 0, 0)
        );
        assert_eq!((a.success_rate, a.mean_latency_ms), (None, None));
        assert_eq!(a.breaker, BreakerView::Closed);
        assert_eq!(a.updated_at, at(1_000));
        // Its window ends at the attachment until an event comes.
        assert_eq!(a.covered, Duration::from_secs(1));
        h.on_event(
            "a",
            &ev(
                2_000,
                EventKind::Started {
                    send: 1,
                    attempt: 1,
                },
            ),
        );
        h.on_event(
            "a",
            &ev(
                2_040,
                EventKind::Succeeded {
                    send: 1,
                    attempt: 1,
                    status: StatusCode::OK,
                    ms: 40,
                    bytes: None,
                },
            ),
        );
        // Another client of the same API, built later, keeps what was counted.
        h.on_attach("a", at(3_000));
        let a = h.snapshot("a").unwrap();
        assert_eq!((a.sends_in_window, a.updated_at), (1, at(2_040)));
        assert!(h.snapshot("b").is_none());
    }

    /// An error whose `Drop` reads the observer, as a token source's error may: it
    /// counts its drops, and those made while a lock of the observer was held.
    #[derive(Debug)]
    struct ReadsTheObserver {
        observer: std::sync::Weak<HealthObserver>,
        dropped: Arc<std::sync::atomic::AtomicUsize>,
        dropped_under_a_lock: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl std::fmt::Display for ReadsTheObserver {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("identity provider down")
        }
    }

    impl std::error::Error for ReadsTheObserver {}

    impl Drop for ReadsTheObserver {
        fn drop(&mut self) {
            self.dropped
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let Some(observer) = self.observer.upgrade() else {
                return;
            };
            let labels_locked = observer
                .labels
                .as_ref()
                .is_some_and(|labels| labels.try_lock().is_err());
            if observer.apis.try_lock().is_err() || labels_locked {
                self.dropped_under_a_lock
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
    }

    /// A replaced last error, last send error or last token error may hold a token
    /// source's error, whose `Drop` may read the observer (or panic): each is
    /// dropped once the lock it was replaced under is released, per API and per
    /// label.
    #[test]
    fn a_replaced_error_is_dropped_after_the_lock() {
        for per_label in [false, true] {
            let (h, dropped) = fed_errors(per_label);
            // The first three errors (kept per API and per label, the first also
            // as the last send error) are replaced by the next three; the last
            // holder of each is the API's map, or the label's.
            assert_eq!(dropped(), (3, 0), "{per_label}");
            let a = h.snapshot("a").unwrap();
            assert_eq!((a.sends_in_window, a.refused_in_window), (2, 2));
        }
    }

    /// Forgetting an API drops the errors its figures held after the locks, per
    /// API and per label.
    #[test]
    fn a_forgotten_apis_errors_are_dropped_after_the_lock() {
        for per_label in [false, true] {
            let (h, dropped) = fed_errors(per_label);
            assert_eq!(dropped(), (3, 0), "{per_label}");
            assert!(h.forget("a"));
            // All six errors are gone now, none dropped under a lock.
            assert_eq!(dropped(), (6, 0), "{per_label}");
        }
    }

    /// An observer (keeping figures per label or not) fed by [`errors_fed_to`], and
    /// a reading of its counts: errors dropped, and dropped under a lock.
    fn fed_errors(per_label: bool) -> (Arc<HealthObserver>, impl Fn() -> (usize, usize)) {
        use std::sync::atomic::Ordering::SeqCst;
        let h = HealthObserver::new(Duration::from_secs(60));
        let h = Arc::new(if per_label { h.per_label() } else { h });
        let (dropped, under_a_lock) = errors_fed_to(&h);
        (h, move || (dropped.load(SeqCst), under_a_lock.load(SeqCst)))
    }

    #[test]
    fn forget_drops_an_api_and_its_labels_and_an_event_after_it_lists_the_api_anew() {
        let h = HealthObserver::new(Duration::from_secs(60)).per_label();
        let start_at = |at_ms| ev(at_ms, started()).with_label(Some("orders.get"));
        let answer_at = |at_ms| ev(at_ms, ok(40, StatusCode::OK)).with_label(Some("orders.get"));
        h.on_event("a", &start_at(0));
        h.on_event("a", &answer_at(40));
        h.on_event("b", &start_at(0));
        h.on_event("b", &answer_at(40));
        h.on_event("a", &start_at(1_000));
        assert!(h.forget("a"));
        assert!(!h.forget("a"), "forgotten already");
        assert!(!h.forget("c"), "never listed");
        assert!(h.snapshot("a").is_none());
        assert!(h.label_snapshots("a").is_empty());
        let listed: Vec<_> = h.snapshots().into_iter().map(|(api, _)| api).collect();
        assert_eq!(listed, [Arc::from("b")]);
        assert_eq!(h.label_snapshots("b").len(), 1, "b's labels are kept");
        // The send in flight at the forget ends: the API is listed anew, with that
        // send counted and nothing in flight.
        h.on_event("a", &answer_at(1_040));
        let a = h.snapshot("a").unwrap();
        assert_eq!(
            (a.sends_in_window, a.in_flight, a.updated_at),
            (1, 0, at(1_040))
        );
        assert_eq!(h.label_snapshots("a")[0].1.sends_in_window, 1);
        // A forget with no labels kept forgets the API alone.
        let plain = HealthObserver::new(Duration::from_secs(60));
        plain.on_attach("a", at(0));
        assert!(plain.forget("a") && plain.snapshot("a").is_none());
    }

    #[test]
    fn ends_of_sends_in_flight_at_a_forget_leave_later_sends_counted() {
        let h = HealthObserver::new(Duration::from_secs(60)).per_label();
        let label = Some("orders.get");
        let send = |at_ms, call, kind| {
            h.on_event(
                "a",
                &TransportEvent::new(at(at_ms), Some(CallId(call)), kind).with_label(label),
            );
        };
        let in_flight = || {
            (
                h.snapshot("a").map(|a| a.in_flight),
                h.label_snapshots("a").first().map(|(_, l)| l.in_flight),
            )
        };
        // Two sends in flight at the forget; the first ends after it, listing the
        // API anew; a third starts: one in flight, not none.
        send(0, 1, started());
        send(0, 2, started());
        assert!(h.forget("a"));
        send(10, 1, ok(10, StatusCode::OK));
        send(20, 3, started());
        assert_eq!(in_flight(), (Some(1), Some(1)));
        // A second forget while one orphan is still owed and the third is in
        // flight: both their ends are owed now.
        assert!(h.forget("a"));
        send(30, 2, ok(30, StatusCode::OK));
        send(40, 3, ok(20, StatusCode::OK));
        send(50, 4, started());
        assert_eq!(in_flight(), (Some(1), Some(1)));
        send(60, 4, ok(10, StatusCode::OK));
        assert_eq!(in_flight(), (Some(0), Some(0)));
        // Listed anew by a client attached under the name: the orphan's end is
        // still taken off what is owed.
        send(70, 5, started());
        assert!(h.forget("a"));
        h.on_attach("a", at(80));
        send(90, 5, ok(20, StatusCode::OK));
        send(100, 6, started());
        assert_eq!(h.snapshot("a").unwrap().in_flight, 1);
        // Nothing in flight at a forget: nothing owed, and an end heard before its
        // start still evens out.
        send(110, 6, ok(10, StatusCode::OK));
        assert!(h.forget("a"));
        send(130, 7, ok(10, StatusCode::OK));
        send(120, 7, started());
        assert_eq!(in_flight(), (Some(0), Some(0)));
        send(140, 8, started());
        assert_eq!(in_flight(), (Some(1), Some(1)));
        // An end heard before its start, then a forget: the start still owed, heard
        // after it, counts no send in flight.
        send(150, 8, ok(10, StatusCode::OK));
        send(170, 9, ok(10, StatusCode::OK));
        assert!(h.forget("a"));
        send(160, 9, started());
        assert_eq!(in_flight(), (Some(0), Some(0)));
        send(180, 10, started());
        assert_eq!(in_flight(), (Some(1), Some(1)));
    }

    /// Feeds `h` two rounds of a failed send, a refusal and a failed token fetch
    /// (labelled), each error's source a [`ReadsTheObserver`]; gives back the counts
    /// of those dropped, and of those dropped under a lock of `h`.
    fn errors_fed_to(h: &Arc<HealthObserver>) -> (Arc<AtomicUsize>, Arc<AtomicUsize>) {
        use crate::auth::{AuthError, SharedAuthError};
        use crate::observer::TokenFetchReason;
        let (dropped, dropped_under_a_lock) =
            (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let source = || ReadsTheObserver {
            observer: Arc::downgrade(h),
            dropped: Arc::clone(&dropped),
            dropped_under_a_lock: Arc::clone(&dropped_under_a_lock),
        };
        let failed = |sent| EventKind::Failed {
            send: 1,
            attempt: 1,
            error: ClientError::new(ErrorKind::Auth, 1).with_source(Arc::new(source())),
            ms: 0,
            sent,
        };
        let fetch_failed = || EventKind::TokenFetchEnded {
            reason: TokenFetchReason::First,
            ms: 0,
            outcome: TokenFetchOutcome::Failed {
                error: SharedAuthError::from(AuthError::from(source())),
            },
        };
        for ms in [0, 10] {
            for kind in [failed(true), failed(false), fetch_failed()] {
                h.on_event("a", &ev(ms, kind).with_label(Some("orders")));
            }
        }
        (dropped, dropped_under_a_lock)
    }

    #[test]
    fn token_fetches_are_counted_and_the_latest_ones_kept_whatever_order_they_come_in() {
        use crate::auth::AuthError;
        use crate::observer::TokenFetchReason;

        let h = HealthObserver::new(Duration::from_secs(60));
        let fetch = |ms: u64, outcome: TokenFetchOutcome| {
            let kind = EventKind::TokenFetchEnded {
                reason: TokenFetchReason::Renewal,
                ms: 5,
                outcome,
            };
            TransportEvent::new(at(ms), None, kind)
        };
        let failed = |text: &'static str| TokenFetchOutcome::Failed {
            error: AuthError::from(text).into(),
        };
        let fetched = |generation| TokenFetchOutcome::Fetched {
            generation,
            lifetime: None,
        };
        // Two threads' reports can cross: the later of each kind is kept.
        h.on_event("a", &fetch(3_000, failed("later")));
        h.on_event("a", &fetch(2_000, failed("earlier")));
        h.on_event("a", &fetch(2_500, fetched(2)));
        h.on_event("a", &fetch(1_000, fetched(1)));
        h.on_event("a", &fetch(4_000, TokenFetchOutcome::Abandoned));
        let a = h.snapshot("a").unwrap();
        assert_eq!(
            (
                a.tokens_fetched,
                a.token_fetches_failed,
                a.token_fetches_abandoned
            ),
            (2, 2, 1)
        );
        assert_eq!(a.last_token_fetched_at, Some(at(2_500)));
        let last = a.last_token_error.unwrap();
        assert_eq!(
            (last.at, last.reason, last.error.to_string()),
            (at(3_000), TokenFetchReason::Renewal, "later".to_owned())
        );
    }

    #[test]
    fn memory_is_fixed_and_the_figures_count_the_last_window() {
        // What an API keeps is one ring of slices, whatever the rate (the docs say
        // about 50 KB, most of it the latency histograms of sends and calls).
        let kept = std::mem::size_of::<ApiState>() + std::mem::size_of::<[Slice; SLICES]>();
        assert!(kept <= 51 * 1024, "{kept} bytes");
        // 10,000 sends and as many refusals over 100 windows of 1 s (50 slices of
        // 20 ms): the figures count only the last window.
        let h = HealthObserver::new(Duration::from_secs(1));
        let err = ClientError::new(ErrorKind::BreakerOpen, 0);
        for i in 0..10_000 {
            let t = i * 10;
            h.on_event("a", &ev(t, started()));
            h.on_event("a", &ev(t, failed(2, true, err.clone())));
            h.on_event("a", &ev(t + 5, started()));
            h.on_event("a", &ev(t + 5, failed(0, false, err.clone())));
        }
        let figures = h.snapshot("a").unwrap();
        assert_eq!(figures.sends_in_window, 100);
        assert_eq!(figures.refused_in_window, 100);
    }

    #[test]
    fn a_window_is_cut_into_the_most_even_slices_up_to_60() {
        let cut = |window: Duration| {
            let slicing = Slicing::new(window).unwrap();
            (slicing.width, slicing.span)
        };
        assert_eq!(cut(Duration::from_secs(60)), (1_000_000_000, 60));
        assert_eq!(cut(Duration::from_secs(10)), (200_000_000, 50));
        assert_eq!(cut(Duration::from_secs(1)), (20_000_000, 50));
        assert_eq!(cut(Duration::from_millis(700)), (12_500_000, 56));
        // No number from 30 to 60 divides these: 60 slices, rounded up.
        assert_eq!(cut(Duration::from_nanos(1_000_000_007)), (16_666_667, 60));
        assert_eq!(cut(Duration::from_nanos(10)), (1, 10));
        assert_eq!(cut(Duration::from_nanos(1)), (1, 1));
        assert!(Slicing::new(Duration::ZERO).is_none());
        let max = Slicing::new(Duration::MAX).unwrap();
        assert!(max.span <= 60 && u128::from(max.span) * max.width >= Duration::MAX.as_nanos());
    }

    #[test]
    fn a_one_minute_window_drops_a_seconds_sends_at_a_time() {
        let h = HealthObserver::new(Duration::from_secs(60));
        for t in [1_000, 1_500, 1_999, 2_000] {
            h.on_event("a", &ev(t, started()));
            h.on_event("a", &ev(t, ok(5, StatusCode::OK)));
        }
        let sends = |ms| h.snapshot_at("a", at(ms)).unwrap().sends_in_window;
        // The sends of second 1 (1.000 to 1.999 s) stay until 61 s, all of them, and
        // leave together; the one at 2 s stays a second longer.
        assert_eq!((sends(2_000), sends(60_999)), (4, 4));
        assert_eq!((sends(61_000), sends(61_999), sends(62_000)), (1, 1, 0));
    }

    #[test]
    fn a_window_no_number_of_slices_divides_holds_a_send_a_few_nanoseconds_longer() {
        let window = Duration::from_nanos(1_000_000_007);
        let h = HealthObserver::new(window);
        h.on_event("a", &ev(0, started()));
        h.on_event("a", &ev(0, ok(5, StatusCode::OK)));
        let sends = |nanos| {
            h.snapshot_at("a", Instant::from_nanos(nanos))
                .unwrap()
                .sends_in_window
        };
        // 60 slices of 16,666,667 ns: 1,000,000,020 ns.
        assert_eq!((sends(1_000_000_019), sends(1_000_000_020)), (1, 0));
    }

    #[test]
    fn a_send_heard_after_a_newer_slice_took_its_slot_is_outside_every_window() {
        // 1 s in 50 slices of 20 ms: the slices of 0.8 s and 2.0 s share a slot.
        let h = HealthObserver::new(Duration::from_secs(1));
        h.on_event("a", &ev(2_000, ok(5, StatusCode::OK)));
        h.on_event("a", &ev(800, ok(7, StatusCode::OK)));
        h.on_event(
            "a",
            &ev(
                800,
                failed(0, false, ClientError::new(ErrorKind::BreakerOpen, 0)),
            ),
        );
        let a = h.snapshot("a").unwrap();
        assert_eq!(
            (a.sends_in_window, a.refused_in_window, a.max_latency_ms),
            (1, 0, Some(5))
        );
        // The slice of 3.2 s takes the slot over, starting from nothing: none of the
        // 2.0 s slice's success, latency or slowest send is left in it.
        let error = ClientError::new(ErrorKind::Status(StatusCode::BAD_GATEWAY), 1);
        h.on_event("a", &ev(3_200, failed(1, true, error)));
        let a = h.snapshot("a").unwrap();
        assert_eq!(
            (a.sends_in_window, a.successes_in_window, a.success_rate),
            (1, 0, Some(0.0))
        );
        assert_eq!((a.mean_latency_ms, a.max_latency_ms), (Some(1.0), Some(1)));
    }

    #[test]
    fn refusals_after_an_outage_do_not_hide_the_apis_own_last_error() {
        let h = HealthObserver::new(Duration::from_secs(60));
        let unavailable = ClientError::new(ErrorKind::Status(StatusCode::SERVICE_UNAVAILABLE), 1);
        let refused = ClientError::new(ErrorKind::BreakerOpen, 0);
        h.on_event("a", &ev(100, failed(20, true, unavailable)));
        h.on_event("a", &ev(200, failed(0, false, refused.clone())));
        h.on_event("a", &ev(300, failed(0, false, refused)));
        let a = h.snapshot("a").unwrap();
        let last = a.last_error.unwrap();
        assert_eq!((last.at, last.error.kind_name()), (at(300), "breaker_open"));
        let api = a.last_send_error.unwrap();
        assert_eq!(
            (api.at, api.error.status()),
            (at(100), Some(StatusCode::SERVICE_UNAVAILABLE))
        );
        // Heard late, an earlier send's error does not replace it.
        let bad_gateway = ClientError::new(ErrorKind::Status(StatusCode::BAD_GATEWAY), 1);
        h.on_event("a", &ev(50, failed(20, true, bad_gateway)));
        let api = h.snapshot("a").unwrap().last_send_error.unwrap();
        assert_eq!(api.error.status(), Some(StatusCode::SERVICE_UNAVAILABLE));
        // Only refusals: none.
        let h = HealthObserver::new(Duration::from_secs(60));
        h.on_event(
            "a",
            &ev(
                0,
                failed(0, false, ClientError::new(ErrorKind::BreakerOpen, 0)),
            ),
        );
        assert!(h.snapshot("a").unwrap().last_send_error.is_none());
    }

    #[test]
    fn a_read_before_the_latest_event_reads_at_the_latest_event() {
        let h = HealthObserver::new(Duration::from_secs(10));
        for t in [15_000, 20_000] {
            h.on_event("a", &ev(t, ok(5, StatusCode::OK)));
        }
        // A clock read just before another thread's report: not a window ending at
        // 1 s, which would hold neither send.
        let early = h.snapshot_at("a", at(1_000)).unwrap();
        assert_eq!(
            (early.sends_in_window, early.covered),
            (2, Duration::from_millis(9_800))
        );
        assert_eq!(h.snapshots_at(at(1_000))[0].1.sends_in_window, 2);
    }

    #[test]
    fn covered_is_the_time_from_the_oldest_slice_to_the_end() {
        let h = HealthObserver::new(Duration::from_secs(60));
        h.on_event("a", &ev(0, ok(5, StatusCode::OK)));
        let covered = |ms| h.snapshot_at("a", at(ms)).unwrap().covered;
        // Younger than the window: all of the runtime's time so far.
        assert_eq!(covered(0), Duration::ZERO);
        assert_eq!(covered(30_500), Duration::from_millis(30_500));
        // Then between the window less one slice (1 s) and the window.
        assert_eq!(covered(59_999), Duration::from_millis(59_999));
        assert_eq!(covered(60_000), Duration::from_secs(59));
        assert_eq!(covered(90_500), Duration::from_millis(59_500));
        // A zero window covers nothing; `Duration::MAX` everything since the origin.
        let zero = HealthObserver::new(Duration::ZERO);
        zero.on_event("a", &ev(5_000, ok(5, StatusCode::OK)));
        assert_eq!(zero.snapshot("a").unwrap().covered, Duration::ZERO);
        let max = HealthObserver::new(Duration::MAX);
        max.on_event("a", &ev(5_000, ok(5, StatusCode::OK)));
        assert_eq!(max.snapshot("a").unwrap().covered, Duration::from_secs(5));
        // Cut unevenly: 60 slices of 16,666,667 ns, 59 ns more than the window.
        let uneven = HealthObserver::new(Duration::from_nanos(1_000_000_007));
        let end = Instant::from_nanos(2 * 1_000_000_020 - 1);
        let call = Some(CallId(1));
        uneven.on_event("a", &TransportEvent::new(end, call, ok(5, StatusCode::OK)));
        assert_eq!(
            uneven.snapshot("a").unwrap().covered,
            Duration::from_nanos(1_000_000_019)
        );
    }

    #[test]
    fn a_window_of_duration_max_counts_every_send_for_ever() {
        let h = HealthObserver::new(Duration::MAX);
        for nanos in [0, 1 << 40, u64::MAX / 2, u64::MAX] {
            let at = Instant::from_nanos(nanos);
            h.on_event(
                "a",
                &TransportEvent::new(at, Some(CallId(1)), ok(1, StatusCode::OK)),
            );
        }
        let end = Instant::from_nanos(u64::MAX);
        assert_eq!(h.snapshot_at("a", end).unwrap().sends_in_window, 4);
    }

    #[test]
    fn a_zero_window_holds_no_send() {
        let h = HealthObserver::new(Duration::ZERO);
        h.on_event("a", &ev(0, started()));
        h.on_event("a", &ev(0, ok(5, StatusCode::OK)));
        h.on_event(
            "a",
            &ev(
                0,
                failed(0, false, ClientError::new(ErrorKind::BreakerOpen, 0)),
            ),
        );
        let a = h.snapshot("a").unwrap();
        assert_eq!(
            (
                a.sends_in_window,
                a.refused_in_window,
                a.success_rate,
                a.mean_latency_ms
            ),
            (0, 0, None, None)
        );
        assert_eq!((a.last_status, a.in_flight), (Some(StatusCode::OK), 0));
    }

    #[test]
    fn keeps_figures_per_api_over_a_window() {
        let h = HealthObserver::new(Duration::from_secs(10));
        let err = ClientError::new(ErrorKind::Status(StatusCode::BAD_GATEWAY), 1);
        h.on_event("a", &ev(0, started()));
        assert_eq!(h.snapshot("a").unwrap().in_flight, 1);
        h.on_event(
            "a",
            &ev(
                100,
                EventKind::Failed {
                    send: 1,
                    attempt: 1,
                    error: err.clone(),
                    ms: 100,
                    sent: true,
                },
            ),
        );
        h.on_event(
            "a",
            &ev(
                100,
                EventKind::RetryScheduled {
                    attempt: 2,
                    after: Duration::from_millis(5),
                },
            ),
        );
        h.on_event(
            "a",
            &ev(
                105,
                EventKind::Started {
                    send: 2,
                    attempt: 2,
                },
            ),
        );
        h.on_event(
            "a",
            &ev(
                125,
                EventKind::Succeeded {
                    send: 2,
                    attempt: 2,
                    status: StatusCode::OK,
                    ms: 20,
                    bytes: None,
                },
            ),
        );
        h.on_event(
            "b",
            &ev(
                130,
                EventKind::BreakerOpened {
                    cooldown: Duration::from_secs(5),
                },
            ),
        );
        let a = h.snapshot("a").unwrap();
        assert_eq!(
            (
                a.in_flight,
                a.sends_in_window,
                a.successes_in_window,
                a.retries
            ),
            (0, 2, 1, 1)
        );
        assert_eq!(a.success_rate, Some(0.5));
        assert_eq!(a.mean_latency_ms, Some(60.0));
        assert_eq!(a.max_latency_ms, Some(100));
        assert_eq!(a.last_status, Some(StatusCode::OK));
        assert_eq!(
            a.last_error.unwrap().error.status(),
            Some(StatusCode::BAD_GATEWAY)
        );
        let b = h.snapshot("b").unwrap();
        assert_eq!(
            b.breaker,
            BreakerView::Open {
                since: at(130),
                cooldown: Duration::from_secs(5)
            }
        );
        assert_eq!(b.success_rate, None);
        // Read at a later time, the window has moved on even with no new event: both
        // sends are in the first slice (200 ms), which leaves at 10 s.
        let later = h.snapshot_at("a", at(9_999)).unwrap();
        assert_eq!((later.sends_in_window, later.successes_in_window), (2, 1));
        let later = h.snapshot_at("a", at(10_000)).unwrap();
        assert_eq!((later.sends_in_window, later.successes_in_window), (0, 0));
        assert_eq!(h.snapshots_at(at(60_000))[0].1.sends_in_window, 0);
        // Samples older than the window drop out.
        h.on_event("a", &ev(20_000, started()));
        let a = h.snapshot("a").unwrap();
        assert_eq!((a.sends_in_window, a.success_rate), (0, None));
        assert_eq!(h.snapshots().len(), 2);
        h.on_event("b", &ev(20_000, EventKind::BreakerClosed));
        assert_eq!(h.snapshot("b").unwrap().breaker, BreakerView::Closed);
    }

    fn opened_for_5_s() -> EventKind {
        EventKind::BreakerOpened {
            cooldown: Duration::from_secs(5),
        }
    }

    fn started() -> EventKind {
        EventKind::Started {
            send: 1,
            attempt: 1,
        }
    }

    #[test]
    fn every_latency_falls_in_the_bucket_whose_range_holds_it() {
        let mut edges = vec![0, 1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 23, 24, 1 << 20];
        edges.extend([(1 << 21) - 1, 1 << 21, u64::MAX]);
        for ms in edges.into_iter().chain(0..5000) {
            let b = bucket(ms);
            let (lo, hi) = bucket_range(b);
            assert!(
                lo <= ms && hi.is_none_or(|hi| ms < hi),
                "{ms} in {b}: {lo}..{hi:?}"
            );
        }
        // The buckets tile the latencies: each starts where the one before ends.
        for b in 1..BUCKETS {
            assert_eq!(Some(bucket_range(b).0), bucket_range(b - 1).1, "{b}");
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        assert_eq!(bucket_range(0), (0, Some(1)));
    }

    /// The percentiles of one window holding sends of these latencies.
    fn percentiles(latencies: impl IntoIterator<Item = u64>) -> (u64, u64, u64) {
        let h = HealthObserver::new(Duration::from_secs(60));
        for (i, ms) in latencies.into_iter().enumerate() {
            let at = i as u64;
            h.on_event("a", &ev(at, started()));
            h.on_event("a", &ev(at, ok(ms, StatusCode::OK)));
        }
        let a = h.snapshot("a").unwrap();
        (
            a.p50_latency_ms.unwrap(),
            a.p90_latency_ms.unwrap(),
            a.p99_latency_ms.unwrap(),
        )
    }

    #[test]
    fn percentiles_land_in_the_bucket_of_the_nearest_rank_send() {
        // 1 to 1000 ms, one send each: the exact nearest-rank values are 500, 900
        // and 990; each estimate lies in the same bucket ([384, 512), [768, 1024)).
        let (p50, p90, p99) = percentiles(1..=1000);
        assert!((384..512).contains(&p50), "{p50}");
        assert!((768..1024).contains(&p90), "{p90}");
        assert!((768..=1000).contains(&p99), "{p99}");
        // Spread over the bucket by rank, so they keep their order.
        assert!(p50 < p90 && p90 < p99);
        // The 900th of 1000 is the 133rd of the 233 sends in [768, 1024): at the
        // middle of the 133rd of 233 parts of the bucket, 768 + 145; the 990th's
        // place, 1012, is past the slowest send, 1000.
        assert_eq!((p50, p90, p99), (500, 913, 1000));
        // Every send the same: exact, whatever the bucket.
        assert_eq!(percentiles([40; 7]), (40, 40, 40));
        assert_eq!(percentiles([0; 3]), (0, 0, 0));
        assert_eq!(percentiles([1 << 30]), (1 << 30, 1 << 30, 1 << 30));
        // One slow send in a hundred shows at the 99th percentile, not below it.
        let mut mostly_fast = vec![10; 98];
        mostly_fast.extend([5000, 5000]);
        let (p50, p90, p99) = percentiles(mostly_fast);
        // In the bucket of 10 ms, [8, 12), spread by rank over it.
        assert!(
            (10..12).contains(&p50) && (p50..12).contains(&p90),
            "{p50} {p90}"
        );
        assert!((4096..=5000).contains(&p99), "{p99}");
    }

    #[test]
    fn sends_past_35_minutes_share_a_bucket_that_ends_at_the_slowest() {
        let minute = 60 * 1000;
        // Spread by rank from 35 minutes (2^21 ms) to the slowest send, within the
        // fastest and the slowest.
        let mut long = vec![40 * minute; 99];
        long.push(600 * minute);
        let (p50, p90, p99) = percentiles(long);
        assert!((40 * minute..=600 * minute).contains(&p50), "{p50}");
        assert!(p50 < p90 && p90 < p99 && p99 <= 600 * minute);
        assert_eq!(percentiles([u64::MAX; 3]), (u64::MAX, u64::MAX, u64::MAX));
        let (p50, _, p99) = percentiles([1 << 21, u64::MAX]);
        assert!(p50 > 1 << 21 && p50 < p99, "{p50} {p99}");
    }

    #[test]
    fn percentiles_count_the_window_and_failed_sends_but_not_refusals() {
        let h = HealthObserver::new(Duration::from_secs(1));
        let err = ClientError::new(ErrorKind::Status(StatusCode::BAD_GATEWAY), 1);
        // Slow sends in the first second; fast ones and a slow failure in the
        // third; refusals (ms 0, never sent) in between.
        for i in 0..10 {
            h.on_event("a", &ev(i, started()));
            h.on_event("a", &ev(i, ok(900, StatusCode::OK)));
        }
        for i in 0..20 {
            h.on_event("a", &ev(1500 + i, started()));
            h.on_event("a", &ev(1500 + i, failed(0, false, err.clone())));
        }
        for i in 0..9 {
            h.on_event("a", &ev(2100 + i, started()));
            h.on_event("a", &ev(2100 + i, ok(20, StatusCode::OK)));
        }
        h.on_event("a", &ev(2200, started()));
        h.on_event("a", &ev(2200, failed(300, true, err)));
        let a = h.snapshot("a").unwrap();
        assert_eq!(a.sends_in_window, 10);
        assert_eq!((a.p50_latency_ms, a.max_latency_ms), (Some(20), Some(300)));
        // Nine sends of 20 ms in [16, 24): the 9th is placed near the bucket's end.
        assert!(a.p90_latency_ms.is_some_and(|p| (20..24).contains(&p)));
        assert!(a.p99_latency_ms.is_some_and(|p| (256..=300).contains(&p)));
        // Later, nothing in the window: no percentiles.
        let later = h.snapshot_at("a", at(10_000)).unwrap();
        assert_eq!((later.p50_latency_ms, later.p99_latency_ms), (None, None));
    }

    fn ok(ms: u64, status: StatusCode) -> EventKind {
        EventKind::Succeeded {
            send: 1,
            attempt: 1,
            status,
            ms,
            bytes: None,
        }
    }

    fn failed(ms: u64, sent: bool, error: ClientError) -> EventKind {
        EventKind::Failed {
            send: 1,
            attempt: 1,
            error,
            ms,
            sent,
        }
    }

    #[test]
    fn events_heard_out_of_order_count_by_their_time() {
        let h = HealthObserver::new(Duration::from_secs(10));
        let late_err = ClientError::new(ErrorKind::Status(StatusCode::BAD_GATEWAY), 1);
        let early_err = ClientError::new(ErrorKind::Status(StatusCode::SERVICE_UNAVAILABLE), 1);
        // The breaker closed at 200 ms; the report that it opened at 100 ms is heard
        // after that.
        h.on_event("a", &ev(200, EventKind::BreakerClosed));
        h.on_event(
            "a",
            &ev(
                100,
                EventKind::BreakerOpened {
                    cooldown: Duration::from_secs(1),
                },
            ),
        );
        // A send answered 200 at 20 s; a 503 from 15 s and a 502 from 19 s come
        // later; a refusal and a send from 5 s come last, already outside the window
        // that ends at 20 s.
        h.on_event("a", &ev(20_000, ok(30, StatusCode::OK)));
        h.on_event("a", &ev(19_000, failed(40, true, late_err)));
        h.on_event("a", &ev(15_000, failed(50, true, early_err)));
        let refused = ClientError::new(ErrorKind::BreakerOpen, 0);
        h.on_event("a", &ev(5_000, failed(0, false, refused)));
        h.on_event("a", &ev(5_000, ok(60, StatusCode::CREATED)));

        let a = h.snapshot("a").unwrap();
        assert_eq!(
            a.breaker,
            BreakerView::Closed,
            "the latest breaker event wins"
        );
        assert_eq!(
            a.last_status,
            Some(StatusCode::OK),
            "the latest answer wins"
        );
        let last = a.last_error.unwrap();
        assert_eq!(
            (last.at, last.error.status()),
            (at(19_000), Some(StatusCode::BAD_GATEWAY)),
            "the latest error wins"
        );
        assert_eq!(
            (
                a.sends_in_window,
                a.successes_in_window,
                a.refused_in_window
            ),
            (3, 1, 0),
            "the sends from 5 s are outside the window"
        );
        assert_eq!(a.max_latency_ms, Some(50));
        assert_eq!(a.updated_at, at(20_000));
        // Ties go to the one heard last.
        h.on_event("a", &ev(20_000, ok(1, StatusCode::ACCEPTED)));
        assert_eq!(
            h.snapshot("a").unwrap().last_status,
            Some(StatusCode::ACCEPTED)
        );
    }

    #[test]
    fn among_events_at_the_same_instant_the_one_heard_last_counts() {
        let h = HealthObserver::new(Duration::from_secs(10));
        let failed = |code: u16| EventKind::Failed {
            send: 1,
            attempt: 1,
            error: ClientError::new(ErrorKind::Status(StatusCode::from_u16(code).unwrap()), 1),
            ms: 5,
            sent: true,
        };
        // Closed then opened at the same instant (common on a virtual clock): open.
        h.on_event("a", &ev(100, EventKind::BreakerClosed));
        h.on_event(
            "a",
            &ev(
                100,
                EventKind::BreakerOpened {
                    cooldown: Duration::from_secs(5),
                },
            ),
        );
        assert!(matches!(
            h.snapshot("a").unwrap().breaker,
            BreakerView::Open { .. }
        ));
        // Two errors at the same instant: the later one is the last error.
        h.on_event("a", &ev(200, failed(502)));
        h.on_event("a", &ev(200, failed(504)));
        let last = h.snapshot("a").unwrap().last_error.unwrap();
        assert_eq!(last.error.status(), Some(StatusCode::GATEWAY_TIMEOUT));
        // A failed answer's status is the last status, after a success.
        h.on_event(
            "a",
            &ev(
                300,
                EventKind::Succeeded {
                    send: 1,
                    attempt: 1,
                    status: StatusCode::OK,
                    ms: 1,
                    bytes: None,
                },
            ),
        );
        h.on_event("a", &ev(400, failed(503)));
        assert_eq!(
            h.snapshot("a").unwrap().last_status,
            Some(StatusCode::SERVICE_UNAVAILABLE)
        );
    }

    #[test]
    fn synthetic_failures_are_refusals_not_sends() {
        let h = HealthObserver::new(Duration::from_secs(10));
        let err = ClientError::new(ErrorKind::BreakerOpen, 0);
        h.on_event("a", &ev(0, started()));
        h.on_event(
            "a",
            &ev(
                0,
                EventKind::Failed {
                    send: 1,
                    attempt: 1,
                    error: err,
                    ms: 0,
                    sent: false,
                },
            ),
        );
        let a = h.snapshot("a").unwrap();
        assert_eq!(
            (a.sends_in_window, a.refused_in_window, a.in_flight),
            (0, 1, 0)
        );
        assert_eq!(a.last_error.unwrap().error.kind_name(), "breaker_open");
    }

    #[test]
    fn reading_at_a_later_time_forgets_nothing() {
        let h = HealthObserver::new(Duration::from_secs(10));
        let started = |send| EventKind::Started {
            send,
            attempt: send,
        };
        let ok = |send| EventKind::Succeeded {
            send,
            attempt: send,
            status: StatusCode::OK,
            ms: 10,
            bytes: None,
        };
        let refused = EventKind::Failed {
            send: 3,
            attempt: 3,
            error: ClientError::new(ErrorKind::BreakerOpen, 2),
            ms: 0,
            sent: false,
        };
        for (ms, kind) in [(0, started(1)), (10, ok(1)), (20, started(2)), (30, ok(2))] {
            h.on_event("a", &ev(ms, kind));
        }
        h.on_event("a", &ev(30, started(3)));
        h.on_event("a", &ev(30, refused));
        let figures = |a: ApiHealth| (a.sends_in_window, a.refused_in_window);
        // A clock (of another client, say) far ahead: the window there is empty ...
        assert_eq!(figures(h.snapshot_at("a", at(60_000)).unwrap()), (0, 0));
        assert_eq!(figures(h.snapshots_at(at(60_000))[0].1.clone()), (0, 0));
        // ... and reading it removed nothing from the windows of other reads.
        assert_eq!(figures(h.snapshot("a").unwrap()), (2, 1));
        assert_eq!(figures(h.snapshot_at("a", at(5_000)).unwrap()), (2, 1));
        // All three are in the first 200 ms slice, which leaves the window 10 s after
        // it began.
        assert_eq!(figures(h.snapshot_at("a", at(9_999)).unwrap()), (2, 1));
        assert_eq!(figures(h.snapshot_at("a", at(10_000)).unwrap()), (0, 0));
    }

    #[test]
    fn a_terminal_event_heard_before_its_started_leaves_nothing_in_flight() {
        let h = HealthObserver::new(Duration::from_secs(10));
        let call = Some(CallId(1));
        let ok = EventKind::Succeeded {
            send: 1,
            attempt: 1,
            status: StatusCode::OK,
            ms: 20,
            bytes: None,
        };
        h.on_event("a", &TransportEvent::new(at(30), call, ok));
        // Its `Started` not heard yet: none in flight, not a negative count.
        assert_eq!(h.snapshot("a").unwrap().in_flight, 0);
        h.on_event("a", &TransportEvent::new(at(10), call, started()));
        assert_eq!(h.snapshot("a").unwrap().in_flight, 0);
    }

    #[test]
    fn the_window_holds_its_length_of_sends_and_not_one_more() {
        // One send a second into a 10 s window: ten sends in it, whichever second.
        let h = HealthObserver::new(Duration::from_secs(10));
        for i in 0..=30 {
            h.on_event("a", &ev(i * 1000, started()));
            h.on_event("a", &ev(i * 1000, ok(5, StatusCode::OK)));
            let expected = u32::try_from(i + 1).unwrap().min(10);
            assert_eq!(
                h.snapshot("a").unwrap().sends_in_window,
                expected,
                "at {i} s"
            );
        }
        // Reading later: a send exactly a window before the reading is out.
        let a = |ms| h.snapshot_at("a", at(ms)).unwrap().sends_in_window;
        assert_eq!((a(39_999), a(40_000)), (1, 0));
        // Refusals too.
        let h = HealthObserver::new(Duration::from_secs(10));
        let refused = ClientError::new(ErrorKind::BreakerOpen, 0);
        h.on_event("a", &ev(0, started()));
        h.on_event("a", &ev(0, failed(0, false, refused)));
        let r = |ms| h.snapshot_at("a", at(ms)).unwrap().refused_in_window;
        assert_eq!((r(0), r(9_999), r(10_000)), (1, 1, 0));
    }

    #[test]
    fn an_answer_closes_a_breaker_whose_close_was_heard_before_its_opening() {
        // Thread B's 503 (at 2.000 s) opens the breaker, then thread A's 200 (head at
        // 1.990 s) closes it: the close is heard last but carries the earlier time,
        // so the view keeps the opening.
        let h = HealthObserver::new(Duration::from_secs(10));
        h.on_event("a", &ev(2_000, opened_for_5_s()));
        h.on_event("a", &ev(1_990, EventKind::BreakerClosed));
        assert!(matches!(
            h.snapshot("a").unwrap().breaker,
            BreakerView::Open { .. }
        ));
        // The next answer shows the breaker as it is: closed (2xx never reports a
        // transition on a closed breaker).
        h.on_event("a", &ev(3_000, started()));
        h.on_event("a", &ev(3_000, ok(5, StatusCode::OK)));
        assert_eq!(h.snapshot("a").unwrap().breaker, BreakerView::Closed);
        // An answer from before the opening does not close it.
        let h = HealthObserver::new(Duration::from_secs(10));
        h.on_event("a", &ev(2_000, opened_for_5_s()));
        h.on_event("a", &ev(1_990, started()));
        h.on_event("a", &ev(1_990, ok(5, StatusCode::OK)));
        assert!(matches!(
            h.snapshot("a").unwrap().breaker,
            BreakerView::Open { .. }
        ));
    }

    #[test]
    fn snapshots_are_sorted_by_name() {
        let h = HealthObserver::new(Duration::from_secs(10));
        for name in ["b", "c", "a"] {
            h.on_event(name, &ev(0, EventKind::BreakerClosed));
        }
        let names = |all: Vec<(Arc<str>, ApiHealth)>| {
            all.into_iter()
                .map(|(name, _)| name.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(h.snapshots()), ["a", "b", "c"]);
        assert_eq!(names(h.snapshots_at(at(5))), ["a", "b", "c"]);
    }

    #[test]
    fn the_mean_latency_of_a_window_where_every_send_failed() {
        let h = HealthObserver::new(Duration::from_secs(10));
        for (t, ms) in [(0, 40), (10, 60)] {
            let error = ClientError::new(ErrorKind::Status(StatusCode::SERVICE_UNAVAILABLE), 1);
            h.on_event("a", &ev(t, failed(ms, true, error)));
        }
        let a = h.snapshot("a").unwrap();
        assert_eq!(
            (a.success_rate, a.mean_latency_ms, a.max_latency_ms),
            (Some(0.0), Some(50.0), Some(60))
        );
    }

    #[test]
    fn redials_are_counted_apart_from_retries() {
        let h = HealthObserver::new(Duration::from_secs(10));
        for send in [2, 3] {
            let redialing = EventKind::Redialing { send, attempt: 1 };
            h.on_event("a", &ev(u64::from(send), redialing));
        }
        let a = h.snapshot("a").unwrap();
        assert_eq!((a.redials, a.retries), (2, 0));
    }

    #[test]
    fn an_opening_heard_after_a_later_event_keeps_its_own_time() {
        let h = HealthObserver::new(Duration::from_secs(10));
        h.on_event("a", &ev(500, started()));
        h.on_event("a", &ev(400, opened_for_5_s()));
        assert_eq!(
            h.snapshot("a").unwrap().breaker,
            BreakerView::Open {
                since: at(400),
                cooldown: Duration::from_secs(5),
            }
        );
    }

    fn call_end(began_ms: u64, ms: u64, outcome: CallOutcome) -> CallEnd {
        CallEnd::new(CallId(1), at(began_ms), at(ms), 1, 1, outcome)
    }

    #[test]
    fn calls_are_counted_where_they_end_apart_from_their_sends() {
        let h = HealthObserver::new(Duration::from_secs(1));
        let ok = || CallOutcome::Succeeded {
            status: StatusCode::OK,
        };
        let failed = || CallOutcome::Failed {
            error: ClientError::new(ErrorKind::BreakerOpen, 0),
        };
        // A call's end lists its API like an event does.
        h.on_call_end("a", &call_end(1_000, 2_100, ok()));
        let a = h.snapshot("a").unwrap();
        assert_eq!((a.calls_in_window, a.call_successes_in_window), (1, 1));
        assert_eq!(
            (a.call_success_rate, a.mean_call_ms, a.max_call_ms),
            (Some(1.0), Some(1100.0), Some(1100))
        );
        assert_eq!((a.sends_in_window, a.success_rate), (0, None));
        assert_eq!(a.updated_at, at(2_100));
        h.on_call_end("a", &call_end(2_280, 2_300, failed()));
        h.on_call_end("a", &call_end(2_340, 2_400, failed()));
        h.on_call_end("a", &call_end(2_000, 2_500, CallOutcome::Cancelled));
        let a = h.snapshot("a").unwrap();
        assert_eq!((a.calls_in_window, a.call_successes_in_window), (3, 1));
        assert_eq!(a.call_success_rate, Some(1.0 / 3.0));
        assert_eq!(a.mean_call_ms, Some(1180.0 / 3.0));
        // The dropped call's 500 ms counts nowhere in the window.
        assert_eq!(a.max_call_ms, Some(1100));
        // 20, 60 and 1,100 ms: the median in 60's bucket, [48, 64) ms, at its
        // middle; the 90th and 99th the slowest.
        assert_eq!(
            (a.p50_call_ms, a.p90_call_ms, a.p99_call_ms),
            (Some(56), Some(1100), Some(1100))
        );
        assert_eq!((a.calls_cancelled, a.cancelled), (1, 0));
        // A second later the first call has left the window (50 slices of 20 ms);
        // the cancelled count stays, all time.
        let a = h.snapshot_at("a", at(3_150)).unwrap();
        assert_eq!((a.calls_in_window, a.call_success_rate), (2, Some(0.0)));
        assert_eq!((a.mean_call_ms, a.max_call_ms), (Some(40.0), Some(60)));
        let a = h.snapshot_at("a", at(4_000)).unwrap();
        assert_eq!((a.calls_in_window, a.call_success_rate), (0, None));
        assert_eq!(
            (a.mean_call_ms, a.max_call_ms, a.calls_cancelled),
            (None, None, 1)
        );
        assert_eq!((a.p50_call_ms, a.p99_call_ms), (None, None));
        // A zero window counts no call.
        let zero = HealthObserver::new(Duration::ZERO);
        zero.on_call_end("a", &call_end(90, 100, ok()));
        assert_eq!(zero.snapshot("a").unwrap().call_success_rate, None);
    }

    #[test]
    fn per_label_figures_count_labelled_calls_apart_with_the_apis_breaker() {
        let labelled = |ms, call, kind, label| {
            TransportEvent::new(at(ms), Some(CallId(call)), kind).with_label(label)
        };
        let started = EventKind::Started {
            send: 1,
            attempt: 1,
        };
        let ok = |ms| EventKind::Succeeded {
            send: 1,
            attempt: 1,
            status: StatusCode::OK,
            ms,
            bytes: None,
        };
        let feed = |h: &HealthObserver| {
            // Call 1 "list" (40 ms), call 2 unlabelled (10 ms), call 3 "get" (5 ms),
            // whose send opens the breaker (an event it caused carries its label).
            let list = Some("orders.list");
            let get = Some("orders.get");
            for (ms, call, kind, label) in [
                (0, 1, started.clone(), list),
                (40, 1, ok(40), list),
                (50, 2, started.clone(), None),
                (60, 2, ok(10), None),
                (100, 3, started.clone(), get),
                (
                    105,
                    3,
                    EventKind::BreakerOpened {
                        cooldown: Duration::from_secs(5),
                    },
                    get,
                ),
            ] {
                h.on_event("a", &labelled(ms, call, kind, label));
            }
            let end = CallEnd::new(CallId(1), at(0), at(40), 1, 1, CallOutcome::Cancelled);
            h.on_call_end("a", &end.with_label(list));
        };
        // Off by default: nothing per label.
        let plain = HealthObserver::new(Duration::from_secs(60));
        feed(&plain);
        assert!(plain.label_snapshots("a").is_empty());
        assert_eq!(plain.snapshot("a").unwrap().sends_in_window, 2);

        let h = HealthObserver::new(Duration::from_secs(60)).per_label();
        feed(&h);
        // The API counts everything; each label its own calls only.
        assert_eq!(h.snapshot("a").unwrap().sends_in_window, 2);
        let labels = h.label_snapshots("a");
        let names: Vec<_> = labels.iter().map(|(label, _)| *label).collect();
        assert_eq!(names, ["orders.get", "orders.list"]);
        let (get, list) = (&labels[0].1, &labels[1].1);
        assert_eq!(
            (
                list.sends_in_window,
                list.max_latency_ms,
                list.calls_cancelled
            ),
            (1, Some(40), 1)
        );
        assert_eq!((list.updated_at, get.updated_at), (at(40), at(105)));
        assert_eq!((get.sends_in_window, get.in_flight), (0, 1));
        // One breaker serves every label: the API's, on each.
        let open = BreakerView::Open {
            since: at(105),
            cooldown: Duration::from_secs(5),
        };
        assert_eq!((get.breaker, list.breaker), (open, open));
        // A window ending later ages a label's figures out, as an API's.
        let later = h.label_snapshots_at("a", at(70_000));
        assert_eq!(later[1].1.sends_in_window, 0);
        assert!(h.label_snapshots("b").is_empty());
    }
}
