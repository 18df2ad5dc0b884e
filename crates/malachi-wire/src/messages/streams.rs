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
use crate::layout::{
    Bool, Item, List16, NonZero32, Rest, Str, U8, U16, U32, U64, wire_enum, wire_struct,
};
use crate::primitive::{Reader, Wire, Writer};
use crate::shapes::{Accept, Position, RouteSegment, Start};

wire_struct! {
    /// Key 24's ok answer (the request is [`crate::messages::Empty`] and must be empty).
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct ClusterStateResponse {
        pub version: u64 = U64,
        /// Whether keys 25–34 are served (the `producer_streams` feature flag).
        pub streams_enabled: bool = Bool,
        pub brokers: Vec<Broker> = List16,
        pub vnodes: Vec<u32> = List16,
    }
}

wire_struct! {
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Broker {
        pub id: Option<Bytes> = Str,
        /// Absent (and `port` 0) when the broker does not advertise an address.
        pub host: Option<Bytes> = Str,
        pub port: u16 = U16,
        pub status: BrokerStatus = Item,
    }
}

wire_enum! {
    pub enum BrokerStatus as "broker status" {
        Alive = 0,
        Suspect = 1,
        Dead = 2,
    }
}

wire_struct! {
    /// Key 25.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct TopicRoutesRequest {
        pub topic: Option<Bytes> = Str,
    }
}

wire_struct! {
    /// Key 25's ok answer.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct TopicRoutesResponse {
        pub topic: Option<Bytes> = Str,
        pub version: u64 = U64,
        pub keyspace_bits: u8 = U8,
        pub ranges: Vec<RangeRoute> = List16,
    }
}

wire_struct! {
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct RangeRoute {
        pub range: u32 = U32,
        pub key_start: u64 = U64,
        /// Exclusive; may be 2^32, hence 64 bits.
        pub key_end: u64 = U64,
        pub state: RangeState = Item,
        pub segment: RouteSegment = Item,
    }
}

wire_enum! {
    pub enum RangeState as "range state" {
        Active = 0,
        Sealed = 1,
    }
}

wire_struct! {
    /// Key 26. Windows of 0 are `malformed_request` (unlike `subscribe`), hence `NonZeroU32`.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct OpenStreamRequest {
        pub topic: Option<Bytes> = Str,
        pub range: u32 = U32,
        pub routes_version: u64 = U64,
        /// The codec the producer will send, as sent: an unknown one is the server's
        /// `unsupported_codec`, not a decode error.
        pub codec: u8 = U8,
        pub window_appends: NonZeroU32 = NonZero32,
        pub window_bytes: NonZeroU32 = NonZero32,
        /// Reserved: sent absent.
        pub producer_id: Option<Bytes> = Str,
        pub label: Option<Bytes> = Str,
    }
}

wire_struct! {
    /// Key 26's ok answer: the grant, capped by server limits.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct OpenStreamResponse {
        pub stream_id: u32 = U32,
        pub segment: u32 = U32,
        pub window_appends: u32 = U32,
        pub window_bytes: u32 = U32,
        pub routes_version: u64 = U64,
    }
}

wire_struct! {
    /// Key 27. No ok answer: `append_ack` pushes arrive on the open_stream's `corr`.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct AppendRequest {
        pub stream_id: u32 = U32,
        /// Starts at 0 and grows by one per append.
        pub sequence: u64 = U64,
        /// A plain-entry batch, still encoded; nothing follows it in the payload.
        pub batch: Bytes = Rest,
    }
}

wire_struct! {
    /// Key 28. Ok answer: [`crate::messages::Empty`].
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct CloseStreamRequest {
        pub stream_id: u32 = U32,
    }
}

wire_struct! {
    /// Key 29. A `window` of 0 is `malformed_request`, hence `NonZeroU32`.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct OpenConsumeRequest {
        pub topic: Option<Bytes> = Str,
        pub range: u32 = U32,
        pub routes_version: u64 = U64,
        pub start: Start = Item,
        /// Wire `window`: records pushed but not yet acked.
        pub window: NonZeroU32 = NonZero32,
        /// Wire `max`: records per push.
        pub max_records: u32 = U32,
        pub max_bytes: u32 = U32,
        pub accept: Accept = Item,
    }
}

wire_struct! {
    /// Key 29's ok answer.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct OpenConsumeResponse {
        pub stream_id: u32 = U32,
        /// Where the first push starts.
        pub position: Position = Item,
    }
}

wire_struct! {
    /// Key 30. No ok answer.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct ConsumeAckRequest {
        pub stream_id: u32 = U32,
        pub position: Position = Item,
        /// The new absolute window (capped by the server); 0 leaves it unchanged.
        pub window: u32 = U32,
    }
}

wire_struct! {
    /// Key 31. Ok answer: [`Page`].
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct FetchRangeRequest {
        pub topic: Option<Bytes> = Str,
        pub range: u32 = U32,
        pub routes_version: u64 = U64,
        pub start: Start = Item,
        /// Wire `max`.
        pub max_records: u32 = U32,
        pub max_bytes: u32 = U32,
        pub wait_ms: u32 = U32,
        pub accept: Accept = Item,
    }
}

wire_struct! {
    /// Key 31's ok answer and the body of a `records` push.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct Page {
        /// Where the next page starts.
        pub next: Position = Item,
        /// Leading records of the batch the reader already had.
        pub skip: u32 = U32,
        pub backlog: u64 = U64,
        /// Records removed by retention before this page.
        pub expired: u64 = U64,
        pub expired_exact: bool = Bool,
        /// A positioned-entry batch, still encoded; nothing follows it in the payload.
        pub batch: Bytes = Rest,
    }
}

wire_struct! {
    /// Key 32. Ok answer: [`Assignment`]. Malachi serves no group key (32–34).
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct JoinGroupRequest {
        pub topic: Option<Bytes> = Str,
        pub group: Option<Bytes> = Str,
        pub member: Option<Bytes> = Str,
    }
}

wire_struct! {
    /// Key 33. Ok answer: [`Assignment`].
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct GroupHeartbeatRequest {
        pub topic: Option<Bytes> = Str,
        pub group: Option<Bytes> = Str,
        pub member: Option<Bytes> = Str,
        pub generation: u64 = U64,
    }
}

wire_struct! {
    /// Key 34. Ok answer: [`crate::messages::Empty`].
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct CommitOffsetsRequest {
        pub topic: Option<Bytes> = Str,
        pub group: Option<Bytes> = Str,
        pub member: Option<Bytes> = Str,
        pub generation: u64 = U64,
        pub offsets: Vec<RangePosition> = List16,
    }
}

wire_struct! {
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct RangePosition {
        pub range: u32 = U32,
        pub position: Position = Item,
    }
}

wire_struct! {
    /// The ok answer of keys 32 and 33.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct Assignment {
        pub generation: u64 = U64,
        pub session_ms: u32 = U32,
        pub ranges: Vec<u32> = List16,
    }
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

wire_struct! {
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct AppendAck {
        /// Every append below this sequence is answered; 0 before the first.
        pub acked_sequence: u64 = U64,
        pub window_appends: u32 = U32,
        /// 0 means hold.
        pub window_bytes: u32 = U32,
        pub errors: Vec<AppendFailure> = List16,
    }
}

wire_struct! {
    /// One refused append inside an `append_ack`.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct AppendFailure {
        pub sequence: u64 = U64,
        /// `overloaded`, `rate_limited`, `quota_too_small`, or a batch error's text.
        pub reason: Option<Bytes> = Str,
    }
}

wire_struct! {
    /// Another node leads the segment; appends in flight are still answered after it.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct Moved {
        pub reason: Option<Bytes> = Str,
        pub routes_version: u64 = U64,
        pub targets: Vec<MovedTarget> = List16,
    }
}

wire_struct! {
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct MovedTarget {
        pub range: u32 = U32,
        pub segment: RouteSegment = Item,
    }
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
