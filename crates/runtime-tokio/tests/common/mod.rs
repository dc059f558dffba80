//! The request and response of the in-memory transports these tests write.
#![allow(dead_code, unreachable_pub)]

use vantage_api_pool::bytes::Bytes;
use vantage_api_pool::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use vantage_api_pool::{PreparedRequest, TransportError, TransportResponse};

/// A GET with headers.
pub struct Request(pub HeaderMap);

impl PreparedRequest for Request {
    fn method(&self) -> Option<&Method> {
        Some(&Method::GET)
    }

    fn header(&self, name: &HeaderName) -> Option<&HeaderValue> {
        self.0.get(name)
    }

    fn set_header(&mut self, name: HeaderName, value: HeaderValue) {
        self.0.insert(name, value);
    }
}

/// A head with an empty body.
#[derive(Debug)]
pub struct Response(pub StatusCode, pub HeaderMap);

impl TransportResponse for Response {
    fn status(&self) -> StatusCode {
        self.0
    }

    fn headers(&self) -> &HeaderMap {
        &self.1
    }

    async fn chunk(&mut self) -> Result<Option<Bytes>, TransportError> {
        Ok(None)
    }
}
