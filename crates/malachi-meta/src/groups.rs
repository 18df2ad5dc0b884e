//! Consumer groups: committed positions per (topic, group), one per range, replaced range by
//! range by a commit that bumps the group's generation. Deleting a topic drops its groups.
//! Does no I/O.
//!
//! A committed position must lie in its range: a retained segment of that range (at most its
//! sealed length), or a segment retention already removed from the front of that range (the
//! reader then resumes at the first retained record). `Finished` is only valid for a sealed
//! range: it says the group drained it and continues in its children.

use std::collections::{BTreeMap, BTreeSet};

use crate::assignment::readable_ranges;
use crate::command::{CommitPositions, GroupHeartbeat, MetaResponse};
use crate::error::{GroupError, MetaError, TopicError};
use crate::membership::{MEMBERS_PER_GROUP_MAX, Membership, MembershipError, Now};
use crate::model::{ConsumerGroup, GroupPosition, Range, Topic};
use crate::names::is_valid_label;
use crate::state::MetaState;

impl MetaState {
    pub fn group(&self, topic_id: u64, group: &str) -> Option<&ConsumerGroup> {
        self.topics.get(&topic_id)?.groups.get(group)
    }

    pub(crate) fn commit_positions(
        &mut self,
        commit: CommitPositions,
    ) -> Result<MetaResponse, MetaError> {
        self.validate_commit(&commit)?;
        let CommitPositions { topic_id, group, positions, now_ms, member, .. } = commit;
        let drains = positions.values().any(|position| *position == GroupPosition::Finished);
        let topic = self.topics.get_mut(&topic_id).expect("validated");
        let entry = topic.groups.entry(group.clone()).or_insert_with(|| new_group(now_ms));
        entry.generation = entry.generation.checked_add(1).expect("generations never run out");
        entry.updated_ms = now_ms;
        entry.positions.extend(positions);
        let generation = entry.generation;
        if let Some(member) = member.filter(|_| drains) {
            // A drained range hands its children out.
            self.with_membership(topic_id, &group, |membership, readable| {
                membership.rebalance(Now { now_ms, session_ms: member.session_ms, readable });
            });
        }
        self.assert_topic(topic_id);
        Ok(MetaResponse::PositionsCommitted { generation })
    }

    /// A member joins or heartbeats: it is told its ranges. Creates the group (with no
    /// positions) if need be.
    pub(crate) fn group_heartbeat(
        &mut self,
        heartbeat: GroupHeartbeat,
    ) -> Result<MetaResponse, MetaError> {
        let GroupHeartbeat { topic_id, group, member, applied, now_ms, session_ms } = heartbeat;
        self.validate_member(topic_id, &group, &member)?;
        if let Some(existing) = self.group(topic_id, &group) {
            let readable = BTreeSet::new();
            let now = Now { now_ms, session_ms, readable: &readable };
            existing
                .membership
                .admits(&member, now, MEMBERS_PER_GROUP_MAX)
                .map_err(GroupError::Membership)?;
        }
        let topic = self.topics.get_mut(&topic_id).expect("validated");
        topic.groups.entry(group.clone()).or_insert_with(|| new_group(now_ms));
        let told = self
            .with_membership(topic_id, &group, |membership, readable| {
                let now = Now { now_ms, session_ms, readable };
                membership.heartbeat(&member, applied, now, MEMBERS_PER_GROUP_MAX)
            })
            .map_err(GroupError::Membership)?;
        self.assert_topic(topic_id);
        Ok(MetaResponse::GroupAssignment {
            generation: told.generation,
            ranges: told.ranges.into_iter().collect(),
        })
    }

    pub(crate) fn leave_group_member(
        &mut self,
        topic_id: u64,
        group: &str,
        member: &str,
        now_ms: u64,
        session_ms: u64,
    ) -> Result<MetaResponse, MetaError> {
        self.validate_member(topic_id, group, member)?;
        if self.group(topic_id, group).is_some() {
            self.with_membership(topic_id, group, |membership, readable| {
                membership.leave(member, Now { now_ms, session_ms, readable });
            });
        }
        self.assert_topic(topic_id);
        Ok(MetaResponse::GroupMemberLeft)
    }

    /// Runs `change` on an existing group's membership with the ranges the group may read now.
    fn with_membership<T>(
        &mut self,
        topic_id: u64,
        group: &str,
        change: impl FnOnce(&mut Membership, &BTreeSet<u32>) -> T,
    ) -> T {
        let topic = self.topics.get_mut(&topic_id).expect("a live topic");
        let readable = readable_ranges(topic, topic.groups.get(group));
        let entry = topic.groups.get_mut(group).expect("an existing group");
        change(&mut entry.membership, &readable)
    }

    fn validate_member(&self, topic_id: u64, group: &str, member: &str) -> Result<(), MetaError> {
        let topic = self.topics.get(&topic_id).ok_or(TopicError::NoSuchTopic)?;
        if !is_valid_label(group) || !is_valid_label(member) {
            return Err(GroupError::InvalidGroupName.into());
        }
        let limit = self.limits.max_groups_per_topic;
        if !topic.groups.contains_key(group) && topic.groups.len() >= limit as usize {
            return Err(GroupError::TooManyGroups { limit }.into());
        }
        Ok(())
    }

    fn validate_commit(&self, commit: &CommitPositions) -> Result<(), MetaError> {
        let topic = self.topics.get(&commit.topic_id).ok_or(TopicError::NoSuchTopic)?;
        if !is_valid_label(&commit.group) {
            return Err(GroupError::InvalidGroupName.into());
        }
        let existing = topic.groups.get(&commit.group);
        let limit = self.limits.max_groups_per_topic;
        if existing.is_none() && topic.groups.len() >= limit as usize {
            return Err(GroupError::TooManyGroups { limit }.into());
        }
        let actual = existing.map_or(0, |group| group.generation);
        if let Some(expected) = commit.expected_generation.filter(|&expected| expected != actual) {
            return Err(GroupError::GenerationMismatch { expected, actual }.into());
        }
        if let Some(member) = &commit.member {
            let membership = existing.map(|group| &group.membership);
            for range_id in commit.positions.keys() {
                let refused = MembershipError::NotOwner {
                    member: member.member.clone(),
                    range_id: *range_id,
                };
                membership
                    .ok_or(GroupError::Membership(refused))?
                    .may_commit(&member.member, member.generation, *range_id)
                    .map_err(GroupError::Membership)?;
            }
        }
        for (range_id, position) in &commit.positions {
            let range = topic
                .ranges
                .get(range_id)
                .ok_or(GroupError::NoSuchRange { range_id: *range_id })?;
            self.check_position(topic, range, position)?;
        }
        Ok(())
    }

    fn check_position(
        &self,
        topic: &Topic,
        range: &Range,
        position: &GroupPosition,
    ) -> Result<(), GroupError> {
        let invalid = || GroupError::InvalidPosition {
            range_id: range.range_id,
            position: format!("{position:?}"),
        };
        let GroupPosition::At(at) = position else {
            return if range.is_active() { Err(invalid()) } else { Ok(()) };
        };
        match self.segments.get(&at.segment_id) {
            Some(segment) => {
                let owned =
                    (segment.topic_id, segment.range_id) == (topic.topic_id, range.range_id);
                let within = segment.sealed_length().is_none_or(|(end, _)| at.offset <= end);
                if owned && within { Ok(()) } else { Err(invalid()) }
            }
            None => {
                // Expired from this range's front: older than the oldest retained segment.
                let first_retained =
                    range.segment_ids.first().copied().unwrap_or(self.next_segment_id);
                if (1..first_retained).contains(&at.segment_id) { Ok(()) } else { Err(invalid()) }
            }
        }
    }

    pub(crate) fn delete_group(
        &mut self,
        topic_id: u64,
        group: &str,
    ) -> Result<MetaResponse, MetaError> {
        let topic = self.topics.get_mut(&topic_id).ok_or(TopicError::NoSuchTopic)?;
        if !is_valid_label(group) {
            return Err(GroupError::InvalidGroupName.into());
        }
        let existed = topic.groups.remove(group).is_some();
        Ok(MetaResponse::GroupDeleted { existed })
    }
}

fn new_group(now_ms: u64) -> ConsumerGroup {
    ConsumerGroup {
        generation: 0,
        positions: BTreeMap::new(),
        updated_ms: now_ms,
        membership: Membership::default(),
    }
}

#[cfg(test)]
mod tests;
