//! Split and merge, both behind the seal-first fence. Does no I/O.
//!
//! The data plane first closes the parent's write head and reports exactly where it ended; the
//! command carries that report, and applying it is atomic: the parent segment is sealed at the
//! reported length, the parent range is sealed, and the children open with fresh segments.
//! A command without a seal report, or with one for any segment other than the parent's active
//! segment, is refused: a reshard of a range whose write head was not fenced never happens.

use crate::command::{MergeRanges, MetaResponse, SplitRange};
use crate::error::{MetaError, RangeError, TopicError};
use crate::keyspace::Extent;
use crate::model::{Range, RangeState, SealReport, Topic};
use crate::state::MetaState;
use crate::topics::new_range;

impl MetaState {
    pub(crate) fn split_range(&mut self, split: SplitRange) -> Result<MetaResponse, MetaError> {
        let (seal, halves) = self.validate_split(&split)?;
        let SplitRange {
            topic_id,
            range_id,
            now_ms,
            child_replicas: [low_replicas, high_replicas],
            ..
        } = split;
        self.seal_segment(seal.segment_id, seal.end_offset, seal.data_bytes, now_ms);
        let low_id = self.topics[&topic_id].next_range_id;
        let high_id = low_id + 1;
        let low_segment = self.allocate_segment(topic_id, low_id, now_ms, low_replicas, 0);
        let high_segment = self.allocate_segment(topic_id, high_id, now_ms, high_replicas, 0);
        let topic = self.topics.get_mut(&topic_id).expect("validated");
        topic.next_range_id += 2;
        let parent = topic.ranges.get_mut(&range_id).expect("validated");
        parent.state = RangeState::Sealed { sealed_ms: now_ms };
        parent.children = vec![low_id, high_id];
        let removed = topic.active_by_start.remove(&halves[0].start);
        assert_eq!(removed, Some(range_id), "the parent was routed by its start");
        for (child_id, extent, segment_id) in
            [(low_id, halves[0], low_segment), (high_id, halves[1], high_segment)]
        {
            let child = new_range(child_id, extent, vec![range_id], now_ms, segment_id);
            assert!(topic.ranges.insert(child_id, child).is_none(), "range id reused");
            assert!(topic.active_by_start.insert(extent.start, child_id).is_none());
        }
        self.assert_topic(topic_id);
        Ok(MetaResponse::RangeSplit {
            sealed_segment_id: seal.segment_id,
            children: [low_id, high_id],
            child_segment_ids: [low_segment, high_segment],
        })
    }

    fn validate_split(&self, split: &SplitRange) -> Result<(SealReport, [Extent; 2]), MetaError> {
        let topic = self.topics.get(&split.topic_id).ok_or(TopicError::NoSuchTopic)?;
        let range = active_range(topic, split.range_id)?;
        let halves =
            range.extent.halves().ok_or(RangeError::RangeTooSmall { range_id: range.range_id })?;
        let limit = self.limits.max_active_ranges_per_topic;
        if topic.active_range_count() >= limit {
            return Err(RangeError::TooManyActiveRanges { limit }.into());
        }
        if let Some(limit) = split.quota.max_active_ranges
            && self.active_ranges_total() >= u64::from(limit)
        {
            return Err(RangeError::TooManyRangesInAll { limit }.into());
        }
        self.check_range_history(topic, 2)?;
        for replicas in &split.child_replicas {
            if let Some(detail) = self.replica_problem(replicas) {
                return Err(RangeError::InvalidReplicas { detail }.into());
            }
        }
        let seal = self.check_fence(range, split.seal.as_ref())?;
        Ok((seal, halves))
    }

    pub(crate) fn merge_ranges(&mut self, merge: MergeRanges) -> Result<MetaResponse, MetaError> {
        let (seals, merged_extent) = self.validate_merge(&merge)?;
        let MergeRanges { topic_id, range_ids, now_ms, replicas, .. } = merge;
        for seal in &seals {
            self.seal_segment(seal.segment_id, seal.end_offset, seal.data_bytes, now_ms);
        }
        let merged_id = self.topics[&topic_id].next_range_id;
        let segment_id = self.allocate_segment(topic_id, merged_id, now_ms, replicas, 0);
        let topic = self.topics.get_mut(&topic_id).expect("validated");
        topic.next_range_id += 1;
        let mut parents = range_ids.to_vec();
        parents.sort_by_key(|range_id| topic.ranges[range_id].extent.start);
        for parent_id in &parents {
            let parent = topic.ranges.get_mut(parent_id).expect("validated");
            parent.state = RangeState::Sealed { sealed_ms: now_ms };
            parent.children = vec![merged_id];
            let removed = topic.active_by_start.remove(&parent.extent.start);
            assert_eq!(removed, Some(*parent_id), "a parent was routed by its start");
        }
        let merged = new_range(merged_id, merged_extent, parents, now_ms, segment_id);
        assert!(topic.ranges.insert(merged_id, merged).is_none(), "range id reused");
        assert!(topic.active_by_start.insert(merged_extent.start, merged_id).is_none());
        self.assert_topic(topic_id);
        Ok(MetaResponse::RangesMerged {
            sealed_segment_ids: [seals[0].segment_id, seals[1].segment_id],
            range_id: merged_id,
            segment_id,
        })
    }

    fn validate_merge(&self, merge: &MergeRanges) -> Result<([SealReport; 2], Extent), MetaError> {
        let topic = self.topics.get(&merge.topic_id).ok_or(TopicError::NoSuchTopic)?;
        let [first_id, second_id] = merge.range_ids;
        let not_buddies = RangeError::NotBuddies { first: first_id, second: second_id };
        if first_id == second_id {
            return Err(not_buddies.into());
        }
        let first = active_range(topic, first_id)?;
        let second = active_range(topic, second_id)?;
        if first.extent.buddy() != Some(second.extent) {
            return Err(not_buddies.into());
        }
        self.check_range_history(topic, 1)?;
        if let Some(detail) = self.replica_problem(&merge.replicas) {
            return Err(RangeError::InvalidReplicas { detail }.into());
        }
        let seals = [
            self.check_fence(first, merge.seals[0].as_ref())?,
            self.check_fence(second, merge.seals[1].as_ref())?,
        ];
        let merged = first.extent.parent().expect("a range with a buddy has a parent block");
        Ok((seals, merged))
    }

    fn check_range_history(&self, topic: &Topic, new_ranges: u32) -> Result<(), RangeError> {
        let limit = self.limits.max_ranges_per_topic;
        let room = topic.next_range_id.checked_add(new_ranges).is_some_and(|next| next <= limit);
        if room { Ok(()) } else { Err(RangeError::RangeHistoryFull { limit }) }
    }

    /// The seal-first fence: `seal` must report the range's active segment, which must still be
    /// active. A report for a segment already sealed is refused as a replay (same length) or a
    /// conflict (different length); sealed lengths never change.
    pub(crate) fn check_fence(
        &self,
        range: &Range,
        seal: Option<&SealReport>,
    ) -> Result<SealReport, RangeError> {
        let range_id = range.range_id;
        let seal = *seal.ok_or(RangeError::Unfenced { range_id })?;
        let active = range.active_segment_id().expect("an active range has an active segment");
        let retained_here = range.segment_ids.binary_search(&seal.segment_id).is_ok();
        let sealed_here =
            retained_here.then(|| self.segments[&seal.segment_id].sealed_length()).flatten();
        if let Some((end_offset, data_bytes)) = sealed_here {
            if (end_offset, data_bytes) == (seal.end_offset, seal.data_bytes) {
                return Err(RangeError::AlreadySealed { segment_id: seal.segment_id });
            }
            return Err(RangeError::SealConflict {
                segment_id: seal.segment_id,
                recorded_end_offset: end_offset,
                recorded_data_bytes: data_bytes,
                reported_end_offset: seal.end_offset,
                reported_data_bytes: seal.data_bytes,
            });
        }
        if seal.segment_id != active {
            return Err(RangeError::NotActiveSegment {
                range_id,
                reported: seal.segment_id,
                active,
            });
        }
        assert!(
            self.segments[&active].is_active(),
            "the active segment id names an active segment"
        );
        Ok(seal)
    }
}

/// The range `range_id` of `topic`, refused unless it exists and is active.
pub(crate) fn active_range(topic: &Topic, range_id: u32) -> Result<&Range, RangeError> {
    let range = topic.ranges.get(&range_id).ok_or(RangeError::NoSuchRange { range_id })?;
    if !range.is_active() {
        return Err(RangeError::RangeSealed { range_id });
    }
    Ok(range)
}

#[cfg(test)]
mod tests;
