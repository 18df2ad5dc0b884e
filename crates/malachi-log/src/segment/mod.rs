//! One segment file: append with group commit, seal, read, recovery on open.
//!
//! [`Segment`] is the thread-safe driver around [`core::Core`]. Group commit is leader/follower:
//! an appender stages its records into the shared pending batch under a short lock, then either
//! finds a flush already running and waits for the durable end to pass its records, or becomes
//! the flusher itself: it takes the whole pending batch, writes it with one vectored write and one
//! `fdatasync` outside the lock, and wakes everyone. No thread exists per segment, and callers
//! that stage without waiting (the simulator, pipelined producers) can flush explicitly.

mod commit;
mod core;
mod scan;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

pub use self::commit::{CommitMetrics, CommitStats, Committer};
pub use self::core::{AppendTicket, CleanClose, Damage, GroupCommitConfig, SealInfo};
pub use self::scan::BadFrame;

use self::core::{Core, FlushJob};
use self::scan::{AfterBadFrame, FrameReader};
use crate::error::{AppendError, OpenError, PoisonCause, ReadError, SealError};
use crate::format::{
    FRAME_HEADER_BYTES, FrameError, FrameKind, SEAL_TRAILER_BYTES, SEGMENT_HEADER_BYTES,
    SealTrailer, SegmentHeader, check_frame,
};
use crate::index::SparseIndex;
use crate::limits::Limits;
use crate::record::{Record, StoredRecord};
use crate::storage::{OpenMode, Storage, StorageFile};

/// Everything a segment needs to know besides its identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentConfig {
    pub limits: Limits,
    pub group_commit: GroupCommitConfig,
    /// One index entry per this many bytes of frames.
    pub index_interval_bytes: u32,
    /// Bytes per `pread` when scanning or reading.
    pub read_chunk_bytes: u32,
    /// A deliberate bug for the simulator's canary, never set outside it: a flush acknowledges
    /// its batch without `fdatasync` (the bytes become durable only when a later seal syncs).
    /// The simulator must report lost writes when this is on; if it does not, its checks are
    /// blind.
    pub canary_ack_before_fsync: bool,
    /// Canary: recovery trusts the page cache (no sync, no cache drop before the scan), so
    /// bytes that never reached the disk are served after a process crash or a failed sync.
    pub canary_trust_page_cache: bool,
    /// Canary: recovery cuts at the first bad frame even when valid frames follow it, dropping
    /// acknowledged records behind damage.
    pub canary_cut_damage: bool,
}

impl Default for SegmentConfig {
    fn default() -> SegmentConfig {
        SegmentConfig {
            limits: Limits::default(),
            group_commit: GroupCommitConfig::default(),
            index_interval_bytes: 4096,
            read_chunk_bytes: 256 * 1024,
            canary_ack_before_fsync: false,
            canary_trust_page_cache: false,
            canary_cut_damage: false,
        }
    }
}

/// What recovery found when a segment was opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Records present after recovery.
    pub records: u64,
    /// Bytes cut from the end of the file (a torn or damaged tail).
    pub bytes_truncated: u64,
    /// The frame that stopped the scan, if it stopped before the end of the file.
    pub stopped_at: Option<(u64, FrameError)>,
    /// The index sidecar could not be used and was rebuilt from the frames.
    pub index_rebuilt: bool,
    /// Damage kept (not cut) because valid frames follow it that a torn write cannot explain.
    pub damage: Option<Damage>,
    /// Valid frames inside the tail that was cut as torn. They belonged to the last write, which
    /// may not have been synced (nothing proves it was); a non-zero count is worth a warning.
    pub valid_frames_cut: u64,
}

/// Records read from a segment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadBatch {
    pub records: Vec<StoredRecord>,
    /// Where the next read continues.
    pub next_offset: u64,
    /// The durable end when the read started.
    pub end_offset: u64,
}

/// A read-only integrity report (see [`verify_segment`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyReport {
    pub segment_id: u64,
    pub records: u64,
    pub bad_frames: Vec<BadFrame>,
    pub sealed: Option<SealInfo>,
    /// More bad frames exist than the report holds.
    pub truncated: bool,
}

/// The most bad frames one verify report lists.
pub const VERIFY_BAD_FRAMES_MAX: usize = 1024;

/// A point-in-time view of a segment's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentStatus {
    pub segment_id: u64,
    pub base_offset: u64,
    pub durable_offset: u64,
    pub durable_bytes: u64,
    pub sealed: Option<SealInfo>,
    pub poisoned: Option<PoisonCause>,
    pub damage: Option<Damage>,
}

/// File names of a segment inside its directory.
pub fn segment_paths(dir: &Path, segment_id: u64) -> (PathBuf, PathBuf) {
    (dir.join(format!("{segment_id:020}.seg")), dir.join(format!("{segment_id:020}.idx")))
}

/// The fence marker of a segment: present (and durable) once a failover fenced the copy, so a
/// restarted broker still refuses its primary's appends (see [`Segment::fence`]).
pub fn fence_path(dir: &Path, segment_id: u64) -> PathBuf {
    dir.join(format!("{segment_id:020}.fence"))
}

/// A segment file open for appends and reads. Always shared (`Arc`): it registers itself with
/// its node's [`Committer`] when it has records to make durable.
#[derive(Debug)]
pub struct Segment {
    segment_id: u64,
    storage: Arc<dyn Storage>,
    /// The data file, as the node journal names it (relative to the journal's directory).
    data_path: PathBuf,
    index_path: PathBuf,
    file: Box<dyn StorageFile>,
    config: SegmentConfig,
    core: Mutex<Core>,
    /// The node's group commit, which writes and syncs this segment's staged batches together
    /// with every other segment's.
    committer: Arc<Committer>,
    /// This segment, as the committer holds it.
    me: Weak<Segment>,
}

/// Whether segment `segment_id`'s file is a create that never became durable: no longer than a
/// header, and either shorter than one or all zeros (a failed `fdatasync` lost the header write
/// but kept the length). No record is acknowledged before the header is synced, and a record
/// makes the file longer than a header, so such a file holds nothing anyone was promised and may
/// be created again. A longer file with a bad header is damage. It reads what is on the disk
/// (synced, cache dropped), not what the page cache shows.
pub fn is_unborn(storage: &dyn Storage, dir: &Path, segment_id: u64) -> io::Result<bool> {
    let (data_path, _) = segment_paths(dir, segment_id);
    let file = storage.open(&data_path, OpenMode::Existing)?;
    file.sync_data()?;
    file.drop_clean_cache()?;
    if file.size_bytes()? > SEGMENT_HEADER_BYTES {
        return Ok(false);
    }
    let mut header = [0u8; SEGMENT_HEADER_BYTES as usize];
    let read = file.read_at(&mut header, 0)?;
    Ok(read < header.len() || header.iter().all(|&byte| byte == 0))
}

impl Segment {
    /// Creates a new, empty segment file and makes its directory entry durable. `dir` must
    /// exist, durably (see [`crate::storage::create_dir_durable`]).
    pub fn create(
        storage: Arc<dyn Storage>,
        dir: &Path,
        segment_id: u64,
        config: SegmentConfig,
        committer: &Arc<Committer>,
    ) -> Result<Arc<Segment>, OpenError> {
        let (data_path, index_path) = segment_paths(dir, segment_id);
        let file = storage.open(&data_path, OpenMode::CreateNew)?;
        let header = SegmentHeader { segment_id, base_offset: 0 };
        file.write_all_at(&[&header.encode()], 0)?;
        file.sync_data()?;
        storage.sync_dir(dir)?;
        let index = SparseIndex::new(config.index_interval_bytes);
        let core =
            Core::new(0, 0, SEGMENT_HEADER_BYTES, index, None, config.limits, config.group_commit);
        let parts = Parts { segment_id, storage, data_path, index_path, file, config };
        Ok(Segment::assemble(parts, core, committer))
    }

    /// Opens an existing segment that this process has not seen closing cleanly: after a
    /// restart, or after a failed write or sync. What the page cache shows is not trusted: the
    /// file is synced (what is cached becomes durable, or the open fails), its directory entry
    /// too, and its clean cached pages are dropped, so recovery reads what is on the disk. A
    /// sealed segment is then trusted up to its trailer; an unsealed one is scanned and its torn
    /// tail cut, while damage that valid frames follow is kept and reported (see
    /// [`RecoveryReport::damage`]).
    pub fn open(
        storage: Arc<dyn Storage>,
        dir: &Path,
        segment_id: u64,
        config: SegmentConfig,
        committer: &Arc<Committer>,
    ) -> Result<(Arc<Segment>, RecoveryReport), OpenError> {
        Segment::open_as(storage, dir, segment_id, config, committer, Recovery::MayCut)
    }

    /// Opens a segment that metadata has sealed, for reads only, changing nothing in its file.
    /// Without an intact trailer it is damaged (a sealed file is never a torn write): it takes
    /// no appends, serves the records before the first bad frame, and refuses past it.
    pub fn open_read_only(
        storage: Arc<dyn Storage>,
        dir: &Path,
        segment_id: u64,
        config: SegmentConfig,
        committer: &Arc<Committer>,
    ) -> Result<(Arc<Segment>, RecoveryReport), OpenError> {
        Segment::open_as(storage, dir, segment_id, config, committer, Recovery::ReadOnly)
    }

    fn open_as(
        storage: Arc<dyn Storage>,
        dir: &Path,
        segment_id: u64,
        config: SegmentConfig,
        committer: &Arc<Committer>,
        recovery: Recovery,
    ) -> Result<(Arc<Segment>, RecoveryReport), OpenError> {
        let (data_path, index_path) = segment_paths(dir, segment_id);
        let file = storage.open(&data_path, OpenMode::Existing)?;
        if !crate::canary(config.canary_trust_page_cache) {
            // Behind a journal, a failed sync here may drop acknowledged bytes only the journal
            // still holds (written behind it, not yet checkpointed): the committer must stop
            // until a restart replays them, as for a failed sync in a round.
            file.sync_data().inspect_err(|_| committer.sync_failed())?;
            storage.sync_dir(dir)?;
            file.drop_clean_cache()?;
        }
        let file_len = file.size_bytes()?;
        let mut header_bytes = [0u8; SEGMENT_HEADER_BYTES as usize];
        let read = file.read_at(&mut header_bytes, 0)?;
        let header = SegmentHeader::decode(&header_bytes[..read])?;
        if header.segment_id != segment_id {
            return Err(OpenError::WrongSegment { expected: segment_id, found: header.segment_id });
        }
        let recovered = match sealed_trailer(file.as_ref(), file_len, header)? {
            Some(trailer) => {
                open_sealed(&*storage, file.as_ref(), &index_path, header, trailer, &config)?
            }
            None => recover_unsealed(file.as_ref(), file_len, header, &config, recovery)
                .inspect_err(|_| committer.sync_failed())?,
        };
        let (mut core, report) = recovered;
        core.fenced = storage.exists(&fence_path(dir, segment_id))?;
        let parts = Parts { segment_id, storage, data_path, index_path, file, config };
        Ok((Segment::assemble(parts, core, committer), report))
    }

    /// Closes an idle segment for a later [`Segment::reopen_clean`]: returns where it ends, with
    /// no I/O and without waiting (callers hold other locks). `None` (and nothing closed) if
    /// anything is staged, flushing, poisoned or damaged, or its lock is busy. The caller must
    /// drop its last handle afterwards.
    pub fn close_clean(&self) -> Option<CleanClose> {
        let core = self.core.try_lock().ok()?;
        if !core.is_idle() {
            return None;
        }
        Some(CleanClose {
            durable_offset: core.durable_offset,
            durable_bytes: core.durable_bytes,
            sealed: core.sealed.is_some(),
        })
    }

    /// Records that metadata sealed this segment at `end_offset`: if the file holds fewer
    /// records, reads from its end on are refused as damage rather than answered as if the
    /// records were not there yet.
    pub fn expect_end(&self, end_offset: u64) {
        let mut core = self.lock();
        if core.damage.is_none() && core.durable_offset < end_offset {
            let missing =
                FrameError::Incomplete { available: 0, needed: FRAME_HEADER_BYTES as u64 };
            core.damage = Some(Damage {
                position: core.durable_bytes,
                offset: core.durable_offset,
                error: missing,
                frames_after: 0,
            });
        }
    }

    /// Reopens a segment this process closed cleanly: nothing is synced, dropped or scanned
    /// (the index sidecar is used when it matches), because everything below the recorded end
    /// was durable and nothing was written after it.
    pub fn reopen_clean(
        storage: Arc<dyn Storage>,
        dir: &Path,
        segment_id: u64,
        config: SegmentConfig,
        committer: &Arc<Committer>,
        clean: CleanClose,
    ) -> Result<Arc<Segment>, OpenError> {
        let (data_path, index_path) = segment_paths(dir, segment_id);
        let file = storage.open(&data_path, OpenMode::Existing)?;
        let file_len = file.size_bytes()?;
        let mut header_bytes = [0u8; SEGMENT_HEADER_BYTES as usize];
        let read = file.read_at(&mut header_bytes, 0)?;
        let header = SegmentHeader::decode(&header_bytes[..read])?;
        if header.segment_id != segment_id {
            return Err(OpenError::WrongSegment { expected: segment_id, found: header.segment_id });
        }
        let core = if clean.sealed {
            let trailer =
                sealed_trailer(file.as_ref(), file_len, header)?.ok_or(OpenError::Changed)?;
            open_sealed(&*storage, file.as_ref(), &index_path, header, trailer, &config)?.0
        } else {
            if file_len != clean.durable_bytes {
                return Err(OpenError::Changed);
            }
            let index = load_index(&*storage, file.as_ref(), &index_path, header, &config, clean)?;
            Core::new(
                header.base_offset,
                clean.durable_offset,
                clean.durable_bytes,
                index,
                None,
                config.limits,
                config.group_commit,
            )
        };
        let mut core = core;
        core.fenced = storage.exists(&fence_path(dir, segment_id))?;
        let parts = Parts { segment_id, storage, data_path, index_path, file, config };
        Ok(Segment::assemble(parts, core, committer))
    }

    fn assemble(parts: Parts, core: Core, committer: &Arc<Committer>) -> Arc<Segment> {
        let Parts { segment_id, storage, data_path, index_path, file, config } = parts;
        Arc::new_cyclic(|me| Segment {
            segment_id,
            storage,
            data_path,
            index_path,
            file,
            config,
            core: Mutex::new(core),
            committer: Arc::clone(committer),
            me: me.clone(),
        })
    }

    pub fn segment_id(&self) -> u64 {
        self.segment_id
    }

    /// Appends `records` and returns once they are durable: written and synced by a round of
    /// the node's group commit.
    pub fn append(&self, records: &[Record]) -> Result<AppendTicket, AppendError> {
        let ticket = self.stage(records)?;
        self.wait_durable(ticket)?;
        Ok(ticket)
    }

    /// Stages `records` into the next group commit without waiting for it. Blocks only while the
    /// pending batch is full (back-pressure), running a round if no one else is.
    pub fn stage(&self, records: &[Record]) -> Result<AppendTicket, AppendError> {
        self.stage_checked(records, Core::check_writable)
    }

    /// Stages `records` copied from another replica of this segment: like [`Segment::stage`],
    /// but a fenced segment takes them (a failover fills the short copies it fenced up to the
    /// end it seals at).
    pub fn stage_fill(&self, records: &[Record]) -> Result<AppendTicket, AppendError> {
        self.stage_checked(records, Core::check_fillable)
    }

    fn stage_checked(
        &self,
        records: &[Record],
        check: fn(&Core) -> Result<(), AppendError>,
    ) -> Result<AppendTicket, AppendError> {
        let encoded_bytes = {
            let core = self.lock();
            check(&core)?;
            core.limits().check(records)?
        };
        let records_count = records.len() as u64;
        let has_room = || {
            let core = self.lock();
            check(&core).is_err() || core.has_room(records_count, encoded_bytes)
        };
        if !has_room() {
            self.committer.wait_until(has_room);
        }
        let mut core = self.lock();
        check(&core)?;
        let first = !core.has_pending();
        let ticket = core.stage(records, encoded_bytes);
        if first {
            // Under the segment's lock, so a round cannot take the batch before it is known.
            self.committer.mark_dirty(self.me.clone());
        }
        Ok(ticket)
    }

    /// Waits until `ticket`'s records are durable, running rounds while nobody else is.
    pub fn wait_durable(&self, ticket: AppendTicket) -> Result<(), AppendError> {
        self.committer.wait_until(|| {
            let core = self.lock();
            core.durable_offset >= ticket.end_offset || core.poisoned.is_some()
        });
        let core = self.lock();
        match core.poisoned {
            Some(cause) if core.durable_offset < ticket.end_offset => {
                Err(AppendError::Poisoned { cause })
            }
            _ => Ok(()),
        }
    }

    /// Makes everything staged so far durable (running rounds as needed). For callers that
    /// drive flushes themselves. Returns the durable end.
    pub fn flush(&self) -> Result<u64, AppendError> {
        self.committer.wait_until(|| {
            let core = self.lock();
            !core.has_pending() && !core.flushing || core.poisoned.is_some()
        });
        let core = self.lock();
        match core.poisoned {
            Some(cause) => Err(AppendError::Poisoned { cause }),
            None => Ok(core.durable_offset),
        }
    }

    /// One past the last record staged (durable or not): where the next append starts. A
    /// replica copy checks it against the offset its primary shipped a batch for.
    pub fn staged_end(&self) -> u64 {
        self.lock().next_offset()
    }

    /// The acknowledgement watermark: every record below it is durable.
    pub fn durable_offset(&self) -> u64 {
        self.lock().durable_offset
    }

    pub fn status(&self) -> SegmentStatus {
        let core = self.lock();
        SegmentStatus {
            segment_id: self.segment_id,
            base_offset: core.base_offset,
            durable_offset: core.durable_offset,
            durable_bytes: core.durable_bytes,
            sealed: core.sealed,
            poisoned: core.poisoned,
            damage: core.damage,
        }
    }

    /// Fences the segment: from now on, and after any restart, it refuses appends
    /// ([`Segment::stage`] answers `Sealed`) but takes fills ([`Segment::stage_fill`]) and a
    /// seal. What was staged before becomes durable first; the marker file is written and
    /// synced (with its directory entry) before this returns. Returns the durable end.
    pub fn fence(&self) -> Result<SegmentStatus, AppendError> {
        self.lock().fenced = true;
        self.flush()?;
        let dir = self.data_path.parent().expect("a segment file lives in a directory");
        let marker = fence_path(dir, self.segment_id);
        let written = (|| {
            if !self.storage.exists(&marker)? {
                let file = self.storage.open(&marker, OpenMode::CreateNew)?;
                file.write_all_at(&[b"fenced\n"], 0)?;
                file.sync_data()?;
                self.storage.sync_dir(dir)?;
            }
            Ok::<_, io::Error>(())
        })();
        if let Err(error) = written {
            let cause = PoisonCause::from_write(&error);
            self.lock().poisoned.get_or_insert(cause);
            return Err(AppendError::Poisoned { cause });
        }
        Ok(self.status())
    }

    /// Whether a failover fenced this copy.
    pub fn is_fenced(&self) -> bool {
        self.lock().fenced
    }

    /// Seals the segment: stops staging, lets a round make what is staged durable, then writes
    /// and syncs the seal trailer. From then on, and after any restart, appends are refused with
    /// the sealed end. Sealing a sealed segment returns the same answer.
    pub fn seal(&self) -> Result<SealInfo, SealError> {
        let target = {
            let mut core = self.lock();
            core.begin_seal();
            core.sealing_at.expect("begin_seal sets where the seal ends")
        };
        self.committer.wait_until(|| {
            let core = self.lock();
            core.durable_offset >= target || core.poisoned.is_some() || core.sealed.is_some()
        });
        let mut core = self.lock();
        if let Some(cause) = core.poisoned {
            return Err(SealError::Poisoned { cause });
        }
        if let Some(seal) = core.sealed {
            return Ok(seal);
        }
        let info = SealInfo { end_offset: core.durable_offset, data_bytes: core.durable_bytes };
        assert_eq!(core.sealing_at, Some(info.end_offset), "a seal ends where staging stopped");
        assert!(!core.flushing && !core.has_pending(), "nothing is in flight behind a seal");
        let trailer = SealTrailer { record_count: info.end_offset, data_bytes: info.data_bytes };
        // The lock is held across this write on purpose: nothing may stage behind a seal.
        let outcome = self
            .file
            .write_all_at(&[&trailer.encode()], info.data_bytes)
            .map_err(|error| PoisonCause::from_write(&error))
            .and_then(|()| self.sync_file().map_err(|error| PoisonCause::Sync(error.kind())));
        if let Err(cause) = outcome {
            core.poisoned.get_or_insert(cause);
            return Err(SealError::Poisoned { cause });
        }
        core.sealed = Some(info);
        let index_bytes = core.index.encode();
        drop(core);
        // The index is derived data: if it cannot be written, the next open rebuilds it.
        let _ = write_index(&*self.storage, &self.index_path, &index_bytes);
        Ok(info)
    }

    /// Reads durable records from `from_offset`: at most `records_max` records and, beyond the
    /// first record, at most `bytes_max` bytes of frames. A damaged frame ends the batch; it is
    /// an error only when it is the first record asked for.
    pub fn read(
        &self,
        from_offset: u64,
        records_max: u32,
        bytes_max: u64,
    ) -> Result<ReadBatch, ReadError> {
        let (start, end_offset, data_end, hint) = {
            let core = self.lock();
            if let Some(cause) = core.poisoned {
                return Err(ReadError::Poisoned { cause });
            }
            if let Some(damage) = core.damage.filter(|damage| from_offset >= damage.offset) {
                return Err(ReadError::Corrupt { position: damage.position, error: damage.error });
            }
            (
                core.base_offset,
                core.durable_offset,
                core.durable_bytes,
                core.index.floor(from_offset),
            )
        };
        if from_offset < start || from_offset > end_offset {
            return Err(ReadError::OffsetOutOfRange {
                requested: from_offset,
                start,
                end: end_offset,
            });
        }
        let mut batch = ReadBatch { records: Vec::new(), next_offset: from_offset, end_offset };
        if from_offset == end_offset || records_max == 0 {
            return Ok(batch);
        }
        let limits = ReadLimits { from_offset, records_max, bytes_max, data_end };
        let hinted = hint.is_some_and(|entry| entry.position > SEGMENT_HEADER_BYTES);
        let first_try = hint.map_or(SEGMENT_HEADER_BYTES, |entry| entry.position);
        let mut outcome =
            self.read_from(first_try, hint.map_or(start, |entry| entry.offset), &limits)?;
        if outcome.0.is_empty() && outcome.1.is_some() && hinted {
            // The index promised a frame it could not deliver: rescan from the first frame.
            outcome = self.read_from(SEGMENT_HEADER_BYTES, start, &limits)?;
        }
        let (records, bad) = outcome;
        if let (true, Some((position, error))) = (records.is_empty(), bad) {
            return Err(ReadError::Corrupt { position, error });
        }
        batch.records = records;
        batch.next_offset = from_offset + batch.records.len() as u64;
        Ok(batch)
    }

    /// Reads frames from `position` (holding offset `expected`): the records wanted, and the
    /// bad frame that stopped the read early, if one did.
    fn read_from(
        &self,
        mut position: u64,
        mut expected: u64,
        limits: &ReadLimits,
    ) -> io::Result<(Vec<StoredRecord>, Option<BadAt>)> {
        let mut reader = FrameReader::new(
            self.file.as_ref(),
            limits.data_end,
            self.config.read_chunk_bytes as usize,
        );
        let mut records = Vec::new();
        let mut bytes = 0u64;
        while position < limits.data_end && records.len() < limits.records_max as usize {
            let frame = match reader.check_at(position)? {
                Ok(frame) => frame,
                Err(error) => return Ok((records, Some((position, error)))),
            };
            let FrameKind::Record { offset, .. } = frame.kind else {
                return Ok((records, Some((position, FrameError::MisplacedSeal))));
            };
            if offset != expected {
                let error = FrameError::OffsetMismatch { expected, found: offset };
                return Ok((records, Some((position, error))));
            }
            if offset >= limits.from_offset {
                if !records.is_empty() && bytes + frame.frame_bytes > limits.bytes_max {
                    break;
                }
                let (record, _) = match reader.decode_at(position) {
                    Ok(decoded) => decoded,
                    Err(error) => return Ok((records, Some((position, error)))),
                };
                assert_eq!(record.offset, offset, "a checked frame decodes to its own offset");
                records.push(record);
                bytes += frame.frame_bytes;
            }
            expected += 1;
            position += frame.frame_bytes;
        }
        Ok((records, None))
    }

    /// For a round: claims the pending batch, if there is one and nothing else owns the tail.
    fn take_job(&self) -> Option<FlushJob> {
        let mut core = self.lock();
        if core.flushing || !core.has_pending() || core.poisoned.is_some() {
            return None;
        }
        core.flushing = true;
        Some(core.take_job())
    }

    /// For a round: writes a claimed batch (no sync).
    fn write_job(&self, job: &FlushJob) -> Result<(), PoisonCause> {
        self.file
            .write_all_at(&[&job.buffer], job.position)
            .map_err(|error| PoisonCause::from_write(&error))
    }

    /// For a round behind the journal: once enough bytes were written behind since the last
    /// time, starts their write-back, so that the checkpoint's `fdatasync` of this file finds
    /// little to write and the round that checkpoints stalls briefly.
    fn nudge_writeback(&self, job: &FlushJob) {
        self.start_writeback(job.position + job.buffer.len() as u64, WRITEBACK_NUDGE_BYTES);
    }

    /// Starts write-back of what was written behind up to `end`, if at least `min_bytes`.
    fn start_writeback(&self, end: u64, min_bytes: u64) {
        let mut core = self.lock();
        if end > core.written_back_to && end - core.written_back_to >= min_bytes {
            let from = core.written_back_to;
            core.written_back_to = end;
            drop(core);
            self.file.start_writeback(from, end - from);
        }
    }

    /// Starts write-back of everything written behind so far (see [`Segment::start_writeback`]).
    fn start_writeback_all(&self) {
        let end = self.lock().durable_bytes;
        self.start_writeback(end, 1);
    }

    /// The data file's path relative to `root` (absolute if it is not under it).
    fn path_under(&self, root: &Path) -> &Path {
        self.data_path.strip_prefix(root).unwrap_or(&self.data_path)
    }

    /// For a round of one segment: `fdatasync` of this file.
    /// `fdatasync` of this file. A failure is also the committer's business: behind a journal
    /// it may have dropped acknowledged bytes only the journal still holds.
    fn sync_file(&self) -> io::Result<()> {
        let synced = self.file.sync_data();
        if synced.is_err() {
            self.committer.sync_failed();
        }
        synced
    }

    /// Whether this segment's batches may be acknowledged without a sync (the canary).
    fn skips_sync(&self) -> bool {
        crate::canary(self.config.canary_ack_before_fsync)
    }

    /// For a round: publishes a batch's outcome. Only a write *and* a sync move the durable end.
    fn finish_job(&self, job: FlushJob, outcome: Result<(), PoisonCause>) {
        self.lock().finish_job(job, outcome);
    }

    fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().expect("segment lock poisoned")
    }
}

/// Bytes written behind the journal before their write-back is started (see
/// [`Segment::nudge_writeback`]): large enough that the device sees few, long writes.
const WRITEBACK_NUDGE_BYTES: u64 = 1024 * 1024;

/// A bad frame's position and what is wrong with it.
type BadAt = (u64, FrameError);

/// What recovery may do to an unsealed file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Recovery {
    /// Cut a torn tail (a write head after a crash).
    MayCut,
    /// Change nothing: anything bad is damage (a segment metadata has sealed).
    ReadOnly,
}

/// What a segment is made of besides its state.
struct Parts {
    segment_id: u64,
    storage: Arc<dyn Storage>,
    data_path: PathBuf,
    index_path: PathBuf,
    file: Box<dyn StorageFile>,
    config: SegmentConfig,
}

struct ReadLimits {
    from_offset: u64,
    records_max: u32,
    bytes_max: u64,
    data_end: u64,
}

/// Scans a segment file without changing it and reports every damaged frame: the read-only
/// check the scrubber runs on sealed segments.
pub fn verify_segment(
    storage: &dyn Storage,
    dir: &Path,
    segment_id: u64,
) -> Result<VerifyReport, OpenError> {
    let (data_path, _) = segment_paths(dir, segment_id);
    let file = storage.open(&data_path, OpenMode::Existing)?;
    let file_len = file.size_bytes()?;
    let mut header_bytes = [0u8; SEGMENT_HEADER_BYTES as usize];
    let read = file.read_at(&mut header_bytes, 0)?;
    let header = SegmentHeader::decode(&header_bytes[..read])?;
    let (records, mut bad_frames, seal) = scan::verify_frames(
        file.as_ref(),
        file_len,
        header.base_offset,
        256 * 1024,
        VERIFY_BAD_FRAMES_MAX + 1,
    )?;
    let truncated = bad_frames.len() > VERIFY_BAD_FRAMES_MAX;
    bad_frames.truncate(VERIFY_BAD_FRAMES_MAX);
    Ok(VerifyReport {
        segment_id: header.segment_id,
        records,
        bad_frames,
        sealed: seal.map(|trailer| SealInfo {
            end_offset: trailer.record_count,
            data_bytes: trailer.data_bytes,
        }),
        truncated,
    })
}

/// The seal trailer at the very end of the file, if there is a valid one: it must say where it
/// stands, and count no fewer records than the header's base offset (a trailer counting fewer
/// cannot be this file's, and trusting it would make the record count negative).
fn sealed_trailer(
    file: &dyn StorageFile,
    file_len: u64,
    header: SegmentHeader,
) -> io::Result<Option<SealTrailer>> {
    if file_len < SEGMENT_HEADER_BYTES + SEAL_TRAILER_BYTES {
        return Ok(None);
    }
    let mut bytes = [0u8; SEAL_TRAILER_BYTES as usize];
    let position = file_len - SEAL_TRAILER_BYTES;
    if file.read_at(&mut bytes, position)? != bytes.len() {
        return Ok(None);
    }
    Ok(match check_frame(&bytes) {
        Ok(frame) => match frame.kind {
            FrameKind::Seal(trailer)
                if trailer.data_bytes == position && trailer.record_count >= header.base_offset =>
            {
                Some(trailer)
            }
            _ => None,
        },
        Err(_) => None,
    })
}

/// Opens a sealed segment without scanning it: the trailer gives its end, the index sidecar its
/// entries (rebuilt by one scan if missing or malformed).
fn open_sealed(
    storage: &dyn Storage,
    file: &dyn StorageFile,
    index_path: &Path,
    header: SegmentHeader,
    trailer: SealTrailer,
    config: &SegmentConfig,
) -> Result<(Core, RecoveryReport), OpenError> {
    let loaded = read_whole(storage, index_path).ok().and_then(|bytes| {
        SparseIndex::decode(&bytes, header.base_offset, trailer.record_count, trailer.data_bytes)
            .ok()
    });
    let index_rebuilt = loaded.is_none();
    let index = match loaded {
        Some(index) => index,
        None => {
            let outcome = scan::scan_frames(
                file,
                trailer.data_bytes,
                header.base_offset,
                config.index_interval_bytes,
                config.read_chunk_bytes as usize,
            )?;
            let _ = write_index(storage, index_path, &outcome.index.encode());
            outcome.index
        }
    };
    let seal = SealInfo { end_offset: trailer.record_count, data_bytes: trailer.data_bytes };
    let core = Core::new(
        header.base_offset,
        trailer.record_count,
        trailer.data_bytes,
        index,
        Some(seal),
        config.limits,
        config.group_commit,
    );
    let report = RecoveryReport {
        records: trailer.record_count - header.base_offset,
        bytes_truncated: 0,
        stopped_at: None,
        index_rebuilt,
        damage: None,
        valid_frames_cut: 0,
    };
    Ok((core, report))
}

/// The index of a cleanly closed unsealed segment: its sidecar if it matches the recorded end,
/// else one scan up to that end.
fn load_index(
    storage: &dyn Storage,
    file: &dyn StorageFile,
    index_path: &Path,
    header: SegmentHeader,
    config: &SegmentConfig,
    clean: CleanClose,
) -> Result<SparseIndex, OpenError> {
    let loaded = read_whole(storage, index_path).ok().and_then(|bytes| {
        SparseIndex::decode(&bytes, header.base_offset, clean.durable_offset, clean.durable_bytes)
            .ok()
    });
    if let Some(index) = loaded {
        return Ok(index);
    }
    let outcome = scan::scan_frames(
        file,
        clean.durable_bytes,
        header.base_offset,
        config.index_interval_bytes,
        config.read_chunk_bytes as usize,
    )?;
    if outcome.stop.is_some() || outcome.end_offset != clean.durable_offset {
        return Err(OpenError::Changed);
    }
    Ok(outcome.index)
}

/// Scans an unsealed segment. A bad frame with nothing valid after it is a torn write (what is
/// cut was never acknowledged: acknowledgements follow `fdatasync`, and a synced frame reads back
/// intact). A bad frame that valid frames follow is cut only if they may all belong to the last
/// write, which nothing proves was synced: no later write started (none of them carries the
/// batch-start flag) and they lie within one write's size of it. Otherwise it is damage among
/// acknowledged records: the file is kept as it is, and the segment is served read-only up to it.
fn recover_unsealed(
    file: &dyn StorageFile,
    file_len: u64,
    header: SegmentHeader,
    config: &SegmentConfig,
    recovery: Recovery,
) -> Result<(Core, RecoveryReport), OpenError> {
    let outcome = scan::scan_frames(
        file,
        file_len,
        header.base_offset,
        config.index_interval_bytes,
        config.read_chunk_bytes as usize,
    )?;
    let mut report = RecoveryReport {
        records: outcome.end_offset - header.base_offset,
        bytes_truncated: 0,
        stopped_at: outcome.stop,
        index_rebuilt: true,
        damage: None,
        valid_frames_cut: 0,
    };
    let seal = outcome.seal.map(|trailer| SealInfo {
        end_offset: trailer.record_count,
        data_bytes: trailer.data_bytes,
    });
    if let Some((position, error)) = outcome.stop.filter(|_| seal.is_none()) {
        let chunk_bytes = config.read_chunk_bytes as usize;
        let bad = (position, outcome.end_offset);
        let after = scan::frames_after(file, file_len, bad, chunk_bytes)?;
        if recovery == Recovery::ReadOnly || is_damage(&after, position, config) {
            let damage = Damage {
                position,
                offset: outcome.end_offset,
                error,
                frames_after: after.valid_frames,
            };
            report.damage = Some(damage);
            let mut core =
                core_at(header, outcome.end_offset, position, outcome.index, None, config);
            // `frames_after` keeps offsets below u64::MAX and at or above the damage.
            let end_offset = after.last_offset.map_or(outcome.end_offset, |last| last + 1);
            assert!(end_offset >= outcome.end_offset, "a damaged segment ends after its damage");
            let data_bytes = after.last_end.max(position);
            core.sealed = Some(SealInfo { end_offset, data_bytes });
            core.damage = Some(damage);
            return Ok((core, report));
        }
        report.valid_frames_cut = after.valid_frames;
    }
    if recovery == Recovery::ReadOnly {
        // Intact frames and no trailer: served as they are, and never appended to.
        let data_bytes = seal.map_or(outcome.valid_bytes, |seal| seal.data_bytes);
        let sealed = seal.unwrap_or(SealInfo { end_offset: outcome.end_offset, data_bytes });
        let core =
            core_at(header, outcome.end_offset, data_bytes, outcome.index, Some(sealed), config);
        return Ok((core, report));
    }
    report.bytes_truncated = file_len - outcome.valid_bytes;
    if report.bytes_truncated > 0 {
        file.set_len(outcome.valid_bytes)?;
        file.sync_data()?;
    }
    let data_bytes = seal.map_or(outcome.valid_bytes, |seal| seal.data_bytes);
    let core = core_at(header, outcome.end_offset, data_bytes, outcome.index, seal, config);
    Ok((core, report))
}

/// Whether the valid frames `after` a bad frame at `position` prove it was durable (see
/// [`recover_unsealed`]).
fn is_damage(after: &AfterBadFrame, position: u64, config: &SegmentConfig) -> bool {
    if after.valid_frames == 0 || crate::canary(config.canary_cut_damage) {
        return false;
    }
    let write_bytes_max = config.group_commit.batch_bytes_max.max(config.limits.append_bytes_max);
    after.batch_start_seen || after.last_end - position > write_bytes_max
}

fn core_at(
    header: SegmentHeader,
    durable_offset: u64,
    durable_bytes: u64,
    index: SparseIndex,
    sealed: Option<SealInfo>,
    config: &SegmentConfig,
) -> Core {
    Core::new(
        header.base_offset,
        durable_offset,
        durable_bytes,
        index,
        sealed,
        config.limits,
        config.group_commit,
    )
}

fn read_whole(storage: &dyn Storage, path: &Path) -> io::Result<Vec<u8>> {
    let file = storage.open(path, OpenMode::Existing)?;
    let mut bytes = vec![0u8; file.size_bytes()? as usize];
    let read = file.read_at(&mut bytes, 0)?;
    bytes.truncate(read);
    Ok(bytes)
}

fn write_index(storage: &dyn Storage, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let file = storage.open(path, OpenMode::Truncate)?;
    file.write_all_at(&[bytes], 0)
}

#[cfg(test)]
mod tests;
