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
//! on every hop, to any origin: for a request that carries a sensitive value under
//! another name (the pool's token in `x-api-key`, say, which
//! [`set_header`](vantage_api_pool::PreparedRequest::set_header) notes), a tracked
//! policy follows no hop out of the first origin.
//!
//! [`tracked`] wraps a redirect policy so that every decision it takes is noted for
//! the send being polled: reqwest asks its policy synchronously, inside the poll of
//! the send's future, on the thread polling it, so a thread-local flag around that
//! poll ties the decision to its send. A send that had a redirect decided and then
//! fails before a response head is reported as `Interrupted`, whatever the last hop
//! said (a timeout stays `TimedOut`, a head over hyper's limits `TooLarge`).
//!
//! Clients the adapter builds ([`ReqwestTransport::default_client_builder`]) use
//! `tracked(Policy::default())`. A client you build yourself keeps its own policy;
//! wrap it (`.redirect(tracked(your_policy))`) for the same guarantee. With an
//! untracked policy an error after a redirect is reported as the last hop alone.
//! `Policy::none()` needs no wrapping: it follows nothing.
//!
//! [`ReqwestTransport::default_client_builder`]: crate::ReqwestTransport::default_client_builder

use std::cell::Cell;

use reqwest::Url;
use reqwest::redirect::Policy;

/// In [`STATE`]: a tracked policy decided on a redirect during the current poll.
const DECIDED: u8 = 1;
/// In [`STATE`]: the send being polled carries a secret that reqwest keeps on a hop
/// to another origin.
const GUARDED: u8 = 2;

thread_local! {
    /// The current poll of a send on this thread: [`DECIDED`] and [`GUARDED`]. One
    /// cell for both, so a poll reads and restores it once.
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
        if let [first, .., last] = attempt.previous()
            && ((state & GUARDED != 0 && !same_origin(attempt.url(), first))
                || (same_origin(attempt.url(), last) && !same_origin(last, first)))
        {
            return attempt.stop();
        }
        STATE.with(|cell| cell.set(state | DECIDED));
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

/// Runs one poll of a send's future, `guarded` if its request carries a secret that
/// must not leave its origin, and tells whether a tracked policy decided on a
/// redirect during it. Restores the state it found, so it nests.
pub(crate) fn noting<T>(guarded: bool, poll: impl FnOnce() -> T) -> (T, bool) {
    let outer = STATE.with(|cell| cell.replace(if guarded { GUARDED } else { 0 }));
    let output = poll();
    let state = STATE.with(|cell| cell.replace(outer));
    (output, state & DECIDED != 0)
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
        assert!(!same_origin(&url("http://a.test/"), &url("http://b.test/")));
    }

    #[test]
    fn noting_sees_only_its_own_poll_and_restores_the_outer_state() {
        let ((inner, inner_guarded, outer_before), outer) = noting(true, || {
            STATE.with(|d| d.set(d.get() | DECIDED));
            let ((), inner) = noting(false, || ());
            let inner_guarded = noting(true, || STATE.with(Cell::get) & GUARDED != 0).0;
            (inner, inner_guarded, STATE.with(Cell::get))
        });
        // The inner poll decided nothing and saw its own guard; the outer one's
        // decision and guard survived it.
        assert!(!inner);
        assert!(inner_guarded);
        assert_eq!(outer_before, DECIDED | GUARDED);
        assert!(outer);
        assert_eq!(STATE.with(Cell::get), 0);
    }
}
