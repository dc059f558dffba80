//! A small HTTP/1.1 fault server on 127.0.0.1 for the wasm tests of
//! `vantage-api-pool-wasm` (`tests/reqwest_client.rs`), built natively and started
//! by `scripts/wasm-test`.
//!
//! ```text
//! cargo run -p vantage-api-pool-wasm --example fault_server [-- --max-seconds N]
//! ```
//!
//! It binds an ephemeral port on 127.0.0.1, prints `listening on 127.0.0.1:PORT` as
//! its first line, and exits by itself after `--max-seconds` (default 900) in case
//! whoever started it does not stop it.
//!
//! | request | answer |
//! |---|---|
//! | `OPTIONS` anything | `204`, the CORS allow headers (methods, the requested headers); not counted |
//! | `GET /flaky/<id>` | first request `503` with `Retry-After: 1`, later ones `200 ok` |
//! | `GET /missing/<id>` | `404` with the body `no such order` |
//! | `POST`, `GET` or `HEAD /see-other-busy/<id>` | `303` to `/busy/<id>`: `429` with `retry-after-ms: 10` |
//! | `POST /see-other-unauth/<id>` | `303` to `/unauth/<id>`: `401` |
//! | `GET /elsewhere/<path>` | `302` to `/<path>` on the server's second port: another origin, with the same answers and counts |
//! | `GET /gzip-stored/<id>` | `200` with 100 `x`, gzip-encoded in 123 bytes (one stored deflate block) |
//! | `GET /stall-body/<id>` | `200` announcing 100 body bytes, sends 10 (`0123456789`), then nothing until the client closes |
//! | `GET /cut-once/<id>` | first request `200` announcing 100 body bytes, sends 10 (`0123456789`), then closes the connection; later ones `200` with 100 `x` |
//! | `GET /stall-head/<id>` | nothing at all until the client closes (counted as a request) |
//! | `GET /stall-error/<id>` | `503` announcing 100 body bytes, sends 10 (`0123456789`), then nothing until the client closes |
//! | `GET /long-error/<id>` | `503` announcing 1,000,000 body bytes, sends 4,096 (`e`), then nothing until the client closes |
//! | `GET /credentials/<id>` | `200` with the body `<cookie>\|<cookie2>\|<proxy-authorization>\|<sec-token>\|<authorization>`: those headers' values, `-` for one not sent |
//! | `GET /count?path=<path>` | how many requests (not preflights) `<path>` received |
//! | `GET /closed?path=<path>` | how many of `<path>`'s stalled answers above the client closed (or reset) the connection of |
//! | `GET /preflights?path=<path>` | how many `OPTIONS` preflights `<path>` received |
//! | `GET /closed-port` | a port on 127.0.0.1 that nothing listens on: the server bound it at its start and closed it at once (not counted) |
//! | anything else | `200 ok` |
//!
//! Every answer carries `Access-Control-Allow-Origin: *`,
//! `Access-Control-Expose-Headers: retry-after, retry-after-ms, x-request-id` (so a
//! browser lets the client read them) and an `x-request-id` naming the path and the
//! request's number. A `HEAD` is answered with the head alone, as HTTP has it (a
//! body after it would be read as the next answer on the connection). Every request
//! and preflight is logged to stderr.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

const EXPOSED: &str = "retry-after, retry-after-ms, x-request-id";

#[derive(Default)]
struct Counts {
    requests: HashMap<String, u64>,
    preflights: HashMap<String, u64>,
    /// Stalled answers whose connection the client closed.
    closed: HashMap<String, u64>,
}

/// The paths whose answer stalls (the head, or the body after a part of it) until
/// the client closes the connection.
const STALLING: [&str; 4] = [
    "/stall-head/",
    "/stall-body/",
    "/stall-error/",
    "/long-error/",
];

type Shared = Arc<Mutex<Counts>>;

/// A port the server bound and closed at its start, for a test of a refused
/// connection (an ephemeral port: nothing else is likely to take it meanwhile).
static CLOSED_PORT: OnceLock<u16> = OnceLock::new();

/// A second port on 127.0.0.1 that serves the same answers (and counts), another
/// origin for redirects to cross.
static OTHER_PORT: OnceLock<u16> = OnceLock::new();

fn main() {
    let max_seconds = parse_max_seconds();
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local address");
    // Bound, then closed at the end of the statement.
    let closed_port = TcpListener::bind("127.0.0.1:0")
        .and_then(|closed| closed.local_addr())
        .expect("bind a second port")
        .port();
    CLOSED_PORT.get_or_init(|| closed_port);
    let other = TcpListener::bind("127.0.0.1:0").expect("bind another port");
    OTHER_PORT.get_or_init(|| other.local_addr().expect("local address").port());
    println!("listening on {addr}");
    std::io::stdout().flush().expect("flush stdout");

    // Stop by ourselves after max_seconds, whatever happens to the parent.
    std::thread::spawn(move || {
        let (_keep, wait) = mpsc::channel::<()>();
        let _ = wait.recv_timeout(Duration::from_secs(max_seconds));
        eprintln!("fault_server: {max_seconds} s are up, exiting");
        std::process::exit(0);
    });

    let counts = Shared::default();
    let for_other = Arc::clone(&counts);
    std::thread::spawn(move || accept(&other, &for_other));
    accept(&listener, &counts);
}

/// Serves each connection `listener` accepts on a thread of its own.
fn accept(listener: &TcpListener, counts: &Shared) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let counts = Arc::clone(counts);
        std::thread::spawn(move || {
            if let Err(e) = serve(stream, &counts) {
                eprintln!("fault_server: connection error: {e}");
            }
        });
    }
}

fn parse_max_seconds() -> u64 {
    let mut args = std::env::args().skip(1);
    let mut max = 900;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--max-seconds" => {
                max = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--max-seconds takes a whole number of seconds");
            }
            other => panic!("unknown argument {other:?}; usage: fault_server [--max-seconds N]"),
        }
    }
    max
}

/// Serves the requests of one connection (keep-alive) until the peer closes it.
fn serve(stream: TcpStream, counts: &Shared) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let mut parts = line.split_whitespace();
        let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
            return Ok(());
        };
        let (method, target) = (method.to_owned(), target.to_owned());

        let mut headers = HashMap::new();
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header)? == 0 {
                return Ok(());
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
            }
        }
        // Discard a request body.
        let length: u64 = headers
            .get("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        std::io::copy(&mut (&mut reader).take(length), &mut std::io::sink())?;

        let mut reply = answer(&method, &target, &headers, counts);
        if method == "HEAD"
            && let Some(end) = reply.windows(4).position(|w| w == b"\r\n\r\n")
        {
            reply.truncate(end + 4);
        }
        let stalls = method != "OPTIONS" && STALLING.iter().any(|p| target.starts_with(p));
        // A body cut off: the connection closes after the part that was sent.
        let path = target.split_once('?').map_or(target.as_str(), |(p, _)| p);
        let cut = method != "OPTIONS"
            && path.starts_with("/cut-once/")
            && counts
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .requests
                .get(path)
                == Some(&1);
        // A stalled head is counted, never answered.
        if !target.starts_with("/stall-head/") || !stalls {
            writer.write_all(&reply)?;
            writer.flush()?;
        }
        if cut {
            eprintln!("fault_server: cut {path}'s body off");
            return Ok(());
        }
        if stalls {
            // The rest never comes: wait for the client to give up, and count it when
            // it closes or resets the connection (not when the read times out).
            let closed = match reader.read_to_end(&mut Vec::new()) {
                Ok(_) => true,
                Err(e) => !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
            };
            if closed {
                let path = target.split_once('?').map_or(target.as_str(), |(p, _)| p);
                let mut counts = counts.lock().unwrap_or_else(PoisonError::into_inner);
                *counts.closed.entry(path.to_owned()).or_default() += 1;
                eprintln!("fault_server: the client closed {path}'s connection");
            }
            return Ok(());
        }
    }
}

/// The whole HTTP response to one request.
fn answer(
    method: &str,
    target: &str,
    headers: &HashMap<String, String>,
    counts: &Shared,
) -> Vec<u8> {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut counts = counts.lock().unwrap_or_else(PoisonError::into_inner);

    if method == "OPTIONS" {
        let n = {
            let n = counts.preflights.entry(path.to_owned()).or_default();
            *n += 1;
            *n
        };
        drop(counts);
        eprintln!("fault_server: OPTIONS {path} (preflight {n}, not counted as a request)");
        let requested = headers
            .get("access-control-request-headers")
            .map_or("", String::as_str);
        return response(
            "204 No Content",
            &[
                (
                    "access-control-allow-methods",
                    "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS",
                ),
                ("access-control-allow-headers", requested),
                ("access-control-max-age", "0"),
            ],
            "",
        );
    }

    let query_path = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("path="))
        .map(percent_decode)
        .unwrap_or_default();
    match path {
        "/count" => {
            let n = counts.requests.get(&query_path).copied().unwrap_or(0);
            return response("200 OK", &[], &n.to_string());
        }
        "/preflights" => {
            let n = counts.preflights.get(&query_path).copied().unwrap_or(0);
            return response("200 OK", &[], &n.to_string());
        }
        "/closed" => {
            let n = counts.closed.get(&query_path).copied().unwrap_or(0);
            return response("200 OK", &[], &n.to_string());
        }
        "/closed-port" => {
            let port = CLOSED_PORT.get().copied().unwrap_or(0);
            return response("200 OK", &[], &port.to_string());
        }
        _ => {}
    }

    let n = {
        let n = counts.requests.entry(path.to_owned()).or_default();
        *n += 1;
        *n
    };
    drop(counts);
    eprintln!("fault_server: {method} {path} (request {n})");
    let request_id = format!("req-{}-{n}", path.trim_start_matches('/').replace('/', "-"));
    let id = ("x-request-id", request_id.as_str());
    if path.starts_with("/flaky/") && n == 1 {
        response(
            "503 Service Unavailable",
            &[id, ("retry-after", "1")],
            "busy",
        )
    } else if let Some(rest) = path.strip_prefix("/see-other-busy/") {
        let to = format!("/busy/{rest}");
        response("303 See Other", &[id, ("location", to.as_str())], "")
    } else if let Some(rest) = path.strip_prefix("/see-other-unauth/") {
        let to = format!("/unauth/{rest}");
        response("303 See Other", &[id, ("location", to.as_str())], "")
    } else if let Some(rest) = path.strip_prefix("/elsewhere/") {
        let port = OTHER_PORT.get().copied().unwrap_or(0);
        let to = format!("http://127.0.0.1:{port}/{rest}");
        response("302 Found", &[id, ("location", to.as_str())], "")
    } else if path.starts_with("/busy/") {
        response(
            "429 Too Many Requests",
            &[id, ("retry-after-ms", "10")],
            "slow down",
        )
    } else if path.starts_with("/unauth/") {
        response("401 Unauthorized", &[id], "who are you")
    } else if path.starts_with("/gzip-stored/") {
        gzip_stored(&[b'x'; 100], id)
    } else if path.starts_with("/missing/") {
        response("404 Not Found", &[id], "no such order")
    } else if path.starts_with("/cut-once/") {
        let whole = response("200 OK", &[id], &"x".repeat(100));
        if n == 1 {
            part_of(whole, 100, b"0123456789")
        } else {
            whole
        }
    } else if path.starts_with("/stall-body/") {
        part_of(
            response("200 OK", &[id], &"x".repeat(100)),
            100,
            b"0123456789",
        )
    } else if path.starts_with("/stall-error/") {
        let full = response("503 Service Unavailable", &[id], &"x".repeat(100));
        part_of(full, 100, b"0123456789")
    } else if path.starts_with("/credentials/") {
        let value = |name: &str| headers.get(name).map_or("-", String::as_str);
        let body = [
            "cookie",
            "cookie2",
            "proxy-authorization",
            "sec-token",
            "authorization",
        ]
        .map(value)
        .join("|");
        response("200 OK", &[id], &body)
    } else if path.starts_with("/long-error/") {
        let full = response("503 Service Unavailable", &[id], &"e".repeat(1_000_000));
        part_of(full, 1_000_000, &[b'e'; 4096])
    } else {
        response("200 OK", &[id], "ok")
    }
}

/// A `200` whose body is `plain` gzip-encoded in one stored (uncompressed) deflate
/// block: 23 bytes longer on the wire than once fetch has decoded it.
fn gzip_stored(plain: &[u8], id: (&str, &str)) -> Vec<u8> {
    let len = u16::try_from(plain.len()).expect("a stored block holds at most 65,535 bytes");
    let mut gzip = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    gzip.push(1); // the last block, stored
    gzip.extend_from_slice(&len.to_le_bytes());
    gzip.extend_from_slice(&(!len).to_le_bytes());
    gzip.extend_from_slice(plain);
    gzip.extend_from_slice(&crc32(plain).to_le_bytes());
    gzip.extend_from_slice(&(plain.len() as u32).to_le_bytes());
    let mut bytes = format!(
        "HTTP/1.1 200 OK\r\n\
         access-control-allow-origin: *\r\n\
         access-control-expose-headers: {EXPOSED}\r\n\
         content-encoding: gzip\r\n\
         content-type: text/plain\r\n\
         content-length: {}\r\n\
         {}: {}\r\n\r\n",
        gzip.len(),
        id.0,
        id.1
    )
    .into_bytes();
    bytes.extend_from_slice(&gzip);
    bytes
}

/// CRC-32 (IEEE), for the gzip trailer.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A whole response whose last `body_len` bytes (its body) are replaced by `part`:
/// the head announces more than is sent.
fn part_of(mut whole: Vec<u8>, body_len: usize, part: &[u8]) -> Vec<u8> {
    whole.truncate(whole.len() - body_len);
    whole.extend_from_slice(part);
    whole
}

fn response(status: &str, extra: &[(&str, &str)], body: &str) -> Vec<u8> {
    let mut head = format!(
        "HTTP/1.1 {status}\r\n\
         access-control-allow-origin: *\r\n\
         access-control-expose-headers: {EXPOSED}\r\n\
         content-type: text/plain\r\n\
         content-length: {}\r\n",
        body.len()
    );
    for (name, value) in extra {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body.as_bytes());
    bytes
}

/// Decodes `%XX` escapes (the test escapes `/` in the `path=` parameter).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| bytes.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
