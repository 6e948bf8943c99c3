//! One multiplexed, auto-reconnecting connection per process (a
//! `ConnectionManager`, or a cluster connection), created lazily so corral
//! starts while Redis is down and attaches when it comes up.

use redis::{
    Cmd, Pipeline, RedisFuture, Value,
    aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection},
    cluster::ClusterClient,
    cluster_async::ClusterConnection,
};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::RedisConfig;

/// Either kind of connection, behind one `ConnectionLike`.
#[derive(Clone)]
pub enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    /// A connection of its own, for blocking reads (they would stall a shared one).
    Dedicated(MultiplexedConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(conn) => conn.req_packed_command(cmd),
            Self::Cluster(conn) => conn.req_packed_command(cmd),
            Self::Dedicated(conn) => conn.req_packed_command(cmd),
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
            Self::Dedicated(conn) => conn.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(conn) => conn.get_db(),
            Self::Cluster(conn) => conn.get_db(),
            Self::Dedicated(conn) => conn.get_db(),
        }
    }
}

/// The connection, established in the background: until it is up, every
/// operation is `Unavailable` at once (corral starts, and serves, with Redis
/// down), and it attaches as soon as Redis answers. Once up, the connection
/// reconnects by itself.
pub struct LazyConn {
    conn: watch::Sender<Option<Conn>>,
}

impl std::fmt::Debug for LazyConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyConn")
            .field("connected", &self.conn.borrow().is_some())
            .finish()
    }
}

/// How the connector and the announcement subscriber space their attempts
/// to reach Redis: from 50 ms, doubling up to 2 s, jittered (so a fleet that
/// lost Redis together does not come back in step); begun afresh after a
/// success.
pub(super) fn reconnect_delays() -> impl Iterator<Item = Duration> {
    use backon::BackoffBuilder as _;
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(50))
        .with_max_delay(Duration::from_secs(2))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

/// Waits out the next of `delays`; false when `stop` came first.
pub(super) async fn wait_to_reconnect(
    delays: &mut impl Iterator<Item = Duration>,
    stop: &CancellationToken,
) -> bool {
    let delay = delays.next().unwrap_or(Duration::from_secs(2));
    tokio::select! {
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep(delay) => true,
    }
}

impl LazyConn {
    /// Starts connecting; retries with backoff and jitter until it succeeds or `stop`.
    pub fn start(config: RedisConfig, stop: CancellationToken) -> Self {
        let conn = watch::Sender::new(None);
        let publish = conn.clone();
        tokio::spawn(async move {
            let mut delays = reconnect_delays();
            loop {
                let attempt = tokio::select! {
                    _ = stop.cancelled() => return,
                    attempt = connect(&config) => attempt,
                };
                match attempt {
                    Ok(connected) => {
                        publish.send_replace(Some(connected));
                        return;
                    }
                    Err(err) => tracing::debug!(error = %err, "redis not reachable yet"),
                }
                if !wait_to_reconnect(&mut delays, &stop).await {
                    return;
                }
            }
        });
        Self { conn }
    }

    /// The shared connection (a cheap clone of a multiplexed handle), if up.
    pub fn get(&self) -> Option<Conn> {
        self.conn.borrow().clone()
    }

    /// Observes the first connection (readiness, tests).
    pub fn connected(&self) -> watch::Receiver<Option<Conn>> {
        self.conn.subscribe()
    }
}

async fn connect(config: &RedisConfig) -> redis::RedisResult<Conn> {
    let urls = config.node_urls();
    // Connecting is not on any request's path, so it may take longer than one operation.
    let connect_timeout = config.op_timeout.max(Duration::from_secs(1));
    if config.is_cluster() {
        let client = ClusterClient::builder(urls)
            .connection_timeout(connect_timeout)
            .response_timeout(config.op_timeout)
            .retries(1)
            .build()?;
        return Ok(Conn::Cluster(client.get_async_connection().await?));
    }
    let client = redis::Client::open(urls[0].as_str())?;
    let manager = ConnectionManager::new_with_config(
        client,
        ConnectionManagerConfig::new()
            .set_connection_timeout(connect_timeout)
            .set_response_timeout(config.op_timeout)
            .set_number_of_retries(1)
            .set_max_delay(1000),
    )
    .await?;
    Ok(Conn::Single(manager))
}

/// A fresh connection for blocking reads (`XREAD BLOCK`), whose replies may
/// take up to `block` to come.
pub async fn dedicated(config: &RedisConfig, block: Duration) -> redis::RedisResult<Conn> {
    let urls = config.node_urls();
    let response_timeout = block + config.op_timeout.max(Duration::from_secs(1));
    if config.is_cluster() {
        let client = ClusterClient::builder(urls)
            .connection_timeout(config.op_timeout.max(Duration::from_secs(1)))
            .response_timeout(response_timeout)
            .retries(1)
            .build()?;
        return Ok(Conn::Cluster(client.get_async_connection().await?));
    }
    let client = redis::Client::open(urls[0].as_str())?;
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(response_timeout);
    Ok(Conn::Dedicated(
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await?,
    ))
}
