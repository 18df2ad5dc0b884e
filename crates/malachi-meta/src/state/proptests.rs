//! A proptest-state-machine test of [`MetaState`] against an independent reference model.
//!
//! The model (`Model`) is a small, separate implementation of topics, ranges, segments, group
//! generations and retention. It generates concrete commands from its own state (valid ones
//! and deliberately wrong ones: missing, foreign or stale seal reports, non-buddy merges,
//! positions outside their range, plans that touch active segments), predicts each outcome,
//! and after every step the test checks that the machine agrees with it and that:
//! the active ranges of each topic tile `[0, 2^64)` exactly once; every segment belongs to a
//! live range of a live topic; a range has exactly one active segment iff it is active; a
//! sealed segment's length never changes; topic ids are never reused; replaying the command
//! log from scratch gives the same `state_hash`; and a serde round trip keeps the hash.

use crate::limits::Quota;
use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use proptest::sample::select;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest, prop_state_machine};

use crate::command::{
    CommitPositions, CreateTopic, GroupHeartbeat, MergeRanges, MetaCommand, MetaResponse,
    RollSegment, SplitRange,
};
use crate::keyspace::Extent;
use crate::limits::MetaLimits;
use crate::model::{GroupPosition, Position, SealReport, SegmentRef, SegmentRoll, SegmentState};
use crate::policy::RetentionDefaults;
use crate::state::MetaState;

const TOPIC_NAMES: [&str; 3] = ["a", "b", "c"];
/// Topic and segment ids no command ever creates in a short run.
const BOGUS_ID: u64 = 999_999;

fn limits() -> MetaLimits {
    MetaLimits {
        max_active_ranges_per_topic: 6,
        max_ranges_per_topic: 12,
        max_segments_per_range: 4,
        ..MetaLimits::default()
    }
}

/// One step: a command, or a retention sweep (plan, then apply the plan).
#[derive(Clone, Debug)]
enum Step {
    Command(MetaCommand),
    Retention { now_ms: u64, defaults: RetentionDefaults },
}

#[derive(Clone, Debug)]
struct ModelSegment {
    topic_id: u64,
    range_id: u32,
    created_ms: u64,
    /// `(end_offset, data_bytes, sealed_ms)` once sealed.
    sealed: Option<(u64, u64, u64)>,
}

#[derive(Clone, Debug)]
struct ModelRange {
    extent: Extent,
    active: bool,
    segments: Vec<u64>,
    expired_records: u64,
}

#[derive(Clone, Debug)]
struct ModelTopic {
    name: String,
    next_range_id: u32,
    ranges: BTreeMap<u32, ModelRange>,
    generations: BTreeMap<String, u64>,
}

#[derive(Clone, Debug)]
struct Model {
    now_ms: u64,
    next_topic_id: u64,
    next_segment_id: u64,
    topics: BTreeMap<u64, ModelTopic>,
    dead_topic_ids: BTreeSet<u64>,
    segments: BTreeMap<u64, ModelSegment>,
    pending_reclaim: BTreeSet<u64>,
    /// The predicted outcome of the last step: `Err(reason)` for a refusal.
    outcome: Result<(), String>,
    /// The predicted plan of the last retention step.
    plan: Vec<SegmentRef>,
}

type Outcome = Result<(), String>;

fn refuse(reason: &str) -> Outcome {
    Err(reason.to_string())
}

impl Model {
    fn new() -> Model {
        Model {
            now_ms: 1_000,
            next_topic_id: 1,
            next_segment_id: 1,
            topics: BTreeMap::new(),
            dead_topic_ids: BTreeSet::new(),
            segments: BTreeMap::new(),
            pending_reclaim: BTreeSet::new(),
            outcome: Ok(()),
            plan: Vec::new(),
        }
    }

    fn topic_id(&self, name: &str) -> Option<u64> {
        self.topics.iter().find(|(_, topic)| topic.name == name).map(|(id, _)| *id)
    }

    fn open_segment(&mut self, topic_id: u64, range_id: u32, now_ms: u64) -> u64 {
        let segment_id = self.next_segment_id;
        self.next_segment_id += 1;
        let segment = ModelSegment { topic_id, range_id, created_ms: now_ms, sealed: None };
        self.segments.insert(segment_id, segment);
        segment_id
    }

    fn create(&mut self, name: &str, count: u32, now_ms: u64) -> Outcome {
        let valid_name = TOPIC_NAMES.contains(&name);
        if !valid_name {
            return refuse("invalid_topic_name");
        }
        if self.topic_id(name).is_some() {
            return refuse("already_exists");
        }
        if !count.is_power_of_two() || count > limits().max_active_ranges_per_topic {
            return refuse("invalid_range_count");
        }
        let topic_id = self.next_topic_id;
        self.next_topic_id += 1;
        let width = (1u128 << 64) / u128::from(count);
        let mut ranges = BTreeMap::new();
        for index in 0..count {
            let start = (u128::from(index) * width) as u64;
            let end_inclusive = (u128::from(start) + width - 1) as u64;
            let segment_id = self.open_segment(topic_id, index, now_ms);
            let extent = Extent { start, end_inclusive };
            let range =
                ModelRange { extent, active: true, segments: vec![segment_id], expired_records: 0 };
            ranges.insert(index, range);
        }
        let topic = ModelTopic {
            name: name.to_string(),
            next_range_id: count,
            ranges,
            generations: BTreeMap::new(),
        };
        self.topics.insert(topic_id, topic);
        Ok(())
    }

    fn delete(&mut self, name: &str) -> Outcome {
        if name.is_empty() {
            return refuse("invalid_topic_name");
        }
        let Some(topic_id) = self.topic_id(name) else { return refuse("no_such_topic") };
        let topic = self.topics.remove(&topic_id).expect("found");
        for range in topic.ranges.values() {
            for segment_id in &range.segments {
                self.segments.remove(segment_id);
                self.pending_reclaim.insert(*segment_id);
            }
        }
        self.dead_topic_ids.insert(topic_id);
        Ok(())
    }

    /// The range, refused unless it exists and is active.
    fn active_range(&self, topic_id: u64, range_id: u32) -> Result<&ModelRange, String> {
        let topic = self.topics.get(&topic_id).ok_or("no_such_topic")?;
        let range = topic.ranges.get(&range_id).ok_or("no_such_range")?;
        if range.active { Ok(range) } else { Err("range_sealed".to_string()) }
    }

    fn fence(&self, range: &ModelRange, seal: Option<&SealReport>) -> Outcome {
        let seal = seal.ok_or("unfenced")?;
        let retained = range.segments.contains(&seal.segment_id);
        if let Some((end, bytes, _)) =
            self.segments.get(&seal.segment_id).and_then(|s| s.sealed).filter(|_| retained)
        {
            let same = (end, bytes) == (seal.end_offset, seal.data_bytes);
            return refuse(if same { "segment_already_sealed" } else { "seal_conflict" });
        }
        if Some(&seal.segment_id) != range.segments.last() {
            return refuse("seal_mismatch");
        }
        Ok(())
    }

    fn seal(&mut self, seal: &SealReport, now_ms: u64) {
        let segment = self.segments.get_mut(&seal.segment_id).expect("fenced segment");
        assert!(segment.sealed.is_none());
        segment.sealed = Some((seal.end_offset, seal.data_bytes, now_ms));
    }

    fn split(&mut self, split: &SplitRange) -> Outcome {
        let range = self.active_range(split.topic_id, split.range_id)?;
        let extent = range.extent;
        if extent.start == extent.end_inclusive {
            return refuse("range_too_small");
        }
        let topic = &self.topics[&split.topic_id];
        let active = topic.ranges.values().filter(|range| range.active).count() as u32;
        if active >= limits().max_active_ranges_per_topic {
            return refuse("too_many_ranges");
        }
        if topic.next_range_id + 2 > limits().max_ranges_per_topic {
            return refuse("range_history_full");
        }
        self.fence(range, split.seal.as_ref())?;
        let low_id = topic.next_range_id;
        let seal = split.seal.expect("fenced");
        self.seal(&seal, split.now_ms);
        // Width is an even power of two here, so half of it is (width - 1) / 2 + 1.
        let half = ((extent.end_inclusive - extent.start) >> 1) + 1;
        let halves = [
            Extent { start: extent.start, end_inclusive: extent.start + half - 1 },
            Extent { start: extent.start + half, end_inclusive: extent.end_inclusive },
        ];
        self.replace_ranges(split.topic_id, &[split.range_id], &halves, low_id, split.now_ms);
        Ok(())
    }

    /// Seals `parents` and opens children with the given extents and consecutive ids.
    fn replace_ranges(
        &mut self,
        topic_id: u64,
        parents: &[u32],
        extents: &[Extent],
        first_id: u32,
        now_ms: u64,
    ) {
        for (index, extent) in extents.iter().enumerate() {
            let range_id = first_id + index as u32;
            let segment_id = self.open_segment(topic_id, range_id, now_ms);
            let range = ModelRange {
                extent: *extent,
                active: true,
                segments: vec![segment_id],
                expired_records: 0,
            };
            self.topics.get_mut(&topic_id).expect("live").ranges.insert(range_id, range);
        }
        let topic = self.topics.get_mut(&topic_id).expect("live");
        topic.next_range_id = first_id + extents.len() as u32;
        for parent in parents {
            topic.ranges.get_mut(parent).expect("validated").active = false;
        }
    }

    fn merge(&mut self, merge: &MergeRanges) -> Outcome {
        let [first_id, second_id] = merge.range_ids;
        if !self.topics.contains_key(&merge.topic_id) {
            return refuse("no_such_topic");
        }
        if first_id == second_id {
            return refuse("not_buddies");
        }
        let first = self.active_range(merge.topic_id, first_id)?;
        let second = self.active_range(merge.topic_id, second_id)?;
        let (low, high) = if first.extent.start < second.extent.start {
            (first, second)
        } else {
            (second, first)
        };
        let width = u128::from(low.extent.end_inclusive - low.extent.start) + 1;
        let same_width = u128::from(high.extent.end_inclusive - high.extent.start) + 1 == width;
        let adjacent = u128::from(low.extent.end_inclusive) + 1 == u128::from(high.extent.start);
        let aligned = u128::from(low.extent.start) % (2 * width) == 0;
        if !(same_width && adjacent && aligned) {
            return refuse("not_buddies");
        }
        let merged = Extent { start: low.extent.start, end_inclusive: high.extent.end_inclusive };
        if self.topics[&merge.topic_id].next_range_id + 1 > limits().max_ranges_per_topic {
            return refuse("range_history_full");
        }
        self.fence(first, merge.seals[0].as_ref())?;
        self.fence(second, merge.seals[1].as_ref())?;
        for seal in merge.seals.iter().flatten() {
            self.seal(seal, merge.now_ms);
        }
        let merged_id = self.topics[&merge.topic_id].next_range_id;
        self.replace_ranges(merge.topic_id, &merge.range_ids, &[merged], merged_id, merge.now_ms);
        Ok(())
    }

    fn roll(&mut self, roll: &RollSegment) -> Outcome {
        let range = self.active_range(roll.topic_id, roll.range_id)?;
        if range.segments.len() >= limits().max_segments_per_range as usize {
            return refuse("too_many_segments");
        }
        self.fence(range, Some(&roll.seal))?;
        self.seal(&roll.seal, roll.now_ms);
        let segment_id = self.open_segment(roll.topic_id, roll.range_id, roll.now_ms);
        let topic = self.topics.get_mut(&roll.topic_id).expect("live");
        topic.ranges.get_mut(&roll.range_id).expect("live").segments.push(segment_id);
        Ok(())
    }

    fn commit(&mut self, commit: &CommitPositions) -> Outcome {
        let topic = self.topics.get(&commit.topic_id).ok_or("no_such_topic")?;
        if commit.group.is_empty() {
            return refuse("invalid_group");
        }
        for (range_id, position) in &commit.positions {
            let range = topic.ranges.get(range_id).ok_or("no_such_range")?;
            let valid = match position {
                GroupPosition::Finished => !range.active,
                GroupPosition::At(at) => match self.segments.get(&at.segment_id) {
                    Some(segment) => {
                        let owned =
                            (segment.topic_id, segment.range_id) == (commit.topic_id, *range_id);
                        owned && segment.sealed.is_none_or(|(end, _, _)| at.offset <= end)
                    }
                    None => {
                        let first = range.segments.first().copied().unwrap_or(self.next_segment_id);
                        at.segment_id >= 1 && at.segment_id < first
                    }
                },
            };
            if !valid {
                return refuse("invalid_cursor");
            }
        }
        let topic = self.topics.get_mut(&commit.topic_id).expect("live");
        *topic.generations.entry(commit.group.clone()).or_insert(0) += 1;
        Ok(())
    }

    fn expire(&mut self, refs: &[SegmentRef]) -> Outcome {
        let mut turns: BTreeMap<(u64, u32), usize> = BTreeMap::new();
        let mut expiring = Vec::new();
        for item in refs {
            let Some(topic) = self.topics.get(&item.topic_id) else { continue };
            let range = topic.ranges.get(&item.range_id).ok_or("no_such_range")?;
            let Some(segment) = self.segments.get(&item.segment_id) else { continue };
            if (segment.topic_id, segment.range_id) != (item.topic_id, item.range_id) {
                return refuse("segment_range_mismatch");
            }
            if segment.sealed.is_none() {
                return refuse("segment_active");
            }
            let turn = turns.entry((item.topic_id, item.range_id)).or_insert(0);
            if range.segments.get(*turn) != Some(&item.segment_id) {
                return refuse("segment_not_oldest");
            }
            *turn += 1;
            expiring.push(*item);
        }
        for item in expiring {
            let segment = self.segments.remove(&item.segment_id).expect("validated");
            let topic = self.topics.get_mut(&item.topic_id).expect("live");
            let range = topic.ranges.get_mut(&item.range_id).expect("live");
            assert_eq!(range.segments.remove(0), item.segment_id);
            range.expired_records += segment.sealed.expect("sealed").0;
            self.pending_reclaim.insert(item.segment_id);
        }
        Ok(())
    }

    /// The model's own retention plan: per topic id, per range id, the expired prefix.
    fn retention_plan(&self, now_ms: u64, defaults: &RetentionDefaults) -> Vec<SegmentRef> {
        let mut plan = Vec::new();
        if defaults.max_age_ms.is_none() && defaults.max_bytes.is_none() {
            return plan;
        }
        for (topic_id, topic) in &self.topics {
            for (range_id, range) in &topic.ranges {
                let sealed = |id: &u64| self.segments[id].sealed;
                let mut total: u128 =
                    range.segments.iter().filter_map(sealed).map(|s| u128::from(s.1)).sum();
                for segment_id in &range.segments {
                    let Some((_, bytes, sealed_ms)) = sealed(segment_id) else { break };
                    let old = defaults
                        .max_age_ms
                        .is_some_and(|age| now_ms.saturating_sub(sealed_ms) > age);
                    let big = defaults.max_bytes.is_some_and(|max| total > u128::from(max));
                    if !(old || big) {
                        break;
                    }
                    plan.push(SegmentRef {
                        topic_id: *topic_id,
                        range_id: *range_id,
                        segment_id: *segment_id,
                    });
                    total -= u128::from(bytes);
                }
            }
        }
        plan
    }

    /// A member's heartbeat (which creates its group, commit generation 0) or leave. Which
    /// ranges it is told is the membership machine's business (its own properties); here the
    /// whole-state check runs over memberships on every reshaped, expiring topic.
    fn member_call(&mut self, topic_id: u64, group: &str, member: &str, creates: bool) -> Outcome {
        let topic = self.topics.get_mut(&topic_id).ok_or("no_such_topic")?;
        if group.is_empty() || member.is_empty() {
            return refuse("invalid_group");
        }
        if creates {
            topic.generations.entry(group.to_string()).or_insert(0);
        }
        Ok(())
    }

    fn apply_command(&mut self, command: &MetaCommand) -> Outcome {
        match command {
            MetaCommand::CreateTopic(create) => {
                self.create(&create.name, create.initial_ranges.unwrap_or(1), create.now_ms)
            }
            MetaCommand::DeleteTopic { name } => self.delete(name),
            MetaCommand::SplitRange(split) => self.split(split),
            MetaCommand::MergeRanges(merge) => self.merge(merge),
            MetaCommand::RollSegment(roll) => self.roll(roll),
            MetaCommand::CommitPositions(commit) => self.commit(commit),
            MetaCommand::GroupHeartbeat(beat) => {
                self.member_call(beat.topic_id, &beat.group, &beat.member, true)
            }
            MetaCommand::LeaveGroupMember { topic_id, group, member, .. } => {
                self.member_call(*topic_id, group, member, false)
            }
            MetaCommand::ExpireSegments { segments } => self.expire(segments),
            MetaCommand::ReclaimDone { segment_ids, node_id: None } => {
                segment_ids.iter().for_each(|id| {
                    self.pending_reclaim.remove(id);
                });
                Ok(())
            }
            other => panic!("the model does not generate {other:?}"),
        }
    }
}

/// What a seal report in a generated command names.
#[derive(Clone, Copy, Debug)]
enum SealChoice {
    /// The range's active segment: the only acceptable report.
    Active,
    Missing,
    /// A segment id nobody holds.
    Unknown,
    /// The range's newest sealed segment at its recorded length (a replay).
    Replay,
    /// The range's newest sealed segment at another length (a conflict).
    Conflict,
}

fn seal_choice() -> impl Strategy<Value = SealChoice> {
    prop_oneof![
        6 => Just(SealChoice::Active),
        1 => Just(SealChoice::Missing),
        1 => Just(SealChoice::Unknown),
        1 => Just(SealChoice::Replay),
        1 => Just(SealChoice::Conflict),
    ]
}

/// A (topic, range) a command may name, with what its seal reports need.
#[derive(Clone, Debug)]
struct RangePick {
    topic_id: u64,
    range_id: u32,
    active_segment: Option<u64>,
    newest_sealed: Option<(u64, u64, u64)>,
    /// Retained segments with their sealed end (None while active).
    segments: Vec<(u64, Option<u64>)>,
}

impl RangePick {
    fn seal(&self, choice: SealChoice, end_offset: u64) -> Option<SealReport> {
        let report = |segment_id, end_offset: u64| SealReport {
            segment_id,
            end_offset,
            data_bytes: end_offset * 10,
        };
        match (choice, self.newest_sealed) {
            (SealChoice::Missing, _) => None,
            (SealChoice::Replay, Some((segment_id, end, bytes))) => {
                Some(SealReport { segment_id, end_offset: end, data_bytes: bytes })
            }
            (SealChoice::Conflict, Some((segment_id, end, _))) => Some(report(segment_id, end + 1)),
            (SealChoice::Active, _) => {
                Some(report(self.active_segment.unwrap_or(BOGUS_ID), end_offset))
            }
            _ => Some(report(BOGUS_ID, end_offset)),
        }
    }
}

fn range_picks(model: &Model) -> Vec<RangePick> {
    let mut picks = Vec::new();
    for (topic_id, topic) in &model.topics {
        for (range_id, range) in &topic.ranges {
            let sealed_of =
                |id: &u64| model.segments[id].sealed.map(|(end, bytes, _)| (*id, end, bytes));
            picks.push(RangePick {
                topic_id: *topic_id,
                range_id: *range_id,
                active_segment: range.segments.last().copied().filter(|_| range.active),
                newest_sealed: range.segments.iter().rev().find_map(sealed_of),
                segments: range
                    .segments
                    .iter()
                    .map(|id| (*id, sealed_of(id).map(|s| s.1)))
                    .collect(),
            });
        }
    }
    let stale_topic = model.dead_topic_ids.iter().next().copied().unwrap_or(BOGUS_ID);
    let bogus = RangePick {
        topic_id: stale_topic,
        range_id: 0,
        active_segment: None,
        newest_sealed: None,
        segments: vec![],
    };
    picks.push(bogus);
    picks
}

/// Pairs of ranges to merge: every active range with its buddy's extent holder, plus any two.
fn merge_pairs(model: &Model, picks: &[RangePick]) -> Vec<(RangePick, RangePick)> {
    let mut pairs = Vec::new();
    for first in picks {
        for second in picks {
            if first.topic_id != second.topic_id {
                continue;
            }
            let topic = model.topics.get(&first.topic_id);
            let extent = |pick: &RangePick| topic.map(|t| t.ranges[&pick.range_id].extent);
            let buddies = extent(first).and_then(|e| e.buddy()) == extent(second);
            if buddies || (first.range_id + second.range_id) % 5 == 0 {
                pairs.push((first.clone(), second.clone()));
            }
        }
    }
    pairs.push((picks[0].clone(), picks[picks.len() - 1].clone()));
    pairs
}

fn create_step(now_ms: u64) -> BoxedStrategy<Step> {
    let names = select(vec!["a", "b", "c", ""]);
    let counts = select(vec![1u32, 1, 2, 4, 3, 8]);
    (names, counts)
        .prop_map(move |(name, count)| {
            Step::Command(MetaCommand::CreateTopic(CreateTopic {
                name: name.to_string(),
                now_ms,
                initial_ranges: Some(count),
                segment_roll: SegmentRoll::default(),
                replicas: vec![1],
                creator: None,
                quota: Quota::default(),
            }))
        })
        .boxed()
}

fn range_steps(model: &Model) -> BoxedStrategy<Step> {
    let now_ms = model.now_ms;
    let picks = range_picks(model);
    let pairs = merge_pairs(model, &picks);
    let split =
        (select(picks.clone()), seal_choice(), 0u64..50).prop_map(move |(pick, choice, end)| {
            Step::Command(MetaCommand::SplitRange(SplitRange {
                topic_id: pick.topic_id,
                range_id: pick.range_id,
                seal: pick.seal(choice, end),
                now_ms,
                child_replicas: [vec![1], vec![2]],
                quota: Quota::default(),
            }))
        });
    let roll =
        (select(picks.clone()), seal_choice(), 0u64..50).prop_map(move |(pick, choice, end)| {
            let seal = pick.seal(choice, end).unwrap_or(SealReport {
                segment_id: BOGUS_ID,
                end_offset: 0,
                data_bytes: 0,
            });
            Step::Command(MetaCommand::RollSegment(RollSegment {
                topic_id: pick.topic_id,
                range_id: pick.range_id,
                seal,
                now_ms,
                replicas: vec![1],
            }))
        });
    let merge = (select(pairs), seal_choice(), seal_choice(), 0u64..50).prop_map(
        move |((first, second), a, b, end)| {
            Step::Command(MetaCommand::MergeRanges(MergeRanges {
                topic_id: first.topic_id,
                range_ids: [first.range_id, second.range_id],
                seals: [first.seal(a, end), second.seal(b, end + 1)],
                now_ms,
                replicas: vec![1],
            }))
        },
    );
    prop_oneof![3 => split, 5 => roll, 3 => merge].boxed()
}

fn position_steps(model: &Model) -> BoxedStrategy<Step> {
    let now_ms = model.now_ms;
    let picks = range_picks(model);
    let picks_for_members = picks.clone();
    let commit = (
        select(picks.clone()),
        any::<prop::sample::Index>(),
        0u64..3,
        any::<bool>(),
        select(vec!["g", "h", ""]),
    );
    let commit = commit.prop_map(move |(pick, index, slack, finished, group)| {
        let position = match pick.segments.get(index.index(pick.segments.len().max(1))) {
            _ if finished => GroupPosition::Finished,
            Some((segment_id, end)) => GroupPosition::At(Position {
                segment_id: *segment_id,
                offset: (end.unwrap_or(5) + slack).saturating_sub(1),
            }),
            None => GroupPosition::At(Position { segment_id: 1, offset: slack }),
        };
        Step::Command(MetaCommand::CommitPositions(CommitPositions {
            topic_id: pick.topic_id,
            group: group.to_string(),
            positions: [(pick.range_id, position)].into_iter().collect(),
            expected_generation: None,
            now_ms,
            member: None,
        }))
    });
    let expire = (select(picks), any::<prop::sample::Index>()).prop_map(|(pick, index)| {
        let segments = match pick.segments.get(index.index(pick.segments.len().max(1))) {
            Some((segment_id, _)) => vec![SegmentRef {
                topic_id: pick.topic_id,
                range_id: pick.range_id,
                segment_id: *segment_id,
            }],
            None => vec![],
        };
        Step::Command(MetaCommand::ExpireSegments { segments })
    });
    let member = (
        select(picks_for_members.clone()),
        select(vec!["g", "h", ""]),
        select(vec!["m1", "m2", "m3", ""]),
        proptest::option::of(0u64..4),
        any::<bool>(),
    );
    let member = member.prop_map(move |(pick, group, member, applied, leaves)| {
        let (topic_id, group, member) = (pick.topic_id, group.to_string(), member.to_string());
        Step::Command(if leaves {
            MetaCommand::LeaveGroupMember {
                topic_id,
                group,
                member,
                now_ms,
                session_ms: MEMBER_SESSION_MS,
            }
        } else {
            MetaCommand::GroupHeartbeat(GroupHeartbeat {
                topic_id,
                group,
                member,
                applied,
                now_ms,
                session_ms: MEMBER_SESSION_MS,
            })
        })
    });
    prop_oneof![3 => commit, 1 => expire, 2 => member].boxed()
}

/// Short, so that members time out within a run (the clock moves 7 ms a step).
const MEMBER_SESSION_MS: u64 = 50;

fn housekeeping_steps(model: &Model) -> BoxedStrategy<Step> {
    let now_ms = model.now_ms;
    let names = select(vec!["a", "b", "c", ""]);
    let delete =
        names.prop_map(|name| Step::Command(MetaCommand::DeleteTopic { name: name.to_string() }));
    let pending: Vec<u64> = model.pending_reclaim.iter().copied().chain([BOGUS_ID]).collect();
    let reclaim =
        proptest::sample::subsequence(pending.clone(), 0..=pending.len()).prop_map(|segment_ids| {
            Step::Command(MetaCommand::ReclaimDone { segment_ids, node_id: None })
        });
    let retention = (0u64..300, optional_limit(), optional_limit()).prop_map(
        move |(later_ms, max_age_ms, max_bytes)| {
            let defaults =
                RetentionDefaults { max_age_ms, max_bytes, unresolved_policy_max_age_ms: None };
            Step::Retention { now_ms: now_ms + later_ms, defaults }
        },
    );
    prop_oneof![1 => delete, 1 => reclaim, 2 => retention].boxed()
}

fn optional_limit() -> impl Strategy<Value = Option<u64>> {
    prop_oneof![Just(None), (0u64..400).prop_map(Some)]
}

struct MetaMachine;

impl ReferenceStateMachine for MetaMachine {
    type State = Model;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<Model> {
        Just(Model::new()).boxed()
    }

    fn transitions(model: &Model) -> BoxedStrategy<Step> {
        let create_weight = if model.topics.is_empty() { 12 } else { 2 };
        prop_oneof![
            create_weight => create_step(model.now_ms),
            6 => range_steps(model),
            3 => position_steps(model),
            2 => housekeeping_steps(model),
        ]
        .boxed()
    }

    fn apply(mut model: Model, step: &Step) -> Model {
        model.now_ms += 7;
        match step {
            Step::Command(command) => {
                model.outcome = model.apply_command(command);
                model.plan = Vec::new();
            }
            Step::Retention { now_ms, defaults } => {
                model.now_ms = model.now_ms.max(*now_ms);
                model.plan = model.retention_plan(*now_ms, defaults);
                let plan = model.plan.clone();
                model.outcome = model.expire(&plan);
                assert_eq!(model.outcome, Ok(()), "a fresh plan always applies");
            }
        }
        model
    }
}

/// The machine under test, with the history the invariants need.
struct Harness {
    state: MetaState,
    /// Every command given to the machine, accepted or not, in order.
    log: Vec<MetaCommand>,
    /// Every sealed length ever observed, by segment id.
    sealed_seen: BTreeMap<u64, (u64, u64)>,
    /// Every topic id ever observed, with its name.
    topic_ids_seen: BTreeMap<u64, String>,
}

impl StateMachineTest for MetaMachine {
    type SystemUnderTest = Harness;
    type Reference = MetaMachine;

    fn init_test(_model: &Model) -> Harness {
        let state = MetaState::new(limits());
        Harness {
            state,
            log: Vec::new(),
            sealed_seen: BTreeMap::new(),
            topic_ids_seen: BTreeMap::new(),
        }
    }

    fn apply(mut harness: Harness, model: &Model, step: Step) -> Harness {
        let command = match step {
            Step::Command(command) => command,
            Step::Retention { now_ms, defaults } => {
                let plan = harness.state.retention_plan(now_ms, &Default::default(), &defaults);
                assert_eq!(plan, model.plan, "retention plans differ");
                MetaCommand::ExpireSegments { segments: plan }
            }
        };
        harness.log.push(command.clone());
        let hash_before = harness.state.state_hash();
        let result = harness.state.apply(command.clone());
        let outcome = result.as_ref().map(|_| ()).map_err(|error| error.reason_text());
        assert_eq!(outcome, model.outcome, "{command:?}");
        if outcome.is_err() {
            assert_eq!(harness.state.state_hash(), hash_before, "a refusal changed the state");
        }
        if let Ok(MetaResponse::TopicCreated { topic_id, .. }) = &result {
            let newest = harness.topic_ids_seen.keys().next_back().copied().unwrap_or(0);
            assert!(*topic_id > newest, "topic id {topic_id} reused or out of order");
        }
        record_history(&mut harness);
        harness
    }

    fn check_invariants(harness: &Harness, model: &Model) {
        let state = &harness.state;
        state.check_invariants().expect("the machine's own invariant check");
        check_tiling_and_segments(state, model);
        assert_eq!(project_machine(state), project_model(model), "machine and model differ");
        let mut replayed = MetaState::new(limits());
        for command in &harness.log {
            let _ = replayed.apply(command.clone());
        }
        assert_eq!(replayed.state_hash(), state.state_hash(), "replay diverged");
        let json = serde_json::to_string(state).expect("serializes");
        let restored: MetaState = serde_json::from_str(&json).expect("deserializes");
        assert_eq!(restored.state_hash(), state.state_hash(), "serde round trip changed the hash");
    }

    fn teardown(harness: Harness) {
        assert!(harness.state.version() <= harness.log.len() as u64);
    }
}

/// Tiling and segment ownership, checked from the public API only.
fn check_tiling_and_segments(state: &MetaState, model: &Model) {
    for topic in state.topics() {
        let mut next: Option<u64> = Some(0);
        for range in topic.active_ranges() {
            assert_eq!(Some(range.extent.start), next, "{}: gap or overlap", topic.name);
            next = range.extent.end_inclusive.checked_add(1);
        }
        assert_eq!(next, None, "{}: active ranges stop short of 2^64", topic.name);
        for range in topic.ranges.values() {
            let segments = state.range_segments(topic.topic_id, range.range_id);
            let active = segments.iter().filter(|segment| segment.is_active()).count();
            assert_eq!(
                active,
                usize::from(range.is_active()),
                "{} range {}",
                topic.name,
                range.range_id
            );
        }
    }
    for segment_id in 1..model.next_segment_id + 1 {
        let Some(segment) = state.segment(segment_id) else { continue };
        let topic = state.topic(segment.topic_id).expect("a segment of a dead topic");
        let range = topic.ranges.get(&segment.range_id).expect("a segment of an unknown range");
        assert!(
            range.segment_ids.contains(&segment_id),
            "segment {segment_id} is not listed by its range"
        );
    }
}

/// Sealed lengths never change and topic ids are never reused: compares the state with
/// everything observed after earlier steps, then records what is new.
fn record_history(harness: &mut Harness) {
    let state = &harness.state;
    for topic in state.topics() {
        match harness.topic_ids_seen.get(&topic.topic_id) {
            Some(name) => assert_eq!(*name, topic.name, "topic id {} reused", topic.topic_id),
            None => {
                let newest = harness.topic_ids_seen.keys().next_back().copied().unwrap_or(0);
                assert!(topic.topic_id > newest, "topic id {} handed out late", topic.topic_id);
                harness.topic_ids_seen.insert(topic.topic_id, topic.name.clone());
            }
        }
        for range in topic.ranges.values() {
            for segment in state.range_segments(topic.topic_id, range.range_id) {
                let Some(length) = segment.sealed_length() else { continue };
                let seen = harness.sealed_seen.entry(segment.segment_id).or_insert(length);
                assert_eq!(
                    *seen, length,
                    "segment {} changed its sealed length",
                    segment.segment_id
                );
            }
        }
    }
}

/// Per topic id: name, and per range id: extent, active, (segment id, sealed length), expired
/// records; plus group generations.
type Projection = BTreeMap<u64, (String, Vec<RangeProjection>, BTreeMap<String, u64>)>;
type RangeProjection = (u32, Extent, bool, Vec<SegmentProjection>, u64);
/// Segment id, created_ms, and `(end_offset, data_bytes, sealed_ms)` once sealed.
type SegmentProjection = (u64, u64, Option<(u64, u64, u64)>);

fn sealed(segment: &crate::model::Segment) -> Option<(u64, u64, u64)> {
    match segment.state {
        SegmentState::Active => None,
        SegmentState::Sealed { end_offset, data_bytes, sealed_ms } => {
            Some((end_offset, data_bytes, sealed_ms))
        }
    }
}

fn project_machine(state: &MetaState) -> (Projection, BTreeSet<u64>) {
    let mut projection = Projection::new();
    for topic in state.topics() {
        let ranges = topic
            .ranges
            .values()
            .map(|range| {
                let segments = state.range_segments(topic.topic_id, range.range_id);
                let segments =
                    segments.iter().map(|s| (s.segment_id, s.created_ms, sealed(s))).collect();
                (range.range_id, range.extent, range.is_active(), segments, range.expired_records)
            })
            .collect();
        let generations =
            topic.groups.iter().map(|(name, group)| (name.clone(), group.generation)).collect();
        projection.insert(topic.topic_id, (topic.name.clone(), ranges, generations));
    }
    (projection, state.pending_reclaim().keys().copied().collect())
}

fn project_model(model: &Model) -> (Projection, BTreeSet<u64>) {
    let mut projection = Projection::new();
    for (topic_id, topic) in &model.topics {
        let ranges = topic
            .ranges
            .iter()
            .map(|(range_id, range)| {
                let segment =
                    |id: &u64| (*id, model.segments[id].created_ms, model.segments[id].sealed);
                let segments = range.segments.iter().map(segment).collect();
                (*range_id, range.extent, range.active, segments, range.expired_records)
            })
            .collect();
        projection.insert(*topic_id, (topic.name.clone(), ranges, topic.generations.clone()));
    }
    (projection, model.pending_reclaim.clone())
}

prop_state_machine! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn metadata_machine_matches_its_model(sequential 1..60 => MetaMachine);
}
