//! Consumer group members that join, heartbeat and commit through the vnode's replicated
//! metadata (wire keys 32-34; issue 24 item 3). The rule is `malachi_meta::membership`'s: a
//! member reads the ranges it was told, a range moves to another member only after its reader
//! applied an answer without it (or its session ran out), a child range is handed out only after
//! the group committed its parents drained, and a commit is taken only from the member holding
//! the range at the group's current generation. The state is replicated with the topic's other
//! metadata, so a group and its members survive the death of any broker.
//!
//! A position names a record of one range's history (its ancestors oldest first, then the range
//! itself) and a range-wide offset. Members read a range only once its ancestors are drained, so
//! a member's position always names the range itself; the offset just past a sealed range's last
//! record commits the range drained, which hands its children out.

use std::collections::BTreeSet;

use malachi_meta::{
    CommitMember, CommitPositions, GroupHeartbeat, GroupPosition, MetaCommand, MetaResponse,
    MetaState, SegmentState, Topic,
};

use crate::cursor::RangePosition;
use crate::error::LogError;
use crate::groups::{Groups, to_group_position};

/// What a member is told: the membership's generation and the ranges it reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberAssignment {
    pub generation: u64,
    /// A member silent this long is dropped and its ranges handed to the others.
    pub session_ms: u64,
    /// Ascending range ids.
    pub ranges: Vec<u32>,
}

/// A member's position in one range, as wire key 34 carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberPosition {
    pub range_id: u32,
    /// Index into the range's history: its ancestors oldest first, then the range itself.
    pub source_index: u16,
    /// Records of the range before the next one to read.
    pub offset: u64,
}

impl Groups {
    /// Joins `member` to `group` (or heartbeats it as a new session) and tells it its ranges.
    pub async fn join_member(
        &self,
        topic: &str,
        group: &str,
        member: &str,
    ) -> Result<MemberAssignment, LogError> {
        self.tell_member(topic, group, member, None).await
    }

    /// Keeps `member` alive; `generation` is the last assignment it applied (it reads only
    /// those ranges now), which lets the ranges it gave up move to other members.
    pub async fn heartbeat_member_at(
        &self,
        topic: &str,
        group: &str,
        member: &str,
        generation: u64,
    ) -> Result<MemberAssignment, LogError> {
        self.tell_member(topic, group, member, Some(generation)).await
    }

    async fn tell_member(
        &self,
        topic: &str,
        group: &str,
        member: &str,
        applied: Option<u64>,
    ) -> Result<MemberAssignment, LogError> {
        self.broker().see_topic(topic).await?;
        let topic = self.topic_named(topic).ok_or(LogError::NoSuchTopic)?;
        let command = MetaCommand::GroupHeartbeat(GroupHeartbeat {
            topic_id: topic.topic_id,
            group: group.to_string(),
            member: member.to_string(),
            applied,
            now_ms: self.clock.now_ms(),
            session_ms: self.session_ms(),
        });
        let MetaResponse::GroupAssignment { generation, ranges } =
            self.propose_meta(topic.topic_id, command).await?
        else {
            unreachable!("a group heartbeat answers GroupAssignment");
        };
        Ok(MemberAssignment { generation, session_ms: self.session_ms(), ranges })
    }

    /// Durably commits `member`'s positions, refused (`generation_mismatch`) unless the group's
    /// membership is at `generation`, and (`not_owner`) unless the member holds every range
    /// named. Committing a sealed range's end drains it and hands its children out.
    pub async fn commit_member(
        &self,
        topic: &str,
        group: &str,
        member: &str,
        generation: u64,
        positions: &[MemberPosition],
    ) -> Result<(), LogError> {
        self.broker().see_topic(topic).await?;
        let topic = self.topic_named(topic).ok_or(LogError::NoSuchTopic)?;
        let positions = self.read_meta(topic.topic_id, |meta| {
            positions
                .iter()
                .map(|position| Ok((position.range_id, member_position(meta, &topic, position)?)))
                .collect::<Result<_, LogError>>()
        })?;
        let command = MetaCommand::CommitPositions(CommitPositions {
            topic_id: topic.topic_id,
            group: group.to_string(),
            positions,
            expected_generation: None,
            now_ms: self.clock.now_ms(),
            member: Some(CommitMember {
                member: member.to_string(),
                generation: Some(generation),
                session_ms: self.session_ms(),
            }),
        });
        self.propose_meta(topic.topic_id, command).await?;
        Ok(())
    }

    /// Whether the replicated membership of `group` knows `member`: it joined through key 32.
    pub fn is_replicated_member(&self, topic: &str, group: &str, member: &str) -> bool {
        let Some(topic) = self.topic_named(topic) else { return false };
        self.read_meta(topic.topic_id, |meta| {
            meta.group(topic.topic_id, group)
                .is_some_and(|state| state.membership.members.contains_key(member))
        })
    }

    /// `member` leaves the replicated membership: its ranges go to the others at once.
    pub async fn leave_member(
        &self,
        topic: &str,
        group: &str,
        member: &str,
    ) -> Result<(), LogError> {
        let topic = self.topic_named(topic).ok_or(LogError::NoSuchTopic)?;
        let command = MetaCommand::LeaveGroupMember {
            topic_id: topic.topic_id,
            group: group.to_string(),
            member: member.to_string(),
            now_ms: self.clock.now_ms(),
            session_ms: self.session_ms(),
        };
        self.propose_meta(topic.topic_id, command).await?;
        Ok(())
    }
}

/// The committed form of a member's position: `Finished` at (or past) a sealed range's end.
fn member_position(
    meta: &MetaState,
    topic: &Topic,
    position: &MemberPosition,
) -> Result<GroupPosition, LogError> {
    let history = history(topic, position.range_id);
    if history.is_empty() {
        return Err(LogError::Meta(
            malachi_meta::GroupError::NoSuchRange { range_id: position.range_id }.into(),
        ));
    }
    if usize::from(position.source_index) + 1 != history.len() {
        // A position in an ancestor: members read a range only after its ancestors drained.
        return Err(LogError::InvalidCursor);
    }
    if sealed_end(meta, topic, position.range_id).is_some_and(|end| position.offset >= end) {
        return Ok(GroupPosition::Finished);
    }
    Ok(to_group_position(meta, topic, position.range_id, RangePosition::At(position.offset)))
}

/// The ranges `range_id` descends from, oldest first (range ids grow with time), then itself;
/// empty for a range the topic never had.
pub fn history(topic: &Topic, range_id: u32) -> Vec<u32> {
    if !topic.ranges.contains_key(&range_id) {
        return Vec::new();
    }
    let mut seen = BTreeSet::new();
    let mut pending = vec![range_id];
    while let Some(next) = pending.pop() {
        if seen.insert(next)
            && let Some(range) = topic.ranges.get(&next)
        {
            pending.extend(range.parents.iter().copied());
        }
    }
    seen.remove(&range_id);
    seen.into_iter().chain([range_id]).collect()
}

/// Records a sealed range holds in all (its last segment's base plus its length); `None` while
/// it takes appends.
fn sealed_end(meta: &MetaState, topic: &Topic, range_id: u32) -> Option<u64> {
    let range = topic.ranges.get(&range_id)?;
    if range.is_active() {
        return None;
    }
    let Some(&last) = range.segment_ids.last() else {
        // Every segment expired: nothing is left to read.
        return Some(range.expired_records);
    };
    let segment = meta.segment(last)?;
    match segment.state {
        SegmentState::Sealed { end_offset, .. } => Some(segment.range_base_records + end_offset),
        SegmentState::Active => None,
    }
}
