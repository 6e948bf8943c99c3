//! Chooses the upstream for a request by its API and `model`: among the
//! upstreams that speak the request's API, the first whose glob matches wins.

use glob::Pattern;

use crate::config::{Affinity, Api, UpstreamConfig};

#[derive(Debug)]
pub struct Routes {
    routes: Vec<(usize, Api, Pattern)>,
    /// A provider's id for a model (`deployments`' values: a Bedrock model
    /// id, a Vertex version) -> the public name it deploys.
    public_names: std::collections::HashMap<String, String>,
    /// By upstream: whether its pool orders members by a request's session
    /// (`affinity: session` over more than one member).
    by_session: Vec<bool>,
}

impl Routes {
    /// Patterns were checked by `Config::validate`; a bad one here is skipped.
    pub fn new(upstreams: &[UpstreamConfig]) -> Self {
        let routes = upstreams
            .iter()
            .enumerate()
            .flat_map(|(index, upstream)| {
                upstream.models.iter().filter_map(move |pattern| {
                    Pattern::new(pattern).ok().map(|p| (index, upstream.api, p))
                })
            })
            .collect();
        let mut public_names = std::collections::HashMap::new();
        for upstream in upstreams {
            for member in upstream.effective_members() {
                for (model, id) in member.deployments.iter() {
                    public_names
                        .entry(id.clone())
                        .or_insert_with(|| model.clone());
                }
            }
        }
        let by_session = upstreams
            .iter()
            .map(|upstream| upstream.affinity == Affinity::Session && upstream.members.len() > 1)
            .collect();
        Self {
            routes,
            public_names,
            by_session,
        }
    }

    /// Whether `upstream`'s pool picks its first member by the request's
    /// session (`routing::affinity_key`): only then is that key worth its
    /// reading of the body (a pool of one, or `affinity: none`, ignores it).
    pub fn orders_by_session(&self, upstream: usize) -> bool {
        self.by_session.get(upstream).copied().unwrap_or(false)
    }

    /// The public name of the model a provider's id names (a Bedrock or
    /// Vertex request's path says the id): the model its `deployments` map
    /// to that id, else the id itself. One name per model, whatever cloud a
    /// caller's client speaks, for keys, cost and metrics.
    pub fn public_name<'a>(&'a self, id: &'a str) -> &'a str {
        self.public_names.get(id).map_or(id, String::as_str)
    }

    /// Index of the OpenAI-API upstream serving `model`, if any: the
    /// deduplicated OpenAI endpoints are only ever sent to one.
    pub fn route(&self, model: &str) -> Option<usize> {
        self.route_for(Api::OpenAi, model)
    }

    /// Index of the upstream speaking `api` that serves `model`, if any.
    pub fn route_for(&self, api: Api, model: &str) -> Option<usize> {
        self.routes
            .iter()
            .find(|(_, speaks, pattern)| *speaks == api && pattern.matches(model))
            .map(|(index, _, _)| *index)
    }

    /// The upstream for a proxied request of `api`: one speaking `api` first,
    /// else any upstream whose glob matches (a model id asked of the other
    /// provider's `GET /v1/models/{id}`, say).
    pub fn route_preferring(&self, api: Api, model: &str) -> Option<usize> {
        self.route_for(api, model).or_else(|| {
            // Gemini's upstreams take Gemini's requests only.
            self.routes
                .iter()
                .find(|(_, speaks, pattern)| *speaks != Api::Gemini && pattern.matches(model))
                .map(|(index, _, _)| *index)
        })
    }

    /// The first upstream speaking `api`, for a proxied request without a model.
    pub fn first_of(&self, api: Api) -> Option<usize> {
        self.routes
            .iter()
            .find(|(_, speaks, _)| *speaks == api)
            .map(|(index, _, _)| *index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn first_match_wins() {
        let config = Config::load(
            "listen: 127.0.0.1:0\nupstreams:\n  - {name: a, base_url: 'http://127.0.0.1:1/v1', models: ['gpt-4o*']}\n  - {name: b, base_url: 'http://127.0.0.1:2/v1', models: ['claude-*', 'gpt-*']}\n",
            [],
        )
        .unwrap();
        let routes = Routes::new(&config.upstreams);
        assert_eq!(routes.route("gpt-4o-mini"), Some(0));
        assert_eq!(routes.route("gpt-3.5-turbo"), Some(1));
        assert_eq!(routes.route("claude-3"), Some(1));
        assert_eq!(routes.route("llama"), None);
        assert!(
            !routes.orders_by_session(0),
            "an upstream of one account has no member to pick"
        );
    }

    #[test]
    fn only_a_pool_of_several_with_session_affinity_orders_by_session() {
        let config = Config::load(
            "listen: 127.0.0.1:0\nupstreams:\n  - name: pool\n    api_key_env: POOL_KEY\n    models: ['gpt-*']\n    members:\n      - {name: a, base_url: 'http://127.0.0.1:1/v1'}\n      - {name: b, base_url: 'http://127.0.0.1:2/v1'}\n  - name: spread\n    api_key_env: POOL_KEY\n    affinity: none\n    models: ['o*']\n    members:\n      - {name: c, base_url: 'http://127.0.0.1:3/v1'}\n      - {name: d, base_url: 'http://127.0.0.1:4/v1'}\n  - {name: one, base_url: 'http://127.0.0.1:5/v1'}\n",
            [("POOL_KEY", "sk-pool")],
        )
        .unwrap();
        let routes = Routes::new(&config.upstreams);
        assert!(routes.orders_by_session(0));
        assert!(!routes.orders_by_session(1), "affinity: none");
        assert!(!routes.orders_by_session(2), "one account");
        assert!(!routes.orders_by_session(3), "no such upstream");
    }

    #[test]
    fn each_api_routes_among_its_own_upstreams() {
        let config = Config::load(
            "listen: 127.0.0.1:0\nupstreams:\n  - {name: openai, base_url: 'http://127.0.0.1:1/v1'}\n  - {name: anthropic, api: anthropic, base_url: 'http://127.0.0.1:2/v1', models: ['claude-*']}\n",
            [],
        )
        .unwrap();
        let routes = Routes::new(&config.upstreams);
        // The catch-all OpenAI upstream does not shadow Anthropic's for Messages...
        assert_eq!(
            routes.route_for(Api::Anthropic, "claude-sonnet-4-5"),
            Some(1)
        );
        assert_eq!(routes.route_for(Api::Anthropic, "gpt-4o"), None);
        // ...and chat never goes to the Anthropic upstream.
        assert_eq!(routes.route("claude-sonnet-4-5"), Some(0));
        assert_eq!(routes.first_of(Api::Anthropic), Some(1));
        assert_eq!(routes.first_of(Api::OpenAi), Some(0));
        assert_eq!(
            routes.route_preferring(Api::Anthropic, "gpt-4o"),
            Some(0),
            "a model only the other API serves"
        );
    }
}
