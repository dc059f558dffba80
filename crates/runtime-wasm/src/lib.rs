//! # vantage-api-pool-wasm
//!
//! `WasmRuntime`: the [`Runtime`](vantage_api_pool::Runtime) port of
//! `vantage-api-pool` for `wasm32-unknown-unknown` in browsers, workers and Node.
//!
//! | port method | here |
//! |---|---|
//! | `now` | `performance.now()`, measured from the value it had when the runtime was made |
//! | `wall_clock` | `Date.now()` |
//! | `sleep_until` | `Sleep`: a `setTimeout` that re-checks the clock when it fires and re-arms if it fired early; `clearTimeout` when dropped |
//! | `random` | `Math.random()`, or SplitMix64 from `WasmRuntime::with_seed` |
//!
//! `performance`, `Date`, `setTimeout` and `clearTimeout` are bound as globals, so
//! the same build works in a browser window, a worker and Node 18 or later (where
//! there is no `window`). `WasmRuntime::try_new` checks that they are there and
//! returns a `MissingGlobal` error if not; `WasmRuntime::new` does not check, and a
//! missing one throws when first called. Nothing here reads `std::time::Instant` or
//! `SystemTime::now()`, both of which panic on `wasm32-unknown-unknown`.
//!
//! The runtime and its futures hold JavaScript values and are not `Send`: run the
//! pool's calls with `wasm_bindgen_futures::spawn_local`, or return them to
//! JavaScript as a promise with `wasm_bindgen_futures::future_to_promise`. A sleep's
//! timer wakes whichever task polled it last, so any single-threaded executor that
//! returns to the JavaScript event loop between polls drives it. One that blocks
//! the thread instead (`futures::executor::block_on`, `pollster`) never lets the
//! timer's callback run: its sleeps never end, and it spins.
//!
//! # Other targets
//!
//! On any target but `wasm32` this crate is empty: it compiles, so a workspace that
//! builds for several targets need not gate the dependency, but it exports nothing.
//! Its API is documented on `wasm32` (`cargo doc --target wasm32-unknown-unknown`).
//!
//! # Examples and tests
//!
//! - `examples/fetch_orders.rs`: a client over reqwest (fetch) and `WasmRuntime`,
//!   exported to JavaScript as an async function.
//! - `tests/wasm_runtime.rs`: the runtime on the real JavaScript clock and timers;
//!   `tests/reqwest_client.rs`: a real client against `examples/fault_server.rs`, a
//!   native HTTP server on 127.0.0.1. `scripts/wasm-test` runs both, with the pool's
//!   scenario suite, in Node and in headless Chromium.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![warn(clippy::missing_errors_doc)]

#[cfg(target_arch = "wasm32")]
mod wasm;

#[cfg(target_arch = "wasm32")]
pub use wasm::{MissingGlobal, Sleep, WasmRuntime};

/// Re-exported so callers name the same `vantage-api-pool` as this runtime.
#[cfg(target_arch = "wasm32")]
pub use vantage_api_pool;
