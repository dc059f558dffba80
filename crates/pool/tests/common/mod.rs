//! Shared set-up for the scenario tests: a client over the testkit with a recording
//! observer, and small helpers to read what happened.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use vantage_api_pool::bytes::Bytes;
use vantage_api_pool::{
    CallPolicy, ClientBuilder, ClientError, ErrorKind, EventKind, Instant, Jitter, NoAuth,
    ResilientClient, RetryMode, RetryPolicy, TokenSource, Transport, TransportError,
    TransportErrorKind, TransportEvent, TransportResponse,
};
use vantage_api_pool_testkit::{
    JoinHandle, RecordingObserver, ScriptedHttp, ScriptedRequestBuilder, ScriptedTransport,
    VirtualRuntime,
};

pub type Client<A = NoAuth> = ResilientClient<ScriptedTransport, VirtualRuntime, A>;

pub struct World {
    pub rt: VirtualRuntime,
    pub transport: ScriptedTransport,
    pub observer: RecordingObserver,
}

impl World {
    pub fn new() -> Self {
        let rt = VirtualRuntime::new();
        let transport = ScriptedTransport::new(&rt);
        World {
            rt,
            transport,
            observer: RecordingObserver::new(),
        }
    }

    /// A builder over this world's transport and runtime, observed by its observer.
    pub fn builder(&self) -> ClientBuilder<ScriptedTransport, VirtualRuntime> {
        ResilientClient::builder(self.transport.clone(), self.rt.clone())
            .observer("api", Arc::new(self.observer.clone()))
    }

    pub fn client(&self) -> Client {
        self.builder().build().expect("valid settings")
    }

    /// Virtual times at which requests were sent.
    pub fn sent_at(&self) -> Vec<Duration> {
        self.transport
            .requests()
            .iter()
            .map(|r| r.at.since_origin())
            .collect()
    }

    /// The last `Failed` reported carries `err`, field by field.
    pub fn assert_last_failed_is(&self, err: &ClientError) {
        let last = self.events().into_iter().rev().find_map(|e| match e.kind {
            EventKind::Failed { error, .. } => Some(error),
            _ => None,
        });
        let last = last.unwrap_or_else(|| panic!("no Failed for {err:?}"));
        assert_eq!(
            error_difference(&last, err),
            None,
            "the last Failed is not {err}"
        );
    }

    pub fn events(&self) -> Vec<TransportEvent> {
        self.observer
            .events()
            .into_iter()
            .map(|r| r.event)
            .collect()
    }

    /// When each event named `name` (`EventKind::name`: "started", "redialing", …)
    /// happened, in order.
    pub fn times_of(&self, name: &str) -> Vec<Duration> {
        self.events()
            .iter()
            .filter(|e| e.kind.name() == name)
            .map(|e| e.at.since_origin())
            .collect()
    }

    /// (send, attempt) of every `Started`, in order.
    pub fn started(&self) -> Vec<(u32, u32)> {
        self.events()
            .iter()
            .filter_map(|e| match e.kind {
                EventKind::Started { send, attempt } => Some((send, attempt)),
                _ => None,
            })
            .collect()
    }

    /// (send, attempt) of every event that carries them, in order.
    pub fn numbers(&self) -> Vec<(u32, u32)> {
        self.events()
            .iter()
            .filter_map(|e| e.kind.send_and_attempt())
            .collect()
    }

    pub fn kinds(&self) -> Vec<&'static str> {
        self.observer.kinds()
    }

    pub fn assert_contract(&self) {
        if let Err(v) = self.observer.check_contract() {
            panic!("observer contract broken: {v}\nevents: {:#?}", self.kinds());
        }
    }

    pub fn now(&self) -> Duration {
        self.rt.now().since_origin()
    }

    /// The error of one `background()` GET of `/x` by `client`, which must fail.
    pub fn background_error<T, A>(
        &self,
        client: &ResilientClient<T, VirtualRuntime, A>,
    ) -> ClientError
    where
        T: Transport<Handle = ScriptedHttp, Draft = ScriptedRequestBuilder>,
        T::Response: std::fmt::Debug,
        A: TokenSource,
    {
        self.rt
            .block_on(client.execute_with(&CallPolicy::background(), |h| h.get("/x")))
            .expect("the call finishes")
            .expect_err("the call fails")
    }

    /// Spawns a background call to `path` that starts at `start` on the virtual
    /// clock; it yields the call's error kind, if any.
    pub fn background_call_at<A: TokenSource + 'static>(
        &self,
        client: &Client<A>,
        start: Duration,
        path: &'static str,
    ) -> JoinHandle<Result<(), ErrorKind>> {
        let (client, rt) = (client.clone(), self.rt.clone());
        self.rt.spawn(async move {
            rt.sleep_until(at(start)).await;
            client
                .execute_with(&CallPolicy::background(), |h| h.get(path))
                .await
                .map(|_| ())
                .map_err(|e| e.kind())
        })
    }

    /// Spawns one call of `client` under `policy` (a GET of `path`) on the driver.
    pub fn spawn_call<A: TokenSource + 'static>(
        &self,
        client: &Client<A>,
        policy: CallPolicy,
        path: &'static str,
    ) -> JoinHandle<Result<(), ClientError>> {
        let client = client.clone();
        self.rt.spawn(async move {
            client
                .execute_with(&policy, |h| h.get(path))
                .await
                .map(|_| ())
        })
    }
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

pub fn at(d: Duration) -> Instant {
    Instant::ORIGIN + d
}

/// A bounded policy with `retries` retries from `base` (ceiling 60 s), jitter off.
pub fn bounded(retries: u32, base: Duration) -> CallPolicy {
    CallPolicy::bounded(RetryPolicy {
        max_retries: retries,
        base,
        max: secs(60),
    })
    .with_jitter(Jitter::None)
    .unwrap()
}

/// [`bounded`] with this attempt timeout and budget.
pub fn bounded_within(
    retries: u32,
    base: Duration,
    attempt_timeout: Duration,
    budget: Duration,
) -> CallPolicy {
    bounded(retries, base)
        .with_attempt_timeout(attempt_timeout)
        .unwrap()
        .with_budget(Some(budget))
        .unwrap()
}

/// Retry until cancelled with a fixed back-off, jitter off.
pub fn forever(backoff: Duration) -> CallPolicy {
    CallPolicy::essential()
        .with_retry(RetryMode::UntilCancelled {
            base: backoff,
            max: backoff,
        })
        .unwrap()
        .with_jitter(Jitter::None)
        .unwrap()
}

/// `RetryScheduled` sleeps reported, in order.
pub fn scheduled(events: &[TransportEvent]) -> Vec<Duration> {
    events
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::RetryScheduled { after, .. } => Some(after),
            _ => None,
        })
        .collect()
}

/// A small deterministic generator (splitmix64) for seeded test schedules.
#[derive(Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    pub fn ms(&mut self, max: u64) -> Duration {
        ms(self.below(max + 1))
    }
}

/// A `200` response whose body is `chunks`, read one per `chunk()` call (an `Err`
/// is a read that fails with that kind and the message "broke").
#[derive(Debug)]
pub struct Chunks {
    pub status: http::StatusCode,
    pub chunks: std::collections::VecDeque<Result<Bytes, TransportError>>,
    /// `chunk()` calls so far.
    pub reads: usize,
    headers: http::HeaderMap,
}

impl Chunks {
    pub fn new(chunks: impl IntoIterator<Item = Result<&'static str, TransportErrorKind>>) -> Self {
        Chunks {
            status: http::StatusCode::OK,
            chunks: chunks
                .into_iter()
                .map(|c| {
                    c.map(|s: &'static str| Bytes::from_static(s.as_bytes()))
                        .map_err(|kind| TransportError::new(kind, "broke"))
                })
                .collect(),
            reads: 0,
            headers: http::HeaderMap::new(),
        }
    }
}

impl TransportResponse for Chunks {
    fn status(&self) -> http::StatusCode {
        self.status
    }

    fn headers(&self) -> &http::HeaderMap {
        &self.headers
    }

    async fn chunk(&mut self) -> Result<Option<Bytes>, TransportError> {
        self.reads += 1;
        self.chunks.pop_front().transpose()
    }
}

/// What differs between two errors, field by field (kind, attempts, status body,
/// request id, server delay, time limit, nothing sent, credentials dropped, and the
/// failure under it), or `None` when nothing does: the last `Failed` must carry the
/// very error its call returns.
pub fn error_difference(a: &ClientError, b: &ClientError) -> Option<String> {
    let fields = |e: &ClientError| {
        format!(
            "{:?} {} {:?} {:?} {:?} {:?} {:?} {} {} {:?} {}",
            e.kind(),
            e.attempts(),
            e.body(),
            e.headers(),
            e.request_id(),
            e.retry_after(),
            e.time_limit(),
            e.nothing_sent(),
            e.credentials_dropped(),
            e.last_failure()
                .map(|l| (l.to_string(), l.request_id().map(str::to_owned))),
            std::error::Error::source(e).is_some(),
        )
    };
    let (a, b) = (fields(a), fields(b));
    (a != b).then(|| format!("{a} vs {b}"))
}

/// Keeps the panics a test provokes on purpose (their message starts with `prefix`)
/// out of its output; every other panic (a failed assertion) is reported as usual.
/// The prefixes of every call in a test binary are kept: the first call sets the
/// hook, which then quiets a panic whose message starts with any of them.
pub fn quiet_panics_starting_with(prefix: &'static str) {
    static PREFIXES: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    static ONCE: std::sync::Once = std::sync::Once::new();
    {
        let mut prefixes = PREFIXES
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !prefixes.contains(&prefix) {
            prefixes.push(prefix);
        }
    }
    ONCE.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let message = payload
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| payload.downcast_ref::<String>().map(String::as_str));
            // Nothing panics while the list is locked, so this never waits on itself.
            let own = message.is_some_and(|m| {
                PREFIXES
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .iter()
                    .any(|p| m.starts_with(p))
            });
            if !own {
                report(info);
            }
        }));
    });
}
