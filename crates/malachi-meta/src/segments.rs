//! Segment rolls: seal the active segment at the length the data plane reports and open the
//! next one, and the pure `roll_due` decision (by size and by age, per-topic thresholds
//! overriding the cluster's). Does no I/O.

use crate::command::{MetaResponse, RollSegment};
use crate::error::{MetaError, RangeError, TopicError};
use crate::model::{SealReport, SegmentRollDefaults};
use crate::reshard::active_range;
use crate::state::MetaState;

impl MetaState {
    /// True when the active segment of the range should roll: `active_bytes` (the store's
    /// `data_bytes` so far) reached the size threshold, or the segment is at least the age
    /// threshold old. False for an unknown or sealed range.
    pub fn roll_due(
        &self,
        topic_id: u64,
        range_id: u32,
        active_bytes: u64,
        now_ms: u64,
        defaults: &SegmentRollDefaults,
    ) -> bool {
        let Some(topic) = self.topics.get(&topic_id) else { return false };
        let Some(segment_id) = topic.ranges.get(&range_id).and_then(|r| r.active_segment_id())
        else {
            return false;
        };
        let max_bytes = topic.segment_roll.max_bytes.unwrap_or(defaults.max_bytes);
        let max_age_ms = topic.segment_roll.max_age_ms.unwrap_or(defaults.max_age_ms);
        let age_ms = now_ms.saturating_sub(self.segments[&segment_id].created_ms);
        active_bytes >= max_bytes || age_ms >= max_age_ms
    }

    pub(crate) fn roll_segment(&mut self, roll: RollSegment) -> Result<MetaResponse, MetaError> {
        let seal = self.validate_roll(&roll)?;
        let RollSegment { topic_id, range_id, now_ms, replicas, .. } = roll;
        self.seal_segment(seal.segment_id, seal.end_offset, seal.data_bytes, now_ms);
        let sealed = &self.segments[&seal.segment_id];
        let range_base_records = sealed
            .range_base_records
            .checked_add(seal.end_offset)
            .expect("record numbers within a range fit in u64");
        let segment_id =
            self.allocate_segment(topic_id, range_id, now_ms, replicas, range_base_records);
        let topic = self.topics.get_mut(&topic_id).expect("validated");
        let range = topic.ranges.get_mut(&range_id).expect("validated");
        range.segment_ids.push(segment_id);
        self.assert_topic(topic_id);
        Ok(MetaResponse::SegmentRolled { sealed_segment_id: seal.segment_id, segment_id })
    }

    fn validate_roll(&self, roll: &RollSegment) -> Result<SealReport, MetaError> {
        let topic = self.topics.get(&roll.topic_id).ok_or(TopicError::NoSuchTopic)?;
        let range = active_range(topic, roll.range_id)?;
        let limit = self.limits.max_segments_per_range;
        if range.segment_ids.len() >= limit as usize {
            return Err(RangeError::TooManySegments { range_id: roll.range_id, limit }.into());
        }
        if let Some(detail) = self.replica_problem(&roll.replicas) {
            return Err(RangeError::InvalidReplicas { detail }.into());
        }
        Ok(self.check_fence(range, Some(&roll.seal))?)
    }
}

#[cfg(test)]
mod tests;
