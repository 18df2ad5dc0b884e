//! Malachi's own keys, 64–72: topic listing, description, deletion, the reshard operations
//! (split, merge, create with several ranges), the cluster's status and each segment's copies.
//! The original protocol has nothing for these, so
//! an original client never sends them; they are numbered well above the original's 0..=34 so
//! that a later original key cannot collide. Layouts follow the same rules as every other key:
//! exact, big-endian, `str` absent ≠ empty. `docs/protocol.md` is their user-facing contract.

use bytes::Bytes;

use crate::error::{DecodeError, EncodeError};
use crate::messages::RangeState;
use crate::primitive::{Reader, Wire, Writer};

/// Key 64's ok answer: every topic's name, sorted. The request payload must be empty
/// ([`crate::messages::Empty`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListTopicsResponse {
    /// `list32<name:str>`, sorted by name (bytewise).
    pub topics: Vec<Option<Bytes>>,
}

/// Key 65.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DescribeTopicRequest {
    pub topic: Option<Bytes>,
}

/// Key 65's ok answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DescribeTopicResponse {
    pub topic: Option<Bytes>,
    /// Assigned by metadata, never reused: a deleted-and-recreated name gets a new id.
    pub topic_id: u64,
    /// When the topic was created, in milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// The bound storage policy's name; `None` when unbound.
    pub policy: Option<Bytes>,
    /// Every range the topic still knows, active and sealed, in `range_id` order.
    pub ranges: Vec<RangeDescription>,
}

/// One range of a [`DescribeTopicResponse`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeDescription {
    pub range_id: u32,
    /// First keyspace point the range owns.
    pub start: u64,
    /// Last keyspace point the range owns (inclusive, so the full keyspace ends at `u64::MAX`).
    pub end_inclusive: u64,
    pub state: RangeState,
    /// `list16<u32>`: the ranges this one was split or merged from (oldest history first).
    pub parents: Vec<u32>,
    /// `list16<u32>`: the ranges that replaced this one once it was sealed.
    pub children: Vec<u32>,
    /// Retained segments.
    pub segments: u32,
    /// Records retained in those segments.
    pub records: u64,
    /// Records removed by retention so far.
    pub expired_records: u64,
}

/// Key 72: each segment of a topic with its replica set and what each copy's broker reports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DescribeSegmentsRequest {
    pub topic: Option<Bytes>,
}

/// Key 72's ok answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DescribeSegmentsResponse {
    pub topic: Option<Bytes>,
    /// `list32`, in `range_id` order, then each range's segments oldest first; the first ones
    /// only, for a topic with more than one answer holds.
    pub segments: Vec<SegmentDescription>,
}

/// A segment's state in [`SegmentDescription`]: `u8` 0 or 1, any other value malformed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum SegmentState {
    Active = 0,
    Sealed = 1,
}

/// One segment of a [`DescribeSegmentsResponse`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentDescription {
    pub range_id: u32,
    pub segment_id: u64,
    /// Wire `base`: records of the range before this segment's offset 0.
    pub base_records: u64,
    pub state: SegmentState,
    /// The length metadata recorded when the segment was sealed; 0 while active.
    pub end_offset: u64,
    /// The data bytes recorded with that seal; 0 while active.
    pub data_bytes: u64,
    /// `list16`, in replica order: the primary first.
    pub copies: Vec<CopyDescription>,
}

/// One copy of a [`SegmentDescription`]. Each flag is a `u8` 0 or 1, any other value malformed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyDescription {
    pub node_id: u64,
    /// Metadata records this copy as settled: sealed at the recorded length and bytes, and
    /// intact when last checked.
    pub settled: bool,
    /// The copy's broker answered; when not, `durable_offset` is 0 and `sealed` false.
    pub answered: bool,
    /// Wire `end`: records durable in this copy, as its broker reports them.
    pub durable_offset: u64,
    /// The copy itself is sealed.
    pub sealed: bool,
}

/// Key 73: consumer lag on a topic, of one group or of every group that committed there.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupLagRequest {
    pub topic: Option<Bytes>,
    /// Absent: every group that committed on the topic.
    pub group: Option<Bytes>,
}

/// Key 73's ok answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupLagResponse {
    pub topic: Option<Bytes>,
    /// `list32`, sorted by group name.
    pub groups: Vec<GroupLagDescription>,
}

/// One group of a [`GroupLagResponse`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupLagDescription {
    pub group: Option<Bytes>,
    /// Records behind, over every range.
    pub total: u64,
    /// When the group last committed, ms since the epoch; 0 if it never did.
    pub updated_ms: u64,
    /// `list32`, every range of the topic in `range_id` order.
    pub ranges: Vec<RangeLagDescription>,
}

/// Where a group stands in one range (`u8` 0, 1 or 2; any other value malformed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum LagStanding {
    /// At `position`, the next range-wide offset it reads.
    At = 0,
    /// It read every record of this sealed range.
    Drained = 1,
    /// It has not reached this range yet (it reads all of it after its ancestors).
    Ahead = 2,
}

/// One range of a [`GroupLagDescription`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RangeLagDescription {
    pub range_id: u32,
    pub state: RangeState,
    pub standing: LagStanding,
    /// The next range-wide offset the group reads; 0 unless `standing` is `At`.
    pub position: u64,
    /// Range-wide offset one past the range's last record.
    pub end: u64,
    /// Records between the group's position and `end` that it will read.
    pub lag: u64,
}

/// Key 66 (admin). Ok answer: [`crate::messages::Empty`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeleteTopicRequest {
    pub topic: Option<Bytes>,
}

/// Key 67 (admin): splits an active range into its two buddy halves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SplitRangeRequest {
    pub topic: Option<Bytes>,
    pub range_id: u32,
}

/// Key 67's ok answer: the two new ranges.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SplitRangeResponse {
    /// The half owning the lower keyspace points.
    pub low: u32,
    /// The half owning the upper keyspace points.
    pub high: u32,
}

/// Key 68 (admin): merges two active buddy ranges into one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MergeRangesRequest {
    pub topic: Option<Bytes>,
    /// The buddy owning the lower keyspace points.
    pub left: u32,
    /// The buddy owning the upper keyspace points.
    pub right: u32,
}

/// Key 68's ok answer: the merged range.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MergeRangesResponse {
    pub range_id: u32,
}

/// Key 69: like `create_topic` (1) but with the number of ranges to start with (a power of
/// two; anything else is the server's `invalid_range_count`). Ok answer:
/// [`crate::messages::Empty`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CreateTopicRangesRequest {
    pub topic: Option<Bytes>,
    pub initial_ranges: u32,
}

/// Key 71 (admin): decommission a broker. The answer is empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RemoveBrokerRequest {
    pub node_id: u64,
    /// Remove it even while it holds sealed segments. A byte other than 0 or 1 is malformed.
    pub force: bool,
}

impl Wire for RemoveBrokerRequest {
    const WIRE_BYTES_MIN: usize = 8 + 1;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u64(self.node_id);
        writer.bool(self.force);
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(RemoveBrokerRequest { node_id: reader.u64()?, force: reader.bool()? })
    }
}

/// Key 74 (admin): a broker hands its work over and keeps serving (`draining` true), or takes
/// work again (false). Sent to any broker, which asks the one it names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainBrokerRequest {
    pub node_id: u64,
    /// A byte other than 0 or 1 is malformed.
    pub draining: bool,
}

impl Wire for DrainBrokerRequest {
    const WIRE_BYTES_MIN: usize = 8 + 1;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u64(self.node_id);
        writer.bool(self.draining);
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(DrainBrokerRequest { node_id: reader.u64()?, draining: reader.bool()? })
    }
}

/// Key 74's ok answer: what the drained broker moved (all 0 when work was taken again).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrainBrokerResponse {
    /// Brokers that heard its drain notice.
    pub brokers_told: u32,
    /// Raft groups whose leadership it handed to another voter, and those it still leads.
    pub leaderships_moved: u32,
    pub leaderships_kept: u32,
    /// Write heads it was primary of that rolled onto other brokers, and those left.
    pub heads_rolled: u32,
    pub heads_left: u32,
}

impl Wire for DrainBrokerResponse {
    const WIRE_BYTES_MIN: usize = 5 * 4;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u32(self.brokers_told);
        writer.u32(self.leaderships_moved);
        writer.u32(self.leaderships_kept);
        writer.u32(self.heads_rolled);
        writer.u32(self.heads_left);
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(DrainBrokerResponse {
            brokers_told: reader.u32()?,
            leaderships_moved: reader.u32()?,
            leaderships_kept: reader.u32()?,
            heads_rolled: reader.u32()?,
            heads_left: reader.u32()?,
        })
    }
}

/// Key 70's ok answer (the request payload must be empty): the cluster as the answering broker
/// sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterStatusResponse {
    /// The answering broker.
    pub node_id: u64,
    /// Absent for a broker alone.
    pub cluster_id: Option<Bytes>,
    /// `list16`, by node id.
    pub brokers: Vec<ClusterBroker>,
    /// `list16`: the Raft groups (0 the administrative group, 1 the vnode).
    pub groups: Vec<ClusterGroup>,
    /// How many replicas each segment should have: the replication factor, or the number of
    /// brokers when there are fewer. A segment with fewer is under-replicated.
    pub replicas_wanted: u16,
}

/// One broker of [`ClusterStatusResponse`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterBroker {
    pub node_id: u64,
    /// `host:port` of its inter-node port; absent for a broker alone.
    pub cluster_address: Option<Bytes>,
    /// `host:port` of its client port.
    pub client_address: Option<Bytes>,
    /// 0 alive, 1 suspect, 2 dead (as `cluster_state`).
    pub status: u8,
    /// `list16<str>` of `name=value`.
    pub attributes: Vec<Option<Bytes>>,
}

/// One Raft group of [`ClusterStatusResponse`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterGroup {
    pub group_id: u64,
    /// 0 when the answering broker knows no leader.
    pub leader: u64,
    pub term: u64,
    /// `list16<u64>`.
    pub voters: Vec<u64>,
    /// `list16<u64>`.
    pub learners: Vec<u64>,
}

impl Wire for ClusterStatusResponse {
    const WIRE_BYTES_MIN: usize = 8 + 1 + 2 + 2 + 2;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u64(self.node_id);
        writer.str(self.cluster_id.as_deref())?;
        writer.list16(&self.brokers)?;
        writer.list16(&self.groups)?;
        writer.u16(self.replicas_wanted);
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(ClusterStatusResponse {
            node_id: reader.u64()?,
            cluster_id: reader.str()?,
            brokers: reader.list16()?,
            groups: reader.list16()?,
            replicas_wanted: reader.u16()?,
        })
    }
}

impl Wire for ClusterBroker {
    const WIRE_BYTES_MIN: usize = 8 + 1 + 1 + 1 + 2;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u64(self.node_id);
        writer.str(self.cluster_address.as_deref())?;
        writer.str(self.client_address.as_deref())?;
        writer.u8(self.status);
        writer.list16(&self.attributes)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(ClusterBroker {
            node_id: reader.u64()?,
            cluster_address: reader.str()?,
            client_address: reader.str()?,
            status: reader.u8()?,
            attributes: reader.list16()?,
        })
    }
}

impl Wire for ClusterGroup {
    const WIRE_BYTES_MIN: usize = 8 + 8 + 8 + 2 + 2;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u64(self.group_id);
        writer.u64(self.leader);
        writer.u64(self.term);
        writer.list16(&self.voters)?;
        writer.list16(&self.learners)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(ClusterGroup {
            group_id: reader.u64()?,
            leader: reader.u64()?,
            term: reader.u64()?,
            voters: reader.list16()?,
            learners: reader.list16()?,
        })
    }
}

impl Wire for ListTopicsResponse {
    const WIRE_BYTES_MIN: usize = 4;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.list32(&self.topics)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(ListTopicsResponse { topics: reader.list32()? })
    }
}

impl Wire for DescribeTopicRequest {
    const WIRE_BYTES_MIN: usize = 1;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.topic.as_deref())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(DescribeTopicRequest { topic: reader.str()? })
    }
}

impl Wire for DescribeTopicResponse {
    const WIRE_BYTES_MIN: usize = 1 + 8 + 8 + 1 + 4;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.topic.as_deref())?;
        writer.u64(self.topic_id);
        writer.u64(self.created_ms);
        writer.str(self.policy.as_deref())?;
        writer.list32(&self.ranges)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(DescribeTopicResponse {
            topic: reader.str()?,
            topic_id: reader.u64()?,
            created_ms: reader.u64()?,
            policy: reader.str()?,
            ranges: reader.list32()?,
        })
    }
}

impl Wire for RangeDescription {
    /// range_id, start, end, state, two empty list16s, segments, records, expired_records.
    const WIRE_BYTES_MIN: usize = 4 + 8 + 8 + 1 + 2 + 2 + 4 + 8 + 8;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u32(self.range_id);
        writer.u64(self.start);
        writer.u64(self.end_inclusive);
        writer.u8(self.state as u8);
        writer.list16(&self.parents)?;
        writer.list16(&self.children)?;
        writer.u32(self.segments);
        writer.u64(self.records);
        writer.u64(self.expired_records);
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(RangeDescription {
            range_id: reader.u32()?,
            start: reader.u64()?,
            end_inclusive: reader.u64()?,
            state: match reader.u8()? {
                0 => RangeState::Active,
                1 => RangeState::Sealed,
                tag => return Err(DecodeError::UnknownTag { field: "range state", tag }),
            },
            parents: reader.list16()?,
            children: reader.list16()?,
            segments: reader.u32()?,
            records: reader.u64()?,
            expired_records: reader.u64()?,
        })
    }
}

impl Wire for DescribeSegmentsRequest {
    const WIRE_BYTES_MIN: usize = 1;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.topic.as_deref())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(DescribeSegmentsRequest { topic: reader.str()? })
    }
}

impl Wire for DescribeSegmentsResponse {
    const WIRE_BYTES_MIN: usize = 1 + 4;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.topic.as_deref())?;
        writer.list32(&self.segments)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(DescribeSegmentsResponse { topic: reader.str()?, segments: reader.list32()? })
    }
}

impl Wire for SegmentDescription {
    /// range_id, segment_id, base, state, end_offset, data_bytes, an empty list16.
    const WIRE_BYTES_MIN: usize = 4 + 8 + 8 + 1 + 8 + 8 + 2;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u32(self.range_id);
        writer.u64(self.segment_id);
        writer.u64(self.base_records);
        writer.u8(self.state as u8);
        writer.u64(self.end_offset);
        writer.u64(self.data_bytes);
        writer.list16(&self.copies)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(SegmentDescription {
            range_id: reader.u32()?,
            segment_id: reader.u64()?,
            base_records: reader.u64()?,
            state: match reader.u8()? {
                0 => SegmentState::Active,
                1 => SegmentState::Sealed,
                tag => return Err(DecodeError::UnknownTag { field: "segment state", tag }),
            },
            end_offset: reader.u64()?,
            data_bytes: reader.u64()?,
            copies: reader.list16()?,
        })
    }
}

impl Wire for CopyDescription {
    /// node_id, settled, answered, end, sealed.
    const WIRE_BYTES_MIN: usize = 8 + 1 + 1 + 8 + 1;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u64(self.node_id);
        writer.bool(self.settled);
        writer.bool(self.answered);
        writer.u64(self.durable_offset);
        writer.bool(self.sealed);
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(CopyDescription {
            node_id: reader.u64()?,
            settled: reader.bool()?,
            answered: reader.bool()?,
            durable_offset: reader.u64()?,
            sealed: reader.bool()?,
        })
    }
}

impl Wire for GroupLagRequest {
    const WIRE_BYTES_MIN: usize = 1 + 1;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.topic.as_deref())?;
        writer.str(self.group.as_deref())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(GroupLagRequest { topic: reader.str()?, group: reader.str()? })
    }
}

impl Wire for GroupLagResponse {
    const WIRE_BYTES_MIN: usize = 1 + 4;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.topic.as_deref())?;
        writer.list32(&self.groups)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(GroupLagResponse { topic: reader.str()?, groups: reader.list32()? })
    }
}

impl Wire for GroupLagDescription {
    /// group (absent), total, updated_ms, an empty list32.
    const WIRE_BYTES_MIN: usize = 1 + 8 + 8 + 4;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.group.as_deref())?;
        writer.u64(self.total);
        writer.u64(self.updated_ms);
        writer.list32(&self.ranges)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(GroupLagDescription {
            group: reader.str()?,
            total: reader.u64()?,
            updated_ms: reader.u64()?,
            ranges: reader.list32()?,
        })
    }
}

impl Wire for RangeLagDescription {
    /// range_id, state, standing, position, end, lag.
    const WIRE_BYTES_MIN: usize = 4 + 1 + 1 + 8 + 8 + 8;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u32(self.range_id);
        writer.u8(self.state as u8);
        writer.u8(self.standing as u8);
        writer.u64(self.position);
        writer.u64(self.end);
        writer.u64(self.lag);
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(RangeLagDescription {
            range_id: reader.u32()?,
            state: match reader.u8()? {
                0 => RangeState::Active,
                1 => RangeState::Sealed,
                tag => return Err(DecodeError::UnknownTag { field: "range state", tag }),
            },
            standing: match reader.u8()? {
                0 => LagStanding::At,
                1 => LagStanding::Drained,
                2 => LagStanding::Ahead,
                tag => return Err(DecodeError::UnknownTag { field: "lag standing", tag }),
            },
            position: reader.u64()?,
            end: reader.u64()?,
            lag: reader.u64()?,
        })
    }
}

impl Wire for DeleteTopicRequest {
    const WIRE_BYTES_MIN: usize = 1;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.topic.as_deref())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(DeleteTopicRequest { topic: reader.str()? })
    }
}

impl Wire for SplitRangeRequest {
    const WIRE_BYTES_MIN: usize = 1 + 4;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.topic.as_deref())?;
        writer.u32(self.range_id);
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(SplitRangeRequest { topic: reader.str()?, range_id: reader.u32()? })
    }
}

impl Wire for SplitRangeResponse {
    const WIRE_BYTES_MIN: usize = 4 + 4;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u32(self.low);
        writer.u32(self.high);
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(SplitRangeResponse { low: reader.u32()?, high: reader.u32()? })
    }
}

impl Wire for MergeRangesRequest {
    const WIRE_BYTES_MIN: usize = 1 + 4 + 4;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.topic.as_deref())?;
        writer.u32(self.left);
        writer.u32(self.right);
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(MergeRangesRequest { topic: reader.str()?, left: reader.u32()?, right: reader.u32()? })
    }
}

impl Wire for MergeRangesResponse {
    const WIRE_BYTES_MIN: usize = 4;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u32(self.range_id);
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(MergeRangesResponse { range_id: reader.u32()? })
    }
}

impl Wire for CreateTopicRangesRequest {
    const WIRE_BYTES_MIN: usize = 1 + 4;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.topic.as_deref())?;
        writer.u32(self.initial_ranges);
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(CreateTopicRangesRequest { topic: reader.str()?, initial_ranges: reader.u32()? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_minimal<T: Wire>(name: &str, value: &T) {
        let encoded = value.encode_to_bytes().expect("minimal values encode");
        assert_eq!(encoded.len(), T::WIRE_BYTES_MIN, "{name}");
    }

    #[test]
    fn wire_bytes_min_is_the_smallest_encoding() {
        let range = RangeDescription {
            range_id: 0,
            start: 0,
            end_inclusive: 0,
            state: RangeState::Active,
            parents: Vec::new(),
            children: Vec::new(),
            segments: 0,
            records: 0,
            expired_records: 0,
        };
        assert_minimal("ListTopicsResponse", &ListTopicsResponse::default());
        assert_minimal("DescribeTopicRequest", &DescribeTopicRequest::default());
        assert_minimal("DescribeTopicResponse", &DescribeTopicResponse::default());
        assert_minimal("RangeDescription", &range);
        assert_minimal("DeleteTopicRequest", &DeleteTopicRequest::default());
        assert_minimal("SplitRangeRequest", &SplitRangeRequest::default());
        assert_minimal("SplitRangeResponse", &SplitRangeResponse::default());
        assert_minimal("MergeRangesRequest", &MergeRangesRequest::default());
        assert_minimal("MergeRangesResponse", &MergeRangesResponse::default());
        assert_minimal("CreateTopicRangesRequest", &CreateTopicRangesRequest::default());
        assert_minimal("ClusterStatusResponse", &ClusterStatusResponse::default());
        assert_minimal("ClusterBroker", &ClusterBroker::default());
        assert_minimal("ClusterGroup", &ClusterGroup::default());
        assert_minimal("RemoveBrokerRequest", &RemoveBrokerRequest::default());
        assert_minimal("DrainBrokerRequest", &DrainBrokerRequest::default());
        assert_minimal("DrainBrokerResponse", &DrainBrokerResponse::default());
        let segment = SegmentDescription {
            range_id: 0,
            segment_id: 0,
            base_records: 0,
            state: SegmentState::Active,
            end_offset: 0,
            data_bytes: 0,
            copies: Vec::new(),
        };
        assert_minimal("DescribeSegmentsRequest", &DescribeSegmentsRequest::default());
        assert_minimal("DescribeSegmentsResponse", &DescribeSegmentsResponse::default());
        assert_minimal("GroupLagRequest", &GroupLagRequest::default());
        assert_minimal("GroupLagResponse", &GroupLagResponse::default());
        assert_minimal("SegmentDescription", &segment);
        assert_minimal("CopyDescription", &CopyDescription::default());
    }
}
