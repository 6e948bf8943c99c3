//! `AppState`: everything a request needs, built once at start-up and shared
//! by `Arc`. No globals.

use std::sync::Arc;

use tokio_util::task::TaskTracker;

use crate::{
    cache::{CacheStore, MemoryStore, TtlPolicy},
    clock::{Clock, SystemClock},
    coalesce::Coalescer,
    config::Config,
    upstream::{Routes, Upstream},
};

#[derive(Debug)]
pub struct AppState {
    pub config: Config,
    pub routes: Routes,
    /// `config.upstreams[i].name`, indexed like the routes.
    pub upstream_names: Vec<String>,
    pub cache: Arc<dyn CacheStore>,
    pub coalescer: Coalescer,
    pub upstream: Upstream,
    pub clock: Arc<dyn Clock>,
    /// Detached work (flights, refreshes) that shutdown waits for.
    pub tasks: TaskTracker,
}

impl AppState {
    pub fn build(config: Config) -> anyhow::Result<Self> {
        Self::build_with_clock(config, Arc::new(SystemClock))
    }

    /// As `build`, with the clock cache freshness is judged by (tests move it by hand).
    pub fn build_with_clock(config: Config, clock: Arc<dyn Clock>) -> anyhow::Result<Self> {
        let cache: Arc<dyn CacheStore> = Arc::new(MemoryStore::new(
            config.cache.max_entries,
            config.cache.max_bytes,
        ));
        let ttl = TtlPolicy {
            soft_ttl: config.cache.soft_ttl,
            hard_ttl: config.cache.hard_ttl,
            jitter: config.cache.ttl_jitter,
        };
        let tasks = TaskTracker::new();
        let coalescer = Coalescer::new(
            cache.clone(),
            clock.clone(),
            ttl,
            config.coalesce.clone(),
            tasks.clone(),
        );
        Ok(Self {
            routes: Routes::new(&config.upstreams),
            upstream_names: config.upstreams.iter().map(|u| u.name.clone()).collect(),
            upstream: Upstream::new(&config)?,
            cache,
            coalescer,
            clock,
            tasks,
            config,
        })
    }
}
