//! The history a workload records, and the builder that numbers its operations.
//!
//! Jepsen-style: every operation is one `Invoke` event followed, later, by at most one completion
//! (`Ok`, `Fail` or `Info`). An event's position in [`History::events`] is its logical time;
//! nothing else carries time. The invoke carries the request. An `Ok` carries the op as observed:
//! a fetch's records and cursor out, a group read's positions, a drain's records. The completion
//! of a produce, commit or rewind repeats the request, and the checker reads the request from the
//! invoke. `Fail` means the op definitely did not happen; `Info` (or no completion at all) means it
//! may or may not have happened.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::report::CheckReport;

/// Names one operation; unique among the invokes of a history.
pub type OpId = u64;

/// Names one client of the system under test (Jepsen's "process").
pub type ProcessId = u64;

/// What an event says about its operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum EventKind {
    /// The client sent the request.
    Invoke,
    /// The client received a success: the op happened, once.
    Ok,
    /// The client received a definite failure: the op did not happen.
    Fail,
    /// The outcome is unknown (timeout, connection reset): the op may or may not have happened.
    Info,
}

/// One entry of a history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub process: ProcessId,
    pub op_id: OpId,
    pub kind: EventKind,
    /// The request on an invoke; the observation on an `Ok`. On `Fail` and `Info` it is ignored,
    /// but like every completion it must be the same kind of op as the invoke.
    pub op: Op,
}

/// The operations a Malachi workload performs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    Produce(Produce),
    Fetch(Fetch),
    Commit(Commit),
    GroupRead(GroupRead),
    Rewind(Rewind),
    Drain(Drain),
}

/// Appends records to a topic.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Produce {
    pub topic: String,
    /// Every value is unique in the history, except that a retry re-sends the same records.
    pub records: Vec<WrittenRecord>,
    /// Set when this produce re-sends the records of an earlier produce whose outcome was
    /// unknown; such a record may legitimately appear once per attempt that may have happened.
    pub retry_of: Option<OpId>,
}

/// A record as the workload wrote it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WrittenRecord {
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    pub producer: u64,
    pub sequence: u64,
}

/// A record as a fetch or drain returned it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ReadRecord {
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
}

/// Reads a page of a topic with an opaque cursor. The fetches of one reader on one topic form
/// cursor chains: a fetch continues the latest fetch, completed before it was invoked, whose
/// `cursor_out` equals its `cursor_in`; `cursor_in: None` starts a new chain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fetch {
    pub topic: String,
    pub reader: u64,
    pub cursor_in: Option<String>,
    /// In the order the server returned them; empty on the invoke.
    pub records: Vec<ReadRecord>,
    /// Empty on the invoke.
    pub cursor_out: String,
    /// How many records the server said retention removed before this page. Kept for the
    /// reader of a history; only a drain's count enters the verdict.
    pub skipped: u64,
}

/// Commits a consumer group's position (the cursor is opaque to the checker).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Commit {
    pub topic: String,
    pub group: String,
    pub cursor: String,
}

/// Observes a consumer group's committed positions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRead {
    pub topic: String,
    pub group: String,
    /// Per range, the committed position: opaque but totally ordered. Empty on the invoke.
    pub position: Vec<(u32, u64)>,
}

/// Declares that the workload moved a group's position backwards on purpose.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rewind {
    pub topic: String,
    pub group: String,
}

/// The final phase: after faults heal, a reader reads a whole topic from the start. The last
/// successful drain of a topic must hold every acknowledged record of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drain {
    pub topic: String,
    /// In the order returned, all fetches of the drain concatenated; empty on the invoke.
    pub records: Vec<ReadRecord>,
    /// The sum of the `skipped` counts of the drain's fetches.
    pub skipped: u64,
}

/// A history under construction, or loaded from a file; [`History::check`] judges it.
///
/// The builder methods number operations and pair completions with invokes. A raw event
/// sequence (from [`History::from_events`] or [`History::push`]) is not validated here: the
/// checker reports malformed events as `MalformedEvent`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Vec<Event>", into = "Vec<Event>")]
pub struct History {
    events: Vec<Event>,
    /// Invoked and not yet completed: op id to the position of its invoke.
    open: BTreeMap<OpId, usize>,
    next_op_id: OpId,
}

impl History {
    pub fn new() -> History {
        History::default()
    }

    pub fn from_events(events: Vec<Event>) -> History {
        let mut history = History::new();
        for event in events {
            history.push(event);
        }
        history
    }

    pub fn events(&self) -> &[Event] {
        &self.events
    }

    pub fn into_events(self) -> Vec<Event> {
        self.events
    }

    /// Runs every check; see the crate documentation.
    pub fn check(&self) -> CheckReport {
        crate::check::check(self)
    }

    /// Records that `process` sent `op`, and returns the new op's id.
    pub fn invoke(&mut self, process: ProcessId, op: Op) -> OpId {
        let op_id = self.next_op_id;
        self.push(Event { process, op_id, kind: EventKind::Invoke, op });
        op_id
    }

    /// Records a success whose observation is the request itself (produce, commit, rewind).
    ///
    /// # Panics
    /// If `op_id` is not open.
    pub fn ok(&mut self, op_id: OpId) {
        let op = self.open_op(op_id).clone();
        self.ok_with(op_id, op);
    }

    /// Records a success with what the client observed (fetch, group read, drain).
    ///
    /// # Panics
    /// If `op_id` is not open.
    pub fn ok_with(&mut self, op_id: OpId, observed: Op) {
        self.complete(op_id, EventKind::Ok, observed);
    }

    /// Records a definite failure.
    ///
    /// # Panics
    /// If `op_id` is not open.
    pub fn fail(&mut self, op_id: OpId) {
        let op = self.open_op(op_id).clone();
        self.complete(op_id, EventKind::Fail, op);
    }

    /// Records an unknown outcome.
    ///
    /// # Panics
    /// If `op_id` is not open.
    pub fn info(&mut self, op_id: OpId) {
        let op = self.open_op(op_id).clone();
        self.complete(op_id, EventKind::Info, op);
    }

    /// Appends a raw event; the builder's numbering skips past its op id.
    pub fn push(&mut self, event: Event) {
        if event.kind == EventKind::Invoke {
            self.open.insert(event.op_id, self.events.len());
            self.next_op_id = self.next_op_id.max(event.op_id.saturating_add(1));
        } else {
            self.open.remove(&event.op_id);
        }
        self.events.push(event);
    }

    fn open_op(&self, op_id: OpId) -> &Op {
        let position = self.open.get(&op_id);
        let position = *position.unwrap_or_else(|| panic!("op {op_id} is not open"));
        &self.events[position].op
    }

    fn complete(&mut self, op_id: OpId, kind: EventKind, op: Op) {
        let position = self.open.get(&op_id);
        let position = *position.unwrap_or_else(|| panic!("op {op_id} is not open"));
        let process = self.events[position].process;
        self.push(Event { process, op_id, kind, op });
    }
}

impl From<Vec<Event>> for History {
    fn from(events: Vec<Event>) -> History {
        History::from_events(events)
    }
}

impl From<History> for Vec<Event> {
    fn from(history: History) -> Vec<Event> {
        history.events
    }
}
