//! Server-requested delays: `retry-after-ms` and `Retry-After`.
//!
//! A response may ask the client to wait before the next attempt. [`server_delay`]
//! reads `retry-after-ms` first; when that header is absent or unusable it reads
//! `Retry-After`. Anything it does not accept is ignored (`None`), and the attempt
//! loop then falls back to the policy's own back-off: an odd header never makes a
//! client retry sooner, later or forever by accident. [`clamped_server_delay`] caps
//! the result at the policy's ceiling.
//!
//! Rules shared by both headers:
//!
//! | input | result |
//! |---|---|
//! | spaces or tabs around the value (`" 15 "`) | trimmed (RFC 9110 optional whitespace) |
//! | whitespace inside the value (`1 5`) | ignored |
//! | empty value, or only whitespace | ignored |
//! | non-ASCII or non-UTF-8 bytes | ignored |
//! | the header on two or more lines, the same value on each (`5` and ` 5`) | read as one line |
//! | the header on two or more lines whose values differ (`5` and `6`) | ignored as ambiguous |
//! | a comma-joined list (`1, 2`, `5, 5`) | ignored (a browser's `fetch` joins a header's repeated lines this way, so on wasm32 a repeated header is ignored even when its lines agree) |
//!
//! `retry-after-ms` (milliseconds):
//!
//! | input | result |
//! |---|---|
//! | ASCII digits (`1500`) | that many milliseconds |
//! | digits `.` digits (`1500.5`, `0.5`) | fractional milliseconds, digits past the nanosecond dropped (rounded down) |
//! | a dot without digits on both sides (`1500.`, `.5`, `1.2.3`) | ignored |
//! | a sign (`+1`, `-1`), an exponent (`1e3`), `inf`, `NaN` | ignored |
//! | zero (`0`, `0.0`), or a value under 1 ns (`0.0000001`) | ignored |
//! | more than [`Duration::MAX`] (`999…` with 30 digits) | ignored (see below) |
//! | ignored for any reason above | `Retry-After` is read instead |
//!
//! `Retry-After` (RFC 9110 §10.2.3):
//!
//! | input | result |
//! |---|---|
//! | ASCII digits (`120`) | that many seconds, up to `u64::MAX` seconds |
//! | `0` | ignored |
//! | a sign (`+1`, `-1`), a fraction (`1.5`), an exponent (`1e3`) | ignored |
//! | more than `u64::MAX` seconds (`99999999999999999999999`) | ignored (see below) |
//! | an HTTP-date (IMF-fixdate, RFC 850 or asctime) after `wall_now` | the date minus `wall_now` |
//! | an RFC 850 date's two-digit year (`Sunday, 29-Nov-26 …`) | the latest year with those last two digits that puts the date at most 50 years after `wall_now` (RFC 9110 §5.6.7: one more than 50 years ahead is read as a century earlier, in the past) |
//! | an HTTP-date at or before `wall_now` | ignored |
//! | any other date format (`2026-11-29T10:00:00Z`) or text | ignored |
//!
//! A date far in the future (year 9999) is accepted as is; the clamp to the policy's
//! ceiling keeps it sensible.
//!
//! A number too large to hold (more than `u64::MAX` seconds, or milliseconds past
//! [`Duration::MAX`]) is ignored like any other value the client cannot read as
//! given, as the project's design decides for overflowing values: the policy's own
//! back-off applies, and on a 503 it is no valid server delay, so a call that is not
//! idempotent is not sent again (the server may have processed it). An overflowing
//! `retry-after-ms` leaves `Retry-After` to be read. Any number that fits, however
//! large, is a delay, which the ceiling cuts to the policy's longest wait.

use std::time::{Duration, SystemTime};

use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderName};

/// Header name constant for `retry-after-ms`.
pub const RETRY_AFTER_MS: &str = "retry-after-ms";

/// [`RETRY_AFTER_MS`] as a header name: looked up without parsing a string each time.
const RETRY_AFTER_MS_NAME: HeaderName = HeaderName::from_static(RETRY_AFTER_MS);

const NANOS_PER_MILLI: u128 = 1_000_000;
const NANOS_PER_SEC: u128 = 1_000_000_000;
/// Fraction digits of a millisecond value that still count: 6 reach the nanosecond.
const MS_FRACTION_DIGITS: u32 = 6;

/// The delay a response asks for, or None when it asks for none or asks in a form we
/// ignore.
///
/// `wall_now` is the runtime's wall clock, used only for an HTTP-date `Retry-After`.
/// See the [module tables](self) for every accepted and ignored form.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use vantage_api_pool::http::{HeaderMap, HeaderValue};
/// use vantage_api_pool::server_delay::server_delay;
///
/// let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777); // 06 Nov 1994 08:49:37
/// let mut headers = HeaderMap::new();
/// headers.insert("retry-after", HeaderValue::from_static("Sun, 06 Nov 1994 08:50:37 GMT"));
/// assert_eq!(server_delay(&headers, now), Some(Duration::from_secs(60)));
/// headers.insert("retry-after-ms", HeaderValue::from_static("1500.5"));
/// assert_eq!(server_delay(&headers, now), Some(Duration::from_micros(1_500_500)));
/// ```
#[must_use]
pub fn server_delay(headers: &HeaderMap, wall_now: SystemTime) -> Option<Duration> {
    single_value(headers, &RETRY_AFTER_MS_NAME)
        .and_then(parse_retry_after_ms)
        .or_else(|| {
            single_value(headers, &RETRY_AFTER).and_then(|v| parse_retry_after(v, wall_now))
        })
}

/// `server_delay` clamped to `ceiling` (the policy's max): min(delay, ceiling).
///
/// Within the ceiling a retry never leaves earlier than the server asked. The result
/// is not floored here: the attempt loop applies
/// [`MIN_BACKOFF`](crate::backoff::MIN_BACKOFF) to every delay it sleeps.
#[must_use]
pub fn clamped_server_delay(
    headers: &HeaderMap,
    wall_now: SystemTime,
    ceiling: Duration,
) -> Option<Duration> {
    server_delay(headers, wall_now).map(|d| d.min(ceiling))
}

/// The header's value with optional whitespace trimmed, if it is visible ASCII, not
/// empty, and the same on every line the header occurs on (a proxy that repeats a
/// line does not hide the delay; two lines that disagree are ambiguous).
fn single_value<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a str> {
    let mut all = headers.get_all(name).iter();
    let text = trimmed(all.next()?)?;
    for other in all {
        if trimmed(other)? != text {
            return None;
        }
    }
    (!text.is_empty()).then_some(text)
}

/// The value as text without the optional whitespace around it; `None` for anything
/// but visible ASCII, space and tab (what `to_str` refuses).
fn trimmed(value: &http::HeaderValue) -> Option<&str> {
    Some(value.to_str().ok()?.trim_matches([' ', '\t']))
}

/// `retry-after-ms`: digits, optionally `.` and more digits.
fn parse_retry_after_ms(text: &str) -> Option<Duration> {
    let (whole, fraction) = match text.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (text, None),
    };
    let mut nanos = digits_value(whole)?.checked_mul(NANOS_PER_MILLI)?;
    if let Some(fraction) = fraction {
        if fraction.is_empty() || !fraction.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        // The first six digits are nanoseconds; later ones are dropped (round down).
        let mut sub: u128 = 0;
        let mut digits = fraction.bytes();
        for _ in 0..MS_FRACTION_DIGITS {
            let d = digits.next().map_or(0, |b| b - b'0');
            sub = sub * 10 + u128::from(d);
        }
        nanos = nanos.checked_add(sub)?;
    }
    if nanos == 0 {
        return None;
    }
    duration_from_nanos(nanos)
}

/// `Retry-After`: whole seconds or an HTTP-date.
fn parse_retry_after(text: &str, wall_now: SystemTime) -> Option<Duration> {
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return match u64::try_from(digits_value(text)?) {
            Ok(0) | Err(_) => None,
            Ok(secs) => Some(Duration::from_secs(secs)),
        };
    }
    let date = match rfc850_as_imf_fixdate(text, wall_now) {
        Some(fixdate) => httpdate::parse_http_date(&fixdate),
        None => httpdate::parse_http_date(text),
    }
    .ok()?;
    let ahead = date.duration_since(wall_now).ok()?;
    (!ahead.is_zero()).then_some(ahead)
}

/// An RFC 850 date (`Sunday, 29-Nov-26 10:00:10 GMT`) as an IMF-fixdate whose year
/// RFC 9110 §5.6.7 picks: of the years ending in its two digits, the latest that puts
/// the date at most 50 years after `wall_now` (to the second: a date in the 50th
/// year on that comes later in its year than `wall_now` is in its own is read a
/// century earlier). `None` for any other text (parsed as it is),
/// and for a `wall_now` an HTTP-date cannot hold (before 1970, from 9999): the date
/// parser's own reading (`00` to `69` as 20xx) then stands.
fn rfc850_as_imf_fixdate(text: &str, wall_now: SystemTime) -> Option<String> {
    const WEEKDAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    /// 9999-01-01T00:00:00Z, the first instant an HTTP-date cannot hold.
    const YEAR_9999: Duration = Duration::from_secs(253_402_300_800);
    let (weekday, rest) = text.split_once(", ")?;
    // `29-Nov-26 10:00:10 GMT`: the two-digit year at 7..9 (the text is ASCII).
    let bytes = rest.as_bytes();
    if !WEEKDAYS.contains(&weekday)
        || bytes.len() != 22
        || bytes[2] != b'-'
        || bytes[6] != b'-'
        || !bytes[7..9].iter().all(u8::is_ascii_digit)
    {
        return None;
    }
    let since_epoch = wall_now.duration_since(SystemTime::UNIX_EPOCH).ok()?;
    if since_epoch >= YEAR_9999 {
        return None;
    }
    // `Sun, 29 Nov 2026 10:00:00 GMT`: the year at 12..16.
    let now = httpdate::fmt_http_date(wall_now);
    let this_year: u32 = now.get(12..16)?.parse().ok()?;
    let two_digits = u32::from(bytes[7] - b'0') * 10 + u32::from(bytes[8] - b'0');
    let (day, month, time) = (rest.get(0..2)?, rest.get(3..6)?, rest.get(10..)?);
    // The first year ending in those digits not before `wall_now`'s; if the date in
    // it is more than 50 years ahead, the century before (in the past: ignored).
    let mut year = this_year - this_year % 100 + two_digits;
    if year < this_year {
        year += 100;
    }
    if year > this_year + 50 || year == this_year + 50 && later_in_year((month, day, time), &now) {
        year -= 100;
    }
    Some(format!(
        "{}, {day} {month} {year} {time}",
        weekday.get(..3)?
    ))
}

/// Whether `(month, day, time)` of a date (`Nov`, `29`, `10:00:10 GMT`) comes later
/// in a year than the same parts of IMF-fixdate `now` (`Sun, 29 Nov 2026 10:00:00
/// GMT`). Both days have two digits and both times are `HH:MM:SS`, so they compare
/// as text; an unknown month is not later (the date parser then refuses it).
fn later_in_year((month, day, time): (&str, &str, &str), now: &str) -> bool {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let index = |name: Option<&str>| MONTHS.iter().position(|m| Some(*m) == name);
    let (Some(date_month), Some(now_month)) = (index(Some(month)), index(now.get(8..11))) else {
        return false;
    };
    (date_month, Some(day), time.get(..8)) > (now_month, now.get(5..7), now.get(17..25))
}

/// A non-empty run of ASCII digits as a number; `None` on any other byte, or when
/// it is larger than a `u128` holds.
fn digits_value(text: &str) -> Option<u128> {
    if text.is_empty() {
        return None;
    }
    text.bytes().try_fold(0u128, |acc, b| {
        if !b.is_ascii_digit() {
            return None;
        }
        acc.checked_mul(10)?.checked_add(u128::from(b - b'0'))
    })
}

/// A `Duration` from nanoseconds; `None` past [`Duration::MAX`].
fn duration_from_nanos(nanos: u128) -> Option<Duration> {
    let secs = u64::try_from(nanos / NANOS_PER_SEC).ok()?;
    // The remainder is under a billion.
    let sub = u32::try_from(nanos % NANOS_PER_SEC).ok()?;
    Some(Duration::new(secs, sub))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    /// 2026-11-29T10:00:00Z, the wall clock of every test.
    const NOW_SECS: u64 = 1_795_946_400;

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(NOW_SECS)
    }

    fn headers(lines: &[(&str, &[u8])]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in lines {
            let name = http::HeaderName::from_bytes(name.as_bytes()).expect("test header name");
            let value = HeaderValue::from_bytes(value).expect("test header value");
            map.append(name, value);
        }
        map
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// Seconds from `NOW_SECS` to 31 Dec 9999 23:59:59 GMT.
    const TO_9999: u64 = 253_402_300_799 - NOW_SECS;

    type Case = (
        &'static str,
        &'static [(&'static str, &'static [u8])],
        Option<Duration>,
    );

    const MS: &str = "retry-after-ms";
    const RA: &str = "retry-after";

    fn cases() -> Vec<Case> {
        vec![
            // retry-after-ms
            ("ms integer", &[(MS, b"1500")], Some(ms(1500))),
            (
                "ms decimal",
                &[(MS, b"1500.5")],
                Some(Duration::from_micros(1_500_500)),
            ),
            (
                "ms below one",
                &[(MS, b"0.5")],
                Some(Duration::from_micros(500)),
            ),
            (
                "ms nanosecond",
                &[(MS, b"0.000001")],
                Some(Duration::from_nanos(1)),
            ),
            (
                "ms sub-nanosecond rounds down",
                &[(MS, b"1.0000019")],
                Some(Duration::from_nanos(1_000_001)),
            ),
            ("ms rounds to zero", &[(MS, b"0.0000009")], None),
            ("ms leading zeros", &[(MS, b"007")], Some(ms(7))),
            ("ms zero", &[(MS, b"0")], None),
            ("ms zero decimal", &[(MS, b"0.0")], None),
            ("ms negative", &[(MS, b"-1")], None),
            ("ms plus sign", &[(MS, b"+1")], None),
            ("ms exponent", &[(MS, b"1e3")], None),
            ("ms inf", &[(MS, b"inf")], None),
            ("ms NaN", &[(MS, b"NaN")], None),
            ("ms trailing dot", &[(MS, b"1500.")], None),
            ("ms leading dot", &[(MS, b".5")], None),
            ("ms two dots", &[(MS, b"1.2.3")], None),
            (
                "ms whitespace trimmed",
                &[(MS, b" \t1500 \t")],
                Some(ms(1500)),
            ),
            ("ms internal space", &[(MS, b"1 5")], None),
            (
                "ms overflow",
                &[(MS, b"999999999999999999999999999999")],
                None,
            ),
            (
                "ms at Duration::MAX's whole milliseconds",
                &[(MS, b"18446744073709551615999")],
                Some(Duration::new(u64::MAX, 999_000_000)),
            ),
            (
                "ms at Duration::MAX to the nanosecond",
                &[(MS, b"18446744073709551615999.999999")],
                Some(Duration::MAX),
            ),
            (
                "ms just past Duration::MAX",
                &[(MS, b"18446744073709551616000")],
                None,
            ),
            (
                // Fits a u128 as milliseconds, not once scaled to nanoseconds (where
                // a wrapping product would read as under a millisecond).
                "ms past u128 only in nanoseconds",
                &[(MS, b"340282366920938463463374607431769")],
                None,
            ),
            (
                "ms past u128 in milliseconds",
                &[(MS, b"340282366920938463463374607431768211456")],
                None,
            ),
            ("ms empty", &[(MS, b"")], None),
            ("ms only whitespace", &[(MS, b"  ")], None),
            ("ms non-ASCII digits", &[(MS, b"\xd9\xa1\xd9\xa5")], None), // "١٥" in UTF-8
            ("ms non-UTF-8", &[(MS, b"\xff15")], None),
            ("ms comma list", &[(MS, b"1, 2")], None),
            (
                "ms repeated",
                &[(MS, b"1500"), (MS, b"1500")],
                Some(ms(1500)),
            ),
            (
                "ms repeated differing",
                &[(MS, b"1500"), (MS, b"1500.0")],
                None,
            ),
            (
                "ms wins over Retry-After",
                &[(MS, b"250"), (RA, b"7")],
                Some(ms(250)),
            ),
            (
                "ms invalid falls through",
                &[(MS, b"-1"), (RA, b"7")],
                Some(secs(7)),
            ),
            (
                "two ms fall through",
                &[(MS, b"1"), (MS, b"2"), (RA, b"7")],
                Some(secs(7)),
            ),
            (
                "ms empty falls through",
                &[(MS, b""), (RA, b"3")],
                Some(secs(3)),
            ),
            // Retry-After: seconds
            ("seconds", &[(RA, b"120")], Some(secs(120))),
            ("seconds trimmed", &[(RA, b"\t 5 ")], Some(secs(5))),
            ("seconds zero", &[(RA, b"0")], None),
            ("seconds negative", &[(RA, b"-1")], None),
            ("seconds plus sign", &[(RA, b"+1")], None),
            ("seconds fraction", &[(RA, b"1.5")], None),
            ("seconds exponent", &[(RA, b"1e3")], None),
            ("seconds internal space", &[(RA, b"1 5")], None),
            (
                "seconds overflow",
                &[(RA, b"99999999999999999999999")],
                None,
            ),
            (
                "seconds u64::MAX",
                &[(RA, b"18446744073709551615")],
                Some(secs(u64::MAX)),
            ),
            (
                "seconds u64::MAX + 1",
                &[(RA, b"18446744073709551616")],
                None,
            ),
            (
                "seconds past u128",
                &[(RA, b"340282366920938463463374607431768211456")],
                None,
            ),
            ("seconds comma list", &[(RA, b"1, 2")], None),
            (
                "Retry-After repeated",
                &[(RA, b"5"), (RA, b" 5\t"), (RA, b"5")],
                Some(secs(5)),
            ),
            ("Retry-After lines differ", &[(RA, b"5"), (RA, b"6")], None),
            (
                "Retry-After differs on a later line",
                &[(RA, b"5"), (RA, b"5"), (RA, b"50")],
                None,
            ),
            (
                "Retry-After repeated, one line non-ASCII",
                &[(RA, b"5"), (RA, b"5\xe9")],
                None,
            ),
            ("Retry-After repeated empty", &[(RA, b""), (RA, b" ")], None),
            ("seconds empty", &[(RA, b"")], None),
            ("seconds non-UTF-8", &[(RA, b"\xe95")], None),
            // Retry-After: HTTP-date (now is Sun, 29 Nov 2026 10:00:00 GMT)
            (
                "IMF-fixdate",
                &[(RA, b"Sun, 29 Nov 2026 10:01:30 GMT")],
                Some(secs(90)),
            ),
            (
                "IMF-fixdate trimmed",
                &[(RA, b"  Sun, 29 Nov 2026 10:01:30 GMT ")],
                Some(secs(90)),
            ),
            (
                "RFC 850",
                &[(RA, b"Sunday, 29-Nov-26 10:00:10 GMT")],
                Some(secs(10)),
            ),
            (
                "asctime",
                &[(RA, b"Sun Nov 29 10:00:20 2026")],
                Some(secs(20)),
            ),
            ("past date", &[(RA, b"Sun, 06 Nov 1994 08:49:37 GMT")], None),
            (
                "date equal to now",
                &[(RA, b"Sun, 29 Nov 2026 10:00:00 GMT")],
                None,
            ),
            (
                "one second past",
                &[(RA, b"Sun, 29 Nov 2026 09:59:59 GMT")],
                None,
            ),
            (
                "year 9999",
                &[(RA, b"Fri, 31 Dec 9999 23:59:59 GMT")],
                Some(secs(TO_9999)),
            ),
            ("garbage date", &[(RA, b"soon, please")], None),
            ("ISO 8601 date", &[(RA, b"2026-11-29T10:00:00Z")], None),
            (
                "wrong weekday",
                &[(RA, b"Mon, 29 Nov 2026 10:01:30 GMT")],
                None,
            ),
            (
                "two dates joined",
                &[(
                    RA,
                    b"Sun, 29 Nov 2026 10:01:30 GMT, Sun, 29 Nov 2026 10:01:30 GMT",
                )],
                None,
            ),
            ("no headers", &[], None),
            ("unrelated header", &[("x-retry", b"5")], None),
        ]
    }

    #[test]
    fn header_table() {
        let cases = cases();
        assert!(cases.len() >= 30);
        for (name, lines, want) in cases {
            let got = server_delay(&headers(lines), now());
            assert_eq!(got, want, "case {name:?}");
        }
    }

    #[test]
    fn header_names_are_case_insensitive() {
        let map = headers(&[("Retry-After-Ms", b"40")]);
        assert_eq!(server_delay(&map, now()), Some(ms(40)));
        let map = headers(&[("RETRY-AFTER", b"4")]);
        assert_eq!(server_delay(&map, now()), Some(secs(4)));
    }

    #[test]
    fn date_is_measured_against_the_wall_clock_given() {
        let map = headers(&[(RA, b"Sun, 06 Nov 1994 08:49:37 GMT")]);
        let before = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777 - 30);
        assert_eq!(server_delay(&map, before), Some(secs(30)));
        let sub_second = SystemTime::UNIX_EPOCH + Duration::from_millis(784_111_776_500);
        assert_eq!(server_delay(&map, sub_second), Some(ms(500)));
        // A wall clock at the epoch works too.
        assert!(server_delay(&map, SystemTime::UNIX_EPOCH).is_some());
    }

    #[test]
    fn clamped_to_the_ceiling() {
        let ceiling = secs(10);
        let clamp = |lines: &[(&str, &[u8])]| clamped_server_delay(&headers(lines), now(), ceiling);
        assert_eq!(clamp(&[(MS, b"1500")]), Some(ms(1500)));
        assert_eq!(clamp(&[(RA, b"10")]), Some(secs(10)));
        assert_eq!(clamp(&[(RA, b"11")]), Some(secs(10)));
        assert_eq!(clamp(&[(RA, b"18446744073709551615")]), Some(secs(10)));
        assert_eq!(
            clamp(&[(RA, b"Fri, 31 Dec 9999 23:59:59 GMT")]),
            Some(secs(10))
        );
        assert_eq!(clamp(&[(MS, b"10000.000001")]), Some(secs(10)));
        assert_eq!(clamp(&[(RA, b"0")]), None);
        assert_eq!(clamp(&[]), None);
        assert_eq!(
            clamped_server_delay(&headers(&[(RA, b"5")]), now(), Duration::ZERO),
            Some(Duration::ZERO)
        );
        assert_eq!(
            clamped_server_delay(&headers(&[(RA, b"5")]), now(), Duration::MAX),
            Some(secs(5))
        );
    }

    #[test]
    fn retry_after_ms_upper_bound() {
        // Duration::MAX is u64::MAX s + 999_999_999 ns; in milliseconds:
        let max_ms = b"18446744073709551615999.999999";
        assert_eq!(
            server_delay(&headers(&[(MS, max_ms)]), now()),
            Some(Duration::MAX)
        );
        let one_more = b"18446744073709551616000";
        assert_eq!(server_delay(&headers(&[(MS, one_more)]), now()), None);
    }

    #[test]
    fn a_number_past_u128_is_ignored_not_wrapped() {
        // 11 × 2^128 + 5, which wraps to 5 in a u128.
        let huge = b"3743106036130323098097120681749450326021";
        // With a fraction after it, and numbers padded with zeros past u128's digits.
        let huge_ms = b"3743106036130323098097120681749450326021.5";
        let zero = b"0000000000000000000000000000000000000000000";
        let five = b"0000000000000000000000000000000000000000005";
        for (name, value, delay) in [
            (MS, &huge[..], None),
            (RA, huge, None),
            (MS, huge_ms, None),
            (MS, zero, None),
            (RA, zero, None),
            (MS, five, Some(ms(5))),
            (RA, five, Some(secs(5))),
        ] {
            assert_eq!(
                server_delay(&headers(&[(name, value)]), now()),
                delay,
                "{name}: {}",
                String::from_utf8_lossy(value)
            );
        }
    }

    /// RFC 9110 §5.6.7: an RFC 850 date's two-digit year is the latest year ending
    /// in those digits that puts the date at most 50 years ahead of the wall clock,
    /// not a fixed century (the date parser alone reads `00` to `69` as 20xx).
    #[test]
    fn an_rfc850_year_is_read_against_the_wall_clock() {
        // 2070-01-01T00:00:00Z, a Wednesday; 2069-12-31 was a Tuesday.
        let in_2070 = SystemTime::UNIX_EPOCH + secs(3_155_760_000);
        let delay = |value: &'static [u8], wall| server_delay(&headers(&[(RA, value)]), wall);
        assert_eq!(
            delay(b"Wednesday, 01-Jan-70 00:00:10 GMT", in_2070),
            Some(secs(10))
        );
        // The same date written IMF-fixdate, for comparison.
        assert_eq!(
            delay(b"Wed, 01 Jan 2070 00:00:10 GMT", in_2070),
            Some(secs(10))
        );
        // `69` from 2070 is 2069, in the past: ignored. From 2026 it is 2069 too.
        assert_eq!(delay(b"Tuesday, 31-Dec-69 23:59:59 GMT", in_2070), None);
        let now = now(); // 2026-11-29T10:00:00Z
        assert!(delay(b"Tuesday, 31-Dec-69 23:59:59 GMT", now).is_some());
        // `76` from 2026 is 2076, exactly 50 years on (13 leap days), not 1976.
        let in_2076 = delay(b"Sunday, 29-Nov-76 10:00:00 GMT", now);
        assert_eq!(in_2076, Some(Duration::from_secs(18_263 * 86_400)));
        // `77` is more than 50 years on: 1977, in the past.
        assert_eq!(delay(b"Monday, 29-Nov-77 10:00:00 GMT", now), None);
        // So is a date in 2076 later than 50 years on, by a month or by a second:
        // 1976, in the past. A second earlier is 2076. (Ignored either way, as the
        // weekdays are 2076's; the year picked is read off the rewritten date.)
        assert_eq!(delay(b"Tuesday, 29-Dec-76 10:00:00 GMT", now), None);
        assert_eq!(delay(b"Sunday, 29-Nov-76 10:00:01 GMT", now), None);
        let year_of = |text| rfc850_as_imf_fixdate(text, now).map(|d| d[12..16].to_owned());
        for (text, year) in [
            ("Sunday, 29-Nov-76 10:00:00 GMT", "2076"),
            ("Sunday, 29-Nov-76 10:00:01 GMT", "1976"),
            ("Tuesday, 29-Dec-76 10:00:00 GMT", "1976"),
            ("Friday, 30-Oct-76 10:00:00 GMT", "2076"),
            ("Monday, 29-Nov-77 10:00:00 GMT", "1977"),
            ("Sunday, 29-Nov-26 09:59:59 GMT", "2026"),
            ("Sunday, 29-Nov-25 10:00:00 GMT", "2025"),
            ("Sunday, 29-Nov-27 10:00:00 GMT", "2027"),
        ] {
            assert_eq!(year_of(text).as_deref(), Some(year), "{text}");
        }
        assert_eq!(
            delay(b"Sunday, 29-Nov-76 09:59:59 GMT", now),
            in_2076.map(|d| d - secs(1))
        );
        assert_eq!(
            delay(b"Friday, 30-Oct-76 10:00:00 GMT", now),
            in_2076.map(|d| d - secs(30 * 86_400))
        );
        // From 2099, `05` is 2105.
        let in_2099 = SystemTime::UNIX_EPOCH + secs(4_070_908_800); // 2099-01-01
        let in_2105 = SystemTime::UNIX_EPOCH + secs(4_260_211_200); // 2105-01-01, Thursday
        assert_eq!(
            delay(b"Thursday, 01-Jan-05 00:00:00 GMT", in_2099),
            in_2105.duration_since(in_2099).ok()
        );
        // A weekday that does not match the year picked is refused, as for any date.
        assert_eq!(delay(b"Thursday, 01-Jan-70 00:00:10 GMT", in_2070), None);
        // A wall clock an HTTP-date cannot hold leaves the parser's own reading.
        let before_1970 = SystemTime::UNIX_EPOCH - secs(86_400);
        assert_eq!(
            delay(b"Thursday, 01-Jan-70 00:00:10 GMT", before_1970),
            Some(secs(86_410))
        );
    }

    /// A wall clock at 9999-01-01T00:00:00Z, the first instant an HTTP-date cannot
    /// hold, leaves an RFC 850 year to the date parser: no panic (formatting that
    /// clock as an HTTP-date would); 1970 is past.
    #[test]
    fn a_wall_clock_at_the_first_instant_of_9999_leaves_an_rfc850_year_to_the_parser() {
        let year_9999 = SystemTime::UNIX_EPOCH + secs(253_402_300_800);
        let map = headers(&[(RA, b"Thursday, 01-Jan-70 00:00:10 GMT")]);
        assert_eq!(server_delay(&map, year_9999), None);
        assert_eq!(server_delay(&map, year_9999 - secs(1)), None);
        assert_eq!(
            server_delay(&headers(&[(RA, b"5")]), year_9999),
            Some(secs(5))
        );
    }

    /// Text that starts like an RFC 850 date but is cut short, or has no two-digit
    /// year, is ignored: never a panic, nor a year made up from other characters
    /// (`9Z` would make 2032, whose 29 Nov is a Monday).
    #[test]
    fn a_malformed_rfc850_date_is_ignored() {
        for value in [
            &b"Monday, 29-Nov-9Z 10:00:00 GMT"[..],
            b"Sunday, 29-Nov-",
            b"Sunday, 29-Nov-2",
            b"Sunday, 29-Nov-+6 10:00:10 GMT",
        ] {
            assert_eq!(
                server_delay(&headers(&[(RA, value)]), now()),
                None,
                "{}",
                String::from_utf8_lossy(value)
            );
        }
    }

    #[test]
    fn an_overflowing_number_is_ignored_and_an_overflowing_ms_leaves_retry_after_to_be_read() {
        let ceiling = secs(30);
        for (name, value) in [
            (RA, &b"99999999999999999999999"[..]),
            (MS, b"999999999999999999999999999999"),
        ] {
            assert_eq!(
                clamped_server_delay(&headers(&[(name, value)]), now(), ceiling),
                None,
                "{name}"
            );
        }
        let both = [(MS, &b"999999999999999999999999999999"[..]), (RA, b"7")];
        assert_eq!(server_delay(&headers(&both), now()), Some(secs(7)));
    }
}
