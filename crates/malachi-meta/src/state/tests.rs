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
            .map(|command| state.apply(command).map_err(|error| error.reason()))
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
