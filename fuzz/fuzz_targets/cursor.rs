//! Fuzzes the broker's cursor decoder, `CursorKey::decode`: the text a client hands back in a
//! fetch, which the broker must verify and parse without trusting any of it.
//!
//! A fuzzer cannot forge the HMAC tag, so most of the input is taken as a cursor *body* and
//! tagged here with the same deterministic secret the key was built from (HMAC-SHA256, first 16
//! bytes, as `cursor.rs` documents the format); that reaches every check behind the tag. The rest
//! of the inputs go in as raw text, which exercises the length and base64 checks.
//!
//! What must hold, whatever the bytes:
//! * a tagged body decodes exactly as the format says: the version, topic, length and order
//!   checks are computed independently here and the decoder must agree on the outcome and, for
//!   a valid body, on every position;
//! * a cursor that decodes re-encodes to the very text it came from (the encoding is canonical,
//!   so two texts never name one cursor);
//! * raw text with no valid tag never decodes.
//!
//! Input: byte 0 picks the mode (bit 0: tag the rest as a body; bit 1: ask for the body's own
//! topic rather than a fixed one), the rest is the body or the text.

#![no_main]

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use libfuzzer_sys::fuzz_target;
use malachi_broker::cursor::{
    CURSOR_ENTRIES_MAX, Cursor, CursorError, CursorKey, RangePosition, TAG_BYTES,
};
use sha2::Sha256;

/// The secret of the key under test, fixed so every run sees the same tags.
const SECRET: [u8; 32] = [0x5a; 32];
/// The topic asked for when the input does not ask for the body's own.
const TOPIC_ID: u64 = 42;
/// Version byte, topic id, entry count.
const HEADER_BYTES: usize = 1 + 8 + 2;
/// Range id, offset.
const ENTRY_BYTES: usize = 4 + 8;

fuzz_target!(|input: &[u8]| {
    let [mode, rest @ ..] = input else {
        return;
    };
    let key = CursorKey::new(SECRET);
    if mode & 1 == 0 {
        let decoded = key.decode(rest, TOPIC_ID);
        assert!(decoded.is_err(), "an untagged text decoded");
        return;
    }
    let topic_id = match rest.get(1..9) {
        Some(topic) if mode & 2 != 0 => u64::from_be_bytes(topic.try_into().expect("8 bytes")),
        _ => TOPIC_ID,
    };
    let text = tagged_text(rest);
    let decoded = key.decode(text.as_bytes(), topic_id);
    assert_eq!(decoded, expected(rest, topic_id), "the decoder disagrees with the format");
    if let Ok(cursor) = decoded {
        assert_eq!(key.encode(&cursor), Ok(text), "the cursor encoding is not canonical");
    }
});

/// `body` with its tag, as the broker would have minted it.
fn tagged_text(body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(&SECRET).expect("HMAC takes any key length");
    mac.update(body);
    let tag = mac.finalize().into_bytes();
    let mut bytes = body.to_vec();
    bytes.extend_from_slice(&tag[..TAG_BYTES]);
    URL_SAFE_NO_PAD.encode(bytes)
}

/// What decoding a correctly tagged `body` must give, from the format's table alone.
fn expected(body: &[u8], topic_id: u64) -> Result<Cursor, CursorError> {
    if body.len() < HEADER_BYTES {
        return Err(CursorError::BadLength);
    }
    if body[0] != 1 {
        return Err(CursorError::UnsupportedVersion(body[0]));
    }
    if body[1..9] != topic_id.to_be_bytes() {
        return Err(CursorError::ForeignTopic);
    }
    let count = usize::from(u16::from_be_bytes([body[9], body[10]]));
    if count > CURSOR_ENTRIES_MAX {
        return Err(CursorError::TooManyEntries);
    }
    if body.len() != HEADER_BYTES + count * ENTRY_BYTES {
        return Err(CursorError::BadLength);
    }
    let mut positions = BTreeMap::new();
    for entry in body[HEADER_BYTES..].chunks(ENTRY_BYTES) {
        let range_id = u32::from_be_bytes(entry[..4].try_into().expect("4 bytes"));
        let offset = u64::from_be_bytes(entry[4..].try_into().expect("8 bytes"));
        if positions.last_key_value().is_some_and(|(last, _)| *last >= range_id) {
            return Err(CursorError::Unsorted);
        }
        let position =
            if offset == u64::MAX { RangePosition::Drained } else { RangePosition::At(offset) };
        positions.insert(range_id, position);
    }
    Ok(Cursor { topic_id, positions })
}
