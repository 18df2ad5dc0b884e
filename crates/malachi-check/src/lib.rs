//! Malachi's history checker: judges Jepsen-style histories recorded by the deterministic
//! simulator and by process-level chaos tests. It judges histories; it never runs anything.
//!
//! It owns the meaning of a history ([`History`]: invokes and their `Ok`/`Fail`/`Info`
//! completions of produce, fetch, commit, group read, rewind and drain ops, where an event's
//! position is its logical time) and the verdict on it ([`CheckReport`]). It knows nothing of
//! brokers, clients or the wire.
//!
//! Invariant: the checker is a pure function of the history. It does no I/O, reads no clock,
//! draws no random number, and iterates no unordered map (only `BTreeMap`/`BTreeSet`, vectors and
//! sorts), so one history always gives one report, byte for byte, and a simulator seed can hash
//! it. A lint test greps the sources for the forbidden names. It must never run, drive or wait
//! on anything, never repair a history, and never panic on a bad one: what does not fit the
//! model is reported (`MalformedEvent`) and left out. Cost is O(n log n) time and O(n) memory in
//! the history's size (about 150 ms for 100k events in a release build).
//!
//! The checks, each reported by name with the op ids and values involved:
//! * `LostWrite`: an acknowledged record is missing from its topic's final drain, beyond what the
//!   drain's retention-skipped count explains (those are counted as `expired_by_retention`).
//! * `PhantomRead`: a read returned a value no produce sent.
//! * `DuplicateRead`: one fetch or drain returned a value more often than the produce attempts
//!   that may have happened allow (copies within that allowance are `retried_duplicates`).
//! * `KeyOrderViolation`: a record acknowledged before another of its key was sent came after it
//!   in a read (a fetch, a cursor chain, a drain).
//! * `ProducerOrderViolation`: acknowledged records of one producer and key came back out of
//!   sequence order.
//! * `CursorRegression`: a fetch returned a value an earlier fetch of its cursor chain returned.
//! * `GroupRegression`: a committed group position went backwards with no rewind that could
//!   explain it.
//! * Also `ReadOfFailedWrite` and `MismatchedRead` (the system's fault), and `DuplicateWrite`,
//!   `MissingDrain` and `MalformedEvent` (the workload's fault).
//!
//! The algorithms are in the module headers: `sequence` (order and duplicates in linear time),
//! `chains` (the cursor chain forest), `drain` (lost writes, retention), `groups`.

mod chains;
mod check;
mod drain;
mod groups;
pub mod history;
mod ops;
pub mod report;
mod sequence;
mod writes;

#[cfg(test)]
mod model_test;
#[cfg(test)]
mod scenarios_test;
#[cfg(test)]
mod testkit;

pub use check::check;
pub use history::{
    Commit, Drain, Event, EventKind, Fetch, GroupRead, History, Op, OpId, ProcessId, Produce,
    ReadRecord, Rewind, WrittenRecord,
};
pub use report::{CheckReport, ReadSite, Stats, Violation};
