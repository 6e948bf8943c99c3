//! What the bench's integration tests share: a quick suite run's options,
//! with the binaries this test build made (`cargo test` at the workspace
//! root builds every one of them into one directory).

use std::path::{Path, PathBuf};

use corral_bench::suite::SuiteOptions;

/// `corral-bench suite --quick --only <only>` (every scenario but the peer
/// when `only` is empty), its report written below `out`.
pub fn quick_suite(only: &[&str], out: &Path) -> SuiteOptions {
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_corral-bench"))
        .parent()
        .expect("binaries have a directory")
        .to_owned();
    for bin in ["corral", "mock-upstream", "bench-baseline"] {
        assert!(
            bin_dir.join(bin).exists(),
            "{bin} is not built in {}: run `cargo test` at the workspace root",
            bin_dir.display()
        );
    }
    SuiteOptions {
        bin_dir,
        out_dir: out.to_owned(),
        corpus: root.join("prompts/corpus.jsonl"),
        corral_config: root.join("config.yaml"),
        criterion_dir: out.join("no-criterion-here"),
        only: only.iter().map(|name| (*name).to_owned()).collect(),
        quick: true,
        peers: Vec::new(),
        litellm: PathBuf::from("litellm"),
        redis_server: "redis-server".to_owned(),
        peer_stampede: 100,
    }
}
