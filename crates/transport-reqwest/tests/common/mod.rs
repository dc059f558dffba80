//! A fault server on 127.0.0.1 and helpers shared by the real-socket tests.
//!
//! Every server is started by its test and stops when dropped: its accept task is
//! aborted, which drops the listener and the `JoinSet` holding every connection task.
#![allow(dead_code)] // each test binary uses its own part of this module

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use vantage_api_pool::{
    CallPolicy, ClientError, ErrorKind, EventKind, Jitter, ResilientClient, RetryPolicy,
    TokenFetchOutcome, TransportErrorKind,
};
use vantage_api_pool_reqwest::ReqwestTransport;
use vantage_api_pool_testkit::RecordingObserver;
use vantage_api_pool_tokio::TokioRuntime;

/// What the server does with one request, once it has read its head (and body).
#[derive(Clone, Debug)]
pub(crate) enum Act {
    /// Write these bytes and keep the connection for the next request.
    Respond(String),
    /// Write these bytes, then close the connection (FIN).
    RespondThenClose(String),
    /// Write these bytes, wait, then close the idle connection (FIN).
    RespondThenCloseAfter(String, Duration),
    /// Close without answering (FIN).
    Close,
    /// Reset without answering (SO_LINGER 0, then close: RST).
    Reset,
    /// Never answer; keep the connection open.
    Stall,
    /// Write these bytes, then never write again; keep the connection open.
    WriteThenStall(String),
    /// Write these bytes, then reset the connection.
    WriteThenReset(String),
}

/// One request as the server read it.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    /// The connection it came on, numbered from 0 in accept order.
    pub(crate) connection: usize,
    /// The request head, lowercased (request line and headers).
    pub(crate) head: String,
}

impl Seen {
    /// The value of header `name` (lowercase), if present.
    pub(crate) fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|line| {
            let (n, v) = line.split_once(':')?;
            (n.trim() == name).then(|| v.trim().to_owned())
        })
    }

    /// The request line's method, uppercase.
    pub(crate) fn method(&self) -> String {
        self.head
            .split(' ')
            .next()
            .unwrap_or_default()
            .to_uppercase()
    }
}

#[derive(Default)]
struct Record {
    connections: AtomicUsize,
    /// Connections the server has closed at once on accept, or idle after
    /// [`Act::RespondThenCloseAfter`], each counted once its close is done (no other
    /// close is counted).
    closed: AtomicUsize,
    requests: Mutex<Vec<Seen>>,
}

/// A script: the action for the request numbered `n` (from 0, over all connections).
pub(crate) type Script = Arc<dyn Fn(usize, &Seen) -> Act + Send + Sync>;

/// A test server's accept task: aborted when dropped, which drops the listener and
/// every connection task it holds.
pub(crate) struct ServerTask(pub(crate) JoinHandle<()>);

impl Drop for ServerTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A raw HTTP/1.1 server on 127.0.0.1:0 that follows a script.
pub(crate) struct FaultServer {
    pub(crate) addr: SocketAddr,
    record: Arc<Record>,
    _task: ServerTask,
}

impl FaultServer {
    /// Starts a server whose `n`-th request gets `script(n, request)`.
    pub(crate) async fn start(
        script: impl Fn(usize, &Seen) -> Act + Send + Sync + 'static,
    ) -> Self {
        FaultServer::start_with(script, |_| false).await
    }

    /// Like [`start`](FaultServer::start), but a connection `i` for which
    /// `close_at_once(i)` is true is closed as soon as it is accepted, before reading.
    pub(crate) async fn start_with(
        script: impl Fn(usize, &Seen) -> Act + Send + Sync + 'static,
        close_at_once: impl Fn(usize) -> bool + Send + 'static,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let record = Arc::new(Record::default());
        let script: Script = Arc::new(script);
        let task = tokio::spawn({
            let record = Arc::clone(&record);
            async move {
                let mut connections = JoinSet::new();
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        return;
                    };
                    let index = record.connections.fetch_add(1, Ordering::SeqCst);
                    if close_at_once(index) {
                        drop(stream);
                        record.closed.fetch_add(1, Ordering::SeqCst);
                        continue;
                    }
                    connections.spawn(serve(
                        stream,
                        index,
                        Arc::clone(&script),
                        Arc::clone(&record),
                    ));
                }
            }
        });
        FaultServer {
            addr,
            record,
            _task: ServerTask(task),
        }
    }

    /// `http://127.0.0.1:port{path}`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Connections accepted so far.
    pub(crate) fn connections(&self) -> usize {
        self.record.connections.load(Ordering::SeqCst)
    }

    /// A reading of the connections the server has closed so far, at once on accept
    /// (see [`start_with`](FaultServer::start_with)) or idle after
    /// [`Act::RespondThenCloseAfter`], each counted once its close is done; it can
    /// move into a connector layer.
    pub(crate) fn closed_counter(&self) -> impl Fn() -> usize + Send + Sync + 'static {
        let record = Arc::clone(&self.record);
        move || record.closed.load(Ordering::SeqCst)
    }

    /// Requests read so far, in order.
    pub(crate) fn requests(&self) -> Vec<Seen> {
        self.record.requests.lock().unwrap().clone()
    }
}

async fn serve(mut stream: TcpStream, connection: usize, script: Script, record: Arc<Record>) {
    let _ = stream.set_nodelay(true);
    while let Some(head) = read_request(&mut stream).await {
        let seen = Seen { connection, head };
        let n = {
            let mut requests = record.requests.lock().unwrap();
            requests.push(seen.clone());
            requests.len() - 1
        };
        match script(n, &seen) {
            Act::Respond(bytes) => {
                if stream.write_all(bytes.as_bytes()).await.is_err() {
                    return;
                }
            }
            Act::RespondThenClose(bytes) => {
                let _ = stream.write_all(bytes.as_bytes()).await;
                let _ = stream.shutdown().await;
                return;
            }
            Act::RespondThenCloseAfter(bytes, idle) => {
                let _ = stream.write_all(bytes.as_bytes()).await;
                tokio::time::sleep(idle).await;
                let _ = stream.shutdown().await;
                record.closed.fetch_add(1, Ordering::SeqCst);
                return;
            }
            Act::Close => {
                let _ = stream.shutdown().await;
                return;
            }
            Act::Reset => {
                reset(stream);
                return;
            }
            Act::Stall => std::future::pending::<()>().await,
            Act::WriteThenStall(bytes) => {
                let _ = stream.write_all(bytes.as_bytes()).await;
                let _ = stream.flush().await;
                std::future::pending::<()>().await;
            }
            Act::WriteThenReset(bytes) => {
                let _ = stream.write_all(bytes.as_bytes()).await;
                let _ = stream.flush().await;
                // Let the bytes leave before the RST overtakes them.
                tokio::time::sleep(Duration::from_millis(30)).await;
                reset(stream);
                return;
            }
        }
    }
}

/// Closes `stream` with an RST instead of a FIN.
pub(crate) fn reset(stream: TcpStream) {
    stream.set_zero_linger().unwrap();
    drop(stream);
}

/// Reads one request head (lowercased) and discards its `content-length` body; `None`
/// at end of file.
pub(crate) async fn read_request<S: AsyncRead + Unpin>(stream: &mut S) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.ok()?;
    Some(head)
}

/// An HTTP/1.1 response with `status`, extra header lines and a body.
pub(crate) fn response(status: &str, headers: &[&str], body: &str) -> String {
    let mut text = format!("HTTP/1.1 {status}\r\ncontent-length: {}\r\n", body.len());
    for h in headers {
        text.push_str(h);
        text.push_str("\r\n");
    }
    text.push_str("\r\n");
    text.push_str(body);
    text
}

/// `200 OK` with `body`.
pub(crate) fn ok(body: &str) -> String {
    response("200 OK", &[], body)
}

/// A policy for real sockets: `retries` retries from 5 ms (so 5, 10, 20 ms… with no
/// jitter) capped at 2 s, a 5 s attempt timeout and a 10 s budget. Tests about time
/// limits set a short one with [`policy_with_timeout`]; the others must not fail
/// because a loaded machine was slow.
pub(crate) fn policy(retries: u32) -> CallPolicy {
    policy_with_timeout(retries, Duration::from_secs(5))
}

/// [`policy`] with another attempt timeout.
pub(crate) fn policy_with_timeout(retries: u32, attempt_timeout: Duration) -> CallPolicy {
    CallPolicy::bounded(
        RetryPolicy::new(retries, Duration::from_millis(5), Duration::from_secs(2)).unwrap(),
    )
    .with_jitter(Jitter::None)
    .unwrap()
    .with_attempt_timeout(attempt_timeout)
    .unwrap()
    .with_budget(Some(Duration::from_secs(10)))
    .unwrap()
}

/// A plain reqwest client: no pooling surprises beyond reqwest's defaults.
pub(crate) fn reqwest_client() -> reqwest::Client {
    // No proxy from the environment: the servers are on 127.0.0.1.
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// A client over `transport` on tokio, reporting to `observer` as `test-api`.
pub(crate) fn client(
    transport: ReqwestTransport,
    observer: &RecordingObserver,
) -> ResilientClient<ReqwestTransport, TokioRuntime> {
    ResilientClient::builder(transport, TokioRuntime::new())
        .observer("test-api", Arc::new(observer.clone()))
        .build()
        .unwrap()
}

/// The trace of a call whose first send was `Interrupted` and whose retry, 5 ms
/// later, got a `200`.
pub(crate) const INTERRUPTED_THEN_OK: [&str; 5] = [
    "started s1 a1",
    "failed s1 a1 transport:interrupted",
    "retry a2 after 5ms",
    "started s2 a2",
    "ok s2 a2 200",
];

/// POSTs `amount=5` to `url` through `client` (reporting to `observer`), with retries
/// allowed, and checks that the POST, which may have been processed, ended on its
/// one send as `Interrupted`: not resent, and not "nothing sent". `what` names the
/// case in the messages.
pub(crate) async fn assert_post_interrupted_once(
    client: &ResilientClient<ReqwestTransport, TokioRuntime>,
    observer: &RecordingObserver,
    url: &str,
    what: &str,
) {
    let error = client
        .execute_with(&policy(3), |http| http.post(url).body("amount=5"))
        .await
        .unwrap_err();
    assert_eq!(
        error.kind(),
        ErrorKind::Transport(TransportErrorKind::Interrupted),
        "{what}: {error}"
    );
    assert!(!error.nothing_sent(), "{what}: {error}");
    assert_eq!(
        trace(observer),
        ["started s1 a1", "failed s1 a1 transport:interrupted"],
        "{what}"
    );
}

/// A short name for an error: `503`, `timed_out`, `transport:interrupted`, ...
pub(crate) fn short(error: &ClientError) -> String {
    match error.kind() {
        ErrorKind::Status(s) => s.as_u16().to_string(),
        ErrorKind::Transport(k) => format!("transport:{k}"),
        other => other.name().to_owned(),
    }
}

/// The observer's events as short lines, checking the observer contract first.
pub(crate) fn trace(observer: &RecordingObserver) -> Vec<String> {
    observer
        .check_contract()
        .unwrap_or_else(|v| panic!("observer contract broken: {v}"));
    observer
        .events()
        .iter()
        .map(|e| match &e.event.kind {
            EventKind::Started { send, attempt } => format!("started s{send} a{attempt}"),
            EventKind::Succeeded {
                send,
                attempt,
                status,
                ..
            } => format!("ok s{send} a{attempt} {}", status.as_u16()),
            EventKind::Failed {
                send,
                attempt,
                error,
                sent,
                ..
            } => format!(
                "failed s{send} a{attempt} {}{}",
                short(error),
                if *sent { "" } else { " unsent" }
            ),
            EventKind::Cancelled { send, attempt } => format!("cancelled s{send} a{attempt}"),
            EventKind::Redialing { send, attempt } => format!("redialing s{send} a{attempt}"),
            EventKind::RetryScheduled { attempt, after } => {
                format!("retry a{attempt} after {}ms", after.as_millis())
            }
            EventKind::TokenFetchEnded {
                reason, outcome, ..
            } => match outcome {
                TokenFetchOutcome::Fetched { generation, .. } => {
                    format!("token g{generation} {}", reason.name())
                }
                other => format!("token {} {}", other.name(), reason.name()),
            },
            other => other.name().to_owned(),
        })
        .collect()
}

/// Checks that nothing of a URL shows in `error`, its Debug, or its sources' texts.
pub(crate) fn assert_no_url(error: &ClientError) {
    let mut texts = vec![error.to_string(), format!("{error:?}")];
    let mut source = std::error::Error::source(error);
    while let Some(s) = source {
        texts.push(s.to_string());
        texts.push(format!("{s:?}"));
        source = s.source();
    }
    for text in texts {
        for needle in ["://", "secret", "hunter2"] {
            assert!(!text.contains(needle), "{needle} in {text}");
        }
    }
}

/// The transport error's message under `error`, for the report of what was observed.
pub(crate) fn message(error: &ClientError) -> String {
    std::error::Error::source(error).map_or_else(String::new, |s| s.to_string())
}

/// A connector layer that holds each new connection (TCP, and TLS for https) before
/// hyper gets it until the server has done something, such as closing it or
/// sending its TLS alert, so that hyper finds that done before it writes anything.
///
/// The `k`-th connection made (from 0, in the order the connects started, counted
/// over every client built with one layer) waits until `ready(k)` holds, as
/// [`wait_until`] waits, and then 2 ms more: a turn of tokio's reactor (its time
/// driver polls for I/O before it fires a timer), so the close the server made is
/// also seen by the socket's readiness, which is what hyper reads.
#[derive(Clone)]
pub(crate) struct HoldConnects {
    made: Arc<AtomicUsize>,
    ready: Arc<dyn Fn(usize) -> bool + Send + Sync>,
}

impl HoldConnects {
    /// Holds the `k`-th connection until `ready(k)`.
    pub(crate) fn until(ready: impl Fn(usize) -> bool + Send + Sync + 'static) -> Self {
        HoldConnects {
            made: Arc::default(),
            ready: Arc::new(ready),
        }
    }
}

/// Waits until `condition` holds, looking every millisecond, and panics naming `what`
/// after 3 s: sooner than a send's 5 s time limit in [`policy`], so a condition that
/// never holds fails the test as itself, not as a timed-out send.
pub(crate) async fn wait_until(what: &str, condition: impl Fn() -> bool) {
    let give_up = tokio::time::Instant::now() + Duration::from_secs(3);
    while !condition() {
        assert!(
            tokio::time::Instant::now() < give_up,
            "still waiting after 3 s: {what}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

impl<S> tower_layer::Layer<S> for HoldConnects {
    type Service = Held<S>;

    fn layer(&self, inner: S) -> Held<S> {
        Held {
            inner,
            hold: self.clone(),
        }
    }
}

#[derive(Clone)]
pub(crate) struct Held<S> {
    inner: S,
    hold: HoldConnects,
}

impl<S, R> tower_service::Service<R> for Held<S>
where
    S: tower_service::Service<R>,
    S::Future: Send + 'static,
    S::Response: Send,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        let k = self.hold.made.fetch_add(1, Ordering::SeqCst);
        let connecting = self.inner.call(request);
        let ready = Arc::clone(&self.hold.ready);
        Box::pin(async move {
            let connection = connecting.await?;
            wait_until(&format!("the hold on connection {k}"), || ready(k)).await;
            tokio::time::sleep(Duration::from_millis(2)).await;
            Ok(connection)
        })
    }
}

/// A listener on 127.0.0.1 that never accepts, its accept queue filled: a further
/// connection attempt gets no answer (the kernel drops its SYN) until the client's
/// connect timeout. Keep it (and its filling connections) alive for the test.
pub(crate) struct Unanswering {
    pub(crate) addr: SocketAddr,
    _listener: TcpListener,
    _fillers: Vec<TcpStream>,
}

impl Unanswering {
    pub(crate) async fn start() -> Self {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(0).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut fillers = Vec::new();
        for _ in 0..4 {
            let connect = TcpStream::connect(addr);
            if let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_millis(200), connect).await
            {
                fillers.push(stream);
            }
        }
        Unanswering {
            addr,
            _listener: listener,
            _fillers: fillers,
        }
    }
}
