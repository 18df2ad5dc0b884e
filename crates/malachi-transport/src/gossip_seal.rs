//! Sealed gossip: every SWIM datagram between brokers is encrypted and authenticated with
//! AES-256-GCM under a key derived from the cluster's join token, as Serf and memberlist seal
//! theirs with a shared key. A datagram that does not open under one of the broker's keys
//! (forged, altered, of another cluster, or plain) is dropped before membership reads it.
//!
//! Layout: `version` u8 (1), a 12-byte random nonce, then the ciphertext and its 16-byte tag.
//! The associated data is [`ASSOCIATED_DATA`], so a sealed datagram is not valid as anything
//! else sealed with the same key.
//!
//! Rotation: a broker opens datagrams under each of its keys (the token in its data directory,
//! and `MALACHI_CLUSTER_TOKEN` when that differs) and seals under the first, so brokers can move
//! to a new token one restart at a time while both are accepted.

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use hmac::{KeyInit, Mac};

/// The layout this file describes.
pub const SEAL_VERSION: u8 = 1;
/// Bytes a sealed datagram adds to the plain one: version, nonce, tag.
pub const SEAL_OVERHEAD_BYTES: usize = 1 + NONCE_LEN + 16;
/// What each sealed datagram is bound to besides its key.
pub const ASSOCIATED_DATA: &[u8] = b"malachi gossip v1";
/// The label under which the gossip key is derived from a token.
const KEY_LABEL: &[u8] = b"malachi gossip key v1";

/// The keys a broker seals and opens gossip with; the first seals.
pub struct GossipSeal {
    keys: Vec<LessSafeKey>,
}

impl std::fmt::Debug for GossipSeal {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("GossipSeal").field("keys", &self.keys.len()).finish()
    }
}

impl GossipSeal {
    /// Keys derived from `tokens` (at least one; duplicates are kept once).
    pub fn from_tokens(tokens: &[&str]) -> GossipSeal {
        assert!(!tokens.is_empty(), "a seal needs a key");
        let mut seen: Vec<[u8; 32]> = Vec::new();
        for token in tokens {
            let key = derive_key(token);
            if !seen.contains(&key) {
                seen.push(key);
            }
        }
        let keys = seen
            .iter()
            .map(|key| LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).expect("a 32-byte key")))
            .collect();
        GossipSeal { keys }
    }

    /// `datagram`, sealed under the first key with `nonce` (random, never reused: 96 random
    /// bits per datagram).
    pub fn seal(&self, datagram: &[u8], nonce: [u8; NONCE_LEN]) -> Vec<u8> {
        let mut out = Vec::with_capacity(datagram.len() + SEAL_OVERHEAD_BYTES);
        out.push(SEAL_VERSION);
        out.extend_from_slice(&nonce);
        let mut body = datagram.to_vec();
        self.keys[0]
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(ASSOCIATED_DATA),
                &mut body,
            )
            .expect("sealing a datagram-sized buffer");
        out.extend_from_slice(&body);
        out
    }

    /// `datagram`, sealed under the first key with a nonce from the operating system's
    /// random source.
    pub fn seal_random(&self, datagram: &[u8]) -> Vec<u8> {
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).expect("the operating system's random source");
        self.seal(datagram, nonce)
    }

    /// The plain datagram, if `sealed` opens under one of the keys.
    pub fn open(&self, sealed: &[u8]) -> Option<Vec<u8>> {
        let (&version, rest) = sealed.split_first()?;
        if version != SEAL_VERSION || rest.len() < NONCE_LEN + 16 {
            return None;
        }
        let (nonce, body) = rest.split_at(NONCE_LEN);
        let nonce: [u8; NONCE_LEN] = nonce.try_into().expect("split at the nonce's length");
        self.keys.iter().find_map(|key| {
            let mut buffer = body.to_vec();
            let plain = key
                .open_in_place(
                    Nonce::assume_unique_for_key(nonce),
                    Aad::from(ASSOCIATED_DATA),
                    &mut buffer,
                )
                .ok()?;
            Some(plain.to_vec())
        })
    }
}

/// The gossip key of a token: HMAC-SHA256 keyed by the token over a fixed label.
fn derive_key(token: &str) -> [u8; 32] {
    let mut mac =
        hmac::Hmac::<sha2::Sha256>::new_from_slice(token.as_bytes()).expect("any key length");
    mac.update(KEY_LABEL);
    mac.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "a-cluster-token-of-32-characters!";
    const OTHER: &str = "another-cluster-token-of-32-chars";

    #[test]
    fn a_sealed_datagram_opens_only_unaltered_and_under_its_key() {
        let seal = GossipSeal::from_tokens(&[TOKEN]);
        let sealed = seal.seal(b"ping from 2", [7; NONCE_LEN]);
        assert_eq!(sealed.len(), b"ping from 2".len() + SEAL_OVERHEAD_BYTES);
        assert_eq!(seal.open(&sealed).as_deref(), Some(&b"ping from 2"[..]));
        // Every single-bit change of every byte is refused.
        for at in 0..sealed.len() {
            let mut altered = sealed.clone();
            altered[at] ^= 1;
            assert_eq!(seal.open(&altered), None, "a change at byte {at} was accepted");
        }
        for cut in 0..sealed.len() {
            assert_eq!(seal.open(&sealed[..cut]), None, "a datagram cut to {cut} was accepted");
        }
        // Another cluster's key, and a plain datagram, are refused.
        assert_eq!(GossipSeal::from_tokens(&[OTHER]).open(&sealed), None);
        assert_eq!(seal.open(b"ping from 2"), None);
    }

    #[test]
    fn during_a_rotation_both_keys_open_and_the_first_seals() {
        let old = GossipSeal::from_tokens(&[TOKEN]);
        let rotating = GossipSeal::from_tokens(&[OTHER, TOKEN]);
        let new = GossipSeal::from_tokens(&[OTHER]);
        let from_old = old.seal(b"a", [1; NONCE_LEN]);
        let from_rotating = rotating.seal(b"b", [2; NONCE_LEN]);
        assert_eq!(rotating.open(&from_old).as_deref(), Some(&b"a"[..]));
        assert_eq!(new.open(&from_rotating).as_deref(), Some(&b"b"[..]));
        assert_eq!(old.open(&from_rotating), None, "the rotating broker seals under the new key");
        assert_eq!(GossipSeal::from_tokens(&[TOKEN, TOKEN]).keys.len(), 1);
    }
}
