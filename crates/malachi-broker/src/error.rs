//! The log API's errors, each with the wire reason string a client sees.

use malachi_consensus::ConsensusError;
use malachi_log::{AppendError, LimitError, ReadError};
use malachi_meta::{AdminError, MetaError};

use crate::data::DataError;

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("no such topic")]
    NoSuchTopic,
    #[error("invalid topic name")]
    InvalidTopicName,
    #[error("topic already exists")]
    AlreadyExists,
    #[error("invalid cursor")]
    InvalidCursor,
    #[error("{0}")]
    Meta(MetaError),
    /// The administrative machine refused a command.
    #[error("{0}")]
    Admin(AdminError),
    #[error(transparent)]
    Limit(#[from] LimitError),
    /// A write or sync failed on this node; the outcome of the produce is unknown.
    #[error("storage failed ({reason}): {detail}")]
    Storage { reason: &'static str, detail: String },
    /// The metadata group did not answer; retry.
    #[error("metadata unavailable: {0}")]
    Unavailable(String),
    /// The range kept moving under the request (splits, merges, rolls); retry.
    #[error("topic is being resharded; retry")]
    Migrating,
    #[error("permission denied")]
    PermissionDenied,
    /// The broker holding the segment refused a forwarded operation with this wire reason.
    #[error("the broker holding the segment answered {reason}")]
    Remote { reason: String, retryable: bool },
    /// The data asked for is held by another broker of the cluster; retry (through it).
    #[error("held by brokers {holders:?}, not this one")]
    NotOwner { holders: Vec<u64> },
    /// Hard placement constraints cannot be met by the live brokers; retry once more are up.
    #[error("no placement of the replicas meets the hard constraints: {0}")]
    PlacementUnmet(String),
    /// The segment's replicas could not reach a quorum for the append (or its seal).
    #[error("no quorum of the segment's replicas: {0}")]
    NoQuorum(String),
    /// The reader's position spans more ranges than a cursor may name
    /// ([`crate::cursor::CURSOR_ENTRIES_MAX`]).
    #[error("the reader's position spans {entries} ranges, more than a cursor holds")]
    FrontierTooWide { entries: usize },
}

impl LogError {
    /// The wire reason (wire-protocol.md section 4).
    pub fn reason(&self) -> String {
        match self {
            LogError::NoSuchTopic => "no_such_topic".into(),
            LogError::InvalidTopicName => "invalid_topic_name".into(),
            LogError::AlreadyExists => "already_exists".into(),
            LogError::InvalidCursor => "invalid_cursor".into(),
            LogError::Meta(error) => error.reason(),
            LogError::Admin(error) => error.reason(),
            LogError::Limit(error) => error.reason().into(),
            LogError::Storage { reason, .. } => (*reason).into(),
            LogError::Unavailable(_) => "metadata_unavailable".into(),
            LogError::Migrating => "migrating".into(),
            LogError::PermissionDenied => "permission_denied".into(),
            LogError::FrontierTooWide { .. } => "too_many_ranges".into(),
            LogError::NotOwner { .. } => "not_owner".into(),
            LogError::PlacementUnmet(_) => "placement_unmet".into(),
            LogError::NoQuorum(_) => "no_quorum".into(),
            LogError::Remote { reason, .. } => reason.clone(),
        }
    }

    /// Whether retrying the same call may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            LogError::Storage { reason, .. } => *reason != "storage_damaged",
            LogError::Unavailable(_)
            | LogError::Migrating
            | LogError::NotOwner { .. }
            | LogError::PlacementUnmet(_)
            | LogError::NoQuorum(_) => true,
            LogError::Remote { retryable, .. } => *retryable,
            _ => false,
        }
    }
}

impl From<ConsensusError> for LogError {
    fn from(error: ConsensusError) -> LogError {
        LogError::Unavailable(error.to_string())
    }
}

impl From<DataError> for LogError {
    fn from(error: DataError) -> LogError {
        match error {
            DataError::Append(AppendError::Limit(limit)) => LogError::Limit(limit),
            DataError::Append(AppendError::Poisoned { cause }) => {
                LogError::Storage { reason: cause.reason(), detail: cause.to_string() }
            }
            DataError::Gone(_) => LogError::NoSuchTopic,
            DataError::Elsewhere { holders, .. } => LogError::NotOwner { holders },
            DataError::Damaged { .. } | DataError::Read(ReadError::Corrupt { .. }) => {
                LogError::Storage { reason: "storage_damaged", detail: error.to_string() }
            }
            other => LogError::Storage { reason: "storage_failed", detail: other.to_string() },
        }
    }
}
