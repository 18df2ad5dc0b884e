//! Typed errors of the segment store, split between what a caller handles (a sealed segment, a
//! limit) and what is fatal until reopen (a failed write or `fdatasync` poisons the segment).

use std::io;

use malachi_reason::Reason;

use crate::format::{FrameError, HeaderError};
use crate::limits::LimitError;

/// Why the segment stopped accepting calls. Never cleared: only reopening the segment, which
/// rescans what actually reached the disk, makes it usable again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PoisonCause {
    #[error("the disk is full")]
    NoSpace,
    #[error("a write failed: {0}")]
    Write(io::ErrorKind),
    #[error("fdatasync failed: {0}")]
    Sync(io::ErrorKind),
}

impl PoisonCause {
    pub fn from_write(error: &io::Error) -> PoisonCause {
        match error.kind() {
            io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => PoisonCause::NoSpace,
            kind => PoisonCause::Write(kind),
        }
    }

    pub fn reason(&self) -> Reason {
        match self {
            PoisonCause::NoSpace => Reason::DiskFull,
            PoisonCause::Write(_) | PoisonCause::Sync(_) => Reason::StorageFailed,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AppendError {
    #[error("segment is sealed at offset {end_offset}")]
    Sealed { end_offset: u64 },
    #[error(transparent)]
    Limit(#[from] LimitError),
    #[error("segment unusable until reopened: {cause}")]
    Poisoned { cause: PoisonCause },
}

impl AppendError {
    pub fn reason(&self) -> Reason {
        match self {
            AppendError::Sealed { .. } => Reason::SegmentSealed,
            AppendError::Limit(limit) => limit.reason(),
            AppendError::Poisoned { cause } => cause.reason(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("segment unusable until reopened: {cause}")]
    Poisoned { cause: PoisonCause },
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("offset {requested} is outside the segment's records [{start}, {end}]")]
    OffsetOutOfRange { requested: u64, start: u64, end: u64 },
    #[error("damaged frame at byte {position}: {error}")]
    Corrupt { position: u64, error: FrameError },
    #[error("segment unusable until reopened: {cause}")]
    Poisoned { cause: PoisonCause },
    #[error("read failed: {0}")]
    Io(#[from] io::Error),
}

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("segment file header: {0}")]
    BadHeader(#[from] HeaderError),
    #[error("segment file belongs to segment {found}, expected {expected}")]
    WrongSegment { expected: u64, found: u64 },
    #[error("opening segment: {0}")]
    Io(#[from] io::Error),
    /// A cleanly closed segment no longer looks as it did when it closed.
    #[error("segment file changed since it was closed")]
    Changed,
}
