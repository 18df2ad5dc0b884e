//! Tables for split and merge, and every refusal of the seal-first fence.

use crate::command::{MergeRanges, MetaCommand, MetaResponse, SplitRange};
use crate::keyspace::Extent;
use crate::limits::MetaLimits;
use crate::limits::Quota;
use crate::model::{RangeState, SealReport, SegmentState};
use crate::state::MetaState;
use crate::testkit::{NOW_MS, apply_ok, assert_refused, create, roll, seal_of, split, with_topic};

fn merge(state: &MetaState, topic_id: u64, range_ids: [u32; 2]) -> MetaCommand {
    MetaCommand::MergeRanges(MergeRanges {
        topic_id,
        range_ids,
        seals: range_ids.map(|range_id| Some(seal_of(state, topic_id, range_id, 7))),
        now_ms: NOW_MS + 20,
        replicas: vec![1],
    })
}

#[test]
fn split_seals_the_parent_and_opens_two_children() {
    let (mut state, topic_id) = with_topic("orders", None);
    let command = split(&state, topic_id, 0, 42);
    let response = apply_ok(&mut state, command);
    assert_eq!(
        response,
        MetaResponse::RangeSplit {
            sealed_segment_id: 1,
            children: [1, 2],
            child_segment_ids: [2, 3]
        }
    );
    let topic = state.topic(topic_id).expect("topic");
    let parent = &topic.ranges[&0];
    assert_eq!(parent.state, RangeState::Sealed { sealed_ms: NOW_MS + 10 });
    assert_eq!(parent.children, vec![1, 2]);
    let sealed = state.segment(1).expect("parent segment is retained");
    assert_eq!(
        sealed.state,
        SegmentState::Sealed { end_offset: 42, data_bytes: 4200, sealed_ms: NOW_MS + 10 }
    );
    let [low, high] = Extent::FULL.halves().expect("splits");
    let cases = [(1u32, low, 2u64, vec![1u64]), (2, high, 3, vec![2])];
    for (range_id, extent, segment_id, replicas) in cases {
        let child = &topic.ranges[&range_id];
        assert_eq!((child.extent, child.parents.clone()), (extent, vec![0]));
        assert_eq!(child.segment_ids, vec![segment_id]);
        assert_eq!(state.segment(segment_id).expect("child segment").replicas, replicas);
        assert_eq!(topic.route(extent.start).range_id, range_id);
        assert_eq!(topic.route(extent.end_inclusive).range_id, range_id);
    }
}

#[test]
fn merge_of_buddies_reopens_their_block() {
    let (mut state, topic_id) = with_topic("orders", Some(4));
    let command = merge(&state, topic_id, [3, 2]);
    let response = apply_ok(&mut state, command);
    assert_eq!(
        response,
        MetaResponse::RangesMerged { sealed_segment_ids: [4, 3], range_id: 4, segment_id: 5 }
    );
    let topic = state.topic(topic_id).expect("topic");
    let merged = &topic.ranges[&4];
    assert_eq!(merged.parents, vec![2, 3], "parents in keyspace order");
    assert_eq!(merged.extent, Extent::new(1 << 63, u64::MAX).expect("block"));
    for parent_id in [2, 3] {
        assert_eq!(topic.ranges[&parent_id].children, vec![4]);
        assert!(!topic.ranges[&parent_id].is_active());
    }
    assert_eq!(topic.active_range_count(), 3);
    assert_eq!(state.segment(3).and_then(|s| s.sealed_length()), Some((7, 700)));
}

#[test]
fn split_then_merge_round_trips_the_extent() {
    let (mut state, topic_id) = with_topic("orders", None);
    let command = split(&state, topic_id, 0, 1);
    apply_ok(&mut state, command);
    let command = merge(&state, topic_id, [1, 2]);
    apply_ok(&mut state, command);
    let topic = state.topic(topic_id).expect("topic");
    let active: Vec<_> =
        topic.active_ranges().map(|range| (range.range_id, range.extent)).collect();
    assert_eq!(active, vec![(3, Extent::FULL)]);
}

#[test]
fn split_refusals() {
    let (mut state, topic_id) = with_topic("orders", Some(2));
    let command = roll(&state, topic_id, 1, 5, NOW_MS);
    apply_ok(&mut state, command);
    let base = SplitRange {
        topic_id,
        range_id: 0,
        seal: Some(seal_of(&state, topic_id, 0, 3)),
        now_ms: NOW_MS,
        child_replicas: [vec![1], vec![2]],
        quota: Quota::default(),
    };
    let with = |change: &dyn Fn(&mut SplitRange)| {
        let mut command = base.clone();
        change(&mut command);
        MetaCommand::SplitRange(command)
    };
    let active_of_1 = seal_of(&state, topic_id, 1, 0).segment_id;
    let cases: Vec<(MetaCommand, &str)> = vec![
        (with(&|c| c.topic_id = 99), "no_such_topic"),
        (with(&|c| c.range_id = 7), "no_such_range"),
        (with(&|c| c.seal = None), "unfenced"),
        (
            with(&|c| {
                c.seal = Some(SealReport { segment_id: active_of_1, end_offset: 3, data_bytes: 1 })
            }),
            "seal_mismatch",
        ),
        (
            with(&|c| c.seal = Some(SealReport { segment_id: 999, end_offset: 3, data_bytes: 1 })),
            "seal_mismatch",
        ),
        (
            with(&|c| c.seal = Some(SealReport { segment_id: 2, end_offset: 5, data_bytes: 500 })),
            "seal_mismatch",
        ),
        (with(&|c| c.child_replicas = [vec![], vec![2]]), "invalid_replicas"),
        (with(&|c| c.child_replicas = [vec![1], vec![2, 2]]), "invalid_replicas"),
    ];
    for (command, reason) in cases {
        assert_refused(&mut state, command, reason);
    }
}

#[test]
fn a_second_seal_of_a_sealed_segment_is_refused() {
    let (mut state, topic_id) = with_topic("orders", None);
    let first_seal = seal_of(&state, topic_id, 0, 10);
    let command = roll(&state, topic_id, 0, 10, NOW_MS);
    apply_ok(&mut state, command);
    let split_with = |seal: SealReport| {
        MetaCommand::SplitRange(SplitRange {
            topic_id,
            range_id: 0,
            seal: Some(seal),
            now_ms: NOW_MS,
            child_replicas: [vec![1], vec![1]],
            quota: Quota::default(),
        })
    };
    assert_refused(&mut state, split_with(first_seal), "segment_already_sealed");
    let longer = SealReport { end_offset: 11, ..first_seal };
    assert_refused(&mut state, split_with(longer), "seal_conflict");
    let fatter = SealReport { data_bytes: first_seal.data_bytes + 1, ..first_seal };
    assert_refused(&mut state, split_with(fatter), "seal_conflict");
    assert_eq!(
        state.segment(first_seal.segment_id).and_then(|s| s.sealed_length()),
        Some((10, 1000))
    );
}

#[test]
fn a_sealed_range_cannot_split_or_merge_again() {
    let (mut state, topic_id) = with_topic("orders", None);
    let stale = split(&state, topic_id, 0, 1);
    apply_ok(&mut state, stale.clone());
    assert_refused(&mut state, stale, "range_sealed");
    let mut stale_merge = merge(&state, topic_id, [1, 2]);
    if let MetaCommand::MergeRanges(command) = &mut stale_merge {
        command.range_ids = [0, 1];
    }
    assert_refused(&mut state, stale_merge, "range_sealed");
}

#[test]
fn a_width_one_range_cannot_split() {
    let (mut state, topic_id) = with_topic("orders", None);
    let mut range_id = 0;
    for _ in 0..64 {
        let command = split(&state, topic_id, range_id, 0);
        let MetaResponse::RangeSplit { children, .. } = apply_ok(&mut state, command) else {
            panic!("not a split answer");
        };
        range_id = children[0];
    }
    let range = &state.topic(topic_id).expect("topic").ranges[&range_id];
    assert_eq!((range.extent.start, range.extent.width()), (0, 1));
    let command = split(&state, topic_id, range_id, 0);
    assert_refused(&mut state, command, "range_too_small");
    assert_eq!(state.topic(topic_id).expect("topic").active_range_count(), 65);
}

#[test]
fn split_respects_range_limits() {
    let limits = MetaLimits { max_active_ranges_per_topic: 2, ..MetaLimits::default() };
    let mut state = MetaState::new(limits);
    apply_ok(&mut state, create("t", Some(2)));
    let command = split(&state, 1, 0, 0);
    assert_refused(&mut state, command, "too_many_ranges");

    let limits = MetaLimits { max_ranges_per_topic: 4, ..MetaLimits::default() };
    let mut state = MetaState::new(limits);
    apply_ok(&mut state, create("t", Some(2)));
    let command = split(&state, 1, 0, 0);
    apply_ok(&mut state, command);
    let command = split(&state, 1, 1, 0);
    assert_refused(&mut state, command, "range_history_full");
    let command = merge(&state, 1, [2, 3]);
    assert_refused(&mut state, command, "range_history_full");
}

#[test]
fn merge_refusals() {
    let (mut state, topic_id) = with_topic("orders", Some(4));
    let base = match merge(&state, topic_id, [0, 1]) {
        MetaCommand::MergeRanges(command) => command,
        _ => unreachable!(),
    };
    let with = |change: &dyn Fn(&mut MergeRanges)| {
        let mut command = base.clone();
        change(&mut command);
        MetaCommand::MergeRanges(command)
    };
    let seal_of_2 = seal_of(&state, topic_id, 2, 7);
    let cases: Vec<(MetaCommand, &str)> = vec![
        (with(&|c| c.topic_id = 99), "no_such_topic"),
        (with(&|c| c.range_ids = [0, 9]), "no_such_range"),
        (with(&|c| c.range_ids = [1, 1]), "not_buddies"),
        (with(&|c| c.range_ids = [1, 2]), "not_buddies"),
        (with(&|c| c.range_ids = [0, 3]), "not_buddies"),
        (with(&|c| c.seals[1] = None), "unfenced"),
        (with(&|c| c.seals[0] = None), "unfenced"),
        (with(&|c| c.seals[1] = Some(seal_of_2)), "seal_mismatch"),
        (with(&|c| c.seals = [c.seals[1], c.seals[0]]), "seal_mismatch"),
        (with(&|c| c.replicas = vec![]), "invalid_replicas"),
    ];
    for (command, reason) in cases {
        assert_refused(&mut state, command, reason);
    }
}

#[test]
fn merge_refuses_ranges_of_different_sizes() {
    let (mut state, topic_id) = with_topic("orders", Some(2));
    let command = split(&state, topic_id, 0, 0);
    apply_ok(&mut state, command);
    // Range 3 is [2^62, 2^63) and range 1 is [2^63, 2^64): adjacent, but of different sizes.
    let command = merge(&state, topic_id, [3, 1]);
    assert_refused(&mut state, command, "not_buddies");
    let command = merge(&state, topic_id, [2, 3]);
    apply_ok(&mut state, command);
    let command = merge(&state, topic_id, [4, 1]);
    apply_ok(&mut state, command);
    let topic = state.topic(topic_id).expect("topic");
    assert_eq!(topic.active_ranges().map(|r| r.extent).collect::<Vec<_>>(), vec![Extent::FULL]);
}
