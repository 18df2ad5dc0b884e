//! Tables for rolls and the roll decision.

use crate::command::{MetaCommand, RollSegment};
use crate::limits::MetaLimits;
use crate::limits::Quota;
use crate::model::{SealReport, SegmentRoll, SegmentRollDefaults, SegmentState};
use crate::state::MetaState;
use crate::testkit::{NOW_MS, apply_ok, assert_refused, create, roll, seal_of, split, with_topic};
use crate::{CreateTopic, MetaResponse};

/// (segment id, sealed length, range base records)
type SegmentSummary = (u64, Option<(u64, u64)>, u64);

#[test]
fn roll_seals_and_numbers_records_across_segments() {
    let (mut state, topic_id) = with_topic("orders", None);
    let lengths = [10u64, 0, 25];
    for (step, &end_offset) in lengths.iter().enumerate() {
        let command = roll(&state, topic_id, 0, end_offset, NOW_MS + step as u64);
        let response = apply_ok(&mut state, command);
        let sealed = step as u64 + 1;
        assert_eq!(
            response,
            MetaResponse::SegmentRolled { sealed_segment_id: sealed, segment_id: sealed + 1 }
        );
    }
    let segments = state.range_segments(topic_id, 0);
    let summary: Vec<SegmentSummary> =
        segments.iter().map(|s| (s.segment_id, s.sealed_length(), s.range_base_records)).collect();
    assert_eq!(
        summary,
        vec![
            (1, Some((10, 1000)), 0),
            (2, Some((0, 0)), 10),
            (3, Some((25, 2500)), 10),
            (4, None, 35)
        ]
    );
    assert_eq!(segments[3].created_ms, NOW_MS + 2);
    let sealed_ms = match segments[2].state {
        SegmentState::Sealed { sealed_ms, .. } => sealed_ms,
        SegmentState::Active => panic!("segment 3 is sealed"),
    };
    assert_eq!(sealed_ms, NOW_MS + 2);
}

#[test]
fn roll_refusals() {
    let (mut state, topic_id) = with_topic("orders", Some(2));
    let command = split(&state, topic_id, 1, 4);
    apply_ok(&mut state, command);
    let base = RollSegment {
        topic_id,
        range_id: 0,
        seal: seal_of(&state, topic_id, 0, 3),
        now_ms: NOW_MS,
        replicas: vec![1, 2, 3],
    };
    let with = |change: &dyn Fn(&mut RollSegment)| {
        let mut command = base.clone();
        change(&mut command);
        MetaCommand::RollSegment(command)
    };
    let sealed_parent = SealReport { segment_id: 2, end_offset: 4, data_bytes: 400 };
    let cases: Vec<(MetaCommand, &str)> = vec![
        (with(&|c| c.topic_id = 5), "no_such_topic"),
        (with(&|c| c.range_id = 50), "no_such_range"),
        (with(&|c| c.range_id = 1), "range_sealed"),
        (with(&|c| c.seal.segment_id = 3), "seal_mismatch"),
        (with(&|c| c.seal = sealed_parent), "seal_mismatch"),
        (with(&|c| c.replicas = vec![]), "invalid_replicas"),
    ];
    for (command, reason) in cases {
        assert_refused(&mut state, command, reason);
    }
}

#[test]
fn a_replayed_roll_is_refused_and_a_conflicting_one_too() {
    let (mut state, topic_id) = with_topic("orders", None);
    let command = roll(&state, topic_id, 0, 8, NOW_MS);
    apply_ok(&mut state, command.clone());
    assert_refused(&mut state, command.clone(), "segment_already_sealed");
    let MetaCommand::RollSegment(mut conflicting) = command else { unreachable!() };
    conflicting.seal.end_offset = 9;
    assert_refused(&mut state, MetaCommand::RollSegment(conflicting), "seal_conflict");
}

#[test]
fn roll_respects_the_segment_limit() {
    let limits = MetaLimits { max_segments_per_range: 2, ..MetaLimits::default() };
    let mut state = MetaState::new(limits);
    apply_ok(&mut state, create("t", None));
    let command = roll(&state, 1, 0, 1, NOW_MS);
    apply_ok(&mut state, command);
    let command = roll(&state, 1, 0, 1, NOW_MS);
    assert_refused(&mut state, command, "too_many_segments");
}

#[test]
fn roll_due_table() {
    let defaults = SegmentRollDefaults { max_bytes: 1_000_000, max_age_ms: 3_600_000 };
    let overrides = SegmentRoll { max_bytes: Some(10_000), max_age_ms: Some(120_000) };
    let mut state = MetaState::default();
    apply_ok(&mut state, create("plain", None));
    apply_ok(
        &mut state,
        MetaCommand::CreateTopic(CreateTopic {
            name: "tuned".into(),
            now_ms: NOW_MS,
            initial_ranges: None,
            segment_roll: overrides,
            replicas: vec![1],
            creator: None,
            quota: Quota::default(),
        }),
    );
    // (topic id, range id, active bytes, age ms, due)
    let cases: &[(u64, u32, u64, u64, bool)] = &[
        (1, 0, 0, 0, false),
        (1, 0, 999_999, 3_599_999, false),
        (1, 0, 1_000_000, 0, true),
        (1, 0, 0, 3_600_000, true),
        (2, 0, 9_999, 119_999, false),
        (2, 0, 10_000, 0, true),
        (2, 0, 0, 120_000, true),
        (1, 9, 5_000_000, 0, false),
        (3, 0, 5_000_000, 0, false),
    ];
    for &(topic_id, range_id, bytes, age_ms, due) in cases {
        let now_ms = NOW_MS + age_ms;
        assert_eq!(
            state.roll_due(topic_id, range_id, bytes, now_ms, &defaults),
            due,
            "{topic_id}/{range_id} {bytes} B {age_ms} ms"
        );
    }
    let command = split(&state, 1, 0, 0);
    apply_ok(&mut state, command);
    assert!(!state.roll_due(1, 0, u64::MAX, u64::MAX, &defaults), "a sealed range never rolls");
    assert!(!state.roll_due(1, 1, 0, NOW_MS - 1, &defaults), "a clock behind creation is age 0");
}

/// A head is closed once sealed or dropped with its topic; a segment id this state has not
/// allocated yet (a lagging replica of the group) is not, so its broker keeps it.
#[test]
fn segment_closed_covers_sealed_and_dropped_segments_only() {
    let (mut state, topic_id) = with_topic("orders", None);
    let first = state.range_segments(topic_id, 0)[0].segment_id;
    assert!(!state.segment_closed(first), "an active head is open");
    let command = roll(&state, topic_id, 0, 5, NOW_MS + 1);
    apply_ok(&mut state, command);
    let second =
        state.topic(topic_id).expect("topic").ranges[&0].active_segment_id().expect("head");
    let unheard = second + 1;
    let cases = [
        (first, true, "sealed by the roll"),
        (second, false, "the new head"),
        (unheard, false, "not allocated yet"),
    ];
    for (segment_id, closed, why) in cases {
        assert_eq!(state.segment_closed(segment_id), closed, "{why}");
    }
    apply_ok(&mut state, MetaCommand::DeleteTopic { name: "orders".into() });
    assert!(state.segment_closed(second), "a head dropped with its topic is closed");
    assert!(!state.segment_closed(unheard), "still not allocated");
}
