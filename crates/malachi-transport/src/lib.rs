//! The inter-node transport: how brokers call each other.
//!
//! Each broker keeps one TCP connection to each peer it calls (opened on first use, reopened
//! after a failure) and multiplexes every call over it: the messages of every Raft group and the
//! cluster's control calls (join). Calls carry an id; answers come back in any order. The peer
//! answers on the same connection, so a pair of brokers holds at most two connections, one
//! opened by each side.
//!
//! A connection starts with a hello each way (`frame.rs`): the peer's node id and cluster id
//! are checked before any call is read, so a broker of another cluster, or another node than the
//! address book promised, is refused with a reason, never served.
//!
//! This crate decides nothing: the receiving broker's [`Handler`] does. It implements
//! `malachi_consensus::GroupTransport`, so Raft groups send through it without knowing TCP.
//! Connections come from a [`Dialer`] and are served from any byte stream
//! ([`Transport::serve_stream`]): real TCP for a broker, the simulator's pipes for its nodes, so
//! the simulator runs this very code.

pub mod frame;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use malachi_consensus::{GroupTransport, RaftMessage, TransportError, TransportFuture};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};

pub use frame::{Frame, FrameError, Hello, Request, Service};

/// How long a connect plus the hello exchange may take.
pub const CONNECT_TIMEOUT_MS: u64 = 2_000;
/// A connection owing answers that receives nothing for this long is aborted ([`Link`]).
pub const SILENT_LINK_MS: u64 = 3_000;
/// Frames queued for one connection's writer before senders wait.
const WRITE_QUEUE_FRAMES: usize = 1024;
/// A refusal reason longer than this is cut.
const REASON_BYTES_MAX: usize = 1024;

/// The future a handler returns: the answer's payload, or why the call failed.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<Vec<u8>, String>> + Send>>;

/// One direction of a connection.
pub type StreamRead = Box<dyn AsyncRead + Send + Unpin>;
pub type StreamWrite = Box<dyn AsyncWrite + Send + Unpin>;
/// What a dial comes to: the two directions of a new connection.
pub type DialFuture =
    Pin<Box<dyn Future<Output = std::io::Result<(StreamRead, StreamWrite)>> + Send>>;

/// Opens connections to peers' inter-node addresses.
pub trait Dialer: Send + Sync + 'static {
    fn dial(&self, address: &str) -> DialFuture;
}

/// Real TCP, with Nagle off (calls are small and latency-bound) and a zero linger: closing a
/// connection resets it and discards what the kernel still holds unsent, so calls given up on
/// while a peer was cut off are not delivered when the cut heals (see [`Link`]).
pub struct TcpDialer;

impl Dialer for TcpDialer {
    fn dial(&self, address: &str) -> DialFuture {
        let address = address.to_string();
        Box::pin(async move {
            let stream = TcpStream::connect(&address).await?;
            let _ = stream.set_nodelay(true);
            let _ = stream.set_zero_linger();
            let (read, write) = stream.into_split();
            Ok((Box::new(read) as StreamRead, Box::new(write) as StreamWrite))
        })
    }
}

/// The receiving broker's side: answers the calls peers make.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, request: Request) -> HandlerFuture;
}

/// Why a call got no answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// No address is known for the node, or the connection could not be made or broke.
    #[error("node {node}: unreachable: {detail}")]
    Unreachable { node: String, detail: String },
    /// The peer refused the connection at the hello (another cluster, another node id).
    #[error("refused by {node}: {reason}")]
    Refused { node: String, reason: String },
    #[error("no answer in time")]
    Timeout,
    /// The call was sent, and the connection broke before its answer: the peer may have
    /// acted on it.
    #[error("node {node}: connection lost after the call was sent: {detail}")]
    Lost { node: String, detail: String },
    /// The peer's handler failed the call.
    #[error("the peer failed the call: {0}")]
    Failed(String),
}

/// This broker's end of the inter-node transport. Cheap to clone.
#[derive(Clone)]
pub struct Transport {
    inner: Arc<Inner>,
}

struct Inner {
    node_id: u64,
    /// Empty until the node belongs to a cluster (a joiner learns it from its seed).
    cluster_id: RwLock<String>,
    /// Where each peer's inter-node port is, by node id.
    addresses: RwLock<BTreeMap<u64, String>>,
    /// One slot per peer; the async lock makes concurrent first calls share one connect.
    links: Mutex<BTreeMap<u64, LinkSlot>>,
    handler: RwLock<Option<Arc<dyn Handler>>>,
    next_call_id: AtomicU64,
    dialer: Arc<dyn Dialer>,
}

/// A peer's link, if open; the async lock makes concurrent first calls share one connect.
type LinkSlot = Arc<tokio::sync::Mutex<Option<Arc<Link>>>>;
/// Where a call's answer goes.
type Waiter = oneshot::Sender<Result<Vec<u8>, CallError>>;

/// One open connection this broker made to a peer.
///
/// A connection on which requests went out and nothing at all came back for
/// [`SILENT_LINK_MS`] (no answer to any call, including calls their callers gave up on) is
/// presumed dead or cut off: it is aborted, failing the calls still waiting on it (`Lost`:
/// their outcome is unknown), and dropped with a reset. Otherwise TCP would keep retransmitting
/// what was queued while the peer was out of reach and deliver it when the cut heals, so a
/// write its caller had long reported as failed would apply minutes later (the partition test
/// found a topic created that way). A healthy peer answers every call, so a busy connection is
/// never silent that long; an idle one expects nothing and is left alone.
struct Link {
    writer: mpsc::Sender<Vec<u8>>,
    pending: Mutex<BTreeMap<u64, Waiter>>,
    closed: AtomicBool,
    /// Requests written to the connection, and frames (answers) read from it: while the
    /// first is ahead, an answer is owed.
    requests_sent: AtomicU64,
    frames_received: AtomicU64,
    /// When the connection last showed progress (an answer arrived, or a request went out
    /// while none was owed), in milliseconds since `opened`.
    progress_ms: AtomicU64,
    opened: tokio::time::Instant,
}

impl Link {
    fn new(writer: mpsc::Sender<Vec<u8>>) -> Link {
        Link {
            writer,
            pending: Mutex::new(BTreeMap::new()),
            closed: AtomicBool::new(false),
            requests_sent: AtomicU64::new(0),
            frames_received: AtomicU64::new(0),
            progress_ms: AtomicU64::new(0),
            opened: tokio::time::Instant::now(),
        }
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn sent_request(&self) {
        let sent = self.requests_sent.fetch_add(1, Ordering::AcqRel);
        if sent == self.frames_received.load(Ordering::Acquire) {
            self.progress_ms.store(self.elapsed_ms(), Ordering::Release);
        }
    }

    fn received_frame(&self) {
        self.frames_received.fetch_add(1, Ordering::AcqRel);
        self.progress_ms.store(self.elapsed_ms(), Ordering::Release);
    }

    /// Whether answers are owed and none came for [`SILENT_LINK_MS`].
    fn silent(&self) -> bool {
        let owed = self.requests_sent.load(Ordering::Acquire)
            > self.frames_received.load(Ordering::Acquire);
        owed && self.elapsed_ms().saturating_sub(self.progress_ms.load(Ordering::Acquire))
            >= SILENT_LINK_MS
    }
}

/// A call in flight on a link: removes its waiter however the call ends (answered, timed out,
/// or dropped by its caller), so calls given up on leave nothing behind.
struct InFlight<'a> {
    link: &'a Link,
    id: u64,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.link.pending.lock().expect("pending lock").remove(&self.id);
    }
}

impl Transport {
    /// `cluster_id` is empty for a node that has not joined yet. Dials over TCP.
    pub fn new(node_id: u64, cluster_id: &str) -> Transport {
        Transport::with_dialer(node_id, cluster_id, Arc::new(TcpDialer))
    }

    /// A transport whose connections `dialer` opens (the simulator's network).
    pub fn with_dialer(node_id: u64, cluster_id: &str, dialer: Arc<dyn Dialer>) -> Transport {
        assert!(cluster_id.len() <= frame::CLUSTER_ID_BYTES_MAX, "cluster id too long");
        Transport {
            inner: Arc::new(Inner {
                node_id,
                cluster_id: RwLock::new(cluster_id.to_string()),
                addresses: RwLock::new(BTreeMap::new()),
                links: Mutex::new(BTreeMap::new()),
                handler: RwLock::new(None),
                next_call_id: AtomicU64::new(1),
                dialer,
            }),
        }
    }

    pub fn node_id(&self) -> u64 {
        self.inner.node_id
    }

    pub fn cluster_id(&self) -> String {
        self.inner.cluster_id.read().expect("cluster id lock").clone()
    }

    /// Adopts the cluster id a joiner learned from its seed.
    pub fn set_cluster_id(&self, cluster_id: &str) {
        assert!(cluster_id.len() <= frame::CLUSTER_ID_BYTES_MAX, "cluster id too long");
        *self.inner.cluster_id.write().expect("cluster id lock") = cluster_id.to_string();
    }

    pub fn set_handler(&self, handler: Arc<dyn Handler>) {
        *self.inner.handler.write().expect("handler lock") = Some(handler);
    }

    /// Records where `node_id` listens. A changed address drops the old connection.
    pub fn set_address(&self, node_id: u64, address: &str) {
        let previous = self
            .inner
            .addresses
            .write()
            .expect("address lock")
            .insert(node_id, address.to_string());
        if previous.is_some_and(|previous| previous != address) {
            self.inner.links.lock().expect("links lock").remove(&node_id);
        }
    }

    pub fn address(&self, node_id: u64) -> Option<String> {
        self.inner.addresses.read().expect("address lock").get(&node_id).cloned()
    }

    /// Calls `target` and waits at most `timeout` for its answer.
    pub async fn call(
        &self,
        target: u64,
        request: Request,
        timeout: Duration,
    ) -> Result<Vec<u8>, CallError> {
        match tokio::time::timeout(timeout, self.call_inner(target, request)).await {
            Ok(answer) => answer,
            Err(_) => Err(CallError::Timeout),
        }
    }

    async fn call_inner(&self, target: u64, request: Request) -> Result<Vec<u8>, CallError> {
        let link = self.link(target).await?;
        let id = self.inner.next_call_id.fetch_add(1, Ordering::Relaxed);
        let (answer_tx, answer_rx) = oneshot::channel();
        link.pending.lock().expect("pending lock").insert(id, answer_tx);
        let _in_flight = InFlight { link: &link, id };
        // A closed link after the insert: its reader has drained `pending` or will not see
        // this entry, so fail it here rather than wait for the timeout.
        if link.closed.load(Ordering::Acquire) {
            return Err(unreachable(target, "connection closed"));
        }
        let bytes = frame::encode_frame(&Frame::Request { id, request });
        if link.writer.send(bytes).await.is_err() {
            return Err(unreachable(target, "connection closed"));
        }
        link.sent_request();
        answer_rx.await.unwrap_or_else(|_| Err(lost(target, "connection closed")))
    }

    /// Calls whoever listens at `address` on a connection of its own, closed after the answer:
    /// how a joiner reaches a seed whose node id it does not know yet. Returns the peer's hello
    /// and its answer.
    pub async fn call_address(
        &self,
        address: &str,
        request: Request,
        timeout: Duration,
    ) -> Result<(Hello, Vec<u8>), CallError> {
        let call = async {
            let (hello, link) = self.connect(address, None).await?;
            let id = self.inner.next_call_id.fetch_add(1, Ordering::Relaxed);
            let (answer_tx, answer_rx) = oneshot::channel();
            link.pending.lock().expect("pending lock").insert(id, answer_tx);
            let bytes = frame::encode_frame(&Frame::Request { id, request });
            link.writer.send(bytes).await.map_err(|_| unreachable(address, "connection closed"))?;
            link.sent_request();
            let answer = answer_rx.await.map_err(|_| lost(address, "connection closed"))?;
            Ok((hello, answer?))
        };
        match tokio::time::timeout(timeout, call).await {
            Ok(answer) => answer,
            Err(_) => Err(CallError::Timeout),
        }
    }

    /// The open link to `target`, connecting if there is none.
    async fn link(&self, target: u64) -> Result<Arc<Link>, CallError> {
        let slot =
            Arc::clone(self.inner.links.lock().expect("links lock").entry(target).or_default());
        let mut slot = slot.lock().await;
        if let Some(link) = slot.as_ref().filter(|link| !link.closed.load(Ordering::Acquire)) {
            return Ok(Arc::clone(link));
        }
        let address = self
            .address(target)
            .ok_or_else(|| unreachable(target, "no address known for this node"))?;
        let (_, link) = self.connect(&address, Some(target)).await?;
        *slot = Some(Arc::clone(&link));
        Ok(link)
    }

    /// Connects to `address`, exchanges hellos (checking the peer is `expected` when given, and
    /// of this node's cluster) and starts the link's reader and writer.
    async fn connect(
        &self,
        address: &str,
        expected: Option<u64>,
    ) -> Result<(Hello, Arc<Link>), CallError> {
        let timeout = Duration::from_millis(CONNECT_TIMEOUT_MS);
        let connect = async {
            let (mut read, mut write) = self
                .inner
                .dialer
                .dial(address)
                .await
                .map_err(|error| unreachable(address, error.to_string()))?;
            let hello = Hello { node_id: self.inner.node_id, cluster_id: self.cluster_id() };
            write
                .write_all(&frame::encode_hello(&hello))
                .await
                .map_err(|error| unreachable(address, error.to_string()))?;
            write.flush().await.map_err(|error| unreachable(address, error.to_string()))?;
            let peer = read_hello_answer(&mut read, address).await?;
            Ok::<_, CallError>((read, write, peer))
        };
        let (read, write, peer) = tokio::time::timeout(timeout, connect)
            .await
            .map_err(|_| unreachable(address, "connect timed out"))??;
        let ours = self.cluster_id();
        if !ours.is_empty() && peer.cluster_id != ours {
            return Err(CallError::Refused {
                node: address.to_string(),
                reason: format!(
                    "it belongs to cluster {:?}, this broker to {ours:?}",
                    peer.cluster_id
                ),
            });
        }
        if let Some(expected) = expected.filter(|&expected| expected != peer.node_id) {
            return Err(CallError::Refused {
                node: address.to_string(),
                reason: format!("it is node {}, not node {expected}", peer.node_id),
            });
        }
        let (writer, queue) = mpsc::channel(WRITE_QUEUE_FRAMES);
        let link = Arc::new(Link::new(writer));
        let (abort, aborted) = watch::channel(false);
        tokio::spawn(write_frames(write, queue, aborted));
        tokio::spawn(read_answers(read, Arc::clone(&link), address.to_string(), abort));
        Ok((peer, link))
    }

    /// Accepts peers' connections on `listener` until the task is dropped.
    pub async fn serve(self, listener: TcpListener) {
        loop {
            match listener.accept().await {
                Ok((stream, from)) => {
                    let _ = stream.set_nodelay(true);
                    let (read, write) = stream.into_split();
                    let transport = self.clone();
                    tokio::spawn(async move {
                        if let Err(error) =
                            transport.serve_stream(Box::new(read), Box::new(write)).await
                        {
                            tracing::debug!(%from, %error, "inter-node connection ended");
                        }
                    });
                }
                Err(error) => {
                    tracing::warn!(%error, "accepting an inter-node connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// Serves one peer's connection, accepted by whatever listens (a TCP listener, the
    /// simulator's network), until it ends.
    pub async fn serve_stream(
        &self,
        mut read: StreamRead,
        mut write: StreamWrite,
    ) -> Result<(), String> {
        let hello =
            tokio::time::timeout(Duration::from_millis(CONNECT_TIMEOUT_MS), read_hello(&mut read))
                .await
                .map_err(|_| "no hello in time".to_string())?
                .map_err(|error| error.to_string())?;
        let ours = self.cluster_id();
        let refusal = if ours.is_empty() {
            Some("this broker has not joined a cluster yet".to_string())
        } else if !hello.cluster_id.is_empty() && hello.cluster_id != ours {
            Some(format!(
                "this broker belongs to cluster {ours}, the caller (node {}) to {}",
                hello.node_id, hello.cluster_id
            ))
        } else {
            None
        };
        if let Some(reason) = refusal {
            let mut answer = vec![1u8];
            let reason = &reason.as_bytes()[..reason.len().min(REASON_BYTES_MAX)];
            answer.extend_from_slice(&(reason.len() as u16).to_le_bytes());
            answer.extend_from_slice(reason);
            let _ = write.write_all(&answer).await;
            let _ = write.flush().await;
            return Err(format!(
                "refused node {}: {}",
                hello.node_id,
                String::from_utf8_lossy(reason)
            ));
        }
        let mut answer = vec![0u8];
        answer.extend_from_slice(&frame::encode_hello(&Hello {
            node_id: self.inner.node_id,
            cluster_id: ours,
        }));
        write.write_all(&answer).await.map_err(|error| error.to_string())?;
        write.flush().await.map_err(|error| error.to_string())?;
        let (writer, queue) = mpsc::channel(WRITE_QUEUE_FRAMES);
        // Answers are never aborted: the caller's side decides when a connection is dead.
        let (_never, no_abort) = watch::channel(false);
        tokio::spawn(write_frames(write, queue, no_abort));
        loop {
            let frame = read_frame(&mut read).await.map_err(|error| error.to_string())?;
            let Frame::Request { id, request } = frame else {
                return Err("a peer sent an answer on a connection it opened".to_string());
            };
            let handler = self.inner.handler.read().expect("handler lock").clone();
            let writer = writer.clone();
            tokio::spawn(async move {
                let answer = match handler {
                    Some(handler) => handler.handle(request).await,
                    None => Err("this broker is still starting".to_string()),
                };
                let frame = match answer {
                    Ok(payload) => Frame::Answer { id, payload },
                    Err(reason) => Frame::Failure { id, reason },
                };
                let _ = writer.send(frame::encode_frame(&frame)).await;
            });
        }
    }
}

impl GroupTransport for Transport {
    fn send(&self, message: RaftMessage) -> TransportFuture {
        let transport = self.clone();
        Box::pin(async move {
            let request = Request {
                service: Service::Raft,
                group_id: message.group_id,
                kind: message.kind.code(),
                source_node_id: message.source_node_id,
                payload: message.payload,
            };
            let timeout = Duration::from_millis(message.timeout_ms.max(1));
            transport.call(message.target_node_id, request, timeout).await.map_err(|error| {
                match error {
                    CallError::Timeout => TransportError::Timeout,
                    CallError::Failed(reason) => TransportError::Failed(reason),
                    lost @ CallError::Lost { .. } => TransportError::Lost(lost.to_string()),
                    other => TransportError::Unreachable(other.to_string()),
                }
            })
        })
    }
}

fn unreachable(node: impl std::fmt::Display, detail: impl Into<String>) -> CallError {
    CallError::Unreachable { node: node.to_string(), detail: detail.into() }
}

fn lost(node: impl std::fmt::Display, detail: impl Into<String>) -> CallError {
    CallError::Lost { node: node.to_string(), detail: detail.into() }
}

async fn read_hello(stream: &mut (impl AsyncRead + Unpin)) -> Result<Hello, FrameError> {
    let mut fixed = [0u8; frame::HELLO_FIXED_BYTES];
    stream.read_exact(&mut fixed).await.map_err(|_| FrameError::Truncated("hello"))?;
    let (node_id, id_len) = frame::decode_hello_fixed(&fixed)?;
    let mut id = vec![0u8; id_len];
    stream.read_exact(&mut id).await.map_err(|_| FrameError::Truncated("hello"))?;
    Ok(Hello { node_id, cluster_id: frame::decode_text(id)? })
}

async fn read_hello_answer(
    stream: &mut (impl AsyncRead + Unpin),
    address: &str,
) -> Result<Hello, CallError> {
    let broken = |error: String| unreachable(address, error);
    let status = stream.read_u8().await.map_err(|error| broken(error.to_string()))?;
    if status == 0 {
        return read_hello(stream).await.map_err(|error| broken(error.to_string()));
    }
    let len = stream.read_u16_le().await.map_err(|error| broken(error.to_string()))?;
    let mut reason = vec![0u8; usize::from(len)];
    stream.read_exact(&mut reason).await.map_err(|error| broken(error.to_string()))?;
    Err(CallError::Refused {
        node: address.to_string(),
        reason: String::from_utf8_lossy(&reason).into_owned(),
    })
}

async fn read_frame(read: &mut StreamRead) -> Result<Frame, FrameError> {
    let mut prefix = [0u8; 4];
    read.read_exact(&mut prefix).await.map_err(|_| FrameError::Truncated("frame length"))?;
    let len = frame::frame_body_len(prefix)?;
    let mut body = vec![0u8; len];
    read.read_exact(&mut body).await.map_err(|_| FrameError::Truncated("frame body"))?;
    frame::decode_frame(body)
}

/// Writes queued frames, flushing when the queue runs dry, so a burst goes out in few writes,
/// until the queue closes or `abort` is set (then what is queued is dropped with the stream).
async fn write_frames(
    write: StreamWrite,
    mut queue: mpsc::Receiver<Vec<u8>>,
    mut abort: watch::Receiver<bool>,
) {
    let mut write = BufWriter::new(write);
    let writing = async move {
        while let Some(bytes) = queue.recv().await {
            if write.write_all(&bytes).await.is_err() {
                return;
            }
            while let Ok(bytes) = queue.try_recv() {
                if write.write_all(&bytes).await.is_err() {
                    return;
                }
            }
            if write.flush().await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        biased;
        _ = abort.wait_for(|&abort| abort) => {}
        () = writing => {}
    }
}

/// Hands answers to their callers until the connection breaks, then fails every call waiting
/// on it.
async fn read_answers(
    mut read: StreamRead,
    link: Arc<Link>,
    address: String,
    abort: watch::Sender<bool>,
) {
    let check = Duration::from_millis(SILENT_LINK_MS / 4);
    let error = loop {
        let frame = tokio::select! {
            biased;
            frame = read_frame(&mut read) => frame,
            () = tokio::time::sleep(check) => {
                if link.silent() {
                    tracing::debug!(%address, "no answer on the connection: aborting it");
                    break format!("aborted: no answer from the peer for {SILENT_LINK_MS} ms");
                }
                continue;
            }
        };
        let frame = match frame {
            Ok(frame) => frame,
            Err(error) => break error.to_string(),
        };
        link.received_frame();
        let (id, answer) = match frame {
            Frame::Answer { id, payload } => (id, Ok(payload)),
            Frame::Failure { id, reason } => (id, Err(CallError::Failed(reason))),
            Frame::Request { .. } => break "the peer sent a request on our connection".into(),
        };
        if let Some(waiter) = link.pending.lock().expect("pending lock").remove(&id) {
            let _ = waiter.send(answer);
        }
    };
    link.closed.store(true, Ordering::Release);
    // Drops the writer's half (with a reset: a zero linger) and with it what is queued.
    abort.send_replace(true);
    let waiting = std::mem::take(&mut *link.pending.lock().expect("pending lock"));
    for (_, waiter) in waiting {
        let _ = waiter.send(Err(lost(&address, error.clone())));
    }
}

#[cfg(test)]
mod tests;
