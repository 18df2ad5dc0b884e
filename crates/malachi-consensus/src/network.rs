//! The network seam: [`GroupTransport`] moves opaque Raft messages between nodes.
//!
//! openraft's own network traits are generic and async, so they cannot be trait objects, and
//! they name openraft types. This crate implements them once (`GroupNetwork`, `GroupPeer`) on
//! top of [`GroupTransport`], an object-safe trait that sees only group id, node ids, a message
//! kind and bytes. That is where the multiplexed TCP transport (many groups over one connection
//! per peer) and the simulator's transport plug in, without knowing openraft.
//!
//! The receiving side hands the bytes to [`crate::RaftGroup::handle_message`] of the group named
//! in the message and sends the returned bytes back as the answer.
//!
//! Payloads are serde_json of openraft's request and response types, except a snapshot, which is
//! `u32` little-endian header length, the JSON header (vote and snapshot meta), then the raw
//! snapshot bytes, so a large snapshot is not inflated by JSON.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;

use futures_util::future::Either;
use openraft::RaftNetworkFactory;
use openraft::RaftNetworkV2;
use openraft::error::NetworkError;
use openraft::error::RPCError;
use openraft::error::ReplicationClosed;
use openraft::error::StreamingError;
use openraft::error::Timeout;
use openraft::error::Unreachable;
use openraft::network::RPCOption;
use openraft::network::RPCTypes;
use openraft::raft::AppendEntriesRequest;
use openraft::raft::AppendEntriesResponse;
use openraft::raft::SnapshotResponse;
use openraft::raft::TransferLeaderRequest;
use openraft::raft::TransferLeaderResponse;
use openraft::raft::VoteRequest;
use openraft::raft::VoteResponse;
use serde::Deserialize;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::StateMachine;
use crate::type_config::Config;
use crate::type_config::Snapshot;
use crate::type_config::SnapshotMeta;
use crate::type_config::Vote;

/// A snapshot header larger than this is refused: it holds a vote and a membership, not data.
const SNAPSHOT_HEADER_BYTES_MAX: usize = 1 << 20;

/// The future a transport returns: the peer's answer bytes.
pub type TransportFuture = Pin<Box<dyn Future<Output = Result<Vec<u8>, TransportError>> + Send>>;

/// Moves Raft messages of any group to a peer node and brings back its answer.
///
/// Implementations: [`NoPeers`] today; the multiplexed TCP transport and the simulator's
/// transport later. An implementation should give up after `timeout_ms` with
/// [`TransportError::Timeout`]; openraft also abandons a call that outlives it.
pub trait GroupTransport: Send + Sync + 'static {
    fn send(&self, message: RaftMessage) -> TransportFuture;
}

/// One Raft request from a group on this node to the same group on `target_node_id`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaftMessage {
    pub group_id: u64,
    pub source_node_id: u64,
    pub target_node_id: u64,
    pub kind: MessageKind,
    /// How long the sender waits for the answer.
    pub timeout_ms: u64,
    pub payload: Vec<u8>,
}

/// The Raft RPCs that cross the network. The codes are the wire values; never reuse one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum MessageKind {
    AppendEntries = 1,
    Vote = 2,
    PreVote = 3,
    FullSnapshot = 4,
    /// A client write this node forwards to the group's leader (not a Raft RPC): the command's
    /// JSON; the answer is a `Forwarded` in JSON.
    ClientWrite = 5,
    /// A read barrier this node asks of the group's leader (not a Raft RPC): an empty payload;
    /// the answer is a `ReadIndex` in JSON.
    ReadIndex = 6,
    /// The leader hands its leadership to the target, which starts an election at once.
    TransferLeader = 7,
}

impl MessageKind {
    pub fn code(self) -> u8 {
        self as u8
    }

    pub fn from_code(code: u8) -> Option<MessageKind> {
        match code {
            1 => Some(MessageKind::AppendEntries),
            2 => Some(MessageKind::Vote),
            3 => Some(MessageKind::PreVote),
            4 => Some(MessageKind::FullSnapshot),
            5 => Some(MessageKind::ClientWrite),
            6 => Some(MessageKind::ReadIndex),
            7 => Some(MessageKind::TransferLeader),
            _ => None,
        }
    }
}

/// Why a message got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// The peer cannot be reached now; openraft backs off before it retries.
    #[error("peer unreachable: {0}")]
    Unreachable(String),
    /// No answer within the message's `timeout_ms`.
    #[error("no answer in time")]
    Timeout,
    /// The peer answered with an error (its group is not open, shut down, ...).
    #[error("peer failed: {0}")]
    Failed(String),
    /// The message was sent, and the connection broke before an answer: it may have been acted
    /// on.
    #[error("connection lost after sending: {0}")]
    Lost(String),
}

/// The transport of a node that has no peers: every message is unreachable. A single-voter
/// group never sends one.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoPeers;

impl GroupTransport for NoPeers {
    fn send(&self, message: RaftMessage) -> TransportFuture {
        let reason = format!(
            "node {} has no transport to node {} (group {})",
            message.source_node_id, message.target_node_id, message.group_id
        );
        Box::pin(async move { Err(TransportError::Unreachable(reason)) })
    }
}

/// openraft's network factory for one group.
pub(crate) struct GroupNetwork<M> {
    group_id: u64,
    node_id: u64,
    transport: Arc<dyn GroupTransport>,
    machine: PhantomData<fn() -> M>,
}

impl<M> GroupNetwork<M> {
    pub(crate) fn new(group_id: u64, node_id: u64, transport: Arc<dyn GroupTransport>) -> Self {
        GroupNetwork { group_id, node_id, transport, machine: PhantomData }
    }
}

/// openraft's client to one peer of one group.
pub(crate) struct GroupPeer<M> {
    group_id: u64,
    source_node_id: u64,
    target_node_id: u64,
    transport: Arc<dyn GroupTransport>,
    machine: PhantomData<fn() -> M>,
}

impl<M: StateMachine> RaftNetworkFactory<Config<M>> for GroupNetwork<M> {
    type Network = GroupPeer<M>;

    async fn new_client(&mut self, target: u64, _node: &openraft::EmptyNode) -> GroupPeer<M> {
        GroupPeer {
            group_id: self.group_id,
            source_node_id: self.node_id,
            target_node_id: target,
            transport: Arc::clone(&self.transport),
            machine: PhantomData,
        }
    }
}

impl<M: StateMachine> GroupPeer<M> {
    async fn call(
        &self,
        kind: MessageKind,
        payload: Vec<u8>,
        option: &RPCOption,
    ) -> Result<Vec<u8>, RPCError<Config<M>>> {
        let message = RaftMessage {
            group_id: self.group_id,
            source_node_id: self.source_node_id,
            target_node_id: self.target_node_id,
            kind,
            timeout_ms: u64::try_from(option.soft_ttl().as_millis()).unwrap_or(u64::MAX),
            payload,
        };
        self.transport.send(message).await.map_err(|error| match error {
            TransportError::Unreachable(_) => RPCError::Unreachable(Unreachable::new(&error)),
            TransportError::Failed(_) | TransportError::Lost(_) => {
                RPCError::Unreachable(Unreachable::new(&error))
            }
            TransportError::Timeout => RPCError::Timeout(Timeout {
                action: rpc_type(kind),
                id: self.source_node_id,
                target: self.target_node_id,
                timeout: option.soft_ttl(),
            }),
        })
    }

    async fn call_json<Request: Serialize, Response: DeserializeOwned>(
        &self,
        kind: MessageKind,
        request: &Request,
        option: &RPCOption,
    ) -> Result<Response, RPCError<Config<M>>> {
        let payload = serde_json::to_vec(request)
            .map_err(|error| RPCError::Network(NetworkError::new(&error)))?;
        let answer = self.call(kind, payload, option).await?;
        serde_json::from_slice(&answer)
            .map_err(|error| RPCError::Network(NetworkError::new(&error)))
    }
}

impl<M: StateMachine> RaftNetworkV2<Config<M>> for GroupPeer<M> {
    type SnapshotData = Vec<u8>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<Config<M>>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<Config<M>>, RPCError<Config<M>>> {
        self.call_json(MessageKind::AppendEntries, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<Config<M>>,
        option: RPCOption,
    ) -> Result<VoteResponse<Config<M>>, RPCError<Config<M>>> {
        self.call_json(MessageKind::Vote, &rpc, &option).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<Config<M>>,
        option: RPCOption,
    ) -> Result<VoteResponse<Config<M>>, RPCError<Config<M>>> {
        self.call_json(MessageKind::PreVote, &rpc, &option).await
    }

    async fn transfer_leader(
        &mut self,
        rpc: TransferLeaderRequest<Config<M>>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<Config<M>>, RPCError<Config<M>>> {
        self.call_json(MessageKind::TransferLeader, &rpc, &option).await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote<M>,
        snapshot: Snapshot<M>,
        cancel: impl Future<Output = ReplicationClosed> + openraft::OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<Config<M>>, StreamingError<Config<M>>> {
        let payload = encode_snapshot::<M>(&vote, &snapshot.meta, &snapshot.snapshot)
            .map_err(|error| StreamingError::Network(NetworkError::from_string(error)))?;
        let call = self.call(MessageKind::FullSnapshot, payload, &option);
        let answer = match futures_util::future::select(Box::pin(call), Box::pin(cancel)).await {
            Either::Left((answer, _)) => answer?,
            Either::Right((closed, _)) => return Err(StreamingError::Closed(closed)),
        };
        serde_json::from_slice(&answer)
            .map_err(|error| StreamingError::Network(NetworkError::new(&error)))
    }
}

fn rpc_type(kind: MessageKind) -> RPCTypes {
    match kind {
        MessageKind::AppendEntries => RPCTypes::AppendEntries,
        MessageKind::Vote | MessageKind::PreVote => RPCTypes::Vote,
        MessageKind::FullSnapshot => RPCTypes::InstallSnapshot,
        MessageKind::ClientWrite | MessageKind::ReadIndex => RPCTypes::AppendEntries,
        MessageKind::TransferLeader => RPCTypes::TransferLeader,
    }
}

#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
struct SnapshotHeader<M: StateMachine> {
    vote: Vote<M>,
    meta: SnapshotMeta<M>,
}

pub(crate) fn encode_snapshot<M: StateMachine>(
    vote: &Vote<M>,
    meta: &SnapshotMeta<M>,
    data: &[u8],
) -> Result<Vec<u8>, String> {
    let header = SnapshotHeader::<M> { vote: *vote, meta: meta.clone() };
    let header = serde_json::to_vec(&header).map_err(|error| error.to_string())?;
    if header.len() > SNAPSHOT_HEADER_BYTES_MAX {
        return Err(format!("snapshot header of {} bytes is too large", header.len()));
    }
    let header_len = u32::try_from(header.len()).map_err(|error| error.to_string())?;
    let mut payload = Vec::with_capacity(4 + header.len() + data.len());
    payload.extend_from_slice(&header_len.to_le_bytes());
    payload.extend_from_slice(&header);
    payload.extend_from_slice(data);
    Ok(payload)
}

pub(crate) fn decode_snapshot<M: StateMachine>(
    payload: &[u8],
) -> Result<(Vote<M>, Snapshot<M>), String> {
    let Some((length_bytes, rest)) = payload.split_first_chunk::<4>() else {
        return Err("snapshot message shorter than its length prefix".to_string());
    };
    let header_len =
        usize::try_from(u32::from_le_bytes(*length_bytes)).map_err(|error| error.to_string())?;
    if header_len > SNAPSHOT_HEADER_BYTES_MAX || header_len > rest.len() {
        return Err(format!("snapshot header length {header_len} is out of bounds"));
    }
    let (header, data) = rest.split_at(header_len);
    let header: SnapshotHeader<M> =
        serde_json::from_slice(header).map_err(|error| format!("snapshot header: {error}"))?;
    let snapshot = Snapshot::<M> { meta: header.meta, snapshot: data.to_vec() };
    Ok((header.vote, snapshot))
}
