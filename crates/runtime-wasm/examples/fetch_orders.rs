//! The README's browser and Node example: a `ResilientClient` over reqwest (fetch)
//! and `WasmRuntime`, exported to JavaScript as an async function.
//!
//! Compiled for wasm32 by `cargo clippy --target wasm32-unknown-unknown --examples`
//! (scripts/test);
//! on other targets it is an empty program.
//!
//! In an application crate (`crate-type = ["cdylib"]`, built with `wasm-pack` or
//! `wasm-bindgen`), JavaScript then calls `await order_count("https://api.example.com")`
//! and gets a string or a thrown `Error`. Rust code that is already async calls
//! `client.execute(...)` directly, or starts it with `wasm_bindgen_futures::spawn_local`.

#[cfg(target_arch = "wasm32")]
mod demo {
    use vantage_api_pool::{CallPolicy, ResilientClient, RetryPolicy};
    use vantage_api_pool_reqwest::{ReqwestTransport, reqwest};
    use vantage_api_pool_wasm::WasmRuntime;
    use wasm_bindgen::prelude::{JsError, wasm_bindgen};

    /// Fetches `{base}/orders/count` with retries, and returns its body.
    #[allow(
        unreachable_pub,
        reason = "exported to JavaScript; in an application's cdylib this is its API"
    )]
    #[wasm_bindgen]
    pub async fn order_count(base: String) -> Result<String, JsError> {
        // One client per API; keep it (e.g. in a thread_local) rather than building
        // one per call, so the breaker and the rate limit see every call.
        let client = ResilientClient::builder(
            ReqwestTransport::new(reqwest::Client::new()),
            WasmRuntime::new(),
        )
        .max_parallel(4)
        .build()?;

        let url = format!("{base}/orders/count");
        // Bounded: 3 retries, a 10 s attempt timeout, a 30 s budget. A JavaScript
        // promise cannot be cancelled, so a call awaited from JavaScript should not
        // use `CallPolicy::essential` (retry until the future is dropped).
        let policy = CallPolicy::bounded(RetryPolicy::default());
        let response = client.execute_with(&policy, |http| http.get(&url)).await?;
        // On wasm32 the loop hands over the response unread.
        let body = response
            .into_inner()
            .ok_or_else(|| JsError::new("the body was already read"))?
            .text()
            .await?;
        Ok(body)
    }
}

fn main() {}
