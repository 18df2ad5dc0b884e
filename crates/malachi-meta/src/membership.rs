//! The members of one consumer group and the ranges each reads (issue 24 item 3). Pure: time
//! comes in as `now_ms`, the ranges the group may read as a set ([`crate::assignment`]).
//!
//! A member joins and heartbeats with the same call; each answer tells it the group's
//! `generation` and its ranges. A member that misses `session_ms` of heartbeats is dropped.
//!
//! **No range is read by two members at once.** A member may read what it was told since it
//! last applied what it was told: its *held* ranges. A range moves in two steps. The first
//! assignment takes it from its reader (a new generation without it), and the range stays held
//! until that reader heartbeats saying it applied the answer that left it out (it stopped
//! reading the range) or is dropped; only then does an assignment give it to another member.
//! So the member that had a range and the member that gets it never hold it together, and a
//! commit for a range is taken only from the member that holds it, at the current generation.
//!
//! Assignment is [`crate::assignment::assign`]'s: balanced, sticky, children after parents.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::assignment::{Assignment, assign};

/// Members of one consumer group: more would leave members idle on any topic but the largest
/// (a topic has at most 65,536 ranges), and every heartbeat reassigns over all of them.
pub const MEMBERS_PER_GROUP_MAX: u32 = 1_024;

/// One member of a group.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// When it last joined or heartbeated.
    pub seen_ms: u64,
    /// The ranges it is to read now.
    pub assigned: BTreeSet<u32>,
    /// The ranges it may be reading: everything it was told since it last applied what it was
    /// told. No other member is assigned any of them.
    pub held: BTreeSet<u32>,
    /// What it was last told, and at which generation: once it says it applied that
    /// generation, it reads only those ranges.
    pub told: BTreeSet<u32>,
    pub told_generation: Option<u64>,
}

/// A group's members, and the generation of their assignment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Membership {
    /// Grows by one whenever any member's assigned ranges change.
    pub generation: u64,
    pub members: BTreeMap<String, Member>,
}

/// What a member is told: the generation and its ranges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Told {
    pub generation: u64,
    pub ranges: BTreeSet<u32>,
}

/// Why a member's commit is refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum MembershipError {
    /// The member does not hold the range (it was never told it, or it was dropped).
    #[error("member {member:?} does not hold range {range_id}")]
    NotOwner { member: String, range_id: u32 },
    /// The commit named a generation the group has moved past (or not reached).
    #[error("member {member:?} committed at generation {stated}, the group is at {current}")]
    StaleGeneration { member: String, stated: u64, current: u64 },
    /// Ours: the group has as many members as it may.
    #[error("the group already has {limit} members")]
    TooManyMembers { limit: u32 },
}

impl MembershipError {
    pub fn reason(&self) -> malachi_reason::Reason {
        match self {
            MembershipError::NotOwner { .. } => malachi_reason::Reason::NotOwner,
            MembershipError::StaleGeneration { .. } => malachi_reason::Reason::GenerationMismatch,
            MembershipError::TooManyMembers { .. } => malachi_reason::Reason::TooManyMembers,
        }
    }
}

/// The clock and the ranges a call works with.
#[derive(Clone, Copy, Debug)]
pub struct Now<'a> {
    pub now_ms: u64,
    pub session_ms: u64,
    /// The ranges the group may read ([`crate::assignment::readable_ranges`]).
    pub readable: &'a BTreeSet<u32>,
}

impl Membership {
    /// No members and never any: nothing to store.
    pub fn is_empty(&self) -> bool {
        self.generation == 0 && self.members.is_empty()
    }

    /// Joins `member` (a name it does not know), or heartbeats it; `applied` is the generation
    /// the member last applied (`None` on a join). Drops members whose session ran out,
    /// reassigns, and tells the member its ranges.
    pub fn heartbeat(
        &mut self,
        member: &str,
        applied: Option<u64>,
        now: Now<'_>,
        members_max: u32,
    ) -> Result<Told, MembershipError> {
        self.admits(member, now, members_max)?;
        self.expire(now);
        let entry = self.members.entry(member.to_string()).or_default();
        entry.seen_ms = now.now_ms;
        if applied.is_some() && applied == entry.told_generation {
            // It reads what it was last told, and stopped reading anything else.
            entry.held = entry.told.clone();
        }
        self.reassign(now.readable);
        let generation = self.generation;
        let entry = self.members.get_mut(member).expect("just inserted");
        entry.held.extend(entry.assigned.iter().copied());
        entry.told = entry.assigned.clone();
        entry.told_generation = Some(generation);
        let told = Told { generation, ranges: entry.assigned.clone() };
        self.check();
        Ok(told)
    }

    /// Whether a heartbeat of `member` is taken: a new member only while the group, less the
    /// members whose session ran out, has room. Changes nothing, so a refusal leaves the group
    /// as it was.
    pub fn admits(
        &self,
        member: &str,
        now: Now<'_>,
        members_max: u32,
    ) -> Result<(), MembershipError> {
        let alive = self.members.values().filter(|entry| !expired(entry, now)).count();
        let known = self.members.get(member).is_some_and(|entry| !expired(entry, now));
        if !known && alive >= members_max as usize {
            return Err(MembershipError::TooManyMembers { limit: members_max });
        }
        Ok(())
    }

    /// `member` leaves: its ranges are free at once.
    pub fn leave(&mut self, member: &str, now: Now<'_>) {
        self.members.remove(member);
        self.expire(now);
        self.reassign(now.readable);
        self.check();
    }

    /// Drops timed-out members and reassigns: after the readable ranges changed (a commit that
    /// drained a range, a split or merge), or on a timer.
    pub fn rebalance(&mut self, now: Now<'_>) {
        self.expire(now);
        self.reassign(now.readable);
        self.check();
    }

    /// Whether `member` may commit a position of `range_id`: it holds the range and, when it
    /// states one, at the current generation.
    pub fn may_commit(
        &self,
        member: &str,
        stated: Option<u64>,
        range_id: u32,
    ) -> Result<(), MembershipError> {
        let not_owner = || MembershipError::NotOwner { member: member.to_string(), range_id };
        let entry = self.members.get(member).ok_or_else(not_owner)?;
        if let Some(stated) = stated.filter(|stated| *stated != self.generation) {
            let (member, current) = (member.to_string(), self.generation);
            return Err(MembershipError::StaleGeneration { member, stated, current });
        }
        if !entry.held.contains(&range_id) {
            return Err(not_owner());
        }
        Ok(())
    }

    /// Drops the members whose last heartbeat is `session_ms` old or older.
    fn expire(&mut self, now: Now<'_>) {
        self.members.retain(|_, member| !expired(member, now));
    }

    /// The balanced, sticky target, less any range another member still holds; a new
    /// generation if anyone's ranges changed.
    fn reassign(&mut self, readable: &BTreeSet<u32>) {
        let names: BTreeSet<String> = self.members.keys().cloned().collect();
        let current: Assignment = self
            .members
            .iter()
            .map(|(name, member)| (name.clone(), member.assigned.clone()))
            .collect();
        let target = assign(&names, readable, &current);
        let mut changed = false;
        for (name, ranges) in target {
            let free: BTreeSet<u32> = ranges
                .into_iter()
                .filter(|range_id| !self.held_by_another(&name, *range_id))
                .collect();
            let member = self.members.get_mut(&name).expect("a member");
            if member.assigned != free {
                member.assigned = free;
                changed = true;
            }
        }
        if changed {
            self.generation = self.generation.checked_add(1).expect("generations never run out");
        }
    }

    fn held_by_another(&self, name: &str, range_id: u32) -> bool {
        self.members.iter().any(|(other, member)| other != name && member.held.contains(&range_id))
    }

    /// No range held by two members; what each is assigned it holds, once told.
    pub(crate) fn check(&self) {
        if let Some(violation) = self.violation() {
            panic!("membership invariant broken: {violation}: {self:?}");
        }
    }

    /// What breaks the membership's invariants, if anything does.
    pub(crate) fn violation(&self) -> Option<String> {
        let mut holders: BTreeMap<u32, &str> = BTreeMap::new();
        for (name, member) in &self.members {
            for range_id in &member.held {
                if let Some(other) = holders.insert(*range_id, name) {
                    return Some(format!("range {range_id} held by {other} and {name}"));
                }
            }
        }
        for (name, member) in &self.members {
            for range_id in &member.assigned {
                if let Some(holder) = holders.get(range_id).filter(|holder| **holder != name) {
                    return Some(format!("range {range_id} assigned to {name}, held by {holder}"));
                }
            }
        }
        None
    }
}

/// Whether `member`'s last heartbeat is `session_ms` old or older.
fn expired(member: &Member, now: Now<'_>) -> bool {
    now.now_ms >= member.seen_ms.saturating_add(now.session_ms)
}

#[cfg(test)]
mod tests;
