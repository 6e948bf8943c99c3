//! What the load tool reads besides responses: the mock provider's call
//! counter (`GET /__mock/calls`), corral's `/metrics` (Prometheus text), and a
//! server process's CPU time and resident memory from `/proc`.
//!
//! `/metrics` is optional: a target without it (the mock, the baseline, an
//! older corral, a peer gateway) simply reports no metrics.

use std::time::Duration;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A short-lived HTTP client for probes (never on the measured path).
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .no_proxy()
        .build()
        .expect("a plain reqwest client builds")
}

/// `http://host:port` of a URL such as `http://host:port/v1`.
pub fn origin_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or(rest);
    let scheme = url.split_once("://").map_or("http", |(scheme, _)| scheme);
    format!("{scheme}://{authority}")
}

/// `GET url`, a success status, a JSON body: what the suite reads of the
/// gateway's `/stats` and the mock's control routes.
pub async fn get_json(client: &reqwest::Client, url: &str) -> anyhow::Result<Value> {
    client
        .get(url)
        .send()
        .await
        .with_context(|| format!("GET {url}"))?
        .error_for_status()?
        .json()
        .await
        .with_context(|| format!("GET {url}: not JSON"))
}

/// The mock provider's billable-call counter.
pub async fn mock_calls(client: &reqwest::Client, mock_url: &str) -> anyhow::Result<u64> {
    let url = format!("{}/__mock/calls", origin_of(mock_url));
    let body = get_json(client, &url).await?;
    body["calls"]
        .as_u64()
        .with_context(|| format!("GET {url}: no `calls` count in {body}"))
}

/// Sends a JSON body to one of the mock's `/__mock/*` control routes.
pub async fn mock_control(
    client: &reqwest::Client,
    mock_url: &str,
    route: &str,
    body: Option<Value>,
) -> anyhow::Result<()> {
    let url = format!("{}/__mock/{route}", origin_of(mock_url));
    let mut request = client.post(&url);
    if let Some(body) = body {
        request = request.json(&body);
    }
    request
        .send()
        .await
        .with_context(|| format!("POST {url}"))?
        .error_for_status()
        .with_context(|| format!("POST {url}"))?;
    Ok(())
}

/// One sample of a Prometheus text exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// A parsed `/metrics` scrape.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    pub series: Vec<Series>,
}

impl Scrape {
    /// Parses the text format; lines that are not samples are skipped.
    pub fn parse(text: &str) -> Self {
        let series = text
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .filter_map(parse_line)
            .collect();
        Self { series }
    }

    /// Sum of every sample of `name` whose labels include all of `filter`.
    pub fn sum(&self, name: &str, filter: &[(&str, &str)]) -> f64 {
        self.series
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                filter
                    .iter()
                    .all(|(k, v)| s.labels.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|s| s.value)
            .sum()
    }

    /// Whether any sample is called `name`.
    pub fn has(&self, name: &str) -> bool {
        self.series.iter().any(|s| s.name == name)
    }
}

fn parse_line(line: &str) -> Option<Series> {
    let (head, rest) = match line.find('{') {
        Some(_) => {
            let close = line.rfind('}')?;
            (&line[..=close], &line[close + 1..])
        }
        None => line.split_once(' ')?,
    };
    let value: f64 = rest.split_whitespace().next()?.parse().ok()?;
    let (name, labels) = match head.find('{') {
        Some(open) => (
            &head[..open],
            parse_labels(&head[open + 1..head.len() - 1])?,
        ),
        None => (head, Vec::new()),
    };
    Some(Series {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// `a="x",b="y \"q\""` into pairs (values unescaped).
fn parse_labels(text: &str) -> Option<Vec<(String, String)>> {
    let mut labels = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Some(labels);
        }
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if chars.next()? != '"' {
            return None;
        }
        let mut value = String::new();
        loop {
            match chars.next()? {
                '"' => break,
                '\\' => match chars.next()? {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                other => value.push(other),
            }
        }
        labels.push((key.trim().to_owned(), value));
    }
}

/// corral's `/metrics`, or `None` when the target serves none.
pub async fn scrape(client: &reqwest::Client, origin: &str) -> Option<Scrape> {
    let response = client.get(format!("{origin}/metrics")).send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    let scrape = Scrape::parse(&response.text().await.ok()?);
    scrape.has("corral_requests_total").then_some(scrape)
}

/// The counters a run reports, as the difference of two scrapes summed over
/// every scraped instance.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MetricsDelta {
    /// `corral_requests_total` by its `cache` label.
    pub requests_by_cache: std::collections::BTreeMap<String, f64>,
    /// `corral_upstream_requests_total`: the gateway's own count of provider calls.
    pub upstream_requests: f64,
    /// `corral_cost_usd_total{source="saved"}`.
    pub saved_usd: f64,
    /// `corral_cost_usd_total{source="upstream"}`.
    pub spent_usd: f64,
    /// `corral_tokens_total{source="saved"}`.
    pub saved_tokens: f64,
}

impl MetricsDelta {
    pub fn between(before: &[Scrape], after: &[Scrape]) -> Self {
        let total = |scrapes: &[Scrape], name: &str, filter: &[(&str, &str)]| -> f64 {
            scrapes.iter().map(|s| s.sum(name, filter)).sum()
        };
        let delta = |name: &str, filter: &[(&str, &str)]| {
            total(after, name, filter) - total(before, name, filter)
        };
        let mut requests_by_cache = std::collections::BTreeMap::new();
        for label in corral::metrics::CACHE_LABELS {
            let count = delta("corral_requests_total", &[("cache", label)]);
            if count != 0.0 {
                requests_by_cache.insert(label.to_owned(), count);
            }
        }
        Self {
            requests_by_cache,
            upstream_requests: delta("corral_upstream_requests_total", &[]),
            saved_usd: delta("corral_cost_usd_total", &[("source", "saved")]),
            spent_usd: delta("corral_cost_usd_total", &[("source", "upstream")]),
            saved_tokens: delta("corral_tokens_total", &[("source", "saved")]),
        }
    }
}

/// User plus system CPU time of a process and its live descendants (a
/// server with worker processes, as uvicorn's), from `/proc/PID/stat`.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let own = stat_fields(pid)?;
    let ticks = |fields: &[String]| -> u64 {
        // utime and stime; USER_HZ is 100 on every Linux architecture corral targets.
        [11, 12]
            .iter()
            .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
            .sum()
    };
    let total = ticks(&own)
        + descendants(pid)
            .into_iter()
            .filter_map(stat_fields)
            .map(|fields| ticks(&fields))
            .sum::<u64>();
    Some(Duration::from_millis(total * 10))
}

/// Resident set size of a process and its live descendants in bytes, from
/// `/proc/PID/status` (pages the processes share are counted once each).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let rss = |pid: u32| -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    };
    Some(rss(pid)? + descendants(pid).into_iter().filter_map(rss).sum::<u64>())
}

/// The fields of `/proc/PID/stat` after the command name (which is
/// parenthesized and may hold spaces): state is 0, ppid 1, utime 11, stime 12.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .map(str::to_owned)
            .collect(),
    )
}

/// Every live process below `pid`, from the parent links in `/proc`.
fn descendants(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let parents: Vec<(u32, u32)> = entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|child| Some((child, stat_fields(child)?.get(1)?.parse().ok()?)))
        .collect();
    let mut found = Vec::new();
    let mut frontier = vec![pid];
    while let Some(parent) = frontier.pop() {
        for &(child, _) in parents.iter().filter(|(_, p)| *p == parent) {
            found.push(child);
            frontier.push(child);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_text_format() {
        let scrape = Scrape::parse(
            "# HELP corral_requests Requests\n\
             # TYPE corral_requests counter\n\
             corral_requests_total{endpoint=\"chat\",cache=\"HIT\"} 2\n\
             corral_requests_total{endpoint=\"embeddings\",cache=\"HIT\"} 3\n\
             corral_requests_total{endpoint=\"chat\",cache=\"MISS\"} 1\n\
             corral_cost_usd_total{model=\"a \\\"b\\\"\",source=\"saved\"} 0.5\n\
             corral_waiters 0\n\
             # EOF\n",
        );
        assert_eq!(
            scrape.sum("corral_requests_total", &[("cache", "HIT")]),
            5.0
        );
        assert_eq!(scrape.sum("corral_requests_total", &[]), 6.0);
        assert_eq!(
            scrape.sum("corral_cost_usd_total", &[("model", "a \"b\"")]),
            0.5
        );
        assert!(scrape.has("corral_waiters"));
        assert!(!scrape.has("corral_nothing"));
    }

    #[test]
    fn origins_drop_the_path() {
        assert_eq!(origin_of("http://127.0.0.1:9/v1"), "http://127.0.0.1:9");
        assert_eq!(origin_of("http://127.0.0.1:9"), "http://127.0.0.1:9");
    }

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        assert!(rss_bytes(me).unwrap() > 0);
        assert!(cpu_time(me).is_some());
        // A child is counted with its parent.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        assert!(descendants(me).contains(&child.id()));
        assert!(rss_bytes(me).unwrap() > rss_bytes(child.id()).unwrap());
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
