//! Budget windows: an hour, a day or a month aligned to UTC, or any whole
//! number of seconds aligned to multiples of it since the Unix epoch, so every
//! instance (and every restart) agrees on which window a moment falls in.

use std::{fmt, str::FromStr, time::Duration};

use chrono::{DateTime, Datelike, TimeZone, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// How long a budget lasts before it starts afresh (`per:` in config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Period {
    Hour,
    Day,
    /// A calendar month, UTC.
    Month,
    /// Whole seconds (at least one), aligned to multiples since the epoch.
    Every(Duration),
}

/// One window of a [`Period`]: `[start_ms, end_ms)`, Unix milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Window {
    pub start_ms: u64,
    pub end_ms: u64,
}

impl Window {
    /// How long from `now_ms` until the window ends.
    pub fn left(&self, now_ms: u64) -> Duration {
        Duration::from_millis(self.end_ms.saturating_sub(now_ms))
    }
}

impl Period {
    /// The window `now_ms` falls in.
    pub fn window(&self, now_ms: u64) -> Window {
        let fixed = |length_ms: u64| {
            let length_ms = length_ms.max(1);
            let start_ms = now_ms - now_ms % length_ms;
            Window {
                start_ms,
                end_ms: start_ms.saturating_add(length_ms),
            }
        };
        match self {
            Self::Hour => fixed(3_600_000),
            Self::Day => fixed(86_400_000),
            Self::Every(length) => fixed(u64::try_from(length.as_millis()).unwrap_or(u64::MAX)),
            Self::Month => {
                let now = i64::try_from(now_ms).unwrap_or(i64::MAX);
                let now = DateTime::<Utc>::from_timestamp_millis(now).unwrap_or_default();
                let first = |year: i32, month: u32| {
                    Utc.with_ymd_and_hms(year, month, 1, 0, 0, 0)
                        .single()
                        .map_or(0, |at| u64::try_from(at.timestamp_millis()).unwrap_or(0))
                };
                let (next_year, next_month) = if now.month() == 12 {
                    (now.year() + 1, 1)
                } else {
                    (now.year(), now.month() + 1)
                };
                Window {
                    start_ms: first(now.year(), now.month()),
                    end_ms: first(next_year, next_month),
                }
            }
        }
    }
}

impl fmt::Display for Period {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Hour => f.write_str("hour"),
            Self::Day => f.write_str("day"),
            Self::Month => f.write_str("month"),
            Self::Every(length) => write!(f, "{}", humantime::format_duration(*length)),
        }
    }
}

impl FromStr for Period {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "hour" => Ok(Self::Hour),
            "day" => Ok(Self::Day),
            "month" => Ok(Self::Month),
            other => {
                let length = humantime::parse_duration(other).map_err(|err| {
                    format!("`{other}` is not hour, day, month or a duration such as 30s ({err})")
                })?;
                if length < Duration::from_secs(1) || length.subsec_nanos() != 0 {
                    return Err(format!("`{other}` must be whole seconds, at least 1s"));
                }
                Ok(Self::Every(length))
            }
        }
    }
}

impl Serialize for Period {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Period {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-12-05T10:30:00Z
    const NOW: u64 = 1_796_466_600_000;

    #[test]
    fn windows_are_aligned_to_utc_and_the_epoch() {
        let day = Period::Day.window(NOW);
        assert_eq!(day.start_ms, 1_796_428_800_000, "UTC midnight");
        assert_eq!(day.end_ms - day.start_ms, 86_400_000);
        assert_eq!(day.left(NOW), Duration::from_secs(13 * 3600 + 1800));
        let hour = Period::Hour.window(NOW);
        assert_eq!(
            (hour.start_ms, hour.end_ms),
            (NOW - 1_800_000, NOW + 1_800_000)
        );
        let every = Period::Every(Duration::from_secs(7)).window(NOW);
        assert_eq!(every.start_ms % 7000, 0);
        assert!(every.start_ms <= NOW && NOW < every.end_ms);
        let month = Period::Month.window(NOW);
        assert_eq!(month.start_ms, 1_796_083_200_000, "2026-12-01");
        assert_eq!(month.end_ms, 1_798_761_600_000, "2027-01-01");
        let february = Period::Month.window(1_772_000_000_000);
        assert_eq!(
            february.end_ms - february.start_ms,
            28 * 86_400_000,
            "2026 is no leap year"
        );
    }

    #[test]
    fn periods_read_and_print_as_config_says_them() {
        for text in ["hour", "day", "month", "30s", "5m"] {
            let period: Period = text.parse().unwrap();
            assert_eq!(period.to_string(), text);
        }
        for bad in ["week", "0s", "1500ms", ""] {
            assert!(bad.parse::<Period>().is_err(), "{bad}");
        }
    }
}
