//! What `ResilientClient` costs next to raw reqwest and its peers (issue 6).
//!
//! One process, one thread: a current-thread tokio runtime runs a loopback HTTP/1.1
//! keep-alive server (plain tokio TCP answering every request with a fixed
//! 2-byte `200`) and the clients under test, all on one shared `reqwest::Client`:
//!
//! | kind | what one request is |
//! |---|---|
//! | `reqwest` | `client.get(url).send()`, body read to its end |
//! | `timeout` | a reference, not a peer: raw reqwest with a time limit, the same request under `tokio::time::timeout(10 s)` (the one tokio timer per request that `ResilientClient`'s attempt time limit costs too) |
//! | `parts` | a reference, not a peer: raw reqwest plus what `ResilientClient` does around one successful send, as separate calls with no attempt loop (three clock readings, breaker check and record, a rate token, a permit, `Started` and `Succeeded` to the same counting observer, `timeout_at` over `TokioRuntime`): the floor of any client built from the pool's parts |
//! | `resilient` | `ResilientClient` over `ReqwestTransport` + `TokioRuntime`: default breaker, a rate bucket of 1e9/s, `max_parallel(1024)`, a counting observer; `execute_with(&CallPolicy::bounded(RetryPolicy::default()), \|http\| http.get(url))`, body read to its end |
//! | `middleware` | reqwest-middleware + `RetryTransientMiddleware` (exponential back-off, 3 retries) |
//! | `tower` | `ServiceBuilder`: `buffer(1024)` (tower's rate limit is per service value; the buffer shares one stack between the concurrent callers) + `concurrency_limit(1024)` + `rate_limit(1e9 / s)` + `retry` with a policy that clones the request and never retries, around `reqwest::Client` |
//! | `floor` | not a client: a hand-written HTTP/1.1 exchange on a raw `TcpStream` (write the request, read the fixed answer). Its cost is the server's, the kernel's and the runtime's share of every request, so `kind - floor` estimates what the client itself spends |
//!
//! For each concurrency (1, 16, 128) a kind runs N requests from `c` spawned tasks.
//! A round runs every kind at every concurrency, the kinds in an order rotated each
//! round; the CPU time of the thread (`clock_gettime(CLOCK_THREAD_CPUTIME_ID)`,
//! nanoseconds, user + kernel, client and server) is read around each run. Reported per kind and
//! concurrency: the median over the rounds of (CPU per request of the kind) / (CPU
//! per request of raw reqwest in the same round), with a distribution-free 95 %
//! confidence interval of that median (two order statistics of the rounds), and the
//! same ratio for the client's own share (`(kind - floor) / (reqwest - floor)`). The
//! interval says how well one run pins its median; separate runs on a shared
//! machine can differ by more than it (see the README).
//!
//! Pin it to one core for steadier numbers; `benches/peers.sh` does that and adds
//! instructions per request from valgrind (`--only KIND CONC N` runs one measured
//! section, `callgrind_measured_section`, for callgrind to count).
//!
//! Run: `cargo bench -p vantage-api-pool-reqwest --bench peers`
//! (`PEERS_ROUNDS`, default 31, and `PEERS_SCALE`, a factor on the request counts,
//! default 1).

#[cfg(not(target_arch = "wasm32"))]
fn main() {
    native::main();
}

#[cfg(target_arch = "wasm32")]
fn main() {}

#[cfg(not(target_arch = "wasm32"))]
mod native {
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::task::JoinHandle;
    use tower::limit::{ConcurrencyLimit, RateLimit};
    use tower::retry::Retry;
    use tower::{Service, ServiceBuilder, ServiceExt};
    use vantage_api_pool::breaker::{BreakerConfig, CircuitBreaker, Gate};
    use vantage_api_pool::classify::BreakerEffect;
    use vantage_api_pool::concurrency::Limiter;
    use vantage_api_pool::rate::TokenBucket;
    use vantage_api_pool::{
        CallId, CallPolicy, EventKind, ResilientClient, RetryPolicy, Runtime, TransportEvent,
        TransportObserver, timeout_at,
    };
    use vantage_api_pool_reqwest::{ReqwestTransport, TokioRuntime};

    /// The server's answer to every request.
    const RESPONSE: &[u8] =
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n\r\nok";
    const CONCURRENCIES: [usize; 3] = [1, 16, 128];
    /// The largest concurrency: the floor keeps this many raw connections.
    const MAX_CONC: usize = 128;
    /// The reference kind's time limit: `ResilientClient`'s default attempt limit.
    const ATTEMPT_LIMIT: Duration = vantage_api_pool::policy::DEFAULT_ATTEMPT_TIMEOUT;
    const DEFAULT_ROUNDS: usize = 31;

    /// Requests per run at concurrency `conc` (before `PEERS_SCALE`).
    fn base_requests(conc: usize) -> usize {
        match conc {
            1 => 8_000,
            16 => 12_800,
            _ => 25_600,
        }
    }

    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    enum Kind {
        Floor,
        Reqwest,
        Timeout,
        Parts,
        Resilient,
        Middleware,
        Tower,
    }

    impl Kind {
        const ALL: [Kind; 7] = [
            Kind::Floor,
            Kind::Reqwest,
            Kind::Timeout,
            Kind::Parts,
            Kind::Resilient,
            Kind::Middleware,
            Kind::Tower,
        ];

        fn name(self) -> &'static str {
            match self {
                Kind::Floor => "floor",
                Kind::Reqwest => "reqwest",
                Kind::Timeout => "timeout",
                Kind::Parts => "parts",
                Kind::Resilient => "resilient",
                Kind::Middleware => "middleware",
                Kind::Tower => "tower",
            }
        }

        fn label(self) -> &'static str {
            match self {
                Kind::Floor => "floor (raw TCP, no client)",
                Kind::Reqwest => "raw reqwest",
                Kind::Timeout => "raw reqwest + a 10 s tokio timeout (reference)",
                Kind::Parts => "raw reqwest + the contract's parts in line (reference)",
                Kind::Resilient => "ResilientClient",
                Kind::Middleware => "reqwest-middleware + reqwest-retry",
                Kind::Tower => "tower (buffer, limit, rate, retry)",
            }
        }

        fn parse(s: &str) -> Option<Kind> {
            Kind::ALL.into_iter().find(|k| k.name() == s)
        }
    }

    /// Counts events: an observer that is on, and nearly free.
    #[derive(Default)]
    struct CountingObserver(AtomicU64);

    impl TransportObserver for CountingObserver {
        fn on_event(&self, _api: &str, _event: &TransportEvent) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A tower retry policy that keeps a copy of the request, as a retry must, and
    /// never retries.
    #[derive(Clone, Copy)]
    struct NeverRetry;

    impl<Res, E> tower::retry::Policy<reqwest::Request, Res, E> for NeverRetry {
        type Future = std::future::Ready<()>;

        fn retry(
            &mut self,
            _req: &mut reqwest::Request,
            _result: &mut Result<Res, E>,
        ) -> Option<Self::Future> {
            None
        }

        fn clone_request(&mut self, req: &reqwest::Request) -> Option<reqwest::Request> {
            req.try_clone()
        }
    }

    /// What `ResilientClient` must do around one successful send, as separate parts
    /// with no attempt loop: the `parts` reference.
    struct Parts {
        runtime: TokioRuntime,
        breaker: CircuitBreaker,
        bucket: TokenBucket,
        limiter: Limiter,
        observer: Arc<dyn TransportObserver>,
    }

    type TowerInner = ConcurrencyLimit<RateLimit<Retry<NeverRetry, reqwest::Client>>>;
    type TowerStack =
        tower::buffer::Buffer<reqwest::Request, <TowerInner as Service<reqwest::Request>>::Future>;

    /// Everything a run needs.
    struct Bench {
        url: Arc<str>,
        addr: SocketAddr,
        reqwest: reqwest::Client,
        resilient: ResilientClient<ReqwestTransport, TokioRuntime>,
        policy: CallPolicy,
        observer: Arc<CountingObserver>,
        parts: Arc<Parts>,
        middleware: reqwest_middleware::ClientWithMiddleware,
        tower: TowerStack,
        /// The floor's keep-alive connections, lent to its tasks for a run.
        raw: Vec<TcpStream>,
    }

    /// One server connection: answers every complete request head with `RESPONSE`.
    async fn serve(mut stream: TcpStream) {
        let mut buf = vec![0u8; 16 * 1024];
        let mut filled = 0;
        let mut out = Vec::new();
        loop {
            let n = match stream.read(&mut buf[filled..]).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            filled += n;
            let mut start = 0;
            let mut answers = 0;
            while let Some(end) = buf[start..filled].windows(4).position(|w| w == b"\r\n\r\n") {
                start += end + 4;
                answers += 1;
            }
            buf.copy_within(start..filled, 0);
            filled -= start;
            assert!(filled < buf.len(), "request head too large");
            let result = if answers == 1 {
                stream.write_all(RESPONSE).await
            } else {
                out.clear();
                for _ in 0..answers {
                    out.extend_from_slice(RESPONSE);
                }
                stream.write_all(&out).await
            };
            if result.is_err() {
                return;
            }
        }
    }

    async fn start_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                stream.set_nodelay(true).expect("nodelay");
                tokio::spawn(serve(stream));
            }
        });
        addr
    }

    async fn setup() -> Bench {
        let addr = start_server().await;
        let url: Arc<str> = format!("http://{addr}/").into();
        // One client under every kind: the same connection pool, the same settings.
        let reqwest = reqwest::Client::builder()
            .no_proxy()
            .retry(reqwest::retry::never())
            .build()
            .expect("reqwest client");
        let observer = Arc::new(CountingObserver::default());
        let resilient =
            ResilientClient::builder(ReqwestTransport::new(reqwest.clone()), TokioRuntime::new())
                .default_breaker()
                .rate_limit(1e9)
                .max_parallel(1024)
                .observer("bench", observer.clone())
                .build()
                .expect("valid settings");
        let policy = CallPolicy::bounded(RetryPolicy::default());
        let parts = Arc::new(Parts {
            runtime: TokioRuntime::new(),
            breaker: CircuitBreaker::new(BreakerConfig::default_breaker()),
            bucket: TokenBucket::new(
                vantage_api_pool::rate::RateLimit::per_second(1e9).expect("rate"),
            ),
            limiter: Limiter::new(1024).expect("limit"),
            observer: observer.clone(),
        });
        let middleware = reqwest_middleware::ClientBuilder::new(reqwest.clone())
            .with(reqwest_retry::RetryTransientMiddleware::new_with_policy(
                reqwest_retry::policies::ExponentialBackoff::builder().build_with_max_retries(3),
            ))
            .build();
        let tower = ServiceBuilder::new()
            .buffer(1024)
            .concurrency_limit(1024)
            .rate_limit(1_000_000_000, Duration::from_secs(1))
            .retry(NeverRetry)
            .service(reqwest.clone());
        let mut raw = Vec::with_capacity(MAX_CONC);
        for _ in 0..MAX_CONC {
            let stream = TcpStream::connect(addr).await.expect("connect");
            stream.set_nodelay(true).expect("nodelay");
            raw.push(stream);
        }
        Bench {
            url,
            addr,
            reqwest,
            resilient,
            policy,
            observer,
            parts,
            middleware,
            tower,
            raw,
        }
    }

    async fn floor_task(mut stream: TcpStream, request: Arc<[u8]>, n: usize) -> TcpStream {
        let mut buf = [0u8; 256];
        for _ in 0..n {
            stream.write_all(&request).await.expect("floor write");
            let mut got = 0;
            while got < RESPONSE.len() {
                let k = stream.read(&mut buf[got..]).await.expect("floor read");
                assert!(k > 0, "server closed");
                got += k;
            }
            debug_assert_eq!(&buf[..got], RESPONSE);
        }
        stream
    }

    async fn reqwest_task(client: reqwest::Client, url: Arc<str>, n: usize) {
        for _ in 0..n {
            let response = client.get(&*url).send().await.expect("reqwest");
            assert!(response.status().is_success());
            std::hint::black_box(response.bytes().await.expect("body"));
        }
    }

    async fn timeout_task(client: reqwest::Client, url: Arc<str>, n: usize) {
        for _ in 0..n {
            let response = tokio::time::timeout(ATTEMPT_LIMIT, client.get(&*url).send())
                .await
                .expect("in time")
                .expect("reqwest");
            assert!(response.status().is_success());
            std::hint::black_box(response.bytes().await.expect("body"));
        }
    }

    /// The floor of any implementation built from the pool's parts: the gate's clock
    /// reading, breaker, rate token and permit, `Started`, the send's clock reading and
    /// time limit (`timeout_at` over `TokioRuntime`), the head's clock reading, the
    /// breaker told, `Succeeded`. No loop, no retry state, no call id.
    async fn parts_task(parts: Arc<Parts>, client: reqwest::Client, url: Arc<str>, n: usize) {
        for i in 0..n as u64 {
            let p = &*parts;
            let now = p.runtime.now();
            assert_eq!(p.breaker.check(now), Gate::Allow { probe: None });
            p.bucket.try_take(now).expect("rate token");
            let permit = p.limiter.try_acquire().expect("permit");
            let call = Some(CallId(i));
            let kind = EventKind::Started {
                send: 1,
                attempt: 1,
            };
            p.observer
                .on_event("bench", &TransportEvent::new(now, call, kind));
            let started = p.runtime.now();
            let response = timeout_at(
                &p.runtime,
                started.saturating_add(ATTEMPT_LIMIT),
                client.get(&*url).send(),
            )
            .await
            .expect("in time")
            .expect("reqwest");
            drop(permit);
            let head_at = p.runtime.now();
            p.breaker.record(BreakerEffect::Success, None, head_at);
            let kind = EventKind::Succeeded {
                send: 1,
                attempt: 1,
                status: response.status(),
                ms: head_at.saturating_duration_since(started).as_millis() as u64,
                bytes: response.content_length(),
            };
            p.observer
                .on_event("bench", &TransportEvent::new(head_at, call, kind));
            assert!(response.status().is_success());
            std::hint::black_box(response.bytes().await.expect("body"));
        }
    }

    async fn resilient_task(
        client: ResilientClient<ReqwestTransport, TokioRuntime>,
        policy: CallPolicy,
        url: Arc<str>,
        n: usize,
    ) {
        for _ in 0..n {
            let response = client
                .execute_with(&policy, |http| http.get(&*url))
                .await
                .expect("resilient")
                .into_inner();
            assert!(response.status().is_success());
            std::hint::black_box(response.bytes().await.expect("body"));
        }
    }

    async fn middleware_task(
        client: reqwest_middleware::ClientWithMiddleware,
        url: Arc<str>,
        n: usize,
    ) {
        for _ in 0..n {
            let response = client.get(&*url).send().await.expect("middleware");
            assert!(response.status().is_success());
            std::hint::black_box(response.bytes().await.expect("body"));
        }
    }

    async fn tower_task(mut svc: TowerStack, client: reqwest::Client, url: Arc<str>, n: usize) {
        for _ in 0..n {
            let request = client.get(&*url).build().expect("request");
            let response = svc
                .ready()
                .await
                .expect("ready")
                .call(request)
                .await
                .expect("tower");
            assert!(response.status().is_success());
            std::hint::black_box(response.bytes().await.expect("body"));
        }
    }

    async fn join<T>(handles: Vec<JoinHandle<T>>) -> Vec<T> {
        let mut out = Vec::with_capacity(handles.len());
        for h in handles {
            out.push(h.await.expect("task"));
        }
        out
    }

    /// `total` requests of `kind` from `conc` tasks (each `total / conc` in a row).
    async fn run(bench: &mut Bench, kind: Kind, conc: usize, total: usize) {
        let n = total / conc;
        let url = &bench.url;
        match kind {
            Kind::Floor => {
                let request: Arc<[u8]> = format!(
                    "GET / HTTP/1.1\r\naccept: */*\r\nhost: {}\r\n\r\n",
                    bench.addr
                )
                .into_bytes()
                .into();
                let lent: Vec<_> = bench.raw.drain(..conc).collect();
                let handles = lent
                    .into_iter()
                    .map(|s| tokio::spawn(floor_task(s, request.clone(), n)))
                    .collect();
                let back = join(handles).await;
                bench.raw.extend(back);
            }
            Kind::Reqwest => {
                let handles = (0..conc)
                    .map(|_| tokio::spawn(reqwest_task(bench.reqwest.clone(), url.clone(), n)))
                    .collect();
                join(handles).await;
            }
            Kind::Timeout => {
                let handles = (0..conc)
                    .map(|_| tokio::spawn(timeout_task(bench.reqwest.clone(), url.clone(), n)))
                    .collect();
                join(handles).await;
            }
            Kind::Parts => {
                let handles = (0..conc)
                    .map(|_| {
                        tokio::spawn(parts_task(
                            bench.parts.clone(),
                            bench.reqwest.clone(),
                            url.clone(),
                            n,
                        ))
                    })
                    .collect();
                join(handles).await;
            }
            Kind::Resilient => {
                let handles = (0..conc)
                    .map(|_| {
                        tokio::spawn(resilient_task(
                            bench.resilient.clone(),
                            bench.policy.clone(),
                            url.clone(),
                            n,
                        ))
                    })
                    .collect();
                join(handles).await;
            }
            Kind::Middleware => {
                let handles = (0..conc)
                    .map(|_| {
                        tokio::spawn(middleware_task(bench.middleware.clone(), url.clone(), n))
                    })
                    .collect();
                join(handles).await;
            }
            Kind::Tower => {
                let handles = (0..conc)
                    .map(|_| {
                        tokio::spawn(tower_task(
                            bench.tower.clone(),
                            bench.reqwest.clone(),
                            url.clone(),
                            n,
                        ))
                    })
                    .collect();
                join(handles).await;
            }
        }
    }

    /// CPU time this thread has used, in nanoseconds (user and kernel), read with
    /// `clock_gettime(CLOCK_THREAD_CPUTIME_ID)`, which counts up to the moment of the
    /// call. (`/proc/thread-self/schedstat`, read before, is only brought up to date at
    /// a scheduler tick or switch: steps of up to 4 ms, which made the ratios of short
    /// runs jump in steps of several per cent.)
    fn thread_cpu_ns() -> u64 {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
        u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
    }

    fn threads() -> usize {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Threads:"))
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0)
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime")
    }

    fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    }

    fn scaled(conc: usize, scale: f64) -> usize {
        // A multiple of the concurrency, at least one request per task.
        let n = ((base_requests(conc) as f64 * scale) as usize).max(conc);
        n / conc * conc
    }

    /// The section callgrind counts (`--toggle-collect=*callgrind_measured_section*`).
    #[inline(never)]
    fn callgrind_measured_section(
        rt: &tokio::runtime::Runtime,
        bench: &mut Bench,
        kind: Kind,
        conc: usize,
        total: usize,
    ) {
        rt.block_on(run(bench, kind, conc, total));
    }

    /// The size of one request's future for each kind (bytes moved and kept per
    /// request in flight).
    fn print_future_sizes(bench: &Bench) {
        let url = &*bench.url;
        let raw = bench.reqwest.get(url).send();
        let resilient = bench
            .resilient
            .execute_with(&bench.policy, |http| http.get(url));
        let middleware = bench.middleware.get(url).send();
        println!(
            "future sizes: reqwest {} B, resilient {} B, middleware {} B",
            std::mem::size_of_val(&raw),
            std::mem::size_of_val(&resilient),
            std::mem::size_of_val(&middleware),
        );
    }

    /// `--only KIND CONC N`: a warm-up, then N requests of one kind in the measured
    /// section; prints the requests and CPU time for the section.
    fn only(args: &[String]) {
        let usage = "usage: peers --only KIND CONC N (KIND: floor|reqwest|timeout|parts|resilient|middleware|tower)";
        let kind = args.first().and_then(|k| Kind::parse(k)).expect(usage);
        let conc: usize = args.get(1).and_then(|c| c.parse().ok()).expect(usage);
        let total: usize = args.get(2).and_then(|c| c.parse().ok()).expect(usage);
        assert!(
            (1..=MAX_CONC).contains(&conc) && total.is_multiple_of(conc),
            "CONC in 1..=128, N a multiple of it"
        );
        let rt = runtime();
        let mut bench = rt.block_on(setup());
        print_future_sizes(&bench);
        rt.block_on(run(
            &mut bench,
            kind,
            conc,
            (total / 4).max(conc) / conc * conc,
        ));
        let before = thread_cpu_ns();
        callgrind_measured_section(&rt, &mut bench, kind, conc, total);
        let cpu = thread_cpu_ns() - before;
        println!(
            "only kind={} conc={conc} requests={total} cpu_ns_per_request={:.0}",
            kind.name(),
            cpu as f64 / total as f64
        );
    }

    fn quantile(sorted: &[f64], q: f64) -> f64 {
        let pos = q * (sorted.len() - 1) as f64;
        let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
        sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
    }

    /// The 1-based ranks of the order statistics that bound a distribution-free
    /// confidence interval of at least 95 % for the median of `n` values: the largest
    /// `k` with P(Binomial(n, 1/2) <= k - 1) <= 2.5 %, and `n + 1 - k` (for 31
    /// values, the 10th and the 22nd, 97 %). Below 6 values no such interval exists
    /// and the whole range is given (k = 1).
    fn median_ci_ranks(n: usize) -> (usize, usize) {
        let ln_half_pow_n = n as f64 * 0.5f64.ln();
        // ln C(n, i), and P(B <= i) summed term by term (in logs, so no term
        // underflows for a large n).
        let (mut ln_choose, mut cdf, mut k) = (0.0f64, 0.0f64, 0);
        for i in 0..n {
            cdf += (ln_choose + ln_half_pow_n).exp();
            if cdf > 0.025 {
                break;
            }
            k = i + 1;
            ln_choose += ((n - i) as f64).ln() - ((i + 1) as f64).ln();
        }
        let k = k.max(1);
        (k, n + 1 - k)
    }

    /// Median, and the bounds of its 95 % confidence interval ([`median_ci_ranks`]).
    fn summary(mut v: Vec<f64>) -> (f64, f64, f64) {
        v.sort_by(f64::total_cmp);
        let (lo, hi) = median_ci_ranks(v.len());
        (quantile(&v, 0.5), v[lo - 1], v[hi - 1])
    }

    #[allow(clippy::disallowed_methods, clippy::disallowed_types)] // wall time on purpose
    fn cpu_table() {
        let rounds: usize = env_or("PEERS_ROUNDS", DEFAULT_ROUNDS).max(1);
        let scale: f64 = env_or("PEERS_SCALE", 1.0);
        let rt = runtime();
        let mut bench = rt.block_on(setup());
        let started = std::time::Instant::now();

        // Warm-up: open every connection, fill every cache, at every concurrency.
        for conc in CONCURRENCIES {
            for kind in Kind::ALL {
                rt.block_on(run(&mut bench, kind, conc, scaled(conc, scale / 10.0)));
            }
        }

        // per_request[conc index][kind index][round] = CPU ns per request.
        let mut per_request = vec![vec![Vec::with_capacity(rounds); Kind::ALL.len()]; 3];
        for round in 0..rounds {
            for (ci, conc) in CONCURRENCIES.into_iter().enumerate() {
                let total = scaled(conc, scale);
                for i in 0..Kind::ALL.len() {
                    let ki = (i + round) % Kind::ALL.len();
                    let before = thread_cpu_ns();
                    rt.block_on(run(&mut bench, Kind::ALL[ki], conc, total));
                    let cpu = thread_cpu_ns() - before;
                    per_request[ci][ki].push(cpu as f64 / total as f64);
                }
            }
            eprintln!(
                "round {}/{rounds} done ({:.0} s)",
                round + 1,
                started.elapsed().as_secs_f64()
            );
        }
        let extra_threads = threads();
        let events = bench.observer.0.load(Ordering::Relaxed);

        let ki = |k: Kind| Kind::ALL.iter().position(|&x| x == k).expect("kind");
        let (floor, raw) = (ki(Kind::Floor), ki(Kind::Reqwest));
        let cell = |ci: usize, k: usize, client_only: bool| -> String {
            let ratios: Vec<f64> = (0..rounds)
                .map(|r| {
                    let (kind, base) = (per_request[ci][k][r], per_request[ci][raw][r]);
                    if client_only {
                        let f = per_request[ci][floor][r];
                        (kind - f) / (base - f)
                    } else {
                        kind / base
                    }
                })
                .collect();
            let (m, lo, hi) = summary(ratios);
            format!("{m:.3} ({lo:.3}-{hi:.3})")
        };

        // One row per kind that is compared with raw reqwest.
        let ratio_rows = |client_only: bool| {
            for kind in [
                Kind::Timeout,
                Kind::Parts,
                Kind::Resilient,
                Kind::Middleware,
                Kind::Tower,
            ] {
                let k = ki(kind);
                println!(
                    "| {} | {} | {} | {} |",
                    kind.label(),
                    cell(0, k, client_only),
                    cell(1, k, client_only),
                    cell(2, k, client_only)
                );
            }
        };

        println!();
        println!(
            "CPU time per request (client + server, one thread), ratio to raw reqwest: \
             median (95 % confidence interval of the median) of {rounds} interleaved \
             rounds; \
             {} / {} / {} requests per run at c = 1 / 16 / 128",
            scaled(1, scale),
            scaled(16, scale),
            scaled(128, scale)
        );
        println!();
        println!("| client | c=1 | c=16 | c=128 |");
        println!("|---|---|---|---|");
        let abs = |k: usize| -> String {
            CONCURRENCIES
                .iter()
                .enumerate()
                .map(|(ci, _)| {
                    let (m, _, _) = summary(per_request[ci][k].clone());
                    format!("{:.1} us", m / 1000.0)
                })
                .collect::<Vec<_>>()
                .join(" | ")
        };
        println!("| raw reqwest, absolute | {} |", abs(raw));
        println!("| floor (raw TCP, no client), absolute | {} |", abs(floor));
        ratio_rows(false);
        println!();
        println!("Client's own share, (kind - floor) / (raw reqwest - floor), same rounds:");
        println!();
        println!("| client | c=1 | c=16 | c=128 |");
        println!("|---|---|---|---|");
        ratio_rows(true);
        println!();
        println!(
            "({} observer events; threads in the process: {extra_threads}; {:.0} s)",
            events,
            started.elapsed().as_secs_f64()
        );
        if extra_threads > 1 {
            println!("warning: more than one thread: the thread's CPU time misses some work");
        }
    }

    pub(crate) fn main() {
        let args: Vec<String> = std::env::args().skip(1).collect();
        match args.iter().position(|a| a == "--only") {
            Some(i) => only(&args[i + 1..]),
            None => cpu_table(),
        }
    }
}
