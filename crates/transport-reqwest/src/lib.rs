//! # vantage-api-pool-reqwest
//!
//! [`ReqwestTransport`]: the [`Transport`] port of `vantage-api-pool` over
//! [`reqwest`], natively (hyper, rustls, HTTP/1.1 and HTTP/2) and on
//! `wasm32-unknown-unknown` (the browser's or Node's `fetch`).
//!
//! | port type | here |
//! |---|---|
//! | [`Transport::Handle`] | [`reqwest::Client`]: what the caller's request closure receives |
//! | [`Transport::Draft`] | [`reqwest::RequestBuilder`]: what the closure returns |
//! | [`Transport::Request`] | [`ReqwestRequest`]: the built [`reqwest::Request`] and the client that will send it |
//! | [`Transport::Response`] | [`ReqwestResponse`]: the [`reqwest::Response`] at its head, body still streaming |
//!
//! ```no_run
//! # async fn demo() -> Result<(), vantage_api_pool::TransportError> {
//! use vantage_api_pool::{Transport, TransportResponse};
//! use vantage_api_pool_reqwest::ReqwestTransport;
//!
//! let transport = ReqwestTransport::new(reqwest::Client::new());
//! let draft = transport.handle().get("https://api.example.com/v1/items");
//! let request = transport.prepare(draft)?;
//! let response = transport.send(request).await?;
//! println!("{}", response.status());
//! let body: reqwest::Response = response.into_inner(); // read it as with reqwest
//! # let _ = body;
//! # Ok(())
//! # }
//! ```
//!
//! # Which client sends
//!
//! [`Transport::prepare`] uses [`reqwest::RequestBuilder::build_split`], and the
//! request is sent by the client the draft was made from, exactly as
//! [`reqwest::RequestBuilder::send`] would. A closure that builds its draft from the
//! handle it receives (the usual case) therefore sends through
//! [`ReqwestTransport::client`].
//!
//! The client's default headers (`ClientBuilder::default_headers`) are merged by
//! reqwest when the request is sent, so
//! [`PreparedRequest::header`](vantage_api_pool::PreparedRequest::header) does not see
//! them: an `Idempotency-Key` or `Authorization` set as a default header is
//! invisible to the attempt loop. Set such headers on the draft instead.
//!
//! # Errors
//!
//! Every failure is turned into a [`TransportError`] by [`transport_error`]; the
//! table of kinds is in the [`error`] module. Messages are built from
//! [`reqwest::Error::without_url`] and never contain a URL.
//!
//! # `distrust_connection`
//!
//! reqwest has no call to drop one pooled connection, and a user-supplied
//! [`reqwest::Client`] cannot be rebuilt without losing its settings, so for now
//! `ReqwestTransport::distrust_connection` is a no-op. What already happens without
//! it: when a time limit cuts a send, its future is dropped, and hyper does not put
//! an HTTP/1.1 connection whose exchange was abandoned back into the pool; on
//! HTTP/2 the stream is reset and the shared connection stays. A later step may
//! rebuild a client the adapter built itself.
//!
//! # Targets
//!
//! On `wasm32` the responses come from `fetch`, and two things differ (see
//! [`ReqwestResponse`]): there is no `Deref` to [`reqwest::Response`], and
//! [`ReqwestResponse::into_inner`] returns `None` once the body has been read with
//! [`TransportResponse::chunk`](vantage_api_pool::TransportResponse::chunk). Fetch
//! reports every network failure alike, so most of them map to `Interrupted` there.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod error;
mod request;
mod response;

pub use error::transport_error;
pub use request::ReqwestRequest;
pub use response::ReqwestResponse;

/// Re-exported so callers name the same reqwest as the adapter.
pub use reqwest;

use std::future::Future;

use vantage_api_pool::{Transport, TransportError, TransportErrorKind};

/// The [`Transport`] port over a [`reqwest::Client`].
///
/// Cheap to clone: a [`reqwest::Client`] is a handle to a shared connection pool.
/// Its send future is `Send` on native targets, so a call over it can be
/// `tokio::spawn`ed.
#[derive(Clone, Debug)]
pub struct ReqwestTransport {
    client: reqwest::Client,
}

impl ReqwestTransport {
    /// A transport over `client`, whose settings (timeouts, TLS, proxies, default
    /// headers, redirects) are used as they are.
    ///
    /// Tip: reqwest follows up to 10 redirects by default; a client built with
    /// `redirect(reqwest::redirect::Policy::none())` hands 3xx answers to the attempt
    /// loop instead.
    #[must_use]
    pub fn new(client: reqwest::Client) -> Self {
        ReqwestTransport { client }
    }

    /// The client given to the request closure on every send.
    #[must_use]
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }
}

impl From<reqwest::Client> for ReqwestTransport {
    fn from(client: reqwest::Client) -> Self {
        ReqwestTransport::new(client)
    }
}

impl Transport for ReqwestTransport {
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
    fn prepare(&self, draft: reqwest::RequestBuilder) -> Result<ReqwestRequest, TransportError> {
        let (client, request) = draft.build_split();
        let request = request.map_err(transport_error)?;
        match request.url().scheme() {
            "http" | "https" => Ok(ReqwestRequest::new(client, request)),
            _ => Err(TransportError::new(
                TransportErrorKind::Config,
                "the URL scheme is not http or https",
            )),
        }
    }

    /// Sends the request with [`reqwest::Client::execute`] and resolves at the
    /// response head.
    ///
    /// Dropping the future abandons the request: hyper does not reuse an HTTP/1.1
    /// connection whose exchange was abandoned, and resets the stream on HTTP/2; on
    /// wasm32 the fetch is aborted.
    fn send(
        &self,
        request: ReqwestRequest,
    ) -> impl Future<Output = Result<ReqwestResponse, TransportError>> {
        let (client, request) = request.into_parts();
        let pending = client.execute(request);
        async move {
            pending
                .await
                .map(ReqwestResponse::new)
                .map_err(transport_error)
        }
    }

    /// Does nothing observable in this version: reqwest cannot drop one pooled
    /// connection. See the crate docs.
    fn distrust_connection(&self) {}
}
