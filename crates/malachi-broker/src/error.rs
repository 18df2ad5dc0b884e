//! The log API's errors, each with the wire reason string a client sees.

use malachi_consensus::ConsensusError;
use malachi_log::{AppendError, LimitError, ReadError};
use malachi_meta::{AdminError, MetaError};
use malachi_reason::Reason;

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
    Storage { reason: Reason, detail: String },
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
    /// The error's entry in the workspace's one table of reasons; `None` only for a peer's
    /// answer in a text this build does not know (a broker of a later release).
    pub fn kind(&self) -> Option<Reason> {
        let reason = match self {
            LogError::NoSuchTopic => Reason::NoSuchTopic,
            LogError::InvalidTopicName => Reason::InvalidTopicName,
            LogError::AlreadyExists => Reason::AlreadyExists,
            LogError::InvalidCursor => Reason::InvalidCursor,
            LogError::Meta(error) => error.reason(),
            LogError::Admin(error) => error.reason(),
            LogError::Limit(error) => error.reason(),
            LogError::Storage { reason, .. } => *reason,
            LogError::Unavailable(_) => Reason::MetadataUnavailable,
            LogError::Migrating => Reason::Migrating,
            LogError::PermissionDenied => Reason::PermissionDenied,
            LogError::FrontierTooWide { .. } => Reason::TooManyRanges,
            LogError::NotOwner { .. } => Reason::NotOwner,
            LogError::PlacementUnmet(_) => Reason::PlacementUnmet,
            LogError::NoQuorum(_) => Reason::NoQuorum,
            LogError::Remote { reason, .. } => return Reason::from_wire(reason.as_bytes()),
        };
        Some(reason)
    }

    /// The exact text of the wire answer (wire-protocol.md section 4): the reason, with detail
    /// where it carries any.
    pub fn reason(&self) -> String {
        match self {
            LogError::Meta(error) => error.reason_text(),
            LogError::Admin(error) => error.reason_text(),
            LogError::Remote { reason, .. } => reason.clone(),
            other => other.kind().map_or_else(String::new, |reason| reason.as_str().to_owned()),
        }
    }

    /// Whether retrying the same call may succeed: the table's class, or for a peer's answer
    /// the class the peer sent with it.
    pub fn is_retryable(&self) -> bool {
        match self {
            LogError::Remote { retryable, .. } => *retryable,
            other => other.kind().is_some_and(Reason::is_retryable),
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
                LogError::Storage { reason: Reason::StorageDamaged, detail: error.to_string() }
            }
            other => LogError::Storage { reason: Reason::StorageFailed, detail: other.to_string() },
        }
    }
}

#[cfg(test)]
mod tests {
    use malachi_meta::{RangeError, TopicError};

    use super::*;

    /// The broker's errors take their text and retry class from the one table; only a peer's
    /// answer keeps the class the peer sent.
    #[test]
    fn errors_answer_with_the_tables_reason_and_class() {
        let storage = |reason| LogError::Storage { reason, detail: String::new() };
        let cases: Vec<(LogError, &str, bool)> = vec![
            (LogError::NoSuchTopic, "no_such_topic", false),
            (LogError::InvalidCursor, "invalid_cursor", false),
            (storage(Reason::StorageFailed), "storage_failed", true),
            (storage(Reason::DiskFull), "disk_full", true),
            (storage(Reason::StorageDamaged), "storage_damaged", false),
            (storage(Reason::Unfenced), "unfenced", true),
            (LogError::Unavailable("no leader".into()), "metadata_unavailable", true),
            (LogError::Migrating, "migrating", true),
            (LogError::NotOwner { holders: vec![2] }, "not_owner", true),
            (LogError::NoQuorum("2 of 3".into()), "no_quorum", true),
            (LogError::FrontierTooWide { entries: 20_000 }, "too_many_ranges", false),
            (LogError::Meta(TopicError::AlreadyExists.into()), "already_exists", false),
            (LogError::Meta(RangeError::Unfenced { range_id: 1 }.into()), "unfenced", true),
            (LogError::Remote { reason: "no_quorum".into(), retryable: false }, "no_quorum", false),
            (LogError::Remote { reason: "from_later".into(), retryable: true }, "from_later", true),
        ];
        for (error, text, retryable) in cases {
            assert_eq!(error.reason(), text, "{error:?}");
            assert_eq!(error.is_retryable(), retryable, "{error:?}");
        }
    }
}
