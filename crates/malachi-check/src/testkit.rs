//! Terse builders for hand-written test histories. Everything happens on topic [`TOPIC`]; values
//! and keys are text.

use crate::history::{
    Drain, Fetch, GroupRead, History, Op, OpId, Produce, ReadRecord, Rewind, WrittenRecord,
};

pub(crate) const TOPIC: &str = "t";
pub(crate) const GROUP: &str = "g";

pub(crate) fn written(key: &str, value: &str, producer: u64, sequence: u64) -> WrittenRecord {
    WrittenRecord {
        key: Some(key.as_bytes().to_vec()),
        value: value.as_bytes().to_vec(),
        producer,
        sequence,
    }
}

pub(crate) fn read(key: &str, value: &str) -> ReadRecord {
    ReadRecord { key: Some(key.as_bytes().to_vec()), value: value.as_bytes().to_vec() }
}

/// Reads of `values`, all under key "k".
pub(crate) fn reads(values: &[&str]) -> Vec<ReadRecord> {
    values.iter().map(|value| read("k", value)).collect()
}

pub(crate) fn produce(records: Vec<WrittenRecord>, retry_of: Option<OpId>) -> Op {
    Op::Produce(Produce { topic: TOPIC.to_string(), records, retry_of })
}

/// Invokes a produce of `values` (key "k", producer `process`, sequences from 0).
pub(crate) fn invoke_produce(history: &mut History, process: u64, values: &[&str]) -> OpId {
    let records = values
        .iter()
        .enumerate()
        .map(|(sequence, value)| written("k", value, process, sequence as u64))
        .collect();
    history.invoke(process, produce(records, None))
}

/// A produce of `values` that succeeds at once.
pub(crate) fn produced(history: &mut History, process: u64, values: &[&str]) -> OpId {
    let op_id = invoke_produce(history, process, values);
    history.ok(op_id);
    op_id
}

pub(crate) fn fetch_op(
    reader: u64,
    cursor_in: Option<&str>,
    records: Vec<ReadRecord>,
    cursor_out: &str,
) -> Op {
    Op::Fetch(Fetch {
        topic: TOPIC.to_string(),
        reader,
        cursor_in: cursor_in.map(str::to_string),
        records,
        cursor_out: cursor_out.to_string(),
        skipped: 0,
    })
}

/// A fetch by `reader` (process 100 + reader) that succeeds at once.
pub(crate) fn fetched(
    history: &mut History,
    reader: u64,
    cursor_in: Option<&str>,
    values: &[&str],
    cursor_out: &str,
) -> OpId {
    let op_id = history.invoke(100 + reader, fetch_op(reader, cursor_in, Vec::new(), ""));
    history.ok_with(op_id, fetch_op(reader, cursor_in, reads(values), cursor_out));
    op_id
}

pub(crate) fn drain_op(records: Vec<ReadRecord>, skipped: u64) -> Op {
    Op::Drain(Drain { topic: TOPIC.to_string(), records, skipped })
}

/// A drain (process 300) of `values` under key "k" that succeeds at once.
pub(crate) fn drained(history: &mut History, values: &[&str], skipped: u64) -> OpId {
    let op_id = history.invoke(300, drain_op(Vec::new(), 0));
    history.ok_with(op_id, drain_op(reads(values), skipped));
    op_id
}

pub(crate) fn group_read_op(position: Vec<(u32, u64)>) -> Op {
    Op::GroupRead(GroupRead { topic: TOPIC.to_string(), group: GROUP.to_string(), position })
}

/// Invokes a read of group [`GROUP`] (process 200); complete it with [`observe_group`].
pub(crate) fn invoke_group_read(history: &mut History) -> OpId {
    history.invoke(200, group_read_op(Vec::new()))
}

pub(crate) fn observe_group(history: &mut History, op_id: OpId, position: u64) {
    history.ok_with(op_id, group_read_op(vec![(0, position)]));
}

/// A group read seeing `position` on range 0 that succeeds at once.
pub(crate) fn group_read(history: &mut History, position: u64) -> OpId {
    let op_id = invoke_group_read(history);
    observe_group(history, op_id, position);
    op_id
}

pub(crate) fn rewind_op() -> Op {
    Op::Rewind(Rewind { topic: TOPIC.to_string(), group: GROUP.to_string() })
}
