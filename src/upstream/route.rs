//! Chooses the upstream for a request by its `model`: the first configured
//! upstream whose glob matches wins.

use glob::Pattern;

use crate::config::UpstreamConfig;

#[derive(Debug)]
pub struct Routes {
    routes: Vec<(usize, Pattern)>,
}

impl Routes {
    /// Patterns were checked by `Config::validate`; a bad one here is skipped.
    pub fn new(upstreams: &[UpstreamConfig]) -> Self {
        let routes = upstreams
            .iter()
            .enumerate()
            .flat_map(|(index, upstream)| {
                upstream
                    .models
                    .iter()
                    .filter_map(move |pattern| Pattern::new(pattern).ok().map(|p| (index, p)))
            })
            .collect();
        Self { routes }
    }

    /// Index of the upstream serving `model`, if any.
    pub fn route(&self, model: &str) -> Option<usize> {
        self.routes
            .iter()
            .find(|(_, pattern)| pattern.matches(model))
            .map(|(index, _)| *index)
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
    }
}
