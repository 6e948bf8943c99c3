//! Tenant identity, the vocabulary every layer shares: the server secret that
//! keys tenant scopes ([`TenantKey`]), the scope itself ([`TenantScope`]) and
//! the hash gateway keys are kept as ([`key_hash`]). A leaf: it imports nothing
//! of the gateway, so the config, auth, the fingerprint and storage can all
//! use it without depending on each other.

use std::{fmt, sync::Arc};

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// The server secret tenant scopes are keyed with.
#[derive(Clone)]
pub struct TenantKey(Hmac<Sha256>);

impl TenantKey {
    pub fn new(secret: &[u8]) -> Self {
        // HMAC takes a key of any length; this cannot fail.
        Self(Hmac::new_from_slice(secret).expect("HMAC accepts any key length"))
    }

    /// HMAC-SHA-256(secret, domain || credential).
    pub fn mac(&self, credential: &[u8]) -> [u8; 32] {
        let mut mac = self.0.clone();
        mac.update(b"corral-tenant-v2\0");
        mac.update(credential);
        mac.finalize().into_bytes().into()
    }
}

impl fmt::Debug for TenantKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TenantKey([redacted])")
    }
}

/// SHA-256 of a gateway key, the form `auth.keys` holds.
pub fn key_hash(key: &[u8]) -> [u8; 32] {
    Sha256::digest(key).into()
}

/// Whose cache an entry belongs to: a hash of the caller's credential, or the
/// one shared scope. Never the credential itself.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TenantScope(Arc<str>);

impl TenantScope {
    pub const GLOBAL: &'static str = "global";

    /// Scope of a caller identified by `credential` (its bearer token, as raw
    /// bytes so a non-ASCII token is still its own tenant); callers without one
    /// share the anonymous scope.
    ///
    /// With the server's [`TenantKey`] the scope is an HMAC of the credential
    /// (`k…`): unlinkable to the key without the secret. Without one it is the
    /// salted SHA-256 of earlier versions (`t…`, the pinned golden
    /// fingerprints), which anyone holding a guessed key can recompute.
    pub fn of_credential(key: Option<&TenantKey>, credential: Option<&[u8]>) -> Self {
        match (key, credential) {
            (Some(key), Some(token)) => Self::tagged(b'k', &key.mac(token)),
            (None, Some(token)) => {
                let digest = Sha256::new()
                    .chain_update(b"corral-tenant-v1\0")
                    .chain_update(token)
                    .finalize();
                Self::tagged(b't', &digest)
            }
            (_, None) => {
                // Every caller without a credential: one allocation per process.
                static ANONYMOUS: std::sync::LazyLock<TenantScope> =
                    std::sync::LazyLock::new(|| TenantScope("anonymous".into()));
                ANONYMOUS.clone()
            }
        }
    }

    /// `tag` and the first 16 bytes of `digest` in hex (every request pays for it).
    fn tagged(tag: u8, digest: &[u8]) -> Self {
        let mut text = [0u8; 33];
        text[0] = tag;
        hex::encode_to_slice(&digest[..16], &mut text[1..]).expect("32 hex digits for 16 bytes");
        Self(
            std::str::from_utf8(&text)
                .expect("a tag byte and hex digits are ASCII")
                .into(),
        )
    }

    /// The one shared scope: one allocation per process, cloned (every
    /// request under `cache.scope: global` takes it).
    pub fn global() -> Self {
        static GLOBAL: std::sync::LazyLock<TenantScope> =
            std::sync::LazyLock::new(|| TenantScope(TenantScope::GLOBAL.into()));
        GLOBAL.clone()
    }

    /// Rebuilds a scope read back from storage (a Redis entry's header).
    pub fn from_stored(text: &str) -> Self {
        Self(text.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for TenantScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TenantScope({})", self.0)
    }
}
