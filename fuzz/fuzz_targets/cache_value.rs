//! The Redis value decoder: any bytes decode or are rejected, never a panic,
//! and whatever decodes re-encodes to a value that decodes the same.
#![no_main]

use corral::{
    cache::codec::{decode_entry, decode_record, encode_entry, encode_record},
    fingerprint::{CacheKey, Endpoint, Fingerprint, KeyInput, TenantScope},
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let scope = TenantScope::global();
    let fingerprint = Fingerprint::of(&KeyInput {
        endpoint: Endpoint::ChatCompletions,
        upstream: "fuzz",
        scope: &scope,
        headers: &[],
        query: &[],
        body: b"{}",
    });
    let key = CacheKey { scope, fingerprint };
    if let Ok(entry) = decode_entry(data, &key) {
        let again = decode_entry(&encode_entry(&key, &entry), &key).expect("round trip");
        assert_eq!(again.response.body, entry.response.body);
    }
    if let Ok(record) = decode_record(data, &key) {
        let again = decode_record(&encode_record(&key, &record), &key).expect("round trip");
        assert_eq!(again.token, record.token);
    }
});
