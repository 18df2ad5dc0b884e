//! Malachi's own keys, 64–72: topic listing, description, deletion, the reshard operations
//! (split, merge, create with several ranges), the cluster's status and each segment's copies.
//! The original protocol has nothing for these, so
//! an original client never sends them; they are numbered well above the original's 0..=34 so
//! that a later original key cannot collide. Layouts follow the same rules as every other key:
//! exact, big-endian, `str` absent ≠ empty. `docs/protocol.md` is their user-facing contract.

use bytes::Bytes;

use crate::layout::{Bool, Item, List16, List32, Str, U8, U16, U32, U64, wire_enum, wire_struct};
use crate::messages::RangeState;

wire_struct! {
    /// Key 64's ok answer: every topic's name, sorted. The request payload must be empty
    /// ([`crate::messages::Empty`]).
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct ListTopicsResponse {
        /// `list32<name:str>`, sorted by name (bytewise).
        pub topics: Vec<Option<Bytes>> = List32,
    }
}

wire_struct! {
    /// Key 65.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct DescribeTopicRequest {
        pub topic: Option<Bytes> = Str,
    }
}

wire_struct! {
    /// Key 65's ok answer.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct DescribeTopicResponse {
        pub topic: Option<Bytes> = Str,
        /// Assigned by metadata, never reused: a deleted-and-recreated name gets a new id.
        pub topic_id: u64 = U64,
        /// When the topic was created, in milliseconds since the Unix epoch.
        pub created_ms: u64 = U64,
        /// The bound storage policy's name; `None` when unbound.
        pub policy: Option<Bytes> = Str,
        /// Every range the topic still knows, active and sealed, in `range_id` order.
        pub ranges: Vec<RangeDescription> = List32,
    }
}

wire_struct! {
    /// One range of a [`DescribeTopicResponse`].
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct RangeDescription {
        pub range_id: u32 = U32,
        /// First keyspace point the range owns.
        pub start: u64 = U64,
        /// Last keyspace point the range owns (inclusive, so the full keyspace ends at `u64::MAX`).
        pub end_inclusive: u64 = U64,
        pub state: RangeState = Item,
        /// `list16<u32>`: the ranges this one was split or merged from (oldest history first).
        pub parents: Vec<u32> = List16,
        /// `list16<u32>`: the ranges that replaced this one once it was sealed.
        pub children: Vec<u32> = List16,
        /// Retained segments.
        pub segments: u32 = U32,
        /// Records retained in those segments.
        pub records: u64 = U64,
        /// Records removed by retention so far.
        pub expired_records: u64 = U64,
    }
}

wire_struct! {
    /// Key 72: each segment of a topic with its replica set and what each copy's broker reports.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct DescribeSegmentsRequest {
        pub topic: Option<Bytes> = Str,
    }
}

wire_struct! {
    /// Key 72's ok answer.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct DescribeSegmentsResponse {
        pub topic: Option<Bytes> = Str,
        /// `list32`, in `range_id` order, then each range's segments oldest first; the first ones
        /// only, for a topic with more than one answer holds.
        pub segments: Vec<SegmentDescription> = List32,
    }
}

wire_enum! {
    /// A segment's state in [`SegmentDescription`]: `u8` 0 or 1, any other value malformed.
    pub enum SegmentState as "segment state" {
        Active = 0,
        Sealed = 1,
    }
}

wire_struct! {
    /// One segment of a [`DescribeSegmentsResponse`].
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct SegmentDescription {
        pub range_id: u32 = U32,
        pub segment_id: u64 = U64,
        /// Wire `base`: records of the range before this segment's offset 0.
        pub base_records: u64 = U64,
        pub state: SegmentState = Item,
        /// The length metadata recorded when the segment was sealed; 0 while active.
        pub end_offset: u64 = U64,
        /// The data bytes recorded with that seal; 0 while active.
        pub data_bytes: u64 = U64,
        /// `list16`, in replica order: the primary first.
        pub copies: Vec<CopyDescription> = List16,
    }
}

wire_struct! {
    /// One copy of a [`SegmentDescription`]. Each flag is a `u8` 0 or 1, any other value malformed.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct CopyDescription {
        pub node_id: u64 = U64,
        /// Metadata records this copy as settled: sealed at the recorded length and bytes, and
        /// intact when last checked.
        pub settled: bool = Bool,
        /// The copy's broker answered; when not, `durable_offset` is 0 and `sealed` false.
        pub answered: bool = Bool,
        /// Wire `end`: records durable in this copy, as its broker reports them.
        pub durable_offset: u64 = U64,
        /// The copy itself is sealed.
        pub sealed: bool = Bool,
    }
}

wire_struct! {
    /// Key 73: consumer lag on a topic, of one group or of every group that committed there.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct GroupLagRequest {
        pub topic: Option<Bytes> = Str,
        /// Absent: every group that committed on the topic.
        pub group: Option<Bytes> = Str,
    }
}

wire_struct! {
    /// Key 73's ok answer.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct GroupLagResponse {
        pub topic: Option<Bytes> = Str,
        /// `list32`, sorted by group name.
        pub groups: Vec<GroupLagDescription> = List32,
    }
}

wire_struct! {
    /// One group of a [`GroupLagResponse`].
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct GroupLagDescription {
        pub group: Option<Bytes> = Str,
        /// Records behind, over every range.
        pub total: u64 = U64,
        /// When the group last committed, ms since the epoch; 0 if it never did.
        pub updated_ms: u64 = U64,
        /// `list32`, every range of the topic in `range_id` order.
        pub ranges: Vec<RangeLagDescription> = List32,
    }
}

wire_enum! {
    /// Where a group stands in one range (`u8` 0, 1 or 2; any other value malformed).
    pub enum LagStanding as "lag standing" {
        /// At `position`, the next range-wide offset it reads.
        At = 0,
        /// It read every record of this sealed range.
        Drained = 1,
        /// It has not reached this range yet (it reads all of it after its ancestors).
        Ahead = 2,
    }
}

wire_struct! {
    /// One range of a [`GroupLagDescription`].
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct RangeLagDescription {
        pub range_id: u32 = U32,
        pub state: RangeState = Item,
        pub standing: LagStanding = Item,
        /// The next range-wide offset the group reads; 0 unless `standing` is `At`.
        pub position: u64 = U64,
        /// Range-wide offset one past the range's last record.
        pub end: u64 = U64,
        /// Records between the group's position and `end` that it will read.
        pub lag: u64 = U64,
    }
}

wire_struct! {
    /// Key 66 (admin). Ok answer: [`crate::messages::Empty`].
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct DeleteTopicRequest {
        pub topic: Option<Bytes> = Str,
    }
}

wire_struct! {
    /// Key 67 (admin): splits an active range into its two buddy halves.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct SplitRangeRequest {
        pub topic: Option<Bytes> = Str,
        pub range_id: u32 = U32,
    }
}

wire_struct! {
    /// Key 67's ok answer: the two new ranges.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct SplitRangeResponse {
        /// The half owning the lower keyspace points.
        pub low: u32 = U32,
        /// The half owning the upper keyspace points.
        pub high: u32 = U32,
    }
}

wire_struct! {
    /// Key 68 (admin): merges two active buddy ranges into one.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct MergeRangesRequest {
        pub topic: Option<Bytes> = Str,
        /// The buddy owning the lower keyspace points.
        pub left: u32 = U32,
        /// The buddy owning the upper keyspace points.
        pub right: u32 = U32,
    }
}

wire_struct! {
    /// Key 68's ok answer: the merged range.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct MergeRangesResponse {
        pub range_id: u32 = U32,
    }
}

wire_struct! {
    /// Key 69: like `create_topic` (1) but with the number of ranges to start with (a power of
    /// two; anything else is the server's `invalid_range_count`). Ok answer:
    /// [`crate::messages::Empty`].
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct CreateTopicRangesRequest {
        pub topic: Option<Bytes> = Str,
        pub initial_ranges: u32 = U32,
    }
}

wire_struct! {
    /// Key 71 (admin): decommission a broker. The answer is empty.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct RemoveBrokerRequest {
        pub node_id: u64 = U64,
        /// Remove it even while it holds sealed segments. A byte other than 0 or 1 is malformed.
        pub force: bool = Bool,
    }
}

wire_struct! {
    /// Key 74 (admin): a broker hands its work over and keeps serving (`draining` true), or takes
    /// work again (false). Sent to any broker, which asks the one it names.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct DrainBrokerRequest {
        pub node_id: u64 = U64,
        /// A byte other than 0 or 1 is malformed.
        pub draining: bool = Bool,
    }
}

wire_struct! {
    /// Key 74's ok answer: what the drained broker moved (all 0 when work was taken again).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct DrainBrokerResponse {
        /// Brokers that heard its drain notice.
        pub brokers_told: u32 = U32,
        /// Raft groups whose leadership it handed to another voter, and those it still leads.
        pub leaderships_moved: u32 = U32,
        pub leaderships_kept: u32 = U32,
        /// Write heads it was primary of that rolled onto other brokers, and those left.
        pub heads_rolled: u32 = U32,
        pub heads_left: u32 = U32,
    }
}

wire_struct! {
    /// Key 70's ok answer (the request payload must be empty): the cluster as the answering broker
    /// sees it.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct ClusterStatusResponse {
        /// The answering broker.
        pub node_id: u64 = U64,
        /// Absent for a broker alone.
        pub cluster_id: Option<Bytes> = Str,
        /// `list16`, by node id.
        pub brokers: Vec<ClusterBroker> = List16,
        /// `list16`: the Raft groups (0 the administrative group, 1 the vnode).
        pub groups: Vec<ClusterGroup> = List16,
        /// How many replicas each segment should have: the replication factor, or the number of
        /// brokers when there are fewer. A segment with fewer is under-replicated.
        pub replicas_wanted: u16 = U16,
    }
}

wire_struct! {
    /// One broker of [`ClusterStatusResponse`].
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct ClusterBroker {
        pub node_id: u64 = U64,
        /// `host:port` of its inter-node port; absent for a broker alone.
        pub cluster_address: Option<Bytes> = Str,
        /// `host:port` of its client port.
        pub client_address: Option<Bytes> = Str,
        /// 0 alive, 1 suspect, 2 dead (as `cluster_state`).
        pub status: u8 = U8,
        /// `list16<str>` of `name=value`.
        pub attributes: Vec<Option<Bytes>> = List16,
    }
}

wire_struct! {
    /// One Raft group of [`ClusterStatusResponse`].
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct ClusterGroup {
        pub group_id: u64 = U64,
        /// 0 when the answering broker knows no leader.
        pub leader: u64 = U64,
        pub term: u64 = U64,
        /// `list16<u64>`.
        pub voters: Vec<u64> = List16,
        /// `list16<u64>`.
        pub learners: Vec<u64> = List16,
    }
}
