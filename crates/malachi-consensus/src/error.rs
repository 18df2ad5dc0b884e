//! Errors, split the way style.md asks: what a caller handles (not leader, shut down, timed out)
//! and what is fatal (storage). A storage failure poisons the whole [`crate::GroupStore`] until
//! the process reopens it; nothing here retries an fsync.

/// A failure of the node's Raft store.
///
/// `Clone` because one failed batch commit is reported to every group whose writes were in it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The database file could not be opened or created (missing directory, not a redb file,
    /// already open, unreadable).
    #[error("cannot open the raft store: {0}")]
    Open(String),
    /// The file is a Raft store of a format this build does not read.
    #[error("raft store format version {found} is not supported (this build reads {supported})")]
    UnsupportedFormat { found: u64, supported: u64 },
    /// A read or a write failed in redb or below it.
    #[error("raft store I/O failed: {0}")]
    Io(String),
    /// An earlier commit failed; the store refuses all writes until it is reopened, because the
    /// state of a failed fsync is unknowable.
    #[error("raft store is poisoned by an earlier failure: {0}")]
    Poisoned(String),
    /// A stored record does not decode, or the log has a hole.
    #[error("raft store record is corrupt: {0}")]
    Corrupt(String),
    /// The writer thread is gone (the store is shutting down).
    #[error("raft store is closed")]
    Closed,
}

/// An error of a [`crate::RaftGroup`] operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConsensusError {
    /// This node does not lead the group; `leader_hint` is the leader it knows of, if any.
    /// Nothing was appended: the proposal can be sent to the leader.
    #[error("not the leader of the group (leader hint: {leader_hint:?})")]
    NotLeader { leader_hint: Option<u64> },
    /// The proposal was appended but the entry was discarded when another leader's log won;
    /// it may or may not have committed, so a retry needs deduplication by the machine.
    #[error("commit outcome unknown after a leader change (leader hint: {leader_hint:?})")]
    OutcomeUnknown { leader_hint: Option<u64> },
    /// The group was shut down (by [`crate::RaftGroup::shutdown`] or after a fatal error).
    #[error("the raft group is shut down")]
    Shutdown,
    /// The node's Raft store failed; the group has stopped.
    #[error(transparent)]
    Storage(#[from] StoreError),
    /// A bounded wait ran out.
    #[error("timed out after {waited_ms} ms waiting for {waiting_for}")]
    Timeout { waited_ms: u64, waiting_for: &'static str },
    /// The [`crate::GroupConfig`] is inconsistent.
    #[error("invalid group config: {0}")]
    Config(String),
    /// A message from a peer does not decode.
    #[error("malformed raft message: {0}")]
    Malformed(String),
    /// A message speaks for a leader or candidate other than the node that sent it.
    #[error("a raft message sent by node {sender} speaks for node {claimed}")]
    Impersonation { sender: u64, claimed: u64 },
    /// openraft failed in a way this crate does not expect (a panic in its core, a response
    /// missing where one must be). A bug, reported rather than panicking the caller.
    #[error("internal consensus error: {0}")]
    Internal(String),
}
