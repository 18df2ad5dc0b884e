//! Tables for create, delete and reclaim.

use super::*;
use crate::command::MetaCommand;
use crate::keyspace::key_point;
use crate::limits::MetaLimits;
use crate::limits::Quota;
use crate::model::SegmentState;
use crate::testkit::{NOW_MS, apply_ok, assert_refused, create, roll, with_topic};

fn create_with(
    name: &str,
    ranges: Option<u32>,
    roll: SegmentRoll,
    replicas: Vec<u64>,
) -> MetaCommand {
    MetaCommand::CreateTopic(CreateTopic {
        name: name.to_string(),
        now_ms: NOW_MS,
        initial_ranges: ranges,
        segment_roll: roll,
        replicas,
        creator: None,
        quota: Quota::default(),
    })
}

#[test]
fn create_tiles_the_keyspace_with_the_requested_ranges() {
    let cases: &[(Option<u32>, usize)] =
        &[(None, 1), (Some(1), 1), (Some(2), 2), (Some(8), 8), (Some(256), 256)];
    for &(ranges, expected) in cases {
        let (state, topic_id) = with_topic("orders", ranges);
        let topic = state.topic(topic_id).expect("created");
        assert_eq!(topic.active_range_count() as usize, expected);
        let ids: Vec<u32> = topic.active_ranges().map(|range| range.range_id).collect();
        assert_eq!(ids, (0..expected as u32).collect::<Vec<_>>(), "keyspace order = id order");
        for range in topic.active_ranges() {
            assert!(range.parents.is_empty());
            let segments = state.range_segments(topic_id, range.range_id);
            assert_eq!(segments.len(), 1);
            assert_eq!(segments[0].state, SegmentState::Active);
            assert_eq!(segments[0].replicas, vec![1]);
            assert_eq!(segments[0].created_ms, NOW_MS);
        }
        assert_eq!(
            topic.route(key_point(b"user-42")).extent.width(),
            (1u128 << 64) / expected as u128
        );
        state.check_invariants().expect("invariants");
    }
}

#[test]
fn create_response_names_ranges_and_first_segments() {
    let mut state = MetaState::default();
    let response = apply_ok(&mut state, create("a", Some(2)));
    assert_eq!(response, MetaResponse::TopicCreated { topic_id: 1, ranges: vec![(0, 1), (1, 2)] });
    let response = apply_ok(&mut state, create("b", None));
    assert_eq!(response, MetaResponse::TopicCreated { topic_id: 2, ranges: vec![(0, 3)] });
    assert_eq!(state.version(), 2);
}

#[test]
fn create_refusals() {
    let roll = SegmentRoll::default();
    let small_bytes = SegmentRoll { max_bytes: Some(MIN_SEGMENT_MAX_BYTES - 1), max_age_ms: None };
    let small_age = SegmentRoll { max_bytes: None, max_age_ms: Some(MIN_SEGMENT_MAX_AGE_MS - 1) };
    let cases: Vec<(MetaCommand, &str)> = vec![
        (create("", None), "invalid_topic_name"),
        (create("..", None), "invalid_topic_name"),
        (create("bad name", None), "invalid_topic_name"),
        (create("existing", None), "already_exists"),
        (create("t", Some(0)), "invalid_range_count"),
        (create("t", Some(3)), "invalid_range_count"),
        (create("t", Some(512)), "invalid_range_count"),
        (create_with("t", None, small_bytes, vec![1]), "invalid_segment_roll"),
        (create_with("t", None, small_age, vec![1]), "invalid_segment_roll"),
        (create_with("t", None, roll, vec![]), "invalid_replicas"),
        (create_with("t", None, roll, vec![1, 2, 1]), "invalid_replicas"),
        (create_with("t", None, roll, (0..17).collect()), "invalid_replicas"),
    ];
    let (mut state, _) = with_topic("existing", None);
    for (command, reason) in cases {
        assert_refused(&mut state, command, reason);
    }
}

#[test]
fn create_respects_the_limits() {
    let limits =
        MetaLimits { max_topics: 1, max_active_ranges_per_topic: 4, ..MetaLimits::default() };
    let mut state = MetaState::new(limits);
    assert_refused(&mut state, create("a", Some(8)), "invalid_range_count");
    apply_ok(&mut state, create("a", Some(4)));
    assert_refused(&mut state, create("b", None), "too_many_topics");
}

#[test]
fn roll_thresholds_at_their_floor_are_accepted() {
    let roll = SegmentRoll {
        max_bytes: Some(MIN_SEGMENT_MAX_BYTES),
        max_age_ms: Some(MIN_SEGMENT_MAX_AGE_MS),
    };
    let mut state = MetaState::default();
    apply_ok(&mut state, create_with("t", None, roll, vec![3, 1, 2]));
    assert_eq!(state.topic_by_name("t").expect("created").segment_roll, roll);
}

#[test]
fn delete_moves_segments_to_reclaim_and_frees_the_name() {
    let (mut state, topic_id) = with_topic("orders", Some(2));
    let response = apply_ok(&mut state, MetaCommand::DeleteTopic { name: "orders".into() });
    assert_eq!(response, MetaResponse::TopicDeleted { topic_id, reclaim: vec![1, 2] });
    assert!(state.topic(topic_id).is_none() && state.topic_by_name("orders").is_none());
    assert_eq!(state.pending_reclaim().keys().copied().collect::<Vec<_>>(), vec![1, 2]);
    assert_eq!(
        state.pending_reclaim()[&2],
        ReclaimEntry { topic_id, range_id: 1, replicas: vec![1] }
    );
    let MetaResponse::TopicCreated { topic_id: recreated, ranges } =
        apply_ok(&mut state, create("orders", None))
    else {
        panic!("not a create answer");
    };
    assert_eq!((recreated, ranges), (topic_id + 1, vec![(0, 3)]), "ids are never reused");
    state.check_invariants().expect("invariants");
}

#[test]
fn delete_refusals() {
    let (mut state, _) = with_topic("orders", None);
    assert_refused(&mut state, MetaCommand::DeleteTopic { name: "other".into() }, "no_such_topic");
    assert_refused(&mut state, MetaCommand::DeleteTopic { name: "".into() }, "invalid_topic_name");
}

#[test]
fn reclaim_done_removes_only_known_ids() {
    let (mut state, _) = with_topic("orders", Some(4));
    apply_ok(&mut state, MetaCommand::DeleteTopic { name: "orders".into() });
    let cases: &[(Vec<u64>, u64, usize)] =
        &[(vec![2, 99], 1, 3), (vec![2], 0, 3), (vec![1, 3, 4], 3, 0)];
    for (ids, removed, left) in cases {
        let command = MetaCommand::ReclaimDone { segment_ids: ids.clone(), node_id: None };
        let response = apply_ok(&mut state, command);
        assert_eq!(response, MetaResponse::ReclaimAcknowledged { removed: *removed });
        assert_eq!(state.pending_reclaim().len(), *left);
    }
    let limits = MetaLimits { max_items_per_command: 2, ..MetaLimits::default() };
    let mut state = MetaState::new(limits);
    assert_refused(
        &mut state,
        MetaCommand::ReclaimDone { segment_ids: vec![1, 2, 3], node_id: None },
        "too_many_items",
    );
}

/// Each replica confirms its own copy; the entry goes with the last one, and a node that holds
/// no copy confirms nothing.
#[test]
fn reclaim_waits_for_every_replica() {
    let mut state = MetaState::default();
    let MetaCommand::CreateTopic(mut create) = create("orders", None) else { unreachable!() };
    create.replicas = vec![1, 2];
    apply_ok(&mut state, MetaCommand::CreateTopic(create));
    apply_ok(&mut state, MetaCommand::DeleteTopic { name: "orders".into() });
    let steps = [(Some(3), 0, vec![1, 2]), (Some(2), 0, vec![1]), (Some(1), 1, vec![])];
    for (node_id, removed, left) in steps {
        let command = MetaCommand::ReclaimDone { segment_ids: vec![1], node_id };
        let response = apply_ok(&mut state, command);
        assert_eq!(response, MetaResponse::ReclaimAcknowledged { removed }, "{node_id:?}");
        let replicas = state.pending_reclaim().get(&1).map(|entry| entry.replicas.clone());
        assert_eq!(replicas.unwrap_or_default(), left, "{node_id:?}");
    }
}

#[test]
fn topics_list_sorted_by_name() {
    let mut state = MetaState::default();
    for name in ["zeta", "alpha", "Mid", "beta"] {
        apply_ok(&mut state, create(name, None));
    }
    let names: Vec<&str> = state.topics().map(|topic| topic.name.as_str()).collect();
    assert_eq!(names, vec!["Mid", "alpha", "beta", "zeta"]);
}

/// Quotas travel in the command, so every replica refuses the same create for the same reason.
#[test]
fn create_honours_the_quota_it_carries() {
    let with_quota = |name: &str, ranges: u32, creator: Option<&str>, quota: Quota| {
        MetaCommand::CreateTopic(CreateTopic {
            name: name.to_string(),
            now_ms: NOW_MS,
            initial_ranges: Some(ranges),
            segment_roll: SegmentRoll::default(),
            replicas: vec![1],
            creator: creator.map(str::to_string),
            quota,
        })
    };
    let topics_2 = Quota { max_topics: Some(2), ..Quota::default() };
    let ranges_8 = Quota { max_active_ranges: Some(8), ..Quota::default() };
    let per_user_1 = Quota { max_topics_per_creator: Some(1), ..Quota::default() };
    /// What, the quota, the creator, the range count, the refusal.
    type Case<'a> = (&'a str, Quota, Option<&'a str>, u32, Option<&'a str>);
    let cases: &[Case] = &[
        ("the third topic of two", topics_2, None, 1, Some("too_many_topics")),
        ("4 more ranges on top of 4", ranges_8, None, 4, None),
        ("8 more ranges on top of 4", ranges_8, None, 8, Some("too_many_ranges")),
        ("a second topic by alice", per_user_1, Some("alice"), 1, Some("too_many_topics")),
        ("a first topic by bob", per_user_1, Some("bob"), 1, None),
        ("an admin's topic is exempt", per_user_1, None, 1, None),
    ];
    for (name, quota, creator, ranges, refusal) in cases {
        let mut state = MetaState::default();
        apply_ok(&mut state, with_quota("first", 2, Some("alice"), Quota::default()));
        apply_ok(&mut state, with_quota("second", 2, None, Quota::default()));
        let command = with_quota("new", *ranges, *creator, *quota);
        match (refusal, state.apply(command.clone())) {
            (Some(reason), Err(error)) => assert_eq!(&error.reason(), reason, "{name}"),
            (None, Ok(_)) => {}
            (expected, got) => panic!("{name}: expected {expected:?}, got {got:?}"),
        }
    }
}

#[test]
fn files_created_are_recorded_once_per_replica() {
    let (mut state, topic_id) = with_topic("orders", Some(2));
    let segment_ids: Vec<u64> = state
        .topic(topic_id)
        .unwrap()
        .active_ranges()
        .filter_map(|r| r.active_segment_id())
        .collect();
    let record =
        |node_id, segment_ids: Vec<u64>| MetaCommand::SegmentFilesCreated { node_id, segment_ids };
    let cases: &[(u64, &[u64], u64)] = &[
        (1, &[segment_ids[0], 999], 1),
        (1, &[segment_ids[0], segment_ids[1]], 1),
        (7, &[segment_ids[1]], 0),
    ];
    for (node_id, ids, expected) in cases {
        let response = apply_ok(&mut state, record(*node_id, ids.to_vec()));
        assert_eq!(response, MetaResponse::SegmentFilesRecorded { recorded: *expected });
    }
    for segment_id in segment_ids {
        assert_eq!(state.segment(segment_id).unwrap().created_on, vec![1]);
    }
}

/// A fenced delete goes only when the heads sealed are exactly the topic's active segments.
#[test]
fn a_fenced_delete_needs_every_head_sealed() {
    let (mut state, _) = with_topic("orders", Some(2));
    let topic = state.topic_by_name("orders").unwrap();
    let heads: Vec<u64> = topic.active_ranges().filter_map(|r| r.active_segment_id()).collect();
    assert_eq!(heads.len(), 2);
    let delete = |fenced_heads: Vec<u64>| MetaCommand::DeleteFencedTopic {
        name: "orders".into(),
        fenced_heads,
    };
    assert_refused(&mut state, delete(vec![heads[0]]), "unfenced");
    assert_refused(&mut state, delete(vec![heads[0], heads[1], 99]), "unfenced");
    let reversed = vec![heads[1], heads[0]];
    let deleted = apply_ok(&mut state, delete(reversed));
    assert!(matches!(deleted, MetaResponse::TopicDeleted { .. }), "{deleted:?}");
    assert_refused(&mut state, delete(Vec::new()), "no_such_topic");
}

/// A topic whose first segment has replicas 1, 2 and 3 and was rolled (sealed at 5 records);
/// returns the sealed segment's id.
fn with_sealed_replicated_segment() -> (MetaState, u64) {
    let mut create = create("orders", None);
    if let MetaCommand::CreateTopic(create) = &mut create {
        create.replicas = vec![1, 2, 3];
    }
    let mut state = MetaState::default();
    let MetaResponse::TopicCreated { topic_id, ranges } = apply_ok(&mut state, create) else {
        panic!("create answered something else");
    };
    let rolled = roll(&state, topic_id, 0, 5, NOW_MS + 1);
    apply_ok(&mut state, rolled);
    (state, ranges[0].1)
}

#[test]
fn settled_copies_are_recorded_for_replicas_of_sealed_segments_only() {
    let (mut state, sealed) = with_sealed_replicated_segment();
    let head = state.segments.keys().copied().max().unwrap();
    let settle = |segment_id, nodes: &[u64], settled| MetaCommand::CopiesSettled {
        segment_id,
        nodes: nodes.to_vec(),
        settled,
    };
    // (command, copies changed, settled copies after)
    let cases: Vec<(MetaCommand, u64, Vec<u64>)> = vec![
        (settle(sealed, &[3, 1], true), 2, vec![1, 3]),
        (settle(sealed, &[1], true), 0, vec![1, 3]),
        (settle(sealed, &[7], true), 0, vec![1, 3]),
        (settle(sealed, &[3], false), 1, vec![1]),
        (settle(999, &[2], true), 0, vec![1]),
        (settle(head, &[1], true), 0, vec![1]),
    ];
    for (command, changed, after) in cases {
        let response = apply_ok(&mut state, command.clone());
        assert_eq!(response, MetaResponse::CopiesRecorded { changed }, "{command:?}");
        assert_eq!(state.segment(sealed).unwrap().settled_on, after, "{command:?}");
    }
    assert!(state.segment(head).unwrap().settled_on.is_empty());
}

#[test]
fn a_replica_moves_only_off_a_sealed_segment_with_a_settled_copy_left() {
    let (mut state, sealed) = with_sealed_replicated_segment();
    let head = state.segments.keys().copied().max().unwrap();
    let replace = |segment_id, old, new| MetaCommand::ReplaceReplica { segment_id, old, new };
    assert_refused(&mut state, replace(sealed, 2, 4), "invalid_replicas");
    let settle = MetaCommand::CopiesSettled { segment_id: sealed, nodes: vec![2], settled: true };
    apply_ok(&mut state, settle);
    let refusals = [
        (replace(sealed, 2, 4), "the only settled copy would go"),
        (replace(sealed, 9, 4), "9 holds no replica"),
        (replace(sealed, 1, 3), "3 holds one already"),
        (replace(head, 1, 4), "the head is active"),
        (replace(999, 1, 4), "no such segment"),
    ];
    for (command, why) in refusals {
        let before = state.clone();
        assert!(state.apply(command).is_err(), "{why}");
        assert_eq!(state, before, "{why}");
    }
    assert_eq!(apply_ok(&mut state, replace(sealed, 1, 4)), MetaResponse::ReplicaReplaced);
    let segment = state.segment(sealed).unwrap();
    assert_eq!(segment.replicas, vec![1, 2, 3, 4], "the old replica stays until the new settles");
    assert_eq!(segment.staying_replicas(), vec![2, 3, 4]);
    assert_eq!(segment.settled_on, vec![2], "the new copy is not settled until it says so");
    assert!(state.apply(replace(sealed, 1, 5)).is_err(), "a replica moves once at a time");
    // The new replica dies before its copy settled: it is replaced in place.
    assert_eq!(apply_ok(&mut state, replace(sealed, 4, 5)), MetaResponse::ReplicaReplaced);
    let segment = state.segment(sealed).unwrap();
    assert_eq!(segment.replicas, vec![1, 2, 3, 5]);
    assert_eq!(segment.moves, vec![moving(1, 5)]);
    // Another settled copy does not finish the move; the new one's does.
    let settle =
        |nodes: Vec<u64>| MetaCommand::CopiesSettled { segment_id: sealed, nodes, settled: true };
    apply_ok(&mut state, settle(vec![1, 3]));
    assert_eq!(state.segment(sealed).unwrap().replicas, vec![1, 2, 3, 5]);
    apply_ok(&mut state, settle(vec![5]));
    let segment = state.segment(sealed).unwrap();
    assert_eq!(segment.replicas, vec![2, 3, 5], "the old replica goes once the new settled");
    assert_eq!(segment.settled_on, vec![2, 3, 5]);
    assert!(segment.moves.is_empty());
    assert!(!segment.created_on.contains(&1));
    assert_eq!(segment.dropped, vec![1, 4], "both dropped replicas' files are to be reclaimed");
    state.check_invariants().expect("invariants hold after a move");
    // A dropped broker takes no new replica until it reports its files deleted, and then may.
    assert_refused(&mut state, replace(sealed, 2, 1), "invalid_replicas");
    let reclaimed =
        |node| MetaCommand::ReclaimDone { segment_ids: vec![sealed], node_id: Some(node) };
    let cases = [(7, 0, vec![1, 4]), (4, 1, vec![1]), (1, 1, vec![]), (1, 0, vec![])];
    for (node, removed, left) in cases {
        let response = apply_ok(&mut state, reclaimed(node));
        assert_eq!(response, MetaResponse::ReclaimAcknowledged { removed }, "node {node}");
        assert_eq!(state.segment(sealed).unwrap().dropped, left, "node {node}");
    }
    assert_eq!(apply_ok(&mut state, replace(sealed, 2, 1)), MetaResponse::ReplicaReplaced);
    state.check_invariants().expect("invariants hold after a move back");
}

/// A sealed segment placed on fewer brokers than the replication factor gains a replica (it
/// counts once settled); the refusals leave the state unchanged.
#[test]
fn a_replica_is_added_only_to_a_sealed_segment_with_a_settled_copy() {
    let (mut state, sealed) = with_sealed_replicated_segment();
    let head = state.segments.keys().copied().max().unwrap();
    let add = |segment_id, new| MetaCommand::AddReplica { segment_id, new };
    assert_refused(&mut state, add(sealed, 4), "invalid_replicas");
    let settle = MetaCommand::CopiesSettled { segment_id: sealed, nodes: vec![2], settled: true };
    apply_ok(&mut state, settle);
    let refusals = [
        (add(sealed, 3), "3 holds one already"),
        (add(head, 4), "the head is active"),
        (add(999, 4), "no such segment"),
    ];
    for (command, why) in refusals {
        let before = state.clone();
        assert!(state.apply(command).is_err(), "{why}");
        assert_eq!(state, before, "{why}");
    }
    // At the per-segment replica limit, no replica is added.
    state.limits.max_replicas_per_segment = 3;
    assert_refused(&mut state, add(sealed, 4), "invalid_replicas");
    state.limits.max_replicas_per_segment = 4;
    assert_eq!(apply_ok(&mut state, add(sealed, 4)), MetaResponse::ReplicaAdded);
    let segment = state.segment(sealed).unwrap();
    assert_eq!(segment.replicas, vec![1, 2, 3, 4]);
    assert_eq!(segment.settled_on, vec![2], "the new copy counts once settled");
    state.check_invariants().expect("invariants hold after an add");
    // Deleting the topic reclaims every holder's files, the dropped ones' too.
    let deleted = state.segment(sealed).unwrap().topic_id;
    let name = state.topic(deleted).unwrap().name.clone();
    apply_ok(&mut state, MetaCommand::DeleteTopic { name });
    assert_eq!(state.pending_reclaim()[&sealed].replicas, vec![1, 2, 3, 4]);
}

fn moving(old: u64, new: u64) -> crate::model::ReplicaMove {
    crate::model::ReplicaMove { old, new }
}
