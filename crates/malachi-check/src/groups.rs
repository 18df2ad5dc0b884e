//! Committed group positions never go backwards, except across a declared rewind.
//!
//! Per (topic, group, range) the successful group reads are observations: an invoke time, a
//! completion time and a position. Read A constrains read B only when A completed before B was
//! invoked (concurrent reads may linearize either way). A rewind of the group that did not fail
//! takes effect somewhere in [its invoke, its completion] (its completion is "never" when it is
//! unknown); it excuses the pair (A, B) when it could fall between them: it was invoked before B
//! completed and completed after A was invoked. So with `fence(B)` the latest completion of the
//! rewinds invoked before B completed, a violation is an A with
//! `completed(A) < invoked(B)`, `invoked(A) >= fence(B)` and `position(A) > position(B)`.
//!
//! Sweep the Bs in invoke order; admit each A into a max-structure once its completion precedes
//! the current B's invoke; ask for the highest position among admitted As invoked at or after
//! `fence(B)`. The structure is a Fenwick tree of maxima over the As' invoke ranks, so a series
//! of n reads costs O(n log n) and the witness comes with the answer.

use std::collections::BTreeMap;

use crate::check::Findings;
use crate::history::{Op, OpId};
use crate::ops::{OpTable, Outcome};
use crate::report::Violation;

#[derive(Clone, Copy)]
struct Observation {
    invoked_at: u64,
    completed_at: u64,
    position: u64,
    read: OpId,
}

#[derive(Clone, Copy)]
struct RewindWindow {
    invoked_at: u64,
    /// `u64::MAX` when the outcome is unknown: it may take effect at any later time.
    completed_at: u64,
}

type Series<'h> = BTreeMap<(&'h str, &'h str, u32), Vec<Observation>>;
type Rewinds<'h> = BTreeMap<(&'h str, &'h str), Vec<RewindWindow>>;

pub(crate) fn check_groups(table: &OpTable<'_>, findings: &mut Findings) {
    let (series, rewinds) = collect(table, findings);
    for ((topic, group, range), mut observations) in series {
        let windows = rewinds.get(&(topic, group)).map(Vec::as_slice).unwrap_or_default();
        for (earlier, later) in regressions(&mut observations, windows) {
            findings.violations.push(Violation::GroupRegression {
                topic: topic.to_string(),
                group: group.to_string(),
                range,
                earlier_read: earlier.read,
                earlier_position: earlier.position,
                later_read: later.read,
                later_position: later.position,
            });
        }
    }
}

fn collect<'h>(table: &OpTable<'h>, findings: &mut Findings) -> (Series<'h>, Rewinds<'h>) {
    let mut series: Series<'h> = BTreeMap::new();
    let mut rewinds: Rewinds<'h> = BTreeMap::new();
    for entry in &table.entries {
        match entry.request {
            Op::GroupRead(request) => {
                let Some((Op::GroupRead(observed), completed_at)) = entry.ok() else { continue };
                findings.stats.group_reads_ok += 1;
                for &(range, position) in &observed.position {
                    let key = (request.topic.as_str(), request.group.as_str(), range);
                    let invoked_at = entry.invoked_at;
                    let observation =
                        Observation { invoked_at, completed_at, position, read: entry.op_id };
                    series.entry(key).or_default().push(observation);
                }
            }
            Op::Rewind(request) => {
                if entry.outcome() == Outcome::Fail {
                    continue;
                }
                let completed_at = entry.ok().map_or(u64::MAX, |(_, completed_at)| completed_at);
                let window = RewindWindow { invoked_at: entry.invoked_at, completed_at };
                let key = (request.topic.as_str(), request.group.as_str());
                rewinds.entry(key).or_default().push(window);
            }
            _ => {}
        }
    }
    (series, rewinds)
}

/// The violating (A, B) pairs of one series, one witness A per B.
fn regressions(
    observations: &mut [Observation],
    rewinds: &[RewindWindow],
) -> Vec<(Observation, Observation)> {
    observations.sort_by_key(|observation| observation.invoked_at);
    let mut by_completion: Vec<usize> = (0..observations.len()).collect();
    by_completion.sort_by_key(|&rank| observations[rank].completed_at);
    let fences = Fences::new(rewinds);
    let mut admitted = SuffixMax::new(observations.len());
    let mut next_admission = 0;
    let mut found = Vec::new();
    for later in observations.iter() {
        while let Some(&rank) = by_completion.get(next_admission)
            && observations[rank].completed_at < later.invoked_at
        {
            admitted.insert(rank, (observations[rank].position, rank));
            next_admission += 1;
        }
        let fence = fences.fence(later.completed_at);
        let first_rank = observations.partition_point(|earlier| earlier.invoked_at < fence);
        if let Some((position, rank)) = admitted.max_from(first_rank)
            && position > later.position
        {
            found.push((observations[rank], *later));
        }
    }
    found
}

/// The latest rewind completion among rewinds invoked before a time.
struct Fences {
    /// Sorted by invoke time, with the running maximum of completions.
    invoked_at: Vec<u64>,
    max_completed_at: Vec<u64>,
}

impl Fences {
    fn new(rewinds: &[RewindWindow]) -> Fences {
        let mut sorted = rewinds.to_vec();
        sorted.sort_by_key(|window| window.invoked_at);
        let invoked_at = sorted.iter().map(|window| window.invoked_at).collect();
        let max_completed_at = sorted
            .iter()
            .scan(0, |max, window| {
                *max = window.completed_at.max(*max);
                Some(*max)
            })
            .collect();
        Fences { invoked_at, max_completed_at }
    }

    /// Reads invoked before the returned time may have preceded a rewind that preceded `before`.
    fn fence(&self, before: u64) -> u64 {
        let count = self.invoked_at.partition_point(|&invoked_at| invoked_at < before);
        count.checked_sub(1).map_or(0, |last| self.max_completed_at[last])
    }
}

/// A Fenwick tree answering "maximum over ranks >= r" with point insertions.
struct SuffixMax {
    /// Indexed by reversed rank, 1-based in the usual Fenwick way.
    tree: Vec<Option<(u64, usize)>>,
}

impl SuffixMax {
    fn new(len: usize) -> SuffixMax {
        SuffixMax { tree: vec![None; len + 1] }
    }

    fn insert(&mut self, rank: usize, item: (u64, usize)) {
        let mut index = self.tree.len() - 1 - rank;
        while index < self.tree.len() {
            self.tree[index] = self.tree[index].max(Some(item));
            index += index & index.wrapping_neg();
        }
    }

    fn max_from(&self, rank: usize) -> Option<(u64, usize)> {
        let mut index = (self.tree.len() - 1).saturating_sub(rank);
        let mut best = None;
        while index > 0 {
            best = best.max(self.tree[index]);
            index -= index & index.wrapping_neg();
        }
        best
    }
}
