//! Handing a broker's work over before it stops (SIGTERM), so that a restart costs producers
//! no failover: the brokers are told it is draining (they place no new head with it as
//! primary and hand it no leadership), the Raft groups it leads are handed to caught-up voters,
//! and the write heads it is primary of are rolled onto others. It keeps serving while it does
//! (its copies stay followers: a head it follows loses one of three copies while it is away,
//! not its quorum), and its caller then closes the client port and the data directory.
//!
//! `drain_broker` (`malachi cluster drain`) runs the same hand-over on a broker that goes on
//! serving, for maintenance: its notice is renewed until it takes work again or restarts.
//!
//! A drain notice is a hint, not metadata: it lives in each broker's memory, lapses after
//! [`DRAIN_NOTICE_MS`] unless renewed, and is withdrawn by the broker when it starts again. A
//! broker of an older release answers the call as unknown and simply keeps placing as before.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use malachi_consensus::{RaftGroup, StateMachine};

use crate::gossip::PeerStatus;
use crate::node::Core;
use crate::peer::PeerCall;

/// How long a drain notice holds without being renewed: longer than a restart takes, so that a
/// broker coming back is not made primary before it has caught up; short enough that a broker
/// that died while draining (and never withdrew it) is a normal candidate again soon.
pub const DRAIN_NOTICE_MS: u64 = 60_000;

/// How often a broker drained for maintenance renews its notice: three times per notice, so one
/// lost renewal does not let it lapse.
const RENEW_NOTICE_MS: u64 = DRAIN_NOTICE_MS / 3;

/// How long the broker named by `drain_broker` is given to hand its work over and answer: its
/// leaderships (3 s each at most) and its heads (10 s at most) with room to spare.
const DRAIN_CALL_MS: u64 = 120_000;

/// How long one broker is given to answer a drain notice.
const NOTICE_CALL_MS: u64 = 1_000;

/// How often the hand-over looks whether leaderships and heads have moved.
const HANDOVER_POLL_MS: u64 = 20;

/// How long one Raft group's leadership may take to move before the hand-over goes on without
/// it (the group then elects a leader after this broker stops, as after a crash).
const LEADERSHIP_MOVE_MS: u64 = 3_000;
/// How long a vnode's coordinator may take to finish what it decided before its leadership is
/// handed over anyway (a roll takes tens of milliseconds; a split of a large range longer).
const COORDINATOR_IDLE_MS: u64 = 2_000;

/// How long the heads may take to roll off before the hand-over gives up on the rest (they are
/// then sealed around this broker by failover, as after a crash).
const ROLL_OFF_MS: u64 = 10_000;

/// How often a roll not done yet is asked again.
const ROLL_ASK_AGAIN_MS: u64 = 1_000;

/// How soon a roll that was refused (its vnode between leaders) is asked again.
const ROLL_REFUSED_AGAIN_MS: u64 = 100;

/// Which brokers announced that they are draining, and until when the notice holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainNotices {
    until_ms: BTreeMap<u64, u64>,
}

impl DrainNotices {
    /// Records `node_id`'s notice (or its withdrawal) heard at `now_ms`.
    pub fn note(&mut self, node_id: u64, draining: bool, now_ms: u64) {
        if draining {
            self.until_ms.insert(node_id, now_ms.saturating_add(DRAIN_NOTICE_MS));
        } else {
            self.until_ms.remove(&node_id);
        }
    }

    /// Whether `node_id`'s notice holds at `now_ms`.
    pub fn draining(&self, node_id: u64, now_ms: u64) -> bool {
        self.until_ms.get(&node_id).is_some_and(|&until_ms| now_ms < until_ms)
    }

    /// Puts the first broker of `replicas` that is not draining first (the primary), keeping
    /// the others in their order; unchanged when all are draining or the first is not.
    pub fn primary_first(&self, replicas: &mut [u64], now_ms: u64) {
        if let Some(index) = replicas.iter().position(|&node| !self.draining(node, now_ms)) {
            replicas[..=index].rotate_right(1);
        }
    }
}

/// What a hand-over moved, for the log (and, for `drain_broker`, the answer).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HandoverReport {
    pub brokers_told: usize,
    pub leaderships_moved: usize,
    pub leaderships_kept: usize,
    pub heads_rolled: usize,
    pub heads_left: usize,
}

/// Why `drain_broker` did not drain the broker it names.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error("no broker {0} is registered")]
    NoSuchBroker(u64),
    #[error("broker {node_id} did not answer: {detail}")]
    Unreachable { node_id: u64, detail: String },
}

impl DrainError {
    /// The wire reason.
    pub fn reason(&self) -> malachi_reason::Reason {
        match self {
            DrainError::NoSuchBroker(_) => malachi_reason::Reason::NoSuchBroker,
            DrainError::Unreachable { .. } => malachi_reason::Reason::BrokerUnreachable,
        }
    }
}

pub struct Handover {
    core: Arc<Core>,
    notices: Mutex<DrainNotices>,
    /// Drained for maintenance (`drain_broker`): the notice is renewed while this holds.
    maintenance: AtomicBool,
    renewed_ms: AtomicU64,
}

services_on_core!(Handover);

impl Handover {
    pub(crate) fn new(core: Arc<Core>) -> Handover {
        Handover {
            core,
            notices: Mutex::default(),
            maintenance: AtomicBool::new(false),
            renewed_ms: AtomicU64::new(0),
        }
    }

    /// `drain_broker` on this broker: hands the work over and keeps serving (`draining`), or
    /// takes work again. What moved (nothing, when taking work again).
    pub async fn drain(&self, draining: bool) -> HandoverReport {
        self.maintenance.store(draining, Ordering::Relaxed);
        if !draining {
            self.withdraw().await;
            tracing::info!("taking work again: the drain notice is withdrawn");
            return HandoverReport::default();
        }
        self.renewed_ms.store(self.clock.now_ms(), Ordering::Relaxed);
        self.hand_over().await
    }

    /// `drain_broker` through this broker: drains (or undrains) broker `node_id`, this one
    /// or another, which is asked over the inter-node port.
    pub async fn drain_broker(
        &self,
        node_id: u64,
        draining: bool,
    ) -> Result<HandoverReport, DrainError> {
        if node_id == self.node_id {
            return Ok(self.drain(draining).await);
        }
        let registered = self.read_admin(|admin| admin.broker(node_id).is_some());
        let Some(transport) = self.transport().filter(|_| registered) else {
            return Err(DrainError::NoSuchBroker(node_id));
        };
        let unreachable = |detail: String| DrainError::Unreachable { node_id, detail };
        let request = PeerCall::HandOver { draining }.encode();
        let answer = transport.call(node_id, request, Duration::from_millis(DRAIN_CALL_MS)).await;
        let answer = answer.map_err(|error| unreachable(error.to_string()))?;
        serde_json::from_slice(&answer).map_err(|error| unreachable(error.to_string()))
    }

    /// Renews this broker's drain notice with the others when it is drained for maintenance and
    /// the last renewal is [`RENEW_NOTICE_MS`] old (called on every maintenance tick).
    pub(crate) async fn renew_once(&self) {
        let now_ms = self.clock.now_ms();
        let due = now_ms >= self.renewed_ms.load(Ordering::Relaxed) + RENEW_NOTICE_MS;
        if self.maintenance.load(Ordering::Relaxed) && due {
            self.renewed_ms.store(now_ms, Ordering::Relaxed);
            self.note(self.node_id, true);
            self.announce(true).await;
        }
    }

    /// Records `node_id`'s drain notice (or its withdrawal).
    pub(crate) fn note(&self, node_id: u64, draining: bool) {
        let now_ms = self.clock.now_ms();
        self.notices.lock().expect("notices lock poisoned").note(node_id, draining, now_ms);
    }

    /// Whether `node_id` announced that it is draining.
    pub(crate) fn is_draining(&self, node_id: u64) -> bool {
        let now_ms = self.clock.now_ms();
        self.notices.lock().expect("notices lock poisoned").draining(node_id, now_ms)
    }

    /// Orders a new segment's replicas so that a draining broker is not its primary.
    pub(crate) fn primary_first(&self, replicas: &mut [u64]) {
        let now_ms = self.clock.now_ms();
        self.notices.lock().expect("notices lock poisoned").primary_first(replicas, now_ms);
    }

    /// Hands this broker's work over (see the module): tells the others it is draining, moves
    /// the leaderships it holds, rolls the heads it is primary of. Returns once nothing is left
    /// to move or what is left could not be moved; the caller bounds it with its deadline.
    pub async fn hand_over(&self) -> HandoverReport {
        let mut report = HandoverReport::default();
        if self.transport().is_none() {
            return report;
        }
        let started_ms = self.clock.now_ms();
        self.note(self.node_id, true);
        report.brokers_told = self.announce(true).await;
        tracing::info!(took_ms = self.clock.now_ms() - started_ms, "drain notices sent");
        (report.leaderships_moved, report.leaderships_kept) = self.move_leaderships().await;
        (report.heads_rolled, report.heads_left) = self.roll_heads_off().await;
        tracing::info!(?report, "handed this broker's work over");
        report
    }

    /// Withdraws a drain notice this broker may have left with the others before it stopped.
    pub async fn withdraw(&self) {
        if self.transport().is_some() {
            self.note(self.node_id, false);
            self.announce(false).await;
        }
    }

    /// Tells every other registered broker whether this one is draining; how many answered.
    async fn announce(&self, draining: bool) -> usize {
        let Some(transport) = self.transport() else { return 0 };
        let others: Vec<u64> = self.read_admin(|admin| {
            admin.brokers().map(|broker| broker.node_id).filter(|&id| id != self.node_id).collect()
        });
        let calls = others.into_iter().map(|node_id| async move {
            let request = PeerCall::Draining { draining }.encode();
            let answer = transport.call(node_id, request, Duration::from_millis(NOTICE_CALL_MS));
            match answer.await {
                Ok(_) => true,
                Err(error) => {
                    tracing::debug!(node_id, %error, "a drain notice was not answered");
                    false
                }
            }
        });
        let answers = futures_util::future::join_all(calls).await;
        answers.into_iter().filter(|&answered| answered).count()
    }

    /// Hands every Raft group this broker leads to a live, caught-up voter that is not
    /// draining; how many moved and how many it still leads.
    async fn move_leaderships(&self) -> (usize, usize) {
        let mut outcomes = vec![self.move_leadership(&self.admin).await];
        outcomes.push(self.move_leadership(&self.root).await);
        for vnode in self.ring.iter() {
            outcomes.push(self.move_vnode_leadership(vnode).await);
        }
        let moved = outcomes.iter().filter(|outcome| **outcome == Some(true)).count();
        let kept = outcomes.iter().filter(|outcome| **outcome == Some(false)).count();
        (moved, kept)
    }

    /// As [`Handover::move_leadership`], once the vnode's coordinator stopped deciding and what
    /// it had decided finished (at most [`COORDINATOR_IDLE_MS`]), so that no roll or reshape is
    /// left half done across the change of leader.
    async fn move_vnode_leadership(&self, vnode: &crate::vnodes::Vnode) -> Option<bool> {
        if !vnode.group.is_leader() {
            return None;
        }
        let coordinator = || vnode.coordinator.lock().expect("coordinator lock poisoned");
        coordinator().hand_over(true);
        for _ in 0..COORDINATOR_IDLE_MS / HANDOVER_POLL_MS {
            if coordinator().is_idle() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(HANDOVER_POLL_MS)).await;
        }
        let moved = self.move_leadership(&vnode.group).await;
        coordinator().hand_over(false);
        moved
    }

    /// `None` when this broker does not lead `group`; whether its leadership moved otherwise.
    async fn move_leadership<M: StateMachine>(&self, group: &RaftGroup<M>) -> Option<bool> {
        if !group.is_leader() {
            return None;
        }
        let to = group.voters().into_iter().find(|&voter| {
            voter != self.node_id
                && self.member_status(voter) == PeerStatus::Alive
                && group.caught_up(voter)
                && !self.is_draining(voter)
        });
        let Some(to) = to else { return Some(false) };
        if let Err(error) = group.transfer_leader(to).await {
            tracing::warn!(group_id = group.group_id(), to, %error, "leadership transfer failed");
            return Some(false);
        }
        let asked_ms = self.clock.now_ms();
        // Until the new leader is known here, not only until this broker stepped down: the
        // rolls that follow ask the vnode's leader, and one asked in between is refused ("no
        // leader now") and asked again only a while later.
        for _ in 0..LEADERSHIP_MOVE_MS / HANDOVER_POLL_MS {
            if group.leader().0.is_some_and(|leader| leader != self.node_id) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(HANDOVER_POLL_MS)).await;
        }
        let moved = !group.is_leader();
        let waited_ms = self.clock.now_ms().saturating_sub(asked_ms);
        tracing::info!(group_id = group.group_id(), to, moved, waited_ms, "leadership handed over");
        Some(moved)
    }

    /// Asks a roll of every replicated head this broker is primary of, asking again those not
    /// moved yet (a leader may have been changing): a second after a roll was taken, sooner
    /// after one was refused. Waits until each has moved or [`ROLL_OFF_MS`] passed; how many
    /// moved and how many are left.
    async fn roll_heads_off(&self) -> (usize, usize) {
        let heads = self.heads_led_here();
        let mut left = heads.clone();
        let mut ask_at_poll: BTreeMap<(u64, u32), u64> =
            heads.iter().map(|&head| (head, 0)).collect();
        for poll in 0..ROLL_OFF_MS / HANDOVER_POLL_MS {
            for &(topic_id, range_id) in &left {
                let due = ask_at_poll.get_mut(&(topic_id, range_id)).expect("every head is timed");
                if *due > poll {
                    continue;
                }
                let again_ms = match self.broker().coordination.roll(topic_id, range_id).await {
                    Ok(_) => ROLL_ASK_AGAIN_MS,
                    Err(error) => {
                        tracing::warn!(topic_id, range_id, %error, "rolling a head off failed");
                        ROLL_REFUSED_AGAIN_MS
                    }
                };
                *due = poll + again_ms / HANDOVER_POLL_MS;
            }
            tokio::time::sleep(Duration::from_millis(HANDOVER_POLL_MS)).await;
            let now_here = self.heads_led_here();
            left.retain(|head| now_here.contains(head));
            if left.is_empty() {
                break;
            }
        }
        (heads.len() - left.len(), left.len())
    }

    /// The ranges whose head this broker is primary of, among those with other copies (a head
    /// only here has nowhere to go).
    fn heads_led_here(&self) -> Vec<(u64, u32)> {
        self.read_every_meta(|meta| {
            meta.active_heads()
                .filter(|segment| {
                    segment.replicas.len() > 1 && segment.replicas.first() == Some(&self.node_id)
                })
                .map(|segment| (segment.topic_id, segment.range_id))
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_holds_until_it_lapses_or_is_withdrawn() {
        let mut notices = DrainNotices::default();
        notices.note(2, true, 1_000);
        assert!(notices.draining(2, 1_000));
        assert!(notices.draining(2, 1_000 + DRAIN_NOTICE_MS - 1));
        assert!(!notices.draining(2, 1_000 + DRAIN_NOTICE_MS), "a notice lapses");
        assert!(!notices.draining(3, 1_000), "only the broker that gave it drains");
        notices.note(2, true, 5_000);
        notices.note(2, false, 5_001);
        assert!(!notices.draining(2, 5_002), "a withdrawn notice no longer holds");
    }

    #[test]
    fn a_draining_broker_is_never_made_primary_while_another_can_be() {
        // (draining brokers, replicas as placed, replicas as ordered)
        let cases: [(&[u64], &[u64], &[u64]); 6] = [
            (&[], &[1, 2, 3], &[1, 2, 3]),
            (&[1], &[1, 2, 3], &[2, 1, 3]),
            (&[1, 2], &[1, 2, 3], &[3, 1, 2]),
            (&[2], &[1, 2, 3], &[1, 2, 3]),
            (&[1, 2, 3], &[1, 2, 3], &[1, 2, 3]),
            (&[1], &[1], &[1]),
        ];
        for (draining, placed, expected) in cases {
            let mut notices = DrainNotices::default();
            for &node in draining {
                notices.note(node, true, 0);
            }
            let mut replicas = placed.to_vec();
            notices.primary_first(&mut replicas, 10);
            assert_eq!(replicas, expected, "draining {draining:?}, placed {placed:?}");
            let mut sorted = replicas.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, placed, "the same replicas, reordered");
        }
    }
}
