//! `ScriptedReqwest`: code written for reqwest (its request closures, its responses)
//! on virtual time. No socket is opened and nothing sleeps in real time, but for one
//! test that holds the scripted answers against the real adapter's on 127.0.0.1.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use vantage_api_pool::transport::SendTransportResponse;
use vantage_api_pool::{
    CallPolicy, ErrorKind, EventKind, Jitter, ResilientClient, RetryPolicy, TimeLimit,
    TransportErrorKind,
};
use vantage_api_pool_reqwest::{ReqwestResponse, ReqwestTransport, ScriptedReqwest, reqwest};
use vantage_api_pool_testkit::{RecordingObserver, Reply, ScriptedTransport, VirtualRuntime};

const URL: &str = "https://orders.example/v1/orders";

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

type Client = ResilientClient<ScriptedReqwest, VirtualRuntime>;

/// A virtual clock, its script, and a client over `ScriptedReqwest` (with its default
/// read timeout: none is set here) that retries without jitter.
fn set_up() -> (VirtualRuntime, ScriptedTransport, Client) {
    over(|transport| transport)
}

/// [`set_up`] with the read timeout `read`.
fn with_read_timeout(read: Option<Duration>) -> (VirtualRuntime, ScriptedTransport, Client) {
    over(move |transport| transport.read_timeout(read))
}

/// [`set_up`] with the transport as `configure` leaves it.
fn over(
    configure: impl FnOnce(ScriptedReqwest) -> ScriptedReqwest,
) -> (VirtualRuntime, ScriptedTransport, Client) {
    let rt = VirtualRuntime::new();
    let script = ScriptedTransport::new(&rt);
    let transport =
        configure(ScriptedReqwest::new(script.clone()).expect("a client that never sends"));
    let policy = CallPolicy::bounded(RetryPolicy::default())
        .with_jitter(Jitter::None)
        .expect("no jitter");
    let client = ResilientClient::builder(transport, rt.clone())
        .default_policy(policy)
        .build()
        .expect("client");
    (rt, script, client)
}

#[test]
fn the_script_sees_what_the_reqwest_closure_built() {
    let (rt, script, client) = set_up();
    script.push(Reply::status(201));
    let response = rt
        .block_on(client.execute(|http| {
            http.post(format!("{URL}?dry_run=1&page=2"))
                .header("x-trace", "t1")
                .header("x-trace", "t2")
                .header("content-type", "application/json")
                .body("[1,2,3]")
        }))
        .expect("driven")
        .expect("answered");
    assert_eq!(response.status(), StatusCode::CREATED);
    let sent = &script.requests()[0];
    assert_eq!(sent.method, Method::POST);
    assert_eq!(sent.path, "/v1/orders?dry_run=1&page=2");
    let traces: Vec<_> = sent.headers.get_all("x-trace").iter().collect();
    assert_eq!(traces, ["t1", "t2"]);
    assert_eq!(sent.headers["content-type"], "application/json");
    assert_eq!(sent.body, Bytes::from_static(b"[1,2,3]"));
}

#[test]
fn clones_share_the_script_and_keep_the_read_timeout() {
    let rt = VirtualRuntime::new();
    let script = ScriptedTransport::new(&rt);
    let first = ScriptedReqwest::new(script.clone())
        .expect("a client that never sends")
        .read_timeout(Some(secs(2)));
    let second = first.clone();
    script.push(Reply::status(201));
    script.push(Reply::ok().body("[1, 2").body_stalls_after(3));
    let a = ResilientClient::builder(first, rt.clone())
        .build()
        .expect("client");
    let b = ResilientClient::builder(second, rt.clone())
        .build()
        .expect("client");
    let created = rt
        .block_on(a.execute(|http| http.post(URL)))
        .expect("driven")
        .expect("answered");
    assert_eq!(created.status(), StatusCode::CREATED);
    // The clone takes the script's next reply, and its read ends at the clone's 2 s.
    let read = rt
        .block_on(async {
            let response = b.execute(|http| http.get(URL)).await?;
            Ok::<_, vantage_api_pool::ClientError>(response.bytes().await)
        })
        .expect("driven")
        .expect("answered");
    assert_eq!(read.unwrap_err().kind(), TransportErrorKind::TimedOut);
    assert_eq!(rt.elapsed(), secs(2));
    let methods: Vec<_> = script.requests().into_iter().map(|r| r.method).collect();
    assert_eq!(methods, [Method::POST, Method::GET]);
}

#[test]
fn a_streamed_request_body_is_read_to_its_end_first() {
    let (rt, script, client) = set_up();
    script.push(Reply::ok());
    let pieces: Vec<Result<&'static str, std::io::Error>> = vec![Ok("ab"), Ok("cd")];
    let mut pieces = Some(pieces);
    rt.block_on(client.execute(|http| {
        let body =
            reqwest::Body::wrap_stream(futures::stream::iter(pieces.take().expect("one attempt")));
        http.put(URL).body(body)
    }))
    .expect("driven")
    .expect("answered");
    assert_eq!(script.requests()[0].body, Bytes::from_static(b"abcd"));
}

#[test]
fn a_failing_request_body_is_interrupted_and_reaches_no_script() {
    let (rt, script, client) = set_up();
    script.default_reply(Reply::ok());
    let err = rt
        .block_on(client.execute_with(&CallPolicy::background(), |http| {
            let pieces: Vec<Result<&'static str, std::io::Error>> =
                vec![Ok("ab"), Err(std::io::Error::other("disk gone"))];
            http.put(URL)
                .body(reqwest::Body::wrap_stream(futures::stream::iter(pieces)))
        }))
        .expect("driven")
        .unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::Transport(TransportErrorKind::Interrupted)
    );
    assert_eq!(script.request_count(), 0);
}

#[test]
fn a_draft_reqwest_cannot_build_is_config_and_never_sent() {
    let (rt, script, client) = set_up();
    script.default_reply(Reply::ok());
    for url in ["not a url", "ftp://orders.example/x"] {
        let err = rt
            .block_on(client.execute(|http| http.get(url)))
            .expect("driven")
            .unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::Transport(TransportErrorKind::Config),
            "{url}"
        );
        assert!(err.nothing_sent(), "{url}");
    }
    assert_eq!(script.request_count(), 0);
}

#[test]
fn a_request_hyper_cannot_send_is_config_and_never_sent() {
    // As over the real adapter (`transport.rs`,
    // `a_request_in_an_http_version_hyper_cannot_send_is_config`): hyper-util refuses
    // HTTP/0.9 and HTTP/3, and `CONNECT` over HTTP/1.0, before anything is sent.
    let (rt, script, client) = set_up();
    script.default_reply(Reply::ok());
    let refused = [
        (
            Method::GET,
            reqwest::Version::HTTP_09,
            "UserUnsupportedVersion",
        ),
        (
            Method::GET,
            reqwest::Version::HTTP_3,
            "UserUnsupportedVersion",
        ),
        (
            Method::CONNECT,
            reqwest::Version::HTTP_10,
            "UserUnsupportedRequestMethod",
        ),
    ];
    for (method, version, refusal) in refused {
        let err = rt
            .block_on(client.execute(|http| http.request(method.clone(), URL).version(version)))
            .expect("driven")
            .unwrap_err();
        let case = format!("{method} {version:?}");
        assert_eq!(
            err.kind(),
            ErrorKind::Transport(TransportErrorKind::Config),
            "{case}"
        );
        assert!(err.nothing_sent(), "{case}");
        let source = std::error::Error::source(&err).map(ToString::to_string);
        assert!(
            source.as_deref().is_some_and(|s| s.contains(refusal)),
            "{case}: {source:?}"
        );
    }
    assert_eq!(script.request_count(), 0);
    // What hyper sends goes to the script.
    for (method, version) in [
        (Method::GET, reqwest::Version::HTTP_10),
        (Method::GET, reqwest::Version::HTTP_11),
        (Method::GET, reqwest::Version::HTTP_2),
        (Method::CONNECT, reqwest::Version::HTTP_11),
    ] {
        rt.block_on(client.execute(|http| http.request(method.clone(), URL).version(version)))
            .expect("driven")
            .unwrap_or_else(|err| panic!("{method} {version:?}: {err}"));
    }
    assert_eq!(script.request_count(), 4);
}

#[test]
fn the_body_streams_on_the_virtual_clock_through_reqwest() {
    let (rt, script, client) = set_up();
    script.push(
        Reply::ok()
            .header("content-length", "9")
            .body("one;two;3")
            .chunk_size(4)
            .chunk_delay(secs(1)),
    );
    let text = rt
        .block_on(async {
            let response = client.execute(|http| http.get(URL)).await?;
            assert_eq!(response.content_length(), Some(9));
            // reqwest's own reader, over the scripted chunks; the length left goes
            // down as hyper's does.
            let mut inner = response.into_inner();
            let mut chunks = Vec::new();
            let mut left = Vec::new();
            while let Some(chunk) = inner.chunk().await.expect("no failure") {
                chunks.push(chunk);
                left.push(inner.content_length());
            }
            assert_eq!(left, [Some(5), Some(1), Some(0)]);
            Ok::<_, vantage_api_pool::ClientError>(chunks)
        })
        .expect("driven")
        .expect("answered");
    assert_eq!(text, ["one;", "two;", "3"]);
    // Each of the three chunks came a virtual second after the one before.
    assert_eq!(rt.elapsed(), secs(3));
}

#[test]
fn a_head_or_bodiless_status_has_an_empty_body_as_hyper_reads_it() {
    for (method, status) in [
        (Method::HEAD, 200),
        (Method::GET, 101),
        (Method::GET, 204),
        (Method::GET, 304),
    ] {
        let (rt, script, client) = set_up();
        script.push(
            Reply::status(status)
                .header("content-length", "5")
                .body("hello"),
        );
        let (length, body) = rt
            .block_on(async {
                let response = client
                    .execute(|http| http.request(method.clone(), URL))
                    .await?;
                let length = response.content_length();
                Ok::<_, vantage_api_pool::ClientError>((length, response.bytes().await))
            })
            .expect("driven")
            .expect("answered");
        assert_eq!(length, Some(0), "{method} {status}");
        assert_eq!(body.expect("no failure"), Bytes::new(), "{method} {status}");
    }
    // Any other: the length the header gives.
    let (rt, script, client) = set_up();
    script.push(Reply::ok().header("content-length", "5").body("hello"));
    let response = rt
        .block_on(client.execute(|http| http.get(URL)))
        .expect("driven")
        .expect("answered");
    assert_eq!(response.content_length(), Some(5));
}

#[test]
fn a_body_that_fails_maps_as_the_real_adapter_maps_it() {
    for (kind, want) in [
        (TransportErrorKind::TimedOut, TransportErrorKind::TimedOut),
        (
            TransportErrorKind::Interrupted,
            TransportErrorKind::Interrupted,
        ),
        (TransportErrorKind::Connect, TransportErrorKind::Interrupted),
    ] {
        let (rt, script, client) = set_up();
        script.push(
            Reply::ok()
                .body("abcdef")
                .body_fails_after(4, kind, "the line dropped"),
        );
        let (got, err) = rt
            .block_on(async {
                let mut response = client.execute(|http| http.get(URL)).await?;
                let mut got = Vec::new();
                loop {
                    match SendTransportResponse::chunk(&mut response).await {
                        Ok(Some(chunk)) => got.extend_from_slice(&chunk),
                        Ok(None) => panic!("{kind:?}: the body ended without its failure"),
                        Err(err) => return Ok::<_, vantage_api_pool::ClientError>((got, err)),
                    }
                }
            })
            .expect("driven")
            .expect("answered");
        assert_eq!(got, b"abcd", "{kind:?}");
        assert_eq!(err.kind(), want, "{kind:?}: {err}");
        assert!(!err.message().contains("orders.example"), "{err}");
    }
}

#[test]
fn an_error_body_that_stalls_is_cut_by_the_attempt_time_limit() {
    let (rt, script, client) = set_up();
    script.push(Reply::status(502).body("bad gateway").body_stalls_after(3));
    let policy = CallPolicy::background()
        .with_attempt_timeout(secs(2))
        .expect("policy");
    let err = rt
        .block_on(client.execute_with(&policy, |http| http.get(URL)))
        .expect("driven")
        .unwrap_err();
    assert_eq!(err.status(), Some(StatusCode::BAD_GATEWAY));
    assert_eq!(err.body(), Some(&b"bad"[..]));
    assert_eq!(rt.elapsed(), secs(2));
    // The loop's cut distrusts the connection; the script counts it.
    assert_eq!(script.distrusted(), 1);
}

#[test]
fn a_body_is_read_to_its_content_length_as_hyper_reads_it() {
    // Short of it: the body fails as a cut connection does. Past it: cut at it.
    for (length, body, want) in [
        ("9", "abc", Err(TransportErrorKind::Interrupted)),
        ("3", "abcdef", Ok(Bytes::from_static(b"abc"))),
        ("0", "abc", Ok(Bytes::new())),
    ] {
        let (rt, script, client) = set_up();
        script.push(
            Reply::ok()
                .header("content-length", length)
                .body(body)
                .chunk_size(2),
        );
        let got = rt
            .block_on(async {
                let response = client.execute(|http| http.get(URL)).await?;
                Ok::<_, vantage_api_pool::ClientError>(response.bytes().await)
            })
            .expect("driven")
            .expect("answered");
        assert_eq!(got.map_err(|e| e.kind()), want, "{length}: {body}");
    }
}

/// A body read to its end over `client`: what came, or the kind it failed with.
fn read_body(
    rt: &VirtualRuntime,
    client: &Client,
) -> Result<Result<Bytes, TransportErrorKind>, vantage_api_pool_testkit::DriveError> {
    rt.block_on(async {
        let response = client
            .execute(|http| http.get(URL))
            .await
            .expect("answered");
        response.bytes().await.map_err(|e| e.kind())
    })
}

#[test]
fn a_stalled_body_meets_the_adapters_default_read_timeout() {
    let (rt, script, client) = set_up();
    script.push(Reply::ok().body("[1, 2, 3]").body_stalls_after(4));
    assert_eq!(
        read_body(&rt, &client),
        Ok(Err(TransportErrorKind::TimedOut))
    );
    // The documented default, 30 s, as a number: not the constant under test.
    assert_eq!(rt.elapsed(), secs(30));
    assert_eq!(vantage_api_pool_reqwest::DEFAULT_READ_TIMEOUT, secs(30));
}

#[test]
fn the_read_timeout_counts_from_each_read_and_covers_the_head() {
    let (rt, script, client) = with_read_timeout(Some(secs(2)));
    // Three pieces 1.5 s apart: 4.5 s in all, but never 2 s without one.
    script.push(
        Reply::ok()
            .body("abcdef")
            .chunk_size(2)
            .chunk_delay(Duration::from_millis(1500)),
    );
    assert_eq!(
        read_body(&rt, &client),
        Ok(Ok(Bytes::from_static(b"abcdef")))
    );
    assert_eq!(rt.elapsed(), Duration::from_millis(4500));
    // A head 3 s late: the transport's own timeout, at 2 s.
    let start = rt.now();
    script.push(Reply::ok().after(secs(3)));
    let err = rt
        .block_on(client.execute_with(&CallPolicy::background(), |http| http.get(URL)))
        .expect("driven")
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
    assert_eq!(err.time_limit(), Some(TimeLimit::Transport));
    assert_eq!(rt.now().saturating_duration_since(start), secs(2));
}

#[test]
fn the_requests_own_timeout_covers_the_head_and_the_whole_body() {
    // A head 5 s late under a 3 s timeout: the transport's own timeout, at 3 s.
    let (rt, script, client) = set_up();
    script.push(Reply::ok().after(secs(5)));
    let err = rt
        .block_on(client.execute_with(&CallPolicy::background(), |http| {
            http.get(URL).timeout(secs(3))
        }))
        .expect("driven")
        .unwrap_err();
    assert_eq!(err.time_limit(), Some(TimeLimit::Transport), "{err}");
    assert_eq!(rt.elapsed(), secs(3));
    // A head at once, then five pieces a second apart under 3.5 s: the body is cut
    // at 3.5 s from the send, though no piece was ever late.
    let (rt, script, client) = set_up();
    script.push(Reply::ok().body("abcde").chunk_size(1).chunk_delay(secs(1)));
    let read = rt
        .block_on(async {
            let response = client
                .execute(|http| http.get(URL).timeout(Duration::from_millis(3500)))
                .await
                .expect("answered");
            response.bytes().await.map_err(|e| e.kind())
        })
        .expect("driven");
    assert_eq!(read, Err(TransportErrorKind::TimedOut));
    assert_eq!(rt.elapsed(), Duration::from_millis(3500));
}

/// Two pieces of body, both there at once, read with `pause` between them: what the
/// second read gave.
fn second_read_after(
    rt: &VirtualRuntime,
    client: &Client,
    request: impl Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    pause: Duration,
) -> Result<Option<Bytes>, TransportErrorKind> {
    rt.block_on(async {
        let mut response = client.execute(request).await.expect("answered");
        let first = SendTransportResponse::chunk(&mut response).await;
        assert_eq!(first.unwrap(), Some(Bytes::from_static(b"abc")));
        rt.sleep(pause).await;
        SendTransportResponse::chunk(&mut response)
            .await
            .map_err(|e| e.kind())
    })
    .expect("driven")
}

#[test]
fn a_reader_that_dawdles_past_a_limit_times_out_though_the_data_is_there() {
    // The read timeout counts from the piece handed over, not from the next read.
    let (rt, script, client) = with_read_timeout(Some(Duration::from_millis(300)));
    script.push(Reply::ok().body("abcdef").chunk_size(3));
    let get = |http: &reqwest::Client| http.get(URL);
    assert_eq!(
        second_read_after(&rt, &client, get, Duration::from_millis(500)),
        Err(TransportErrorKind::TimedOut)
    );
    script.push(Reply::ok().body("abcdef").chunk_size(3));
    assert_eq!(
        second_read_after(&rt, &client, get, Duration::from_millis(200)),
        Ok(Some(Bytes::from_static(b"def")))
    );
    // The request's own timeout: a read after it fails, whatever is there.
    let (rt, script, client) = with_read_timeout(None);
    script.push(Reply::ok().body("abcdef").chunk_size(3));
    let get = |http: &reqwest::Client| http.get(URL).timeout(Duration::from_millis(300));
    assert_eq!(
        second_read_after(&rt, &client, get, Duration::from_millis(500)),
        Err(TransportErrorKind::TimedOut)
    );
}

#[test]
fn a_piece_at_the_deadline_is_late_and_a_zero_read_timeout_fails_the_head() {
    let (rt, script, client) = with_read_timeout(Some(secs(2)));
    script.push(Reply::ok().body("abcd").chunk_size(2).chunk_delay(secs(2)));
    assert_eq!(
        read_body(&rt, &client),
        Ok(Err(TransportErrorKind::TimedOut))
    );
    assert_eq!(rt.elapsed(), secs(2));

    let (rt, script, client) = with_read_timeout(Some(Duration::ZERO));
    script.push(Reply::ok().body("abcd"));
    let err = rt
        .block_on(client.execute_with(&CallPolicy::background(), |http| http.get(URL)))
        .expect("driven")
        .unwrap_err();
    assert_eq!(err.time_limit(), Some(TimeLimit::Transport), "{err}");
}

#[test]
fn the_limits_cover_the_upload_of_a_streamed_body() {
    let (rt, script, client) = with_read_timeout(None);
    script.default_reply(Reply::ok());
    let err = rt
        .block_on(client.execute_with(&CallPolicy::background(), |http| {
            let never = futures::stream::pending::<Result<&'static str, std::io::Error>>();
            http.post(URL)
                .timeout(secs(1))
                .body(reqwest::Body::wrap_stream(never))
        }))
        .expect("driven")
        .unwrap_err();
    assert_eq!(err.time_limit(), Some(TimeLimit::Transport), "{err}");
    assert_eq!(rt.elapsed(), secs(1));
    assert_eq!(script.request_count(), 0);
}

#[test]
fn a_content_length_hyper_cannot_read_fails_the_send_unless_bodiless() {
    for lengths in [&["abc"][..], &["3", "4"]] {
        let (rt, script, client) = set_up();
        let mut reply = Reply::ok().body("abcd");
        for length in lengths {
            reply = reply.header("content-length", *length);
        }
        script.push(reply);
        let err = rt
            .block_on(client.execute_with(&CallPolicy::background(), |http| http.get(URL)))
            .expect("driven")
            .unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::Transport(TransportErrorKind::Interrupted),
            "{lengths:?}"
        );
    }
    // hyper does not look at a HEAD response's.
    let (rt, script, client) = set_up();
    script.push(Reply::ok().header("content-length", "abc"));
    let response = rt
        .block_on(client.execute(|http| http.head(URL)))
        .expect("driven")
        .expect("a HEAD response reads no length");
    assert_eq!(response.content_length(), Some(0));
}

#[test]
fn without_a_read_timeout_a_stalled_body_stalls_its_reader() {
    let (rt, script, client) = with_read_timeout(None);
    script.push(Reply::ok().body("[1, 2, 3]").body_stalls_after(4));
    assert!(
        matches!(
            read_body(&rt, &client),
            Err(vantage_api_pool_testkit::DriveError::Deadlock { .. })
        ),
        "nothing ends the read"
    );
}

#[test]
fn the_scripts_admission_gates_every_send() {
    let (rt, script, client) = set_up();
    script.admit_delay(secs(2)).push(Reply::ok());
    rt.block_on(client.execute(|http| http.get(URL)))
        .expect("driven")
        .expect("answered");
    assert_eq!(script.admitted(), 1);
    assert_eq!(script.requests()[0].at.since_origin(), secs(2));
}

#[test]
fn retry_after_and_failures_before_the_head_come_from_the_script() {
    let (rt, script, client) = set_up();
    script.push(Reply::status(503).header("retry-after", "3"));
    script.push(Reply::fail(TransportErrorKind::Connect, "refused"));
    script.push(Reply::ok().body("done"));
    let body = rt
        .block_on(async {
            let response = client.execute(|http| http.get(URL)).await?;
            Ok::<_, vantage_api_pool::ClientError>(response.text().await)
        })
        .expect("driven")
        .expect("answered")
        .expect("body");
    assert_eq!(body, "done");
    let at: Vec<Duration> = script
        .requests()
        .iter()
        .map(|r| r.at.since_origin())
        .collect();
    // 3 s as the server asked; then the policy's second back-off, 500 ms.
    assert_eq!(at, [secs(0), secs(3), Duration::from_millis(3_500)]);
}

#[test]
fn a_reply_marked_credentials_dropped_says_so_through_reqwest() {
    let (rt, script, client) = set_up();
    script.push(Reply::ok().credentials_dropped());
    script.push(Reply::ok());
    let marks: Vec<bool> = (0..2)
        .map(|_| {
            let response: ReqwestResponse = rt
                .block_on(client.execute(|http| http.get(URL)))
                .expect("driven")
                .expect("answered");
            SendTransportResponse::credentials_dropped(&response)
        })
        .collect();
    assert_eq!(marks, [true, false]);
}

#[test]
fn cooldown_doubling_over_five_minutes_with_a_reqwest_closure() {
    let rt = VirtualRuntime::new();
    let script = ScriptedTransport::new(&rt);
    script.default_reply(Reply::status(503));
    let events = RecordingObserver::new();
    let client =
        ResilientClient::builder(ScriptedReqwest::new(script.clone()).unwrap(), rt.clone())
            .breaker(3, secs(10), secs(80))
            .observer("orders-api", Arc::new(events.clone()))
            .build()
            .unwrap();
    let call = rt.spawn(async move {
        client
            .execute_with(&CallPolicy::essential(), |http| http.get(URL))
            .await
            .map(|_| ())
    });
    rt.run_for(secs(5 * 60)).unwrap();
    call.abort();
    let cooldowns: Vec<u64> = events
        .events()
        .iter()
        .filter_map(|e| match e.event.kind {
            EventKind::BreakerOpened { cooldown } => Some(cooldown.as_secs()),
            _ => None,
        })
        .collect();
    assert!(
        cooldowns.starts_with(&[10, 20, 40, 80, 80]),
        "{cooldowns:?}"
    );
    events.check_contract().unwrap();
}

/// Compile-time: a call over it is `Send`, as one over `ReqwestTransport` is.
#[test]
fn a_call_over_it_is_send() {
    fn assert_send<F: Send>(_: &F) {}
    let (_rt, _script, client) = set_up();
    assert_send(&client.execute(|http| http.get(URL)));
}

/// What a caller's code sees of an answer: the status, the headers the case names,
/// `content_length()` before the body is read, and the body read to its end.
#[derive(Debug, PartialEq)]
struct Seen {
    status: u16,
    headers: Vec<(String, Option<String>)>,
    length: Option<u64>,
    body: Result<Bytes, TransportErrorKind>,
}

async fn seen_of(response: ReqwestResponse, names: &[&str]) -> Seen {
    let headers = names
        .iter()
        .map(|&name| {
            let value = response.headers().get(name);
            (
                name.to_owned(),
                value.map(|v| v.to_str().unwrap().to_owned()),
            )
        })
        .collect();
    Seen {
        status: response.status().as_u16(),
        headers,
        length: response.content_length(),
        body: response.bytes().await.map_err(|e| e.kind()),
    }
}

#[tokio::test]
async fn a_scripted_answer_reads_as_the_same_answer_from_a_real_server() {
    use common::{Act, FaultServer, response};
    // (method, what the server writes, the same answer scripted, headers to compare)
    let cases: Vec<(Method, Act, Reply, &[&str])> = vec![
        (
            Method::GET,
            Act::Respond(response("200 OK", &["x-id: 7"], "hello")),
            Reply::ok()
                .header("content-length", "5")
                .header("x-id", "7")
                .body("hello"),
            &["content-length", "x-id"],
        ),
        (
            Method::HEAD,
            Act::Respond("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n".to_owned()),
            Reply::ok().header("content-length", "5").body("hello"),
            &["content-length"],
        ),
        (
            Method::GET,
            Act::Respond("HTTP/1.1 204 No Content\r\n\r\n".to_owned()),
            Reply::status(204),
            &[],
        ),
        (
            Method::GET,
            Act::Respond("HTTP/1.1 304 Not Modified\r\ncontent-length: 5\r\n\r\n".to_owned()),
            Reply::status(304).header("content-length", "5"),
            &["content-length"],
        ),
        (
            Method::GET,
            Act::RespondThenClose("HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nabc".to_owned()),
            Reply::ok().header("content-length", "9").body("abc"),
            &["content-length"],
        ),
        (
            Method::GET,
            Act::Respond("HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nabcdef".to_owned()),
            Reply::ok().header("content-length", "3").body("abcdef"),
            &["content-length"],
        ),
        (
            Method::GET,
            Act::WriteThenReset("HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nabc".to_owned()),
            Reply::ok()
                .header("content-length", "6")
                .body("abcdef")
                .body_fails_after(3, TransportErrorKind::Interrupted, "reset"),
            &["content-length"],
        ),
        (
            Method::GET,
            Act::Respond("HTTP/1.1 200 OK\r\ncontent-length: 3, 3\r\n\r\nabc".to_owned()),
            Reply::ok().header("content-length", "3, 3").body("abc"),
            &["content-length"],
        ),
        (
            Method::GET,
            Act::Respond(
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
                    .to_owned(),
            ),
            Reply::ok()
                .header("transfer-encoding", "chunked")
                .body("abc"),
            &["content-length", "transfer-encoding"],
        ),
        (
            Method::GET,
            Act::Respond(
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n6\r\nabcdef\r\n0\r\n\r\n"
                    .to_owned(),
            ),
            Reply::ok()
                .header("transfer-encoding", "chunked")
                .header("content-length", "3")
                .body("abcdef"),
            &["transfer-encoding"],
        ),
        (
            Method::GET,
            Act::Respond(response("302 Found", &["location: /elsewhere"], "")),
            Reply::status(302)
                .header("content-length", "0")
                .header("location", "/elsewhere"),
            &["location"],
        ),
    ];
    let no_retries = CallPolicy::background();
    for (method, act, reply, names) in cases {
        let act = std::sync::Mutex::new(Some(act));
        let server = FaultServer::start(move |_, _| act.lock().unwrap().take().unwrap()).await;
        let url = server.url("/x");
        // The real adapter, following no redirect, as the script does not.
        let real = ReqwestTransport::with_builder(|| {
            ReqwestTransport::default_client_builder().redirect(reqwest::redirect::Policy::none())
        })
        .unwrap();
        let real = ResilientClient::builder(real, vantage_api_pool_tokio::TokioRuntime::new())
            .build()
            .unwrap();
        let response = real
            .execute_with(&no_retries, |http| http.request(method.clone(), &url))
            .await
            .unwrap_or_else(|e| panic!("{method} {reply:?}: {e}"));
        let from_server = seen_of(response, names).await;

        let (rt, script, client) = set_up();
        script.push(reply);
        let scripted = rt
            .block_on(async {
                let response = client
                    .execute_with(&no_retries, |http| http.request(method.clone(), URL))
                    .await
                    .unwrap();
                seen_of(response, names).await
            })
            .expect("driven");
        assert_eq!(scripted, from_server, "{method} {names:?}");
    }
}

/// Code bound on `SendReqwestLike` makes `Send + 'static` calls over either transport:
/// the compiler proves it in the signature.
fn spawnable_read<T, R, A>(
    api: ResilientClient<T, R, A>,
) -> impl std::future::Future<Output = Result<Bytes, vantage_api_pool::ClientError>> + Send + 'static
where
    T: vantage_api_pool_reqwest::SendReqwestLike + 'static,
    R: vantage_api_pool::runtime::SendRuntime + 'static,
    A: vantage_api_pool::auth::SendTokenSource + 'static,
{
    let call = api.into_read_call(1024, |http| http.get(URL));
    async move { Ok(call.await?.into_body()) }
}

#[test]
fn code_bound_on_send_reqwest_like_reads_a_body_that_broke_off_again() {
    let (rt, script, client) = set_up();
    script.push(Reply::ok().body("[1, 2, 3]").body_fails_after(
        4,
        TransportErrorKind::Interrupted,
        "reset",
    ));
    script.push(Reply::ok().body("[1, 2, 3]"));
    let body = rt.block_on(spawnable_read(client)).unwrap().unwrap();
    assert_eq!(body, "[1, 2, 3]");
    assert_eq!(script.request_count(), 2);
    // The production transport has the bound too.
    fn bound<T: vantage_api_pool_reqwest::SendReqwestLike>(_: &T) {}
    bound(&ReqwestTransport::new(reqwest::Client::new()));
}

/// The adapter's `json`, `query` and `form` features turn on reqwest's own, so the
/// re-exported `reqwest` builds and reads such bodies.
#[cfg(all(feature = "json", feature = "query", feature = "form"))]
#[test]
fn the_json_query_and_form_features_reach_reqwest() {
    let (rt, script, client) = set_up();
    script.push(
        Reply::ok()
            .header("content-type", "application/json")
            .body(r#"[["a",1],["b",2]]"#),
    );
    script.push(Reply::status(201));
    script.push(Reply::status(201));
    let rows = rt
        .block_on(async {
            let response = client
                .execute(|http| http.get(URL).query(&[("page", "2")]))
                .await?;
            Ok::<_, vantage_api_pool::ClientError>(
                response.into_inner().json::<Vec<(String, u32)>>().await,
            )
        })
        .expect("driven")
        .expect("answered")
        .expect("a JSON body");
    assert_eq!(rows, [("a".to_owned(), 1), ("b".to_owned(), 2)]);
    for build in [
        |http: &reqwest::Client| http.post(URL).json(&[("a", 1)]),
        |http: &reqwest::Client| http.post(URL).form(&[("name", "x y")]),
    ] {
        rt.block_on(client.execute(build))
            .expect("driven")
            .expect("answered");
    }
    let sent = script.requests();
    assert_eq!(sent[0].path, "/v1/orders?page=2");
    assert_eq!(sent[1].body, Bytes::from_static(br#"[["a",1]]"#));
    assert_eq!(sent[1].headers["content-type"], "application/json");
    assert_eq!(sent[2].body, Bytes::from_static(b"name=x+y"));
    assert_eq!(
        sent[2].headers["content-type"],
        "application/x-www-form-urlencoded"
    );
}

#[test]
fn a_request_body_failing_with_a_refused_connection_is_interrupted_as_over_reqwest() {
    // As over the real adapter (`not_sent.rs`): the caller's own body stream error,
    // whatever it holds, is not this connection's. Read as such, its
    // `ConnectionRefused` would make the POST `Connect` ("nothing sent"), retried.
    let (rt, script, client) = set_up();
    script.default_reply(Reply::ok());
    let err = rt
        .block_on(client.execute(|http| {
            let pieces: Vec<Result<&'static str, std::io::Error>> = vec![
                Ok("amount="),
                Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    "the upload's source refused",
                )),
            ];
            http.post(URL)
                .body(reqwest::Body::wrap_stream(futures::stream::iter(pieces)))
        }))
        .expect("driven")
        .unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::Transport(TransportErrorKind::Interrupted),
        "{err}"
    );
    assert!(!err.nothing_sent(), "{err}");
    assert_eq!(err.attempts(), 1, "{err}");
    assert_eq!(script.request_count(), 0);
}
