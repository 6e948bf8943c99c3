//! Opening an encrypted Redis value: any bytes are refused without a panic
//! (a forgery cannot authenticate).
#![no_main]

use corral::crypto::Sealer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let sealer = Sealer::new(&[7; 32]);
    assert!(sealer.open(b"corral:v1:global:resp:{fuzz}", data).is_err());
});
