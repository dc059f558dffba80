//! From [`reqwest::Error`] to the pool's [`TransportError`].
//!
//! [`transport_error`] decides the [`TransportErrorKind`] from what reqwest exposes
//! (its `is_*` methods) and from the `std::io::Error`s in the error's `source()`
//! chain, first match wins:
//!
//! | reqwest says | kind | why |
//! |---|---|---|
//! | `is_builder()` (bad URL, header or body; a scheme other than http/https) | `Config` | our side, nothing sent |
//! | `is_connect()` with an `io::ErrorKind::InvalidData` in the chain | `Tls` | rustls reports handshake and certificate failures as `InvalidData` through tokio-rustls (native only) |
//! | `is_connect()` otherwise (refused, DNS, connect timeout, unreachable) | `Connect` | no connection, nothing reached the server (native only) |
//! | `is_timeout()` (the request's or client's `timeout`, `read_timeout`) | `TimedOut` | the exchange was cut; the server may have acted |
//! | an `io::ErrorKind::ConnectionRefused` in the chain | `Connect` | as above |
//! | an `io::ErrorKind` `ConnectionReset`, `ConnectionAborted`, `BrokenPipe` or `UnexpectedEof` in the chain | `Interrupted` | the connection broke mid-exchange |
//! | `is_request()` otherwise, for example hyper's "connection closed before message completed" | `Interrupted` | the request may have been written |
//! | `is_body()`, `is_decode()` (a body that broke off or could not be decoded) | `Interrupted` | as above |
//! | `is_redirect()` (a redirect loop, too many redirects, a redirect policy error) | `Interrupted` | requests were sent and answered; not our side, so not `Config` |
//! | anything else | `Interrupted` | the safe kind: retried only for idempotent calls |
//!
//! Kinds this adapter never produces, and why:
//!
//! - `NotSent`. hyper (1.x) has exactly the right signal, `hyper::Error::is_canceled()`:
//!   it is only raised when hyper hands the request back unwritten. But hyper is not
//!   a dependency of this crate, so the type cannot be named for `downcast_ref`, and
//!   hyper-util shows its own "canceled" kind only in its `Display` text. So such an
//!   error maps to `Interrupted`, which is safe but spends a retry and is not
//!   redialed for a non-idempotent call. Observed in the tests: a server that
//!   closes a fresh connection at once gives `client error (Canceled): operation was
//!   canceled: connection closed before message completed`. hyper-util already
//!   sends such a request again by itself when the connection was a reused pooled
//!   one (the stale keep-alive case), so this reaches us only on fresh connections.
//!   A stale pooled connection whose close races with the request (hyper wrote it,
//!   then read end-of-file: "connection closed before message completed" without
//!   "canceled") is genuinely ambiguous and is `Interrupted` in any case.
//! - `TooLarge`. reqwest sets no body-size limit; hyper's "message head is too large"
//!   is not visible through an API and maps to `Interrupted`.
//! - On wasm32, fetch reports every network failure (refused, DNS, reset, CORS) as
//!   the same `TypeError`, so there is no `Connect` or `Tls` there: they are
//!   `Interrupted`.
//!
//! The message is [`reqwest::Error::without_url`]'s text followed by the texts of its
//! sources (for example `error sending request: client error (Connect): tcp connect
//! error: Connection refused (os error 111)`). Anything that still looks like a URL
//! (`scheme://...`) is replaced by `<url>`, and the message is cut at 512 bytes.

use std::error::Error as StdError;
use std::io;

use vantage_api_pool::{TransportError, TransportErrorKind};

/// The longest message kept, in bytes.
const MAX_MESSAGE: usize = 512;

/// Turns a reqwest error into a [`TransportError`]: the kind from the table in the
/// [module docs](self), the message from [`reqwest::Error::without_url`] with its
/// sources, never containing a URL.
///
/// Useful for code that talks to reqwest directly and wants the pool's kinds.
///
/// ```
/// use vantage_api_pool::TransportErrorKind;
/// use vantage_api_pool_reqwest::transport_error;
///
/// let client = reqwest::Client::builder().build().unwrap();
/// let err = client.get("not a url").build().unwrap_err();
/// let err = transport_error(err);
/// assert_eq!(err.kind(), TransportErrorKind::Config);
/// assert!(!err.to_string().contains("not a url"));
/// ```
#[must_use]
pub fn transport_error(err: reqwest::Error) -> TransportError {
    let err = err.without_url();
    TransportError::new(kind_of(&err), describe(&err))
}

fn kind_of(err: &reqwest::Error) -> TransportErrorKind {
    if err.is_builder() {
        return TransportErrorKind::Config;
    }
    #[cfg(not(target_arch = "wasm32"))]
    if err.is_connect() {
        return if io_kinds(err).any(|kind| kind == io::ErrorKind::InvalidData) {
            TransportErrorKind::Tls
        } else {
            TransportErrorKind::Connect
        };
    }
    if err.is_timeout() {
        return TransportErrorKind::TimedOut;
    }
    for kind in io_kinds(err) {
        match kind {
            io::ErrorKind::ConnectionRefused => return TransportErrorKind::Connect,
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof => return TransportErrorKind::Interrupted,
            _ => {}
        }
    }
    TransportErrorKind::Interrupted
}

/// The kinds of the `io::Error`s in `err`'s source chain, outermost first,
/// including those wrapped inside another `io::Error` (whose `source()` skips the
/// wrapped error: tokio-rustls's `InvalidData` sits inside hyper-util's `Other`).
fn io_kinds(err: &reqwest::Error) -> impl Iterator<Item = io::ErrorKind> + '_ {
    sources(err).flat_map(|e| {
        std::iter::successors(e.downcast_ref::<io::Error>(), |io| {
            io.get_ref()?.downcast_ref::<io::Error>()
        })
        .map(io::Error::kind)
    })
}

/// `err`'s sources, outermost first (not `err` itself).
fn sources(err: &reqwest::Error) -> impl Iterator<Item = &(dyn StdError + 'static)> {
    std::iter::successors(err.source(), |&e| e.source())
}

/// `err`'s text and its sources' texts, URLs replaced, cut at [`MAX_MESSAGE`].
fn describe(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    for source in sources(err) {
        let part = source.to_string();
        // Some errors repeat their source's text in their own.
        if !part.is_empty() && !text.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
    }
    let mut text = redact_urls(&text);
    if text.len() > MAX_MESSAGE {
        let mut cut = MAX_MESSAGE;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("...");
    }
    text
}

/// Replaces everything that looks like `scheme://rest` with `<url>`; `rest` ends at
/// whitespace or a quote, bracket or angle bracket.
fn redact_urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let before = &rest[..at];
        let scheme_len = before
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
            .count(); // ASCII only, so chars == bytes
        let after = &rest[at + 3..];
        let url_len = after
            .find(|c: char| c.is_whitespace() || "\"'`<>()[]{}".contains(c))
            .unwrap_or(after.len());
        if scheme_len == 0 {
            out.push_str(&rest[..at + 3]);
        } else {
            out.push_str(&before[..before.len() - scheme_len]);
            out.push_str("<url>");
        }
        rest = if scheme_len == 0 {
            after
        } else {
            &after[url_len..]
        };
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_anything_that_looks_like_a_url() {
        assert_eq!(
            redact_urls("error for url (https://user:pw@host:8/p?q=1#f) here"),
            "error for url (<url>) here"
        );
        assert_eq!(redact_urls("a http://x b ws://y"), "a <url> b <url>");
        assert_eq!(redact_urls("\"git+ssh://h/r\""), "\"<url>\"");
        assert_eq!(redact_urls("no scheme ://x"), "no scheme ://x");
        assert_eq!(redact_urls("plain text"), "plain text");
        assert_eq!(redact_urls("end http://"), "end <url>");
        assert_eq!(redact_urls("ünï http://x ünï"), "ünï <url> ünï");
    }

    #[test]
    fn builder_errors_are_config_without_the_url() {
        let client = reqwest::Client::builder().build().unwrap();
        let err = client
            .get("http://[::1/secret?token=hunter2")
            .build()
            .unwrap_err();
        let err = transport_error(err);
        assert_eq!(err.kind(), TransportErrorKind::Config);
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert!(err.message().starts_with("builder error"), "{err}");
    }
}
