//! Seeing the redirects reqwest follows inside one send.
//!
//! reqwest follows redirects within one [`execute`](reqwest::Client::execute), and an
//! error on a later hop looks exactly like one on the first: refused, DNS, TLS, a
//! connection closed before the request left. Taken alone, such an error says the
//! request was not sent, yet an earlier hop reached a server that may have acted on it
//! (a `303` after a processed POST, say). Read that way, the POST would be resent.
//!
//! [`tracked`] also keeps credentials from a second hop inside another origin.
//! reqwest puts the request's first headers back on every hop, and drops
//! `Authorization`, `Cookie` and `Proxy-Authorization` only from a hop that changes
//! origin (scheme, host or port) from the hop before it. So after the API redirects to
//! another origin, a further redirect within that origin would carry the API's token
//! there. A tracked policy stops the chain at such a hop instead: the 3xx that asked
//! for it goes to the caller, and nothing more is sent. Other headers reqwest keeps
//! on every hop, to any origin: for a request that carries a sensitive value
//! ([`HeaderValue::set_sensitive`](http::HeaderValue::set_sensitive)) under another
//! name, a tracked policy follows no hop out of the first origin. The pool marks its
//! token sensitive, so a token in `x-api-key` stays with the API; mark a secret you
//! set on the draft yourself too. The client's `default_headers`, and the headers of
//! a proxy of its own (`Proxy::headers`, on http URLs), are added by reqwest after
//! the adapter has seen the request, so a secret there is not guarded; nor is a
//! request sent with reqwest directly, outside the adapter. A body is not looked at:
//! a 307 or 308 sends it on to the next hop, whatever its origin, as reqwest does.
//!
//! [`tracked`] wraps a redirect policy so that every decision it takes is noted for
//! the send being polled: reqwest asks its policy synchronously, inside the poll of
//! the send's future, on the thread polling it, so a thread-local flag around that
//! poll ties the decision to its send. A send that had a redirect decided and then
//! fails before a response head is reported as `Interrupted`, whatever the last hop
//! said (a timeout stays `TimedOut`, a head over hyper's limits `TooLarge`).
//!
//! The policy also notes whether the latest hop it decided on goes to another origin
//! than the hop before, where reqwest sends it without the request's credentials: a
//! response to such a hop says
//! [`credentials_dropped`](vantage_api_pool::TransportResponse::credentials_dropped),
//! and a 401 in it is final, no token refreshed (the token was not sent). Only a hop
//! the policy followed counts: when it stops, the response is the 3xx itself.
//!
//! Clients the adapter builds ([`ReqwestTransport::default_client_builder`]) use
//! `tracked(Policy::default())`. A client you build yourself keeps its own policy;
//! wrap it (`.redirect(tracked(your_policy))`) for the same guarantee. With an
//! untracked policy an error after a redirect is reported as the last hop alone.
//! `Policy::none()` needs no wrapping: it follows nothing.
//!
//! [`ReqwestTransport::default_client_builder`]: crate::ReqwestTransport::default_client_builder

use std::cell::Cell;

use http::HeaderMap;
use http::header::{AUTHORIZATION, COOKIE, PROXY_AUTHORIZATION};
use reqwest::Url;
use reqwest::redirect::Policy;

/// In [`STATE`]: a tracked policy decided on a redirect during the current poll.
const DECIDED: u8 = 1;
/// In [`STATE`]: the send being polled carries a secret that reqwest keeps on a hop
/// to another origin.
const GUARDED: u8 = 2;
/// In [`STATE`]: the latest redirect decided during the current poll goes to another
/// origin than the hop before, so reqwest sends it without the request's
/// credentials (`Authorization`, `Cookie`, `Proxy-Authorization`).
const DROPS_CREDENTIALS: u8 = 4;
/// In [`STATE`]: a redirect decided during the current poll is one after which
/// reqwest sends the next hop as another request, a GET: a 303, or a 301 or 302 to
/// a POST. The request itself was answered.
const ANSWERED: u8 = 8;
/// In [`STATE`]: the send being polled is a POST, which reqwest sends on as a GET
/// after a 301 or 302 (any other method it sends on as it is).
const POST: u8 = 16;

/// What a tracked policy decided during one poll of a send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Decided {
    /// The latest hop decided on goes without the request's credentials.
    pub(crate) drops_credentials: bool,
    /// A hop decided on turned the request into a GET (a 303, or a 301 or 302 to a
    /// POST).
    pub(crate) answered: bool,
}

thread_local! {
    /// The current poll of a send on this thread: [`DECIDED`], [`GUARDED`],
    /// [`DROPS_CREDENTIALS`], [`ANSWERED`] and [`POST`]. One cell for all, so a poll reads and
    /// restores it once.
    static STATE: Cell<u8> = const { Cell::new(0) };
}

/// `policy`, noting each redirect it decides on for the send being polled, so an error
/// on a later hop is not taken for a request that never left, and stopping at a hop
/// within an origin the chain has moved to, which would carry the first request's
/// credentials there. See the module docs.
///
/// ```
/// use vantage_api_pool_reqwest::{ReqwestTransport, redirect::tracked};
/// use vantage_api_pool_reqwest::reqwest::{Client, redirect::Policy};
///
/// let client = Client::builder().redirect(tracked(Policy::limited(3))).build()?;
/// let transport = ReqwestTransport::new(client);
/// # let _ = transport;
/// # Ok::<(), vantage_api_pool_reqwest::reqwest::Error>(())
/// ```
#[must_use]
pub fn tracked(policy: Policy) -> Policy {
    Policy::custom(move |attempt| {
        let state = STATE.with(Cell::get);
        let previous = attempt.previous();
        // A guarded request stays in its first origin, from the first hop on.
        let leaves_guarded = state & GUARDED != 0
            && previous
                .first()
                .is_some_and(|first| !same_origin(attempt.url(), first));
        // A hop inside an origin the chain has moved to would get the credentials back.
        let credentials_back = matches!(previous, [first, .., last]
            if same_origin(attempt.url(), last) && !same_origin(last, first));
        if leaves_guarded || credentials_back {
            return attempt.stop();
        }
        // Whether the next hop, if the policy follows it, goes without the
        // credentials: reqwest drops them on a hop to another origin than the hop
        // before (so A, B, A drops them on the way back to A too).
        let drops = previous
            .last()
            .is_some_and(|last| !same_origin(attempt.url(), last));
        let mut decided = if drops {
            state | DECIDED | DROPS_CREDENTIALS
        } else {
            (state | DECIDED) & !DROPS_CREDENTIALS
        };
        // reqwest sends anything but a HEAD on as a GET after a 303 (a HEAD, which is
        // idempotent, is marked too: it changes nothing for it), a POST after a 301
        // or 302; any other method, and any after a 307 or 308, goes on as it is.
        let answered = match attempt.status().as_u16() {
            303 => true,
            301 | 302 => state & POST != 0,
            _ => false,
        };
        if answered {
            decided |= ANSWERED;
        }
        STATE.with(|cell| cell.set(decided));
        policy.redirect(attempt)
    })
}

/// Whether reqwest takes a hop from `a` to `b` to stay in one origin, and so keeps the
/// request's credentials on it (the comparison its `remove_sensitive_headers` makes).
fn same_origin(a: &Url, b: &Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str() == b.host_str()
        && a.port_or_known_default() == b.port_or_known_default()
}

/// Whether `headers` hold a sensitive value under a name that reqwest keeps on a hop
/// to another origin (it drops only `Authorization`, `Cookie` and
/// `Proxy-Authorization` there). Such a request is guarded: a tracked policy keeps
/// it in its first origin.
pub(crate) fn carries_secret(headers: &HeaderMap) -> bool {
    headers.iter().any(|(name, value)| {
        value.is_sensitive()
            && name != AUTHORIZATION
            && name != COOKIE
            && name != PROXY_AUTHORIZATION
    })
}

/// The marks a send's request gives each poll of it ([`noting`]): [`GUARDED`] if it
/// carries a secret that must not leave its origin ([`carries_secret`]), [`POST`]
/// if it is a POST.
pub(crate) fn request_marks(request: &reqwest::Request) -> u8 {
    let guarded = if carries_secret(request.headers()) {
        GUARDED
    } else {
        0
    };
    let post = if request.method() == http::Method::POST {
        POST
    } else {
        0
    };
    guarded | post
}

/// One poll of a send's future under `marks` ([`request_marks`]): [`Noting::start`]
/// before it, [`Noting::finish`] after it, which tells whether a tracked policy
/// decided on a redirect during it (`Some`), and if so whether the latest one goes
/// without the request's credentials and whether one turned the request into a GET.
/// It puts back the state it found as it finishes, or is dropped (the poll panicked),
/// so it nests. (A tracked policy used outside the adapter, by a request sent with
/// reqwest directly, leaves its own mark on the thread; the next `Noting` replaces
/// it, and such a request has no guard.) A guard rather than a function around the
/// poll, so the poll's output stays where the poll wrote it (a response head is
/// some 140 bytes, and a tuple around it is a copy on every poll).
pub(crate) struct Noting {
    /// The state to put back.
    outer: u8,
}

impl Noting {
    /// Marks the thread for the poll that follows.
    #[inline(always)]
    pub(crate) fn start(marks: u8) -> Self {
        Noting {
            outer: STATE.with(|cell| cell.replace(marks)),
        }
    }

    /// Ends the poll: what a tracked policy decided during it, the outer state put
    /// back.
    #[inline(always)]
    pub(crate) fn finish(self) -> Option<Decided> {
        let state = STATE.with(Cell::get);
        drop(self);
        (state & DECIDED != 0).then_some(Decided {
            drops_credentials: state & DROPS_CREDENTIALS != 0,
            answered: state & ANSWERED != 0,
        })
    }
}

impl Drop for Noting {
    #[inline(always)]
    fn drop(&mut self) {
        STATE.with(|cell| cell.set(self.outer));
    }
}

/// `poll` under a [`Noting`]: its output, and what was decided during it.
#[cfg(test)]
fn noting<T>(marks: u8, poll: impl FnOnce() -> T) -> (T, Option<Decided>) {
    let noting = Noting::start(marks);
    let output = poll();
    (output, noting.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_compare_as_reqwest_compares_them() {
        let url = |s: &str| Url::parse(s).unwrap();
        assert!(same_origin(
            &url("http://a.test/x"),
            &url("http://a.test:80/y?q")
        ));
        assert!(same_origin(
            &url("https://a.test/x"),
            &url("https://a.test:443/")
        ));
        assert!(!same_origin(
            &url("http://a.test/"),
            &url("https://a.test/")
        ));
        assert!(!same_origin(
            &url("http://a.test/"),
            &url("http://a.test:8080/")
        ));
        // Same host and port, another scheme: a token must not go out in clear text.
        assert!(!same_origin(
            &url("https://a.test:8443/"),
            &url("http://a.test:8443/")
        ));
        assert!(!same_origin(&url("http://a.test/"), &url("http://b.test/")));
    }

    #[test]
    fn a_secret_is_a_sensitive_value_under_a_name_reqwest_keeps_across_origins() {
        let sensitive = |v: &'static str| {
            let mut value = http::HeaderValue::from_static(v);
            value.set_sensitive(true);
            value
        };
        let mut headers = HeaderMap::new();
        headers.insert("x-trace", http::HeaderValue::from_static("plain"));
        headers.insert(AUTHORIZATION, sensitive("Bearer t"));
        headers.insert(COOKIE, sensitive("s=1"));
        headers.insert(PROXY_AUTHORIZATION, sensitive("Basic p"));
        assert!(!carries_secret(&headers), "reqwest drops these itself");
        headers.insert("x-api-key", http::HeaderValue::from_static("k"));
        assert!(!carries_secret(&headers), "not marked sensitive");
        headers.insert("x-api-key", sensitive("k"));
        assert!(carries_secret(&headers));
    }

    #[test]
    fn noting_restores_the_outer_state_when_the_poll_panics() {
        STATE.with(|cell| cell.set(DECIDED));
        let panicked = std::panic::catch_unwind(|| {
            noting(GUARDED, || {
                STATE.with(|cell| cell.set(cell.get() | DECIDED));
                panic!("a poll that panics");
            })
        });
        assert!(panicked.is_err());
        assert_eq!(STATE.with(Cell::get), DECIDED);
        STATE.with(|cell| cell.set(0));
    }

    #[test]
    fn noting_sees_only_its_own_poll_and_restores_the_outer_state() {
        let ((inner, inner_guarded, outer_before), outer) = noting(GUARDED, || {
            STATE.with(|d| d.set(d.get() | DECIDED));
            let ((), inner) = noting(0, || ());
            let inner_guarded = noting(GUARDED, || STATE.with(Cell::get) & GUARDED != 0).0;
            (inner, inner_guarded, STATE.with(Cell::get))
        });
        // The inner poll decided nothing and saw its own guard; the outer one's
        // decision and guard survived it.
        assert_eq!(inner, None);
        assert!(inner_guarded);
        assert_eq!(outer_before, DECIDED | GUARDED);
        let neither = Decided {
            drops_credentials: false,
            answered: false,
        };
        assert_eq!(outer, Some(neither));
        let ((), decided) = noting(0, || {
            STATE.with(|d| d.set(DECIDED | DROPS_CREDENTIALS));
        });
        assert_eq!(
            decided,
            Some(Decided {
                drops_credentials: true,
                ..neither
            })
        );
        let ((), decided) = noting(0, || STATE.with(|d| d.set(DECIDED | ANSWERED)));
        assert_eq!(
            decided,
            Some(Decided {
                answered: true,
                ..neither
            })
        );
        assert_eq!(STATE.with(Cell::get), 0);
    }
}
