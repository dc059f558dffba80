//! `ClientBuilder`: the settings of a [`ResilientClient`], checked by `build()`.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use http::{HeaderName, header};

use std::time::Duration;

use crate::auth::{AuthState, NoAuth, TokenSource, reserved_headers};
use crate::breaker::{BreakerConfig, CircuitBreaker};
use crate::client::{Events, ResilientClient, Shared};
use crate::concurrency::Limiter;
use crate::error::ConfigError;
use crate::observer::TransportObserver;
use crate::policy::{CallPolicy, RetryMode, RetryPolicy};
use crate::rate::{RateLimit, TokenBucket};
use crate::runtime::Runtime;
use crate::transport::Transport;

/// The header names [`ClientBuilder::retry_count_header`] refuses: credentials, and
/// the names no token may take ([`RESERVED_TOKEN_HEADERS`]: the idempotency key,
/// the headers that frame the message or the connection, and `expect`).
///
/// [`RESERVED_TOKEN_HEADERS`]: crate::auth::RESERVED_TOKEN_HEADERS
pub const RESERVED_RETRY_COUNT_HEADERS: [HeaderName; 16] = reserved_headers!(
    header::AUTHORIZATION,
    header::PROXY_AUTHORIZATION,
    header::COOKIE
);

/// The default header read for [`ClientError::request_id`](crate::ClientError::request_id).
pub const DEFAULT_REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// Builds a [`ResilientClient`]. Every setting has a default; `build()` checks them
/// and returns a [`ConfigError`] naming the first one refused.
///
/// ```
/// use std::sync::Arc;
/// use vantage_api_pool::{NullObserver, ResilientClient, RetryPolicy};
/// use vantage_api_pool_testkit::{ScriptedTransport, VirtualRuntime};
///
/// let rt = VirtualRuntime::new();
/// let client = ResilientClient::builder(ScriptedTransport::new(&rt), rt.clone())
///     .default_retry(RetryPolicy::default())
///     .observer("orders-api", Arc::new(NullObserver))
///     .build()?;
/// assert_eq!(client.api_name(), Some("orders-api"));
/// # Ok::<(), vantage_api_pool::ConfigError>(())
/// ```
#[must_use = "a builder does nothing until build() is called"]
pub struct ClientBuilder<T, R, A = NoAuth> {
    transport: T,
    runtime: R,
    auth: A,
    default_policy: CallPolicy,
    default_retry: Option<RetryPolicy>,
    request_id_header: HeaderName,
    retry_count_header: Option<HeaderName>,
    observer: Option<(Arc<str>, Arc<dyn TransportObserver>)>,
    max_parallel: usize,
    rate: Option<(f64, Option<u32>)>,
    breaker: Option<(u32, Duration, Duration)>,
}

/// The default of [`ClientBuilder::max_parallel`]: 8 sends in flight.
pub const DEFAULT_MAX_PARALLEL: usize = 8;

impl<T, R, A> std::fmt::Debug for ClientBuilder<T, R, A> {
    /// Settings only: no transport, runtime or token source internals.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("api", &self.observer.as_ref().map(|(k, _)| k))
            .field("default_policy", &self.default_policy)
            .field("default_retry", &self.default_retry)
            .field("max_parallel", &self.max_parallel)
            .field("rate", &self.rate)
            .field("breaker", &self.breaker)
            .field("request_id_header", &self.request_id_header)
            .field("retry_count_header", &self.retry_count_header)
            .finish_non_exhaustive()
    }
}

impl<T: Transport, R: Runtime> ClientBuilder<T, R, NoAuth> {
    pub(crate) fn new(transport: T, runtime: R) -> Self {
        ClientBuilder {
            transport,
            runtime,
            auth: NoAuth,
            default_policy: CallPolicy::default(),
            default_retry: None,
            request_id_header: DEFAULT_REQUEST_ID_HEADER,
            retry_count_header: None,
            observer: None,
            max_parallel: DEFAULT_MAX_PARALLEL,
            rate: None,
            breaker: None,
        }
    }
}

impl<T: Transport, R: Runtime, A: TokenSource> ClientBuilder<T, R, A> {
    /// The policy of [`ResilientClient::execute`]: its retries, breaker mode,
    /// jitter, time limits and idempotency. Default: [`CallPolicy::default`],
    /// [`bounded`](CallPolicy::bounded) with [`RetryPolicy::default`] (3 retries from
    /// 250 ms capped at 10 s, 10 s per attempt, 30 s for the whole call).
    ///
    /// It replaces an earlier [`default_retry`](Self::default_retry); a later one
    /// changes its retry only.
    ///
    /// The transport's own time limits still hold: a reqwest client's read timeout
    /// (30 s on the one the reqwest adapter builds) also ends the wait for a response
    /// head, so an attempt limit longer than it needs a longer read timeout too.
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool::{CallPolicy, ResilientClient, RetryPolicy};
    /// use vantage_api_pool_testkit::{ScriptedTransport, VirtualRuntime};
    ///
    /// let rt = VirtualRuntime::new();
    /// // A slow API: a minute per attempt, five for the whole call, every call.
    /// let slow = CallPolicy::bounded(RetryPolicy::default())
    ///     .with_time_limits(Duration::from_secs(60), Some(Duration::from_secs(300)))?;
    /// let client = ResilientClient::builder(ScriptedTransport::new(&rt), rt.clone())
    ///     .default_policy(slow.clone())
    ///     .build()?;
    /// assert_eq!(client.default_policy(), &slow);
    /// # Ok::<(), vantage_api_pool::ConfigError>(())
    /// ```
    pub fn default_policy(mut self, policy: CallPolicy) -> Self {
        self.default_policy = policy;
        self.default_retry = None;
        self
    }

    /// The retry schedule of [`ResilientClient::execute`]: the default policy's retry
    /// becomes [`RetryMode::Bounded`]`(retry)`, the rest of it (time limits, breaker
    /// mode, jitter) stays as [`default_policy`](Self::default_policy) set it. Default:
    /// 3 retries from 250 ms capped at 10 s. `build()` refuses a `max` below `base`.
    ///
    /// Under the default policy's time limits (10 s per attempt, 30 s for the whole
    /// call) a retry the budget has no room for is not attempted, so a schedule
    /// whose back-offs (or a server's `Retry-After`) reach past 30 s is cut short
    /// there, without an error. For a longer one, give the client a
    /// [`default_policy`](Self::default_policy) with longer time limits.
    pub fn default_retry(mut self, retry: RetryPolicy) -> Self {
        self.default_retry = Some(retry);
        self
    }

    /// Reports every event to `observer`, keyed by `api` (the API's name). A client
    /// has one observer: a second call replaces the first (to report to several,
    /// pass a [`Fanout`](crate::Fanout)). `build()` refuses an `api` that is empty
    /// or only white space: every event, figure and `tracing` record is keyed on it.
    pub fn observer(
        mut self,
        api: impl Into<Arc<str>>,
        observer: Arc<dyn TransportObserver>,
    ) -> Self {
        self.observer = Some((api.into(), observer));
        self
    }

    /// The response header whose value becomes
    /// [`ClientError::request_id`](crate::ClientError::request_id); default `x-request-id`.
    pub fn request_id_header(mut self, name: HeaderName) -> Self {
        self.request_id_header = name;
        self
    }

    /// Adds header `name` to every retry, carrying the retry's number (`1` on the
    /// first retry, `2` on the second). The first attempt carries none; a redial or
    /// a 401 replay carries the number of the attempt it repeats. Off by default.
    ///
    /// It replaces a header of that name the request closure set, but not the auth
    /// token's: a token under the same name goes out instead. `build()` refuses the
    /// names it must never replace ([`RESERVED_RETRY_COUNT_HEADERS`]): a retry with
    /// a new `Idempotency-Key` is a new operation to the server, and credentials or
    /// the message's framing would be lost.
    pub fn retry_count_header(mut self, name: HeaderName) -> Self {
        self.retry_count_header = Some(name);
        self
    }

    /// At most `n` sends in flight at once (default 8). A permit is held from just
    /// before a send (through the wait for its rate token, if the bucket has none) to
    /// its response head: the success body the caller then streams holds none, so
    /// this does not cap concurrent downloads (hold a semaphore of your own across
    /// the body's read for that). `build()` refuses 0 and anything
    /// above [`MAX_PERMITS`](crate::concurrency::MAX_PERMITS).
    pub fn max_parallel(mut self, n: usize) -> Self {
        self.max_parallel = n;
        self
    }

    /// A long-run rate of `per_second` sends per second, with a burst of
    /// `ceil(per_second)`. The bucket starts full, so in any window of length T up to
    /// burst + `per_second` × T sends may start (at 10/s: ten at once, then one every
    /// 100 ms). A send takes its token last, after its permit, so this holds while
    /// callers queue for permits too. The token is charged at the clock reading its
    /// `Started` event carries (for a send that waited for nothing, the one taken
    /// before the request closure ran), so a closure that takes time delays its send
    /// by as much past its token. Set it below an API's hard quota, or use
    /// [`rate_limit_with_burst`](Self::rate_limit_with_burst) with a burst of 1.
    /// `build()` refuses 0, negative, NaN and infinite rates, and one so slow that
    /// refilling the burst would take more than [`MAX_REFILL`](crate::rate::MAX_REFILL).
    /// The bucket counts whole nanoseconds: a rate above 10⁹/s acts as 10⁹/s, a very
    /// high one is rounded down to 10⁹/n per second, and the burst is at most
    /// `u32::MAX` (see [`RateLimit::per_second`](crate::rate::RateLimit::per_second)).
    pub fn rate_limit(mut self, per_second: f64) -> Self {
        self.rate = Some((per_second, None));
        self
    }

    /// A long-run rate of `per_second` sends per second, with an explicit `burst`
    /// (in any window of length T, up to burst + `per_second` × T sends). `build()`
    /// refuses the rates [`rate_limit`](Self::rate_limit) refuses, a burst of 0, and a
    /// burst that would take more than [`MAX_REFILL`](crate::rate::MAX_REFILL) to
    /// refill.
    pub fn rate_limit_with_burst(mut self, per_second: f64, burst: u32) -> Self {
        self.rate = Some((per_second, Some(burst)));
        self
    }

    /// A circuit breaker with threshold 5, cooldown 5 s doubling to 60 s.
    pub fn default_breaker(self) -> Self {
        self.breaker_config(BreakerConfig::default_breaker())
    }

    /// A circuit breaker with settings already checked by [`BreakerConfig::new`], the
    /// same as [`breaker`](Self::breaker) with its three values.
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool::ResilientClient;
    /// use vantage_api_pool::breaker::BreakerConfig;
    /// use vantage_api_pool_testkit::{ScriptedTransport, VirtualRuntime};
    ///
    /// let config = BreakerConfig::new(3, Duration::from_secs(2), Duration::from_secs(30))?;
    /// let rt = VirtualRuntime::new();
    /// let client = ResilientClient::builder(ScriptedTransport::new(&rt), rt.clone())
    ///     .breaker_config(config)
    ///     .build()?;
    /// # let _ = client;
    /// # Ok::<(), vantage_api_pool::ConfigError>(())
    /// ```
    pub fn breaker_config(self, config: BreakerConfig) -> Self {
        self.breaker(config.threshold(), config.cooldown(), config.max_cooldown())
    }

    /// A circuit breaker that opens after `threshold` failures with no success (2xx)
    /// between them, for `cooldown`, doubling on every failed probe up to
    /// `max_cooldown`. A reachable answer neither counts nor ends the run (see
    /// [`BreakerConfig::new`](crate::breaker::BreakerConfig::new)). `build()` refuses
    /// a threshold of 0, a zero cooldown and a cooldown above its max.
    pub fn breaker(mut self, threshold: u32, cooldown: Duration, max_cooldown: Duration) -> Self {
        self.breaker = Some((threshold, cooldown, max_cooldown));
        self
    }

    /// Fetches a token from `source` on first use, applies it to every send, and
    /// refreshes it once per call on a 401 (single-flight across the client), ahead
    /// of its expiry when the source gives its lifetime
    /// ([`AuthToken::expires_in`](crate::AuthToken::expires_in)), or when asked
    /// ([`ResilientClient::refresh_token`](crate::ResilientClient::refresh_token)).
    ///
    /// A call's wait for a token counts toward its budget and ends with it
    /// (`TimedOut`); the attempt timeout does not apply (a fetch that one caller
    /// gave up would start again from nothing in the next, so a source slower than
    /// the timeout could never deliver). Under a policy without a budget
    /// (`essential`, `background`), a source that never answers holds its callers
    /// until they are dropped: give it a timeout of its own.
    pub fn auth<S: TokenSource>(self, source: S) -> ClientBuilder<T, R, S> {
        ClientBuilder {
            transport: self.transport,
            runtime: self.runtime,
            auth: source,
            default_policy: self.default_policy,
            default_retry: self.default_retry,
            request_id_header: self.request_id_header,
            retry_count_header: self.retry_count_header,
            observer: self.observer,
            max_parallel: self.max_parallel,
            rate: self.rate,
            breaker: self.breaker,
        }
    }

    /// Checks the settings and builds the client.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first setting it refuses, checked in this order:
    /// an [`observer`](Self::observer) whose API name is empty or only white space
    /// (`observer`); a `retry_count_header` among [`RESERVED_RETRY_COUNT_HEADERS`]; a
    /// [`default_retry`](Self::default_retry) whose `max` is below its `base`
    /// (`default_retry.max`); `max_parallel` of 0 or above
    /// [`MAX_PERMITS`](crate::concurrency::MAX_PERMITS); a `rate_limit` that is not a
    /// finite number above zero or too slow to refill its burst (`rate_limit.burst`
    /// for a burst of 0); a breaker threshold of 0 (`breaker.threshold`), a zero
    /// cooldown or one above its max (`breaker.cooldown`).
    pub fn build(self) -> Result<ResilientClient<T, R, A>, ConfigError> {
        if self
            .observer
            .as_ref()
            .is_some_and(|(api, _)| api.trim().is_empty())
        {
            return Err(ConfigError::new(
                "observer",
                "the API's name must not be empty or only white space",
            ));
        }
        if self
            .retry_count_header
            .as_ref()
            .is_some_and(|name| RESERVED_RETRY_COUNT_HEADERS.contains(name))
        {
            return Err(ConfigError::new(
                "retry_count_header",
                "must not name a header the request depends on (idempotency key, \
                 credentials, framing)",
            ));
        }
        let default_policy = match self.default_retry {
            Some(retry) => self
                .default_policy
                .with_retry(RetryMode::Bounded(retry))
                .map_err(|_| {
                    ConfigError::new("default_retry.max", "must not be below default_retry.base")
                })?,
            None => self.default_policy,
        };
        let limiter = Limiter::new(self.max_parallel)?;
        let bucket = match self.rate {
            None => None,
            Some((rate, None)) => Some(TokenBucket::new(RateLimit::per_second(rate)?)),
            Some((rate, Some(burst))) => {
                Some(TokenBucket::new(RateLimit::with_burst(rate, burst)?))
            }
        };
        let breaker = match self.breaker {
            None => None,
            Some((threshold, cooldown, max)) => Some(CircuitBreaker::new(BreakerConfig::new(
                threshold, cooldown, max,
            )?)),
        };
        // Accepted: the observer may list the API now, before any event.
        if let Some((api, observer)) = &self.observer {
            observer.on_attach(api, self.runtime.now());
        }
        Ok(ResilientClient {
            shared: Arc::new(Shared {
                transport: self.transport,
                runtime: self.runtime,
                auth: self.auth,
                auth_state: AuthState::new(),
                default_policy,
                request_id_header: self.request_id_header,
                retry_count_header: self.retry_count_header,
                events: Events::new(self.observer),
                breaker,
                bucket,
                limiter,
                next_call: AtomicU64::new(0),
            }),
        })
    }
}
