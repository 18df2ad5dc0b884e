//! The segment's write state, with no I/O and no locking: staging, flush bookkeeping, seal state.
//!
//! Appends are encoded into `pending` as they arrive; a flush takes the whole pending buffer as one
//! job, writes it and syncs it outside any lock, and only then moves the durable end. The durable
//! end is the acknowledgement: nothing below it may be lost and nothing above it is acknowledged
//! or served to readers.

use crate::error::{AppendError, PoisonCause};
use crate::format::{self, FrameError};
use crate::index::{IndexEntry, SparseIndex};
use crate::limits::Limits;
use crate::record::Record;

/// A write buffer an idle segment may keep (small appends reuse it without allocating).
const SPARE_BYTES_IDLE: u64 = 64 * 1024;

/// Bounds on one group commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupCommitConfig {
    /// Records in one flush.
    pub batch_records_max: u32,
    /// Bytes in one flush (a single append larger than this still goes alone).
    pub batch_bytes_max: u64,
    /// How long a flush may wait for more appends before it starts. Zero means start as soon as
    /// the disk is idle, which already batches everything that arrives during the previous
    /// `fdatasync`; a longer linger trades latency at light load for fewer syncs.
    pub linger_us: u64,
}

impl Default for GroupCommitConfig {
    fn default() -> GroupCommitConfig {
        GroupCommitConfig {
            batch_records_max: 20_000,
            batch_bytes_max: 8 * 1024 * 1024,
            linger_us: 0,
        }
    }
}

/// What a sealed segment holds, as the store reports it to metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SealInfo {
    /// Offset one past the last record.
    pub end_offset: u64,
    /// Bytes of header and record frames, the seal trailer excluded.
    pub data_bytes: u64,
}

/// Damage that recovery found among an unsealed segment's records: a bad frame with valid
/// frames after it that a torn write cannot explain. The file is kept as it is; records below
/// `offset` are served, reads at or past it fail, and the segment takes no appends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Damage {
    /// File position of the first bad frame.
    pub position: u64,
    /// Offset of the first record that cannot be read.
    pub offset: u64,
    pub error: FrameError,
    /// Valid record frames found after the damage.
    pub frames_after: u64,
}

/// Where a segment closed while idle: enough to reopen it without a scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CleanClose {
    pub durable_offset: u64,
    pub durable_bytes: u64,
    pub sealed: bool,
}

/// Offsets handed to one staged append: `[first_offset, end_offset)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendTicket {
    pub first_offset: u64,
    pub end_offset: u64,
}

/// A flush in flight: one contiguous buffer at one file position.
#[derive(Debug)]
pub(crate) struct FlushJob {
    pub buffer: Vec<u8>,
    pub position: u64,
    pub end_offset: u64,
    pub index: Vec<IndexEntry>,
}

#[derive(Debug)]
pub(crate) struct Core {
    pub base_offset: u64,
    /// Offset one past the last durable record: the acknowledgement watermark.
    pub durable_offset: u64,
    /// File position one past the last durable frame.
    pub durable_bytes: u64,
    next_offset: u64,
    next_position: u64,
    pending: Vec<u8>,
    pending_records: u64,
    pending_index: Vec<IndexEntry>,
    /// The buffer of the last finished flush, kept to be reused: no allocation in steady state.
    spare: Vec<u8>,
    /// Position of the last index entry, staged or durable.
    last_index_position: u64,
    pub index: SparseIndex,
    pub sealed: Option<SealInfo>,
    /// A seal has begun: nothing more may stage, and the segment will end at this offset once
    /// what is already staged is flushed. Without this fence a seal could chase a stream of
    /// new appends forever.
    pub sealing_at: Option<u64>,
    pub poisoned: Option<PoisonCause>,
    /// Set by recovery; such a segment also carries a `sealed` end and takes no appends.
    pub damage: Option<Damage>,
    /// File position up to which write-back was started (journal mode; a hint only).
    pub written_back_to: u64,
    /// A flush (or a seal) owns the file's tail.
    pub flushing: bool,
    /// Fenced by a failover: only fills (records copied from another replica) may stage.
    pub fenced: bool,
    limits: Limits,
    group_commit: GroupCommitConfig,
}

impl Core {
    pub fn new(
        base_offset: u64,
        durable_offset: u64,
        durable_bytes: u64,
        index: SparseIndex,
        sealed: Option<SealInfo>,
        limits: Limits,
        group_commit: GroupCommitConfig,
    ) -> Core {
        Core {
            base_offset,
            durable_offset,
            durable_bytes,
            next_offset: durable_offset,
            next_position: durable_bytes,
            pending: Vec::new(),
            pending_records: 0,
            pending_index: Vec::new(),
            spare: Vec::new(),
            last_index_position: index.last_position(),
            index,
            sealed,
            sealing_at: None,
            poisoned: None,
            damage: None,
            written_back_to: durable_bytes,
            flushing: false,
            fenced: false,
            limits,
            group_commit,
        }
    }

    /// Refuses appends to a poisoned, sealed or fenced segment.
    pub fn check_writable(&self) -> Result<(), AppendError> {
        self.check_fillable()?;
        if self.fenced {
            return Err(AppendError::Sealed { end_offset: self.next_offset });
        }
        Ok(())
    }

    /// Refuses fills of a poisoned or sealed segment (a fenced one takes them).
    pub fn check_fillable(&self) -> Result<(), AppendError> {
        if let Some(cause) = self.poisoned {
            return Err(AppendError::Poisoned { cause });
        }
        if let Some(seal) = self.sealed {
            return Err(AppendError::Sealed { end_offset: seal.end_offset });
        }
        if let Some(end_offset) = self.sealing_at {
            return Err(AppendError::Sealed { end_offset });
        }
        Ok(())
    }

    /// Stops staging: the seal will end at the current staged end.
    pub fn begin_seal(&mut self) {
        self.sealing_at.get_or_insert(self.next_offset);
    }

    pub fn has_pending(&self) -> bool {
        self.pending_records > 0
    }

    /// The offset the next staged record gets: one past everything staged so far.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// Whether an append of `records` records and `bytes` bytes fits the pending batch now.
    /// An empty batch takes anything, so one oversize append is never starved.
    pub fn has_room(&self, records: u64, bytes: u64) -> bool {
        !self.has_pending()
            || self.pending_records + records <= u64::from(self.group_commit.batch_records_max)
                && self.pending.len() as u64 + bytes <= self.group_commit.batch_bytes_max
    }

    /// Encodes `records` into the pending batch and assigns their offsets. The caller has checked
    /// limits, writability and room.
    pub fn stage(&mut self, records: &[Record], encoded_bytes: u64) -> AppendTicket {
        let first_offset = self.next_offset;
        let start_len = self.pending.len();
        self.pending.reserve(encoded_bytes as usize);
        for record in records {
            let position = self.next_position + (self.pending.len() - start_len) as u64;
            if self.index.wants_entry_at(position, self.last_index_position) {
                self.pending_index.push(IndexEntry { offset: self.next_offset, position });
                self.last_index_position = position;
            }
            let batch_start = self.pending.is_empty();
            format::encode_record(&mut self.pending, self.next_offset, record, batch_start);
            self.next_offset += 1;
        }
        let staged = (self.pending.len() - start_len) as u64;
        assert_eq!(staged, encoded_bytes, "limits and encoder disagree on the batch size");
        self.next_position += staged;
        self.pending_records += records.len() as u64;
        AppendTicket { first_offset, end_offset: self.next_offset }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Takes the pending batch as a flush job. The caller must hold `flushing`.
    pub fn take_job(&mut self) -> FlushJob {
        assert!(self.flushing && self.has_pending(), "take_job without a claim or a batch");
        let mut buffer = std::mem::take(&mut self.spare);
        std::mem::swap(&mut buffer, &mut self.pending);
        let job = FlushJob {
            position: self.next_position - buffer.len() as u64,
            end_offset: self.next_offset,
            index: std::mem::take(&mut self.pending_index),
            buffer,
        };
        self.pending_records = 0;
        assert_eq!(job.position, self.durable_bytes, "a flush must start at the durable end");
        job
    }

    /// Records the outcome of a flush. Only a successful write *and* sync moves the durable end.
    pub fn finish_job(&mut self, mut job: FlushJob, outcome: Result<(), PoisonCause>) {
        assert!(self.flushing, "finish_job without a claim");
        self.flushing = false;
        match outcome {
            Ok(()) => {
                assert!(job.end_offset > self.durable_offset, "a flush must move the durable end");
                self.durable_offset = job.end_offset;
                self.durable_bytes = job.position + job.buffer.len() as u64;
                for entry in job.index.drain(..) {
                    self.index.push(entry);
                }
            }
            Err(cause) => {
                self.poisoned.get_or_insert(cause);
            }
        }
        job.buffer.clear();
        // Keep a buffer for the next flush only while appends keep coming (something staged
        // during this one): an idle segment holds no write buffer, so thousands of quiet
        // segments cost no memory. Never more than one batch worth of capacity.
        let keep_bytes = if self.has_pending() { self.group_commit.batch_bytes_max } else { 0 };
        if job.buffer.capacity() as u64 > keep_bytes.max(SPARE_BYTES_IDLE) {
            job.buffer.shrink_to(keep_bytes as usize);
        }
        self.spare = job.buffer;
    }

    /// Whether nothing is staged, flushing or broken: the segment may close and reopen from a
    /// [`CleanClose`].
    pub fn is_idle(&self) -> bool {
        !self.flushing
            && !self.has_pending()
            && self.sealing_at.is_none_or(|_| self.sealed.is_some())
            && self.poisoned.is_none()
            && self.damage.is_none()
    }
}
