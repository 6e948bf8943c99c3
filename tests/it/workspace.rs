//! The workspace is the architecture (issue 12): the gateway, the mock
//! provider and the bench tool are members of their own; `cargo test` at the
//! root runs all three; the gateway's dependency tree holds only the product.
//! Read from `cargo metadata` (offline, the lockfile's resolution).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    process::Command,
};

use serde_json::Value;

/// Crates that belong to the load tool or the mock, never to the gateway.
const NOT_THE_PRODUCT: [&str; 5] = [
    "mock-upstream",
    "corral-bench",
    "hdrhistogram",
    "rand_distr",
    "criterion",
];

/// The workspace as cargo sees it, resolved for this machine's platform:
/// offline, a resolve for every platform would need the manifests of crates
/// only other platforms use (`android_system_properties`, say), which a
/// fresh machine's builds never downloaded.
fn metadata() -> Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let rustc = Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("rustc runs");
    let host = String::from_utf8_lossy(&rustc.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("host: ").map(str::to_owned))
        .expect("rustc -vV names the host");
    let output = Command::new(env!("CARGO"))
        .current_dir(root)
        .args(["metadata", "--format-version", "1", "--offline"])
        .args(["--filter-platform", &host])
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON")
}

fn name_of(packages: &BTreeMap<String, String>, id: &Value) -> String {
    packages[id.as_str().unwrap()].clone()
}

#[test]
fn the_workspace_members_are_tested_together_and_the_gateway_depends_on_neither() {
    let metadata = metadata();
    let packages: BTreeMap<String, String> = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["id"].as_str().unwrap().to_owned(),
                p["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let names = |key: &str| -> BTreeSet<String> {
        metadata[key]
            .as_array()
            .unwrap_or_else(|| panic!("no {key} in cargo metadata"))
            .iter()
            .map(|id| name_of(&packages, id))
            .collect()
    };
    let expected: BTreeSet<String> = ["corral", "mock-upstream", "corral-bench"]
        .map(str::to_owned)
        .into();
    assert_eq!(names("workspace_members"), expected);
    // `cargo test` at the root builds and tests the default members.
    assert_eq!(names("workspace_default_members"), expected);

    // Everything the gateway needs to build and run: its normal and build
    // dependencies, transitively (dev-dependencies are its tests').
    let nodes: BTreeMap<String, &Value> = metadata["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|node| (node["id"].as_str().unwrap().to_owned(), node))
        .collect();
    let gateway = packages
        .iter()
        .find(|(id, name)| *name == "corral" && nodes.contains_key(*id))
        .map(|(id, _)| id.clone())
        .expect("the gateway package");
    let mut seen = BTreeSet::new();
    let mut todo = vec![gateway];
    while let Some(id) = todo.pop() {
        if !seen.insert(id.clone()) {
            continue;
        }
        for dep in nodes[&id]["deps"].as_array().unwrap() {
            let product = dep["dep_kinds"]
                .as_array()
                .unwrap()
                .iter()
                .any(|kind| kind["kind"].as_str() != Some("dev"));
            if product {
                todo.push(dep["pkg"].as_str().unwrap().to_owned());
            }
        }
    }
    let tree: BTreeSet<String> = seen.iter().map(|id| packages[id].clone()).collect();
    assert!(tree.contains("axum") && tree.contains("redis"), "{tree:?}");
    for name in NOT_THE_PRODUCT {
        assert!(
            !tree.contains(name),
            "`{name}` is in the gateway's dependency tree"
        );
    }
}
