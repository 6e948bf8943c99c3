//! Configuration: YAML, then `CORRAL_*` environment overrides, then path-precise
//! deserialization errors, then `validate()`.
//!
//! The environment is passed in as a list of pairs rather than read from the
//! process, so tests never touch (or race on) the process environment.
//!
//! One file a job: the sections (`upstream.rs`, `cache.rs`, `protection.rs`,
//! `telemetry.rs`, `books.rs`, `redis.rs`), the environment overrides
//! (`env.rs`), the secrets resolved at load (`secrets.rs`) and the checks
//! types alone cannot make (`validate.rs`).

mod books;
mod cache;
mod env;
mod passthrough;
mod protection;
mod redis;
mod secrets;
mod telemetry;
mod upstream;
mod validate;

pub use crate::budget::{BudgetRule, Period};
pub use crate::pricing::ModelPrice;
pub use books::{LedgerConfig, OTHER_MODEL, PriceTable, PricingConfig};
pub use cache::{CacheConfig, CacheScope, CoalesceConfig, OnWaitTimeout, RetryConfig};
pub use passthrough::{PassRule, PassthroughConfig};
pub use protection::{
    AuthConfig, LimitsConfig, RateConfig, ServerConfig, ShutdownConfig, TenantLimitsConfig,
};
pub use redis::RedisConfig;
pub use secrets::Secret;
pub use telemetry::{
    LogConfig, LogFormat, OTEL_ENDPOINT_ENV, OtlpConfig, OtlpProtocol, TelemetryConfig,
};
pub use upstream::{
    Affinity, Api, AwsConfig, AwsCredentials, EntraConfig, Member, MemberConfig, ProviderKind,
    UpstreamConfig,
};

use std::{collections::BTreeMap, net::SocketAddr, time::Duration};

use serde::{Deserialize, Serialize};
use serde_yaml_ng::{Mapping, Value};

/// The configuration the binary falls back to when no config file exists: the
/// commented example shipped at the repository root.
pub const EMBEDDED_DEFAULT: &str = include_str!("../../config.yaml");

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config is not valid YAML: {0}")]
    Yaml(#[from] serde_yaml_ng::Error),
    #[error("config key `{path}`: {message}")]
    Key { path: String, message: String },
    #[error("environment variable {var}: {message}")]
    Env { var: String, message: String },
}

impl ConfigError {
    pub(crate) fn key(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Key {
            path: path.into(),
            message: message.into(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub listen: SocketAddr,
    pub upstreams: Vec<UpstreamConfig>,
    #[serde(default)]
    pub cache: CacheConfig,
    #[serde(default)]
    pub coalesce: CoalesceConfig,
    #[serde(default)]
    pub retry: RetryConfig,
    #[serde(default)]
    pub limits: LimitsConfig,
    #[serde(default)]
    pub log: LogConfig,
    /// USD per million tokens by model, for the cost metrics (`/metrics`, `/stats`).
    #[serde(default)]
    pub pricing: PricingConfig,
    /// The books behind `/stats`: the cluster ledger in Redis, tenant bounds.
    #[serde(default)]
    pub ledger: LedgerConfig,
    /// Absent: the embedded in-memory mode (one instance, local singleflight).
    #[serde(default)]
    pub redis: Option<RedisConfig>,
    #[serde(default)]
    pub auth: AuthConfig,
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub shutdown: ShutdownConfig,
    #[serde(default)]
    pub passthrough: PassthroughConfig,
    /// Traces (OpenTelemetry over OTLP/HTTP); off unless an endpoint is set.
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    /// Caps on what the provider bills, per tenant or per upstream, per window
    /// (`budget.rs`); cache hits and shared answers spend nothing.
    #[serde(default)]
    pub budgets: Vec<BudgetRule>,
    /// `CORRAL_*` variables that name no setting (Kubernetes' service links,
    /// say): ignored, each logged once as a warning by the binary.
    #[serde(skip)]
    pub ignored_env: Vec<String>,
}

impl Config {
    /// Parses YAML, applies `CORRAL_*` overrides from `env`, resolves provider
    /// keys from `env`, and validates.
    pub fn load<'a>(
        yaml: &str,
        env: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, ConfigError> {
        let env: BTreeMap<&str, &str> = env.into_iter().collect();
        let mut tree: Value = serde_yaml_ng::from_str(yaml)?;
        if tree.is_null() {
            tree = Value::Mapping(Mapping::new());
        }
        let ignored_env = env::apply_env_overrides(&mut tree, &env)?;
        let mut config: Config = serde_path_to_error::deserialize(tree).map_err(|err| {
            let path = err.path().to_string();
            ConfigError::key(path, err.into_inner().to_string())
        })?;
        config.ignored_env = ignored_env;
        config.resolve_keys(&env)?;
        config.resolve_protection_secrets(&env)?;
        config.telemetry.otlp.resolve(&env)?;
        config.validate()?;
        Ok(config)
    }

    /// Reads the process environment; only the binary calls this.
    pub fn load_from_process_env(yaml: &str) -> Result<Self, ConfigError> {
        let vars: Vec<(String, String)> = std::env::vars().collect();
        Self::load(yaml, vars.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }

    /// A small, fast configuration pointing at one upstream, for tests.
    pub fn for_tests(upstream_base_url: &str) -> Self {
        let mut config = Self::load(
            "listen: 127.0.0.1:0\nupstreams: [{name: mock, base_url: http://127.0.0.1:1/v1}]",
            [],
        )
        .expect("the test config is valid");
        config.upstreams[0].base_url = upstream_base_url.trim_end_matches('/').to_owned();
        config.cache.ttl_jitter = 0.0;
        config.retry.base_delay = Duration::from_millis(10);
        config.retry.max_delay = Duration::from_millis(100);
        config.retry.deadline = Duration::from_secs(20);
        config.coalesce.wait_timeout = Duration::from_secs(30);
        config.upstreams[0].request_timeout = Duration::from_secs(30);
        // Tests about other things must not trip the protections; theirs set them.
        config.upstreams[0].breaker_failures = 1_000_000;
        config.retry.budget_min_per_sec = 1_000_000.0;
        // Tests stop instances often; theirs of readiness set it.
        config.shutdown.unready_delay = Duration::ZERO;
        config
    }
}

#[cfg(test)]
mod accounts_tests;
#[cfg(test)]
mod tests;
