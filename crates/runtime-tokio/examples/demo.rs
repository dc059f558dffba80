//! # The vantage-api-pool demo: three APIs, one flaky server, a live health view
//!
//! ```text
//! cargo run --example demo               # about 30 s, from the workspace root
//! cargo run --example demo -- --quick    # about 6 s (or DEMO_QUICK=1), e.g. for a CI smoke test
//! cargo run --example demo -- --plain    # periodic plain-text snapshots even on a terminal
//! ```
//!
//! It starts an HTTP server on `127.0.0.1` (an ephemeral port; nothing but loopback is
//! used) that plays a script, and drives three APIs on it, each through its own
//! [`ResilientClient`] with its own policy:
//!
//! | API | server script | client |
//! |---|---|---|
//! | `orders-api` → `/orders` | healthy, then an outage of 503s (6 s → 14 s), then recovery; one 200 in 20 breaks off mid-body (the connection closes) | `CallPolicy::essential()` (retry until dropped, wait for the breaker's probe), the default breaker (5 failures, 5 s doubling), 4 in parallel |
//! | `search-api` → `/search` | a quota of 12 requests a second, cut to 4 (10 s → 20 s): above it, `429` with `Retry-After: 1` | `CallPolicy::bounded` (2 retries), its own rate limit of 8/s |
//! | `profile-api` → `/profile` | tokens from `/token` live 5 s, then `401`; a spell of 500s (17 s → 21 s) | `CallPolicy::background()` (one attempt, fail fast), a breaker of 3 failures, auth through `auth::token_fn` |
//!
//! What to watch: the orders breaker opens, its probe fails and the cooldown doubles,
//! and the waiting calls go through once it closes; search calls slow down on 429s and
//! leave no earlier than the server asked, without touching the breaker; profile calls
//! refresh their token once per 401 (single-flight) and are refused at once, nothing
//! sent, while the breaker is open. Every call reads its body with `execute_read`, so
//! an orders body cut off mid-way is a failed send, and the GET goes again: no call
//! gets a part of a body.
//!
//! The health view is built only from the observer events and `breaker_state()`: the
//! shipped [`HealthObserver`] keeps the figures per API (breaker, in flight, success
//! rate and latency over a window, retries, last error), and the shipped
//! [`TracingObserver`] writes the events at `DEBUG` and up (all but `Started`), with
//! their API name, to a log file in the OS temp directory (its path is printed). On a
//! terminal of 80 x 19 or more the view is redrawn in place four times a second, in 79
//! columns and 19 lines; otherwise (CI, a pipe, a smaller terminal) plain-text
//! snapshots are printed every couple of seconds. At the end a summary per API is printed, and the exit code is 0 when every
//! API had a successful call and the story happened (the orders breaker opened and
//! closed again, search retried its 429s no earlier than asked, a 401 refreshed the
//! profile token). A watchdog ends the process if anything hangs, so the demo always
//! finishes by itself.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::error::Error;
use std::fmt::Write as _;
use std::future::Future;
use std::io::{IsTerminal, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tracing_subscriber::layer::SubscriberExt as _;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use vantage_api_pool::auth::{AuthError, TokenSource, token_fn};
use vantage_api_pool::health::{ApiHealth, BreakerView, HealthObserver};
use vantage_api_pool::http::{HeaderName, HeaderValue, header::AUTHORIZATION};
use vantage_api_pool::tracing_observer::TracingObserver;
use vantage_api_pool::{
    BreakerState, CallId, CallPolicy, ClientError, EventKind, Fanout, Instant, ReadResponse,
    ResilientClient, RetryPolicy, Runtime, TokenFetchOutcome, TransportEvent, TransportObserver,
};
use vantage_api_pool_reqwest::{ReqwestResponse, ReqwestTransport, reqwest};
use vantage_api_pool_tokio::TokioRuntime;

type BoxError = Box<dyn Error + Send + Sync + 'static>;

// ---------------------------------------------------------------------------------
// Settings and the script
// ---------------------------------------------------------------------------------

/// Script seconds of traffic. The full run plays them in real seconds; `--quick`
/// plays them five times faster.
const RUN: f64 = 30.0;
/// `/orders` answers 503 in this span.
const ORDERS_OUTAGE: (f64, f64) = (6.0, 14.0);
/// `/search` allows `SEARCH_QUOTA_TIGHT` requests a second in this span,
/// `SEARCH_QUOTA` outside it.
const SEARCH_TIGHT: (f64, f64) = (10.0, 20.0);
const SEARCH_QUOTA: u32 = 12;
const SEARCH_QUOTA_TIGHT: u32 = 4;
/// `/profile` answers 500 in this span.
const PROFILE_BROKEN: (f64, f64) = (17.0, 21.0);
/// How long a token from `/token` is accepted, in script seconds.
const TOKEN_TTL: f64 = 5.0;
/// The bodies of the three APIs' successes: a call must read one whole.
const ORDERS_BODY: &str = r#"{"orders":[{"id":1,"total":42}]}"#;
const SEARCH_BODY: &str = r#"{"hits":3}"#;
const PROFILE_BODY: &str = r#"{"name":"Ada"}"#;
/// The most any call reads of a body.
const BODY_LIMIT: usize = 64 * 1024;

#[derive(Debug, Clone, Copy)]
struct Settings {
    quick: bool,
    /// Real seconds per script second.
    scale: f64,
    /// Redraw in place with ANSI escapes (a terminal), or print plain snapshots.
    live: bool,
    /// A terminal too small for the live view (so plain snapshots instead).
    small_terminal: bool,
    color: bool,
}

impl Settings {
    fn from_env() -> Result<Settings, String> {
        let mut quick = std::env::var("DEMO_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
        let mut plain = false;
        for arg in std::env::args().skip(1) {
            match arg.as_str() {
                "--quick" | "-q" => quick = true,
                "--plain" => plain = true,
                "--help" | "-h" => return Err(String::new()),
                other => return Err(format!("unknown argument `{other}`")),
            }
        }
        let terminal =
            std::io::stdout().is_terminal() && !std::env::var("TERM").is_ok_and(|t| t == "dumb");
        // A terminal too small for the view would wrap and scroll every redraw.
        let small_terminal = terminal && !plain && !terminal_fits();
        let live = terminal && !plain && !small_terminal;
        Ok(Settings {
            quick,
            scale: if quick { 0.2 } else { 1.0 },
            live,
            small_terminal,
            color: live && std::env::var_os("NO_COLOR").is_none(),
        })
    }

    /// `script_secs` of the script in real time.
    fn real(&self, script_secs: f64) -> Duration {
        Duration::from_secs_f64(script_secs * self.scale)
    }

    fn run_for(&self) -> Duration {
        self.real(RUN)
    }

    /// The watchdog's limit: far past the end, well inside a minute.
    fn hard_deadline(&self) -> Duration {
        if self.quick {
            Duration::from_secs(25)
        } else {
            Duration::from_secs(55)
        }
    }

    /// The health view's window for success rate and latency.
    fn window(&self) -> Duration {
        self.real(10.0).max(Duration::from_secs(2))
    }
}

const USAGE: &str = "usage: cargo run --example demo [-- [--quick] [--plain]]
  --quick   play the 30 s script five times faster (about 6 s); also DEMO_QUICK=1
  --plain   print plain-text snapshots instead of redrawing (automatic when stdout is not a terminal)";

/// Where the script is: real time since the shared clock's origin, in script seconds.
#[derive(Debug, Clone)]
struct Script {
    settings: Settings,
    clock: TokioRuntime,
}

impl Script {
    fn now(&self) -> f64 {
        self.clock.now().since_origin().as_secs_f64() / self.settings.scale
    }

    fn orders_down(t: f64) -> bool {
        (ORDERS_OUTAGE.0..ORDERS_OUTAGE.1).contains(&t)
    }

    fn search_quota(t: f64) -> u32 {
        if (SEARCH_TIGHT.0..SEARCH_TIGHT.1).contains(&t) {
            SEARCH_QUOTA_TIGHT
        } else {
            SEARCH_QUOTA
        }
    }

    fn profile_broken(t: f64) -> bool {
        (PROFILE_BROKEN.0..PROFILE_BROKEN.1).contains(&t)
    }

    /// What each endpoint is doing at `t`, for the view's header line.
    fn describe(&self, t: f64) -> String {
        let orders = if Script::orders_down(t) {
            "OUTAGE 503"
        } else if t >= ORDERS_OUTAGE.1 {
            "recovered"
        } else {
            "healthy"
        };
        let quota = Script::search_quota(t);
        // The server counts its quota in whole seconds, so a burst of the client's
        // bucket, or retries that waited out the same Retry-After, can meet a 429
        // even at the higher quota.
        let above = if quota < SEARCH_QUOTA {
            ", 429 above"
        } else {
            ", 429 on burst"
        };
        let profile = if Script::profile_broken(t) {
            "FAILING 500".to_owned()
        } else {
            format!("ok, tokens {}", secs(self.settings.real(TOKEN_TTL)))
        };
        // At most 74 characters, so the view's "now: " line fits 79 columns.
        format!("/orders {orders} | /search {quota}/s{above} | /profile {profile}")
    }

    /// The script's turning points, in script seconds, in order.
    fn turns() -> Vec<(f64, String)> {
        let mut turns = vec![
            (ORDERS_OUTAGE.0, "/orders goes down: 503".to_owned()),
            (ORDERS_OUTAGE.1, "/orders is back up".to_owned()),
            (
                SEARCH_TIGHT.0,
                format!(
                    "/search quota cut to {SEARCH_QUOTA_TIGHT}/s: 429 + Retry-After: 1 above it"
                ),
            ),
            (
                SEARCH_TIGHT.1,
                format!("/search quota back to {SEARCH_QUOTA}/s"),
            ),
            (PROFILE_BROKEN.0, "/profile fails: 500".to_owned()),
            (PROFILE_BROKEN.1, "/profile is back up".to_owned()),
        ];
        turns.sort_by(|a, b| a.0.total_cmp(&b.0));
        turns
    }
}

/// Notes each turn of the script as a moment, when it happens.
async fn narrate(script: Script, moments: Arc<Moments>) {
    for (at, text) in Script::turns() {
        let when = script.settings.real(at);
        script.clock.sleep_until(Instant::from_origin(when)).await;
        moments.push(when, format!("server: {text}"));
    }
}

// ---------------------------------------------------------------------------------
// The flaky server
// ---------------------------------------------------------------------------------

/// One answer of the server, sent after `delay`.
struct Reply {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: String,
    delay: Duration,
    /// Only the head and half the body go out, then the connection closes: a body
    /// cut off mid-way.
    cut: bool,
}

impl Reply {
    fn new(status: u16, body: impl Into<String>, delay_ms: u64) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: body.into(),
            delay: Duration::from_millis(delay_ms),
            cut: false,
        }
    }

    fn cut(mut self) -> Reply {
        self.cut = true;
        self
    }

    fn header(mut self, name: &'static str, value: impl Into<String>) -> Reply {
        self.headers.push((name, value.into()));
        self
    }

    fn encode(&self, request_id: u64) -> Vec<u8> {
        let reason = match self.status {
            200 => "OK",
            401 => "Unauthorized",
            404 => "Not Found",
            429 => "Too Many Requests",
            500 => "Internal Server Error",
            503 => "Service Unavailable",
            _ => "Unknown",
        };
        let mut head = format!(
            "HTTP/1.1 {} {reason}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nx-request-id: req-{request_id}\r\n",
            self.status,
            self.body.len()
        );
        for (name, value) in &self.headers {
            let _ = write!(head, "{name}: {value}\r\n");
        }
        head.push_str("\r\n");
        let mut bytes = head.into_bytes();
        let body = self.body.as_bytes();
        let sent = if self.cut { body.len() / 2 } else { body.len() };
        bytes.extend_from_slice(&body[..sent]);
        bytes
    }
}

/// The server's state: a small random generator, the search quota's window, the
/// tokens it issued, and what it answered.
struct ServerState {
    rng: u64,
    search_window: u64,
    search_count: u32,
    /// When token `n` (1-based) was issued, as time since the origin.
    tokens: Vec<Duration>,
    /// Per endpoint, per status: how many answers.
    seen: BTreeMap<&'static str, BTreeMap<u16, u64>>,
    /// The 200s of `/orders` so far, and how many of them were cut off mid-body.
    orders_ok: u64,
    cut: u64,
}

impl ServerState {
    /// A number in `[0, 1)` (xorshift64*; plenty for latencies).
    fn random(&mut self) -> f64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A latency between `lo` and `hi` ms.
    fn ms(&mut self, lo: u64, hi: u64) -> u64 {
        lo + (self.random() * (hi - lo) as f64) as u64
    }
}

struct FlakyServer {
    script: Script,
    state: Mutex<ServerState>,
    requests: AtomicU64,
}

impl FlakyServer {
    fn new(script: Script) -> FlakyServer {
        FlakyServer {
            script,
            state: Mutex::new(ServerState {
                rng: 0x9E37_79B9_7F4A_7C15,
                search_window: u64::MAX,
                search_count: 0,
                tokens: Vec::new(),
                seen: BTreeMap::new(),
                orders_ok: 0,
                cut: 0,
            }),
            requests: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ServerState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The answer to one request: the whole script is here.
    fn answer(&self, method: &str, target: &str, auth: Option<&str>) -> Reply {
        let t = self.script.now();
        let elapsed = self.script.clock.now().since_origin();
        let path = target.split('?').next().unwrap_or(target);
        let mut st = self.lock();
        let (endpoint, reply) = match (method, path) {
            ("GET", "/orders") => {
                let reply = if Script::orders_down(t) {
                    let ms = st.ms(5, 20);
                    Reply::new(503, "orders database unavailable", ms)
                } else {
                    let ms = if st.random() < 0.03 {
                        st.ms(250, 400)
                    } else {
                        st.ms(20, 80)
                    };
                    let reply = Reply::new(200, ORDERS_BODY, ms);
                    // One in 20 breaks off mid-body, as a dropped connection would.
                    st.orders_ok += 1;
                    if st.orders_ok % 20 == 7 {
                        st.cut += 1;
                        reply.cut()
                    } else {
                        reply
                    }
                };
                ("/orders", reply)
            }
            ("GET", "/search") => {
                let window = elapsed.as_secs();
                if window != st.search_window {
                    st.search_window = window;
                    st.search_count = 0;
                }
                st.search_count += 1;
                let reply = if st.search_count > Script::search_quota(t) {
                    Reply::new(429, "slow down", 2).header("retry-after", "1")
                } else {
                    let ms = if st.random() < 0.05 {
                        st.ms(400, 600)
                    } else {
                        st.ms(30, 150)
                    };
                    Reply::new(200, SEARCH_BODY, ms)
                };
                ("/search", reply)
            }
            ("GET", "/token") => {
                st.tokens.push(elapsed);
                let token = format!("tok-{}", st.tokens.len());
                ("/token", Reply::new(200, token, 30))
            }
            ("GET", "/profile") => {
                let ttl = self.script.settings.real(TOKEN_TTL);
                let valid = auth
                    .and_then(|a| a.strip_prefix("Bearer tok-"))
                    .and_then(|n| n.parse::<usize>().ok())
                    .and_then(|n| n.checked_sub(1))
                    .and_then(|i| st.tokens.get(i))
                    .is_some_and(|issued| elapsed.saturating_sub(*issued) < ttl);
                let ms = st.ms(10, 40);
                let reply = if Script::profile_broken(t) {
                    Reply::new(500, "profile store crashed", ms)
                } else if valid {
                    Reply::new(200, PROFILE_BODY, ms)
                } else {
                    Reply::new(401, "token expired", 2)
                        .header("www-authenticate", r#"Bearer error="invalid_token""#)
                };
                ("/profile", reply)
            }
            _ => ("other", Reply::new(404, "no such endpoint", 1)),
        };
        *st.seen
            .entry(endpoint)
            .or_default()
            .entry(reply.status)
            .or_default() += 1;
        reply
    }

    /// Per endpoint, per status: how many answers so far.
    fn seen(&self) -> BTreeMap<&'static str, BTreeMap<u16, u64>> {
        self.lock().seen.clone()
    }

    fn tokens_issued(&self) -> usize {
        self.lock().tokens.len()
    }

    fn bodies_cut(&self) -> u64 {
        self.lock().cut
    }
}

/// Accepts connections until the task is aborted; aborting it drops the `JoinSet`,
/// which aborts every connection.
async fn serve(listener: TcpListener, server: Arc<FlakyServer>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let server = Arc::clone(&server);
                    connections.spawn(async move {
                        // A broken connection only ends itself.
                        let _ = connection(stream, server).await;
                    });
                }
                // For example too many open files: wait a little and go on.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Serves HTTP/1.1 requests on one keep-alive connection.
async fn connection(stream: TcpStream, server: Arc<FlakyServer>) -> std::io::Result<()> {
    const MAX_LINE: usize = 8 * 1024;
    let _ = stream.set_nodelay(true);
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).await? == 0 || line.len() > MAX_LINE {
            return Ok(());
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_owned();
        let target = parts.next().unwrap_or_default().to_owned();
        let (mut auth, mut content_length, mut close) = (None, 0usize, false);
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).await? == 0 || header.len() > MAX_LINE {
                return Ok(());
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                let value = value.trim();
                match name.trim().to_ascii_lowercase().as_str() {
                    "authorization" => auth = Some(value.to_owned()),
                    "content-length" => content_length = value.parse().unwrap_or(0),
                    "connection" => close = value.eq_ignore_ascii_case("close"),
                    _ => {}
                }
            }
        }
        if content_length > 0 {
            let mut body = vec![0; content_length.min(1 << 20)];
            reader.read_exact(&mut body).await?;
        }
        let id = server.requests.fetch_add(1, Ordering::Relaxed) + 1;
        let reply = server.answer(&method, &target, auth.as_deref());
        tokio::time::sleep(reply.delay).await;
        write.write_all(&reply.encode(id)).await?;
        if close || reply.cut {
            return Ok(());
        }
    }
}

// ---------------------------------------------------------------------------------
// Observers: the two shipped ones, plus a tally for the summary and the ticker
// ---------------------------------------------------------------------------------

/// Notable moments (breaker changes, server phases, token fetches), time-stamped on
/// the shared clock, for the view's "recent" list and the plain-text log.
#[derive(Default)]
struct Moments(Mutex<Vec<(Duration, String)>>);

impl Moments {
    fn push(&self, at: Duration, text: String) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((at, text));
    }

    fn since(&self, from: usize) -> Vec<(Duration, String)> {
        let all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        all.get(from..).unwrap_or_default().to_vec()
    }

    fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// All-time counts per API that the health view does not keep.
#[derive(Debug, Default, Clone, Copy)]
struct ApiTotals {
    sends: u64,
    refused: u64,
    unauthorized: u64,
    /// 401s answered by a new token and the same request sent again: a `Started`
    /// right after a 401 of the same call, whose send went out (it ended in
    /// `Succeeded` or a sent `Failed`, not refused before sending).
    replays: u64,
    /// Token fetches that ended (`TokenFetchEnded`), and of them the ones that
    /// brought no token (failed or given up).
    token_fetches: u64,
    token_fetches_without_token: u64,
    /// The breaker opened from closed (an outage began).
    breaker_openings: u64,
    /// The half-open probe failed and the breaker opened again.
    failed_probes: u64,
    /// The breaker closed after it had opened.
    breaker_closings: u64,
    /// Whether the breaker is open, as its events tell.
    open: bool,
    /// Retries scheduled right after a 429, and the shortest and longest wait.
    retries_after_429: u64,
    shortest_after_429: Option<Duration>,
    longest_after_429: Option<Duration>,
}

/// Where a call is in a 401's replay.
#[derive(Debug, Clone, Copy)]
enum Replay {
    /// Its last send was answered 401.
    After401,
    /// The `Started` after that 401 came; its send has not ended yet.
    Started,
}

/// Counts sends and breaker changes, notes the changes as moments, and notes the
/// waits the client scheduled after a 429.
struct Totals {
    per_api: Mutex<HashMap<String, ApiTotals>>,
    /// Calls whose last failure was a 429, by API.
    after_429: Mutex<HashSet<(String, CallId)>>,
    /// Calls in the middle of a 401's replay, by API.
    replays: Mutex<HashMap<(String, CallId), Replay>>,
    moments: Arc<Moments>,
}

impl Totals {
    fn get(&self, api: &str) -> ApiTotals {
        let map = self.per_api.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(api).copied().unwrap_or_default()
    }
}

impl TransportObserver for Totals {
    fn on_event(&self, api: &str, event: &TransportEvent) {
        let mut note = None;
        {
            let mut map = self.per_api.lock().unwrap_or_else(PoisonError::into_inner);
            let totals = map.entry(api.to_owned()).or_default();
            let mut after_429 = self
                .after_429
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let mut replays = self.replays.lock().unwrap_or_else(PoisonError::into_inner);
            let key = event.call.map(|call| (api.to_owned(), call));
            // A replay is the next `Started` of a call after its 401; it counts once
            // its send went out (not refused before sending). A breaker change
            // between the two (the 401 of a probe closes the breaker) leaves the
            // stage as it is.
            let send_event = matches!(
                event.kind,
                EventKind::Started { .. }
                    | EventKind::Succeeded { .. }
                    | EventKind::Failed { .. }
                    | EventKind::Cancelled { .. }
            );
            let stage = key
                .as_ref()
                .filter(|_| send_event)
                .and_then(|key| replays.remove(key));
            match (stage, &event.kind) {
                (Some(Replay::After401), EventKind::Started { .. }) => {
                    replays.extend(key.clone().map(|key| (key, Replay::Started)));
                }
                (
                    Some(Replay::Started),
                    EventKind::Succeeded { .. } | EventKind::Failed { sent: true, .. },
                ) => {
                    totals.replays += 1;
                    note = Some(format!("{api}: 401, new token, request sent again"));
                }
                _ => {}
            }
            match &event.kind {
                EventKind::Succeeded { .. } | EventKind::Cancelled { .. } => totals.sends += 1,
                EventKind::Failed {
                    sent: true, error, ..
                } => {
                    totals.sends += 1;
                    let status = error.status().map(|s| s.as_u16());
                    if status == Some(401) {
                        totals.unauthorized += 1;
                        replays.extend(key.clone().map(|key| (key, Replay::After401)));
                    }
                    if let Some(key) = key {
                        if status == Some(429) {
                            after_429.insert(key);
                        } else {
                            after_429.remove(&key);
                        }
                    }
                }
                EventKind::Failed { sent: false, .. } => totals.refused += 1,
                EventKind::RetryScheduled { after, .. }
                    if key.is_some_and(|key| after_429.remove(&key)) =>
                {
                    totals.retries_after_429 += 1;
                    totals.shortest_after_429 =
                        Some(totals.shortest_after_429.map_or(*after, |d| d.min(*after)));
                    totals.longest_after_429 =
                        Some(totals.longest_after_429.map_or(*after, |d| d.max(*after)));
                }
                // Transitions are heard in the order they reach the observer, which
                // for two close together (a slow 200 closing the breaker just as it
                // opens) may not be the order they happened in.
                EventKind::BreakerOpened { cooldown } if totals.open => {
                    totals.failed_probes += 1;
                    note = Some(format!(
                        "{api}: probe failed, breaker OPEN again for {}",
                        secs(*cooldown)
                    ));
                }
                EventKind::BreakerOpened { cooldown } => {
                    totals.open = true;
                    totals.breaker_openings += 1;
                    note = Some(format!("{api}: breaker OPENED for {}", secs(*cooldown)));
                }
                EventKind::BreakerClosed => {
                    totals.open = false;
                    totals.breaker_closings += 1;
                    note = Some(format!("{api}: an answer came, breaker closed"));
                }
                EventKind::BreakerReset => {
                    totals.open = false;
                    totals.breaker_closings += 1;
                    note = Some(format!("{api}: breaker reset by hand"));
                }
                EventKind::TokenFetchEnded { outcome, .. } => {
                    totals.token_fetches += 1;
                    let fetched = matches!(outcome, TokenFetchOutcome::Fetched { .. });
                    totals.token_fetches_without_token += u64::from(!fetched);
                }
                _ => {}
            }
        }
        if let Some(text) = note {
            self.moments.push(event.at.since_origin(), text);
        }
    }
}

// ---------------------------------------------------------------------------------
// The APIs and their workers
// ---------------------------------------------------------------------------------

/// What the view asks of a client, whatever its token source.
trait ApiClient: Send + Sync {
    fn breaker(&self) -> BreakerNow;
}

impl<A> ApiClient for ResilientClient<ReqwestTransport, TokioRuntime, A>
where
    A: TokenSource + Send + Sync,
{
    fn breaker(&self) -> BreakerNow {
        match self.breaker_state() {
            BreakerState::Open { until } => BreakerNow::Open {
                left: until.saturating_duration_since(self.runtime().now()),
            },
            BreakerState::HalfOpen => BreakerNow::HalfOpen,
            _ => BreakerNow::Closed,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum BreakerNow {
    Closed,
    Open { left: Duration },
    HalfOpen,
}

/// How the calls of one API ended, as the workers saw them.
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    /// Successful calls whose body was not the API's whole body (never, if reads
    /// are whole).
    partial: AtomicU64,
    failed: AtomicU64,
    abandoned: AtomicU64,
    reasons: Mutex<BTreeMap<String, u64>>,
}

impl Tally {
    fn failed(&self, error: &ClientError) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        let reason = match error.status() {
            Some(status) => format!("HTTP {}", status.as_u16()),
            None => error.kind_name().replace('_', " "),
        };
        *self
            .reasons
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(reason)
            .or_default() += 1;
    }
}

/// One API as the view and the summary see it.
struct Api {
    name: &'static str,
    endpoint: &'static str,
    about: String,
    client: Arc<dyn ApiClient>,
    tally: Arc<Tally>,
}

/// Starts `workers` tasks that make calls with `call` until `stop_at`, pausing `think`
/// between calls. A call still running at `stop_at` is dropped, which cancels it.
/// Each call reads its body (`execute_read`), which must be `whole`.
fn spawn_workers<F, Fut>(
    tasks: &mut JoinSet<()>,
    workers: u32,
    think: Duration,
    stop_at: tokio::time::Instant,
    tally: &Arc<Tally>,
    whole: &'static str,
    call: F,
) where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<ReadResponse<ReqwestResponse>, ClientError>> + Send + 'static,
{
    for i in 0..workers {
        let call = call.clone();
        let tally = Arc::clone(tally);
        let stagger = Duration::from_millis(40) * i;
        tasks.spawn(async move {
            tokio::time::sleep(stagger).await;
            while tokio::time::Instant::now() < stop_at {
                match tokio::time::timeout_at(stop_at, call()).await {
                    Err(_) => {
                        tally.abandoned.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    Ok(Ok(read)) => {
                        tally.ok.fetch_add(1, Ordering::Relaxed);
                        if read.body() != whole.as_bytes() {
                            tally.partial.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(Err(error)) => tally.failed(&error),
                }
                let next = tokio::time::Instant::now() + think;
                tokio::time::sleep_until(next.min(stop_at)).await;
            }
        });
    }
}

/// The token source of profile-api: asks the server's `/token` for a new token.
async fn fetch_token(
    http: reqwest::Client,
    url: String,
) -> Result<(HeaderName, HeaderValue), AuthError> {
    let response = http
        .get(&url)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(reqwest::Error::without_url)?;
    let token = response.text().await.map_err(reqwest::Error::without_url)?;
    let token = token.trim();
    Ok((
        AUTHORIZATION,
        HeaderValue::try_from(format!("Bearer {token}"))?,
    ))
}

/// A `reqwest::Client` for one API: the adapter's recommended settings (read timeout,
/// no hidden retries), and no proxy, since the server is on loopback.
fn http_client() -> Result<reqwest::Client, BoxError> {
    Ok(ReqwestTransport::default_client_builder()
        .no_proxy()
        .build()?)
}

// ---------------------------------------------------------------------------------
// The view
// ---------------------------------------------------------------------------------

struct View {
    settings: Settings,
    script: Script,
    health: Arc<HealthObserver>,
    /// The demo's own counts, from the events too.
    totals: Arc<Totals>,
    apis: Vec<Api>,
    moments: Arc<Moments>,
    base: String,
    log: Option<PathBuf>,
}

const RESET: &str = "\x1b[0m";
const BOLD: &str = "\x1b[1m";
const DIM: &str = "\x1b[2m";
const RED: &str = "\x1b[31m";
const GREEN: &str = "\x1b[32m";
const YELLOW: &str = "\x1b[33m";

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// Writes `text` to stdout. A closed pipe is no panic: once the reader has gone
/// (`demo | head`), the demo ends there with status 0, as a filter would.
fn say(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let written = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush());
    if written.is_err_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) {
        std::process::exit(0);
    }
}

/// The widest line the live view draws: it fits an 80-column terminal.
const WIDTH: usize = 79;

/// The most lines the live view draws.
const HEIGHT: usize = 19;

/// Whether the terminal on stdout is at least `WIDTH + 1` columns by `HEIGHT` lines
/// (the last column stays free, so a full line never wraps). Unknown: no.
#[cfg(unix)]
fn terminal_fits() -> bool {
    rustix::termios::tcgetwinsize(std::io::stdout())
        .is_ok_and(|size| usize::from(size.ws_col) > WIDTH && usize::from(size.ws_row) >= HEIGHT)
}

/// Elsewhere the size is not read: plain snapshots.
#[cfg(not(unix))]
fn terminal_fits() -> bool {
    false
}

/// `text` cut to [`WIDTH`] characters (before any colour is added).
fn fit(text: &str) -> String {
    fit_to(text, WIDTH)
}

/// `text` cut to `width` characters.
fn fit_to(text: &str, width: usize) -> String {
    text.chars().take(width).collect()
}

/// How many characters of the error a line keeps at least, notes or not.
const ERROR_AT_LEAST: usize = 16;

/// The line under an API's row, in [`WIDTH`] characters: its last error, then its
/// notes (the tokens fetched, a quiet spell), each as a long and a short form. The
/// whole error with every note long if they fit; else the notes short, from the
/// last, until the whole error fits; else the error cut, ending in `…`, keeping at
/// least [`ERROR_AT_LEAST`] characters, and a note that still does not fit whole
/// left out, from the last. A note is never cut: a long 401 text once pushed the
/// token count off the line for the rest of the run.
fn error_line(last: &str, notes: &[(&str, &str)]) -> String {
    let lead = format!("{:<11} last error: ", "");
    let width = |text: &str| text.chars().count();
    let notes_width = |notes: &[&str]| notes.iter().map(|n| 2 + width(n)).sum::<usize>();
    let fits = |error: usize, notes: &[&str]| width(&lead) + error + notes_width(notes) <= WIDTH;
    let mut chosen: Vec<&str> = notes.iter().map(|(long, _)| *long).collect();
    for (i, (_, short)) in notes.iter().enumerate().rev() {
        if fits(width(last), &chosen) {
            break;
        }
        chosen[i] = short;
    }
    while !chosen.is_empty() && !fits(width(last).min(ERROR_AT_LEAST), &chosen) {
        chosen.pop();
    }
    let room = WIDTH.saturating_sub(width(&lead) + notes_width(&chosen));
    let mut line = lead;
    if width(last) <= room {
        line.push_str(last);
    } else {
        line.push_str(&fit_to(last, room.saturating_sub(1)));
        line.push('…');
    }
    for note in chosen {
        line.push_str("; ");
        line.push_str(note);
    }
    fit(&line)
}

impl View {
    fn paint(&self, style: &str, text: &str) -> String {
        if self.settings.color {
            format!("{style}{text}{RESET}")
        } else {
            text.to_owned()
        }
    }

    fn now(&self) -> Instant {
        self.script.clock.now()
    }

    /// The cooldown of the opening the events last told of, while they say open.
    fn cooldown(health: Option<&ApiHealth>) -> Option<Duration> {
        match health?.breaker {
            BreakerView::Open { cooldown, .. } => Some(cooldown),
            _ => None,
        }
    }

    /// The window's median, 99th percentile and slowest latency in milliseconds,
    /// once it holds a send.
    fn latency(health: Option<&ApiHealth>) -> Option<(u64, u64, u64)> {
        health.and_then(|h| Some((h.p50_latency_ms?, h.p99_latency_ms?, h.max_latency_ms?)))
    }

    /// The breaker cell: state from `breaker_state()`, the cooldown from the events.
    fn breaker_cell(breaker: BreakerNow, health: Option<&ApiHealth>) -> (String, &'static str) {
        match breaker {
            BreakerNow::Closed => ("closed".to_owned(), GREEN),
            BreakerNow::HalfOpen => ("half-open (probe)".to_owned(), YELLOW),
            BreakerNow::Open { left } => {
                // Time left of the cooldown, as `OPEN 3.5/5.0s`.
                let of = match View::cooldown(health) {
                    Some(cooldown) => format!("/{}", secs(cooldown)),
                    _ => " left".to_owned(),
                };
                let left = secs(left);
                let left = if of.starts_with('/') {
                    left.trim_end_matches('s').to_owned()
                } else {
                    left
                };
                (format!("OPEN {left}{of}"), RED)
            }
        }
    }

    fn success_cell(health: Option<&ApiHealth>) -> (String, &'static str) {
        match health.and_then(|h| h.success_rate.map(|r| (r, h))) {
            Some((rate, h)) => {
                let style = if rate >= 0.95 {
                    GREEN
                } else if rate >= 0.5 {
                    YELLOW
                } else {
                    RED
                };
                let text = format!(
                    "{:>3.0}% {}/{}",
                    rate * 100.0,
                    h.successes_in_window,
                    h.sends_in_window
                );
                (text, style)
            }
            None => ("-".to_owned(), DIM),
        }
    }

    fn latency_cell(health: Option<&ApiHealth>) -> String {
        match View::latency(health) {
            Some((p50, p99, _)) => format!("{p50} / {p99}"),
            None => "-".to_owned(),
        }
    }

    /// The last error and how long ago it came; after a 401, how many 401s a new
    /// token answered so far (the replays the events show).
    fn last_error(&self, health: Option<&ApiHealth>, replays: u64) -> String {
        match health.and_then(|h| h.last_error.as_ref()) {
            Some(last) => format!(
                "{} ({} ago{})",
                last.error,
                secs(self.now().saturating_duration_since(last.at)),
                if last.error.status().is_some_and(|s| s.as_u16() == 401) {
                    format!("; {replays} replayed with a new token")
                } else {
                    String::new()
                }
            ),
            None => "none".to_owned(),
        }
    }

    /// For an API with a token source, from `TokenFetchEnded`: the tokens fetched,
    /// how long ago the last, and the fetches that brought none; the long note and
    /// the short one, for a line too full for the long.
    fn token_note(&self, health: Option<&ApiHealth>) -> Option<(String, String)> {
        let h = health?;
        let missed = h.token_fetches_failed + h.token_fetches_abandoned;
        if h.tokens_fetched + missed == 0 {
            return None;
        }
        let mut note = format!("tokens {}", h.tokens_fetched);
        let mut short = note.clone();
        if let Some(at) = h.last_token_fetched_at {
            let last = self.now().saturating_duration_since(at);
            note.push_str(&format!(" (last {} ago)", secs(last)));
        }
        if missed > 0 {
            note.push_str(&format!(", {missed} fetches brought none"));
            short.push_str(&format!(", {missed} missed"));
        }
        Some((note, short))
    }

    /// With no events for a while (calls waiting out an open breaker send nothing),
    /// say so: the window keeps moving (`snapshots_at`), so its figures thin out.
    /// The long note and the short one, for a line too full for the long.
    fn quiet(&self, health: Option<&ApiHealth>) -> Option<(String, String)> {
        let idle = self.now().saturating_duration_since(health?.updated_at);
        (idle >= Duration::from_secs(1)).then(|| {
            (
                format!("no events for {}: the window empties", secs(idle)),
                format!("quiet {}", secs(idle)),
            )
        })
    }

    /// The whole view, one string per line.
    fn frame(&self) -> Vec<String> {
        let now = self.now().since_origin();
        let t = self.script.now().min(RUN);
        let health: HashMap<Arc<str>, ApiHealth> =
            self.health.snapshots_at(self.now()).into_iter().collect();
        let mut lines = Vec::new();
        // Every line fits WIDTH columns, and the frame HEIGHT lines, so an 80 x 24
        // terminal shows all of it without scrolling (colour is added after the cut).
        let title = format!(
            "vantage-api-pool demo  t = {} of {}{}   server {}",
            secs(now.min(self.settings.run_for())),
            secs(self.settings.run_for()),
            if self.settings.quick {
                " (--quick)"
            } else {
                ""
            },
            self.base.trim_start_matches("http://")
        );
        lines.push(self.paint(BOLD, &fit(&title)));
        lines.push(fit(&format!("now: {}", self.script.describe(t))));
        let window = format!("OK ({:.0}s)", self.settings.window().as_secs_f64());
        let refused = format!("REF {:.0}s", self.settings.window().as_secs_f64());
        lines.push(self.paint(
            BOLD,
            &format!(
                "{:<11} {:<17} {:>4} {:<14} {:>13} {:>7} {:>5}",
                "API", "BREAKER left/cd", "INFL", window, "P50/P99 ms", refused, "RETRY"
            ),
        ));
        for api in &self.apis {
            let h = health.get(api.name);
            let (breaker, breaker_style) = View::breaker_cell(api.client.breaker(), h);
            let (success, success_style) = View::success_cell(h);
            lines.push(format!(
                "{:<11} {} {:>4} {} {:>13} {:>7} {:>5}",
                api.name,
                self.paint(breaker_style, &format!("{:<17}", fit_to(&breaker, 17))),
                h.map_or(0, |h| h.in_flight),
                self.paint(success_style, &format!("{:<14}", fit_to(&success, 14))),
                fit_to(&View::latency_cell(h), 13),
                h.map_or(0, |h| h.refused_in_window),
                h.map_or(0, |h| h.retries),
            ));
            lines.push(self.paint(DIM, &fit(&format!("{:<11} {}", "", api.about))));
            let last = self.last_error(h, self.totals.get(api.name).replays);
            let notes: Vec<(String, String)> = self
                .token_note(h)
                .into_iter()
                .chain(self.quiet(h))
                .collect();
            let notes: Vec<(&str, &str)> = notes.iter().map(|(l, s)| (&**l, &**s)).collect();
            lines.push(error_line(&last, &notes));
        }
        lines.push(String::new());
        lines.push(self.paint(BOLD, "recent"));
        let count = self.moments.len();
        for (at, text) in self.moments.since(count.saturating_sub(4)) {
            lines.push(fit(&format!("  {:>6}  {text}", secs(at))));
        }
        if let Some(log) = &self.log {
            lines.push(self.paint(
                DIM,
                &fit(&format!(
                    "tracing events (DEBUG and up) -> {}",
                    log.display()
                )),
            ));
        }
        lines
    }

    /// Three plain lines per API, for logs and CI (and a terminal too small for the
    /// live view): the breaker and the sends in flight; the figures over the window
    /// (sends, and the calls they served); the retries so far and the last error.
    fn snapshot_lines(&self) -> Vec<String> {
        let now = self.now().since_origin();
        let w = self.settings.window().as_secs();
        let health: HashMap<Arc<str>, ApiHealth> =
            self.health.snapshots_at(self.now()).into_iter().collect();
        let mut lines = Vec::new();
        for api in &self.apis {
            let h = health.get(api.name);
            let breaker = match (api.client.breaker(), View::cooldown(h)) {
                (BreakerNow::Open { left }, Some(cooldown)) => {
                    format!("OPEN {} left of {}", secs(left), secs(cooldown))
                }
                (other, _) => View::breaker_cell(other, h).0,
            };
            lines.push(format!(
                "[{:>6}] {:<12} breaker {breaker}; {} in flight",
                secs(now),
                api.name,
                h.map_or(0, |h| h.in_flight),
            ));
            let (success, _) = View::success_cell(h);
            let latency = match View::latency(h) {
                Some((p50, p99, max)) => format!("p50 {p50} ms, p99 {p99} ms, max {max} ms"),
                None => "-".to_owned(),
            };
            // What the callers saw: calls, retries and waits included.
            let calls =
                h.and_then(|h| Some((h.call_success_rate?, h.p50_call_ms?, h.p99_call_ms?, h)));
            let calls = match calls {
                Some((rate, p50, p99, h)) => format!(
                    "{:.0}% {}/{}, waits p50 {p50} ms, p99 {p99} ms",
                    rate * 100.0,
                    h.call_successes_in_window,
                    h.calls_in_window
                ),
                None => "-".to_owned(),
            };
            // What the window covers: less than the window while the run is younger.
            let span = h.map_or(w.to_string(), |h| {
                let covered = h.covered.as_secs_f64();
                if covered + 0.05 < w as f64 {
                    format!("{covered:.1}")
                } else {
                    w.to_string()
                }
            });
            lines.push(format!(
                "{:9}last {span}s: ok {}; latency {latency}; refused {}; calls ok {calls}",
                "",
                success.trim(),
                h.map_or(0, |h| h.refused_in_window),
            ));
            let last = self.last_error(h, self.totals.get(api.name).replays);
            let mut tail = format!(
                "{:9}retries so far {}; last error: {last}",
                "",
                h.map_or(0, |h| h.retries)
            );
            if let Some((note, _)) = self.token_note(h) {
                tail.push_str("; ");
                tail.push_str(&note);
            }
            if let Some(idle) = h.map(|h| self.now().saturating_duration_since(h.updated_at))
                && idle >= Duration::from_secs(1)
            {
                tail.push_str(&format!("; quiet {}", secs(idle)));
            }
            lines.push(tail);
        }
        lines
    }
}

/// Redraws the view (or prints snapshots and moments) until `stop_at`.
async fn dashboard(view: Arc<View>, stop_at: tokio::time::Instant) {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let snapshot_every = if view.settings.quick { 4 } else { 8 };
    let mut printed = 0;
    let mut ticks = 0u64;
    if view.settings.live {
        say("\x1b[2J");
    }
    while tokio::time::Instant::now() < stop_at {
        tick.tick().await;
        ticks += 1;
        if view.settings.live {
            draw(&view);
        } else {
            let mut out = String::new();
            for (at, text) in view.moments.since(printed) {
                printed += 1;
                let _ = writeln!(out, "[{:>6}] * {text}", secs(at));
            }
            if ticks.is_multiple_of(snapshot_every) {
                for line in view.snapshot_lines() {
                    let _ = writeln!(out, "{line}");
                }
            }
            say(&out);
        }
    }
}

/// Redraws the view in place: cursor home, each line cleared to its end, the rest of
/// the screen cleared, all in one write.
fn draw(view: &View) {
    let mut out = String::from("\x1b[H");
    for (i, line) in view.frame().iter().enumerate() {
        if i > 0 {
            // No newline after the last line: a frame as tall as the screen must not
            // scroll it.
            out.push('\n');
        }
        out.push_str(line);
        out.push_str("\x1b[K");
    }
    out.push_str("\x1b[J");
    say(&out);
}

// ---------------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------------

/// Sets up a `tracing` subscriber that writes to a log file in the temp directory.
fn log_to_file() -> Result<PathBuf, BoxError> {
    // A file per run (two runs at once must not count each other's lines), made
    // new: never one that was there, nor a link someone left at that name. A name
    // taken (a pid reused, in a container say) moves on to the next.
    let (path, file) = {
        let mut n = 0u32;
        loop {
            let name = match n {
                0 => format!("vantage-api-pool-demo-{}.log", std::process::id()),
                n => format!("vantage-api-pool-demo-{}-{n}.log", std::process::id()),
            };
            let path = std::env::temp_dir().join(name);
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(file) => break (path, file),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 100 => n += 1,
                Err(e) => return Err(e.into()),
            }
        }
    };
    // Only the pool's events (hyper and reqwest log too): the log is what the
    // TracingObserver wrote, and the summary counts its lines.
    let subscriber = tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_writer(Mutex::new(file)))
        .with(tracing_subscriber::filter::Targets::new().with_target(
            "vantage_api_pool",
            tracing_subscriber::filter::LevelFilter::DEBUG,
        ));
    tracing::subscriber::set_global_default(subscriber)?;
    Ok(path)
}

async fn run(settings: Settings, log: Option<PathBuf>) -> Result<bool, BoxError> {
    // One clock for everything: the clients' runtimes are clones of it (clones share
    // the origin), so the events' `at` of every API, the script and the view agree.
    let clock = TokioRuntime::new();
    let script = Script {
        settings,
        clock: clock.clone(),
    };

    // The server.
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let server = Arc::new(FlakyServer::new(script.clone()));
    let server_task = tokio::spawn(serve(listener, Arc::clone(&server)));

    // The observers: both shipped ones, and the demo's tally, behind one `Fanout`.
    let moments = Arc::new(Moments::default());
    let health = Arc::new(HealthObserver::new(settings.window()));
    let totals = Arc::new(Totals {
        per_api: Mutex::new(HashMap::new()),
        after_429: Mutex::new(HashSet::new()),
        replays: Mutex::new(HashMap::new()),
        moments: Arc::clone(&moments),
    });
    let observer: Arc<dyn TransportObserver> = Arc::new(
        Fanout::default()
            .with(health.clone())
            .with(Arc::new(TracingObserver::new()))
            .with(totals.clone()),
    );

    // orders-api: someone is waiting, so retry until dropped and wait out the breaker.
    // `ResilientClient::builder(ReqwestTransport::new(http), TokioRuntime::new())` is
    // what `ReqwestTransport::tokio_builder(http)` does in one call; here the runtime
    // is a clone of the shared clock.
    let builder = ResilientClient::builder(ReqwestTransport::new(http_client()?), clock.clone())
        .max_parallel(4)
        .observer("orders-api", Arc::clone(&observer));
    let orders = if settings.quick {
        // The default breaker's timing, five times faster.
        builder.breaker(5, settings.real(5.0), settings.real(60.0))
    } else {
        builder.default_breaker()
    }
    .build()?;

    // search-api: bounded retries, and a rate limit of our own.
    let search = ResilientClient::builder(ReqwestTransport::new(http_client()?), clock.clone())
        .max_parallel(4)
        .rate_limit(8.0)
        .default_breaker()
        .observer("search-api", Arc::clone(&observer))
        .build()?;
    let search_policy = CallPolicy::bounded(RetryPolicy::new(
        2,
        Duration::from_millis(200),
        Duration::from_secs(2),
    )?);

    // profile-api: nobody waits (one attempt, fail fast), with a token from /token.
    let token_http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()?;
    let token_url = format!("{base}/token");
    let tokens = token_fn(move || fetch_token(token_http.clone(), token_url.clone()));
    let profile = ResilientClient::builder(ReqwestTransport::new(http_client()?), clock.clone())
        .max_parallel(2)
        .breaker(3, settings.real(2.0), settings.real(8.0))
        .auth(tokens)
        .observer("profile-api", Arc::clone(&observer))
        .build()?;
    let profile_policy = CallPolicy::background();

    let tallies: [Arc<Tally>; 3] = Default::default();
    let apis = vec![
        Api {
            name: "orders-api",
            endpoint: "/orders",
            about: format!(
                "essential (retry until dropped), 4 parallel, breaker 5 x {}",
                secs(settings.real(5.0))
            ),
            client: Arc::new(orders.clone()),
            tally: Arc::clone(&tallies[0]),
        },
        Api {
            name: "search-api",
            endpoint: "/search",
            about: "bounded (2 retries, Retry-After honoured), 8/s rate limit".to_owned(),
            client: Arc::new(search.clone()),
            tally: Arc::clone(&tallies[1]),
        },
        Api {
            name: "profile-api",
            endpoint: "/profile",
            about: format!(
                "background (1 attempt, fail fast), token auth, breaker 3 x {}",
                secs(settings.real(2.0))
            ),
            client: Arc::new(profile.clone()),
            tally: Arc::clone(&tallies[2]),
        },
    ];

    // The traffic.
    let start = tokio::time::Instant::now();
    let stop_at = start + settings.run_for();
    let mut workers = JoinSet::new();
    let orders_url = format!("{base}/orders");
    spawn_workers(
        &mut workers,
        4,
        Duration::from_millis(150),
        stop_at,
        &tallies[0],
        ORDERS_BODY,
        move || {
            let (client, url) = (orders.clone(), orders_url.clone());
            async move {
                let policy = CallPolicy::essential();
                client
                    .execute_read_with(&policy, BODY_LIMIT, |http| http.get(&url))
                    .await
            }
        },
    );
    let search_url = format!("{base}/search");
    spawn_workers(
        &mut workers,
        3,
        Duration::ZERO,
        stop_at,
        &tallies[1],
        SEARCH_BODY,
        move || {
            let (client, url, policy) = (search.clone(), search_url.clone(), search_policy.clone());
            async move {
                client
                    .execute_read_with(&policy, BODY_LIMIT, |http| http.get(&url))
                    .await
            }
        },
    );
    let profile_url = format!("{base}/profile");
    spawn_workers(
        &mut workers,
        2,
        Duration::from_millis(200),
        stop_at,
        &tallies[2],
        PROFILE_BODY,
        move || {
            let (client, url, policy) =
                (profile.clone(), profile_url.clone(), profile_policy.clone());
            async move {
                client
                    .execute_read_with(&policy, BODY_LIMIT, |http| http.get(&url))
                    .await
            }
        },
    );

    // The view, until the traffic stops.
    let view = Arc::new(View {
        settings,
        script,
        health,
        totals: Arc::clone(&totals),
        apis,
        moments,
        base: base.clone(),
        log: log.clone(),
    });
    if !settings.live {
        say(&format!(
            "vantage-api-pool demo: flaky server on {base}, {} of traffic{}\n",
            secs(settings.run_for()),
            if settings.quick { " (--quick)" } else { "" }
        ));
        if settings.small_terminal {
            say(&format!(
                "(the live view needs a terminal of {} x {HEIGHT} at least: plain snapshots instead)\n",
                WIDTH + 1
            ));
        }
        if let Some(log) = &log {
            say(&format!(
                "tracing events (DEBUG and up) -> {}\n",
                log.display()
            ));
        }
    }
    let narrator = tokio::spawn(narrate(view.script.clone(), Arc::clone(&view.moments)));
    let dashboard_task = tokio::spawn(dashboard(Arc::clone(&view), stop_at));

    // Workers stop at `stop_at` (a call still running is dropped); give them a moment
    // to read their last bodies, then abort whatever is left.
    tokio::time::sleep_until(stop_at).await;
    let drained = tokio::time::timeout(Duration::from_secs(3), async {
        while workers.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        workers.abort_all();
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), dashboard_task).await;
    if settings.live {
        draw(&view);
    } else {
        let mut out = String::from("final:\n");
        for line in view.snapshot_lines() {
            out.push_str(&line);
            out.push('\n');
        }
        say(&out);
    }
    narrator.abort();
    server_task.abort();

    Ok(summary(
        &view,
        &server,
        &totals,
        log.as_deref(),
        start.elapsed(),
    ))
}

/// Prints the summary; returns whether the story happened: every API had a
/// successful call, the orders outage opened its breaker and it is closed again, the
/// search quota answered 429 and was retried, no sooner than the server asked, and
/// profile-api refreshed its token after a 401.
fn summary(
    view: &View,
    server: &FlakyServer,
    totals: &Totals,
    log: Option<&std::path::Path>,
    took: Duration,
) -> bool {
    let seen = server.seen();
    let health: HashMap<Arc<str>, ApiHealth> = view.health.snapshots().into_iter().collect();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n{} after {} (server stopped)",
        view.paint(BOLD, "summary"),
        secs(took)
    );
    let _ = writeln!(
        out,
        "{:<11} {:>5} {:>6} {:>7} {:>5} {:>6} {:>7} {:>7} {:>6} {:>6}",
        "API",
        "ok",
        "failed",
        "dropped",
        "sends",
        "server",
        "retries",
        "refused",
        "opened",
        "reopen"
    );
    let mut all_ok = true;
    for api in &view.apis {
        let t = totals.get(api.name);
        let h = health.get(api.name);
        let ok = api.tally.ok.load(Ordering::Relaxed);
        all_ok &= ok > 0;
        let server_saw: u64 = seen.get(api.endpoint).map_or(0, |s| s.values().sum());
        let _ = writeln!(
            out,
            "{:<11} {:>5} {:>6} {:>7} {:>5} {:>6} {:>7} {:>7} {:>6} {:>6}",
            api.name,
            ok,
            api.tally.failed.load(Ordering::Relaxed),
            api.tally.abandoned.load(Ordering::Relaxed),
            t.sends,
            server_saw,
            h.map_or(0, |h| h.retries),
            t.refused,
            t.breaker_openings,
            t.failed_probes,
        );
    }
    let _ = writeln!(
        out,
        "  ok/failed/dropped: calls (dropped: still running when the traffic stopped);\n  \
         sends: by the client, server: requests the server saw; refused: passes turned\n  \
         back with nothing sent (breaker open, auth, time), not counted in sends;\n  \
         opened: the breaker opened from closed; reopen: a probe failed, it opened\n  \
         again, its cooldown doubled"
    );
    let search = totals.get("search-api");
    if let (Some(shortest), Some(longest)) = (search.shortest_after_429, search.longest_after_429) {
        let _ = writeln!(
            out,
            "retry-after      search-api scheduled waits of {} to {} for the {} retries\n                 it made after a 429 (asked: 1 s; jitter adds up to 25 %)",
            secs(shortest),
            secs(longest),
            search.retries_after_429,
        );
    }
    for (i, api) in view.apis.iter().enumerate() {
        let reasons = api
            .tally
            .reasons
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let list = reasons
            .iter()
            .map(|(reason, n)| format!("{reason} x{n}"))
            .collect::<Vec<_>>();
        let list = if list.is_empty() {
            "none".to_owned()
        } else {
            list.join(", ")
        };
        let label = if i == 0 { "failed calls" } else { "" };
        let _ = writeln!(out, "{label:<16} {:<12} {list}", api.name);
    }
    for (i, (endpoint, statuses)) in seen.iter().enumerate() {
        let statuses = statuses
            .iter()
            .map(|(status, n)| format!("{status} x{n}"))
            .collect::<Vec<_>>()
            .join(", ");
        let label = if i == 0 { "server answered" } else { "" };
        let _ = writeln!(out, "{label:<16} {endpoint:<12} {statuses}");
    }
    let cut = server.bodies_cut();
    let partial: u64 = view
        .apis
        .iter()
        .map(|api| api.tally.partial.load(Ordering::Relaxed))
        .sum();
    let _ = writeln!(
        out,
        "bodies           {cut} of the /orders 200s were cut off mid-body; each was read\n                 \
         again (execute_read, a GET); calls that got a part of a body: {partial}",
    );
    let fetches = server.tokens_issued();
    let profile = totals.get("profile-api");
    let _ = writeln!(
        out,
        "auth             {fetches} tokens from /token (first use + {} refreshes);\n                 \
         {} sends answered 401, {} of them replayed with a new token;\n                 \
         the observer heard {} token fetches end ({} without a token)",
        fetches.saturating_sub(1),
        profile.unauthorized,
        profile.replays,
        profile.token_fetches,
        profile.token_fetches_without_token,
    );
    let _ = writeln!(out, "timeline:");
    let moments = view.moments.since(0);
    let shown = 30;
    for (at, text) in moments.iter().take(shown) {
        let _ = writeln!(out, "  {:>6}  {text}", secs(*at));
    }
    if moments.len() > shown {
        let _ = writeln!(out, "  ... and {} more", moments.len() - shown);
    }
    match log {
        Some(path) => {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let lines = text.lines().count();
            let warns = text.lines().filter(|l| l.contains(" WARN ")).count();
            let _ = writeln!(
                out,
                "tracing log: {lines} events, {warns} at WARN, in\n  {}\n  for example:",
                path.display(),
            );
            // One line of each kind the story is about, without the timestamp.
            for kind in ["event=\"breaker_opened\"", "status=429", "status=401"] {
                if let Some(line) = text.lines().find(|l| l.contains(kind)) {
                    let line = line.split_once("  ").map_or(line, |(_, rest)| rest);
                    let mut sample: String = line.chars().take(74).collect();
                    if sample.len() < line.len() {
                        sample.push_str("...");
                    }
                    let _ = writeln!(out, "  {sample}");
                }
            }
        }
        None => {
            let _ = writeln!(out, "tracing log: none (the log file could not be created)");
        }
    }
    let search_429 = seen
        .get("/search")
        .and_then(|statuses| statuses.get(&429))
        .copied()
        .unwrap_or(0);
    let search_retries = health.get("search-api").map_or(0, |h| h.retries);
    let orders = totals.get("orders-api");
    let story = [
        (all_ok, "every API had a successful call"),
        (
            orders.breaker_openings > 0,
            "the orders outage opened its breaker",
        ),
        (
            // The state from the breaker itself: transitions reach observers after
            // the breaker's lock is released, so two close together may be heard
            // out of order (the labels "opened" and "reopen" come from that order).
            orders.breaker_closings > 0
                && view
                    .apis
                    .iter()
                    .find(|api| api.name == "orders-api")
                    .is_some_and(|api| matches!(api.client.breaker(), BreakerNow::Closed)),
            "the orders breaker closed once the API was back",
        ),
        (
            search_429 > 0 && search_retries > 0,
            "the search quota answered 429 and the client retried",
        ),
        (
            search.retries_after_429 > 0
                && search
                    .shortest_after_429
                    .is_some_and(|d| d >= Duration::from_secs(1)),
            "every retry after a 429 was scheduled at least the server's Retry-After later",
        ),
        (
            totals.get("profile-api").unauthorized > 0 && totals.get("profile-api").replays > 0,
            "a 401 made profile-api refresh its token",
        ),
        (
            cut > 0 && partial == 0,
            "bodies cut off mid-way were read again: every call got a whole body",
        ),
    ];
    for (happened, what) in story {
        if !happened {
            let _ = writeln!(out, "demo: did not happen: {what}");
        }
    }
    let all_ok = story.iter().all(|(happened, _)| *happened);
    say(&out);
    all_ok
}

fn main() -> ExitCode {
    let settings = match Settings::from_env() {
        Ok(settings) => settings,
        Err(message) if message.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("demo: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };

    // The watchdog: whatever happens, the demo ends.
    let limit = settings.hard_deadline();
    let _watchdog = std::thread::spawn(move || {
        std::thread::sleep(limit);
        eprintln!("\ndemo: still running after {}; giving up", secs(limit));
        std::process::exit(3);
    });

    let log = match log_to_file() {
        Ok(path) => Some(path),
        Err(error) => {
            eprintln!("demo: no tracing log ({error}); going on without it");
            None
        }
    };

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("demo: cannot start tokio: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(settings, log));
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("demo failed: {error}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{ERROR_AT_LEAST, WIDTH, error_line};

    const LONG_401: &str = "HTTP 401 after 1 attempt (0.7s ago; 3 replayed with a new token)";
    const QUIET: (&str, &str) = ("no events for 2.0s: the window empties", "quiet 2.0s");

    #[test]
    fn the_token_count_stays_on_a_line_whose_error_is_long() {
        // The error is too long to keep whole beside any note: the note goes short
        // and the error is cut.
        let tokens = ("tokens 4 (last 0.5s ago)", "tokens 4");
        let line = error_line(LONG_401, &[tokens]);
        assert!(line.ends_with(" replay…; tokens 4"), "{line}");
        assert_eq!(line.chars().count(), WIDTH, "{line}");
        // With a quiet spell too: both notes, short.
        let line = error_line(LONG_401, &[tokens, QUIET]);
        assert!(line.ends_with("…; tokens 4; quiet 2.0s"), "{line}");
        assert_eq!(line.chars().count(), WIDTH, "{line}");
        // An error that fits whole beside the long token note keeps it long; with
        // the quiet note too, the quiet one goes short first, then the tokens'.
        let line = error_line("HTTP 401 (0.7s ago)", &[tokens]);
        let want = "last error: HTTP 401 (0.7s ago); tokens 4 (last 0.5s ago)";
        assert_eq!(line.trim_start(), want);
        let line = error_line("HTTP 503 (1.2s)", &[tokens, QUIET]);
        let want = "last error: HTTP 503 (1.2s); tokens 4 (last 0.5s ago); quiet 2.0s";
        assert_eq!(line.trim_start(), want);
        let line = error_line("HTTP 401 (0.7s ago)", &[tokens, QUIET]);
        let want = "last error: HTTP 401 (0.7s ago); tokens 4; quiet 2.0s";
        assert_eq!(line.trim_start(), want);
    }

    #[test]
    fn notes_go_short_then_out_and_are_never_cut() {
        let tokens = (
            "tokens 12 (last 3.4s ago), 2 fetches brought none",
            "tokens 12, 2 missed",
        );
        let line = error_line(LONG_401, &[tokens, QUIET]);
        assert!(
            line.ends_with("…; tokens 12, 2 missed; quiet 2.0s"),
            "{line}"
        );
        // A note that leaves the error too little room even short is left out, from
        // the last.
        let wide = ("x".repeat(40), "y".repeat(30));
        let line = error_line(LONG_401, &[tokens, (&wide.0, &wide.1)]);
        assert!(line.ends_with("…; tokens 12, 2 missed"), "{line}");
        let error = line.trim_start().trim_start_matches("last error: ");
        assert!(error.chars().count() > ERROR_AT_LEAST, "{line}");
        assert!(line.chars().count() <= WIDTH, "{line}");
    }

    #[test]
    fn a_short_error_is_kept_whole_with_the_long_notes() {
        let line = error_line("none", &[QUIET]);
        assert_eq!(line.trim_start(), format!("last error: none; {}", QUIET.0));
        let line = error_line("HTTP 503 after 3 attempts (1.2s ago)", &[("tokens 2", "t")]);
        assert_eq!(
            line.trim_start(),
            "last error: HTTP 503 after 3 attempts (1.2s ago); tokens 2"
        );
    }
}
