//! The `usage` a relayed JSON answer reports (an image generation's, a
//! transcription's), read as the body streams past without holding it: the
//! answer is relayed as it came, however large (a few images in base64 are
//! megabytes), and only the top-level `usage` member's bytes are kept,
//! bounded. OpenAI sends `usage` after the image data, so the whole body is
//! scanned; the scan is a small state machine over the JSON's structure
//! (strings, escapes, nesting), which never fails and never panics: a
//! malformed body simply reports no usage.

use crate::usage::Usage;

/// Longest `usage` value kept; a longer one is not a usage object anyone sends.
const MAX_USAGE_BYTES: usize = 4096;

/// The key looked for at the top level.
const USAGE_KEY: &[u8] = b"usage";

/// See the module documentation. Feed it every chunk in order, then ask
/// [`usage`](Self::usage).
#[derive(Debug, Default)]
pub(super) struct UsageScan {
    /// Open objects and arrays around the current byte.
    depth: usize,
    in_string: bool,
    escaped: bool,
    /// At the top level, the next string is a member's name.
    expect_key: bool,
    /// The top-level member name being read (`None`: not reading one, or
    /// longer than `usage`).
    key: Option<Vec<u8>>,
    /// The member name just read was `usage`: its value follows the colon.
    usage_named: bool,
    /// The `usage` value being read.
    capture: Option<Vec<u8>>,
    /// The last complete top-level `usage` value.
    found: Option<Vec<u8>>,
}

impl UsageScan {
    pub(super) fn feed(&mut self, chunk: &[u8]) {
        for &byte in chunk {
            self.step(byte);
        }
    }

    fn step(&mut self, byte: u8) {
        if self.in_string {
            self.keep(byte);
            // The name's bytes, but not its closing quote; one past `usage`
            // is enough to tell it is not `usage`.
            if let Some(key) = &mut self.key
                && (byte != b'"' || self.escaped)
                && key.len() <= USAGE_KEY.len()
            {
                key.push(byte);
            }
            if self.escaped {
                self.escaped = false;
            } else if byte == b'\\' {
                self.escaped = true;
            } else if byte == b'"' {
                self.in_string = false;
                if let Some(key) = self.key.take() {
                    self.usage_named = key == USAGE_KEY;
                }
            }
            return;
        }
        match byte {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.expect_key {
                    self.expect_key = false;
                    self.key = Some(Vec::new());
                }
                self.keep(byte);
            }
            b'{' | b'[' => {
                self.keep(byte);
                self.depth = self.depth.saturating_add(1);
                if self.depth == 1 && byte == b'{' {
                    self.expect_key = true;
                }
            }
            b'}' | b']' => {
                if self.depth == 1 {
                    self.end_value();
                } else {
                    self.keep(byte);
                }
                self.depth = self.depth.saturating_sub(1);
            }
            b',' if self.depth == 1 => {
                self.end_value();
                self.expect_key = true;
            }
            b':' if self.depth == 1 && self.usage_named => {
                self.usage_named = false;
                self.capture = Some(Vec::new());
            }
            _ => self.keep(byte),
        }
    }

    /// Adds `byte` to the `usage` value being read, if any; a value past the
    /// bound is dropped.
    fn keep(&mut self, byte: u8) {
        if let Some(capture) = &mut self.capture {
            if capture.len() < MAX_USAGE_BYTES {
                capture.push(byte);
            } else {
                self.capture = None;
            }
        }
    }

    /// A top-level value ended (at a `,` or the closing brace).
    fn end_value(&mut self) {
        self.usage_named = false;
        if let Some(value) = self.capture.take() {
            self.found = Some(value);
        }
    }

    /// The usage the body reported, if it reported one in a shape
    /// `Usage::from_body` reads.
    pub(super) fn usage(&self) -> Option<Usage> {
        let value = self.found.as_ref()?;
        let mut body = Vec::with_capacity(value.len() + 10);
        body.extend_from_slice(b"{\"usage\":");
        body.extend_from_slice(value);
        body.push(b'}');
        Usage::from_body(&body)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn scanned(chunks: &[&[u8]]) -> Option<Usage> {
        let mut scan = UsageScan::default();
        for chunk in chunks {
            scan.feed(chunk);
        }
        scan.usage()
    }

    const IMAGE: &str = r#"{"created":1,"data":[{"b64_json":"aGk=","revised_prompt":"a \"usage\": {\"input_tokens\": 1}, } ] \\"}],"usage":{"input_tokens":50,"input_tokens_details":{"image_tokens":0,"text_tokens":50},"output_tokens":4160,"total_tokens":4210}}"#;

    #[test]
    fn the_top_level_usage_is_read_past_strings_that_look_like_one() {
        let usage = scanned(&[IMAGE.as_bytes()]).unwrap();
        assert_eq!((usage.prompt_tokens, usage.completion_tokens), (50, 4160));
        let chat = br#"{"id":"x","usage":{"prompt_tokens":3,"completion_tokens":5},"z":1}"#;
        let usage = scanned(&[chat]).unwrap();
        assert_eq!((usage.prompt_tokens, usage.completion_tokens), (3, 5));
    }

    #[test]
    fn a_nested_usage_or_none_or_a_broken_body_reports_nothing() {
        for body in [
            r#"{"data":[{"usage":{"input_tokens":1}}]}"#,
            r#"{"text":"no usage here"}"#,
            r#"{"usage":null}"#,
            r#"[{"usage":{"input_tokens":1}}]"#,
            r#"{"usage":{"input_tokens":1"#,
            r#"{"usagex":{"input_tokens":1}}"#,
            r#"{"xusage":{"input_tokens":1}}"#,
            "\u{0}\u{ff}{{{{]]]]\"\\",
            "",
        ] {
            assert!(scanned(&[body.as_bytes()]).is_none(), "{body}");
        }
        let long = format!(
            r#"{{"usage":{{"input_tokens":1,"pad":"{}"}}}}"#,
            "x".repeat(MAX_USAGE_BYTES)
        );
        assert!(scanned(&[long.as_bytes()]).is_none(), "bounded");
    }

    proptest! {
        /// However the body is cut into chunks, the scan reads the same usage.
        #[test]
        fn chunking_never_changes_the_usage(cuts in proptest::collection::vec(0..IMAGE.len(), 0..8)) {
            let body = IMAGE.as_bytes();
            let mut cuts = cuts;
            cuts.sort_unstable();
            let mut chunks = Vec::new();
            let mut at = 0;
            for cut in cuts {
                chunks.push(&body[at..cut]);
                at = cut;
            }
            chunks.push(&body[at..]);
            let usage = scanned(&chunks).unwrap();
            prop_assert_eq!((usage.prompt_tokens, usage.completion_tokens), (50, 4160));
        }

        /// Any bytes at all: no panic.
        #[test]
        fn any_bytes_are_scanned_without_panic(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = scanned(&[&body]);
        }
    }
}
