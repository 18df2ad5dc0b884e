//! The wire form of a record (section 2.1): key, value, timestamp and headers, without offset.
//!
//! Header names and values must be present strings. The wire grammar admits absent ones, but no
//! store can persist them, so this decoder refuses them (section 7 item 9): inside a request that
//! is `malformed_request`, inside a batch `malformed_batch`. No byte string is checked for UTF-8.

use bytes::Bytes;

use crate::layout::{Bytes32, List32, PresentStr, Str, U64, wire_struct};

wire_struct! {
    /// One record as it travels in produce requests, fetch answers, pushes and batches.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct Record {
        /// `None` is a record without a key, which differs from an empty key.
        pub key: Option<Bytes> = Str,
        pub value: Bytes = Bytes32,
        /// Producer-supplied milliseconds since the Unix epoch, stored and returned unchanged.
        pub timestamp_ms: u64 = U64,
        /// In wire order; names may repeat (the Node client collapses duplicates on read).
        pub headers: Vec<Header> = List32,
    }
}

wire_struct! {
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct Header {
        pub name: Bytes = PresentStr as "header name",
        pub value: Bytes = PresentStr as "header value",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::DecodeError;
    use crate::primitive::Wire;
    use crate::vectors::hex;

    #[test]
    fn records_decode_or_fail_as_the_table_says() {
        let one_header = Record {
            key: Some(Bytes::from_static(b"k1")),
            value: Bytes::from_static(b"v1"),
            timestamp_ms: 1_767_225_600_000,
            headers: vec![Header { name: "x".into(), value: Bytes::new() }],
        };
        let cases: &[(&str, &str, Result<Record, DecodeError>)] = &[
            (
                "key, value, one header with an empty value",
                "01 00000002 6b31 00000002 7631 0000019b76daa800 \
                 00000001 01 00000001 78 01 00000000",
                Ok(one_header),
            ),
            (
                "no key, empty value, no headers",
                "00 00000000 0000000000000000 00000000",
                Ok(Record::default()),
            ),
            (
                "absent header name",
                "00 00000000 0000000000000000 00000001 00 01 00000004 76767676",
                Err(DecodeError::AbsentStr { field: "header name" }),
            ),
            (
                "absent header value",
                "00 00000000 0000000000000000 00000001 01 00000004 6e6e6e6e 00",
                Err(DecodeError::AbsentStr { field: "header value" }),
            ),
            (
                "key flag 2",
                "02 00000000 0000000000000000 00000000",
                Err(DecodeError::InvalidStrFlag { flag: 2 }),
            ),
            (
                "header count far beyond the bytes",
                "00 00000000 0000000000000000 ffffffff 01 00000000 01 00000000",
                Err(DecodeError::CountTooLarge { count: u32::MAX, remaining: 10 }),
            ),
            (
                "value cut short",
                "00 00000005 6162",
                Err(DecodeError::Truncated { needed: 5, remaining: 2 }),
            ),
        ];
        for (name, input, expected) in cases {
            assert_eq!(Record::decode(hex(input)), *expected, "{name}");
            if let Ok(record) = expected {
                assert_eq!(record.encode_to_bytes().as_ref(), Ok(&hex(input)), "{name}");
            }
        }
    }
}
