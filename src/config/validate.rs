//! What types alone cannot check; every message names its key.

use std::time::Duration;

use super::{Api, CacheScope, Config, ConfigError, ModelPrice, OTHER_MODEL, RateConfig};

impl Config {
    /// The protection settings' checks, each naming its key.
    fn validate_protection(&self) -> Result<(), ConfigError> {
        let rate = |rate: &RateConfig, key: &str| {
            if rate.rps == 0 || rate.burst == 0 {
                return Err(ConfigError::key(key, "rps and burst must be at least 1"));
            }
            Ok(())
        };
        if let Some(per_tenant) = &self.limits.per_tenant {
            if per_tenant.rps.is_none() && per_tenant.burst.is_some() {
                return Err(ConfigError::key(
                    "limits.per_tenant",
                    "burst needs rps (the rate it refills at)",
                ));
            }
            if let Some(per_tenant_rate) = per_tenant.rate() {
                rate(&per_tenant_rate, "limits.per_tenant")?;
            }
            if per_tenant.max_concurrent == Some(0) {
                return Err(ConfigError::key(
                    "limits.per_tenant.max_concurrent",
                    "must be at least 1",
                ));
            }
            if per_tenant.tokens_per_minute == Some(0) {
                return Err(ConfigError::key(
                    "limits.per_tenant.tokens_per_minute",
                    "must be at least 1",
                ));
            }
            if per_tenant.rps.is_none()
                && per_tenant.max_concurrent.is_none()
                && per_tenant.tokens_per_minute.is_none()
            {
                return Err(ConfigError::key(
                    "limits.per_tenant",
                    "set rps (with burst), max_concurrent, tokens_per_minute, or any of them together",
                ));
            }
        }
        for (i, rule) in self.budgets.iter().enumerate() {
            let key = format!("budgets[{i}]");
            match (&rule.tenant, &rule.upstream) {
                (Some(tenant), None) if !tenant.is_empty() => {}
                (None, Some(upstream)) => {
                    if !self.upstreams.iter().any(|known| &known.name == upstream) {
                        return Err(ConfigError::key(
                            format!("{key}.upstream"),
                            format!("no upstream is named `{upstream}`"),
                        ));
                    }
                }
                _ => {
                    return Err(ConfigError::key(
                        key,
                        "set exactly one of tenant (a key label, a short scope or \"*\") and upstream",
                    ));
                }
            }
            if rule.limit_nanos().is_none() {
                return Err(ConfigError::key(
                    format!("{key}.usd"),
                    "must be a sum of USD >= 0",
                ));
            }
        }
        if self.limits.max_concurrent_requests == Some(0) {
            return Err(ConfigError::key(
                "limits.max_concurrent_requests",
                "must be at least 1",
            ));
        }
        if self.limits.max_json_depth < 2 || self.limits.max_json_depth > 128 {
            return Err(ConfigError::key(
                "limits.max_json_depth",
                "must be between 2 and 128",
            ));
        }
        if self.limits.max_messages == 0 {
            return Err(ConfigError::key(
                "limits.max_messages",
                "must be at least 1",
            ));
        }
        if self.limits.max_embedding_inputs == 0 || self.limits.max_embedding_input_bytes == 0 {
            return Err(ConfigError::key(
                "limits.max_embedding_inputs",
                "max_embedding_inputs and max_embedding_input_bytes must be at least 1",
            ));
        }
        for (i, upstream) in self.upstreams.iter().enumerate() {
            for (m, member) in upstream.effective_members().iter().enumerate() {
                // A pool of one is the upstream itself: its keys are the upstream's.
                let at = |field: &str| {
                    if upstream.members.is_empty() {
                        format!("upstreams[{i}].{field}")
                    } else {
                        format!("upstreams[{i}].members[{m}].{field}")
                    }
                };
                if let Some(member_rate) = &member.rate {
                    rate(member_rate, &at("rate"))?;
                }
                account(upstream, member, &at)?;
                if member.max_concurrency == Some(0) {
                    return Err(ConfigError::key(
                        at("max_concurrency"),
                        "must be at least 1",
                    ));
                }
                if member.breaker_failures == 0 {
                    return Err(ConfigError::key(
                        at("breaker_failures"),
                        "must be at least 1",
                    ));
                }
                if member.first_byte_timeout.is_zero() || member.request_timeout.is_zero() {
                    return Err(ConfigError::key(
                        at("first_byte_timeout"),
                        "first_byte_timeout and request_timeout must be above zero",
                    ));
                }
                // With gateway keys, the caller's Authorization is a gateway key:
                // forwarding it would hand it to the provider.
                if !self.auth.key_hashes.is_empty() && !member.has_own_credential() {
                    return Err(ConfigError::key(
                        at("api_key_env"),
                        "is required when auth.keys or auth.keys_env is set (the caller's key is a gateway key, not a provider key)",
                    ));
                }
            }
        }
        if !(self.retry.budget_ratio.is_finite() && self.retry.budget_ratio >= 0.0) {
            return Err(ConfigError::key(
                "retry.budget_ratio",
                "must be a number >= 0",
            ));
        }
        if !(self.retry.budget_min_per_sec.is_finite() && self.retry.budget_min_per_sec >= 0.0) {
            return Err(ConfigError::key(
                "retry.budget_min_per_sec",
                "must be a number >= 0",
            ));
        }
        if self.server.write_timeout.is_zero() {
            return Err(ConfigError::key(
                "server.write_timeout",
                "must be above zero",
            ));
        }
        if self.server.header_read_timeout.is_zero() || self.server.body_read_timeout.is_zero() {
            return Err(ConfigError::key(
                "server.header_read_timeout",
                "header_read_timeout and body_read_timeout must be above zero",
            ));
        }
        if self.shutdown.drain_timeout.is_zero() {
            return Err(ConfigError::key(
                "shutdown.drain_timeout",
                "must be above zero",
            ));
        }
        Ok(())
    }

    /// Refuses the set-ups that would expose one caller's spending or
    /// answers to others: an open relay, a cache shared by unauthenticated
    /// callers who each pay with their own key; and checks the pass-through rules.
    fn validate_exposure(&self) -> Result<(), ConfigError> {
        let gateway_keys = !self.auth.key_hashes.is_empty();
        if let Some(i) = self.upstreams.iter().position(|u| {
            u.effective_members()
                .iter()
                .any(|member| member.api_key.is_some())
        }) && !gateway_keys
            && !self.listen.ip().is_loopback()
            && !self.auth.allow_anonymous
        {
            return Err(ConfigError::key(
                "auth.allow_anonymous",
                format!(
                    "refusing to start an open relay: corral listens on {} and sends its own provider key (upstreams[{i}]) for anyone who reaches it, and no gateway key is set. Set auth.keys or auth.keys_env, listen on a loopback address, or set auth.allow_anonymous: true if that is intended",
                    self.listen
                ),
            ));
        }
        if self.cache.scope == CacheScope::Global
            && !gateway_keys
            && let Some(i) = self.upstreams.iter().position(|u| !u.has_own_keys())
        {
            return Err(ConfigError::key(
                "cache.scope",
                format!(
                    "`global` is refused while callers bring their own provider keys (upstreams[{i}] has no api_key_env) and no gateway key authenticates them: an answer paid by one key would be served to any key or none, and one bad key's error to everyone. Use `tenant`, or set api_key_env and gateway keys (auth.keys)"
                ),
            ));
        }
        Ok(())
    }

    /// A pool's members: each named once, weighted above zero, at the
    /// pool's provider, and, when there are several, each with a key of its
    /// own (a caller's credential belongs to one account: it is never spread
    /// over a pool's).
    fn validate_pool(&self, i: usize, upstream: &super::UpstreamConfig) -> Result<(), ConfigError> {
        let resolved = upstream.effective_members();
        for (m, member) in upstream.members.iter().enumerate() {
            let at = |field: &str| format!("upstreams[{i}].members[{m}].{field}");
            if member.name.is_empty() {
                return Err(ConfigError::key(at("name"), "a member needs a name"));
            }
            if let Some(first) = upstream.members[..m]
                .iter()
                .position(|earlier| earlier.name == member.name)
            {
                return Err(ConfigError::key(
                    at("name"),
                    format!(
                        "`{}` names members[{first}] of `{}` too; every member needs a name of its own",
                        member.name, upstream.name
                    ),
                ));
            }
            if member.weight == 0 {
                return Err(ConfigError::key(
                    at("weight"),
                    "must be at least 1 (leave a member out to send it nothing)",
                ));
            }
            if let Some(provider) = member.provider
                && !provider.speaks(upstream.api)
            {
                return Err(ConfigError::key(
                    at("provider"),
                    format!(
                        "`{}` does not speak this pool's API (`{}`): a member speaks its pool's wire format",
                        provider.as_str(),
                        upstream.api.as_str()
                    ),
                ));
            }
            if upstream.members.len() > 1 && !resolved[m].has_own_credential() {
                return Err(ConfigError::key(
                    at("api_key_env"),
                    "every member of a pool of several needs a key (its own, or the pool's): a caller's key belongs to one account, never to a pool's",
                ));
            }
        }
        Ok(())
    }

    /// Each `upstreams[].fallback` names a model (not a pattern) that
    /// another upstream of the same API serves, as a request naming it is
    /// routed: never the upstream itself (a cycle of one; fallbacks are not
    /// chained, so two pools may each be the other's). Gemini's requests name
    /// their model in the path, so a Gemini upstream has none.
    fn validate_fallbacks(&self) -> Result<(), ConfigError> {
        for (i, upstream) in self.upstreams.iter().enumerate() {
            if upstream.api == super::Api::Gemini && !upstream.fallback.is_empty() {
                return Err(ConfigError::key(
                    format!("upstreams[{i}].fallback"),
                    "is not supported for `api: gemini` (its requests name their model in the path)",
                ));
            }
            for (f, model) in upstream.fallback.iter().enumerate() {
                let at = format!("upstreams[{i}].fallback[{f}]");
                if model.is_empty() || model.contains(['*', '?', '[']) {
                    return Err(ConfigError::key(
                        at,
                        format!(
                            "`{model}` is not a model name: name the model that answers instead"
                        ),
                    ));
                }
                // As `upstream::Routes` routes a request naming it.
                let routed = self.upstreams.iter().position(|other| {
                    other.api == upstream.api
                        && other.models.iter().any(|pattern| {
                            glob::Pattern::new(pattern).is_ok_and(|p| p.matches(model))
                        })
                });
                match routed {
                    None => {
                        return Err(ConfigError::key(
                            at,
                            format!(
                                "no upstream with `api: {}` serves `{model}` (no `models` pattern matches it)",
                                upstream.api.as_str()
                            ),
                        ));
                    }
                    Some(to) if to == i => {
                        return Err(ConfigError::key(
                            at,
                            format!(
                                "`{model}` is routed to `{}` itself: a fallback must be another upstream's model",
                                upstream.name
                            ),
                        ));
                    }
                    Some(_) => {}
                }
            }
        }
        Ok(())
    }

    /// Checks what types alone cannot; every message names its key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_protection()?;
        self.validate_exposure()?;
        self.telemetry.otlp.validate()?;
        if self.upstreams.is_empty() {
            return Err(ConfigError::key(
                "upstreams",
                "at least one upstream is required",
            ));
        }
        for (i, upstream) in self.upstreams.iter().enumerate() {
            // Metrics, logs and `/stats` name an upstream by its name: two of one
            // name would be one row for two providers.
            if let Some(first) = self.upstreams[..i]
                .iter()
                .position(|earlier| earlier.name == upstream.name)
            {
                return Err(ConfigError::key(
                    format!("upstreams[{i}].name"),
                    format!(
                        "`{}` names upstreams[{first}] too; every upstream needs a name of its own",
                        upstream.name
                    ),
                ));
            }
            self.validate_pool(i, upstream)?;
            for (m, member) in upstream.effective_members().iter().enumerate() {
                let key = if upstream.members.is_empty() {
                    format!("upstreams[{i}].base_url")
                } else {
                    format!("upstreams[{i}].members[{m}].base_url")
                };
                check_base_url(&key, member.api, member.provider, &member.base_url)?;
            }
            if upstream.models.is_empty() {
                return Err(ConfigError::key(
                    format!("upstreams[{i}].models"),
                    "needs at least one pattern (\"*\" matches every model)",
                ));
            }
            for (j, pattern) in upstream.models.iter().enumerate() {
                glob::Pattern::new(pattern).map_err(|err| {
                    ConfigError::key(format!("upstreams[{i}].models[{j}]"), err.to_string())
                })?;
            }
        }
        self.validate_fallbacks()?;
        let cache = &self.cache;
        if cache.soft_ttl.is_zero() || cache.soft_ttl > cache.hard_ttl {
            return Err(ConfigError::key(
                "cache.soft_ttl",
                "must be above zero and at most cache.hard_ttl",
            ));
        }
        if !(0.0..1.0).contains(&cache.ttl_jitter) {
            return Err(ConfigError::key("cache.ttl_jitter", "must be in [0, 1)"));
        }
        if cache.max_bytes == 0 || cache.max_entry_bytes == 0 {
            return Err(ConfigError::key("cache.max_bytes", "must be above zero"));
        }
        if cache.max_entry_bytes > cache.max_bytes || cache.max_entry_bytes > u64::from(u32::MAX) {
            return Err(ConfigError::key(
                "cache.max_entry_bytes",
                "must be at most cache.max_bytes (and below 4 GiB)",
            ));
        }
        if !(cache.early_refresh_beta.is_finite() && cache.early_refresh_beta >= 0.0) {
            return Err(ConfigError::key(
                "cache.early_refresh_beta",
                "must be a number >= 0 (0 disables early refresh)",
            ));
        }
        if let Some(redis) = &self.redis {
            let urls = redis.node_urls();
            if urls.is_empty() {
                return Err(ConfigError::key(
                    "redis.url",
                    "set redis.url or redis.nodes",
                ));
            }
            for url in &urls {
                ::redis::parse_redis_url(url).ok_or_else(|| {
                    ConfigError::key("redis.url", format!("`{url}` is not a redis:// URL"))
                })?;
            }
            if redis.op_timeout.is_zero() {
                return Err(ConfigError::key("redis.op_timeout", "must be above zero"));
            }
            if redis.lock_ttl < Duration::from_millis(300) {
                return Err(ConfigError::key("redis.lock_ttl", "must be at least 300ms"));
            }
            if redis.poll_interval.is_zero() {
                return Err(ConfigError::key(
                    "redis.poll_interval",
                    "must be above zero",
                ));
            }
            if redis.breaker_failures == 0 {
                return Err(ConfigError::key(
                    "redis.breaker_failures",
                    "must be at least 1",
                ));
            }
        }
        for (name, price) in &self.pricing.models.0 {
            let key = format!("pricing.models.{name}");
            if name.is_empty() || name.eq_ignore_ascii_case(OTHER_MODEL) {
                return Err(ConfigError::key(
                    key,
                    format!("a model name must be non-empty and not `{OTHER_MODEL}`"),
                ));
            }
            glob::Pattern::new(name).map_err(|err| ConfigError::key(&key, err.to_string()))?;
            check_price(&key, price)?;
        }
        if let Some(price) = &self.pricing.unpriced {
            check_price("pricing.unpriced", price)?;
        }
        if self.ledger.flush_interval.is_zero() || self.ledger.retention < Duration::from_secs(60) {
            return Err(ConfigError::key(
                "ledger.flush_interval",
                "flush_interval must be above zero and retention at least 1m",
            ));
        }
        if self.ledger.max_tenants == 0 || self.ledger.top_tenants == 0 {
            return Err(ConfigError::key(
                "ledger.max_tenants",
                "max_tenants and top_tenants must be at least 1",
            ));
        }
        if self.retry.max_attempts == 0 {
            return Err(ConfigError::key("retry.max_attempts", "must be at least 1"));
        }
        if !self.retry.dedup_window.is_zero() && self.retry.dedup_max_bytes == 0 {
            return Err(ConfigError::key(
                "retry.dedup_max_bytes",
                "must be at least 1 while retry.dedup_window is on (set the window to 0 to turn it off)",
            ));
        }
        if self.retry.base_delay > self.retry.max_delay {
            return Err(ConfigError::key(
                "retry.base_delay",
                "must be at most retry.max_delay",
            ));
        }
        if self.coalesce.max_waiters == 0 {
            return Err(ConfigError::key(
                "coalesce.max_waiters",
                "must be at least 1",
            ));
        }
        if self.coalesce.max_total_waiters < self.coalesce.max_waiters {
            return Err(ConfigError::key(
                "coalesce.max_total_waiters",
                "must be at least coalesce.max_waiters",
            ));
        }
        if self.coalesce.wait_timeout.is_zero() {
            return Err(ConfigError::key(
                "coalesce.wait_timeout",
                "must be above zero",
            ));
        }
        Ok(())
    }
}

/// Every rate of a price is a number of USD per million tokens that integer
/// picodollars can hold.
fn check_price(key: &str, price: &ModelPrice) -> Result<(), ConfigError> {
    let fields = [
        ("input", Some(price.input)),
        ("output", Some(price.output)),
        ("cached_input", price.cached_input),
        ("cache_write", price.cache_write),
    ];
    for (field, value) in fields {
        if let Some(value) = value
            && crate::pricing::picos_per_token(value).is_none()
        {
            return Err(ConfigError::key(
                format!("{key}.{field}"),
                "must be a number >= 0 with at most 6 decimals (USD per million tokens)",
            ));
        }
    }
    Ok(())
}

/// What an account's provider asks of it: one credential, and the settings
/// only its provider reads left out elsewhere.
fn account(
    upstream: &super::UpstreamConfig,
    member: &super::Member,
    at: &dyn Fn(&str) -> String,
) -> Result<(), ConfigError> {
    use super::ProviderKind;
    if !member.provider.speaks(member.api) {
        return Err(ConfigError::key(
            at("provider"),
            format!(
                "`{}` does not speak this pool's API (`{}`): a member speaks its pool's wire format",
                member.provider.as_str(),
                member.api.as_str()
            ),
        ));
    }
    // The account's own settings: its member's, or the upstream's for a pool of one.
    let (own_entra, own_key) = match upstream
        .members
        .iter()
        .find(|config| config.name == member.name)
    {
        Some(config) => (config.entra.is_some(), config.api_key_env.is_some()),
        None => (upstream.entra.is_some(), upstream.api_key_env.is_some()),
    };
    if (own_entra && own_key) || (upstream.entra.is_some() && upstream.api_key_env.is_some()) {
        return Err(ConfigError::key(
            at("entra"),
            "api_key_env and entra are two credentials for one account: keep one",
        ));
    }
    match member.provider {
        ProviderKind::Bedrock => {
            let region = member.region.as_deref().unwrap_or_default();
            if region.is_empty()
                || !region
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            {
                return Err(ConfigError::key(
                    at("region"),
                    "a Bedrock account needs its AWS region, e.g. us-east-1",
                ));
            }
            if member.aws.is_some() == member.api_key.is_some() {
                return Err(ConfigError::key(
                    at("aws"),
                    "a Bedrock account signs with `aws` credentials or sends a Bedrock API key (`api_key_env`): exactly one",
                ));
            }
        }
        ProviderKind::Vertex => {
            if member.service_account.is_none() {
                return Err(ConfigError::key(
                    at("credentials_file"),
                    "a Vertex AI account needs its service account's key: credentials_file or credentials_env",
                ));
            }
        }
        _ => {
            if member.region.is_some() || member.aws.is_some() {
                return Err(ConfigError::key(
                    at("region"),
                    "only a Bedrock account takes a region or aws credentials (provider: bedrock)",
                ));
            }
            if member.service_account.is_some() {
                return Err(ConfigError::key(
                    at("credentials_file"),
                    "only a Vertex AI account takes a service account (provider: vertex)",
                ));
            }
        }
    }
    if member.provider != ProviderKind::Azure {
        if member.entra.is_some() {
            return Err(ConfigError::key(
                at("entra"),
                "an Entra ID application authenticates an Azure account only (provider: azure)",
            ));
        }
        if member.api_version.is_some() {
            return Err(ConfigError::key(
                at("api_version"),
                "only an Azure account takes an api_version (provider: azure)",
            ));
        }
    }
    if let Some(entra) = &member.entra {
        for (field, value) in [
            ("tenant_id", &entra.tenant_id),
            ("client_id", &entra.client_id),
        ] {
            if value.trim().is_empty() {
                return Err(ConfigError::key(
                    at(&format!("entra.{field}")),
                    "must not be empty",
                ));
            }
        }
        let authority = reqwest::Url::parse(&entra.authority)
            .map_err(|err| ConfigError::key(at("entra.authority"), err.to_string()))?;
        if !matches!(authority.scheme(), "http" | "https") {
            return Err(ConfigError::key(
                at("entra.authority"),
                "must be an http or https URL",
            ));
        }
    }
    if let Some(version) = &member.api_version
        && (version.is_empty()
            || !version
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.'))
    {
        return Err(ConfigError::key(
            at("api_version"),
            "must be an API version such as 2024-10-21 or 2025-04-01-preview",
        ));
    }
    for (model, name) in member.deployments.iter() {
        let plain = !name.is_empty()
            && name.bytes().all(|b| {
                b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b':' | b'@')
            });
        if !plain {
            return Err(ConfigError::key(
                at(&format!("deployments.{model}")),
                "a deployment or model id is letters, digits and - . _ : @",
            ));
        }
    }
    Ok(())
}

/// A provider's base URL: http(s), and for the APIs whose paths corral
/// appends below a version, ending in that version.
fn check_base_url(
    key: &str,
    api: Api,
    provider: super::ProviderKind,
    base_url: &str,
) -> Result<(), ConfigError> {
    let url =
        reqwest::Url::parse(base_url).map_err(|err| ConfigError::key(key, err.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ConfigError::key(key, "must be an http or https URL"));
    }
    // Anthropic's SDKs take the bare host as their base URL and add
    // `/v1/messages`; corral adds `/messages` to its base URL, so the
    // bare host would send every request to a path that does not exist.
    // The clouds' paths are their own (`provider/`): a Bedrock base URL is
    // its runtime's host, a Vertex one its project's location.
    if matches!(
        provider,
        super::ProviderKind::Bedrock | super::ProviderKind::Vertex
    ) {
        return Ok(());
    }
    if api == Api::Gemini && url.path().trim_end_matches('/').is_empty() {
        return Err(ConfigError::key(
            key,
            "a Gemini base URL ends in its version, e.g. https://generativelanguage.googleapis.com/v1beta (corral appends /models/...)",
        ));
    }
    if api == Api::Anthropic && url.path().trim_end_matches('/').is_empty() {
        return Err(ConfigError::key(
            key,
            "an Anthropic base URL ends in its version, e.g. https://api.anthropic.com/v1 (corral appends /messages)",
        ));
    }
    Ok(())
}
