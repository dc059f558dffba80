//! Hundreds of POSTs, none marked idempotent, through one client on a multi-threaded
//! runtime against a server that meets each request it receives with a fault drawn
//! from a seed: answered, a 5xx, a close or a reset after reading it, a stall, a head
//! cut off, or "not processed" (429, 503 with a server delay), and connections closed
//! before anything is read. Whatever the timing, the server must never receive a
//! POST again once it may have processed it: only a 429, a 503 with a delay and a
//! request that never arrived may be sent again. The simulation checks this rule on
//! virtual time; here it is the adapter's mapping of real errors that is put to it.
#![cfg(not(target_arch = "wasm32"))]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use vantage_api_pool::ResilientClient;
use vantage_api_pool_reqwest::ReqwestTransport;
use vantage_api_pool_testkit::RecordingObserver;
use vantage_api_pool_tokio::TokioRuntime;

const CALLS: u64 = 300;

/// What the server does with one request it received in full.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Fate {
    Ok,
    /// 500: maybe processed.
    Failed,
    /// 503 without a delay: maybe processed.
    Unavailable,
    /// 503 with `retry-after-ms`: not processed.
    UnavailableFor,
    /// 429: not processed.
    TooMany,
    /// Close (FIN) without answering.
    Close,
    /// Reset (RST) without answering.
    Reset,
    /// Never answer: the attempt's time limit ends it.
    Stall,
    /// Part of a head, then a reset.
    HeadCut,
}

impl Fate {
    const ALL: [Fate; 9] = [
        Fate::Ok,
        Fate::Failed,
        Fate::Unavailable,
        Fate::UnavailableFor,
        Fate::TooMany,
        Fate::Close,
        Fate::Reset,
        Fate::Stall,
        Fate::HeadCut,
    ];

    /// Whether the server may have acted on the request: it must not come again.
    fn maybe_processed(self) -> bool {
        !matches!(self, Fate::UnavailableFor | Fate::TooMany)
    }

    fn act(self) -> Act {
        match self {
            Fate::Ok => Act::Respond(ok("done")),
            Fate::Failed => Act::Respond(response("500 Internal Server Error", &[], "oops")),
            Fate::Unavailable => Act::Respond(response("503 Service Unavailable", &[], "")),
            Fate::UnavailableFor => Act::Respond(response(
                "503 Service Unavailable",
                &["retry-after-ms: 2"],
                "",
            )),
            Fate::TooMany => Act::Respond(response(
                "429 Too Many Requests",
                &["retry-after-ms: 2"],
                "",
            )),
            Fate::Close => Act::Close,
            Fate::Reset => Act::Reset,
            Fate::Stall => Act::Stall,
            Fate::HeadCut => Act::WriteThenReset("HTTP/1.1 200 OK\r\ncontent-len".to_owned()),
        }
    }
}

/// SplitMix64 of `x`.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The fate of the `receipt`-th arrival of call `id`'s POST: "not processed" half
/// the time on a first arrival, so resends happen; otherwise any fate.
fn draw(seed: u64, id: u64, receipt: usize) -> Fate {
    let r = mix(seed ^ mix(id) ^ mix(receipt as u64 + 1));
    if receipt == 0 && r.is_multiple_of(2) {
        return if r.is_multiple_of(4) {
            Fate::UnavailableFor
        } else {
            Fate::TooMany
        };
    }
    Fate::ALL[((r >> 8) % Fate::ALL.len() as u64) as usize]
}

/// The seed: `NO_DOUBLE_POST_SEED`, or 7.
fn seed() -> u64 {
    std::env::var("NO_DOUBLE_POST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7)
}

/// Checks that no call's POST arrived again after an arrival that may have been
/// processed, that some were sent again, and that every fate in `all` was met.
/// Returns how many calls' POSTs arrived more than once.
fn check<F: Copy + PartialEq + std::fmt::Debug>(
    seed: u64,
    received: &HashMap<u64, Vec<F>>,
    maybe_processed: fn(F) -> bool,
    all: &[F],
) -> usize {
    let doubled: Vec<_> = received
        .iter()
        .filter(|(_, fates)| {
            fates
                .iter()
                .take(fates.len().saturating_sub(1))
                .any(|fate| maybe_processed(*fate))
        })
        .collect();
    assert!(
        doubled.is_empty(),
        "seed {seed}: POSTs received again after the server may have processed them: {doubled:?}"
    );
    // The run exercised what it is about: resends after "not processed", and every
    // fate at least once.
    let resent = received.values().filter(|fates| fates.len() > 1).count();
    assert!(resent > 0, "seed {seed}: no POST was sent again");
    for fate in all {
        assert!(
            received.values().flatten().any(|f| f == fate),
            "seed {seed}: no request met {fate:?}"
        );
    }
    resent
}

/// Sends `CALLS` POSTs through `client` to `url`, all at once (16 in flight), each
/// with its call number in `x-call`; returns how many succeeded.
async fn post_all(client: &ResilientClient<ReqwestTransport, TokioRuntime>, url: &str) -> usize {
    // Three retries 5 ms apart and up; a stall ends after 300 ms.
    let policy = policy_with_timeout(3, Duration::from_millis(300));
    let mut calls = tokio::task::JoinSet::new();
    for id in 0..CALLS {
        let (client, policy, url) = (client.clone(), policy.clone(), url.to_owned());
        calls.spawn(async move {
            client
                .execute_with_owned(policy, move |http| {
                    http.post(&url).header("x-call", id).body("amount=5")
                })
                .await
                .map(|response| response.status())
        });
    }
    let mut succeeded = 0;
    while let Some(outcome) = calls.join_next().await {
        succeeded += usize::from(outcome.unwrap().is_ok());
    }
    succeeded
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_the_server_may_have_processed_is_never_received_again() {
    let seed = seed();
    // Each call's POSTs as the server received them, with the fate each met.
    let received: Arc<Mutex<HashMap<u64, Vec<Fate>>>> = Arc::default();
    let server = FaultServer::start_with(
        {
            let received = Arc::clone(&received);
            move |_, seen| {
                let id: u64 = seen
                    .header("x-call")
                    .and_then(|v| v.parse().ok())
                    .expect("every POST carries x-call");
                let mut received = received.lock().unwrap();
                let fates = received.entry(id).or_default();
                let fate = draw(seed, id, fates.len());
                fates.push(fate);
                fate.act()
            }
        },
        // Some connections are closed before anything is read: what was sent on
        // them never arrived, and may be sent again.
        |connection| connection % 5 == 3,
    )
    .await;
    let observer = RecordingObserver::new();
    observer.record(false);
    let client = ResilientClient::builder(
        ReqwestTransport::with_defaults().unwrap(),
        TokioRuntime::new(),
    )
    .max_parallel(16)
    .observer("orders-api", Arc::new(observer.clone()))
    .build()
    .unwrap();
    let succeeded = post_all(&client, &server.url("/orders")).await;

    let received = received.lock().unwrap();
    let resent = check(seed, &received, Fate::maybe_processed, &Fate::ALL);
    assert!(succeeded > 0, "seed {seed}: no call succeeded");
    observer.check_contract().unwrap();
    eprintln!(
        "seed {seed}: {CALLS} calls, {succeeded} succeeded, {resent} sent again, {} received, {} connections",
        received.values().map(Vec::len).sum::<usize>(),
        server.connections()
    );
}

/// What an HTTP/2 server does with one stream it took.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum StreamFate {
    Ok,
    /// 500: maybe processed.
    Failed,
    /// 503 with `retry-after-ms`: not processed.
    UnavailableFor,
    /// 429: not processed.
    TooMany,
    /// `REFUSED_STREAM`: not processed (RFC 9113 §8.7).
    Refused,
    /// Reset with `INTERNAL_ERROR`: maybe processed.
    Reset,
    /// `GOAWAY` naming the stream processed, then the connection closes: maybe
    /// processed, and so may be every stream the connection had taken.
    GoAway,
    /// Never answer: the attempt's time limit ends it.
    Stall,
}

impl StreamFate {
    const ALL: [StreamFate; 8] = [
        StreamFate::Ok,
        StreamFate::Failed,
        StreamFate::UnavailableFor,
        StreamFate::TooMany,
        StreamFate::Refused,
        StreamFate::Reset,
        StreamFate::GoAway,
        StreamFate::Stall,
    ];

    fn maybe_processed(self) -> bool {
        !matches!(
            self,
            StreamFate::UnavailableFor | StreamFate::TooMany | StreamFate::Refused
        )
    }

    /// As [`draw`], over the HTTP/2 fates.
    fn draw(seed: u64, id: u64, receipt: usize) -> StreamFate {
        let r = mix(seed ^ mix(id) ^ mix(receipt as u64 + 1) ^ 0x4832);
        if receipt == 0 && r.is_multiple_of(2) {
            return [
                StreamFate::UnavailableFor,
                StreamFate::TooMany,
                StreamFate::Refused,
            ][(r % 3) as usize];
        }
        StreamFate::ALL[((r >> 8) % StreamFate::ALL.len() as u64) as usize]
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_post_the_server_may_have_processed_is_never_received_again() {
    use tokio::net::TcpListener;
    let seed = seed();
    let received: Arc<Mutex<HashMap<u64, Vec<StreamFate>>>> = Arc::default();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let _server = ServerTask(tokio::spawn({
        let received = Arc::clone(&received);
        async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((socket, _)) = listener.accept().await {
                let received = Arc::clone(&received);
                connections.spawn(async move {
                    let Ok(mut connection) = h2::server::handshake(socket).await else {
                        return;
                    };
                    let mut stalled = Vec::new();
                    while let Some(Ok((request, mut respond))) = connection.accept().await {
                        let id: u64 = request
                            .headers()
                            .get("x-call")
                            .and_then(|v| v.to_str().ok()?.parse().ok())
                            .expect("every POST carries x-call");
                        let fate = {
                            let mut received = received.lock().unwrap();
                            let fates = received.entry(id).or_default();
                            let fate = StreamFate::draw(seed, id, fates.len());
                            fates.push(fate);
                            fate
                        };
                        let answer = |status: u16, delay: bool| {
                            let mut head = http::Response::builder().status(status);
                            if delay {
                                head = head.header("retry-after-ms", "2");
                            }
                            head.body(()).unwrap()
                        };
                        match fate {
                            StreamFate::Ok => drop(respond.send_response(answer(200, false), true)),
                            StreamFate::Failed => {
                                drop(respond.send_response(answer(500, false), true))
                            }
                            StreamFate::UnavailableFor => {
                                drop(respond.send_response(answer(503, true), true));
                            }
                            StreamFate::TooMany => {
                                drop(respond.send_response(answer(429, true), true))
                            }
                            StreamFate::Refused => respond.send_reset(h2::Reason::REFUSED_STREAM),
                            StreamFate::Reset => respond.send_reset(h2::Reason::INTERNAL_ERROR),
                            StreamFate::GoAway => {
                                connection.abrupt_shutdown(h2::Reason::NO_ERROR);
                                stalled.push(respond);
                            }
                            StreamFate::Stall => stalled.push(respond),
                        }
                    }
                });
            }
        }
    }));
    let observer = RecordingObserver::new();
    observer.record(false);
    let transport = ReqwestTransport::with_builder(|| {
        ReqwestTransport::default_client_builder().http2_prior_knowledge()
    })
    .unwrap();
    let client = ResilientClient::builder(transport, TokioRuntime::new())
        .max_parallel(16)
        .observer("orders-api", Arc::new(observer.clone()))
        .build()
        .unwrap();
    let succeeded = post_all(&client, &format!("http://{addr}/orders")).await;

    let received = received.lock().unwrap();
    let resent = check(
        seed,
        &received,
        StreamFate::maybe_processed,
        &StreamFate::ALL,
    );
    assert!(succeeded > 0, "seed {seed}: no call succeeded");
    observer.check_contract().unwrap();
    eprintln!(
        "seed {seed}, HTTP/2: {CALLS} calls, {succeeded} succeeded, {resent} sent again, {} received",
        received.values().map(Vec::len).sum::<usize>(),
    );
}
