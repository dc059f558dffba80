//! # vantage-api-pool-reqwest
//!
//! [`ReqwestTransport`]: the [`Transport`](vantage_api_pool::Transport) port of
//! `vantage-api-pool` over [`reqwest`], natively (hyper, rustls, HTTP/1.1 and HTTP/2) and
//! on `wasm32-unknown-unknown` (the browser's or Node's `fetch`).
//!
//! | port type | here |
//! |---|---|
//! | [`Transport::Handle`](vantage_api_pool::Transport::Handle) | [`reqwest::Client`]: what the caller's request closure receives |
//! | [`Transport::Draft`](vantage_api_pool::Transport::Draft) | [`reqwest::RequestBuilder`]: what the closure returns |
//! | [`Transport::Request`](vantage_api_pool::Transport::Request) | [`ReqwestRequest`]: the built [`reqwest::Request`] and the client that will send it |
//! | [`Transport::Response`](vantage_api_pool::Transport::Response) | [`ReqwestResponse`]: the [`reqwest::Response`] at its head, body still streaming |
//!
#![cfg_attr(
    all(feature = "tokio", not(target_arch = "wasm32")),
    doc = r##"
# Quick start (tokio)

With the default feature `tokio`, one call gives a
[`ClientBuilder`](vantage_api_pool::ClientBuilder) over this transport and
[`TokioRuntime`]:

```no_run
use std::sync::Arc;
use std::time::Duration;
use vantage_api_pool::{CallPolicy, health::HealthObserver};
use vantage_api_pool_reqwest::ReqwestTransport;

# async fn demo(url: &str) -> Result<(), Box<dyn std::error::Error>> {
let health = Arc::new(HealthObserver::new(Duration::from_secs(60)));
// The adapter builds the reqwest client: a 30 s read timeout, no retries of
// reqwest's own, a tracked redirect policy (see "Hidden retries" below).
let client = ReqwestTransport::tokio_default()?
    .max_parallel(4).rate_limit(10.0).default_breaker()
    .observer("orders-api", health).build()?;
let resp = client.execute_with(&CallPolicy::essential(), |http| http.get(url)).await?;
let orders = resp.into_inner().text().await?; // a plain reqwest::Response
# let _ = orders;

// Or a reqwest client of your own, from the adapter's builder so it keeps those
// settings (a plain `reqwest::Client::new()` has none of them):
let own = ReqwestTransport::default_client_builder()
    .user_agent("orders-sync/1.0")
    .build()?;
let client = ReqwestTransport::tokio_builder(own).max_parallel(4).build()?;
# let _ = client;
# Ok(())
# }
```
"##
)]
#![cfg_attr(
    target_arch = "wasm32",
    doc = r##"
# Quick start (wasm32)

Build the client over this transport and `WasmRuntime` (crate
`vantage-api-pool-wasm`), keep it (a `thread_local!` serves), and give every request
its own timeout, since fetch has no read timeout:

```ignore
let client = ResilientClient::builder(
    ReqwestTransport::new(reqwest::Client::new()),
    WasmRuntime::new(),
)
.max_parallel(4)
.build()?;
let response = client
    .execute_with(&CallPolicy::bounded(RetryPolicy::default()), |http| {
        http.get(url).timeout(Duration::from_secs(30))
    })
    .await?;
```

The README's "In a browser or Node" section has a whole crate, its manifest and
the wasm-bindgen steps; [Targets](#targets) below says what differs from native.
"##
)]
//!
//! # Which client sends
//!
//! Two ways to make a transport natively (one on wasm32), which differ in who owns
//! the [`reqwest::Client`]:
//!
//! - [`ReqwestTransport::new`] takes your client and uses its settings as they are.
//!   [`Transport::prepare`](vantage_api_pool::Transport::prepare) uses
//!   [`reqwest::RequestBuilder::build_split`] and the request is sent by the client the
//!   draft was made from, exactly as [`reqwest::RequestBuilder::send`] would.
#![cfg_attr(
    not(target_arch = "wasm32"),
    doc = r##"
- [`ReqwestTransport::with_builder`] (and [`ReqwestTransport::with_defaults`])
  takes a function that makes a [`reqwest::ClientBuilder`], and builds the client
  itself, so it can build a fresh one when
  [`distrust_connection`](vantage_api_pool::Transport::distrust_connection) asks for it.
  The request closure always receives the first client; requests are sent by the newest
  one (made by the same function, so with the same settings), whichever client the draft
  was made from.
"##
)]
#![cfg_attr(
    target_arch = "wasm32",
    doc = r##"
- Natively, `ReqwestTransport::with_builder` builds the client from a function, so
  that it can build a fresh one; on wasm32 there is no such thing to do (fetch
  gives no handle on its connections), and no `with_builder`.
"##
)]
//!
//! The client's default headers (`ClientBuilder::default_headers`) are merged by
//! reqwest when the request is sent, so
//! [`PreparedRequest::header`](vantage_api_pool::PreparedRequest::header) does not see
//! them: an `Idempotency-Key` or `Authorization` set as a default header is
//! invisible to the attempt loop. Set such headers on the draft instead.
//!
#![cfg_attr(
    not(target_arch = "wasm32"),
    doc = r##"
# `distrust_connection`

The pool calls it after a time limit cut a send: the connection that carried it
may be stuck. reqwest has no call to drop one pooled connection, so:

- on a client the adapter built, the whole client is replaced by a fresh one from
  the same builder function: new sends use a new connection pool, and requests
  already in flight finish on their own. Intermediate clients are dropped once no
  request holds them; the first client stays alive (it is the handle the request
  closure receives), so its idle connections last until its `pool_idle_timeout`.
  A rebuild starts from a fresh client state: a cookie jar, TLS session cache and
  DNS cache of the old client do not carry over (share a jar through
  `cookie_provider` in the builder function if sessions matter). At most one rebuild per second
  ([`REBUILD_INTERVAL`]); [`ReqwestTransport::rebuilds`] counts them. Building a
  client loads the root certificates and sets up TLS: blocking work done in the
  calling task, measured here at 2 to 3 ms in a release build and 18 to 40 ms in a
  debug one. The tasks of that worker thread wait for it (on a current-thread
  runtime, every task), and their calls' budgets run on meanwhile, at most once per
  [`REBUILD_INTERVAL`]; if that matters more than a fresh pool, supply your own
  client (no rebuilds).
- on a client you supplied, nothing can be done, and nothing is. What happens
  anyway: the pool drops the cut send's future, and hyper never puts an HTTP/1.1
  connection whose exchange was abandoned back into the pool, so the next send
  dials afresh. On HTTP/2 the stream is reset and the shared connection stays in
  use: if that connection is the stuck part, later sends on it will time out too
  until hyper notices (set `http2_keep_alive_interval` on your client).

# Hidden retries

Three layers under this adapter can send a request again without the pool knowing
(no rate token, no permit, no event):

- reqwest 0.13's own retry policy, which by default resends a request that an
  HTTP/2 server refused (`REFUSED_STREAM`) or cut off with a graceful `GOAWAY`, up
  to twice. A client the adapter builds sets
  [`retry(reqwest::retry::never())`](reqwest::ClientBuilder::retry), so these
  come to the pool: a refused stream as `NotSent`, redialed through its gate (at
  most twice a call, each reported); a `GOAWAY` as `Interrupted`, because hyper
  can fail a request h2 had already sent with the connection's `GOAWAY` (see
  [`error`]), which reqwest's retry would resend too. On a client you supply,
  set it yourself; never give a client used here a retry policy that retries on
  status codes, or retries multiply.
- hyper-util's resend of a request that a reused keep-alive connection handed back
  unwritten (the server had closed it). It cannot be turned off through reqwest;
  it only resends requests that provably never left, on another connection, so
  the pool sees one send that took a little longer.
- redirects: reqwest follows up to 10 by default within one send. A hop to another
  origin (host, port or scheme) drops `Authorization`, `Cookie` and
  `Proxy-Authorization`, but not other headers. A [tracked](redirect::tracked)
  policy follows no hop out of the API's origin for a request that carries the
  token under another name (say `x-api-key`), or any header value marked
  sensitive under a name reqwest keeps on such a hop: the 3xx goes to the
  caller. With an untracked policy, such a token
  source should be used with
  `redirect(reqwest::redirect::Policy::none())`, which hands every 3xx to the
  caller. An error on a later hop (refused, DNS, TLS) would read as "never sent"
  although the first hop reached a server; a [tracked](redirect::tracked) policy,
  the default on clients the adapter builds, lets the adapter report it as
  `Interrupted` instead. reqwest drops those credentials only from a hop that
  changes origin, and puts them back on the next: a tracked policy also stops a
  chain at a second hop inside another origin, handing that 3xx to the caller,
  which keeps the API's token from reaching it. A response to a hop that went
  without the credentials says
  [`credentials_dropped`](vantage_api_pool::TransportResponse::credentials_dropped)
  under a tracked policy, so a 401 there is final: no token is refreshed for it.
"##
)]
#![cfg_attr(
    target_arch = "wasm32",
    doc = r##"
# `distrust_connection`

Does nothing on wasm32: fetch gives no handle on its connections. Dropping a send
(as the pool does when a time limit cuts it) aborts its fetch: on HTTP/1.1 the
browser and Node close its connection; on HTTP/2 and HTTP/3 only its stream is
reset, and the shared connection stays in use (if that connection is the stuck
part, later sends on it time out too until the platform gives it up).

# Hidden retries

fetch follows redirects itself, with no policy to set and no hop the adapter can
see: it drops `Authorization` on a hop to another origin, but a token under another
header name (`x-api-key`) goes along, so point such a client only at an API whose
redirects stay in its origin. The adapter sees fetch's final URL: when it is not the
request's, the answer of a request other than a `GET` or `HEAD` counts as answered
by a redirect (`answered_by_redirect`; a 307 or 308 too, which it cannot tell from a
303), so a POST answered `303 See Other` whose GET meets a 429, a 503 with a delay
or a 401 is not sent again; and one from another origin as sent without
`Authorization` (`credentials_dropped`); the two URLs are compared with their
percent-encoding decoded (Chromium encodes a `|` or `^` in a path that reqwest's URL
keeps as it is). A chain that leaves the origin and comes back to the request's URL
looks like no redirect (give such a POST an `Idempotency-Key` the server honours),
and one that comes back to another URL of its origin like a redirect that kept
`Authorization`. What the platform's own network stack does under
fetch (a resend of a request that a kept-alive connection handed back unwritten,
say) is out of the adapter's sight.

"##
)]
//! # Errors
//!
//! Every failure is turned into a [`TransportError`] by [`transport_error`] (before
//! the response head) or [`body_error`] (while reading a body); the table of kinds is
//! in the [`error`] module. Messages are built from [`reqwest::Error::without_url`]
//! and never contain a URL.
//!
//! # Success bodies
//!
//! The response is returned at its head; the body belongs to the caller and is read
//! outside the pool's time limits.
#![cfg_attr(
    not(target_arch = "wasm32"),
    doc = r##"
A client the adapter builds has a read timeout
([`DEFAULT_READ_TIMEOUT`], 30 s), so a body that stalls fails
(`reqwest::Error::is_timeout`) instead of hanging its reader; give a client of
your own a `read_timeout` too.
"##
)]
//! On `wasm32` reqwest has no client-wide timeout:
//! give each request its own (`RequestBuilder::timeout`, at most
//! [`MAX_WASM_TIMEOUT`]), or a stalled body keeps its reader waiting.
//!
//! # Testing on virtual time
//!
#![cfg_attr(
    all(feature = "testkit", not(target_arch = "wasm32")),
    doc = "With the feature `testkit` (for dev-dependencies, native targets), \
           [`ScriptedReqwest`] (module [`scripted`])"
)]
#![cfg_attr(
    not(all(feature = "testkit", not(target_arch = "wasm32"))),
    doc = "With the feature `testkit` (for dev-dependencies, native targets; these docs \
           were built without it or for wasm32, so its items are missing: `cargo doc \
           --features vantage-api-pool-reqwest/testkit`, or `--all-features`, on a \
           native target shows them), `ScriptedReqwest` (module `scripted`)"
)]
//! puts the testkit's scripted API behind this transport's types:
//! the same request closures and the same code reading a [`ReqwestResponse`] run on a
//! `VirtualRuntime`, with nothing sent.
//!
//! # Targets
//!
//! On `wasm32` the responses come from `fetch`, and things differ (see
//! [`ReqwestResponse`]): there is no `Deref` to [`reqwest::Response`],
//! [`ReqwestResponse::into_inner`] returns `None` once the body has been read with
//! [`TransportResponse::chunk`](vantage_api_pool::TransportResponse::chunk), there is
//! no `ReqwestTransport::with_builder` (fetch gives no handle on its connections,
//! so there is none to distrust; dropping a send aborts its fetch) and no `tokio`
//! feature. Fetch reports every network failure alike (Node's fetch gives a cause,
//! which reqwest 0.13 drops), so most of them map to `Interrupted` there. In a browser, a request carrying a credential the browser
//! would drop without an error (`cookie`, `cookie2`, `proxy-authorization`, or a
//! sensitive header, a token's, under a forbidden name) fails with `Config` before
//! the fetch, nothing sent. Never send with `fetch_mode_no_cors()`: reqwest 0.13 throws
//! a JavaScript exception on the opaque response of a cross-origin no-cors fetch,
//! which ends the call without running its destructors (it never returns and keeps
//! its permit), and the adapter cannot see the mode on a request.
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![warn(clippy::missing_errors_doc)]

pub mod error;
#[cfg(not(target_arch = "wasm32"))]
pub mod redirect;
mod request;
mod response;
#[cfg(all(feature = "testkit", not(target_arch = "wasm32")))]
#[cfg_attr(docsrs, doc(cfg(feature = "testkit")))]
pub mod scripted;

pub use error::{body_error, transport_error};

/// The longest request timeout (`RequestBuilder::timeout`) a request keeps on
/// `wasm32`: 2^31 - 1 ms (24.8 days), the longest delay a JavaScript timer takes. A
/// longer one, `Duration::MAX` included, is cut to it when the request is sent
/// (reqwest would panic on it there); a shorter one is rounded up to whole
/// milliseconds, plus one, so that its timer never cuts the fetch early. Native
/// targets keep every timeout as given.
pub const MAX_WASM_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(i32::MAX as u64);
pub use request::ReqwestRequest;
pub use response::ReqwestResponse;
#[cfg(all(feature = "testkit", not(target_arch = "wasm32")))]
#[cfg_attr(docsrs, doc(cfg(feature = "testkit")))]
pub use scripted::ScriptedReqwest;

/// Re-exported so callers name the same reqwest as the adapter. The adapter's
/// features `json`, `query` and `form` turn on reqwest's own of those names
/// (`RequestBuilder::json`, `Response::json`, `RequestBuilder::query`,
/// `RequestBuilder::form`), so these need no `reqwest` dependency of your own.
pub use reqwest;
/// Re-exported so callers name the same `vantage-api-pool` as the adapter,
/// with no second dependency to keep at the same version:
///
/// ```
/// use vantage_api_pool_reqwest::vantage_api_pool::CallPolicy;
/// assert!(CallPolicy::essential().budget().is_none());
/// ```
pub use vantage_api_pool;
/// Re-exported with the `tokio` feature, for [`ReqwestTransport::tokio_builder`]'s
/// return type.
#[cfg(all(feature = "tokio", not(target_arch = "wasm32")))]
pub use vantage_api_pool_tokio::TokioRuntime;

/// A client over reqwest and tokio, as [`ReqwestTransport::tokio_builder`] and
/// [`ReqwestTransport::tokio_default`] build it: the type to name in a struct field or
/// a signature (`TokioClient` without auth, `TokioClient<A>` with a token source).
///
/// ```
/// use vantage_api_pool_reqwest::{ReqwestTransport, TokioClient};
///
/// struct Orders {
///     api: TokioClient,
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let orders = Orders { api: ReqwestTransport::tokio_default()?.build()? };
/// # let _ = orders.api;
/// # Ok(())
/// # }
/// ```
#[cfg(all(feature = "tokio", not(target_arch = "wasm32")))]
pub type TokioClient<A = vantage_api_pool::NoAuth> =
    vantage_api_pool::ResilientClient<ReqwestTransport, TokioRuntime, A>;

/// A transport with reqwest's types at its port: its request closures get a
/// [`reqwest::Client`] and return a [`reqwest::RequestBuilder`], and its responses are
/// [`ReqwestResponse`]s. [`ReqwestTransport`] is one, and so is `ScriptedReqwest`
/// (feature `testkit`), so code bound on this trait runs over both: in production and
/// on virtual time. It stands for the three bounds it spells out, and every transport
/// with those types has it.
///
/// ```
/// use vantage_api_pool::{ResilientClient, Runtime, TokenSource};
/// use vantage_api_pool_reqwest::{ReqwestLike, ReqwestTransport, reqwest};
///
/// async fn open_orders<T: ReqwestLike, R: Runtime, A: TokenSource>(
///     api: &ResilientClient<T, R, A>,
///     base: &str,
/// ) -> Result<String, Box<dyn std::error::Error>> {
///     let response = api.execute(|http| http.get(format!("{base}/orders?open=1"))).await?;
///     Ok(response.text().await?)
/// }
///
/// fn takes(_: &impl ReqwestLike) {}
/// takes(&ReqwestTransport::new(reqwest::Client::new()));
/// ```
pub trait ReqwestLike:
    vantage_api_pool::Transport<
        Handle = reqwest::Client,
        Draft = reqwest::RequestBuilder,
        Response = ReqwestResponse,
    >
{
}

impl<T> ReqwestLike for T where
    T: vantage_api_pool::Transport<
            Handle = reqwest::Client,
            Draft = reqwest::RequestBuilder,
            Response = ReqwestResponse,
        >
{
}

/// [`ReqwestLike`] for code that spawns its calls: reqwest's types at the port of a
/// [`SendTransport`](vantage_api_pool::transport::SendTransport), whose futures are
/// `Send`. [`ReqwestTransport`] is one on native targets, and so is `ScriptedReqwest`
/// (feature `testkit`). Bind a transport on this alone (not on [`ReqwestLike`] or
/// `Transport` as well, which leaves the compiler two ways to the send and no proof
/// of `Send`: rustc then suggests bounding `<T as Transport>::Request: Send`, a dead
/// end; drop the extra bound instead), with the runtime and token source on
/// [`SendRuntime`](vantage_api_pool::runtime::SendRuntime) and
/// [`SendTokenSource`](vantage_api_pool::auth::SendTokenSource), and the call's future
/// is `Send`. Native targets only: no transport is `Send` on wasm32.
///
/// ```
/// use vantage_api_pool::auth::SendTokenSource;
/// use vantage_api_pool::runtime::SendRuntime;
/// use vantage_api_pool::{ClientError, ResilientClient};
/// use vantage_api_pool_reqwest::{SendReqwestLike, TokioRuntime, ReqwestTransport};
///
/// /// Starts a refresh of the open orders on a task of its own.
/// fn spawn_refresh<T, R, A>(
///     api: &ResilientClient<T, R, A>,
///     url: String,
/// ) -> tokio::task::JoinHandle<Result<u16, ClientError>>
/// where
///     T: SendReqwestLike + 'static,
///     R: SendRuntime + 'static,
///     A: SendTokenSource + 'static,
/// {
///     let call = api.clone().into_read_call(1 << 20, move |http| http.get(&url));
///     tokio::spawn(async move { Ok(call.await?.status().as_u16()) })
/// }
///
/// fn takes(_: &impl SendReqwestLike) {}
/// takes(&ReqwestTransport::new(vantage_api_pool_reqwest::reqwest::Client::new()));
/// # let _ = spawn_refresh::<ReqwestTransport, TokioRuntime, vantage_api_pool::NoAuth>;
/// ```
#[cfg(not(target_arch = "wasm32"))]
pub trait SendReqwestLike:
    vantage_api_pool::transport::SendTransport<
        Handle = reqwest::Client,
        Draft = reqwest::RequestBuilder,
        Response = ReqwestResponse,
    >
{
}

#[cfg(not(target_arch = "wasm32"))]
impl<T> SendReqwestLike for T where
    T: vantage_api_pool::transport::SendTransport<
            Handle = reqwest::Client,
            Draft = reqwest::RequestBuilder,
            Response = ReqwestResponse,
        >
{
}

use std::fmt;
use std::future::Future;
#[cfg(not(target_arch = "wasm32"))]
use std::sync::{Arc, Mutex, PoisonError};
#[cfg(not(target_arch = "wasm32"))]
use std::time::Duration;

use vantage_api_pool::{TransportError, TransportErrorKind};

/// The read timeout of a client the adapter builds: a body that sends nothing for
/// this long fails with a timeout instead of hanging its reader. reqwest starts it
/// anew for each read of the body, but only once for the head: a response head
/// (its redirect hops and a streamed upload included) not complete this long after
/// the send began fails with a timeout, even while bytes keep arriving. An attempt
/// timeout longer than this needs a client with a longer read timeout.
#[cfg(not(target_arch = "wasm32"))]
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The connect timeout of a client the adapter builds: a connection not set up
/// (TCP, and TLS for `https`) in this long fails as
/// [`Connect`](TransportErrorKind::Connect), so the call knows nothing was sent and
/// retries it even for a POST, and it counts toward the breaker. Without it a
/// connect that hangs (a host that drops the packets, a full accept queue) runs
/// into the attempt timeout (10 s by default) and fails as `TimedOut`, which may
/// have reached the server: a POST is then not retried. Keep a connect timeout of
/// your own below your attempt timeouts.
#[cfg(not(target_arch = "wasm32"))]
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The shortest time between two rebuilds of a client the adapter built: the
/// timeouts of many concurrent sends on one stuck connection cause one rebuild.
#[cfg(not(target_arch = "wasm32"))]
pub const REBUILD_INTERVAL: Duration = Duration::from_secs(1);

/// The [`Transport`](vantage_api_pool::Transport) port over a [`reqwest::Client`].
///
/// Cheap to clone (clones share the client and, for a client the adapter built, its
/// rebuilds). Its send future is `Send` on native targets, so a call over it can be
/// `tokio::spawn`ed.
#[derive(Clone)]
pub struct ReqwestTransport {
    /// The handle given to the request closure.
    client: reqwest::Client,
    /// For a client the adapter built: how to build it again, and the newest one.
    #[cfg(not(target_arch = "wasm32"))]
    rebuild: Option<Arc<Rebuild>>,
}

/// A function that makes the builder of a client the adapter owns.
#[cfg(not(target_arch = "wasm32"))]
type MakeBuilder = dyn Fn() -> reqwest::ClientBuilder + Send + Sync;

#[cfg(not(target_arch = "wasm32"))]
struct Rebuild {
    make: Box<MakeBuilder>,
    state: Mutex<Sender>,
}

/// The client that sends, and when it was last replaced.
#[cfg(not(target_arch = "wasm32"))]
struct Sender {
    client: reqwest::Client,
    rebuilt_at: Option<std::time::Instant>,
    rebuilds: u64,
}

#[cfg(not(target_arch = "wasm32"))]
impl Rebuild {
    fn lock(&self) -> std::sync::MutexGuard<'_, Sender> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl ReqwestTransport {
    /// A transport over your `client`, whose settings (timeouts, TLS, proxies, default
    /// headers, redirects, retries) are used as they are.
    ///
    #[cfg_attr(
        not(target_arch = "wasm32"),
        doc = r##"
[`distrust_connection`](vantage_api_pool::Transport::distrust_connection) can do
nothing with it (see the crate docs). Consider giving the client a `read_timeout`
(so a stalled success body cannot hang its reader), a `connect_timeout` below your
attempt timeouts (so a connect that hangs fails as `Connect`, which a POST retries,
and not as a `TimedOut` that may have reached the server), `retry(reqwest::retry::never())`
(so reqwest does not resend behind the pool's back), a
[tracked](redirect::tracked) redirect policy (so an error after a redirect is not
taken for an unsent request, and the token does not follow a redirect to another
origin on a later hop or under a custom header name) and `referer(false)` (so a
redirect does not tell another origin the API's URL), as
[`default_client_builder`](ReqwestTransport::default_client_builder) does.

Keep the `read_timeout` finite: reqwest adds it to the clock at each body read
without a check, so `Duration::MAX` (or any timeout that overflows an instant)
panics at the first read, the loop's read of an error body included. To have
no read timeout, leave it unset. A request's own `timeout(Duration::MAX)` is
fine.
"##
    )]
    #[cfg_attr(
        target_arch = "wasm32",
        doc = r##"
On wasm32 this is the only way to make one: `reqwest::Client::new()` serves. It
has no read timeout, so give each request its own `timeout` (see the crate docs).
"##
    )]
    #[must_use]
    pub fn new(client: reqwest::Client) -> Self {
        ReqwestTransport {
            client,
            #[cfg(not(target_arch = "wasm32"))]
            rebuild: None,
        }
    }

    /// The client given to the request closure on every send.
    #[must_use]
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl ReqwestTransport {
    /// The builder of the client [`with_defaults`](ReqwestTransport::with_defaults)
    /// makes: reqwest's defaults (rustls, HTTP/1.1 and HTTP/2, up to 10 redirects,
    /// [tracked](redirect::tracked) so an error after a redirect is not taken for an
    /// unsent request), plus a [`read_timeout`](reqwest::ClientBuilder::read_timeout)
    /// of [`DEFAULT_READ_TIMEOUT`], a
    /// [`connect_timeout`](reqwest::ClientBuilder::connect_timeout) of
    /// [`DEFAULT_CONNECT_TIMEOUT`], [`reqwest::retry::never`] and no `Referer` header
    /// (reqwest would send the URL a redirect came from, path and query included, to
    /// the origin it leads to).
    ///
    /// A `read_timeout` you set must be finite (see [`new`](ReqwestTransport::new)).
    ///
    /// Start from it to change something:
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool_reqwest::ReqwestTransport;
    ///
    /// let transport = ReqwestTransport::with_builder(|| {
    ///     ReqwestTransport::default_client_builder()
    ///         .read_timeout(Duration::from_secs(5))
    ///         .user_agent("orders-sync/1.0")
    /// })?;
    /// # let _ = transport;
    /// # Ok::<(), vantage_api_pool::TransportError>(())
    /// ```
    pub fn default_client_builder() -> reqwest::ClientBuilder {
        reqwest::Client::builder()
            .read_timeout(DEFAULT_READ_TIMEOUT)
            .connect_timeout(DEFAULT_CONNECT_TIMEOUT)
            .retry(reqwest::retry::never())
            .redirect(redirect::tracked(reqwest::redirect::Policy::default()))
            // reqwest would tell the origin a redirect leads to the URL it came
            // from, path and query included.
            .referer(false)
    }

    /// A transport over a client the adapter builds from
    /// [`default_client_builder`](ReqwestTransport::default_client_builder), and
    /// rebuilds when a connection is distrusted.
    ///
    /// # Errors
    ///
    /// [`TransportErrorKind::Config`] when reqwest cannot build the client (for
    /// example when the TLS backend cannot be initialised).
    pub fn with_defaults() -> Result<Self, TransportError> {
        ReqwestTransport::with_builder(ReqwestTransport::default_client_builder)
    }

    /// A transport over a client the adapter builds from `make()`, and builds again from
    /// `make()` when
    /// [`distrust_connection`](vantage_api_pool::Transport::distrust_connection) asks for
    /// it (see the crate docs).
    ///
    /// A later rebuild that fails keeps the client in use.
    ///
    /// # Errors
    ///
    /// [`TransportErrorKind::Config`] when reqwest cannot build the client.
    pub fn with_builder<F>(make: F) -> Result<Self, TransportError>
    where
        F: Fn() -> reqwest::ClientBuilder + Send + Sync + 'static,
    {
        let client = make().build().map_err(transport_error)?;
        Ok(ReqwestTransport {
            client: client.clone(),
            rebuild: Some(Arc::new(Rebuild {
                make: Box::new(make),
                state: Mutex::new(Sender {
                    client,
                    rebuilt_at: None,
                    rebuilds: 0,
                }),
            })),
        })
    }

    /// Whether the adapter built the client (and so can rebuild it).
    #[must_use]
    pub fn owns_client(&self) -> bool {
        self.rebuild.is_some()
    }

    /// How many times the client was rebuilt after a distrusted connection; always 0
    /// for a client you supplied.
    #[must_use]
    pub fn rebuilds(&self) -> u64 {
        self.rebuild.as_ref().map_or(0, |r| r.lock().rebuilds)
    }

    /// The client that sends the next request.
    #[must_use]
    pub fn sending_client(&self) -> reqwest::Client {
        match &self.rebuild {
            Some(rebuild) => rebuild.lock().client.clone(),
            None => self.client.clone(),
        }
    }
}

#[cfg(all(feature = "tokio", not(target_arch = "wasm32")))]
impl ReqwestTransport {
    /// A [`ClientBuilder`](vantage_api_pool::ClientBuilder) over your `client` and a
    /// fresh [`TokioRuntime`]: the one call of the quick start.
    ///
    /// Same as `ResilientClient::builder(ReqwestTransport::new(client),
    /// TokioRuntime::new())`. See [`ReqwestTransport::new`] for what your client
    /// should have, or use [`tokio_default`](ReqwestTransport::tokio_default).
    ///
    /// Each call makes its own runtime, whose clock starts when it is made, so the
    /// event times of clients built apart are not comparable. To read several clients
    /// against one clock (one `HealthObserver` read with `snapshots_at`), build them
    /// over clones of one runtime with `ResilientClient::builder`.
    ///
    /// The client belongs to one tokio runtime: hyper's pooled connections live on the
    /// runtime that opened them, and a request in flight on one fails (`Interrupted`)
    /// when that runtime shuts down. Build one per test in `#[tokio::test]`s.
    ///
    /// # Panics
    ///
    /// Not here, but the first wait of a call (a back-off, a time limit) panics when
    /// no tokio runtime with its time driver is current, as tokio's timers do.
    pub fn tokio_builder(
        client: reqwest::Client,
    ) -> vantage_api_pool::ClientBuilder<ReqwestTransport, TokioRuntime> {
        vantage_api_pool::ResilientClient::builder(
            ReqwestTransport::new(client),
            TokioRuntime::new(),
        )
    }

    /// A [`ClientBuilder`](vantage_api_pool::ClientBuilder) over a client the adapter
    /// builds ([`with_defaults`](ReqwestTransport::with_defaults): 30 s read timeout,
    /// no reqwest retries, rebuilt when a connection is distrusted) and a fresh
    /// [`TokioRuntime`] (its own clock: see
    /// [`tokio_builder`](ReqwestTransport::tokio_builder) for clients built apart, for
    /// one client per tokio runtime, and for what needs a tokio runtime).
    ///
    /// # Errors
    ///
    /// [`TransportErrorKind::Config`] when reqwest cannot build the client.
    pub fn tokio_default()
    -> Result<vantage_api_pool::ClientBuilder<ReqwestTransport, TokioRuntime>, TransportError> {
        Ok(vantage_api_pool::ResilientClient::builder(
            ReqwestTransport::with_defaults()?,
            TokioRuntime::new(),
        ))
    }
}

impl fmt::Debug for ReqwestTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not the client itself: its Debug prints default header values and proxies.
        let mut d = f.debug_struct("ReqwestTransport");
        #[cfg(not(target_arch = "wasm32"))]
        d.field("owns_client", &self.owns_client())
            .field("rebuilds", &self.rebuilds());
        d.finish_non_exhaustive()
    }
}

impl From<reqwest::Client> for ReqwestTransport {
    fn from(client: reqwest::Client) -> Self {
        ReqwestTransport::new(client)
    }
}

// The transport's one implementation: of `SendTransport` on native targets (its
// futures are `Send`, so generic code can spawn calls over it) and of the plain
// `Transport` on wasm32 (a `fetch` holds `JsValue`s).
macro_rules! transport_impl {
    ($port:path $(, $send:ident)?) => {
        impl $port for ReqwestTransport {
            type Handle = reqwest::Client;
            type Draft = reqwest::RequestBuilder;
            type Request = ReqwestRequest;
            type Response = ReqwestResponse;

            fn handle(&self) -> &reqwest::Client {
                &self.client
            }

            /// Builds the draft ([`reqwest::RequestBuilder::build_split`]).
            ///
            /// Fails with [`TransportErrorKind::Config`] when reqwest could not build it (an
            /// invalid URL, header or body) or when its URL scheme is not `http` or `https`
            /// (which reqwest would only report when sending). Nothing is sent.
            ///
            /// The request is sent by the draft's client, or, on a client the adapter
            /// built, by its newest client at the time of sending (chosen in
            /// [`Transport::send`](vantage_api_pool::Transport::send), so a rebuild during
            /// the permit or rate-token wait reaches requests already prepared).
            #[inline]
            fn prepare(&self, draft: reqwest::RequestBuilder) -> Result<ReqwestRequest, TransportError> {
                build_request(draft)
            }

            /// Sends the request with [`reqwest::Client::execute`] and resolves at the
            /// response head.
            ///
            /// Dropping the future abandons the request: hyper does not reuse an HTTP/1.1
            /// connection whose exchange was abandoned, and resets the stream on HTTP/2; on
            /// wasm32 the fetch is aborted.
            #[inline]
            fn send(
                &self,
                request: ReqwestRequest,
            ) -> impl Future<Output = Result<ReqwestResponse, TransportError>> $(+ $send)? {
                let (client, request) = request.into_parts();
                // Here, where the request reaches reqwest, not in `prepare`: its
                // timeout can be changed after that (`ReqwestRequest` dereferences to
                // it mutably), or the request made with `ReqwestRequest::new`.
                #[cfg(target_arch = "wasm32")]
                let request = cap_wasm_timeout(request);
                #[cfg(target_arch = "wasm32")]
                if let Some(refused) = refused_by_fetch(request.headers()) {
                    return futures::future::Either::Left(std::future::ready(Err(refused)));
                }
                #[cfg(not(target_arch = "wasm32"))]
                let client = match &self.rebuild {
                    Some(rebuild) => rebuild.lock().client.clone(),
                    None => client,
                };
                #[cfg(not(target_arch = "wasm32"))]
                let marks = redirect::request_marks(&request);
                #[cfg(target_arch = "wasm32")]
                let marks = 0;
                let http_url = matches!(request.url().scheme(), "http" | "https");
                #[cfg(target_arch = "wasm32")]
                let asked = {
                    let mut url = request.url().clone();
                    url.set_fragment(None);
                    let method = request.method();
                    let answerable =
                        method != http::Method::GET && method != http::Method::HEAD;
                    (url, answerable, request.timeout().is_some())
                };
                #[cfg(not(target_arch = "wasm32"))]
                let asked = ();
                let sending = Sending {
                    pending: client.execute(request),
                    marks,
                    redirected: false,
                    answered: false,
                    credentials_dropped: false,
                    http_url,
                    asked,
                };
                #[cfg(target_arch = "wasm32")]
                let sending = futures::future::Either::Right(sending);
                sending
            }

            #[cfg_attr(
                not(target_arch = "wasm32"),
                doc = "On a client the adapter built, replaces it with a fresh one (at most \
                       once per [`REBUILD_INTERVAL`]); on a client you supplied, does nothing. \
                       See the crate docs."
            )]
            #[cfg_attr(
                target_arch = "wasm32",
                doc = "Does nothing: fetch gives no handle on its connections. See the \
                       crate docs."
            )]
            fn distrust_connection(&self) {
                #[cfg(not(target_arch = "wasm32"))]
                if let Some(rebuild) = &self.rebuild {
                    {
                        let mut sender = rebuild.lock();
                        if sender
                            .rebuilt_at
                            .is_some_and(|at| at.elapsed() < REBUILD_INTERVAL)
                        {
                            return;
                        }
                        // Claim this rebuild before building, outside the lock.
                        sender.rebuilt_at = Some(std::time::Instant::now());
                    }
                    if let Ok(client) = (rebuild.make)().build() {
                        let mut sender = rebuild.lock();
                        sender.client = client;
                        sender.rebuilds += 1;
                    }
                }
            }
        }
    };
}

/// A draft built as [`ReqwestTransport::prepare`](vantage_api_pool::Transport::prepare)
/// builds it (shared with the scripted transport).
#[inline]
fn build_request(draft: reqwest::RequestBuilder) -> Result<ReqwestRequest, TransportError> {
    let (client, request) = draft.build_split();
    // Matched where it lies: the request moves once, into its `ReqwestRequest`.
    match request {
        Ok(request) if matches!(request.url().scheme(), "http" | "https") => {
            Ok(ReqwestRequest::new(client, request))
        }
        Ok(_) => Err(TransportError::new(
            TransportErrorKind::Config,
            "the URL scheme is not http or https",
        )),
        Err(error) => Err(transport_error(error)),
    }
}

/// reqwest hands a request's timeout to `setTimeout` as whole milliseconds, cut
/// down (a 9.99 ms timeout becomes 9 ms, 0.9 ms becomes 0), and a timer in Node can
/// fire up to a millisecond before its delay: the timeout is rounded up to whole
/// milliseconds, plus one, so the fetch is never cut before it. A JavaScript timer
/// takes at most 2^31 - 1 ms, and reqwest panics (an abort on wasm32, which ends the
/// whole instance) on a longer one: it is cut to [`MAX_WASM_TIMEOUT`], 24.8 days,
/// which is as good as none.
#[cfg(target_arch = "wasm32")]
fn cap_wasm_timeout(mut request: reqwest::Request) -> reqwest::Request {
    if let Some(timeout) = request.timeout_mut() {
        let millis = timeout.as_nanos().div_ceil(1_000_000).saturating_add(1);
        let max = MAX_WASM_TIMEOUT.as_millis();
        *timeout = std::time::Duration::from_millis(millis.min(max) as u64);
    }
    request
}

/// The credential headers a browser's `fetch` drops without an error when a page or
/// a Web Worker sets them (forbidden request-header names in the Fetch standard).
/// Any header whose value is marked sensitive (a token) is looked at too.
#[cfg(target_arch = "wasm32")]
const CREDENTIAL_HEADERS: [http::HeaderName; 3] = [
    http::header::COOKIE,
    http::HeaderName::from_static("cookie2"),
    http::header::PROXY_AUTHORIZATION,
];

/// A request carrying a credential (a header of [`CREDENTIAL_HEADERS`], or one whose
/// value is sensitive, as a token's is) that this platform's `fetch` would drop
/// without an error fails before the fetch with `Config`: it would leave without the
/// credential and be answered 401 for a reason nobody could see. A browser drops
/// them (`cookie`, `proxy-*`, `sec-*`, …); a platform whose fetch sends them (Node)
/// is left alone.
///
/// A client's `default_headers` are added by reqwest after this, out of its sight.
#[cfg(target_arch = "wasm32")]
fn refused_by_fetch(headers: &http::HeaderMap) -> Option<TransportError> {
    let name = headers
        .iter()
        .filter(|(name, value)| value.is_sensitive() || CREDENTIAL_HEADERS.contains(name))
        .map(|(name, _)| name)
        .find(|name| fetch_drops(name))?;
    let hint = if name == http::header::COOKIE || name.as_str() == "cookie2" {
        " (a browser sends its own cookies: same-origin by default, cross-origin with \
         fetch_credentials_include and a CORS answer that allows credentials)"
    } else {
        ""
    };
    Some(TransportError::new(
        TransportErrorKind::Config,
        format!("this platform's fetch drops a `{name}` header, so the request was not sent{hint}"),
    ))
}

/// Whether this platform's `fetch` drops header `name`: asked of its own `Request`,
/// as reqwest builds one (a `Headers` handed to `new Request`), once per name and
/// thread. Where there is no `Request` to ask, the header is let through as before.
#[cfg(target_arch = "wasm32")]
fn fetch_drops(name: &http::HeaderName) -> bool {
    thread_local! {
        static SEEN: std::cell::RefCell<Vec<(http::HeaderName, bool)>> =
            const { std::cell::RefCell::new(Vec::new()) };
    }
    let ask = || -> Option<bool> {
        let headers = web_sys::Headers::new().ok()?;
        headers.append(name.as_str(), "x").ok()?;
        let init = web_sys::RequestInit::new();
        init.set_headers(&headers);
        let request = web_sys::Request::new_with_str_and_init("http://localhost/", &init).ok()?;
        Some(!request.headers().has(name.as_str()).ok()?)
    };
    SEEN.with(|seen| {
        if let Some(&(_, drops)) = seen.borrow().iter().find(|(seen, _)| seen == name) {
            return drops;
        }
        let drops = ask().unwrap_or(false);
        // A few names in practice; a bound all the same.
        let mut seen = seen.borrow_mut();
        if seen.len() < 64 {
            seen.push((name.clone(), drops));
        }
        drops
    })
}

#[cfg(not(target_arch = "wasm32"))]
transport_impl!(vantage_api_pool::transport::SendTransport, Send);
#[cfg(target_arch = "wasm32")]
transport_impl!(vantage_api_pool::Transport);

pin_project_lite::pin_project! {
    /// The future of [`ReqwestTransport::send`]: reqwest's own, its outcome mapped
    /// to the pool's types (a plain struct, not an `async` block, so a send adds no
    /// state machine of its own).
    struct Sending<F> {
        #[pin]
        pending: F,
        // What each poll tells a tracked redirect policy of the request
        // (`redirect::request_marks`): it carries a secret reqwest would keep on a hop
        // to another origin (the policy follows no such hop), it is a POST (a 301 or
        // 302 turns it into a GET).
        marks: u8,
        // A tracked redirect policy decided on a redirect during this send.
        redirected: bool,
        // A tracked redirect policy followed a redirect that turned the request into
        // a GET (a 303, or a 301 or 302 to a POST) during this send: the request was
        // answered, and the response answers another request.
        answered: bool,
        // The latest redirect a tracked policy followed went to another origin than
        // the hop before, so reqwest sent it without the request's credentials.
        credentials_dropped: bool,
        // The request's own URL is http or https, so a builder error about another
        // scheme came from a redirect (`prepare` refuses other schemes, but a
        // request can be changed after it, or made with `ReqwestRequest::new`).
        http_url: bool,
        // On wasm32, the request's URL without its fragment and whether a redirect
        // may have turned it into a GET (any method but GET and HEAD): fetch follows
        // redirects out of sight, and its final URL is all that tells of them; and
        // whether the request has a `timeout` (only that aborts a fetch whose body
        // is read). Nothing natively.
        asked: Asked,
    }
}

/// What [`Sending`] keeps of the request on wasm32 (see `asked`).
#[cfg(target_arch = "wasm32")]
type Asked = (reqwest::Url, bool, bool);
#[cfg(not(target_arch = "wasm32"))]
type Asked = ();

impl<F> Future for Sending<F>
where
    F: Future<Output = Result<reqwest::Response, reqwest::Error>>,
{
    type Output = Result<ReqwestResponse, TransportError>;

    // Inlined into the loop's time limit, as it was before it polled under a `Noting`:
    // a call of its own costs every send about 150 instructions.
    #[inline(always)]
    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let this = self.project();
        #[cfg(not(target_arch = "wasm32"))]
        {
            let noting = redirect::Noting::start(*this.marks);
            let poll = this.pending.poll(cx);
            if let Some(decided) = noting.finish() {
                *this.redirected = true;
                // A hop the policy follows leaves the poll pending (tower-http sets
                // up the next request and wakes the task); when it stops or fails,
                // the poll is ready with that 3xx or error.
                if poll.is_pending() {
                    *this.answered |= decided.answered;
                    *this.credentials_dropped = decided.drops_credentials;
                }
            }
            let std::task::Poll::Ready(result) = poll else {
                return std::task::Poll::Pending;
            };
            std::task::Poll::Ready(match result {
                Ok(response) => Ok(ReqwestResponse::answered(
                    response,
                    *this.answered,
                    *this.credentials_dropped,
                )),
                Err(error) if !*this.http_url => Err(error::transport_error(error)),
                Err(error) if *this.redirected => Err(error::after_redirect(error)),
                Err(error) => Err(error::send_error(error)),
            })
        }
        // The browser follows redirects itself (its final URL tells that it did),
        // and every failure is `Interrupted`.
        #[cfg(target_arch = "wasm32")]
        {
            let _ = (
                this.marks,
                this.redirected,
                this.answered,
                this.credentials_dropped,
            );
            let map_error = if *this.http_url {
                error::send_error
            } else {
                error::transport_error
            };
            let (asked, answerable, timed) = &*this.asked;
            this.pending.poll(cx).map(|result| {
                result
                    .map(|response| ReqwestResponse::fetched(response, asked, *answerable, *timed))
                    .map_err(map_error)
            })
        }
    }
}

/// Every Rust example of the workspace README, compiled (and the runnable ones run)
/// as doctests of this crate, whose dev-dependencies cover them all; with the
/// features `tokio` and `testkit` (`scripts/test` runs `--all-features`), which the
/// examples use.
#[cfg(all(
    doctest,
    feature = "tokio",
    feature = "testkit",
    not(target_arch = "wasm32")
))]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
