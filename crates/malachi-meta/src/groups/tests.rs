//! Tables for commits and group deletion.

use std::collections::BTreeMap;

use crate::command::{CommitMember, CommitPositions, GroupHeartbeat, MetaCommand, MetaResponse};
use crate::limits::MetaLimits;
use crate::model::{GroupPosition, Position};
use crate::state::MetaState;
use crate::testkit::{NOW_MS, apply_ok, assert_refused, create, roll, split, with_topic};

/// (positions, expected generation, generation after the commit)
type CommitStep = (Vec<(u32, GroupPosition)>, Option<u64>, u64);

fn at(segment_id: u64, offset: u64) -> GroupPosition {
    GroupPosition::At(Position { segment_id, offset })
}

fn commit(
    topic_id: u64,
    group: &str,
    positions: &[(u32, GroupPosition)],
    expected: Option<u64>,
) -> MetaCommand {
    MetaCommand::CommitPositions(CommitPositions {
        topic_id,
        group: group.to_string(),
        positions: positions.iter().copied().collect(),
        expected_generation: expected,
        now_ms: NOW_MS,
        member: None,
    })
}

/// Topic 1 with ranges 0 (segments 1 sealed at 10, 3 active) and 1 (split: segment 2 sealed at
/// 4; children 2 and 3 with segments 4 and 5).
fn fixture() -> MetaState {
    let (mut state, topic_id) = with_topic("orders", Some(2));
    let command = roll(&state, topic_id, 0, 10, NOW_MS);
    apply_ok(&mut state, command);
    let command = split(&state, topic_id, 1, 4);
    apply_ok(&mut state, command);
    state
}

#[test]
fn commits_replace_only_the_named_ranges_and_bump_the_generation() {
    let mut state = fixture();
    let steps: Vec<CommitStep> = vec![
        (vec![(0, at(1, 10)), (1, at(2, 0))], None, 1),
        (vec![(1, GroupPosition::Finished), (2, at(4, 7))], Some(1), 2),
        (vec![], Some(2), 3),
    ];
    for (positions, expected, generation) in steps {
        let response = apply_ok(&mut state, commit(1, "workers", &positions, expected));
        assert_eq!(response, MetaResponse::PositionsCommitted { generation });
    }
    let group = state.group(1, "workers").expect("group");
    let expected: BTreeMap<u32, GroupPosition> =
        [(0, at(1, 10)), (1, GroupPosition::Finished), (2, at(4, 7))].into_iter().collect();
    assert_eq!(group.positions, expected);
    assert_eq!(group.generation, 3);
}

#[test]
fn positions_in_expired_segments_are_accepted() {
    let mut state = fixture();
    let expire = vec![crate::model::SegmentRef { topic_id: 1, range_id: 0, segment_id: 1 }];
    apply_ok(&mut state, MetaCommand::ExpireSegments { segments: expire });
    apply_ok(&mut state, commit(1, "g", &[(0, at(1, 3))], Some(0)));
}

#[test]
fn commit_refusals() {
    let limits = MetaLimits { max_groups_per_topic: 1, ..MetaLimits::default() };
    let mut state = MetaState::new(limits);
    apply_ok(&mut state, create("orders", Some(2)));
    let command = roll(&state, 1, 0, 10, NOW_MS);
    apply_ok(&mut state, command);
    let command = split(&state, 1, 1, 4);
    apply_ok(&mut state, command);
    apply_ok(&mut state, commit(1, "existing", &[], None));
    let cases: Vec<(MetaCommand, &str)> = vec![
        (commit(9, "existing", &[], None), "no_such_topic"),
        (commit(1, "", &[], None), "invalid_group"),
        (commit(1, "bad\ngroup", &[], None), "invalid_group"),
        (commit(1, "new-group", &[], None), "too_many_groups"),
        (commit(1, "existing", &[], Some(0)), "generation_mismatch"),
        (commit(1, "existing", &[], Some(2)), "generation_mismatch"),
        (commit(1, "existing", &[(7, at(1, 0))], None), "no_such_range"),
        (commit(1, "existing", &[(0, at(2, 0))], None), "invalid_cursor"),
        (commit(1, "existing", &[(0, at(1, 11))], None), "invalid_cursor"),
        (commit(1, "existing", &[(0, at(99, 0))], None), "invalid_cursor"),
        (commit(1, "existing", &[(0, at(0, 0))], None), "invalid_cursor"),
        (commit(1, "existing", &[(0, GroupPosition::Finished)], None), "invalid_cursor"),
        (commit(1, "existing", &[(1, at(2, 5))], None), "invalid_cursor"),
        (commit(1, "existing", &[(0, at(1, 1)), (3, at(4, 0))], None), "invalid_cursor"),
    ];
    for (command, reason) in cases {
        assert_refused(&mut state, command, reason);
    }
    // Boundaries that are accepted: the sealed end itself, any offset in an active segment.
    apply_ok(&mut state, commit(1, "existing", &[(0, at(1, 10)), (1, at(2, 4))], None));
    apply_ok(&mut state, commit(1, "existing", &[(0, at(3, 1 << 40))], Some(2)));
}

#[test]
fn delete_group_and_delete_topic_drop_positions() {
    let mut state = fixture();
    apply_ok(&mut state, commit(1, "a", &[(0, at(1, 1))], None));
    apply_ok(&mut state, commit(1, "b", &[(0, at(1, 2))], None));
    let delete = |group: &str| MetaCommand::DeleteGroup { topic_id: 1, group: group.to_string() };
    assert_eq!(apply_ok(&mut state, delete("a")), MetaResponse::GroupDeleted { existed: true });
    assert_eq!(apply_ok(&mut state, delete("a")), MetaResponse::GroupDeleted { existed: false });
    assert_refused(&mut state, delete(""), "invalid_group");
    assert_refused(
        &mut state,
        MetaCommand::DeleteGroup { topic_id: 8, group: "b".into() },
        "no_such_topic",
    );
    apply_ok(&mut state, MetaCommand::DeleteTopic { name: "orders".into() });
    assert!(state.group(1, "b").is_none());
    apply_ok(&mut state, create("orders", None));
    let recreated = state.topic_by_name("orders").expect("recreated");
    assert!(recreated.groups.is_empty(), "a recreated topic starts without groups");
}

const SESSION_MS: u64 = 30_000;

fn heartbeat(member: &str, applied: Option<u64>, now_ms: u64) -> MetaCommand {
    MetaCommand::GroupHeartbeat(GroupHeartbeat {
        topic_id: 1,
        group: "workers".into(),
        member: member.into(),
        applied,
        now_ms,
        session_ms: SESSION_MS,
    })
}

/// `(generation, ranges)` a heartbeat answered.
fn told(state: &mut MetaState, member: &str, applied: Option<u64>, now_ms: u64) -> (u64, Vec<u32>) {
    match apply_ok(state, heartbeat(member, applied, now_ms)) {
        MetaResponse::GroupAssignment { generation, ranges } => (generation, ranges),
        other => panic!("heartbeat answered {other:?}"),
    }
}

fn member_commit(
    member: &str,
    generation: Option<u64>,
    positions: &[(u32, GroupPosition)],
) -> MetaCommand {
    MetaCommand::CommitPositions(CommitPositions {
        topic_id: 1,
        group: "workers".to_string(),
        positions: positions.iter().copied().collect(),
        expected_generation: None,
        now_ms: NOW_MS,
        member: Some(CommitMember { member: member.into(), generation, session_ms: SESSION_MS }),
    })
}

/// Members share the readable ranges (the split range 1's children wait for it), commits come
/// only from the holder at the current generation, and draining range 1 hands its children out.
#[test]
fn members_share_ranges_and_commit_only_their_own() {
    let mut state = fixture();
    let (generation, ranges) = told(&mut state, "a", None, NOW_MS);
    let first_generation = generation;
    assert_eq!(ranges, vec![0, 1], "children 2 and 3 wait for range 1");
    let (_, b_ranges) = told(&mut state, "b", None, NOW_MS + 1);
    assert!(b_ranges.is_empty(), "a still reads both");
    let (generation, ranges) = told(&mut state, "a", Some(generation), NOW_MS + 2);
    assert_eq!(ranges, vec![0], "a is told to let range 1 go");
    assert_refused(&mut state, member_commit("b", None, &[(1, at(2, 1))]), "not_owner");
    let (generation, _) = told(&mut state, "a", Some(generation), NOW_MS + 3);
    let (b_generation, b_ranges) = told(&mut state, "b", None, NOW_MS + 4);
    assert_eq!(b_ranges, vec![1]);
    let stale = member_commit("a", Some(first_generation), &[(0, at(1, 1))]);
    assert_refused(&mut state, stale, "generation_mismatch");
    apply_ok(&mut state, member_commit("a", Some(generation), &[(0, at(1, 1))]));
    assert_refused(
        &mut state,
        member_commit("a", Some(b_generation), &[(1, at(2, 1))]),
        "not_owner",
    );
    apply_ok(&mut state, member_commit("b", Some(b_generation), &[(1, GroupPosition::Finished)]));
    let (_, b_ranges) = told(&mut state, "b", Some(b_generation), NOW_MS + 5);
    let (_, a_ranges) = told(&mut state, "a", None, NOW_MS + 6);
    let mut all: Vec<u32> = a_ranges.iter().chain(&b_ranges).copied().collect();
    all.sort_unstable();
    assert_eq!(all, vec![0, 2, 3], "range 1 drained: its children are read");
    apply_ok(
        &mut state,
        MetaCommand::LeaveGroupMember {
            topic_id: 1,
            group: "workers".into(),
            member: "b".into(),
            now_ms: NOW_MS + 7,
            session_ms: SESSION_MS,
        },
    );
    let (_, a_ranges) = told(&mut state, "a", None, NOW_MS + 8);
    assert_eq!(a_ranges, vec![0, 2, 3], "b left: a reads all");
}

/// Groups without members serialize as they did before membership existed; refusals change
/// nothing.
#[test]
fn membership_refusals_and_storage() {
    let mut state = fixture();
    apply_ok(&mut state, commit(1, "plain", &[(0, at(1, 3))], None));
    let json = serde_json::to_string(state.group(1, "plain").expect("group")).expect("json");
    assert!(!json.contains("membership"), "{json}");
    assert_refused(&mut state, heartbeat("bad\nname", None, NOW_MS), "invalid_group");
    let mut heartbeat_elsewhere = heartbeat("a", None, NOW_MS);
    if let MetaCommand::GroupHeartbeat(beat) = &mut heartbeat_elsewhere {
        beat.topic_id = 99;
    }
    assert_refused(&mut state, heartbeat_elsewhere, "no_such_topic");
}
