//! Building records and produce batches.
//!
//! [`ProduceBatch`] gathers records up to a count and a byte budget so a stream of input (lines
//! on stdin, a load generator) becomes produce requests of a sensible size: big enough to
//! amortize the round trip and the server's fsync, far below the 16 MiB frame limit.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use malachi_wire::{Header, Record};

use crate::client::Client;
use crate::error::ClientError;

/// A record under construction; the timestamp defaults to now.
#[derive(Clone, Debug)]
pub struct RecordBuilder {
    record: Record,
}

/// Records for one produce request, bounded by count and encoded size.
#[derive(Clone, Debug)]
pub struct ProduceBatch {
    records: Vec<Record>,
    wire_bytes: usize,
    records_max: usize,
    wire_bytes_max: usize,
}

impl RecordBuilder {
    pub fn new(value: impl Into<Bytes>) -> RecordBuilder {
        let record =
            Record { key: None, value: value.into(), timestamp_ms: now_ms(), headers: Vec::new() };
        RecordBuilder { record }
    }

    /// Sets the key (copied: keys are short).
    pub fn key(mut self, key: impl AsRef<[u8]>) -> Self {
        self.record.key = Some(Bytes::copy_from_slice(key.as_ref()));
        self
    }

    /// Adds a header; names may repeat (readers that build a map keep the last).
    pub fn header(mut self, name: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Self {
        let name = Bytes::copy_from_slice(name.as_ref());
        let value = Bytes::copy_from_slice(value.as_ref());
        self.record.headers.push(Header { name, value });
        self
    }

    pub fn timestamp_ms(mut self, timestamp_ms: u64) -> Self {
        self.record.timestamp_ms = timestamp_ms;
        self
    }

    pub fn build(self) -> Record {
        self.record
    }
}

impl ProduceBatch {
    pub const RECORDS_MAX_DEFAULT: usize = 1000;
    pub const WIRE_BYTES_MAX_DEFAULT: usize = 1024 * 1024;

    /// A batch of at most 1000 records and about 1 MiB.
    pub fn new() -> ProduceBatch {
        ProduceBatch::with_limits(Self::RECORDS_MAX_DEFAULT, Self::WIRE_BYTES_MAX_DEFAULT)
    }

    /// Limits of at least one record; a single record larger than `wire_bytes_max` still makes
    /// a batch of its own (the server judges whether it is too large).
    pub fn with_limits(records_max: usize, wire_bytes_max: usize) -> ProduceBatch {
        ProduceBatch {
            records: Vec::new(),
            wire_bytes: 0,
            records_max: records_max.max(1),
            wire_bytes_max,
        }
    }

    /// Whether `record` can join without passing a limit. An empty batch takes anything.
    pub fn fits(&self, record: &Record) -> bool {
        self.records.is_empty()
            || (self.records.len() < self.records_max
                && self.wire_bytes + record_wire_bytes(record) <= self.wire_bytes_max)
    }

    /// Adds `record` whether or not it [fits](Self::fits); callers send first when it does not.
    pub fn push(&mut self, record: Record) {
        self.wire_bytes += record_wire_bytes(&record);
        self.records.push(record);
    }

    pub fn is_full(&self) -> bool {
        self.records.len() >= self.records_max || self.wire_bytes >= self.wire_bytes_max
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Encoded bytes of the records so far.
    pub fn wire_bytes(&self) -> usize {
        self.wire_bytes
    }

    /// Empties the batch, returning its records.
    pub fn take(&mut self) -> Vec<Record> {
        self.wire_bytes = 0;
        std::mem::take(&mut self.records)
    }

    /// Produces the records (if any) and empties the batch; returns the count appended.
    pub async fn send(&mut self, client: &Client, topic: &str) -> Result<u32, ClientError> {
        if self.is_empty() {
            return Ok(0);
        }
        client.produce(topic, self.take()).await
    }
}

impl Default for ProduceBatch {
    fn default() -> ProduceBatch {
        ProduceBatch::new()
    }
}

/// Bytes `record` takes on the wire (section 2.1).
pub fn record_wire_bytes(record: &Record) -> usize {
    let key = 1 + record.key.as_ref().map_or(0, |key| 4 + key.len());
    let headers: usize =
        record.headers.iter().map(|header| 10 + header.name.len() + header.value.len()).sum();
    key + 4 + record.value.len() + 8 + 4 + headers
}

/// Milliseconds since the Unix epoch, the producer-supplied timestamp of section 2.1.
pub fn now_ms() -> u64 {
    let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use malachi_wire::Wire;

    use super::*;

    #[test]
    fn wire_bytes_match_the_encoding() {
        let records = [
            RecordBuilder::new("").timestamp_ms(0).build(),
            RecordBuilder::new("value").key("k").build(),
            RecordBuilder::new(vec![0_u8; 300]).header("a", "b").header("trace", "").build(),
        ];
        for record in records {
            let encoded = record.encode_to_bytes().expect("encodes");
            assert_eq!(record_wire_bytes(&record), encoded.len(), "{record:?}");
        }
    }

    #[test]
    fn batches_respect_count_and_bytes() {
        let small = RecordBuilder::new("x").build(); // 18 bytes
        let mut by_count = ProduceBatch::with_limits(2, 1000);
        for expected_fit in [true, true, false] {
            assert_eq!(by_count.fits(&small), expected_fit);
            if expected_fit {
                by_count.push(small.clone());
            }
        }
        assert!(by_count.is_full());
        assert_eq!(by_count.take().len(), 2);
        assert!(by_count.is_empty() && by_count.wire_bytes() == 0);

        let mut by_bytes = ProduceBatch::with_limits(100, 40);
        by_bytes.push(small.clone());
        by_bytes.push(small.clone());
        assert!(!by_bytes.fits(&small), "54 bytes would pass 40");

        let huge = RecordBuilder::new(vec![0_u8; 100]).build();
        let empty = ProduceBatch::with_limits(100, 40);
        assert!(empty.fits(&huge), "an oversized record still goes, alone");
    }
}
