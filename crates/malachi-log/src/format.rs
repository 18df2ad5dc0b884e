//! The on-disk byte layout of segment files: header, record frames, seal trailer.
//!
//! `docs/storage-format.md` specifies every byte and `testdata/` pins them with golden files; this
//! module is the only code that knows the layout. All integers are fixed-width little-endian.
//! Decoding never trusts a length before checking it against the bytes present and the format's
//! hard bounds, and never panics on any input.

use bytes::{Buf, Bytes};

use crate::record::{Record, StoredRecord};

/// First four bytes of every segment file.
pub const SEGMENT_MAGIC: [u8; 4] = *b"MLSG";
/// The only format version this code writes and reads; a file with another is refused.
pub const FORMAT_VERSION: u16 = 1;
pub const SEGMENT_HEADER_BYTES: u64 = 32;

/// Magic of a record frame.
pub const RECORD_MAGIC: [u8; 2] = *b"RF";
/// Magic of the seal trailer, the last frame of a sealed segment.
pub const SEAL_MAGIC: [u8; 2] = *b"SL";
/// `magic` (2) + `length` (4) + `crc32c` (4).
pub const FRAME_HEADER_BYTES: usize = 10;
/// `offset` (8) + `timestamp_ms` (8) + `flags` (1) + `key_len` (4) + `value_len` (4) +
/// `header_count` (4).
pub const RECORD_FIXED_BYTES: usize = 29;
/// Per header: `name_len` (4) + `value_len` (4).
pub const HEADER_FIXED_BYTES: usize = 8;
pub const SEAL_PAYLOAD_BYTES: usize = 20;
pub const SEAL_TRAILER_BYTES: u64 = (FRAME_HEADER_BYTES + SEAL_PAYLOAD_BYTES) as u64;
/// Hard bound on a frame's payload: a larger length field is damage, not a record. It sits above
/// every configurable limit so that a limit change never makes old files unreadable.
pub const FRAME_PAYLOAD_BYTES_MAX: u32 = 64 * 1024 * 1024;

pub const FLAG_TOMBSTONE: u8 = 0b001;
pub const FLAG_HAS_KEY: u8 = 0b010;
/// The first record of one group-commit write. Recovery uses it to tell a torn tail from damage:
/// a write starts only after the previous one was synced, so a valid frame carrying this flag
/// after a bad one proves the bad one was durable, hence damaged rather than torn.
pub const FLAG_BATCH_START: u8 = 0b100;
const FLAGS_KNOWN: u8 = FLAG_TOMBSTONE | FLAG_HAS_KEY | FLAG_BATCH_START;

/// Why a frame did not decode. `Incomplete` at the end of a file is a torn write; anywhere else,
/// like every other variant, it is damage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame incomplete: {available} bytes present, {needed} needed")]
    Incomplete { available: u64, needed: u64 },
    #[error("bad frame magic {found:02x?}")]
    BadMagic { found: [u8; 2] },
    #[error("frame length {length} out of bounds")]
    LengthOutOfBounds { length: u32 },
    #[error("frame checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch { stored: u32, computed: u32 },
    #[error("unknown record flags {flags:#04x}")]
    UnknownFlags { flags: u8 },
    #[error("record fields do not fill the frame exactly")]
    LayoutMismatch,
    #[error("record offset {found} where {expected} was expected")]
    OffsetMismatch { expected: u64, found: u64 },
    /// A record at offset `u64::MAX`: the offset after it, which every count and end needs,
    /// would not fit. No writer makes one, so it is damage like any other bad frame.
    #[error("record offset u64::MAX leaves no next offset")]
    LastOffset,
    #[error("seal trailer is not the last frame of the file")]
    MisplacedSeal,
}

/// The segment file header, written once when the file is created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    pub segment_id: u64,
    /// Offset of the first record; dense offsets follow it.
    pub base_offset: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("not a segment file (magic {found:02x?})")]
    BadMagic { found: [u8; 4] },
    #[error("segment format version {found} is not supported (this build reads {FORMAT_VERSION})")]
    UnsupportedVersion { found: u16 },
    #[error("segment header checksum mismatch")]
    CrcMismatch,
    #[error("segment header truncated")]
    Truncated,
}

impl SegmentHeader {
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_BYTES as usize] {
        let mut out = [0u8; SEGMENT_HEADER_BYTES as usize];
        out[0..4].copy_from_slice(&SEGMENT_MAGIC);
        out[4..6].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        out[6..8].copy_from_slice(&(SEGMENT_HEADER_BYTES as u16).to_le_bytes());
        out[8..16].copy_from_slice(&self.segment_id.to_le_bytes());
        out[16..24].copy_from_slice(&self.base_offset.to_le_bytes());
        // 24..28 reserved, zero.
        let crc = crc32c::crc32c(&out[0..28]);
        out[28..32].copy_from_slice(&crc.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<SegmentHeader, HeaderError> {
        if bytes.len() < SEGMENT_HEADER_BYTES as usize {
            return Err(HeaderError::Truncated);
        }
        let magic: [u8; 4] = bytes[0..4].try_into().expect("four bytes");
        if magic != SEGMENT_MAGIC {
            return Err(HeaderError::BadMagic { found: magic });
        }
        let stored_crc = u32::from_le_bytes(bytes[28..32].try_into().expect("four bytes"));
        if crc32c::crc32c(&bytes[0..28]) != stored_crc {
            return Err(HeaderError::CrcMismatch);
        }
        let version = u16::from_le_bytes([bytes[4], bytes[5]]);
        let header_len = u16::from_le_bytes([bytes[6], bytes[7]]);
        if version != FORMAT_VERSION || u64::from(header_len) != SEGMENT_HEADER_BYTES {
            return Err(HeaderError::UnsupportedVersion { found: version });
        }
        Ok(SegmentHeader {
            segment_id: u64::from_le_bytes(bytes[8..16].try_into().expect("eight bytes")),
            base_offset: u64::from_le_bytes(bytes[16..24].try_into().expect("eight bytes")),
        })
    }
}

/// Bytes `record` occupies on disk, frame header included.
pub fn frame_bytes(record: &Record) -> u64 {
    let headers: usize = record
        .headers
        .iter()
        .map(|(name, value)| HEADER_FIXED_BYTES + name.len() + value.len())
        .sum();
    let key = record.key.as_ref().map_or(0, |key| key.len());
    (FRAME_HEADER_BYTES + RECORD_FIXED_BYTES + key + record.value.len() + headers) as u64
}

/// Appends the frame of `record` at `offset` to `out`; `batch_start` marks the first record of a
/// group-commit write. The caller has checked the limits, which keep every length within `u32`
/// and the payload within `FRAME_PAYLOAD_BYTES_MAX`.
pub fn encode_record(out: &mut Vec<u8>, offset: u64, record: &Record, batch_start: bool) {
    let frame_start = out.len();
    let payload_len = frame_bytes(record) as usize - FRAME_HEADER_BYTES;
    assert!(payload_len <= FRAME_PAYLOAD_BYTES_MAX as usize, "limits admitted an oversize record");
    out.extend_from_slice(&RECORD_MAGIC);
    out.extend_from_slice(&(payload_len as u32).to_le_bytes());
    out.extend_from_slice(&[0u8; 4]); // crc32c, filled in below
    let mut flags = 0;
    if record.tombstone {
        flags |= FLAG_TOMBSTONE;
    }
    if record.key.is_some() {
        flags |= FLAG_HAS_KEY;
    }
    if batch_start {
        flags |= FLAG_BATCH_START;
    }
    let key: &[u8] = record.key.as_deref().unwrap_or(&[]);
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&record.timestamp_ms.to_le_bytes());
    out.push(flags);
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(&(record.value.len() as u32).to_le_bytes());
    out.extend_from_slice(&(record.headers.len() as u32).to_le_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(&record.value);
    for (name, value) in &record.headers {
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(name);
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
        out.extend_from_slice(value);
    }
    assert_eq!(out.len() - frame_start, FRAME_HEADER_BYTES + payload_len);
    let crc =
        frame_crc(&out[frame_start + 2..frame_start + 6], &out[frame_start + FRAME_HEADER_BYTES..]);
    out[frame_start + 6..frame_start + 10].copy_from_slice(&crc.to_le_bytes());
}

/// The seal trailer: the segment holds `record_count` records in its first `data_bytes` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SealTrailer {
    pub record_count: u64,
    pub data_bytes: u64,
}

impl SealTrailer {
    pub fn encode(&self) -> [u8; SEAL_TRAILER_BYTES as usize] {
        let mut out = [0u8; SEAL_TRAILER_BYTES as usize];
        out[0..2].copy_from_slice(&SEAL_MAGIC);
        out[2..6].copy_from_slice(&(SEAL_PAYLOAD_BYTES as u32).to_le_bytes());
        out[10..18].copy_from_slice(&self.record_count.to_le_bytes());
        out[18..26].copy_from_slice(&self.data_bytes.to_le_bytes());
        // 26..30 reserved, zero.
        let crc = frame_crc(&out[2..6], &out[FRAME_HEADER_BYTES..]);
        out[6..10].copy_from_slice(&crc.to_le_bytes());
        out
    }
}

/// What a checked frame turned out to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    Record { offset: u64, batch_start: bool },
    Seal(SealTrailer),
}

/// A frame whose header, checksum and layout are valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckedFrame {
    pub kind: FrameKind,
    pub frame_bytes: u64,
}

/// Validates the frame at the start of `bytes` without building a record: magic, length bounds,
/// checksum, then the payload layout. This is the check recovery, verify and reads all share.
pub fn check_frame(bytes: &[u8]) -> Result<CheckedFrame, FrameError> {
    let available = bytes.len() as u64;
    if bytes.len() < FRAME_HEADER_BYTES {
        return Err(FrameError::Incomplete { available, needed: FRAME_HEADER_BYTES as u64 });
    }
    let magic = [bytes[0], bytes[1]];
    let length = u32::from_le_bytes(bytes[2..6].try_into().expect("four bytes"));
    let stored = u32::from_le_bytes(bytes[6..10].try_into().expect("four bytes"));
    let is_seal = match magic {
        RECORD_MAGIC => false,
        SEAL_MAGIC => true,
        found => return Err(FrameError::BadMagic { found }),
    };
    let length_ok = if is_seal {
        length as usize == SEAL_PAYLOAD_BYTES
    } else {
        (RECORD_FIXED_BYTES as u32..=FRAME_PAYLOAD_BYTES_MAX).contains(&length)
    };
    if !length_ok {
        return Err(FrameError::LengthOutOfBounds { length });
    }
    let total = FRAME_HEADER_BYTES + length as usize;
    if bytes.len() < total {
        return Err(FrameError::Incomplete { available, needed: total as u64 });
    }
    let payload = &bytes[FRAME_HEADER_BYTES..total];
    let computed = frame_crc(&bytes[2..6], payload);
    if computed != stored {
        return Err(FrameError::CrcMismatch { stored, computed });
    }
    let kind = if is_seal {
        FrameKind::Seal(SealTrailer {
            record_count: u64::from_le_bytes(payload[0..8].try_into().expect("eight bytes")),
            data_bytes: u64::from_le_bytes(payload[8..16].try_into().expect("eight bytes")),
        })
    } else {
        check_record_layout(payload)?;
        let offset = u64::from_le_bytes(payload[0..8].try_into().expect("eight"));
        if offset == u64::MAX {
            return Err(FrameError::LastOffset);
        }
        FrameKind::Record { offset, batch_start: payload[16] & FLAG_BATCH_START != 0 }
    };
    Ok(CheckedFrame { kind, frame_bytes: total as u64 })
}

/// Decodes the record frame at `chunk[at..]`. The record's byte fields are slices of `chunk`.
pub fn decode_record(chunk: &Bytes, at: usize) -> Result<(StoredRecord, u64), FrameError> {
    let checked = check_frame(&chunk[at..])?;
    let FrameKind::Record { offset, .. } = checked.kind else {
        return Err(FrameError::MisplacedSeal);
    };
    let mut payload = chunk.slice(at + FRAME_HEADER_BYTES..at + checked.frame_bytes as usize);
    payload.advance(8); // offset, read above
    let timestamp_ms = payload.get_u64_le();
    let flags = payload.get_u8();
    let key_len = payload.get_u32_le() as usize;
    let value_len = payload.get_u32_le() as usize;
    let header_count = payload.get_u32_le() as usize;
    // check_record_layout proved every length below fits.
    let key = payload.split_to(key_len);
    let value = payload.split_to(value_len);
    let mut headers = Vec::with_capacity(header_count);
    for _ in 0..header_count {
        let name_len = payload.get_u32_le() as usize;
        let name = payload.split_to(name_len);
        let header_value_len = payload.get_u32_le() as usize;
        headers.push((name, payload.split_to(header_value_len)));
    }
    let record = Record {
        key: (flags & FLAG_HAS_KEY != 0).then_some(key),
        value,
        headers,
        timestamp_ms,
        tombstone: flags & FLAG_TOMBSTONE != 0,
    };
    Ok((StoredRecord { offset, record }, checked.frame_bytes))
}

/// Checks that the lengths inside a record payload add up to exactly the payload.
fn check_record_layout(payload: &[u8]) -> Result<(), FrameError> {
    let flags = payload[16];
    if flags & !FLAGS_KNOWN != 0 {
        return Err(FrameError::UnknownFlags { flags });
    }
    let read_u32 = |at: usize| -> Option<u64> {
        payload.get(at..at + 4).map(|b| u64::from(u32::from_le_bytes(b.try_into().expect("4"))))
    };
    let key_len = read_u32(17).ok_or(FrameError::LayoutMismatch)?;
    let value_len = read_u32(21).ok_or(FrameError::LayoutMismatch)?;
    let header_count = read_u32(25).ok_or(FrameError::LayoutMismatch)?;
    if flags & FLAG_HAS_KEY == 0 && key_len != 0 {
        return Err(FrameError::LayoutMismatch);
    }
    let mut cursor = RECORD_FIXED_BYTES as u64 + key_len + value_len;
    // Each header needs at least 8 bytes, so this bound also stops a huge count from looping.
    if header_count > payload.len() as u64 / HEADER_FIXED_BYTES as u64 {
        return Err(FrameError::LayoutMismatch);
    }
    for _ in 0..header_count {
        let name_len = read_u32(cursor as usize).ok_or(FrameError::LayoutMismatch)?;
        cursor += 4 + name_len;
        let value_len = read_u32(cursor as usize).ok_or(FrameError::LayoutMismatch)?;
        cursor += 4 + value_len;
    }
    if cursor != payload.len() as u64 {
        return Err(FrameError::LayoutMismatch);
    }
    Ok(())
}

/// CRC32C over the length field and the payload, so a flipped length bit is caught too.
fn frame_crc(length_field: &[u8], payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(length_field), payload)
}

#[cfg(test)]
pub(crate) mod tests;
