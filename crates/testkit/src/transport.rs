//! [`ScriptedTransport`]: a [`Transport`](vantage_api_pool::Transport) that answers from a
//! script, on the virtual clock of a [`VirtualRuntime`], and records what it was asked.
//!
//! # Where a send's answer comes from
//!
//! Every send takes the first of these that has something for it:
//!
//! 1. the script of the request's path ([`ScriptedTransport::on_path`]; the path is
//!    matched exactly as the request closure wrote it, query included);
//! 2. the sequence ([`ScriptedTransport::push`], [`ScriptedTransport::push_many`]);
//! 3. the responder ([`ScriptedTransport::respond_with`]), which sees the request;
//! 4. the default reply ([`ScriptedTransport::default_reply`]), given every time;
//! 5. otherwise the send fails with [`TransportErrorKind::Config`] and the message
//!    `script exhausted` (final for the attempt loop, so a test that forgot a reply
//!    fails visibly instead of passing on an invented `200`), counted by
//!    [`ScriptedTransport::unanswered`].
//!
//! ```
//! use vantage_api_pool::{Transport, TransportResponse};
//! use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
//!
//! let rt = VirtualRuntime::new();
//! let transport = ScriptedTransport::new(&rt);
//! transport.on_path("/health", [Reply::status(204)]);
//! transport.push(Reply::status(503));
//! transport.default_reply(Reply::ok());
//! let status = |path: &'static str| {
//!     let request = transport.prepare(transport.handle().get(path)).unwrap();
//!     rt.block_on(transport.send(request)).unwrap().unwrap().status().as_u16()
//! };
//! assert_eq!(status("/health"), 204); // its path script
//! assert_eq!(status("/health"), 503); // path script used up: the sequence
//! assert_eq!(status("/health"), 200); // sequence used up: the default
//! ```

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
// The docs name the plain ports, which the testkit's types have through the `Send` ones.
use vantage_api_pool::transport::{SendTransport, SendTransportResponse};
use vantage_api_pool::{Instant, PreparedRequest, TransportError, TransportErrorKind};

use crate::runtime::{SleepRef, VirtualRuntime};

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What one send is answered with: a response, a transport failure, or a stall,
/// optionally after a delay on the virtual clock.
///
/// Named `Reply` so it does not clash with [`vantage_api_pool::classify::Outcome`].
///
/// ```
/// use std::time::Duration;
/// use vantage_api_pool::TransportErrorKind;
/// use vantage_api_pool_testkit::Reply;
///
/// let busy = Reply::status(503).header("retry-after", "2").body("try later");
/// let slow = Reply::ok().after(Duration::from_secs(3));
/// let refused = Reply::fail(TransportErrorKind::Connect, "connection refused");
/// let hung = Reply::stall();
/// let cut = Reply::ok().body(vec![b'x'; 100]).body_stalls_after(10);
/// # let _ = (busy, slow, refused, hung, cut);
/// ```
#[must_use = "a Reply does nothing until given to a ScriptedTransport"]
#[derive(Clone)]
pub struct Reply {
    action: Action,
    delay: Duration,
}

impl fmt::Debug for Reply {
    /// The status, header names, body length and shape, or the failure, and the
    /// delay: no header value, no body, like the testkit's other types.
    ///
    /// ```
    /// use vantage_api_pool_testkit::Reply;
    /// let reply = Reply::status(401).header("www-authenticate", "Bearer realm=secret").body("session=abc");
    /// let printed = format!("{reply:?}");
    /// assert!(printed.contains("401") && printed.contains("www-authenticate"));
    /// assert!(!printed.contains("secret") && !printed.contains("session"));
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = f.debug_struct("Reply");
        match &self.action {
            Action::Respond(spec) => {
                out.field("status", &spec.status)
                    .field(
                        "headers",
                        &HeaderNames(spec.headers.as_deref().unwrap_or_else(|| no_headers())),
                    )
                    .field("body_len", &spec.body.len());
                if let Some(shape) = &spec.shape {
                    out.field("shape", shape);
                }
            }
            Action::Fail(error) => {
                out.field("fail", &error.kind());
            }
            Action::Stall => {
                out.field("stall", &true);
            }
        }
        out.field("delay", &self.delay).finish()
    }
}

#[derive(Clone)]
enum Action {
    Respond(ResponseSpec),
    Fail(TransportError),
    Stall,
}

#[derive(Clone)]
struct ResponseSpec {
    status: StatusCode,
    /// `None`: no headers (most replies), so cloning a default reply is free.
    headers: Option<Arc<HeaderMap>>,
    body: Bytes,
    /// `None`: the whole body at once, never stalling (most replies).
    shape: Option<Box<BodyShape>>,
    /// As if a redirect had dropped the request's credentials.
    credentials_dropped: bool,
    /// As if the request had been answered with a redirect the transport followed
    /// with another request.
    answered_by_redirect: bool,
}

/// How a body is delivered, when not all at once.
#[derive(Clone, Default)]
struct BodyShape {
    stall_after: Option<usize>,
    /// The body breaks after this many bytes, with this error.
    fail_after: Option<(usize, TransportError)>,
    chunk_size: usize,
    chunk_delay: Duration,
}

impl fmt::Debug for BodyShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BodyShape")
            .field("stall_after", &self.stall_after)
            .field(
                "fail_after",
                &self.fail_after.as_ref().map(|(n, error)| (n, error.kind())),
            )
            .field("chunk_size", &self.chunk_size)
            .field("chunk_delay", &self.chunk_delay)
            .finish()
    }
}

fn no_headers() -> &'static HeaderMap {
    static EMPTY: OnceLock<HeaderMap> = OnceLock::new();
    EMPTY.get_or_init(HeaderMap::new)
}

impl Reply {
    /// A response with status `code`, no headers and an empty body.
    ///
    /// # Panics
    ///
    /// If `code` is not a valid status code (100 to 999), naming it.
    ///
    /// ```
    /// use vantage_api_pool_testkit::Reply;
    /// let reply = Reply::status(429);
    /// assert_eq!(reply.status_code().map(|s| s.as_u16()), Some(429));
    /// ```
    pub fn status(code: u16) -> Reply {
        let status = StatusCode::from_u16(code).unwrap_or_else(|_| {
            panic!("Reply::status({code}): not a valid HTTP status code (100..=999)")
        });
        Reply::with_status(status)
    }

    /// A response with `status`, no headers and an empty body.
    ///
    /// ```
    /// use http::StatusCode;
    /// use vantage_api_pool_testkit::Reply;
    /// let reply = Reply::with_status(StatusCode::NOT_FOUND);
    /// assert_eq!(reply.status_code(), Some(StatusCode::NOT_FOUND));
    /// ```
    pub fn with_status(status: StatusCode) -> Reply {
        Reply {
            action: Action::Respond(ResponseSpec {
                status,
                headers: None,
                body: Bytes::new(),
                shape: None,
                credentials_dropped: false,
                answered_by_redirect: false,
            }),
            delay: Duration::ZERO,
        }
    }

    /// `200 OK` with no headers and an empty body.
    ///
    /// ```
    /// use vantage_api_pool_testkit::Reply;
    /// assert_eq!(Reply::ok().status_code().map(|s| s.as_u16()), Some(200));
    /// ```
    pub fn ok() -> Reply {
        Reply::with_status(StatusCode::OK)
    }

    /// The send fails with a [`TransportError`] of `kind` described by `message`.
    ///
    /// ```
    /// use vantage_api_pool::TransportErrorKind;
    /// use vantage_api_pool_testkit::Reply;
    /// let reply = Reply::fail(TransportErrorKind::NotSent, "pooled connection closed");
    /// assert_eq!(reply.status_code(), None);
    /// ```
    pub fn fail(kind: TransportErrorKind, message: impl Into<Arc<str>>) -> Reply {
        Reply::error(TransportError::new(kind, message))
    }

    /// The send fails with `error`.
    ///
    /// ```
    /// use vantage_api_pool::{TransportError, TransportErrorKind};
    /// use vantage_api_pool_testkit::Reply;
    /// let reply = Reply::error(TransportError::new(TransportErrorKind::Tls, "bad certificate"));
    /// # let _ = reply;
    /// ```
    pub fn error(error: TransportError) -> Reply {
        Reply {
            action: Action::Fail(error),
            delay: Duration::ZERO,
        }
    }

    /// The send never completes: it stays pending until its future is dropped (by a
    /// time limit, or by the caller). With no time limit, the driver reports a
    /// deadlock instead of hanging.
    ///
    /// ```
    /// use vantage_api_pool_testkit::Reply;
    /// let hung = Reply::stall();
    /// # let _ = hung;
    /// ```
    pub fn stall() -> Reply {
        Reply {
            action: Action::Stall,
            delay: Duration::ZERO,
        }
    }

    /// Gives this reply `delay` after the send starts, on the virtual clock (a
    /// response's head arrives then; a failure happens then; a stall starts then).
    /// Calling it again replaces the delay.
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool_testkit::Reply;
    /// let reply = Reply::ok().after(Duration::from_millis(1500));
    /// assert_eq!(reply.delay(), Duration::from_millis(1500));
    /// ```
    pub fn after(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }

    /// Adds a response header (appended: a name may repeat).
    ///
    /// # Panics
    ///
    /// On a failure or a stall (only responses have headers), or if `name` or `value`
    /// is not a valid header name or value. Bytes 0x80 to 0xFF are valid in a value
    /// given as `&[u8]`, which is how to script a non-ASCII header.
    ///
    /// ```
    /// use vantage_api_pool_testkit::Reply;
    /// let reply = Reply::status(503)
    ///     .header("retry-after", "3")
    ///     .header("x-request-id", "req-42")
    ///     .header("x-odd", &b"caf\xe9"[..]);
    /// # let _ = reply;
    /// ```
    pub fn header<K, V>(mut self, name: K, value: V) -> Reply
    where
        K: TryInto<HeaderName>,
        V: TryInto<HeaderValue>,
    {
        let spec = self.spec("header");
        let Ok(name) = name.try_into() else {
            panic!("Reply::header: invalid header name")
        };
        let Ok(value) = value.try_into() else {
            panic!("Reply::header: invalid value for header `{name}`")
        };
        Arc::make_mut(spec.headers.get_or_insert_with(Arc::default)).append(name, value);
        self
    }

    /// Sets the response body.
    ///
    /// # Panics
    ///
    /// On a failure or a stall: only responses have bodies.
    ///
    /// ```
    /// use vantage_api_pool_testkit::Reply;
    /// let reply = Reply::status(400).body(r#"{"error":"bad field"}"#);
    /// # let _ = reply;
    /// ```
    pub fn body(mut self, body: impl Into<Bytes>) -> Reply {
        self.spec("body").body = body.into();
        self
    }

    /// Makes the body stall: reads return the first `n` bytes (or the whole body if
    /// it is shorter), and the read after that never completes (its end is never
    /// signalled either), until the reader gives up.
    ///
    /// # Panics
    ///
    /// On a failure or a stall: only responses have bodies.
    ///
    /// ```
    /// use vantage_api_pool_testkit::Reply;
    /// let reply = Reply::status(500).body(vec![b'e'; 4096]).body_stalls_after(1000);
    /// # let _ = reply;
    /// ```
    pub fn body_stalls_after(mut self, n: usize) -> Reply {
        self.shape("body_stalls_after").stall_after = Some(n);
        self
    }

    /// Makes the body break, as a connection reset mid-body would: reads return the
    /// first `n` bytes (or the whole body if it is shorter), and every read after
    /// that fails with a [`TransportError`] of `kind` and `message` instead of
    /// returning more (or the end). If the body also stalls, the first of the two
    /// cuts wins; at the same byte, the failure.
    ///
    /// # Panics
    ///
    /// On a failure or a stall: only responses have bodies.
    ///
    /// ```
    /// use vantage_api_pool::{Transport, TransportErrorKind, TransportResponse};
    /// use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
    ///
    /// let rt = VirtualRuntime::new();
    /// let transport = ScriptedTransport::new(&rt);
    /// transport.push(
    ///     Reply::ok()
    ///         .body("abcdef")
    ///         .body_fails_after(4, TransportErrorKind::Interrupted, "connection reset"),
    /// );
    /// let request = transport.prepare(transport.handle().get("/"))?;
    /// let mut response = rt.block_on(transport.send(request))??;
    /// assert_eq!(rt.block_on(response.chunk())??.unwrap(), "abcd");
    /// let broken = rt.block_on(response.chunk())?.unwrap_err();
    /// assert_eq!(broken.kind(), TransportErrorKind::Interrupted);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn body_fails_after(
        mut self,
        n: usize,
        kind: TransportErrorKind,
        message: impl Into<Arc<str>>,
    ) -> Reply {
        self.shape("body_fails_after").fail_after = Some((n, TransportError::new(kind, message)));
        self
    }

    /// Delivers the body in chunks of at most `size` bytes (default, or `0`: the
    /// whole body in one chunk).
    ///
    /// # Panics
    ///
    /// On a failure or a stall: only responses have bodies.
    ///
    /// ```
    /// use vantage_api_pool_testkit::Reply;
    /// let reply = Reply::ok().body("abcdef").chunk_size(2); // "ab", "cd", "ef"
    /// # let _ = reply;
    /// ```
    pub fn chunk_size(mut self, size: usize) -> Reply {
        self.shape("chunk_size").chunk_size = size;
        self
    }

    /// Makes the response one to a request that went out without the client's
    /// credentials, as if a redirect the transport followed had crossed origins and
    /// dropped them
    /// ([`TransportResponse::credentials_dropped`](vantage_api_pool::TransportResponse::credentials_dropped)):
    /// a 401 then is final, no token refreshed. (Whether that redirect also made the
    /// request another one, a 303's GET, is [`answered_by_redirect`](Reply::answered_by_redirect).)
    ///
    /// # Panics
    ///
    /// On a failure or a stall: only responses answer a request.
    ///
    /// ```
    /// use vantage_api_pool::{Transport, TransportResponse};
    /// use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
    /// let rt = VirtualRuntime::new();
    /// let transport = ScriptedTransport::new(&rt);
    /// transport.push(Reply::status(401).credentials_dropped()).push(Reply::status(401));
    /// for dropped in [true, false] {
    ///     let request = transport.prepare(transport.handle().get("/x"))?;
    ///     let response = rt.block_on(transport.send(request))??;
    ///     assert_eq!(response.credentials_dropped(), dropped);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn credentials_dropped(mut self) -> Reply {
        self.spec("credentials_dropped").credentials_dropped = true;
        self
    }

    /// Makes the response one to another request than the one sent, as if the
    /// request had been answered with a 303 (or a 301 or 302 to a POST) that the
    /// transport followed with a GET
    /// ([`TransportResponse::answered_by_redirect`](vantage_api_pool::TransportResponse::answered_by_redirect)):
    /// the request may have been processed, so a 429, a 503 with a server delay or a
    /// 401 of the GET is retried or replayed only for an idempotent call.
    ///
    /// # Panics
    ///
    /// On a failure or a stall: only responses answer a request.
    ///
    /// ```
    /// use vantage_api_pool::{CallPolicy, ResilientClient};
    /// use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
    /// let rt = VirtualRuntime::new();
    /// let transport = ScriptedTransport::new(&rt);
    /// // A POST answered 303; the GET it led to meets a 429.
    /// transport.push(Reply::status(429).answered_by_redirect());
    /// let client = ResilientClient::builder(transport.clone(), rt.clone()).build()?;
    /// let error = rt.block_on(client.execute(|http| http.post("/orders")))?.unwrap_err();
    /// assert!(error.answered_by_redirect());
    /// assert_eq!(transport.request_count(), 1, "the POST is not sent again");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn answered_by_redirect(mut self) -> Reply {
        self.spec("answered_by_redirect").answered_by_redirect = true;
        self
    }

    /// Makes every body chunk arrive `delay` after it is asked for, on the virtual
    /// clock: a slow body.
    ///
    /// # Panics
    ///
    /// On a failure or a stall: only responses have bodies.
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool_testkit::Reply;
    /// let reply = Reply::ok()
    ///     .body("abcdef")
    ///     .chunk_size(3)
    ///     .chunk_delay(Duration::from_secs(1)); // two chunks, one second each
    /// # let _ = reply;
    /// ```
    pub fn chunk_delay(mut self, delay: Duration) -> Reply {
        self.shape("chunk_delay").chunk_delay = delay;
        self
    }

    /// The status of a response reply; `None` for a failure or a stall.
    ///
    /// ```
    /// use vantage_api_pool_testkit::Reply;
    /// assert_eq!(Reply::stall().status_code(), None);
    /// ```
    #[must_use]
    pub fn status_code(&self) -> Option<StatusCode> {
        match &self.action {
            Action::Respond(spec) => Some(spec.status),
            _ => None,
        }
    }

    /// The delay set by [`after`](Reply::after) (zero by default).
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool_testkit::Reply;
    /// assert_eq!(Reply::ok().delay(), Duration::ZERO);
    /// ```
    #[must_use]
    pub fn delay(&self) -> Duration {
        self.delay
    }

    fn shape(&mut self, method: &str) -> &mut BodyShape {
        self.spec(method).shape.get_or_insert_with(Box::default)
    }

    fn spec(&mut self, method: &str) -> &mut ResponseSpec {
        match &mut self.action {
            Action::Respond(spec) => spec,
            Action::Fail(_) => {
                panic!("Reply::{method} on a failure reply: only responses have headers and bodies")
            }
            Action::Stall => {
                panic!("Reply::{method} on a stall reply: only responses have headers and bodies")
            }
        }
    }
}

impl From<TransportError> for Reply {
    /// Same as [`Reply::error`].
    ///
    /// ```
    /// use vantage_api_pool::{TransportError, TransportErrorKind};
    /// use vantage_api_pool_testkit::Reply;
    /// let reply: Reply = TransportError::new(TransportErrorKind::Connect, "refused").into();
    /// assert_eq!(reply.status_code(), None);
    /// ```
    fn from(error: TransportError) -> Reply {
        Reply::error(error)
    }
}

/// The handle the request closure receives: it starts request drafts.
///
/// ```
/// use vantage_api_pool::Transport;
/// use vantage_api_pool_testkit::{ScriptedTransport, VirtualRuntime};
///
/// let transport = ScriptedTransport::new(&VirtualRuntime::new());
/// let http = transport.handle();
/// let draft = http.post("/orders").header("content-type", "application/json").body("{}");
/// let request = transport.prepare(draft)?;
/// assert_eq!(request.path(), "/orders");
/// # Ok::<(), vantage_api_pool::TransportError>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct ScriptedHttp {
    _private: (),
}

impl ScriptedHttp {
    /// A draft of `method` to `path`.
    ///
    /// ```
    /// use http::Method;
    /// use vantage_api_pool_testkit::ScriptedHttp;
    /// let draft = ScriptedHttp::default().request(Method::OPTIONS, "/");
    /// # let _ = draft;
    /// ```
    pub fn request(
        &self,
        method: Method,
        path: impl Into<Cow<'static, str>>,
    ) -> ScriptedRequestBuilder {
        ScriptedRequestBuilder {
            method,
            path: path.into(),
            headers: HeaderMap::new(),
            body: Bytes::new(),
            invalid: None,
        }
    }

    /// A `GET` draft.
    ///
    /// ```
    /// # use vantage_api_pool_testkit::ScriptedHttp;
    /// let draft = ScriptedHttp::default().get("/items?page=2");
    /// # let _ = draft;
    /// ```
    pub fn get(&self, path: impl Into<Cow<'static, str>>) -> ScriptedRequestBuilder {
        self.request(Method::GET, path)
    }

    /// A `POST` draft.
    ///
    /// ```
    /// # use vantage_api_pool_testkit::ScriptedHttp;
    /// let draft = ScriptedHttp::default().post("/items").body("{}");
    /// # let _ = draft;
    /// ```
    pub fn post(&self, path: impl Into<Cow<'static, str>>) -> ScriptedRequestBuilder {
        self.request(Method::POST, path)
    }

    /// A `PUT` draft.
    ///
    /// ```
    /// # use vantage_api_pool_testkit::ScriptedHttp;
    /// let draft = ScriptedHttp::default().put("/items/1");
    /// # let _ = draft;
    /// ```
    pub fn put(&self, path: impl Into<Cow<'static, str>>) -> ScriptedRequestBuilder {
        self.request(Method::PUT, path)
    }

    /// A `DELETE` draft.
    ///
    /// ```
    /// # use vantage_api_pool_testkit::ScriptedHttp;
    /// let draft = ScriptedHttp::default().delete("/items/1");
    /// # let _ = draft;
    /// ```
    pub fn delete(&self, path: impl Into<Cow<'static, str>>) -> ScriptedRequestBuilder {
        self.request(Method::DELETE, path)
    }

    /// A `PATCH` draft.
    ///
    /// ```
    /// # use vantage_api_pool_testkit::ScriptedHttp;
    /// let draft = ScriptedHttp::default().patch("/items/1");
    /// # let _ = draft;
    /// ```
    pub fn patch(&self, path: impl Into<Cow<'static, str>>) -> ScriptedRequestBuilder {
        self.request(Method::PATCH, path)
    }

    /// A `HEAD` draft.
    ///
    /// ```
    /// # use vantage_api_pool_testkit::ScriptedHttp;
    /// let draft = ScriptedHttp::default().head("/health");
    /// # let _ = draft;
    /// ```
    pub fn head(&self, path: impl Into<Cow<'static, str>>) -> ScriptedRequestBuilder {
        self.request(Method::HEAD, path)
    }
}

/// A request draft: what the request closure returns.
/// [`Transport::prepare`](vantage_api_pool::Transport::prepare) turns it into a
/// [`ScriptedRequest`], or fails with [`TransportErrorKind::Config`] if the draft was made
/// invalid.
///
/// ```
/// use vantage_api_pool::{Transport, TransportErrorKind};
/// use vantage_api_pool_testkit::{ScriptedTransport, VirtualRuntime};
///
/// let transport = ScriptedTransport::new(&VirtualRuntime::new());
/// let bad = transport.handle().get("/x").header("x-token", "line\nbreak");
/// let err = transport.prepare(bad).unwrap_err();
/// assert_eq!(err.kind(), TransportErrorKind::Config);
/// assert_eq!(err.to_string(), "config: invalid value for header `x-token`");
/// ```
#[must_use = "a draft does nothing until returned to the client"]
#[derive(Clone)]
pub struct ScriptedRequestBuilder {
    method: Method,
    path: Cow<'static, str>,
    headers: HeaderMap,
    body: Bytes,
    invalid: Option<Cow<'static, str>>,
}

impl ScriptedRequestBuilder {
    /// Adds a header (appended: a name may repeat). An invalid name or value does not
    /// panic: it makes the draft invalid, so `prepare` fails with `Config`.
    ///
    /// ```
    /// # use vantage_api_pool_testkit::ScriptedHttp;
    /// let draft = ScriptedHttp::default().get("/").header("accept", "application/json");
    /// # let _ = draft;
    /// ```
    pub fn header<K, V>(mut self, name: K, value: V) -> ScriptedRequestBuilder
    where
        K: TryInto<HeaderName>,
        V: TryInto<HeaderValue>,
    {
        if self.invalid.is_some() {
            return self;
        }
        match name.try_into() {
            Err(_) => self.invalid = Some(Cow::Borrowed("invalid header name")),
            Ok(name) => match value.try_into() {
                Err(_) => {
                    self.invalid = Some(Cow::Owned(format!("invalid value for header `{name}`")));
                }
                Ok(value) => {
                    self.headers.append(name, value);
                }
            },
        }
        self
    }

    /// Sets the body.
    ///
    /// ```
    /// # use vantage_api_pool_testkit::ScriptedHttp;
    /// let draft = ScriptedHttp::default().put("/doc").body(vec![1u8, 2, 3]);
    /// # let _ = draft;
    /// ```
    pub fn body(mut self, body: impl Into<Bytes>) -> ScriptedRequestBuilder {
        self.body = body.into();
        self
    }

    /// Marks the draft as one that cannot be built: `prepare` fails with
    /// [`TransportErrorKind::Config`] and the message `request marked invalid`.
    ///
    /// ```
    /// use vantage_api_pool::{Transport, TransportErrorKind};
    /// use vantage_api_pool_testkit::{ScriptedTransport, VirtualRuntime};
    /// let transport = ScriptedTransport::new(&VirtualRuntime::new());
    /// let err = transport.prepare(transport.handle().get("/").invalid()).unwrap_err();
    /// assert_eq!(err.kind(), TransportErrorKind::Config);
    /// ```
    pub fn invalid(mut self) -> ScriptedRequestBuilder {
        if self.invalid.is_none() {
            self.invalid = Some(Cow::Borrowed("request marked invalid"));
        }
        self
    }
}

/// A prepared request: what is sent, and what a responder sees.
///
/// ```
/// use http::{HeaderName, HeaderValue, Method};
/// use vantage_api_pool::{PreparedRequest, Transport};
/// use vantage_api_pool_testkit::{ScriptedTransport, VirtualRuntime};
///
/// let transport = ScriptedTransport::new(&VirtualRuntime::new());
/// let mut request = transport.prepare(transport.handle().delete("/items/9"))?;
/// request.set_header(HeaderName::from_static("authorization"), HeaderValue::from_static("Bearer t1"));
/// assert_eq!(request.method(), &Method::DELETE);
/// assert_eq!(request.path(), "/items/9");
/// assert_eq!(request.headers()["authorization"], "Bearer t1");
/// # Ok::<(), vantage_api_pool::TransportError>(())
/// ```
#[derive(Clone)]
pub struct ScriptedRequest {
    method: Method,
    path: Cow<'static, str>,
    headers: HeaderMap,
    body: Bytes,
}

impl ScriptedRequest {
    /// The method.
    ///
    /// ```
    /// # use vantage_api_pool::Transport;
    /// # use vantage_api_pool_testkit::{ScriptedTransport, VirtualRuntime};
    /// # let transport = ScriptedTransport::new(&VirtualRuntime::new());
    /// let request = transport.prepare(transport.handle().head("/"))?;
    /// assert_eq!(request.method(), &http::Method::HEAD);
    /// # Ok::<(), vantage_api_pool::TransportError>(())
    /// ```
    #[must_use]
    pub fn method(&self) -> &Method {
        &self.method
    }

    /// The path, exactly as the request closure wrote it.
    ///
    /// ```
    /// # use vantage_api_pool::Transport;
    /// # use vantage_api_pool_testkit::{ScriptedTransport, VirtualRuntime};
    /// # let transport = ScriptedTransport::new(&VirtualRuntime::new());
    /// let request = transport.prepare(transport.handle().get("/a?b=c"))?;
    /// assert_eq!(request.path(), "/a?b=c");
    /// # Ok::<(), vantage_api_pool::TransportError>(())
    /// ```
    #[must_use]
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The headers, including those the attempt loop set.
    ///
    /// ```
    /// # use vantage_api_pool::Transport;
    /// # use vantage_api_pool_testkit::{ScriptedTransport, VirtualRuntime};
    /// # let transport = ScriptedTransport::new(&VirtualRuntime::new());
    /// let request = transport.prepare(transport.handle().get("/").header("x-a", "1"))?;
    /// assert_eq!(request.headers()["x-a"], "1");
    /// # Ok::<(), vantage_api_pool::TransportError>(())
    /// ```
    #[must_use]
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The body.
    ///
    /// ```
    /// # use vantage_api_pool::Transport;
    /// # use vantage_api_pool_testkit::{ScriptedTransport, VirtualRuntime};
    /// # let transport = ScriptedTransport::new(&VirtualRuntime::new());
    /// let request = transport.prepare(transport.handle().post("/").body("hi"))?;
    /// assert_eq!(request.body(), "hi");
    /// # Ok::<(), vantage_api_pool::TransportError>(())
    /// ```
    #[must_use]
    pub fn body(&self) -> &Bytes {
        &self.body
    }
}

impl PreparedRequest for ScriptedRequest {
    fn method(&self) -> Option<&Method> {
        Some(&self.method)
    }

    fn header(&self, name: &HeaderName) -> Option<&HeaderValue> {
        self.headers.get(name)
    }

    fn set_header(&mut self, name: HeaderName, value: HeaderValue) {
        self.headers.insert(name, value);
    }
}

/// A scripted response head with its body still to read through
/// [`TransportResponse::chunk`](vantage_api_pool::TransportResponse::chunk).
///
/// The body's length is reported only through a `content-length` header the script
/// set (as over the wire), not guessed from the body.
///
/// ```
/// use vantage_api_pool::{Transport, TransportResponse};
/// use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
///
/// let rt = VirtualRuntime::new();
/// let transport = ScriptedTransport::new(&rt);
/// transport.push(Reply::ok().header("content-type", "text/plain").body("hello"));
/// let request = transport.prepare(transport.handle().get("/"))?;
/// let body = rt.block_on(async {
///     let mut response = transport.send(request).await?;
///     assert_eq!(response.status(), 200);
///     response.read_to_end().await
/// })??;
/// assert_eq!(body, "hello");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ScriptedResponse {
    status: StatusCode,
    headers: Option<Arc<HeaderMap>>,
    body: Bytes,
    pos: usize,
    shape: Option<Box<BodyShape>>,
    /// Only for a body with a chunk delay.
    runtime: Option<VirtualRuntime>,
    credentials_dropped: bool,
    answered_by_redirect: bool,
}

impl fmt::Debug for ScriptedResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptedResponse")
            .field("status", &self.status)
            .field("headers", &HeaderNames(self.headers()))
            .field("body_len", &self.body.len())
            .field("read", &self.pos)
            .finish_non_exhaustive()
    }
}

impl ScriptedResponse {
    fn new(spec: ResponseSpec, runtime: &VirtualRuntime) -> ScriptedResponse {
        let slow = spec
            .shape
            .as_ref()
            .is_some_and(|shape| !shape.chunk_delay.is_zero());
        ScriptedResponse {
            runtime: slow.then(|| runtime.clone()),
            status: spec.status,
            headers: spec.headers,
            body: spec.body,
            pos: 0,
            shape: spec.shape,
            credentials_dropped: spec.credentials_dropped,
            answered_by_redirect: spec.answered_by_redirect,
        }
    }

    /// The status code (also available through
    /// [`TransportResponse::status`](vantage_api_pool::TransportResponse::status)).
    ///
    /// ```
    /// # use vantage_api_pool::Transport;
    /// # use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
    /// # let rt = VirtualRuntime::new();
    /// # let transport = ScriptedTransport::new(&rt);
    /// transport.push(Reply::status(204));
    /// # let request = transport.prepare(transport.handle().get("/"))?;
    /// let response = rt.block_on(transport.send(request))??;
    /// assert_eq!(response.status(), 204);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The headers (also available through
    /// [`TransportResponse::headers`](vantage_api_pool::TransportResponse::headers)).
    ///
    /// ```
    /// # use vantage_api_pool::Transport;
    /// # use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
    /// # let rt = VirtualRuntime::new();
    /// # let transport = ScriptedTransport::new(&rt);
    /// transport.push(Reply::ok().header("etag", "\"v1\""));
    /// # let request = transport.prepare(transport.handle().get("/"))?;
    /// let response = rt.block_on(transport.send(request))??;
    /// assert_eq!(response.headers()["etag"], "\"v1\"");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn headers(&self) -> &HeaderMap {
        match &self.headers {
            Some(headers) => headers,
            None => no_headers(),
        }
    }

    /// How many body bytes have been read so far.
    ///
    /// ```
    /// # use vantage_api_pool::{Transport, TransportResponse};
    /// # use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
    /// # let rt = VirtualRuntime::new();
    /// # let transport = ScriptedTransport::new(&rt);
    /// transport.push(Reply::ok().body("abcd").chunk_size(3));
    /// # let request = transport.prepare(transport.handle().get("/"))?;
    /// let mut response = rt.block_on(transport.send(request))??;
    /// rt.block_on(response.chunk())??;
    /// assert_eq!(response.bytes_read(), 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn bytes_read(&self) -> usize {
        self.pos
    }

    /// Reads the rest of the body. Never completes on a body that stalls; put it
    /// under a time limit ([`vantage_api_pool::timeout_at`]) in that case.
    ///
    /// # Errors
    ///
    /// The error of a body that breaks part-way ([`Reply::body_fails_after`]).
    ///
    /// ```
    /// # use vantage_api_pool::Transport;
    /// # use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
    /// # let rt = VirtualRuntime::new();
    /// # let transport = ScriptedTransport::new(&rt);
    /// transport.push(Reply::ok().body("a long body").chunk_size(4));
    /// # let request = transport.prepare(transport.handle().get("/"))?;
    /// let mut response = rt.block_on(transport.send(request))??;
    /// assert_eq!(rt.block_on(response.read_to_end())??, "a long body");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn read_to_end(&mut self) -> Result<Bytes, TransportError> {
        vantage_api_pool::transport::read_body(self, usize::MAX).await
    }
}

impl SendTransportResponse for ScriptedResponse {
    fn status(&self) -> StatusCode {
        self.status
    }

    fn headers(&self) -> &HeaderMap {
        ScriptedResponse::headers(self)
    }

    /// Moves the headers out, leaving the response none; headers another response
    /// still shares (those of the [default reply](ScriptedTransport::default_reply))
    /// are copied.
    fn take_headers(&mut self) -> HeaderMap {
        self.headers
            .take()
            .map(|headers| Arc::try_unwrap(headers).unwrap_or_else(|shared| (*shared).clone()))
            .unwrap_or_default()
    }

    /// As [`Reply::credentials_dropped`] said.
    fn credentials_dropped(&self) -> bool {
        self.credentials_dropped
    }

    /// As [`Reply::answered_by_redirect`] said.
    fn answered_by_redirect(&self) -> bool {
        self.answered_by_redirect
    }

    /// The next chunk: the whole body at once unless the reply set a chunk size;
    /// after [`Reply::chunk_delay`] on the virtual clock if one was set; pending
    /// forever once a stalling body has given its bytes. Dropping the future loses
    /// nothing: the position moves only when a chunk is returned.
    async fn chunk(&mut self) -> Result<Option<Bytes>, TransportError> {
        let len = self.body.len();
        let Some(shape) = &self.shape else {
            // The common case: the whole body at once.
            if self.pos >= len {
                return Ok(None);
            }
            self.pos = len;
            return Ok(Some(self.body.clone()));
        };
        let stall_at = shape.stall_after.map(|n| n.min(len));
        let fail_at = shape.fail_after.as_ref().map(|(n, _)| (*n).min(len));
        // Where the body is cut, if it is: by the first of the two; at the same
        // byte, by the failure.
        let cut = stall_at.into_iter().chain(fail_at).min();
        let at_cut = cut.is_some_and(|n| self.pos >= n);
        let fails = at_cut && fail_at == cut;
        if at_cut && !fails {
            return std::future::pending().await;
        }
        if !at_cut && self.pos >= len {
            return Ok(None);
        }
        let chunk_size = shape.chunk_size;
        if let Some(runtime) = &self.runtime {
            runtime.sleep_ref(shape.chunk_delay).await;
        }
        if fails && let Some((_, error)) = &shape.fail_after {
            return Err(error.clone());
        }
        let limit = cut.unwrap_or(len);
        let end = if chunk_size == 0 {
            limit
        } else {
            self.pos.saturating_add(chunk_size).min(limit)
        };
        let chunk = self.body.slice(self.pos..end);
        self.pos = end;
        Ok(Some(chunk))
    }
}

/// One request as the transport received it.
///
/// ```
/// use vantage_api_pool::Transport;
/// use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
///
/// let rt = VirtualRuntime::new();
/// let transport = ScriptedTransport::new(&rt);
/// transport.push(Reply::ok());
/// let request = transport.prepare(transport.handle().get("/a").header("x-n", "1"))?;
/// rt.block_on(transport.send(request))??;
/// let recorded = &transport.requests()[0];
/// assert_eq!((recorded.index, recorded.path.as_ref()), (0, "/a"));
/// assert_eq!(recorded.headers["x-n"], "1");
/// assert_eq!(recorded.at, rt.now());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[non_exhaustive]
#[derive(Clone)]
pub struct RecordedRequest {
    /// The virtual time the send started.
    pub at: Instant,
    /// The send's index on this transport, from 0 (counted even when recording is off).
    pub index: usize,
    /// The method.
    pub method: Method,
    /// The path, as the request closure wrote it.
    pub path: Cow<'static, str>,
    /// Every header, including those the attempt loop set.
    pub headers: HeaderMap,
    /// The body.
    pub body: Bytes,
}

type Responder = Arc<dyn Fn(&ScriptedRequest, usize) -> Reply + Send + Sync>;
type AdmitFn = Arc<dyn Fn(Instant) -> Duration + Send + Sync>;

enum Admit {
    Delay(Duration),
    With(AdmitFn),
}

#[derive(Default)]
struct Script {
    by_path: HashMap<String, VecDeque<Reply>>,
    sequence: VecDeque<Reply>,
    responder: Option<Responder>,
    default: Option<Reply>,
    admit: Option<Admit>,
    requests: Vec<RecordedRequest>,
    /// Sends started; counted under the lock the send takes anyway.
    sends: usize,
    peak_in_flight: usize,
}

struct TransportShared {
    runtime: VirtualRuntime,
    script: Mutex<Script>,
    recording: AtomicBool,
    has_admit: AtomicBool,
    /// Sends finished or dropped; `in flight = started - finished`.
    finished: AtomicUsize,
    distrusted: AtomicUsize,
    admitted: AtomicUsize,
    unanswered: AtomicUsize,
}

impl TransportShared {
    /// Picks the reply for `request` and records it.
    fn answer(&self, request: ScriptedRequest) -> Reply {
        let mut script = lock(&self.script);
        let index = script.sends;
        script.sends += 1;
        // In flight from here; `SendFuture` counts the end. Reading `finished` after
        // counting the start can only over-count sends that end concurrently.
        let in_flight = script
            .sends
            .saturating_sub(self.finished.load(Ordering::Acquire));
        script.peak_in_flight = script.peak_in_flight.max(in_flight);
        let scripted = if script.by_path.is_empty() {
            None
        } else {
            script
                .by_path
                .get_mut(request.path.as_ref())
                .and_then(VecDeque::pop_front)
        };
        let reply = match scripted.or_else(|| script.sequence.pop_front()) {
            Some(reply) => reply,
            None => {
                if let Some(responder) = script.responder.clone() {
                    // The responder runs outside the lock: it may use the transport.
                    drop(script);
                    let reply = responder(&request, index);
                    if !self.recording.load(Ordering::Relaxed) {
                        return reply;
                    }
                    script = lock(&self.script);
                    reply
                } else if let Some(default) = &script.default {
                    default.clone()
                } else {
                    self.unanswered.fetch_add(1, Ordering::Relaxed);
                    Reply::fail(TransportErrorKind::Config, "script exhausted")
                }
            }
        };
        if self.recording.load(Ordering::Relaxed) {
            let ScriptedRequest {
                method,
                path,
                headers,
                body,
            } = request;
            let record = RecordedRequest {
                at: self.runtime.now(),
                index,
                method,
                path,
                headers,
                body,
            };
            // In the order the sends started: a send whose responder ran outside the
            // lock records after any send that started meanwhile (on another thread),
            // so it goes before them. Usually the end of the list.
            let position = script
                .requests
                .iter()
                .rposition(|r| r.index < index)
                .map_or(0, |before| before + 1);
            script.requests.insert(position, record);
        }
        reply
    }
}

/// The future of [`ScriptedTransport::send`]: hand-written so that it stays small
/// (the attempt loop moves it into its time limit on every send).
struct SendFuture<'a> {
    shared: &'a TransportShared,
    state: SendState<'a>,
    /// Whether this send is counted in `in_flight`.
    in_flight: bool,
}

enum SendState<'a> {
    /// Not polled yet.
    Start(ScriptedRequest),
    /// Waiting for the reply's delay.
    Delayed(Action, SleepRef<'a>),
    /// A stall: pending until dropped.
    Stalled,
    Done,
}

impl SendFuture<'_> {
    fn leave(&mut self) {
        if std::mem::take(&mut self.in_flight) {
            self.shared.finished.fetch_add(1, Ordering::Release);
        }
    }

    fn finish(&mut self, action: Action) -> Poll<Result<ScriptedResponse, TransportError>> {
        let result = match action {
            Action::Respond(spec) => Ok(ScriptedResponse::new(spec, &self.shared.runtime)),
            Action::Fail(error) => Err(error),
            Action::Stall => {
                self.state = SendState::Stalled;
                return Poll::Pending;
            }
        };
        self.state = SendState::Done;
        self.leave();
        Poll::Ready(result)
    }
}

impl Future for SendFuture<'_> {
    type Output = Result<ScriptedResponse, TransportError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        match &mut this.state {
            SendState::Start(_) => {
                let SendState::Start(request) = std::mem::replace(&mut this.state, SendState::Done)
                else {
                    unreachable!("matched Start just above")
                };
                // `answer` counts the send as started before anything can panic.
                this.in_flight = true;
                let reply = this.shared.answer(request);
                if reply.delay.is_zero() {
                    return this.finish(reply.action);
                }
                let mut sleep = this.shared.runtime.sleep_ref(reply.delay);
                if Pin::new(&mut sleep).poll(cx).is_ready() {
                    return this.finish(reply.action);
                }
                this.state = SendState::Delayed(reply.action, sleep);
                Poll::Pending
            }
            SendState::Delayed(_, sleep) => {
                if Pin::new(sleep).poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let SendState::Delayed(action, _) =
                    std::mem::replace(&mut this.state, SendState::Done)
                else {
                    unreachable!("matched Delayed just above")
                };
                this.finish(action)
            }
            SendState::Stalled => Poll::Pending,
            SendState::Done => panic!("ScriptedTransport send future polled after it completed"),
        }
    }
}

impl Drop for SendFuture<'_> {
    fn drop(&mut self) {
        self.leave();
    }
}

/// A [`Transport`](vantage_api_pool::Transport) that answers from a script on a
/// [`VirtualRuntime`]'s clock and records every request.
///
/// Cheap to clone; clones share one script, one record and one set of counters, so a
/// test keeps a clone to script and inspect the transport it gave the client.
/// `Send + Sync`. See the [module docs](crate::transport) for where each send's answer
/// comes from.
///
/// ```
/// use std::time::Duration;
/// use vantage_api_pool::{Transport, TransportResponse};
/// use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
///
/// let rt = VirtualRuntime::new();
/// let transport = ScriptedTransport::new(&rt);
/// transport.push(Reply::status(503).after(Duration::from_millis(200)));
/// transport.push(Reply::ok());
///
/// let (first, second) = rt.block_on(async {
///     let a = transport.send(transport.prepare(transport.handle().get("/a"))?).await?;
///     let b = transport.send(transport.prepare(transport.handle().get("/a"))?).await?;
///     Ok::<_, vantage_api_pool::TransportError>((a.status(), b.status()))
/// })??;
/// assert_eq!((first.as_u16(), second.as_u16()), (503, 200));
/// assert_eq!(transport.request_count(), 2);
/// assert_eq!(rt.elapsed(), Duration::from_millis(200));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct ScriptedTransport {
    shared: Arc<TransportShared>,
    http: ScriptedHttp,
}

impl fmt::Debug for ScriptedTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptedTransport")
            .field("requests", &self.request_count())
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

impl ScriptedTransport {
    /// An empty script on `runtime`'s clock, recording on, admitting at once.
    ///
    /// ```
    /// use vantage_api_pool_testkit::{ScriptedTransport, VirtualRuntime};
    /// let transport = ScriptedTransport::new(&VirtualRuntime::new());
    /// assert_eq!(transport.request_count(), 0);
    /// ```
    #[must_use]
    pub fn new(runtime: &VirtualRuntime) -> ScriptedTransport {
        ScriptedTransport {
            shared: Arc::new(TransportShared {
                runtime: runtime.clone(),
                script: Mutex::new(Script::default()),
                recording: AtomicBool::new(true),
                has_admit: AtomicBool::new(false),
                finished: AtomicUsize::new(0),
                distrusted: AtomicUsize::new(0),
                admitted: AtomicUsize::new(0),
                unanswered: AtomicUsize::new(0),
            }),
            http: ScriptedHttp::default(),
        }
    }

    /// The runtime whose clock this transport uses.
    ///
    /// ```
    /// use vantage_api_pool_testkit::{ScriptedTransport, VirtualRuntime};
    /// let rt = VirtualRuntime::new().with_seed(3);
    /// assert_eq!(ScriptedTransport::new(&rt).runtime().seed(), 3);
    /// ```
    #[must_use]
    pub fn runtime(&self) -> &VirtualRuntime {
        &self.shared.runtime
    }

    /// Appends `reply` to the sequence: the next send with no path script of its own
    /// gets the first reply in the sequence.
    ///
    /// ```
    /// use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
    /// let transport = ScriptedTransport::new(&VirtualRuntime::new());
    /// transport.push(Reply::status(500));
    /// transport.push(Reply::ok());
    /// assert_eq!(transport.scripted_remaining(), 2);
    /// ```
    pub fn push(&self, reply: Reply) -> &Self {
        lock(&self.shared.script).sequence.push_back(reply);
        self
    }

    /// Appends every reply of `replies` to the sequence, in order.
    ///
    /// ```
    /// use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
    /// let transport = ScriptedTransport::new(&VirtualRuntime::new());
    /// transport.push_many([Reply::status(503), Reply::status(503), Reply::ok()]);
    /// assert_eq!(transport.scripted_remaining(), 3);
    /// ```
    pub fn push_many(&self, replies: impl IntoIterator<Item = Reply>) -> &Self {
        lock(&self.shared.script).sequence.extend(replies);
        self
    }

    /// Appends `replies` to the script of `path`: sends to exactly that path take
    /// these first, before the sequence.
    ///
    /// ```
    /// use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
    /// let transport = ScriptedTransport::new(&VirtualRuntime::new());
    /// transport.on_path("/health", [Reply::ok()]);
    /// transport.on_path("/orders", [Reply::status(503), Reply::ok()]);
    /// assert_eq!(transport.scripted_remaining(), 3);
    /// ```
    pub fn on_path(
        &self,
        path: impl Into<String>,
        replies: impl IntoIterator<Item = Reply>,
    ) -> &Self {
        lock(&self.shared.script)
            .by_path
            .entry(path.into())
            .or_default()
            .extend(replies);
        self
    }

    /// Sets the responder: a closure that answers the sends no script answers. It
    /// sees the request (method, path, headers, body) and the send's index on this
    /// transport (from 0), and runs outside the transport's lock, so it may read the
    /// transport's counters. Replaces any earlier responder.
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
    ///
    /// let transport = ScriptedTransport::new(&VirtualRuntime::new());
    /// let token = Arc::new(Mutex::new(String::from("Bearer t2")));
    /// let current = Arc::clone(&token);
    /// transport.respond_with(move |request, _index| {
    ///     let expected = current.lock().unwrap();
    ///     match request.headers().get("authorization") {
    ///         Some(v) if *v == *expected => Reply::ok(),
    ///         _ => Reply::status(401),
    ///     }
    /// });
    /// ```
    pub fn respond_with<F>(&self, responder: F) -> &Self
    where
        F: Fn(&ScriptedRequest, usize) -> Reply + Send + Sync + 'static,
    {
        lock(&self.shared.script).responder = Some(Arc::new(responder));
        self
    }

    /// Sets the reply given (cloned) to every send that nothing else answers.
    ///
    /// ```
    /// use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
    /// let transport = ScriptedTransport::new(&VirtualRuntime::new());
    /// transport.default_reply(Reply::ok()); // a healthy API, for benchmarks
    /// ```
    pub fn default_reply(&self, reply: Reply) -> &Self {
        lock(&self.shared.script).default = Some(reply);
        self
    }

    /// Drops every scripted reply (paths and sequence), the responder and the
    /// default; records and counters stay.
    ///
    /// ```
    /// use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
    /// let transport = ScriptedTransport::new(&VirtualRuntime::new());
    /// transport.push(Reply::ok());
    /// transport.clear_script();
    /// assert_eq!(transport.scripted_remaining(), 0);
    /// ```
    pub fn clear_script(&self) -> &Self {
        let mut script = lock(&self.shared.script);
        script.by_path.clear();
        script.sequence.clear();
        script.responder = None;
        script.default = None;
        self
    }

    /// Scripted replies not yet given (paths and sequence; not the responder or the
    /// default): zero at the end of a test means every scripted reply was used.
    ///
    /// ```
    /// use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
    /// let transport = ScriptedTransport::new(&VirtualRuntime::new());
    /// transport.push(Reply::ok()).push(Reply::ok());
    /// assert_eq!(transport.scripted_remaining(), 2);
    /// ```
    #[must_use]
    pub fn scripted_remaining(&self) -> usize {
        let script = lock(&self.shared.script);
        script.sequence.len() + script.by_path.values().map(VecDeque::len).sum::<usize>()
    }

    /// Makes every [`Transport::admit`](vantage_api_pool::Transport::admit) wait `delay` on
    /// the virtual clock (zero: admit at once, the default). Replaces
    /// [`admit_with`](Self::admit_with).
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool::Transport;
    /// use vantage_api_pool_testkit::{ScriptedTransport, VirtualRuntime};
    /// let rt = VirtualRuntime::new();
    /// let transport = ScriptedTransport::new(&rt);
    /// transport.admit_delay(Duration::from_millis(100));
    /// rt.block_on(transport.admit())?;
    /// assert_eq!(rt.elapsed(), Duration::from_millis(100));
    /// assert_eq!(transport.admitted(), 1);
    /// # Ok::<(), vantage_api_pool_testkit::DriveError>(())
    /// ```
    pub fn admit_delay(&self, delay: Duration) -> &Self {
        let admit = (!delay.is_zero()).then_some(Admit::Delay(delay));
        self.set_admit(admit)
    }

    /// Makes every [`Transport::admit`](vantage_api_pool::Transport::admit) wait for as
    /// long as `wait` says, given the virtual time the sender asks at: a shared rate limit
    /// of your own. The closure runs outside the transport's lock. Replaces
    /// [`admit_delay`](Self::admit_delay).
    ///
    /// ```
    /// use std::sync::Mutex;
    /// use std::time::Duration;
    /// use vantage_api_pool::{Instant, Transport};
    /// use vantage_api_pool_testkit::{ScriptedTransport, VirtualRuntime};
    ///
    /// let rt = VirtualRuntime::new();
    /// let transport = ScriptedTransport::new(&rt);
    /// // One sender every 100 ms, first come first served.
    /// let next_free = Mutex::new(Instant::ORIGIN);
    /// transport.admit_with(move |now| {
    ///     let mut next = next_free.lock().unwrap();
    ///     let at = (*next).max(now);
    ///     *next = at + Duration::from_millis(100);
    ///     at - now
    /// });
    /// rt.block_on(async {
    ///     for _ in 0..3 {
    ///         transport.admit().await;
    ///     }
    /// })?;
    /// assert_eq!(rt.elapsed(), Duration::from_millis(200));
    /// # Ok::<(), vantage_api_pool_testkit::DriveError>(())
    /// ```
    pub fn admit_with<F>(&self, wait: F) -> &Self
    where
        F: Fn(Instant) -> Duration + Send + Sync + 'static,
    {
        self.set_admit(Some(Admit::With(Arc::new(wait))))
    }

    fn set_admit(&self, admit: Option<Admit>) -> &Self {
        let mut script = lock(&self.shared.script);
        self.shared
            .has_admit
            .store(admit.is_some(), Ordering::Relaxed);
        script.admit = admit;
        self
    }

    /// Switches request recording on or off (on by default). Off, sends keep only
    /// the counters: the cheap mode for benchmarks.
    ///
    /// ```
    /// use vantage_api_pool::Transport;
    /// use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
    /// let rt = VirtualRuntime::new();
    /// let transport = ScriptedTransport::new(&rt);
    /// transport.default_reply(Reply::ok()).record(false);
    /// let request = transport.prepare(transport.handle().get("/"))?;
    /// rt.block_on(transport.send(request))??;
    /// assert_eq!((transport.request_count(), transport.requests().len()), (1, 0));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn record(&self, on: bool) -> &Self {
        self.shared.recording.store(on, Ordering::Relaxed);
        self
    }

    /// The recorded requests, in the order their sends started.
    ///
    /// ```
    /// use vantage_api_pool_testkit::{ScriptedTransport, VirtualRuntime};
    /// let transport = ScriptedTransport::new(&VirtualRuntime::new());
    /// assert!(transport.requests().is_empty());
    /// ```
    #[must_use]
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.shared.script).requests.clone()
    }

    /// Forgets the recorded requests (counters stay).
    ///
    /// ```
    /// use vantage_api_pool_testkit::{ScriptedTransport, VirtualRuntime};
    /// let transport = ScriptedTransport::new(&VirtualRuntime::new());
    /// transport.clear_requests();
    /// assert!(transport.requests().is_empty());
    /// ```
    pub fn clear_requests(&self) -> &Self {
        lock(&self.shared.script).requests.clear();
        self
    }

    /// Sends started so far, whether recorded or not.
    ///
    /// ```
    /// use vantage_api_pool_testkit::{ScriptedTransport, VirtualRuntime};
    /// assert_eq!(ScriptedTransport::new(&VirtualRuntime::new()).request_count(), 0);
    /// ```
    #[must_use]
    pub fn request_count(&self) -> usize {
        lock(&self.shared.script).sends
    }

    /// Sends in flight now: started, and neither finished nor dropped.
    ///
    /// ```
    /// use vantage_api_pool_testkit::{ScriptedTransport, VirtualRuntime};
    /// assert_eq!(ScriptedTransport::new(&VirtualRuntime::new()).in_flight(), 0);
    /// ```
    #[must_use]
    pub fn in_flight(&self) -> usize {
        let started = lock(&self.shared.script).sends;
        started.saturating_sub(self.shared.finished.load(Ordering::Acquire))
    }

    /// The most sends ever in flight at once: what a concurrency cap is checked
    /// against.
    ///
    /// ```
    /// use vantage_api_pool_testkit::{ScriptedTransport, VirtualRuntime};
    /// assert_eq!(ScriptedTransport::new(&VirtualRuntime::new()).peak_in_flight(), 0);
    /// ```
    #[must_use]
    pub fn peak_in_flight(&self) -> usize {
        lock(&self.shared.script).peak_in_flight
    }

    /// How many times
    /// [`Transport::distrust_connection`](vantage_api_pool::Transport::distrust_connection)
    /// was called.
    ///
    /// ```
    /// use vantage_api_pool::Transport;
    /// use vantage_api_pool_testkit::{ScriptedTransport, VirtualRuntime};
    /// let transport = ScriptedTransport::new(&VirtualRuntime::new());
    /// transport.distrust_connection();
    /// assert_eq!(transport.distrusted(), 1);
    /// ```
    #[must_use]
    pub fn distrusted(&self) -> usize {
        self.shared.distrusted.load(Ordering::Relaxed)
    }

    /// How many [`Transport::admit`](vantage_api_pool::Transport::admit) futures completed
    /// (a dropped wait is not counted).
    ///
    /// ```
    /// use vantage_api_pool::Transport;
    /// use vantage_api_pool_testkit::{ScriptedTransport, VirtualRuntime};
    /// let rt = VirtualRuntime::new();
    /// let transport = ScriptedTransport::new(&rt);
    /// rt.block_on(transport.admit())?;
    /// assert_eq!(transport.admitted(), 1);
    /// # Ok::<(), vantage_api_pool_testkit::DriveError>(())
    /// ```
    #[must_use]
    pub fn admitted(&self) -> usize {
        self.shared.admitted.load(Ordering::Relaxed)
    }

    /// Sends that found nothing to answer them and failed with `script exhausted`.
    ///
    /// ```
    /// use vantage_api_pool::{Transport, TransportErrorKind};
    /// use vantage_api_pool_testkit::{ScriptedTransport, VirtualRuntime};
    /// let rt = VirtualRuntime::new();
    /// let transport = ScriptedTransport::new(&rt);
    /// let request = transport.prepare(transport.handle().get("/"))?;
    /// let err = rt.block_on(transport.send(request))?.unwrap_err();
    /// assert_eq!(err.kind(), TransportErrorKind::Config);
    /// assert_eq!(err.message(), "script exhausted");
    /// assert_eq!(transport.unanswered(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn unanswered(&self) -> usize {
        self.shared.unanswered.load(Ordering::Relaxed)
    }
}

impl SendTransport for ScriptedTransport {
    type Handle = ScriptedHttp;
    type Draft = ScriptedRequestBuilder;
    type Request = ScriptedRequest;
    type Response = ScriptedResponse;

    fn handle(&self) -> &ScriptedHttp {
        &self.http
    }

    /// Fails with [`TransportErrorKind::Config`] for a draft marked invalid or given
    /// an invalid header; otherwise never fails.
    fn prepare(&self, draft: ScriptedRequestBuilder) -> Result<ScriptedRequest, TransportError> {
        if let Some(reason) = draft.invalid {
            return Err(TransportError::new(TransportErrorKind::Config, reason));
        }
        Ok(ScriptedRequest {
            method: draft.method,
            path: draft.path,
            headers: draft.headers,
            body: draft.body,
        })
    }

    /// On first poll: counts the send in flight, picks its reply (see the
    /// [module docs](crate::transport)), records the request, then waits the
    /// reply's delay on the virtual clock. Dropping the future at any point ends the
    /// send and takes it out of [`in_flight`](ScriptedTransport::in_flight).
    fn send(
        &self,
        request: ScriptedRequest,
    ) -> impl Future<Output = Result<ScriptedResponse, TransportError>> + Send {
        SendFuture {
            shared: &self.shared,
            state: SendState::Start(request),
            in_flight: false,
        }
    }

    /// Waits as [`admit_delay`](ScriptedTransport::admit_delay) or
    /// [`admit_with`](ScriptedTransport::admit_with) say (at once by default), then
    /// counts the admission. Dropping the future gives up the wait; nothing is counted.
    fn admit(&self) -> impl Future<Output = ()> + Send {
        let shared = &*self.shared;
        async move {
            if shared.has_admit.load(Ordering::Relaxed) {
                let admit = match &lock(&shared.script).admit {
                    None => None,
                    Some(Admit::Delay(d)) => Some(Ok(*d)),
                    Some(Admit::With(f)) => Some(Err(Arc::clone(f))),
                };
                let wait = match admit {
                    None => Duration::ZERO,
                    Some(Ok(d)) => d,
                    Some(Err(f)) => f(shared.runtime.now()),
                };
                if !wait.is_zero() {
                    shared.runtime.sleep_ref(wait).await;
                }
            }
            shared.admitted.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts the call ([`distrusted`](ScriptedTransport::distrusted)); nothing else.
    fn distrust_connection(&self) {
        self.shared.distrusted.fetch_add(1, Ordering::Relaxed);
    }
}

/// Shows a header map's names only: `Debug` never prints a header value or a body.
struct HeaderNames<'a>(&'a HeaderMap);

impl fmt::Debug for HeaderNames<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}

impl fmt::Debug for ScriptedRequestBuilder {
    /// Method, path, header names and body length: no header value, no body.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptedRequestBuilder")
            .field("method", &self.method)
            .field("path", &self.path)
            .field("headers", &HeaderNames(&self.headers))
            .field("body_len", &self.body.len())
            .field("invalid", &self.invalid.is_some())
            .finish()
    }
}

impl fmt::Debug for ScriptedRequest {
    /// Method, path, header names and body length: no header value, no body.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptedRequest")
            .field("method", &self.method)
            .field("path", &self.path)
            .field("headers", &HeaderNames(&self.headers))
            .field("body_len", &self.body.len())
            .finish()
    }
}

impl fmt::Debug for RecordedRequest {
    /// Time, index, method, path, header names and body length: no header value, no
    /// body (read the fields for those).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordedRequest")
            .field("at", &self.at)
            .field("index", &self.index)
            .field("method", &self.method)
            .field("path", &self.path)
            .field("headers", &HeaderNames(&self.headers))
            .field("body_len", &self.body.len())
            .finish()
    }
}
