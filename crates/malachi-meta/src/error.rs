//! Typed errors, one enum per area, each with `reason()`: its entry in the workspace's one table
//! of reasons (`malachi-reason`; `wire-protocol.md` sections 3.4, 3.5 and 4, reasons it does
//! not list are ours and documented on the variant), and where the answer carries detail,
//! `reason_text()`, the exact text. Every error here is a refusal the caller can handle: the
//! machine's state is unchanged. Broken invariants are not errors; they are assertions. Does no
//! I/O.

use malachi_reason::Reason;
use serde::{Deserialize, Serialize};

/// Any refusal of a [`crate::MetaCommand`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum MetaError {
    #[error(transparent)]
    Topic(#[from] TopicError),
    #[error(transparent)]
    Range(#[from] RangeError),
    #[error(transparent)]
    Group(#[from] GroupError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    Retention(#[from] RetentionError),
    /// Ours: a coordinator's command decided in a term older than one a coordinator already
    /// acted in. The fence refuses it; a correct coordinator never sends one (its commands
    /// enter the log in the term they were decided in, and the log's terms only grow).
    #[error("a coordinator command of term {term}, after one of term {latest}")]
    StaleCoordinator { term: u64, latest: u64 },
    /// Ours: only a coordinator's commands may be wrapped, once.
    #[error("not a coordinator's command")]
    NotCoordinated,
}

impl MetaError {
    pub fn reason(&self) -> Reason {
        match self {
            MetaError::Topic(error) => error.reason(),
            MetaError::Range(error) => error.reason(),
            MetaError::Group(error) => error.reason(),
            MetaError::Policy(error) => error.reason(),
            MetaError::Retention(error) => error.reason(),
            MetaError::StaleCoordinator { .. } => Reason::StaleCoordinator,
            MetaError::NotCoordinated => Reason::NotCoordinated,
        }
    }

    /// The exact text an answer carries: the reason, with detail where it has any.
    pub fn reason_text(&self) -> String {
        match self {
            MetaError::Policy(error) => error.reason_text(),
            other => other.reason().as_str().to_owned(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum TopicError {
    #[error("topic names are [A-Za-z0-9._-]{{1,249}}, not `.` or `..`")]
    InvalidTopicName,
    #[error("a topic with this name exists")]
    AlreadyExists,
    #[error("no such topic")]
    NoSuchTopic,
    /// Ours: the initial range count is not a power of two in `1..=256` (and the topic limit).
    #[error("initial range count {count} is not a power of two in 1..={max}")]
    InvalidRangeCount { count: u32, max: u32 },
    /// Ours: a per-topic roll threshold below its floor.
    #[error("segment roll threshold below its floor: {detail}")]
    InvalidSegmentRoll { detail: String },
    /// Ours.
    #[error("the machine already holds {limit} topics")]
    TooManyTopics { limit: u32 },
    /// Ours: `MALACHI_MAX_TOPICS_PER_USER`.
    #[error("{creator} already created {limit} topics")]
    TooManyTopicsForCreator { creator: String, limit: u32 },
    /// Ours: `MALACHI_MAX_ACTIVE_RANGES` over all topics.
    #[error("the cluster already holds {limit} active ranges")]
    TooManyRanges { limit: u32 },
    /// Ours: empty, duplicated or too many replica node ids.
    #[error("invalid replica list: {detail}")]
    InvalidReplicas { detail: String },
    /// Ours, between brokers: the name hashes outside this vnode's arc of the ring (a broker
    /// routed the command to the wrong vnode). Clients never see it.
    #[error("topic {name:?} belongs to another vnode")]
    WrongVnode { name: String },
    /// Ours, between brokers: the vnode was asked to claim an arc other than the one it holds,
    /// or one that leaves some of its topics outside.
    #[error("this vnode cannot claim that arc: {detail}")]
    ArcRefused { detail: String },
}

impl TopicError {
    pub fn reason(&self) -> Reason {
        match self {
            TopicError::InvalidTopicName => Reason::InvalidTopicName,
            TopicError::AlreadyExists => Reason::AlreadyExists,
            TopicError::NoSuchTopic => Reason::NoSuchTopic,
            TopicError::InvalidRangeCount { .. } => Reason::InvalidRangeCount,
            TopicError::InvalidSegmentRoll { .. } => Reason::InvalidSegmentRoll,
            TopicError::TooManyTopics { .. } | TopicError::TooManyTopicsForCreator { .. } => {
                Reason::TooManyTopics
            }
            TopicError::TooManyRanges { .. } => Reason::TooManyRanges,
            TopicError::InvalidReplicas { .. } => Reason::InvalidReplicas,
            TopicError::WrongVnode { .. } => Reason::WrongVnode,
            TopicError::ArcRefused { .. } => Reason::ArcRefused,
        }
    }
}

/// Refusals of split, merge and roll. All reasons are ours (the wire has no such keys).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum RangeError {
    #[error("no range {range_id} in this topic")]
    NoSuchRange { range_id: u32 },
    #[error("range {range_id} is sealed")]
    RangeSealed { range_id: u32 },
    /// The seal-first fence: a split or merge without the data plane's seal of the write head
    /// is refused, never performed unfenced.
    #[error("range {range_id} has no seal report for its write head")]
    Unfenced { range_id: u32 },
    /// The report names a segment other than the range's active one.
    #[error("range {range_id}: reported segment {reported} is not the active segment {active}")]
    NotActiveSegment { range_id: u32, reported: u64, active: u64 },
    /// The segment is already sealed at exactly the reported length (a replayed request).
    #[error("segment {segment_id} is already sealed at that length")]
    AlreadySealed { segment_id: u64 },
    /// The segment is already sealed at a different length: sealed lengths never change.
    #[error(
        "segment {segment_id} is sealed at {recorded_end_offset} records / {recorded_data_bytes} \
         bytes; a seal at {reported_end_offset} / {reported_data_bytes} is refused"
    )]
    SealConflict {
        segment_id: u64,
        recorded_end_offset: u64,
        recorded_data_bytes: u64,
        reported_end_offset: u64,
        reported_data_bytes: u64,
    },
    #[error("range {range_id} has width 1 and cannot split")]
    RangeTooSmall { range_id: u32 },
    #[error("ranges {first} and {second} are not the two halves of one aligned block")]
    NotBuddies { first: u32, second: u32 },
    #[error("the topic already has {limit} active ranges")]
    TooManyActiveRanges { limit: u32 },
    /// Ours: `MALACHI_MAX_ACTIVE_RANGES` over all topics.
    #[error("the cluster already holds {limit} active ranges")]
    TooManyRangesInAll { limit: u32 },
    #[error("the topic already created {limit} ranges")]
    RangeHistoryFull { limit: u32 },
    #[error("range {range_id} already retains {limit} segments")]
    TooManySegments { range_id: u32, limit: u32 },
    #[error("invalid replica list: {detail}")]
    InvalidReplicas { detail: String },
}

impl RangeError {
    pub fn reason(&self) -> Reason {
        match self {
            RangeError::NoSuchRange { .. } => Reason::NoSuchRange,
            RangeError::RangeSealed { .. } => Reason::RangeSealed,
            RangeError::Unfenced { .. } => Reason::Unfenced,
            RangeError::NotActiveSegment { .. } => Reason::SealMismatch,
            RangeError::AlreadySealed { .. } => Reason::SegmentAlreadySealed,
            RangeError::SealConflict { .. } => Reason::SealConflict,
            RangeError::RangeTooSmall { .. } => Reason::RangeTooSmall,
            RangeError::NotBuddies { .. } => Reason::NotBuddies,
            RangeError::TooManyActiveRanges { .. } | RangeError::TooManyRangesInAll { .. } => {
                Reason::TooManyRanges
            }
            RangeError::RangeHistoryFull { .. } => Reason::RangeHistoryFull,
            RangeError::TooManySegments { .. } => Reason::TooManySegments,
            RangeError::InvalidReplicas { .. } => Reason::InvalidReplicas,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum GroupError {
    /// Ours: empty, longer than 255 bytes, or holding control characters.
    #[error("invalid consumer group name")]
    InvalidGroupName,
    #[error("no range {range_id} in this topic")]
    NoSuchRange { range_id: u32 },
    /// A position that does not lie in its range. Its reason is the wire's `invalid_cursor`
    /// because positions only reach a commit by way of a cursor.
    #[error("position {position} is not valid in range {range_id}")]
    InvalidPosition { range_id: u32, position: String },
    /// Ours: the commit named a generation the group has moved past.
    #[error("expected generation {expected}, the group is at {actual}")]
    GenerationMismatch { expected: u64, actual: u64 },
    /// Ours.
    #[error("the topic already has {limit} consumer groups")]
    TooManyGroups { limit: u32 },
    /// A member's commit or heartbeat the membership refused.
    #[error(transparent)]
    Membership(#[from] crate::membership::MembershipError),
}

impl GroupError {
    pub fn reason(&self) -> Reason {
        match self {
            GroupError::InvalidGroupName => Reason::InvalidGroup,
            GroupError::NoSuchRange { .. } => Reason::NoSuchRange,
            GroupError::InvalidPosition { .. } => Reason::InvalidCursor,
            GroupError::GenerationMismatch { .. } => Reason::GenerationMismatch,
            GroupError::TooManyGroups { .. } => Reason::TooManyGroups,
            GroupError::Membership(error) => error.reason(),
        }
    }
}

/// Storage-policy refusals with the reason strings of wire-protocol.md section 3.5.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum PolicyError {
    #[error("policy names are [A-Za-z0-9._-]{{1,249}}, not `.` or `..`")]
    InvalidPolicyName,
    #[error("invalid topic name")]
    InvalidTopic,
    #[error("no such policy")]
    NoSuchPolicy,
    #[error("no such topic")]
    NoSuchTopic,
    /// Topics still bound, sorted by name; the reason lists at most 64 of them.
    #[error("policy is bound to {} topics", topics.len())]
    PolicyInUse { topics: Vec<String> },
    #[error("unknown policy field {0}")]
    UnknownField(String),
    #[error("duplicate policy field {0}")]
    DuplicateField(String),
    #[error("invalid value for policy field {0}")]
    InvalidField(String),
    #[error("{limit} policies are already defined")]
    TooManyPolicies { limit: u32 },
}

/// Most topic names a `policy_in_use` reason lists before summarising the rest.
const POLICY_IN_USE_NAMES_MAX: usize = 64;

impl PolicyError {
    pub fn reason(&self) -> Reason {
        match self {
            PolicyError::InvalidPolicyName => Reason::InvalidPolicyName,
            PolicyError::InvalidTopic => Reason::InvalidTopic,
            PolicyError::NoSuchPolicy => Reason::NoSuchPolicy,
            PolicyError::NoSuchTopic => Reason::NoSuchTopic,
            PolicyError::PolicyInUse { .. } => Reason::PolicyInUse,
            PolicyError::UnknownField(_) => Reason::UnknownPolicyField,
            PolicyError::DuplicateField(_) => Reason::DuplicatePolicyField,
            PolicyError::InvalidField(_) => Reason::InvalidPolicyField,
            PolicyError::TooManyPolicies { .. } => Reason::InvalidPolicy,
        }
    }

    /// The exact text of section 3.5: the reason, then the detail most of these carry.
    pub fn reason_text(&self) -> String {
        let reason = self.reason();
        match self {
            PolicyError::PolicyInUse { topics } => policy_in_use_reason(topics),
            PolicyError::UnknownField(field)
            | PolicyError::DuplicateField(field)
            | PolicyError::InvalidField(field) => format!("{reason}: {field}"),
            PolicyError::TooManyPolicies { limit } => {
                format!("{reason}: {limit} policies are already defined")
            }
            _ => reason.as_str().to_owned(),
        }
    }
}

fn policy_in_use_reason(topics: &[String]) -> String {
    let shown = &topics[..topics.len().min(POLICY_IN_USE_NAMES_MAX)];
    let mut reason = format!("{}: {}", Reason::PolicyInUse, shown.join(", "));
    if topics.len() > shown.len() {
        reason.push_str(&format!(" and {} more", topics.len() - shown.len()));
    }
    reason
}

/// Refusals of an expire command: each means the plan it carries is wrong, not stale (stale
/// entries, whose topic or segment is already gone, are skipped and reported instead).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum RetentionError {
    #[error("no range {range_id} in topic {topic_id}")]
    NoSuchRange { topic_id: u64, range_id: u32 },
    #[error("segment {segment_id} is active; only sealed segments expire")]
    ActiveSegment { segment_id: u64 },
    #[error("segment {segment_id} is not the oldest retained segment of its range")]
    NotOldest { segment_id: u64 },
    #[error("segment {segment_id} does not belong to the named topic and range")]
    WrongRange { segment_id: u64 },
    #[error("{count} items exceed the per-command limit of {limit}")]
    TooManyItems { count: u64, limit: u32 },
}

impl RetentionError {
    pub fn reason(&self) -> Reason {
        match self {
            RetentionError::NoSuchRange { .. } => Reason::NoSuchRange,
            RetentionError::ActiveSegment { .. } => Reason::SegmentActive,
            RetentionError::NotOldest { .. } => Reason::SegmentNotOldest,
            RetentionError::WrongRange { .. } => Reason::SegmentRangeMismatch,
            RetentionError::TooManyItems { .. } => Reason::TooManyItems,
        }
    }
}

/// Refusals of an [`crate::AdminCommand`], with the reasons of wire-protocol.md section 3.4.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum AdminError {
    #[error("permissions are admin, produce and consume")]
    InvalidPermissions,
    #[error("user exists")]
    UserExists,
    #[error("user not found")]
    UserNotFound,
    #[error("operations are produce and consume")]
    InvalidOperation,
    #[error("an ACL pattern is a topic name or a prefix of one followed by a single `*`")]
    InvalidAcl,
    #[error("roles are viewer, editor and admin (none removes)")]
    InvalidRole,
    /// Ours: empty, longer than 255 bytes, or holding control characters.
    #[error("invalid username")]
    InvalidUsername,
    /// Ours: the hash is computed outside; an empty or oversized one is a caller bug.
    #[error("invalid password hash")]
    InvalidPasswordHash,
    /// Ours: the login source is empty or too long.
    #[error("invalid client address")]
    InvalidAddress,
    /// Ours.
    #[error("{limit} users already exist")]
    TooManyUsers { limit: u32 },
    /// Ours.
    #[error("the user already holds {limit} ACL grants")]
    TooManyAcls { limit: u32 },
    /// Ours: a broker registration with node id 0, an empty or oversized address, or more
    /// brokers than the cluster may hold.
    #[error("invalid broker registration: {0}")]
    InvalidBroker(String),
    #[error(transparent)]
    Policy(#[from] PolicyError),
}

impl AdminError {
    pub fn reason(&self) -> Reason {
        match self {
            AdminError::Policy(error) => error.reason(),
            AdminError::InvalidPermissions => Reason::InvalidPermissions,
            AdminError::UserExists => Reason::UserExists,
            AdminError::UserNotFound => Reason::UserNotFound,
            AdminError::InvalidOperation => Reason::InvalidOperation,
            AdminError::InvalidAcl => Reason::InvalidAcl,
            AdminError::InvalidRole => Reason::InvalidRole,
            AdminError::InvalidUsername => Reason::InvalidUsername,
            AdminError::InvalidPasswordHash => Reason::InvalidPasswordHash,
            AdminError::InvalidAddress => Reason::InvalidAddress,
            AdminError::TooManyUsers { .. } => Reason::TooManyUsers,
            AdminError::TooManyAcls { .. } => Reason::TooManyAcls,
            AdminError::InvalidBroker(_) => Reason::InvalidBroker,
        }
    }

    /// The exact text an answer carries: the reason, with detail where it has any.
    pub fn reason_text(&self) -> String {
        match self {
            AdminError::Policy(error) => error.reason_text(),
            other => other.reason().as_str().to_owned(),
        }
    }
}
