//! Which member of a consumer group reads which range: the rule behind group membership
//! (issue 24). Pure: the members, the ranges a group may read now and the previous assignment
//! in, the new assignment out.
//!
//! **Order first.** A range is *readable* by a group once every one of its parents is drained
//! by the group (committed `Finished`, or removed by retention); a range the group drained is
//! not. A child of a split or merge is therefore never handed out while any record of its
//! parents may still be read, and each key's records are read in the order they were written,
//! whatever the reshapes and whichever member reads.
//!
//! **Balanced.** Every readable range goes to exactly one member; member counts differ by at
//! most one.
//!
//! **Sticky.** A member keeps the readable ranges it had, up to its share; only the excess of
//! members above their share and the ranges nobody keeps move. The larger shares (when the
//! ranges do not divide evenly) go to the members that kept the most, so a change of the
//! readable set or of the members moves as few ranges as balance allows.
//!
//! Deterministic: ordered maps only, ties broken by member name, then range id.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{ConsumerGroup, GroupPosition, Topic};

/// Member name to the ranges it reads.
pub type Assignment = BTreeMap<String, BTreeSet<u32>>;

/// The ranges of `topic` that `group` (`None`: a group that never committed) may read now: not
/// drained by it, and every parent drained by it or gone.
pub fn readable_ranges(topic: &Topic, group: Option<&ConsumerGroup>) -> BTreeSet<u32> {
    let drained = |range_id: u32| {
        group.and_then(|group| group.positions.get(&range_id)) == Some(&GroupPosition::Finished)
            || !topic.ranges.contains_key(&range_id)
    };
    topic
        .ranges
        .values()
        .filter(|range| !drained(range.range_id))
        .filter(|range| range.parents.iter().all(|&parent| drained(parent)))
        .map(|range| range.range_id)
        .collect()
}

/// Hands every range of `readable` to one of `members`, balanced and sticky (see the module
/// documentation). No members: nothing is assigned.
pub fn assign(
    members: &BTreeSet<String>,
    readable: &BTreeSet<u32>,
    previous: &Assignment,
) -> Assignment {
    let mut assignment: Assignment =
        members.iter().map(|member| (member.clone(), BTreeSet::new())).collect();
    if members.is_empty() {
        return assignment;
    }
    let kept = kept_ranges(members, readable, previous);
    let shares = shares(members, readable.len(), &kept);
    for (member, ranges) in kept {
        let share = shares[&member];
        assignment.get_mut(&member).expect("a member").extend(ranges.into_iter().take(share));
    }
    // What nobody kept (new ranges, and the excess of members above their share), in order.
    let free: Vec<u32> =
        readable.iter().copied().filter(|range_id| !assigned(&assignment, *range_id)).collect();
    for range_id in free {
        let member = members
            .iter()
            .filter(|member| assignment[*member].len() < shares[*member])
            .min_by_key(|member| assignment[*member].len())
            .expect("the shares add up to the readable ranges");
        assignment.get_mut(member).expect("a member").insert(range_id);
    }
    assert_balanced(&assignment, readable);
    assignment
}

/// What each member had before that is still readable, claimed once (a range two members
/// claim, after a lost update, stays with the first by name).
fn kept_ranges(
    members: &BTreeSet<String>,
    readable: &BTreeSet<u32>,
    previous: &Assignment,
) -> BTreeMap<String, BTreeSet<u32>> {
    let mut claimed = BTreeSet::new();
    members
        .iter()
        .map(|member| {
            let kept: BTreeSet<u32> = previous
                .get(member)
                .into_iter()
                .flatten()
                .copied()
                .filter(|range_id| readable.contains(range_id) && claimed.insert(*range_id))
                .collect();
            (member.clone(), kept)
        })
        .collect()
}

/// Each member's share of `ranges`: `ranges / members`, one more for the `ranges % members`
/// members that kept the most (ties by name).
fn shares(
    members: &BTreeSet<String>,
    ranges: usize,
    kept: &BTreeMap<String, BTreeSet<u32>>,
) -> BTreeMap<String, usize> {
    let (base, extra) = (ranges / members.len(), ranges % members.len());
    let mut by_kept: Vec<&String> = members.iter().collect();
    by_kept.sort_by_key(|member| std::cmp::Reverse(kept[*member].len()));
    by_kept
        .into_iter()
        .enumerate()
        .map(|(rank, member)| (member.clone(), base + usize::from(rank < extra)))
        .collect()
}

fn assigned(assignment: &Assignment, range_id: u32) -> bool {
    assignment.values().any(|ranges| ranges.contains(&range_id))
}

/// Every readable range to exactly one member, nothing else, counts within one of each other.
fn assert_balanced(assignment: &Assignment, readable: &BTreeSet<u32>) {
    let handed: Vec<u32> = assignment.values().flatten().copied().collect();
    let unique: BTreeSet<u32> = handed.iter().copied().collect();
    assert_eq!(handed.len(), unique.len(), "a range handed to two members: {assignment:?}");
    assert_eq!(&unique, readable, "the readable ranges, each handed out once");
    let counts = assignment.values().map(BTreeSet::len);
    let (least, most) = (counts.clone().min().unwrap_or(0), counts.max().unwrap_or(0));
    assert!(most - least <= 1, "unbalanced: {assignment:?}");
}

#[cfg(test)]
mod tests;
