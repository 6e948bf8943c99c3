//! One multiplexed, auto-reconnecting connection per process (a
//! `ConnectionManager`, or a cluster connection), created lazily so corral
//! starts while Redis is down and attaches when it comes up.

use redis::{
    Cmd, Pipeline, RedisFuture, Value,
    aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig},
    cluster::ClusterClient,
    cluster_async::ClusterConnection,
};
use tokio::sync::OnceCell;

use crate::config::RedisConfig;

/// Either kind of connection, behind one `ConnectionLike`.
#[derive(Clone)]
pub enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(conn) => conn.req_packed_command(cmd),
            Self::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(conn) => conn.req_packed_commands(cmd, offset, count),
            Self::Cluster(conn) => conn.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(conn) => conn.get_db(),
            Self::Cluster(conn) => conn.get_db(),
        }
    }
}

/// Connects on first use; a failed connect is retried by the next use.
pub struct LazyConn {
    config: RedisConfig,
    conn: OnceCell<Conn>,
}

impl std::fmt::Debug for LazyConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyConn")
            .field("connected", &self.conn.initialized())
            .finish()
    }
}

impl LazyConn {
    pub fn new(config: RedisConfig) -> Self {
        Self {
            config,
            conn: OnceCell::new(),
        }
    }

    /// The shared connection (a cheap clone of a multiplexed handle).
    pub async fn get(&self) -> redis::RedisResult<Conn> {
        self.conn
            .get_or_try_init(|| connect(&self.config))
            .await
            .cloned()
    }
}

async fn connect(config: &RedisConfig) -> redis::RedisResult<Conn> {
    let urls = config.node_urls();
    if config.is_cluster() {
        let client = ClusterClient::builder(urls)
            .connection_timeout(config.op_timeout)
            .response_timeout(config.op_timeout)
            .retries(1)
            .build()?;
        return Ok(Conn::Cluster(client.get_async_connection().await?));
    }
    let client = redis::Client::open(urls[0].as_str())?;
    let manager = ConnectionManager::new_with_config(
        client,
        ConnectionManagerConfig::new()
            .set_connection_timeout(config.op_timeout)
            .set_response_timeout(config.op_timeout)
            .set_number_of_retries(1)
            .set_max_delay(1000),
    )
    .await?;
    Ok(Conn::Single(manager))
}
