//! Malachi's metadata state machine: topics, ranges, segments, consumer-group positions,
//! storage policies and retention (in [`MetaState`]), and users, ACL grants and login lockouts
//! (in [`AdminState`]).
//!
//! Both machines are pure functions of their command logs: `apply(&mut self, command)` returns
//! a typed response or a typed error whose `reason()` is the exact wire text, and a refused
//! command leaves the state byte-for-byte unchanged. This crate does no I/O: no clock (time
//! travels inside commands as `now_ms`), no randomness, no node identity, no hash maps, no
//! floating point. Everything is serde-serializable because commands go into a Raft log and
//! state into snapshots; [`MetaState::state_hash`] and [`AdminState::state_hash`] prove two
//! replays identical. Invariants are asserted with `assert!`, on in release builds too.

pub mod admin;
pub mod assignment;
pub mod command;
pub mod error;
pub mod groups;
pub mod invariants;
pub mod keyspace;
pub mod limits;
pub mod membership;
pub mod model;
pub mod names;
pub mod placement;
pub mod policy;
pub mod reshard;
pub mod retention;
pub mod ring;
pub mod segments;
pub mod state;
pub mod topics;

#[cfg(test)]
mod testkit;

pub use admin::{
    AclGrant, AdminCommand, AdminLimits, AdminResponse, AdminState, BrokerRecord, LockoutEntry,
    LockoutPolicy, Operation, Permission, Role, User,
};
pub use command::{
    CommitMember, CommitPositions, CreateTopic, GroupHeartbeat, MergeRanges, MetaCommand,
    MetaResponse, RollSegment, SplitRange,
};
pub use error::TopicError;
pub use error::{AdminError, GroupError, MetaError, PolicyError, RangeError, RetentionError};
pub use invariants::InvariantViolation;
pub use keyspace::{Extent, key_point};
pub use limits::{MAX_INITIAL_RANGES, MetaLimits, Quota};
pub use model::{
    ConsumerGroup, GroupPosition, Position, Range, RangeState, ReclaimEntry, ReplicaMove,
    SealReport, Segment, SegmentRef, SegmentRoll, SegmentRollDefaults, SegmentState, Topic,
};
pub use names::validate_topic_name;
pub use policy::{
    EffectiveField, EffectiveRetention, FieldOrigin, PolicyDefaults, PolicyDefinition,
    PolicyDefinitions, PolicyField, PolicyResolution, PolicySetting, PolicyValue,
    RetentionDefaults, TopicPolicyView,
};
pub use ring::{
    RingCommand, RingError, RingResponse, RingState, VnodeArc, name_point, vnode_of_id,
    vnode_of_name,
};
pub use state::MetaState;
