//! From [`reqwest::Error`] to the pool's [`TransportError`].
//!
//! Two functions, one per phase of an exchange:
//!
//! - [`transport_error`] for a failure before the response head (building, connecting,
//!   writing the request, reading the head): every kind is possible;
//! - [`body_error`] for a failure while reading a body whose head has arrived: the
//!   request certainly reached the server, so only `TimedOut` and `Interrupted`.
//!
#![cfg_attr(
    not(target_arch = "wasm32"),
    doc = r##"
[`transport_error`] decides from what reqwest exposes (its `is_*` methods) and from
the errors in its `source()` chain, first match wins:

| what the error says | kind | why |
|---|---|---|
| from [`send`](vantage_api_pool::transport::SendTransport::send) only, of a request whose own URL is http or https: `is_builder()` about a URL that is not | `Interrupted` | raised while following a redirect to `ftp://…` or `myapp://…`, so the request was sent and answered (a `Location` that cannot be resolved is not followed: the 3xx is the response). A request whose own URL has another scheme (changed after `prepare`, which refuses one, or made with `ReqwestRequest::new`) stays `Config` |
| `is_builder()` (bad URL, header or body; a scheme other than http/https) | `Config` | our side, nothing sent |
| a [`hyper::Error`] in the chain with `is_user()`: above all the caller's request body stream failing | `Interrupted` | the head (and maybe part of the body) may have been written; the errors under it are the caller's own (a relayed upload's source that could not connect, say) and are not read: by the rows below they could say `Connect` or `NotSent` |
| a TLS alert from the server refusing the handshake (`handshake_failure`, `access_denied`, `decrypt_error`, or one about a certificate: `certificate_required`, `bad_certificate`, `unknown_ca`, …) | `Tls` | checked before hyper's signals below, which a refusal that reaches a fresh connection before the request does also raises (`NotSent`, and a redial would meet it again); under TLS 1.3 the server checks a client certificate only after the client has finished its side of the handshake and written the request, so the refusal comes on the first read and not as a connect error; the server never let the request through |
| a [`hyper::Error`] in the chain with `is_canceled()` | `NotSent` | hyper hands a request back with this error only when it never started writing it (the connection closed or failed first) |
| a [`hyper::Error`] in the chain with `is_closed()` | `NotSent` | while sending, only the readiness check of a connection raises it, before the request is handed over |
| a hyper-util client error about the request itself (`client error (User...)`: an HTTP version or method it does not support) | `Config` | our side, nothing sent |
| a hyper-util client error that is not a connect error and has no [`connect_info`](hyper_util::client::legacy::Error::connect_info) | `NotSent` | hyper-util attaches the connection's info to every error raised once a connection had the request; without it, the error came while a fresh connection was being set up (for example the server closed it before hyper's first read) |
| an [`h2::Error`] from the server: a `REFUSED_STREAM` reset | `NotSent` | RFC 9113 §8.7: the server did not process the stream (reqwest's default retry would resend it itself; see the crate docs) |
| an [`h2::Error`] from the server: a `GOAWAY` (any error code) | `Interrupted` (below) | h2 gives a `GOAWAY` as the error of the streams above its last stream id (not processed, RFC 9113 §6.8), but hyper can also give it to a request h2 had already sent: see the cases that cannot be told apart |
| a [`hyper::Error`] in the chain with `is_parse_too_large()` | `TooLarge` | the response head was over hyper's limits (more than 100 headers, or a head larger than its read buffer) |
| `is_connect()` with an `io::ErrorKind::InvalidData` in the chain | `Tls` | rustls reports handshake and certificate failures as `InvalidData` through tokio-rustls |
| `is_connect()` otherwise (refused, DNS, connect timeout, unreachable, reset during the TCP or TLS handshake) | `Connect` | no connection, nothing reached the server |
| `is_timeout()` (the request's or client's `timeout`, `read_timeout`) | `TimedOut` | the exchange was cut; the server may have acted |
| an `io::ErrorKind::ConnectionRefused` in the chain | `Connect` | as above |
| an `io::ErrorKind` `ConnectionReset`, `ConnectionAborted`, `BrokenPipe` or `UnexpectedEof` in the chain | `Interrupted` | the connection broke mid-exchange |
| `is_request()` otherwise: hyper's "connection closed before message completed" (the server closed after the request was written), an invalid status line or header | `Interrupted` | the request was (or may have been) written |
| `is_redirect()` (a redirect loop, too many redirects) | `Interrupted` | requests were sent and answered; not our side, so not `Config` |
| anything else | `Interrupted` | the safe kind: retried only for idempotent calls |

A send during which a [tracked](crate::redirect::tracked) redirect policy (the
default on clients the adapter builds) decided on a redirect is `Interrupted`
where the table says `NotSent`, `Connect`, `Tls` or `Config`: an earlier hop
reached a server. With an untracked policy on a client you supply, such an error
is reported as the last hop alone (see [`redirect`](crate::redirect)).

Cases that cannot be told apart, mapped to the safe kind:

- A pooled keep-alive connection that the server closes while our request is being
  written: hyper has written (part of) it, then reads end-of-file. The request may
  have arrived, so this is `Interrupted`, not `NotSent`. (When the close is seen
  before writing, hyper-util resends on a fresh connection by itself and nothing
  reaches the pool; when it is seen on a fresh connection, it is `NotSent`.)
- A server that closes a fresh connection right after accepting it: when hyper
  notices before the request reaches the connection, the request is handed back
  (`NotSent`); when the request was already being written, `Interrupted`. Which
  one is a race on the wire.
- An HTTP/2 `GOAWAY` from the server. h2 fails the streams above its last stream
  id with it, which the server did not process and which could be sent again. But
  hyper 1.x, right after handing a request to h2, asks the connection whether it
  is ready again, and if the `GOAWAY` arrived in between (the connection's task
  runs on another thread of a multi-threaded runtime) it fails that request with
  the `GOAWAY` too, though h2 had sent it and the server may have taken it (a
  test saw this about once in a hundred runs: a POST the server took, then
  resent). The error is the same in both cases, so a `GOAWAY` is `Interrupted`: a
  POST is not resent, and an idempotent call is retried as an attempt. (The
  connection-info row still comes first: an error raised before hyper-util had
  handed the request to a connection is `NotSent`, whatever it carries.)
"##
)]
#![cfg_attr(
    target_arch = "wasm32",
    doc = r##"
[`transport_error`] decides from what reqwest exposes, first match wins:

| what the error says | kind | why |
|---|---|---|
| `is_builder()` (bad URL, header or body; a URL with no host) | `Config` | our side, nothing sent (a scheme other than http/https is refused by `prepare`, `Config` too) |
| `is_timeout()`, or reqwest's timeout abort of the fetch (the request's own `timeout`) | `TimedOut` | the exchange was cut; the server may have acted |
| an `io::ErrorKind` in the chain, as natively (`ConnectionRefused`: `Connect`; `ConnectionReset`, `ConnectionAborted`, `BrokenPipe`, `UnexpectedEof`: `Interrupted`) | as said | reqwest's fetch path puts no `io::Error` there, so this row is for errors built by hand |
| anything else: fetch's `TypeError` (refused, DNS, reset, TLS, CORS), any other abort | `Interrupted` | a browser's fetch does not say how far the request got, and the cause Node's gives is lost in reqwest 0.13's text of the error: the safe kind, retried only for idempotent calls |

The native table (hyper's and h2's signals, `NotSent`, `Connect`, `Tls`,
`TooLarge`) is in the docs built for a native target.

"##
)]
//! On wasm32, fetch reports every network failure (refused, DNS, reset, CORS) as the
//! same `TypeError` (Node's carries a cause, which reqwest 0.13 drops), so there is no `NotSent`, `Connect`, `Tls` or `TooLarge` there:
//! they are `Interrupted`. A request that fetch cannot carry as it is (a header value
//! with bytes above 0x7f; in a browser, a credential the browser would drop without
//! an error: `cookie`, `cookie2`, `proxy-authorization` or a sensitive header such as
//! a token under `sec-*`) is `Config`, refused before the fetch.
//!
//! The message is [`reqwest::Error::without_url`]'s text followed by the texts of its
//! sources (for example `error sending request: client error (Connect): tcp connect
//! error: Connection refused (os error 111)`). A reqwest error among the sources (the
//! refused hop of a redirect, say) has its own URL replaced by `<url>`; then anything
//! that still looks like a URL (`scheme://` up to whitespace, `"`, `<` or `>`) is
//! replaced too, and the message is put on one line (on wasm32 a fetch error's
//! JavaScript text repeats its message and adds a stack trace, a frame a line) and
//! cut at 512 bytes.

use std::error::Error as StdError;
use std::io;

use vantage_api_pool::{TransportError, TransportErrorKind};

/// The longest message kept, in bytes.
const MAX_MESSAGE: usize = 512;

/// The whole message of a `Tls` error: rustls's own text names the expected server
/// and the certificate's names, and host names stay out of error messages.
const TLS_FAILED: &str = "the TLS handshake failed (a certificate check on either side, \
                          or no protocol both sides accept)";

/// Turns a reqwest error raised before the response head into a [`TransportError`]:
/// the kind from the table in the [module docs](self), the message from
/// [`reqwest::Error::without_url`] with its sources, never containing a URL.
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
    let kind = kind_of(&err);
    // A TLS failure's text names the expected server and the certificate's names:
    // host names stay out of error messages, so it gets a fixed text.
    let message = if kind == TransportErrorKind::Tls {
        TLS_FAILED.to_owned()
    } else {
        describe(&err)
    };
    TransportError::new(kind, message)
}

/// Turns a reqwest error raised while reading a response body into a
/// [`TransportError`]: `TimedOut` for a timeout (`read_timeout`, the request's
/// `timeout`), `Interrupted` for everything else (a reset, an early close, a body that
/// could not be decoded). The head has arrived, so the request reached the server.
///
/// On wasm32 the request's `timeout` aborts the fetch, and the body fails with
/// the abort's reason, which reqwest sets, or (in Chromium, whatever the reason) with
/// a JavaScript `AbortError`: both are `TimedOut` here. reqwest aborts a fetch whose
/// body is still read for nothing but its timeout, but this function cannot tell
/// whether the request had one; the adapter's own responses can, and call an
/// `AbortError` of a request without a timeout (the page's or the platform's abort)
/// `Interrupted`.
#[must_use]
pub fn body_error(err: reqwest::Error) -> TransportError {
    body_error_of(err, true)
}

/// [`body_error`] for a body whose request may have been aborted by its own
/// `timeout` (`timed`: it had one) or not. Without a timeout no abort is
/// reqwest's, so none is `TimedOut`.
pub(crate) fn body_error_of(err: reqwest::Error, timed: bool) -> TransportError {
    let err = err.without_url();
    let kind = if err.is_timeout() || (timed && aborted_by_timeout(&err)) {
        TransportErrorKind::TimedOut
    } else {
        TransportErrorKind::Interrupted
    };
    TransportError::new(kind, describe(&err))
}

/// [`transport_error`] for an error of [`reqwest::Client::execute`] on a request whose
/// own URL is http or https (`send` checks; `prepare` refuses other schemes, but a
/// request can be changed after it): a builder error about a URL of another
/// scheme was raised while following a redirect, after the request was sent and
/// answered, so it is `Interrupted`, not `Config`. Before sending, reqwest raises
/// builder errors only about the request's own URL (an `https_only` client refusing
/// `http`, a URL that is no valid URI), and those stay `Config`.
pub(crate) fn send_error(err: reqwest::Error) -> TransportError {
    let other_scheme = err
        .url()
        .is_some_and(|url| !matches!(url.scheme(), "http" | "https"));
    if err.is_builder() && other_scheme {
        let err = err.without_url();
        return TransportError::new(TransportErrorKind::Interrupted, describe(&err));
    }
    transport_error(err)
}

/// [`send_error`] for a send during which a [tracked](crate::redirect::tracked)
/// redirect policy decided on a redirect: an earlier hop reached a server, so a
/// failure that on its own says "never left" (`NotSent`, `Connect`, `Tls`, `Config`)
/// is `Interrupted`. The message says it came after a redirect.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn after_redirect(err: reqwest::Error) -> TransportError {
    let error = send_error(err);
    match error.kind() {
        TransportErrorKind::NotSent
        | TransportErrorKind::Connect
        | TransportErrorKind::Tls
        | TransportErrorKind::Config => TransportError::new(
            TransportErrorKind::Interrupted,
            shorten(format!("after a redirect: {}", error.message())),
        ),
        _ => error,
    }
}

fn kind_of(err: &reqwest::Error) -> TransportErrorKind {
    if err.is_builder() {
        return TransportErrorKind::Config;
    }
    // Before anything that reads the chain: under hyper's user error lies the
    // caller's own error (a body stream's), which says nothing of this connection.
    #[cfg(not(target_arch = "wasm32"))]
    if native::callers_own_error(err) {
        return TransportErrorKind::Interrupted;
    }
    // Before hyper's signals: a refusal that reaches a fresh connection before the
    // request does reads to hyper as a connection failed before it was handed the
    // request (`NotSent`), but a redial would meet the same refusal.
    #[cfg(not(target_arch = "wasm32"))]
    if native::handshake_refused(err) {
        return TransportErrorKind::Tls;
    }
    #[cfg(not(target_arch = "wasm32"))]
    if let Some(kind) = native::protocol_signal(err) {
        return kind;
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

#[cfg(not(target_arch = "wasm32"))]
mod native {
    use hyper_util::client::legacy::Error as LegacyError;
    use rustls::AlertDescription as Alert;

    use super::{StdError, TransportErrorKind, inner_errors, sources};

    /// Whether the chain holds a TLS alert by which the server refused the handshake:
    /// a certificate it would not take (or none where it requires one), access
    /// denied, or a failed handshake. A server sends these only before it accepts
    /// any application data (under TLS 1.3, `certificate_required` comes after its
    /// own `Finished` but before it reads the request), so it has let no request
    /// through. Other alerts (`bad_record_mac`, `close_notify`, …) can come
    /// mid-exchange and say nothing about what the server did.
    pub(super) fn handshake_refused(err: &reqwest::Error) -> bool {
        inner_errors(err).any(|e| {
            matches!(
                e.downcast_ref::<rustls::Error>(),
                Some(rustls::Error::AlertReceived(
                    Alert::HandshakeFailure
                        | Alert::AccessDenied
                        | Alert::DecryptError
                        | Alert::NoCertificate
                        | Alert::BadCertificate
                        | Alert::UnsupportedCertificate
                        | Alert::CertificateRevoked
                        | Alert::CertificateExpired
                        | Alert::CertificateUnknown
                        | Alert::UnknownCA
                        | Alert::CertificateRequired
                        | Alert::CertificateUnobtainable
                        | Alert::BadCertificateStatusResponse
                        | Alert::BadCertificateHashValue
                ))
            )
        })
    }

    /// Whether hyper reports an error of the request as the caller gave it (a
    /// `hyper::Error` with `is_user()`): above all a request body stream that failed,
    /// after the head and maybe part of the body were written. The chain below it is
    /// the caller's own error and its sources (a relayed upload whose source could not
    /// connect, say), which must not be read as this connection's: its refused
    /// connection would read as `Connect`, nothing sent.
    pub(super) fn callers_own_error(err: &reqwest::Error) -> bool {
        sources(err).any(|e| {
            e.downcast_ref::<hyper::Error>()
                .is_some_and(hyper::Error::is_user)
        })
    }

    /// `NotSent`, `TooLarge` or `Config` when a hyper, h2 or hyper-util error in the
    /// chain says so.
    pub(super) fn protocol_signal(err: &reqwest::Error) -> Option<TransportErrorKind> {
        let mut before_connection = false;
        for source in sources(err) {
            if let Some(kind) = hyper_signal(source).or_else(|| h2_signal(source)) {
                return Some(kind);
            }
            if let Some(legacy) = source.downcast_ref::<LegacyError>() {
                // hyper-util's own checks of the request (an HTTP version or method
                // it does not support) fail before anything is sent: our side.
                if legacy.to_string().starts_with("client error (User") {
                    return Some(TransportErrorKind::Config);
                }
                // Every error raised once a connection had the request carries that
                // connection's info; one without it (and not a connect error) came
                // while a fresh connection was being set up, before the request was
                // handed to it.
                before_connection = !legacy.is_connect() && legacy.connect_info().is_none();
            }
        }
        before_connection.then_some(TransportErrorKind::NotSent)
    }

    fn hyper_signal(source: &(dyn StdError + 'static)) -> Option<TransportErrorKind> {
        let hyper = source.downcast_ref::<hyper::Error>()?;
        if hyper.is_canceled() || hyper.is_closed() {
            Some(TransportErrorKind::NotSent)
        } else if hyper.is_parse_too_large() {
            Some(TransportErrorKind::TooLarge)
        } else {
            None
        }
    }

    /// A stream the server refused (RFC 9113 §8.7). Not a `GOAWAY`: hyper can fail
    /// a request h2 had already sent with the connection's `GOAWAY`, so that error
    /// does not prove the request unprocessed (see the module docs).
    fn h2_signal(source: &(dyn StdError + 'static)) -> Option<TransportErrorKind> {
        let h2 = source.downcast_ref::<h2::Error>()?;
        let refused = h2.is_reset() && h2.reason() == Some(h2::Reason::REFUSED_STREAM);
        (h2.is_remote() && refused).then_some(TransportErrorKind::NotSent)
    }
}

/// `err`'s sources, outermost first, each followed by the errors wrapped inside it
/// when it is an `io::Error` (whose `source()` skips the wrapped error:
/// tokio-rustls's `InvalidData`, holding a `rustls::Error`, sits inside hyper-util's
/// `Other`).
fn inner_errors(err: &reqwest::Error) -> impl Iterator<Item = &(dyn StdError + 'static)> {
    sources(err).flat_map(|e| {
        std::iter::successors(Some(e), |&e| {
            let inner = e.downcast_ref::<io::Error>()?.get_ref()?;
            Some(inner as &(dyn StdError + 'static))
        })
    })
}

/// The kinds of the `io::Error`s among [`inner_errors`], outermost first.
fn io_kinds(err: &reqwest::Error) -> impl Iterator<Item = io::ErrorKind> + '_ {
    inner_errors(err)
        .filter_map(|e| e.downcast_ref::<io::Error>())
        .map(io::Error::kind)
}

/// The text of the abort reason reqwest on wasm32 gives a fetch when a request's
/// `timeout` passes (the same exact text reqwest itself compares while waiting for
/// the head). During a body read it surfaces as the source of a decode error.
#[cfg(target_arch = "wasm32")]
const WASM_TIMEOUT_ABORT: &str = "JsValue(\"reqwest::errors::TimedOut\")";

/// The start of the text of a JavaScript error named `AbortError` (the
/// `DOMException` of an aborted fetch) in a reqwest error's source on wasm32:
/// reqwest keeps a JavaScript error as its `Debug` text, which wasm-bindgen writes,
/// for any value that is an `Error`, as `JsValue(` then its name, `: `, its message
/// and its stack. An `Error` whose message merely starts with those words reads
/// `JsValue(Error: AbortError: …`.
#[cfg(target_arch = "wasm32")]
const WASM_ABORT_ERROR: &str = "JsValue(AbortError: ";

/// Whether a source of `err` is reqwest's wasm32 timeout abort of a body read:
/// exactly its reason (never a text that merely holds it, such as a decode error
/// quoting a body), or an `AbortError`. Chromium (148 here) errors an aborted
/// fetch's body stream with its own `AbortError` rather than the abort's reason, and
/// reqwest aborts the fetch of a response it still reads only when the request's
/// timeout passes (it offers no abort of its own to callers; the abort on drop
/// comes when nothing reads the body any more). Native reqwest reports its timeouts
/// through `is_timeout`.
#[cfg(target_arch = "wasm32")]
fn aborted_by_timeout(err: &reqwest::Error) -> bool {
    sources(err).any(|e| {
        let text = e.to_string();
        text == WASM_TIMEOUT_ABORT || text.starts_with(WASM_ABORT_ERROR)
    })
}

#[cfg(not(target_arch = "wasm32"))]
fn aborted_by_timeout(_: &reqwest::Error) -> bool {
    false
}

/// `err`'s sources, outermost first (not `err` itself).
fn sources(err: &reqwest::Error) -> impl Iterator<Item = &(dyn StdError + 'static)> {
    std::iter::successors(err.source(), |&e| e.source())
}

/// `err`'s text and its sources' texts, URLs replaced, on one line, cut at
/// [`MAX_MESSAGE`].
fn describe(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    for source in sources(err) {
        let mut part = source.to_string();
        // A reqwest error inside another (a redirect that `https_only` refused, say)
        // still names its URL: that exact text goes, whatever characters it holds.
        if let Some(url) = source
            .downcast_ref::<reqwest::Error>()
            .and_then(reqwest::Error::url)
        {
            part = part.replace(url.as_str(), "<url>");
        }
        // Some errors repeat their source's text in their own.
        if !part.is_empty() && !text.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
    }
    shorten(redact_urls(&one_line(&text)))
}

/// `text` on one line, for logs: each line trimmed, empty ones dropped, and so is a
/// line that repeats the words the text so far ends with (a message given twice),
/// the rest joined by spaces. A JavaScript error (fetch's, on wasm32) comes as its
/// message, the message again and a stack trace, one frame a line.
fn one_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines().map(str::trim).filter(|line| !line.is_empty()) {
        if repeats_the_end(&out, line) {
            continue;
        }
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(line);
    }
    out
}

/// Whether `text` ends with `line`, starting at a word's start, and `line` holds a
/// word: a message repeated, not a closing brace or the last digit of a number.
fn repeats_the_end(text: &str, line: &str) -> bool {
    text.strip_suffix(line).is_some_and(|before| {
        line.chars().any(char::is_alphabetic)
            && !before
                .chars()
                .next_back()
                .is_some_and(char::is_alphanumeric)
    })
}

/// `text` if it is at most [`MAX_MESSAGE`] bytes; otherwise its start, cut on a
/// character boundary, and `...`, together at most [`MAX_MESSAGE`] bytes.
fn shorten(mut text: String) -> String {
    const ELLIPSIS: &str = "...";
    if text.len() > MAX_MESSAGE {
        let mut cut = MAX_MESSAGE - ELLIPSIS.len();
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str(ELLIPSIS);
    }
    text
}

/// Replaces everything that looks like `scheme://rest` with `<url>`. `rest` runs to
/// whitespace, `"`, `<` or `>` (characters a serialized URL always escapes), brackets,
/// quotes and braces included, so no part of a URL is left behind whatever it holds;
/// only a `)` or `]` that ends it, closing a bracket opened just before the scheme
/// (as in `for url (…)`), is given back. Linear in the text's length.
fn redact_urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (before, after) = (&rest[..at], &rest[at + 3..]);
        let scheme_len = before
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
            .count(); // ASCII only, so chars == bytes
        if scheme_len == 0 {
            out.push_str(&rest[..at + 3]);
            rest = after;
            continue;
        }
        let head = &before[..before.len() - scheme_len];
        let mut end = after
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '<' | '>'))
            .unwrap_or(after.len());
        let closer = match head.chars().next_back() {
            Some('(') => Some(')'),
            Some('[') => Some(']'),
            _ => None,
        };
        if closer.is_some_and(|c| after[..end].ends_with(c)) {
            end -= 1;
        }
        out.push_str(head);
        out.push_str("<url>");
        rest = &after[end..];
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
        // Brackets inside the URL belong to it; one closing a bracket opened
        // before it ends it.
        assert_eq!(
            redact_urls("builder error for url (http://[::1]:8080/secret?token=hunter2)"),
            "builder error for url (<url>)"
        );
        // A URL runs to whitespace: a `)` inside it cannot end it early.
        assert_eq!(
            redact_urls("for url (https://api.example/odata/Orders(42)?token=hunter2): x"),
            "for url (<url> x"
        );
        assert_eq!(
            redact_urls("[http://h/a[1]?t=hunter2] tail"),
            "[<url>] tail"
        );
        assert_eq!(
            redact_urls("unbalanced http://h/a(b?t=hunter2"),
            "unbalanced <url>"
        );
    }

    #[test]
    fn no_character_a_url_may_hold_unescaped_ends_it_early() {
        // The url crate leaves these unescaped in a path, a query or userinfo.
        for hostile in [
            "http://127.0.0.1:1/p?a=)&token=hunter2",
            "http://127.0.0.1:1/p?a=`&token=hunter2",
            "http://127.0.0.1:1/p?a={&token=hunter2}",
            "http://127.0.0.1:1/a]/hunter2",
            "http://127.0.0.1:1/it's/hunter2",
            "http://us'er:p)w@127.0.0.1:1/hunter2",
        ] {
            let text = format!("builder error for url ({hostile}): URL scheme is not allowed");
            let redacted = redact_urls(&text);
            assert!(!redacted.contains("hunter2"), "{redacted}");
            assert!(
                redacted.starts_with("builder error for url (<url>"),
                "{redacted}"
            );
            assert!(
                redacted.ends_with(" URL scheme is not allowed"),
                "{redacted}"
            );
        }
    }

    #[test]
    fn a_text_full_of_separators_is_redacted_in_one_pass() {
        // Each `://` used to rescan the rest of the text: 60 KB of them took minutes.
        let text = format!("for url (http://h/a){} tail", "://".repeat(20_000));
        assert_eq!(redact_urls(&text), "for url (<url> tail");
        let text = format!("x{}", " ://".repeat(20_000));
        assert_eq!(redact_urls(&text), text, "no scheme: nothing to redact");
    }

    #[test]
    fn messages_come_on_one_line_without_a_repeated_line() {
        // As reqwest 0.13 gives a failed fetch in Node.
        let node = "error sending request: JsValue(TypeError: fetch failed\n\
                    TypeError: fetch failed\n    at node:internal/deps/undici/undici:14976:13\n\
                    \x20   at process.processTicksAndRejections (node:internal/process/task_queues:95:5))";
        assert_eq!(
            one_line(node),
            "error sending request: JsValue(TypeError: fetch failed at \
             node:internal/deps/undici/undici:14976:13 at \
             process.processTicksAndRejections (node:internal/process/task_queues:95:5))"
        );
        assert_eq!(one_line("one line"), "one line");
        // Only words repeated go: a closing brace, a number's last digit, or the end
        // of a word stay.
        assert_eq!(
            one_line("Error {\n  inner: Inner {\n    code: 7\n  }\n}"),
            "Error { inner: Inner { code: 7 } }"
        );
        assert_eq!(
            one_line("read 1001 bytes, expected 1\n1"),
            "read 1001 bytes, expected 1 1"
        );
        assert_eq!(one_line("a refused\nused"), "a refused used");
        assert_eq!(one_line("timed out\ntimed out"), "timed out");
        assert_eq!(one_line("a\r\n\r\n  b  \n"), "a b");
        assert_eq!(one_line(""), "");
    }

    #[test]
    fn messages_are_cut_to_512_bytes_on_a_character_boundary() {
        let short = "x".repeat(MAX_MESSAGE);
        assert_eq!(shorten(short.clone()), short, "512 bytes stay whole");
        let long = shorten("y".repeat(MAX_MESSAGE + 1));
        assert_eq!(long.len(), MAX_MESSAGE);
        assert!(long.ends_with("yyy..."));
        // Two-byte characters: the cut never splits one.
        let wide = shorten("é".repeat(MAX_MESSAGE));
        assert!(
            wide.len() <= MAX_MESSAGE && wide.ends_with("é..."),
            "{}",
            wide.len()
        );
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
