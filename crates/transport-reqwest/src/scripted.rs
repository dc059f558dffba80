//! [`ScriptedReqwest`]: the testkit's scripted API behind reqwest's types, so code
//! written for [`ReqwestTransport`](crate::ReqwestTransport) runs on virtual time.
//!
//! A call over `ReqwestTransport` takes a closure that receives a [`reqwest::Client`]
//! and returns a [`reqwest::RequestBuilder`], and gets back a [`ReqwestResponse`] to be
//! read with its `text`, `bytes` and `chunk`, or with reqwest's own methods through
//! `into_inner()` (`json`). The testkit's
//! [`ScriptedTransport`] has types of its own, so that code could not be tested on
//! it. `ScriptedReqwest` has the same four port types as `ReqwestTransport`; it
//! builds the draft as reqwest does (the same `prepare`, with the same
//! [`Config`](vantage_api_pool::TransportErrorKind::Config) errors, and hyper's
//! refusal of an HTTP version it cannot send, or of `CONNECT` over HTTP/1.0, as
//! `Config` at the send, nothing sent), hands the
//! request to a [`ScriptedTransport`] on a [`VirtualRuntime`], and turns its scripted
//! reply into a real [`reqwest::Response`] whose body streams the reply's chunks on
//! the virtual clock. Nothing touches a socket.
//!
//! What the script sees and records of the request:
//!
//! | of the `reqwest::Request` | in the [`ScriptedRequest`](vantage_api_pool_testkit::ScriptedRequest) |
//! |---|---|
//! | method | the method |
//! | URL | its path and query (`/orders?page=2`): `on_path` routes on it; scheme, host and port are not kept |
//! | headers the request carries | the headers, every line (not the client's default headers, which reqwest adds when it sends) |
//! | body | its bytes; a streamed body is read to its end first (one that fails is `Interrupted` and reaches no script, as a caller's failing body does over the real adapter) |
//! | `timeout` (the request's own) | on the virtual clock, as reqwest's: from the start of the send, over the upload, the head and the whole body; a body read after it fails even when the data is there |
//! | the client's `read_timeout` | on the virtual clock, counted as reqwest counts it: the adapter's default, 30 s ([`ScriptedReqwest::read_timeout`]) |
//!
//! And of the reply, in the response:
//!
//! | reply | `ReqwestResponse` |
//! |---|---|
//! | status and headers | the same |
//! | the body of a response to `HEAD`, or of a 1xx, 204 or 304 | empty, `content_length()` 0 (as hyper reads them; the script's body is not read) |
//! | a `Content-Length` | as hyper reads it: `content_length()` is what is left of it, bytes past it are not delivered, a body that ends short of it fails `Interrupted`; one beside a `Transfer-Encoding` is ignored; a list of one value (`3, 3`) reads as that value; one hyper cannot read (not a number, values that disagree) fails the send `Interrupted` |
//! | a 1xx other than 101 | returned as it is (hyper would wait past it for the final response, which a script of one reply per send does not have) |
//! | a 3xx | returned as it is, never followed (script the hop the call should see; mark one that went to another origin with `Reply::credentials_dropped`) |
//! | body chunks, delays, stalls | streamed as reqwest's body: `chunk`, `bytes`, `text`, `json` wait on the virtual clock |
//! | a body that fails after `n` bytes | a reqwest body error after them, mapped as the real adapter maps one: `TimedOut` for a scripted `TimedOut`, `Interrupted` otherwise |
//! | [`credentials_dropped`](vantage_api_pool_testkit::Reply::credentials_dropped) | [`credentials_dropped`](vantage_api_pool::transport::SendTransportResponse::credentials_dropped) |
//! | [`answered_by_redirect`](vantage_api_pool_testkit::Reply::answered_by_redirect) | [`answered_by_redirect`](vantage_api_pool::transport::SendTransportResponse::answered_by_redirect) |
//! | — | `url()` is `http://no.url.provided.local/` (reqwest's for a response it did not fetch) |
//!
//! A failed send ([`Reply::fail`](vantage_api_pool_testkit::Reply::fail), a stall ended
//! by a time limit) is the scripted [`TransportError`] as it is.
//!
//! ```
//! use std::time::Duration;
//! use vantage_api_pool::{CallPolicy, Jitter, ResilientClient, RetryPolicy, Runtime, TokenSource, Transport};
//! use vantage_api_pool_reqwest::{ReqwestResponse, ScriptedReqwest, reqwest};
//! use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
//!
//! // The code under test, written for reqwest: over `ReqwestTransport` it runs as is,
//! // with or without a token source.
//! async fn order_count<T, R, A>(api: &ResilientClient<T, R, A>) -> Result<usize, Box<dyn std::error::Error>>
//! where
//!     T: Transport<Handle = reqwest::Client, Draft = reqwest::RequestBuilder, Response = ReqwestResponse>,
//!     R: Runtime,
//!     A: TokenSource,
//! {
//!     let response = api.execute(|http| http.get("https://orders.example/orders?open=1")).await?;
//!     Ok(response.text().await?.lines().count())
//! }
//!
//! let rt = VirtualRuntime::new();
//! let script = ScriptedTransport::new(&rt);
//! script.push(Reply::status(503).header("retry-after", "2"));
//! script.push(Reply::ok().body("a\nb\nc").chunk_size(2));
//! let api = ResilientClient::builder(ScriptedReqwest::new(script.clone())?, rt.clone())
//!     .default_policy(CallPolicy::bounded(RetryPolicy::default()).with_jitter(Jitter::None)?)
//!     .build()?;
//!
//! assert_eq!(rt.block_on(order_count(&api))?.unwrap(), 3);
//! assert_eq!(rt.elapsed(), Duration::from_secs(2)); // the server's delay, on virtual time
//! assert_eq!(script.requests()[1].path, "/orders?open=1");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use vantage_api_pool::transport::{SendTransport, SendTransportResponse};
use vantage_api_pool::{TransportError, TransportErrorKind};
use vantage_api_pool_testkit::{
    ScriptedRequestBuilder, ScriptedResponse, ScriptedTransport, VirtualRuntime,
};

use crate::{ReqwestRequest, ReqwestResponse};

/// The testkit's [`ScriptedTransport`] behind reqwest's types: a transport whose
/// request closure receives a [`reqwest::Client`] and whose responses are
/// [`ReqwestResponse`]s, answered from the script on the virtual clock. See the
/// [module docs](self) for what passes through and what does not.
///
/// Clones of the `ScriptedTransport` given to [`new`](ScriptedReqwest::new) share its
/// script and record: keep one to push replies and read
/// [`requests`](ScriptedTransport::requests). Clones of a `ScriptedReqwest` share
/// them too, and keep its read timeout, as clones of a [`ReqwestTransport`]
/// share its `reqwest::Client`: give one to a client under test and another to a
/// token source that fetches over HTTP, both answered from one script.
///
/// [`ReqwestTransport`]: crate::ReqwestTransport
#[derive(Clone)]
pub struct ScriptedReqwest {
    /// Only builds drafts: nothing is ever sent through it.
    http: reqwest::Client,
    script: ScriptedTransport,
    read_timeout: Option<Duration>,
}

impl ScriptedReqwest {
    /// A transport answered by `script`, with the read timeout of the clients the
    /// adapter builds ([`DEFAULT_READ_TIMEOUT`](crate::DEFAULT_READ_TIMEOUT), 30 s;
    /// see [`read_timeout`](ScriptedReqwest::read_timeout)).
    ///
    /// # Errors
    ///
    /// [`TransportErrorKind::Config`] when reqwest cannot build the client the request
    /// closures receive (its TLS set-up failed); it never connects anywhere.
    pub fn new(script: ScriptedTransport) -> Result<Self, TransportError> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .map_err(crate::transport_error)?;
        Ok(ScriptedReqwest {
            http,
            script,
            read_timeout: Some(crate::DEFAULT_READ_TIMEOUT),
        })
    }

    /// reqwest's client `read_timeout` on the virtual clock, counted as reqwest counts
    /// it: a response head that does not come within `timeout` of the start of the
    /// send (a streamed body's upload included) fails with the transport's own
    /// `TimedOut`; a body read fails once `timeout` has passed since the body was first
    /// polled or last handed a piece, even when the next piece is there already (a
    /// reader that dawdles between pieces times out too). A body's timeout reads as
    /// [`reqwest::Error::is_timeout`], and [`body_error`](crate::body_error) maps it to
    /// `TimedOut`. A piece that comes exactly at the deadline is late, as the timer is
    /// looked at first. `None`: no read timeout, like a `reqwest::Client` of your own
    /// without one, so a scripted body that stalls stalls its reader until something of
    /// the caller's ends the read (the driver reports a deadlock if nothing will).
    ///
    /// reqwest panics on a read timeout too long to add to an `Instant`
    /// (`Duration::MAX`) at the first read; here such a timeout never ends a read.
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool::{ResilientClient, TransportErrorKind};
    /// use vantage_api_pool_reqwest::ScriptedReqwest;
    /// use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
    ///
    /// let rt = VirtualRuntime::new();
    /// let script = ScriptedTransport::new(&rt);
    /// script.push(Reply::ok().body("[1, 2").body_stalls_after(3));
    /// let transport = ScriptedReqwest::new(script)?.read_timeout(Some(Duration::from_secs(2)));
    /// let api = ResilientClient::builder(transport, rt.clone()).build()?;
    /// let read = rt.block_on(async {
    ///     let response = api.execute(|http| http.get("https://orders.example/")).await?;
    ///     Ok::<_, vantage_api_pool::ClientError>(response.bytes().await)
    /// })??;
    /// assert_eq!(read.unwrap_err().kind(), TransportErrorKind::TimedOut);
    /// assert_eq!(rt.elapsed(), Duration::from_secs(2));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn read_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.read_timeout = timeout;
        self
    }

    /// The script behind it (the one given to [`new`](ScriptedReqwest::new)).
    #[must_use]
    pub fn script(&self) -> &ScriptedTransport {
        &self.script
    }
}

impl fmt::Debug for ScriptedReqwest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptedReqwest")
            .field("script", &self.script)
            .field("read_timeout", &self.read_timeout)
            .finish_non_exhaustive()
    }
}

impl SendTransport for ScriptedReqwest {
    type Handle = reqwest::Client;
    type Draft = reqwest::RequestBuilder;
    type Request = ReqwestRequest;
    type Response = ReqwestResponse;

    fn handle(&self) -> &reqwest::Client {
        &self.http
    }

    /// As [`ReqwestTransport`](crate::ReqwestTransport)'s: reqwest builds the draft;
    /// an invalid URL, header or body, or a scheme other than `http` or `https`, is
    /// [`Config`](TransportErrorKind::Config).
    fn prepare(&self, draft: reqwest::RequestBuilder) -> Result<ReqwestRequest, TransportError> {
        crate::build_request(draft)
    }

    /// Reads a streamed body to its end, then sends the request to the script and
    /// turns its reply into a [`ReqwestResponse`] (see the [module docs](self)).
    /// Dropping the future abandons the send, the script's with it (it leaves
    /// [`in_flight`](ScriptedTransport::in_flight)).
    fn send(
        &self,
        request: ReqwestRequest,
    ) -> impl Future<Output = Result<ReqwestResponse, TransportError>> + Send {
        let (_, request) = request.into_parts();
        let head_request = request.method() == http::Method::HEAD;
        let timeout = request.timeout().copied();
        let refused = refused_by_hyper(&request);
        async move {
            if let Some(err) = refused {
                return Err(err);
            }
            let runtime = self.script.runtime();
            let start = runtime.now();
            let limits = ReadLimits {
                runtime: runtime.clone(),
                read: self.read_timeout,
                until: timeout.map(|t| start.saturating_add(t)),
            };
            // As reqwest's, both limits run from the start of the send, over the upload
            // of a streamed body too, until the head.
            let head_deadline = earliest(limits.read_from(start), limits.until);
            let (response, length) = timer_first(runtime, head_deadline, async {
                let draft = scripted_draft(request).await?;
                let request = self.script.prepare(draft)?;
                let response = self.script.send(request).await?;
                let length = body_length(&response, head_request)?;
                Ok((response, length))
            })
            .await
            .map_err(|()| timed_out())??;
            Ok(into_reqwest(response, length, limits))
        }
    }

    /// The script's admission ([`admit_delay`](ScriptedTransport::admit_delay),
    /// [`admit_with`](ScriptedTransport::admit_with)). Dropping the future gives up
    /// the wait; nothing is counted.
    fn admit(&self) -> impl Future<Output = ()> + Send {
        self.script.admit()
    }

    /// Counted by the script ([`ScriptedTransport::distrusted`]).
    fn distrust_connection(&self) {
        self.script.distrust_connection();
    }
}

/// The script's draft of a built reqwest request.
async fn scripted_draft(
    request: reqwest::Request,
) -> Result<ScriptedRequestBuilder, TransportError> {
    let url = request.url();
    let path = match url.query() {
        Some(query) => format!("{}?{query}", url.path()),
        None => url.path().to_owned(),
    };
    let mut draft =
        vantage_api_pool_testkit::ScriptedHttp::default().request(request.method().clone(), path);
    for (name, value) in request.headers() {
        draft = draft.header(name.clone(), value.clone());
    }
    let body = match request.body() {
        None => Bytes::new(),
        Some(body) => match body.as_bytes() {
            Some(bytes) => Bytes::copy_from_slice(bytes),
            None => read_streamed(request).await?,
        },
    };
    Ok(draft.body(body))
}

/// A streamed request body, read to its end.
async fn read_streamed(mut request: reqwest::Request) -> Result<Bytes, TransportError> {
    let Some(mut body) = request.body_mut().take() else {
        return Ok(Bytes::new());
    };
    let mut bytes = Vec::new();
    loop {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        match frame {
            None => return Ok(Bytes::from(bytes)),
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    bytes.extend_from_slice(data);
                }
            }
            Some(Err(err)) => {
                let err = crate::transport_error(err);
                return Err(TransportError::new(
                    TransportErrorKind::Interrupted,
                    format!("the request body failed: {}", err.message()),
                ));
            }
        }
    }
}

/// The script's response as reqwest's, its body `length` bytes long when known
/// ([`body_length`]; of length 0, the script's body is not read).
fn into_reqwest(
    response: ScriptedResponse,
    length: Option<u64>,
    limits: ReadLimits,
) -> ReqwestResponse {
    let dropped = response.credentials_dropped();
    let answered = response.answered_by_redirect();
    let status = response.status();
    let headers = response.headers().clone();
    let (state, remaining) = match length {
        Some(0) => (BodyState::Done, Some(0)),
        _ => (BodyState::Idle(response), length),
    };
    let body = ScriptedBody {
        state: Mutex::new(Reader {
            state,
            read_deadline: None,
            timer: None,
        }),
        remaining,
        limits,
    };
    let mut head = http::Response::new(reqwest::Body::wrap(body));
    *head.status_mut() = status;
    *head.headers_mut() = headers;
    ReqwestResponse::answered(reqwest::Response::from(head), answered, dropped)
}

type Reading =
    Pin<Box<dyn Future<Output = (ScriptedResponse, Result<Option<Bytes>, TransportError>)> + Send>>;

/// A scripted response's body as an [`http_body::Body`] for reqwest: each frame is
/// the next chunk the script gives, on the virtual clock. The state sits in a mutex
/// only to make the body `Sync`, as [`reqwest::Body::wrap`] asks; `poll_frame` has it
/// by `&mut` and never locks.
///
/// With a `Content-Length`, it reads as hyper reads a body: the size hint is what is
/// left of that length, bytes past it are not delivered, and a body that ends short of
/// it fails (`UnexpectedEof`, which the adapter maps to `Interrupted`).
///
/// Its time limits are reqwest's body wrappers' (`ReadTimeoutBody`,
/// `TotalTimeoutBody`): before the body is polled, the request's deadline and the read
/// deadline are looked at, and either one passed fails the read with a timeout, even
/// when the next piece is there already; the read deadline is set at the first poll
/// and again each time a piece is handed over.
struct ScriptedBody {
    state: Mutex<Reader>,
    /// Bytes left of the `Content-Length`, when the response has one.
    remaining: Option<u64>,
    limits: ReadLimits,
}

/// The body's reading state (in the mutex only for `Sync`).
struct Reader {
    state: BodyState,
    /// When the read timeout ends the read, once the body has been polled.
    read_deadline: Option<vantage_api_pool::Instant>,
    /// A sleep to the nearest deadline, to be woken by while a piece is awaited.
    timer: Option<vantage_api_pool_testkit::Sleep>,
}

enum BodyState {
    Idle(ScriptedResponse),
    Reading(Reading),
    Done,
}

impl HttpBody for ScriptedBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        let reader = this.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        let limits = &this.limits;
        let now = limits.runtime.now();
        if reader.read_deadline.is_none() {
            reader.read_deadline = limits.read_from(now);
        }
        // The timers first, as reqwest's body wrappers look at them.
        if let Some(deadline) = earliest(reader.read_deadline, limits.until) {
            if reader
                .timer
                .as_ref()
                .map(vantage_api_pool_testkit::Sleep::deadline)
                != Some(deadline)
            {
                reader.timer = Some(limits.runtime.sleep_until(deadline));
            }
            if let Some(timer) = reader.timer.as_mut()
                && Pin::new(timer).poll(cx).is_ready()
            {
                reader.timer = None;
                reader.state = BodyState::Done;
                return Poll::Ready(Some(Err(io_error(timed_out()))));
            }
        }
        let state = &mut reader.state;
        loop {
            match std::mem::replace(state, BodyState::Done) {
                BodyState::Idle(mut response) => {
                    *state = BodyState::Reading(Box::pin(async move {
                        let chunk = response.chunk().await;
                        (response, chunk)
                    }));
                }
                BodyState::Reading(mut reading) => {
                    return match reading.as_mut().poll(cx) {
                        Poll::Pending => {
                            *state = BodyState::Reading(reading);
                            Poll::Pending
                        }
                        Poll::Ready((response, Ok(Some(mut chunk)))) => {
                            match &mut this.remaining {
                                Some(left) => {
                                    let keep = usize::try_from(*left)
                                        .map_or(chunk.len(), |left| left.min(chunk.len()));
                                    chunk.truncate(keep);
                                    *left -= keep as u64;
                                    if *left > 0 {
                                        *state = BodyState::Idle(response);
                                    }
                                }
                                None => *state = BodyState::Idle(response),
                            }
                            reader.read_deadline = limits.read_from(limits.runtime.now());
                            Poll::Ready(Some(Ok(Frame::data(chunk))))
                        }
                        Poll::Ready((_, Ok(None))) => match this.remaining {
                            Some(left) if left > 0 => Poll::Ready(Some(Err(io::Error::new(
                                io::ErrorKind::UnexpectedEof,
                                "the body ended before its Content-Length",
                            )))),
                            _ => Poll::Ready(None),
                        },
                        Poll::Ready((_, Err(err))) => Poll::Ready(Some(Err(io_error(err)))),
                    };
                }
                BodyState::Done => return Poll::Ready(None),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == Some(0)
    }

    fn size_hint(&self) -> SizeHint {
        self.remaining
            .map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}

/// The time limits reqwest puts on reading a response, on the virtual clock: the
/// client's read timeout, and the request's own `timeout`, a deadline from the start
/// of the send that covers the body too.
#[derive(Clone)]
struct ReadLimits {
    runtime: VirtualRuntime,
    read: Option<Duration>,
    until: Option<vantage_api_pool::Instant>,
}

impl ReadLimits {
    /// When the read timeout ends a read that starts at `at`.
    fn read_from(&self, at: vantage_api_pool::Instant) -> Option<vantage_api_pool::Instant> {
        self.read.map(|t| at.saturating_add(t))
    }
}

/// The nearer of two deadlines, if any.
fn earliest(
    a: Option<vantage_api_pool::Instant>,
    b: Option<vantage_api_pool::Instant>,
) -> Option<vantage_api_pool::Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// `work`, unless `deadline` comes first (`Err(())`). The deadline is looked at before
/// the work at every poll, as reqwest looks at its timers, so work that is only ready
/// at the deadline, or after it, loses.
async fn timer_first<F: Future>(
    runtime: &VirtualRuntime,
    deadline: Option<vantage_api_pool::Instant>,
    work: F,
) -> Result<F::Output, ()> {
    let Some(deadline) = deadline else {
        return Ok(work.await);
    };
    let mut timer = runtime.sleep_until(deadline);
    let mut work = std::pin::pin!(work);
    std::future::poll_fn(|cx| {
        if Pin::new(&mut timer).poll(cx).is_ready() {
            return Poll::Ready(Err(()));
        }
        work.as_mut().poll(cx).map(Ok)
    })
    .await
}

/// What a read that a time limit ended fails with.
fn timed_out() -> TransportError {
    TransportError::new(TransportErrorKind::TimedOut, "operation timed out")
}

/// The refusal hyper-util gives a request before anything is sent, as the real
/// adapter maps it ([`Config`](TransportErrorKind::Config)): an HTTP version it
/// cannot send (HTTP/0.9, HTTP/3), or `CONNECT` over HTTP/1.0. (An HTTP/2 request
/// over a connection that turns out HTTP/1 is refused too, over the real adapter;
/// a script has no connection to tell.)
fn refused_by_hyper(request: &reqwest::Request) -> Option<TransportError> {
    let refusal = match request.version() {
        http::Version::HTTP_11 | http::Version::HTTP_2 => return None,
        http::Version::HTTP_10 if request.method() != http::Method::CONNECT => return None,
        http::Version::HTTP_10 => "UserUnsupportedRequestMethod",
        _ => "UserUnsupportedVersion",
    };
    Some(TransportError::new(
        TransportErrorKind::Config,
        format!("error sending request: client error ({refusal})"),
    ))
}

/// Whether hyper reads no body for this response: one to a `HEAD`, a 1xx, 204 or 304
/// (it does not look at their `Content-Length`).
fn bodiless(status: http::StatusCode, head_request: bool) -> bool {
    head_request
        || status.is_informational()
        || status == http::StatusCode::NO_CONTENT
        || status == http::StatusCode::NOT_MODIFIED
}

/// The body's length as hyper frames it: 0 for a response to `HEAD`, a 1xx, 204 or
/// 304, whatever its `Content-Length` says; unknown when a `Transfer-Encoding` frames
/// it (a `Content-Length` beside it is ignored); else its `Content-Length`. One hyper
/// cannot read (not a number, lines that disagree) fails the send `Interrupted`, as
/// over the real adapter.
fn body_length(
    response: &ScriptedResponse,
    head_request: bool,
) -> Result<Option<u64>, TransportError> {
    let headers = response.headers();
    if bodiless(response.status(), head_request) {
        return Ok(Some(0));
    }
    if headers.contains_key(http::header::TRANSFER_ENCODING) {
        return Ok(None);
    }
    match response.content_length() {
        None if headers.contains_key(http::header::CONTENT_LENGTH) => Err(TransportError::new(
            TransportErrorKind::Interrupted,
            "invalid content-length parsed",
        )),
        length => Ok(length),
    }
}

/// A scripted body failure as the I/O error reqwest would meet: a `TimedOut` one
/// reads as a timeout ([`reqwest::Error::is_timeout`]), any other as a broken body.
fn io_error(err: TransportError) -> io::Error {
    let kind = match err.kind() {
        TransportErrorKind::TimedOut => io::ErrorKind::TimedOut,
        _ => io::ErrorKind::ConnectionReset,
    };
    io::Error::new(kind, err)
}
