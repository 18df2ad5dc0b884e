//! Topic lifecycle: create (tiling the keyspace with its initial ranges), delete (metadata goes
//! first; the segments become pending reclaim for the data plane), and the reclaim
//! acknowledgement. Does no I/O.

use std::collections::BTreeMap;

use crate::command::{CreateTopic, MetaResponse};
use crate::error::{MetaError, RetentionError, TopicError};
use crate::keyspace::Extent;
use crate::limits::MAX_INITIAL_RANGES;
use crate::model::{Range, RangeState, ReclaimEntry, ReplicaMove, Segment, SegmentRoll, Topic};
use crate::names::validate_topic_name;
use crate::state::MetaState;

/// Lowest per-topic roll size: below it every few appends would cost a metadata command.
pub const MIN_SEGMENT_MAX_BYTES: u64 = 4_096;
/// Lowest per-topic roll age, the floor `MALACHI_SEGMENT_MAX_AGE_MS` has too.
pub const MIN_SEGMENT_MAX_AGE_MS: u64 = 60_000;

impl MetaState {
    pub(crate) fn create_topic(&mut self, create: CreateTopic) -> Result<MetaResponse, MetaError> {
        let count_log2 = self.validate_create(&create)?;
        let topic_id = self.next_topic_id;
        self.next_topic_id = topic_id.checked_add(1).expect("topic ids never run out");
        assert!(self.arc.is_none_or(|arc| arc.owns_id(topic_id)), "topic ids left the block");
        let mut topic = Topic {
            topic_id,
            name: create.name.clone(),
            created_ms: create.now_ms,
            segment_roll: create.segment_roll,
            policy: None,
            created_by: create.creator.clone(),
            next_range_id: 0,
            ranges: BTreeMap::new(),
            active_by_start: BTreeMap::new(),
            groups: BTreeMap::new(),
        };
        let mut created = Vec::new();
        for extent in Extent::initial_tiling(count_log2) {
            let range_id = topic.next_range_id;
            topic.next_range_id += 1;
            let segment_id = self.allocate_segment(
                topic_id,
                range_id,
                create.now_ms,
                create.replicas.clone(),
                0,
            );
            topic.ranges.insert(
                range_id,
                new_range(range_id, extent, Vec::new(), create.now_ms, segment_id),
            );
            topic.active_by_start.insert(extent.start, range_id);
            created.push((range_id, segment_id));
        }
        self.topics.insert(topic_id, topic);
        self.topic_ids_by_name.insert(create.name, topic_id);
        self.assert_topic(topic_id);
        Ok(MetaResponse::TopicCreated { topic_id, ranges: created })
    }

    /// Returns `log2` of the initial range count.
    fn validate_create(&self, create: &CreateTopic) -> Result<u32, TopicError> {
        validate_topic_name(&create.name)?;
        self.check_owns_name(&create.name)?;
        if self.topic_ids_by_name.contains_key(&create.name) {
            return Err(TopicError::AlreadyExists);
        }
        let limit = create.quota.max_topics.unwrap_or(u32::MAX).min(self.limits.max_topics);
        if self.topics.len() >= limit as usize {
            return Err(TopicError::TooManyTopics { limit });
        }
        if let (Some(creator), Some(limit)) = (&create.creator, create.quota.max_topics_per_creator)
        {
            let owned =
                self.topics.values().filter(|topic| topic.created_by.as_ref() == Some(creator));
            if owned.count() >= limit as usize {
                return Err(TopicError::TooManyTopicsForCreator {
                    creator: creator.clone(),
                    limit,
                });
            }
        }
        let count = create.initial_ranges.unwrap_or(1);
        let max = MAX_INITIAL_RANGES.min(self.limits.max_active_ranges_per_topic);
        if !count.is_power_of_two() || count > max {
            return Err(TopicError::InvalidRangeCount { count, max });
        }
        if let Some(limit) = create.quota.max_active_ranges
            && self.active_ranges_total() + u64::from(count) > u64::from(limit)
        {
            return Err(TopicError::TooManyRanges { limit });
        }
        validate_segment_roll(&create.segment_roll)?;
        if let Some(detail) = self.replica_problem(&create.replicas) {
            return Err(TopicError::InvalidReplicas { detail });
        }
        Ok(count.trailing_zeros())
    }

    /// Deletes a topic whose active heads the data plane sealed: exactly `fenced_heads`.
    pub(crate) fn delete_fenced_topic(
        &mut self,
        name: &str,
        mut fenced_heads: Vec<u64>,
    ) -> Result<MetaResponse, MetaError> {
        validate_topic_name(name)?;
        self.check_owns_name(name)?;
        let topic = self.topic_by_name(name).ok_or(TopicError::NoSuchTopic)?;
        let mut heads: Vec<u64> =
            topic.active_ranges().filter_map(|range| range.active_segment_id()).collect();
        heads.sort_unstable();
        fenced_heads.sort_unstable();
        if heads != fenced_heads {
            // A head moved after the fence (a roll): fence again.
            let range_id = topic.active_ranges().next().map_or(0, |range| range.range_id);
            return Err(crate::error::RangeError::Unfenced { range_id }.into());
        }
        self.delete_topic(name)
    }

    pub(crate) fn delete_topic(&mut self, name: &str) -> Result<MetaResponse, MetaError> {
        validate_topic_name(name)?;
        self.check_owns_name(name)?;
        let topic_id = self.topic_ids_by_name.remove(name).ok_or(TopicError::NoSuchTopic)?;
        let topic = self.topics.remove(&topic_id).expect("the name index names live topics");
        let mut reclaim = Vec::new();
        for range in topic.ranges.values() {
            for segment_id in &range.segment_ids {
                let segment =
                    self.segments.remove(segment_id).expect("ranges name retained segments");
                assert_eq!((segment.topic_id, segment.range_id), (topic_id, range.range_id));
                let replicas = segment.holders();
                let entry = ReclaimEntry { topic_id, range_id: range.range_id, replicas };
                let previous = self.pending_reclaim.insert(*segment_id, entry);
                assert!(previous.is_none(), "segment {segment_id} reclaimed twice");
                reclaim.push(*segment_id);
            }
        }
        reclaim.sort_unstable();
        Ok(MetaResponse::TopicDeleted { topic_id, reclaim })
    }

    pub(crate) fn reclaim_done(
        &mut self,
        segment_ids: &[u64],
        node_id: Option<u64>,
    ) -> Result<MetaResponse, MetaError> {
        let limit = self.limits.max_items_per_command;
        if segment_ids.len() > limit as usize {
            let count = segment_ids.len() as u64;
            return Err(RetentionError::TooManyItems { count, limit }.into());
        }
        let mut removed = 0;
        for segment_id in segment_ids {
            if let (Some(segment), Some(node_id)) = (self.segments.get_mut(segment_id), node_id) {
                // A dropped replica's files are gone.
                if let Ok(at) = segment.dropped.binary_search(&node_id) {
                    segment.dropped.remove(at);
                    removed += 1;
                }
                continue;
            }
            let Some(entry) = self.pending_reclaim.get_mut(segment_id) else { continue };
            if let Some(node_id) = node_id {
                entry.replicas.retain(|replica| *replica != node_id);
                if !entry.replicas.is_empty() {
                    continue;
                }
            }
            self.pending_reclaim.remove(segment_id);
            removed += 1;
        }
        Ok(MetaResponse::ReclaimAcknowledged { removed })
    }

    pub(crate) fn segment_files_created(
        &mut self,
        node_id: u64,
        segment_ids: &[u64],
    ) -> Result<MetaResponse, MetaError> {
        let limit = self.limits.max_items_per_command;
        if segment_ids.len() > limit as usize {
            let count = segment_ids.len() as u64;
            return Err(RetentionError::TooManyItems { count, limit }.into());
        }
        let mut recorded = 0;
        for segment_id in segment_ids {
            let Some(segment) = self.segments.get_mut(segment_id) else { continue };
            if !segment.replicas.contains(&node_id) {
                continue;
            }
            if let Err(at) = segment.created_on.binary_search(&node_id) {
                segment.created_on.insert(at, node_id);
                recorded += 1;
            }
        }
        Ok(MetaResponse::SegmentFilesRecorded { recorded })
    }
}

impl MetaState {
    pub(crate) fn copies_settled(
        &mut self,
        segment_id: u64,
        nodes: &[u64],
        settled: bool,
    ) -> MetaResponse {
        let mut changed = 0;
        let Some(segment) = self.segments.get_mut(&segment_id) else {
            return MetaResponse::CopiesRecorded { changed };
        };
        if segment.is_active() {
            return MetaResponse::CopiesRecorded { changed };
        }
        for &node in nodes.iter().filter(|node| segment.replicas.contains(node)) {
            match (segment.settled_on.binary_search(&node), settled) {
                (Err(at), true) => segment.settled_on.insert(at, node),
                (Ok(at), false) => {
                    segment.settled_on.remove(at);
                }
                _ => continue,
            }
            changed += 1;
        }
        finish_moves(segment);
        MetaResponse::CopiesRecorded { changed }
    }

    /// Starts moving `segment_id`'s replica off `old` to `new` (see `Segment::moves`); a
    /// replica that is itself the unsettled target of a move (it holds no settled copy, only a
    /// rebuild under way) is replaced in place, the move then aiming at `new`.
    pub(crate) fn replace_replica(
        &mut self,
        segment_id: u64,
        old: u64,
        new: u64,
    ) -> Result<MetaResponse, MetaError> {
        let invalid =
            |detail: String| MetaError::from(crate::RangeError::InvalidReplicas { detail });
        let segment = self.sealed_segment_mut(segment_id).map_err(invalid)?;
        let at = segment
            .replicas
            .iter()
            .position(|&node| node == old)
            .ok_or_else(|| invalid(format!("node {old} holds no replica of {segment_id}")))?;
        new_replica_allowed(segment, new).map_err(invalid)?;
        if segment.is_moving_off(old) {
            return Err(invalid(format!("node {old}'s replica of {segment_id} is moving already")));
        }
        if !segment.settled_on.iter().any(|&node| node != old) {
            return Err(invalid(format!("no settled copy of {segment_id} would remain")));
        }
        let incoming = segment.moves.iter_mut().find(|move_| move_.new == old);
        match incoming {
            Some(move_) if !segment.settled_on.contains(&old) => {
                // Its rebuild may have written files: they are reclaimed like a dropped copy's.
                move_.new = new;
                segment.replicas[at] = new;
                segment.created_on.retain(|&node| node != old);
                segment.record_dropped(old);
            }
            _ => {
                segment.replicas.push(new);
                segment.moves.push(ReplicaMove { old, new });
            }
        }
        Ok(MetaResponse::ReplicaReplaced)
    }

    /// Sealed segment `segment_id`, for a change of its replicas.
    fn sealed_segment_mut(&mut self, segment_id: u64) -> Result<&mut Segment, String> {
        let segment = self
            .segments
            .get_mut(&segment_id)
            .ok_or_else(|| format!("segment {segment_id} is not retained"))?;
        if segment.is_active() {
            return Err(format!("segment {segment_id} is active"));
        }
        Ok(segment)
    }

    /// Adds a replica on `new` to sealed segment `segment_id`, which has fewer than the
    /// replication factor: its copy is rebuilt by healing from a settled one and counts once
    /// it is reported settled.
    pub(crate) fn add_replica(
        &mut self,
        segment_id: u64,
        new: u64,
    ) -> Result<MetaResponse, MetaError> {
        let invalid =
            |detail: String| MetaError::from(crate::RangeError::InvalidReplicas { detail });
        let limit = self.limits.max_replicas_per_segment as usize;
        let segment = self.sealed_segment_mut(segment_id).map_err(invalid)?;
        new_replica_allowed(segment, new).map_err(invalid)?;
        if segment.settled_on.is_empty() {
            return Err(invalid(format!("segment {segment_id} has no settled copy to copy")));
        }
        if segment.replicas.len() >= limit {
            return Err(invalid(format!("segment {segment_id} has {limit} replicas already")));
        }
        segment.replicas.push(new);
        Ok(MetaResponse::ReplicaAdded)
    }
}

/// Whether `new` may take a new replica of `segment`: it holds none, and no files of a
/// dropped one wait to be deleted there.
fn new_replica_allowed(segment: &Segment, new: u64) -> Result<(), String> {
    let segment_id = segment.segment_id;
    if segment.replicas.contains(&new) {
        return Err(format!("node {new} holds a replica of {segment_id} already"));
    }
    if segment.dropped.contains(&new) {
        return Err(format!("node {new} has not deleted its dropped copy of {segment_id} yet"));
    }
    Ok(())
}

/// Drops the old replica of every move whose new copy is settled.
fn finish_moves(segment: &mut Segment) {
    let (done, going): (Vec<ReplicaMove>, Vec<ReplicaMove>) =
        segment.moves.iter().partition(|move_| segment.settled_on.contains(&move_.new));
    segment.moves = going;
    for ReplicaMove { old, .. } in done {
        segment.drop_replica(old);
    }
}

pub(crate) fn validate_segment_roll(roll: &SegmentRoll) -> Result<(), TopicError> {
    if roll.max_bytes.is_some_and(|bytes| bytes < MIN_SEGMENT_MAX_BYTES) {
        let detail = format!("max_bytes below {MIN_SEGMENT_MAX_BYTES}");
        return Err(TopicError::InvalidSegmentRoll { detail });
    }
    if roll.max_age_ms.is_some_and(|age_ms| age_ms < MIN_SEGMENT_MAX_AGE_MS) {
        let detail = format!("max_age_ms below {MIN_SEGMENT_MAX_AGE_MS}");
        return Err(TopicError::InvalidSegmentRoll { detail });
    }
    Ok(())
}

/// An active range whose only segment is `segment_id`.
pub(crate) fn new_range(
    range_id: u32,
    extent: Extent,
    parents: Vec<u32>,
    now_ms: u64,
    segment_id: u64,
) -> Range {
    Range {
        range_id,
        extent,
        parents,
        children: Vec::new(),
        state: RangeState::Active,
        created_ms: now_ms,
        segment_ids: vec![segment_id],
        expired_records: 0,
    }
}

#[cfg(test)]
mod tests;
