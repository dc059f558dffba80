//! [`ReqwestRequest`]: a built reqwest request as the attempt loop sees it.

use std::fmt;
use std::ops::{Deref, DerefMut};

use http::{HeaderName, HeaderValue, Method};
use vantage_api_pool::PreparedRequest;

/// A built [`reqwest::Request`] and the [`reqwest::Client`] that will send it (the
/// one its draft was made from).
///
/// Dereferences to the [`reqwest::Request`], so its URL, body and timeout can be read
/// or changed before sending.
///
/// Its `Debug` shows the method only: never the URL or a header value. The
/// [`reqwest::Request`] it dereferences to has reqwest's own `Debug`, which prints
/// the whole URL (query included) and the header values (a value marked sensitive,
/// as the client's token is, shows as `Sensitive`): format `*request` only where
/// that may be seen.
pub struct ReqwestRequest {
    client: reqwest::Client,
    request: reqwest::Request,
}

impl ReqwestRequest {
    /// A request that `client` will send.
    #[must_use]
    pub fn new(client: reqwest::Client, request: reqwest::Request) -> Self {
        ReqwestRequest { client, request }
    }

    /// The client the draft came from. It sends the request, except on a transport
    /// the adapter built, where [`send`](vantage_api_pool::Transport::send) takes the
    /// newest client (one rebuilt after a distrusted connection) instead.
    #[must_use]
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// The reqwest request.
    #[must_use]
    pub fn into_inner(self) -> reqwest::Request {
        self.request
    }

    /// The client that would have sent the request, and the request.
    #[must_use]
    pub fn into_parts(self) -> (reqwest::Client, reqwest::Request) {
        (self.client, self.request)
    }
}

impl Deref for ReqwestRequest {
    type Target = reqwest::Request;

    fn deref(&self) -> &reqwest::Request {
        &self.request
    }
}

impl DerefMut for ReqwestRequest {
    fn deref_mut(&mut self) -> &mut reqwest::Request {
        &mut self.request
    }
}

impl fmt::Debug for ReqwestRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReqwestRequest")
            .field("method", self.request.method())
            .finish_non_exhaustive()
    }
}

impl PreparedRequest for ReqwestRequest {
    /// Always `Some`: every reqwest request has a method.
    fn method(&self) -> Option<&Method> {
        Some(self.request.method())
    }

    fn header(&self, name: &HeaderName) -> Option<&HeaderValue> {
        self.request.headers().get(name)
    }

    /// Replaces every value of `name` with `value`, exactly as given.
    ///
    /// The value's sensitivity flag ([`HeaderValue::set_sensitive`]) is kept as the
    /// caller set it; nothing is marked sensitive here, so whoever sets a secret
    /// (such as an `Authorization` token) should mark it. A sensitive value is left
    /// out of the HTTP/2 header compression table and shown as `Sensitive` by
    /// `HeaderValue`'s `Debug`.
    fn set_header(&mut self, name: HeaderName, value: HeaderValue) {
        self.request.headers_mut().insert(name, value);
    }
}
