//! Judges one read sequence: the records of a drain, or of a cursor chain's fetches in order.
//!
//! Per record, in read order:
//! 1. Resolve the value in the write index: unknown is a `PhantomRead`; another topic or key
//!    than written is a `MismatchedRead`; every attempt failed is a `ReadOfFailedWrite`. Such a
//!    record takes no further part.
//! 2. Count its copies in the sequence. A copy beyond `copies_allowed` is a `DuplicateRead` when
//!    the earlier copy came from the same fetch or drain, else a `CursorRegression`; a copy within
//!    the allowance is a retried duplicate. Only a value's first copy takes part in the order
//!    checks: a late copy can be the delayed write of an attempt whose outcome was unknown.
//! 3. Key order. The records of key K in the sequence are r1, r2, ... A violation is a pair i < j
//!    with `acked(rj) < invoked(ri)`: rj was acknowledged before ri was even sent, yet came
//!    second. Keep, per key, the maximum `invoked` over the prefix (with its record). At rj there
//!    is a violating i exactly when that maximum exceeds `acked(rj)`, and the record holding the
//!    maximum is a witness. One comparison and one update per record: linear in the sequence.
//!    An unacknowledged record never comes "too late" but can still come too early.
//! 4. Producer order, the same way over acknowledged records per (producer, key), with the
//!    sequence number in place of both times: a violation at rj is a running maximum above
//!    `sequence(rj)`.
//!
//! In a sequence that may start after the log's start ([`ReadContext::partial_start`]), a
//! value with more than one possible copy is not judged at steps 3 and 4 (it still raises the
//! maxima): its first copy in the sequence may be a retry's late copy, the earlier one lying
//! before the start, and the simulator found exactly that pattern in a group member's fetch.
//!
//! Cursor chains share prefixes (a reader may resume twice from one cursor), so the state is
//! undoable: every change is logged, and [`SequenceChecker::rollback`] restores an earlier mark.
//! A depth-first walk over the chain forest thus checks every root-to-leaf chain while touching
//! each fetch's records twice (once forward, once back).

use std::collections::BTreeSet;

use crate::history::{OpId, ReadRecord};
use crate::report::{ReadSite, Violation};
use crate::writes::{WriteIndex, WrittenValue};

/// Where the records being checked come from.
#[derive(Clone, Copy)]
pub(crate) struct ReadContext<'h> {
    pub topic: &'h str,
    /// The fetch or drain that returned them.
    pub read: OpId,
    /// The chain's reader; `None` for a drain.
    pub reader: Option<u64>,
    /// The sequence may begin after the log's start: a chain (a reader may start from a
    /// group's position) or a drain that retention cut. Then the first copy of a retried value
    /// in the sequence may be a late copy whose earlier one lies before the start, so such a
    /// value is not judged as the later record of an order pair.
    pub partial_start: bool,
}

pub(crate) struct SequenceChecker<'a, 'h> {
    writes: &'a WriteIndex<'h>,
    /// Per value: copies in the current sequence.
    copies: Vec<u32>,
    /// Per value: the read that returned its first copy (meaningful while `copies > 0`).
    first_read: Vec<OpId>,
    /// Per key: the latest-invoked record so far.
    key_max: Vec<Option<Mark>>,
    /// Per (producer, key): the acknowledged record with the highest sequence so far.
    producer_key_max: Vec<Option<Mark>>,
    undo: Vec<Undo>,
    /// Values seen duplicated within their allowance, in any sequence.
    retried: BTreeSet<usize>,
}

/// A record that raised a running maximum: the rank (invoke time or sequence), which value, and
/// which read returned it.
#[derive(Clone, Copy)]
struct Mark {
    rank: u64,
    value: usize,
    read: OpId,
}

enum Undo {
    Copy(usize),
    Key(usize, Option<Mark>),
    ProducerKey(usize, Option<Mark>),
}

impl<'a, 'h> SequenceChecker<'a, 'h> {
    pub fn new(writes: &'a WriteIndex<'h>) -> Self {
        SequenceChecker {
            writes,
            copies: vec![0; writes.values.len()],
            first_read: vec![0; writes.values.len()],
            key_max: vec![None; writes.key_count],
            producer_key_max: vec![None; writes.producer_key_count],
            undo: Vec::new(),
            retried: BTreeSet::new(),
        }
    }

    pub fn retried_duplicates(&self) -> u64 {
        self.retried.len() as u64
    }

    /// A point to roll back to.
    pub fn mark(&self) -> usize {
        self.undo.len()
    }

    /// Forgets every record read since `mark`.
    pub fn rollback(&mut self, mark: usize) {
        while self.undo.len() > mark {
            match self.undo.pop().expect("the undo log is longer than the mark") {
                Undo::Copy(value) => self.copies[value] -= 1,
                Undo::Key(key, previous) => self.key_max[key] = previous,
                Undo::ProducerKey(pair, previous) => self.producer_key_max[pair] = previous,
            }
        }
    }

    /// Appends `records` to the current sequence, reporting what they break.
    pub fn read(
        &mut self,
        context: ReadContext<'h>,
        records: &[ReadRecord],
        out: &mut Vec<Violation>,
    ) {
        for record in records {
            let Some(value) = self.resolve(context, record, out) else { continue };
            if self.count_copy(context, value, out) {
                self.check_key_order(context, value, out);
                self.check_producer_order(context, value, out);
            }
        }
    }

    fn resolve(
        &self,
        context: ReadContext<'h>,
        record: &ReadRecord,
        out: &mut Vec<Violation>,
    ) -> Option<usize> {
        let Some(&value) = self.writes.by_value.get(record.value.as_slice()) else {
            out.push(Violation::PhantomRead {
                topic: context.topic.to_string(),
                read: context.read,
                value: record.value.clone(),
            });
            return None;
        };
        let written = &self.writes.values[value];
        if written.topic != context.topic || written.record.key != record.key {
            out.push(Violation::MismatchedRead {
                read: context.read,
                value: record.value.clone(),
                written_topic: written.topic.to_string(),
                written_key: written.record.key.clone(),
                read_topic: context.topic.to_string(),
                read_key: record.key.clone(),
            });
            return None;
        }
        if written.copies_allowed == 0 {
            out.push(Violation::ReadOfFailedWrite {
                read: context.read,
                value: record.value.clone(),
                produce: written.first_produce,
            });
            return None;
        }
        Some(value)
    }

    /// Counts one more copy of `value`; true when it is the sequence's first.
    fn count_copy(
        &mut self,
        context: ReadContext<'h>,
        value: usize,
        out: &mut Vec<Violation>,
    ) -> bool {
        let copies = self.copies[value] + 1;
        self.copies[value] = copies;
        self.undo.push(Undo::Copy(value));
        if copies == 1 {
            self.first_read[value] = context.read;
            return true;
        }
        let written = &self.writes.values[value];
        let first_read = self.first_read[value];
        if copies <= written.copies_allowed {
            self.retried.insert(value);
        } else if first_read == context.read {
            out.push(Violation::DuplicateRead {
                read: context.read,
                value: written.record.value.clone(),
                copies,
                copies_allowed: written.copies_allowed,
            });
        } else {
            out.push(Violation::CursorRegression {
                reader: context.reader.unwrap_or_default(),
                topic: context.topic.to_string(),
                value: written.record.value.clone(),
                first_fetch: first_read,
                again_fetch: context.read,
            });
        }
        false
    }

    fn check_key_order(
        &mut self,
        context: ReadContext<'h>,
        value: usize,
        out: &mut Vec<Violation>,
    ) {
        let written = &self.writes.values[value];
        let Some(key) = written.key_id else { return };
        let previous = self.key_max[key];
        let judged = !(context.partial_start && written.copies_allowed > 1);
        if let (Some(max), Some((acked_at, acked_by))) = (previous, written.acked)
            && judged
            && max.rank > acked_at
        {
            let later = &self.writes.values[max.value];
            out.push(Violation::KeyOrderViolation {
                key: written.record.key.clone().unwrap_or_default(),
                earlier: written.record.value.clone(),
                earlier_acked_by: acked_by,
                earlier_acked_at: acked_at,
                later: later.record.value.clone(),
                later_invoked_by: later.first_produce,
                later_invoked_at: later.invoked_at,
                site: site(context, max.read),
            });
        }
        if previous.is_none_or(|max| written.invoked_at > max.rank) {
            let mark = Mark { rank: written.invoked_at, value, read: context.read };
            self.key_max[key] = Some(mark);
            self.undo.push(Undo::Key(key, previous));
        }
    }

    fn check_producer_order(
        &mut self,
        context: ReadContext<'h>,
        value: usize,
        out: &mut Vec<Violation>,
    ) {
        let written: &WrittenValue<'h> = &self.writes.values[value];
        let (Some(pair), Some(_)) = (written.producer_key_id, written.acked) else { return };
        let previous = self.producer_key_max[pair];
        let sequence = written.record.sequence;
        let judged = !(context.partial_start && written.copies_allowed > 1);
        if let Some(max) = previous
            && judged
            && max.rank > sequence
        {
            let higher = &self.writes.values[max.value];
            out.push(Violation::ProducerOrderViolation {
                producer: written.record.producer,
                key: written.record.key.clone().unwrap_or_default(),
                lower_sequence: sequence,
                lower: written.record.value.clone(),
                higher_sequence: max.rank,
                higher: higher.record.value.clone(),
                site: site(context, max.read),
            });
        }
        if previous.is_none_or(|max| sequence > max.rank) {
            self.producer_key_max[pair] = Some(Mark { rank: sequence, value, read: context.read });
            self.undo.push(Undo::ProducerKey(pair, previous));
        }
    }
}

/// The site of an order violation whose first record came from `first_read`.
fn site(context: ReadContext<'_>, first_read: OpId) -> ReadSite {
    match context.reader {
        Some(reader) => {
            ReadSite::Chain { reader, first_fetch: first_read, second_fetch: context.read }
        }
        None => ReadSite::Drain { drain: context.read },
    }
}
