//! `StreamLog`: replay then live tail, late joiners, slow readers, bounds, abandonment.

use bytes::Bytes;
use futures::FutureExt as _;

use super::{DEADLINE, event, json_of};
use crate::sse::{
    AppendError, BROKEN_STREAM_CODE, CallerUsage, DONE_EVENT, LogEnd, StreamLog, error_event,
};

fn numbered(n: usize) -> Bytes {
    event(&format!(r#"{{"n":{n}}}"#))
}

/// Everything the reader yields until its stream ends, failing the test past the deadline.
/// Every event the reader gives, each whole (a body stream may send one in two slices).
async fn drain(mut reader: crate::sse::StreamReader) -> Vec<Bytes> {
    let events = async move {
        let mut events = Vec::new();
        while let Some(event) = reader.next_event().await {
            events.push(event);
        }
        events
    };
    tokio::time::timeout(DEADLINE, events)
        .await
        .expect("the reader's stream should end")
}

#[tokio::test]
async fn reader_gets_every_event_then_done_then_ends() {
    let (log, mut writer) = super::chat_log(1 << 20);
    let reader = log.reader(CallerUsage::Asked);
    for n in 0..3 {
        writer.append(numbered(n)).unwrap();
    }
    writer.finish();
    let events = drain(reader).await;
    assert_eq!(
        events,
        vec![
            numbered(0),
            numbered(1),
            numbered(2),
            Bytes::from_static(DONE_EVENT)
        ]
    );
    assert_eq!(log.end(), Some(LogEnd::Done));
}

#[tokio::test]
async fn late_joiner_gets_everything_so_far_at_once_then_the_live_tail() {
    let (log, mut writer) = super::chat_log(1 << 20);
    for n in 0..5 {
        writer.append(numbered(n)).unwrap();
    }
    let mut late = log.reader(CallerUsage::Asked);
    for n in 0..5 {
        // Already in the log: ready without waiting for the writer.
        let got = late.next_event().now_or_never().expect("ready at once");
        assert_eq!(got, Some(numbered(n)));
    }
    let mut next = Box::pin(late.next_event());
    assert!((&mut next).now_or_never().is_none(), "caught up: waits");
    writer.append(numbered(5)).unwrap();
    assert_eq!(
        tokio::time::timeout(DEADLINE, next).await.unwrap(),
        Some(numbered(5))
    );
    writer.finish();
    assert_eq!(
        late.next_event().await,
        Some(Bytes::from_static(DONE_EVENT))
    );
    assert_eq!(late.next_event().await, None);
    assert_eq!(late.next_event().await, None, "stays ended");
}

#[tokio::test]
async fn a_reader_waiting_on_the_tail_is_woken_by_each_append() {
    let (log, mut writer) = super::chat_log(1 << 20);
    let reader = log.reader(CallerUsage::Asked);
    let follower = tokio::spawn(drain(reader));
    for n in 0..100 {
        writer.append(numbered(n)).unwrap();
        tokio::task::yield_now().await;
    }
    writer.finish();
    let events = follower.await.unwrap();
    assert_eq!(events.len(), 101);
    assert_eq!(events[42], numbered(42));
}

#[tokio::test]
async fn a_reader_that_never_reads_does_not_hold_up_the_writer_or_others() {
    let (log, mut writer) = super::chat_log(usize::MAX);
    let _stuck = log.reader(CallerUsage::Asked);
    let fast = tokio::spawn(drain(log.reader(CallerUsage::Asked)));
    // The writer never waits: every append returns at once, whatever the readers do.
    for n in 0..10_000 {
        writer.append(numbered(n)).unwrap();
    }
    writer.finish();
    let events = fast.await.unwrap();
    assert_eq!(events.len(), 10_001);
    assert_eq!(log.reader_count(), 1, "only the stuck reader is left");
}

#[tokio::test]
async fn readers_share_the_logs_bytes_rather_than_copies() {
    let (log, mut writer) = super::chat_log(1 << 20);
    writer.append(numbered(7)).unwrap();
    writer.finish();
    let a = drain(log.reader(CallerUsage::Asked)).await;
    let b = drain(log.reader(CallerUsage::Asked)).await;
    assert_eq!(a[0].as_ptr(), b[0].as_ptr(), "the same allocation");
    assert_eq!(a[0].as_ptr(), log.events()[0].as_ptr());
    // A reader is a cursor, a version and two pointers, however long the log.
    assert!(std::mem::size_of::<crate::sse::StreamReader>() <= 64);
}

#[tokio::test]
async fn a_failed_log_ends_every_reader_with_the_error_event() {
    let (log, mut writer) = super::chat_log(1 << 20);
    let early = log.reader(CallerUsage::Asked);
    writer.append(numbered(0)).unwrap();
    let error = error_event("boom");
    writer.fail(error.clone());
    let late = log.reader(CallerUsage::NotAsked);
    for reader in [early, late] {
        assert_eq!(drain(reader).await, vec![numbered(0), error.clone()]);
    }
    assert_eq!(log.end(), Some(LogEnd::Failed(error)));
}

#[tokio::test]
async fn appending_past_the_bound_fails_the_log_for_everyone() {
    let one = numbered(1).len();
    let (log, mut writer) = super::chat_log(2 * one);
    let reader = log.reader(CallerUsage::Asked);
    writer.append(numbered(1)).unwrap();
    writer.append(numbered(2)).unwrap();
    assert_eq!(
        writer.append(numbered(3)),
        Err(AppendError::Full { max_bytes: 2 * one })
    );
    assert_eq!(writer.append(numbered(4)), Err(AppendError::Ended));
    let events = drain(reader).await;
    assert_eq!(events.len(), 3, "two events, then the error");
    let error = json_of(&events[2]).unwrap();
    assert_eq!(error["error"]["code"], BROKEN_STREAM_CODE);
    assert_eq!(error["error"]["type"], "server_error");
    assert!(matches!(log.end(), Some(LogEnd::Failed(_))));
}

#[tokio::test]
async fn a_dropped_writer_fails_the_log_instead_of_leaving_readers_waiting() {
    let (log, mut writer) = super::chat_log(1 << 20);
    let reader = log.reader(CallerUsage::Asked);
    writer.append(numbered(0)).unwrap();
    let follower = tokio::spawn(drain(reader));
    drop(writer);
    let events = follower.await.unwrap();
    assert_eq!(events.len(), 2);
    let error = json_of(&events[1]).unwrap();
    assert_eq!(
        error["error"]["message"],
        "the upstream stream was cancelled before it ended"
    );
    assert_eq!(
        tokio::time::timeout(DEADLINE, log.ended()).await.unwrap(),
        log.end().unwrap()
    );
}

#[tokio::test]
async fn finishing_after_the_end_changes_nothing() {
    let (log, mut writer) = super::chat_log(numbered(1).len());
    writer.append(numbered(1)).unwrap();
    assert!(writer.append(numbered(2)).is_err());
    writer.finish();
    assert!(matches!(log.end(), Some(LogEnd::Failed(_))), "still failed");
    assert_eq!(log.len(), 2);
}

#[tokio::test]
async fn abandoned_resolves_when_the_last_reader_goes_and_not_before_any_came() {
    let (log, _writer) = super::chat_log(1 << 20);
    assert!(
        log.abandoned().now_or_never().is_none(),
        "nobody joined yet"
    );
    let a = log.reader(CallerUsage::Asked);
    let b = log.reader(CallerUsage::NotAsked);
    assert_eq!(log.reader_count(), 2);
    let mut abandoned = Box::pin(log.abandoned());
    drop(a);
    assert!((&mut abandoned).now_or_never().is_none(), "one reader left");
    drop(b);
    tokio::time::timeout(DEADLINE, abandoned).await.unwrap();
    assert_eq!(log.reader_count(), 0);
    // A body stream holds its reader: dropping the body (a client gone) counts too.
    let body = log.reader(CallerUsage::Asked).into_stream();
    assert_eq!(log.reader_count(), 1);
    drop(body);
    assert_eq!(log.reader_count(), 0);
}

#[tokio::test]
async fn ended_waits_for_the_writer() {
    let (log, mut writer) = super::chat_log(1 << 20);
    let mut ended = Box::pin(log.ended());
    assert!((&mut ended).now_or_never().is_none());
    writer.append(numbered(0)).unwrap();
    writer.finish();
    assert_eq!(
        tokio::time::timeout(DEADLINE, ended).await.unwrap(),
        LogEnd::Done
    );
}

#[tokio::test]
async fn a_caller_who_did_not_ask_never_sees_usage() {
    let (log, mut writer) = super::chat_log(1 << 20);
    let content = event(r#"{"choices":[{"index":0,"delta":{"content":"hi"}}],"usage":null}"#);
    let usage = event(r#"{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}"#);
    writer.append(content.clone()).unwrap();
    writer.append(usage.clone()).unwrap();
    writer.finish();
    let asked = drain(log.reader(CallerUsage::Asked)).await;
    assert_eq!(asked, vec![content, usage, Bytes::from_static(DONE_EVENT)]);
    let not_asked = drain(log.reader(CallerUsage::NotAsked)).await;
    assert_eq!(
        not_asked,
        vec![
            event(r#"{"choices":[{"index":0,"delta":{"content":"hi"}}]}"#),
            Bytes::from_static(DONE_EVENT),
        ]
    );
    // The usage-free view is the event's bytes around its `usage` member: the log holds the
    // stream once, and counts it once against its bound.
    assert_eq!(log.bytes(), asked.iter().map(Bytes::len).sum::<usize>());
    // The body stream sends those slices, with nothing copied; joined they are the view.
    let body = axum::body::Body::from_stream(log.reader(CallerUsage::NotAsked).into_stream());
    let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    assert_eq!(bytes, not_asked.concat());
}

#[tokio::test]
async fn a_replayed_log_serves_a_cached_stream_through_the_same_readers() {
    let cached = vec![numbered(0), numbered(1), Bytes::from_static(DONE_EVENT)];
    let log = StreamLog::replay(&crate::wire::chat::STREAM, cached.clone());
    assert_eq!(log.end(), Some(LogEnd::Done));
    assert_eq!(drain(log.reader(CallerUsage::Asked)).await, cached);
    // Without the trailing [DONE] too.
    let log = StreamLog::replay(&crate::wire::chat::STREAM, cached[..2].to_vec());
    assert_eq!(drain(log.reader(CallerUsage::Asked)).await, cached);
}

#[tokio::test]
async fn the_reader_streams_through_an_axum_body() {
    let (log, mut writer) = super::chat_log(1 << 20);
    let reader = log.reader(CallerUsage::Asked);
    let body = axum::body::Body::from_stream(reader.into_stream());
    writer.append(numbered(0)).unwrap();
    writer.append(numbered(1)).unwrap();
    writer.finish();
    let bytes = tokio::time::timeout(DEADLINE, axum::body::to_bytes(body, usize::MAX))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        &bytes[..],
        &b"data: {\"n\":0}\n\ndata: {\"n\":1}\n\ndata: [DONE]\n\n"[..]
    );
}

#[tokio::test]
async fn a_reader_that_falls_too_far_behind_a_live_stream_is_cut_with_an_error_event() {
    let (log, mut writer) = StreamLog::with_limits(
        &crate::wire::chat::STREAM,
        crate::sse::LogLimits {
            max_bytes: 1 << 20,
            max_reader_lag: 100,
            tally: None,
        },
    );
    let big = |n: usize| event(&format!(r#"{{"n":{n},"pad":"{}"}}"#, "x".repeat(40)));
    writer.append(big(0)).unwrap();
    writer.append(big(1)).unwrap();
    writer.append(big(2)).unwrap();
    // Joined late: what was there already is replayed, not lag.
    let mut late = log.reader(CallerUsage::Asked);
    let mut keeping_up = log.reader(CallerUsage::Asked);
    for n in 0..3 {
        assert_eq!(late.next_event().await, Some(big(n)));
        assert_eq!(keeping_up.next_event().await, Some(big(n)));
    }
    let mut slow = log.reader(CallerUsage::Asked);
    for n in 3..6 {
        writer.append(big(n)).unwrap();
        assert_eq!(keeping_up.next_event().await, Some(big(n)));
    }
    // `slow` joined at the same point as `keeping_up`, then read nothing while
    // three events (well over 100 bytes) went by: cut.
    let cut = slow.next_event().await.expect("an error event");
    assert_eq!(json_of(&cut).unwrap()["error"]["code"], BROKEN_STREAM_CODE);
    assert_eq!(slow.next_event().await, None, "and then the end");
    // `late` is behind by the events after its join, more than the cap: cut as well.
    let events = drain(late).await;
    assert_eq!(events.len(), 1);
    assert_eq!(
        json_of(&events[0]).unwrap()["error"]["code"],
        BROKEN_STREAM_CODE
    );
    writer.finish();
    assert_eq!(
        keeping_up.next_event().await,
        Some(Bytes::from_static(DONE_EVENT))
    );
}

#[tokio::test]
async fn a_finished_log_is_never_cut_for_lag() {
    let (log, mut writer) = StreamLog::with_limits(
        &crate::wire::chat::STREAM,
        crate::sse::LogLimits {
            max_bytes: 1 << 20,
            max_reader_lag: 10,
            tally: None,
        },
    );
    let reader = log.reader(CallerUsage::Asked);
    for n in 0..5 {
        writer.append(numbered(n)).unwrap();
    }
    writer.finish();
    assert_eq!(drain(reader).await.len(), 6, "every event and [DONE]");
}

#[tokio::test]
async fn the_tally_counts_a_log_while_any_handle_lives_and_returns_to_zero() {
    let tally = crate::sse::LogBytes::default();
    let (log, mut writer) = StreamLog::with_limits(
        &crate::wire::chat::STREAM,
        crate::sse::LogLimits {
            max_bytes: 1 << 20,
            max_reader_lag: usize::MAX,
            tally: Some(tally.clone()),
        },
    );
    let reader = log.reader(CallerUsage::Asked);
    writer.append(numbered(1)).unwrap();
    writer.finish();
    assert_eq!(tally.get(), log.bytes());
    assert!(tally.get() > 0);
    drop(log);
    assert!(tally.get() > 0, "the reader still holds the log");
    drop(reader);
    assert_eq!(tally.get(), 0);
}

#[tokio::test]
async fn an_interrupted_log_ends_every_reader_with_the_given_error_event() {
    let (log, mut writer) = super::chat_log(1 << 20);
    let reader = log.reader(CallerUsage::Asked);
    writer.append(numbered(1)).unwrap();
    let cut = error_event("shutting down");
    log.interrupt(cut.clone());
    assert_eq!(writer.append(numbered(2)), Err(AppendError::Ended));
    drop(writer);
    assert_eq!(drain(reader).await, vec![numbered(1), cut.clone()]);
    assert_eq!(log.end(), Some(LogEnd::Failed(cut)));
}
