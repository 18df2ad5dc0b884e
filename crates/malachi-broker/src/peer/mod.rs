//! The inter-node protocol: every call one broker makes to another, in one enum
//! ([`PeerCall`]), with one codec ([`PeerCall::encode`], [`PeerCall::decode`]) and one
//! dispatcher (`dispatch.rs`), which also says who may make which call. The transport under it
//! (`malachi-transport`: the hello, version negotiation, TLS, framing and per-connection
//! bounds) carries a call as a `Request` of `service`, `group_id`, `kind` and a payload; this
//! module is what those mean. docs/cluster.md ("The inter-node protocol") is the operator's
//! view of it.
//!
//! Calls, by service and kind (wire values: never reuse one). All integers little-endian.
//!
//! | service | kind | call | payload |
//! |---|---|---|---|
//! | Raft | `MessageKind` | a Raft message of group `group_id` | the consensus crate's encoding |
//! | Cluster | 1 | [`PeerCall::Welcome`] | empty |
//! | Cluster | 2 | [`PeerCall::Join`] | a `BrokerRecord` (JSON) |
//! | Cluster | 3 | [`PeerCall::AddMember`] | an [`AddMember`] (JSON) |
//! | Cluster | 4, 5, 6 | [`PeerCall::Coordinate`] (roll, load, reshape) | an [`Ask`] (JSON) |
//! | Cluster | 7 | [`PeerCall::Enroll`] | an `EnrollRequest` (JSON); the only call of a stranger |
//! | Cluster | 8 | [`PeerCall::Draining`] | `{"draining": bool}` (JSON): the caller is (or is no longer) handing its work over |
//! | Cluster | 9 | [`PeerCall::HandOver`] | `{"draining": bool}` (JSON): an operator asks the receiver to hand its work over and keep serving (`drain_broker`), or to take work again; answered with the `HandoverReport` (JSON) |
//! | Data | 1..12 | [`PeerCall::Data`] | the segment key, then the [`DataCall`]'s fields |
//!
//! A data call's segment key is `topic_id` u64, `range_id` u32, `segment_id` u64. Records are
//! `count` u32, then per record `flags` u8 (1 key present, 2 tombstone), `timestamp_ms` u64,
//! key, value, `headers` u16 and each header's name and value, every byte string as `len` u32
//! then the bytes, and last a CRC32C u32 of all that (`records.rs`).
//!
//! Answers are the call's own (`answer.rs` has the data calls' status bytes); a call that
//! cannot be answered at all fails with a reason, which the transport sends as a failure frame.
//!
//! Decoding checks every length against what the payload holds before anything is allocated
//! (the transport already bounded the payload by its frame limit), and refuses trailing bytes,
//! so a call has exactly one encoding.

mod answer;
mod dispatch;
mod records;
#[cfg(test)]
mod tests;

use malachi_consensus::MessageKind;
use malachi_log::{Record, SealInfo};
use malachi_meta::BrokerRecord;
use malachi_transport::{Request, Service};
use serde::{Deserialize, Serialize};

use crate::data::SegmentKey;
use crate::enroll::EnrollRequest;

#[cfg(test)]
pub(crate) use answer::{DONE, FENCED_OR_GONE};
pub(crate) use answer::{
    Remote, Shipped, answer_of, decode_answer, decode_shipped, encode_failure, encode_shipped,
};
pub use dispatch::{PeerHandler, STRANGERS_ENROLL_ONLY, peer_handler};
pub(crate) use records::{Reader, decode_records, encode_records};

/// Cluster call kinds.
const CLUSTER_WELCOME: u8 = 1;
const CLUSTER_JOIN: u8 = 2;
const CLUSTER_ADD_MEMBER: u8 = 3;
const CLUSTER_ROLL_WANTED: u8 = 4;
const CLUSTER_LOAD_REPORT: u8 = 5;
const CLUSTER_RESHAPE: u8 = 6;
/// The enrollment's kind, public so a test can make the call a stranger may make.
pub const CLUSTER_ENROLL: u8 = 7;
const CLUSTER_DRAINING: u8 = 8;
const CLUSTER_HAND_OVER: u8 = 9;

/// Data call kinds.
const DATA_APPEND: u8 = 1;
const DATA_READ: u8 = 2;
const DATA_END: u8 = 3;
const DATA_SEAL: u8 = 4;
const DATA_CREATE: u8 = 5;
const DATA_REPLICATE: u8 = 6;
const DATA_FENCE: u8 = 7;
const DATA_FILL: u8 = 8;
const DATA_SEAL_AT: u8 = 9;
const DATA_READ_RAW: u8 = 10;
const DATA_SETTLE: u8 = 11;
const DATA_COPY_STATE: u8 = 12;

/// Bytes of a segment key on the wire.
const KEY_BYTES: usize = 8 + 4 + 8;

/// One call from a broker to a peer. Who makes it is not part of it: the receiver takes the
/// caller from the connection's certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerCall {
    /// A Raft message (or a forwarded client write, read barrier, leadership transfer) of group
    /// `group_id`; the body is decoded by the group.
    Raft {
        group_id: u64,
        kind: MessageKind,
        body: Vec<u8>,
    },
    /// What a broker about to join needs: cluster id, cursor secret, brokers, ring size.
    Welcome,
    /// Registers the caller (the record must name it) and adds it to every group.
    Join(BrokerRecord),
    /// Adds a broker to one group, sent to that group's leader.
    AddMember(AddMember),
    /// A coordinator's question to the leader of the vnode of group `group_id`.
    Coordinate {
        group_id: u64,
        ask: Ask,
    },
    /// A stranger's enrollment with the cluster token.
    Enroll(EnrollRequest),
    /// An operation on one segment's copy on the receiving broker.
    /// The caller is handing its work over before it stops (`handover.rs`), or is back.
    Draining {
        draining: bool,
    },
    /// An operator, through the caller, asks the receiver to drain for maintenance (or to take
    /// work again).
    HandOver {
        draining: bool,
    },
    Data {
        key: SegmentKey,
        call: DataCall,
    },
}

/// A drain notice's payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct DrainNotice {
    draining: bool,
}

/// An operation on one segment's copy, by the broker holding it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataCall {
    /// A produce forwarded to the head's primary; answered once durable there.
    Append { records: Vec<Record> },
    /// Up to `wanted` records (about `bytes_max` bytes, clamped by the receiver) from `from`.
    Read { from: u64, wanted: u32, bytes_max: u64 },
    /// The durable end of an active segment, and whether it is sealed there.
    End,
    /// The coordinator's fence: seal the head; answers its end offset and data bytes.
    Seal,
    /// Create the file of a segment metadata has just allocated.
    Create,
    /// A batch the primary ships to a follower's copy, starting at offset `start`, with the
    /// primary's acknowledged end.
    Replicate { start: u64, acked_end: u64, records: Vec<Record> },
    /// A failover's fence of one copy; answers where the copy ends.
    Fence,
    /// Fill the copy up to `end` from the copy on `source`.
    Fill { source: u64, end: u64 },
    /// Seal the copy at `end`.
    SealAt { end: u64 },
    /// Records of the copy as stored, for a fill or a rebuild.
    ReadRaw { from: u64, wanted: u32, bytes_max: u64 },
    /// Settle a sealed copy at `seal`, rebuilt from one of `sources` if it must be.
    Settle { seal: SealInfo, sources: Vec<u64> },
    /// The copy's state, changing nothing (describe).
    CopyState,
}

/// A request to add a broker to one group, sent to that group's leader.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddMember {
    pub group_id: u64,
    pub node_id: u64,
    pub cluster_address: String,
}

/// What a coordinator asks a vnode's leader.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Ask {
    Roll {
        topic_id: u64,
        range_id: u32,
    },
    /// Per range: `(topic_id, range_id, records_per_s, bytes_per_s)`.
    Load {
        reporter: u64,
        rates: Vec<(u64, u32, u64, u64)>,
    },
    Split {
        topic_id: u64,
        range_id: u32,
    },
    Merge {
        topic_id: u64,
        left: u32,
        right: u32,
    },
}

/// The most sources a settle names: a segment has at most this many copies.
pub const SETTLE_SOURCES_MAX: usize = u8::MAX as usize;

/// Why a request is not a call this broker knows.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PeerCallError {
    #[error("unknown {service:?} call {kind}")]
    UnknownKind { service: Service, kind: u8 },
    #[error("truncated {0} call")]
    Truncated(&'static str),
    #[error("{bytes} bytes after the {call} call")]
    Trailing { call: &'static str, bytes: usize },
    #[error("malformed {call} call: {detail}")]
    Malformed { call: &'static str, detail: String },
}

impl PeerCall {
    /// The request that carries this call.
    pub fn encode(&self) -> Request {
        let cluster = |kind, group_id, payload| Request {
            service: Service::Cluster,
            group_id,
            kind,
            payload,
        };
        match self {
            PeerCall::Raft { group_id, kind, body } => Request {
                service: Service::Raft,
                group_id: *group_id,
                kind: kind.code(),
                payload: body.clone(),
            },
            PeerCall::Welcome => cluster(CLUSTER_WELCOME, 0, Vec::new()),
            PeerCall::Join(record) => cluster(CLUSTER_JOIN, 0, json(record)),
            PeerCall::AddMember(add) => cluster(CLUSTER_ADD_MEMBER, add.group_id, json(add)),
            PeerCall::Coordinate { group_id, ask } => cluster(ask_kind(ask), *group_id, json(ask)),
            PeerCall::Enroll(enroll) => cluster(CLUSTER_ENROLL, 0, json(enroll)),
            PeerCall::Draining { draining } => {
                cluster(CLUSTER_DRAINING, 0, json(&DrainNotice { draining: *draining }))
            }
            PeerCall::HandOver { draining } => {
                cluster(CLUSTER_HAND_OVER, 0, json(&DrainNotice { draining: *draining }))
            }
            PeerCall::Data { key, call } => Request {
                service: Service::Data,
                group_id: 0,
                kind: call.kind(),
                payload: call.encode(*key),
            },
        }
    }

    /// The call `request` carries.
    pub fn decode(request: Request) -> Result<PeerCall, PeerCallError> {
        let Request { service, group_id, kind, payload } = request;
        let unknown = PeerCallError::UnknownKind { service, kind };
        match service {
            Service::Raft => {
                let kind = MessageKind::from_code(kind).ok_or(unknown)?;
                Ok(PeerCall::Raft { group_id, kind, body: payload })
            }
            Service::Cluster => decode_cluster(group_id, kind, &payload).ok_or(unknown)?,
            Service::Data if group_id != 0 => Err(malformed("data", "a data call names no group")),
            Service::Data => {
                let mut reader = Reader(&payload);
                let key = decode_key(&mut reader)?;
                let call = DataCall::decode(kind, &mut reader).ok_or(unknown)??;
                Ok(PeerCall::Data { key, call })
            }
        }
    }

    /// The enrollment `request` carries; `None` when it carries another call, which a stranger
    /// may not make (and which is then not decoded at all).
    pub fn decode_enrollment(request: Request) -> Option<Result<EnrollRequest, PeerCallError>> {
        (request.service == Service::Cluster && request.kind == CLUSTER_ENROLL)
            .then(|| from_json("enroll", &request.payload))
    }

    /// A short name for logs and refusals.
    pub fn name(&self) -> &'static str {
        match self {
            PeerCall::Raft { .. } => "raft",
            PeerCall::Welcome => "welcome",
            PeerCall::Join(_) => "join",
            PeerCall::AddMember(_) => "add-member",
            PeerCall::Coordinate { .. } => "coordinate",
            PeerCall::Enroll(_) => "enroll",
            PeerCall::Draining { .. } => "draining",
            PeerCall::HandOver { .. } => "hand-over",
            PeerCall::Data { call, .. } => call.name(),
        }
    }
}

/// A cluster call, `None` for an unknown kind. The cluster calls are JSON (rare control calls,
/// a few hundred bytes); a call's kind must agree with what it carries.
fn decode_cluster(
    group_id: u64,
    kind: u8,
    payload: &[u8],
) -> Option<Result<PeerCall, PeerCallError>> {
    let groupless = matches!(
        kind,
        CLUSTER_WELCOME | CLUSTER_JOIN | CLUSTER_ENROLL | CLUSTER_DRAINING | CLUSTER_HAND_OVER
    );
    if groupless && group_id != 0 {
        return Some(Err(malformed("cluster", "this call names no group")));
    }
    Some(match kind {
        CLUSTER_WELCOME if payload.is_empty() => Ok(PeerCall::Welcome),
        CLUSTER_WELCOME => Err(PeerCallError::Trailing { call: "welcome", bytes: payload.len() }),
        CLUSTER_JOIN => from_json("join", payload).map(PeerCall::Join),
        CLUSTER_ADD_MEMBER => from_json("add-member", payload).and_then(|add: AddMember| {
            if add.group_id == group_id {
                Ok(PeerCall::AddMember(add))
            } else {
                Err(malformed("add-member", "the group differs from the request's"))
            }
        }),
        CLUSTER_ROLL_WANTED | CLUSTER_LOAD_REPORT | CLUSTER_RESHAPE => {
            from_json("coordinate", payload).and_then(|ask: Ask| {
                if ask_kind(&ask) == kind {
                    Ok(PeerCall::Coordinate { group_id, ask })
                } else {
                    Err(malformed("coordinate", "the question differs from the call's kind"))
                }
            })
        }
        CLUSTER_ENROLL => from_json("enroll", payload).map(PeerCall::Enroll),
        CLUSTER_DRAINING => from_json("draining", payload)
            .map(|notice: DrainNotice| PeerCall::Draining { draining: notice.draining }),
        CLUSTER_HAND_OVER => from_json("hand-over", payload)
            .map(|notice: DrainNotice| PeerCall::HandOver { draining: notice.draining }),
        _ => return None,
    })
}

fn ask_kind(ask: &Ask) -> u8 {
    match ask {
        Ask::Roll { .. } => CLUSTER_ROLL_WANTED,
        Ask::Load { .. } => CLUSTER_LOAD_REPORT,
        Ask::Split { .. } | Ask::Merge { .. } => CLUSTER_RESHAPE,
    }
}

pub(crate) fn json(value: &impl Serialize) -> Vec<u8> {
    serde_json::to_vec(value).expect("peer calls serialize")
}

fn from_json<T: serde::de::DeserializeOwned>(
    call: &'static str,
    payload: &[u8],
) -> Result<T, PeerCallError> {
    serde_json::from_slice(payload).map_err(|error| malformed(call, error))
}

fn malformed(call: &'static str, detail: impl std::fmt::Display) -> PeerCallError {
    PeerCallError::Malformed { call, detail: detail.to_string() }
}

impl DataCall {
    fn kind(&self) -> u8 {
        match self {
            DataCall::Append { .. } => DATA_APPEND,
            DataCall::Read { .. } => DATA_READ,
            DataCall::End => DATA_END,
            DataCall::Seal => DATA_SEAL,
            DataCall::Create => DATA_CREATE,
            DataCall::Replicate { .. } => DATA_REPLICATE,
            DataCall::Fence => DATA_FENCE,
            DataCall::Fill { .. } => DATA_FILL,
            DataCall::SealAt { .. } => DATA_SEAL_AT,
            DataCall::ReadRaw { .. } => DATA_READ_RAW,
            DataCall::Settle { .. } => DATA_SETTLE,
            DataCall::CopyState => DATA_COPY_STATE,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            DataCall::Append { .. } => "append",
            DataCall::Read { .. } => "read",
            DataCall::End => "end",
            DataCall::Seal => "seal",
            DataCall::Create => "create",
            DataCall::Replicate { .. } => "replicate",
            DataCall::Fence => "fence",
            DataCall::Fill { .. } => "fill",
            DataCall::SealAt { .. } => "seal-at",
            DataCall::ReadRaw { .. } => "read-raw",
            DataCall::Settle { .. } => "settle",
            DataCall::CopyState => "copy-state",
        }
    }

    fn encode(&self, key: SegmentKey) -> Vec<u8> {
        let mut out = Vec::with_capacity(KEY_BYTES + 24);
        out.extend_from_slice(&key.topic_id.to_le_bytes());
        out.extend_from_slice(&key.range_id.to_le_bytes());
        out.extend_from_slice(&key.segment_id.to_le_bytes());
        match self {
            DataCall::End
            | DataCall::Seal
            | DataCall::Create
            | DataCall::Fence
            | DataCall::CopyState
            | DataCall::Append { .. } => {}
            DataCall::Read { from, wanted, bytes_max }
            | DataCall::ReadRaw { from, wanted, bytes_max } => {
                put(&mut out, *from);
                out.extend_from_slice(&wanted.to_le_bytes());
                out.extend_from_slice(&bytes_max.to_le_bytes());
            }
            DataCall::Replicate { start, acked_end, .. } => {
                put(&mut out, *start);
                put(&mut out, *acked_end);
            }
            DataCall::Fill { source, end } => {
                put(&mut out, *source);
                put(&mut out, *end);
            }
            DataCall::SealAt { end } => put(&mut out, *end),
            DataCall::Settle { seal, sources } => {
                assert!(sources.len() <= SETTLE_SOURCES_MAX, "a segment has few copies");
                put(&mut out, seal.end_offset);
                put(&mut out, seal.data_bytes);
                out.push(sources.len() as u8);
                for &source in sources {
                    put(&mut out, source);
                }
            }
        }
        if let DataCall::Append { records } | DataCall::Replicate { records, .. } = self {
            encode_records(records, &mut out);
        }
        out
    }

    /// The data call of `kind` from what follows the key; `None` for an unknown kind.
    fn decode(kind: u8, reader: &mut Reader<'_>) -> Option<Result<DataCall, PeerCallError>> {
        let call = match kind {
            DATA_APPEND => decode_records(reader).map(|records| DataCall::Append { records }),
            DATA_READ => read_args(reader).map(|(from, wanted, bytes_max)| DataCall::Read {
                from,
                wanted,
                bytes_max,
            }),
            DATA_END => Ok(DataCall::End),
            DATA_SEAL => Ok(DataCall::Seal),
            DATA_CREATE => Ok(DataCall::Create),
            DATA_REPLICATE => (|| {
                let (start, acked_end) = (reader.u64()?, reader.u64()?);
                let records = decode_records(reader)?;
                Ok(DataCall::Replicate { start, acked_end, records })
            })(),
            DATA_FENCE => Ok(DataCall::Fence),
            DATA_FILL => (|| Ok(DataCall::Fill { source: reader.u64()?, end: reader.u64()? }))(),
            DATA_SEAL_AT => reader.u64().map(|end| DataCall::SealAt { end }),
            DATA_READ_RAW => read_args(reader).map(|(from, wanted, bytes_max)| DataCall::ReadRaw {
                from,
                wanted,
                bytes_max,
            }),
            DATA_SETTLE => decode_settle(reader),
            DATA_COPY_STATE => Ok(DataCall::CopyState),
            _ => return None,
        };
        Some(call.map_err(|detail| malformed("data", detail)).and_then(
            |call| match reader.0.len() {
                0 => Ok(call),
                bytes => Err(PeerCallError::Trailing { call: call.name(), bytes }),
            },
        ))
    }
}

fn put(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(&value.to_le_bytes());
}

fn read_args(reader: &mut Reader<'_>) -> Result<(u64, u32, u64), String> {
    Ok((reader.u64()?, reader.u32()?, reader.u64()?))
}

fn decode_settle(reader: &mut Reader<'_>) -> Result<DataCall, String> {
    let seal = SealInfo { end_offset: reader.u64()?, data_bytes: reader.u64()? };
    let count = usize::from(reader.u8()?);
    // Checked before anything is reserved: each source is 8 bytes.
    if reader.0.len() < count * 8 {
        return Err(format!("{count} sources declared, {} bytes left", reader.0.len()));
    }
    let sources = (0..count).map(|_| reader.u64()).collect::<Result<Vec<u64>, String>>()?;
    Ok(DataCall::Settle { seal, sources })
}

fn decode_key(reader: &mut Reader<'_>) -> Result<SegmentKey, PeerCallError> {
    let key = (|| {
        Ok::<_, String>(SegmentKey {
            topic_id: reader.u64()?,
            range_id: reader.u32()?,
            segment_id: reader.u64()?,
        })
    })();
    key.map_err(|_| PeerCallError::Truncated("data"))
}
