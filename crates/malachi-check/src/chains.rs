//! Cursor chains: builds the forest of successful fetches and walks every chain through the
//! sequence checker.
//!
//! A fetch's parent is the latest successful fetch of the same reader and topic that completed
//! before the fetch was invoked and whose `cursor_out` equals the fetch's `cursor_in` (the client
//! must have held that cursor to send it). A fetch with no such parent (no cursor, or a cursor
//! from elsewhere, such as a group commit) starts a chain. Resuming twice from one cursor forks
//! the chain; the branches are judged separately, each with the shared prefix.

use std::collections::BTreeMap;

use crate::check::Findings;
use crate::history::{Fetch, Op, OpId};
use crate::ops::OpTable;
use crate::sequence::{ReadContext, SequenceChecker};

struct FetchNode<'h> {
    op_id: OpId,
    request: &'h Fetch,
    observed: &'h Fetch,
    children: Vec<usize>,
}

/// Checks every cursor chain of the history.
pub(crate) fn check_chains<'h>(
    table: &OpTable<'h>,
    checker: &mut SequenceChecker<'_, 'h>,
    findings: &mut Findings,
) {
    let (nodes, roots) = build_forest(table);
    findings.stats.fetches_ok = nodes.len() as u64;
    findings.stats.cursor_chains = roots.len() as u64;
    findings.stats.records_read = nodes.iter().map(|node| node.observed.records.len() as u64).sum();
    // Depth first, without recursion (chains can be thousands of fetches long): a node is
    // pushed once to enter it and once more, with its rollback mark, to leave it.
    let mut stack: Vec<(usize, Option<usize>)> =
        roots.iter().rev().map(|&root| (root, None)).collect();
    while let Some((node, leaving)) = stack.pop() {
        if let Some(mark) = leaving {
            checker.rollback(mark);
            continue;
        }
        let fetch = &nodes[node];
        let context = ReadContext {
            topic: &fetch.request.topic,
            read: fetch.op_id,
            reader: Some(fetch.request.reader),
            partial_start: true,
        };
        let mark = checker.mark();
        checker.read(context, &fetch.observed.records, &mut findings.violations);
        stack.push((node, Some(mark)));
        stack.extend(fetch.children.iter().rev().map(|&child| (child, None)));
    }
}

/// The successful fetches in completion order, with their children, and the chain roots.
fn build_forest<'h>(table: &OpTable<'h>) -> (Vec<FetchNode<'h>>, Vec<usize>) {
    let mut nodes: Vec<FetchNode<'h>> = Vec::new();
    let mut roots = Vec::new();
    // Per op table entry: the parent found when the fetch was invoked.
    let mut parent_of: Vec<Option<usize>> = vec![None; table.entries.len()];
    // (reader, topic, cursor out) to the latest node that returned that cursor.
    let mut latest: BTreeMap<(u64, &'h str, &'h str), usize> = BTreeMap::new();
    for moment in &table.timeline {
        let entry = &table.entries[moment.entry];
        let Op::Fetch(request) = entry.request else { continue };
        if moment.is_invoke {
            let cursor = request.cursor_in.as_deref();
            parent_of[moment.entry] = cursor
                .and_then(|cursor| latest.get(&(request.reader, request.topic.as_str(), cursor)))
                .copied();
            continue;
        }
        let Some((Op::Fetch(observed), _)) = entry.ok() else { continue };
        let node = nodes.len();
        nodes.push(FetchNode { op_id: entry.op_id, request, observed, children: Vec::new() });
        match parent_of[moment.entry] {
            Some(parent) => nodes[parent].children.push(node),
            None => roots.push(node),
        }
        let key = (request.reader, request.topic.as_str(), observed.cursor_out.as_str());
        latest.insert(key, node);
    }
    (nodes, roots)
}
