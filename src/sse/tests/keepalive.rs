//! A silent stream's readers receive keep-alive comments; no event is lost
//! or reordered around them, and none comes when they are off.

use std::{convert::Infallible, time::Duration};

use bytes::Bytes;
use futures::StreamExt;

use crate::sse::{KEEPALIVE, with_keepalive};

/// Two events, the first after `thinking` of silence, the second 10 ms later.
fn thinking_stream(
    thinking: Duration,
) -> impl futures::Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
    futures::stream::iter([
        (thinking, "data: 1\n\n"),
        (Duration::from_millis(10), "data: 2\n\n"),
    ])
    .then(|(pause, event)| async move {
        tokio::time::sleep(pause).await;
        Ok(Bytes::from_static(event.as_bytes()))
    })
}

#[tokio::test(start_paused = true)]
async fn a_silent_stream_gets_keepalives_and_loses_no_event() {
    let received: Vec<Bytes> = with_keepalive(
        thinking_stream(Duration::from_secs(100)),
        Duration::from_secs(15),
        KEEPALIVE,
    )
    .map(Result::unwrap)
    .collect()
    .await;
    let comments = received.iter().filter(|event| **event == KEEPALIVE).count();
    assert_eq!(comments, 6, "one per 15 s of the 100 s of thinking");
    let events: Vec<&Bytes> = received
        .iter()
        .filter(|event| **event != KEEPALIVE)
        .collect();
    assert_eq!(
        events,
        [
            &Bytes::from_static(b"data: 1\n\n"),
            &Bytes::from_static(b"data: 2\n\n")
        ]
    );
    assert!(
        received.last() != Some(&KEEPALIVE),
        "the stream ends on its own event"
    );
}

#[tokio::test(start_paused = true)]
async fn keepalives_off_send_only_events() {
    let received: Vec<Bytes> = with_keepalive(
        thinking_stream(Duration::from_secs(100)),
        Duration::ZERO,
        KEEPALIVE,
    )
    .map(Result::unwrap)
    .collect()
    .await;
    assert_eq!(received.len(), 2);
}
