use super::*;

const BASE: &str =
    "listen: 127.0.0.1:8080\nupstreams:\n  - name: a\n    base_url: http://127.0.0.1:9/v1\n";

#[test]
fn the_shipped_config_loads() {
    let config = Config::load(EMBEDDED_DEFAULT, []).unwrap();
    assert!(!config.upstreams.is_empty());
    assert!(
        !config.cache.sampled,
        "the shipped default must not cache sampled answers"
    );
}

#[test]
fn env_overrides_listen_upstream_and_nested_keys() {
    let config = Config::load(
        BASE,
        [
            ("CORRAL_LISTEN", "0.0.0.0:9999"),
            ("CORRAL_UPSTREAM_BASE_URL", "http://127.0.0.1:7/v1"),
            ("CORRAL_UPSTREAM_API_KEY", "sk-test"),
            ("CORRAL_CACHE__SOFT_TTL", "10s"),
            ("CORRAL_CACHE__SAMPLED", "true"),
            // Listening on every interface with corral's own key is an explicit choice.
            ("CORRAL_AUTH__ALLOW_ANONYMOUS", "true"),
            ("UNRELATED", "x"),
        ],
    )
    .unwrap();
    assert_eq!(config.listen.port(), 9999);
    assert_eq!(config.upstreams[0].base_url, "http://127.0.0.1:7/v1");
    assert_eq!(
        config.upstreams[0].api_key.as_ref().unwrap().expose(),
        "sk-test"
    );
    assert_eq!(config.cache.soft_ttl, Duration::from_secs(10));
    assert!(config.cache.sampled);
}

#[test]
fn an_upstream_names_the_api_it_speaks() {
    let config = Config::load(BASE, []).unwrap();
    assert_eq!(config.upstreams[0].api, Api::OpenAi, "the default");
    let yaml = format!(
        "{BASE}  - {{name: anthropic, api: anthropic, base_url: 'https://api.anthropic.com/v1', api_key_env: ANTHROPIC_API_KEY, models: ['claude-*']}}\n"
    );
    let config = Config::load(&yaml, [("ANTHROPIC_API_KEY", "sk-ant-1")]).unwrap();
    assert_eq!(config.upstreams[1].api, Api::Anthropic);
    assert_eq!(config.upstreams[1].api.as_str(), "anthropic");
    let config = Config::load(BASE, [("CORRAL_UPSTREAMS__0__API", "anthropic")]).unwrap();
    assert_eq!(
        config.upstreams[0].api,
        Api::Anthropic,
        "settable from the environment"
    );

    let err = Config::load(&format!("{BASE}    api: vertex\n"), [])
        .unwrap_err()
        .to_string();
    assert!(err.contains("upstreams[0].api"), "{err}");
    assert!(
        err.contains("openai") && err.contains("anthropic") && err.contains("gemini"),
        "{err}"
    );
    // Gemini's base URL names its version, as Anthropic's does.
    let gemini = "listen: 127.0.0.1:8080\nupstreams:\n  - {name: g, api: gemini, base_url: 'https://generativelanguage.googleapis.com/v1beta'}\n";
    assert_eq!(
        Config::load(gemini, []).unwrap().upstreams[0].api,
        Api::Gemini
    );
    let bare = gemini.replace("/v1beta", "");
    let err = Config::load(&bare, []).unwrap_err().to_string();
    assert!(err.contains("ends in its version"), "{err}");
    let bare = "listen: 127.0.0.1:8080\nupstreams:\n  - {name: a, api: anthropic, base_url: 'https://api.anthropic.com'}\n";
    let err = Config::load(bare, []).unwrap_err().to_string();
    assert!(
        err.contains("upstreams[0].base_url") && err.contains("/v1"),
        "{err}"
    );
}

#[test]
fn api_key_env_is_resolved_and_required() {
    let yaml = format!("{BASE}    api_key_env: MY_KEY\n");
    let config = Config::load(&yaml, [("MY_KEY", "sk-1")]).unwrap();
    assert_eq!(
        config.upstreams[0].api_key.as_ref().unwrap().expose(),
        "sk-1"
    );
    let err = Config::load(&yaml, []).unwrap_err().to_string();
    assert!(err.contains("MY_KEY"), "{err}");
}

#[test]
fn errors_name_the_key() {
    let err = Config::load(&format!("{BASE}cache:\n  soft_ttl: soon\n"), [])
        .unwrap_err()
        .to_string();
    assert!(err.contains("cache.soft_ttl"), "{err}");
    let err = Config::load(&format!("{BASE}retry:\n  max_attempts: 0\n"), [])
        .unwrap_err()
        .to_string();
    assert!(err.contains("retry.max_attempts"), "{err}");
    let err = Config::load(&format!("{BASE}cache:\n  typo: 1\n"), [])
        .unwrap_err()
        .to_string();
    assert!(err.contains("typo"), "{err}");
    let err = Config::load(BASE, [("CORRAL_CACHE__HARD_TTL", "1s")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("cache.soft_ttl"), "{err}");
}

#[test]
fn pricing_keeps_its_order_and_accepts_embeddings_without_output() {
    let yaml = format!(
        "{BASE}pricing:\n  as_of: 2025-08-15\n  models:\n    gpt-4o-mini: {{input: 0.15, output: 0.6, cached_input: 0.075}}\n    'claude-*': {{input: 3, output: 15}}\n    text-embedding-3-small: {{input: 0.02}}\n    '*': {{input: 1, output: 1}}\n"
    );
    let config = Config::load(&yaml, []).unwrap();
    let names: Vec<&str> = config
        .pricing
        .models
        .0
        .iter()
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(
        names,
        ["gpt-4o-mini", "claude-*", "text-embedding-3-small", "*"]
    );
    assert_eq!(config.pricing.as_of.as_deref(), Some("2025-08-15"));
    let embedding = config.pricing.models.0[2].1;
    assert_eq!((embedding.input, embedding.output), (0.02, 0.0));
    assert_eq!(config.pricing.models.0[0].1.cached_input, Some(0.075));
    // Serializing keeps the order too (the config round-trips).
    let text = serde_yaml_ng::to_string(&config.pricing).unwrap();
    assert!(text.find("gpt-4o-mini").unwrap() < text.find("claude-*").unwrap());
}

#[test]
fn pricing_errors_name_the_model_and_field() {
    for (models, expected) in [
        (
            "gpt-4o: {input: -1, output: 1}",
            "pricing.models.gpt-4o.input",
        ),
        (
            "gpt-4o: {input: 1, output: .nan}",
            "pricing.models.gpt-4o.output",
        ),
        ("'gpt-[': {input: 1}", "pricing.models.gpt-["),
        ("other: {input: 1}", "pricing.models.other"),
        ("gpt-4o: {input: 1, outptu: 2}", "outptu"),
        ("gpt-4o: {input: 1}\n    GPT-4o: {input: 2}", "priced twice"),
    ] {
        let yaml = format!("{BASE}pricing:\n  models:\n    {models}\n");
        let err = Config::load(&yaml, []).unwrap_err().to_string();
        assert!(err.contains(expected), "{models}: {err}");
    }
}

#[test]
fn prices_and_request_logging_can_be_set_from_the_environment() {
    let yaml = format!("{BASE}pricing:\n  models:\n    gpt-4o: {{input: 2.5, output: 10}}\n");
    let config = Config::load(
        &yaml,
        [
            ("CORRAL_PRICING__MODELS__GPT-4O__INPUT", "3"),
            ("CORRAL_LOG__REQUESTS", "false"),
            ("CORRAL_LOG__FORMAT", "json"),
        ],
    )
    .unwrap();
    assert_eq!(config.pricing.models.0[0].1.input, 3.0);
    assert!(!config.log.requests);
    assert_eq!(config.log.format, LogFormat::Json);
    let defaults = Config::load(BASE, []).unwrap();
    assert!(defaults.log.requests, "request lines are on by default");
    assert!(defaults.pricing.models.0.is_empty());
}

#[test]
fn traces_are_off_unless_an_endpoint_is_configured() {
    let defaults = Config::load(BASE, []).unwrap();
    assert_eq!(defaults.telemetry.otlp.endpoint, None, "off by default");
    assert!(
        Config::load(EMBEDDED_DEFAULT, [])
            .unwrap()
            .telemetry
            .otlp
            .endpoint
            .is_none()
    );

    // The file's key, its CORRAL_ override, then the standard variable.
    let yaml = format!("{BASE}telemetry:\n  otlp:\n    endpoint: http://file:4318\n");
    let from_file = Config::load(&yaml, [(OTEL_ENDPOINT_ENV, "http://otel:4318")]).unwrap();
    assert_eq!(
        from_file.telemetry.otlp.endpoint.as_deref(),
        Some("http://file:4318")
    );
    let overridden = Config::load(
        &yaml,
        [("CORRAL_TELEMETRY__OTLP__ENDPOINT", "http://env:4318")],
    )
    .unwrap();
    assert_eq!(
        overridden.telemetry.otlp.endpoint.as_deref(),
        Some("http://env:4318")
    );
    let standard = Config::load(BASE, [(OTEL_ENDPOINT_ENV, "http://otel:4318")]).unwrap();
    assert_eq!(
        standard.telemetry.otlp.endpoint.as_deref(),
        Some("http://otel:4318")
    );
    assert!(standard.ignored_env.is_empty());

    let tuned = Config::load(
        BASE,
        [
            ("CORRAL_TELEMETRY__OTLP__ENDPOINT", "https://c:4318"),
            ("CORRAL_TELEMETRY__OTLP__SAMPLE_RATIO", "0.25"),
            ("CORRAL_TELEMETRY__OTLP__SERVICE_NAME", "corral-eu"),
        ],
    )
    .unwrap();
    assert_eq!(tuned.telemetry.otlp.sample_ratio, 0.25);
    assert_eq!(tuned.telemetry.otlp.service_name, "corral-eu");
}

#[test]
fn trace_export_headers_come_from_their_variable_and_stay_secret() {
    let yaml = format!(
        "{BASE}telemetry:\n  otlp:\n    endpoint: http://c:4318\n    headers_env: OTLP_AUTH\n"
    );
    let config = Config::load(
        &yaml,
        [("OTLP_AUTH", "authorization=Bearer%20tok-123, x-team = a")],
    )
    .unwrap();
    let headers = config.telemetry.otlp.headers.as_ref().unwrap();
    assert_eq!(
        headers.expose(),
        &vec![
            ("authorization".to_owned(), "Bearer tok-123".to_owned()),
            ("x-team".to_owned(), "a".to_owned()),
        ]
    );
    assert!(
        !format!("{config:?}").contains("tok-123"),
        "redacted in Debug"
    );
    let missing = Config::load(&yaml, []).unwrap_err().to_string();
    assert!(missing.contains("OTLP_AUTH"), "{missing}");
    let bad = Config::load(&yaml, [("OTLP_AUTH", "no-equals-sign-tok-123")])
        .unwrap_err()
        .to_string();
    assert!(
        bad.contains("key=value") && !bad.contains("tok-123"),
        "{bad}"
    );
}

#[test]
fn trace_settings_are_checked_by_path() {
    for (otlp, path) in [
        ("endpoint: ftp://c", "telemetry.otlp.endpoint"),
        (
            "{endpoint: 'http://c:4318', sample_ratio: 1.5}",
            "telemetry.otlp.sample_ratio",
        ),
        ("protocol: grpc", "telemetry.otlp.protocol"),
        ("max_queue_spans: 0", "telemetry.otlp.max_queue_spans"),
    ] {
        let otlp = if otlp.starts_with('{') {
            otlp.to_owned()
        } else {
            format!("{{{otlp}}}")
        };
        let yaml = format!("{BASE}telemetry:\n  otlp: {otlp}\n");
        let err = Config::load(&yaml, []).unwrap_err().to_string();
        assert!(err.contains(path), "{otlp}: {err}");
    }
}

#[test]
fn the_shipped_config_prices_through_the_snapshot_and_names_the_ledger() {
    let config = Config::load(EMBEDDED_DEFAULT, []).unwrap();
    assert!(config.pricing.snapshot, "the snapshot prices by default");
    assert!(
        config.pricing.models.0.is_empty(),
        "no hand-typed table to rot"
    );
    assert_eq!(config.ledger.flush_interval, Duration::from_secs(1));
    assert_eq!(config.ledger.top_tenants, 10);
}

#[test]
fn key_labels_name_tenants_and_are_checked() {
    let hash = "ab".repeat(32);
    let yaml = format!("{BASE}auth:\n  key_labels:\n    team-a: '{hash}'\n");
    let config = Config::load(&yaml, []).unwrap();
    assert_eq!(
        config.auth.labels_by_hash,
        vec![([0xab; 32], "team-a".to_owned())]
    );
    for (labels, expected) in [
        ("team-a: nothex", "auth.key_labels.team-a"),
        (&format!("other: '{hash}'") as &str, "auth.key_labels.other"),
        (&format!("gateway: '{hash}'"), "auth.key_labels.gateway"),
    ] {
        let yaml = format!("{BASE}auth:\n  key_labels:\n    {labels}\n");
        let err = Config::load(&yaml, []).unwrap_err().to_string();
        assert!(err.contains(expected), "{labels}: {err}");
    }
    let err = Config::load(&format!("{BASE}ledger:\n  max_tenants: 0\n"), [])
        .unwrap_err()
        .to_string();
    assert!(err.contains("ledger.max_tenants"), "{err}");
}

#[test]
fn protection_settings_load_from_yaml_and_env() {
    let yaml = format!(
        "{BASE}    api_key_env: PROVIDER_KEY\n    rate: {{rps: 50, burst: 100}}\n    max_concurrency: 8\n    first_byte_timeout: 5s\nlimits:\n  per_tenant: {{rps: 5, burst: 10}}\nauth:\n  keys: ['{}']\n  keys_env: GATEWAY_KEYS\n  tenant_secret_env: TENANT_SECRET\nserver:\n  header_read_timeout: 3s\nshutdown:\n  drain_timeout: 7s\nredis:\n  url: redis://127.0.0.1:6379\n  encryption_key_env: CACHE_KEY\n",
        "ab".repeat(32)
    );
    let config = Config::load(
        &yaml,
        [
            ("PROVIDER_KEY", "sk-provider"),
            ("GATEWAY_KEYS", "gw-1, gw-2"),
            ("TENANT_SECRET", "a-secret-of-sixteen+"),
            ("CACHE_KEY", &"cd".repeat(32)),
        ],
    )
    .unwrap();
    assert_eq!(
        config.limits.per_tenant.and_then(|limits| limits.rate()),
        Some(RateConfig { rps: 5, burst: 10 })
    );
    assert_eq!(config.upstreams[0].max_concurrency, Some(8));
    assert_eq!(config.auth.key_hashes.len(), 3);
    assert_eq!(config.auth.key_hashes[1], crate::tenant::key_hash(b"gw-1"));
    assert!(config.auth.tenant_secret.is_some());
    assert_eq!(
        config
            .redis
            .as_ref()
            .unwrap()
            .encryption_key
            .as_ref()
            .unwrap()
            .expose(),
        &[0xcd; 32]
    );
    assert_eq!(config.server.header_read_timeout, Duration::from_secs(3));
    assert_eq!(config.shutdown.drain_timeout, Duration::from_secs(7));
    assert!(!format!("{config:?}").contains("a-secret-of-sixteen"));
}

#[test]
fn admin_keys_load_like_gateway_keys_and_are_never_gateway_keys() {
    let admin_hash = hex::encode(crate::tenant::key_hash(b"adm-1"));
    let yaml =
        format!("{BASE}auth:\n  admin_keys: ['{admin_hash}']\n  admin_keys_env: ADMIN_KEYS\n");
    let config = Config::load(&yaml, [("ADMIN_KEYS", " adm-2, adm-3 ,")]).unwrap();
    assert_eq!(
        config.auth.admin_key_hashes,
        [b"adm-1".as_slice(), b"adm-2", b"adm-3"].map(crate::tenant::key_hash)
    );
    assert!(
        config.auth.key_hashes.is_empty(),
        "admin keys admit no /v1 caller"
    );
    // From the environment alone, as a Secret would provide it.
    let config = Config::load(
        BASE,
        [
            ("CORRAL_AUTH__ADMIN_KEYS_ENV", "ADMIN_KEYS"),
            ("ADMIN_KEYS", "adm-4"),
        ],
    )
    .unwrap();
    assert_eq!(
        config.auth.admin_key_hashes,
        [crate::tenant::key_hash(b"adm-4")]
    );
    assert!(!format!("{config:?}").contains("adm-4"));
    let cases = [
        ("auth:\n  admin_keys: [nothex]\n", "auth.admin_keys[0]"),
        ("auth:\n  admin_keys_env: MISSING\n", "MISSING"),
        (
            "auth:\n  keys_env: SAME\n  admin_keys_env: SAME\n",
            "auth.admin_keys",
        ),
    ];
    for (extra, expected) in cases {
        let err = Config::load(&format!("{BASE}{extra}"), [("SAME", "k-1")])
            .unwrap_err()
            .to_string();
        assert!(err.contains(expected), "{extra}: {err}");
    }
}

#[test]
fn a_tenants_rate_and_places_each_work_alone_and_burst_defaults_to_rps() {
    let places = Config::load(
        &format!("{BASE}limits:\n  per_tenant: {{max_concurrent: 4}}\n"),
        [],
    )
    .unwrap()
    .limits
    .per_tenant
    .unwrap();
    assert_eq!((places.rate(), places.max_concurrent), (None, Some(4)));
    let rate = Config::load(&format!("{BASE}limits:\n  per_tenant: {{rps: 5}}\n"), [])
        .unwrap()
        .limits
        .per_tenant
        .unwrap();
    assert_eq!(rate.rate(), Some(RateConfig { rps: 5, burst: 5 }));
    assert_eq!(rate.max_concurrent, None);
}

#[test]
fn budgets_load_from_yaml_and_the_environment_and_name_what_is_wrong() {
    let yaml = format!(
        "{BASE}budgets:\n  - {{tenant: '*', usd: 10, per: day}}\n  - {{upstream: a, usd: 1000, per: month}}\n"
    );
    let config = Config::load(
        &yaml,
        [
            ("CORRAL_BUDGETS__0__USD", "2.5"),
            ("CORRAL_LIMITS__PER_TENANT__TOKENS_PER_MINUTE", "2000000"),
        ],
    )
    .unwrap();
    assert!(config.ignored_env.is_empty(), "{:?}", config.ignored_env);
    assert_eq!(config.budgets[0].usd, 2.5);
    assert_eq!(config.budgets[0].per, Period::Day);
    assert_eq!(config.budgets[1].upstream.as_deref(), Some("a"));
    assert_eq!(
        config.limits.per_tenant.unwrap().tokens_per_minute,
        Some(2_000_000)
    );
    let whole = Config::load(
        BASE,
        [("CORRAL_BUDGETS", "[{tenant: team-a, usd: 50, per: 30s}]")],
    )
    .unwrap();
    assert_eq!(whole.budgets[0].per, Period::Every(Duration::from_secs(30)));
    for (rules, expected) in [
        ("[{usd: 1, per: day}]", "budgets[0]"),
        ("[{tenant: a, upstream: a, usd: 1, per: day}]", "budgets[0]"),
        (
            "[{upstream: nowhere, usd: 1, per: day}]",
            "budgets[0].upstream",
        ),
        ("[{tenant: a, usd: -1, per: day}]", "budgets[0].usd"),
        ("[{tenant: a, usd: 1, per: week}]", "week"),
    ] {
        let err = Config::load(&format!("{BASE}budgets: {rules}\n"), [])
            .unwrap_err()
            .to_string();
        assert!(err.contains(expected), "{rules}: {err}");
    }
}

#[test]
fn protection_errors_name_the_key() {
    let cases = [
        (
            "limits:\n  per_tenant: {rps: 0, burst: 1}\n",
            "limits.per_tenant",
        ),
        (
            "limits:\n  per_tenant: {max_concurrent: 0}\n",
            "limits.per_tenant.max_concurrent",
        ),
        ("limits:\n  per_tenant: {burst: 5}\n", "burst needs rps"),
        ("limits:\n  per_tenant: {}\n", "limits.per_tenant"),
        ("auth:\n  keys: [nothex]\n", "auth.keys[0]"),
        ("auth:\n  tenant_secret_env: MISSING\n", "MISSING"),
        ("shutdown:\n  drain_timeout: 0s\n", "shutdown.drain_timeout"),
        ("limits:\n  max_json_depth: 500\n", "limits.max_json_depth"),
        ("server:\n  typo: 1s\n", "typo"),
    ];
    for (extra, expected) in cases {
        let err = Config::load(&format!("{BASE}{extra}"), [])
            .unwrap_err()
            .to_string();
        assert!(err.contains(expected), "{extra}: {err}");
    }
    // A gateway key must never be forwarded as the provider key.
    let err = Config::load(
        &format!("{BASE}auth:\n  keys: ['{}']\n", "ab".repeat(32)),
        [],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("upstreams[0].api_key_env"), "{err}");
    let err = Config::load(
        &format!("{BASE}redis:\n  url: redis://127.0.0.1:1\n  encryption_key_env: K\n"),
        [("K", "too-short")],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("64 hex digits"), "{err}");
}

#[test]
fn an_open_relay_is_refused_unless_anonymous_access_is_allowed() {
    let yaml = "listen: 0.0.0.0:8080\nupstreams:\n  - {name: a, base_url: 'http://127.0.0.1:9/v1', api_key_env: KEY}\n";
    let err = Config::load(yaml, [("KEY", "sk-1")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("auth.allow_anonymous"), "{err}");
    assert!(err.contains("open relay"), "{err}");
    let allowed = format!("{yaml}auth:\n  allow_anonymous: true\n");
    assert!(Config::load(&allowed, [("KEY", "sk-1")]).is_ok());
    // Gateway keys, a loopback address or the callers' own keys: no relay.
    let keyed = format!("{yaml}auth:\n  keys_env: GW\n");
    assert!(Config::load(&keyed, [("KEY", "sk-1"), ("GW", "gw-1")]).is_ok());
    let loopback = yaml.replace("0.0.0.0", "127.0.0.1");
    assert!(Config::load(&loopback, [("KEY", "sk-1")]).is_ok());
    let own_keys =
        "listen: '[::]:8080'\nupstreams:\n  - {name: a, base_url: 'http://127.0.0.1:9/v1'}\n";
    assert!(Config::load(own_keys, []).is_ok());
}

#[test]
fn a_global_cache_is_refused_while_callers_pay_with_their_own_keys() {
    let err = Config::load(&format!("{BASE}cache:\n  scope: global\n"), [])
        .unwrap_err()
        .to_string();
    assert!(err.contains("cache.scope"), "{err}");
    assert!(err.contains("upstreams[0]"), "{err}");
    let shared_key = format!("{BASE}    api_key_env: KEY\ncache:\n  scope: global\n");
    assert!(Config::load(&shared_key, [("KEY", "sk-1")]).is_ok());
}

#[test]
fn kubernetes_service_variables_are_ignored_and_named() {
    let config = Config::load(
        BASE,
        [
            ("CORRAL_PORT", "tcp://10.0.0.1:8080"),
            ("CORRAL_PORT_8080_TCP_ADDR", "10.0.0.1"),
            ("CORRAL_SERVICE_HOST", "10.0.0.1"),
            ("CORRAL_SERVICE_PORT", "8080"),
            ("CORRAL_BIN", "x"),
            ("CORRAL_CACHE__TYPO", "1"),
            ("CORRAL_CACHE__SOFT_TTL", "10s"),
            ("CORRAL_UPSTREAMS__0__MODELS", "['gpt-*']"),
            ("CORRAL_PRICING__MODELS__GPT-4O__INPUT", "3"),
            ("CORRAL_PASSTHROUGH__ALLOW", "['POST /v1/files']"),
        ],
    )
    .unwrap();
    assert_eq!(
        config.ignored_env,
        [
            "CORRAL_BIN",
            "CORRAL_CACHE__TYPO",
            "CORRAL_PORT",
            "CORRAL_PORT_8080_TCP_ADDR",
            "CORRAL_SERVICE_HOST",
            "CORRAL_SERVICE_PORT"
        ]
    );
    assert_eq!(config.cache.soft_ttl, Duration::from_secs(10));
    assert_eq!(config.upstreams[0].models, ["gpt-*"]);
    assert_eq!(config.pricing.models.0[0].0, "gpt-4o");
    assert_eq!(config.passthrough.allow, ["POST /v1/files"]);
    // A documented key with a bad value is still an error naming the variable.
    let err = Config::load(BASE, [("CORRAL_UPSTREAMS__3__NAME", "x")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("CORRAL_UPSTREAMS__3__NAME"), "{err}");
}

#[test]
fn passthrough_rules_are_checked_at_load() {
    let err = Config::load(
        &format!("{BASE}passthrough:\n  deny: ['/v1/ok', 'GET files']\n"),
        [],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("passthrough.deny[1]"), "{err}");
}

#[test]
fn secrets_do_not_print() {
    let secret = Secret::new("sk-live-123".to_owned());
    assert!(!format!("{secret:?}").contains("sk-live"));
}

/// Walks the settings derived from the configuration's types: every path
/// down to a value is applied from a `CORRAL_*` variable to a tree that has
/// only the lists and sections on its way, and lands there (none ignored).
#[test]
fn every_setting_of_the_typed_schema_can_be_set_from_the_environment() {
    use super::env::{Setting, apply_env_overrides};

    let settings = Setting::of_config();
    let paths = settings.paths();
    assert!(paths.len() > 100, "{} settings", paths.len());
    let dotted: Vec<String> = paths.iter().map(|path| path.join(".")).collect();
    for key in [
        "listen",
        "upstreams.0.rate.rps",
        "pricing.models.key.cache_write",
        "limits.per_tenant.tokens_per_minute",
        "budgets.0.usd",
        "redis.encryption_key_env",
        "telemetry.otlp.sample_ratio",
        "auth.key_labels.key",
        "passthrough.allow.0",
    ] {
        assert!(
            dotted.iter().any(|path| path == key),
            "{key} is not a setting"
        );
    }
    for path in &paths {
        // The sections on the way (lists as maps keyed `0`, made lists below).
        let mut tree = Value::Mapping(Mapping::new());
        let mut at = &mut tree;
        for key in path {
            if at.is_null() {
                *at = Value::Mapping(Mapping::new());
            }
            at = at
                .as_mapping_mut()
                .unwrap()
                .entry(Value::String(key.clone()))
                .or_insert(Value::Null);
        }
        // Lists stand where the schema says so.
        fix_lists(&mut tree, &settings);
        let var = format!("CORRAL_{}", path.join("__").to_ascii_uppercase());
        let ignored = apply_env_overrides(&mut tree, &BTreeMap::from([(var.as_str(), "7")]))
            .unwrap_or_else(|err| panic!("{var}: {err}"));
        assert!(ignored.is_empty(), "{var} is ignored");
        let mut landed = &tree;
        for key in path {
            landed = match landed {
                Value::Sequence(items) => &items[key.parse::<usize>().unwrap()],
                other => &other[key.as_str()],
            };
        }
        assert_eq!(landed, &Value::from(7), "{var}");
    }
    // The key the hand-written sample missed, in a whole load.
    let config = Config::load(
        &format!("{BASE}pricing:\n  models:\n    gpt-4o: {{input: 2}}\n"),
        [("CORRAL_PRICING__MODELS__GPT-4O__CACHE_WRITE", "3.75")],
    )
    .unwrap();
    assert!(config.ignored_env.is_empty(), "{:?}", config.ignored_env);
    assert_eq!(config.pricing.models.0[0].1.cache_write, Some(3.75));
}

/// Turns the mappings that stand for lists (keyed `0`) into sequences, as the
/// settings say.
fn fix_lists(tree: &mut Value, setting: &super::env::Setting) {
    use super::env::Setting;
    match setting {
        Setting::List(item) => {
            if let Some(map) = tree.as_mapping() {
                let first = map.get("0").cloned().unwrap_or(Value::Null);
                *tree = Value::Sequence(vec![first]);
            }
            if let Value::Sequence(items) = tree {
                for value in items {
                    fix_lists(value, item);
                }
            }
        }
        Setting::Section(keys) => {
            if let Some(map) = tree.as_mapping_mut() {
                for (key, value) in map.iter_mut() {
                    if let Some(child) = key.as_str().and_then(|key| keys.get(key)) {
                        fix_lists(value, child);
                    }
                }
            }
        }
        Setting::Map(child) => {
            if let Some(map) = tree.as_mapping_mut() {
                for (_, value) in map.iter_mut() {
                    fix_lists(value, child);
                }
            }
        }
        Setting::Value => {}
    }
}

#[test]
fn a_fallback_names_another_upstreams_model() {
    let config = |primary: &str, mini: &str| {
        format!(
            "listen: 127.0.0.1:0\nupstreams:\n  - {{name: gpt, base_url: 'http://127.0.0.1:1/v1', models: ['gpt-4o*'], fallback: [{primary}]}}\n  - {{name: mini, base_url: 'http://127.0.0.1:2/v1', models: ['gpt-mini'], fallback: [{mini}]}}\n  - {{name: claude, api: anthropic, base_url: 'http://127.0.0.1:3/v1', models: ['claude-*']}}\n"
        )
    };
    let loaded = Config::load(&config("gpt-mini", "gpt-4o"), []).unwrap();
    assert_eq!(loaded.upstreams[0].fallback, ["gpt-mini"]);
    let refused = |yaml: String| Config::load(&yaml, []).unwrap_err().to_string();
    let unknown = refused(config("gpt-nano", "gpt-4o"));
    assert!(
        unknown.contains("upstreams[0].fallback[0]") && unknown.contains("no upstream"),
        "{unknown}"
    );
    let itself = refused(config("gpt-4o-mini", "gpt-4o"));
    assert!(itself.contains("itself"), "{itself}");
    let pattern = refused(config("'gpt-*'", "gpt-4o"));
    assert!(pattern.contains("not a model name"), "{pattern}");
    let other_api = refused(config("claude-sonnet-4-5", "gpt-4o"));
    assert!(other_api.contains("api: openai"), "{other_api}");
}

/// A pool's members resolve against the pool (base URL, key, bounds), and an
/// invalid pool stops corral at start with one line naming the key: two
/// members of one name, a weight of 0, an unknown or foreign provider, a
/// member of a pool of several without a key.
#[test]
fn a_pool_resolves_its_members_and_an_invalid_one_names_its_key() {
    let pool = |members: &str| {
        format!(
            "listen: 127.0.0.1:8080\nupstreams:\n  - name: gpt\n    base_url: http://127.0.0.1:9/v1\n    cooldown: 2s\n    request_timeout: 30s\n    members:\n{members}"
        )
    };
    let good = pool(
        "      - {name: a, api_key_env: KEY_A, weight: 3}\n      - {name: b, api_key_env: KEY_B, base_url: \"http://127.0.0.2:9/v1\", priority: 1, quota: org, request_timeout: 5s}\n",
    );
    let config = Config::load(&good, [("KEY_A", "sk-a"), ("KEY_B", "sk-b")]).unwrap();
    let upstream = &config.upstreams[0];
    assert_eq!(upstream.cooldown, Duration::from_secs(2));
    let members = upstream.effective_members();
    assert_eq!(members.len(), 2);
    assert_eq!(
        (members[0].base_url.as_str(), members[0].weight),
        ("http://127.0.0.1:9/v1", 3),
        "the pool's base URL"
    );
    assert_eq!(
        members[0].request_timeout,
        Duration::from_secs(30),
        "the pool's bound"
    );
    assert_eq!(
        members[1].request_timeout,
        Duration::from_secs(5),
        "its own bound"
    );
    assert_eq!(members[1].quota.as_deref(), Some("org"));
    assert_eq!(members[1].api_key.as_ref().unwrap().expose(), "sk-b");
    assert_ne!(
        upstream.identity(),
        Config::load(BASE, []).unwrap().upstreams[0].identity(),
        "a pool's key is its own"
    );
    let env = [("KEY_A", "sk-a"), ("KEY_B", "sk-b")];
    for (members, key) in [
        (
            "      - {name: a, api_key_env: KEY_A}\n      - {name: a, api_key_env: KEY_B}\n",
            "upstreams[0].members[1].name",
        ),
        (
            "      - {name: a, api_key_env: KEY_A, weight: 0}\n",
            "upstreams[0].members[0].weight",
        ),
        (
            "      - {name: a, api_key_env: KEY_A, provider: anthropic}\n",
            "upstreams[0].members[0].provider",
        ),
        (
            "      - {name: a, api_key_env: KEY_A, provider: bedrock}\n",
            "upstreams[0].members[0].provider",
        ),
        (
            "      - {name: a, api_key_env: KEY_A}\n      - {name: b}\n",
            "upstreams[0].members[1].api_key_env",
        ),
    ] {
        let err = Config::load(&pool(members), env).unwrap_err().to_string();
        assert!(err.contains(key), "{members}: {err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
    }
}
