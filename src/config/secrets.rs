//! Secrets: never printed, resolved from the environment at load (provider
//! keys, gateway and admin keys, the tenant secret, the Redis encryption key).

use std::{collections::BTreeMap, fmt};

use super::{Config, ConfigError, env::ENV_UPSTREAM_API_KEY};

/// A value that must never be printed: `Debug` and `Display` redact it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret<T>(T);

impl<T> Secret<T> {
    pub fn new(value: T) -> Self {
        Self(value)
    }
    /// The only way to read the secret; grep for it when auditing.
    pub fn expose(&self) -> &T {
        &self.0
    }
}

impl<T> fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

impl Config {
    /// Gateway keys, the tenant secret and the Redis encryption key, from `env`.
    pub(super) fn resolve_protection_secrets(
        &mut self,
        env: &BTreeMap<&str, &str>,
    ) -> Result<(), ConfigError> {
        let required = |var: &str, key: &str| {
            env.get(var).copied().ok_or_else(|| ConfigError::Env {
                var: var.to_owned(),
                message: format!("not set, but {key} names it"),
            })
        };
        let auth = &mut self.auth;
        auth.key_hashes.clear();
        for (i, hash) in auth.keys.iter().enumerate() {
            let mut bytes = [0u8; 32];
            hex::decode_to_slice(hash.trim(), &mut bytes).map_err(|_| {
                ConfigError::key(
                    format!("auth.keys[{i}]"),
                    "must be the SHA-256 of a key, 64 hex digits (printf %s KEY | sha256sum)",
                )
            })?;
            auth.key_hashes.push(bytes);
        }
        auth.labels_by_hash.clear();
        for (label, hash) in &auth.key_labels {
            let mut bytes = [0u8; 32];
            hex::decode_to_slice(hash.trim(), &mut bytes).map_err(|_| {
                ConfigError::key(
                    format!("auth.key_labels.{label}"),
                    "must be the SHA-256 of a key, 64 hex digits (printf %s KEY | sha256sum)",
                )
            })?;
            if label.is_empty()
                || label.len() > 64
                || label == crate::ledger::OTHER
                || label == crate::ledger::GATEWAY
            {
                return Err(ConfigError::key(
                    format!("auth.key_labels.{label}"),
                    "a label must be 1 to 64 characters and not `other` or `gateway`",
                ));
            }
            auth.labels_by_hash.push((bytes, label.clone()));
        }
        if let Some(var) = &auth.keys_env {
            let keys = required(var, "auth.keys_env")?;
            for key in keys.split(',').map(str::trim).filter(|k| !k.is_empty()) {
                auth.key_hashes
                    .push(crate::tenant::key_hash(key.as_bytes()));
            }
            if auth.key_hashes.is_empty() {
                return Err(ConfigError::Env {
                    var: var.clone(),
                    message: "holds no key (auth.keys_env wants comma-separated keys)".into(),
                });
            }
        }
        auth.admin_key_hashes.clear();
        for (i, hash) in auth.admin_keys.iter().enumerate() {
            let mut bytes = [0u8; 32];
            hex::decode_to_slice(hash.trim(), &mut bytes).map_err(|_| {
                ConfigError::key(
                    format!("auth.admin_keys[{i}]"),
                    "must be the SHA-256 of a key, 64 hex digits (printf %s KEY | sha256sum)",
                )
            })?;
            auth.admin_key_hashes.push(bytes);
        }
        if let Some(var) = &auth.admin_keys_env {
            let keys = required(var, "auth.admin_keys_env")?;
            for key in keys.split(',').map(str::trim).filter(|k| !k.is_empty()) {
                auth.admin_key_hashes
                    .push(crate::tenant::key_hash(key.as_bytes()));
            }
            if auth.admin_key_hashes.is_empty() {
                return Err(ConfigError::Env {
                    var: var.clone(),
                    message: "holds no key (auth.admin_keys_env wants comma-separated keys)".into(),
                });
            }
        }
        // A gateway key reaches callers' code; an admin key must not be one.
        if auth
            .admin_key_hashes
            .iter()
            .any(|admin| auth.key_hashes.contains(admin))
        {
            return Err(ConfigError::key(
                "auth.admin_keys",
                "an admin key is also a gateway key (auth.keys or auth.keys_env); use a key of its own",
            ));
        }
        if let Some(var) = &auth.tenant_secret_env {
            let secret = required(var, "auth.tenant_secret_env")?;
            if secret.len() < 16 {
                return Err(ConfigError::Env {
                    var: var.clone(),
                    message: "the tenant secret must be at least 16 bytes".into(),
                });
            }
            auth.tenant_secret = Some(Secret::new(secret.as_bytes().to_vec()));
        }
        if let Some(redis) = &mut self.redis
            && let Some(var) = &redis.encryption_key_env
        {
            let text = required(var, "redis.encryption_key_env")?;
            let key =
                crate::crypto::Sealer::parse_key(text).map_err(|message| ConfigError::Env {
                    var: var.clone(),
                    message,
                })?;
            redis.encryption_key = Some(Secret::new(key));
        }
        Ok(())
    }

    pub(super) fn resolve_keys(&mut self, env: &BTreeMap<&str, &str>) -> Result<(), ConfigError> {
        for (index, upstream) in self.upstreams.iter_mut().enumerate() {
            if let Some(var) = &upstream.api_key_env {
                let value = env.get(var.as_str()).ok_or_else(|| ConfigError::Env {
                    var: var.clone(),
                    message: format!(
                        "not set, but upstreams[{index}].api_key_env names it ({})",
                        upstream.name
                    ),
                })?;
                upstream.api_key = Some(Secret::new((*value).to_owned()));
            }
            if let Some(entra) = &mut upstream.entra {
                resolve_entra(entra, env, &format!("upstreams[{index}].entra"))?;
            }
            if let Some(aws) = &mut upstream.aws {
                resolve_aws(aws, env, &format!("upstreams[{index}].aws"))?;
            }
            upstream.service_account = service_account(
                upstream.credentials_file.as_deref(),
                upstream.credentials_env.as_deref(),
                env,
                &format!("upstreams[{index}]"),
            )?;
            for (m, member) in upstream.members.iter_mut().enumerate() {
                if let Some(entra) = &mut member.entra {
                    resolve_entra(
                        entra,
                        env,
                        &format!("upstreams[{index}].members[{m}].entra"),
                    )?;
                }
                if let Some(aws) = &mut member.aws {
                    resolve_aws(aws, env, &format!("upstreams[{index}].members[{m}].aws"))?;
                }
                member.service_account = service_account(
                    member.credentials_file.as_deref(),
                    member.credentials_env.as_deref(),
                    env,
                    &format!("upstreams[{index}].members[{m}]"),
                )?;
                if let Some(var) = &member.api_key_env {
                    let value = env.get(var.as_str()).ok_or_else(|| ConfigError::Env {
                        var: var.clone(),
                        message: format!(
                            "not set, but upstreams[{index}].members[{m}].api_key_env names it ({}/{})",
                            upstream.name, member.name
                        ),
                    })?;
                    member.api_key = Some(Secret::new((*value).to_owned()));
                }
            }
        }
        if let (Some(key), Some(first)) =
            (env.get(ENV_UPSTREAM_API_KEY), self.upstreams.first_mut())
        {
            first.api_key = Some(Secret::new((*key).to_owned()));
        }
        Ok(())
    }
}

/// An Entra application's client secret, from the variable it names.
fn resolve_entra(
    entra: &mut super::EntraConfig,
    env: &BTreeMap<&str, &str>,
    at: &str,
) -> Result<(), ConfigError> {
    let var = &entra.client_secret_env;
    let value = env.get(var.as_str()).ok_or_else(|| ConfigError::Env {
        var: var.clone(),
        message: format!("not set, but {at}.client_secret_env names it"),
    })?;
    entra.client_secret = Some(Secret::new((*value).to_owned()));
    Ok(())
}

/// AWS credentials, from the variables they name.
fn resolve_aws(
    aws: &mut super::AwsConfig,
    env: &BTreeMap<&str, &str>,
    at: &str,
) -> Result<(), ConfigError> {
    let read = |var: &String, field: &str| {
        env.get(var.as_str())
            .map(|value| Secret::new((*value).to_owned()))
            .ok_or_else(|| ConfigError::Env {
                var: var.clone(),
                message: format!("not set, but {at}.{field} names it"),
            })
    };
    aws.credentials = Some(super::AwsCredentials {
        access_key_id: read(&aws.access_key_id_env, "access_key_id_env")?,
        secret_access_key: read(&aws.secret_access_key_env, "secret_access_key_env")?,
        session_token: aws
            .session_token_env
            .as_ref()
            .map(|var| read(var, "session_token_env"))
            .transpose()?,
    });
    Ok(())
}

/// A Vertex AI service account's JSON key: the file `credentials_file`
/// names, or the variable `credentials_env` names (not both).
fn service_account(
    file: Option<&std::path::Path>,
    var: Option<&str>,
    env: &BTreeMap<&str, &str>,
    at: &str,
) -> Result<Option<Secret<String>>, ConfigError> {
    match (file, var) {
        (None, None) => Ok(None),
        (Some(_), Some(_)) => Err(ConfigError::key(
            format!("{at}.credentials_env"),
            "credentials_file and credentials_env are two keys for one account: keep one",
        )),
        (Some(path), None) => std::fs::read_to_string(path)
            .map(|json| Some(Secret::new(json)))
            .map_err(|err| {
                ConfigError::key(
                    format!("{at}.credentials_file"),
                    format!("cannot read {}: {err}", path.display()),
                )
            }),
        (None, Some(var)) => env
            .get(var)
            .map(|json| Some(Secret::new((*json).to_owned())))
            .ok_or_else(|| ConfigError::Env {
                var: var.to_owned(),
                message: format!("not set, but {at}.credentials_env names it"),
            }),
    }
}
