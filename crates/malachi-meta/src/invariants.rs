//! The metadata invariants, checked as a whole by [`MetaState::check_invariants`] (after
//! restoring a snapshot, and in this crate's tests after every command) and per topic by
//! `assert_topic` after every change, in all builds. Does no I/O.
//!
//! Per topic: the active ranges tile `[0, 2^64)` exactly once and the routing index matches
//! them; every extent is an aligned block; parents and children point at each other; a range
//! has exactly one active segment, its last, iff it is active; its segments belong to it, are
//! in id order, and number their records contiguously from `expired_records`. Globally: the
//! name index matches the topics, every retained segment belongs to exactly one live range,
//! and ids stay below their counters.

use std::collections::BTreeSet;

use crate::keyspace::tiles_keyspace;
use crate::model::{Range, Topic};
use crate::state::MetaState;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{detail}")]
pub struct InvariantViolation {
    pub detail: String,
}

fn check(condition: bool, detail: impl FnOnce() -> String) -> Result<(), InvariantViolation> {
    if condition { Ok(()) } else { Err(InvariantViolation { detail: detail() }) }
}

impl MetaState {
    /// Checks every invariant of the whole state. Call it after deserializing a snapshot: a
    /// state that fails it must not be installed.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        check(self.topics.len() == self.topic_ids_by_name.len(), || "name index size".into())?;
        let mut retained = 0usize;
        for (name, topic_id) in &self.topic_ids_by_name {
            let topic = self.topics.get(topic_id);
            check(topic.is_some_and(|t| &t.name == name), || format!("name index: {name}"))?;
        }
        for (topic_id, topic) in &self.topics {
            check(*topic_id == topic.topic_id, || format!("topic key {topic_id}"))?;
            let first_id = self.arc.map_or(1, |arc| arc.id_base() + 1);
            let known = (first_id..self.next_topic_id).contains(topic_id);
            check(known, || format!("topic id {topic_id}"))?;
            self.check_topic(topic)?;
            retained += topic.ranges.values().map(|range| range.segment_ids.len()).sum::<usize>();
        }
        check(retained == self.segments.len(), || "a retained segment has no range".into())?;
        for segment_id in self.segments.keys().chain(self.pending_reclaim.keys()) {
            check(*segment_id < self.next_segment_id, || format!("segment id {segment_id}"))?;
        }
        for segment in self.segments.values() {
            let id = segment.segment_id;
            let sorted = segment.settled_on.windows(2).all(|pair| pair[0] < pair[1]);
            check(sorted, || format!("segment {id}: settled copies out of order"))?;
            let held = segment.settled_on.iter().all(|node| segment.replicas.contains(node));
            check(held, || format!("segment {id}: a settled copy holds no replica"))?;
            let sealed = !segment.is_active() || segment.settled_on.is_empty();
            check(sealed, || format!("segment {id}: an active segment has settled copies"))?;
            for move_ in &segment.moves {
                let held = [move_.old, move_.new].iter().all(|n| segment.replicas.contains(n));
                check(held, || format!("segment {id}: a move between non-replicas"))?;
                check(move_.old != move_.new, || format!("segment {id}: a move to itself"))?;
                let waiting = !segment.settled_on.contains(&move_.new);
                check(waiting, || format!("segment {id}: a finished move is still recorded"))?;
            }
            let sorted = segment.dropped.windows(2).all(|pair| pair[0] < pair[1]);
            check(sorted, || format!("segment {id}: dropped copies out of order"))?;
            let gone = segment.dropped.iter().all(|node| !segment.replicas.contains(node));
            check(gone, || format!("segment {id}: a dropped copy is a replica"))?;
            let single = segment.moves.iter().map(|move_| move_.old).collect::<BTreeSet<_>>();
            check(single.len() == segment.moves.len(), || format!("segment {id}: moved twice"))?;
            let sealed = !segment.is_active() || segment.moves.is_empty();
            check(sealed, || format!("segment {id}: a replica of an active segment moves"))?;
        }
        let reclaimed_and_retained =
            self.pending_reclaim.keys().find(|segment_id| self.segments.contains_key(segment_id));
        check(reclaimed_and_retained.is_none(), || "a reclaimed segment is retained".into())?;
        self.check_arc()
    }

    /// With an arc claimed: every name and id here is the arc's, and the counters are in its
    /// block.
    fn check_arc(&self) -> Result<(), InvariantViolation> {
        let Some(arc) = self.arc else { return Ok(()) };
        for topic in self.topics.values() {
            check(arc.owns_name(&topic.name) && arc.owns_id(topic.topic_id), || {
                format!("topic {} outside the vnode's arc", topic.topic_id)
            })?;
        }
        for segment_id in self.segments.keys().chain(self.pending_reclaim.keys()) {
            check(arc.owns_id(*segment_id), || format!("segment {segment_id} outside the block"))?;
        }
        check(self.next_topic_id > arc.id_base() && self.next_segment_id > arc.id_base(), || {
            "id counters below the vnode's block".into()
        })
    }

    /// Panics when `topic_id`'s invariants do not hold; called after every change to it.
    pub(crate) fn assert_topic(&self, topic_id: u64) {
        let topic = self.topics.get(&topic_id).expect("asserting a live topic");
        if let Err(violation) = self.check_topic(topic) {
            panic!("topic {topic_id} invariant broken: {violation}");
        }
    }

    fn check_topic(&self, topic: &Topic) -> Result<(), InvariantViolation> {
        let name = &topic.name;
        let active: Vec<&Range> = topic.ranges.values().filter(|r| r.is_active()).collect();
        let mut by_start: Vec<(u64, u32)> =
            active.iter().map(|r| (r.extent.start, r.range_id)).collect();
        by_start.sort_unstable();
        let index: Vec<(u64, u32)> = topic.active_by_start.iter().map(|(s, r)| (*s, *r)).collect();
        check(by_start == index, || format!("{name}: routing index differs from active ranges"))?;
        let extents = topic.active_ranges().map(|range| range.extent);
        check(tiles_keyspace(extents), || format!("{name}: active ranges do not tile"))?;
        for (group_name, group) in &topic.groups {
            let violation = group.membership.violation();
            check(violation.is_none(), || format!("{name}: group {group_name}: {violation:?}"))?;
        }
        for (range_id, range) in &topic.ranges {
            check(*range_id == range.range_id, || format!("{name}: range key {range_id}"))?;
            check(*range_id < topic.next_range_id, || format!("{name}: range id {range_id}"))?;
            self.check_range(topic, range)?;
        }
        for group in topic.groups.values() {
            let known = group.positions.keys().all(|range_id| topic.ranges.contains_key(range_id));
            check(known, || format!("{name}: a group position names an unknown range"))?;
        }
        Ok(())
    }

    fn check_range(&self, topic: &Topic, range: &Range) -> Result<(), InvariantViolation> {
        let label = format!("{} range {}", topic.name, range.range_id);
        check(range.extent.is_block(), || format!("{label}: extent is not an aligned block"))?;
        check(range.parents.len() <= 2 && range.children.len() <= 2, || {
            format!("{label}: family")
        })?;
        for parent_id in &range.parents {
            let parent = topic.ranges.get(parent_id);
            let linked =
                parent.is_some_and(|p| !p.is_active() && p.children.contains(&range.range_id));
            check(linked, || format!("{label}: parent {parent_id} does not name it"))?;
        }
        check(range.is_active() == range.children.is_empty(), || format!("{label}: children"))?;
        let ids = &range.segment_ids;
        check(ids.windows(2).all(|pair| pair[0] < pair[1]), || format!("{label}: segment order"))?;
        let active_count =
            ids.iter().filter(|id| self.segments.get(id).is_some_and(|s| s.is_active())).count();
        let expected_active = usize::from(range.is_active());
        check(active_count == expected_active, || {
            format!("{label}: {active_count} active segments")
        })?;
        if range.is_active() {
            let last_active = ids.last().is_some_and(|id| self.segments[id].is_active());
            check(last_active, || format!("{label}: the active segment is not the last"))?;
        }
        let mut next_record = range.expired_records;
        let mut seen = BTreeSet::new();
        for segment_id in ids {
            let segment = self.segments.get(segment_id);
            let segment = segment.ok_or_else(|| InvariantViolation {
                detail: format!("{label}: missing segment {segment_id}"),
            })?;
            let owned = (segment.topic_id, segment.range_id) == (topic.topic_id, range.range_id);
            check(owned && seen.insert(*segment_id), || {
                format!("{label}: segment {segment_id} owner")
            })?;
            check(segment.range_base_records == next_record, || {
                format!("{label}: record numbering")
            })?;
            next_record =
                next_record.saturating_add(segment.sealed_length().map_or(0, |(end, _)| end));
        }
        Ok(())
    }
}
