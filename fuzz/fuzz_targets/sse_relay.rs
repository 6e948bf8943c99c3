//! The SSE parser and relay: any provider body, cut into chunks anywhere,
//! ends the log (complete or failed) with only whole `data: ...\n\n` events.
#![no_main]

use std::time::Duration;

use bytes::Bytes;
use corral::sse::{StreamLog, relay};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, body)) = data.split_first() else {
        return;
    };
    let step = usize::from(cut).max(1);
    let chunks: Vec<Result<Bytes, std::io::Error>> = body
        .chunks(step)
        .map(|chunk| Ok(Bytes::copy_from_slice(chunk)))
        .collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let summary = runtime.block_on(async {
        let (_log, writer) = StreamLog::new(64 * 1024);
        relay(futures::stream::iter(chunks), writer, Duration::from_secs(5)).await
    });
    for event in &summary.events {
        assert!(event.starts_with(b"data: ") && event.ends_with(b"\n\n"));
    }
});
