//! Completion announcements: one pub/sub subscriber connection per process,
//! dispatching "fingerprint X is done" to the local remote-follower waiting on X.
//!
//! Pub/sub loses messages, and a dropped subscriber connection is not
//! re-established by the client library, so: followers register interest
//! before they read the result key, the subscriber reconnects and resubscribes
//! by itself and then wakes every follower to re-read, and followers keep a
//! backstop poll (in `Cluster::follow`). A lost announcement costs at most one
//! poll interval.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, Weak},
    time::Duration,
};

use futures::StreamExt;
use rand::Rng;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::fingerprint::Fingerprint;

#[derive(Debug, Default)]
pub struct Dispatch {
    interests: Mutex<HashMap<Fingerprint, Weak<Notify>>>,
    /// Whether the subscriber is subscribed right now.
    subscribed: watch::Sender<bool>,
}

/// A registered wish to hear about one fingerprint; unregisters on drop.
pub struct Interest {
    dispatch: Arc<Dispatch>,
    fingerprint: Fingerprint,
    notify: Arc<Notify>,
}

impl Interest {
    /// Resolves on an announcement for the fingerprint, or a resubscription.
    /// A notification that came before this call is not lost (`Notify` keeps a permit).
    pub async fn notified(&self) {
        self.notify.notified().await;
    }
}

impl Drop for Interest {
    fn drop(&mut self) {
        let mut interests = self.dispatch.lock();
        if interests
            .get(&self.fingerprint)
            .is_some_and(|weak| weak.as_ptr() == Arc::as_ptr(&self.notify))
        {
            interests.remove(&self.fingerprint);
        }
    }
}

impl Dispatch {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Fingerprint, Weak<Notify>>> {
        self.interests.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn register(self: &Arc<Self>, fingerprint: Fingerprint) -> Interest {
        let notify = Arc::new(Notify::new());
        self.lock().insert(fingerprint, Arc::downgrade(&notify));
        Interest {
            dispatch: self.clone(),
            fingerprint,
            notify,
        }
    }

    fn announce(&self, fingerprint: &Fingerprint) {
        if let Some(notify) = self.lock().get(fingerprint).and_then(Weak::upgrade) {
            notify.notify_one();
        }
    }

    /// After a (re)subscription every follower re-reads: announcements sent
    /// while no subscriber was connected are lost.
    fn wake_all(&self) {
        for notify in self.lock().values().filter_map(Weak::upgrade) {
            notify.notify_one();
        }
    }

    pub fn subscribed(&self) -> watch::Receiver<bool> {
        self.subscribed.subscribe()
    }
}

/// Runs the subscriber until `stop`: connect, subscribe, dispatch, and on any
/// loss reconnect with backoff and jitter.
pub async fn run_subscriber(
    url: String,
    channel: String,
    dispatch: Arc<Dispatch>,
    connect_timeout: Duration,
    stop: CancellationToken,
) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let connect = async {
            let client = redis::Client::open(url.as_str())?;
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        let connected = tokio::select! {
            _ = stop.cancelled() => return,
            connected = tokio::time::timeout(connect_timeout.max(Duration::from_millis(500)), connect) => connected,
        };
        if let Ok(Ok(pubsub)) = connected {
            backoff = Duration::from_millis(50);
            dispatch.subscribed.send_replace(true);
            dispatch.wake_all();
            tracing::debug!("subscribed to completion announcements");
            let mut messages = pubsub.into_on_message();
            loop {
                let message = tokio::select! {
                    _ = stop.cancelled() => return,
                    message = messages.next() => message,
                };
                let Some(message) = message else { break };
                if let Some(fingerprint) = std::str::from_utf8(message.get_payload_bytes())
                    .ok()
                    .and_then(Fingerprint::from_hex)
                {
                    dispatch.announce(&fingerprint);
                }
            }
            dispatch.subscribed.send_replace(false);
            tracing::warn!("announcement subscriber lost its connection; reconnecting");
        }
        let jittered = backoff.mul_f64(rand::rng().random_range(0.5..=1.0));
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(jittered) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}
