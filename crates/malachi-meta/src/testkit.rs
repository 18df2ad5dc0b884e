//! Helpers shared by the unit tables: command builders and the refusal check (a refused command
//! must leave the state, and so its hash, unchanged). Test-only; does no I/O.

use crate::command::{CreateTopic, MetaCommand, MetaResponse, RollSegment, SplitRange};
use crate::limits::Quota;
use crate::model::{SealReport, SegmentRoll};
use crate::state::MetaState;

/// A fixed "now" for tables that do not care about time.
pub const NOW_MS: u64 = 1_700_000_000_000;

pub fn create(name: &str, initial_ranges: Option<u32>) -> MetaCommand {
    MetaCommand::CreateTopic(CreateTopic {
        name: name.to_string(),
        now_ms: NOW_MS,
        initial_ranges,
        segment_roll: SegmentRoll::default(),
        replicas: vec![1],
        creator: None,
        quota: Quota::default(),
    })
}

pub fn apply_ok(state: &mut MetaState, command: MetaCommand) -> MetaResponse {
    match state.apply(command.clone()) {
        Ok(response) => response,
        Err(error) => panic!("{command:?} refused: {error} ({})", error.reason()),
    }
}

/// A state holding one topic; returns its id.
pub fn with_topic(name: &str, initial_ranges: Option<u32>) -> (MetaState, u64) {
    let mut state = MetaState::default();
    let MetaResponse::TopicCreated { topic_id, .. } =
        apply_ok(&mut state, create(name, initial_ranges))
    else {
        panic!("create answered something else");
    };
    (state, topic_id)
}

/// A seal report for the range's current active segment.
pub fn seal_of(state: &MetaState, topic_id: u64, range_id: u32, end_offset: u64) -> SealReport {
    let range = &state.topic(topic_id).expect("topic").ranges[&range_id];
    let segment_id = range.active_segment_id().expect("active range");
    SealReport { segment_id, end_offset, data_bytes: end_offset * 100 }
}

pub fn split(state: &MetaState, topic_id: u64, range_id: u32, end_offset: u64) -> MetaCommand {
    MetaCommand::SplitRange(SplitRange {
        topic_id,
        range_id,
        seal: Some(seal_of(state, topic_id, range_id, end_offset)),
        now_ms: NOW_MS + 10,
        child_replicas: [vec![1], vec![2]],
        quota: Quota::default(),
    })
}

pub fn roll(
    state: &MetaState,
    topic_id: u64,
    range_id: u32,
    end_offset: u64,
    now_ms: u64,
) -> MetaCommand {
    MetaCommand::RollSegment(RollSegment {
        topic_id,
        range_id,
        seal: seal_of(state, topic_id, range_id, end_offset),
        now_ms,
        replicas: vec![1],
    })
}

/// Applies `command`, expects a refusal with `reason`, and checks nothing changed.
pub fn assert_refused(state: &mut MetaState, command: MetaCommand, reason: &str) {
    let before = state.clone();
    let hash_before = state.state_hash();
    match state.apply(command.clone()) {
        Ok(response) => panic!("{command:?} accepted: {response:?}, expected {reason}"),
        Err(error) => assert_eq!(error.reason(), reason, "{command:?}: {error}"),
    }
    assert_eq!(state.state_hash(), hash_before, "{command:?} changed the hash");
    assert_eq!(*state, before, "{command:?} changed the state");
}
