//! The node journal: one preallocated file where a group-commit round of many segments becomes
//! durable with one sequential write and one `fdatasync`, the segment files being written
//! behind it and synced at checkpoints (Apache BookKeeper's journal and entry logs).
//!
//! Why: a round that wrote a few KiB to each of hundreds of segment files costs hundreds of
//! small random writes and inode updates to make durable, whatever the barrier (measured here:
//! 256 ranges ran at 0.27 of one range's throughput with one `syncfs` per round, 0.12 with one
//! `fdatasync` per file). The same bytes as one append to a file whose blocks are already
//! allocated cost one sequential write and a cache flush, with no metadata to commit.
//!
//! Layout (`docs/storage-format.md`): a 4 KiB header naming the *checkpoint*, the round replay
//! starts at and where it is, then entries from byte 4096 on, written as a ring. An entry is one segment's batch of one round: the segment file's
//! path (relative to the data directory), the position in that file, and the bytes, under a
//! CRC32C. Rounds are numbered; all entries of a round carry its number.
//!
//! Order of a round: the entries are written and synced here first; only then are the bytes
//! written into the segment files (page cache, no sync) and acknowledged. So a segment file never
//! holds bytes the journal does not hold durably, and after a crash replaying the journal from
//! its checkpoint rebuilds every acknowledged byte the page cache did not write back.
//!
//! A checkpoint marks the next round (its number and position), syncs every segment file
//! written behind before it, then rewrites the header with the mark: the bytes before the mark
//! are free again. The committer runs checkpoints beside the rounds, which go on writing after
//! the mark and wrap to the front when a round does not fit before the end, never over the
//! checkpoint's round; only a journal with no room left waits for one. Replay reads entries from
//! the checkpoint while their numbers continue (an entry of an earlier lap carries a smaller
//! number) and their checksums hold; where that breaks it tries once at the front, where the
//! writer may have wrapped, up to the checkpoint; the next break ends the durable journal.

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::storage::{OpenMode, Storage, StorageFile};

/// Where entries start; the header's block before it.
pub const JOURNAL_HEADER_BYTES: u64 = 4096;
const HEADER_MAGIC: [u8; 4] = *b"MLJH";
const HEADER_VERSION: u16 = 2;
const ENTRY_MAGIC: [u8; 2] = *b"JE";
/// `magic` (2) + `length` (4) + `crc32c` (4).
const ENTRY_FRAME_BYTES: u64 = 10;
/// `sequence` (8) + `position` (8) + `path_len` (2).
const ENTRY_FIXED_BYTES: u64 = 18;
/// The journal file's name in the data directory.
pub const JOURNAL_FILE: &str = "journal";
/// The smallest journal that works: a header and room for one large round.
pub const JOURNAL_BYTES_MIN: u64 = 1024 * 1024;

/// One segment's batch in a round, as the journal records it.
#[derive(Clone, Copy, Debug)]
pub struct JournalEntry<'a> {
    /// The segment file, relative to the journal's directory (or absolute).
    pub path: &'a Path,
    pub position: u64,
    pub bytes: &'a [u8],
}

/// A checkpoint begun: once every file written behind the journal before it is durable,
/// replay may start at this round ([`Journal::checkpoint_done`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointMark {
    sequence: u64,
    position: u64,
    lap: u64,
}

/// What replay did at open.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplayReport {
    pub rounds: u64,
    pub entries: u64,
    pub bytes: u64,
    /// Segment files written and synced by the replay.
    pub files: u64,
    /// Entries whose segment file no longer exists (deleted since), skipped.
    pub skipped: u64,
}

/// The journal file of a node. Rounds are serialised by the committer that owns it.
#[derive(Debug)]
pub struct Journal {
    file: Box<dyn StorageFile>,
    capacity: u64,
    /// Where the next round is written.
    position: u64,
    /// Laps the write position has begun (it wraps to the front when a round does not fit
    /// before the end).
    lap: u64,
    /// Where the checkpoint's round is: the oldest byte replay needs, never written over.
    start: u64,
    /// The lap `start` is on; the write position is on it or on the next.
    start_lap: u64,
    /// The next round's number.
    sequence: u64,
    /// The encoded round, kept to be reused.
    buffer: Vec<u8>,
}

impl Journal {
    /// Opens the journal in `dir` (created, preallocated and synced if missing), replays every
    /// durable entry since its checkpoint into the segment files, syncs them, and records a new
    /// checkpoint. What the page cache shows is not trusted: the file is synced and its clean
    /// pages dropped before it is read, as for segment recovery.
    pub fn open(
        storage: &Arc<dyn Storage>,
        dir: &Path,
        capacity: u64,
    ) -> io::Result<(Journal, ReplayReport)> {
        let capacity = capacity.max(JOURNAL_BYTES_MIN);
        let path = dir.join(JOURNAL_FILE);
        if !storage.exists(&path)? {
            create(&**storage, dir, &path, capacity)?;
        }
        let file = storage.open(&path, OpenMode::Existing)?;
        file.sync_data()?;
        file.drop_clean_cache()?;
        let (sequence, start) = read_header(file.as_ref())?;
        let capacity = file.size_bytes()?.max(JOURNAL_HEADER_BYTES + 1);
        if !(JOURNAL_HEADER_BYTES..=capacity).contains(&start) {
            let error = format!("journal header: checkpoint position {start} outside the file");
            return Err(io::Error::new(io::ErrorKind::InvalidData, error));
        }
        let mut journal = Journal {
            capacity,
            file,
            position: start,
            lap: 0,
            start,
            start_lap: 0,
            sequence,
            buffer: Vec::new(),
        };
        let report = journal.replay(&**storage, dir)?;
        journal.checkpoint_now()?;
        Ok((journal, report))
    }

    /// How much of the journal the rounds since the checkpoint fill, in eighths.
    pub fn eighths_used(&self) -> u64 {
        self.used_bytes() * 8 / (self.capacity - JOURNAL_HEADER_BYTES).max(1)
    }

    /// Bytes of the rounds since the checkpoint (and of the gap a wrap left at the end).
    fn used_bytes(&self) -> u64 {
        if self.lap == self.start_lap {
            self.position - self.start
        } else {
            (self.capacity - self.start) + (self.position - JOURNAL_HEADER_BYTES)
        }
    }

    /// Where a round of `bytes` goes, and on which lap: at the write position, or at the front
    /// after a wrap; `None` if neither has room before the checkpoint's round.
    fn place(&self, bytes: u64) -> Option<(u64, u64)> {
        if self.lap == self.start_lap {
            if self.position + bytes <= self.capacity {
                return Some((self.position, self.lap));
            }
            (JOURNAL_HEADER_BYTES + bytes <= self.start)
                .then_some((JOURNAL_HEADER_BYTES, self.lap + 1))
        } else {
            (self.position + bytes <= self.start).then_some((self.position, self.lap))
        }
    }

    /// Whether a round of these entries fits without a checkpoint.
    pub fn fits(&self, entries: &[JournalEntry<'_>]) -> bool {
        self.place(round_bytes(entries)).is_some()
    }

    /// Whether a round of these entries could ever fit (after a checkpoint).
    pub fn could_fit(&self, entries: &[JournalEntry<'_>]) -> bool {
        JOURNAL_HEADER_BYTES + round_bytes(entries) <= self.capacity
    }

    /// Writes one round's entries and syncs them. After `Ok` they survive a crash. After an
    /// error nothing of the round may be assumed, and the journal must not be used again
    /// before a checkpoint: Linux may have dropped the pages the failed sync did not write.
    /// `sync` is off only for the simulator's canary, which acknowledges before the sync.
    pub fn write_round(&mut self, entries: &[JournalEntry<'_>], sync: bool) -> io::Result<()> {
        let (position, lap) =
            self.place(round_bytes(entries)).expect("a round is written only where it fits");
        let mut buffer = std::mem::take(&mut self.buffer);
        buffer.clear();
        for entry in entries {
            encode_entry(&mut buffer, self.sequence, entry);
        }
        let written = self
            .file
            .write_all_at(&[&buffer], position)
            .and_then(|()| if sync { self.file.sync_data() } else { Ok(()) });
        let length = buffer.len() as u64;
        self.buffer = buffer;
        written?;
        self.position = position + length;
        self.lap = lap;
        self.sequence += 1;
        Ok(())
    }

    /// Begins a checkpoint at the next round. Rounds may go on being written while the files
    /// behind the journal are synced; [`Journal::checkpoint_done`] then frees what precedes it.
    pub fn mark(&self) -> CheckpointMark {
        CheckpointMark { sequence: self.sequence, position: self.position, lap: self.lap }
    }

    /// Records that every segment file written behind the journal before `mark` is durable:
    /// replay starts at the mark's round from now on, and rounds may use the space before it.
    pub fn checkpoint_done(&mut self, mark: CheckpointMark) -> io::Result<()> {
        assert!(mark.lap >= self.start_lap && mark.sequence <= self.sequence, "a current mark");
        self.file.write_all_at(&[&encode_header(mark.sequence, mark.position)], 0)?;
        self.file.sync_data()?;
        self.start = mark.position;
        self.start_lap = mark.lap;
        assert!(self.lap - self.start_lap <= 1, "the writer is never a lap ahead of replay");
        Ok(())
    }

    /// Records that every segment file written behind the journal so far is durable, with no
    /// round written since: rounds start again at the front, all of the journal free.
    pub fn checkpoint_now(&mut self) -> io::Result<()> {
        let header = encode_header(self.sequence, JOURNAL_HEADER_BYTES);
        self.file.write_all_at(&[&header], 0)?;
        self.file.sync_data()?;
        // A new lap, so that a mark taken before this can never be completed after it.
        self.lap += 1;
        self.start_lap = self.lap;
        (self.position, self.start) = (JOURNAL_HEADER_BYTES, JOURNAL_HEADER_BYTES);
        Ok(())
    }

    /// Replays the durable entries after the checkpoint into their segment files.
    fn replay(&mut self, storage: &dyn Storage, dir: &Path) -> io::Result<ReplayReport> {
        let mut report = ReplayReport::default();
        let mut files: Vec<(PathBuf, Box<dyn StorageFile>)> = Vec::new();
        let mut rounds = BTreeSet::new();
        let mut position = self.start;
        let mut wrapped = false;
        let mut expected = self.sequence;
        loop {
            // After a wrap, entries end before the checkpoint's round.
            let limit = if wrapped { self.start } else { self.capacity };
            let entry = read_entry(self.file.as_ref(), position, limit)?;
            // The first round after a checkpoint carries the checkpoint's number.
            let continues =
                |sequence| sequence == expected || (sequence == expected + 1 && !rounds.is_empty());
            let Some(entry) = entry.filter(|entry| continues(entry.sequence)) else {
                if !wrapped && self.start > JOURNAL_HEADER_BYTES {
                    (wrapped, position) = (true, JOURNAL_HEADER_BYTES);
                    continue;
                }
                break;
            };
            expected = entry.sequence;
            rounds.insert(entry.sequence);
            position += entry.encoded_bytes;
            let target = dir.join(&entry.path);
            let file = match files.iter().position(|(path, _)| *path == target) {
                Some(at) => &files[at].1,
                None => match storage.open(&target, OpenMode::Existing) {
                    Ok(file) => {
                        files.push((target, file));
                        &files.last().expect("just pushed").1
                    }
                    Err(error) if error.kind() == io::ErrorKind::NotFound => {
                        report.skipped += 1;
                        continue;
                    }
                    Err(error) => return Err(error),
                },
            };
            file.write_all_at(&[&entry.bytes], entry.position)?;
            report.entries += 1;
            report.bytes += entry.bytes.len() as u64;
        }
        for (_, file) in &files {
            file.sync_data()?;
        }
        report.rounds = rounds.len() as u64;
        report.files = files.len() as u64;
        // The next round continues after the last replayed one.
        self.sequence = rounds.last().map_or(self.sequence, |last| last + 1);
        Ok(report)
    }
}

/// Bytes a round of these entries takes in the journal.
fn round_bytes(entries: &[JournalEntry<'_>]) -> u64 {
    entries.iter().map(|entry| entry_bytes(entry.path, entry.bytes.len())).sum()
}

fn entry_bytes(path: &Path, data_bytes: usize) -> u64 {
    ENTRY_FRAME_BYTES + ENTRY_FIXED_BYTES + path.as_os_str().len() as u64 + data_bytes as u64
}

fn create(storage: &dyn Storage, dir: &Path, path: &Path, capacity: u64) -> io::Result<()> {
    // Under a temporary name, so a crash halfway leaves no journal that looks valid.
    let temporary = dir.join(format!("{JOURNAL_FILE}.new"));
    if storage.exists(&temporary)? {
        storage.remove(&temporary)?;
    }
    let file = storage.open(&temporary, OpenMode::CreateNew)?;
    // Zeros written (not just reserved): overwriting allocated blocks needs no metadata commit,
    // which is what makes a round's `fdatasync` a plain data flush.
    let zeros = vec![0u8; 1024 * 1024];
    let mut at = 0;
    while at < capacity {
        let length = zeros.len().min((capacity - at) as usize);
        file.write_all_at(&[&zeros[..length]], at)?;
        at += length as u64;
    }
    file.write_all_at(&[&encode_header(1, JOURNAL_HEADER_BYTES)], 0)?;
    file.sync_data()?;
    drop(file);
    storage.rename(&temporary, path)?;
    storage.sync_dir(dir)
}

fn encode_header(checkpoint_sequence: u64, checkpoint_position: u64) -> [u8; 32] {
    let mut header = [0u8; 32];
    header[0..4].copy_from_slice(&HEADER_MAGIC);
    header[4..6].copy_from_slice(&HEADER_VERSION.to_le_bytes());
    header[8..16].copy_from_slice(&checkpoint_sequence.to_le_bytes());
    header[16..24].copy_from_slice(&checkpoint_position.to_le_bytes());
    let crc = crc32c::crc32c(&header[0..24]);
    header[24..28].copy_from_slice(&crc.to_le_bytes());
    header
}

/// The checkpoint's round number and position.
fn read_header(file: &dyn StorageFile) -> io::Result<(u64, u64)> {
    let mut header = [0u8; 32];
    let read = file.read_at(&mut header, 0)?;
    let damaged =
        |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("journal header: {what}"));
    if read < header.len() || header[0..4] != HEADER_MAGIC {
        return Err(damaged("not a journal"));
    }
    let stored = u32::from_le_bytes(header[24..28].try_into().expect("four bytes"));
    if crc32c::crc32c(&header[0..24]) != stored {
        return Err(damaged("checksum mismatch"));
    }
    let sequence = u64::from_le_bytes(header[8..16].try_into().expect("eight bytes"));
    match u16::from_le_bytes([header[4], header[5]]) {
        // Version 1 restarted at the front after every checkpoint.
        1 => Ok((sequence, JOURNAL_HEADER_BYTES)),
        HEADER_VERSION => {
            Ok((sequence, u64::from_le_bytes(header[16..24].try_into().expect("eight bytes"))))
        }
        newer => Err(damaged(&format!(
            "version {newer}, and this release reads versions 1 to {HEADER_VERSION}: the \
             directory was written by a newer release, which must open it"
        ))),
    }
}

fn encode_entry(out: &mut Vec<u8>, sequence: u64, entry: &JournalEntry<'_>) {
    let path = entry.path.as_os_str().as_encoded_bytes();
    let path_len = u16::try_from(path.len()).expect("segment paths are short");
    let length = ENTRY_FIXED_BYTES as usize + path.len() + entry.bytes.len();
    let start = out.len();
    out.extend_from_slice(&ENTRY_MAGIC);
    out.extend_from_slice(&u32::try_from(length).expect("rounds fit the journal").to_le_bytes());
    out.extend_from_slice(&[0u8; 4]);
    out.extend_from_slice(&sequence.to_le_bytes());
    out.extend_from_slice(&entry.position.to_le_bytes());
    out.extend_from_slice(&path_len.to_le_bytes());
    out.extend_from_slice(path);
    out.extend_from_slice(entry.bytes);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&out[start + 2..start + 6]), &out[start + 10..]);
    out[start + 6..start + 10].copy_from_slice(&crc.to_le_bytes());
}

/// An entry read back.
struct ReadEntry {
    sequence: u64,
    path: PathBuf,
    position: u64,
    bytes: Vec<u8>,
    encoded_bytes: u64,
}

/// The entry at `position`, or `None` where the durable journal ends (a bad magic, length or
/// checksum: a torn round, the zeros of a fresh file, or an entry of an earlier lap).
/// `limit`: where entries must end.
fn read_entry(file: &dyn StorageFile, position: u64, limit: u64) -> io::Result<Option<ReadEntry>> {
    let mut frame = [0u8; ENTRY_FRAME_BYTES as usize];
    if position + ENTRY_FRAME_BYTES > limit || file.read_at(&mut frame, position)? < frame.len() {
        return Ok(None);
    }
    let length = u64::from(u32::from_le_bytes(frame[2..6].try_into().expect("four bytes")));
    if frame[0..2] != ENTRY_MAGIC
        || length < ENTRY_FIXED_BYTES
        || position + ENTRY_FRAME_BYTES + length > limit
    {
        return Ok(None);
    }
    let mut body = vec![0u8; length as usize];
    if file.read_at(&mut body, position + ENTRY_FRAME_BYTES)? < body.len() {
        return Ok(None);
    }
    let stored = u32::from_le_bytes(frame[6..10].try_into().expect("four bytes"));
    if crc32c::crc32c_append(crc32c::crc32c(&frame[2..6]), &body) != stored {
        return Ok(None);
    }
    let sequence = u64::from_le_bytes(body[0..8].try_into().expect("eight bytes"));
    let target = u64::from_le_bytes(body[8..16].try_into().expect("eight bytes"));
    let path_len = usize::from(u16::from_le_bytes([body[16], body[17]]));
    if ENTRY_FIXED_BYTES as usize + path_len > body.len() {
        return Ok(None);
    }
    let path_bytes = body[18..18 + path_len].to_vec();
    let bytes = body.split_off(18 + path_len);
    // Written from `OsStr::as_encoded_bytes` on Unix, where every byte string is a path.
    let path = PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(
        path_bytes,
    ));
    Ok(Some(ReadEntry {
        sequence,
        path,
        position: target,
        bytes,
        encoded_bytes: ENTRY_FRAME_BYTES + length,
    }))
}

#[cfg(test)]
mod tests;
