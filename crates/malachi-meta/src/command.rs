//! The commands [`crate::MetaState::apply`] accepts and the responses it returns. Does no I/O.
//!
//! Commands are what the Raft log carries, so each holds everything its effect depends on:
//! the time (`now_ms`, read once by the proposer), the replica lists placement chose, and the
//! data plane's seal reports. Admin-facing commands name topics by name; data-plane commands
//! name them by `topic_id`, so a command meant for a deleted topic can never act on a newly
//! created topic with the same name.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::limits::Quota;
use crate::model::{GroupPosition, SealReport, SegmentRef, SegmentRoll};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaCommand {
    CreateTopic(CreateTopic),
    /// Drops the topic, its ranges, groups and binding; its segments move to pending reclaim.
    DeleteTopic {
        name: String,
    },
    /// `DeleteTopic` behind the seal-first fence: `fenced_heads` are the topic's active segments
    /// the data plane sealed first (in any order); refused (`unfenced`) unless they are exactly
    /// its active segments now, so that no broker can still take appends into a deleted topic.
    DeleteFencedTopic {
        name: String,
        fenced_heads: Vec<u64>,
    },
    SplitRange(SplitRange),
    MergeRanges(MergeRanges),
    RollSegment(RollSegment),
    CommitPositions(CommitPositions),
    /// A member of a group joins (`applied` absent) or heartbeats; answered with its ranges.
    GroupHeartbeat(GroupHeartbeat),
    /// A member leaves its group; its ranges are handed out at once.
    LeaveGroupMember {
        topic_id: u64,
        group: String,
        member: String,
        now_ms: u64,
        session_ms: u64,
    },
    DeleteGroup {
        topic_id: u64,
        group: String,
    },
    /// From before the definitions moved to the administrative machine: found only in the
    /// logs of older data directories, replayed into the vnode's legacy definitions, which
    /// the broker moves to the administrative machine at boot (`ForgetLegacyPolicies`).
    DefinePolicy {
        name: String,
        fields: Vec<crate::policy::PolicyField>,
    },
    /// As `DefinePolicy`: a legacy delete, replayed from an older log.
    DeletePolicy {
        name: String,
        force: bool,
    },
    /// The broker moved these legacy definitions to the administrative machine.
    ForgetLegacyPolicies {
        names: Vec<String>,
    },
    /// `policy: None` detaches.
    BindTopicPolicy {
        topic: String,
        policy: Option<String>,
    },
    /// Applies a retention plan: each segment must be sealed and the oldest retained of its
    /// range at its turn. Entries whose topic or segment is already gone are skipped.
    ExpireSegments {
        segments: Vec<SegmentRef>,
    },
    /// The data plane deleted these segments' files; unknown ids are ignored. With `node_id`,
    /// that node deleted its copies: an entry goes once every replica it lists confirmed, so
    /// no broker's copy is forgotten while still on its disk. Without, the entries go at once
    /// (a broker alone, whose copies are all its own).
    ReclaimDone {
        segment_ids: Vec<u64>,
        #[serde(default)]
        node_id: Option<u64>,
    },
    /// Node `node_id` created (durably) its files of these segments: from now on a missing file
    /// there is damage, not a create that never happened. Ids that are gone, or whose replicas
    /// do not include the node, are ignored.
    SegmentFilesCreated {
        node_id: u64,
        segment_ids: Vec<u64>,
    },
    /// The vnode's first command: the arc of the ring it holds (from then on it refuses names
    /// outside it) and so the block its ids come from. Claiming the same arc again changes
    /// nothing; another arc is refused.
    ClaimArc {
        arc: crate::ring::VnodeArc,
    },
    /// The copies of sealed segment `segment_id` on `nodes` are settled (`settled`: sealed at
    /// the recorded length, intact), or are not any more (a check found them damaged, short or
    /// missing). Nodes that hold no replica, and segments gone or still active, are ignored.
    CopiesSettled {
        segment_id: u64,
        nodes: Vec<u64>,
        settled: bool,
    },
    /// Healing: the replica of sealed segment `segment_id` on `old` (dead too long, or its copy
    /// lost) starts moving to `new`: `new` joins the replica set beside `old`, its copy is
    /// rebuilt from a settled one, and `old` is dropped when `new` is reported settled
    /// (`Segment::moves`). Refused unless the segment is sealed, `old` holds a replica not
    /// moving already, `new` does not, and a settled copy remains elsewhere.
    ReplaceReplica {
        segment_id: u64,
        old: u64,
        new: u64,
    },
    /// Healing: sealed segment `segment_id` has fewer replicas than the replication factor
    /// (placed while brokers were down): `new` joins its replica set, its copy is rebuilt from
    /// a settled one and counts once reported settled. Refused unless the segment is sealed
    /// with a settled copy, `new` holds no replica, and no dropped copy of it waits there.
    AddReplica {
        segment_id: u64,
        new: u64,
    },
    /// A command the vnode's coordinator decided (roll, split, merge, expiry), with the term it
    /// was decided in: refused when a coordinator already acted in a later term (see
    /// `MetaError::StaleCoordinator`).
    Coordinated {
        term: u64,
        command: Box<MetaCommand>,
    },
}

impl MetaCommand {
    /// Whether the coordinator decides this command (and so must wrap it).
    pub fn is_coordinators(&self) -> bool {
        matches!(
            self,
            MetaCommand::RollSegment(_)
                | MetaCommand::SplitRange(_)
                | MetaCommand::MergeRanges(_)
                | MetaCommand::ExpireSegments { .. }
                | MetaCommand::ReplaceReplica { .. }
                | MetaCommand::AddReplica { .. }
        )
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateTopic {
    pub name: String,
    pub now_ms: u64,
    /// A power of two in `1..=256` (and within the active-range limit); `None` means 1.
    pub initial_ranges: Option<u32>,
    pub segment_roll: SegmentRoll,
    /// Replicas of every initial range's first segment; the first is the primary.
    pub replicas: Vec<u64>,
    /// The principal creating it, counted by `quota.max_topics_per_creator`; `None` for an
    /// administrator (exempt).
    #[serde(default)]
    pub creator: Option<String>,
    #[serde(default)]
    pub quota: Quota,
}

/// Split a range at its midpoint behind the seal-first fence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitRange {
    pub topic_id: u64,
    pub range_id: u32,
    /// Where the data plane fenced the range's active segment; `None` is refused (`unfenced`).
    pub seal: Option<SealReport>,
    pub now_ms: u64,
    /// Replicas of the low child's and the high child's first segments.
    pub child_replicas: [Vec<u64>; 2],
    #[serde(default)]
    pub quota: Quota,
}

/// Merge two active buddies into the block that holds both, behind the seal-first fence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergeRanges {
    pub topic_id: u64,
    /// In any order.
    pub range_ids: [u32; 2],
    /// `seals[i]` fences `range_ids[i]`'s active segment; a `None` is refused (`unfenced`).
    pub seals: [Option<SealReport>; 2],
    pub now_ms: u64,
    pub replicas: Vec<u64>,
}

/// Seal a range's active segment at the reported length and open the next one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RollSegment {
    pub topic_id: u64,
    pub range_id: u32,
    pub seal: SealReport,
    pub now_ms: u64,
    pub replicas: Vec<u64>,
}

/// Replace a group's positions for the ranges named (others are kept).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitPositions {
    pub topic_id: u64,
    pub group: String,
    pub positions: BTreeMap<u32, GroupPosition>,
    /// When set, the commit is refused unless the group is at this generation (0 = no group).
    pub expected_generation: Option<u64>,
    pub now_ms: u64,
    /// A member's commit: refused unless the member holds every range named (and, when it
    /// states one, at the membership's current generation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<CommitMember>,
}

/// Who commits, in a group with members.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitMember {
    pub member: String,
    /// The membership generation the member works at; `None` for clients that do not carry
    /// one (`fetch` and `stream_ack` with a member), which are checked by ownership alone.
    pub generation: Option<u64>,
    pub session_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupHeartbeat {
    pub topic_id: u64,
    pub group: String,
    pub member: String,
    /// The generation of the last answer the member applied; `None` to join.
    pub applied: Option<u64>,
    pub now_ms: u64,
    /// A member silent this long is dropped.
    pub session_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaResponse {
    /// `ranges[i] = (range_id, first segment_id)` in keyspace order.
    TopicCreated {
        topic_id: u64,
        ranges: Vec<(u32, u64)>,
    },
    /// Every segment of the topic, ascending; they are now pending reclaim.
    TopicDeleted {
        topic_id: u64,
        reclaim: Vec<u64>,
    },
    /// `children = [low, high]` with their first segments.
    RangeSplit {
        sealed_segment_id: u64,
        children: [u32; 2],
        child_segment_ids: [u64; 2],
    },
    /// `sealed_segment_ids` follow the command's `range_ids` order.
    RangesMerged {
        sealed_segment_ids: [u64; 2],
        range_id: u32,
        segment_id: u64,
    },
    SegmentRolled {
        sealed_segment_id: u64,
        segment_id: u64,
    },
    PositionsCommitted {
        generation: u64,
    },
    /// A member's ranges at the membership's `generation`.
    GroupAssignment {
        generation: u64,
        ranges: Vec<u32>,
    },
    GroupMemberLeft,
    GroupDeleted {
        existed: bool,
    },
    /// A legacy policy command was applied to the vnode's legacy definitions.
    LegacyPolicies,
    TopicPolicyBound {
        previous: Option<String>,
    },
    /// `expired_records`: records removed by this command, over all ranges.
    SegmentsExpired {
        expired: Vec<SegmentRef>,
        skipped: Vec<SegmentRef>,
        expired_records: u64,
    },
    ReclaimAcknowledged {
        removed: u64,
    },
    SegmentFilesRecorded {
        recorded: u64,
    },
    /// `already`: the vnode held this arc before.
    ArcClaimed {
        already: bool,
    },
    /// Copies whose settled state changed.
    CopiesRecorded {
        changed: u64,
    },
    ReplicaReplaced,
    ReplicaAdded,
}
