//! The voter seats of the Raft groups: the reconcile loop that keeps every group at the voters
//! it wants on live brokers, and the decommission of a broker (`malachi cluster remove`).
//!
//! The loop is level-triggered and idempotent, the controller pattern: on every maintenance
//! tick, each group's leader compares the group's voters with what it should have and makes at
//! most one change (a learner promoted, or a seat moved), so a lost leadership or a crash in the
//! middle leaves nothing half-done that the next tick would not finish. A seat moves when its
//! broker is leaving (decommissioned) or has been dead longer than
//! `MALACHI_VOTER_REPLACE_AFTER_MS`: the replacement is a live learner that has caught up (every
//! broker is a learner of every group it is no voter of), promoted first, and only then the old
//! voter is demoted, so the group never has fewer voters than it had. Where the seats should
//! be is placement's answer for the group (rendezvous hashing over the brokers that may hold
//! one), so the vnodes' seats spread over the brokers as they join, the same on every broker.
//!
//! Leadership spreads too: each vnode's leader hands the leadership to the vnode's preferred
//! voter ([`preferred_leaders`]: the live voter leading the fewest vnodes so far), so the
//! vnodes' coordinators, and their metadata writes, spread over the brokers.

use malachi_reason::Reason;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use malachi_consensus::{RaftGroup, StateMachine};
use malachi_meta::AdminCommand;
use malachi_meta::placement::{self, Candidate, Constraints};

use crate::cluster::ADMIN_VOTERS_MAX;
use crate::gossip::PeerStatus;
use crate::node::{ADMIN_GROUP_ID, Core};
use crate::vnodes::ROOT_GROUP_ID;

/// A vnode's leadership is handed over at most this often.
const LEADERSHIP_MOVE_PAUSE_MS: u64 = 10_000;
/// How long a decommission waits for the groups' leaders to move the broker's seats.
const DECOMMISSION_WAIT_MS: u64 = 60_000;
const DECOMMISSION_POLL_MS: u64 = 100;

/// Why a broker could not be removed.
#[derive(Debug, thiserror::Error)]
pub enum RemoveError {
    #[error("no broker {0} is registered")]
    NoSuchBroker(u64),
    #[error("broker {node_id} holds {sealed} sealed segments (their only copies); pass force")]
    HoldsSegments { node_id: u64, sealed: usize },
    #[error("a broker cannot remove itself; send the request through another broker")]
    RemoveSelf,
    #[error("{0}")]
    Unavailable(String),
}

impl RemoveError {
    /// The wire reason.
    pub fn reason(&self) -> Reason {
        match self {
            RemoveError::NoSuchBroker(_) => Reason::NoSuchBroker,
            RemoveError::HoldsSegments { .. } => Reason::BrokerHoldsSegments,
            RemoveError::RemoveSelf => Reason::CannotRemoveSelf,
            RemoveError::Unavailable(_) => Reason::MetadataUnavailable,
        }
    }
}

/// What the reconcile loop knows of one broker, for one pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BrokerFacts {
    /// Registered in the administrative machine and not leaving: it may hold seats.
    pub eligible: bool,
    /// Membership holds it alive now.
    pub alive: bool,
    /// Dead (or leaving, or forgotten) long enough that its seats move
    /// (`MALACHI_VOTER_REPLACE_AFTER_MS`).
    pub gone: bool,
}

/// One group's seats as its leader sees them, and what every broker is.
#[derive(Clone, Debug)]
pub struct SeatView {
    /// What placement hashes for this group (its id's bytes).
    pub object: Vec<u8>,
    pub wanted: usize,
    pub voters: BTreeSet<u64>,
    pub learners: BTreeSet<u64>,
    /// Every broker the group or the registry knows; one missing counts as gone.
    pub brokers: BTreeMap<u64, BrokerFacts>,
}

/// The one change a reconcile pass makes to a group's seats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeatChange {
    /// Promote learner `into` to a voter, then (if any) demote `out`, kept as a learner when
    /// `keep_learner`.
    Move { into: u64, out: Option<u64>, keep_learner: bool },
    /// Take `out` out of the group's voters (kept as a learner when `keep_learner`), or drop
    /// the learner `out` (`keep_learner` false).
    Remove { out: u64, keep_learner: bool },
    /// Make a registered broker the group lacks a learner (a join that stopped part-way, or
    /// a registration applied here after the group's leader dropped the broker).
    AddLearner { node_id: u64 },
}

impl SeatView {
    fn facts(&self, node_id: u64) -> BrokerFacts {
        self.brokers.get(&node_id).copied().unwrap_or(BrokerFacts {
            eligible: false,
            alive: false,
            gone: true,
        })
    }

    /// Where the group's voters should be: placement (rendezvous hashing of the group over the
    /// brokers that may hold a seat) among the live eligible members of the group and its
    /// voters not gone yet (a voter down for less than the replace time keeps its place, so a
    /// restart moves nothing).
    pub fn target(&self) -> Vec<u64> {
        let candidates: Vec<Candidate> = self
            .voters
            .iter()
            .chain(&self.learners)
            .copied()
            .filter(|&node_id| {
                let facts = self.facts(node_id);
                let voter_staying = self.voters.contains(&node_id) && !facts.gone;
                facts.eligible && (facts.alive || voter_staying)
            })
            .map(|broker_id| Candidate { broker_id, attributes: Default::default() })
            .collect();
        let seats = self.wanted.min(candidates.len());
        placement::place(&self.object, seats, &candidates, &[], &Constraints::default())
            .map(|placed| placed.brokers)
            .unwrap_or_default()
    }

    /// The one change to make now, if any: a gone voter's seat moves to a live learner
    /// (promoted first, so the group never has fewer voters); a missing seat is filled; a
    /// surplus voter off the target is demoted; a seat off its target moves to the target's
    /// live learner (brokers that joined share the seats); a leaving broker's learner is
    /// dropped; a live registered broker the group lacks becomes a learner. Deterministic: the
    /// same view gives the same change on any broker.
    pub fn plan(&self) -> Option<SeatChange> {
        let target = self.target();
        let live_learner = |node_id: &u64| {
            let facts = self.facts(*node_id);
            self.learners.contains(node_id) && facts.eligible && facts.alive
        };
        let into = target
            .iter()
            .copied()
            .find(live_learner)
            .or_else(|| self.learners.iter().copied().find(live_learner));
        if let Some(out) = self.voters.iter().copied().find(|&node_id| self.facts(node_id).gone) {
            let keep_learner = self.facts(out).eligible;
            return match into {
                Some(into) => Some(SeatChange::Move { into, out: Some(out), keep_learner }),
                // No replacement: a leaving broker still gives up its seat while others remain.
                None if !keep_learner && self.voters.len() > 1 => {
                    Some(SeatChange::Remove { out, keep_learner: false })
                }
                None => None,
            };
        }
        if self.voters.len() < self.wanted
            && let Some(into) = into
        {
            return Some(SeatChange::Move { into, out: None, keep_learner: true });
        }
        let off_target = self.voters.iter().copied().find(|node_id| !target.contains(node_id));
        if self.voters.len() > self.wanted
            && let Some(out) = off_target
        {
            // A move whose demotion did not happen (the leadership moved between the two).
            return Some(SeatChange::Remove { out, keep_learner: true });
        }
        let on_target = target.iter().copied().find(live_learner);
        if self.voters.len() >= self.wanted
            && let (Some(out), Some(into)) = (off_target, on_target)
        {
            return Some(SeatChange::Move { into, out: Some(out), keep_learner: true });
        }
        let leaving = self.learners.iter().copied().find(|&node_id| !self.facts(node_id).eligible);
        if let Some(out) = leaving {
            return Some(SeatChange::Remove { out, keep_learner: false });
        }
        let missing = self.brokers.iter().find(|(node_id, facts)| {
            facts.eligible
                && facts.alive
                && !self.voters.contains(node_id)
                && !self.learners.contains(node_id)
        });
        missing.map(|(&node_id, _)| SeatChange::AddLearner { node_id })
    }
}

/// The voter each vnode's leadership should rest on: vnode by vnode, the live voter leading the
/// fewest so far, ties broken by rendezvous rank, so leadership spreads evenly over the brokers
/// that hold seats. `vnodes` are (group id, voters); the same inputs give the same answer on
/// every broker.
pub fn preferred_leaders(
    vnodes: &[(u64, BTreeSet<u64>)],
    alive: impl Fn(u64) -> bool,
) -> BTreeMap<u64, u64> {
    let mut led: BTreeMap<u64, usize> = BTreeMap::new();
    let mut preferred = BTreeMap::new();
    for (group_id, voters) in vnodes {
        let object = group_object(*group_id);
        let best =
            voters.iter().copied().filter(|&node_id| alive(node_id)).min_by_key(|&node_id| {
                let rank = u64::MAX - placement::score(&object, node_id);
                (led.get(&node_id).copied().unwrap_or(0), rank, node_id)
            });
        if let Some(node_id) = best {
            *led.entry(node_id).or_default() += 1;
            preferred.insert(*group_id, node_id);
        }
    }
    preferred
}

/// What placement hashes for a Raft group.
pub fn group_object(group_id: u64) -> Vec<u8> {
    [&b"group"[..], &group_id.to_le_bytes()].concat()
}

/// The seats service: keeps every Raft group at the voters it wants on live brokers, spreads
/// the vnodes' leadership, and decommissions brokers.
pub struct Seats {
    core: Arc<Core>,
    /// When this broker last handed each vnode's leadership over, by group id.
    leadership_moved_ms: Mutex<BTreeMap<u64, u64>>,
}

services_on_core!(Seats);

impl Seats {
    pub(crate) fn new(core: Arc<Core>) -> Seats {
        Seats { core, leadership_moved_ms: Mutex::default() }
    }

    /// One pass of the reconcile loop over the groups this broker leads, then the leadership
    /// of the vnodes it leads that should rest elsewhere.
    pub async fn reconcile_seats(&self) {
        if self.transport().is_none() {
            return;
        }
        let brokers = self.broker_facts();
        if self.admin.is_leader() {
            let outcome = self.reconcile_group(&self.admin, ADMIN_VOTERS_MAX, &brokers).await;
            log_change(ADMIN_GROUP_ID, outcome);
        }
        if self.root.is_leader() {
            let wanted = self.config.cluster.vnode_voters;
            let outcome = self.reconcile_group(&self.root, wanted, &brokers).await;
            log_change(ROOT_GROUP_ID, outcome);
        }
        for vnode in self.ring.iter().filter(|vnode| vnode.group.is_leader()) {
            let wanted = self.config.cluster.vnode_voters;
            let outcome = self.reconcile_group(&vnode.group, wanted, &brokers).await;
            log_change(vnode.group_id(), outcome);
        }
        self.spread_leadership().await;
    }

    /// What every registered broker is now, for the seats.
    fn broker_facts(&self) -> BTreeMap<u64, BrokerFacts> {
        let replace_after_ms = self.config.cluster.voter_replace_after_ms;
        let registered: Vec<(u64, bool)> = self.broker().read_admin(|admin| {
            admin
                .brokers()
                .map(|broker| (broker.node_id, admin.broker_leaving(broker.node_id)))
                .collect()
        });
        registered
            .into_iter()
            .map(|(node_id, leaving)| {
                let facts = BrokerFacts {
                    eligible: !leaving,
                    alive: self.member_status(node_id) == PeerStatus::Alive,
                    gone: leaving || self.dead_for_ms(node_id) >= replace_after_ms,
                };
                (node_id, facts)
            })
            .collect()
    }

    /// At most one change to `group`'s seats (see [`SeatView::plan`]). What changed, if anything.
    async fn reconcile_group<M: StateMachine>(
        &self,
        group: &RaftGroup<M>,
        wanted: usize,
        brokers: &BTreeMap<u64, BrokerFacts>,
    ) -> Result<Option<String>, String> {
        let view = SeatView {
            object: group_object(group.group_id()),
            wanted,
            voters: group.voters(),
            learners: group.learners(),
            brokers: brokers.clone(),
        };
        let error = |error: malachi_consensus::ConsensusError| error.to_string();
        match view.plan() {
            None => Ok(None),
            Some(SeatChange::Move { into, out, keep_learner }) => {
                group.add_member(into, true).await.map_err(error)?;
                if let Some(out) = out {
                    group.remove_member(out, keep_learner).await.map_err(error)?;
                    return Ok(Some(format!("seat of {out} moved to {into}")));
                }
                Ok(Some(format!("{into} took a free seat")))
            }
            Some(SeatChange::Remove { out, keep_learner }) => {
                group.remove_member(out, keep_learner).await.map_err(error)?;
                Ok(Some(format!("{out} removed")))
            }
            Some(SeatChange::AddLearner { node_id }) => {
                group.add_learner(node_id).await.map_err(error)?;
                Ok(Some(format!("{node_id} added as a learner")))
            }
        }
    }

    /// Hands the leadership of each vnode this broker leads to its preferred voter
    /// ([`preferred_leaders`]), when that voter is alive, not leaving, caught up, and leads at
    /// least two vnodes fewer than this broker (so two brokers that see the cluster a little
    /// differently never hand a vnode back and forth), the vnode's coordinator has nothing in
    /// flight, and the vnode was not handed over in the last `LEADERSHIP_MOVE_PAUSE_MS`.
    async fn spread_leadership(&self) {
        if !self.membership_running() {
            return;
        }
        let vnodes: Vec<(u64, BTreeSet<u64>)> =
            self.ring.iter().map(|vnode| (vnode.group_id(), vnode.group.voters())).collect();
        let preferred =
            preferred_leaders(&vnodes, |node_id| self.member_status(node_id) == PeerStatus::Alive);
        let mut led: BTreeMap<u64, usize> = BTreeMap::new();
        for vnode in self.ring.iter() {
            if let Some(leader) = vnode.group.leader().0 {
                *led.entry(leader).or_default() += 1;
            }
        }
        let now_ms = self.clock.now_ms();
        for vnode in self.ring.iter().filter(|vnode| vnode.group.is_leader()) {
            let Some(&to) = preferred.get(&vnode.group_id()) else { continue };
            let (mine, theirs) = (led.get(&self.node_id).copied().unwrap_or(0), led.get(&to));
            let idle = vnode.coordinator.lock().expect("coordinator lock poisoned").is_idle();
            if to == self.node_id
                || mine < theirs.copied().unwrap_or(0) + 2
                || !self.takes_new_work(to)
                || self.broker().handover.is_draining(to)
                || !vnode.group.caught_up(to)
                || !idle
                || !self.leadership_move_allowed(vnode.group_id(), now_ms)
            {
                continue;
            }
            tracing::info!(vnode = vnode.vnode_id(), to, "handing the vnode's leadership over");
            if let Err(error) = vnode.group.transfer_leader(to).await {
                tracing::warn!(vnode = vnode.vnode_id(), to, %error, "leadership transfer failed");
                continue;
            }
            *led.entry(self.node_id).or_default() -= 1;
            *led.entry(to).or_default() += 1;
        }
    }

    /// Whether `group_id`'s leadership may be handed over now, recording that it is.
    fn leadership_move_allowed(&self, group_id: u64, now_ms: u64) -> bool {
        let mut moved = self.leadership_moved_ms.lock().expect("leadership lock poisoned");
        if moved.get(&group_id).is_some_and(|&last| now_ms < last + LEADERSHIP_MOVE_PAUSE_MS) {
            return false;
        }
        moved.insert(group_id, now_ms);
        true
    }

    /// Decommissions broker `node_id`: marks it leaving (it takes no new segments and no
    /// seats), rolls the write heads it holds onto other brokers, waits until the groups'
    /// leaders moved its seats and dropped it, then forgets it. A broker holding sealed
    /// segments (their only copies, until segments are replicated) is refused unless `force`.
    pub async fn decommission(&self, node_id: u64, force: bool) -> Result<(), RemoveError> {
        if node_id == self.node_id {
            return Err(RemoveError::RemoveSelf);
        }
        if self.admin.read(|admin| admin.0.broker(node_id).is_none()) {
            return Err(RemoveError::NoSuchBroker(node_id));
        }
        let (sealed, heads) = self.segments_on(node_id);
        if sealed > 0 && !force {
            return Err(RemoveError::HoldsSegments { node_id, sealed });
        }
        self.propose_admin(AdminCommand::SetBrokerLeaving { node_id, leaving: true }).await?;
        tracing::info!(node_id, heads = heads.len(), sealed, "decommissioning a broker");
        for (topic_id, range_id) in heads {
            if let Err(error) = self.broker().coordination.roll(topic_id, range_id).await {
                tracing::warn!(node_id, topic_id, range_id, %error, "rolling a head off failed");
            }
        }
        for _ in 0..DECOMMISSION_WAIT_MS / DECOMMISSION_POLL_MS {
            let member = |voters: BTreeSet<u64>, learners: BTreeSet<u64>| {
                voters.contains(&node_id) || learners.contains(&node_id)
            };
            let in_admin = member(self.admin.voters(), self.admin.learners());
            let in_root = member(self.root.voters(), self.root.learners());
            let in_vnodes =
                self.ring.iter().any(|vnode| member(vnode.group.voters(), vnode.group.learners()));
            if !in_admin && !in_root && !in_vnodes {
                self.propose_admin(AdminCommand::RemoveBroker { node_id }).await?;
                tracing::info!(node_id, "broker removed from the cluster");
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(DECOMMISSION_POLL_MS)).await;
        }
        Err(RemoveError::Unavailable(format!(
            "the groups' leaders did not move broker {node_id}'s seats within \
             {DECOMMISSION_WAIT_MS} ms; it stays marked leaving, and the request may be repeated"
        )))
    }

    /// The sealed segments with a copy on `node_id`, and the ranges whose head it holds.
    fn segments_on(&self, node_id: u64) -> (usize, Vec<(u64, u32)>) {
        let held = self.read_every_meta(|meta| {
            let mut held = Vec::new();
            for topic in meta.topics() {
                for range in topic.ranges.values() {
                    for segment in meta.range_segments(topic.topic_id, range.range_id) {
                        if segment.replicas.contains(&node_id) {
                            held.push((topic.topic_id, range.range_id, segment.is_active()));
                        }
                    }
                }
            }
            held
        });
        let sealed = held.iter().filter(|(_, _, active)| !active).count();
        let heads = held.into_iter().filter(|(_, _, active)| *active);
        (sealed, heads.map(|(topic_id, range_id, _)| (topic_id, range_id)).collect())
    }

    async fn propose_admin(&self, command: AdminCommand) -> Result<(), RemoveError> {
        match self.admin.propose(command).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(RemoveError::Unavailable(error.to_string())),
            Err(error) => Err(RemoveError::Unavailable(error.to_string())),
        }
    }

    /// Whether this broker may place new segments or seats on `node_id` (not leaving).
    pub(crate) fn takes_new_work(&self, node_id: u64) -> bool {
        !self.admin.read(|admin| admin.0.broker_leaving(node_id))
    }
}

fn log_change(group_id: u64, outcome: Result<Option<String>, String>) {
    match outcome {
        Ok(Some(change)) => tracing::info!(group_id, %change, "group seats reconciled"),
        Ok(None) => {}
        Err(error) => tracing::warn!(group_id, %error, "reconciling a group's seats failed"),
    }
}

#[cfg(test)]
mod tests;
