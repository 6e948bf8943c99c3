//! The price snapshot's update command, run against the packaged data: the
//! committed snapshot and license are exactly what `pricing/update.py`
//! produces from the `genai-prices` release the snapshot names.
//!
//! Like the SDK test, this installs the package itself (once, into the target
//! directory) and fails loudly rather than skipping without python3 or PyPI.

use std::{path::Path, time::Duration};

use tokio::process::Command;

use crate::sdk::{pip_install, run};

/// pip resolves genai-prices and pydantic; a slow index must not hang the run.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(120);

#[tokio::test]
async fn the_update_command_regenerates_the_committed_snapshot_from_the_package() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let committed = std::fs::read_to_string(root.join("pricing/genai-prices.json"))
        .expect("the snapshot is committed");
    let snapshot: serde_json::Value = serde_json::from_str(&committed).expect("it is JSON");
    let version = snapshot["source"]["version"]
        .as_str()
        .expect("it names its version");
    let as_of = snapshot["as_of"].as_str().expect("it is dated");

    let deps =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("pydeps-genai-prices-{version}"));
    if !deps.join("genai_prices").is_dir() {
        pip_install(&format!("genai-prices=={version}"), &deps).await;
    }
    let out = tempfile::tempdir().expect("a temporary directory");
    let json = out.path().join("genai-prices.json");
    let license = out.path().join("LICENSE.genai-prices");
    let mut command = Command::new("python3");
    command
        .arg(root.join("pricing/update.py"))
        .arg("--out")
        .arg(&json)
        .arg("--license-out")
        .arg(&license)
        .args(["--as-of", as_of])
        .env("PYTHONPATH", &deps);
    let output = run(command, SCRIPT_TIMEOUT, "pricing/update.py").await;
    assert!(
        output.status.success(),
        "pricing/update.py failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let regenerated = std::fs::read_to_string(&json).expect("the command wrote the snapshot");
    assert!(
        regenerated == committed,
        "pricing/genai-prices.json differs from what pricing/update.py makes of genai-prices \
         {version} as of {as_of}; regenerate it (see README, Prices)"
    );
    let models = snapshot["models"].as_array().expect("models");
    assert!(models.len() >= 300, "{} models", models.len());
    assert_eq!(
        std::fs::read_to_string(&license).expect("the command copied the license"),
        std::fs::read_to_string(root.join("pricing/LICENSE.genai-prices"))
            .expect("the license is committed beside the snapshot"),
    );
    assert!(
        std::fs::read_to_string(&license)
            .unwrap()
            .contains("MIT License"),
        "genai-prices is MIT"
    );
}
