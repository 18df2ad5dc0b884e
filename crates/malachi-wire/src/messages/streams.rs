//! Section 3.6: routing, producer and consumer streams, and groups, keys 24–34, plus the push
//! payloads sent on an open stream's `corr`.
//!
//! Batches (`append`, pages) stay encoded here: a request or page carries the batch's bytes,
//! which extend to the end of the payload, and [`crate::decode_batch`] reads them. That keeps a
//! batch's own errors (`malformed_batch`, `batch_too_large`, ...) apart from `malformed_request`,
//! since the server reports them per append inside `append_ack`, and lets a server send batches
//! it already holds encoded without re-encoding them.

use std::num::NonZeroU32;

use bytes::Bytes;

use crate::batch::{BatchLimits, PlainEntry, PositionedEntry, decode_batch};
use crate::error::{BatchError, DecodeError, EncodeError};
use crate::primitive::{Reader, Wire, Writer};
use crate::shapes::{Accept, Position, RouteSegment, Start};

/// Key 24's ok answer (the request is [`crate::messages::Empty`] and must be empty).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterStateResponse {
    pub version: u64,
    /// Whether keys 25–34 are served (the `producer_streams` feature flag).
    pub streams_enabled: bool,
    pub brokers: Vec<Broker>,
    pub vnodes: Vec<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Broker {
    pub id: Option<Bytes>,
    /// Absent (and `port` 0) when the broker does not advertise an address.
    pub host: Option<Bytes>,
    pub port: u16,
    pub status: BrokerStatus,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum BrokerStatus {
    Alive = 0,
    Suspect = 1,
    Dead = 2,
}

/// Key 25.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopicRoutesRequest {
    pub topic: Option<Bytes>,
}

/// Key 25's ok answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopicRoutesResponse {
    pub topic: Option<Bytes>,
    pub version: u64,
    pub keyspace_bits: u8,
    pub ranges: Vec<RangeRoute>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeRoute {
    pub range: u32,
    pub key_start: u64,
    /// Exclusive; may be 2^32, hence 64 bits.
    pub key_end: u64,
    pub state: RangeState,
    pub segment: RouteSegment,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RangeState {
    Active = 0,
    Sealed = 1,
}

/// Key 26. Windows of 0 are `malformed_request` (unlike `subscribe`), hence `NonZeroU32`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenStreamRequest {
    pub topic: Option<Bytes>,
    pub range: u32,
    pub routes_version: u64,
    /// The codec the producer will send, as sent: an unknown one is the server's
    /// `unsupported_codec`, not a decode error.
    pub codec: u8,
    pub window_appends: NonZeroU32,
    pub window_bytes: NonZeroU32,
    /// Reserved: sent absent.
    pub producer_id: Option<Bytes>,
    pub label: Option<Bytes>,
}

/// Key 26's ok answer: the grant, capped by server limits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenStreamResponse {
    pub stream_id: u32,
    pub segment: u32,
    pub window_appends: u32,
    pub window_bytes: u32,
    pub routes_version: u64,
}

/// Key 27. No ok answer: `append_ack` pushes arrive on the open_stream's `corr`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AppendRequest {
    pub stream_id: u32,
    /// Starts at 0 and grows by one per append.
    pub sequence: u64,
    /// A plain-entry batch, still encoded; nothing follows it in the payload.
    pub batch: Bytes,
}

/// Key 28. Ok answer: [`crate::messages::Empty`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CloseStreamRequest {
    pub stream_id: u32,
}

/// Key 29. A `window` of 0 is `malformed_request`, hence `NonZeroU32`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenConsumeRequest {
    pub topic: Option<Bytes>,
    pub range: u32,
    pub routes_version: u64,
    pub start: Start,
    /// Wire `window`: records pushed but not yet acked.
    pub window: NonZeroU32,
    /// Wire `max`: records per push.
    pub max_records: u32,
    pub max_bytes: u32,
    pub accept: Accept,
}

/// Key 29's ok answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenConsumeResponse {
    pub stream_id: u32,
    /// Where the first push starts.
    pub position: Position,
}

/// Key 30. No ok answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConsumeAckRequest {
    pub stream_id: u32,
    pub position: Position,
    /// The new absolute window (capped by the server); 0 leaves it unchanged.
    pub window: u32,
}

/// Key 31. Ok answer: [`Page`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchRangeRequest {
    pub topic: Option<Bytes>,
    pub range: u32,
    pub routes_version: u64,
    pub start: Start,
    /// Wire `max`.
    pub max_records: u32,
    pub max_bytes: u32,
    pub wait_ms: u32,
    pub accept: Accept,
}

/// Key 31's ok answer and the body of a `records` push.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Page {
    /// Where the next page starts.
    pub next: Position,
    /// Leading records of the batch the reader already had.
    pub skip: u32,
    pub backlog: u64,
    /// Records removed by retention before this page.
    pub expired: u64,
    pub expired_exact: bool,
    /// A positioned-entry batch, still encoded; nothing follows it in the payload.
    pub batch: Bytes,
}

/// Key 32. Ok answer: [`Assignment`]. Malachi serves no group key (32–34).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JoinGroupRequest {
    pub topic: Option<Bytes>,
    pub group: Option<Bytes>,
    pub member: Option<Bytes>,
}

/// Key 33. Ok answer: [`Assignment`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupHeartbeatRequest {
    pub topic: Option<Bytes>,
    pub group: Option<Bytes>,
    pub member: Option<Bytes>,
    pub generation: u64,
}

/// Key 34. Ok answer: [`crate::messages::Empty`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommitOffsetsRequest {
    pub topic: Option<Bytes>,
    pub group: Option<Bytes>,
    pub member: Option<Bytes>,
    pub generation: u64,
    pub offsets: Vec<RangePosition>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RangePosition {
    pub range: u32,
    pub position: Position,
}

/// The ok answer of keys 32 and 33.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Assignment {
    pub generation: u64,
    pub session_ms: u32,
    pub ranges: Vec<u32>,
}

/// A push on an open stream's `corr` (after `open_stream` or `open_consume`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamPush {
    pub stream_id: u32,
    pub kind: PushKind,
}

/// On the wire, `kind:u8` comes before `stream_id`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PushKind {
    /// Kind 0.
    AppendAck(AppendAck),
    /// Kind 1.
    Moved(Moved),
    /// Kind 2.
    Records(Page),
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AppendAck {
    /// Every append below this sequence is answered; 0 before the first.
    pub acked_sequence: u64,
    pub window_appends: u32,
    /// 0 means hold.
    pub window_bytes: u32,
    pub errors: Vec<AppendFailure>,
}

/// One refused append inside an `append_ack`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AppendFailure {
    pub sequence: u64,
    /// `overloaded`, `rate_limited`, `quota_too_small`, or a batch error's text.
    pub reason: Option<Bytes>,
}

/// Another node leads the segment; appends in flight are still answered after it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Moved {
    pub reason: Option<Bytes>,
    pub routes_version: u64,
    pub targets: Vec<MovedTarget>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MovedTarget {
    pub range: u32,
    pub segment: RouteSegment,
}

impl AppendRequest {
    /// Reads the batch; its errors go into `append_ack.errors` for this `sequence`.
    pub fn entries(&self, limits: BatchLimits) -> Result<Vec<PlainEntry>, BatchError> {
        decode_batch(self.batch.clone(), limits)
    }
}

impl Page {
    pub fn entries(&self, limits: BatchLimits) -> Result<Vec<PositionedEntry>, BatchError> {
        decode_batch(self.batch.clone(), limits)
    }
}

impl Wire for ClusterStateResponse {
    const WIRE_BYTES_MIN: usize = 8 + 1 + 2 + 2;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u64(self.version);
        writer.bool(self.streams_enabled);
        writer.list16(&self.brokers)?;
        writer.list16(&self.vnodes)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(ClusterStateResponse {
            version: reader.u64()?,
            streams_enabled: reader.bool()?,
            brokers: reader.list16()?,
            vnodes: reader.list16()?,
        })
    }
}

impl Wire for Broker {
    const WIRE_BYTES_MIN: usize = 1 + 1 + 2 + 1;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.id.as_deref())?;
        writer.str(self.host.as_deref())?;
        writer.u16(self.port);
        writer.u8(self.status as u8);
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(Broker {
            id: reader.str()?,
            host: reader.str()?,
            port: reader.u16()?,
            status: match reader.u8()? {
                0 => BrokerStatus::Alive,
                1 => BrokerStatus::Suspect,
                2 => BrokerStatus::Dead,
                tag => return Err(DecodeError::UnknownTag { field: "broker status", tag }),
            },
        })
    }
}

impl Wire for TopicRoutesRequest {
    const WIRE_BYTES_MIN: usize = 1;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.topic.as_deref())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(TopicRoutesRequest { topic: reader.str()? })
    }
}

impl Wire for TopicRoutesResponse {
    const WIRE_BYTES_MIN: usize = 1 + 8 + 1 + 2;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.topic.as_deref())?;
        writer.u64(self.version);
        writer.u8(self.keyspace_bits);
        writer.list16(&self.ranges)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(TopicRoutesResponse {
            topic: reader.str()?,
            version: reader.u64()?,
            keyspace_bits: reader.u8()?,
            ranges: reader.list16()?,
        })
    }
}

impl Wire for RangeRoute {
    const WIRE_BYTES_MIN: usize = 4 + 8 + 8 + 1 + RouteSegment::WIRE_BYTES_MIN;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u32(self.range);
        writer.u64(self.key_start);
        writer.u64(self.key_end);
        writer.u8(self.state as u8);
        writer.item(&self.segment)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(RangeRoute {
            range: reader.u32()?,
            key_start: reader.u64()?,
            key_end: reader.u64()?,
            state: match reader.u8()? {
                0 => RangeState::Active,
                1 => RangeState::Sealed,
                tag => return Err(DecodeError::UnknownTag { field: "range state", tag }),
            },
            segment: reader.item()?,
        })
    }
}

impl Wire for OpenStreamRequest {
    const WIRE_BYTES_MIN: usize = 1 + 4 + 8 + 1 + 4 + 4 + 1 + 1;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.topic.as_deref())?;
        writer.u32(self.range);
        writer.u64(self.routes_version);
        writer.u8(self.codec);
        writer.u32(self.window_appends.get());
        writer.u32(self.window_bytes.get());
        writer.str(self.producer_id.as_deref())?;
        writer.str(self.label.as_deref())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(OpenStreamRequest {
            topic: reader.str()?,
            range: reader.u32()?,
            routes_version: reader.u64()?,
            codec: reader.u8()?,
            window_appends: read_window(reader, "window_appends")?,
            window_bytes: read_window(reader, "window_bytes")?,
            producer_id: reader.str()?,
            label: reader.str()?,
        })
    }
}

impl Wire for OpenStreamResponse {
    const WIRE_BYTES_MIN: usize = 4 * 4 + 8;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u32(self.stream_id);
        writer.u32(self.segment);
        writer.u32(self.window_appends);
        writer.u32(self.window_bytes);
        writer.u64(self.routes_version);
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(OpenStreamResponse {
            stream_id: reader.u32()?,
            segment: reader.u32()?,
            window_appends: reader.u32()?,
            window_bytes: reader.u32()?,
            routes_version: reader.u64()?,
        })
    }
}

impl Wire for AppendRequest {
    const WIRE_BYTES_MIN: usize = 4 + 8;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u32(self.stream_id);
        writer.u64(self.sequence);
        writer.raw(&self.batch);
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(AppendRequest {
            stream_id: reader.u32()?,
            sequence: reader.u64()?,
            batch: reader.rest(),
        })
    }
}

impl Wire for CloseStreamRequest {
    const WIRE_BYTES_MIN: usize = 4;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u32(self.stream_id);
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(CloseStreamRequest { stream_id: reader.u32()? })
    }
}

impl Wire for OpenConsumeRequest {
    const WIRE_BYTES_MIN: usize = 1 + 4 + 8 + Start::WIRE_BYTES_MIN + 4 * 3 + 1;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.topic.as_deref())?;
        writer.u32(self.range);
        writer.u64(self.routes_version);
        writer.item(&self.start)?;
        writer.u32(self.window.get());
        writer.u32(self.max_records);
        writer.u32(self.max_bytes);
        writer.item(&self.accept)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(OpenConsumeRequest {
            topic: reader.str()?,
            range: reader.u32()?,
            routes_version: reader.u64()?,
            start: reader.item()?,
            window: read_window(reader, "window")?,
            max_records: reader.u32()?,
            max_bytes: reader.u32()?,
            accept: reader.item()?,
        })
    }
}

impl Wire for OpenConsumeResponse {
    const WIRE_BYTES_MIN: usize = 4 + Position::WIRE_BYTES_MIN;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u32(self.stream_id);
        writer.item(&self.position)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(OpenConsumeResponse { stream_id: reader.u32()?, position: reader.item()? })
    }
}

impl Wire for ConsumeAckRequest {
    const WIRE_BYTES_MIN: usize = 4 + Position::WIRE_BYTES_MIN + 4;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u32(self.stream_id);
        writer.item(&self.position)?;
        writer.u32(self.window);
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(ConsumeAckRequest {
            stream_id: reader.u32()?,
            position: reader.item()?,
            window: reader.u32()?,
        })
    }
}

impl Wire for FetchRangeRequest {
    const WIRE_BYTES_MIN: usize = 1 + 4 + 8 + Start::WIRE_BYTES_MIN + 4 * 3 + 1;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.topic.as_deref())?;
        writer.u32(self.range);
        writer.u64(self.routes_version);
        writer.item(&self.start)?;
        writer.u32(self.max_records);
        writer.u32(self.max_bytes);
        writer.u32(self.wait_ms);
        writer.item(&self.accept)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(FetchRangeRequest {
            topic: reader.str()?,
            range: reader.u32()?,
            routes_version: reader.u64()?,
            start: reader.item()?,
            max_records: reader.u32()?,
            max_bytes: reader.u32()?,
            wait_ms: reader.u32()?,
            accept: reader.item()?,
        })
    }
}

impl Wire for Page {
    const WIRE_BYTES_MIN: usize = Position::WIRE_BYTES_MIN + 4 + 8 + 8 + 1;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.item(&self.next)?;
        writer.u32(self.skip);
        writer.u64(self.backlog);
        writer.u64(self.expired);
        writer.bool(self.expired_exact);
        writer.raw(&self.batch);
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(Page {
            next: reader.item()?,
            skip: reader.u32()?,
            backlog: reader.u64()?,
            expired: reader.u64()?,
            expired_exact: reader.bool()?,
            batch: reader.rest(),
        })
    }
}

impl Wire for JoinGroupRequest {
    const WIRE_BYTES_MIN: usize = 3;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.topic.as_deref())?;
        writer.str(self.group.as_deref())?;
        writer.str(self.member.as_deref())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(JoinGroupRequest { topic: reader.str()?, group: reader.str()?, member: reader.str()? })
    }
}

impl Wire for GroupHeartbeatRequest {
    const WIRE_BYTES_MIN: usize = 3 + 8;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.topic.as_deref())?;
        writer.str(self.group.as_deref())?;
        writer.str(self.member.as_deref())?;
        writer.u64(self.generation);
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(GroupHeartbeatRequest {
            topic: reader.str()?,
            group: reader.str()?,
            member: reader.str()?,
            generation: reader.u64()?,
        })
    }
}

impl Wire for CommitOffsetsRequest {
    const WIRE_BYTES_MIN: usize = 3 + 8 + 2;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.topic.as_deref())?;
        writer.str(self.group.as_deref())?;
        writer.str(self.member.as_deref())?;
        writer.u64(self.generation);
        writer.list16(&self.offsets)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(CommitOffsetsRequest {
            topic: reader.str()?,
            group: reader.str()?,
            member: reader.str()?,
            generation: reader.u64()?,
            offsets: reader.list16()?,
        })
    }
}

impl Wire for RangePosition {
    const WIRE_BYTES_MIN: usize = 4 + Position::WIRE_BYTES_MIN;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u32(self.range);
        writer.item(&self.position)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(RangePosition { range: reader.u32()?, position: reader.item()? })
    }
}

impl Wire for Assignment {
    const WIRE_BYTES_MIN: usize = 8 + 4 + 2;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u64(self.generation);
        writer.u32(self.session_ms);
        writer.list16(&self.ranges)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(Assignment {
            generation: reader.u64()?,
            session_ms: reader.u32()?,
            ranges: reader.list16()?,
        })
    }
}

impl Wire for StreamPush {
    const WIRE_BYTES_MIN: usize = 1 + 4 + Moved::WIRE_BYTES_MIN;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u8(self.kind.tag());
        writer.u32(self.stream_id);
        match &self.kind {
            PushKind::AppendAck(ack) => writer.item(ack),
            PushKind::Moved(moved) => writer.item(moved),
            PushKind::Records(page) => writer.item(page),
        }
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        let kind_tag = reader.u8()?;
        let stream_id = reader.u32()?;
        let kind = match kind_tag {
            0 => PushKind::AppendAck(reader.item()?),
            1 => PushKind::Moved(reader.item()?),
            2 => PushKind::Records(reader.item()?),
            tag => return Err(DecodeError::UnknownTag { field: "push kind", tag }),
        };
        Ok(StreamPush { stream_id, kind })
    }
}

impl PushKind {
    /// The `kind:u8` byte.
    pub fn tag(&self) -> u8 {
        match self {
            PushKind::AppendAck(_) => 0,
            PushKind::Moved(_) => 1,
            PushKind::Records(_) => 2,
        }
    }
}

impl Wire for AppendAck {
    const WIRE_BYTES_MIN: usize = 8 + 4 + 4 + 2;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u64(self.acked_sequence);
        writer.u32(self.window_appends);
        writer.u32(self.window_bytes);
        writer.list16(&self.errors)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(AppendAck {
            acked_sequence: reader.u64()?,
            window_appends: reader.u32()?,
            window_bytes: reader.u32()?,
            errors: reader.list16()?,
        })
    }
}

impl Wire for AppendFailure {
    const WIRE_BYTES_MIN: usize = 8 + 1;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u64(self.sequence);
        writer.str(self.reason.as_deref())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(AppendFailure { sequence: reader.u64()?, reason: reader.str()? })
    }
}

impl Wire for Moved {
    const WIRE_BYTES_MIN: usize = 1 + 8 + 2;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.reason.as_deref())?;
        writer.u64(self.routes_version);
        writer.list16(&self.targets)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(Moved {
            reason: reader.str()?,
            routes_version: reader.u64()?,
            targets: reader.list16()?,
        })
    }
}

impl Wire for MovedTarget {
    const WIRE_BYTES_MIN: usize = 4 + RouteSegment::WIRE_BYTES_MIN;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u32(self.range);
        writer.item(&self.segment)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(MovedTarget { range: reader.u32()?, segment: reader.item()? })
    }
}

/// Section 3.6: windows of 26 and 29 must be 1..2^32−1.
fn read_window(reader: &mut Reader, field: &'static str) -> Result<NonZeroU32, DecodeError> {
    NonZeroU32::new(reader.u32()?).ok_or(DecodeError::Zero { field })
}
