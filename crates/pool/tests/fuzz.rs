//! Property tests (run in CI) for the two parsers of untrusted input: server-delay
//! headers and error-body truncation. `PROPTEST_CASES=100000` runs them longer.
//! Native only: proptest's randomness does not build for wasm32.
#![cfg(not(target_arch = "wasm32"))]

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use proptest::prelude::*;
use vantage_api_pool::MAX_ERROR_BODY;
use vantage_api_pool::error::truncate_body;
use vantage_api_pool::server_delay::{clamped_server_delay, server_delay};

/// 512 cases per property in CI; `PROPTEST_CASES=N` for a longer run.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(512)
}

fn wall() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600)
}

fn headers(pairs: &[(&'static str, Vec<u8>)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        if let Ok(v) = HeaderValue::from_bytes(value) {
            map.append(*name, v);
        }
    }
    map
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// Any bytes in either header: no panic, and a result is positive and bounded by
    /// the ceiling once clamped.
    #[test]
    fn any_header_bytes_parse_without_panicking(
        ms in proptest::collection::vec(any::<u8>(), 0..40),
        secs in proptest::collection::vec(any::<u8>(), 0..40),
        ceiling_ms in 0u64..100_000,
    ) {
        let map = headers(&[("retry-after-ms", ms), ("retry-after", secs)]);
        if let Some(d) = server_delay(&map, wall()) {
            prop_assert!(d > Duration::ZERO);
        }
        let ceiling = Duration::from_millis(ceiling_ms);
        if let Some(d) = clamped_server_delay(&map, wall(), ceiling) {
            prop_assert!(d <= ceiling);
        }
    }

    /// Text shaped like the valid forms parses to exactly its value.
    #[test]
    fn valid_forms_parse_exactly(seconds in 1u64..10_000_000, millis in 1u64..10_000_000, frac in 0u32..1000) {
        let map = headers(&[("retry-after", seconds.to_string().into_bytes())]);
        prop_assert_eq!(server_delay(&map, wall()), Some(Duration::from_secs(seconds)));
        let map = headers(&[("retry-after-ms", format!("{millis}.{frac:03}").into_bytes())]);
        let want = Duration::from_millis(millis) + Duration::from_micros(u64::from(frac));
        prop_assert_eq!(server_delay(&map, wall()), Some(want));
        let date = httpdate::fmt_http_date(wall() + Duration::from_secs(seconds));
        let map = headers(&[("retry-after", date.into_bytes())]);
        prop_assert_eq!(server_delay(&map, wall()), Some(Duration::from_secs(seconds)));
    }

    /// Truncation keeps a prefix of at most 2048 bytes; text stays text, and only a
    /// split character is dropped.
    #[test]
    fn truncation_keeps_a_bounded_prefix(bytes in proptest::collection::vec(any::<u8>(), 0..6000)) {
        let cut = truncate_body(Bytes::from(bytes.clone()));
        prop_assert!(cut.len() <= MAX_ERROR_BODY);
        prop_assert!(bytes.starts_with(&cut));
        if bytes.len() <= MAX_ERROR_BODY {
            prop_assert_eq!(cut.len(), bytes.len());
        }
    }

    #[test]
    fn truncation_of_text_stays_text(text in "\\PC{0,2600}") {
        let cut = truncate_body(Bytes::from(text.clone()));
        let kept = std::str::from_utf8(&cut);
        prop_assert!(kept.is_ok());
        prop_assert!(text.len() <= MAX_ERROR_BODY || cut.len() + 4 > MAX_ERROR_BODY);
    }
}
