//! The `mock-upstream` binary as demos and the bench suite run it: it prints
//! one ready line with the address it bound (port 0 picks a free one), answers
//! the OpenAI surface, and counts every billable call on `/__mock/calls`.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::Command;

/// Bound on every wait: generous for a loaded machine, finite so a broken run fails.
const WAIT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn the_binary_prints_its_address_answers_and_counts_calls() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mock-upstream"))
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("mock-upstream starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .expect("a ready line within the bound")
        .expect("stdout is readable")
        .expect("the process prints a ready line");
    let base = ready
        .split_whitespace()
        .find_map(|word| word.strip_prefix("http://"))
        .and_then(|rest| rest.split('/').next())
        .map(|addr| format!("http://{addr}"))
        .unwrap_or_else(|| panic!("no address on the ready line: {ready}"));

    let client = reqwest::Client::builder().timeout(WAIT).build().unwrap();
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});
    let mut answers = Vec::new();
    for _ in 0..2 {
        let answer: Value = client
            .post(format!("{base}/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .expect("the mock answers")
            .json()
            .await
            .expect("a JSON answer");
        answers.push(answer["choices"][0]["message"]["content"].clone());
    }
    assert!(answers[0].is_string(), "{answers:?}");
    assert_eq!(answers[0], answers[1], "answers are deterministic");

    let calls: Value = client
        .get(format!("{base}/__mock/calls"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(calls["calls"], 2, "{calls}");
}
