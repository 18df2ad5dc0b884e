//! Malachi's consensus glue: openraft groups behind a small API, with the Raft state of all
//! groups of a node in one redb database.
//!
//! What this crate owns:
//!
//! * the openraft glue: the type configuration, log storage, state machine adapter and network
//!   adapter of a group ([`RaftGroup`]), so an openraft upgrade touches this crate only. No
//!   openraft type appears in the public API;
//! * the persistence of Raft state: [`GroupStore`] is one redb database per node holding every
//!   group's log, vote, committed log id, purge mark and last snapshot, with one writer thread
//!   that commits the writes of all groups in shared batches (one fsync per batch);
//! * the network seam: [`GroupTransport`] carries opaque messages; [`NoPeers`] is the only
//!   implementation so far.
//!
//! What it must never do: interpret commands. Machines ([`StateMachine`]) live in other crates
//! and are pure: commands in, responses out, state as canonical bytes. This crate only orders,
//! persists and replays their commands, and snapshots their bytes.
//!
//! Invariants:
//!
//! * an append's `IOFlushed` callback runs only after the redb commit holding it returned with
//!   `Durability::Immediate` (fsynced); a write returns only after it is readable;
//! * a storage failure reaches openraft as an `io::Error` (openraft then stops the group) and
//!   callers as [`ConsensusError::Storage`]; never a panic. A failed commit poisons the store
//!   until the process reopens it; fsyncs are never retried;
//! * the stored log of a group has no hole, and applied indexes strictly increase; both are
//!   checked at the disk boundary.
//!
//! Time and runtime: openraft runs on tokio (feature `tokio-rt`) and takes every timer
//! (elections, heartbeats, waits) from its `AsyncRuntime`; this crate reads no clock of its own.
//! The deterministic simulator will drive groups through openraft's runtime abstraction (a
//! simulated `AsyncRuntime` in the type configuration) and its disk through
//! [`GroupStore::open_with_backend`] (redb's `StorageBackend`).

mod backend;
mod error;
mod group;
mod group_machine;
mod log_store;
mod machine;
mod network;
mod runtime;
mod store;
mod type_config;
pub mod watch;

#[cfg(test)]
mod tests;

pub use backend::StorageFileBackend;
pub use error::ConsensusError;
pub use error::StoreError;
pub use group::FirstBoot;
pub use group::GroupConfig;
pub use group::RaftGroup;
pub use machine::StateMachine;
pub use network::GroupTransport;
pub use network::MessageKind;
pub use network::NoPeers;
pub use network::RaftMessage;
pub use network::TransportError;
pub use network::TransportFuture;
pub use runtime::{MalachiRuntime, RaftRng, seed_raft_rng};
pub use store::FORMAT_VERSION;
pub use store::GroupStore;
pub use store::WriterMode;
