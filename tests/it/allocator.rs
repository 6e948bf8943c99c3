//! The `corral` binary runs on jemalloc with the options that give memory
//! back after a burst (BENCHMARKS.md, "Memory that follows the bytes held"):
//! built in, so no unsafe exported symbol is needed to set them.

#[test]
fn the_binary_runs_on_jemalloc_with_background_purging() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_corral"))
        .arg("--version")
        // jemalloc prints its options and statistics at exit.
        .env("_RJEM_MALLOC_CONF", "stats_print:true")
        .output()
        .expect("the binary runs");
    assert!(output.status.success());
    let stats = String::from_utf8_lossy(&output.stderr);
    for option in [
        "opt.background_thread: true",
        "opt.dirty_decay_ms: 1000",
        "opt.muzzy_decay_ms: 0",
    ] {
        assert!(
            stats.contains(option),
            "{option} not in jemalloc's stats:\n{stats}"
        );
    }
}
