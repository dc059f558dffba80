//! The `Transport` port: turn a caller's draft into a request, send it, read the answer.
//!
//! A transport has three steps and four types:
//!
//! 1. the caller's closure receives [`Transport::handle`] (for reqwest, the shared
//!    `reqwest::Client`) and returns a [`Transport::Draft`] (a `reqwest::RequestBuilder`);
//! 2. [`Transport::prepare`] turns the draft into a [`Transport::Request`] that the
//!    attempt loop can inspect and change through [`PreparedRequest`] (method, headers);
//! 3. [`Transport::send`] sends it and returns the response head as a
//!    [`Transport::Response`], whose body the caller reads, or a [`TransportError`].
//!
//! The closure runs again for every send, so every retry gets a fresh request.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};

/// Sends one request. Implemented by `ReqwestTransport`, the testkit's
/// `ScriptedTransport`, or anything of your own.
///
/// No method has a `Send` bound; see [`Runtime`](crate::Runtime) for why. A transport
/// whose futures are `Send` should implement [`SendTransport`] instead (it gets this
/// trait from a blanket impl), so that code generic over it can spawn its calls.
///
/// A transport of your own implements this trait, [`PreparedRequest`] for its
/// request and [`TransportResponse`] for its response head, and maps its failures to
/// [`TransportErrorKind`]s (its table says how). Here one over an in-process service
/// that keeps its state in an `Rc` (so its futures are not `Send`, and it
/// implements `Transport`, not `SendTransport`):
///
/// ```
/// use std::cell::Cell;
/// use std::rc::Rc;
/// use vantage_api_pool::bytes::Bytes;
/// use vantage_api_pool::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
/// use vantage_api_pool::{
///     PreparedRequest, ResilientClient, Transport, TransportError, TransportErrorKind,
///     TransportResponse,
/// };
///
/// /// The caller's closure gets a `Service` and returns a `Draft`.
/// struct Service {
///     answered: Rc<Cell<u32>>,
/// }
///
/// struct Draft {
///     path: String,
/// }
///
/// struct Request {
///     method: Method,
///     path: String,
///     headers: HeaderMap,
/// }
///
/// impl PreparedRequest for Request {
///     fn method(&self) -> Option<&Method> {
///         Some(&self.method)
///     }
///     fn header(&self, name: &HeaderName) -> Option<&HeaderValue> {
///         self.headers.get(name)
///     }
///     fn set_header(&mut self, name: HeaderName, value: HeaderValue) {
///         self.headers.insert(name, value);
///     }
/// }
///
/// struct Response {
///     status: StatusCode,
///     headers: HeaderMap,
///     body: Option<Bytes>,
/// }
///
/// impl TransportResponse for Response {
///     fn status(&self) -> StatusCode {
///         self.status
///     }
///     fn headers(&self) -> &HeaderMap {
///         &self.headers
///     }
///     // The loop reads an error response's body (its first 2048 bytes) through this.
///     async fn chunk(&mut self) -> Result<Option<Bytes>, TransportError> {
///         Ok(self.body.take())
///     }
/// }
///
/// struct InProcess {
///     service: Service,
/// }
///
/// impl Transport for InProcess {
///     type Handle = Service;
///     type Draft = Draft;
///     type Request = Request;
///     type Response = Response;
///
///     fn handle(&self) -> &Service {
///         &self.service
///     }
///
///     fn prepare(&self, draft: Draft) -> Result<Request, TransportError> {
///         if !draft.path.starts_with('/') {
///             // Our side, nothing sent: the call ends at once.
///             return Err(TransportError::new(TransportErrorKind::Config, "a path starts with /"));
///         }
///         Ok(Request { method: Method::GET, path: draft.path, headers: HeaderMap::new() })
///     }
///
///     async fn send(&self, request: Request) -> Result<Response, TransportError> {
///         // A real transport writes the request here and maps what goes wrong: see
///         // `TransportErrorKind` (when unsure, `Interrupted`).
///         let answered = self.service.answered.get() + 1;
///         self.service.answered.set(answered);
///         let status = if answered == 1 { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
///         let body = format!("{} {}", request.method, request.path);
///         Ok(Response { status, headers: HeaderMap::new(), body: Some(Bytes::from(body)) })
///     }
/// }
///
/// # use vantage_api_pool_testkit::VirtualRuntime;
/// let rt = VirtualRuntime::new(); // or the runtime you run on
/// let answered = Rc::new(Cell::new(0));
/// let transport = InProcess { service: Service { answered: answered.clone() } };
/// let client = ResilientClient::builder(transport, rt.clone()).build()?;
/// let call = client.execute(|_service| Draft { path: "/orders".into() });
/// let mut response = rt.block_on(call)??; // the 503 is retried
/// assert_eq!((response.status(), answered.get()), (StatusCode::OK, 2));
/// assert_eq!(rt.block_on(response.chunk())??.unwrap(), "GET /orders");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Transport {
    /// What the caller's request closure receives, for example `reqwest::Client`.
    type Handle: ?Sized;
    /// What the caller's request closure returns, for example `reqwest::RequestBuilder`.
    type Draft;
    /// A request ready to send, which the loop can inspect and change.
    type Request: PreparedRequest;
    /// A response head with a body still to be read, handed to the caller on success.
    type Response: TransportResponse;

    /// The handle passed to the caller's request closure on every send.
    fn handle(&self) -> &Self::Handle;

    /// Turns a draft into a request.
    ///
    /// # Errors
    ///
    /// A draft that cannot be prepared should fail with
    /// [`TransportErrorKind::Config`]: the call then ends at once, nothing sent. The
    /// loop reports any error from here as `Config` (with its message), whatever kind
    /// it carries.
    fn prepare(&self, draft: Self::Draft) -> Result<Self::Request, TransportError>;

    /// Sends one request and resolves when the response head has arrived.
    ///
    /// Dropping the future abandons the request: a transport should close or
    /// discard whatever connection was carrying it.
    fn send(
        &self,
        request: Self::Request,
    ) -> impl Future<Output = Result<Self::Response, TransportError>>;

    /// Waits for a rate limit shared with other senders, before every send.
    ///
    /// The time spent here is not charged to a call's budget. The default admits at
    /// once. Dropping the future gives up the wait and must not consume anything.
    ///
    /// It is awaited on every pass through the gate (a redial's and a replay's too),
    /// once the breaker let the pass in and before the token, the permit and the
    /// breaker's second look: a pass that then sends nothing (the breaker turns it
    /// back after a wait, its token was refused meanwhile) has spent an admission,
    /// and its next pass asks for another. A shared limit counts admissions, which
    /// can outnumber sends.
    fn admit(&self) -> impl Future<Output = ()> {
        std::future::ready(())
    }

    /// Called after the pool's own time limit cut a send (or the read of a body: an
    /// error body, or the body of a call that reads it): the connection it used may
    /// be stuck, so the next send should not reuse it. Not called for a `TimedOut` the transport reports itself (its own timeout
    /// already knows which connection it gave up on). The default does nothing.
    fn distrust_connection(&self) {}
}

/// [`Transport`] for generic code that spawns its calls: every future it returns is
/// `Send`, and so is everything a call holds while it waits.
///
/// The ports carry no `Send` bound, so code generic over `T: Transport` cannot prove
/// that a call's future is `Send`, even when every concrete transport's is (stable
/// Rust cannot name the future a trait method returns in a bound). A transport that
/// implements this trait instead gets [`Transport`] from a blanket impl, and code
/// generic over `T: SendTransport` (with [`SendRuntime`](crate::runtime::SendRuntime) and
/// [`SendTokenSource`](crate::auth::SendTokenSource)) can `tokio::spawn` its calls.
///
/// Bound such code on `SendTransport` alone, never on `Transport` as well: with both,
/// the compiler reads `Transport`'s unbounded futures again and reports that
/// `<T as Transport>::Request` (or a future) "cannot be sent between threads safely".
/// Bounds that come from an enclosing `impl` block or a supertrait count too, so an
/// `impl<T: Transport> Service<T>` cannot gain a spawning method through a
/// `where T: SendTransport` on that method; bound the `impl` on `SendTransport`.
///
/// `ReqwestTransport` (on native targets) and the testkit's `ScriptedTransport`
/// implement this trait. A type implements one of the two traits, never both; a
/// generic decorator over an inner transport implements one of them too: `impl<T:
/// SendTransport> SendTransport for Counting<T>` stays spawnable over a `Send` inner
/// transport, `impl<T: Transport> Transport for Counting<T>` takes any inner one (and
/// a call over it is still `Send` in concrete code when the inner one's futures are).
///
/// The variants live in their modules, not at the crate root, so a glob import of the
/// root (`use vantage_api_pool::*`) brings one trait of each pair. With both
/// `Transport` and `SendTransport` in scope, a method call on an adapter such as
/// `transport.send(request)` is ambiguous (E0034): name the trait,
/// `SendTransport::send(&transport, request)`.
///
/// ```
/// use vantage_api_pool::ResilientClient;
/// use vantage_api_pool::auth::SendTokenSource;
/// use vantage_api_pool::runtime::SendRuntime;
/// use vantage_api_pool::transport::SendTransport;
///
/// /// Generic over the ports, and still spawnable. The request closure is given the
/// /// transport's own handle (a `reqwest::Client`, or the testkit's `ScriptedHttp`),
/// /// so code that runs over both also abstracts how it builds a request.
/// fn spawnable<T, R, A>(
///     client: ResilientClient<T, R, A>,
///     build: fn(&T::Handle) -> T::Draft,
/// ) -> impl std::future::Future<Output = bool> + Send + 'static
/// where
///     T: SendTransport + 'static,
///     R: SendRuntime + 'static,
///     A: SendTokenSource + 'static,
/// {
///     async move { client.execute(build).await.is_ok() }
/// }
/// ```
///
/// The same function bound on the plain ports does not compile: the compiler cannot
/// tell that their futures are `Send`.
///
/// ```compile_fail
/// use vantage_api_pool::{ResilientClient, Runtime, TokenSource, Transport};
///
/// fn spawnable<T, R, A>(
///     client: ResilientClient<T, R, A>,
///     build: fn(&T::Handle) -> T::Draft,
/// ) -> impl std::future::Future<Output = bool> + Send + 'static
/// where
///     T: Transport + Send + Sync + 'static,
///     R: Runtime + Send + Sync + 'static,
///     A: TokenSource + Send + Sync + 'static,
/// {
///     async move { client.execute(build).await.is_ok() }
/// }
/// ```
pub trait SendTransport: Send + Sync {
    /// As [`Transport::Handle`].
    type Handle: ?Sized;
    /// As [`Transport::Draft`].
    type Draft;
    /// As [`Transport::Request`].
    type Request: PreparedRequest + Send;
    /// As [`Transport::Response`], with a `Send` body read.
    type Response: SendTransportResponse;

    /// As [`Transport::handle`].
    fn handle(&self) -> &Self::Handle;

    /// As [`Transport::prepare`].
    ///
    /// # Errors
    ///
    /// A draft that cannot be prepared, as for [`Transport::prepare`].
    fn prepare(&self, draft: Self::Draft) -> Result<Self::Request, TransportError>;

    /// As [`Transport::send`], with a `Send` future.
    fn send(
        &self,
        request: Self::Request,
    ) -> impl Future<Output = Result<Self::Response, TransportError>> + Send;

    /// As [`Transport::admit`], with a `Send` future. The default admits at once.
    fn admit(&self) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }

    /// As [`Transport::distrust_connection`]. The default does nothing.
    fn distrust_connection(&self) {}
}

impl<T: SendTransport> Transport for T {
    type Handle = T::Handle;
    type Draft = T::Draft;
    type Request = T::Request;
    type Response = T::Response;

    #[inline]
    fn handle(&self) -> &Self::Handle {
        SendTransport::handle(self)
    }

    #[inline]
    fn prepare(&self, draft: Self::Draft) -> Result<Self::Request, TransportError> {
        SendTransport::prepare(self, draft)
    }

    #[inline]
    fn send(
        &self,
        request: Self::Request,
    ) -> impl Future<Output = Result<Self::Response, TransportError>> {
        SendTransport::send(self, request)
    }

    #[inline]
    fn admit(&self) -> impl Future<Output = ()> {
        SendTransport::admit(self)
    }

    #[inline]
    fn distrust_connection(&self) {
        SendTransport::distrust_connection(self);
    }
}

/// A prepared request as the attempt loop sees it: enough to decide idempotency and
/// to set the auth, idempotency and retry-count headers.
pub trait PreparedRequest {
    /// The request's method, if the transport has such a thing.
    ///
    /// A request without a method counts as not idempotent unless the policy says so.
    fn method(&self) -> Option<&Method>;

    /// The first value of header `name`, if present.
    fn header(&self, name: &HeaderName) -> Option<&HeaderValue>;

    /// Sets header `name`, replacing every value (line) it had.
    fn set_header(&mut self, name: HeaderName, value: HeaderValue);
}

/// A response head whose body has not been read yet.
pub trait TransportResponse {
    /// The status code.
    fn status(&self) -> StatusCode;

    /// The response headers.
    fn headers(&self) -> &HeaderMap;

    /// The response headers, moved out. The loop calls it once for an error
    /// response, after it has read what it needs of [`headers`](Self::headers)
    /// (`Retry-After`, the request id) and before the body, and keeps them in the
    /// [`ClientError`](crate::ClientError) (its
    /// [`headers`](crate::ClientError::headers)); after the call, the response's own
    /// may be empty. By default a clone of [`headers`](Self::headers): a transport
    /// that owns its headers should move them out (`std::mem::take`), which copies
    /// and allocates nothing.
    ///
    /// A transport that moves them must not need them afterwards: its
    /// [`chunk`](Self::chunk) has to read the body without them, and the default
    /// [`content_length`](Self::content_length), which reads `Content-Length` from
    /// [`headers`](Self::headers), gives `None` after the move (the loop reads the
    /// length only of a successful response, never of one whose headers it took).
    fn take_headers(&mut self) -> HeaderMap {
        self.headers().clone()
    }

    /// The body length when the transport knows it; by default the `Content-Length`
    /// header as hyper reads it: digits, or a list of them split by commas, every
    /// value in every copy the same, and none beside a `Transfer-Encoding` (which
    /// frames the body instead).
    fn content_length(&self) -> Option<u64> {
        content_length_header(self.headers())
    }

    /// Whether this response answers a request that went out without the
    /// credentials the client put on it: a redirect the transport followed inside
    /// the send crossed origins, and the transport dropped them on that hop (reqwest
    /// drops `Authorization`, `Cookie` and `Proxy-Authorization` on a hop to another
    /// origin than the hop before). A 401 then says nothing of the client's token: it
    /// is final, no token refreshed, as a refresh could not help. `false` by default,
    /// for a transport that follows no redirect or cannot tell.
    fn credentials_dropped(&self) -> bool {
        false
    }

    /// Whether the request the transport was given was answered with a redirect
    /// that the transport followed with another request, which this response
    /// answers: a 303 (any method goes on as a GET), or a 301 or 302 to a POST
    /// (which goes on as a GET; other methods go on as they are). The
    /// request reached the server and may have been processed (a POST answered
    /// `303 See Other` by a server that took the order), so a 429, a 503 with a
    /// server delay or a 401 of the later request says nothing of it: the call is
    /// retried or replayed only when it is idempotent. Not for a redirect that sends
    /// the same request on (a 307 or 308, or a 301 or 302 to another method than
    /// POST): its answer is the request's own. `false` by
    /// default, for a transport that follows no redirect or cannot tell (so a
    /// transport written before this method existed keeps the old reading).
    fn answered_by_redirect(&self) -> bool {
        false
    }

    /// The next chunk of the body, `Ok(None)` at its end. An empty chunk carries
    /// nothing: the loop's error-body read takes it as the end, and
    /// [`read_body`] skips it, giving way once.
    ///
    /// The loop calls this for error responses, to keep up to 2048 bytes of the
    /// body, and for every body of a call that reads it
    /// ([`execute_read`](crate::ResilientClient::execute_read)), inside the send's
    /// time limit; one exception: an error body that reached exactly 2048 bytes is
    /// asked once more for a chunk that is already there, polled once with a waker
    /// that does nothing, and the future dropped if it is not ready. Dropping the
    /// future abandons the read; the bytes already returned stay valid.
    fn chunk(&mut self) -> impl Future<Output = Result<Option<Bytes>, TransportError>>;
}

/// Returns `Pending` once, waking its task at once, then `Ready`.
fn yield_once() -> impl Future<Output = ()> {
    let mut yielded = false;
    std::future::poll_fn(move |cx| {
        if yielded {
            std::task::Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    })
}

/// Reads the rest of `response`'s body, at most `limit` bytes: the body of a success,
/// for code generic over the transport (an adapter's own reader, such as reqwest's
/// `bytes()`, does the same for its type).
///
/// The read is not bounded in time (the call's time limits end at the response
/// head): wrap it in [`timeout_at`](crate::timeout_at) for that. A body that arrives
/// in one chunk is returned as that chunk, without a copy.
///
/// # Errors
///
/// A body longer than `limit` fails with [`TransportErrorKind::TooLarge`] as soon as
/// the limit is passed, without reading on; a body that breaks fails with the
/// transport's error.
///
/// ```
/// use vantage_api_pool::Transport;
/// use vantage_api_pool::transport::{TransportErrorKind, read_body};
/// use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
///
/// let rt = VirtualRuntime::new();
/// let transport = ScriptedTransport::new(&rt);
/// transport.push(Reply::ok().body("twelve bytes").chunk_size(5));
/// transport.push(Reply::ok().body("twelve bytes"));
/// for limit in [12, 11] {
///     let request = transport.prepare(transport.handle().get("/orders"))?;
///     let mut response = rt.block_on(transport.send(request))??;
///     match rt.block_on(read_body(&mut response, limit))? {
///         Ok(body) => assert_eq!(body, "twelve bytes"),
///         Err(e) => assert_eq!((limit, e.kind()), (11, TransportErrorKind::TooLarge)),
///     }
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub async fn read_body<R: TransportResponse + ?Sized>(
    response: &mut R,
    limit: usize,
) -> Result<Bytes, TransportError> {
    let mut first: Option<Bytes> = None;
    let mut joined: Vec<u8> = Vec::new();
    let mut len = 0usize;
    while let Some(chunk) = response.chunk().await? {
        if chunk.is_empty() {
            // Skipped, but after giving way once: a response that keeps handing out
            // ready empty chunks must not keep this poll (and a `timeout_at` around
            // it, which polls its timer after the work) spinning for ever.
            yield_once().await;
            continue;
        }
        len = len.saturating_add(chunk.len());
        if len > limit {
            return Err(TransportError::new(
                TransportErrorKind::TooLarge,
                "the body is longer than the limit",
            ));
        }
        match &first {
            None => first = Some(chunk),
            Some(head) => {
                if joined.is_empty() {
                    joined.reserve(len);
                    joined.extend_from_slice(head);
                }
                joined.extend_from_slice(&chunk);
            }
        }
    }
    Ok(if joined.is_empty() {
        first.unwrap_or_default()
    } else {
        Bytes::from(joined)
    })
}

/// [`TransportResponse`] whose body read is `Send`: the response type of a
/// [`SendTransport`]. A blanket impl provides [`TransportResponse`].
pub trait SendTransportResponse: Send {
    /// As [`TransportResponse::status`].
    fn status(&self) -> StatusCode;

    /// As [`TransportResponse::headers`].
    fn headers(&self) -> &HeaderMap;

    /// As [`TransportResponse::take_headers`]; by default a clone of
    /// [`headers`](Self::headers).
    fn take_headers(&mut self) -> HeaderMap {
        self.headers().clone()
    }

    /// As [`TransportResponse::content_length`]; by default the `Content-Length`
    /// header as hyper reads it: digits, or a list of them split by commas, every
    /// value in every copy the same, and none beside a `Transfer-Encoding` (which
    /// frames the body instead).
    fn content_length(&self) -> Option<u64> {
        content_length_header(self.headers())
    }

    /// As [`TransportResponse::credentials_dropped`]; `false` by default.
    fn credentials_dropped(&self) -> bool {
        false
    }

    /// As [`TransportResponse::answered_by_redirect`]; `false` by default.
    fn answered_by_redirect(&self) -> bool {
        false
    }

    /// As [`TransportResponse::chunk`], with a `Send` future.
    fn chunk(&mut self) -> impl Future<Output = Result<Option<Bytes>, TransportError>> + Send;
}

impl<T: SendTransportResponse> TransportResponse for T {
    #[inline]
    fn status(&self) -> StatusCode {
        SendTransportResponse::status(self)
    }

    #[inline]
    fn headers(&self) -> &HeaderMap {
        SendTransportResponse::headers(self)
    }

    #[inline]
    fn take_headers(&mut self) -> HeaderMap {
        SendTransportResponse::take_headers(self)
    }

    #[inline]
    fn content_length(&self) -> Option<u64> {
        SendTransportResponse::content_length(self)
    }

    #[inline]
    fn credentials_dropped(&self) -> bool {
        SendTransportResponse::credentials_dropped(self)
    }

    #[inline]
    fn answered_by_redirect(&self) -> bool {
        SendTransportResponse::answered_by_redirect(self)
    }

    #[inline]
    fn chunk(&mut self) -> impl Future<Output = Result<Option<Bytes>, TransportError>> {
        SendTransportResponse::chunk(self)
    }
}

/// The `Content-Length` header as a number, read as hyper reads it: each copy a
/// list of values split by commas (RFC 9110 §8.6 lets a recipient take `42, 42`),
/// each value digits only (`1*DIGIT`: no sign) with white space around it, and
/// every value of every copy the same; otherwise `None`. A `Transfer-Encoding`
/// frames the body instead (RFC 9112 §6.3: it overrides a `Content-Length` beside
/// it), so there is none then either.
fn content_length_header(headers: &HeaderMap) -> Option<u64> {
    if headers.contains_key(http::header::TRANSFER_ENCODING) {
        return None;
    }
    let mut length = None;
    for value in headers.get_all(http::header::CONTENT_LENGTH) {
        for part in value.as_bytes().split(|&b| b == b',') {
            let digits = part.trim_ascii();
            if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
                return None;
            }
            let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
            if length.is_some_and(|first| first != n) {
                return None;
            }
            length = Some(n);
        }
    }
    length
}

/// How a send failed, which decides whether and how it is tried again.
///
/// | kind | reached the server? | retried | breaker |
/// |---|---|---|---|
/// | `NotSent` | no | redialed with no back-off and no retry budget (through the gate again), twice per call; a third counts as `Interrupted` | untouched |
/// | `Connect` | no | yes, any method | failure |
/// | `Interrupted` | maybe | only if the call is idempotent | failure |
/// | `TimedOut` | maybe | only if the call is idempotent | failure |
/// | `Tls` | no | no | failure |
/// | `TooLarge` | maybe | no | untouched |
/// | `Config` | no | no | untouched |
///
/// For a transport of your own: the kinds that say "no" promise that not one byte
/// of the request reached the server. `Connect` is retried and `NotSent` redialed
/// (twice a call) whatever the method; `Tls` and `Config` end the call. When in
/// doubt, `Interrupted` is the safe kind. A write
/// that failed once it had started (on a fresh connection too), a malformed
/// answer (a status line or header that does not parse, an encoding you do not
/// support) and an end of stream before the status line are `Interrupted`: the
/// server may have read the request. `NotSent` is for a request you know you never
/// started to write (a connection found closed before the first byte); a failure to
/// open the connection is `Connect`.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportErrorKind {
    /// The request never left: not one byte of it was written, for example to a
    /// pooled connection the server had already closed. Safe to send again: the
    /// loop redials it through the same transport, which picks the connection
    /// (hyper has dropped a pooled connection the server closed; an HTTP/2 stream
    /// the server refused goes out again on a connection hyper chooses, maybe the
    /// same).
    NotSent,
    /// No connection could be made (refused, DNS, connect timeout). Nothing reached
    /// the server.
    Connect,
    /// The exchange broke after the request may have been written: a reset, an
    /// early close, a body that broke mid-way, or an answer that does not parse.
    /// The server may have acted on it.
    Interrupted,
    /// The transport's own time limit cut the exchange. The server may have acted on it.
    TimedOut,
    /// The TLS handshake or certificate check failed. Retrying will not help.
    Tls,
    /// The request or the response was larger than a limit allows.
    TooLarge,
    /// The request could not be built (bad URL, bad header). Our side; nothing sent.
    /// Returned by `send`, its `Failed` is reported unsent (`sent: false`, `ms: 0`),
    /// as one from `prepare` is, and the attempt counts in
    /// [`ClientError::attempts`](crate::ClientError::attempts). One from `prepare`
    /// ends the call before its attempt began, so `attempts()` leaves it out (its
    /// synthetic pair numbers the attempt it would have been).
    Config,
}

impl TransportErrorKind {
    /// A stable snake_case name, for logs and metrics.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            TransportErrorKind::NotSent => "not_sent",
            TransportErrorKind::Connect => "connect",
            TransportErrorKind::Interrupted => "interrupted",
            TransportErrorKind::TimedOut => "timed_out",
            TransportErrorKind::Tls => "tls",
            TransportErrorKind::TooLarge => "too_large",
            TransportErrorKind::Config => "config",
        }
    }
}

impl fmt::Display for TransportErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A failed send: a [`TransportErrorKind`] and a short description.
///
/// The description must never hold a URL, a body or a header value; adapters strip
/// them before building the error (the reqwest adapter uses `without_url`). It keeps
/// no `source()`: the errors under a transport's (reqwest's, hyper's, an I/O error)
/// can carry the URL or the peer's text, and whoever walks the chain would print
/// them. What they tell is in the kind and the description, which makes the error
/// cheap to clone and compare, as events and errors that carry it need.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct TransportError {
    kind: TransportErrorKind,
    message: Arc<str>,
}

impl TransportError {
    /// A transport error of `kind` described by `message` (no URL, body or header value).
    ///
    /// ```
    /// use vantage_api_pool::{TransportError, TransportErrorKind};
    /// let e = TransportError::new(TransportErrorKind::Connect, "connection refused");
    /// assert_eq!(e.to_string(), "connect: connection refused");
    /// // Equal when kind and message are.
    /// assert_eq!(e, TransportError::new(TransportErrorKind::Connect, "connection refused"));
    /// assert_ne!(e, TransportError::new(TransportErrorKind::Tls, "connection refused"));
    /// ```
    #[must_use]
    pub fn new(kind: TransportErrorKind, message: impl Into<Arc<str>>) -> Self {
        TransportError {
            kind,
            message: message.into(),
        }
    }

    /// What kind of failure this was.
    #[must_use]
    pub fn kind(&self) -> TransportErrorKind {
        self.kind
    }

    /// The description given by the transport.
    #[must_use]
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Debug for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransportError")
            .field("kind", &self.kind)
            .field("message", &self.message)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lengths(values: &[&'static str]) -> Option<u64> {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(http::header::CONTENT_LENGTH, HeaderValue::from_static(v));
        }
        content_length_header(&headers)
    }

    #[test]
    fn content_length_is_read_as_hyper_reads_it() {
        assert_eq!(lengths(&["42"]), Some(42));
        assert_eq!(lengths(&["0"]), Some(0));
        assert_eq!(lengths(&["42", "42"]), Some(42));
        assert_eq!(lengths(&[]), None);
        assert_eq!(lengths(&["+5"]), None);
        assert_eq!(lengths(&["-1"]), None);
        assert_eq!(lengths(&[" 5"]), Some(5));
        assert_eq!(lengths(&["5x"]), None);
        assert_eq!(lengths(&["42", "43"]), None);
        // Comma lists, as hyper takes them: every value the same.
        assert_eq!(lengths(&["3, 3"]), Some(3));
        assert_eq!(lengths(&["3,3", "3"]), Some(3));
        assert_eq!(lengths(&["3, 4"]), None);
        assert_eq!(lengths(&["3,"]), None);
        assert_eq!(lengths(&[","]), None);
        assert_eq!(lengths(&["3, +3"]), None);
        // Beside a Transfer-Encoding, which frames the body instead: none.
        let mut chunked = HeaderMap::new();
        chunked.insert(
            http::header::CONTENT_LENGTH,
            HeaderValue::from_static("100"),
        );
        chunked.insert(
            http::header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        assert_eq!(content_length_header(&chunked), None);
        assert_eq!(lengths(&["99999999999999999999999"]), None);
    }
}
