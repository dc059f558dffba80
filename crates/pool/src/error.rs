//! Errors: [`ClientError`] for a call that failed, [`ConfigError`] for a setting that
//! was refused.
//!
//! Neither `Display` nor `Debug` of these types ever contains a URL, a body or a
//! header value: bodies, headers and request ids are reachable only through accessors.

use std::borrow::Cow;
use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};

use crate::transport::{TransportError, TransportErrorKind};

/// The most bytes of an error response's body a [`ClientError`] keeps.
pub const MAX_ERROR_BODY: usize = 2048;

/// A setting refused by a builder or a [`CallPolicy`](crate::CallPolicy) constructor.
///
/// ```
/// use vantage_api_pool::{CallPolicy, ConfigError};
/// let err: ConfigError = CallPolicy::background()
///     .with_attempt_timeout(std::time::Duration::ZERO)
///     .unwrap_err();
/// assert_eq!(err.setting(), "attempt_timeout");
/// assert_eq!(err.reason(), "must be greater than zero");
/// assert_eq!(err.to_string(), "invalid attempt_timeout: must be greater than zero");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
#[error("invalid {setting}: {reason}")]
pub struct ConfigError {
    setting: &'static str,
    reason: &'static str,
}

impl ConfigError {
    pub(crate) const fn new(setting: &'static str, reason: &'static str) -> Self {
        ConfigError { setting, reason }
    }

    /// The name of the refused setting, as the builder method or constructor names it.
    #[must_use]
    pub fn setting(&self) -> &'static str {
        self.setting
    }

    /// Why it was refused.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

/// What went wrong with a call. Switch on it through [`ClientError::kind`].
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The API answered with a status that is final, or kept answering with a
    /// retryable one until the policy gave up. The body is kept (up to 2048 bytes).
    Status(StatusCode),
    /// The transport failed and the failure was final or retries ran out.
    /// `Transport(Config)` means the request could not be built: nothing was sent.
    Transport(TransportErrorKind),
    /// A time limit ended the call: an attempt timeout, the call's budget, or the
    /// transport's own timeout (reported here, never as `Transport(TimedOut)`);
    /// [`ClientError::time_limit`] tells which. When the limit ended the call before
    /// a retry, redial or replay went out, [`ClientError::last_failure`] (and
    /// `source()`) is the failed send's [`ClientError`] (the 503 with its body, say).
    TimedOut,
    /// The circuit breaker was open and the policy fails fast; nothing was sent this
    /// time. On a retry, [`ClientError::last_failure`] (and `source()`) is the
    /// failed send's [`ClientError`].
    BreakerOpen,
    /// The auth token source failed. Not retried by the client.
    /// [`ClientError::auth_error`] is the token source's own error (`source()` is a
    /// [`SharedAuthError`](crate::auth::SharedAuthError), whose
    /// [`as_error`](crate::auth::SharedAuthError::as_error) is the same).
    Auth,
    /// The client was shut down. Reserved: nothing produces it yet.
    Closed,
}

impl ErrorKind {
    /// A stable snake_case name: `status`, `transport`, `timed_out`, `breaker_open`,
    /// `auth` or `closed`.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            ErrorKind::Status(_) => "status",
            ErrorKind::Transport(_) => "transport",
            ErrorKind::TimedOut => "timed_out",
            ErrorKind::BreakerOpen => "breaker_open",
            ErrorKind::Auth => "auth",
            ErrorKind::Closed => "closed",
        }
    }
}

/// Which time limit ended a call that failed with [`ErrorKind::TimedOut`]: read it with
/// [`ClientError::time_limit`].
///
/// It names the limit that produced the error the call returned. A send cut by its
/// attempt timeout whose retry would not fit in the budget returns that send's error,
/// so its limit is [`AttemptTimeout`](TimeLimit::AttemptTimeout), not `Budget`.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TimeLimit {
    /// The policy's [attempt timeout](crate::CallPolicy::attempt_timeout) cut a send
    /// (the rest of the budget, if any, was at least as long).
    AttemptTimeout,
    /// The call's [budget](crate::CallPolicy::budget) ran out: before a send could
    /// go out (at the breaker, the rate limit, the concurrency limit, the token
    /// source, or with no time left for a send), or during a send whose time limit
    /// was the rest of the budget because that was shorter than the attempt timeout.
    Budget,
    /// The transport's own timeout (a `TimedOut` transport error, such as reqwest's
    /// read timeout), not one of the client's limits.
    Transport,
}

impl TimeLimit {
    /// A stable snake_case name: `attempt_timeout`, `budget` or `transport`.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            TimeLimit::AttemptTimeout => "attempt_timeout",
            TimeLimit::Budget => "budget",
            TimeLimit::Transport => "transport",
        }
    }
}

impl fmt::Display for TimeLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TimeLimit::AttemptTimeout => "attempt timeout",
            TimeLimit::Budget => "call budget",
            TimeLimit::Transport => "transport's own timeout",
        })
    }
}

/// The kind's [`name`](ErrorKind::name), with a status's code: `status 503`,
/// `transport not_sent`, `timed_out`.
impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorKind::Status(s) => write!(f, "status {}", s.as_u16()),
            ErrorKind::Transport(k) => write!(f, "transport {k}"),
            other => f.write_str(other.name()),
        }
    }
}

/// What a [`ClientError`] of kind `Status` keeps of its own response.
#[derive(Clone)]
struct ErrorResponse {
    body: Bytes,
    headers: HeaderMap,
}

/// An error response's headers, kept from its head while its body is read, already
/// in the allocation its [`ClientError`] will share: one allocation per error
/// response, and one pointer in the call's future.
pub(crate) struct ErrorResponseHead(Arc<ErrorResponse>);

impl ErrorResponseHead {
    pub(crate) fn new(headers: HeaderMap) -> Self {
        ErrorResponseHead(Arc::new(ErrorResponse {
            body: Bytes::new(),
            headers,
        }))
    }
}

/// Why a call failed, after how many attempts, and what the API said.
///
/// Cheap to clone (the response it keeps is reference-counted). `Display` reads like
/// `HTTP 503 after 3 attempts` and never contains a URL, a body or a header value;
/// `Debug` shows only the body's length, how many headers there are and whether a
/// request id is present.
#[derive(Clone)]
pub struct ClientError {
    kind: ErrorKind,
    attempts: u32,
    // What a `Status` error keeps of its own response, behind one pointer: a call
    // keeps its last failure across its waits, so this error's size is part of the
    // call's future.
    response: Option<Arc<ErrorResponse>>,
    request_id: Option<Arc<str>>,
    retry_after: Option<Duration>,
    reached: bool,
    // The last response answered a hop sent without the client's credentials.
    credentials_dropped: bool,
    // The last response answered another request, which a redirect that answered
    // the call's request led to.
    answered_by_redirect: bool,
    // Set for `TimedOut` only.
    time_limit: Option<TimeLimit>,
    source: Option<Arc<dyn StdError + Send + Sync + 'static>>,
}

impl ClientError {
    /// A bare error of `kind` after `attempts` attempts (nothing else known).
    pub(crate) fn new(kind: ErrorKind, attempts: u32) -> Self {
        ClientError {
            kind,
            attempts,
            response: None,
            request_id: None,
            retry_after: None,
            reached: false,
            credentials_dropped: false,
            answered_by_redirect: false,
            time_limit: None,
            source: None,
        }
    }

    /// A [`ErrorKind::TimedOut`] error that `limit` caused, after `attempts` attempts.
    pub(crate) fn timed_out(limit: TimeLimit, attempts: u32) -> Self {
        let mut e = ClientError::new(ErrorKind::TimedOut, attempts);
        e.time_limit = Some(limit);
        e
    }

    /// A transport failure; the transport error becomes the source.
    pub(crate) fn transport(err: TransportError, attempts: u32) -> Self {
        let mut e = ClientError::new(ErrorKind::Transport(err.kind()), attempts);
        e.source = Some(Arc::new(err));
        e
    }

    /// Keeps the error's own response: its headers, and at most [`MAX_ERROR_BODY`]
    /// bytes of `body`, cut on a char boundary.
    #[cfg(test)]
    pub(crate) fn with_response(self, body: Bytes, headers: HeaderMap) -> Self {
        self.with_response_head(ErrorResponseHead::new(headers), body)
    }

    /// Keeps the error's own response: the headers already in `head`'s allocation,
    /// and at most [`MAX_ERROR_BODY`] bytes of `body`, cut on a char boundary, put
    /// into it.
    pub(crate) fn with_response_head(mut self, head: ErrorResponseHead, body: Bytes) -> Self {
        let mut response = head.0;
        // Never shared yet, so this writes in place and clones nothing.
        Arc::make_mut(&mut response).body = truncate_body(body);
        self.response = Some(response);
        self
    }

    pub(crate) fn with_request_id(mut self, id: Option<Arc<str>>) -> Self {
        self.request_id = id;
        self
    }

    /// For an error with no response of its own (any kind but `Status`) and no
    /// request id: the request id of `earlier`, the error of the call's send before
    /// it, which has the one of the last response the call got.
    pub(crate) fn with_request_id_of(mut self, earlier: &ClientError) -> Self {
        if !matches!(self.kind, ErrorKind::Status(_)) && self.request_id.is_none() {
            self.request_id.clone_from(&earlier.request_id);
        }
        self
    }

    pub(crate) fn with_retry_after(mut self, after: Option<Duration>) -> Self {
        self.retry_after = after;
        self
    }

    /// Records that some attempt of the call may have reached the server.
    pub(crate) fn with_reached(mut self, reached: bool) -> Self {
        self.reached = reached;
        self
    }

    /// Records that the response answered a hop that went without the client's
    /// credentials.
    pub(crate) fn with_credentials_dropped(mut self, dropped: bool) -> Self {
        self.credentials_dropped = dropped;
        self
    }

    /// Records that the call's request was answered with a redirect the transport
    /// followed with another request.
    pub(crate) fn with_answered_by_redirect(mut self, answered: bool) -> Self {
        self.answered_by_redirect = answered;
        self
    }

    pub(crate) fn with_source(mut self, source: Arc<dyn StdError + Send + Sync + 'static>) -> Self {
        self.source = Some(source);
        self
    }

    /// What went wrong.
    #[must_use]
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// [`ErrorKind::name`] of the kind: the string consumers switch on.
    #[must_use]
    pub fn kind_name(&self) -> &'static str {
        self.kind.name()
    }

    /// The final status code, for [`ErrorKind::Status`].
    #[must_use]
    pub fn status(&self) -> Option<StatusCode> {
        match self.kind {
            ErrorKind::Status(s) => Some(s),
            _ => None,
        }
    }

    /// Attempts made, the first included: sends that went through the transport,
    /// whether or not the request reached the server (a refused connection is an
    /// attempt; [`nothing_sent`](ClientError::nothing_sent) tells whether any did).
    /// Redials are not attempts; a 401 replay is. A fail-fast rejection or an auth
    /// failure before any send has 0.
    #[must_use]
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Up to 2048 bytes of the last error response's body, cut on a char boundary when
    /// the body is UTF-8, whether the cut is the limit's or a read that stalled or
    /// broke. `None` for every kind but [`ErrorKind::Status`].
    #[must_use]
    pub fn body(&self) -> Option<&[u8]> {
        self.response.as_deref().map(|r| &r.body[..])
    }

    /// [`ClientError::body`] as text, with invalid UTF-8 replaced.
    #[must_use]
    pub fn body_text(&self) -> Option<Cow<'_, str>> {
        self.body().map(String::from_utf8_lossy)
    }

    /// The request id the server sent with the last response the call got (header
    /// configurable on the client, `x-request-id` by default): the handle for a
    /// support or billing question. An error with no response of its own (a time
    /// limit, a transport failure, the breaker, an auth failure) after a send that got
    /// one carries that response's id: a 503 with id `r1` then a timed-out retry
    /// gives `TimedOut` with `r1`. `None` when the last response had none, or the
    /// call got no response.
    #[must_use]
    pub fn request_id(&self) -> Option<&str> {
        self.request_id.as_deref()
    }

    /// The headers of the response this error is about, for [`ErrorKind::Status`]
    /// (a 409's `Location`, a 401's `WWW-Authenticate`, a 429's rate-limit
    /// headers once its retries ran out); `None` for every other kind, which has no
    /// response of its own (when the breaker or a time limit ended the call before its
    /// next send went out, [`last_failure`](ClientError::last_failure) is the failed
    /// send before, with its headers). Neither `Display` nor `Debug` shows their
    /// values.
    ///
    /// ```
    /// use vantage_api_pool::{CallPolicy, ResilientClient};
    /// use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
    ///
    /// let rt = VirtualRuntime::new();
    /// let api = ScriptedTransport::new(&rt);
    /// api.push(Reply::status(409).header("location", "/orders/7"));
    /// let client = ResilientClient::builder(api, rt.clone()).build()?;
    /// let err = rt.block_on(client.execute(|http| http.post("/orders")))?.unwrap_err();
    /// assert_eq!(err.headers().map(|h| &h["location"]), Some(&"/orders/7".parse()?));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn headers(&self) -> Option<&HeaderMap> {
        self.response.as_deref().map(|r| &r.headers)
    }

    /// Which time limit ended the call, for [`ErrorKind::TimedOut`]; `None` for every
    /// other kind.
    ///
    /// ```
    /// use vantage_api_pool::{ClientError, ErrorKind, TimeLimit};
    ///
    /// fn explain(error: &ClientError) -> &'static str {
    ///     match error.time_limit() {
    ///         Some(TimeLimit::AttemptTimeout) => "the API is slow: each try took too long",
    ///         Some(TimeLimit::Budget) => "the call as a whole ran out of time",
    ///         Some(_) => "the transport gave up waiting",
    ///         None => "not a time limit",
    ///     }
    /// }
    /// # let _ = explain;
    /// ```
    #[must_use]
    pub fn time_limit(&self) -> Option<TimeLimit> {
        self.time_limit
    }

    /// For a call that a time limit or the breaker ended after it had sent
    /// ([`ErrorKind::TimedOut`] or [`ErrorKind::BreakerOpen`] before a retry, redial
    /// or replay went out): the failed send's error, with its status, body and
    /// request id. It is also this error's `source()`. `None` for every other error,
    /// and for a call refused before it sent anything.
    ///
    /// ```
    /// use vantage_api_pool::{ClientError, ErrorKind};
    ///
    /// fn describe(error: &ClientError) -> String {
    ///     match (error.kind(), error.last_failure()) {
    ///         (ErrorKind::BreakerOpen, Some(last)) => format!("gave up after {last}"),
    ///         _ => error.to_string(),
    ///     }
    /// }
    /// # let _ = describe;
    /// ```
    #[must_use]
    pub fn last_failure(&self) -> Option<&ClientError> {
        self.source.as_deref()?.downcast_ref::<ClientError>()
    }

    /// For an [`ErrorKind::Auth`] error, the token source's own error (downcast it to
    /// the source's error type, say to tell revoked credentials from an identity
    /// provider that is down); `None` for every other kind. The short way to
    /// `source()` → [`SharedAuthError`](crate::auth::SharedAuthError) →
    /// [`as_error`](crate::auth::SharedAuthError::as_error).
    ///
    /// ```
    /// use vantage_api_pool::ClientError;
    ///
    /// #[derive(Debug)]
    /// struct Revoked;
    /// impl std::fmt::Display for Revoked {
    ///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
    ///         f.write_str("credentials revoked")
    ///     }
    /// }
    /// impl std::error::Error for Revoked {}
    ///
    /// fn revoked(error: &ClientError) -> bool {
    ///     error.auth_error().is_some_and(|e| e.is::<Revoked>())
    /// }
    /// # let _ = revoked;
    /// ```
    #[must_use]
    pub fn auth_error(&self) -> Option<&(dyn StdError + Send + Sync + 'static)> {
        // Only an `Auth` error has a `SharedAuthError` as its source.
        let shared = self.source.as_deref()?;
        Some(
            shared
                .downcast_ref::<crate::auth::SharedAuthError>()?
                .as_error(),
        )
    }

    /// How long to wait before trying again, when something said so:
    ///
    /// - [`ErrorKind::Status`]: the delay the server asked for on this response
    ///   (`retry-after-ms` or `Retry-After`), as parsed, before any clamping to a
    ///   policy's ceiling; `None` when it asked for none or in a form the client
    ///   ignores (a number too large to hold among them).
    /// - [`ErrorKind::BreakerOpen`]: how long the breaker still refused sends when it
    ///   turned the call away, from that moment: the rest of its cooldown. `None`
    ///   while another call's probe is out, whose answer nobody can foresee (the
    ///   loop's own callers look again every
    ///   [`PROBE_RECHECK`](crate::breaker::PROBE_RECHECK), an interval too short to
    ///   hand on as a delay). A service in front of the API can pass it on as its
    ///   own `Retry-After`.
    /// - `None` for every other kind: a delay an earlier response asked for was
    ///   waited out before the send that failed (that response's error, under
    ///   [`last_failure`](ClientError::last_failure), still has it).
    ///
    /// ```
    /// use vantage_api_pool::{ClientError, ErrorKind};
    ///
    /// /// The status and `Retry-After` seconds a gateway answers its own caller with.
    /// fn answer(error: &ClientError) -> (u16, Option<u64>) {
    ///     let seconds = error.retry_after().map(|d| d.as_secs_f64().ceil() as u64);
    ///     match error.kind() {
    ///         ErrorKind::BreakerOpen => (503, seconds),
    ///         ErrorKind::Status(status) => (status.as_u16(), seconds),
    ///         _ => (502, None),
    ///     }
    /// }
    /// # let _ = answer;
    /// ```
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// True only when no attempt of the call can have reached the server: nothing was
    /// sent (fail-fast, auth failure, a request that could not be built), or every
    /// send was refused before the request left (`Connect`, `NotSent`, `Tls`). A
    /// `NotSent` after the call's two free redials is taken as `Interrupted`, which
    /// may have reached the server.
    #[must_use]
    pub fn nothing_sent(&self) -> bool {
        !self.reached
    }

    /// True when the last response answered a hop that went out without the client's
    /// credentials, as the transport tells through
    /// [`TransportResponse::credentials_dropped`](crate::TransportResponse::credentials_dropped):
    /// a redirect to another origin, where reqwest drops `Authorization`. A 401 or 403
    /// of that hop says nothing about the client's token, and the call did not fetch a
    /// newer token for it. Always `false` for an error that is not
    /// [`ErrorKind::Status`], and for a response the transport cannot track.
    ///
    /// ```
    /// use vantage_api_pool::ClientError;
    ///
    /// fn explain(error: &ClientError) -> &'static str {
    ///     match error.status().map(|s| s.as_u16()) {
    ///         Some(401) if error.credentials_dropped() => {
    ///             "the API redirected to another origin, which wants its own credentials"
    ///         }
    ///         Some(401) => "the API refused the token, even a fresh one",
    ///         _ => "something else",
    ///     }
    /// }
    /// # let _ = explain;
    /// ```
    #[must_use]
    pub fn credentials_dropped(&self) -> bool {
        self.credentials_dropped
    }

    /// True when the call's last request was answered with a redirect that the
    /// transport followed with another request, a GET (a 303, or a 301 or 302 to a
    /// POST), and this error's status answers that later request, as
    /// the transport tells through
    /// [`TransportResponse::answered_by_redirect`](crate::TransportResponse::answered_by_redirect).
    /// The request itself may have been processed, so a 429, a 503 with a server
    /// delay or a 401 of the later request was retried or replayed only if the call
    /// is idempotent. Always `false` for an error that is not [`ErrorKind::Status`],
    /// and for a response the transport cannot track.
    #[must_use]
    pub fn answered_by_redirect(&self) -> bool {
        self.answered_by_redirect
    }

    /// Whether the same call, tried again later, might succeed: 408, 429 and 5xx
    /// statuses, `NotSent`, `Connect` and `Interrupted` transport failures, time limits
    /// (`TimedOut`) and an open breaker. Other 4xx, `Tls`, `TooLarge`, `Config`,
    /// auth failures and a closed client are not.
    ///
    /// It says nothing of whether trying again is safe: the call's idempotency is
    /// not considered. After an `Interrupted` or `TimedOut` POST the server may have
    /// acted on the request (a payment made, say), and only
    /// [`nothing_sent`](Self::nothing_sent) says that no attempt can have reached it.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        match self.kind {
            ErrorKind::Status(s) => {
                s == StatusCode::REQUEST_TIMEOUT
                    || s == StatusCode::TOO_MANY_REQUESTS
                    || s.is_server_error()
            }
            ErrorKind::Transport(k) => matches!(
                k,
                TransportErrorKind::NotSent
                    | TransportErrorKind::Connect
                    | TransportErrorKind::Interrupted
                    | TransportErrorKind::TimedOut
            ),
            ErrorKind::TimedOut | ErrorKind::BreakerOpen => true,
            ErrorKind::Auth | ErrorKind::Closed => false,
        }
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            ErrorKind::Status(s) => write!(f, "HTTP {}", s.as_u16())?,
            ErrorKind::Transport(k) => write!(f, "transport error ({k})")?,
            ErrorKind::TimedOut => match self.time_limit {
                Some(limit) => write!(f, "timed out ({limit})")?,
                None => f.write_str("timed out")?,
            },
            ErrorKind::BreakerOpen => f.write_str("circuit breaker open")?,
            ErrorKind::Auth => f.write_str("auth token source failed")?,
            ErrorKind::Closed => f.write_str("client closed")?,
        }
        match self.attempts {
            0 => f.write_str(", nothing sent"),
            1 => f.write_str(" after 1 attempt"),
            n => write!(f, " after {n} attempts"),
        }
    }
}

impl fmt::Debug for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientError")
            .field("kind", &self.kind)
            .field("attempts", &self.attempts)
            .field("body_len", &self.body().map(<[u8]>::len))
            .field("header_count", &self.headers().map(HeaderMap::len))
            .field("has_request_id", &self.request_id.is_some())
            .field("retry_after", &self.retry_after)
            .field("time_limit", &self.time_limit)
            .field("nothing_sent", &!self.reached)
            .field("credentials_dropped", &self.credentials_dropped)
            .field("answered_by_redirect", &self.answered_by_redirect)
            .finish()
    }
}

impl StdError for ClientError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn StdError + 'static))
    }
}

/// Cuts `body` to at most [`MAX_ERROR_BODY`] bytes.
///
/// When the kept prefix is valid text up to a character the cut split in two (the
/// bytes past the cut finish it, or the body ends before they could tell), that
/// partial character is dropped too; a body that is not UTF-8 is cut at exactly
/// [`MAX_ERROR_BODY`] bytes. Never copies: the result shares `body`'s storage.
#[must_use]
pub fn truncate_body(body: Bytes) -> Bytes {
    if body.len() <= MAX_ERROR_BODY {
        return body;
    }
    let prefix = &body[..MAX_ERROR_BODY];
    let cut = match std::str::from_utf8(prefix) {
        Ok(_) => MAX_ERROR_BODY,
        // The prefix is valid text up to a sequence the cut left unfinished (so it
        // starts in the last three bytes): a character split in two if the bytes
        // past the cut finish it (or the body ends before they could tell), binary
        // otherwise.
        Err(e) if e.error_len().is_none() => {
            let start = e.valid_up_to();
            let next = &body[start..body.len().min(start + 4)];
            match std::str::from_utf8(next) {
                Err(e) if e.valid_up_to() == 0 && e.error_len().is_some() => MAX_ERROR_BODY,
                _ => start,
            }
        }
        Err(_) => MAX_ERROR_BODY,
    };
    body.slice(..cut)
}

/// A body whose read was cut short (a stall or a read error) without the bytes that
/// would finish its last character: when it is valid text up to that unfinished
/// sequence, the sequence is dropped, as [`truncate_body`] does at the limit.
pub(crate) fn trim_unfinished_char(body: Bytes) -> Bytes {
    match std::str::from_utf8(&body) {
        Err(e) if e.error_len().is_none() => body.slice(..e.valid_up_to()),
        _ => body,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, attempts: u32) -> ClientError {
        ClientError::new(
            ErrorKind::Status(StatusCode::from_u16(code).unwrap()),
            attempts,
        )
    }

    /// Only an error with no response of its own and no request id takes an
    /// earlier one's: a status error keeps its own (here none), and an error with
    /// an id keeps it.
    #[test]
    fn the_request_id_of_an_earlier_error_goes_only_to_one_without_its_own() {
        let earlier = status(503, 1).with_request_id(Some("r1".into()));
        let timed_out = ClientError::timed_out(TimeLimit::AttemptTimeout, 2);
        assert_eq!(
            timed_out.with_request_id_of(&earlier).request_id(),
            Some("r1")
        );
        assert_eq!(
            status(500, 2).with_request_id_of(&earlier).request_id(),
            None
        );
        let own =
            ClientError::timed_out(TimeLimit::AttemptTimeout, 2).with_request_id(Some("r2".into()));
        assert_eq!(own.with_request_id_of(&earlier).request_id(), Some("r2"));
    }

    #[test]
    fn display_names_kind_and_attempts_only() {
        let e = status(503, 3)
            .with_response(
                Bytes::from_static(b"secret body https://api.example/x"),
                HeaderMap::new(),
            )
            .with_request_id(Some("req-123".into()))
            .with_reached(true);
        assert_eq!(e.to_string(), "HTTP 503 after 3 attempts");
        assert_eq!(status(404, 1).to_string(), "HTTP 404 after 1 attempt");
        assert_eq!(
            ClientError::new(ErrorKind::BreakerOpen, 0).to_string(),
            "circuit breaker open, nothing sent"
        );
        assert_eq!(
            ClientError::timed_out(TimeLimit::AttemptTimeout, 3).to_string(),
            "timed out (attempt timeout) after 3 attempts"
        );
        assert_eq!(
            ClientError::timed_out(TimeLimit::Budget, 0).to_string(),
            "timed out (call budget), nothing sent"
        );
        assert_eq!(
            ClientError::timed_out(TimeLimit::Transport, 1).to_string(),
            "timed out (transport's own timeout) after 1 attempt"
        );
        let t = ClientError::transport(
            TransportError::new(TransportErrorKind::Connect, "refused"),
            2,
        );
        assert_eq!(t.to_string(), "transport error (connect) after 2 attempts");
        assert_eq!(
            ClientError::new(ErrorKind::Auth, 0).to_string(),
            "auth token source failed, nothing sent"
        );
        let debug = format!("{e:?}");
        assert!(
            !debug.contains("secret") && !debug.contains("req-123") && !debug.contains("https"),
            "{debug}"
        );
        assert!(debug.contains("body_len: Some(33)"), "{debug}");
    }

    #[test]
    fn debug_shows_every_field_but_what_a_log_must_not_hold() {
        // What goes to logs: every field by value, the body, headers and request id
        // only by their size or presence (a header's value may be a credential).
        let mut headers = HeaderMap::new();
        headers.insert("x-token", "secret-header-value".parse().unwrap());
        let e = status(429, 2)
            .with_response(Bytes::from_static(b"busy"), headers)
            .with_request_id(Some("req-123".into()))
            .with_retry_after(Some(Duration::from_secs(3)))
            .with_reached(true)
            .with_credentials_dropped(true);
        assert_eq!(
            format!("{e:?}"),
            "ClientError { kind: Status(429), attempts: 2, body_len: Some(4), \
             header_count: Some(1), has_request_id: true, retry_after: Some(3s), \
             time_limit: None, nothing_sent: false, credentials_dropped: true, \
             answered_by_redirect: false }"
        );
        let e = ClientError::timed_out(TimeLimit::Budget, 1).with_answered_by_redirect(true);
        assert_eq!(
            format!("{e:?}"),
            "ClientError { kind: TimedOut, attempts: 1, body_len: None, \
             header_count: None, has_request_id: false, retry_after: None, \
             time_limit: Some(Budget), nothing_sent: true, credentials_dropped: false, \
             answered_by_redirect: true }"
        );
        // Not yet made by the client (no shutdown), but named all the same.
        assert_eq!(
            ClientError::new(ErrorKind::Closed, 0).to_string(),
            "client closed, nothing sent"
        );
    }

    #[test]
    fn accessors() {
        let e = status(429, 2)
            .with_request_id(Some("abc".into()))
            .with_retry_after(Some(Duration::from_secs(3)))
            .with_reached(true);
        assert_eq!(e.status(), Some(StatusCode::TOO_MANY_REQUESTS));
        assert_eq!(e.kind_name(), "status");
        assert_eq!(e.request_id(), Some("abc"));
        assert_eq!(e.retry_after(), Some(Duration::from_secs(3)));
        assert_eq!(e.attempts(), 2);
        assert!(!e.nothing_sent());
        assert!(ClientError::new(ErrorKind::BreakerOpen, 0).nothing_sent());
        assert_eq!(ClientError::timed_out(TimeLimit::Budget, 1).status(), None);
        assert_eq!(
            ClientError::timed_out(TimeLimit::Budget, 1).time_limit(),
            Some(TimeLimit::Budget)
        );
        assert_eq!(e.time_limit(), None);
        assert_eq!(
            [
                TimeLimit::AttemptTimeout,
                TimeLimit::Budget,
                TimeLimit::Transport
            ]
            .map(TimeLimit::name),
            ["attempt_timeout", "budget", "transport"]
        );
        let t = ClientError::transport(TransportError::new(TransportErrorKind::Tls, "bad cert"), 1);
        assert_eq!(t.source().unwrap().to_string(), "tls: bad cert");
        assert_eq!(t.body(), None);
    }

    #[test]
    fn retryable_kinds() {
        for (code, want) in [
            (408, true),
            (429, true),
            (500, true),
            (503, true),
            (400, false),
            (401, false),
            (404, false),
        ] {
            assert_eq!(status(code, 1).is_retryable(), want, "{code}");
        }
        use TransportErrorKind::*;
        for (k, want) in [
            (NotSent, true),
            (Connect, true),
            (Interrupted, true),
            (TimedOut, true),
            (Tls, false),
            (TooLarge, false),
            (Config, false),
        ] {
            assert_eq!(
                ClientError::new(ErrorKind::Transport(k), 1).is_retryable(),
                want,
                "{k}"
            );
        }
        assert!(ClientError::new(ErrorKind::TimedOut, 1).is_retryable());
        assert!(ClientError::new(ErrorKind::BreakerOpen, 0).is_retryable());
        assert!(!ClientError::new(ErrorKind::Auth, 0).is_retryable());
        assert!(!ClientError::new(ErrorKind::Closed, 0).is_retryable());
    }

    #[test]
    fn kind_names() {
        let names: Vec<_> = [
            ErrorKind::Status(StatusCode::OK),
            ErrorKind::Transport(TransportErrorKind::Config),
            ErrorKind::TimedOut,
            ErrorKind::BreakerOpen,
            ErrorKind::Auth,
            ErrorKind::Closed,
        ]
        .iter()
        .map(|k| k.name())
        .collect();
        assert_eq!(
            names,
            [
                "status",
                "transport",
                "timed_out",
                "breaker_open",
                "auth",
                "closed"
            ]
        );
    }

    #[test]
    fn a_cut_read_drops_only_an_unfinished_last_character() {
        let trim = |b: &'static [u8]| trim_unfinished_char(Bytes::from_static(b));
        assert_eq!(&trim(b"aaaa\xE2\x82")[..], b"aaaa");
        assert_eq!(&trim("aaaa€".as_bytes())[..], "aaaa€".as_bytes());
        // Not text before the end: binary, kept as read.
        assert_eq!(&trim(b"\xFFaa\xE2")[..], b"\xFFaa\xE2");
        assert_eq!(&trim(b"")[..], b"");
    }

    #[test]
    fn body_is_cut_at_2048_bytes_on_a_char_boundary() {
        // Short bodies are kept whole.
        assert_eq!(truncate_body(Bytes::from_static(b"short")).len(), 5);
        // Exactly 2048 ASCII bytes: kept whole; 2049: cut to 2048.
        assert_eq!(truncate_body(Bytes::from(vec![b'a'; 2048])).len(), 2048);
        assert_eq!(truncate_body(Bytes::from(vec![b'a'; 2049])).len(), 2048);
        // A 3-byte char straddling byte 2048 is dropped whole.
        let mut text = "a".repeat(2047);
        text.push('€'); // bytes 2047..2050
        text.push_str("tail");
        let cut = truncate_body(Bytes::from(text));
        assert_eq!(cut.len(), 2047);
        assert!(std::str::from_utf8(&cut).is_ok());
        // A 4-byte char ending exactly at 2048 is kept.
        let mut text = "a".repeat(2044);
        text.push('😀');
        text.push('z');
        assert_eq!(truncate_body(Bytes::from(text)).len(), 2048);
        // A body that is not UTF-8 is cut at exactly 2048 bytes.
        let binary: Vec<u8> = (0..5000u32).map(|i| (i % 256) as u8 | 0x80).collect();
        assert_eq!(truncate_body(Bytes::from(binary)).len(), 2048);
        // ... also when its last bytes look like a 4-byte character the cut split,
        // until the byte past the cut shows it is not one (as the loop hands a body
        // over: the limit plus one byte).
        let mut lookalike = vec![b'a'; 2045];
        lookalike.extend_from_slice(&[0xF0, 0x9F, 0x98, 0xFF]);
        assert_eq!(truncate_body(Bytes::from(lookalike)).len(), 2048);
        // At most 2048 bytes is never cut, even ending in an unfinished sequence.
        let mut unfinished = vec![b'a'; 2046];
        unfinished.extend_from_slice(&[0xE2, 0x82]);
        assert_eq!(truncate_body(Bytes::from(unfinished)).len(), 2048);
        // Through the error: the body is kept, cut, and readable as text.
        let e = status(500, 1).with_response(Bytes::from("é".repeat(2000)), HeaderMap::new());
        assert_eq!(e.body().unwrap().len(), 2048);
        assert_eq!(e.body_text().unwrap().chars().count(), 1024);
    }

    #[test]
    fn a_binary_body_whose_cut_looks_like_a_split_character_is_cut_at_the_limit() {
        // The prefix ends in the first two bytes of a three-byte sequence, but the
        // bytes past the cut do not finish it: binary, so exactly the limit.
        let mut body = vec![b'a'; MAX_ERROR_BODY - 2];
        body.extend_from_slice(&[0xE2, 0x82]);
        body.extend_from_slice(&[0xFF; 10]);
        assert_eq!(truncate_body(Bytes::from(body)).len(), MAX_ERROR_BODY);
        // The same start finished past the cut (a euro sign): text, cut before it.
        let mut body = vec![b'a'; MAX_ERROR_BODY - 2];
        body.extend_from_slice("€ tail".as_bytes());
        assert_eq!(truncate_body(Bytes::from(body)).len(), MAX_ERROR_BODY - 2);
        // Only one byte past the cut, and a four-byte sequence it cannot finish: the
        // body ends before it can tell, so it is taken as text (what the loop keeps:
        // the limit plus one byte).
        let mut body = vec![b'a'; MAX_ERROR_BODY - 2];
        body.extend_from_slice(&"😀".as_bytes()[..3]);
        assert_eq!(truncate_body(Bytes::from(body)).len(), MAX_ERROR_BODY - 2);
        // A character finished past the cut, then binary: the character is text, so
        // it is dropped whole; what follows it does not matter.
        let mut body = vec![b'a'; MAX_ERROR_BODY - 1];
        body.extend_from_slice(&[0xC3, 0xA9, 0xFF, 0xFF, 0xFF]);
        assert_eq!(truncate_body(Bytes::from(body)).len(), MAX_ERROR_BODY - 1);
        // A four-byte character with three of its bytes before the cut.
        let mut text = "a".repeat(MAX_ERROR_BODY - 3);
        text.push('😀');
        text.push('z');
        assert_eq!(truncate_body(Bytes::from(text)).len(), MAX_ERROR_BODY - 3);
    }

    #[test]
    fn kinds_display_their_name_and_code() {
        assert_eq!(
            ErrorKind::Status(StatusCode::SERVICE_UNAVAILABLE).to_string(),
            "status 503"
        );
        assert_eq!(
            ErrorKind::Transport(TransportErrorKind::NotSent).to_string(),
            "transport not_sent"
        );
        assert_eq!(ErrorKind::TimedOut.to_string(), "timed_out");
        assert_eq!(ErrorKind::BreakerOpen.to_string(), "breaker_open");
    }
}
