//! `ReqwestTransport` against a raw HTTP/1.1 server on 127.0.0.1.
#![cfg(not(target_arch = "wasm32"))]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::Unanswering;
use futures::StreamExt;
use futures::channel::{mpsc, oneshot};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use vantage_api_pool::http::{HeaderName, HeaderValue, Method, StatusCode};
use vantage_api_pool::{
    PreparedRequest, Transport, TransportError, TransportErrorKind, TransportResponse,
};
use vantage_api_pool_reqwest::{ReqwestRequest, ReqwestResponse, ReqwestTransport};

/// What the server does with each connection.
#[derive(Clone, Copy)]
enum Behaviour {
    /// Answer every request on the connection with these bytes.
    Respond(&'static str),
    /// Read the request head, then close without answering.
    CloseAfterHead,
    /// Close as soon as the connection is accepted.
    CloseAtOnce,
    /// Read the request head, then never answer.
    Silent,
    /// Answer at once, without reading the request (for the TLS test).
    BlurtOut(&'static str),
}

/// A test server; dropping it aborts its task, which drops every connection.
struct Server {
    addr: SocketAddr,
    heads: mpsc::UnboundedReceiver<String>,
    task: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    async fn start(behaviour: Behaviour) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, heads) = mpsc::unbounded();
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                connections.spawn(serve(stream, behaviour, tx.clone()));
            }
        });
        Server { addr, heads, task }
    }

    fn url(&self, path_and_query: &str) -> String {
        format!("http://{}{path_and_query}", self.addr)
    }

    /// The next request head the server read.
    async fn next_head(&mut self) -> String {
        self.heads.next().await.expect("the server read a request")
    }
}

async fn serve(mut stream: TcpStream, behaviour: Behaviour, heads: mpsc::UnboundedSender<String>) {
    match behaviour {
        Behaviour::CloseAtOnce => {}
        Behaviour::BlurtOut(answer) => {
            let _ = stream.write_all(answer.as_bytes()).await;
            let _ = stream.shutdown().await;
        }
        Behaviour::CloseAfterHead => {
            if let Some(head) = read_head(&mut stream).await {
                let _ = heads.unbounded_send(head);
            }
        }
        Behaviour::Silent => {
            if let Some(head) = read_head(&mut stream).await {
                let _ = heads.unbounded_send(head);
                std::future::pending::<()>().await;
            }
        }
        Behaviour::Respond(answer) => {
            while let Some(head) = read_head(&mut stream).await {
                let _ = heads.unbounded_send(head);
                if stream.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Reads one request head (the tests send no request bodies); `None` at end of file.
async fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

fn transport() -> ReqwestTransport {
    ReqwestTransport::new(reqwest::Client::builder().no_proxy().build().unwrap())
}

async fn send(
    transport: &ReqwestTransport,
    draft: reqwest::RequestBuilder,
) -> Result<ReqwestResponse, TransportError> {
    let request = transport.prepare(draft)?;
    transport.send(request).await
}

/// Checks that nothing of `url` shows in the error's message, Display or Debug.
fn assert_no_url(err: &TransportError, url: &str) {
    let texts = [
        err.message().to_owned(),
        err.to_string(),
        format!("{err:?}"),
    ];
    for text in texts {
        assert!(!text.contains("://"), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
        assert!(!text.contains("secret"), "{text}");
        assert!(!text.contains(url), "{text}");
    }
}

#[tokio::test]
async fn get_returns_the_status_headers_and_body() {
    let server = Server::start(Behaviour::Respond(
        "HTTP/1.1 201 Created\r\ncontent-length: 5\r\nx-test: yes\r\n\r\nhello",
    ))
    .await;
    let transport = transport();
    let response = send(&transport, transport.handle().get(server.url("/items")))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(response.headers()["x-test"], "yes");
    assert_eq!(TransportResponse::content_length(&response), Some(5));
    // Deref reaches the reqwest response; into_inner gives it back, body unread.
    assert_eq!(response.version(), reqwest::Version::HTTP_11);
    assert_eq!(response.into_inner().text().await.unwrap(), "hello");
}

#[tokio::test]
async fn set_header_reaches_the_server() {
    let mut server = Server::start(Behaviour::Respond("HTTP/1.1 204 No Content\r\n\r\n")).await;
    let transport = transport();
    let draft = transport
        .handle()
        .post(server.url("/jobs"))
        .header("idempotency-key", "k-1");
    let mut request: ReqwestRequest = transport.prepare(draft).unwrap();
    assert_eq!(request.method(), Some(&Method::POST));
    let key = HeaderName::from_static("idempotency-key");
    assert_eq!(request.header(&key).unwrap(), "k-1");

    let retry = HeaderName::from_static("x-retry-count");
    request.set_header(retry.clone(), HeaderValue::from_static("1"));
    request.set_header(retry.clone(), HeaderValue::from_static("2")); // replaces
    assert_eq!(request.header(&retry).unwrap(), "2");
    let debug = format!("{request:?}");
    assert!(!debug.contains("jobs") && !debug.contains("k-1"), "{debug}");

    let response = transport.send(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let head = server.next_head().await.to_ascii_lowercase();
    assert!(head.starts_with("post /jobs http/1.1\r\n"), "{head}");
    assert!(head.contains("\r\nx-retry-count: 2\r\n"), "{head}");
    assert!(!head.contains("x-retry-count: 1"), "{head}");
    assert!(head.contains("\r\nidempotency-key: k-1\r\n"), "{head}");
}

#[tokio::test]
async fn chunk_streams_the_body() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (go, wait) = oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        read_head(&mut stream).await.unwrap();
        stream
            .write_all(b"HTTP/1.1 500 Internal Server Error\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
            .await
            .unwrap();
        // The rest of the body only leaves once the client has read the first chunk.
        wait.await.unwrap();
        stream.write_all(b"6\r\n world\r\n0\r\n\r\n").await.unwrap();
        std::future::pending::<()>().await;
    });

    let transport = transport();
    let mut response = send(
        &transport,
        transport.handle().get(format!("http://{addr}/")),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(TransportResponse::content_length(&response), None);
    // Bounded: a chunk() that waited for more than one read would wait forever for
    // the rest, which leaves only after this read.
    let first = tokio::time::timeout(Duration::from_secs(10), response.chunk())
        .await
        .expect("the first chunk alone, not the whole body");
    assert_eq!(first.unwrap().unwrap(), "hello");
    go.send(()).unwrap();
    let mut rest = Vec::new();
    while let Some(chunk) = response.chunk().await.unwrap() {
        rest.extend_from_slice(&chunk);
    }
    assert_eq!(rest, b" world");
    assert_eq!(response.chunk().await.unwrap(), None);
    server.abort();
}

#[tokio::test]
async fn a_refused_connection_is_connect_and_its_message_has_no_url() {
    let addr = {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap()
    }; // dropped: nothing listens there now
    let url = format!("http://{addr}/secret/path?token=hunter2");
    let transport = transport();
    let err = send(&transport, transport.handle().get(&url))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), TransportErrorKind::Connect, "{err}");
    assert_no_url(&err, &url);
    eprintln!("refused: {err}");
}

#[tokio::test]
async fn a_server_that_closes_after_reading_the_request_is_interrupted() {
    let mut server = Server::start(Behaviour::CloseAfterHead).await;
    let url = server.url("/secret?token=hunter2");
    let transport = transport();
    let err = send(&transport, transport.handle().get(&url))
        .await
        .unwrap_err();
    // Observed: hyper reads end-of-file before any response
    // ("connection closed before message completed").
    assert_eq!(err.kind(), TransportErrorKind::Interrupted, "{err}");
    assert_no_url(&err, &url);
    server.next_head().await;
    eprintln!("closed after head: {err}");
}

#[tokio::test]
async fn a_server_that_closes_at_once_is_not_sent_or_interrupted() {
    let server = Server::start(Behaviour::CloseAtOnce).await;
    let url = server.url("/secret?token=hunter2");
    let transport = transport();
    let err = send(&transport, transport.handle().get(&url))
        .await
        .unwrap_err();
    // Whether hyper saw the close before it started writing the request is a race:
    // `NotSent` if it did (the request was handed back), `Interrupted` if not. See
    // tests/not_sent.rs for the deterministic version.
    assert!(
        matches!(
            err.kind(),
            TransportErrorKind::NotSent | TransportErrorKind::Interrupted
        ),
        "{err}"
    );
    assert_no_url(&err, &url);
    eprintln!("closed at once: {err}");
}

#[tokio::test]
async fn a_request_timeout_is_timed_out() {
    let server = Server::start(Behaviour::Silent).await;
    let url = server.url("/secret?token=hunter2");
    let transport = transport();
    let draft = transport
        .handle()
        .get(&url)
        .timeout(Duration::from_millis(50));
    let err = send(&transport, draft).await.unwrap_err();
    assert_eq!(err.kind(), TransportErrorKind::TimedOut, "{err}");
    assert_no_url(&err, &url);
}

#[tokio::test]
async fn tls_to_a_plain_http_server_is_tls() {
    let server = Server::start(Behaviour::BlurtOut(
        "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n",
    ))
    .await;
    let url = format!("https://{}/secret?token=hunter2", server.addr);
    let transport = transport();
    let err = send(&transport, transport.handle().get(&url))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), TransportErrorKind::Tls, "{err}");
    assert_no_url(&err, &url);
    // A fixed text: a certificate error would name hosts.
    assert_eq!(
        err.message(),
        "the TLS handshake failed (a certificate check on either side, or no protocol both sides accept)"
    );
    assert!(!err.to_string().contains("127.0.0.1"), "{err}");
}

#[tokio::test]
async fn a_redirect_that_fails_after_the_request_was_answered_is_interrupted_without_url() {
    // A redirect loop, and a target reqwest refuses to follow (reqwest calls the
    // latter a "builder" error, which must not read as "nothing sent"): both come
    // after the request went out and was answered.
    let answers = [
        "HTTP/1.1 302 Found\r\nlocation: /secret?token=hunter2\r\ncontent-length: 0\r\n\r\n",
        "HTTP/1.1 303 See Other\r\nlocation: ftp://files.example/secret(1)?token=hunter2\r\ncontent-length: 0\r\n\r\n",
    ];
    for answer in answers {
        let mut server = Server::start(Behaviour::Respond(answer)).await;
        let url = server.url("/secret?token=hunter2");
        let transport = transport();
        let err = send(&transport, transport.handle().get(&url))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), TransportErrorKind::Interrupted, "{err}");
        assert_no_url(&err, &url);
        assert!(server.next_head().await.starts_with("GET /secret"));
    }
}

/// A transport with the adapter's tracked redirect policy.
fn tracking_transport(
    customize: fn(reqwest::ClientBuilder) -> reqwest::ClientBuilder,
) -> ReqwestTransport {
    ReqwestTransport::with_builder(move || {
        customize(ReqwestTransport::default_client_builder().no_proxy())
    })
    .unwrap()
}

/// A server answering every request with a redirect to `location`.
async fn redirecting(status: &str, location: &str) -> Server {
    let answer = format!("HTTP/1.1 {status}\r\nlocation: {location}\r\ncontent-length: 0\r\n\r\n");
    Server::start(Behaviour::Respond(Box::leak(answer.into_boxed_str()))).await
}

#[tokio::test]
async fn a_hop_that_fails_after_a_redirect_is_interrupted_unless_it_timed_out() {
    // A POST answered with a 303 to https on a plain server: the hop's TLS failure
    // comes after the POST was processed, so it is no "nothing sent" Tls.
    let plain = Server::start(Behaviour::BlurtOut(
        "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n",
    ))
    .await;
    let mut origin = redirecting("303 See Other", &format!("https://{}/receipt", plain.addr)).await;
    let transport = tracking_transport(|b| b);
    let draft = transport.handle().post(origin.url("/charge")).body("x");
    let err = send(&transport, draft).await.unwrap_err();
    assert_eq!(err.kind(), TransportErrorKind::Interrupted, "{err}");
    assert!(origin.next_head().await.starts_with("POST /charge"));

    // A hop that stalls until the request's own timeout stays TimedOut.
    let silent = Server::start(Behaviour::Silent).await;
    let origin = redirecting("302 Found", &silent.url("/slow")).await;
    let transport = tracking_transport(|b| b.timeout(Duration::from_millis(300)));
    let err = send(&transport, transport.handle().get(origin.url("/a")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), TransportErrorKind::TimedOut, "{err}");
}

#[tokio::test]
async fn a_connect_timeout_is_connect() {
    // A listener that never accepts, its accept queue filled: further connection
    // attempts get no answer until the client's connect timeout. Nothing was sent,
    // so Connect (reqwest also calls it a timeout).
    let unanswering = Unanswering::start().await;
    let addr = unanswering.addr;
    let transport = tracking_transport(|b| b.connect_timeout(Duration::from_millis(200)));
    let draft = transport
        .handle()
        .post(format!("http://{addr}/x"))
        .body("x");
    let started = std::time::Instant::now();
    let sent = tokio::time::timeout(Duration::from_secs(10), send(&transport, draft));
    let err = sent
        .await
        .expect("ended by the connect timeout")
        .unwrap_err();
    assert_eq!(err.kind(), TransportErrorKind::Connect, "{err}");
    // A refusal would end at once: this one waited for the connect timeout.
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(150),
        "not a timeout: {waited:?}, {err}"
    );
    drop(unanswering);
}

#[tokio::test]
async fn an_https_only_client_refusing_an_http_url_is_config_and_sends_nothing() {
    let mut server = Server::start(Behaviour::Respond(
        "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
    ))
    .await;
    let url = server.url("/secret?token=hunter2");
    let transport =
        ReqwestTransport::new(reqwest::Client::builder().https_only(true).build().unwrap());
    let err = send(&transport, transport.handle().get(&url))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), TransportErrorKind::Config, "{err}");
    assert_no_url(&err, &url);
    // Nothing reached the server: a plain client's request is the first it reads.
    let plain = self::transport();
    send(&plain, plain.handle().get(server.url("/plain")))
        .await
        .unwrap();
    assert!(server.next_head().await.starts_with("GET /plain"));
}

#[tokio::test]
async fn a_draft_that_cannot_be_built_is_config() {
    let transport = transport();
    let err = transport
        .prepare(transport.handle().get("not a url"))
        .unwrap_err();
    assert_eq!(err.kind(), TransportErrorKind::Config, "{err}");
    assert!(!err.to_string().contains("not a url"), "{err}");

    let bad_header = transport
        .handle()
        .get("http://127.0.0.1/secret")
        .header("x-bad", "line\nbreak");
    let err = transport.prepare(bad_header).unwrap_err();
    assert_eq!(err.kind(), TransportErrorKind::Config, "{err}");
    assert!(!err.to_string().contains("break"), "{err}");

    // reqwest itself only rejects the scheme when sending; prepare does it early.
    let err = transport
        .prepare(
            transport
                .handle()
                .get("ftp://127.0.0.1/secret?token=hunter2"),
        )
        .unwrap_err();
    assert_eq!(err.kind(), TransportErrorKind::Config, "{err}");
    assert_no_url(&err, "ftp://127.0.0.1/secret?token=hunter2");
}

#[tokio::test]
async fn a_request_whose_own_url_is_not_http_is_config_when_sent() {
    // `prepare` refuses the scheme, but a prepared request can be changed after it
    // (it dereferences mutably) or made with `ReqwestRequest::new`: reqwest refuses
    // it when sending, before anything leaves. Not a redirect's target, so `Config`,
    // not `Interrupted`.
    let transport = transport();
    let url = "ftp://127.0.0.1/secret?token=hunter2";
    let mut changed = transport
        .prepare(transport.handle().post("http://127.0.0.1:9/charge"))
        .unwrap();
    *changed.url_mut() = url.parse().unwrap();
    let made = ReqwestRequest::new(
        transport.handle().clone(),
        reqwest::Request::new(Method::GET, url.parse().unwrap()),
    );
    for request in [changed, made] {
        let err = transport.send(request).await.unwrap_err();
        assert_eq!(err.kind(), TransportErrorKind::Config, "{err}");
        assert_no_url(&err, url);
    }
}

#[test]
fn the_futures_are_send() {
    fn assert_send<T: Send>(_: &T) {}
    let transport = transport();
    let request = transport
        .prepare(transport.handle().get("http://127.0.0.1:9/"))
        .unwrap();
    let send = transport.send(request);
    assert_send(&send);
    assert_send(&transport);
    drop(send);
    fn chunk_is_send(response: &mut ReqwestResponse) {
        assert_send(&response.chunk());
    }
    let _ = chunk_is_send;
}

#[tokio::test]
async fn a_send_cut_off_by_its_caller_does_not_leave_its_connection_in_the_pool() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (accepted, mut accepts) = mpsc::unbounded::<()>();
    let server = tokio::spawn(async move {
        let mut connections = JoinSet::new();
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            accepted.unbounded_send(()).unwrap();
            connections.spawn(async move {
                while let Some(head) = read_head(&mut stream).await {
                    if head.starts_with("GET /stall ") {
                        std::future::pending::<()>().await;
                    }
                    let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                    if stream.write_all(ok).await.is_err() {
                        return;
                    }
                }
            });
        }
    });

    let transport = transport();
    // A first exchange leaves one idle connection in the pool.
    let ok = send(
        &transport,
        transport.handle().get(format!("http://{addr}/ok")),
    );
    assert_eq!(ok.await.unwrap().status(), StatusCode::OK);
    // The next one reuses it, stalls, and is cut off by dropping its future, as the
    // attempt loop does when a time limit ends.
    let stall = send(
        &transport,
        transport.handle().get(format!("http://{addr}/stall")),
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(50), stall)
            .await
            .is_err()
    );
    // The stalled connection is not handed out again: a new one is dialed. (Were
    // it reused, this request would stall too and the timeout would fail the test.)
    let ok = send(
        &transport,
        transport.handle().get(format!("http://{addr}/ok")),
    );
    let ok = tokio::time::timeout(Duration::from_secs(5), ok).await;
    assert_eq!(ok.expect("not stuck").unwrap().status(), StatusCode::OK);
    server.abort();
    let mut count = 0;
    while accepts.next().await.is_some() {
        count += 1;
    }
    assert_eq!(count, 2);
}

#[tokio::test]
async fn a_request_in_an_http_version_hyper_cannot_send_is_config() {
    let server = Server::start(Behaviour::Respond("HTTP/1.1 204 No Content\r\n\r\n")).await;
    let url = server.url("/secret?token=hunter2");
    let transport = transport();
    let draft = transport
        .handle()
        .get(&url)
        .version(reqwest::Version::HTTP_09);
    let err = send(&transport, draft).await.unwrap_err();
    assert_eq!(err.kind(), TransportErrorKind::Config, "{err}");
    assert_no_url(&err, &url);
    assert!(err.to_string().contains("UserUnsupportedVersion"), "{err}");
    // `CONNECT` over HTTP/1.0 is refused as well.
    let draft = transport
        .handle()
        .request(reqwest::Method::CONNECT, &url)
        .version(reqwest::Version::HTTP_10);
    let err = send(&transport, draft).await.unwrap_err();
    assert_eq!(err.kind(), TransportErrorKind::Config, "{err}");
    assert!(
        err.to_string().contains("UserUnsupportedRequestMethod"),
        "{err}"
    );
}

/// A resolver that knows no name.
struct NoSuchHost;

impl reqwest::dns::Resolve for NoSuchHost {
    fn resolve(&self, _name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        Box::pin(std::future::ready(Err("no such host".into())))
    }
}

#[tokio::test]
async fn a_name_that_does_not_resolve_is_connect() {
    let client = reqwest::Client::builder()
        .dns_resolver(NoSuchHost)
        .build()
        .unwrap();
    let transport = ReqwestTransport::new(client);
    let url = "http://orders.example.invalid/secret?token=hunter2";
    let err = send(&transport, transport.handle().get(url))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), TransportErrorKind::Connect, "{err}");
    assert_no_url(&err, url);
    eprintln!("dns: {err}");
}

#[test]
fn debug_of_the_transport_shows_no_default_header_value() {
    let mut headers = http::HeaderMap::new();
    headers.insert(
        "x-api-key",
        http::HeaderValue::from_static("s3cret-default"),
    );
    let client = reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .unwrap();
    let debug = format!(
        "{:?}",
        vantage_api_pool_reqwest::ReqwestTransport::new(client)
    );
    assert!(!debug.contains("s3cret"), "{debug}");
}

#[tokio::test]
async fn take_headers_moves_the_headers_out_and_the_body_reads_on() {
    let head = http::Response::builder()
        .status(503)
        .header("retry-after", "2")
        .header("x-a", "1");
    let mut response = ReqwestResponse::new(head.body("busy").unwrap().into());
    let taken = TransportResponse::take_headers(&mut response);
    assert_eq!(
        (taken.len(), &taken["x-a"]),
        (2, &HeaderValue::from_static("1"))
    );
    assert!(response.headers().is_empty());
    assert_eq!(response.status(), 503);
    let body = TransportResponse::chunk(&mut response)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(body, "busy");
}
