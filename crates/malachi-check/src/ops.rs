//! Pairs each invoke with its completion, in one pass over the events.
//!
//! Everything after this pass works on [`OpTable`]: one entry per accepted invoke, in invoke
//! order, with its completion if any, and the timeline of accepted events for the passes that
//! need real-time order. Events that do not fit (a second invoke of an op id, a completion of an
//! op never invoked or already completed, a completion of another process or another kind of op)
//! are reported as `MalformedEvent` and otherwise ignored.

use std::collections::BTreeMap;
use std::mem::discriminant;

use crate::history::{Event, EventKind, Op, OpId, ProcessId};
use crate::report::Violation;

/// The outcome of one op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Ok,
    Fail,
    /// `Info`, or no completion in the history.
    Unknown,
}

pub(crate) struct OpEntry<'h> {
    pub op_id: OpId,
    pub process: ProcessId,
    pub invoked_at: u64,
    pub request: &'h Op,
    pub completion: Option<Completion<'h>>,
}

pub(crate) struct Completion<'h> {
    pub at: u64,
    pub kind: EventKind,
    /// Same variant as the request (checked).
    pub observed: &'h Op,
}

/// An accepted event: the invoke or the completion of `entry`.
#[derive(Clone, Copy)]
pub(crate) struct Moment {
    pub entry: usize,
    pub is_invoke: bool,
}

pub(crate) struct OpTable<'h> {
    /// In invoke order.
    pub entries: Vec<OpEntry<'h>>,
    pub timeline: Vec<Moment>,
    index_of: BTreeMap<OpId, usize>,
}

impl<'h> OpTable<'h> {
    pub fn entry_of(&self, op_id: OpId) -> Option<usize> {
        self.index_of.get(&op_id).copied()
    }
}

impl<'h> OpEntry<'h> {
    pub fn outcome(&self) -> Outcome {
        match self.completion.as_ref().map(|completion| completion.kind) {
            Some(EventKind::Ok) => Outcome::Ok,
            Some(EventKind::Fail) => Outcome::Fail,
            _ => Outcome::Unknown,
        }
    }

    /// The observed op and the completion time, if the op succeeded.
    pub fn ok(&self) -> Option<(&'h Op, u64)> {
        let completion = self.completion.as_ref()?;
        (completion.kind == EventKind::Ok).then_some((completion.observed, completion.at))
    }
}

pub(crate) fn pair_events<'h>(events: &'h [Event], violations: &mut Vec<Violation>) -> OpTable<'h> {
    let mut table =
        OpTable { entries: Vec::new(), timeline: Vec::new(), index_of: BTreeMap::new() };
    for (position, event) in events.iter().enumerate() {
        let at = position as u64;
        let accepted = match event.kind {
            EventKind::Invoke => accept_invoke(&mut table, at, event),
            _ => accept_completion(&mut table, at, event),
        };
        if let Err(reason) = accepted {
            violations.push(Violation::MalformedEvent {
                event: at,
                op_id: event.op_id,
                reason: reason.to_string(),
            });
        }
    }
    table
}

fn accept_invoke<'h>(
    table: &mut OpTable<'h>,
    at: u64,
    event: &'h Event,
) -> Result<(), &'static str> {
    if table.index_of.contains_key(&event.op_id) {
        return Err("a second invoke of the same op id");
    }
    let entry = table.entries.len();
    table.index_of.insert(event.op_id, entry);
    table.entries.push(OpEntry {
        op_id: event.op_id,
        process: event.process,
        invoked_at: at,
        request: &event.op,
        completion: None,
    });
    table.timeline.push(Moment { entry, is_invoke: true });
    Ok(())
}

fn accept_completion<'h>(
    table: &mut OpTable<'h>,
    at: u64,
    event: &'h Event,
) -> Result<(), &'static str> {
    let Some(entry) = table.entry_of(event.op_id) else {
        return Err("a completion of an op that was never invoked");
    };
    let op = &mut table.entries[entry];
    if op.completion.is_some() {
        return Err("a second completion of the same op");
    }
    if op.process != event.process {
        return Err("a completion by another process than the invoke's");
    }
    if discriminant(op.request) != discriminant(&event.op) {
        return Err("a completion carrying another kind of op than the invoke");
    }
    op.completion = Some(Completion { at, kind: event.kind, observed: &event.op });
    table.timeline.push(Moment { entry, is_invoke: false });
    Ok(())
}
