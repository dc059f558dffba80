//! Auth: where a client's token comes from.
//!
//! A [`TokenSource`] is a generic parameter of the client, like the ports, so the
//! `Send`-ness of its future leaks through to the call's future. The default,
//! [`NoAuth`], applies nothing and never refreshes.
//!
//! The token is fetched lazily on first use and applied to every send as a sensitive
//! header. A 401 on a client with a configured source, the first in its call, fetches
//! a newer token and replays with no back-off and no retry spent (through the gate
//! and the permit queue like any send, so behind the calls already queued; a call
//! gets one replay). Fetches are single-flight by token generation:
//! concurrent first callers cause one fetch; concurrent 401s answered with generation
//! `g` cause one fetch of `g + 1`; a 401 for a generation already replaced replays with
//! the current token without another fetch, unless a 401 for the current token has
//! started a refresh that is still running: then it waits for that refresh, as does
//! a call that just needs a token (if the refresh fails, such a call sends the
//! cached token). A send whose token a 401 rejected (or that expired) while it waited
//! for a permit or a rate token does not go out with it either: it waits for the
//! refresh, or goes back through the gate.
//!
//! A token with a lifetime ([`AuthToken::expires_in`]) is renewed ahead of its expiry
//! by the first call to look once [`REFRESH_AHEAD`] (or its own
//! [`renew_ahead`](AuthToken::renew_ahead)) or less of it is left, and never
//! sent once expired. A token without one is used until the API rejects it, unless
//! you ask: [`ResilientClient::refresh_token`](crate::ResilientClient::refresh_token)
//! fetches a new one while the one in use stays in use.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderName, HeaderValue};

use crate::observer::{TokenFetchOutcome, TokenFetchReason};
use crate::sync::{AtomicU64, Mutex, MutexGuard, Ordering, PoisonError, ToWake, Wakers};
use crate::time::Instant;

/// An array of the names no token may take (see [`RESERVED_TOKEN_HEADERS`]), after
/// the given ones: the builder's list of names a retry-count header may not take
/// adds the credentials.
macro_rules! reserved_headers {
    ($($first:expr),*) => {
        [
            $($first,)*
            $crate::classify::IDEMPOTENCY_KEY,
            ::http::header::HOST,
            ::http::header::CONTENT_LENGTH,
            ::http::header::CONTENT_TYPE,
            ::http::header::CONTENT_ENCODING,
            ::http::header::TRANSFER_ENCODING,
            ::http::header::EXPECT,
            ::http::header::CONNECTION,
            ::http::HeaderName::from_static("keep-alive"),
            ::http::HeaderName::from_static("proxy-connection"),
            ::http::header::TE,
            ::http::header::TRAILER,
            ::http::header::UPGRADE,
        ]
    };
}
pub(crate) use reserved_headers;

/// The header names a token may not come under: the idempotency key, the headers
/// that frame the message or the connection, and `expect` (whether the body goes
/// out at all waits on the server's answer to it). A [`TokenSource`] that gives one, or
/// an empty or blank value, fails the fetch: the call ends with
/// [`ErrorKind::Auth`](crate::ErrorKind::Auth), nothing sent.
pub const RESERVED_TOKEN_HEADERS: [HeaderName; 13] = reserved_headers!();

/// Refuses a token under a name in [`RESERVED_TOKEN_HEADERS`], or with an empty or
/// blank value: sent, it would break the request's framing or carry no credential.
fn checked(token: AuthToken) -> Result<AuthToken, AuthError> {
    let (name, value) = (&token.name, &token.value);
    if RESERVED_TOKEN_HEADERS.contains(name) {
        return Err(format!(
            "the token source gave a header the request depends on (`{name}`), not a credential"
        )
        .into());
    }
    if value.as_bytes().trim_ascii().is_empty() {
        return Err(format!("the token source gave an empty `{name}` value").into());
    }
    Ok(token)
}

/// Once this much of a token's lifetime or less is left (or half of it, for a token
/// that lives less than twice as long), the next call to look fetches a new one
/// while the others go on sending it: one minute, unless the token says otherwise
/// ([`AuthToken::renew_ahead`]).
pub const REFRESH_AHEAD: Duration = Duration::from_secs(60);

/// After a failed renewal the next is due halfway to the token's expiry, unless that
/// would leave less than this before the expiry: then none before it expires.
const RENEW_RETRY_FLOOR: Duration = Duration::from_secs(2);

/// A token as a [`TokenSource`] gives it: the header to apply to every send, and how
/// long it stays valid, when the source knows (an OAuth token response's
/// `expires_in`, say).
///
/// With a lifetime, counted from the moment its fetch started, the client renews the
/// token before it expires: once what is left is at most [`REFRESH_AHEAD`] or the
/// token's own [`renew_ahead`](AuthToken::renew_ahead) (or half the lifetime, if
/// less), the first call to look fetches a new token and waits for
/// it (sending the current one if that fetch fails), while other calls go on sending
/// the current one. After a failed renewal the next is tried halfway to the expiry
/// (none in the last 2 s), so a provider that is down is not asked once per call.
/// That call's wait counts toward its budget like any token wait: a source slower
/// than a call's budget ends that call `TimedOut`, old token or not, so give the
/// source a timeout shorter than the budgets.
///
/// From its expiry on, a token is never sent (it is looked at last after the request
/// closure has run, before the send's `Started`): calls wait for a fetch, as for the
/// first token, and a fetch that fails then ends them with
/// [`ErrorKind::Auth`](crate::ErrorKind::Auth); a request built with it that waited
/// for a permit past the expiry takes a new one first, and one that waited for its
/// rate token past the expiry is built again with a new one (and waits for a fresh
/// rate token: sends keep to the rate). A token that, once fetched, lives less than
/// a rate interval can never go out: such a call ends when its budget does. A token whose
/// lifetime ran out before its fetch ended (a lifetime of zero, or shorter than the
/// fetch took) counts as a failed fetch. To renew earlier or later than a minute
/// ahead, give the token a margin of its own with
/// [`renew_ahead`](AuthToken::renew_ahead); for a server whose clock runs ahead,
/// give a shorter lifetime. Without a lifetime, a token is used until the API
/// answers 401.
///
/// A `(HeaderName, HeaderValue)` pair converts into a token without a lifetime.
///
/// ```
/// use std::time::Duration;
/// use vantage_api_pool::auth::AuthToken;
///
/// let token = AuthToken::bearer("abc")?.expires_in(Duration::from_secs(3600));
/// assert_eq!(token.name(), "authorization");
/// assert_eq!(token.value(), "Bearer abc");
/// assert_eq!(token.lifetime(), Some(Duration::from_secs(3600)));
/// # Ok::<(), vantage_api_pool::auth::AuthError>(())
/// ```
#[derive(Clone)]
pub struct AuthToken {
    name: HeaderName,
    value: HeaderValue,
    lifetime: Option<Duration>,
    renew_ahead: Duration,
}

impl AuthToken {
    /// A token applied as header `name: value`, with no lifetime.
    #[must_use]
    pub fn new(name: HeaderName, value: HeaderValue) -> Self {
        AuthToken {
            name,
            value,
            lifetime: None,
            renew_ahead: REFRESH_AHEAD,
        }
    }

    /// `authorization: Bearer <token>`, with no lifetime.
    ///
    /// # Errors
    ///
    /// An [`AuthError`] if `token` is empty or blank (`Bearer ` would carry no
    /// credential: an unset environment variable, say), or holds a character a
    /// header value cannot (a line break, say).
    pub fn bearer(token: &str) -> Result<Self, AuthError> {
        if token.trim_ascii().is_empty() {
            return Err(AuthError::from("the bearer token is empty"));
        }
        let value = HeaderValue::try_from(format!("Bearer {token}"))
            .map_err(|_| AuthError::from("the bearer token holds a character a header cannot"))?;
        Ok(AuthToken::new(http::header::AUTHORIZATION, value))
    }

    /// The same token, valid for `lifetime` from the start of the fetch that got it.
    #[must_use]
    pub fn expires_in(mut self, lifetime: Duration) -> Self {
        self.lifetime = Some(lifetime);
        self
    }

    /// The header's name.
    #[must_use]
    pub fn name(&self) -> &HeaderName {
        &self.name
    }

    /// The header's value.
    #[must_use]
    pub fn value(&self) -> &HeaderValue {
        &self.value
    }

    /// How long it stays valid from the start of its fetch, if the source said.
    #[must_use]
    pub fn lifetime(&self) -> Option<Duration> {
        self.lifetime
    }

    /// The same token, due for renewal once `ahead` or less of its lifetime is left,
    /// instead of [`REFRESH_AHEAD`]: earlier for a provider that is slow to answer
    /// or one that should not be asked at the last minute, later to ask it less
    /// often (down to zero: fetched anew only once expired, the calls that need it
    /// then waiting for the fetch). Never more than half the
    /// lifetime, as with the default, so a token is always sent for at least half
    /// its life and a source is never asked once per call. Changes nothing for a
    /// token without a lifetime.
    ///
    /// ```
    /// use std::time::Duration;
    /// use vantage_api_pool::auth::{AuthToken, REFRESH_AHEAD};
    ///
    /// let hour = Duration::from_secs(3600);
    /// let token = AuthToken::bearer("abc")?.expires_in(hour);
    /// assert_eq!(token.renewal_margin(), REFRESH_AHEAD);
    /// // Renewed with ten minutes left ...
    /// let early = token.clone().renew_ahead(Duration::from_secs(600));
    /// assert_eq!(early.renewal_margin(), Duration::from_secs(600));
    /// // ... and never with more than half of its life left.
    /// assert_eq!(token.renew_ahead(2 * hour).renewal_margin(), hour / 2);
    /// # Ok::<(), vantage_api_pool::auth::AuthError>(())
    /// ```
    #[must_use]
    pub fn renew_ahead(mut self, ahead: Duration) -> Self {
        self.renew_ahead = ahead;
        self
    }

    /// How much of its lifetime is left when the token is due for renewal: the
    /// margin given with [`renew_ahead`](AuthToken::renew_ahead) or
    /// [`REFRESH_AHEAD`], at most half the lifetime (without a lifetime, the margin
    /// as given: it has no use then).
    #[must_use]
    pub fn renewal_margin(&self) -> Duration {
        match self.lifetime {
            Some(lifetime) => self.renew_ahead.min(lifetime / 2),
            None => self.renew_ahead,
        }
    }
}

impl From<(HeaderName, HeaderValue)> for AuthToken {
    fn from((name, value): (HeaderName, HeaderValue)) -> Self {
        AuthToken::new(name, value)
    }
}

/// Shows the header's name and the lifetime, never the value.
impl std::fmt::Debug for AuthToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthToken")
            .field("name", &self.name)
            .field("lifetime", &self.lifetime)
            .field("renew_ahead", &self.renew_ahead)
            .finish_non_exhaustive()
    }
}

/// The error a [`TokenSource`] returns; it becomes the source of an
/// [`ErrorKind::Auth`](crate::ErrorKind::Auth) client error.
///
/// Anything that converts into `Box<dyn Error + Send + Sync>` converts into it (a
/// string, any error type), so `?` and `.into()` work in a token source. It is a
/// struct rather than a boxed trait object so that a token source written as a
/// closure returning an `async` block keeps the call's future `Send` (a bare
/// `Box<dyn Error>` in the future's output trips the compiler's higher-ranked
/// lifetime check when the call is `tokio::spawn`ed). Like `anyhow::Error`, it does
/// not implement `Error` itself (that would clash with the blanket `From`); its
/// message and source are reachable through `Display` and [`AuthError::as_error`].
///
/// Its text is the token source's own, unredacted: the client error's `Display` and
/// `Debug` never show it, nor does the [`SharedAuthError`]'s `Debug` that a failed
/// fetch's event ([`TokenFetchOutcome::Failed`]) and a health snapshot carry, but
/// the `source()` chain and the shared error's `Display` do. Keep URLs and
/// credentials out of the errors a token source returns (a `reqwest::Error` from a
/// token endpoint names its URL: use `without_url()`), or print client errors
/// without their chain and the shared error only where its text may go.
///
/// ```
/// use vantage_api_pool::auth::AuthError;
/// let e: AuthError = "identity provider down".into();
/// assert_eq!(e.to_string(), "identity provider down");
/// ```
pub struct AuthError(Box<dyn std::error::Error + Send + Sync + 'static>);

impl AuthError {
    /// The error the token source gave.
    #[must_use]
    pub fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }

    /// The boxed error the token source gave.
    #[must_use]
    pub fn into_inner(self) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self.0
    }
}

impl<E: Into<Box<dyn std::error::Error + Send + Sync + 'static>>> From<E> for AuthError {
    fn from(error: E) -> Self {
        AuthError(error.into())
    }
}

impl std::fmt::Display for AuthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl std::fmt::Debug for AuthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.0, f)
    }
}

/// Produces the auth header a client applies to every send.
///
/// A source whose fetch is `Send` should implement [`SendTokenSource`] instead (it
/// gets this trait from a blanket impl), so that code generic over it can spawn its
/// calls.
pub trait TokenSource {
    /// Whether this source can produce a token at all. A client whose source cannot
    /// (like [`NoAuth`]) never applies a header and treats a 401 as final.
    fn is_configured(&self) -> bool {
        true
    }

    /// Fetches a fresh token: the header to apply (for example
    /// `authorization: Bearer …`) and, if known, how long it stays valid (see
    /// [`AuthToken`]; a `(HeaderName, HeaderValue)` pair converts into one with
    /// `.into()`). The value is marked sensitive before use, and replaces any header
    /// of that name the request closure set. Dropping the future abandons the fetch. A
    /// name among [`RESERVED_TOKEN_HEADERS`], or an empty or blank value, is refused
    /// as a failed fetch.
    ///
    /// Never fetch through the client this source belongs to (a token endpoint on the
    /// same API needs a client of its own, or a plain `reqwest::Client`): the inner
    /// call waits for a token, which waits for the fetch it is part of, so both wait
    /// until a time limit or a drop ends them.
    fn fetch(&self) -> impl Future<Output = Result<AuthToken, AuthError>>;
}

/// [`TokenSource`] whose fetch is `Send`, for generic code that spawns its calls (see
/// [`SendTransport`](crate::transport::SendTransport)). A blanket impl provides [`TokenSource`].
///
/// [`NoAuth`] and [`SendTokenFn`] implement this trait; [`TokenFn`] does not (its
/// closure may hold an `Rc` or a `JsValue`). A type implements one of the two, never
/// both.
pub trait SendTokenSource: Send + Sync {
    /// As [`TokenSource::is_configured`].
    fn is_configured(&self) -> bool {
        true
    }

    /// As [`TokenSource::fetch`], with a `Send` future.
    fn fetch(&self) -> impl Future<Output = Result<AuthToken, AuthError>> + Send;
}

impl<A: SendTokenSource> TokenSource for A {
    #[inline]
    fn is_configured(&self) -> bool {
        SendTokenSource::is_configured(self)
    }

    #[inline]
    fn fetch(&self) -> impl Future<Output = Result<AuthToken, AuthError>> {
        SendTokenSource::fetch(self)
    }
}

/// No auth: nothing is applied and a 401 is final.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoAuth;

impl SendTokenSource for NoAuth {
    fn is_configured(&self) -> bool {
        false
    }

    fn fetch(&self) -> impl Future<Output = Result<AuthToken, AuthError>> + Send {
        std::future::ready(Err("no token source configured".into()))
    }
}

/// A token source built from a closure returning a future (which may hold an `Rc` or
/// a `JsValue`). For code generic over the `Send` ports, use [`send_token_fn`]. The
/// future gives an [`AuthToken`], or anything that converts into one (a
/// `(HeaderName, HeaderValue)` pair).
///
/// ```
/// use std::time::Duration;
/// use http::{HeaderValue, header::AUTHORIZATION};
/// use vantage_api_pool::auth::{AuthError, AuthToken, token_fn};
///
/// let source = token_fn(|| async {
///     Ok::<_, AuthError>((AUTHORIZATION, HeaderValue::from_static("Bearer abc")))
/// });
/// // With a lifetime, renewed before it expires:
/// let expiring = token_fn(|| async {
///     Ok::<_, AuthError>(AuthToken::bearer("abc")?.expires_in(Duration::from_secs(3600)))
/// });
/// # let _ = (source, expiring);
/// ```
pub fn token_fn<F, Fut, T>(fetch: F) -> TokenFn<F>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, AuthError>>,
    T: Into<AuthToken>,
{
    TokenFn(fetch)
}

/// The [`TokenSource`] made by [`token_fn`].
#[derive(Clone, Copy)]
pub struct TokenFn<F>(F);

impl<F> std::fmt::Debug for TokenFn<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenFn")
    }
}

impl<F, Fut, T> TokenSource for TokenFn<F>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, AuthError>>,
    T: Into<AuthToken>,
{
    fn fetch(&self) -> impl Future<Output = Result<AuthToken, AuthError>> {
        let fetch = (self.0)();
        async move { fetch.await.map(Into::into) }
    }
}

/// A [`SendTokenSource`] built from a closure returning a `Send` future: the
/// counterpart of [`token_fn`] (whose [`TokenFn`] implements only the plain
/// [`TokenSource`]) for code generic over the `Send` ports.
///
/// ```
/// use http::{HeaderValue, header::AUTHORIZATION};
/// use vantage_api_pool::auth::{AuthError, SendTokenSource, send_token_fn};
///
/// fn spawnable(_: &impl SendTokenSource) {}
/// spawnable(&send_token_fn(|| async {
///     Ok::<_, AuthError>((AUTHORIZATION, HeaderValue::from_static("Bearer abc")))
/// }));
/// ```
pub fn send_token_fn<F, Fut, T>(fetch: F) -> SendTokenFn<F>
where
    F: Fn() -> Fut + Send + Sync,
    Fut: Future<Output = Result<T, AuthError>> + Send,
    T: Into<AuthToken>,
{
    SendTokenFn(fetch)
}

/// The [`SendTokenSource`] made by [`send_token_fn`].
#[derive(Clone, Copy)]
pub struct SendTokenFn<F>(F);

impl<F> std::fmt::Debug for SendTokenFn<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SendTokenFn")
    }
}

impl<F, Fut, T> SendTokenSource for SendTokenFn<F>
where
    F: Fn() -> Fut + Send + Sync,
    Fut: Future<Output = Result<T, AuthError>> + Send,
    T: Into<AuthToken>,
{
    fn fetch(&self) -> impl Future<Output = Result<AuthToken, AuthError>> + Send {
        let fetch = (self.0)();
        async move { fetch.await.map(Into::into) }
    }
}

/// A token applied to sends, and the generation it belongs to.
#[derive(Clone)]
pub(crate) struct Token {
    pub(crate) name: HeaderName,
    pub(crate) value: HeaderValue,
    pub(crate) generation: u64,
    /// From then on the next caller to look renews it (see [`REFRESH_AHEAD`]).
    renew_at: Option<Instant>,
    /// From then on it is never handed out ([`Instant::FAR_FUTURE`]: never).
    pub(crate) expires_at: Instant,
}

/// Whether a token that expires at `expires_at` has expired by `now`: never for
/// [`Instant::FAR_FUTURE`], a token without a lifetime (or with one past the clock's
/// range, which saturates there).
pub(crate) fn expired(expires_at: Instant, now: Instant) -> bool {
    expires_at != Instant::FAR_FUTURE && now >= expires_at
}

impl Token {
    fn expired(&self, now: Instant) -> bool {
        expired(self.expires_at, now)
    }

    fn due(&self, now: Instant) -> bool {
        self.renew_at.is_some_and(|at| now >= at)
    }
}

/// The shared auth state of one client: the current token and the single-flight
/// fetch.
///
/// No lock is held across an `.await`: the caller that sets `fetching` runs the
/// fetch itself; the others wait to be woken. If that caller is dropped, its guard
/// clears the flag and wakes the waiters, one of which takes over.
pub(crate) struct AuthState {
    inner: Mutex<AuthInner>,
    /// `AuthInner::rejected`, written under the lock, read without it by a send's
    /// last look at its token (after the request closure), which takes no lock.
    rejected_now: AtomicU64,
}

struct AuthInner {
    token: Option<Token>,
    /// Generation of the last token fetched (0: none yet).
    generation: u64,
    /// The newest generation whose header name differs from the token before it
    /// (0: the name never changed).
    renamed_at: u64,
    /// The newest generation a 401 refused: one whose 401 asked for a refresh (while
    /// that refresh runs, or once it succeeded), or one a newer token had replaced
    /// when its 401 came. A token of it or older is not handed out (callers wait for
    /// the refresh, or take the newer token). A fetch that fails lowers it to just
    /// below the cached token's generation, if it was not already: callers that only
    /// need a token fall back to the cached one rather than fail, and the tokens the
    /// cached one replaced stay refused.
    rejected: u64,
    /// The `fetching` flag: the start of the fetch that runs, if one does.
    fetching: Option<Instant>,
    /// Fetches started so far (a fetch abandoned by a dropped caller included).
    fetches_started: u64,
    /// Fetches finished so far (successful or not).
    fetches_done: u64,
    /// The error of the last fetch, with the fetch number it belongs to.
    last_error: Option<(u64, Arc<AuthError>)>,
    /// Callers waiting for the running fetch.
    waiters: Wakers,
}

impl std::fmt::Debug for AuthState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("AuthState")
            .field("generation", &inner.generation)
            .field("has_token", &inner.token.is_some())
            .field("fetching", &inner.fetching.is_some())
            .finish()
    }
}

impl AuthInner {
    /// After a fetch that brought no token: if the cached one is due for renewal,
    /// the next try is due halfway to its expiry (none in its last 2 s), not at the
    /// next call's look, so an identity provider that is down or hangs is not asked
    /// once per call.
    fn back_off_renewal(&mut self, now: Instant) {
        if let Some(cached) = self.token.as_mut()
            && cached.due(now)
            && !cached.expired(now)
        {
            let half_left = cached.expires_at.saturating_duration_since(now) / 2;
            cached.renew_at = Some(if half_left >= RENEW_RETRY_FLOOR {
                now.saturating_add(half_left)
            } else {
                cached.expires_at
            });
        }
    }

    /// The current token, unless a 401 rejected its generation (or it is not newer
    /// than `stale`), or it has expired by `now`.
    fn usable(&self, stale: Option<u64>, now: Instant) -> Option<&Token> {
        let floor = self.rejected.max(stale.unwrap_or(0));
        self.token
            .as_ref()
            .filter(|t| t.generation > floor && !t.expired(now))
    }
}

enum Step {
    Ready(Token),
    Failed(Arc<AuthError>),
    /// This caller fetches, for `reason`; if the fetch fails, `fall_back` hands it
    /// the cached token (if it has not expired) instead of the error.
    Fetch {
        fall_back: bool,
        reason: TokenFetchReason,
    },
    Wait(u64),
}

/// A fetch that ended, as its client's observer hears of it.
pub(crate) struct FetchEnded {
    pub(crate) reason: TokenFetchReason,
    pub(crate) started: Instant,
    pub(crate) ended: Instant,
    pub(crate) outcome: TokenFetchOutcome,
}

/// What a fetch needs of its client: the runtime's clock, read at every look (a
/// look may follow a wait), and where to report each fetch that ends. A plain clock
/// (`Fn() -> Instant`) reports nothing.
pub(crate) trait FetchEnv {
    /// The runtime's clock.
    fn now(&self) -> Instant;

    /// A fetch this caller ran ended (or was abandoned: from a destructor, maybe
    /// while a panic unwinds): called once the state's lock is released, before
    /// the callers that waited for the fetch are woken.
    fn fetched(&self, ended: FetchEnded) {
        let _ = ended;
    }
}

impl<F: Fn() -> Instant> FetchEnv for F {
    fn now(&self) -> Instant {
        self()
    }
}

impl AuthState {
    pub(crate) fn new() -> Self {
        AuthState {
            inner: Mutex::new(AuthInner {
                token: None,
                generation: 0,
                renamed_at: 0,
                rejected: 0,
                fetching: None,
                fetches_started: 0,
                fetches_done: 0,
                last_error: None,
                waiters: Wakers::default(),
            }),
            rejected_now: AtomicU64::new(0),
        }
    }

    /// After a 401 answered generation `stale`: if a newer token has replaced it
    /// (a renewal, `refresh_token`, another 401's refresh), `stale` and every older
    /// generation are refused from now on, so a request still built with one goes
    /// back through the gate instead of drawing another 401. The cached token is
    /// marked only on the way to its refresh (`token`), which a failed fetch takes
    /// back.
    fn refuse_replaced(&self, inner: &mut AuthInner, stale: Option<u64>) {
        if let Some(g) = stale
            && g < inner.generation
            && g > inner.rejected
        {
            self.set_rejected(inner, g);
        }
    }

    /// As a 401 for generation `g` comes in (replayed or final): `g` and older are
    /// refused if a newer token has replaced `g` already
    /// ([`refuse_replaced`](Self::refuse_replaced)). Starts nothing. A replay
    /// that then waits for a fetch looks again as the fetch ends (`token`).
    pub(crate) fn refuse_if_replaced(&self, g: u64) {
        let mut inner = self.lock();
        self.refuse_replaced(&mut inner, Some(g));
    }

    /// Sets `inner.rejected` (`inner` is this state's, locked) and its copy.
    fn set_rejected(&self, inner: &mut AuthInner, rejected: u64) {
        inner.rejected = rejected;
        self.rejected_now.store(rejected, Ordering::Release);
    }

    fn lock(&self) -> MutexGuard<'_, AuthInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Fetches started so far, abandoned ones included (for tests and figures).
    pub(crate) fn fetches(&self) -> u64 {
        self.lock().fetches_started
    }

    /// The start of the fetch that runs now, if one does.
    pub(crate) fn fetch_running_since(&self) -> Option<Instant> {
        self.lock().fetching
    }

    /// The current token if there is one that no 401 rejected (and newer than
    /// `stale` when given) and that has not expired by `now`, without waiting: the
    /// path of every send once a token is cached. `None` too for a token due for
    /// renewal that nobody is renewing: the caller renews it (through
    /// [`token`](Self::token)).
    pub(crate) fn current(&self, stale: Option<u64>, now: Instant) -> Option<Token> {
        let inner = self.lock();
        let token = inner.usable(stale, now)?;
        if token.due(now) && inner.fetching.is_none() {
            return None;
        }
        Some(token.clone())
    }

    /// The current token if no 401 rejected it and it has not expired by `now`, due
    /// for renewal or not (so `Some` whenever [`current`](Self::current)`(None, now)`
    /// is): what a replay takes once its refresh (run or waited for) has ended, as a
    /// caller that waited for a fetch takes what it brought.
    pub(crate) fn current_due_or_not(&self, now: Instant) -> Option<Token> {
        self.lock().usable(None, now).cloned()
    }

    /// A usable token newer than generation `held`, if every token since `held`
    /// came under `held`'s header name: one that can replace `held` in a request
    /// already built (a request cannot drop a header, so a token under another name
    /// would go out beside the old one).
    pub(crate) fn newer_under_same_name(&self, held: u64, now: Instant) -> Option<Token> {
        let inner = self.lock();
        if inner.renamed_at > held {
            return None;
        }
        inner.usable(Some(held), now).cloned()
    }

    /// Whether generation `held` is refused: a 401 rejected it or a newer one, and
    /// either no fetch has failed since or `held` is older than the cached token (a
    /// failed fetch takes back only the cached token's rejection). The gate hands a
    /// token of `held` or older to nobody now, so a request that carries one must
    /// not go out with it either. Takes no lock.
    pub(crate) fn rejected(&self, held: u64) -> bool {
        self.rejected_now.load(Ordering::Acquire) >= held
    }

    /// The current token, fetching it first if there is none (or it has expired),
    /// or a newer one than `stale` (the generation a 401 was answered with) when
    /// given. Concurrent callers share one fetch. A token due for renewal is renewed
    /// by the first caller to look, which waits for the fetch (and falls back to the
    /// token if it fails); the others take the token meanwhile. A fetch this caller
    /// runs is reported to `env` as it ends.
    pub(crate) async fn token<S: TokenSource>(
        &self,
        source: &S,
        stale: Option<u64>,
        env: &impl FetchEnv,
    ) -> Result<Token, Arc<AuthError>> {
        let mut waited_for: Option<u64> = None;
        loop {
            let now = env.now();
            let step = {
                let mut inner = self.lock();
                let shared_failure = waited_for.and_then(|seen| {
                    inner
                        .last_error
                        .as_ref()
                        .filter(|(n, _)| *n > seen)
                        .map(|(_, e)| Arc::clone(e))
                });
                self.refuse_replaced(&mut inner, stale);
                let ready = inner.usable(stale, now).cloned();
                if let Some(token) = ready {
                    // Due for renewal, and nobody renewing it: this caller does, and
                    // keeps the token it could have sent if that fails (a caller that
                    // waited for a fetch already takes what it brought).
                    if token.due(now) && inner.fetching.is_none() && waited_for.is_none() {
                        inner.fetching = Some(now);
                        inner.fetches_started += 1;
                        Step::Fetch {
                            fall_back: true,
                            reason: TokenFetchReason::Renewal,
                        }
                    } else {
                        Step::Ready(token)
                    }
                } else if let Some(error) = shared_failure {
                    // The fetch we waited for failed: do not fetch again. A call that
                    // only needs a token sends the cached one, unless it has expired;
                    // a replay shares the error.
                    match (stale, &inner.token) {
                        // Another 401 started a new refresh meanwhile: wait for it.
                        (None, Some(_)) if inner.fetching.is_some() => {
                            Step::Wait(inner.fetches_done)
                        }
                        (None, Some(cached)) if !cached.expired(now) => Step::Ready(cached.clone()),
                        _ => Step::Failed(error),
                    }
                } else {
                    // About to wait for a refresh or start one: the generation this
                    // 401 answered is rejected until the refresh ends.
                    if let Some(g) = stale {
                        let rejected = inner.rejected.max(g);
                        self.set_rejected(&mut inner, rejected);
                    }
                    if inner.fetching.is_some() {
                        Step::Wait(inner.fetches_done)
                    } else {
                        inner.fetching = Some(now);
                        inner.fetches_started += 1;
                        // No usable token: none yet, one a 401 refused (this
                        // call's, or another's whose refresh was abandoned), or,
                        // newer than that, an expired one.
                        let floor = inner.rejected.max(stale.unwrap_or(0));
                        let reason = match &inner.token {
                            None => TokenFetchReason::First,
                            Some(cached) if cached.generation <= floor => {
                                TokenFetchReason::Rejected
                            }
                            Some(_) => TokenFetchReason::Expired,
                        };
                        // As for a waiter: a call that only needs a token falls back
                        // to the cached one (decided under the lock that ends the
                        // fetch).
                        Step::Fetch {
                            fall_back: stale.is_none(),
                            reason,
                        }
                    }
                }
            };
            match step {
                Step::Ready(t) => return Ok(t),
                Step::Failed(e) => return Err(e),
                Step::Wait(seen) => {
                    waited_for = Some(seen);
                    self.wait_for_fetch(seen).await;
                }
                Step::Fetch { fall_back, reason } => {
                    return self.run_fetch(source, fall_back, reason, now, env).await;
                }
            }
        }
    }

    /// Fetches a newer token now, whatever the cached one, or joins the fetch that
    /// is running: the cached token stays in use meanwhile (nothing is rejected).
    /// `Ok` once a token newer than the one in use when it was asked for has landed;
    /// otherwise the error of the fetch it ran or waited for (the cached token
    /// stays, as after a failed refresh a 401 asked for).
    pub(crate) async fn refresh<S: TokenSource>(
        &self,
        source: &S,
        env: &impl FetchEnv,
    ) -> Result<(), Arc<AuthError>> {
        // The generation of the token in use when the refresh was asked for.
        let asked_at = self.lock().generation;
        let mut waited_for: Option<u64> = None;
        loop {
            // Read before the lock: a fetch this caller starts starts now.
            let now = env.now();
            // The fetch to wait for (by the number of fetches done when it ran), or
            // `None`: this caller fetches.
            let wait = {
                let mut inner = self.lock();
                match waited_for {
                    // The fetch waited for ended (others may have ended too before
                    // this caller looked): done if a newer token than the one in use
                    // at the start has landed, else that fetch failed.
                    Some(seen) if inner.fetches_done > seen => {
                        return match &inner.last_error {
                            Some((_, e)) if inner.generation == asked_at => Err(Arc::clone(e)),
                            _ => Ok(()),
                        };
                    }
                    _ if inner.fetching.is_some() => Some(inner.fetches_done),
                    // None runs, or the one waited for was abandoned: start one.
                    _ => {
                        inner.fetching = Some(now);
                        inner.fetches_started += 1;
                        None
                    }
                }
            };
            match wait {
                Some(seen) => {
                    waited_for = Some(seen);
                    self.wait_for_fetch(seen).await;
                }
                None => {
                    return self
                        .run_fetch(source, false, TokenFetchReason::Requested, now, env)
                        .await
                        .map(|_| ());
                }
            }
        }
    }

    /// Waits until the fetch that runs while `seen` fetches are done ends, or is
    /// abandoned.
    fn wait_for_fetch(&self, seen: u64) -> WaitForFetch<'_> {
        WaitForFetch {
            state: self,
            seen,
            key: None,
        }
    }

    /// Runs the fetch (for `reason`, starting at `started`, read before this caller
    /// set the `fetching` flag) under a guard that hands it over if the caller is
    /// dropped; on failure, `fall_back` hands out the cached token instead of the
    /// error, if there is one and it has not expired. A token's lifetime counts
    /// from the fetch's start. Nothing runs between the flag and the guard.
    async fn run_fetch<S: TokenSource, E: FetchEnv>(
        &self,
        source: &S,
        fall_back: bool,
        reason: TokenFetchReason,
        started: Instant,
        env: &E,
    ) -> Result<Token, Arc<AuthError>> {
        let guard = FetchGuard {
            state: self,
            env,
            reason,
            started,
            armed: true,
        };
        let result = source.fetch().await;
        guard.complete(result, fall_back)
    }
}

/// Clears the `fetching` flag if the fetching caller is dropped, reports the fetch
/// abandoned (or unwound by a panic), and wakes the waiters so one of them takes
/// over. `env` is the client's.
struct FetchGuard<'a, E: FetchEnv> {
    state: &'a AuthState,
    env: &'a E,
    /// Why the fetch runs, and when it started.
    reason: TokenFetchReason,
    started: Instant,
    armed: bool,
}

impl<E: FetchEnv> FetchGuard<'_, E> {
    /// Reports the fetch's end with `outcome` at `now`, then wakes `waiters` (woken
    /// all the same if the observer panics).
    fn report(&self, now: Instant, outcome: TokenFetchOutcome, waiters: ToWake) {
        let waiters = waiters.on_drop();
        self.env.fetched(FetchEnded {
            reason: self.reason,
            started: self.started,
            ended: now,
            outcome,
        });
        drop(waiters);
    }

    /// Ends the fetch, and reports it. On failure, `fall_back` hands out the
    /// cached token instead of the error, if there is one and it has not expired.
    fn complete(
        mut self,
        result: Result<AuthToken, AuthError>,
        fall_back: bool,
    ) -> Result<Token, Arc<AuthError>> {
        // The clock before the guard lets go: if it panics, the guard's drop still
        // clears the flag and wakes the waiters.
        let now = self.env.now();
        self.armed = false;
        let started = self.started;
        let (outcome, fetched, waiters, replaced) = {
            let mut inner = self.state.lock();
            inner.fetching = None;
            inner.fetches_done += 1;
            // A lifetime that ran out before the fetch ended (zero, or shorter than
            // the fetch took) gives a token nobody may send: a failed fetch.
            let expires_at = |lifetime: Option<Duration>| {
                lifetime.map_or(Instant::FAR_FUTURE, |lifetime| {
                    started.saturating_add(lifetime)
                })
            };
            let result = result.and_then(checked).and_then(|token| {
                if expired(expires_at(token.lifetime), now) {
                    return Err(AuthError::from(
                        "the token source's token expired before its fetch ended (its \
                         lifetime is shorter than the fetch took)",
                    ));
                }
                Ok(token)
            });
            let mut replaced = None;
            let (outcome, fetched) = match result {
                Ok(fetched_token) => {
                    let margin = fetched_token.renewal_margin();
                    let AuthToken {
                        name,
                        mut value,
                        lifetime,
                        ..
                    } = fetched_token;
                    value.set_sensitive(true);
                    inner.generation += 1;
                    if inner.token.as_ref().is_some_and(|old| old.name != name) {
                        inner.renamed_at = inner.generation;
                    }
                    let token = Token {
                        name,
                        value,
                        generation: inner.generation,
                        renew_at: lifetime
                            .map(|lifetime| started.saturating_add(lifetime - margin)),
                        expires_at: expires_at(lifetime),
                    };
                    inner.token = Some(token.clone());
                    let fetched = TokenFetchOutcome::Fetched {
                        generation: inner.generation,
                        lifetime,
                    };
                    (Ok(token), fetched)
                }
                Err(e) => {
                    let e = Arc::new(e);
                    let this_fetch = inner.fetches_done;
                    replaced = inner.last_error.replace((this_fetch, Arc::clone(&e)));
                    // No newer token: a call that just needs one sends the cached one
                    // (it may be answered 401 again; its replay then asks again). Only
                    // the cached token is taken back into use: one it replaced stays
                    // refused if a 401 refused it, whatever this fetch was for (a
                    // renewal or `refresh_token` failing after a 401's refresh had
                    // succeeded let a request built with the old token go out).
                    let kept = inner.rejected.min(inner.generation.saturating_sub(1));
                    self.state.set_rejected(&mut inner, kept);
                    inner.back_off_renewal(now);
                    let outcome = match &inner.token {
                        Some(cached) if fall_back && !cached.expired(now) => Ok(cached.clone()),
                        _ => Err(Arc::clone(&e)),
                    };
                    (
                        outcome,
                        TokenFetchOutcome::Failed {
                            error: SharedAuthError(e),
                        },
                    )
                }
            };
            (outcome, fetched, inner.waiters.take(), replaced)
        };
        self.report(now, fetched, waiters);
        // The error it replaced is the token source's own type: its drop runs
        // outside the lock, and after the waiters are woken (a drop that panics
        // leaves none asleep).
        drop(replaced);
        outcome
    }
}

impl<E: FetchEnv> Drop for FetchGuard<'_, E> {
    fn drop(&mut self) {
        if self.armed {
            let panicking = std::thread::panicking();
            // A clock that panics here (or did in `complete`, which this drop then
            // unwinds from) must leave neither the flag set nor the waiters asleep:
            // its panic is caught, the fetch's start stands in for the reading, and
            // the panic goes on once the state is put right (unless one already
            // unwinds: a second one out of a destructor would abort the process).
            let now = std::panic::catch_unwind(AssertUnwindSafe(|| self.env.now()));
            let waiters = {
                let mut inner = self.state.lock();
                inner.fetching = None;
                // An abandoned renewal (its caller's budget ended, or it was dropped)
                // backs off as a failed one does: a provider that hangs is not asked
                // again by every call that looks.
                inner.back_off_renewal(*now.as_ref().unwrap_or(&self.started));
                inner.waiters.take()
            };
            let outcome = if panicking || now.is_err() {
                TokenFetchOutcome::Panicked
            } else {
                TokenFetchOutcome::Abandoned
            };
            match now {
                Ok(now) => self.report(now, outcome, waiters),
                Err(clock_panic) => {
                    self.report(self.started, outcome, waiters);
                    if !panicking {
                        std::panic::resume_unwind(clock_panic);
                    }
                }
            }
        }
    }
}

/// Waits until the fetch running when it was created ends (or is abandoned).
/// Dropped while it waits, it takes its waker back out of the list, so callers that
/// give up on a fetch that never ends leave nothing behind.
struct WaitForFetch<'a> {
    state: &'a AuthState,
    seen: u64,
    /// Its key in `waiters`, once it registered.
    key: Option<u64>,
}

impl Future for WaitForFetch<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let state = self.state;
        let mut inner = state.lock();
        if inner.fetching.is_none() || inner.fetches_done != self.seen {
            return Poll::Ready(());
        }
        // A replaced waker is dropped after the lock: its drop may be the last of a
        // task whose own waiter then takes the lock.
        let replaced = inner.waiters.register(&mut self.key, cx.waker());
        drop(inner);
        drop(replaced);
        Poll::Pending
    }
}

impl Drop for WaitForFetch<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            let mut inner = self.state.lock();
            // Gone already if the fetch ended and woke everyone. Dropped after the
            // lock, as in `poll`.
            let removed = inner.waiters.remove(key);
            drop(inner);
            drop(removed);
        }
    }
}

/// A token source's error shared by every caller that waited on the same fetch; the
/// source of an [`ErrorKind::Auth`](crate::ErrorKind::Auth) client error.
///
/// It shows the token source's message; its `source()` is that error's own source,
/// so a chain printer does not show the message twice. To reach the token source's
/// error itself (say, to tell revoked credentials from an identity provider that is
/// down), downcast [`as_error`](SharedAuthError::as_error):
///
/// ```
/// use std::error::Error;
/// use vantage_api_pool::auth::SharedAuthError;
/// use vantage_api_pool::ClientError;
///
/// #[derive(Debug)]
/// struct Revoked;
/// impl std::fmt::Display for Revoked {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         f.write_str("credentials revoked")
///     }
/// }
/// impl Error for Revoked {}
///
/// fn revoked(error: &ClientError) -> bool {
///     error
///         .source()
///         .and_then(|s| s.downcast_ref::<SharedAuthError>())
///         .is_some_and(|shared| shared.as_error().is::<Revoked>())
/// }
/// ```
///
/// Its `Debug` shows none of the token source's text (as a `ClientError`'s shows
/// none of its source), so an event or a health snapshot printed with `{:?}`
/// carries none; its `Display` is the source's text.
#[derive(Clone)]
pub struct SharedAuthError(pub(crate) Arc<AuthError>);

impl std::fmt::Debug for SharedAuthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedAuthError").finish_non_exhaustive()
    }
}

impl SharedAuthError {
    /// The error the token source gave (downcast it to the token source's own type).
    #[must_use]
    pub fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self.0.as_error()
    }
}

impl From<AuthError> for SharedAuthError {
    /// The error shared, as a fetch's error is: for an observer fed by hand (a
    /// failed [`TokenFetchEnded`](crate::EventKind::TokenFetchEnded)).
    ///
    /// ```
    /// use vantage_api_pool::auth::{AuthError, SharedAuthError};
    ///
    /// let shared = SharedAuthError::from(AuthError::from("identity provider down"));
    /// assert_eq!(shared.to_string(), "identity provider down");
    /// ```
    fn from(error: AuthError) -> Self {
        SharedAuthError(Arc::new(error))
    }
}

impl std::fmt::Display for SharedAuthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for SharedAuthError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.as_error().source()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::channel::oneshot;
    use std::collections::VecDeque;
    use std::future::Future;
    use std::task::{Context, Poll};

    type Answer = Result<(HeaderName, HeaderValue), String>;

    /// The clock of these tests, which never move it.
    fn origin() -> Instant {
        Instant::ORIGIN
    }

    /// A token source whose fetches end when the test says so, in order.
    #[derive(Default)]
    struct Controlled {
        pending: std::sync::Mutex<VecDeque<oneshot::Receiver<Answer>>>,
    }

    impl Controlled {
        /// Queues the next fetch; answering on the returned sender ends it.
        fn next_fetch(&self) -> oneshot::Sender<Answer> {
            let (tx, rx) = oneshot::channel();
            self.pending.lock().unwrap().push_back(rx);
            tx
        }
    }

    impl TokenSource for Controlled {
        fn fetch(&self) -> impl Future<Output = Result<AuthToken, AuthError>> {
            let rx = self
                .pending
                .lock()
                .unwrap()
                .pop_front()
                .expect("a fetch was queued");
            async move {
                match rx.await.expect("answered") {
                    Ok(token) => Ok(token.into()),
                    Err(e) => Err(AuthError::from(e)),
                }
            }
        }
    }

    fn token(value: &'static str) -> Answer {
        Ok((http::header::AUTHORIZATION, HeaderValue::from_static(value)))
    }

    /// Polls `future` once with a waker that does nothing.
    fn poll<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
        let waker = futures::task::noop_waker();
        Pin::new(future).poll(&mut Context::from_waker(&waker))
    }

    fn generation(poll: Poll<Result<Token, Arc<AuthError>>>) -> Option<u64> {
        match poll {
            Poll::Ready(Ok(token)) => Some(token.generation),
            Poll::Ready(Err(_)) => Some(0),
            Poll::Pending => None,
        }
    }

    #[test]
    fn debug_shows_the_settings_and_never_a_token_value() {
        let token = AuthToken::bearer("s3cret")
            .unwrap()
            .expires_in(Duration::from_secs(90))
            .renew_ahead(Duration::from_secs(5));
        assert_eq!(token.lifetime(), Some(Duration::from_secs(90)));
        assert_eq!(
            format!("{token:?}"),
            "AuthToken { name: \"authorization\", lifetime: Some(90s), renew_ahead: 5s, .. }"
        );
        assert_eq!(AuthToken::bearer("s3cret").unwrap().lifetime(), None);
        assert_eq!(
            format!("{:?}", AuthError::from("provider down")),
            "\"provider down\""
        );
        let fetch = || async { AuthToken::bearer("s3cret") };
        assert_eq!(format!("{:?}", token_fn(fetch)), "TokenFn");
        assert_eq!(format!("{:?}", send_token_fn(fetch)), "SendTokenFn");
        let state = AuthState::new();
        assert_eq!(
            format!("{state:?}"),
            "AuthState { generation: 0, has_token: false, fetching: false }"
        );
        let got = futures::executor::block_on(state.token(&token_fn(fetch), None, &origin));
        assert!(got.is_ok());
        assert_eq!(
            format!("{state:?}"),
            "AuthState { generation: 1, has_token: true, fetching: false }"
        );
        assert!(!format!("{state:?}").contains("s3cret"));
    }

    #[test]
    fn a_waker_whose_drop_reaches_back_into_the_auth_state_is_dropped_after_the_lock() {
        use crate::sync::test_support::{waker_dropping, without_deadlock};
        // A waiter's stored waker may be the last of a task that holds another
        // waiter, whose drop takes the state's lock: replaced by a poll, or removed
        // when its waiter gives up.
        without_deadlock(|| {
            let state: &'static AuthState = Box::leak(Box::new(AuthState::new()));
            let source: &'static Controlled = Box::leak(Box::default());
            let _never_answered = source.next_fetch();
            let mut fetching = Box::pin(state.token(source, None, &origin));
            assert_eq!(generation(poll(&mut fetching)), None);
            let waiting = || {
                let mut waiter = Box::pin(state.token(source, None, &origin));
                assert_eq!(generation(poll(&mut waiter)), None);
                waiter
            };
            let waiters = || state.lock().waiters.len();
            let mut a = waiting();
            // Polled with a waker that holds another waiter, whose last reference the
            // state then keeps.
            let another = || waker_dropping(waiting());
            // Replaced by a poll with another waker.
            assert!(
                a.as_mut()
                    .poll(&mut Context::from_waker(&another()))
                    .is_pending()
            );
            assert_eq!(waiters(), 2);
            assert_eq!(generation(poll(&mut a)), None);
            assert_eq!(waiters(), 1);
            // Removed when A gives up.
            assert!(
                a.as_mut()
                    .poll(&mut Context::from_waker(&another()))
                    .is_pending()
            );
            assert_eq!(waiters(), 2);
            drop(a);
            assert_eq!(waiters(), 0);
            drop(fetching);
        });
    }

    /// Polls `future` once with `waker`.
    fn poll_with<F: Future + Unpin>(future: &mut F, waker: &std::task::Waker) -> Poll<F::Output> {
        Pin::new(future).poll(&mut Context::from_waker(waker))
    }

    /// A clock that panics at its `from`-th reading and every one after it
    /// (`until` = `from`: that one only).
    fn breaking_clock(from: u32, until: u32) -> impl Fn() -> Instant {
        let reads = std::cell::Cell::new(0);
        move || {
            reads.set(reads.get() + 1);
            assert!(!(from..=until).contains(&reads.get()), "the clock broke");
            Instant::ORIGIN
        }
    }

    #[test]
    fn a_clock_that_panics_as_a_fetch_ends_leaves_no_fetch_running() {
        // Its first reading starts the fetch; the second, as the fetch ends, panics,
        // and so does the third, in the guard's drop as that panic unwinds: the
        // process goes on, and the waiter takes over.
        let (state, source) = (AuthState::new(), Controlled::default());
        let clock = breaking_clock(2, u32::MAX);
        let answer = source.next_fetch();
        let mut fetching = Box::pin(state.token(&source, None, &clock));
        assert_eq!(generation(poll(&mut fetching)), None);
        let mut waiter = Box::pin(state.token(&source, None, &origin));
        let (waker, woken) = crate::sync::test_support::counting_waker(false);
        assert_eq!(generation(poll_with(&mut waiter, &waker)), None);
        answer.send(token("Bearer t1")).unwrap();
        let unwound = std::panic::catch_unwind(AssertUnwindSafe(|| poll(&mut fetching)));
        assert!(unwound.is_err());
        assert_eq!(woken.load(std::sync::atomic::Ordering::SeqCst), 1, "woken");
        source.next_fetch().send(token("Bearer t2")).unwrap();
        assert_eq!(generation(poll(&mut waiter)), Some(1));
        assert_eq!(state.fetches(), 2);
    }

    #[test]
    fn a_clock_that_panics_as_a_fetch_is_abandoned_leaves_no_fetch_running() {
        // The caller drops its fetch, and the clock's reading in the guard's drop
        // panics: the panic reaches the caller, once the flag is cleared.
        let (state, source) = (AuthState::new(), Controlled::default());
        let clock = breaking_clock(2, 2);
        let _never_answered = source.next_fetch();
        let mut fetching = Box::pin(state.token(&source, None, &clock));
        assert_eq!(generation(poll(&mut fetching)), None);
        let mut waiter = Box::pin(state.token(&source, None, &origin));
        let (waker, woken) = crate::sync::test_support::counting_waker(false);
        assert_eq!(generation(poll_with(&mut waiter, &waker)), None);
        let unwound = std::panic::catch_unwind(AssertUnwindSafe(|| drop(fetching)));
        assert!(unwound.is_err(), "the clock's panic goes on to the caller");
        assert_eq!(woken.load(std::sync::atomic::Ordering::SeqCst), 1, "woken");
        source.next_fetch().send(token("Bearer t1")).unwrap();
        assert_eq!(generation(poll(&mut waiter)), Some(1));
        assert_eq!(state.fetches(), 2);
    }

    #[test]
    fn a_failed_fetch_drops_the_error_it_replaces_outside_the_lock() {
        use crate::sync::test_support::without_deadlock;
        /// A token source's error whose drop reads the auth state.
        #[derive(Debug)]
        struct LooksBack(&'static AuthState);
        impl std::fmt::Display for LooksBack {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("identity provider down")
            }
        }
        impl std::error::Error for LooksBack {}
        impl Drop for LooksBack {
            fn drop(&mut self) {
                let _ = self.0.fetches();
            }
        }
        struct Failing(&'static AuthState);
        impl TokenSource for Failing {
            fn fetch(&self) -> impl Future<Output = Result<AuthToken, AuthError>> {
                std::future::ready(Err(AuthError::from(LooksBack(self.0))))
            }
        }
        without_deadlock(|| {
            let state: &'static AuthState = Box::leak(Box::new(AuthState::new()));
            let source = Failing(state);
            for _ in 0..2 {
                let failed = futures::executor::block_on(state.token(&source, None, &origin));
                assert!(failed.is_err());
            }
            assert_eq!(state.fetches(), 2);
        });
    }

    #[test]
    fn a_caller_whose_refresh_failed_waits_for_a_newer_refresh_of_the_same_token() {
        let (state, source) = (AuthState::new(), Controlled::default());
        source.next_fetch().send(token("Bearer t1")).unwrap();
        let first = futures::executor::block_on(state.token(&source, None, &origin)).unwrap();
        assert_eq!(first.generation, 1);
        // A's 401 for t1 starts refresh F1; C, a new call, waits for it.
        let f1 = source.next_fetch();
        let mut a = Box::pin(state.token(&source, Some(1), &origin));
        let mut c = Box::pin(state.token(&source, None, &origin));
        assert_eq!(generation(poll(&mut a)), None);
        assert_eq!(generation(poll(&mut c)), None);
        // F1 fails: A shares the failure. Before C runs again, D's 401 for t1
        // starts refresh F2.
        f1.send(Err("identity provider down".into())).unwrap();
        assert_eq!(generation(poll(&mut a)), Some(0), "A fails");
        let f2 = source.next_fetch();
        let mut d = Box::pin(state.token(&source, Some(1), &origin));
        assert_eq!(generation(poll(&mut d)), None);
        // C must not be handed t1 while F2 runs: it waits, then gets t2.
        assert_eq!(generation(poll(&mut c)), None, "t1 handed out during F2");
        f2.send(token("Bearer t2")).unwrap();
        assert_eq!(generation(poll(&mut d)), Some(2));
        assert_eq!(generation(poll(&mut c)), Some(2));
        assert_eq!(state.fetches(), 3);
    }

    #[test]
    fn a_call_that_only_needs_a_token_falls_back_when_its_own_refresh_fails() {
        let (state, source) = (AuthState::new(), Controlled::default());
        source.next_fetch().send(token("Bearer t1")).unwrap();
        futures::executor::block_on(state.token(&source, None, &origin)).unwrap();
        // A replay for t1 waits on a refresh that the test lets fail; meanwhile a
        // new call finds t1 rejected and waits too. Both are woken by the failure:
        // the replay fails, the new call sends t1.
        let f1 = source.next_fetch();
        let mut replay = Box::pin(state.token(&source, Some(1), &origin));
        assert_eq!(generation(poll(&mut replay)), None);
        let mut fresh = Box::pin(state.token(&source, None, &origin));
        assert_eq!(generation(poll(&mut fresh)), None);
        f1.send(Err("down".into())).unwrap();
        assert_eq!(generation(poll(&mut replay)), Some(0));
        assert_eq!(generation(poll(&mut fresh)), Some(1));
        // A fetch for a new call (t1 rejected again) that fails hands out t1 too.
        let f2 = source.next_fetch();
        let mut second_replay = Box::pin(state.token(&source, Some(1), &origin));
        assert_eq!(generation(poll(&mut second_replay)), None);
        drop(second_replay); // abandons F2's fetch: the flag is cleared
        let mut fetcher = Box::pin(state.token(&source, None, &origin));
        // t1 is still rejected (the abandoned refresh did not end it): fetch F3.
        let f3 = source.next_fetch();
        assert_eq!(generation(poll(&mut fetcher)), None);
        drop(f2);
        f3.send(Err("down".into())).unwrap();
        assert_eq!(generation(poll(&mut fetcher)), Some(1));
    }

    /// A new call that waited on a refresh which failed sends the cached token,
    /// even when a later refresh, abandoned before the call ran again, left that
    /// token rejected: it does not fetch again, nor fail with the error it shares.
    #[test]
    fn a_waiter_whose_refresh_failed_sends_the_cached_token_after_an_abandoned_refresh() {
        let (state, source) = (AuthState::new(), Controlled::default());
        source.next_fetch().send(token("Bearer t1")).unwrap();
        futures::executor::block_on(state.token(&source, None, &origin)).unwrap();
        // A's 401 for t1 starts F1; C, a new call, waits for it.
        let f1 = source.next_fetch();
        let mut a = Box::pin(state.token(&source, Some(1), &origin));
        assert_eq!(generation(poll(&mut a)), None);
        let mut c = Box::pin(state.token(&source, None, &origin));
        assert_eq!(generation(poll(&mut c)), None);
        // F1 fails. Before C runs again, D's 401 for t1 starts F2 and D is dropped:
        // t1 stays rejected and no refresh runs.
        f1.send(Err("identity provider down".into())).unwrap();
        assert_eq!(generation(poll(&mut a)), Some(0), "A shares the failure");
        let _f2 = source.next_fetch();
        let mut d = Box::pin(state.token(&source, Some(1), &origin));
        assert_eq!(generation(poll(&mut d)), None);
        drop(d);
        assert!(
            state.current(None, Instant::ORIGIN).is_none(),
            "t1 is still rejected"
        );
        assert_eq!(generation(poll(&mut c)), Some(1), "C sends the cached t1");
        assert_eq!(state.fetches(), 3, "C started no fetch of its own");
    }

    /// A caller that waited on a fetch which was abandoned takes it over; the error
    /// of an earlier, unrelated fetch is not shared with it.
    #[test]
    fn a_waiter_on_an_abandoned_fetch_takes_over_instead_of_sharing_an_older_error() {
        let (state, source) = (AuthState::new(), Controlled::default());
        source.next_fetch().send(token("Bearer t1")).unwrap();
        futures::executor::block_on(state.token(&source, None, &origin)).unwrap();
        // Refresh F2 for t1 fails.
        source.next_fetch().send(Err("down".into())).unwrap();
        let failed = futures::executor::block_on(state.token(&source, Some(1), &origin));
        assert!(failed.is_err());
        // Y's 401 for t1 starts F3; R's 401 for t1 waits on it; Y is dropped.
        let _f3 = source.next_fetch();
        let mut y = Box::pin(state.token(&source, Some(1), &origin));
        assert_eq!(generation(poll(&mut y)), None);
        let mut r = Box::pin(state.token(&source, Some(1), &origin));
        assert_eq!(generation(poll(&mut r)), None);
        let f4 = source.next_fetch();
        drop(y);
        // R takes over with F4, rather than failing with F2's old error.
        assert_eq!(generation(poll(&mut r)), None, "R shared a stale error");
        f4.send(token("Bearer t2")).unwrap();
        assert_eq!(generation(poll(&mut r)), Some(2));
        assert_eq!(state.fetches(), 4);
    }

    /// A replay that waited on a refresh which failed shares that failure, even if
    /// another refresh started before it was polled again.
    #[test]
    fn a_replay_shares_the_failure_of_the_refresh_it_waited_for() {
        let (state, source) = (AuthState::new(), Controlled::default());
        source.next_fetch().send(token("Bearer t1")).unwrap();
        futures::executor::block_on(state.token(&source, None, &origin)).unwrap();
        let f2 = source.next_fetch();
        let mut x = Box::pin(state.token(&source, Some(1), &origin));
        assert_eq!(generation(poll(&mut x)), None);
        let mut r = Box::pin(state.token(&source, Some(1), &origin));
        assert_eq!(generation(poll(&mut r)), None);
        f2.send(Err("down".into())).unwrap();
        assert_eq!(generation(poll(&mut x)), Some(0));
        let _f3 = source.next_fetch();
        let mut d = Box::pin(state.token(&source, Some(1), &origin));
        assert_eq!(generation(poll(&mut d)), None);
        assert_eq!(
            generation(poll(&mut r)),
            Some(0),
            "R must share F2's failure"
        );
    }

    #[test]
    fn an_empty_or_blank_bearer_token_is_refused() {
        for blank in ["", " ", "\t \t"] {
            let err = AuthToken::bearer(blank).unwrap_err();
            assert_eq!(err.to_string(), "the bearer token is empty", "{blank:?}");
        }
        let err = AuthToken::bearer("a\nb").unwrap_err();
        assert_eq!(
            err.to_string(),
            "the bearer token holds a character a header cannot"
        );
        let token = AuthToken::bearer(" t1").unwrap();
        assert_eq!(token.value(), "Bearer  t1");
    }

    /// A shared fetch error reads as the token source's error: its text, and that
    /// error's own source as its source.
    #[test]
    fn a_shared_auth_error_gives_the_source_of_the_sources_error() {
        #[derive(Debug)]
        struct Refused(std::io::Error);
        impl std::fmt::Display for Refused {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("token endpoint refused")
            }
        }
        impl std::error::Error for Refused {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let cause = std::io::Error::other("connection reset");
        let shared = SharedAuthError::from(AuthError::from(Refused(cause)));
        assert_eq!(shared.to_string(), "token endpoint refused");
        let source = std::error::Error::source(&shared).map(ToString::to_string);
        assert_eq!(source.as_deref(), Some("connection reset"));
    }

    /// A refresh that joined a fetch whose caller was then dropped takes that fetch
    /// over when woken: it fetches and lands a newer token, rather than taking the
    /// wake for the end of a fetch that never ended.
    #[test]
    fn a_refresh_that_joined_an_abandoned_fetch_takes_it_over() {
        let (state, source) = (AuthState::new(), Controlled::default());
        source.next_fetch().send(token("Bearer t1")).unwrap();
        futures::executor::block_on(state.token(&source, None, &origin)).unwrap();
        // A 401 for t1 starts F2 and a refresh joins it; then the replay is dropped.
        let _f2 = source.next_fetch();
        let mut replay = Box::pin(state.token(&source, Some(1), &origin));
        assert_eq!(generation(poll(&mut replay)), None);
        let mut refresh = Box::pin(state.refresh(&source, &origin));
        assert!(poll(&mut refresh).is_pending());
        drop(replay);
        let f3 = source.next_fetch();
        assert!(
            poll(&mut refresh).is_pending(),
            "the refresh returned without fetching"
        );
        f3.send(token("Bearer t2")).unwrap();
        assert!(matches!(poll(&mut refresh), Poll::Ready(Ok(()))));
        assert_eq!(state.fetches(), 3);
        let current = state.current(None, Instant::ORIGIN);
        assert_eq!(current.map(|t| t.generation), Some(2));
    }

    /// A refresh that joined a fetch returns that fetch's error when it fails (the
    /// token in use stays), and `Ok` when the fetch lands a newer token.
    #[test]
    fn a_refresh_that_joined_a_fetch_ends_as_that_fetch_did() {
        let (state, source) = (AuthState::new(), Controlled::default());
        source.next_fetch().send(token("Bearer t1")).unwrap();
        futures::executor::block_on(state.token(&source, None, &origin)).unwrap();
        for (answer, landed) in [
            (Err("down".to_owned()), None),
            (token("Bearer t2"), Some(2)),
        ] {
            let fetch = source.next_fetch();
            let mut replay = Box::pin(state.token(&source, Some(1), &origin));
            assert_eq!(generation(poll(&mut replay)), None);
            let mut refresh = Box::pin(state.refresh(&source, &origin));
            assert!(poll(&mut refresh).is_pending());
            fetch.send(answer).unwrap();
            assert_eq!(generation(poll(&mut replay)), landed.or(Some(0)));
            match poll(&mut refresh) {
                Poll::Ready(Err(e)) => assert_eq!((e.to_string(), landed), ("down".into(), None)),
                Poll::Ready(Ok(())) => assert_eq!(landed, Some(2)),
                Poll::Pending => panic!("the refresh still waits"),
            }
        }
        assert_eq!(state.fetches(), 3);
    }

    /// A late 401 for an older generation does not lower the rejection floor: the
    /// token whose refresh is running is still not handed out.
    #[test]
    fn a_late_401_for_an_older_token_does_not_unreject_the_current_one() {
        let (state, source) = (AuthState::new(), Controlled::default());
        source.next_fetch().send(token("Bearer t1")).unwrap();
        futures::executor::block_on(state.token(&source, None, &origin)).unwrap();
        source.next_fetch().send(token("Bearer t2")).unwrap();
        let t2 = futures::executor::block_on(state.token(&source, Some(1), &origin)).unwrap();
        assert_eq!(t2.generation, 2);
        // Y's 401 for t2 starts F3.
        let f3 = source.next_fetch();
        let mut y = Box::pin(state.token(&source, Some(2), &origin));
        assert_eq!(generation(poll(&mut y)), None);
        // Z's 401 arrives late for t1: it waits too.
        let mut z = Box::pin(state.token(&source, Some(1), &origin));
        assert_eq!(generation(poll(&mut z)), None);
        // A new call must not get the rejected t2 while F3 runs.
        let mut n = Box::pin(state.token(&source, None, &origin));
        assert_eq!(
            generation(poll(&mut n)),
            None,
            "t2 handed out during its refresh"
        );
        assert!(state.current(None, Instant::ORIGIN).is_none());
        f3.send(token("Bearer t3")).unwrap();
        assert_eq!(generation(poll(&mut y)), Some(3));
        assert_eq!(generation(poll(&mut z)), Some(3));
        assert_eq!(generation(poll(&mut n)), Some(3));
    }

    #[test]
    fn a_token_first_under_a_new_name_can_be_replaced_by_a_newer_one_of_that_name() {
        use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
        /// t1 under `authorization`, then t2, t3, ... under `x-api-key`.
        struct Renaming(AtomicU32);
        impl TokenSource for Renaming {
            fn fetch(&self) -> impl Future<Output = Result<AuthToken, AuthError>> {
                let n = self.0.fetch_add(1, SeqCst) + 1;
                let name = if n == 1 {
                    http::header::AUTHORIZATION
                } else {
                    HeaderName::from_static("x-api-key")
                };
                let value = HeaderValue::from_str(&format!("t{n}")).unwrap();
                std::future::ready(Ok(AuthToken::new(name, value)))
            }
        }
        let state = AuthState::new();
        let source = Renaming(AtomicU32::new(0));
        let block = futures::executor::block_on;
        assert_eq!(
            block(state.token(&source, None, &origin))
                .unwrap()
                .generation,
            1
        );
        // A 401 for t1 brings t2 under a new name (renamed at generation 2).
        assert_eq!(
            block(state.token(&source, Some(1), &origin))
                .unwrap()
                .generation,
            2
        );
        // A request built with t2 waits; a 401 elsewhere brings t3, same name as t2.
        assert_eq!(
            block(state.token(&source, Some(2), &origin))
                .unwrap()
                .generation,
            3
        );
        let newer = state
            .newer_under_same_name(2, Instant::ORIGIN)
            .expect("t3 can replace t2");
        assert_eq!(newer.generation, 3);
        // A request built with t1 cannot take it (it would carry both headers).
        assert!(state.newer_under_same_name(1, Instant::ORIGIN).is_none());
    }
}
