//! # vantage-api-pool-wasm
//!
//! `WasmRuntime`: the [`Runtime`](vantage_api_pool::Runtime) port of
//! `vantage-api-pool` for `wasm32-unknown-unknown` in browsers and Node.
//!
//! | port method | here |
//! |---|---|
//! | `now` | `performance.now()`, measured from the value it had when the runtime was made |
//! | `wall_clock` | `Date.now()` |
//! | `sleep_until` | `Sleep`: a `setTimeout` that re-checks the clock when it fires and re-arms if it fired early; `clearTimeout` when dropped |
//! | `random` | `Math.random()` |
//!
//! `performance`, `setTimeout` and `clearTimeout` are bound as globals, so the same
//! build works in a browser window, a worker and Node (where there is no `window`).
//!
//! The runtime and its futures hold JavaScript values and are not `Send`: run the
//! pool's calls with `wasm_bindgen_futures::spawn_local` or await them directly.
//!
//! # Other targets
//!
//! On any target but `wasm32` this crate is empty: it compiles, so a workspace that
//! builds for several targets need not gate the dependency, but it exports nothing.
//! Its API is documented on `wasm32` (`cargo doc --target wasm32-unknown-unknown`).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

#[cfg(target_arch = "wasm32")]
mod wasm;

#[cfg(target_arch = "wasm32")]
pub use wasm::{Sleep, WasmRuntime};
