//! Retention: the pure plan of which sealed segments to delete, and the command that applies a
//! plan. Does no I/O.
//!
//! Segments leave a range only from its front (oldest first), so a range's retained segments
//! stay contiguous and `expired_records` counts exactly the records before the first retained
//! one. A segment expires by age when `now_ms - sealed_ms > max_age_ms`, and by size while the
//! range's bytes (sealed plus active) exceed `max_bytes` (a per-range bound). The active segment
//! never expires; sealed ranges' segments do. What bounds a topic comes from its policy binding
//! (see `policy.rs`): a topic bound to an undefined policy only ever expires by the backstop.

use std::collections::BTreeMap;

use crate::command::MetaResponse;
use crate::error::{MetaError, RetentionError};
use crate::model::{Range, ReclaimEntry, SegmentRef, SegmentState};
use crate::policy::{EffectiveRetention, PolicyDefinitions, RetentionDefaults};
use crate::state::MetaState;

impl MetaState {
    /// Sealed segments to delete now, by topic id, then range id, oldest first per range; at
    /// most `max_items_per_command` of them. Active segments count as empty.
    /// `definitions` are the cluster's policies (the administrative machine's).
    pub fn retention_plan(
        &self,
        now_ms: u64,
        definitions: &PolicyDefinitions,
        defaults: &RetentionDefaults,
    ) -> Vec<SegmentRef> {
        self.retention_plan_with_active_bytes(now_ms, definitions, defaults, &BTreeMap::new())
    }

    /// As [`MetaState::retention_plan`], with the data plane's byte counts of active segments
    /// (by segment id) counted towards each range's size.
    pub fn retention_plan_with_active_bytes(
        &self,
        now_ms: u64,
        definitions: &PolicyDefinitions,
        defaults: &RetentionDefaults,
        active_bytes: &BTreeMap<u64, u64>,
    ) -> Vec<SegmentRef> {
        let mut plan = Vec::new();
        for topic in self.topics.values() {
            let retention = self.effective_retention(topic, definitions, defaults);
            if retention.max_age_ms.is_none() && retention.max_bytes.is_none() {
                continue;
            }
            for range in topic.ranges.values() {
                let expired = self.plan_range(range, retention, now_ms, active_bytes);
                plan.extend(expired.into_iter().map(|segment_id| SegmentRef {
                    topic_id: topic.topic_id,
                    range_id: range.range_id,
                    segment_id,
                }));
            }
        }
        plan.truncate(self.limits.max_items_per_command as usize);
        plan
    }

    /// The expired prefix of one range's segments.
    fn plan_range(
        &self,
        range: &Range,
        retention: EffectiveRetention,
        now_ms: u64,
        active_bytes: &BTreeMap<u64, u64>,
    ) -> Vec<u64> {
        let segments: Vec<_> = range.segment_ids.iter().map(|id| &self.segments[id]).collect();
        let mut range_bytes: u128 = segments
            .iter()
            .map(|segment| match segment.state {
                SegmentState::Sealed { data_bytes, .. } => u128::from(data_bytes),
                SegmentState::Active => {
                    u128::from(active_bytes.get(&segment.segment_id).copied().unwrap_or(0))
                }
            })
            .sum();
        let mut expired = Vec::new();
        for segment in segments {
            let SegmentState::Sealed { data_bytes, sealed_ms, .. } = segment.state else { break };
            let too_old =
                retention.max_age_ms.is_some_and(|max| now_ms.saturating_sub(sealed_ms) > max);
            let too_big = retention.max_bytes.is_some_and(|max| range_bytes > u128::from(max));
            if !too_old && !too_big {
                break;
            }
            expired.push(segment.segment_id);
            range_bytes -= u128::from(data_bytes);
        }
        expired
    }

    pub(crate) fn expire_segments(
        &mut self,
        refs: &[SegmentRef],
    ) -> Result<MetaResponse, MetaError> {
        let ExpiryPlan { front_counts, expired, skipped } = self.validate_expiry(refs)?;
        let mut expired_records = 0u64;
        for (&(topic_id, range_id), &count) in &front_counts {
            expired_records += self.expire_front(topic_id, range_id, count);
        }
        for &(topic_id, _) in front_counts.keys() {
            self.assert_topic(topic_id);
        }
        Ok(MetaResponse::SegmentsExpired { expired, skipped, expired_records })
    }

    fn validate_expiry(&self, refs: &[SegmentRef]) -> Result<ExpiryPlan, RetentionError> {
        let limit = self.limits.max_items_per_command;
        if refs.len() > limit as usize {
            return Err(RetentionError::TooManyItems { count: refs.len() as u64, limit });
        }
        let mut plan = ExpiryPlan::default();
        for item in refs {
            let Some(topic) = self.topics.get(&item.topic_id) else {
                plan.skipped.push(*item);
                continue;
            };
            let (topic_id, range_id) = (item.topic_id, item.range_id);
            let range = topic
                .ranges
                .get(&range_id)
                .ok_or(RetentionError::NoSuchRange { topic_id, range_id })?;
            let Some(segment) = self.segments.get(&item.segment_id) else {
                plan.skipped.push(*item);
                continue;
            };
            let segment_id = segment.segment_id;
            if (segment.topic_id, segment.range_id) != (topic_id, range_id) {
                return Err(RetentionError::WrongRange { segment_id });
            }
            if segment.is_active() {
                return Err(RetentionError::ActiveSegment { segment_id });
            }
            let turn = plan.front_counts.entry((topic_id, range_id)).or_insert(0);
            if range.segment_ids.get(*turn) != Some(&segment_id) {
                return Err(RetentionError::NotOldest { segment_id });
            }
            *turn += 1;
            plan.expired.push(*item);
        }
        Ok(plan)
    }

    /// Removes the `count` oldest segments of a range; returns the records they held.
    fn expire_front(&mut self, topic_id: u64, range_id: u32, count: usize) -> u64 {
        let topic = self.topics.get_mut(&topic_id).expect("validated");
        let range = topic.ranges.get_mut(&range_id).expect("validated");
        let mut records = 0u64;
        for segment_id in range.segment_ids.drain(..count) {
            let segment = self.segments.remove(&segment_id).expect("ranges name retained segments");
            let (end_offset, _) = segment.sealed_length().expect("validated: only sealed expire");
            assert_eq!(segment.range_base_records, range.expired_records, "expiry is front-only");
            range.expired_records += end_offset;
            records += end_offset;
            let entry = ReclaimEntry { topic_id, range_id, replicas: segment.holders() };
            assert!(self.pending_reclaim.insert(segment_id, entry).is_none());
        }
        records
    }
}

/// A validated expire command.
#[derive(Default)]
struct ExpiryPlan {
    /// How many segments each (topic, range) loses from its front.
    front_counts: BTreeMap<(u64, u32), usize>,
    expired: Vec<SegmentRef>,
    /// Entries whose topic or segment is already gone.
    skipped: Vec<SegmentRef>,
}

#[cfg(test)]
mod tests;
