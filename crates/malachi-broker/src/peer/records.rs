//! Records between brokers (forwarded produces, shipped batches, fills and rebuilds) and the
//! little-endian reader every peer payload is decoded with.

use bytes::Bytes;
use malachi_log::Record;

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).expect("records are bounded far below 4 GiB");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Appends `records` to `out`: a count, the records, and a CRC32C of both, so that a record
/// damaged between brokers (forwarded, shipped to a follower, copied by a fill or a rebuild) is
/// refused, never written with a checksum of its own over the wrong bytes.
pub(crate) fn encode_records(records: &[Record], out: &mut Vec<u8>) {
    let from = out.len();
    let count = u32::try_from(records.len()).expect("batches are bounded far below 4 G records");
    out.extend_from_slice(&count.to_le_bytes());
    for record in records {
        let flags = u8::from(record.key.is_some()) | (u8::from(record.tombstone) << 1);
        out.push(flags);
        out.extend_from_slice(&record.timestamp_ms.to_le_bytes());
        put_bytes(out, record.key.as_deref().unwrap_or_default());
        put_bytes(out, &record.value);
        let headers = u16::try_from(record.headers.len()).expect("headers are bounded by limits");
        out.extend_from_slice(&headers.to_le_bytes());
        for (name, value) in &record.headers {
            put_bytes(out, name);
            put_bytes(out, value);
        }
    }
    let checksum = crc32c::crc32c(&out[from..]);
    out.extend_from_slice(&checksum.to_le_bytes());
}

/// Reads what [`encode_records`] wrote: the rest of `reader`, its checksum checked first.
pub(crate) fn decode_records(reader: &mut Reader<'_>) -> Result<Vec<Record>, String> {
    let Some((body, checksum)) = reader.0.split_last_chunk::<4>() else {
        return Err("truncated".to_string());
    };
    reader.0 = &[];
    if crc32c::crc32c(body) != u32::from_le_bytes(*checksum) {
        return Err("records damaged in transit (checksum mismatch)".to_string());
    }
    let mut reader = Reader(body);
    let reader = &mut reader;
    let count = reader.u32()? as usize;
    // Every record takes at least 19 bytes: never reserve more than the payload can hold.
    let mut records = Vec::with_capacity(count.min(reader.0.len() / 19));
    for _ in 0..count {
        let flags = reader.u8()?;
        if flags & !3 != 0 {
            return Err(format!("unknown record flags {flags:#x}"));
        }
        let timestamp_ms = reader.u64()?;
        let key = reader.bytes()?;
        let value = reader.bytes()?;
        let header_count = reader.u16()?;
        let mut headers = Vec::with_capacity(usize::from(header_count).min(reader.0.len() / 8));
        for _ in 0..header_count {
            headers.push((reader.bytes()?, reader.bytes()?));
        }
        let key = (flags & 1 != 0).then_some(key);
        records.push(Record { key, value, headers, timestamp_ms, tombstone: flags & 2 != 0 });
    }
    if !reader.0.is_empty() {
        return Err(format!("{} bytes after the records", reader.0.len()));
    }
    Ok(records)
}

/// Reads little-endian fields off the front of a byte slice, failing on a short one.
pub(crate) struct Reader<'a>(pub(crate) &'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let Some((head, rest)) = self.0.split_first_chunk::<N>() else {
            return Err("truncated".to_string());
        };
        self.0 = rest;
        Ok(*head)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, String> {
        self.take().map(u16::from_le_bytes)
    }

    pub(crate) fn u32(&mut self) -> Result<u32, String> {
        self.take().map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self) -> Result<u64, String> {
        self.take().map(u64::from_le_bytes)
    }

    /// Nothing may follow what was read.
    pub(crate) fn end(&self) -> Result<(), String> {
        match self.0.len() {
            0 => Ok(()),
            bytes => Err(format!("{bytes} bytes after the end")),
        }
    }

    fn bytes(&mut self) -> Result<Bytes, String> {
        let len = self.u32()? as usize;
        if len > self.0.len() {
            return Err("truncated".to_string());
        }
        let (bytes, rest) = self.0.split_at(len);
        self.0 = rest;
        Ok(Bytes::copy_from_slice(bytes))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) fn record() -> impl Strategy<Value = Record> {
        let bytes = || proptest::collection::vec(any::<u8>(), 0..40).prop_map(Bytes::from);
        (
            proptest::option::of(bytes()),
            bytes(),
            proptest::collection::vec((bytes(), bytes()), 0..4),
            any::<u64>(),
            any::<bool>(),
        )
            .prop_map(|(key, value, headers, timestamp_ms, tombstone)| Record {
                key,
                value,
                headers,
                timestamp_ms,
                tombstone,
            })
    }

    proptest! {
        #[test]
        fn records_round_trip(records in proptest::collection::vec(record(), 0..20)) {
            let mut bytes = Vec::new();
            encode_records(&records, &mut bytes);
            prop_assert_eq!(decode_records(&mut Reader(&bytes)).unwrap(), records.clone());
            // Every strict prefix is refused, never misread, and so is every flipped bit.
            for cut in 0..bytes.len() {
                prop_assert!(decode_records(&mut Reader(&bytes[..cut])).is_err());
            }
            for at in 0..bytes.len() {
                let mut flipped = bytes.clone();
                flipped[at] ^= 1 << (at % 8);
                let refused = decode_records(&mut Reader(&flipped));
                prop_assert!(refused.unwrap_err().contains("checksum"), "byte {} flipped", at);
            }
        }
    }

    #[test]
    fn unknown_record_flags_are_refused() {
        let mut flagged = Vec::new();
        let record = Record {
            key: None,
            value: Bytes::from_static(b"v"),
            headers: Vec::new(),
            timestamp_ms: 0,
            tombstone: false,
        };
        encode_records(&[record], &mut flagged);
        flagged[4] = 0x80;
        let body = flagged.len() - 4;
        let checksum = crc32c::crc32c(&flagged[..body]);
        flagged[body..].copy_from_slice(&checksum.to_le_bytes());
        assert!(decode_records(&mut Reader(&flagged)).unwrap_err().contains("flags"));
    }
}
