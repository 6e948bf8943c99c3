//! The `mock-upstream` binary as a Vertex AI stand-in: `--google-service-account-file` writes
//! the test service account's key file before the ready line, its `token_uri` the bound
//! address, and the key in it gets a token that opens the Vertex paths.

use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::Command;

/// Bound on every wait: the binary makes a 2048-bit key before its ready line, which takes
/// seconds in a debug build on a loaded machine; finite so a broken run fails.
const WAIT: Duration = Duration::from_secs(120);

#[tokio::test]
async fn the_written_key_file_gets_a_token_that_opens_vertex() {
    let key_path = std::env::temp_dir().join(format!(
        "mock-upstream-sa-{}-{}.json",
        std::process::id(),
        rand::random::<u64>()
    ));
    let mut child = Command::new(env!("CARGO_BIN_EXE_mock-upstream"))
        .args(["--listen", "127.0.0.1:0", "--google-service-account-file"])
        .arg(&key_path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("mock-upstream starts");
    let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
    let ready = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .expect("a ready line within the bound")
        .expect("stdout is readable")
        .expect("the process prints a ready line");
    let root = ready
        .split_whitespace()
        .find_map(|word| word.strip_prefix("http://"))
        .and_then(|rest| rest.split('/').next())
        .map(|addr| format!("http://{addr}"))
        .unwrap_or_else(|| panic!("no address on the ready line: {ready}"));

    let file = std::fs::read_to_string(&key_path).expect("the key file was written");
    let _ = std::fs::remove_file(&key_path);
    let file: Value = serde_json::from_str(&file).expect("the key file is JSON");
    assert_eq!(file["type"], "service_account");
    assert_eq!(file["token_uri"], format!("{root}/token"));

    let iat = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_secs();
    let claims = json!({
        "iss": file["client_email"],
        "aud": file["token_uri"],
        "scope": "https://www.googleapis.com/auth/cloud-platform",
        "iat": iat,
        "exp": iat + 3600,
    });
    let key =
        EncodingKey::from_rsa_pem(file["private_key"].as_str().unwrap_or_default().as_bytes())
            .expect("an RSA private key");
    let assertion = jsonwebtoken::encode(&Header::new(Algorithm::RS256), &claims, &key)
        .expect("signing the assertion");

    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(WAIT)
        .build()
        .expect("building the HTTP client");
    let token: Value = client
        .post(format!("{root}/token"))
        .form(&[
            ("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer"),
            ("assertion", assertion.as_str()),
        ])
        .send()
        .await
        .expect("the token endpoint answers")
        .json()
        .await
        .expect("a JSON answer");
    let token = token["access_token"]
        .as_str()
        .unwrap_or_else(|| panic!("no token: {token}"));

    let answer = client
        .post(format!(
            "{root}/v1/projects/mock-project/locations/us-central1/publishers/google/models/gemini-2.5-flash:generateContent"
        ))
        .bearer_auth(token)
        .json(&json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}))
        .send()
        .await
        .expect("the mock answers");
    assert_eq!(answer.status(), 200);
    let answer: Value = answer.json().await.expect("a JSON answer");
    assert_eq!(answer["modelVersion"], "gemini-2.5-flash", "{answer}");
}
