//! The sparse offset index: derived data that makes a read start near its record.
//!
//! An entry maps a record offset to the file position of its frame, one entry every
//! `interval_bytes` of frames. Nothing depends on the index being right: a read verifies the frame
//! the index points at and rescans from the start of the segment when it does not find what the
//! index promised, and a missing or malformed `.idx` file is rebuilt by scanning the segment.

use crate::format::SEGMENT_HEADER_BYTES;

pub const INDEX_MAGIC: [u8; 4] = *b"MLIX";
pub const INDEX_VERSION: u16 = 1;
pub const INDEX_HEADER_BYTES: usize = 16;
pub const INDEX_ENTRY_BYTES: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    pub offset: u64,
    pub position: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SparseIndex {
    interval_bytes: u32,
    /// Strictly increasing in both offset and position.
    entries: Vec<IndexEntry>,
}

/// Why an index file was not used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    #[error("index file has a bad header")]
    BadHeader,
    #[error("index file size does not match its entry count")]
    BadSize,
    #[error("index entry {at} is out of order or out of the segment's bounds")]
    BadEntry { at: usize },
}

impl SparseIndex {
    pub fn new(interval_bytes: u32) -> SparseIndex {
        assert!(interval_bytes > 0, "index interval must be positive");
        SparseIndex { interval_bytes, entries: Vec::new() }
    }

    pub fn interval_bytes(&self) -> u32 {
        self.interval_bytes
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Position of the last entry, or the start of the frames when there is none.
    pub fn last_position(&self) -> u64 {
        self.entries.last().map_or(SEGMENT_HEADER_BYTES, |entry| entry.position)
    }

    /// Whether a frame at `position` is far enough past the last entry to deserve one.
    pub fn wants_entry_at(&self, position: u64, last_position: u64) -> bool {
        self.entries.is_empty() && position == SEGMENT_HEADER_BYTES
            || position >= last_position + u64::from(self.interval_bytes)
    }

    pub fn push(&mut self, entry: IndexEntry) {
        if let Some(last) = self.entries.last() {
            assert!(entry.offset > last.offset && entry.position > last.position, "index order");
        }
        self.entries.push(entry);
    }

    /// The last entry at or before `offset`.
    pub fn floor(&self, offset: u64) -> Option<IndexEntry> {
        let after = self.entries.partition_point(|entry| entry.offset <= offset);
        after.checked_sub(1).map(|at| self.entries[at])
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(INDEX_HEADER_BYTES + INDEX_ENTRY_BYTES * self.entries.len());
        out.extend_from_slice(&INDEX_MAGIC);
        out.extend_from_slice(&INDEX_VERSION.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&self.interval_bytes.to_le_bytes());
        out.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for entry in &self.entries {
            out.extend_from_slice(&entry.offset.to_le_bytes());
            out.extend_from_slice(&entry.position.to_le_bytes());
        }
        out
    }

    /// Decodes an index file and checks it against the segment it claims to describe: entries
    /// in order, offsets below `end_offset`, positions inside the frames.
    pub fn decode(
        bytes: &[u8],
        base_offset: u64,
        end_offset: u64,
        data_bytes: u64,
    ) -> Result<SparseIndex, IndexError> {
        if bytes.len() < INDEX_HEADER_BYTES || bytes[0..4] != INDEX_MAGIC {
            return Err(IndexError::BadHeader);
        }
        let version = u16::from_le_bytes([bytes[4], bytes[5]]);
        let interval_bytes = u32::from_le_bytes(bytes[8..12].try_into().expect("four bytes"));
        let count = u32::from_le_bytes(bytes[12..16].try_into().expect("four bytes")) as usize;
        if version != INDEX_VERSION || interval_bytes == 0 {
            return Err(IndexError::BadHeader);
        }
        if bytes.len() != INDEX_HEADER_BYTES + count * INDEX_ENTRY_BYTES {
            return Err(IndexError::BadSize);
        }
        let mut index = SparseIndex::new(interval_bytes);
        for (at, raw) in bytes[INDEX_HEADER_BYTES..].chunks_exact(INDEX_ENTRY_BYTES).enumerate() {
            let entry = IndexEntry {
                offset: u64::from_le_bytes(raw[0..8].try_into().expect("eight bytes")),
                position: u64::from_le_bytes(raw[8..16].try_into().expect("eight bytes")),
            };
            let in_bounds = (base_offset..end_offset).contains(&entry.offset)
                && (SEGMENT_HEADER_BYTES..data_bytes).contains(&entry.position);
            let ordered = index
                .entries
                .last()
                .is_none_or(|last| entry.offset > last.offset && entry.position > last.position);
            if !in_bounds || !ordered {
                return Err(IndexError::BadEntry { at });
            }
            index.entries.push(entry);
        }
        Ok(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SparseIndex {
        let mut index = SparseIndex::new(4096);
        index.push(IndexEntry { offset: 0, position: 32 });
        index.push(IndexEntry { offset: 40, position: 4200 });
        index.push(IndexEntry { offset: 90, position: 8400 });
        index
    }

    #[test]
    fn floor_finds_the_entry_at_or_before() {
        let index = sample();
        let cases = [(0, Some(0)), (39, Some(0)), (40, Some(40)), (89, Some(40)), (1000, Some(90))];
        for (offset, expected) in cases {
            assert_eq!(index.floor(offset).map(|entry| entry.offset), expected, "offset {offset}");
        }
        assert_eq!(SparseIndex::new(1).floor(5), None);
    }

    #[test]
    fn round_trips_and_rejects_damage() {
        let index = sample();
        let bytes = index.encode();
        assert_eq!(SparseIndex::decode(&bytes, 0, 100, 9000), Ok(index));
        let mut reordered = bytes.clone();
        reordered[INDEX_HEADER_BYTES + 16..INDEX_HEADER_BYTES + 24].copy_from_slice(&[0; 8]);
        let cases: Vec<(Vec<u8>, u64, u64, IndexError)> = vec![
            (bytes[..bytes.len() - 1].to_vec(), 100, 9000, IndexError::BadSize),
            (b"XXXX".repeat(4), 100, 9000, IndexError::BadHeader),
            (bytes.clone(), 90, 9000, IndexError::BadEntry { at: 2 }),
            (bytes.clone(), 100, 8400, IndexError::BadEntry { at: 2 }),
            (reordered, 100, 9000, IndexError::BadEntry { at: 1 }),
        ];
        for (input, end_offset, data_bytes, expected) in cases {
            assert_eq!(SparseIndex::decode(&input, 0, end_offset, data_bytes), Err(expected));
        }
    }
}
