//! How long the provider said to wait, read off its own answer.
//!
//! A member is cooled for what its provider said, not for a guess: the
//! generic `retry-after-ms` and `Retry-After`, then on a 429 the rate-limit
//! windows' resets (OpenAI's `x-ratelimit-reset-*`, Anthropic's
//! `anthropic-ratelimit-*-reset`), then Gemini's `RetryInfo` in the error
//! body; else the pool's own cooldown for an overload (429, 503, 529). Any
//! other status (a caller's mistake, a server error) is not a cooldown: the
//! breaker judges those. Every hint is bounded by [`LONGEST_COOLDOWN`]; a
//! value that does not parse is no hint.

use std::time::{Duration, SystemTime};

use http::HeaderMap;

use super::cooldown::LONGEST_COOLDOWN;

/// The longest wait any one hint can name: `Retry-After: 1e20` would
/// overflow a `Duration` and an `Instant`, and no wait is worth a longer one.
/// (A cooldown is bounded tighter, by [`LONGEST_COOLDOWN`].)
pub const LONGEST_PROVIDER_WAIT: Duration = Duration::from_secs(24 * 3600);

/// The largest error body read for a `RetryInfo`: Google's error documents
/// are a few hundred bytes; a larger body is not one.
const LARGEST_ERROR_BODY: usize = 64 * 1024;

/// How long to cool a member that answered `status` with `headers` and
/// `body`, at wall-clock `now` (for the hints that are dates); `default` is
/// the pool's `cooldown`. `None`: this answer does not cool the member.
pub fn cooldown_from(
    status: u16,
    headers: &HeaderMap,
    body: &[u8],
    default: Duration,
    now: SystemTime,
) -> Option<Duration> {
    if !matches!(status, 429 | 503 | 529) {
        return None;
    }
    let hint = retry_after(headers, now)
        .or_else(|| (status == 429).then(|| openai_reset(headers)).flatten())
        .or_else(|| {
            (status == 429)
                .then(|| anthropic_reset(headers, now))
                .flatten()
        })
        .or_else(|| gemini_retry_delay(body));
    Some(hint.unwrap_or(default).min(LONGEST_COOLDOWN))
}

/// `retry-after-ms` (OpenAI's SDKs read it first), else `Retry-After` as
/// seconds or an HTTP date (counted from `now`).
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    if let Some(ms) = header(headers, "retry-after-ms").and_then(|v| seconds(v, 1000.0)) {
        return Some(ms);
    }
    let value = header(headers, "retry-after")?;
    if let Some(wait) = seconds(value, 1.0) {
        return Some(wait);
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(until(when, now))
}

/// OpenAI's windows on a 429: the reset of the window that is exhausted
/// (`x-ratelimit-remaining-* = 0`), the later if both are, and the later of
/// the two if neither remaining count says.
fn openai_reset(headers: &HeaderMap) -> Option<Duration> {
    let windows = ["requests", "tokens"].map(|window| {
        let reset = header(headers, &format!("x-ratelimit-reset-{window}")).and_then(go_duration);
        let remaining = header(headers, &format!("x-ratelimit-remaining-{window}"));
        (reset, remaining)
    });
    exhausted_or_latest(
        windows
            .iter()
            .map(|(reset, remaining)| (*reset, *remaining)),
    )
}

/// Anthropic's windows on a 429 (requests, tokens, input and output tokens):
/// RFC 3339 times of each window's reset, chosen like OpenAI's.
fn anthropic_reset(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let windows = ["requests", "tokens", "input-tokens", "output-tokens"].map(|window| {
        let reset = header(headers, &format!("anthropic-ratelimit-{window}-reset"))
            .and_then(|text| chrono::DateTime::parse_from_rfc3339(text).ok())
            .map(|when| until(SystemTime::from(when), now));
        let remaining = header(headers, &format!("anthropic-ratelimit-{window}-remaining"));
        (reset, remaining)
    });
    exhausted_or_latest(
        windows
            .iter()
            .map(|(reset, remaining)| (*reset, *remaining)),
    )
}

/// The latest reset among the windows whose remaining count is `0`, else
/// the latest of all when none says it is exhausted.
fn exhausted_or_latest<'a>(
    windows: impl Iterator<Item = (Option<Duration>, Option<&'a str>)> + Clone,
) -> Option<Duration> {
    let exhausted = windows
        .clone()
        .filter(|(_, remaining)| remaining.is_some_and(|r| r.parse::<u64>() == Ok(0)))
        .filter_map(|(reset, _)| reset)
        .max();
    exhausted.or_else(|| windows.filter_map(|(reset, _)| reset).max())
}

/// Gemini's `RetryInfo.retryDelay` (`"1.5s"`) among the error's `details`,
/// in an error object or the array a stream's error comes in. Google sends
/// its 429s' wait there, not in `Retry-After`.
pub fn gemini_retry_delay(body: &[u8]) -> Option<Duration> {
    if body.is_empty() || body.len() > LARGEST_ERROR_BODY {
        return None;
    }
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let error = match &value {
        serde_json::Value::Array(items) => items.first()?.get("error")?,
        other => other.get("error")?,
    };
    error
        .get("details")?
        .as_array()?
        .iter()
        .filter(|detail| {
            detail
                .get("@type")
                .and_then(|t| t.as_str())
                .is_some_and(|t| t.ends_with("google.rpc.RetryInfo"))
        })
        .find_map(|detail| detail.get("retryDelay")?.as_str()?.strip_suffix('s'))
        .and_then(|text| seconds(text, 1.0))
}

/// A Go `time.Duration` string as OpenAI sends it: `20ms`, `1s`, `6m0s`,
/// `1h2m3.5s` (units `h`, `m`, `s`, `ms`, `us`/`µs`, `ns`).
fn go_duration(text: &str) -> Option<Duration> {
    let mut rest = text.trim();
    if rest.is_empty() || rest.len() > 64 {
        return None;
    }
    let mut total = 0.0f64;
    while !rest.is_empty() {
        let number_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let number: f64 = rest[..number_end].parse().ok()?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" | "μs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += number * scale;
        rest = &rest[unit_end..];
    }
    seconds_f64(total)
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name)?.to_str().ok().map(str::trim)
}

/// A decimal count of seconds, divided by `per_second` (1000 for ms).
fn seconds(text: &str, per_second: f64) -> Option<Duration> {
    seconds_f64(text.trim().parse::<f64>().ok()? / per_second)
}

fn seconds_f64(value: f64) -> Option<Duration> {
    (value.is_finite() && value >= 0.0)
        .then(|| Duration::from_secs_f64(value.min(LONGEST_PROVIDER_WAIT.as_secs_f64())))
}

/// From `now` to `when`, none if it has passed, at most [`LONGEST_PROVIDER_WAIT`].
fn until(when: SystemTime, now: SystemTime) -> Duration {
    when.duration_since(now)
        .unwrap_or_default()
        .min(LONGEST_PROVIDER_WAIT)
}

#[cfg(test)]
mod tests {
    use super::*;

    const POOL: Duration = Duration::from_secs(7);

    fn now() -> SystemTime {
        // 2025-01-01T00:00:00Z.
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_735_689_600)
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(name, value)| (http::HeaderName::from_static(name), value.parse().unwrap()))
            .collect()
    }

    fn wait(status: u16, pairs: &[(&'static str, &str)], body: &str) -> Option<Duration> {
        cooldown_from(status, &headers(pairs), body.as_bytes(), POOL, now())
    }

    fn ms(ms: u64) -> Option<Duration> {
        Some(Duration::from_millis(ms))
    }

    #[test]
    fn retry_after_ms_comes_first_then_retry_after() {
        assert_eq!(
            wait(429, &[("retry-after-ms", "1500"), ("retry-after", "9")], ""),
            ms(1500)
        );
        assert_eq!(wait(429, &[("retry-after", "3")], ""), ms(3000));
        assert_eq!(wait(503, &[("retry-after", " 2.5 ")], ""), ms(2500));
        assert_eq!(
            wait(529, &[("retry-after", "Wed, 01 Jan 2025 00:00:42 GMT")], ""),
            ms(42_000)
        );
        assert_eq!(
            wait(429, &[("retry-after", "Tue, 31 Dec 2024 23:00:00 GMT")], ""),
            ms(0),
            "a date that has passed: no wait"
        );
    }

    #[test]
    fn openai_resets_take_the_exhausted_window() {
        let both = [
            ("x-ratelimit-reset-requests", "1s"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ];
        assert_eq!(wait(429, &both, ""), ms(360_000), "neither says: the later");
        let requests_out = [
            both[0],
            both[1],
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-remaining-tokens", "4000"),
        ];
        assert_eq!(wait(429, &requests_out, ""), ms(1000));
        let tokens_out = [
            ("x-ratelimit-reset-requests", "20ms"),
            ("x-ratelimit-reset-tokens", "2m3.5s"),
            ("x-ratelimit-remaining-requests", "12"),
            ("x-ratelimit-remaining-tokens", "0"),
        ];
        assert_eq!(wait(429, &tokens_out, ""), ms(123_500));
        assert_eq!(
            wait(503, &both, ""),
            Some(POOL),
            "the windows speak of a 429 only"
        );
    }

    #[test]
    fn go_durations_parse_and_garbage_does_not() {
        for (text, millis) in [
            ("1s", 1000),
            ("6m0s", 360_000),
            ("20ms", 20),
            ("1m30.5s", 90_500),
            ("0s", 0),
            ("250us", 0),
            ("0h59m3.5s", 3_543_500),
        ] {
            assert_eq!(
                go_duration(text).map(|d| d.as_millis() as u64),
                Some(millis),
                "{text}"
            );
        }
        assert_eq!(
            go_duration("1h2m3.5s").map(|d| d.as_millis() as u64),
            Some(3_723_500)
        );
        assert_eq!(
            go_duration("99999h"),
            Some(LONGEST_PROVIDER_WAIT),
            "bounded"
        );
        for garbage in ["", "s", "5", "1x", "1.2.3s", "-1s", "NaNs", "1s2"] {
            assert_eq!(go_duration(garbage), None, "{garbage}");
        }
    }

    #[test]
    fn anthropic_resets_are_times_from_now() {
        let pairs = [
            ("anthropic-ratelimit-requests-reset", "2025-01-01T00:00:05Z"),
            ("anthropic-ratelimit-requests-remaining", "10"),
            (
                "anthropic-ratelimit-input-tokens-reset",
                "2025-01-01T00:00:30Z",
            ),
            ("anthropic-ratelimit-input-tokens-remaining", "0"),
            (
                "anthropic-ratelimit-output-tokens-reset",
                "2025-01-01T00:01:00+00:00",
            ),
        ];
        assert_eq!(
            wait(429, &pairs, ""),
            ms(30_000),
            "the exhausted window's reset"
        );
        assert_eq!(wait(429, &pairs[..1], ""), ms(5_000));
        let garbage = [("anthropic-ratelimit-tokens-reset", "soon")];
        assert_eq!(wait(429, &garbage, ""), Some(POOL));
    }

    #[test]
    fn gemini_retry_info_is_read_from_the_error_body() {
        let body = r#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[
            {"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[]},
            {"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"1.5s"}]}}"#;
        assert_eq!(wait(429, &[], body), ms(1500));
        assert_eq!(
            wait(429, &[], &format!("[{body}]")),
            ms(1500),
            "a stream's error array"
        );
        assert_eq!(
            wait(429, &[("retry-after", "2")], body),
            ms(2000),
            "headers first"
        );
        let bad = r#"{"error":{"details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"-3s"}]}}"#;
        assert_eq!(wait(429, &[], bad), Some(POOL));
    }

    #[test]
    fn an_overload_without_a_hint_takes_the_pools_cooldown_and_nothing_else_cools() {
        for status in [429, 503, 529] {
            assert_eq!(wait(status, &[], "not json"), Some(POOL), "{status}");
        }
        for status in [200, 400, 401, 404, 408, 500, 502, 504] {
            assert_eq!(wait(status, &[("retry-after", "5")], ""), None, "{status}");
        }
    }

    #[test]
    fn every_hint_is_bounded_and_garbage_is_none() {
        assert_eq!(
            wait(429, &[("retry-after", "1e300")], ""),
            Some(LONGEST_COOLDOWN)
        );
        assert_eq!(wait(429, &[("retry-after-ms", "inf")], ""), Some(POOL));
        assert_eq!(wait(429, &[("retry-after", "-5")], ""), Some(POOL));
        assert_eq!(
            wait(429, &[("retry-after", "Wed, 01 Jan 3000 00:00:00 GMT")], ""),
            Some(LONGEST_COOLDOWN)
        );
        assert_eq!(
            cooldown_from(429, &HeaderMap::new(), b"", Duration::MAX, now()),
            Some(LONGEST_COOLDOWN)
        );
    }
}
