//! The normalizer: any JSON object canonicalizes without panicking, to valid
//! JSON, and canonicalizing that again changes nothing.
#![no_main]

use corral::fingerprint::{Normalization, canonical_body};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(serde_json::Value::Object(body)) = serde_json::from_slice(data) else {
        return;
    };
    for case_fold in [false, true] {
        let normalization = Normalization {
            case_fold,
            ..Normalization::default()
        };
        let canonical = canonical_body(&body, normalization);
        let again: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&canonical).expect("canonical bodies are JSON objects");
        assert_eq!(canonical_body(&again, normalization), canonical);
    }
});
