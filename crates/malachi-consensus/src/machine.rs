//! The contract between a deterministic state machine and the Raft group that replicates it.
//!
//! A machine here is pure: it turns commands into responses and its whole state into canonical
//! bytes and back. It never sees log ids, terms, membership or time; the group keeps those
//! beside it (see `group_machine`). That is what lets the metadata machine be tested without
//! Raft and replayed by the simulator.

use std::fmt::Debug;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A deterministic state machine replicated by a [`crate::RaftGroup`].
///
/// Invariant: `apply` is a pure function of the current state and the command: no clock, no
/// randomness, no node identity, no I/O. Every replica applies the same commands in the same
/// order and so reaches the same state; a divergence is a bug in the machine.
pub trait StateMachine: Send + Sync + 'static {
    /// What a proposal carries; it is what the Raft log stores (serialized with serde_json).
    type Command: Serialize + DeserializeOwned + Clone + Debug + Send + Sync + 'static;
    /// What applying one command answers to the proposer.
    type Response: Serialize + DeserializeOwned + Clone + Debug + Send + Sync + 'static;

    /// Applies one committed command. It must not panic on any command a proposer can build:
    /// a rejected command is a response, not an error.
    fn apply(&mut self, command: Self::Command) -> Self::Response;

    /// The canonical bytes of the whole state: two machines in the same state return the same
    /// bytes, so snapshots can be compared byte for byte.
    fn snapshot(&self) -> Vec<u8>;

    /// Rebuilds a machine from bytes that [`StateMachine::snapshot`] produced. Bytes from disk
    /// or from a peer are untrusted: a bad snapshot is an `Err`, never a panic.
    fn restore(bytes: &[u8]) -> Result<Self, String>
    where
        Self: Sized;

    /// The state before the first command.
    fn empty() -> Self
    where
        Self: Sized;
}
