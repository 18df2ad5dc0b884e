//! The final drains: each successful drain is a read sequence of its own, and the last
//! successful drain of each topic must hold every acknowledged record of that topic.
//!
//! Retention, kept simple and sound: a drain reports how many records it was told retention
//! removed. If that count covers the number of acknowledged records missing, they are counted as
//! expired, not reported. Otherwise every missing acknowledged record is a `LostWrite` (the
//! history then certainly lost at least `missing - skipped` of them; the report names all
//! candidates, with the drain's skipped count, since it cannot tell which ones expired).

use std::collections::{BTreeMap, BTreeSet};

use crate::check::Findings;
use crate::history::{Drain, Op, OpId};
use crate::ops::OpTable;
use crate::report::Violation;
use crate::sequence::{ReadContext, SequenceChecker};
use crate::writes::WriteIndex;

/// The last successful drain of a topic.
struct FinalDrain<'h> {
    completed_at: u64,
    op_id: OpId,
    observed: &'h Drain,
}

pub(crate) fn check_drains<'h>(
    table: &OpTable<'h>,
    writes: &WriteIndex<'h>,
    checker: &mut SequenceChecker<'_, 'h>,
    findings: &mut Findings,
) {
    let mut finals: BTreeMap<&'h str, FinalDrain<'h>> = BTreeMap::new();
    for entry in &table.entries {
        let Op::Drain(request) = entry.request else { continue };
        let Some((Op::Drain(observed), completed_at)) = entry.ok() else { continue };
        let context = ReadContext {
            topic: &request.topic,
            read: entry.op_id,
            reader: None,
            partial_start: observed.skipped > 0,
        };
        let mark = checker.mark();
        checker.read(context, &observed.records, &mut findings.violations);
        checker.rollback(mark);
        findings.stats.records_drained += observed.records.len() as u64;
        let candidate = FinalDrain { completed_at, op_id: entry.op_id, observed };
        let current = finals.entry(&request.topic).or_insert(candidate);
        if current.completed_at < completed_at {
            *current = FinalDrain { completed_at, op_id: entry.op_id, observed };
        }
    }
    check_lost_writes(writes, &finals, findings);
}

fn check_lost_writes(
    writes: &WriteIndex<'_>,
    finals: &BTreeMap<&str, FinalDrain<'_>>,
    findings: &mut Findings,
) {
    let mut acked_by_topic: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (id, value) in writes.values.iter().enumerate() {
        if value.acked.is_some() {
            acked_by_topic.entry(value.topic).or_default().push(id);
        }
    }
    for (topic, acked) in acked_by_topic {
        let Some(drain) = finals.get(topic) else {
            let records_acked = acked.len() as u64;
            let topic = topic.to_string();
            findings.violations.push(Violation::MissingDrain { topic, records_acked });
            continue;
        };
        let present: BTreeSet<usize> = drain
            .observed
            .records
            .iter()
            .filter_map(|record| writes.by_value.get(record.value.as_slice()).copied())
            .collect();
        let missing: Vec<usize> = acked.into_iter().filter(|id| !present.contains(id)).collect();
        if missing.len() as u64 <= drain.observed.skipped {
            findings.stats.expired_by_retention += missing.len() as u64;
            continue;
        }
        for id in missing {
            let value = &writes.values[id];
            findings.violations.push(Violation::LostWrite {
                topic: topic.to_string(),
                value: value.record.value.clone(),
                key: value.record.key.clone(),
                acked_by: value.acked.map(|(_, op_id)| op_id).unwrap_or_default(),
                drain: drain.op_id,
                drain_skipped: drain.observed.skipped,
            });
        }
    }
}
