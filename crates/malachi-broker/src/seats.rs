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
//! voter is demoted, so the group never has fewer voters than it had. Candidates are taken in
//! node id order, the same on every broker.

use std::collections::BTreeSet;
use std::time::Duration;

use malachi_consensus::{RaftGroup, StateMachine};
use malachi_meta::AdminCommand;

use crate::cluster::ADMIN_VOTERS_MAX;
use crate::gossip::PeerStatus;
use crate::node::Broker;

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
    pub fn reason(&self) -> &'static str {
        match self {
            RemoveError::NoSuchBroker(_) => "no_such_broker",
            RemoveError::HoldsSegments { .. } => "broker_holds_segments",
            RemoveError::RemoveSelf => "cannot_remove_self",
            RemoveError::Unavailable(_) => "metadata_unavailable",
        }
    }
}

/// What the registry says of the brokers, for one reconcile pass.
#[derive(Debug, Default)]
struct Registry {
    registered: BTreeSet<u64>,
    leaving: BTreeSet<u64>,
}

impl Broker {
    /// One pass of the reconcile loop over the groups this broker leads.
    pub async fn reconcile_seats(&self) {
        if self.transport().is_none() {
            return;
        }
        let registry = self.registry();
        if self.admin.is_leader() {
            let outcome = self.reconcile_group(&self.admin, ADMIN_VOTERS_MAX, &registry).await;
            log_change("admin", outcome);
        }
        if self.meta.is_leader() {
            let wanted = self.config.cluster.vnode_voters;
            let outcome = self.reconcile_group(&self.meta, wanted, &registry).await;
            log_change("vnode", outcome);
        }
    }

    fn registry(&self) -> Registry {
        self.admin.read(|admin| {
            let registered: BTreeSet<u64> =
                admin.0.brokers().map(|broker| broker.node_id).collect();
            let leaving =
                registered.iter().copied().filter(|&id| admin.0.broker_leaving(id)).collect();
            Registry { registered, leaving }
        })
    }

    /// At most one change to `group`'s seats: move a seat off a leaving or long-dead broker,
    /// else fill a missing seat, else drop a leaving broker's learner. What changed, if anything.
    async fn reconcile_group<M: StateMachine>(
        &self,
        group: &RaftGroup<M>,
        wanted: usize,
        registry: &Registry,
    ) -> Result<Option<String>, String> {
        let (voters, learners) = (group.voters(), group.learners());
        let replace_after_ms = self.config.cluster.voter_replace_after_ms;
        let gone = |node_id: &u64| {
            registry.leaving.contains(node_id)
                || !registry.registered.contains(node_id)
                || self.dead_for_ms(*node_id) >= replace_after_ms
        };
        let candidate = learners.iter().copied().find(|node_id| {
            registry.registered.contains(node_id)
                && !registry.leaving.contains(node_id)
                && self.member_status(*node_id) == PeerStatus::Alive
        });
        let error = |error: malachi_consensus::ConsensusError| error.to_string();
        if let Some(out) = voters.iter().copied().find(gone) {
            let keep_learner =
                registry.registered.contains(&out) && !registry.leaving.contains(&out);
            match candidate {
                Some(into) => {
                    group.add_member(into, true).await.map_err(error)?;
                    group.remove_member(out, keep_learner).await.map_err(error)?;
                    return Ok(Some(format!("seat of {out} moved to {into}")));
                }
                // No replacement: a leaving broker still gives up its seat while others remain.
                None if !keep_learner && voters.len() > 1 => {
                    group.remove_member(out, false).await.map_err(error)?;
                    return Ok(Some(format!("seat of {out} given up")));
                }
                None => return Ok(None),
            }
        }
        if voters.len() < wanted
            && let Some(into) = candidate
        {
            group.add_member(into, true).await.map_err(error)?;
            return Ok(Some(format!("{into} took a free seat")));
        }
        let leaving_learner = learners.iter().copied().find(|node_id| {
            registry.leaving.contains(node_id) || !registry.registered.contains(node_id)
        });
        if let Some(out) = leaving_learner {
            group.remove_member(out, false).await.map_err(error)?;
            return Ok(Some(format!("learner {out} removed")));
        }
        Ok(None)
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
            if let Err(error) = self.roll(topic_id, range_id).await {
                tracing::warn!(node_id, topic_id, range_id, %error, "rolling a head off failed");
            }
        }
        for _ in 0..DECOMMISSION_WAIT_MS / DECOMMISSION_POLL_MS {
            let member = |voters: BTreeSet<u64>, learners: BTreeSet<u64>| {
                voters.contains(&node_id) || learners.contains(&node_id)
            };
            let in_admin = member(self.admin.voters(), self.admin.learners());
            let in_vnode = member(self.meta.voters(), self.meta.learners());
            if !in_admin && !in_vnode {
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
        self.meta.read(|meta| {
            let mut sealed = 0;
            let mut heads = Vec::new();
            for topic in meta.0.topics() {
                for range in topic.ranges.values() {
                    for segment in meta.0.range_segments(topic.topic_id, range.range_id) {
                        if !segment.replicas.contains(&node_id) {
                            continue;
                        }
                        if segment.is_active() {
                            heads.push((topic.topic_id, range.range_id));
                        } else {
                            sealed += 1;
                        }
                    }
                }
            }
            (sealed, heads)
        })
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

fn log_change(group: &str, outcome: Result<Option<String>, String>) {
    match outcome {
        Ok(Some(change)) => tracing::info!(group, %change, "group seats reconciled"),
        Ok(None) => {}
        Err(error) => tracing::warn!(group, %error, "reconciling a group's seats failed"),
    }
}
