//! The input checks: any bytes are accepted or refused, never a panic.
#![no_main]

use corral::{
    fingerprint::Endpoint,
    validate::{InputLimits, check_fields, parse_json},
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = InputLimits { max_json_depth: 16, max_messages: 8 };
    if let Ok(serde_json::Value::Object(body)) = parse_json(data, limits) {
        let _ = check_fields(Endpoint::ChatCompletions, &body, limits);
    }
});
