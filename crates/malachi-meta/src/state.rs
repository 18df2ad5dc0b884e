//! [`MetaState`], the metadata state machine: the entry point `apply`, the read-only queries,
//! the shared allocation helpers, and `state_hash`. The per-area command handlers live in
//! `topics.rs`, `reshard.rs`, `segments.rs`, `groups.rs`, `policy.rs` and `retention.rs`. Does
//! no I/O.
//!
//! Every handler validates completely before it changes anything, so a refused command leaves
//! the state (and its hash) unchanged. Identifiers come from counters held in the state and
//! start at 1: topic ids and segment ids are never reused, even after a delete.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::command::{MetaCommand, MetaResponse};
use crate::error::{MetaError, TopicError};
use crate::limits::MetaLimits;
use crate::model::{ReclaimEntry, Segment, SegmentState, Topic};
use crate::ring::VnodeArc;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaState {
    pub(crate) limits: MetaLimits,
    /// Number of commands accepted so far: the metadata version.
    pub(crate) version: u64,
    pub(crate) next_topic_id: u64,
    pub(crate) next_segment_id: u64,
    pub(crate) topics: BTreeMap<u64, Topic>,
    /// Live topic names to ids: sorted listing and lookup by name.
    pub(crate) topic_ids_by_name: BTreeMap<String, u64>,
    /// Every retained segment of every live topic.
    pub(crate) segments: BTreeMap<u64, Segment>,
    /// Segments whose metadata is gone and whose files the data plane still has to delete.
    pub(crate) pending_reclaim: BTreeMap<u64, ReclaimEntry>,
    /// Policy definitions from before they moved to the administrative machine (snapshots of
    /// older data directories name the field `policies`); the broker moves them there at boot.
    #[serde(default, rename = "policies", skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) legacy_policies: crate::policy::PolicyDefinitions,
    /// The vnode's arc of the ring, claimed by its first command. `None` in a state from
    /// before the ring: it holds every name, as vnode 1 of a ring of one.
    #[serde(default)]
    pub(crate) arc: Option<VnodeArc>,
    /// The latest term a coordinator acted in (`MetaCommand::Coordinated`).
    #[serde(default)]
    pub(crate) coordinator_term: u64,
    /// Coordinator commands refused as stale: a broken fence somewhere, counted so that the
    /// simulator can tell (every replica counts the same).
    #[serde(default)]
    pub(crate) stale_coordinator_commands: u64,
}

impl Default for MetaState {
    fn default() -> MetaState {
        MetaState::new(MetaLimits::default())
    }
}

impl MetaState {
    pub fn new(limits: MetaLimits) -> MetaState {
        MetaState {
            limits,
            version: 0,
            next_topic_id: 1,
            next_segment_id: 1,
            topics: BTreeMap::new(),
            topic_ids_by_name: BTreeMap::new(),
            segments: BTreeMap::new(),
            pending_reclaim: BTreeMap::new(),
            legacy_policies: BTreeMap::new(),
            arc: None,
            coordinator_term: 0,
            stale_coordinator_commands: 0,
        }
    }

    /// Applies one command. `Ok` bumps the version; `Err` leaves the state untouched.
    pub fn apply(&mut self, command: MetaCommand) -> Result<MetaResponse, MetaError> {
        let result = self.apply_inner(command);
        if result.is_ok() {
            self.version += 1;
        }
        // The touched topic is asserted in every build by its handler; debug builds (every
        // test, the simulator's test runs) also check the whole state after every command.
        #[cfg(debug_assertions)]
        if let Err(violation) = self.check_invariants() {
            panic!("metadata invariant broken after a command: {violation}");
        }
        result
    }

    fn apply_inner(&mut self, command: MetaCommand) -> Result<MetaResponse, MetaError> {
        match command {
            MetaCommand::CreateTopic(create) => self.create_topic(create),
            MetaCommand::DeleteTopic { name } => self.delete_topic(&name),
            MetaCommand::DeleteFencedTopic { name, fenced_heads } => {
                self.delete_fenced_topic(&name, fenced_heads)
            }
            MetaCommand::SplitRange(split) => self.split_range(split),
            MetaCommand::MergeRanges(merge) => self.merge_ranges(merge),
            MetaCommand::RollSegment(roll) => self.roll_segment(roll),
            MetaCommand::CommitPositions(commit) => self.commit_positions(commit),
            MetaCommand::GroupHeartbeat(heartbeat) => self.group_heartbeat(heartbeat),
            MetaCommand::LeaveGroupMember { topic_id, group, member, now_ms, session_ms } => {
                self.leave_group_member(topic_id, &group, &member, now_ms, session_ms)
            }
            MetaCommand::DeleteGroup { topic_id, group } => self.delete_group(topic_id, &group),
            MetaCommand::DefinePolicy { name, fields } => self.legacy_define(name, &fields),
            MetaCommand::DeletePolicy { name, .. } => {
                self.legacy_policies.remove(&name);
                Ok(MetaResponse::LegacyPolicies)
            }
            MetaCommand::ForgetLegacyPolicies { names } => {
                for name in names {
                    self.legacy_policies.remove(&name);
                }
                Ok(MetaResponse::LegacyPolicies)
            }
            MetaCommand::BindTopicPolicy { topic, policy } => {
                self.bind_topic_policy(&topic, policy)
            }
            MetaCommand::ExpireSegments { segments } => self.expire_segments(&segments),
            MetaCommand::ReclaimDone { segment_ids, node_id } => {
                self.reclaim_done(&segment_ids, node_id)
            }
            MetaCommand::SegmentFilesCreated { node_id, segment_ids } => {
                self.segment_files_created(node_id, &segment_ids)
            }
            MetaCommand::ClaimArc { arc } => self.claim_arc(arc),
            MetaCommand::CopiesSettled { segment_id, nodes, settled } => {
                Ok(self.copies_settled(segment_id, &nodes, settled))
            }
            MetaCommand::ReplaceReplica { segment_id, old, new } => {
                self.replace_replica(segment_id, old, new)
            }
            MetaCommand::AddReplica { segment_id, new } => self.add_replica(segment_id, new),
            MetaCommand::Coordinated { term, command } => self.coordinated(term, *command),
        }
    }

    /// A stable hash of the canonical serialized state: xxh3-64 over its JSON, which is
    /// canonical because every map is a `BTreeMap` and no float is stored.
    pub fn state_hash(&self) -> u64 {
        let bytes = serde_json::to_vec(self).expect("metadata state serializes: string/int keys");
        xxhash_rust::xxh3::xxh3_64(&bytes)
    }

    pub fn limits(&self) -> &MetaLimits {
        &self.limits
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn topic(&self, topic_id: u64) -> Option<&Topic> {
        self.topics.get(&topic_id)
    }

    pub fn topic_by_name(&self, name: &str) -> Option<&Topic> {
        self.topic_ids_by_name.get(name).map(|topic_id| &self.topics[topic_id])
    }

    /// Live topics sorted by name.
    pub fn topics(&self) -> impl Iterator<Item = &Topic> {
        self.topic_ids_by_name.values().map(|topic_id| &self.topics[topic_id])
    }

    pub fn segment(&self, segment_id: u64) -> Option<&Segment> {
        self.segments.get(&segment_id)
    }

    /// The head (active segment) of every active range of every topic.
    pub fn active_heads(&self) -> impl Iterator<Item = &Segment> {
        self.topics()
            .flat_map(|topic| topic.active_ranges())
            .filter_map(|range| self.segments.get(&range.active_segment_id()?))
    }

    /// Every retained segment, by id.
    pub fn segments(&self) -> impl Iterator<Item = &Segment> {
        self.segments.values()
    }

    /// Whether segment `segment_id` is known to take no more appends: sealed, or allocated here
    /// and since dropped (its topic deleted, or expired). A segment this state has not heard of
    /// yet (a replica of the group that lags) is not.
    pub fn segment_closed(&self, segment_id: u64) -> bool {
        match self.segments.get(&segment_id) {
            Some(segment) => !matches!(segment.state, SegmentState::Active),
            None => segment_id < self.next_segment_id,
        }
    }

    /// The retained segments of a range, oldest first (empty when the range is unknown).
    pub fn range_segments(&self, topic_id: u64, range_id: u32) -> Vec<&Segment> {
        let Some(range) = self.topic(topic_id).and_then(|topic| topic.ranges.get(&range_id)) else {
            return Vec::new();
        };
        range.segment_ids.iter().map(|segment_id| &self.segments[segment_id]).collect()
    }

    /// Active ranges over all topics.
    pub fn active_ranges_total(&self) -> u64 {
        self.topics.values().map(|topic| u64::from(topic.active_range_count())).sum()
    }

    /// Coordinator commands refused as stale so far (0 while every fence holds).
    pub fn stale_coordinator_commands(&self) -> u64 {
        self.stale_coordinator_commands
    }

    /// The fence of coordinator terms: a command decided in a term older than the latest one
    /// a coordinator acted in is refused (and counted); otherwise it is applied, and its term
    /// becomes the latest. The count changes the state even for a refusal, on purpose: it is a
    /// fact about the log that every replica agrees on.
    fn coordinated(&mut self, term: u64, command: MetaCommand) -> Result<MetaResponse, MetaError> {
        if !command.is_coordinators() {
            return Err(MetaError::NotCoordinated);
        }
        if term < self.coordinator_term {
            self.stale_coordinator_commands += 1;
            return Err(MetaError::StaleCoordinator { term, latest: self.coordinator_term });
        }
        let applied = self.apply_inner(command);
        if applied.is_ok() {
            self.coordinator_term = term;
        }
        applied
    }

    /// The arc of the ring this vnode holds (`None`: every name, from before the ring).
    pub fn arc(&self) -> Option<VnodeArc> {
        self.arc
    }

    /// Refuses a name outside this vnode's arc.
    pub(crate) fn check_owns_name(&self, name: &str) -> Result<(), TopicError> {
        match self.arc {
            Some(arc) if !arc.owns_name(name) => Err(TopicError::WrongVnode { name: name.into() }),
            _ => Ok(()),
        }
    }

    /// Claims `arc`: refused if another arc is held, or if a topic here lies outside it; the
    /// id counters move up into the arc's block.
    fn claim_arc(&mut self, arc: VnodeArc) -> Result<MetaResponse, MetaError> {
        match self.arc {
            Some(held) if held == arc => return Ok(MetaResponse::ArcClaimed { already: true }),
            Some(held) => {
                let detail = format!("it holds {held:?}");
                return Err(TopicError::ArcRefused { detail }.into());
            }
            None => {}
        }
        let outside = self
            .topics
            .values()
            .find(|topic| !arc.owns_name(&topic.name) || !arc.owns_id(topic.topic_id));
        if let Some(topic) = outside {
            let detail = format!("topic {:?} ({}) lies outside", topic.name, topic.topic_id);
            return Err(TopicError::ArcRefused { detail }.into());
        }
        let foreign_segment = self.segments.keys().chain(self.pending_reclaim.keys());
        if let Some(segment_id) = foreign_segment.copied().find(|id| !arc.owns_id(*id)) {
            let detail = format!("segment {segment_id} lies outside");
            return Err(TopicError::ArcRefused { detail }.into());
        }
        self.next_topic_id = self.next_topic_id.max(arc.id_base() + 1);
        self.next_segment_id = self.next_segment_id.max(arc.id_base() + 1);
        self.arc = Some(arc);
        Ok(MetaResponse::ArcClaimed { already: false })
    }

    /// Segments the data plane still has to delete, by segment id.
    pub fn pending_reclaim(&self) -> &BTreeMap<u64, ReclaimEntry> {
        &self.pending_reclaim
    }

    /// Validates a replica list: non-empty, no duplicates, within the limit.
    pub(crate) fn replica_problem(&self, replicas: &[u64]) -> Option<String> {
        if replicas.is_empty() {
            return Some("no replicas".to_string());
        }
        if replicas.len() > self.limits.max_replicas_per_segment as usize {
            return Some(format!("more than {} replicas", self.limits.max_replicas_per_segment));
        }
        let mut sorted = replicas.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        (sorted.len() != replicas.len()).then(|| "a node appears twice".to_string())
    }

    /// Opens a new active segment at the end of `range_id` (the caller appends the id to it).
    pub(crate) fn allocate_segment(
        &mut self,
        topic_id: u64,
        range_id: u32,
        now_ms: u64,
        replicas: Vec<u64>,
        range_base_records: u64,
    ) -> u64 {
        let segment_id = self.next_segment_id;
        self.next_segment_id = segment_id.checked_add(1).expect("segment ids never run out");
        assert!(self.arc.is_none_or(|arc| arc.owns_id(segment_id)), "segment ids left the block");
        let segment = Segment {
            segment_id,
            topic_id,
            range_id,
            state: SegmentState::Active,
            created_ms: now_ms,
            replicas,
            created_on: Vec::new(),
            settled_on: Vec::new(),
            moves: Vec::new(),
            dropped: Vec::new(),
            range_base_records,
        };
        let previous = self.segments.insert(segment_id, segment);
        assert!(previous.is_none(), "segment id {segment_id} handed out twice");
        segment_id
    }

    /// Seals an active segment at the fenced length. Sealing is one-way: the length recorded
    /// here never changes afterwards.
    pub(crate) fn seal_segment(
        &mut self,
        segment_id: u64,
        end_offset: u64,
        data_bytes: u64,
        now_ms: u64,
    ) {
        let segment = self.segments.get_mut(&segment_id).expect("sealing a retained segment");
        assert!(segment.is_active(), "segment {segment_id} sealed twice");
        segment.state = SegmentState::Sealed { end_offset, data_bytes, sealed_ms: now_ms };
    }
}

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
