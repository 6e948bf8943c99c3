//! The relay: canonical events, broken streams, and a parser that never panics and does not
//! care where the bytes were split.

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use proptest::prelude::*;
use serde_json::json;

use super::{body, event, json_of, stalled_body};
use crate::sse::{
    BROKEN_STREAM_CODE, BrokenStream, DONE_EVENT, LogEnd, RelayOutcome, RelaySummary, StreamLog,
    relay,
};
use crate::usage::Usage;

const STALL: Duration = Duration::from_secs(30);

fn bytes(text: &str) -> Bytes {
    Bytes::copy_from_slice(text.as_bytes())
}

async fn relay_chunks(chunks: Vec<Bytes>) -> (RelaySummary, StreamLog) {
    let (log, writer) = super::chat_log(1 << 20);
    let summary = relay(body(chunks), writer, STALL).await;
    (summary, log)
}

fn broken(summary: &RelaySummary) -> &BrokenStream {
    match &summary.outcome {
        RelayOutcome::Broken(broken) => broken,
        RelayOutcome::Completed => panic!("expected a broken stream: {summary:?}"),
    }
}

/// The last event is corral's error event, with the client-facing message of `broken`.
fn assert_ends_with_error(summary: &RelaySummary, log: &StreamLog) {
    let last = summary.events.last().expect("an error event");
    let error = json_of(last).expect("a JSON error event");
    assert_eq!(error["error"]["code"], BROKEN_STREAM_CODE);
    assert_eq!(error["error"]["type"], "server_error");
    assert_eq!(error["error"]["message"], broken(summary).to_string());
    assert_eq!(log.end(), Some(LogEnd::Failed(last.clone())));
}

#[tokio::test]
async fn a_complete_stream_is_relayed_in_one_framing_with_its_usage() {
    let raw = concat!(
        ": keep-alive comment\r\n",
        "\r\n",
        "data:{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}],  \"usage\": null}\r\n\r\n",
        "data: {\"choices\":[{\"index\":0,\n",
        "data: \"delta\":{\"content\":\"lo\"}}],\"usage\":null}\n\n",
        "id: 7\nretry: 100\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\r\r",
        "data: [DONE]\n\n",
    );
    let (summary, log) = relay_chunks(vec![bytes(raw)]).await;
    assert!(summary.completed(), "{summary:?}");
    assert_eq!(
        summary.events,
        vec![
            // Line endings and `data:` spacing become corral's; a chunk on one line keeps
            // the provider's JSON as written, one over several lines is written compact.
            Bytes::from_static(
                b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}],  \"usage\": null}\n\n"
            ),
            event(r#"{"choices":[{"index":0,"delta":{"content":"lo"}}],"usage":null}"#),
            Bytes::from_static(
                b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\n"
            ),
            Bytes::from_static(DONE_EVENT),
        ]
    );
    assert_eq!(
        summary.usage,
        Some(Usage {
            prompt_tokens: 5,
            completion_tokens: 2,
            ..Usage::default()
        })
    );
    assert_eq!(log.end(), Some(LogEnd::Done));
    assert_eq!(log.events(), summary.events);
}

#[tokio::test]
async fn a_body_that_ends_before_done_is_broken() {
    let (summary, log) = relay_chunks(vec![bytes("data: {\"choices\":[]}\n\ndata: {\"cho")]).await;
    assert_eq!(broken(&summary), &BrokenStream::EndedWithoutDone);
    assert_eq!(summary.events.len(), 2, "the chunk, then the error");
    assert_ends_with_error(&summary, &log);
}

#[tokio::test]
async fn data_that_is_not_a_json_object_is_broken() {
    for data in ["hello", "[1,2]", "{\"unterminated\": "] {
        let raw = format!("data: {{\"ok\":1}}\n\ndata: {data}\n\ndata: [DONE]\n\n");
        let (summary, log) = relay_chunks(vec![bytes(&raw)]).await;
        assert!(
            matches!(broken(&summary), BrokenStream::Malformed { .. }),
            "{data}: {summary:?}"
        );
        assert_eq!(summary.events.len(), 2);
        assert_ends_with_error(&summary, &log);
    }
}

#[tokio::test]
async fn invalid_utf8_is_broken() {
    let (summary, log) =
        relay_chunks(vec![Bytes::from_static(b"data: {\"a\":\"\xff\"}\n\n")]).await;
    assert!(matches!(broken(&summary), BrokenStream::Malformed { .. }));
    assert_ends_with_error(&summary, &log);
}

#[tokio::test(start_paused = true)]
async fn no_event_within_the_stall_timeout_is_broken() {
    let (log, writer) = super::chat_log(1 << 20);
    let reader = log.reader(crate::sse::CallerUsage::Asked);
    let relayed = tokio::spawn(relay(
        stalled_body(vec![bytes("data: {\"n\":1}\n\n")]),
        writer,
        Duration::from_secs(5),
    ));
    // The paused clock jumps to the stall deadline once everything else is idle.
    let summary = relayed.await.unwrap();
    assert_eq!(
        broken(&summary),
        &BrokenStream::Stalled(Duration::from_secs(5))
    );
    assert_ends_with_error(&summary, &log);
    let events: Vec<_> = reader.into_stream().map(Result::unwrap).collect().await;
    assert_eq!(events, summary.events);
}

#[tokio::test(start_paused = true)]
async fn the_relay_returns_at_done_without_waiting_for_the_body_to_end() {
    let (log, writer) = super::chat_log(1 << 20);
    let raw = "data: {\"n\":1}\n\ndata: [DONE]\n\ndata: {\"after\":true}\n\n";
    let summary = relay(stalled_body(vec![bytes(raw)]), writer, STALL).await;
    assert!(summary.completed(), "{summary:?}");
    assert_eq!(summary.events.len(), 2, "nothing after [DONE]");
    assert_eq!(log.end(), Some(LogEnd::Done));
}

#[tokio::test]
async fn a_transport_error_is_broken_without_its_detail_reaching_clients() {
    let (log, writer) = super::chat_log(1 << 20);
    let input = futures::stream::iter(vec![
        Ok(bytes("data: {\"n\":1}\n\n")),
        Err(std::io::Error::other("connection reset by 10.0.0.7")),
    ]);
    let summary = relay(input, writer, STALL).await;
    let BrokenStream::Transport { detail } = broken(&summary) else {
        panic!("expected a transport error: {summary:?}");
    };
    assert!(detail.contains("connection reset"), "{detail}");
    assert_ends_with_error(&summary, &log);
    assert!(!String::from_utf8_lossy(summary.events.last().unwrap()).contains("10.0.0.7"));
}

#[tokio::test]
async fn the_providers_own_error_event_is_relayed_as_the_last_event() {
    let upstream_error = r#"{"error":{"message":"overloaded","type":"server_error","param":null,"code":"overloaded"}}"#;
    let raw = format!("data: {{\"n\":1}}\n\ndata: {upstream_error}\n\ndata: [DONE]\n\n");
    let (summary, log) = relay_chunks(vec![bytes(&raw)]).await;
    assert_eq!(broken(&summary), &BrokenStream::UpstreamError);
    assert_eq!(
        summary.events,
        vec![event(r#"{"n":1}"#), event(upstream_error)]
    );
    assert_eq!(log.end(), Some(LogEnd::Failed(event(upstream_error))));

    // A named error event without an `error` member is wrapped in one, since event names are
    // not relayed.
    let named = "event: error\ndata: {\"message\":\"quota\"}\n\n";
    let (summary, _) = relay_chunks(vec![bytes(named)]).await;
    assert_eq!(broken(&summary), &BrokenStream::UpstreamError);
    assert_eq!(
        summary.events,
        vec![event(r#"{"error":{"message":"quota"}}"#)]
    );
}

#[tokio::test]
async fn a_stream_past_the_bound_is_broken() {
    // The log's bound.
    let one = event(r#"{"n":1}"#).len();
    let (log, writer) = super::chat_log(2 * one);
    let raw = "data: {\"n\":1}\n\n".repeat(3);
    let summary = relay(body(vec![bytes(&raw)]), writer, STALL).await;
    assert_eq!(
        broken(&summary),
        &BrokenStream::TooLarge { max_bytes: 2 * one }
    );
    assert_ends_with_error(&summary, &log);

    // The raw body's bound: one endless line never becomes an event, yet is cut.
    let (log, writer) = super::chat_log(1024);
    let line = vec![Bytes::from(vec![b'x'; 600]); 3];
    let summary = relay(body(line), writer, STALL).await;
    assert_eq!(
        broken(&summary),
        &BrokenStream::TooLarge { max_bytes: 1024 }
    );
    assert_ends_with_error(&summary, &log);
}

/// Generated SSE is made of these pieces.
fn sse_piece() -> impl Strategy<Value = Vec<u8>> {
    let piece = |bytes: &[u8]| Just(bytes.to_vec());
    prop_oneof![
        // Whole events, so that generated streams often relay something and end in [DONE].
        4 => piece(b"data: {\"a\":1}\n\n"),
        2 => piece(b"data:{\"choices\":[],\"usage\":null}\r\n\r\n"),
        1 => piece(b"data: [DONE]\n\n"),
        1 => piece(b": ping\n\n"),
        // Pieces the grammar cares about, and noise.
        1 => piece(b"data:"),
        1 => piece(b"data: "),
        1 => piece(b"event: error"),
        1 => piece(b"id: 1"),
        1 => piece(b"retry: 5"),
        1 => piece(b": comment"),
        1 => piece(b"\n"),
        1 => piece(b"\r"),
        1 => piece(b"\r\n"),
        1 => piece(b"\n\n"),
        1 => piece(b"[DONE]"),
        1 => piece(b"{\"a\":1}"),
        1 => piece(b"\xEF\xBB\xBF"),
        1 => piece("é日本".as_bytes()),
        2 => proptest::collection::vec(any::<u8>(), 0..8),
    ]
}

fn sse_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(sse_piece(), 0..40).prop_map(|pieces| pieces.concat()),
        proptest::collection::vec(any::<u8>(), 0..200),
    ]
}

/// `bytes` cut at the given points (taken modulo its length, in order).
fn split(bytes: &[u8], cuts: &[usize]) -> Vec<Bytes> {
    let mut points: Vec<usize> = cuts.iter().map(|cut| cut % (bytes.len() + 1)).collect();
    points.sort_unstable();
    let mut chunks = Vec::new();
    let mut start = 0;
    for point in points {
        chunks.push(Bytes::copy_from_slice(&bytes[start..point]));
        start = point;
    }
    chunks.push(Bytes::copy_from_slice(&bytes[start..]));
    chunks
}

/// What the parser makes of the chunks: its events (or error message), in order.
fn parse(chunks: Vec<Bytes>) -> Vec<Result<sse_stream::Sse, String>> {
    futures::executor::block_on(
        sse_stream::SseByteStream::new(body(chunks))
            .map(|item| item.map_err(|error| error.to_string()))
            .collect(),
    )
}

/// What the relay makes of the chunks: the log's events and the outcome.
fn relayed(chunks: Vec<Bytes>) -> (Vec<Bytes>, RelayOutcome) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    let summary = runtime.block_on(async {
        let (_log, writer) = super::chat_log(1 << 16);
        relay(body(chunks), writer, STALL).await
    });
    (summary.events, summary.outcome)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn parsing_never_panics_and_ignores_where_the_bytes_were_split(
        bytes in sse_bytes(),
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
    ) {
        let whole = parse(vec![Bytes::copy_from_slice(&bytes)]);
        let bytewise = parse(bytes.iter().map(|b| Bytes::copy_from_slice(&[*b])).collect());
        let cut = parse(split(&bytes, &cuts));
        prop_assert_eq!(&whole, &bytewise);
        prop_assert_eq!(&whole, &cut);
    }

    #[test]
    fn relaying_never_panics_and_ignores_where_the_bytes_were_split(
        bytes in sse_bytes(),
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
    ) {
        let whole = relayed(vec![Bytes::copy_from_slice(&bytes)]);
        let cut = relayed(split(&bytes, &cuts));
        prop_assert_eq!(&whole, &cut);
        // Whatever came in, the log ends with [DONE] or an error event, and every event is
        // one frame in corral's framing.
        let last = whole.0.last().expect("a terminal event");
        prop_assert!(last == DONE_EVENT || json_of(last).is_some_and(|e| e.get("error").is_some()));
        for event in &whole.0 {
            prop_assert!(event.starts_with(b"data: ") && event.ends_with(b"\n\n"));
        }
    }

    #[test]
    fn relayed_events_reparse_to_the_same_json(
        values in proptest::collection::vec(any::<(u32, String, bool)>(), 0..10),
    ) {
        let chunks: Vec<serde_json::Value> = values
            .iter()
            .map(|(n, text, flag)| json!({"n": n, "text": text, "flag": flag, "usage": null}))
            .collect();
        let mut raw = String::new();
        for chunk in &chunks {
            raw.push_str(&format!("data: {chunk}\r\n\r\n"));
        }
        raw.push_str("data: [DONE]\n\n");
        let (events, outcome) = relayed(vec![bytes(&raw)]);
        prop_assert_eq!(outcome, RelayOutcome::Completed);
        let reparsed: Vec<_> = events.iter().filter_map(|e| json_of(e)).collect();
        prop_assert_eq!(reparsed, chunks);
    }
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_drips_past_its_total_deadline_is_broken_though_it_never_stalls() {
    // One event every 2 s, for ever: never a stall under a 30 s stall timeout.
    let drip = futures::stream::unfold(0u32, |n| async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let chunk = Bytes::from(format!("data: {{\"n\":{n}}}\n\n"));
        Some((Ok::<_, std::io::Error>(chunk), n + 1))
    });
    let (log, writer) = super::chat_log(1 << 20);
    let reader = log.reader(crate::sse::CallerUsage::Asked);
    let started = tokio::time::Instant::now();
    let summary = crate::sse::relay_until(drip, writer, STALL, Some(Duration::from_secs(5))).await;
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(5),
        "ends at the deadline"
    );
    assert_eq!(
        broken(&summary),
        &BrokenStream::DeadlineExceeded(Duration::from_secs(5))
    );
    assert_eq!(summary.events.len(), 3, "two events, then the error event");
    assert_ends_with_error(&summary, &log);
    let events: Vec<_> = reader.into_stream().map(Result::unwrap).collect().await;
    assert_eq!(events, summary.events, "the reader got the error event too");
}

/// Two events after `thinking` of silence, the second `gap` after the first, then `[DONE]`.
fn thinking_body(
    thinking: Duration,
    gap: Duration,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> {
    futures::stream::iter([
        (thinking, "data: {\"n\":1}\n\n"),
        (gap, "data: {\"n\":2}\n\n"),
        (Duration::ZERO, "data: [DONE]\n\n"),
    ])
    .then(|(pause, chunk)| async move {
        tokio::time::sleep(pause).await;
        Ok(Bytes::from_static(chunk.as_bytes()))
    })
}

/// The shipped defaults: a model may think for up to 10 minutes before its
/// first event, and a stream then goes on as long as no gap between events
/// passes `stream_stall_timeout`, within the 10-minute request bound.
#[tokio::test(start_paused = true)]
async fn the_shipped_defaults_let_a_model_think_for_minutes_but_not_fall_silent() {
    let defaults = crate::config::Config::load(crate::config::EMBEDDED_DEFAULT, [])
        .expect("the shipped config");
    let silence = crate::sse::Silence {
        first_event: defaults.coalesce.first_event_timeout,
        between_events: defaults.coalesce.stream_stall_timeout,
    };
    let total = Some(defaults.upstreams[0].request_timeout);
    let relay = |thinking: Duration, gap: Duration| async move {
        let (_log, writer) = super::chat_log(1 << 20);
        crate::sse::relay_until(thinking_body(thinking, gap), writer, silence, total).await
    };
    let thought = relay(Duration::from_secs(9 * 60), Duration::from_secs(5)).await;
    assert_eq!(
        thought.outcome,
        RelayOutcome::Completed,
        "9 minutes of thinking"
    );
    let too_long = relay(Duration::from_secs(11 * 60), Duration::from_secs(5)).await;
    assert_eq!(
        broken(&too_long),
        &BrokenStream::DeadlineExceeded(Duration::from_secs(600)),
        "past the 10-minute request bound"
    );
    let fell_silent = relay(Duration::from_secs(5), Duration::from_secs(61)).await;
    assert_eq!(
        broken(&fell_silent),
        &BrokenStream::Stalled(Duration::from_secs(60)),
        "silent for longer than the stall bound after it began"
    );
}
