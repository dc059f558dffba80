//! [`ReqwestResponse`]: a reqwest response at its head, body not read yet.

use std::fmt;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use vantage_api_pool::{TransportError, TransportResponse};

pub use imp::ReqwestResponse;

impl fmt::Debug for ReqwestResponse {
    /// The status and the body length when known: never the URL or a header value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReqwestResponse")
            .field("status", &self.status())
            .field("content_length", &self.content_length())
            .finish_non_exhaustive()
    }
}

/// The head, readable the same way on every target, with no trait to import.
impl ReqwestResponse {
    /// The status code.
    ///
    /// ```
    /// use vantage_api_pool_reqwest::ReqwestResponse;
    /// let head = http::Response::builder().status(503).header("retry-after", "2");
    /// let response = ReqwestResponse::new(head.body("busy").unwrap().into());
    /// assert_eq!(response.status(), 503);
    /// assert_eq!(response.headers()["retry-after"], "2");
    /// assert_eq!(response.content_length(), Some(4));
    /// ```
    #[must_use]
    pub fn status(&self) -> StatusCode {
        TransportResponse::status(self)
    }

    /// The response headers.
    #[must_use]
    pub fn headers(&self) -> &HeaderMap {
        TransportResponse::headers(self)
    }

    /// The body length when known, as reqwest's
    /// [`content_length`](reqwest::Response::content_length) gives it natively; on
    /// wasm32 always `None` (fetch decodes the body, and the header's length may be
    /// the encoded one's).
    #[must_use]
    pub fn content_length(&self) -> Option<u64> {
        TransportResponse::content_length(self)
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod imp {
    use std::ops::Deref;

    use vantage_api_pool::transport::SendTransportResponse;

    use super::{Bytes, HeaderMap, StatusCode, TransportError};
    use crate::error::body_error;

    /// A [`reqwest::Response`] at its head; its body is still streaming from the
    /// connection.
    ///
    /// Dereferences to the [`reqwest::Response`]; [`ReqwestResponse::into_inner`]
    /// gives it back to be read with reqwest's own methods (`bytes`, `json`,
    /// `bytes_stream`, ...).
    ///
    /// Its `Debug` shows the status and the body length only. The
    /// [`reqwest::Response`] behind it has reqwest's own `Debug`, which prints the
    /// final URL (query included) and every header value: format `*response` or
    /// [`into_inner`](ReqwestResponse::into_inner)'s result only where that may be seen.
    pub struct ReqwestResponse {
        inner: reqwest::Response,
    }

    /// In a response's extensions: it answers a hop a tracked policy followed;
    /// `answered` when a hop of the chain turned the request into a GET (a 303, or a
    /// 301 or 302 to a POST); `credentials_dropped` when the latest hop went to
    /// another origin than the hop before, so reqwest sent it without the request's
    /// credentials. (A mark in the extensions, set only then, keeps the response the
    /// size of reqwest's.)
    #[derive(Clone, Copy)]
    struct Redirected {
        answered: bool,
        credentials_dropped: bool,
    }

    impl ReqwestResponse {
        /// Wraps a response.
        #[must_use]
        pub fn new(inner: reqwest::Response) -> Self {
            ReqwestResponse { inner }
        }

        /// The response a send got; `answered` when the request was answered with a
        /// redirect the send followed with a GET, `dropped` when the hop it answers went
        /// without the request's credentials.
        #[inline(always)]
        pub(crate) fn answered(
            mut inner: reqwest::Response,
            answered: bool,
            dropped: bool,
        ) -> Self {
            if answered || dropped {
                inner.extensions_mut().insert(Redirected {
                    answered,
                    credentials_dropped: dropped,
                });
            }
            ReqwestResponse { inner }
        }

        /// The reqwest response, with whatever of its body
        /// [`chunk`](vantage_api_pool::TransportResponse::chunk) has not read yet.
        #[must_use]
        pub fn into_inner(self) -> reqwest::Response {
            self.inner
        }

        /// [`into_inner`](ReqwestResponse::into_inner) in the form that compiles on
        /// every target: always `Some` here; on `wasm32`, `None` once
        /// [`chunk`](vantage_api_pool::TransportResponse::chunk) has started reading.
        ///
        /// ```
        /// use vantage_api_pool_reqwest::ReqwestResponse;
        /// let head = http::Response::builder().status(200);
        /// let response = ReqwestResponse::new(head.body("ok").unwrap().into());
        /// assert_eq!(response.as_inner().map(|r| r.status()), Some(http::StatusCode::OK));
        /// assert!(response.try_into_inner().is_some());
        /// ```
        #[must_use]
        pub fn try_into_inner(self) -> Option<reqwest::Response> {
            Some(self.inner)
        }

        /// The reqwest response, in the form that compiles on every target (see
        /// [`try_into_inner`](ReqwestResponse::try_into_inner)): always `Some` here.
        /// Natively the response also dereferences to it.
        #[must_use]
        pub fn as_inner(&self) -> Option<&reqwest::Response> {
            Some(&self.inner)
        }

        /// The rest of the body: reqwest's [`bytes`](reqwest::Response::bytes). The
        /// same call on every target.
        ///
        /// # Errors
        ///
        /// A failure mapped by [`body_error`](crate::body_error): `TimedOut` for a
        /// read timeout, otherwise `Interrupted`; no URL in its text.
        pub async fn bytes(self) -> Result<Bytes, TransportError> {
            self.inner.bytes().await.map_err(body_error)
        }

        /// The rest of the body as text: reqwest's [`text`](reqwest::Response::text)
        /// (UTF-8 with invalid bytes replaced; by the `Content-Type` charset if your
        /// build enables reqwest's `charset` feature).
        ///
        /// # Errors
        ///
        /// As for [`bytes`](ReqwestResponse::bytes).
        pub async fn text(self) -> Result<String, TransportError> {
            self.inner.text().await.map_err(body_error)
        }
    }

    impl Deref for ReqwestResponse {
        type Target = reqwest::Response;

        fn deref(&self) -> &reqwest::Response {
            &self.inner
        }
    }

    impl SendTransportResponse for ReqwestResponse {
        fn status(&self) -> StatusCode {
            self.inner.status()
        }

        fn headers(&self) -> &HeaderMap {
            self.inner.headers()
        }

        /// Moves the headers out of the reqwest response, leaving it none (its
        /// body reads on as before).
        fn take_headers(&mut self) -> HeaderMap {
            std::mem::take(self.inner.headers_mut())
        }

        /// reqwest's [`content_length`](reqwest::Response::content_length): the
        /// exact length of the body when known (from `Content-Length`).
        fn content_length(&self) -> Option<u64> {
            self.inner.content_length()
        }

        /// The response answers a hop that a [tracked](crate::redirect::tracked)
        /// policy followed to another origin than the hop before, which reqwest sent
        /// without the request's `Authorization`, `Cookie` and `Proxy-Authorization`:
        /// a 401 in it is final. Always `false` under an untracked policy, which the
        /// adapter cannot see. (On wasm32, where the browser follows redirects: fetch's
        /// final URL is of another origin than the request's.)
        fn credentials_dropped(&self) -> bool {
            self.inner
                .extensions()
                .get::<Redirected>()
                .is_some_and(|redirected| redirected.credentials_dropped)
        }

        /// The request was answered with a redirect that a
        /// [tracked](crate::redirect::tracked) policy followed and after which
        /// reqwest sent a GET (a 303, or a 301 or 302 to a POST), which this
        /// response answers, so a 429, a 503 with a server delay or a 401 in it is
        /// retried or replayed only for an idempotent call. A redirect after which
        /// reqwest sends the same request on (a 307 or 308, or a 301 or 302 to a
        /// PATCH, say) does not count. Always `false` under an untracked policy, whose hops the
        /// adapter does not see (comparing URLs could not tell a 303 from a 307).
        /// (On wasm32, where the browser follows redirects, a final URL other than
        /// the request's marks the answer of any request but a `GET` or `HEAD`.)
        fn answered_by_redirect(&self) -> bool {
            self.inner
                .extensions()
                .get::<Redirected>()
                .is_some_and(|redirected| redirected.answered)
        }

        /// [`reqwest::Response::chunk`]: the next piece of the body as hyper read it
        /// from the connection (at most one read buffer, never the whole body), so the
        /// pool's loop can stop after 2048 bytes. A body that breaks off fails with
        /// `Interrupted`, a `read_timeout` or the request's `timeout` with `TimedOut`
        /// ([`body_error`](crate::body_error)). Dropping the future loses nothing
        /// already returned.
        async fn chunk(&mut self) -> Result<Option<Bytes>, TransportError> {
            self.inner.chunk().await.map_err(body_error)
        }
    }
}

#[cfg(target_arch = "wasm32")]
mod imp {
    use std::pin::Pin;

    use futures::stream::{Stream, StreamExt};

    use super::{Bytes, HeaderMap, StatusCode, TransportError, TransportResponse};
    use crate::error::body_error_of;

    type BodyStream = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>>>>;

    /// A [`reqwest::Response`] from `fetch` at its head; its body is not read yet.
    ///
    /// reqwest on wasm32 can only read a body by consuming the response, so the first
    /// [`chunk`](vantage_api_pool::TransportResponse::chunk) turns it into a byte stream,
    /// after which [`ReqwestResponse::into_inner`] returns `None`. Status and headers
    /// (copied when the response arrives) stay readable throughout.
    pub struct ReqwestResponse {
        status: StatusCode,
        headers: HeaderMap,
        answered: bool,
        credentials_dropped: bool,
        // The request may have had a `timeout` (it had one, or it is not known): an
        // `AbortError` in the body is then the timeout's (`body_error_of`).
        timed: bool,
        unread: Option<reqwest::Response>,
        body: Option<BodyStream>,
    }

    impl ReqwestResponse {
        /// Wraps a response. Whether its request had a `timeout` is not known here,
        /// so a body read that fails with an `AbortError` is `TimedOut`, as
        /// [`body_error`](crate::body_error) reads it.
        #[must_use]
        pub fn new(inner: reqwest::Response) -> Self {
            ReqwestResponse {
                status: inner.status(),
                headers: inner.headers().clone(),
                answered: false,
                credentials_dropped: false,
                timed: true,
                unread: Some(inner),
                body: None,
            }
        }

        /// Wraps the response to a request sent to `asked` (its URL without a
        /// fragment) that was `answerable` (a method a redirect may turn into a
        /// `GET`: any but `GET` and `HEAD`). fetch follows redirects out of sight; a
        /// final URL other than `asked` tells that it followed some. The response
        /// then counts as answering another request than the one sent, for an
        /// `answerable` one (a 303, or a 301 or 302 to a `POST`, answered it; a 307 or
        /// 308, which cannot be told apart here, did not, and is counted too: a
        /// request that is not idempotent is then not sent again), and as sent
        /// without the credentials when the final origin is another (fetch drops
        /// `Authorization` on a hop to another origin). `timed`: the request had a
        /// `timeout`; without one a body's `AbortError` is not reqwest's, and is
        /// `Interrupted`.
        pub(crate) fn fetched(
            inner: reqwest::Response,
            asked: &reqwest::Url,
            answerable: bool,
            timed: bool,
        ) -> Self {
            let mut response = ReqwestResponse::new(inner);
            response.timed = timed;
            if let Some(inner) = &response.unread
                && !super::same_place(asked, inner.url())
            {
                response.answered = answerable;
                response.credentials_dropped = inner.url().origin() != asked.origin();
            }
            response
        }

        /// The reqwest response, or `None` once
        /// [`chunk`](vantage_api_pool::TransportResponse::chunk) has started reading its
        /// body.
        #[must_use]
        pub fn into_inner(self) -> Option<reqwest::Response> {
            self.unread
        }

        /// The same as [`into_inner`](ReqwestResponse::into_inner), under the name
        /// that natively returns an `Option` too, for code built for every target.
        #[must_use]
        pub fn try_into_inner(self) -> Option<reqwest::Response> {
            self.unread
        }

        /// The reqwest response, or `None` once
        /// [`chunk`](vantage_api_pool::TransportResponse::chunk) has started reading its
        /// body.
        #[must_use]
        pub fn as_inner(&self) -> Option<&reqwest::Response> {
            self.unread.as_ref()
        }

        /// The rest of the body, whatever
        /// [`chunk`](vantage_api_pool::TransportResponse::chunk) has not read. The same
        /// call on every target.
        ///
        /// # Errors
        ///
        /// A failure mapped by [`body_error`](crate::body_error).
        pub async fn bytes(mut self) -> Result<Bytes, TransportError> {
            if let Some(inner) = self.unread.take() {
                let timed = self.timed;
                return inner.bytes().await.map_err(|e| body_error_of(e, timed));
            }
            let mut body = Vec::new();
            while let Some(chunk) = self.chunk().await? {
                body.extend_from_slice(&chunk);
            }
            Ok(Bytes::from(body))
        }

        /// The rest of the body as text (UTF-8, invalid bytes replaced).
        ///
        /// # Errors
        ///
        /// As for [`bytes`](ReqwestResponse::bytes).
        pub async fn text(self) -> Result<String, TransportError> {
            let body = self.bytes().await?;
            Ok(String::from_utf8_lossy(&body).into_owned())
        }
    }

    impl TransportResponse for ReqwestResponse {
        fn status(&self) -> StatusCode {
            self.status
        }

        fn headers(&self) -> &HeaderMap {
            &self.headers
        }

        /// Moves the headers out, leaving the response none (its body reads on as
        /// before).
        fn take_headers(&mut self) -> HeaderMap {
            std::mem::take(&mut self.headers)
        }

        /// Unknown (`None`): fetch hands over the body decoded, while the
        /// `Content-Length` it shows (reqwest's
        /// [`content_length`](reqwest::Response::content_length)) is that of the
        /// encoded body, and a browser hides `Content-Encoding` from a cross-origin
        /// reader, so nothing tells the two apart. (A limit on an `execute_read` is
        /// then met by the bytes read, never by the header.)
        fn content_length(&self) -> Option<u64> {
            None
        }

        /// fetch followed a redirect to another origin (its final URL's origin is
        /// not the request's): it dropped `Authorization` on the way.
        fn credentials_dropped(&self) -> bool {
            self.credentials_dropped
        }

        /// fetch followed a redirect (its final URL is not the request's) for a
        /// request other than a `GET` or `HEAD`. A 307 or 308, which keeps the
        /// method, cannot be told apart from a 303 here, and counts too: a request
        /// that is not idempotent is then not sent again.
        fn answered_by_redirect(&self) -> bool {
            self.answered
        }

        /// The next piece of the `fetch` body stream. Dropping the future loses
        /// nothing: the stream lives in the response.
        async fn chunk(&mut self) -> Result<Option<Bytes>, TransportError> {
            // The response is turned into a stream on the first poll, not on the call,
            // so a chunk future dropped unpolled leaves it whole for `into_inner`.
            if let Some(inner) = self.unread.take() {
                self.body = Some(Box::pin(inner.bytes_stream()));
            }
            let body = self
                .body
                .get_or_insert_with(|| Box::pin(futures::stream::empty()));
            let timed = self.timed;
            body.next()
                .await
                .transpose()
                .map_err(|e| body_error_of(e, timed))
        }
    }
}

/// Whether fetch's final URL is the one the request went to: the same scheme,
/// host and port, and the same path and query once their percent-encoding is
/// decoded (a browser encodes some characters reqwest's URLs leave as they are:
/// Chromium a `|` or `^` in a path, which then comes back encoded).
#[cfg(any(target_arch = "wasm32", test))]
fn same_place(asked: &reqwest::Url, fetched: &reqwest::Url) -> bool {
    asked.scheme() == fetched.scheme()
        && asked.host_str() == fetched.host_str()
        && asked.port_or_known_default() == fetched.port_or_known_default()
        && decoded(asked.path()).eq(decoded(fetched.path()))
        && decoded(asked.query().unwrap_or("")).eq(decoded(fetched.query().unwrap_or("")))
}

/// The bytes of `text` with each `%XX` escape decoded.
#[cfg(any(target_arch = "wasm32", test))]
fn decoded(text: &str) -> impl Iterator<Item = u8> + '_ {
    let bytes = text.as_bytes();
    let hex = |at: usize| {
        bytes
            .get(at)
            .and_then(|&b| char::from(b).to_digit(16))
            .and_then(|d| u8::try_from(d).ok())
    };
    let mut at = 0;
    std::iter::from_fn(move || {
        let byte = *bytes.get(at)?;
        if byte == b'%'
            && let (Some(high), Some(low)) = (hex(at + 1), hex(at + 2))
        {
            at += 3;
            return Some(high << 4 | low);
        }
        at += 1;
        Some(byte)
    })
}

#[cfg(test)]
mod tests {
    use super::same_place;

    fn same(a: &str, b: &str) -> bool {
        same_place(&a.parse().unwrap(), &b.parse().unwrap())
    }

    #[test]
    fn a_final_url_is_the_requests_own_whatever_the_platform_percent_encodes() {
        let asked = "http://127.0.0.1:8080/users/auth0|123^x?q=a|b";
        assert!(same(asked, asked));
        // Chromium sends a `|` or `^` in a path encoded, and reports it so.
        assert!(same(
            asked,
            "http://127.0.0.1:8080/users/auth0%7C123%5Ex?q=a|b"
        ));
        assert!(same(
            asked,
            "http://127.0.0.1:8080/users/auth0%7c123%5ex?q=a%7Cb"
        ));
        assert!(same("http://h/x", "http://h:80/x"));
        assert!(same("http://h/x?", "http://h/x"));
        // Another path, query, port, host or scheme is another place.
        assert!(!same(
            asked,
            "http://127.0.0.1:8080/users/auth0|124^x?q=a|b"
        ));
        assert!(!same(
            asked,
            "http://127.0.0.1:8080/users/auth0|123^x?q=a|c"
        ));
        assert!(!same(
            asked,
            "http://127.0.0.1:8081/users/auth0|123^x?q=a|b"
        ));
        assert!(!same(
            asked,
            "http://localhost:8080/users/auth0|123^x?q=a|b"
        ));
        assert!(!same("http://h/x", "https://h/x"));
        assert!(!same("http://h/see-other/1", "http://h/busy/1"));
        // An escape that is not one stays as it is.
        assert!(same("http://h/100%", "http://h/100%"));
        assert!(!same("http://h/100%25", "http://h/100%2"));
    }
}
