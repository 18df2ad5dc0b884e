//! Explicit bounds on what one append may carry, checked before a byte is staged.

use malachi_reason::Reason;

use crate::format::{self, FRAME_PAYLOAD_BYTES_MAX};
use crate::record::Record;

/// Bounds on records and on one append call. Defaults admit anything the wire protocol can carry
/// in one 16 MiB frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Key + value + header names and values of one record.
    pub record_bytes_max: u64,
    pub key_bytes_max: u64,
    pub headers_per_record_max: u32,
    /// Records in one `append` call.
    pub append_records_max: u32,
    /// Encoded bytes (frames included) of one `append` call.
    pub append_bytes_max: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            record_bytes_max: 16 * 1024 * 1024,
            key_bytes_max: 64 * 1024,
            headers_per_record_max: 1024,
            append_records_max: 1_000_000,
            append_bytes_max: 32 * 1024 * 1024,
        }
    }
}

/// An append refused by a limit; nothing of it was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    #[error("record {index} is {bytes} bytes, the limit is {max}")]
    RecordTooLarge { index: u32, bytes: u64, max: u64 },
    #[error("record {index} has a {bytes}-byte key, the limit is {max}")]
    KeyTooLarge { index: u32, bytes: u64, max: u64 },
    #[error("record {index} has {count} headers, the limit is {max}")]
    TooManyHeaders { index: u32, count: u64, max: u32 },
    #[error("append of {count} records, the limit is {max}")]
    TooManyRecords { count: u64, max: u32 },
    #[error("append of {bytes} bytes, the limit is {max}")]
    BatchTooLarge { bytes: u64, max: u64 },
}

impl LimitError {
    /// The reason for logs and the wire.
    pub fn reason(&self) -> Reason {
        match self {
            LimitError::RecordTooLarge { .. } => Reason::RecordTooLarge,
            LimitError::KeyTooLarge { .. } => Reason::KeyTooLarge,
            LimitError::TooManyHeaders { .. } => Reason::TooManyHeaders,
            LimitError::TooManyRecords { .. } => Reason::BatchTooManyRecords,
            LimitError::BatchTooLarge { .. } => Reason::BatchTooLarge,
        }
    }
}

impl Limits {
    /// Checks `records` against every limit and returns their encoded size.
    pub fn check(&self, records: &[Record]) -> Result<u64, LimitError> {
        if records.len() as u64 > u64::from(self.append_records_max) {
            return Err(LimitError::TooManyRecords {
                count: records.len() as u64,
                max: self.append_records_max,
            });
        }
        let record_bytes_max = self.record_bytes_max.min(record_bytes_format_max());
        let mut batch_bytes = 0u64;
        for (index, record) in records.iter().enumerate() {
            let index = index as u32;
            let key_bytes = record.key.as_ref().map_or(0, |key| key.len() as u64);
            if key_bytes > self.key_bytes_max {
                return Err(LimitError::KeyTooLarge {
                    index,
                    bytes: key_bytes,
                    max: self.key_bytes_max,
                });
            }
            let count = record.headers.len() as u64;
            if count > u64::from(self.headers_per_record_max) {
                return Err(LimitError::TooManyHeaders {
                    index,
                    count,
                    max: self.headers_per_record_max,
                });
            }
            let bytes = record.user_bytes();
            if bytes > record_bytes_max {
                return Err(LimitError::RecordTooLarge { index, bytes, max: record_bytes_max });
            }
            batch_bytes += format::frame_bytes(record);
        }
        if batch_bytes > self.append_bytes_max {
            return Err(LimitError::BatchTooLarge {
                bytes: batch_bytes,
                max: self.append_bytes_max,
            });
        }
        Ok(batch_bytes)
    }
}

/// The largest user payload a frame can carry even with the most headers the format allows.
fn record_bytes_format_max() -> u64 {
    // Conservative: leave room for the fixed fields and 8 bytes per header at the default cap.
    u64::from(FRAME_PAYLOAD_BYTES_MAX) - format::RECORD_FIXED_BYTES as u64 - 8 * 65_536
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn record(key: usize, value: usize, headers: usize) -> Record {
        Record {
            key: Some(Bytes::from(vec![b'k'; key])),
            value: Bytes::from(vec![b'v'; value]),
            headers: vec![(Bytes::from_static(b"h"), Bytes::new()); headers],
            timestamp_ms: 0,
            tombstone: false,
        }
    }

    #[test]
    fn each_limit_names_its_reason() {
        let limits = Limits {
            record_bytes_max: 100,
            key_bytes_max: 10,
            headers_per_record_max: 2,
            append_records_max: 3,
            append_bytes_max: 400,
        };
        let cases: &[(Vec<Record>, Option<Reason>)] = &[
            (vec![record(10, 90, 0)], None),
            (vec![record(10, 91, 0)], Some(Reason::RecordTooLarge)),
            (vec![record(11, 0, 0)], Some(Reason::KeyTooLarge)),
            (vec![record(1, 0, 3)], Some(Reason::TooManyHeaders)),
            (vec![record(1, 0, 0); 4], Some(Reason::BatchTooManyRecords)),
            (vec![record(10, 90, 0); 3], Some(Reason::BatchTooLarge)),
        ];
        for (records, expected) in cases {
            let got = limits.check(records).err().map(|error| error.reason());
            assert_eq!(got, *expected, "records {:?}", records.len());
        }
    }

    #[test]
    fn check_returns_the_encoded_size() {
        let records = vec![record(2, 3, 1), record(0, 0, 0)];
        let expected: u64 = records.iter().map(format::frame_bytes).sum();
        assert_eq!(Limits::default().check(&records), Ok(expected));
    }
}
