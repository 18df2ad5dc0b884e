//! Malachi's segment store: the on-disk record format, durable appends with group commit,
//! seal-as-fence, crash recovery, read-only verification, and the disk seam under all of them.
//!
//! This crate owns the bytes of segment files and nothing else: it knows no topics, ranges or
//! replicas, and it never decides when to roll or seal (metadata does). It does all its I/O
//! through [`storage::Storage`], so the same code runs on real files and on the simulator's disk.
//! An append is acknowledged only after its `fdatasync` returned successfully; a failed write or
//! sync poisons the segment until it is reopened.

pub mod error;

/// A simulator canary's switch as the store reads it: off in every build without the `canaries`
/// feature, which only the simulator (and this crate's own tests) turn on, so the deliberate
/// bugs are compiled out of the broker users run.
#[inline(always)]
pub const fn canary(switch: bool) -> bool {
    cfg!(feature = "canaries") && switch
}

pub mod format;
pub mod index;
pub mod journal;
pub mod limits;
pub mod record;
pub mod rng;
pub mod segment;
pub mod storage;

pub use error::{AppendError, OpenError, PoisonCause, ReadError, SealError};
pub use limits::{LimitError, Limits};
pub use record::{Record, StoredRecord};
pub use segment::{
    AppendTicket, BadFrame, CleanClose, CommitMetrics, CommitStats, Committer, Damage,
    GroupCommitConfig, ReadBatch, RecoveryReport, SealInfo, Segment, SegmentConfig, SegmentStatus,
    VerifyReport, fence_path, is_unborn, segment_paths, verify_segment,
};
pub use storage::{
    DIR_MODE, FILE_MODE, FilesystemSync, OpenMode, RealStorage, SimFaults, SimStorage, Storage,
    StorageFile, create_dir_durable,
};
