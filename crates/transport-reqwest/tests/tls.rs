//! HTTPS end to end: a TLS server on 127.0.0.1 (rustls, with the test CA of
//! `tests/certs`) against clients the adapter builds.
#![cfg(not(target_arch = "wasm32"))]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{
    HoldConnects, ServerTask, assert_no_url, assert_post_interrupted_once, ok, policy,
    policy_with_timeout, read_request, short, trace,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use vantage_api_pool::{BreakerState, ErrorKind, ResilientClient, Transport, TransportErrorKind};
use vantage_api_pool_reqwest::ReqwestTransport;
use vantage_api_pool_testkit::RecordingObserver;
use vantage_api_pool_tokio::TokioRuntime;

const CA: &[u8] = include_bytes!("certs/ca.pem");
const CERT: &[u8] = include_bytes!("certs/server.pem");
const KEY: &[u8] = include_bytes!("certs/server.key");

/// What the server does with a request it read.
enum Answer {
    /// Writes these bytes.
    Bytes(String),
    /// Never answers.
    Never,
    /// Drops the connection without TLS's `close_notify`: the client reads an
    /// unexpected end of file.
    CutWithoutCloseNotify,
}

/// An HTTPS server on 127.0.0.1 (HTTP/1.1 over TLS): it answers request `n`
/// (counted from 0) as `answer(n)` says. Dropping it aborts its task and every
/// connection.
struct TlsServer {
    port: u16,
    /// Request heads read after a completed handshake, in order.
    heads: Arc<Mutex<Vec<String>>>,
    /// TCP connections accepted, handshakes completed or not.
    connections: Arc<AtomicUsize>,
    /// Handshakes that failed on the server's side (it refused the client, its alert
    /// written, or the client gave up), counted as each fails.
    refused: Arc<AtomicUsize>,
    _task: ServerTask,
}

impl TlsServer {
    async fn start(answer: impl Fn(usize) -> Answer + Send + Sync + 'static) -> TlsServer {
        Self::start_with(server_config(rustls::DEFAULT_VERSIONS, false), answer).await
    }

    async fn start_with(
        config: rustls::ServerConfig,
        answer: impl Fn(usize) -> Answer + Send + Sync + 'static,
    ) -> TlsServer {
        let answer = Arc::new(answer);
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let refused = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn({
            let (heads, connections) = (Arc::clone(&heads), Arc::clone(&connections));
            let refused = Arc::clone(&refused);
            async move {
                let mut tasks = JoinSet::new();
                while let Ok((stream, _)) = listener.accept().await {
                    connections.fetch_add(1, Ordering::SeqCst);
                    let (acceptor, heads) = (acceptor.clone(), Arc::clone(&heads));
                    let (answer, refused) = (Arc::clone(&answer), Arc::clone(&refused));
                    tasks.spawn(async move {
                        // A client that rejects the certificate ends the handshake;
                        // so does the server, with its alert, for a client
                        // certificate it requires and does not get.
                        let Ok(mut tls) = acceptor.accept(stream).await else {
                            refused.fetch_add(1, Ordering::SeqCst);
                            return;
                        };
                        while let Some(head) = read_request(&mut tls).await {
                            let n = {
                                let mut heads = heads.lock().unwrap();
                                heads.push(head);
                                heads.len() - 1
                            };
                            match answer(n) {
                                Answer::Bytes(bytes) => {
                                    if tls.write_all(bytes.as_bytes()).await.is_err() {
                                        return;
                                    }
                                }
                                Answer::Never => std::future::pending::<()>().await,
                                // Dropped without a shutdown: no `close_notify`.
                                Answer::CutWithoutCloseNotify => return,
                            }
                        }
                    });
                }
            }
        });
        TlsServer {
            port,
            heads,
            connections,
            refused,
            _task: ServerTask(task),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.port)
    }

    fn requests(&self) -> usize {
        self.heads.lock().unwrap().len()
    }
}

/// The server's TLS settings: the test certificate, the given protocol versions, and
/// with `client_certificate`, a client certificate from the test CA required.
fn server_config(
    versions: &[&'static rustls::SupportedProtocolVersion],
    client_certificate: bool,
) -> rustls::ServerConfig {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(versions)
        .expect("protocol versions");
    let builder = if client_certificate {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(CA).expect("ca.pem"))
            .expect("the test CA");
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .expect("client verifier");
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    builder
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(CERT).expect("server.pem")],
            PrivateKeyDer::from_pem_slice(KEY).expect("server.key"),
        )
        .expect("certificate and key")
}

/// A client over a transport the adapter builds from its default builder, trusting
/// only the test CA, so every rebuild after a distrusted connection trusts it too.
fn trusting_client(
    observer: &RecordingObserver,
) -> (
    ResilientClient<ReqwestTransport, TokioRuntime>,
    ReqwestTransport,
) {
    trusting_client_with(observer, None, None)
}

/// [`trusting_client`], each new connection held after its handshake as `hold`
/// says before hyper gets it, presenting `identity` as its client certificate when
/// given.
fn trusting_client_with(
    observer: &RecordingObserver,
    hold: Option<HoldConnects>,
    identity: Option<reqwest::Identity>,
) -> (
    ResilientClient<ReqwestTransport, TokioRuntime>,
    ReqwestTransport,
) {
    let ca = reqwest::Certificate::from_pem(CA).expect("ca.pem");
    let transport = ReqwestTransport::with_builder(move || {
        let builder = ReqwestTransport::default_client_builder()
            .no_proxy()
            .tls_certs_only([ca.clone()]);
        let builder = match &identity {
            Some(identity) => builder.identity(identity.clone()),
            None => builder,
        };
        match &hold {
            Some(hold) => builder.connector_layer(hold.clone()),
            None => builder,
        }
    })
    .expect("client");
    let client = ResilientClient::builder(transport.clone(), TokioRuntime::new())
        .observer("test-api", Arc::new(observer.clone()))
        .build()
        .unwrap();
    (client, transport)
}

#[tokio::test]
async fn a_call_over_https_succeeds_and_its_body_streams_to_the_caller() {
    let server = TlsServer::start(|_| Answer::Bytes(ok("https ok"))).await;
    let observer = RecordingObserver::new();
    let (client, _transport) = trusting_client(&observer);
    let url = server.url("/orders");
    let response = client
        .execute_with(&policy(0), |http| http.get(&url))
        .await
        .expect("200 over TLS");
    assert_eq!(response.status(), 200);
    assert_eq!(response.into_inner().text().await.unwrap(), "https ok");
    assert_eq!(trace(&observer), ["started s1 a1", "ok s1 a1 200"]);
    assert_eq!(server.requests(), 1);
    assert!(server.heads.lock().unwrap()[0].starts_with("get /orders http/1.1"));
}

#[tokio::test]
async fn a_retry_after_a_cut_send_goes_out_on_a_rebuilt_client_that_still_trusts_the_ca() {
    // The first request is never answered: its time limit cuts it, the adapter
    // rebuilds its client (the connection is distrusted), and the retry must make a
    // new TLS connection with the same trust settings.
    let server = TlsServer::start(|n| {
        if n > 0 {
            Answer::Bytes(ok("https ok"))
        } else {
            Answer::Never
        }
    })
    .await;
    let observer = RecordingObserver::new();
    let (client, transport) = trusting_client(&observer);
    let url = server.url("/orders");
    let response = client
        .execute_with(&policy_with_timeout(1, Duration::from_secs(2)), |http| {
            http.get(&url)
        })
        .await
        .expect("the retry is answered");
    assert_eq!(response.status(), 200);
    assert_eq!(
        trace(&observer),
        [
            "started s1 a1",
            "failed s1 a1 timed_out",
            "retry a2 after 5ms",
            "started s2 a2",
            "ok s2 a2 200",
        ]
    );
    assert_eq!(transport.rebuilds(), 1);
    assert_eq!(server.requests(), 2);
    assert_eq!(server.connections.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn an_untrusted_certificate_is_a_final_tls_error_and_nothing_is_sent() {
    let server = TlsServer::start(|_| Answer::Bytes(ok("https ok"))).await;
    let observer = RecordingObserver::new();
    // The adapter's defaults: the platform's roots, which do not hold the test CA.
    let transport = ReqwestTransport::new(
        ReqwestTransport::default_client_builder()
            .no_proxy()
            .build()
            .unwrap(),
    );
    let client = ResilientClient::builder(transport, TokioRuntime::new())
        .observer("test-api", Arc::new(observer.clone()))
        .breaker(1, Duration::from_secs(60), Duration::from_secs(600))
        .build()
        .unwrap();
    let url = server.url("/secret?token=hunter2");
    let error = client
        .execute_with(&policy(3), |http| http.get(&url))
        .await
        .unwrap_err();
    assert_eq!(
        error.kind(),
        ErrorKind::Transport(TransportErrorKind::Tls),
        "{error}"
    );
    assert_eq!(short(&error), "transport:tls");
    // Final: one attempt though three retries were allowed; nothing reached the
    // server, and no URL or host shows in the error.
    assert_eq!(error.attempts(), 1);
    assert!(error.nothing_sent());
    assert!(!error.is_retryable());
    assert_no_url(&error);
    assert!(!error.to_string().contains("127.0.0.1"), "{error}");
    assert_eq!(
        trace(&observer),
        [
            "started s1 a1",
            "failed s1 a1 transport:tls",
            "breaker_opened"
        ]
    );
    assert_eq!(server.requests(), 0);
    assert_eq!(server.connections.load(Ordering::SeqCst), 1);
    // A TLS failure is the API's side: it counts against the breaker (threshold 1).
    assert!(
        matches!(client.breaker_state(), BreakerState::Open { .. }),
        "{:?}",
        client.breaker_state()
    );
}

#[tokio::test]
async fn a_server_that_requires_a_client_certificate_gives_a_final_tls_error_not_a_cut_send() {
    // Under TLS 1.2 the server refuses the missing certificate during the handshake.
    // Under TLS 1.3 the client has finished its side and written the POST before
    // the server's `certificate_required` alert arrives, on the first read: still a
    // handshake the server refused, with nothing let through, so `Tls` (final,
    // nothing sent), not `Interrupted` ("something may have been sent"). When the
    // alert reaches the fresh connection before hyper hands it the request, hyper
    // reads it as a connection that failed before the request (`NotSent`): still
    // `Tls`, and not redialed, which would meet the same refusal. A certificate the
    // server will not take (the server's own, not for client authentication) is
    // refused the same way under TLS 1.3, with `unsupported_certificate`.
    let servers_own = || Some(reqwest::Identity::from_pem(&[CERT, KEY].concat()).expect("pem"));
    for (version, versions, alert_first, identity) in [
        ("1.2", &[&rustls::version::TLS12], false, None),
        ("1.3", &[&rustls::version::TLS13], false, None),
        ("1.3, alert first", &[&rustls::version::TLS13], true, None),
        (
            "1.3, a certificate it will not take",
            &[&rustls::version::TLS13],
            false,
            servers_own(),
        ),
    ] {
        let server =
            TlsServer::start_with(server_config(versions, true), |_| Answer::Bytes(ok("paid")))
                .await;
        let observer = RecordingObserver::new();
        // Alert first: the connection goes to hyper once the server has refused it.
        let hold = alert_first.then(|| {
            let refused = Arc::clone(&server.refused);
            HoldConnects::until(move |_| refused.load(Ordering::SeqCst) >= 1)
        });
        let (client, _transport) = trusting_client_with(&observer, hold, identity);
        let url = server.url("/charge");
        let error = client
            .execute_with(&policy(3).idempotent(true), |http| {
                http.post(&url).body("amount=5")
            })
            .await
            .unwrap_err();
        assert_eq!(
            error.kind(),
            ErrorKind::Transport(TransportErrorKind::Tls),
            "TLS {version}: {error}"
        );
        assert!(error.nothing_sent(), "TLS {version}");
        assert_eq!(error.attempts(), 1, "TLS {version}: final, not retried");
        assert_no_url(&error);
        assert_eq!(
            trace(&observer),
            ["started s1 a1", "failed s1 a1 transport:tls"],
            "TLS {version}"
        );
        assert_eq!(server.requests(), 0, "TLS {version}");
        assert_eq!(
            server.connections.load(Ordering::SeqCst),
            1,
            "TLS {version}: no redial"
        );
    }
}

#[tokio::test]
async fn a_tls_connection_cut_without_close_notify_after_the_request_is_interrupted() {
    // The server read the POST, then dropped the connection with no `close_notify`:
    // the client's read ends in an unexpected end of file. The request arrived, so
    // it is `Interrupted` and not resent.
    let server = TlsServer::start(|_| Answer::CutWithoutCloseNotify).await;
    let observer = RecordingObserver::new();
    let (client, _transport) = trusting_client(&observer);
    let url = server.url("/charge");
    assert_post_interrupted_once(&client, &observer, &url, "TLS cut").await;
    assert_eq!(server.requests(), 1);
}

#[tokio::test]
async fn a_refused_redirect_to_plain_http_names_no_part_of_its_target() {
    // `https_only` refuses the hop to http, and reqwest reports it as an error inside
    // the redirect error, one that still carries the target URL. Its text must not
    // survive into the message, whatever characters the URL holds.
    for location in [
        "http://127.0.0.1:1/p?a=)&token=hunter2",
        "http://127.0.0.1:1/p?a=`&token=hunter2",
        "http://127.0.0.1:1/p?a={&token=hunter2",
        "http://127.0.0.1:1/a]/hunter2",
        "http://127.0.0.1:1/it's/hunter2",
    ] {
        let server = TlsServer::start(move |_| {
            Answer::Bytes(common::response(
                "302 Found",
                &[&format!("location: {location}")],
                "",
            ))
        })
        .await;
        let ca = reqwest::Certificate::from_pem(CA).expect("ca.pem");
        let transport = ReqwestTransport::with_builder(move || {
            ReqwestTransport::default_client_builder()
                .no_proxy()
                .https_only(true)
                .tls_certs_only([ca.clone()])
        })
        .expect("client");
        let request = transport
            .prepare(transport.client().get(server.url("/start")))
            .expect("prepared");
        let err = transport
            .send(request)
            .await
            .expect_err("the hop to http is refused");
        // The server answered the first request: not "never sent".
        assert_eq!(err.kind(), TransportErrorKind::Interrupted, "{err}");
        for text in [err.to_string(), format!("{err:?}")] {
            assert!(!text.contains("hunter2"), "{location}: {text}");
            assert!(!text.contains("127.0.0.1"), "{location}: {text}");
        }
        assert_eq!(server.requests(), 1);
    }
}
