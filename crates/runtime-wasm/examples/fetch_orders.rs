//! The README's browser and Node example: a `ResilientClient` over reqwest (fetch)
//! and `WasmRuntime`, exported to JavaScript as an async function.
//!
//! Compiled for wasm32 by `cargo clippy --target wasm32-unknown-unknown --examples`
//! (scripts/test), and built, run through `wasm-bindgen --target nodejs` and called
//! from Node by `fetch_orders_node.js` (scripts/wasm-test); on other targets it is an
//! empty program.
//!
//! In an application crate (`crate-type = ["cdylib"]`, built with `wasm-pack` or
//! `wasm-bindgen`), JavaScript then calls `await order_count("https://api.example.com")`
//! and gets a string or a thrown `Error`. Rust code that is already async calls
//! `client.execute(...)` directly, or starts it with `wasm_bindgen_futures::spawn_local`.

use vantage_api_pool::{ClientBuilder, Runtime, Transport};

/// The API's settings, in one function over any builder, so that the wasm32 client
/// below and native tests on virtual time (a `ScriptedTransport` and a
/// `VirtualRuntime`) use the same ones.
#[allow(
    unreachable_pub,
    reason = "in an application's library, its native tests call it"
)]
pub fn orders_settings<T: Transport, R: Runtime>(
    builder: ClientBuilder<T, R>,
) -> ClientBuilder<T, R> {
    builder.max_parallel(4)
}

#[cfg(target_arch = "wasm32")]
mod demo {
    use std::time::Duration;

    use vantage_api_pool::{CallPolicy, ResilientClient, RetryPolicy};
    use vantage_api_pool_reqwest::{ReqwestTransport, reqwest};
    use vantage_api_pool_wasm::WasmRuntime;
    use wasm_bindgen::prelude::{JsError, wasm_bindgen};

    type Client = ResilientClient<ReqwestTransport, WasmRuntime>;

    thread_local! {
        // One client per API, kept for the page's (or worker's) life, so the
        // breaker and the rate limit see every call. Its settings are constants, so
        // building it cannot fail.
        static ORDERS_API: Client = super::orders_settings(ResilientClient::builder(
            ReqwestTransport::new(reqwest::Client::new()),
            WasmRuntime::new(),
        ))
        .build()
        .expect("valid settings");
    }

    /// Fetches `{base}/orders/count` with retries, and returns its body.
    #[allow(
        unreachable_pub,
        reason = "exported to JavaScript; in an application's cdylib this is its API"
    )]
    #[wasm_bindgen]
    pub async fn order_count(base: String) -> Result<String, JsError> {
        // Clones are cheap and share the client's state.
        let client = ORDERS_API.with(Client::clone);
        let url = format!("{base}/orders/count");
        // Bounded: 3 retries, a 10 s attempt timeout, a 30 s budget. A JavaScript
        // promise cannot be cancelled, so a call awaited from JavaScript should not
        // use `CallPolicy::essential` (retry until the future is dropped).
        let policy = CallPolicy::bounded(RetryPolicy::default());
        // fetch has no read timeout, and the body is read outside the policy's
        // limits: the request's own timeout is what ends a body that stalls.
        let response = client
            .execute_with(&policy, |http| {
                http.get(&url).timeout(Duration::from_secs(30))
            })
            .await?;
        Ok(response.text().await?)
    }
}

fn main() {}
