//! Reader frontiers over a topic's range history: which ranges a reader is in and where.
//!
//! A frontier maps range ids to [`RangePosition`]s and tiles the keyspace. A drained (sealed and
//! fully read) range gives way to its children once *all* of each child's parents are drained:
//! after a split both children start at once; after a merge the merged range waits for both
//! buddies. That rule is what keeps per-key order across splits and merges: a key's records in
//! a parent are always read before its records in the child. Pure functions; no I/O.

use std::collections::{BTreeMap, BTreeSet};

use malachi_meta::{Extent, Topic, keyspace::tiles_keyspace};

use crate::cursor::RangePosition;

pub type Frontier = BTreeMap<u32, RangePosition>;

/// Why a frontier cannot be used for a topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrontierError {
    #[error("range {0} does not exist in this topic")]
    UnknownRange(u32),
    #[error("range {0} is active and cannot be drained")]
    DrainedActiveRange(u32),
    #[error("the frontier does not cover the keyspace exactly once")]
    NotATiling,
    #[error("two ranges of the frontier overlap")]
    Overlapping,
}

/// Where a reader with no position starts: every initial range, at its first record.
pub fn initial(topic: &Topic) -> Frontier {
    topic
        .ranges
        .values()
        .filter(|range| range.parents.is_empty())
        .map(|range| (range.range_id, RangePosition::At(0)))
        .collect()
}

/// Checks that a frontier tiles the keyspace with ranges of the topic (see `extents_of`).
pub fn validate(topic: &Topic, frontier: &Frontier) -> Result<(), FrontierError> {
    let extents = extents_of(topic, frontier)?;
    if tiles_keyspace(extents) { Ok(()) } else { Err(FrontierError::NotATiling) }
}

/// The extents of a frontier's ranges in keyspace order, after checking that every range
/// exists and that only sealed ranges are drained.
fn extents_of(topic: &Topic, frontier: &Frontier) -> Result<Vec<Extent>, FrontierError> {
    let mut extents: Vec<Extent> = Vec::with_capacity(frontier.len());
    for (&range_id, position) in frontier {
        let range = topic.ranges.get(&range_id).ok_or(FrontierError::UnknownRange(range_id))?;
        if *position == RangePosition::Drained && range.is_active() {
            return Err(FrontierError::DrainedActiveRange(range_id));
        }
        extents.push(range.extent);
    }
    extents.sort_by_key(|extent| extent.start);
    Ok(extents)
}

/// Checks a frontier that may cover only part of the keyspace (a group member's share): its
/// ranges exist, only sealed ones are drained, and no two overlap.
pub fn validate_partial(topic: &Topic, frontier: &Frontier) -> Result<(), FrontierError> {
    let extents = extents_of(topic, frontier)?;
    let overlapping = extents.windows(2).any(|pair| pair[1].start <= pair[0].end_inclusive);
    if overlapping { Err(FrontierError::Overlapping) } else { Ok(()) }
}

/// Replaces drained ranges by their children wherever every parent of a child is drained, until
/// nothing changes. Entries stay `Drained` while a merge waits for the other buddy.
pub fn advance(topic: &Topic, frontier: &mut Frontier) {
    loop {
        let drained: Vec<u32> = frontier
            .iter()
            .filter(|(_, position)| **position == RangePosition::Drained)
            .map(|(&range_id, _)| range_id)
            .collect();
        let mut changed = false;
        for range_id in drained {
            let Some(range) = topic.ranges.get(&range_id) else { continue };
            for child_id in &range.children {
                let ready = topic.ranges[child_id]
                    .parents
                    .iter()
                    .all(|parent| frontier.get(parent) == Some(&RangePosition::Drained));
                if ready && !frontier.contains_key(child_id) {
                    frontier.insert(*child_id, RangePosition::At(0));
                    changed = true;
                }
            }
            if !range.children.is_empty() && range.children.iter().all(|c| frontier.contains_key(c))
            {
                frontier.remove(&range_id);
                changed = true;
            }
        }
        if !changed {
            return;
        }
    }
}

/// Turns whatever a group committed (possibly only some ranges, possibly with stale ancestors)
/// into a tiling frontier: a range with a committed descendant counts as drained, a range with
/// no committed position and no committed descendant starts at its first record.
pub fn from_committed(topic: &Topic, committed: &Frontier) -> Frontier {
    let mut frontier = Frontier::new();
    let mut visited = BTreeSet::new();
    let mut stack: Vec<u32> = initial(topic).into_keys().rev().collect();
    while let Some(range_id) = stack.pop() {
        if !visited.insert(range_id) {
            continue;
        }
        let Some(range) = topic.ranges.get(&range_id) else { continue };
        let committed_descendant = has_descendant_in(topic, range_id, committed);
        match committed.get(&range_id) {
            Some(position) if !committed_descendant => {
                frontier.insert(range_id, *position);
            }
            _ if committed_descendant => stack.extend(range.children.iter().rev()),
            _ => {
                frontier.insert(range_id, RangePosition::At(0));
            }
        }
    }
    advance(topic, &mut frontier);
    frontier
}

fn has_descendant_in(topic: &Topic, range_id: u32, committed: &Frontier) -> bool {
    let mut stack: Vec<u32> = topic.ranges[&range_id].children.clone();
    let mut seen = BTreeSet::new();
    while let Some(child) = stack.pop() {
        if !seen.insert(child) {
            continue;
        }
        if committed.contains_key(&child) {
            return true;
        }
        stack.extend(topic.ranges[&child].children.iter().copied());
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::TopicBuilder;

    #[test]
    fn a_split_releases_both_children_at_once() {
        let mut topic = TopicBuilder::new(1);
        let [low, high] = topic.split(0);
        let topic = topic.topic();
        let mut frontier = Frontier::from([(0, RangePosition::Drained)]);
        advance(&topic, &mut frontier);
        let expected = Frontier::from([(low, RangePosition::At(0)), (high, RangePosition::At(0))]);
        assert_eq!(frontier, expected);
        assert_eq!(validate(&topic, &frontier), Ok(()));
    }

    #[test]
    fn a_merge_waits_for_both_buddies() {
        let mut builder = TopicBuilder::new(2);
        let merged = builder.merge(0, 1);
        let topic = builder.topic();
        let mut frontier = Frontier::from([(0, RangePosition::Drained), (1, RangePosition::At(4))]);
        advance(&topic, &mut frontier);
        assert_eq!(frontier.get(&merged), None, "the merged range must wait for range 1");
        frontier.insert(1, RangePosition::Drained);
        advance(&topic, &mut frontier);
        assert_eq!(frontier, Frontier::from([(merged, RangePosition::At(0))]));
    }

    #[test]
    fn validation_names_the_problem() {
        let mut builder = TopicBuilder::new(2);
        builder.split(0);
        let topic = builder.topic();
        let cases: Vec<(Frontier, Result<(), FrontierError>)> = vec![
            (initial(&topic), Ok(())),
            (Frontier::from([(0, RangePosition::At(1))]), Err(FrontierError::NotATiling)),
            (
                Frontier::from([(0, RangePosition::At(1)), (9, RangePosition::At(0))]),
                Err(FrontierError::UnknownRange(9)),
            ),
            (
                Frontier::from([(0, RangePosition::At(0)), (1, RangePosition::Drained)]),
                Err(FrontierError::DrainedActiveRange(1)),
            ),
            (
                Frontier::from([
                    (0, RangePosition::At(0)),
                    (1, RangePosition::At(0)),
                    (2, RangePosition::At(0)),
                ]),
                Err(FrontierError::NotATiling),
            ),
        ];
        for (frontier, expected) in cases {
            assert_eq!(validate(&topic, &frontier), expected, "{frontier:?}");
        }
    }

    #[test]
    fn partial_frontiers_must_not_overlap() {
        let mut builder = TopicBuilder::new(2);
        let [low, _] = builder.split(0);
        let topic = builder.topic();
        let cases: Vec<(Frontier, Result<(), FrontierError>)> = vec![
            (Frontier::from([(low, RangePosition::At(0))]), Ok(())),
            (Frontier::from([(1, RangePosition::At(0)), (low, RangePosition::At(3))]), Ok(())),
            (
                Frontier::from([(0, RangePosition::At(0)), (low, RangePosition::At(0))]),
                Err(FrontierError::Overlapping),
            ),
            (
                Frontier::from([(1, RangePosition::Drained)]),
                Err(FrontierError::DrainedActiveRange(1)),
            ),
        ];
        for (frontier, expected) in cases {
            assert_eq!(validate_partial(&topic, &frontier), expected, "{frontier:?}");
        }
    }

    #[test]
    fn committed_positions_become_a_tiling_frontier() {
        let mut builder = TopicBuilder::new(1);
        let [low, high] = builder.split(0);
        let [low_low, low_high] = builder.split(low);
        let topic = builder.topic();
        let cases: Vec<(Frontier, Frontier)> = vec![
            (Frontier::new(), Frontier::from([(0, RangePosition::At(0))])),
            (
                Frontier::from([(0, RangePosition::At(7))]),
                Frontier::from([(0, RangePosition::At(7))]),
            ),
            // A committed grandchild implies its ancestors were drained; the uncommitted
            // branches start from their beginning.
            (
                Frontier::from([(0, RangePosition::At(3)), (low_low, RangePosition::At(2))]),
                Frontier::from([
                    (low_low, RangePosition::At(2)),
                    (low_high, RangePosition::At(0)),
                    (high, RangePosition::At(0)),
                ]),
            ),
        ];
        for (committed, expected) in cases {
            let frontier = from_committed(&topic, &committed);
            assert_eq!(frontier, expected, "from {committed:?}");
            assert_eq!(validate(&topic, &frontier), Ok(()));
        }
    }
}
