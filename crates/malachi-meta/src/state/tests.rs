//! Whole-machine properties on fixed command logs: versioning, replay determinism, snapshot
//! round trips and the full invariant check.

use crate::command::{MetaCommand, MetaResponse};
use crate::state::MetaState;
use crate::testkit::{NOW_MS, apply_ok, create, roll, split};

fn scripted_log() -> Vec<MetaCommand> {
    let mut state = MetaState::default();
    let mut log = Vec::new();
    let mut run = |state: &mut MetaState, command: MetaCommand| {
        log.push(command.clone());
        let _ = state.apply(command);
    };
    run(&mut state, create("orders", Some(2)));
    run(&mut state, create("orders", None));
    let command = roll(&state, 1, 0, 10, NOW_MS + 1);
    run(&mut state, command);
    let command = split(&state, 1, 1, 5);
    run(&mut state, command);
    run(&mut state, MetaCommand::DeleteTopic { name: "orders".into() });
    run(&mut state, create("orders", Some(4)));
    log
}

#[test]
fn version_counts_accepted_commands_only() {
    let mut state = MetaState::default();
    for command in scripted_log() {
        let before = state.version();
        let accepted = state.apply(command).is_ok();
        assert_eq!(state.version(), before + u64::from(accepted));
    }
    assert_eq!(state.version(), 5, "the duplicate create was refused");
}

#[test]
fn replaying_a_log_gives_the_same_state() {
    let replay = || {
        let mut state = MetaState::default();
        let outcomes: Vec<Result<MetaResponse, String>> = scripted_log()
            .into_iter()
            .map(|command| state.apply(command).map_err(|error| error.reason_text()))
            .collect();
        (state, outcomes)
    };
    let (first, first_outcomes) = replay();
    let (second, second_outcomes) = replay();
    assert_eq!(first_outcomes, second_outcomes);
    assert_eq!(first.state_hash(), second.state_hash());
    assert_eq!(first, second);
    first.check_invariants().expect("invariants");
}

#[test]
fn snapshots_round_trip_with_the_same_hash() {
    let mut state = MetaState::default();
    for command in scripted_log() {
        let _ = state.apply(command);
    }
    let json = serde_json::to_vec(&state).expect("serializes");
    let restored: MetaState = serde_json::from_slice(&json).expect("deserializes");
    assert_eq!(restored.state_hash(), state.state_hash());
    assert_eq!(restored, state);
    let mut changed = restored.clone();
    apply_ok(&mut changed, create("other", None));
    assert_ne!(changed.state_hash(), state.state_hash(), "the hash sees a change");
}

#[test]
fn an_empty_state_holds_its_invariants() {
    let state = MetaState::default();
    state.check_invariants().expect("invariants");
    assert_eq!((state.version(), state.topics().count()), (0, 0));
}

/// A vnode claims its arc once: it then hands out ids from its block and refuses names that
/// hash elsewhere; another arc, or an arc that leaves a topic outside, is refused unchanged.
#[test]
fn a_vnode_holds_its_arc_and_its_id_block() {
    use crate::error::TopicError;
    use crate::ring::{VnodeArc, vnode_of_name};
    let count = 4;
    let names: Vec<String> = (0..40).map(|i| format!("topic-{i}")).collect();
    let mine: Vec<&String> = names.iter().filter(|name| vnode_of_name(name, count) == 3).collect();
    let theirs = names.iter().find(|name| vnode_of_name(name, count) != 3).unwrap();
    assert!(mine.len() >= 2, "enough names hash to vnode 3");
    let arc = VnodeArc::of(3, count);

    let mut state = MetaState::default();
    let claim = MetaCommand::ClaimArc { arc };
    assert_eq!(state.apply(claim.clone()), Ok(MetaResponse::ArcClaimed { already: false }));
    assert_eq!(state.apply(claim), Ok(MetaResponse::ArcClaimed { already: true }));
    let other = MetaCommand::ClaimArc { arc: VnodeArc::of(2, count) };
    assert_eq!(state.apply(other).unwrap_err().reason(), "arc_refused");

    let MetaResponse::TopicCreated { topic_id, ranges } =
        apply_ok(&mut state, create(mine[0], Some(2)))
    else {
        panic!("created");
    };
    assert_eq!((topic_id, crate::ring::vnode_of_id(topic_id)), (arc.id_base() + 1, 3));
    assert!(ranges.iter().all(|(_, segment_id)| arc.owns_id(*segment_id)));
    let before = state.state_hash();
    for refused in [
        create(theirs, None),
        MetaCommand::DeleteTopic { name: theirs.clone() },
        MetaCommand::BindTopicPolicy { topic: theirs.clone(), policy: None },
    ] {
        let error = state.apply(refused).unwrap_err();
        assert!(matches!(error, crate::MetaError::Topic(TopicError::WrongVnode { .. })), "{error}");
    }
    assert_eq!(state.state_hash(), before, "refusals change nothing");
    state.check_invariants().unwrap();

    // A state from before the ring holds topics anywhere: it may claim only a whole ring.
    let mut legacy = MetaState::default();
    apply_ok(&mut legacy, create(mine[1], None));
    apply_ok(&mut legacy, create(theirs, None));
    let partial = MetaCommand::ClaimArc { arc };
    assert_eq!(legacy.apply(partial).unwrap_err().reason(), "arc_refused");
    let whole = MetaCommand::ClaimArc { arc: VnodeArc::of(1, 1) };
    assert_eq!(legacy.apply(whole), Ok(MetaResponse::ArcClaimed { already: false }));
    legacy.check_invariants().unwrap();
}

/// The fence of coordinator terms: commands of a term older than one a coordinator acted in are
/// refused and counted; only the coordinator's commands may be wrapped.
#[test]
fn stale_coordinator_commands_are_refused_and_counted() {
    let mut state = MetaState::default();
    apply_ok(&mut state, create("orders", None));
    let coordinated =
        |term, command: MetaCommand| MetaCommand::Coordinated { term, command: Box::new(command) };
    // (term, outcome reason or "ok")
    let steps = [(3, "ok"), (3, "ok"), (5, "ok"), (4, "stale_coordinator"), (5, "ok")];
    for (at, (term, expected)) in steps.into_iter().enumerate() {
        let roll = roll(&state, 1, 0, 10 * (at as u64 + 1), NOW_MS + at as u64);
        let outcome = state.apply(coordinated(term, roll));
        let got = outcome.as_ref().map_or_else(|error| error.reason_text(), |_| "ok".to_string());
        assert_eq!(got, expected, "step {at}");
    }
    assert_eq!(state.stale_coordinator_commands(), 1);
    let wrapped_create = coordinated(9, create("other", None));
    assert_eq!(state.apply(wrapped_create).unwrap_err().reason(), "not_coordinated");
    state.check_invariants().unwrap();
}
