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
pub mod gossip_seal;
pub mod pki;
pub mod resolve;
pub mod tls;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use malachi_consensus::{GroupTransport, RaftMessage, TransportError, TransportFuture};
use tokio::io::{
    AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter, ReadHalf, WriteHalf,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, oneshot, watch};

pub use frame::{Frame, FrameError, Hello, Request, Service};
pub use resolve::Resolver;
pub use tls::ClusterTls;

/// How long a connect, the TLS handshake and the hello exchange may take.
pub const CONNECT_TIMEOUT_MS: u64 = 2_000;
/// A connection owing answers that receives nothing for this long is aborted ([`Link`]).
pub const SILENT_LINK_MS: u64 = 3_000;
/// Frames queued for one connection's writer before senders wait.
const WRITE_QUEUE_FRAMES: usize = 1024;
/// Inbound connections served at once; more are closed at accept. A cluster of a hundred
/// brokers opens one per peer, plus short-lived ones for joins.
pub const INBOUND_CONNECTIONS_MAX: usize = 512;
/// Connections without a certificate (brokers enrolling) served at once.
pub const STRANGERS_MAX: usize = 8;
/// How long a stranger's connection may last: an enrollment is one call.
pub const STRANGER_SESSION_MS: u64 = 10_000;
/// Calls of one connection handled at once; the connection's reader waits for a free slot, so
/// a peer that sends faster than this broker answers is slowed down by TCP, not by memory.
pub const HANDLERS_PER_CONNECTION_MAX: usize = 64;
/// Bytes of answers one connection may have queued and not yet written; a handler whose answer
/// does not fit waits (an answer larger than the budget waits for the whole budget).
pub const ANSWER_QUEUE_BYTES_MAX: usize = 32 << 20;
/// How long a frame's body may take to arrive once its length is read: a peer that declares
/// a large frame and sends it slowly holds nothing for longer.
pub const FRAME_BODY_DEADLINE_MS: u64 = 60_000;

/// The future a handler returns: the answer's payload, or why the call failed.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<Vec<u8>, String>> + Send>>;

/// A connection's byte stream: TCP, TLS over TCP, or the simulator's pipes.
pub trait Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Stream for T {}
pub type BoxStream = Box<dyn Stream>;
/// What a dial comes to: a new connection.
pub type DialFuture = Pin<Box<dyn Future<Output = std::io::Result<BoxStream>> + Send>>;

/// Opens connections to peers' inter-node addresses.
pub trait Dialer: Send + Sync + 'static {
    fn dial(&self, address: &str) -> DialFuture;
}

/// Real TCP, with Nagle off (calls are small and latency-bound) and a zero linger: closing a
/// connection resets it and discards what the kernel still holds unsent, so calls given up on
/// while a peer was cut off are not delivered when the cut heals (see [`Link`]). Names are
/// resolved by a [`Resolver`], one lookup per name at a time.
#[derive(Debug, Default)]
pub struct TcpDialer {
    resolver: Arc<Resolver>,
}

impl Dialer for TcpDialer {
    fn dial(&self, address: &str) -> DialFuture {
        let address = address.to_string();
        let resolver = Arc::clone(&self.resolver);
        Box::pin(async move {
            let found = resolver.resolve(&address).await?;
            let stream = TcpStream::connect(&found[..]).await?;
            let _ = stream.set_nodelay(true);
            let _ = stream.set_zero_linger();
            Ok(Box::new(stream) as BoxStream)
        })
    }
}

/// How connections between brokers are secured.
#[derive(Clone, Debug)]
pub enum Security {
    /// TLS 1.3, both ends authenticated by certificates of the cluster CA (the default).
    Tls(Arc<ClusterTls>),
    /// TLS without a certificate yet: a joining broker, which can only enroll
    /// ([`Transport::call_as_stranger`]) and serves nobody.
    Unenrolled,
    /// Plain bytes, and a peer is whoever its hello says it is: only with
    /// `MALACHI_CLUSTER_INSECURE=true`, and in the simulator (which replaces the cryptography,
    /// not the checks made of a caller).
    Insecure,
}

/// Who made a call, as the connection it came on established it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// A broker of the cluster: the node its certificate names (under
    /// [`Security::Insecure`], the node its hello claims).
    Member(u64),
    /// A broker without a certificate, which may only enroll. `binding` is the TLS exporter
    /// value of its session, which its proof of the join token must be bound to.
    Stranger { binding: [u8; 32] },
}

/// The receiving broker's side: answers the calls peers make.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, caller: Caller, request: Request) -> HandlerFuture;
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
    security: Security,
    /// Inbound connections being served, and those of them without a certificate.
    inbound: Arc<Semaphore>,
    strangers: Arc<Semaphore>,
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
    writer: mpsc::Sender<Queued>,
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
    /// Told when a connection of its own has had its one call answered: the reader closes it,
    /// so the peer's slot (a stranger's, one of its few) is freed at once.
    hang_up: tokio::sync::Notify,
}

impl Link {
    fn new(writer: mpsc::Sender<Queued>) -> Link {
        Link {
            writer,
            pending: Mutex::new(BTreeMap::new()),
            closed: AtomicBool::new(false),
            requests_sent: AtomicU64::new(0),
            frames_received: AtomicU64::new(0),
            progress_ms: AtomicU64::new(0),
            opened: tokio::time::Instant::now(),
            hang_up: tokio::sync::Notify::new(),
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
    pub fn new(node_id: u64, cluster_id: &str, security: Security) -> Transport {
        Transport::with_dialer(node_id, cluster_id, Arc::new(TcpDialer::default()), security)
    }

    /// A transport whose connections `dialer` opens (the simulator's network).
    pub fn with_dialer(
        node_id: u64,
        cluster_id: &str,
        dialer: Arc<dyn Dialer>,
        security: Security,
    ) -> Transport {
        assert!(cluster_id.len() <= frame::CLUSTER_ID_BYTES_MAX, "cluster id too long");
        if let Security::Tls(tls) = &security {
            assert_eq!(tls.node_id(), node_id, "a broker's certificate names its own node");
        }
        Transport {
            inner: Arc::new(Inner {
                node_id,
                cluster_id: RwLock::new(cluster_id.to_string()),
                addresses: RwLock::new(BTreeMap::new()),
                links: Mutex::new(BTreeMap::new()),
                handler: RwLock::new(None),
                next_call_id: AtomicU64::new(1),
                dialer,
                security,
                inbound: Arc::new(Semaphore::new(INBOUND_CONNECTIONS_MAX)),
                strangers: Arc::new(Semaphore::new(STRANGERS_MAX)),
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
        if link.writer.send(Queued::unbudgeted(bytes)).await.is_err() {
            return Err(unreachable(target, "connection closed"));
        }
        link.sent_request();
        answer_rx.await.unwrap_or_else(|_| Err(lost(target, "connection closed")))
    }

    /// Calls whoever listens at `address` on a connection of its own, closed after the answer:
    /// how a broker reaches a seed whose node id it does not know. Returns the peer's hello
    /// and its answer.
    pub async fn call_address(
        &self,
        address: &str,
        request: Request,
        timeout: Duration,
    ) -> Result<(Hello, Vec<u8>), CallError> {
        self.call_address_as(address, Dial::AnyMember, |_| request, timeout).await
    }

    /// Calls the broker at `address` without a certificate, as a broker that has not joined
    /// yet: `request` is made from the session's binding (the TLS exporter value), which the
    /// call's proof of the join token must cover. Under [`Security::Insecure`] the binding is
    /// all zeros.
    pub async fn call_as_stranger(
        &self,
        address: &str,
        request: impl FnOnce([u8; 32]) -> Request + Send,
        timeout: Duration,
    ) -> Result<(Hello, [u8; 32], Vec<u8>), CallError> {
        let binding = Arc::new(Mutex::new([0u8; 32]));
        let seen = Arc::clone(&binding);
        let make = move |session: [u8; 32]| {
            *seen.lock().expect("binding lock") = session;
            request(session)
        };
        let (hello, answer) = self.call_address_as(address, Dial::Stranger, make, timeout).await?;
        let binding = *binding.lock().expect("binding lock");
        Ok((hello, binding, answer))
    }

    async fn call_address_as(
        &self,
        address: &str,
        dial: Dial,
        request: impl FnOnce([u8; 32]) -> Request + Send,
        timeout: Duration,
    ) -> Result<(Hello, Vec<u8>), CallError> {
        let call = async {
            let (hello, binding, link) = self.connect(address, dial).await?;
            let id = self.inner.next_call_id.fetch_add(1, Ordering::Relaxed);
            let (answer_tx, answer_rx) = oneshot::channel();
            link.pending.lock().expect("pending lock").insert(id, answer_tx);
            let bytes = frame::encode_frame(&Frame::Request { id, request: request(binding) });
            link.writer
                .send(Queued::unbudgeted(bytes))
                .await
                .map_err(|_| unreachable(address, "connection closed"))?;
            link.sent_request();
            let answer = answer_rx.await.map_err(|_| lost(address, "connection closed"));
            link.hang_up.notify_one();
            Ok((hello, answer??))
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
        let (_, _, link) = self.connect(&address, Dial::Node(target)).await?;
        *slot = Some(Arc::clone(&link));
        Ok(link)
    }

    /// Connects to `address`, secures the connection, exchanges hellos (checking the peer is
    /// the node dialled, of this node's cluster) and starts the link's reader and writer.
    async fn connect(
        &self,
        address: &str,
        dial: Dial,
    ) -> Result<(Hello, [u8; 32], Arc<Link>), CallError> {
        let timeout = Duration::from_millis(CONNECT_TIMEOUT_MS);
        let connect = async {
            let raw = self
                .inner
                .dialer
                .dial(address)
                .await
                .map_err(|error| unreachable(address, error.to_string()))?;
            let (stream, certified, binding) = self.secure_outbound(raw, address, dial).await?;
            let (mut read, mut write) = tokio::io::split(stream);
            let hello = Hello {
                versions: frame::VERSIONS,
                node_id: self.inner.node_id,
                cluster_id: self.cluster_id(),
            };
            write
                .write_all(&frame::encode_hello(&hello))
                .await
                .map_err(|error| unreachable(address, error.to_string()))?;
            write.flush().await.map_err(|error| unreachable(address, error.to_string()))?;
            let peer = read_hello_answer(&mut read, address).await?;
            Ok::<_, CallError>((read, write, peer, certified, binding))
        };
        let (read, write, peer, certified, binding) = tokio::time::timeout(timeout, connect)
            .await
            .map_err(|_| unreachable(address, "connect timed out"))??;
        self.check_answering_peer(address, dial, &peer, certified)?;
        let (writer, queue) = mpsc::channel(WRITE_QUEUE_FRAMES);
        let link = Arc::new(Link::new(writer));
        let (abort, aborted) = watch::channel(false);
        tokio::spawn(write_frames(write, queue, aborted));
        // A link to a node carries every call to it and is replaced when silent; a connection
        // of its own carries one call, which may rightly take long (a join waits for the
        // groups to catch the joiner up) and is bounded by its caller's timeout.
        let watch_silence = matches!(dial, Dial::Node(_));
        let reader =
            read_answers(read, Arc::clone(&link), address.to_string(), abort, watch_silence);
        tokio::spawn(reader);
        Ok((peer, binding, link))
    }

    /// The TLS session over `raw` (the peer's certified node id and the session's binding), or
    /// `raw` itself when insecure.
    async fn secure_outbound(
        &self,
        raw: BoxStream,
        address: &str,
        dial: Dial,
    ) -> Result<(BoxStream, Option<u64>, [u8; 32]), CallError> {
        let failed = |error: &dyn std::fmt::Display| CallError::Refused {
            node: address.to_string(),
            reason: format!("TLS: {error}"),
        };
        let (connector, expected) = match (&self.inner.security, dial) {
            (Security::Insecure, _) => return Ok((raw, None, [0u8; 32])),
            (_, Dial::Stranger) => {
                (tls::stranger_connector().map_err(|error| failed(&error))?, None)
            }
            (Security::Tls(tls), Dial::Node(node_id)) => (tls.current().0, Some(node_id)),
            (Security::Tls(tls), Dial::AnyMember) => (tls.current().0, None),
            (Security::Unenrolled, _) => {
                return Err(failed(&"this broker has no cluster certificate yet"));
            }
        };
        let stream = connector
            .connect(tls::server_name(expected), raw)
            .await
            .map_err(|error| failed(&error))?;
        let session = stream.get_ref().1;
        let certified = tls::peer_node_id(session.peer_certificates());
        let binding = exporter(|out| session.export_keying_material(out, pki::BINDING_LABEL, None))
            .map_err(|error| failed(&error))?;
        Ok((Box::new(stream), certified, binding))
    }

    fn check_answering_peer(
        &self,
        address: &str,
        dial: Dial,
        peer: &Hello,
        certified: Option<u64>,
    ) -> Result<(), CallError> {
        let refused = |reason: String| CallError::Refused { node: address.to_string(), reason };
        if let Some(certified) = certified.filter(|&certified| certified != peer.node_id) {
            return Err(refused(format!(
                "its hello says node {}, its certificate node {certified}",
                peer.node_id
            )));
        }
        let ours = self.cluster_id();
        if !ours.is_empty() && peer.cluster_id != ours {
            return Err(refused(format!(
                "it belongs to cluster {:?}, this broker to {ours:?}",
                peer.cluster_id
            )));
        }
        if let Dial::Node(expected) = dial
            && expected != peer.node_id
        {
            return Err(refused(format!("it is node {}, not node {expected}", peer.node_id)));
        }
        Ok(())
    }

    /// Accepts peers' connections on `listener` until the task is dropped.
    pub async fn serve(self, listener: TcpListener) {
        loop {
            match listener.accept().await {
                Ok((stream, from)) => {
                    let Ok(slot) = Arc::clone(&self.inner.inbound).try_acquire_owned() else {
                        tracing::warn!(%from, limit = INBOUND_CONNECTIONS_MAX, "too many inter-node connections: closing a new one");
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    let transport = self.clone();
                    tokio::spawn(async move {
                        if let Err(error) = transport.serve_stream(Box::new(stream)).await {
                            tracing::debug!(%from, %error, "inter-node connection ended");
                        }
                        drop(slot);
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
    pub async fn serve_stream(&self, stream: BoxStream) -> Result<(), String> {
        let wait = Duration::from_millis(CONNECT_TIMEOUT_MS);
        let opened = async {
            let (stream, certified, binding) = self.secure_inbound(stream).await?;
            let (mut read, write) = tokio::io::split(stream);
            let hello = read_hello(&mut read).await.map_err(|error| error.to_string())?;
            Ok::<_, String>((read, write, hello, certified, binding))
        };
        let (read, mut write, hello, certified, binding) = tokio::time::timeout(wait, opened)
            .await
            .map_err(|_| "no hello in time".to_string())??;
        let accepted = self.accept_caller(&hello, certified, binding);
        let (caller, version) = match accepted {
            Ok(accepted) => accepted,
            Err(reason) => {
                let _ = write.write_all(&frame::encode_refusal(&reason)).await;
                let _ = write.flush().await;
                return Err(format!("refused node {}: {reason}", hello.node_id));
            }
        };
        let own = Hello {
            versions: frame::VERSIONS,
            node_id: self.inner.node_id,
            cluster_id: self.cluster_id(),
        };
        write
            .write_all(&frame::encode_welcome_hello(version, &own))
            .await
            .map_err(|error| error.to_string())?;
        write.flush().await.map_err(|error| error.to_string())?;
        match caller {
            Caller::Member(_) => self.serve_calls(caller, read, write).await,
            Caller::Stranger { .. } => {
                let Ok(_slot) = Arc::clone(&self.inner.strangers).try_acquire_owned() else {
                    return Err("too many brokers enrolling at once".to_string());
                };
                let session = Duration::from_millis(STRANGER_SESSION_MS);
                tokio::time::timeout(session, self.serve_calls(caller, read, write))
                    .await
                    .unwrap_or_else(|_| Err("an enrolling broker's session ran out".to_string()))
            }
        }
    }

    /// The TLS session over an accepted stream (the node its certificate names, if the caller
    /// offered one, and the session's binding), or the stream itself when insecure.
    async fn secure_inbound(
        &self,
        stream: BoxStream,
    ) -> Result<(BoxStream, Option<u64>, [u8; 32]), String> {
        let tls = match &self.inner.security {
            Security::Tls(tls) => tls,
            Security::Insecure => return Ok((stream, None, [0u8; 32])),
            Security::Unenrolled => return Err("this broker is not enrolled yet".to_string()),
        };
        let (_, acceptor) = tls.current();
        let stream = acceptor.accept(stream).await.map_err(|error| format!("TLS: {error}"))?;
        let session = stream.get_ref().1;
        let offered = session.peer_certificates().is_some_and(|chain| !chain.is_empty());
        let certified = tls::peer_node_id(session.peer_certificates());
        if offered && certified.is_none() {
            return Err("the caller's certificate names no node".to_string());
        }
        let binding = exporter(|out| session.export_keying_material(out, pki::BINDING_LABEL, None))
            .map_err(|error| format!("TLS: {error}"))?;
        Ok((Box::new(stream), certified, binding))
    }

    /// Who the caller is and the protocol version both speak, or why it is refused.
    fn accept_caller(
        &self,
        hello: &Hello,
        certified: Option<u64>,
        binding: [u8; 32],
    ) -> Result<(Caller, u16), String> {
        let version =
            frame::common_version(&frame::VERSIONS, &hello.versions).map_err(|e| e.to_string())?;
        let ours = self.cluster_id();
        if ours.is_empty() {
            return Err("this broker has not joined a cluster yet".to_string());
        }
        if !hello.cluster_id.is_empty() && hello.cluster_id != ours {
            return Err(format!(
                "this broker belongs to cluster {ours}, the caller (node {}) to {}",
                hello.node_id, hello.cluster_id
            ));
        }
        let caller = match (&self.inner.security, certified) {
            (Security::Insecure | Security::Unenrolled, _) => Caller::Member(hello.node_id),
            (Security::Tls(_), Some(node_id)) if node_id == hello.node_id => {
                Caller::Member(node_id)
            }
            (Security::Tls(_), Some(node_id)) => {
                return Err(format!(
                    "the caller's hello says node {}, its certificate node {node_id}",
                    hello.node_id
                ));
            }
            (Security::Tls(_), None) => Caller::Stranger { binding },
        };
        Ok((caller, version))
    }

    /// Reads `caller`'s calls and answers them, a bounded number at a time, until the
    /// connection ends.
    async fn serve_calls(
        &self,
        caller: Caller,
        mut read: ReadHalf<BoxStream>,
        write: WriteHalf<BoxStream>,
    ) -> Result<(), String> {
        let frame_bytes_max = match caller {
            Caller::Member(_) => frame::FRAME_BYTES_MAX,
            Caller::Stranger { .. } => frame::STRANGER_FRAME_BYTES_MAX,
        };
        let (writer, queue) = mpsc::channel(WRITE_QUEUE_FRAMES);
        // Answers are never aborted: the caller's side decides when a connection is dead.
        let (_never, no_abort) = watch::channel(false);
        tokio::spawn(write_frames(write, queue, no_abort));
        let handlers = Arc::new(Semaphore::new(HANDLERS_PER_CONNECTION_MAX));
        let answer_bytes = Arc::new(Semaphore::new(ANSWER_QUEUE_BYTES_MAX));
        loop {
            let frame =
                read_frame(&mut read, frame_bytes_max).await.map_err(|error| error.to_string())?;
            let Frame::Request { id, request } = frame else {
                return Err("a peer sent an answer on a connection it opened".to_string());
            };
            let handling = Arc::clone(&handlers).acquire_owned().await.expect("never closed");
            let handler = self.inner.handler.read().expect("handler lock").clone();
            let (writer, answer_bytes) = (writer.clone(), Arc::clone(&answer_bytes));
            tokio::spawn(async move {
                let answer = match handler {
                    Some(handler) => handler.handle(caller, request).await,
                    None => Err("this broker is still starting".to_string()),
                };
                let frame = match answer {
                    Ok(payload) => Frame::Answer { id, payload },
                    Err(reason) => Frame::Failure { id, reason },
                };
                let bytes = frame::encode_frame(&frame);
                let weight = u32::try_from(bytes.len().min(ANSWER_QUEUE_BYTES_MAX))
                    .expect("the budget fits u32");
                let budget = answer_bytes.acquire_many_owned(weight).await.expect("never closed");
                drop(handling);
                let _ = writer.send(Queued { bytes, _budget: Some(budget) }).await;
            });
        }
    }
}

/// How a connection is dialled: to a known node, to any member at an address, or as a
/// stranger (no certificate offered, none checked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dial {
    Node(u64),
    AnyMember,
    Stranger,
}

/// Bytes queued for a connection's writer, holding their share of the answer budget until
/// written.
struct Queued {
    bytes: Vec<u8>,
    _budget: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Queued {
    /// A request: its caller waits for the answer, which bounds what it has in flight.
    fn unbudgeted(bytes: Vec<u8>) -> Queued {
        Queued { bytes, _budget: None }
    }
}

/// The session's exporter value, 32 bytes.
fn exporter<E>(
    export: impl FnOnce(&mut [u8; 32]) -> Result<&mut [u8; 32], E>,
) -> Result<[u8; 32], E> {
    let mut out = [0u8; 32];
    export(&mut out)?;
    Ok(out)
}

impl GroupTransport for Transport {
    fn send(&self, message: RaftMessage) -> TransportFuture {
        let transport = self.clone();
        Box::pin(async move {
            let request = Request {
                service: Service::Raft,
                group_id: message.group_id,
                kind: message.kind.code(),
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
    let (versions, node_id, id_len) = frame::decode_hello_fixed(&fixed)?;
    let mut id = vec![0u8; id_len];
    stream.read_exact(&mut id).await.map_err(|_| FrameError::Truncated("hello"))?;
    Ok(Hello { versions, node_id, cluster_id: frame::decode_text(id)? })
}

async fn read_hello_answer(
    stream: &mut (impl AsyncRead + Unpin),
    address: &str,
) -> Result<Hello, CallError> {
    let broken = |error: String| unreachable(address, error);
    let status = stream.read_u8().await.map_err(|error| broken(error.to_string()))?;
    if status == 0 {
        let version = stream.read_u16_le().await.map_err(|error| broken(error.to_string()))?;
        let hello = read_hello(stream).await.map_err(|error| broken(error.to_string()))?;
        if !frame::VERSIONS.contains(&version) || !hello.versions.contains(&version) {
            return Err(CallError::Refused {
                node: address.to_string(),
                reason: format!("it chose protocol version {version}, outside what both speak"),
            });
        }
        return Ok(hello);
    }
    let len = stream.read_u16_le().await.map_err(|error| broken(error.to_string()))?;
    let len = usize::from(len).min(frame::REASON_BYTES_MAX);
    let mut reason = vec![0u8; len];
    stream.read_exact(&mut reason).await.map_err(|error| broken(error.to_string()))?;
    Err(CallError::Refused {
        node: address.to_string(),
        reason: String::from_utf8_lossy(&reason).into_owned(),
    })
}

/// Reads one frame of at most `bytes_max`. Waits as long as it takes for a frame to start;
/// once its length is read, its body must arrive within [`FRAME_BODY_DEADLINE_MS`], and the
/// buffer grows as bytes arrive, so a declared length costs nothing until it is sent.
async fn read_frame(
    read: &mut (impl AsyncRead + Unpin),
    bytes_max: u32,
) -> Result<Frame, FrameError> {
    let mut prefix = [0u8; 4];
    read.read_exact(&mut prefix).await.map_err(|_| FrameError::Truncated("frame length"))?;
    let len = frame::frame_body_len(prefix, bytes_max)?;
    let mut body = Vec::with_capacity(len.min(64 << 10));
    let mut limited = (&mut *read).take(len as u64);
    let reading = limited.read_to_end(&mut body);
    let deadline = Duration::from_millis(FRAME_BODY_DEADLINE_MS);
    match tokio::time::timeout(deadline, reading).await {
        Ok(Ok(read)) if read == len => frame::decode_frame(body),
        Ok(_) => Err(FrameError::Truncated("frame body")),
        Err(_) => Err(FrameError::Truncated("frame body (deadline passed)")),
    }
}

/// Writes queued frames, flushing when the queue runs dry, so a burst goes out in few writes,
/// until the queue closes or `abort` is set (then what is queued is dropped with the stream).
async fn write_frames(
    write: WriteHalf<BoxStream>,
    mut queue: mpsc::Receiver<Queued>,
    mut abort: watch::Receiver<bool>,
) {
    let mut write = BufWriter::new(write);
    let writing = async move {
        while let Some(queued) = queue.recv().await {
            if write.write_all(&queued.bytes).await.is_err() {
                return;
            }
            while let Ok(queued) = queue.try_recv() {
                if write.write_all(&queued.bytes).await.is_err() {
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
    mut read: ReadHalf<BoxStream>,
    link: Arc<Link>,
    address: String,
    abort: watch::Sender<bool>,
    watch_silence: bool,
) {
    let check = Duration::from_millis(SILENT_LINK_MS / 4);
    let error = loop {
        // The read is polled to completion across checks, never dropped half-way: a frame
        // partly read when a check fires would leave the stream out of step.
        let reading = read_frame(&mut read, frame::FRAME_BYTES_MAX);
        tokio::pin!(reading);
        let frame = loop {
            tokio::select! {
                biased;
                frame = &mut reading => break frame.map_err(|error| error.to_string()),
                () = link.hang_up.notified() => break Err("closed after its call".to_string()),
                () = tokio::time::sleep(check) => {
                    if watch_silence && link.silent() {
                        tracing::debug!(%address, "no answer on the connection: aborting it");
                        break Err(format!(
                            "aborted: no answer from the peer for {SILENT_LINK_MS} ms"
                        ));
                    }
                }
            }
        };
        let frame = match frame {
            Ok(frame) => frame,
            Err(error) => break error,
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
