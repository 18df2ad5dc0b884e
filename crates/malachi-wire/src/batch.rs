//! The batch of section 2.4 (the body of `append`, of `fetch_range` pages and of record pushes):
//! a 13-byte header, then `size` payload bytes holding `count` entries, compressed or not.
//!
//! [`decode_batch`] runs the spec's checks in the spec's order, because the first failing check
//! decides the reason a peer sees: framing (`malformed_batch`), codec (`{:unknown_codec, n}`),
//! the inflated cap (`batch_too_large`, before any work), sizes (`batch_size_mismatch`), then the
//! entries (`malformed_batch` when cut short, `batch_count_mismatch` when bytes are left over).
//!
//! Codec 1 (zstd) is recognised but not implemented yet: both directions return a typed
//! "not implemented" error (`unsupported_codec`) until the zstd dependency lands with key 27.

use bytes::{Bytes, BytesMut};

use crate::error::{BatchError, DecodeError, EncodeError};
use crate::limits::{BATCH_HEADER_BYTES, INFLATED_BATCH_BYTES_MAX_DEFAULT};
use crate::primitive::{Reader, Wire, Writer, length_u32};
use crate::record::Record;
use crate::shapes::Position;

/// A batch's compression, the header's `codec` byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Codec {
    None = 0,
    Zstd = 1,
}

/// Bounds a batch reader applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchLimits {
    /// Largest `inflated_size` accepted (`max_inflated_batch_bytes`), checked before any
    /// decompression so a small frame cannot make us inflate without bound.
    pub inflated_bytes_max: u32,
}

/// The fixed 13 bytes in front of a batch's payload, as read (the codec not yet checked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchHeader {
    pub codec: u8,
    /// Entries in the batch.
    pub count: u32,
    /// Bytes of the entries once decompressed.
    pub inflated_size: u32,
    /// Bytes of the payload that follows the header.
    pub size: u32,
}

/// An entry shape a batch can hold. Implemented by [`PlainEntry`] and [`PositionedEntry`] only.
pub trait BatchEntry: Wire {}

/// A producer's entry (`append`): flags, then the record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlainEntry {
    /// Flags bit 0.
    pub tombstone: bool,
    pub record: Record,
}

/// A consumer's entry (pages and record pushes): the record's position, flags, then the record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PositionedEntry {
    pub position: Position,
    /// Flags bit 0.
    pub tombstone: bool,
    pub record: Record,
}

/// Encodes `entries` as one batch. Codec 0 only for now; nothing is written on error.
pub fn encode_batch<E: BatchEntry>(
    entries: &[E],
    codec: Codec,
    dst: &mut BytesMut,
) -> Result<(), EncodeError> {
    if codec != Codec::None {
        // zstd: codec 1 lands with key 27 (one zstd frame holding all entries, section 2.4).
        return Err(EncodeError::CodecNotImplemented { codec });
    }
    let start = dst.len();
    let result = write_uncompressed(entries, &mut Writer::new(dst));
    if result.is_err() {
        dst.truncate(start);
    }
    result
}

/// Reads a whole batch (it must be exactly header + `size` bytes) into its entries.
pub fn decode_batch<E: BatchEntry>(
    batch: Bytes,
    limits: BatchLimits,
) -> Result<Vec<E>, BatchError> {
    let (header, payload) = BatchHeader::split(batch)?;
    let codec =
        Codec::from_u8(header.codec).ok_or(BatchError::UnknownCodec { codec: header.codec })?;
    if header.inflated_size > limits.inflated_bytes_max {
        let max = limits.inflated_bytes_max;
        return Err(BatchError::TooLarge { inflated_size: header.inflated_size, max });
    }
    let inflated = inflate(codec, &header, payload)?;
    read_entries(inflated, header.count)
}

impl Codec {
    pub const fn from_u8(value: u8) -> Option<Codec> {
        match value {
            0 => Some(Codec::None),
            1 => Some(Codec::Zstd),
            _ => None,
        }
    }

    pub const fn as_u8(self) -> u8 {
        self as u8
    }
}

impl Default for BatchLimits {
    fn default() -> BatchLimits {
        BatchLimits { inflated_bytes_max: INFLATED_BATCH_BYTES_MAX_DEFAULT }
    }
}

impl BatchHeader {
    /// The first check of section 2.4: a whole header and exactly `size` payload bytes, no more
    /// and no fewer. Returns the header and the payload. A server may call this alone to learn
    /// `count` and `inflated_size` (for quotas) before decoding.
    pub fn split(batch: Bytes) -> Result<(BatchHeader, Bytes), BatchError> {
        let mut reader = Reader::new(batch);
        let header = read_header(&mut reader).map_err(BatchError::Malformed)?;
        let payload = reader.rest();
        let size = crate::primitive::widen(header.size);
        if payload.len() < size {
            let error = DecodeError::Truncated { needed: size, remaining: payload.len() };
            return Err(BatchError::Malformed(error));
        }
        if payload.len() > size {
            let error = DecodeError::TrailingBytes { count: payload.len() - size };
            return Err(BatchError::Malformed(error));
        }
        Ok((header, payload))
    }
}

fn read_header(reader: &mut Reader) -> Result<BatchHeader, DecodeError> {
    if reader.remaining() < BATCH_HEADER_BYTES {
        let remaining = reader.remaining();
        return Err(DecodeError::Truncated { needed: BATCH_HEADER_BYTES, remaining });
    }
    Ok(BatchHeader {
        codec: reader.u8()?,
        count: reader.u32()?,
        inflated_size: reader.u32()?,
        size: reader.u32()?,
    })
}

/// The payload's entries, decompressed. The cap on `inflated_size` was checked by the caller.
fn inflate(codec: Codec, header: &BatchHeader, payload: Bytes) -> Result<Bytes, BatchError> {
    match codec {
        Codec::None => {
            if header.size != header.inflated_size {
                let (size, inflated_size) = (header.size, header.inflated_size);
                return Err(BatchError::SizeMismatch { size, inflated_size });
            }
            Ok(payload)
        }
        // zstd: codec 1 lands with key 27. Section 2.4's order, to keep here: payload shorter
        // than 9 bytes → malformed_batch; a frame header declaring a content size other than
        // inflated_size → batch_size_mismatch; not zstd or corrupt → malformed_batch; decompress
        // in bounded steps and stop as soon as output exceeds inflated_size; total output other
        // than inflated_size → batch_size_mismatch.
        Codec::Zstd => Err(BatchError::CodecNotImplemented { codec }),
    }
}

/// Exactly `count` entries must consume exactly the inflated bytes.
fn read_entries<E: BatchEntry>(inflated: Bytes, count: u32) -> Result<Vec<E>, BatchError> {
    let mut reader = Reader::new(inflated);
    let entries = reader.items(count).map_err(BatchError::Malformed)?;
    match reader.remaining() {
        0 => Ok(entries),
        bytes_left => Err(BatchError::CountMismatch { count, bytes_left }),
    }
}

fn write_uncompressed<E: BatchEntry>(
    entries: &[E],
    writer: &mut Writer<'_>,
) -> Result<(), EncodeError> {
    let count = length_u32(entries.len())?;
    writer.u8(Codec::None.as_u8());
    writer.u32(count);
    let sizes_at = writer.position();
    writer.u32(0); // inflated_size, patched below
    writer.u32(0); // size, patched below
    entries.iter().try_for_each(|entry| entry.write(writer))?;
    let size = length_u32(writer.position() - sizes_at - 8)?;
    writer.patch_u32(sizes_at, size);
    writer.patch_u32(sizes_at + 4, size);
    Ok(())
}

fn write_flags(writer: &mut Writer<'_>, tombstone: bool) {
    writer.u8(u8::from(tombstone));
}

/// Flags bit 0 is the tombstone; any other bit makes the batch malformed.
fn read_flags(reader: &mut Reader) -> Result<bool, DecodeError> {
    match reader.u8()? {
        0 => Ok(false),
        1 => Ok(true),
        flags => Err(DecodeError::InvalidEntryFlags { flags }),
    }
}

impl BatchEntry for PlainEntry {}
impl BatchEntry for PositionedEntry {}

impl Wire for PlainEntry {
    const WIRE_BYTES_MIN: usize = 1 + Record::WIRE_BYTES_MIN;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        write_flags(writer, self.tombstone);
        writer.item(&self.record)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(PlainEntry { tombstone: read_flags(reader)?, record: reader.item()? })
    }
}

impl Wire for PositionedEntry {
    const WIRE_BYTES_MIN: usize = Position::WIRE_BYTES_MIN + 1 + Record::WIRE_BYTES_MIN;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.item(&self.position)?;
        write_flags(writer, self.tombstone);
        writer.item(&self.record)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(PositionedEntry {
            position: reader.item()?,
            tombstone: read_flags(reader)?,
            record: reader.item()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::collection::vec;
    use proptest::prelude::*;

    use super::*;
    use crate::arbitrary::arb_record;
    use crate::vectors::{hex, timestamp};

    /// One plain entry (`k1`, `v1`, TS, no headers): the batch of test vector V21.
    const V21_BATCH: &str = "00 00000001 0000001a 0000001a \
        00 01 00000002 6b31 00000002 7631 0000019b76daa800 00000000";

    fn v21_entry() -> PlainEntry {
        let record = Record {
            key: Some("k1".into()),
            value: "v1".into(),
            timestamp_ms: timestamp(0),
            headers: Vec::new(),
        };
        PlainEntry { tombstone: false, record }
    }

    #[test]
    fn v21_batch_round_trips() {
        let mut dst = BytesMut::new();
        encode_batch(&[v21_entry()], Codec::None, &mut dst).expect("encodes");
        assert_eq!(dst.freeze(), hex(V21_BATCH));
        let entries = decode_batch::<PlainEntry>(hex(V21_BATCH), BatchLimits::default());
        assert_eq!(entries, Ok(vec![v21_entry()]));
    }

    #[test]
    fn checks_run_in_the_spec_order() {
        let cap = BatchLimits { inflated_bytes_max: 0x1a };
        // Each header breaks one more rule than the row below it would catch.
        let cases: &[(&str, &str, BatchLimits, BatchError)] = &[
            (
                "short header",
                "00 00000001 0000001a",
                cap,
                BatchError::Malformed(DecodeError::Truncated { needed: 13, remaining: 9 }),
            ),
            (
                "payload shorter than size, with an unknown codec too",
                "07 00000001 ffffffff 00000002 00",
                cap,
                BatchError::Malformed(DecodeError::Truncated { needed: 2, remaining: 1 }),
            ),
            (
                "payload longer than size",
                "00 00000000 00000000 00000000 00",
                cap,
                BatchError::Malformed(DecodeError::TrailingBytes { count: 1 }),
            ),
            (
                "unknown codec before the cap",
                "07 00000001 ffffffff 00000000",
                cap,
                BatchError::UnknownCodec { codec: 7 },
            ),
            (
                "cap before the size mismatch",
                "00 00000001 0000001b 00000000",
                cap,
                BatchError::TooLarge { inflated_size: 0x1b, max: 0x1a },
            ),
            (
                "codec 0 with size != inflated_size",
                "00 00000001 00000001 00000000",
                cap,
                BatchError::SizeMismatch { size: 0, inflated_size: 1 },
            ),
            (
                "zstd is known but not implemented",
                "01 00000001 00000001 00000000",
                cap,
                BatchError::CodecNotImplemented { codec: Codec::Zstd },
            ),
            (
                "entries cut short",
                "00 00000002 00000012 00000012 00 00 00000000 0000000000000000 00000000",
                cap,
                BatchError::Malformed(DecodeError::CountTooLarge { count: 2, remaining: 18 }),
            ),
            (
                "bytes left after count entries",
                "00 00000000 00000001 00000001 00",
                cap,
                BatchError::CountMismatch { count: 0, bytes_left: 1 },
            ),
            (
                "flag bit 1 set",
                "00 00000001 00000012 00000012 02 00 00000000 0000000000000000 00000000",
                cap,
                BatchError::Malformed(DecodeError::InvalidEntryFlags { flags: 2 }),
            ),
            (
                "absent header name inside a batch",
                "00 00000001 0000001c 0000001c \
                 00 00 00000000 0000000000000000 00000001 00 01 00000004 76767676",
                BatchLimits::default(),
                BatchError::Malformed(DecodeError::AbsentStr { field: "header name" }),
            ),
            (
                "four billion entries in 18 bytes",
                "00 ffffffff 00000012 00000012 00 00 00000000 0000000000000000 00000000",
                cap,
                BatchError::Malformed(DecodeError::CountTooLarge {
                    count: u32::MAX,
                    remaining: 18,
                }),
            ),
        ];
        for (name, input, limits, expected) in cases {
            let got = decode_batch::<PlainEntry>(hex(input), *limits);
            assert_eq!(got, Err(*expected), "{name}");
        }
    }

    #[test]
    fn reasons_of_batch_errors() {
        let malformed = BatchError::Malformed(DecodeError::TrailingBytes { count: 1 });
        let cases: &[(BatchError, &str)] = &[
            (malformed, "malformed_batch"),
            (BatchError::UnknownCodec { codec: 7 }, "{:unknown_codec, 7}"),
            (BatchError::TooLarge { inflated_size: 2, max: 1 }, "batch_too_large"),
            (BatchError::SizeMismatch { size: 1, inflated_size: 2 }, "batch_size_mismatch"),
            (BatchError::CountMismatch { count: 1, bytes_left: 2 }, "batch_count_mismatch"),
            (BatchError::CodecNotImplemented { codec: Codec::Zstd }, "unsupported_codec"),
        ];
        for (error, text) in cases {
            assert_eq!(error.wire_text(), *text);
        }
    }

    #[test]
    fn positioned_entries_and_tombstones() {
        let entries = vec![
            PositionedEntry {
                position: Position { source_index: 2, offset: 9 },
                tombstone: true,
                record: v21_entry().record,
            },
            PositionedEntry::default(),
        ];
        let mut dst = BytesMut::new();
        encode_batch(&entries, Codec::None, &mut dst).expect("encodes");
        let decoded = decode_batch::<PositionedEntry>(dst.freeze(), BatchLimits::default());
        assert_eq!(decoded, Ok(entries));
    }

    #[test]
    fn zstd_encode_is_refused_and_writes_nothing() {
        let mut dst = BytesMut::from(&b"x"[..]);
        let result = encode_batch(&[v21_entry()], Codec::Zstd, &mut dst);
        assert_eq!(result, Err(EncodeError::CodecNotImplemented { codec: Codec::Zstd }));
        assert_eq!(&dst[..], b"x");
    }

    fn arb_plain_entries() -> impl Strategy<Value = Vec<PlainEntry>> {
        let entry = (any::<bool>(), arb_record())
            .prop_map(|(tombstone, record)| PlainEntry { tombstone, record });
        vec(entry, 0..5)
    }

    fn encoded<E: BatchEntry>(entries: &[E]) -> Bytes {
        let mut dst = BytesMut::new();
        encode_batch(entries, Codec::None, &mut dst).expect("encodes");
        dst.freeze()
    }

    proptest! {
        #[test]
        fn plain_batches_round_trip(entries in arb_plain_entries()) {
            let decoded = decode_batch::<PlainEntry>(encoded(&entries), BatchLimits::default());
            prop_assert_eq!(decoded, Ok(entries));
        }

        #[test]
        fn positioned_batches_round_trip(
            entries in vec((any::<(u16, u64)>(), any::<bool>(), arb_record()), 0..5),
        ) {
            let entries: Vec<PositionedEntry> = entries
                .into_iter()
                .map(|((source_index, offset), tombstone, record)| PositionedEntry {
                    position: Position { source_index, offset },
                    tombstone,
                    record,
                })
                .collect();
            let decoded = decode_batch(encoded(&entries), BatchLimits::default());
            prop_assert_eq!(decoded, Ok(entries));
        }

        #[test]
        fn every_strict_prefix_of_a_batch_is_malformed(entries in arb_plain_entries()) {
            let whole = encoded(&entries);
            for cut in 0..whole.len() {
                let got = decode_batch::<PlainEntry>(whole.slice(..cut), BatchLimits::default());
                prop_assert!(matches!(got, Err(BatchError::Malformed(_))), "cut at {}", cut);
            }
        }

        #[test]
        fn arbitrary_batches_never_panic(
            batch in vec(any::<u8>(), 0..160),
            inflated_bytes_max in any::<u32>(),
        ) {
            let limits = BatchLimits { inflated_bytes_max };
            let _ = decode_batch::<PlainEntry>(Bytes::from(batch.clone()), limits);
            let _ = decode_batch::<PositionedEntry>(Bytes::from(batch), limits);
        }
    }
}
