//! Opaque cursors: a reader's position in a topic, minted and verified by the broker.
//!
//! A cursor is a frontier over the topic's range history: for every range it names, either the
//! next range-wide offset to read or "drained". Together its entries tile the keyspace. When a
//! sealed range is drained, its children replace it once all of their parents are drained,
//! which is what lets a cursor minted before a split or merge keep reading in order after it.
//!
//! Bytes (all big-endian), then the tag, then unpadded URL-safe base64:
//!
//! | field | type |
//! |---|---|
//! | version | u8 = 1 |
//! | topic_id | u64 |
//! | entry_count | u16, at most [`CURSOR_ENTRIES_MAX`], equal to the entries that follow |
//! | entries | entry_count × (`range_id` u32, `offset` u64; `u64::MAX` = drained), sorted by range |
//! | tag | first 16 bytes of HMAC-SHA256(secret, everything above) |
//!
//! Anything that fails to decode, verify or match the topic is `invalid_cursor`; nothing is ever
//! silently restarted.

use malachi_reason::Reason;
use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

pub const CURSOR_VERSION: u8 = 1;
pub const TAG_BYTES: usize = 16;
/// The most entries one cursor holds; bounds its size and its decoding work. Well below the
/// 65,535 its u16 count can say (65,536 entries, the metadata's cap on ranges a topic may ever
/// create, wrapped the count to 0), and small enough that the longest cursor text (256,036
/// bytes) stays under the 262,144 bytes a client of the original accepts (wire-protocol.md
/// section 2.2). A frontier wider than this is refused when minted, never wrapped.
pub const CURSOR_ENTRIES_MAX: usize = 16_000;
const _: () = assert!(CURSOR_ENTRIES_MAX <= u16::MAX as usize, "the count is a u16");
const ENTRY_BYTES: usize = 12;
const HEADER_BYTES: usize = 1 + 8 + 2;
const DRAINED: u64 = u64::MAX;
/// The longest cursor text accepted, checked before decoding anything.
pub const CURSOR_TEXT_BYTES_MAX: usize = text_bytes_bound(CURSOR_ENTRIES_MAX);
const _: () = assert!(CURSOR_TEXT_BYTES_MAX <= 262_144, "the original's clients accept it");

/// The length of a cursor with `entries` entries, rounded up.
pub const fn text_bytes_bound(entries: usize) -> usize {
    (HEADER_BYTES + entries * ENTRY_BYTES + TAG_BYTES).div_ceil(3) * 4
}

/// Where a reader stands in one range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RangePosition {
    /// The next range-wide offset to read.
    At(u64),
    /// Every record of this sealed range has been read.
    Drained,
}

/// A decoded, verified cursor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cursor {
    pub topic_id: u64,
    pub positions: BTreeMap<u32, RangePosition>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CursorError {
    #[error("cursor is longer than {CURSOR_TEXT_BYTES_MAX} bytes")]
    TooLong,
    #[error("cursor is not unpadded URL-safe base64")]
    NotBase64,
    #[error("cursor is truncated or has trailing bytes")]
    BadLength,
    #[error("cursor version {0} is not supported")]
    UnsupportedVersion(u8),
    #[error("cursor was not minted by this cluster")]
    BadTag,
    #[error("cursor belongs to another topic")]
    ForeignTopic,
    #[error("cursor entries are not strictly sorted by range")]
    Unsorted,
    /// On decode, a count above [`CURSOR_ENTRIES_MAX`]; on encode, a frontier wider than it.
    #[error("cursor has more than {CURSOR_ENTRIES_MAX} entries")]
    TooManyEntries,
}

impl CursorError {
    /// Every cursor failure is the same wire reason.
    pub fn reason(&self) -> Reason {
        Reason::InvalidCursor
    }
}

/// Mints and verifies cursors under one secret.
#[derive(Clone)]
pub struct CursorKey {
    secret: [u8; 32],
}

impl std::fmt::Debug for CursorKey {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("CursorKey(..)")
    }
}

impl CursorKey {
    pub fn new(secret: [u8; 32]) -> CursorKey {
        CursorKey { secret }
    }

    /// The secret, for a broker joining the cluster: every broker must check every other's
    /// cursors.
    pub fn secret(&self) -> [u8; 32] {
        self.secret
    }

    /// Mints the text of `cursor`; a frontier of more than [`CURSOR_ENTRIES_MAX`] ranges is
    /// refused rather than given a count that no longer matches its entries.
    pub fn encode(&self, cursor: &Cursor) -> Result<String, CursorError> {
        if cursor.positions.len() > CURSOR_ENTRIES_MAX {
            return Err(CursorError::TooManyEntries);
        }
        let count = u16::try_from(cursor.positions.len()).expect("the limit fits a u16");
        let mut bytes =
            Vec::with_capacity(HEADER_BYTES + cursor.positions.len() * ENTRY_BYTES + TAG_BYTES);
        bytes.push(CURSOR_VERSION);
        bytes.extend_from_slice(&cursor.topic_id.to_be_bytes());
        bytes.extend_from_slice(&count.to_be_bytes());
        for (range_id, position) in &cursor.positions {
            bytes.extend_from_slice(&range_id.to_be_bytes());
            let offset = match position {
                RangePosition::At(offset) => {
                    assert!(*offset != DRAINED, "offset u64::MAX is reserved");
                    *offset
                }
                RangePosition::Drained => DRAINED,
            };
            bytes.extend_from_slice(&offset.to_be_bytes());
        }
        let tag = self.tag(&bytes);
        bytes.extend_from_slice(&tag[..TAG_BYTES]);
        let text = URL_SAFE_NO_PAD.encode(bytes);
        assert!(text.len() <= CURSOR_TEXT_BYTES_MAX, "a minted cursor decodes");
        Ok(text)
    }

    /// Decodes and verifies a cursor for `topic_id`.
    pub fn decode(&self, text: &[u8], topic_id: u64) -> Result<Cursor, CursorError> {
        if text.len() > CURSOR_TEXT_BYTES_MAX {
            return Err(CursorError::TooLong);
        }
        let bytes = URL_SAFE_NO_PAD.decode(text).map_err(|_| CursorError::NotBase64)?;
        if bytes.len() < HEADER_BYTES + TAG_BYTES {
            return Err(CursorError::BadLength);
        }
        let (body, tag) = bytes.split_at(bytes.len() - TAG_BYTES);
        self.verify(body, tag)?;
        if body[0] != CURSOR_VERSION {
            return Err(CursorError::UnsupportedVersion(body[0]));
        }
        let cursor_topic = u64::from_be_bytes(body[1..9].try_into().expect("eight bytes"));
        if cursor_topic != topic_id {
            return Err(CursorError::ForeignTopic);
        }
        let count = u16::from_be_bytes([body[9], body[10]]) as usize;
        if count > CURSOR_ENTRIES_MAX {
            return Err(CursorError::TooManyEntries);
        }
        if body.len() != HEADER_BYTES + count * ENTRY_BYTES {
            return Err(CursorError::BadLength);
        }
        let mut positions = BTreeMap::new();
        let mut previous: Option<u32> = None;
        for entry in body[HEADER_BYTES..].chunks_exact(ENTRY_BYTES) {
            let range_id = u32::from_be_bytes(entry[0..4].try_into().expect("four bytes"));
            let offset = u64::from_be_bytes(entry[4..12].try_into().expect("eight bytes"));
            if previous.is_some_and(|previous| previous >= range_id) {
                return Err(CursorError::Unsorted);
            }
            previous = Some(range_id);
            let position =
                if offset == DRAINED { RangePosition::Drained } else { RangePosition::At(offset) };
            positions.insert(range_id, position);
        }
        Ok(Cursor { topic_id, positions })
    }

    fn tag(&self, body: &[u8]) -> [u8; 32] {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.secret).expect("HMAC takes any key length");
        mac.update(body);
        mac.finalize().into_bytes().into()
    }

    fn verify(&self, body: &[u8], tag: &[u8]) -> Result<(), CursorError> {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.secret).expect("HMAC takes any key length");
        mac.update(body);
        // Constant-time comparison of the truncated tag.
        mac.verify_truncated_left(tag).map_err(|_| CursorError::BadTag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key() -> CursorKey {
        CursorKey::new([7u8; 32])
    }

    fn arb_cursor() -> impl Strategy<Value = Cursor> {
        let position =
            prop_oneof![(0..u64::MAX).prop_map(RangePosition::At), Just(RangePosition::Drained),];
        (any::<u64>(), proptest::collection::btree_map(any::<u32>(), position, 0..20))
            .prop_map(|(topic_id, positions)| Cursor { topic_id, positions })
    }

    #[test]
    fn golden_cursor_is_pinned() {
        let cursor = Cursor {
            topic_id: 3,
            positions: BTreeMap::from([(0, RangePosition::At(5)), (1, RangePosition::Drained)]),
        };
        let text = key().encode(&cursor).unwrap();
        assert_eq!(text, "AQAAAAAAAAADAAIAAAAAAAAAAAAAAAUAAAAB___________tId6ztbZqClXoBcIm5lU2");
        assert!(text.is_ascii());
    }

    #[test]
    fn refusals_are_named() {
        let cursor = Cursor { topic_id: 3, positions: BTreeMap::from([(0, RangePosition::At(5))]) };
        let text = key().encode(&cursor).unwrap();
        let other_key = CursorKey::new([8u8; 32]).encode(&cursor).unwrap();
        let cases: Vec<(Vec<u8>, u64, CursorError)> = vec![
            (b"not base64!".to_vec(), 3, CursorError::NotBase64),
            (b"AAAA".to_vec(), 3, CursorError::BadLength),
            (other_key.into_bytes(), 3, CursorError::BadTag),
            (text.clone().into_bytes(), 4, CursorError::ForeignTopic),
            (text.as_bytes()[..text.len() - 4].to_vec(), 3, CursorError::BadTag),
            (vec![b'A'; CURSOR_TEXT_BYTES_MAX + 1], 3, CursorError::TooLong),
            // The original's cursor format (padded base64 of an Erlang term) is foreign here.
            (b"g3QAAAAA".to_vec(), 3, CursorError::BadLength),
        ];
        for (input, topic, expected) in cases {
            assert_eq!(
                key().decode(&input, topic),
                Err(expected),
                "{:?}",
                String::from_utf8_lossy(&input)
            );
        }
    }

    fn cursor_of(entries: usize) -> Cursor {
        let positions = (0..entries as u32).map(|range| (range, RangePosition::At(1))).collect();
        Cursor { topic_id: 3, positions }
    }

    /// A frontier at the limit round-trips; one range more, or the 65,536 that used to wrap the
    /// u16 count to 0, is refused rather than minted as a cursor that cannot decode.
    #[test]
    fn minting_stops_at_the_entry_limit() {
        let cases = [
            (0, true),
            (1, true),
            (CURSOR_ENTRIES_MAX, true),
            (CURSOR_ENTRIES_MAX + 1, false),
            (usize::from(u16::MAX), false),
            (usize::from(u16::MAX) + 1, false),
        ];
        for (entries, minted) in cases {
            let cursor = cursor_of(entries);
            match key().encode(&cursor) {
                Ok(text) => {
                    assert!(minted, "{entries} entries minted");
                    assert!(text.len() <= CURSOR_TEXT_BYTES_MAX, "{entries}");
                    assert_eq!(key().decode(text.as_bytes(), 3), Ok(cursor), "{entries}");
                }
                Err(error) => {
                    assert!(!minted, "{entries} entries refused");
                    assert_eq!(error, CursorError::TooManyEntries);
                }
            }
        }
    }

    /// Correctly tagged bodies whose count disagrees with their entries (as a forger holding
    /// the key, or a wrapped count, would make them) are refused.
    #[test]
    fn a_count_that_does_not_match_the_entries_is_refused() {
        let tagged = |count: u16, entries: usize| {
            let mut body = vec![CURSOR_VERSION];
            body.extend_from_slice(&3u64.to_be_bytes());
            body.extend_from_slice(&count.to_be_bytes());
            for range in 0..entries as u32 {
                body.extend_from_slice(&range.to_be_bytes());
                body.extend_from_slice(&1u64.to_be_bytes());
            }
            let tag = key().tag(&body);
            body.extend_from_slice(&tag[..TAG_BYTES]);
            URL_SAFE_NO_PAD.encode(body)
        };
        let limit = CURSOR_ENTRIES_MAX as u16;
        let cases = [
            (1, 1, Ok(())),
            (2, 1, Err(CursorError::BadLength)),
            (0, 1, Err(CursorError::BadLength)),
            (limit - 1, usize::from(limit), Err(CursorError::BadLength)),
            (limit + 1, 1, Err(CursorError::TooManyEntries)),
            (u16::MAX, 1, Err(CursorError::TooManyEntries)),
            // What 65,536 entries used to be minted as: a count of 0.
            (0, usize::from(u16::MAX) + 1, Err(CursorError::TooLong)),
        ];
        for (count, entries, expected) in cases {
            let decoded = key().decode(tagged(count, entries).as_bytes(), 3).map(|_| ());
            assert_eq!(decoded, expected, "count {count}, {entries} entries");
        }
    }

    proptest! {
        #[test]
        fn minted_cursors_decode(cursor in arb_cursor()) {
            let text = key().encode(&cursor).unwrap();
            prop_assert!(text.len() <= CURSOR_TEXT_BYTES_MAX);
            prop_assert_eq!(key().decode(text.as_bytes(), cursor.topic_id), Ok(cursor));
        }

        #[test]
        fn any_byte_mutation_is_rejected(cursor in arb_cursor(), at in any::<prop::sample::Index>(), byte in any::<u8>()) {
            let text = key().encode(&cursor).unwrap().into_bytes();
            let at = at.index(text.len());
            prop_assume!(text[at] != byte);
            let mut mutated = text.clone();
            mutated[at] = byte;
            prop_assert!(key().decode(&mutated, cursor.topic_id).is_err());
        }

        #[test]
        fn arbitrary_text_never_panics(text in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = key().decode(&text, 1);
        }
    }
}
