//! Sequential frame scanning over a file: the shared engine of recovery, verify and reads.

use std::io;

use bytes::{Bytes, BytesMut};

use crate::format::{
    self, CheckedFrame, FRAME_HEADER_BYTES, FrameError, FrameKind, SEAL_TRAILER_BYTES,
    SEGMENT_HEADER_BYTES, SealTrailer,
};
use crate::index::{IndexEntry, SparseIndex};
use crate::record::StoredRecord;
use crate::storage::StorageFile;

/// Reads frames at increasing positions through a buffer of whole chunks, so a scan costs one
/// `pread` per chunk rather than per frame. Records decoded from it point into the chunk.
pub(crate) struct FrameReader<'a> {
    file: &'a dyn StorageFile,
    /// Bytes of the file this reader may look at; nothing past it is trusted.
    end: u64,
    chunk_bytes: usize,
    chunk: Bytes,
    chunk_start: u64,
}

impl<'a> FrameReader<'a> {
    pub(crate) fn new(file: &'a dyn StorageFile, end: u64, chunk_bytes: usize) -> FrameReader<'a> {
        FrameReader { file, end, chunk_bytes, chunk: Bytes::new(), chunk_start: 0 }
    }

    pub(crate) fn end(&self) -> u64 {
        self.end
    }

    /// Checks the frame at `position` (which must be below `end`).
    pub(crate) fn check_at(
        &mut self,
        position: u64,
    ) -> io::Result<Result<CheckedFrame, FrameError>> {
        assert!(position < self.end, "check_at past the readable end");
        if !self.buffered(position, FRAME_HEADER_BYTES as u64) {
            self.refill(position, self.chunk_bytes)?;
        }
        let at = (position - self.chunk_start) as usize;
        match format::check_frame(&self.chunk[at..]) {
            Err(FrameError::Incomplete { needed, .. })
                if self.chunk_start + (self.chunk.len() as u64) < self.end =>
            {
                self.refill(position, self.chunk_bytes.max(needed as usize))?;
                Ok(format::check_frame(&self.chunk[..]))
            }
            other => Ok(other),
        }
    }

    /// Decodes the record frame at `position`, which `check_at` has just accepted.
    pub(crate) fn decode_at(&mut self, position: u64) -> Result<(StoredRecord, u64), FrameError> {
        let at = (position - self.chunk_start) as usize;
        format::decode_record(&self.chunk, at)
    }

    fn buffered(&self, position: u64, bytes: u64) -> bool {
        position >= self.chunk_start
            && position + bytes <= self.chunk_start + self.chunk.len() as u64
    }

    fn refill(&mut self, position: u64, bytes: usize) -> io::Result<()> {
        let wanted = (bytes as u64).min(self.end - position) as usize;
        let mut buffer = BytesMut::zeroed(wanted);
        let read = self.file.read_at(&mut buffer, position)?;
        buffer.truncate(read);
        self.chunk = buffer.freeze();
        self.chunk_start = position;
        Ok(())
    }
}

/// What a scan of a segment's frames found.
#[derive(Debug)]
pub(crate) struct ScanOutcome {
    /// Offset one past the last valid record.
    pub end_offset: u64,
    /// File position one past the last valid frame (the seal trailer included, if any).
    pub valid_bytes: u64,
    pub seal: Option<SealTrailer>,
    /// Where and why the scan stopped before the end of the file.
    pub stop: Option<(u64, FrameError)>,
    pub index: SparseIndex,
}

/// Scans frames from the header to `file_len`, stopping at the first bad one, and rebuilds the
/// sparse index on the way.
pub(crate) fn scan_frames(
    file: &dyn StorageFile,
    file_len: u64,
    base_offset: u64,
    index_interval_bytes: u32,
    chunk_bytes: usize,
) -> io::Result<ScanOutcome> {
    let mut reader = FrameReader::new(file, file_len, chunk_bytes);
    let mut index = SparseIndex::new(index_interval_bytes);
    let mut position = SEGMENT_HEADER_BYTES;
    let mut expected = base_offset;
    let mut seal = None;
    let mut stop = None;
    while position < file_len {
        let frame = match reader.check_at(position)? {
            Ok(frame) => frame,
            Err(error) => {
                stop = Some((position, error));
                break;
            }
        };
        match frame.kind {
            FrameKind::Record { offset, .. } if offset == expected => {
                if index.wants_entry_at(position, index.last_position()) {
                    index.push(IndexEntry { offset, position });
                }
                expected += 1;
                position += frame.frame_bytes;
            }
            FrameKind::Record { offset, .. } => {
                stop = Some((position, FrameError::OffsetMismatch { expected, found: offset }));
                break;
            }
            FrameKind::Seal(trailer)
                if trailer.record_count == expected && trailer.data_bytes == position =>
            {
                seal = Some(trailer);
                position += SEAL_TRAILER_BYTES;
                if position < file_len {
                    stop = Some((position, FrameError::MisplacedSeal));
                }
                break;
            }
            FrameKind::Seal(_) => {
                stop = Some((position, FrameError::MisplacedSeal));
                break;
            }
        }
    }
    Ok(ScanOutcome { end_offset: expected, valid_bytes: position, seal, stop, index })
}

/// One damaged frame found by [`crate::verify_segment`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadFrame {
    pub position: u64,
    pub error: FrameError,
}

/// Reports every bad frame of a file without changing it. After a bad frame the scan resumes at
/// the next position where a whole frame checks out, so one damaged frame does not hide others.
pub(crate) fn verify_frames(
    file: &dyn StorageFile,
    file_len: u64,
    base_offset: u64,
    chunk_bytes: usize,
    bad_frames_max: usize,
) -> io::Result<(u64, Vec<BadFrame>, Option<SealTrailer>)> {
    let mut reader = FrameReader::new(file, file_len, chunk_bytes);
    let mut bad = Vec::new();
    let mut records = 0;
    let mut seal = None;
    // Unknown right after a bad frame: the frames it hid may have held any number of records.
    let mut expected = Some(base_offset);
    let mut position = SEGMENT_HEADER_BYTES;
    while position < file_len && bad.len() < bad_frames_max {
        match reader.check_at(position)? {
            Ok(frame) => {
                match frame.kind {
                    FrameKind::Record { offset, .. } => {
                        if let Some(expected) = expected.filter(|&expected| expected != offset) {
                            let error = FrameError::OffsetMismatch { expected, found: offset };
                            bad.push(BadFrame { position, error });
                        }
                        records += 1;
                        expected = Some(offset + 1);
                    }
                    FrameKind::Seal(trailer) => {
                        let last = position + frame.frame_bytes == file_len;
                        let count_ok = expected.is_none_or(|count| count == trailer.record_count);
                        if !last || trailer.data_bytes != position || !count_ok {
                            bad.push(BadFrame { position, error: FrameError::MisplacedSeal });
                        }
                        seal = Some(trailer);
                    }
                }
                position += frame.frame_bytes;
            }
            Err(error) => {
                bad.push(BadFrame { position, error });
                expected = None;
                position = resync(&mut reader, position + 1)?;
            }
        }
    }
    Ok((records, bad, seal))
}

/// What follows a bad frame: the valid record frames found by resynchronising after it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct AfterBadFrame {
    pub valid_frames: u64,
    /// One of them starts a group-commit write (see [`crate::format::FLAG_BATCH_START`]).
    pub batch_start_seen: bool,
    /// File position one past the last valid record frame.
    pub last_end: u64,
    /// Offset of the last valid record frame.
    pub last_offset: Option<u64>,
}

/// Looks for valid record frames after the bad frame at `bad_position` (which held offset
/// `bad_offset`), resynchronising byte by byte over every bad stretch, without changing the
/// file. A bad frame's own length field is not trusted to skip it: when that field is what was
/// damaged, trusting it could jump over every later record and call damage a torn tail.
///
/// Only frames that could be this segment's records count: offsets rising from `bad_offset`,
/// and no further ahead of it than the skipped bytes could hold records (each takes at least a
/// minimal frame). A checksum-valid frame inside another record's value (a record carrying a
/// segment file, say) rarely passes both.
pub(crate) fn frames_after(
    file: &dyn StorageFile,
    file_len: u64,
    (bad_position, bad_offset): (u64, u64),
    chunk_bytes: usize,
) -> io::Result<AfterBadFrame> {
    let mut reader = FrameReader::new(file, file_len, chunk_bytes);
    let mut after = AfterBadFrame { last_end: bad_position, ..AfterBadFrame::default() };
    let mut position = resync(&mut reader, bad_position + 1)?;
    while position < file_len {
        let frame = match reader.check_at(position)? {
            Ok(frame) => frame,
            Err(_) => {
                position = resync(&mut reader, position + 1)?;
                continue;
            }
        };
        match frame.kind {
            FrameKind::Record { offset, batch_start }
                if offset >= bad_offset
                    && after.last_offset.is_none_or(|last| offset > last)
                    && offset < u64::MAX
                    && offset - bad_offset <= (position - bad_position) / MIN_FRAME_BYTES =>
            {
                after.valid_frames += 1;
                after.batch_start_seen |= batch_start;
                after.last_end = position + frame.frame_bytes;
                after.last_offset = Some(offset);
                position += frame.frame_bytes;
            }
            FrameKind::Seal(_) => position += frame.frame_bytes,
            FrameKind::Record { .. } => position = resync(&mut reader, position + 1)?,
        }
    }
    Ok(after)
}

/// The fewest bytes a record frame takes: records between two offsets need this much each.
const MIN_FRAME_BYTES: u64 = (FRAME_HEADER_BYTES + format::RECORD_FIXED_BYTES) as u64;

/// The first position at or after `from` where a whole valid frame starts, or the end.
fn resync(reader: &mut FrameReader<'_>, from: u64) -> io::Result<u64> {
    let mut candidate = from;
    while candidate + FRAME_HEADER_BYTES as u64 <= reader.end() {
        if reader.check_at(candidate)?.is_ok() {
            return Ok(candidate);
        }
        candidate += 1;
    }
    Ok(reader.end())
}
