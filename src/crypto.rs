//! Encryption of the values corral keeps in Redis (`redis.encryption_key_env`).
//!
//! XChaCha20-Poly1305 (RustCrypto `chacha20poly1305`): its 192-bit nonces can be
//! drawn at random for every write without a birthday bound worth counting,
//! which AES-GCM's 96-bit nonces cannot promise over billions of cache writes.
//! The Redis key is the associated data, so a value copied or renamed to
//! another key fails to open, like a value sealed under another (rotated) key.
//! Either is a clean, counted cache miss, never an error a caller sees.
//!
//! Layout: `magic (4) | key id (4) | nonce (24) | ciphertext + tag (16)`. The
//! key id (the first bytes of SHA-256 of the key) only tells a rotation apart
//! from tampering in the logs; it is no secret.

use chacha20poly1305::{
    Key, KeyInit, XChaCha20Poly1305, XNonce,
    aead::{Aead, Payload},
};
use rand::RngCore;
use sha2::{Digest, Sha256};

const MAGIC: &[u8; 4] = b"CRE\x01";
const KEY_ID_LEN: usize = 4;
const NONCE_LEN: usize = 24;
const HEADER_LEN: usize = MAGIC.len() + KEY_ID_LEN + NONCE_LEN;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    #[error("value is not encrypted (written before encryption was turned on?)")]
    NotSealed,
    #[error("value was sealed under another key (rotated?)")]
    OtherKey,
    #[error("value does not authenticate (tampered, truncated or moved to another key)")]
    Forged,
}

/// Seals and opens Redis values under one 32-byte key.
pub struct Sealer {
    cipher: XChaCha20Poly1305,
    key_id: [u8; KEY_ID_LEN],
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sealer(key id {})", hex::encode(self.key_id))
    }
}

impl Sealer {
    pub fn new(key: &[u8; 32]) -> Self {
        let digest = Sha256::digest(key);
        let mut key_id = [0u8; KEY_ID_LEN];
        key_id.copy_from_slice(&digest[..KEY_ID_LEN]);
        Self {
            cipher: XChaCha20Poly1305::new(Key::from_slice(key)),
            key_id,
        }
    }

    /// Parses the key as 64 hex digits (`openssl rand -hex 32`).
    pub fn parse_key(text: &str) -> Result<[u8; 32], String> {
        let mut key = [0u8; 32];
        hex::decode_to_slice(text.trim(), &mut key).map_err(|_| {
            "must be 64 hex digits (32 bytes), e.g. from `openssl rand -hex 32`".to_owned()
        })?;
        Ok(key)
    }

    pub fn seal(&self, aad: &[u8], plaintext: &[u8]) -> Vec<u8> {
        let mut nonce = [0u8; NONCE_LEN];
        rand::rng().fill_bytes(&mut nonce);
        let ciphertext = self
            .cipher
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: plaintext,
                    aad,
                },
            )
            .expect("XChaCha20-Poly1305 encrypts any length corral writes");
        let mut out = Vec::with_capacity(HEADER_LEN + ciphertext.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.key_id);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&ciphertext);
        out
    }

    /// Never panics, whatever the bytes.
    pub fn open(&self, aad: &[u8], sealed: &[u8]) -> Result<Vec<u8>, OpenError> {
        if sealed.len() < HEADER_LEN || &sealed[..MAGIC.len()] != MAGIC {
            return Err(OpenError::NotSealed);
        }
        let key_id = &sealed[MAGIC.len()..MAGIC.len() + KEY_ID_LEN];
        let nonce = &sealed[MAGIC.len() + KEY_ID_LEN..HEADER_LEN];
        let opened = self.cipher.decrypt(
            XNonce::from_slice(nonce),
            Payload {
                msg: &sealed[HEADER_LEN..],
                aad,
            },
        );
        match opened {
            Ok(plaintext) => Ok(plaintext),
            Err(_) if key_id != self.key_id => Err(OpenError::OtherKey),
            Err(_) => Err(OpenError::Forged),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn round_trips_and_binds_the_key_name() {
        let sealer = Sealer::new(&[7; 32]);
        let sealed = sealer.seal(b"corral:v1:t:resp:{ab}", b"the answer");
        assert_eq!(
            sealer.open(b"corral:v1:t:resp:{ab}", &sealed).unwrap(),
            b"the answer"
        );
        assert_eq!(
            sealer.open(b"corral:v1:t:resp:{cd}", &sealed),
            Err(OpenError::Forged)
        );
        assert_eq!(
            Sealer::new(&[8; 32]).open(b"corral:v1:t:resp:{ab}", &sealed),
            Err(OpenError::OtherKey)
        );
        assert_eq!(
            sealer.open(b"k", b"CRL\x01plaintext"),
            Err(OpenError::NotSealed)
        );
        let mut flipped = sealed.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(
            sealer.open(b"corral:v1:t:resp:{ab}", &flipped),
            Err(OpenError::Forged)
        );
        assert!(
            !sealed.windows(10).any(|w| w == b"the answer"),
            "no plaintext in the sealed bytes"
        );
    }

    #[test]
    fn keys_parse_from_hex_only() {
        assert_eq!(Sealer::parse_key(&"ab".repeat(32)).unwrap(), [0xab; 32]);
        assert!(Sealer::parse_key("short").is_err());
        assert!(Sealer::parse_key(&"zz".repeat(32)).is_err());
    }

    proptest! {
        #[test]
        fn opening_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let sealer = Sealer::new(&[1; 32]);
            prop_assert!(sealer.open(b"k", &bytes).is_err());
        }
    }
}
