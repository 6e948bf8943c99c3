//! `CORRAL_*` environment overrides: `CORRAL_A__B__0__C=value` sets `a.b[0].c`,
//! for the keys the configuration has; any other variable is left alone.

use std::{collections::BTreeMap, sync::LazyLock};

use serde_yaml_ng::{Mapping, Value};

use super::{Config, ConfigError};

/// Prefix of every environment override.
const ENV_PREFIX: &str = "CORRAL_";

/// Short aliases for the settings people change most, mapped onto config paths.
const ENV_ALIASES: &[(&str, &str)] = &[
    ("CORRAL_UPSTREAM_BASE_URL", "upstreams.0.base_url"),
    ("CORRAL_UPSTREAM_API_KEY_ENV", "upstreams.0.api_key_env"),
    ("CORRAL_REDIS_URL", "redis.url"),
];

/// Holds the provider key given directly in the environment (instead of naming
/// another variable through `api_key_env`).
pub(super) const ENV_UPSTREAM_API_KEY: &str = "CORRAL_UPSTREAM_API_KEY";

/// Applies `CORRAL_A__B__0__C=value` as `a.b[0].c = value` (value read as a YAML
/// scalar, so numbers and booleans keep their type), plus the short aliases.
/// Only variables that name a setting apply: the others (Kubernetes injects
/// `CORRAL_PORT=tcp://...` and `CORRAL_SERVICE_HOST` beside a Service named
/// `corral`) are returned, to be ignored with a warning.
pub(super) fn apply_env_overrides(
    tree: &mut Value,
    env: &BTreeMap<&str, &str>,
) -> Result<Vec<String>, ConfigError> {
    let settings = &*SETTINGS;
    let mut ignored = Vec::new();
    for (var, value) in env {
        let path = match ENV_ALIASES.iter().find(|(alias, _)| alias == var) {
            Some((_, path)) => path.split('.').map(str::to_owned).collect::<Vec<_>>(),
            None => {
                let Some(rest) = var.strip_prefix(ENV_PREFIX) else {
                    continue;
                };
                if *var == ENV_UPSTREAM_API_KEY {
                    continue;
                }
                let path: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
                if !settings.has(&path) {
                    ignored.push((*var).to_owned());
                    continue;
                }
                path
            }
        };
        let parsed: Value =
            serde_yaml_ng::from_str(value).unwrap_or(Value::String((*value).into()));
        set_path(tree, &path, parsed).map_err(|message| ConfigError::Env {
            var: (*var).to_owned(),
            message,
        })?;
    }
    Ok(ignored)
}

/// The settings of [`Config`], derived once a process.
static SETTINGS: LazyLock<Setting> = LazyLock::new(Setting::of_config);

/// Every setting's path, as a tree derived from the configuration's own types
/// (their JSON schema, `schemars`): a new field is settable from the
/// environment the moment it exists, with no list to keep.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Setting {
    /// A value: a number, a string, a list or map given whole.
    Value,
    /// A section: its keys.
    Section(BTreeMap<String, Setting>),
    /// A list: any index (`UPSTREAMS__0__...`).
    List(Box<Setting>),
    /// A map: any key (`PRICING__MODELS__GPT-4O__...`).
    Map(Box<Setting>),
}

impl Setting {
    /// The settings of [`Config`].
    pub(super) fn of_config() -> Self {
        let schema = schemars::schema_for!(Config);
        let schema = schema.as_value();
        let defs = schema
            .get("$defs")
            .and_then(serde_json::Value::as_object)
            .cloned()
            .unwrap_or_default();
        Self::of(schema, &defs)
    }

    fn of(schema: &serde_json::Value, defs: &serde_json::Map<String, serde_json::Value>) -> Self {
        use serde_json::Value as Json;
        if let Some(name) = schema
            .get("$ref")
            .and_then(Json::as_str)
            .and_then(|reference| reference.strip_prefix("#/$defs/"))
        {
            return defs
                .get(name)
                .map_or(Self::Value, |def| Self::of(def, defs));
        }
        // `Option<Section>` is "that, or null": the alternative with keys.
        for alternatives in ["anyOf", "oneOf", "allOf"] {
            if let Some(options) = schema.get(alternatives).and_then(Json::as_array) {
                return options
                    .iter()
                    .map(|option| Self::of(option, defs))
                    .find(|setting| *setting != Self::Value)
                    .unwrap_or(Self::Value);
            }
        }
        if let Some(properties) = schema.get("properties").and_then(Json::as_object) {
            return Self::Section(
                properties
                    .iter()
                    .map(|(key, value)| (key.clone(), Self::of(value, defs)))
                    .collect(),
            );
        }
        if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
            return Self::Map(Box::new(Self::of(values, defs)));
        }
        if let Some(items) = schema.get("items").filter(|v| v.is_object()) {
            return Self::List(Box::new(Self::of(items, defs)));
        }
        Self::Value
    }

    /// Whether `path` (lower-case keys, list indices as numbers) names a setting.
    pub(super) fn has(&self, path: &[String]) -> bool {
        let Some((head, rest)) = path.split_first() else {
            return true;
        };
        match self {
            Self::Section(keys) => keys.get(head).is_some_and(|child| child.has(rest)),
            Self::List(item) => head.parse::<usize>().is_ok() && item.has(rest),
            Self::Map(value) => value.has(rest),
            Self::Value => false,
        }
    }

    /// Every path down to a value (a list's index `0`, a map's key `key`).
    #[cfg(test)]
    pub(super) fn paths(&self) -> Vec<Vec<String>> {
        let below = |key: &str, child: &Self| {
            let mut paths = child.paths();
            for path in &mut paths {
                path.insert(0, key.to_owned());
            }
            paths
        };
        match self {
            Self::Value => vec![Vec::new()],
            Self::Section(keys) => keys
                .iter()
                .flat_map(|(key, child)| below(key, child))
                .collect(),
            Self::List(item) => below("0", item),
            Self::Map(value) => below("key", value),
        }
    }
}

fn set_path(tree: &mut Value, path: &[String], value: Value) -> Result<(), String> {
    let Some((head, rest)) = path.split_first() else {
        *tree = value;
        return Ok(());
    };
    match tree {
        Value::Sequence(items) => {
            let index: usize = head
                .parse()
                .map_err(|_| format!("`{head}` must be a list index"))?;
            let item = items
                .get_mut(index)
                .ok_or_else(|| format!("list index {index} does not exist"))?;
            set_path(item, rest, value)
        }
        Value::Mapping(map) => {
            let key = Value::String(head.clone());
            let child = map.entry(key).or_insert(Value::Null);
            if child.is_null() && !rest.is_empty() {
                *child = Value::Mapping(Mapping::new());
            }
            set_path(child, rest, value)
        }
        Value::Null => {
            *tree = Value::Mapping(Mapping::new());
            set_path(tree, path, value)
        }
        _ => Err(format!(
            "`{head}` is under a value that is not a map or list"
        )),
    }
}
