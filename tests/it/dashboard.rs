//! The savings page at `GET /`, rendered by headless Chromium: a screenshot,
//! and the rendered DOM checked for the figures `/stats` reports.
//!
//! Chromium is installed by `.ci/run`. Without it this test prints
//! `SKIPPED: chromium not installed` and passes, unless `CI` is set, where a
//! missing browser is a failure.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use corral::config::{ModelPrice, PriceTable};
use reqwest::StatusCode;
use serde_json::Value;
use tokio::process::Command;

use crate::harness::{TestGateway, chat, count_status, embedding};

/// Headless Chromium starts slowly on a loaded machine; bounded all the same.
const BROWSER_TIMEOUT: Duration = Duration::from_secs(120);

/// Chromium, or `None` after saying the test is skipped (never in CI, where
/// a missing browser fails the test).
pub(crate) fn chromium_or_skip() -> Option<PathBuf> {
    let found = find_chromium();
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "chromium is required in CI (.ci/run installs it)"
        );
        println!("SKIPPED: chromium not installed");
    }
    found
}

fn find_chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| ["chromium", "chromium-browser"].map(|name| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

/// Runs Chromium headless on `url` with `mode` (`--screenshot=...` or
/// `--dump-dom`) and returns its stdout.
pub(crate) async fn chromium(binary: &Path, url: &str, mode: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let output = Command::new(binary)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args([
            "--virtual-time-budget=5000",
            mode,
            "--window-size=1200,900",
            url,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(BROWSER_TIMEOUT, output)
        .await
        .expect("chromium finishes in time")
        .expect("chromium runs");
    assert!(
        output.status.success(),
        "chromium failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The value of `attribute` on the element with `id` in serialized HTML.
fn attribute(dom: &str, id: &str, attribute: &str) -> String {
    let at = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no element #{id} in the DOM"));
    let start = dom[..at].rfind('<').unwrap();
    let end = at + dom[at..].find('>').unwrap();
    let tag = &dom[start..end];
    let key = format!("{attribute}=\"");
    let from = tag
        .find(&key)
        .unwrap_or_else(|| panic!("#{id} has no {attribute}: {tag}"))
        + key.len();
    tag[from..from + tag[from..].find('"').unwrap()].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_savings_page_renders_the_figures_in_headless_chromium() {
    let Some(browser) = chromium_or_skip() else {
        return;
    };
    let gateway = TestGateway::start(|config| {
        config.pricing.as_of = Some("2026-03-21".into());
        config.pricing.models = PriceTable(vec![
            (
                "gpt-4o-mini".into(),
                ModelPrice {
                    input: 0.15,
                    output: 0.60,
                    cached_input: None,
                    cache_write: None,
                },
            ),
            (
                "text-embedding-3-small".into(),
                ModelPrice {
                    input: 0.02,
                    output: 0.0,
                    cached_input: None,
                    cache_write: None,
                },
            ),
        ]);
    })
    .await;
    // Traffic worth drawing: a herd, its repeats, and an embedding.
    let body = chat("draw me the savings");
    let herd = gateway.herd("/v1/chat/completions", &body, 20, &[]).await;
    assert_eq!(count_status(&herd, "COALESCED"), 19);
    for _ in 0..10 {
        assert_eq!(
            gateway.post("/v1/chat/completions", &body).await.cache(),
            "HIT"
        );
    }
    let embedded = gateway
        .post("/v1/embeddings", &embedding("and a vector"))
        .await;
    assert_eq!(embedded.status, StatusCode::OK);
    // A sampled answer and the client's retry of it, absorbed by the retry window.
    let sampled = serde_json::json!({
        "model": "gpt-4o-mini",
        "temperature": 1,
        "messages": [{"role": "user", "content": "retry me on the page"}],
    });
    assert_eq!(
        gateway.post("/v1/chat/completions", &sampled).await.cache(),
        "MISS"
    );
    let retry = gateway
        .post_with(
            "/v1/chat/completions",
            &sampled,
            &[("x-stainless-retry-count", "1")],
        )
        .await;
    assert_eq!(
        retry.header("cache-status"),
        Some("corral; hit; detail=retry")
    );

    let page = gateway.get("/").await;
    assert_eq!(page.status, StatusCode::OK);
    let html = std::str::from_utf8(&page.body).unwrap();
    assert!(html.contains("<svg"), "the chart is inline SVG");
    for external in ["<script src", "<link", "http://", "https://", "@import"] {
        assert!(!html.contains(external), "external asset: {external}");
    }
    assert_eq!(gateway.get("/dashboard").await.body, page.body);

    let stats: Value = gateway.get("/stats").await.json();
    let url = format!("{}/", gateway.url);

    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("corral-dashboard.png");
    let _ = std::fs::remove_file(&shot);
    chromium(&browser, &url, &format!("--screenshot={}", shot.display())).await;
    let png = std::fs::read(&shot).expect("chromium wrote the screenshot");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    assert!(
        png.len() > 20_000,
        "a rendered page, not a blank one ({} bytes)",
        png.len()
    );
    println!("screenshot: {}", shot.display());

    let dom = chromium(&browser, &url, "--dump-dom").await;
    assert!(
        dom.contains("data-state=\"ready\""),
        "the page rendered /stats:\n{dom}"
    );
    // Nothing happened between /stats and the browser's reads except its own
    // requests for the page and /stats, which are not counted.
    assert_eq!(attribute(&dom, "saved-responses", "data-value"), "30");
    assert!(dom.contains("1 retries absorbed"), "{dom}");
    assert_eq!(
        attribute(&dom, "saved-responses", "data-value"),
        stats["saved_responses"]["total"].to_string()
    );
    assert_eq!(
        attribute(&dom, "upstream-calls", "data-value"),
        stats["upstream"]["calls"].to_string()
    );
    assert_eq!(
        attribute(&dom, "requests-total", "data-value"),
        stats["requests"]["total"].to_string()
    );
    let saved: f64 = attribute(&dom, "saved-usd", "data-value").parse().unwrap();
    assert!(saved > 0.0);
    assert!((saved - stats["cost_usd"]["saved"].as_f64().unwrap()).abs() < 1e-12);
    let spent: f64 = attribute(&dom, "spent-usd", "data-value").parse().unwrap();
    assert!((spent - stats["cost_usd"]["upstream"].as_f64().unwrap()).abs() < 1e-12);
    let ratio: f64 = attribute(&dom, "dedup-ratio", "data-value")
        .parse()
        .unwrap();
    assert!((ratio - stats["dedup_ratio"].as_f64().unwrap()).abs() < 1e-12);
    // The chart has both lines, each with at least the start and now.
    for line in ["line-saved", "line-spent"] {
        let points = attribute(&dom, line, "points");
        assert!(points.split(' ').count() >= 2, "{line}: {points:?}");
    }
    // The per-model table names both models.
    assert!(dom.contains("<td>gpt-4o-mini</td>"), "{dom}");
    assert!(dom.contains("<td>text-embedding-3-small</td>"));
    // The page says whose totals it shows (no Redis: this instance's), and
    // attributes them to the upstream.
    assert_eq!(attribute(&dom, "scope", "data-scope"), "instance");
    assert_eq!(stats["scope"], "instance");
    assert!(dom.contains("this instance since it started"), "{dom}");
    assert!(dom.contains("<td>mock</td>"), "the upstream table: {dom}");
}

/// The attributes of the `<tr data-budget="{subject}" ...>` row in serialized HTML.
fn budget_row(dom: &str, subject: &str) -> (f64, f64) {
    let at = dom
        .find(&format!("data-budget=\"{subject}\""))
        .unwrap_or_else(|| panic!("no budget row for {subject}: {dom}"));
    let tag = &dom[at..at + dom[at..].find('>').unwrap()];
    let value = |name: &str| -> f64 {
        let key = format!("{name}=\"");
        let from = tag.find(&key).unwrap() + key.len();
        tag[from..from + tag[from..].find('"').unwrap()]
            .parse()
            .unwrap()
    };
    (value("data-spent"), value("data-remaining"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_savings_page_shows_each_budget_and_what_is_left_of_it() {
    let Some(browser) = chromium_or_skip() else {
        return;
    };
    let gateway = TestGateway::start(|config| {
        config.pricing.models = PriceTable(vec![(
            "gpt-4o-mini".into(),
            ModelPrice {
                input: 100.0,
                output: 100.0,
                cached_input: None,
                cache_write: None,
            },
        )]);
        config.budgets = vec![
            corral::budget::BudgetRule {
                tenant: Some("*".into()),
                upstream: None,
                usd: 1.0,
                per: "day".parse().unwrap(),
            },
            corral::budget::BudgetRule {
                tenant: None,
                upstream: Some("mock".into()),
                usd: 50.0,
                per: "month".parse().unwrap(),
            },
        ];
    })
    .await;
    let body = chat("a budgeted question");
    let paid = gateway.post("/v1/chat/completions", &body).await;
    assert_eq!(paid.cache(), "MISS");
    assert_eq!(
        gateway.post("/v1/chat/completions", &body).await.cache(),
        "HIT"
    );
    let stats: Value = gateway.get("/stats").await.json();
    let budgets = stats["budgets"]
        .as_array()
        .expect("/stats lists the budgets");
    assert_eq!(budgets.len(), 2, "{budgets:?}");
    let dom = chromium(&browser, &format!("{}/", gateway.url), "--dump-dom").await;
    assert!(dom.contains("data-state=\"ready\""), "{dom}");
    for budget in budgets {
        let subject = budget["subject"].as_str().unwrap();
        let (spent, remaining) = budget_row(&dom, subject);
        assert!(spent > 0.0, "the miss was billed: {subject}");
        assert!((spent - budget["spent_usd"].as_f64().unwrap()).abs() < 1e-12);
        assert!((remaining - budget["remaining_usd"].as_f64().unwrap()).abs() < 1e-12);
    }
    // The hit spent nothing: each budget holds exactly the one call's cost.
    let left: f64 = paid
        .header("x-corral-budget-remaining-usd")
        .unwrap()
        .parse()
        .unwrap();
    let tenant_budget = budgets
        .iter()
        .find(|b| b["subject"].as_str().unwrap().starts_with("tenant "))
        .unwrap();
    assert!((tenant_budget["remaining_usd"].as_f64().unwrap() - left).abs() < 1e-9);
}
