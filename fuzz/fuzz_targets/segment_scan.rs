//! Fuzzes the segment scanner: the code that reads a segment file's frames at recovery
//! (`Segment::open`, and `Segment::open_read_only` for sealed ranges), at verify
//! (`verify_segment`) and at reads, with `format::check_frame` and `format::decode_record` under
//! all of them. The file lives on `SimStorage`, the in-memory disk the simulator uses.
//!
//! Frames carry a CRC32C that a fuzzer cannot forge, so the target can fix them up: with the
//! `FIX_CHECKSUMS` bit it walks the file and writes the right checksum into everything that looks
//! like a frame header, then flips one bit the input names, so damage among valid frames is
//! reached too. Without a header bit, the input is the whole file, header included.
//!
//! What must hold, whatever the bytes:
//! * a frame that checks out lies within the bytes, and decodes and re-encodes to exactly them
//!   (the record frame is canonical);
//! * recovery of a file with a valid header succeeds; it only ever cuts (what is left is a
//!   prefix of the file), never reports a valid end beyond what is left, counts its records as
//!   its offsets say, and run again it finds the same end and cuts nothing more;
//! * every record recovery admits can be read back, at consecutive offsets, each re-encoding to
//!   the bytes of its own frame, and the frames end where recovery says the data ends;
//! * opening read-only changes no byte, and verify reports bad frames in order, inside the file.
//!
//! Input: byte 0 holds flags, byte 1 the read chunk size, byte 2 the base offset, bytes 3-4 the
//! bit to flip, byte 5 the largest write recovery assumes (in 16-byte units); the rest is the
//! file's frames.

#![no_main]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use malachi_log::format::{
    self, FRAME_HEADER_BYTES, FrameKind, RECORD_MAGIC, SEAL_MAGIC, SEAL_TRAILER_BYTES,
    SEGMENT_HEADER_BYTES, SegmentHeader,
};
use malachi_log::segment::VERIFY_BAD_FRAMES_MAX;
use malachi_log::{
    Committer, GroupCommitConfig, Limits, OpenMode, Segment, SegmentConfig, SimStorage, Storage,
    StoredRecord, create_dir_durable, verify_segment,
};

/// The input carries only frames: the target writes a valid header in front of them.
const WITH_HEADER: u8 = 1;
/// Checksums are made right before the flip (see the module header).
const FIX_CHECKSUMS: u8 = 2;
/// One bit of the file is flipped after the checksums are fixed.
const FLIP_BIT: u8 = 4;

const SEGMENT_ID: u64 = 1;
const SETTINGS_BYTES: usize = 6;

fuzz_target!(|input: &[u8]| {
    let Some((settings, frames)) = input.split_first_chunk::<SETTINGS_BYTES>() else {
        return;
    };
    let [flags, chunk, base, flip_low, flip_high, write_max] = *settings;
    // The low half of the byte's values are small offsets, the high half the last offsets of
    // the u64 range, where counting past the last record overflows.
    let base_offset = match base {
        0..0x80 => u64::from(base),
        _ => u64::MAX - u64::from(u8::MAX - base),
    };
    let mut file = Vec::with_capacity(frames.len() + SEGMENT_HEADER_BYTES as usize);
    if flags & WITH_HEADER != 0 {
        file.extend_from_slice(&SegmentHeader { segment_id: SEGMENT_ID, base_offset }.encode());
    }
    file.extend_from_slice(frames);
    if flags & FIX_CHECKSUMS != 0 {
        fix_checksums(&mut file);
    }
    if flags & FLIP_BIT != 0 && !file.is_empty() {
        let bit = usize::from(u16::from_le_bytes([flip_low, flip_high]));
        let at = (bit / 8) % file.len();
        file[at] ^= 1 << (bit % 8);
    }
    check_every_frame(&file);

    // Small chunks cross frame boundaries; a small write size makes damage provable by size.
    let write_bytes_max = u64::from(write_max) * 16;
    let config = SegmentConfig {
        limits: Limits { append_bytes_max: write_bytes_max, ..Limits::default() },
        group_commit: GroupCommitConfig {
            batch_bytes_max: write_bytes_max,
            ..GroupCommitConfig::default()
        },
        index_interval_bytes: 64,
        read_chunk_bytes: u32::from(chunk) + 1,
        ..SegmentConfig::default()
    };
    // The flip may land in the header, and a raw file may carry a valid one.
    let header = SegmentHeader::decode(&file);
    let header_valid = header.is_ok_and(|header| header.segment_id == SEGMENT_ID);
    check_recovery(&file, header_valid, config);
    check_read_only(&file, config);
    check_verify(&file);
});

/// Writes the right checksum into every frame found by walking `file` from the first frame:
/// a frame header whose frame fits is fixed and skipped, anything else is stepped over a byte at
/// a time.
fn fix_checksums(file: &mut [u8]) {
    let mut position = SEGMENT_HEADER_BYTES as usize;
    while position + FRAME_HEADER_BYTES <= file.len() {
        let magic = [file[position], file[position + 1]];
        let length_field: [u8; 4] = file[position + 2..position + 6].try_into().expect("4");
        let end = position + FRAME_HEADER_BYTES + u32::from_le_bytes(length_field) as usize;
        if (magic != RECORD_MAGIC && magic != SEAL_MAGIC) || end > file.len() {
            position += 1;
            continue;
        }
        let crc = crc32c_append(&length_field, &file[position + FRAME_HEADER_BYTES..end]);
        file[position + 6..position + 10].copy_from_slice(&crc.to_le_bytes());
        position = end;
    }
}

/// CRC32C over a frame's length field then its payload, as the format defines the checksum.
fn crc32c_append(length_field: &[u8], payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(length_field), payload)
}

/// Every position of the file where a frame checks out: it fits, and a record frame decodes and
/// re-encodes to exactly its bytes.
fn check_every_frame(file: &[u8]) {
    let chunk = Bytes::copy_from_slice(file);
    let mut position = SEGMENT_HEADER_BYTES.min(file.len() as u64) as usize;
    while position < file.len() {
        let Ok(frame) = format::check_frame(&file[position..]) else {
            position += 1;
            continue;
        };
        let end = position + frame.frame_bytes as usize;
        assert!(end <= file.len(), "a frame checked out past the end of the bytes");
        if let FrameKind::Record { offset, batch_start } = frame.kind {
            let (stored, frame_bytes) =
                format::decode_record(&chunk, position).expect("a checked frame decodes");
            assert_eq!((stored.offset, frame_bytes), (offset, frame.frame_bytes));
            assert_eq!(encode(&stored, batch_start), &file[position..end], "not canonical");
        } else {
            assert_eq!(frame.frame_bytes, SEAL_TRAILER_BYTES);
        }
        position = end;
    }
}

fn encode(stored: &StoredRecord, batch_start: bool) -> Vec<u8> {
    let mut out = Vec::new();
    format::encode_record(&mut out, stored.offset, &stored.record, batch_start);
    out
}

/// Opens the file for appends, as after a crash, and checks what recovery made of it.
fn check_recovery(file: &[u8], header_valid: bool, config: SegmentConfig) {
    let (storage, path) = store(file);
    let opened =
        Segment::open(dyn_storage(&storage), &dir(), SEGMENT_ID, config, &Committer::solo());
    let (segment, report) = match opened {
        Ok(opened) => opened,
        Err(error) => {
            assert!(!header_valid, "recovery refused a file with a valid header: {error}");
            return;
        }
    };
    let left = storage.written_bytes(&path).expect("recovery never deletes the file");
    assert_eq!(left.len() as u64, file.len() as u64 - report.bytes_truncated);
    assert_eq!(&left[..], &file[..left.len()], "recovery changed a byte it kept");
    let status = segment.status();
    assert!(status.durable_bytes <= left.len() as u64, "a valid end beyond the file");
    assert!(status.durable_bytes >= SEGMENT_HEADER_BYTES);
    assert_eq!(report.records, status.durable_offset - status.base_offset);
    if let Some(sealed) = status.sealed {
        assert!(sealed.data_bytes <= left.len() as u64, "a sealed end beyond the file");
    }
    let trusted = status.damage.is_none() && !ends_in_trailer(&left);
    check_reads(&segment, &left, trusted);
    drop(segment);

    // Recovery of a recovered file is the identity (a file it left alone would only repeat the
    // first recovery, so only a cut file is opened again).
    if report.bytes_truncated == 0 {
        return;
    }
    let (again, report_again) =
        Segment::open(dyn_storage(&storage), &dir(), SEGMENT_ID, config, &Committer::solo())
            .expect("a recovered file opens again");
    assert_eq!(report_again.bytes_truncated, 0, "a second recovery cut more");
    let status_again = again.status();
    assert_eq!(
        (status_again.durable_offset, status_again.durable_bytes, status_again.sealed),
        (status.durable_offset, status.durable_bytes, status.sealed),
        "a second recovery found another end"
    );
}

/// Whether the file ends in a seal trailer that recovery trusts without scanning.
fn ends_in_trailer(file: &[u8]) -> bool {
    let Some(position) = file.len().checked_sub(SEAL_TRAILER_BYTES as usize) else {
        return false;
    };
    match format::check_frame(&file[position..]) {
        Ok(frame) => {
            matches!(frame.kind, FrameKind::Seal(seal) if seal.data_bytes == position as u64)
        }
        Err(_) => false,
    }
}

/// Reads from the first offset on, a few records at a time. Every batch continues where the last
/// ended. When recovery scanned every frame it admitted (`trusted`), every read succeeds, the
/// records are the file's frames in order, and they end where the data ends.
fn check_reads(segment: &Segment, file: &[u8], trusted: bool) {
    let status = segment.status();
    let mut offset = status.base_offset;
    let mut position = SEGMENT_HEADER_BYTES as usize;
    while offset < status.durable_offset {
        let batch = match segment.read(offset, 3, 256) {
            Ok(batch) => batch,
            Err(error) => {
                assert!(!trusted, "a record recovery admitted cannot be read: {error}");
                return;
            }
        };
        if batch.records.is_empty() {
            // Below the end, only a segment opened on a trailer it did not scan may find nothing
            // (fewer frames than the trailer counts); the broker answers that `storage_damaged`.
            assert!(!trusted, "a read below the end returned nothing");
            return;
        }
        for stored in &batch.records {
            assert_eq!(stored.offset, offset, "records out of order");
            if trusted {
                let batch_start = file[position + FRAME_HEADER_BYTES + 16] & 4 != 0;
                let frame = encode(stored, batch_start);
                assert_eq!(&file[position..position + frame.len()], &frame[..]);
                position += frame.len();
            }
            offset += 1;
        }
        assert_eq!(batch.next_offset, offset);
    }
    if trusted {
        let data_end = status.sealed.map_or(status.durable_bytes, |seal| seal.data_bytes);
        assert_eq!(position as u64, data_end, "the records do not end where the data does");
    }
}

/// Opening read-only (a range metadata sealed) never changes the file.
fn check_read_only(file: &[u8], config: SegmentConfig) {
    let (storage, path) = store(file);
    let opened = Segment::open_read_only(
        dyn_storage(&storage),
        &dir(),
        SEGMENT_ID,
        config,
        &Committer::solo(),
    );
    if let Ok((segment, _)) = opened {
        let status = segment.status();
        assert!(status.durable_bytes <= file.len() as u64, "a valid end beyond the file");
        assert!(status.sealed.is_some(), "a read-only segment takes appends");
        check_reads(&segment, file, false);
    }
    let after = storage.written_bytes(&path).expect("the file is still there");
    assert_eq!(&after[..], file, "opening read-only changed the file");
}

/// Verify lists bad frames at rising positions inside the file, and counts no more records
/// than the file can hold.
fn check_verify(file: &[u8]) {
    let (storage, _) = store(file);
    let Ok(report) = verify_segment(&*storage, &dir(), SEGMENT_ID) else {
        return;
    };
    assert!(report.bad_frames.len() <= VERIFY_BAD_FRAMES_MAX);
    let frames_bytes = file.len() as u64 - SEGMENT_HEADER_BYTES;
    let smallest_frame = (FRAME_HEADER_BYTES + format::RECORD_FIXED_BYTES) as u64;
    assert!(report.records <= frames_bytes / smallest_frame, "more records than fit");
    let mut previous = None;
    for bad in &report.bad_frames {
        assert!(bad.position >= SEGMENT_HEADER_BYTES && bad.position < file.len() as u64);
        assert!(previous.is_none_or(|previous| previous < bad.position), "bad frames unordered");
        previous = Some(bad.position);
    }
}

fn dir() -> PathBuf {
    PathBuf::from("/data/range")
}

/// A fresh simulated disk holding `file` durably as segment 1.
fn store(file: &[u8]) -> (Arc<SimStorage>, PathBuf) {
    let storage = Arc::new(SimStorage::new(0));
    create_dir_durable(&*storage, Path::new("/"), &dir()).expect("the simulated disk is healthy");
    let path = malachi_log::segment_paths(&dir(), SEGMENT_ID).0;
    let handle = storage.open(&path, OpenMode::CreateNew).expect("a new file");
    handle.write_all_at(&[file], 0).expect("the simulated disk is healthy");
    handle.sync_data().expect("the simulated disk is healthy");
    (storage, path)
}

fn dyn_storage(storage: &Arc<SimStorage>) -> Arc<dyn Storage> {
    Arc::clone(storage) as Arc<dyn Storage>
}
