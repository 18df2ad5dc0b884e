//! The coordinator's driver: feeds `Coordinator` (`coordinator.rs`) what this broker sees and
//! carries out its decisions (`heads.rs`), and, on every broker, the duties of holding write
//! heads: asking the vnode's leader to roll a head (full, old, failed, found sealed) and
//! reporting the append rates of the heads held here.
//!
//! Each vnode has its own coordinator (`vnodes.rs`); a broker coordinates the vnodes it leads
//! and no other. For a vnode it does not lead it decides nothing: it sends what it knows to that
//! vnode's leader (`PeerCall::Coordinate`, naming the vnode's group) and forwards an
//! operator's split or merge there. Roll requests are carried out at once, not at the next
//! tick, because producers wait on them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::coordinator::{Action, Decision};
use crate::data::SegmentKey;
use crate::error::LogError;
use crate::load::LoadTracker;
use crate::load::Rate;
use crate::node::Core;
use crate::peer::{Ask, PeerCall};
use crate::vnodes::Vnode;
use malachi_meta::Segment;

/// A holder asks the leader for a roll of the same range at most this often.
const ROLL_ASK_MS: u64 = 1_000;
/// A head placed on too few brokers is rolled onto more once it is this old.
const HEAD_GROW_AFTER_MS: u64 = 1_000;
/// How long a call to the leader may take (a forwarded reshape seals and proposes).
const LEADER_CALL_MS: u64 = 30_000;

/// The answer to a forwarded reshape: the new ranges, or the wire reason it was refused with.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Reshaped {
    Ranges(Vec<u32>),
    Refused { reason: String, retryable: bool },
}

/// The coordination service: on the vnodes this broker leads, feeds their coordinators and
/// carries out their decisions (roll, split, merge, expire: `heads.rs`); on every broker,
/// asks for rolls of the heads it holds and reports their append rates.
pub struct Coordination {
    core: Arc<Core>,
    /// Append rates of the heads held here, reported to their vnodes' leaders.
    load: Mutex<LoadTracker>,
    /// Ranges this broker is rolling now (as their vnode's coordinator).
    rolling: Mutex<BTreeSet<(u64, u32)>>,
    /// When this broker last asked the vnode's leader to roll each range.
    roll_asked_ms: Mutex<BTreeMap<(u64, u32), u64>>,
}

services_on_core!(Coordination);

impl Coordination {
    pub(crate) fn new(core: Arc<Core>) -> Coordination {
        let load = Mutex::new(LoadTracker::new(core.config.load.window_ms));
        Coordination { core, load, rolling: Mutex::default(), roll_asked_ms: Mutex::default() }
    }

    /// Counts an append to `key` in its range's rate.
    pub(crate) fn record_load(&self, key: SegmentKey, records: u64, bytes: u64, now_ms: u64) {
        let mut load = self.load.lock().expect("load lock poisoned");
        load.record(key.topic_id, key.range_id, records, bytes, now_ms);
    }

    /// Segment rolls requested and not finished yet.
    pub(crate) fn rolls_pending(&self) -> usize {
        self.rolling.lock().expect("rolling lock poisoned").len()
    }

    /// The term this broker leads `vnode` in now, after telling its coordinator.
    fn observe_leadership(&self, vnode: &Vnode) -> Option<u64> {
        let (leader, term) = vnode.group.leader();
        let mut coordinator = vnode.coordinator.lock().expect("coordinator lock poisoned");
        coordinator.leadership(leader == Some(self.node_id), term);
        coordinator.deciding_term()
    }

    /// One pass of coordination, run on every maintenance tick: the holder's duties, then, for
    /// each vnode this broker leads, its coordinator's decisions, carried out in turn.
    pub async fn coordinate_once(&self) {
        self.roll_by_age().await;
        self.roll_heads_without_replication();
        self.tend_heads();
        self.report_load().await;
        for vnode in self.ring.iter() {
            let Some(term) = self.observe_leadership(vnode) else { continue };
            self.roll_heads_of_dead_primaries(vnode);
            self.roll_heads_below_replication(vnode);
            self.broker().healer.heal_vnode(vnode, term).await;
            let now_ms = self.clock.now_ms();
            let policies = self.broker().admin_service.policy_definitions();
            let decisions = vnode.group.read(|meta| {
                let mut coordinator = vnode.coordinator.lock().expect("coordinator lock poisoned");
                coordinator.tick(&meta.0, &policies, now_ms)
            });
            for decision in decisions {
                self.carry_out(vnode, decision).await;
            }
        }
    }

    /// Asks for a roll of every replicated head this broker is the primary of but holds no
    /// replication state for (it restarted since it created the head): it takes no appends
    /// and shows readers nothing until failover seals it, which must not wait for a producer.
    ///
    /// A head whose file this broker never reported created is not one: metadata records a new
    /// segment before its primary creates the file (`create_placed`, or the first append), and
    /// the replication state is made with the file. Rolling it in that window sealed brand-new
    /// heads at offset 0 on a tick that happened to fall between the two (CI saw a topic's first
    /// head rolled before its first record, which moved the head the test then failed).
    fn roll_heads_without_replication(&self) {
        let stateless: Vec<(u64, u32)> = self.read_every_meta(|meta| {
            meta.active_heads()
                .filter(|segment| {
                    let key = SegmentKey {
                        topic_id: segment.topic_id,
                        range_id: segment.range_id,
                        segment_id: segment.segment_id,
                    };
                    segment.replicas.len() > 1
                        && segment.replicas.first() == Some(&self.node_id)
                        && segment.created_on.contains(&self.node_id)
                        && !self.broker().replicator.holds_head(key)
                })
                .map(|segment| (segment.topic_id, segment.range_id))
                .collect()
        });
        for (topic_id, range_id) in stateless {
            self.request_roll(topic_id, range_id);
        }
    }

    /// Tends the replication heads held here. One that metadata holds closed (sealed by
    /// failover on another broker while this one was cut off, or its topic deleted) is
    /// forgotten: nothing appends to it any more, and its followers, who hold it sealed or
    /// not at all, would otherwise be shipped to for good. One a quorum refused is asked to
    /// roll again: the roll asked when it was refused may have failed (its followers were
    /// failing too), and once they return no producer asks, since none writes to a head that
    /// refuses appends; until it is sealed its range takes no writes.
    fn tend_heads(&self) {
        for (key, refused) in self.broker().replicator.heads_refused() {
            let closed = self.read_meta(key.topic_id, |meta| meta.segment_closed(key.segment_id));
            if closed {
                tracing::debug!(?key, "a head held here was sealed elsewhere: forgetting it");
                self.broker().replicator.forget(key);
            } else if refused {
                self.request_roll(key.topic_id, key.range_id);
            }
        }
    }

    /// Rolls the replicated heads of `vnode` whose primary membership holds dead: failover
    /// seals them on their followers and their ranges take writes again on live brokers,
    /// without waiting for a producer to ask.
    fn roll_heads_of_dead_primaries(&self, vnode: &Vnode) {
        let orphaned = heads_where(vnode, |segment| {
            segment.replicas.first().is_some_and(|&primary| {
                segment.replicas.len() > 1
                    && primary != self.node_id
                    && self.member_status(primary) == crate::gossip::PeerStatus::Dead
            })
        });
        for (topic_id, range_id) in orphaned {
            tracing::info!(topic_id, range_id, "the primary of a head is dead: rolling it");
            self.request_roll(topic_id, range_id);
        }
    }

    /// Rolls the heads of `vnode` placed on fewer brokers than they should have (brokers were
    /// down when they were created) once more brokers can take a replica: the next head is
    /// placed on as many as are live, and healing adds the missing replicas to the sealed one.
    /// A head younger than `HEAD_GROW_AFTER_MS` is left to take its first writes, so a broker
    /// that flaps does not roll every head it comes back to.
    fn roll_heads_below_replication(&self, vnode: &Vnode) {
        let placeable = self.replicas_wanted().min(self.placement_candidates().len());
        let now_ms = self.clock.now_ms();
        let short = heads_where(vnode, |segment| {
            segment.replicas.len() < placeable
                && now_ms >= segment.created_ms.saturating_add(HEAD_GROW_AFTER_MS)
        });
        for (topic_id, range_id) in short {
            tracing::info!(
                topic_id,
                range_id,
                placeable,
                "a head has too few replicas: rolling it"
            );
            self.request_roll(topic_id, range_id);
        }
    }

    /// Carries out one decision of `vnode`'s coordinator and tells it it is done.
    async fn carry_out(&self, vnode: &Vnode, decision: Decision) {
        let Decision { term, action } = decision;
        let outcome = self.act(term, &action).await;
        match &outcome {
            Ok(ranges) if !ranges.is_empty() => tracing::info!(?action, ?ranges, term, "reshaped"),
            Ok(_) => tracing::debug!(?action, term, "coordinated"),
            Err(error) => tracing::warn!(?action, term, %error, "coordinated action failed"),
        }
        let now_ms = self.clock.now_ms();
        vnode.coordinator.lock().expect("coordinator lock poisoned").finished(&action, now_ms);
    }

    /// The new ranges of a split or merge (none for the others).
    async fn act(&self, term: u64, action: &Action) -> Result<Vec<u32>, LogError> {
        match *action {
            Action::Roll { topic_id, range_id } => {
                self.roll_in(term, topic_id, range_id).await.map(|()| Vec::new())
            }
            Action::Split { topic_id, range_id } => {
                self.split_in(term, topic_id, range_id).await.map(Vec::from)
            }
            Action::Merge { topic_id, left, right } => {
                self.merge_in(term, topic_id, [left, right]).await.map(|merged| vec![merged])
            }
            Action::Expire { ref segments } => {
                self.expire_in(term, segments).await?;
                self.broker().reclaim().await.map(|()| Vec::new())
            }
        }
    }

    /// Asks for a roll of a range whose head this broker holds: carried out here at once when
    /// this broker leads the topic's vnode, else asked of the leader (at most every
    /// `ROLL_ASK_MS`).
    pub(crate) fn request_roll(&self, topic_id: u64, range_id: u32) {
        let Some(broker) = self.self_handle() else { return };
        let Some(vnode) = self.ring.of_id(topic_id) else { return };
        if let Some(term) = self.observe_leadership(vnode) {
            let decision = vnode.group.read(|meta| {
                let mut coordinator = vnode.coordinator.lock().expect("coordinator lock poisoned");
                coordinator.roll_wanted(&meta.0, topic_id, range_id, term)
            });
            let Some(decision) = decision else { return };
            self.rolling.lock().expect("rolling lock poisoned").insert((topic_id, range_id));
            tokio::spawn(async move {
                let vnode = broker.ring.of_id(topic_id).expect("the ring is fixed");
                let coordination = &broker.coordination;
                coordination.carry_out(vnode, decision).await;
                coordination
                    .rolling
                    .lock()
                    .expect("rolling lock poisoned")
                    .remove(&(topic_id, range_id));
            });
            return;
        }
        let now_ms = self.clock.now_ms();
        {
            let mut asked = self.roll_asked_ms.lock().expect("roll ask lock poisoned");
            if asked.get(&(topic_id, range_id)).is_some_and(|at| now_ms < at + ROLL_ASK_MS) {
                return;
            }
            asked.insert((topic_id, range_id), now_ms);
            asked.retain(|_, at| now_ms < *at + ROLL_ASK_MS);
        }
        tokio::spawn(async move {
            let vnode = broker.ring.of_id(topic_id).expect("the ring is fixed");
            if let Err(error) =
                broker.coordination.ask_leader(vnode, &Ask::Roll { topic_id, range_id }).await
            {
                tracing::debug!(topic_id, range_id, %error, "asking the leader for a roll failed");
            }
        });
    }

    /// Splits or merges ranges (an operator's request): carried out by the coordinator, here
    /// or on the leader. Returns the new ranges.
    pub(crate) async fn reshape(&self, ask: Ask) -> Result<Vec<u32>, LogError> {
        let (Ask::Split { topic_id, .. } | Ask::Merge { topic_id, .. }) = ask else {
            unreachable!("only reshapes are asked here")
        };
        self.reshape_in(self.vnode_of(topic_id)?, ask).await
    }

    async fn reshape_in(&self, vnode: &Vnode, ask: Ask) -> Result<Vec<u32>, LogError> {
        let Some(term) = self.observe_leadership(vnode) else {
            let answer = self.ask_leader(vnode, &ask).await?;
            return match decode::<Reshaped>(&answer)? {
                Reshaped::Ranges(ranges) => Ok(ranges),
                Reshaped::Refused { reason, retryable } => {
                    Err(LogError::Remote { reason, retryable })
                }
            };
        };
        let action = match ask {
            Ask::Split { topic_id, range_id } => Action::Split { topic_id, range_id },
            Ask::Merge { topic_id, left, right } => Action::Merge { topic_id, left, right },
            Ask::Roll { .. } | Ask::Load { .. } => unreachable!("only reshapes are asked here"),
        };
        self.act_claimed(vnode, term, &action).await
    }

    /// Carries out an action decided outside the coordinator's tick, once its ranges are free.
    async fn act_claimed(
        &self,
        vnode: &Vnode,
        term: u64,
        action: &Action,
    ) -> Result<Vec<u32>, LogError> {
        if !vnode.coordinator.lock().expect("coordinator lock poisoned").claim(action) {
            return Err(LogError::Migrating);
        }
        let outcome = self.act(term, action).await;
        let now_ms = self.clock.now_ms();
        vnode.coordinator.lock().expect("coordinator lock poisoned").finished(action, now_ms);
        outcome
    }

    /// Rolls a range's head now (an operator's or a test's request): here when this broker
    /// leads the topic's vnode, else asked of the leader, which rolls it shortly.
    pub(crate) async fn roll(&self, topic_id: u64, range_id: u32) -> Result<(), LogError> {
        let vnode = self.vnode_of(topic_id)?;
        match self.observe_leadership(vnode) {
            Some(term) => {
                let roll = Action::Roll { topic_id, range_id };
                self.act_claimed(vnode, term, &roll).await.map(drop)
            }
            None => self.ask_leader(vnode, &Ask::Roll { topic_id, range_id }).await.map(drop),
        }
    }

    /// Requests a roll of every head held here that is older than its topic's age threshold
    /// and holds at least one record.
    async fn roll_by_age(&self) {
        let now_ms = self.clock.now_ms();
        let heads: Vec<SegmentKey> = self.read_every_meta(|meta| {
            meta.topics()
                .flat_map(|topic| {
                    topic.active_ranges().filter_map(move |range| {
                        range.active_segment_id().map(|segment_id| SegmentKey {
                            topic_id: topic.topic_id,
                            range_id: range.range_id,
                            segment_id,
                        })
                    })
                })
                .collect()
        });
        for key in heads {
            if self.holder_elsewhere(key).is_some() {
                continue;
            }
            // Known without I/O when open or closed cleanly; otherwise opened once.
            let (durable_offset, durable_bytes) = match self.data.durable_end(key) {
                Some(end) => end,
                None => match self.segment(key).await {
                    Ok(segment) => {
                        let status = segment.status();
                        (status.durable_offset, status.durable_bytes)
                    }
                    Err(_) => continue,
                },
            };
            if durable_offset == 0 {
                continue;
            }
            let due = self.read_meta(key.topic_id, |meta| {
                let defaults = self.broker().roll_defaults();
                meta.roll_due(key.topic_id, key.range_id, durable_bytes, now_ms, &defaults)
            });
            if due {
                self.request_roll(key.topic_id, key.range_id);
            }
        }
    }

    /// Reports the rates of the ranges written here to their vnodes' coordinators, and forgets
    /// ranges that no longer take writes.
    async fn report_load(&self) {
        let now_ms = self.clock.now_ms();
        let rates: Vec<((u64, u32), Rate)> = {
            let mut load = self.load.lock().expect("load lock poisoned");
            load.retain(|topic_id, range_id| {
                self.read_meta(topic_id, |meta| {
                    meta.topic(topic_id)
                        .and_then(|topic| topic.ranges.get(&range_id))
                        .is_some_and(|range| range.is_active())
                })
            });
            load.ranges().map(|range| (range, load.rate(range.0, range.1, now_ms))).collect()
        };
        for vnode in self.ring.iter() {
            let vnode_id = vnode.vnode_id();
            let rates: Vec<((u64, u32), Rate)> = rates
                .iter()
                .filter(|((topic_id, _), _)| malachi_meta::vnode_of_id(*topic_id) == vnode_id)
                .copied()
                .collect();
            self.report_load_to(vnode, rates, now_ms).await;
        }
    }

    async fn report_load_to(&self, vnode: &Vnode, rates: Vec<((u64, u32), Rate)>, now_ms: u64) {
        if self.observe_leadership(vnode).is_some() {
            let mut coordinator = vnode.coordinator.lock().expect("coordinator lock poisoned");
            coordinator.load_report(self.node_id, &rates, now_ms);
            return;
        }
        if rates.is_empty() {
            return;
        }
        let rates = rates
            .into_iter()
            .map(|((topic_id, range_id), rate)| {
                (topic_id, range_id, rate.records_per_s, rate.bytes_per_s)
            })
            .collect();
        let ask = Ask::Load { reporter: self.node_id, rates };
        if let Err(error) = self.ask_leader(vnode, &ask).await {
            tracing::debug!(%error, vnode = vnode.vnode_id(), "reporting load to the leader failed");
        }
    }

    /// Sends `ask` to `vnode`'s leader.
    async fn ask_leader(&self, vnode: &Vnode, ask: &Ask) -> Result<Vec<u8>, LogError> {
        let (leader, _) = vnode.group.leader();
        let transport = self.transport();
        let (Some(leader), Some(transport)) = (leader, transport) else {
            return Err(LogError::Unavailable(format!(
                "vnode {} has no leader now",
                vnode.vnode_id()
            )));
        };
        let request =
            PeerCall::Coordinate { group_id: vnode.group_id(), ask: ask.clone() }.encode();
        transport
            .call(leader, request, Duration::from_millis(LEADER_CALL_MS))
            .await
            .map_err(|error| LogError::Unavailable(format!("the vnode's leader {leader}: {error}")))
    }

    /// Answers a coordinator call from another broker, about the vnode of group `group_id`.
    pub(crate) async fn answer_coordination(
        &self,
        group_id: u64,
        ask: Ask,
    ) -> Result<Vec<u8>, String> {
        let vnode = self
            .ring
            .by_group_id(group_id)
            .ok_or_else(|| format!("group {group_id} is no vnode of this ring"))?;
        match ask {
            Ask::Roll { topic_id, range_id } => {
                self.request_roll(topic_id, range_id);
                Ok(Vec::new())
            }
            Ask::Load { reporter, rates } => {
                let rates: Vec<((u64, u32), Rate)> = rates
                    .into_iter()
                    .map(|(topic_id, range_id, records_per_s, bytes_per_s)| {
                        ((topic_id, range_id), Rate { records_per_s, bytes_per_s })
                    })
                    .collect();
                if self.observe_leadership(vnode).is_some() {
                    let now_ms = self.clock.now_ms();
                    let mut coordinator =
                        vnode.coordinator.lock().expect("coordinator lock poisoned");
                    coordinator.load_report(reporter, &rates, now_ms);
                }
                Ok(Vec::new())
            }
            Ask::Split { .. } | Ask::Merge { .. } => {
                if self.observe_leadership(vnode).is_none() {
                    return Err("this broker does not lead the vnode".into());
                }
                let answer = match self.reshape_in(vnode, ask).await {
                    Ok(ranges) => Reshaped::Ranges(ranges),
                    Err(error) => Reshaped::Refused {
                        reason: error.reason(),
                        retryable: error.is_retryable(),
                    },
                };
                Ok(serde_json::to_vec(&answer).expect("answers serialize"))
            }
        }
    }
}

fn decode<T: serde::de::DeserializeOwned>(payload: &[u8]) -> Result<T, LogError> {
    serde_json::from_slice(payload)
        .map_err(|error| LogError::Unavailable(format!("malformed coordinator answer: {error}")))
}

/// The `(topic, range)` of each head of `vnode` that `wanted` picks.
fn heads_where(vnode: &Vnode, wanted: impl Fn(&Segment) -> bool) -> Vec<(u64, u32)> {
    vnode.group.read(|meta| {
        meta.0
            .active_heads()
            .filter(|segment| wanted(segment))
            .map(|segment| (segment.topic_id, segment.range_id))
            .collect()
    })
}
