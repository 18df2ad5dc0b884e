//! Golden files pin the encoding; property tests prove round trips and that damage is caught.

use std::path::PathBuf;

use bytes::Bytes;
use proptest::prelude::*;

use super::*;

/// The records whose encodings `testdata/` pins, by file name.
fn golden_cases() -> Vec<(&'static str, Vec<u8>)> {
    let keyed = Record {
        key: Some(Bytes::from_static(b"user-42")),
        value: Bytes::from_static(b"hello"),
        headers: vec![(Bytes::from_static(b"trace"), Bytes::from_static(b"ab"))],
        timestamp_ms: 1_767_225_600_000,
        tombstone: false,
    };
    let keyless_tombstone = Record {
        key: None,
        value: Bytes::new(),
        headers: Vec::new(),
        timestamp_ms: 1_767_225_600_001,
        tombstone: true,
    };
    let mut keyed_frame = Vec::new();
    encode_record(&mut keyed_frame, 0, &keyed, false);
    let mut tombstone_frame = Vec::new();
    encode_record(&mut tombstone_frame, 1, &keyless_tombstone, false);
    let header = SegmentHeader { segment_id: 7, base_offset: 0 }.encode().to_vec();
    let seal = SealTrailer { record_count: 2, data_bytes: 137 }.encode().to_vec();
    vec![
        ("segment_header.bin", header),
        ("record_keyed.bin", keyed_frame),
        ("record_keyless_tombstone.bin", tombstone_frame),
        ("seal_trailer.bin", seal),
    ]
}

fn testdata(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata").join(name)
}

#[test]
fn encodings_match_golden_files() {
    for (name, bytes) in golden_cases() {
        let path = testdata(name);
        if std::env::var_os("MALACHI_UPDATE_GOLDEN").is_some() {
            std::fs::write(&path, &bytes).unwrap();
        }
        let golden = std::fs::read(&path).unwrap_or_else(|error| panic!("{name}: {error}"));
        assert_eq!(bytes, golden, "{name} no longer matches its golden file");
    }
}

#[test]
fn golden_segment_decodes() {
    // The golden files laid end to end are a whole sealed segment of two records.
    let mut segment = Vec::new();
    for (_, bytes) in golden_cases() {
        segment.extend_from_slice(&bytes);
    }
    let header = SegmentHeader::decode(&segment).unwrap();
    assert_eq!(header, SegmentHeader { segment_id: 7, base_offset: 0 });
    let chunk = Bytes::from(segment);
    let (first, first_len) = decode_record(&chunk, 32).unwrap();
    assert_eq!(first.offset, 0);
    assert_eq!(first.record.key.as_deref(), Some(&b"user-42"[..]));
    let (second, second_len) = decode_record(&chunk, 32 + first_len as usize).unwrap();
    assert_eq!(
        (second.offset, second.record.key.clone(), second.record.tombstone),
        (1, None, true)
    );
    let seal_at = 32 + first_len + second_len;
    let sealed = check_frame(&chunk[seal_at as usize..]).unwrap();
    assert_eq!(sealed.kind, FrameKind::Seal(SealTrailer { record_count: 2, data_bytes: seal_at }));
}

/// `docs/storage-format.md` shows each golden file as hex; the document must not drift.
#[test]
fn format_document_shows_the_golden_bytes() {
    let doc_path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/storage-format.md");
    let doc = std::fs::read_to_string(doc_path).unwrap();
    for (name, bytes) in golden_cases() {
        let marker = format!("<!-- golden: {name} -->");
        let start =
            doc.find(&marker).unwrap_or_else(|| panic!("document lacks {marker}")) + marker.len();
        let block = &doc[start..];
        let body_start = block.find("```\n").unwrap() + 4;
        let body_end = body_start + block[body_start..].find("```").unwrap();
        let hex: String = block[body_start..body_end]
            .lines()
            .map(|line| line.split('#').next().unwrap_or(""))
            .collect::<String>()
            .split_whitespace()
            .collect();
        let shown: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|at| u8::from_str_radix(&hex[at..at + 2], 16).unwrap())
            .collect();
        assert_eq!(shown, bytes, "document's bytes for {name} differ from the encoder's");
    }
}

#[test]
fn header_refusals() {
    let good = SegmentHeader { segment_id: 1, base_offset: 0 }.encode();
    let mut bad_magic = good;
    bad_magic[0] = b'X';
    let mut bad_crc = good;
    bad_crc[9] ^= 1;
    let mut future = good;
    future[4] = 2;
    let future_crc = crc32c::crc32c(&future[0..28]);
    future[28..32].copy_from_slice(&future_crc.to_le_bytes());
    let cases: Vec<(&[u8], HeaderError)> = vec![
        (&good[..31], HeaderError::Truncated),
        (&bad_magic, HeaderError::BadMagic { found: *b"XLSG" }),
        (&bad_crc, HeaderError::CrcMismatch),
        (&future, HeaderError::UnsupportedVersion { found: 2 }),
    ];
    for (bytes, expected) in cases {
        assert_eq!(SegmentHeader::decode(bytes), Err(expected));
    }
}

pub(crate) fn arb_record() -> impl Strategy<Value = Record> {
    let bytes = |max: usize| proptest::collection::vec(any::<u8>(), 0..max).prop_map(Bytes::from);
    (
        proptest::option::of(bytes(40)),
        bytes(300),
        proptest::collection::vec((bytes(12), bytes(12)), 0..4),
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
    fn record_round_trips(record in arb_record(), offset in any::<u64>()) {
        let mut frame = Vec::new();
        encode_record(&mut frame, offset, &record, false);
        prop_assert_eq!(frame.len() as u64, frame_bytes(&record));
        let (decoded, used) = decode_record(&Bytes::from(frame.clone()), 0).unwrap();
        prop_assert_eq!(used, frame.len() as u64);
        prop_assert_eq!(decoded, StoredRecord { offset, record });
    }

    #[test]
    fn every_single_bit_flip_is_caught(record in arb_record()) {
        let mut frame = Vec::new();
        encode_record(&mut frame, 3, &record, false);
        for bit in 0..frame.len() * 8 {
            let mut damaged = frame.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(check_frame(&damaged).is_err(), "flip of bit {} went unnoticed", bit);
        }
    }

    #[test]
    fn every_truncation_is_incomplete(record in arb_record()) {
        let mut frame = Vec::new();
        encode_record(&mut frame, 3, &record, false);
        for len in 0..frame.len() {
            let is_incomplete = matches!(check_frame(&frame[..len]), Err(FrameError::Incomplete { .. }));
            prop_assert!(is_incomplete, "a frame cut to {} bytes", len);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let chunk = Bytes::from(bytes);
        let _ = check_frame(&chunk);
        let _ = decode_record(&chunk, 0);
        let _ = SegmentHeader::decode(&chunk);
    }

    #[test]
    fn forged_lengths_with_valid_crc_are_rejected(
        record in arb_record(),
        cut in 1usize..8,
    ) {
        // Damage that recomputes the checksum (a bug, not bit rot) must still not decode into
        // fields that overrun the frame: it is refused, or its lengths still add up to the frame
        // (a longer value swallowing the bytes of the headers after it, which then read as
        // fewer or shorter headers: `cc 02ef9c54` in proptest-regressions), and decodes to a
        // record of exactly the frame's size.
        let mut frame = Vec::new();
        encode_record(&mut frame, 0, &record, false);
        let value_len_at = FRAME_HEADER_BYTES + 21;
        let value_len = u32::from_le_bytes(frame[value_len_at..value_len_at + 4].try_into().unwrap());
        frame[value_len_at..value_len_at + 4].copy_from_slice(&(value_len + cut as u32).to_le_bytes());
        let crc = frame_crc(&frame[2..6], &frame[FRAME_HEADER_BYTES..]);
        frame[6..10].copy_from_slice(&crc.to_le_bytes());
        match check_frame(&frame) {
            Err(error) => prop_assert_eq!(error, FrameError::LayoutMismatch),
            Ok(checked) => {
                prop_assert_eq!(checked.frame_bytes, frame.len() as u64);
                let (decoded, used) = decode_record(&Bytes::from(frame.clone()), 0).unwrap();
                prop_assert_eq!(used, frame.len() as u64);
                prop_assert_eq!(frame_bytes(&decoded.record), frame.len() as u64);
            }
        }
    }
}
