//! The index of everything written: one entry per distinct value, merged over its retry family.
//!
//! A retry family is a produce and every produce that names it (or one of its retries) in
//! `retry_of`. A value sent by two produces of different families is a `DuplicateWrite`; the
//! later sending is ignored. Per value the index keeps what the read checks need:
//! * `invoked_at`: the earliest invoke among the attempts carrying it (the earliest time it can
//!   have been written);
//! * `acked`: the earliest `Ok` among them (from then on it is certainly written);
//! * `copies_allowed`: how many attempts carrying it may have happened (not `Fail`), which is how
//!   many times a read may return it.
//!
//! Keys and (producer, key) pairs are interned to dense ids, so the read checks keep their
//! per-key state in vectors rather than maps.

use std::collections::BTreeMap;

use crate::check::Findings;
use crate::history::{Op, OpId, Produce, WrittenRecord};
use crate::ops::{OpEntry, OpTable, Outcome};
use crate::report::Violation;

pub(crate) struct WrittenValue<'h> {
    pub record: &'h WrittenRecord,
    pub topic: &'h str,
    pub key_id: Option<usize>,
    pub producer_key_id: Option<usize>,
    /// The family root, to tell a retry from a duplicate.
    pub family: OpId,
    /// The first produce that sent the value; its invoke is `invoked_at`.
    pub first_produce: OpId,
    /// The last produce that sent it, to catch a value twice in one produce.
    pub last_produce: OpId,
    pub invoked_at: u64,
    /// The earliest `Ok` among the attempts carrying the value: when, and which op.
    pub acked: Option<(u64, OpId)>,
    pub copies_allowed: u32,
}

#[derive(Default)]
pub(crate) struct WriteIndex<'h> {
    pub values: Vec<WrittenValue<'h>>,
    pub by_value: BTreeMap<&'h [u8], usize>,
    pub key_count: usize,
    pub producer_key_count: usize,
}

/// Builds the index from the produce invokes, in invoke order.
pub(crate) fn index_writes<'h>(table: &OpTable<'h>, findings: &mut Findings) -> WriteIndex<'h> {
    let mut builder = Builder::default();
    let mut family_of: BTreeMap<OpId, OpId> = BTreeMap::new();
    for (position, entry) in table.entries.iter().enumerate() {
        let Op::Produce(produce) = entry.request else { continue };
        count_outcome(entry.outcome(), findings);
        let family = family_root(table, &family_of, position, produce, findings);
        family_of.insert(entry.op_id, family);
        for record in &produce.records {
            builder.add(entry, family, &produce.topic, record, findings);
        }
    }
    let index = builder.index;
    findings.stats.records_written = index.values.len() as u64;
    let acked = index.values.iter().filter(|value| value.acked.is_some()).count();
    findings.stats.records_acked = acked as u64;
    index
}

fn count_outcome(outcome: Outcome, findings: &mut Findings) {
    let stats = &mut findings.stats;
    match outcome {
        Outcome::Ok => stats.produces_ok += 1,
        Outcome::Fail => stats.produces_failed += 1,
        Outcome::Unknown => stats.produces_unknown += 1,
    }
}

/// The family a produce belongs to: its own, unless it retries an earlier produce.
fn family_root(
    table: &OpTable<'_>,
    family_of: &BTreeMap<OpId, OpId>,
    position: usize,
    produce: &Produce,
    findings: &mut Findings,
) -> OpId {
    let entry = &table.entries[position];
    let Some(retried) = produce.retry_of else { return entry.op_id };
    let earlier = table.entry_of(retried).filter(|&earlier| earlier < position);
    match earlier.and_then(|_| family_of.get(&retried)) {
        Some(&family) => family,
        None => {
            findings.violations.push(Violation::MalformedEvent {
                event: entry.invoked_at,
                op_id: entry.op_id,
                reason: format!("retry_of names op {retried}, which is no earlier produce"),
            });
            entry.op_id
        }
    }
}

#[derive(Default)]
struct Builder<'h> {
    index: WriteIndex<'h>,
    keys: BTreeMap<&'h [u8], usize>,
    producer_keys: BTreeMap<(u64, usize), usize>,
}

impl<'h> Builder<'h> {
    fn add(
        &mut self,
        entry: &OpEntry<'h>,
        family: OpId,
        topic: &'h str,
        record: &'h WrittenRecord,
        findings: &mut Findings,
    ) {
        let Some(&id) = self.index.by_value.get(record.value.as_slice()) else {
            self.insert(entry, family, topic, record);
            return;
        };
        let known = &mut self.index.values[id];
        let same_record = known.record == record && known.topic == topic;
        if known.family != family || known.last_produce == entry.op_id || !same_record {
            findings.violations.push(Violation::DuplicateWrite {
                value: record.value.clone(),
                first_produce: known.first_produce,
                second_produce: entry.op_id,
            });
            return;
        }
        known.last_produce = entry.op_id;
        merge_attempt(known, entry);
    }

    fn insert(
        &mut self,
        entry: &OpEntry<'h>,
        family: OpId,
        topic: &'h str,
        record: &'h WrittenRecord,
    ) {
        let key_id = record.key.as_deref().map(|key| {
            let next = self.keys.len();
            *self.keys.entry(key).or_insert(next)
        });
        let producer_key_id = key_id.map(|key_id| {
            let next = self.producer_keys.len();
            *self.producer_keys.entry((record.producer, key_id)).or_insert(next)
        });
        let mut value = WrittenValue {
            record,
            topic,
            key_id,
            producer_key_id,
            family,
            first_produce: entry.op_id,
            last_produce: entry.op_id,
            invoked_at: entry.invoked_at,
            acked: None,
            copies_allowed: 0,
        };
        merge_attempt(&mut value, entry);
        self.index.by_value.insert(&record.value, self.index.values.len());
        self.index.values.push(value);
        self.index.key_count = self.keys.len();
        self.index.producer_key_count = self.producer_keys.len();
    }
}

/// Folds one more attempt carrying the value into what is known of it.
fn merge_attempt(value: &mut WrittenValue<'_>, entry: &OpEntry<'_>) {
    value.invoked_at = value.invoked_at.min(entry.invoked_at);
    if entry.outcome() != Outcome::Fail {
        value.copies_allowed += 1;
    }
    if let Some((_, acked_at)) = entry.ok()
        && value.acked.is_none_or(|(earliest, _)| acked_at < earliest)
    {
        value.acked = Some((acked_at, entry.op_id));
    }
}
