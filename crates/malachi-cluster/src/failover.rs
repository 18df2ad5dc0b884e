//! Failover of a replicated segment whose primary is gone, as a sans-IO machine.
//!
//! Failover never promotes a follower (design.md, invariant 4). With `n` replicas and the
//! acknowledgement quorum `q`, it needs `n - q + 1` of them: any acknowledged record is on `q`
//! replicas, so some replica among any `n - q + 1` holds it, and the highest durable end among
//! them covers every acknowledged record. The machine walks four steps, each fed what the
//! driver (the broker's `replica/failover.rs`) learned from the copies, and answers what to do
//! next:
//!
//! 1. *probe* every replica, read-only ([`Failover::replicas`]); fewer than `n - q + 1`
//!    answers and nothing is touched ([`Failover::probed`] refuses), since a fence cannot be
//!    undone and fencing copies of a segment that is then not sealed shrinks every later quorum;
//! 2. *fence* the copies that answered; each reports its durable end ([`Failover::fenced`]),
//!    which fixes the seal point ([`seal_point`]) and the copies short of it to *fill* from a
//!    copy that reaches it;
//! 3. *seal* every copy at the seal point ([`Failover::filled`] names them);
//! 4. the copies sealed there ([`Failover::sealed`]) must again be `n - q + 1`; then the seal
//!    point is what metadata records.
//!
//! After every step the machine checks its invariants (see `check`), as
//! [`Primary`](crate::replication::Primary) does.

use std::collections::BTreeMap;

use crate::canary;
use crate::replication::quorum;

/// Where one replica's copy ends, as it answered a fence, a fill or a seal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyEnd {
    pub node_id: u64,
    /// Records the copy holds durably (or was sealed at).
    pub end_offset: u64,
    pub data_bytes: u64,
    pub sealed: bool,
}

/// The simulator's deliberate bugs in failover (off in every build without the `canaries`
/// feature, see [`canary`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct FailoverCanaries {
    /// Seal with one answer, not `n - q + 1`.
    pub seal_without_enough_answers: bool,
    /// Seal at the shortest follower's end, as an unlucky election would promote it.
    pub promote_follower: bool,
}

/// Fewer copies than a failover needs did what a step asked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{count} of {replicas} replicas {what}, {needed} needed to seal it")]
pub struct TooFew {
    /// What the copies did: "answer", "are fenced", "are sealed at the highest end".
    pub what: &'static str,
    pub count: usize,
    pub replicas: usize,
    pub needed: usize,
}

/// Step 2's answer: fill `copies` up to `end` from the copy on `source`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fill {
    pub source: u64,
    pub end: u64,
    pub copies: Vec<u64>,
}

/// Step 3's answer: seal `copies` at `end`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SealAt {
    pub end: u64,
    pub copies: Vec<u64>,
}

/// The outcome: the segment ends at `end_offset` records of `data_bytes` bytes, sealed on
/// `copies`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sealed {
    pub end_offset: u64,
    pub data_bytes: u64,
    pub copies: Vec<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Probing,
    Fencing,
    Filling,
    Sealing,
    Done,
}

/// One failover of one segment.
#[derive(Debug)]
pub struct Failover {
    /// The segment's replicas, its primary first.
    replicas: Vec<u64>,
    /// The broker running this failover: the source of a fill when its copy reaches the end.
    own: u64,
    /// Copies each step needs: `n - q + 1`.
    needed: usize,
    canaries: FailoverCanaries,
    phase: Phase,
    answered: Vec<u64>,
    fenced: Vec<CopyEnd>,
    seal_end: Option<u64>,
    at_end: Vec<u64>,
    sealed: Vec<CopyEnd>,
}

impl Failover {
    /// A failover of a segment on `replicas` (its primary first, at least one), run by `own`.
    pub fn new(replicas: Vec<u64>, own: u64, canaries: FailoverCanaries) -> Failover {
        assert!(!replicas.is_empty(), "a segment has at least one replica");
        let needed = match canary(canaries.seal_without_enough_answers) {
            true => 1,
            false => replicas.len() - quorum(replicas.len()) + 1,
        };
        let failover = Failover {
            replicas,
            own,
            needed,
            canaries,
            phase: Phase::Probing,
            answered: Vec::new(),
            fenced: Vec::new(),
            seal_end: None,
            at_end: Vec::new(),
            sealed: Vec::new(),
        };
        failover.check();
        failover
    }

    /// The copies to probe (step 1): every replica.
    pub fn replicas(&self) -> &[u64] {
        &self.replicas
    }

    /// Step 1 done: the replicas that answered the probe. Answers the copies to fence.
    pub fn probed(&mut self, answered: Vec<u64>) -> Result<Vec<u64>, TooFew> {
        self.advance(Phase::Probing);
        self.answered = answered.into_iter().filter(|node| self.replicas.contains(node)).collect();
        self.answered.sort_unstable();
        self.answered.dedup();
        self.enough("answer", self.answered.len())?;
        self.check();
        Ok(self.answered.clone())
    }

    /// Step 2 done: the fenced copies' ends. Answers which copies to fill, and from where.
    pub fn fenced(&mut self, fenced: Vec<CopyEnd>) -> Result<Fill, TooFew> {
        self.advance(Phase::Fencing);
        self.fenced =
            fenced.into_iter().filter(|copy| self.answered.contains(&copy.node_id)).collect();
        self.fenced.sort_unstable_by_key(|copy| copy.node_id);
        self.fenced.dedup_by_key(|copy| copy.node_id);
        self.enough("are fenced", self.fenced.len())?;
        let end = match canary(self.canaries.promote_follower) {
            true => promoted_end(&self.fenced, self.replicas[0]),
            false => seal_point(&self.fenced),
        };
        self.seal_end = Some(end);
        let own = self.own;
        let source = self
            .fenced
            .iter()
            .filter(|copy| copy.end_offset == end)
            .map(|copy| copy.node_id)
            .min_by_key(|&node| (node != own, node))
            .expect("some copy ends at the seal point");
        let copies = self
            .fenced
            .iter()
            .filter(|copy| copy.end_offset < end && !copy.sealed)
            .map(|copy| copy.node_id)
            .collect();
        let fill = Fill { source, end, copies };
        self.check();
        self.check_fill(&fill);
        Ok(fill)
    }

    /// Step 3 done: where each filled copy ends now. Answers the copies to seal: those filled
    /// to the seal point and those that reached it already.
    pub fn filled(&mut self, filled: Vec<(u64, u64)>) -> SealAt {
        self.advance(Phase::Filling);
        let end = self.seal_end.expect("a fenced failover has a seal point");
        let short = |node: u64| self.fenced.iter().any(|c| c.node_id == node && c.end_offset < end);
        let mut at_end: Vec<u64> = filled
            .into_iter()
            .filter(|&(node, reached)| reached == end && short(node))
            .map(|(node, _)| node)
            .collect();
        at_end.extend(self.fenced.iter().filter(|copy| copy.end_offset == end).map(|c| c.node_id));
        at_end.sort_unstable();
        at_end.dedup();
        self.at_end = at_end;
        self.check();
        SealAt { end, copies: self.at_end.clone() }
    }

    /// Step 4 done: the copies' answers to the seal. Answers where the segment ends, once
    /// enough copies are sealed at the seal point.
    pub fn sealed(&mut self, answers: Vec<CopyEnd>) -> Result<Sealed, TooFew> {
        self.advance(Phase::Sealing);
        let end = self.seal_end.expect("a fenced failover has a seal point");
        self.sealed = answers
            .into_iter()
            .filter(|copy| copy.sealed && copy.end_offset == end)
            .filter(|copy| self.at_end.contains(&copy.node_id))
            .collect();
        self.sealed.sort_unstable_by_key(|copy| copy.node_id);
        self.sealed.dedup_by_key(|copy| copy.node_id);
        // The promote canary's follower becomes the segment alone, as a promoting design's
        // would.
        let promoted = canary(self.canaries.promote_follower) && !self.sealed.is_empty();
        if !promoted {
            self.enough("are sealed at the highest end", self.sealed.len())?;
        }
        self.phase = Phase::Done;
        self.check();
        Ok(Sealed {
            end_offset: end,
            data_bytes: self.sealed[0].data_bytes,
            copies: self.sealed.iter().map(|copy| copy.node_id).collect(),
        })
    }

    /// Moves past `phase`, which must be the one the machine is in: the steps run in order,
    /// each once.
    fn advance(&mut self, phase: Phase) {
        assert_eq!(self.phase, phase, "failover steps run in order, each once");
        self.phase = match phase {
            Phase::Probing => Phase::Fencing,
            Phase::Fencing => Phase::Filling,
            Phase::Filling => Phase::Sealing,
            Phase::Sealing | Phase::Done => Phase::Done,
        };
    }

    fn enough(&mut self, what: &'static str, count: usize) -> Result<(), TooFew> {
        if count >= self.needed {
            return Ok(());
        }
        // A refused step ends the failover: nothing further may be asked of it.
        self.phase = Phase::Done;
        Err(TooFew { what, count, replicas: self.replicas.len(), needed: self.needed })
    }

    /// The machine's invariants, checked after every step.
    fn check(&self) {
        let n = self.replicas.len();
        assert!((1..=n).contains(&self.needed), "a failover needs between 1 and n copies");
        let subset = |inner: &[u64], outer: &[u64]| inner.iter().all(|node| outer.contains(node));
        assert!(subset(&self.answered, &self.replicas), "answered: a replica");
        let fenced: Vec<u64> = self.fenced.iter().map(|copy| copy.node_id).collect();
        assert!(subset(&fenced, &self.answered), "fenced: one that answered");
        assert!(subset(&self.at_end, &fenced), "sealed: a fenced copy");
        let Some(end) = self.seal_end else { return };
        assert!(
            self.fenced.iter().any(|copy| copy.end_offset == end),
            "the seal point is where some fenced copy ends"
        );
        if !canary(self.canaries.promote_follower) {
            assert_eq!(end, seal_point(&self.fenced), "the seal point follows the fenced ends");
            // No record a fenced copy holds durably lies past the seal point, unless an
            // earlier seal fixed the end below it (those records were never acknowledged).
            let sealed_before = self.fenced.iter().any(|copy| copy.sealed);
            assert!(
                sealed_before || self.fenced.iter().all(|copy| copy.end_offset <= end),
                "the seal point covers every fenced copy's records"
            );
        }
        if let Some(first) = self.sealed.first() {
            assert!(
                self.sealed
                    .iter()
                    .all(|copy| copy.end_offset == end && copy.data_bytes == first.data_bytes),
                "copies sealed at one record count hold the same bytes: {:?}",
                self.sealed
            );
        }
    }

    fn check_fill(&self, fill: &Fill) {
        let short = |node: &u64| {
            self.fenced.iter().any(|c| c.node_id == *node && c.end_offset < fill.end && !c.sealed)
        };
        assert!(fill.copies.iter().all(short), "only unsealed copies short of the end are filled");
        let source_at_end =
            self.fenced.iter().any(|c| c.node_id == fill.source && c.end_offset == fill.end);
        assert!(source_at_end, "a fill's source reaches the seal point");
    }
}

/// Where a failover seals, given the fenced copies (at least one). Copies an earlier seal
/// already sealed decide it when there are any: each was sealed at or past every acknowledged
/// record (a primary drains at its staged end, a failover at the highest end of `n - q + 1`
/// fenced copies), and a sealed copy can be neither filled nor cut, so a seal point elsewhere
/// could never gather them (a failover whose seal metadata did not record, then a restarted
/// primary with unacknowledged records past it, would leave the range unsealable). The end most
/// sealed copies share wins, the higher on a tie. Without sealed copies: the highest fenced end,
/// which covers every acknowledged record.
pub fn seal_point(fenced: &[CopyEnd]) -> u64 {
    let mut sealed_at: BTreeMap<u64, usize> = BTreeMap::new();
    for copy in fenced.iter().filter(|copy| copy.sealed) {
        *sealed_at.entry(copy.end_offset).or_default() += 1;
    }
    let agreed = sealed_at.into_iter().max_by_key(|&(end, copies)| (copies, end));
    match agreed {
        Some((end, _)) => end,
        None => fenced.iter().map(|copy| copy.end_offset).max().expect("some copy answered"),
    }
}

/// The promote-follower canary's end: the copy of the follower furthest behind, as an unlucky
/// election would promote it (the primary's own copy when no follower answered).
fn promoted_end(fenced: &[CopyEnd], primary: u64) -> u64 {
    let followers = fenced.iter().filter(|copy| copy.node_id != primary);
    let lowest = followers.map(|copy| copy.end_offset).min();
    lowest.unwrap_or_else(|| fenced.iter().map(|copy| copy.end_offset).max().unwrap_or(0))
}

#[cfg(test)]
mod tests;
