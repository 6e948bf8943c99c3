//! The deployment files: `deploy/kubernetes/` validates against the pinned
//! Kubernetes schemas and `docker-compose.yml` against the compose
//! specification, offline (`tests/deploy/validate.py`: kubernetes-validate and
//! check-jsonschema's vendored compose-spec schema, pip-installed into the
//! target directory once, like the SDK tests). Then the facts the schemas
//! cannot know: three replicas, probes on corral's own paths and port, a
//! preStop drain that fits the grace period, a PodDisruptionBudget and a
//! Service that select the Deployment's pods, keys only in Secrets, the
//! ConfigMap's config.yaml loading with the Deployment's environment, and a
//! compose demo whose Prometheus scrapes every corral it starts.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    time::Duration,
};

use corral::Config;
use serde_json::Value;
use tokio::sync::OnceCell;

use crate::sdk::{pip_install, run};

/// The Kubernetes version the manifests are validated against.
const KUBERNETES_VERSION: &str = "1.30";
/// The validators, pinned: the schemas they ship are the test's input.
const KUBERNETES_VALIDATE: &str = "kubernetes-validate==1.37.0";
const CHECK_JSONSCHEMA: &str = "check-jsonschema==0.39.0";
/// The Kubernetes schemas (16,000 files) take a while to unpack.
const VALIDATE_TIMEOUT: Duration = Duration::from_secs(300);
/// The cut after `shutdown.drain_timeout` (src/server.rs `CUT_GRACE`).
const CUT_GRACE_SECS: u64 = 5;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn kubernetes_dir() -> PathBuf {
    root().join("deploy/kubernetes")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|err| panic!("reading {}: {err}", path.display()))
}

/// A YAML file as JSON values, one per document.
fn yaml_documents(path: &Path) -> Vec<Value> {
    let text = read(path);
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|document| {
            let value: serde_yaml_ng::Value = serde::Deserialize::deserialize(document)
                .unwrap_or_else(|err| panic!("{}: {err}", path.display()));
            serde_json::to_value(value).expect("YAML maps to JSON")
        })
        .filter(|value| !value.is_null())
        .collect()
}

fn yaml(path: &Path) -> Value {
    let mut documents = yaml_documents(path);
    assert_eq!(documents.len(), 1, "{}: one document", path.display());
    documents.remove(0)
}

/// Every manifest in `deploy/kubernetes/`, by kind.
fn manifests() -> BTreeMap<String, Value> {
    let mut by_kind = BTreeMap::new();
    for path in manifest_files() {
        for document in yaml_documents(&path) {
            let kind = document["kind"].as_str().expect("kind").to_owned();
            assert!(
                by_kind.insert(kind.clone(), document).is_none(),
                "one {kind}"
            );
        }
    }
    by_kind
}

/// The YAML files of `deploy/kubernetes/` except the kustomization.
fn manifest_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(kubernetes_dir())
        .expect("deploy/kubernetes exists")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .filter(|path| !path.ends_with("kustomization.yaml"))
        .collect();
    files.sort();
    files
}

/// `python3` with the two validators importable.
async fn validators() -> &'static str {
    static DEPS: OnceCell<String> = OnceCell::const_new();
    DEPS.get_or_init(|| async {
        let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let mut paths = Vec::new();
        for (requirement, dir, module) in [
            (
                KUBERNETES_VALIDATE,
                "pydeps-kubernetes-validate",
                "kubernetes_validate",
            ),
            (
                CHECK_JSONSCHEMA,
                "pydeps-check-jsonschema",
                "check_jsonschema",
            ),
        ] {
            let deps = base.join(dir);
            let version = requirement.split("==").nth(1).unwrap();
            if !imports(&deps, module, version).await {
                pip_install(requirement, &deps).await;
                assert!(
                    imports(&deps, module, version).await,
                    "installed {requirement} into {} but python3 cannot import it",
                    deps.display()
                );
            }
            paths.push(deps.display().to_string());
        }
        paths.join(":")
    })
    .await
}

/// Whether `module` at `version` imports from `deps`.
async fn imports(deps: &Path, module: &str, version: &str) -> bool {
    if !deps.is_dir() {
        return false;
    }
    let check = format!(
        "import importlib.metadata as m, sys; import {module}; \
         sys.exit(0 if m.version('{}') == '{version}' else 1)",
        module.replace('_', "-")
    );
    let mut command = tokio::process::Command::new("python3");
    command.env("PYTHONPATH", deps).args(["-c", &check]);
    run(command, VALIDATE_TIMEOUT, "the validator import check")
        .await
        .status
        .success()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manifests_and_the_compose_file_validate() {
    let pythonpath = validators().await;
    let files = manifest_files();
    let mut command = tokio::process::Command::new("python3");
    command
        .env("PYTHONPATH", pythonpath)
        .arg(root().join("tests/deploy/validate.py"))
        .arg(KUBERNETES_VERSION)
        .arg(root().join("docker-compose.yml"))
        .args(&files);
    let output = run(command, VALIDATE_TIMEOUT, "the validators").await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "validate.py failed:\n{stdout}\n{stderr}"
    );
    let report: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|err| panic!("not JSON ({err}): {stdout}\n{stderr}"));
    assert_eq!(report["errors"], serde_json::json!([]), "{report:#}");
    // Every resource was checked against a schema (a kind the tool does not
    // know would only be a warning to it).
    let passed: BTreeSet<&str> = report["passed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let expected: BTreeSet<String> = manifests()
        .values()
        .map(|m| {
            format!(
                "{}/{}",
                m["kind"].as_str().unwrap(),
                m["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        passed,
        expected.iter().map(String::as_str).collect(),
        "{report:#}"
    );
    for kind in [
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "ConfigMap",
        "Secret",
    ] {
        assert!(
            passed.iter().any(|p| p.starts_with(&format!("{kind}/"))),
            "{kind}"
        );
    }
}

/// The `containerPort` a probe's or service's named port resolves to.
fn container_port(container: &Value, port: &Value) -> u64 {
    match port {
        Value::Number(n) => n.as_u64().unwrap(),
        Value::String(name) => container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name.as_str())
            .unwrap_or_else(|| panic!("no container port named {name}"))["containerPort"]
            .as_u64()
            .unwrap(),
        other => panic!("port {other}"),
    }
}

/// Whether every label of `selector` is on `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let selector = selector.as_object().expect("a selector");
    !selector.is_empty() && selector.iter().all(|(k, v)| labels[k] == *v)
}

/// The Deployment's environment as corral would see it, secrets given
/// placeholder values of the right shape.
fn pod_environment(container: &Value) -> Vec<(String, String)> {
    container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|var| {
            let name = var["name"].as_str().unwrap().to_owned();
            let value = match var["value"].as_str() {
                Some(value) => value.to_owned(),
                None => match var["valueFrom"]["secretKeyRef"]["key"].as_str().unwrap() {
                    "cache-key" => "ab".repeat(32),
                    "redis-url" => "redis://:hunter2@redis.example.internal:6379".to_owned(),
                    "gateway-keys" => "gw-one,gw-two".to_owned(),
                    "admin-keys" => "admin-one".to_owned(),
                    other => format!("placeholder-{other}"),
                },
            };
            (name, value)
        })
        .collect()
}

fn load(yaml: &str, env: &[(String, String)]) -> Config {
    Config::load(yaml, env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .unwrap_or_else(|err| panic!("the config does not load: {err}"))
}

#[test]
fn the_kubernetes_manifests_run_corral_as_intended() {
    let manifests = manifests();
    let deployment = &manifests["Deployment"];
    let pod = &deployment["spec"]["template"];
    let labels = &pod["metadata"]["labels"];
    assert_eq!(deployment["spec"]["replicas"], 3);
    assert!(selects(
        &deployment["spec"]["selector"]["matchLabels"],
        labels
    ));
    let containers = pod["spec"]["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let container = &containers[0];

    // The config: the ConfigMap's config.yaml, mounted where the image looks.
    let dockerfile = read(&root().join("Dockerfile"));
    assert!(
        dockerfile.contains(r#"ENTRYPOINT ["corral", "--config", "/etc/corral/config.yaml"]"#),
        "the image reads /etc/corral/config.yaml"
    );
    let config_map = &manifests["ConfigMap"];
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == "/etc/corral")
        .expect("the config is mounted at /etc/corral");
    let volume = pod["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the mounted volume");
    assert_eq!(volume["configMap"]["name"], config_map["metadata"]["name"]);
    let config_yaml = config_map["data"]["config.yaml"]
        .as_str()
        .expect("config.yaml");

    // It loads with the Deployment's environment: every secret the config
    // names is provided, nothing is ignored.
    let env = pod_environment(container);
    let config = load(config_yaml, &env);
    assert!(config.ignored_env.is_empty(), "{:?}", config.ignored_env);
    assert!(
        config.listen.ip().is_unspecified(),
        "reachable from the Service"
    );
    let redis = config.redis.as_ref().expect("redis is configured");
    assert_eq!(
        redis.url.as_deref(),
        Some("redis://:hunter2@redis.example.internal:6379"),
        "from the Secret"
    );
    assert!(redis.encryption_key.is_some(), "values sealed at rest");
    assert_eq!(
        config.auth.key_hashes.len(),
        2,
        "gateway keys from the Secret"
    );
    assert_eq!(
        config.auth.admin_key_hashes.len(),
        1,
        "the reports are not open"
    );
    assert!(config.upstreams[0].api_key_env.is_some());
    // Kubernetes' service links would be ignored with a warning, not fatal;
    // the pods turn them off.
    assert_eq!(pod["spec"]["enableServiceLinks"], false);
    let mut linked = env.clone();
    linked.push(("CORRAL_SERVICE_HOST".into(), "10.0.0.1".into()));
    linked.push(("CORRAL_PORT".into(), "tcp://10.0.0.1:8080".into()));
    assert_eq!(
        load(config_yaml, &linked).ignored_env,
        ["CORRAL_PORT", "CORRAL_SERVICE_HOST"]
    );

    // Keys only in Secrets: every secretKeyRef names a key of the Secret, and
    // the ConfigMap holds no secret value.
    let secret = &manifests["Secret"];
    let secret_values = secret["stringData"].as_object().expect("stringData");
    for var in container["env"].as_array().unwrap() {
        if let Some(reference) = var["valueFrom"].get("secretKeyRef") {
            assert_eq!(reference["name"], secret["metadata"]["name"]);
            let key = reference["key"].as_str().unwrap();
            assert!(secret_values.contains_key(key), "the Secret has {key}");
        }
    }
    let config_text = serde_json::to_string(config_map).unwrap();
    for value in secret_values.values() {
        assert!(
            !config_text.contains(value.as_str().unwrap()),
            "{value} in the ConfigMap"
        );
    }
    for marker in ["redis://", "rediss://", "sk-"] {
        assert!(!config_text.contains(marker), "{marker} in the ConfigMap");
    }

    // Probes on corral's own paths and port.
    let port = config.listen.port() as u64;
    for (probe, path) in [
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
        ("startupProbe", "/healthz"),
    ] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}");
        assert_eq!(container_port(container, &get["port"]), port, "{probe}");
    }

    // The drain: preStop sleeps while endpoints update, then SIGTERM turns
    // /readyz 503 (serving on for shutdown.unready_delay), drains for
    // shutdown.drain_timeout and cuts after 5 s; all within the grace period.
    let command = container["lifecycle"]["preStop"]["exec"]["command"]
        .as_array()
        .expect("a preStop command");
    assert_eq!(command[0], "sleep");
    let sleep: u64 = command[1].as_str().unwrap().parse().unwrap();
    assert!(sleep >= 5, "long enough for endpoints to update");
    let grace = pod["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap();
    let drain = config.shutdown.drain_timeout.as_secs();
    let unready = config.shutdown.unready_delay.as_secs();
    assert!(
        grace > sleep + unready + drain + CUT_GRACE_SECS,
        "grace {grace}s <= preStop {sleep}s + unready {unready}s + drain {drain}s + cut {CUT_GRACE_SECS}s"
    );

    // Non-root (the image's user), read-only root filesystem, nothing to escalate.
    let uid: u64 = dockerfile
        .lines()
        .find_map(|line| line.strip_prefix("RUN useradd --system --uid "))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .expect("the Dockerfile creates its user with a uid");
    assert_eq!(pod["spec"]["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["spec"]["securityContext"]["runAsUser"], uid);
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));
    for bound in ["requests", "limits"] {
        for resource in ["cpu", "memory"] {
            assert!(
                container["resources"][bound][resource].is_string(),
                "{bound}.{resource}"
            );
        }
    }

    // The Service and the PodDisruptionBudget select the Deployment's pods.
    let service = &manifests["Service"];
    assert!(selects(&service["spec"]["selector"], labels));
    let service_port = &service["spec"]["ports"][0];
    assert_eq!(container_port(container, &service_port["targetPort"]), port);
    let budget = &manifests["PodDisruptionBudget"];
    assert!(selects(&budget["spec"]["selector"]["matchLabels"], labels));
    assert_eq!(
        budget["spec"]["maxUnavailable"], 1,
        "one of three at a time"
    );

    // kustomization.yaml applies every manifest but the Secret example.
    let kustomization = yaml(&kubernetes_dir().join("kustomization.yaml"));
    let listed: BTreeSet<&str> = kustomization["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    let files: BTreeSet<String> = manifest_files()
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap().to_owned())
        .filter(|name| name != "secret.example.yaml")
        .collect();
    assert_eq!(listed, files.iter().map(String::as_str).collect());
    assert_eq!(
        manifests["ServiceAccount"]["automountServiceAccountToken"],
        false
    );
}

#[test]
fn the_compose_demo_wires_three_corrals_to_redis_the_mock_and_prometheus() {
    let compose = yaml(&root().join("docker-compose.yml"));
    let services = compose["services"].as_object().expect("services");
    let dockerfile = read(&root().join("Dockerfile"));
    let corrals: Vec<&String> = services
        .keys()
        .filter(|name| name.starts_with("corral-"))
        .collect();
    assert_eq!(corrals.len(), 3, "{corrals:?}");
    // The image's own config.yaml plus its ENV and the service's environment.
    let image_config = read(&root().join("config.yaml"));
    for name in &corrals {
        let service = &services[name.as_str()];
        assert_eq!(service["build"]["target"], "corral");
        let mut env: Vec<(String, String)> = vec![("CORRAL_LISTEN".into(), "0.0.0.0:8080".into())];
        assert!(dockerfile.contains("ENV CORRAL_LISTEN=0.0.0.0:8080"));
        for (key, value) in service["environment"].as_object().unwrap() {
            env.push((key.clone(), value.as_str().unwrap().to_owned()));
        }
        let config = load(&image_config, &env);
        assert!(
            config.ignored_env.is_empty(),
            "{name}: {:?}",
            config.ignored_env
        );
        assert_eq!(
            config.upstreams[0].base_url, "http://mock:9090/v1",
            "{name}"
        );
        let redis = config.redis.as_ref().expect("redis");
        assert_eq!(redis.url.as_deref(), Some("redis://redis:6379"), "{name}");
    }
    assert_eq!(services["mock"]["build"]["target"], "mock-upstream");
    for target in ["corral", "mock-upstream"] {
        assert!(dockerfile.contains(&format!(" AS {target}\n")), "{target}");
    }
    assert!(
        services["redis"]["image"]
            .as_str()
            .unwrap()
            .starts_with("redis:7")
    );

    // Prometheus scrapes every corral the file starts, on its listen port.
    let prometheus = yaml(&root().join("deploy/compose/prometheus.yml"));
    let targets: BTreeSet<&str> = prometheus["scrape_configs"][0]["static_configs"][0]["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let expected: BTreeSet<String> = corrals.iter().map(|name| format!("{name}:8080")).collect();
    assert_eq!(targets, expected.iter().map(String::as_str).collect());
    assert_eq!(prometheus["scrape_configs"][0]["metrics_path"], "/metrics");

    // Every file a service mounts exists; Grafana gets the dashboard and the
    // provisioning that points it at this Prometheus.
    for service in services.values() {
        for volume in service["volumes"].as_array().into_iter().flatten() {
            let host = volume.as_str().unwrap().split(':').next().unwrap();
            assert!(root().join(host).exists(), "{host} is mounted but missing");
        }
    }
    let grafana = services["grafana"]["volumes"].as_array().unwrap();
    let mounted = |target: &str| {
        grafana
            .iter()
            .filter_map(|v| v.as_str())
            .any(|v| v.split(':').nth(1) == Some(target))
    };
    assert!(mounted("/etc/grafana/provisioning"));
    assert!(mounted("/var/lib/grafana/dashboards"));
    let datasources =
        yaml(&root().join("deploy/compose/grafana/provisioning/datasources/prometheus.yml"));
    assert_eq!(datasources["datasources"][0]["type"], "prometheus");
    assert_eq!(
        datasources["datasources"][0]["url"],
        "http://prometheus:9090"
    );
    assert_eq!(datasources["datasources"][0]["isDefault"], true);
    let dashboards =
        yaml(&root().join("deploy/compose/grafana/provisioning/dashboards/corral.yml"));
    assert_eq!(
        dashboards["providers"][0]["options"]["path"],
        "/var/lib/grafana/dashboards"
    );
    let dashboard: Value =
        serde_json::from_str(&read(&root().join("deploy/grafana/corral.json"))).unwrap();
    assert!(
        dashboard["panels"]
            .as_array()
            .is_some_and(|p| !p.is_empty())
    );
}
