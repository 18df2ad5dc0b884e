//! Tables for the retention plan and the expire command.

use std::collections::BTreeMap;

use crate::command::{MetaCommand, MetaResponse};
use crate::limits::MetaLimits;
use crate::model::SegmentRef;
use crate::policy::{PolicyDefinitions, PolicyField, PolicyValue, RetentionDefaults};
use crate::state::MetaState;
use crate::testkit::{NOW_MS, apply_ok, assert_refused, create, roll, split, with_topic};

const MINUTE_MS: u64 = 60_000;

/// Topic 1, one range: segments 1..=3 sealed at minutes 1, 2, 3 with 10, 20, 30 records (1000,
/// 2000, 3000 bytes), segment 4 active.
fn three_sealed() -> MetaState {
    let (mut state, topic_id) = with_topic("orders", None);
    for (minute, records) in [(1, 10), (2, 20), (3, 30)] {
        let command = roll(&state, topic_id, 0, records, NOW_MS + minute * MINUTE_MS);
        apply_ok(&mut state, command);
    }
    state
}

fn refs(topic_id: u64, range_id: u32, segment_ids: &[u64]) -> Vec<SegmentRef> {
    segment_ids.iter().map(|&segment_id| SegmentRef { topic_id, range_id, segment_id }).collect()
}

fn retention(max_age_ms: Option<u64>, max_bytes: Option<u64>) -> RetentionDefaults {
    RetentionDefaults { max_age_ms, max_bytes, unresolved_policy_max_age_ms: None }
}

#[test]
fn plan_table() {
    let state = three_sealed();
    let at = |minute: u64| NOW_MS + minute * MINUTE_MS;
    // (now, defaults, active bytes of segment 4, expected segments)
    let cases: Vec<(u64, RetentionDefaults, u64, Vec<u64>)> = vec![
        (at(100), retention(None, None), 0, vec![]),
        (at(3), retention(Some(0), None), 0, vec![1, 2]),
        (at(3) + 1, retention(Some(0), None), 0, vec![1, 2, 3]),
        (at(4), retention(Some(2 * MINUTE_MS), None), 0, vec![1]),
        (at(4) + 1, retention(Some(2 * MINUTE_MS), None), 0, vec![1, 2]),
        (at(4), retention(None, Some(6000)), 0, vec![]),
        (at(4), retention(None, Some(5999)), 0, vec![1]),
        (at(4), retention(None, Some(5999)), 1, vec![1]),
        (at(4), retention(None, Some(5000)), 1, vec![1, 2]),
        (at(4), retention(None, Some(0)), 0, vec![1, 2, 3]),
        (at(4), retention(Some(u64::MAX), Some(3000)), 0, vec![1, 2]),
        (0, retention(Some(0), None), 0, vec![]),
    ];
    for (now_ms, defaults, active, expected) in cases {
        let active_bytes: BTreeMap<u64, u64> = [(4, active)].into_iter().collect();
        let plan = state.retention_plan_with_active_bytes(
            now_ms,
            &PolicyDefinitions::new(),
            &defaults,
            &active_bytes,
        );
        assert_eq!(plan, refs(1, 0, &expected), "{now_ms} {defaults:?} active {active}");
    }
}

#[test]
fn plan_covers_sealed_ranges_and_respects_policies() {
    let mut state = MetaState::default();
    for name in ["a", "b", "c", "d"] {
        apply_ok(&mut state, create(name, None));
        let topic_id = state.topic_by_name(name).expect("topic").topic_id;
        let command = split(&state, topic_id, 0, 5);
        apply_ok(&mut state, command);
    }
    let keep = vec![
        PolicyField { name: "retention.max_age_ms".into(), value: PolicyValue::Null },
        PolicyField { name: "retention.max_bytes".into(), value: PolicyValue::Null },
    ];
    // "gone" was defined, bound, then deleted: its topics are unresolved.
    let definitions: PolicyDefinitions =
        [("keep".to_string(), crate::policy::PolicyDefinition::from_fields(&keep).expect("valid"))]
            .into();
    let bind = |topic: &str, policy: &str| MetaCommand::BindTopicPolicy {
        topic: topic.into(),
        policy: Some(policy.into()),
    };
    apply_ok(&mut state, bind("b", "keep"));
    apply_ok(&mut state, bind("c", "gone"));
    apply_ok(&mut state, bind("d", "gone"));
    let later = NOW_MS + 1_000 * MINUTE_MS;
    let plan = state.retention_plan(later, &definitions, &retention(Some(MINUTE_MS), Some(0)));
    assert_eq!(plan, refs(1, 0, &[1]), "sealed parents expire; keep and unresolved hold");
    let with_backstop = RetentionDefaults {
        unresolved_policy_max_age_ms: Some(MINUTE_MS),
        ..retention(None, None)
    };
    let plan = state.retention_plan(later, &definitions, &with_backstop);
    assert_eq!(plan, [refs(3, 0, &[7]), refs(4, 0, &[10])].concat(), "only the backstop applies");
}

#[test]
fn plan_is_bounded_by_the_command_limit() {
    let limits = MetaLimits { max_items_per_command: 2, ..MetaLimits::default() };
    let mut state = MetaState::new(limits);
    apply_ok(&mut state, create("t", None));
    for _ in 0..4 {
        let command = roll(&state, 1, 0, 1, NOW_MS);
        apply_ok(&mut state, command);
    }
    let plan =
        state.retention_plan(NOW_MS + 1, &PolicyDefinitions::new(), &retention(Some(0), None));
    assert_eq!(plan, refs(1, 0, &[1, 2]));
}

#[test]
fn expire_counts_records_and_queues_reclaim() {
    let mut state = three_sealed();
    let plan = refs(1, 0, &[1, 2]);
    let response = apply_ok(&mut state, MetaCommand::ExpireSegments { segments: plan.clone() });
    assert_eq!(
        response,
        MetaResponse::SegmentsExpired { expired: plan, skipped: vec![], expired_records: 30 }
    );
    let range = &state.topic(1).expect("topic").ranges[&0];
    assert_eq!((range.segment_ids.clone(), range.expired_records), (vec![3, 4], 30));
    assert_eq!(state.pending_reclaim().keys().copied().collect::<Vec<_>>(), vec![1, 2]);
    assert_eq!(state.segment(3).expect("retained").range_base_records, 30);
    let replay = refs(1, 0, &[2, 3]);
    let response = apply_ok(&mut state, MetaCommand::ExpireSegments { segments: replay });
    let skipped = refs(1, 0, &[2]);
    assert_eq!(
        response,
        MetaResponse::SegmentsExpired { expired: refs(1, 0, &[3]), skipped, expired_records: 30 }
    );
    let stale = vec![SegmentRef { topic_id: 42, range_id: 0, segment_id: 4 }];
    let response = apply_ok(&mut state, MetaCommand::ExpireSegments { segments: stale.clone() });
    assert_eq!(
        response,
        MetaResponse::SegmentsExpired { expired: vec![], skipped: stale, expired_records: 0 }
    );
}

#[test]
fn expire_refusals() {
    let mut state = {
        let mut fresh = three_sealed();
        apply_ok(&mut fresh, create("other", Some(2)));
        let command = roll(&fresh, 2, 1, 3, NOW_MS);
        apply_ok(&mut fresh, command);
        fresh
    };
    let expire = |segments: Vec<SegmentRef>| MetaCommand::ExpireSegments { segments };
    let cases: Vec<(MetaCommand, &str)> = vec![
        (expire(refs(1, 0, &[4])), "segment_active"),
        (expire(refs(1, 0, &[2])), "segment_not_oldest"),
        (expire(refs(1, 0, &[1, 3])), "segment_not_oldest"),
        (expire(refs(1, 0, &[1, 1])), "segment_not_oldest"),
        (expire(refs(1, 0, &[1, 2, 3, 4])), "segment_active"),
        (expire(refs(1, 5, &[1])), "no_such_range"),
        (expire(refs(1, 0, &[6])), "segment_range_mismatch"),
        (expire(refs(2, 0, &[6])), "segment_range_mismatch"),
        (
            expire([refs(1, 0, &[1]), refs(2, 1, &[6]), refs(1, 0, &[3])].concat()),
            "segment_not_oldest",
        ),
    ];
    for (command, reason) in cases {
        assert_refused(&mut state, command, reason);
    }
    let limits = MetaLimits { max_items_per_command: 1, ..MetaLimits::default() };
    let mut small = MetaState::new(limits);
    assert_refused(&mut small, expire(refs(1, 0, &[1, 2])), "too_many_items");
}
