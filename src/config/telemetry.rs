//! `log` and `telemetry`: the access log and the OpenTelemetry trace export.

use std::{collections::BTreeMap, time::Duration};

use serde::{Deserialize, Serialize};

use super::{ConfigError, Secret};

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    pub format: LogFormat,
    /// One `info` line per finished request (request id, status, cache status,
    /// fingerprint prefix, latency). Off: only upstream calls and problems are logged.
    pub requests: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            requests: true,
        }
    }
}

/// Observability exports beyond logs and `/metrics`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    pub otlp: OtlpConfig,
}

/// OTLP trace export (`traces.rs`). No endpoint: no exporter is built.
#[derive(Debug, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct OtlpConfig {
    /// The collector's base OTLP/HTTP URL (`http://collector:4318`); corral
    /// posts to `{endpoint}/v1/traces`. Absent: `OTEL_EXPORTER_OTLP_ENDPOINT`
    /// when that is set, else traces are off.
    pub endpoint: Option<String>,
    pub protocol: OtlpProtocol,
    /// `service.name` of every span.
    pub service_name: String,
    /// Share of traces that start at corral which are recorded (0 to 1); a
    /// caller's `traceparent` sampled flag decides for its own traces.
    pub sample_ratio: f64,
    /// Variable holding extra export headers, `key=value,key2=value2`
    /// (a collector's auth token): never written in the file.
    pub headers_env: Option<String>,
    /// Bound on one export request.
    #[schemars(with = "String")]
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Spans are exported in batches at least this often.
    #[schemars(with = "String")]
    #[serde(with = "humantime_serde")]
    pub export_interval: Duration,
    /// Ended spans waiting for export; beyond it new spans are dropped, so a
    /// slow collector never slows a request.
    pub max_queue_spans: usize,
    /// Resolved at load from `headers_env`.
    #[serde(skip)]
    pub headers: Option<Secret<Vec<(String, String)>>>,
}

/// The OTLP transport. Only OTLP/HTTP with protobuf bodies is built in (a
/// collector's port 4318); gRPC would add a tonic/h2 client to every build.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
pub enum OtlpProtocol {
    #[default]
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
}

impl Default for OtlpConfig {
    fn default() -> Self {
        Self {
            endpoint: None,
            protocol: OtlpProtocol::HttpProtobuf,
            service_name: "corral".to_owned(),
            sample_ratio: 1.0,
            headers_env: None,
            timeout: Duration::from_secs(10),
            export_interval: Duration::from_secs(5),
            max_queue_spans: 2048,
            headers: None,
        }
    }
}

/// The standard OpenTelemetry variable honoured when `telemetry.otlp.endpoint` is absent.
pub const OTEL_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

impl OtlpConfig {
    /// The endpoint from `OTEL_EXPORTER_OTLP_ENDPOINT` when the file sets
    /// none, and the export headers from `headers_env`.
    pub(super) fn resolve(&mut self, env: &BTreeMap<&str, &str>) -> Result<(), ConfigError> {
        if self.endpoint.is_none()
            && let Some(endpoint) = env.get(OTEL_ENDPOINT_ENV).filter(|e| !e.trim().is_empty())
        {
            self.endpoint = Some((*endpoint).to_owned());
        }
        if let Some(var) = &self.headers_env {
            let text = env.get(var.as_str()).ok_or_else(|| ConfigError::Env {
                var: var.clone(),
                message: "not set, but telemetry.otlp.headers_env names it".into(),
            })?;
            let headers = parse_export_headers(text).map_err(|message| ConfigError::Env {
                var: var.clone(),
                message,
            })?;
            self.headers = Some(Secret::new(headers));
        }
        Ok(())
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if let Some(endpoint) = &self.endpoint {
            let url = reqwest::Url::parse(endpoint)
                .map_err(|err| ConfigError::key("telemetry.otlp.endpoint", err.to_string()))?;
            if !matches!(url.scheme(), "http" | "https") {
                return Err(ConfigError::key(
                    "telemetry.otlp.endpoint",
                    "must be an http or https URL (OTLP/HTTP, a collector's port 4318)",
                ));
            }
        }
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return Err(ConfigError::key(
                "telemetry.otlp.sample_ratio",
                "must be between 0 and 1",
            ));
        }
        if self.max_queue_spans == 0 {
            return Err(ConfigError::key(
                "telemetry.otlp.max_queue_spans",
                "must be at least 1",
            ));
        }
        if self.timeout.is_zero() || self.export_interval.is_zero() {
            return Err(ConfigError::key(
                "telemetry.otlp",
                "timeout and export_interval must be above 0",
            ));
        }
        Ok(())
    }
}

/// `key=value,key2=value2` (the `OTEL_EXPORTER_OTLP_HEADERS` format; values
/// may be percent-encoded), each a valid header. Errors never quote a value.
fn parse_export_headers(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut headers = Vec::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, value) = pair
            .split_once('=')
            .ok_or("wants key=value pairs separated by commas")?;
        let name = name.trim();
        let value = percent_encoding::percent_decode_str(value.trim())
            .decode_utf8()
            .map_err(|_| format!("the value of `{name}` is not UTF-8 once decoded"))?;
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(format!("`{name}` is not a header name"));
        }
        if http::HeaderValue::from_str(&value).is_err() {
            return Err(format!("the value of `{name}` is not a valid header value"));
        }
        headers.push((name.to_owned(), value.into_owned()));
    }
    Ok(headers)
}
