//! Consumer groups: committed positions (in metadata, so they survive restarts) and the soft
//! membership of group members with their range assignment.
//!
//! A member's share is computed, not stored: the group's frontier entries in range order, dealt
//! round-robin over the live members in name order. Every node computes the same answer from the
//! same membership, and a member that stops heartbeating drops out after the session timeout.

use std::collections::BTreeMap;

use malachi_meta::{CommitPositions, GroupPosition, MetaCommand, Position, Topic};

use crate::cursor::RangePosition;
use crate::error::LogError;
use crate::frontier::{self, Frontier};
use crate::node::Core;
use std::sync::{Arc, Mutex};

/// A member that has not fetched or acked for this long leaves its group (the original's 30 s),
/// unless `MALACHI_GROUP_SESSION_TIMEOUT_MS` says otherwise.
pub const SESSION_TIMEOUT_MS: u64 = 30_000;
/// Bound on live members of one group.
pub const MEMBERS_PER_GROUP_MAX: usize = 10_000;

/// Live members of every group on this node.
#[derive(Debug)]
pub struct Members {
    /// A member silent this long drops out.
    session_ms: u64,
    groups: BTreeMap<(u64, String), BTreeMap<String, u64>>,
}

impl Members {
    pub fn new(session_ms: u64) -> Members {
        Members { session_ms, groups: BTreeMap::new() }
    }

    /// Records that `member` is alive and returns the group's live members, sorted.
    pub fn heartbeat(
        &mut self,
        topic_id: u64,
        group: &str,
        member: &str,
        now_ms: u64,
    ) -> Vec<String> {
        let session_ms = self.session_ms;
        let members = self.groups.entry((topic_id, group.to_string())).or_default();
        members.retain(|_, last_seen_ms| *last_seen_ms + session_ms > now_ms);
        if members.len() < MEMBERS_PER_GROUP_MAX || members.contains_key(member) {
            members.insert(member.to_string(), now_ms);
        }
        members.keys().cloned().collect()
    }

    /// Forgets members silent for a whole session and groups left empty.
    pub fn prune(&mut self, now_ms: u64) {
        for members in self.groups.values_mut() {
            members.retain(|_, last_seen_ms| *last_seen_ms + self.session_ms > now_ms);
        }
        self.groups.retain(|_, members| !members.is_empty());
    }

    pub fn leave(&mut self, topic_id: u64, group: &str, member: &str) {
        if let Some(members) = self.groups.get_mut(&(topic_id, group.to_string())) {
            members.remove(member);
        }
    }
}

/// The ranges of `frontier` dealt to `member` among `members` (sorted).
pub fn assigned(frontier: &Frontier, members: &[String], member: &str) -> Frontier {
    let Some(index) = members.iter().position(|name| name == member) else {
        return Frontier::new();
    };
    frontier
        .iter()
        .enumerate()
        .filter(|(at, _)| at % members.len() == index)
        .map(|(_, (&range_id, &position))| (range_id, position))
        .collect()
}

/// The consumer groups service: commits and reads of a group's positions, and the soft
/// membership of its members with their share of the ranges.
pub struct Groups {
    core: Arc<Core>,
    /// Live members of every group on this broker.
    members: Mutex<Members>,
}

services_on_core!(Groups);

impl Groups {
    pub(crate) fn new(core: Arc<Core>) -> Groups {
        let members = Mutex::new(Members::new(core.config.group_session_timeout_ms));
        Groups { core, members }
    }

    /// How long a member may stay silent (`MALACHI_GROUP_SESSION_TIMEOUT_MS`).
    pub(crate) fn session_ms(&self) -> u64 {
        self.core.config.group_session_timeout_ms
    }

    /// Drops the members whose session timed out by `now_ms`.
    pub(crate) fn prune(&self, now_ms: u64) {
        self.members.lock().expect("members lock poisoned").prune(now_ms);
    }

    /// The group's committed frontier (the start for a group that never committed).
    pub(crate) fn group_frontier(&self, topic: &Topic, group: &str) -> Frontier {
        let committed: Frontier = self.read_meta(topic.topic_id, |meta| {
            let Some(state) = meta.group(topic.topic_id, group) else {
                return Frontier::new();
            };
            state
                .positions
                .iter()
                .map(|(&range_id, position)| {
                    (range_id, to_range_position(meta, topic, range_id, position))
                })
                .collect()
        });
        frontier::from_committed(topic, &committed)
    }

    /// A member's share of the group's committed frontier; heartbeats the member.
    pub(crate) fn member_frontier(&self, topic: &Topic, group: &str, member: &str) -> Frontier {
        let now_ms = self.clock.now_ms();
        let members = self.members.lock().expect("members lock poisoned").heartbeat(
            topic.topic_id,
            group,
            member,
            now_ms,
        );
        assigned(&self.group_frontier(topic, group), &members, member)
    }

    /// Durably commits `cursor` as the group's position for the ranges it names. An absent
    /// cursor commits nothing.
    pub async fn commit(
        &self,
        topic: &str,
        group: &str,
        cursor: Option<&[u8]>,
    ) -> Result<(), LogError> {
        let Some(text) = cursor else { return Ok(()) };
        self.broker().see_topic(topic).await?;
        let topic = self.topic_named(topic).ok_or(LogError::NoSuchTopic)?;
        let positions = self.broker().decode_cursor(&topic, text)?;
        let positions = self.read_meta(topic.topic_id, |meta| {
            positions
                .iter()
                .map(|(&range_id, &position)| {
                    (range_id, to_group_position(meta, &topic, range_id, position))
                })
                .collect()
        });
        let command = MetaCommand::CommitPositions(CommitPositions {
            topic_id: topic.topic_id,
            group: group.to_string(),
            positions,
            expected_generation: None,
            now_ms: self.clock.now_ms(),
            member: None,
        });
        self.propose_meta(topic.topic_id, command).await?;
        Ok(())
    }

    /// The group's committed position per range, as range-wide offsets (`u64::MAX` for a range
    /// the group drained): what a lag report, or the simulator's group observer, compares.
    pub fn group_positions(&self, topic: &str, group: &str) -> Result<Vec<(u32, u64)>, LogError> {
        let topic = self.topic_named(topic).ok_or(LogError::NoSuchTopic)?;
        let positions = self.group_frontier(&topic, group);
        Ok(positions
            .into_iter()
            .map(|(range_id, position)| match position {
                crate::cursor::RangePosition::At(offset) => (range_id, offset),
                crate::cursor::RangePosition::Drained => (range_id, u64::MAX),
            })
            .collect())
    }

    /// The group's committed position as a cursor (the start of the topic if it never committed).
    pub fn group_cursor(&self, topic: &str, group: &str) -> Result<String, LogError> {
        let topic = self.topic_named(topic).ok_or(LogError::NoSuchTopic)?;
        let positions = self.group_frontier(&topic, group);
        self.broker().mint_cursor(&crate::cursor::Cursor { topic_id: topic.topic_id, positions })
    }

    /// Keeps a subscribed member alive between fetches.
    pub fn heartbeat_member(&self, topic: &str, group: &str, member: &str) {
        if let Ok(topic_id) = self.broker().topic_id(topic) {
            let now_ms = self.clock.now_ms();
            self.members
                .lock()
                .expect("members lock poisoned")
                .heartbeat(topic_id, group, member, now_ms);
        }
    }

    /// Removes a member at once, so the others take over its ranges on their next fetch.
    pub fn leave_group(&self, topic: &str, group: &str, member: &str) {
        if let Ok(topic_id) = self.broker().topic_id(topic) {
            self.members.lock().expect("members lock poisoned").leave(topic_id, group, member);
        }
    }
}

/// A committed position as a range-wide offset; a position in an expired segment resumes at the
/// oldest retained record.
fn to_range_position(
    meta: &malachi_meta::MetaState,
    topic: &Topic,
    range_id: u32,
    position: &GroupPosition,
) -> RangePosition {
    match position {
        GroupPosition::Finished => RangePosition::Drained,
        GroupPosition::At(Position { segment_id, offset }) => match meta.segment(*segment_id) {
            Some(segment) => RangePosition::At(segment.range_base_records + offset),
            None => RangePosition::At(
                topic.ranges.get(&range_id).map_or(0, |range| range.expired_records),
            ),
        },
    }
}

/// A range-wide offset as the (segment, offset) metadata stores.
pub(crate) fn to_group_position(
    meta: &malachi_meta::MetaState,
    topic: &Topic,
    range_id: u32,
    position: RangePosition,
) -> GroupPosition {
    let RangePosition::At(offset) = position else {
        return GroupPosition::Finished;
    };
    let segments = meta.range_segments(topic.topic_id, range_id);
    let holding = segments
        .iter()
        .rev()
        .find(|segment| segment.range_base_records <= offset)
        .or(segments.first());
    match holding {
        Some(segment) => GroupPosition::At(Position {
            segment_id: segment.segment_id,
            offset: offset.saturating_sub(segment.range_base_records),
        }),
        // Every segment expired: the range has nothing left to read.
        None => GroupPosition::Finished,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_dealt_round_robin_by_name() {
        let frontier: Frontier = (0..5).map(|range_id| (range_id, RangePosition::At(0))).collect();
        let members = vec!["a".to_string(), "b".to_string()];
        let keys =
            |member: &str| assigned(&frontier, &members, member).into_keys().collect::<Vec<_>>();
        assert_eq!(keys("a"), vec![0, 2, 4]);
        assert_eq!(keys("b"), vec![1, 3]);
        assert!(keys("stranger").is_empty());
    }

    #[test]
    fn silent_members_expire() {
        let mut members = Members::new(SESSION_TIMEOUT_MS);
        assert_eq!(members.heartbeat(1, "g", "a", 0), vec!["a"]);
        assert_eq!(members.heartbeat(1, "g", "b", 10_000), vec!["a", "b"]);
        assert_eq!(members.heartbeat(1, "g", "b", 30_000), vec!["b"], "a was silent for 30 s");
        members.leave(1, "g", "b");
        assert_eq!(members.heartbeat(1, "g", "c", 30_001), vec!["c"]);
        members.prune(60_001);
        assert!(members.groups.is_empty(), "silent groups are forgotten");
    }
}
