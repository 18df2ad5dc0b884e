//! The simulated network between clients and nodes, and between nodes (their inter-node ports):
//! byte pipes whose chunks arrive after a seeded delay, in order within a connection (as TCP),
//! in any order across connections.
//!
//! A connection is two pipes. A writer never blocks: its chunk is queued for delivery at
//! `now + delay` (never before the pipe's previous chunk), and [`SimNet::deliver`], called by
//! the world once per tick, moves due chunks into the reader's buffer and wakes it. Faults: a
//! write may sever its connection (both directions fail, queued chunks are lost, as a reset),
//! and a crashed node's connections are all severed. A partition holds chunks back (TCP
//! retransmits what a partition drops, so bytes arrive late, or their reader gives up): between
//! the clients and every node, or from one node to another, one way or both. Nothing here reads
//! a clock or a thread RNG; time is the tick the world hands to `deliver`.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes, BytesMut};
use malachi_log::rng::SeededRng;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc::UnboundedSender;

/// The network's fault rates for one run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetFaults {
    /// Each chunk waits up to this many milliseconds (uniform) before it is delivered.
    pub delay_max_ms: u64,
    /// Chance per 100,000 writes that a write resets its connection instead.
    pub reset_per_100k: u64,
}

/// A connection a node accepted: its two directions and the client's address.
pub struct Accepted {
    pub reader: PipeReader,
    pub writer: PipeWriter,
    pub peer: SocketAddr,
}

/// The network. Cloning shares it.
#[derive(Clone)]
pub struct SimNet {
    state: Arc<Mutex<NetState>>,
}

struct NetState {
    rng: SeededRng,
    faults: NetFaults,
    now_ms: u64,
    next_pipe: u64,
    next_seq: u64,
    pipes: BTreeMap<u64, Pipe>,
    /// `(deliver_at_ms, seq)` to `(pipe, chunk)`: the seq keeps equal times in send order.
    in_flight: BTreeMap<(u64, u64), (u64, Chunk)>,
    listeners: BTreeMap<(u64, Port), UnboundedSender<Accepted>>,
    resets: u64,
    /// `(from, to)` node pairs whose chunks are held: a partition between nodes, one way.
    cuts: BTreeSet<(u64, u64)>,
    /// A partition between the clients and the nodes: nothing is delivered before this time
    /// (TCP retransmits what a partition drops, so the bytes arrive late, or the client gives up).
    partitioned_until_ms: u64,
}

/// Which of a node's ports a connection reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Port {
    Client,
    Cluster,
}

/// One end of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Client,
    Node(u64),
}

enum Chunk {
    Data(Bytes),
    Fin,
}

struct Pipe {
    /// Who writes into the pipe, and who reads it.
    from: End,
    to: End,
    /// The pipe of the other direction of the same connection.
    partner: u64,
    buffer: BytesMut,
    fin: bool,
    reset: bool,
    reader_gone: bool,
    reader: Option<Waker>,
    last_deliver_at_ms: u64,
}

impl SimNet {
    pub fn new(seed: u64) -> SimNet {
        let state = NetState {
            rng: SeededRng::new(seed),
            faults: NetFaults::default(),
            now_ms: 0,
            next_pipe: 0,
            next_seq: 0,
            pipes: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            listeners: BTreeMap::new(),
            resets: 0,
            cuts: BTreeSet::new(),
            partitioned_until_ms: 0,
        };
        SimNet { state: Arc::new(Mutex::new(state)) }
    }

    fn lock(&self) -> MutexGuard<'_, NetState> {
        self.state.lock().expect("network lock poisoned")
    }

    pub fn set_faults(&self, faults: NetFaults) {
        self.lock().faults = faults;
    }

    /// Delivers nothing before `until_ms` (0 heals a partition at once).
    pub fn partition_until(&self, until_ms: u64) {
        self.lock().partitioned_until_ms = until_ms;
    }

    /// Connections reset so far (by faults or by node crashes).
    pub fn resets(&self) -> u64 {
        self.lock().resets
    }

    /// Node `node_id` accepts client connections on `listener` from now on.
    pub fn listen(&self, node_id: u64, listener: UnboundedSender<Accepted>) {
        self.listen_on(node_id, Port::Client, listener);
    }

    /// Node `node_id` accepts connections to `port` on `listener` from now on.
    pub fn listen_on(&self, node_id: u64, port: Port, listener: UnboundedSender<Accepted>) {
        self.lock().listeners.insert((node_id, port), listener);
    }

    /// Holds every chunk from node `from` to node `to` until [`SimNet::heal_cuts`].
    pub fn cut(&self, from: u64, to: u64) {
        self.lock().cuts.insert((from, to));
    }

    /// Lifts every partition between nodes: what they held is delivered.
    pub fn heal_cuts(&self) {
        self.lock().cuts.clear();
    }

    /// Node `node_id` died: it accepts nothing, and every connection to or from it is reset.
    pub fn fail_node(&self, node_id: u64) {
        let mut state = self.lock();
        state.listeners.retain(|(node, _), _| *node != node_id);
        let pipes: Vec<u64> = state
            .pipes
            .iter()
            .filter(|(_, pipe)| pipe.touches(node_id) && !pipe.reset)
            .map(|(&id, _)| id)
            .collect();
        for pipe in pipes {
            state.reset(pipe);
        }
    }

    /// Opens a connection from client `client_id` to node `node_id`; the node's accept loop
    /// gets the other end. Refused when the node is down.
    pub fn connect(&self, client_id: u64, node_id: u64) -> io::Result<(PipeReader, PipeWriter)> {
        self.open(End::Client, node_id, Port::Client, client_address(client_id))
    }

    /// Opens a connection from node `from` to node `to`'s inter-node port.
    pub fn connect_nodes(&self, from: u64, to: u64) -> io::Result<(PipeReader, PipeWriter)> {
        let peer = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 1, 0, from as u8)), 4042);
        self.open(End::Node(from), to, Port::Cluster, peer)
    }

    fn open(
        &self,
        from: End,
        node_id: u64,
        port: Port,
        peer: SocketAddr,
    ) -> io::Result<(PipeReader, PipeWriter)> {
        let mut state = self.lock();
        let Some(listener) = state.listeners.get(&(node_id, port)).cloned() else {
            return Err(io::Error::from(io::ErrorKind::ConnectionRefused));
        };
        let to_server = state.next_pipe;
        let to_client = to_server + 1;
        state.next_pipe += 2;
        let server = End::Node(node_id);
        state.pipes.insert(to_server, Pipe::new(from, server, to_client));
        state.pipes.insert(to_client, Pipe::new(server, from, to_server));
        drop(state);
        let accepted = Accepted {
            reader: PipeReader { net: self.clone(), pipe: to_server },
            writer: PipeWriter { net: self.clone(), pipe: to_client },
            peer,
        };
        if listener.send(accepted).is_err() {
            return Err(io::Error::from(io::ErrorKind::ConnectionRefused));
        }
        Ok((
            PipeReader { net: self.clone(), pipe: to_client },
            PipeWriter { net: self.clone(), pipe: to_server },
        ))
    }

    /// Delivers every chunk due by `now_ms` and wakes the readers that got something.
    pub fn deliver(&self, now_ms: u64) {
        let mut wakers = Vec::new();
        {
            let mut state = self.lock();
            state.now_ms = now_ms;
            let clients_cut = now_ms < state.partitioned_until_ms;
            let due: Vec<(u64, u64)> =
                state.in_flight.range(..(now_ms + 1, 0)).map(|(key, _)| *key).collect();
            for key in due {
                let pipe_id = state.in_flight[&key].0;
                let held = state.pipes.get(&pipe_id).is_some_and(|pipe| {
                    let touches_client = pipe.from == End::Client || pipe.to == End::Client;
                    let cut = match (pipe.from, pipe.to) {
                        (End::Node(from), End::Node(to)) => state.cuts.contains(&(from, to)),
                        _ => false,
                    };
                    (clients_cut && touches_client) || cut
                });
                if held {
                    // Later chunks of the same pipe are held behind it: they keep their order.
                    continue;
                }
                let (pipe_id, chunk) = state.in_flight.remove(&key).expect("a due chunk");
                let Some(pipe) = state.pipes.get_mut(&pipe_id) else { continue };
                if pipe.reset {
                    continue;
                }
                match chunk {
                    Chunk::Data(bytes) => pipe.buffer.extend_from_slice(&bytes),
                    Chunk::Fin => pipe.fin = true,
                }
                wakers.extend(pipe.reader.take());
            }
        }
        // Woken outside the lock: a waker of another runtime only queues its task.
        for waker in wakers {
            waker.wake();
        }
    }
}

/// Clients get distinct addresses, so per-address limits see distinct peers.
fn client_address(client_id: u64) -> SocketAddr {
    let host = (client_id % 250) as u8 + 1;
    let port = 40_000 + (client_id % 20_000) as u16;
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, (client_id / 250 % 250) as u8, host)), port)
}

impl Pipe {
    fn new(from: End, to: End, partner: u64) -> Pipe {
        Pipe {
            from,
            to,
            partner,
            buffer: BytesMut::new(),
            fin: false,
            reset: false,
            reader_gone: false,
            reader: None,
            last_deliver_at_ms: 0,
        }
    }
}

impl Pipe {
    fn touches(&self, node_id: u64) -> bool {
        self.from == End::Node(node_id) || self.to == End::Node(node_id)
    }
}

impl NetState {
    /// Resets the connection `pipe` belongs to: both directions fail at once.
    fn reset(&mut self, pipe: u64) {
        let Some(partner) = self.pipes.get(&pipe).map(|pipe| pipe.partner) else { return };
        self.resets += 1;
        let mut wakers = Vec::new();
        for id in [pipe, partner] {
            if let Some(pipe) = self.pipes.get_mut(&id) {
                pipe.reset = true;
                pipe.buffer.clear();
                wakers.extend(pipe.reader.take());
            }
        }
        for waker in wakers {
            waker.wake();
        }
    }

    fn send(&mut self, pipe_id: u64, chunk: Chunk) -> io::Result<()> {
        let faults = self.faults;
        let pipe = self.pipes.get(&pipe_id).expect("a writer's pipe exists");
        if pipe.reset || pipe.reader_gone {
            return Err(io::Error::from(io::ErrorKind::ConnectionReset));
        }
        if faults.reset_per_100k > 0 && self.rng.chance(faults.reset_per_100k, 100_000) {
            self.reset(pipe_id);
            return Err(io::Error::from(io::ErrorKind::ConnectionReset));
        }
        let delay_ms =
            if faults.delay_max_ms > 0 { self.rng.below(faults.delay_max_ms + 1) } else { 0 };
        let now_ms = self.now_ms;
        let pipe = self.pipes.get_mut(&pipe_id).expect("a writer's pipe exists");
        let deliver_at_ms = (now_ms + delay_ms).max(pipe.last_deliver_at_ms);
        pipe.last_deliver_at_ms = deliver_at_ms;
        let seq = self.next_seq;
        self.next_seq += 1;
        self.in_flight.insert((deliver_at_ms, seq), (pipe_id, chunk));
        Ok(())
    }
}

/// The reading end of one direction of a connection.
pub struct PipeReader {
    net: SimNet,
    pipe: u64,
}

/// The writing end of one direction of a connection.
pub struct PipeWriter {
    net: SimNet,
    pipe: u64,
}

impl AsyncRead for PipeReader {
    fn poll_read(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let mut state = self.net.lock();
        let pipe = state.pipes.get_mut(&self.pipe).expect("a reader's pipe exists");
        if pipe.reset {
            return Poll::Ready(Err(io::Error::from(io::ErrorKind::ConnectionReset)));
        }
        if !pipe.buffer.is_empty() {
            let count = pipe.buffer.len().min(out.remaining());
            out.put_slice(&pipe.buffer[..count]);
            pipe.buffer.advance(count);
            return Poll::Ready(Ok(()));
        }
        if pipe.fin {
            return Poll::Ready(Ok(()));
        }
        pipe.reader = Some(context.waker().clone());
        Poll::Pending
    }
}

impl AsyncWrite for PipeWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        _context: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut state = self.net.lock();
        Poll::Ready(
            state.send(self.pipe, Chunk::Data(Bytes::copy_from_slice(bytes))).map(|()| bytes.len()),
        )
    }

    fn poll_flush(self: Pin<&mut Self>, _context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _context: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut state = self.net.lock();
        let pipe = state.pipes.get_mut(&self.pipe).expect("a writer's pipe exists");
        if pipe.fin || pipe.reset {
            return Poll::Ready(Ok(()));
        }
        Poll::Ready(state.send(self.pipe, Chunk::Fin).or(Ok(())))
    }
}

impl Drop for PipeWriter {
    /// Closing a socket sends its FIN after the data already written.
    fn drop(&mut self) {
        let mut state = self.net.lock();
        let _ = state.send(self.pipe, Chunk::Fin);
    }
}

impl Drop for PipeReader {
    /// Writes to a closed socket fail.
    fn drop(&mut self) {
        if let Some(pipe) = self.net.lock().pipes.get_mut(&self.pipe) {
            pipe.reader_gone = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::mpsc;

    use super::*;

    #[tokio::test]
    async fn bytes_arrive_in_order_after_their_delay_and_resets_fail_both_ends() {
        let net = SimNet::new(3);
        net.set_faults(NetFaults { delay_max_ms: 5, reset_per_100k: 0 });
        let (listener, mut accepted) = mpsc::unbounded_channel();
        net.listen(1, listener);
        let (mut client_read, mut client_write) = net.connect(7, 1).unwrap();
        let mut server = accepted.recv().await.unwrap();
        for chunk in [b"ab".as_slice(), b"cd", b"ef"] {
            client_write.write_all(chunk).await.unwrap();
        }
        net.deliver(2);
        let mut early = [0u8; 6];
        // Nothing due yet may have arrived, but what arrived is a prefix.
        net.deliver(10);
        server.reader.read_exact(&mut early).await.unwrap();
        assert_eq!(&early, b"abcdef");
        net.partition_until(20);
        server.writer.write_all(b"late").await.unwrap();
        net.deliver(19);
        let mut late = [0u8; 4];
        let early = tokio::time::timeout(
            std::time::Duration::from_millis(1),
            client_read.read_exact(&mut late),
        );
        assert!(early.await.is_err(), "nothing crosses a partition");
        net.deliver(20);
        client_read.read_exact(&mut late).await.unwrap();
        assert_eq!(&late, b"late", "and it arrives once healed");
        net.fail_node(1);
        assert!(client_read.read_u8().await.is_err(), "a reset reaches the client");
        assert!(server.writer.write_all(b"x").await.is_err(), "and the node");
        assert!(net.connect(7, 1).is_err(), "a dead node refuses connections");
    }
}
