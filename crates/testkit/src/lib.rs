//! # vantage-api-pool-testkit
//!
//! Prove your retry policies on virtual time: thirty simulated seconds of back-off,
//! time limits and `Retry-After` pass in microseconds, the same way every run.
//!
//! Three pieces, each implementing one port of `vantage-api-pool`:
//!
//! | type | port | what it gives a test |
//! |---|---|---|
//! | [`VirtualRuntime`] | [`Runtime`](vantage_api_pool::Runtime) (as [`SendRuntime`](vantage_api_pool::runtime::SendRuntime)) | a virtual clock, seeded jitter, a settable wall clock, and a driver that runs many concurrent calls on one thread |
//! | [`ScriptedTransport`] | [`Transport`](vantage_api_pool::Transport) (as [`SendTransport`](vantage_api_pool::transport::SendTransport)) | answers from a script ([`Reply`]): statuses, headers, bodies, transport errors, delays, stalls; records every request with its virtual time |
//! | [`RecordingObserver`] | [`TransportObserver`](vantage_api_pool::TransportObserver) | keeps every event and checks the observer contract |
//!
//! # How virtual time moves
//!
//! The clock starts at [`Instant::ORIGIN`](vantage_api_pool::Instant::ORIGIN) and
//! moves only when every task of the driver is parked: it then jumps to the earliest
//! pending timer, and every timer at that deadline fires, in creation order. So a
//! test never waits in real time, and a run depends only on its script and its seed.
//! When everything is parked and no timer could fire (none is pending, or only ones
//! at `Instant::FAR_FUTURE`), the driver returns
//! [`DriveError::Deadlock`] instead of hanging; a task that never stops waking itself
//! ends in [`DriveError::StepLimit`], and one that keeps waiting for the next timer
//! (a call that retries forever) in [`DriveError::TimeLimit`] after a day of virtual
//! time.
//!
//! Only this driver moves the clock. A future that waits on a `VirtualRuntime` (a
//! call, a sleep, a scripted delay) must run inside [`VirtualRuntime::block_on`] or a
//! task [`spawn`](VirtualRuntime::spawn)ed on it: awaited under `#[tokio::test]` or
//! another executor, nothing advances the clock and it waits forever as soon as it
//! sleeps (a call with nothing to wait for still ends there, so such a test can pass
//! until a scripted reply gets a delay or the call has to retry). The first sleep
//! left waiting that way prints [`UNDRIVEN_HINT`] on stderr (captured by the test
//! harness: shown with a failing test's output or under `--nocapture`, so a test that
//! hangs shows it only under `--nocapture`; not after a [`VirtualRuntime::advance`],
//! for a test that moves the clock by hand), and [`VirtualRuntime::undriven_sleeps`]
//! counts them.
//!
//! # Testing your own policy
//!
//! Build the client over a [`ScriptedTransport`] and a [`VirtualRuntime`], script
//! what the API answers, run the call with [`VirtualRuntime::block_on`] (or spawn
//! several and [`run`](VirtualRuntime::run) them), then assert on the result, on
//! [`ScriptedTransport::requests`] (what was sent, when, with which headers) and on
//! [`RecordingObserver::events`]. Keep clones of the transport and observer you give
//! the client: clones share their script and record.
//!
//! The same pieces work below the client. Here a send that answers `503` after
//! 200 ms, a back-off sleep on the virtual clock, and a second send that stalls until
//! a 10 s time limit cuts it:
//!
//! ```
//! use std::time::Duration;
//! use vantage_api_pool::{Transport, TransportResponse, timeout_at};
//! use vantage_api_pool_testkit::{Reply, ScriptedTransport, VirtualRuntime};
//!
//! let rt = VirtualRuntime::new().with_seed(7);
//! let transport = ScriptedTransport::new(&rt);
//! transport.push(Reply::status(503).header("retry-after", "2").after(Duration::from_millis(200)));
//! transport.push(Reply::stall());
//!
//! let second = rt.block_on(async {
//!     // First send: the 503 arrives at +200 ms.
//!     let request = transport.prepare(transport.handle().get("/orders"))?;
//!     let response = transport.send(request).await?;
//!     assert_eq!(response.status(), 503);
//!     assert_eq!(rt.elapsed(), Duration::from_millis(200));
//!
//!     // The back-off sleep (what a policy would decide) passes in no real time.
//!     rt.sleep(Duration::from_secs(2)).await;
//!
//!     // Second send: it stalls, and the time limit ends it at exactly +10 s.
//!     let request = transport.prepare(transport.handle().get("/orders"))?;
//!     let deadline = rt.now() + Duration::from_secs(10);
//!     Ok::<_, vantage_api_pool::TransportError>(
//!         timeout_at(&rt, deadline, transport.send(request)).await,
//!     )
//! })??;
//!
//! assert!(second.is_err()); // Elapsed: the time limit won
//! assert_eq!(rt.elapsed(), Duration::from_millis(12_200));
//! let sent: Vec<_> = transport.requests().iter().map(|r| r.at.since_origin()).collect();
//! assert_eq!(sent, [Duration::ZERO, Duration::from_millis(2_200)]);
//! assert_eq!(transport.in_flight(), 0); // the cut send was dropped
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Cost
//!
//! Everything is built to run the real attempt loop millions of times: clones share
//! one `Arc`, a sleep is one map insert and one removal, a send locks once, and
//! recording is switchable off on both the transport
//! ([`ScriptedTransport::record`]) and the observer ([`RecordingObserver::record`]),
//! leaving only counters.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![warn(clippy::missing_errors_doc)]

pub mod observer;
pub mod runtime;
mod timers;
pub mod transport;

pub use observer::{ContractRule, ContractViolation, RecordedEvent, RecordingObserver};
pub use runtime::{
    DEFAULT_SEED, DEFAULT_STEP_LIMIT, DEFAULT_TIME_LIMIT, DEFAULT_WALL_CLOCK_SECS, DriveError,
    JoinHandle, Sleep, UNDRIVEN_HINT, VirtualRuntime,
};
pub use transport::{
    RecordedRequest, Reply, ScriptedHttp, ScriptedRequest, ScriptedRequestBuilder,
    ScriptedResponse, ScriptedTransport,
};
/// Re-exported so tests name the same `vantage-api-pool` as the testkit:
///
/// ```
/// use vantage_api_pool_testkit::vantage_api_pool::Runtime;
/// let _ = vantage_api_pool_testkit::VirtualRuntime::new().now();
/// ```
pub use vantage_api_pool;
