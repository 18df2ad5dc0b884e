//! The record as the storage layer sees it: key, value, headers, timestamp, flags.
//!
//! Fields are `Bytes` so that a record read from disk can point into the chunk it was read from,
//! and a record handed to `append` can be encoded without copying it into a new allocation first.

use bytes::Bytes;

/// One log record. The offset is not part of it: the segment assigns offsets on append.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// `None` is a record without a key; `Some(empty)` is a record with the empty key.
    pub key: Option<Bytes>,
    pub value: Bytes,
    /// Header names and values, in the producer's order; duplicate names are kept.
    pub headers: Vec<(Bytes, Bytes)>,
    /// Producer-supplied milliseconds since the Unix epoch, stored and returned unchanged.
    pub timestamp_ms: u64,
    /// A tombstone marks a deletion for compacting readers; storage treats it as opaque.
    pub tombstone: bool,
}

impl Record {
    /// A keyed record with no headers.
    pub fn keyed(key: impl Into<Bytes>, value: impl Into<Bytes>, timestamp_ms: u64) -> Record {
        Record {
            key: Some(key.into()),
            value: value.into(),
            headers: Vec::new(),
            timestamp_ms,
            tombstone: false,
        }
    }

    /// The bytes a user handed us: key, value, header names and values. Limits are counted in these.
    pub fn user_bytes(&self) -> u64 {
        let key_bytes = self.key.as_ref().map_or(0, |key| key.len() as u64);
        let header_bytes: u64 =
            self.headers.iter().map(|(name, value)| (name.len() + value.len()) as u64).sum();
        key_bytes + self.value.len() as u64 + header_bytes
    }
}

/// A record read back from a segment, with the offset the segment assigned to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredRecord {
    pub offset: u64,
    pub record: Record,
}
