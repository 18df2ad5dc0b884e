//! One simulated broker node: the real `Broker` and client-protocol server on their own paused
//! tokio runtime, their segments and Raft store on a [`SimStorage`], their connections on the
//! [`SimNet`]. A crash drops the runtime (every task of the node ends where it stood) after the
//! disk went down, so nothing the node does afterwards reaches the disk.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use malachi_broker::auth::{Entropy, PasswordCost};
use malachi_broker::config::BrokerConfig;
use malachi_broker::data::IoMode;
use malachi_broker::node::{Broker, Canaries, NodeDeps};
use malachi_broker::notify::Clock;
use malachi_consensus::{GroupConfig, GroupStore, StorageFileBackend, WriterMode};
use malachi_log::rng::SeededRng;
use malachi_log::{OpenMode, SimStorage, Storage};
use malachi_server::ServerShared;
use tokio::runtime::Runtime;

use crate::net::SimNet;

/// The simulated wall clock: the world sets it every tick (and jumps it).
#[derive(Debug, Default)]
pub struct SimClock {
    now_ms: AtomicU64,
}

impl SimClock {
    pub fn set(&self, now_ms: u64) {
        self.now_ms.store(now_ms, Ordering::SeqCst);
    }
}

impl Clock for SimClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }
}

/// Seeded bytes for salts, passwords and tokens.
pub struct SeededEntropy {
    rng: Mutex<SeededRng>,
}

impl SeededEntropy {
    pub fn new(seed: u64) -> SeededEntropy {
        SeededEntropy { rng: Mutex::new(SeededRng::new(seed)) }
    }
}

impl Entropy for SeededEntropy {
    fn fill(&self, bytes: &mut [u8]) {
        let mut rng = self.rng.lock().expect("entropy lock poisoned");
        for chunk in bytes.chunks_mut(8) {
            let word = rng.next_u64().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
    }
}

/// A paused, single-threaded runtime: its clock moves only while the world runs it.
pub fn paused_runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime builds")
}

/// Mixes a run's seed with a purpose, so each consumer of randomness has its own stream.
pub fn derive_seed(seed: u64, purpose: u64) -> u64 {
    let mut rng = SeededRng::new(seed ^ purpose.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    rng.next_u64()
}

/// How a node of a simulated cluster finds the others.
#[derive(Clone, Debug)]
pub struct Membership {
    /// The node that starts the cluster; the others join through it.
    pub first: u64,
}

/// The cluster id every simulated cluster carries.
pub const SIM_CLUSTER_ID: &str = "5151515151515151515151515151515a";

/// The inter-node address of node `node_id` in the simulated network.
pub fn cluster_address(node_id: u64) -> String {
    format!("node-{node_id}:4042")
}

/// Dials other nodes' inter-node ports over the simulated network.
struct SimDialer {
    net: SimNet,
    from: u64,
}

impl malachi_transport::Dialer for SimDialer {
    fn dial(&self, address: &str) -> malachi_transport::DialFuture {
        let target = address
            .strip_prefix("node-")
            .and_then(|rest| rest.strip_suffix(":4042"))
            .and_then(|id| id.parse::<u64>().ok());
        let connected = match target {
            Some(to) => self.net.connect_nodes(self.from, to),
            None => Err(std::io::Error::from(std::io::ErrorKind::AddrNotAvailable)),
        };
        Box::pin(async move {
            let (read, write) = connected?;
            Ok(Box::new(tokio::io::join(read, write)) as malachi_transport::BoxStream)
        })
    }
}

pub struct SimNode {
    pub node_id: u64,
    /// `Some` for a node of a cluster.
    pub membership: Option<Membership>,
    pub storage: SimStorage,
    pub data_dir: PathBuf,
    config: BrokerConfig,
    seed: u64,
    canaries: Canaries,
    /// Boots so far, the first included.
    pub incarnation: u64,
    running: Option<Running>,
}

struct Running {
    // Field order is drop order: the broker handle goes before the runtime that owns its tasks.
    /// `None` while a cluster node boots (its peers must run for it to finish).
    broker: Option<Arc<Broker>>,
    booting: Option<tokio::task::JoinHandle<Result<Arc<Broker>, String>>>,
    store: GroupStore,
    runtime: Runtime,
}

impl SimNode {
    pub fn new(
        node_id: u64,
        seed: u64,
        config: BrokerConfig,
        canaries: Canaries,
        storage: SimStorage,
    ) -> SimNode {
        let data_dir = config.data_dir.clone();
        SimNode {
            node_id,
            membership: None,
            storage,
            data_dir,
            config,
            seed,
            canaries,
            incarnation: 0,
            running: None,
        }
    }

    pub fn is_up(&self) -> bool {
        self.running.is_some()
    }

    /// The node's broker once it booted.
    pub fn broker(&self) -> Option<Arc<Broker>> {
        self.running.as_ref().and_then(|running| running.broker.clone())
    }

    /// Whether the node is up and its boot finished.
    pub fn is_serving(&self) -> bool {
        self.broker().is_some()
    }

    /// Whether the node's group commit failed a sync (it refuses writes until a restart).
    pub fn commit_failed(&self) -> bool {
        self.broker().is_some_and(|broker| broker.data_plane().commit_failed())
    }

    /// Why the node's Raft store refuses writes, if it does: a real node stops there (fail-stop),
    /// so the world crashes and restarts it.
    pub fn store_poisoned(&self) -> Option<String> {
        self.running.as_ref().and_then(|running| running.store.poisoned())
    }

    /// Boots the node on its disk as it is now. An error is a finding: a node that cannot come
    /// back after a crash. A node of a cluster boots in the background (it needs its peers,
    /// which run only as the world steps them): [`SimNode::step`] finishes it.
    pub fn boot(&mut self, clock: Arc<SimClock>, net: &SimNet) -> Result<(), String> {
        assert!(self.running.is_none(), "boot of a running node");
        self.incarnation += 1;
        let runtime = paused_runtime();
        malachi_consensus::seed_raft_rng(derive_seed(self.seed, 1000 + self.incarnation));
        let store = open_raft_store(&self.storage, &self.data_dir)?;
        let mut deps = NodeDeps {
            config: self.config.clone(),
            node_id: self.node_id,
            storage: Arc::new(self.storage.clone()),
            clock,
            entropy: Arc::new(SeededEntropy::new(derive_seed(self.seed, 2000 + self.incarnation))),
            raft: GroupConfig::default(),
            io_mode: IoMode::Inline,
            cursor_secret: Some(cursor_secret(self.seed)),
            cluster: None,
            raft_store: Some(store.clone()),
            canaries: self.canaries,
            password_cost: PasswordCost::Minimal,
            write_admin_credentials: false,
        };
        let Some(membership) = self.membership.clone() else {
            let (broker, _) = runtime
                .block_on(async {
                    tokio::time::timeout(Duration::from_secs(60), Broker::open(deps)).await
                })
                .map_err(|_| "the node did not open within 60 s".to_string())?
                .map_err(|error| format!("the node did not open: {error}"))?;
            self.running = Some(Running { broker: None, booting: None, store, runtime });
            self.serve(broker, net);
            return Ok(());
        };
        let dialer = Arc::new(SimDialer { net: net.clone(), from: self.node_id });
        // The simulator replaces the cryptography, not the checks made of a caller: a node is
        // who its hello says, and every handler still checks that node against metadata.
        let transport = malachi_transport::Transport::with_dialer(
            self.node_id,
            SIM_CLUSTER_ID,
            dialer,
            malachi_transport::Security::Insecure,
        );
        let first = membership.first == self.node_id;
        deps.cluster = Some(malachi_broker::node::ClusterDeps {
            transport: transport.clone(),
            cluster_id: SIM_CLUSTER_ID.to_string(),
            first_boot: if first {
                malachi_consensus::FirstBoot::Initialize
            } else {
                malachi_consensus::FirstBoot::AwaitLeader
            },
            // What a seed's welcome would tell a joining broker.
            vnodes_hint: (!first).then_some(self.config.cluster.vnodes),
            cluster_files: None,
        });
        let (listener, mut accepted) = tokio::sync::mpsc::unbounded_channel();
        net.listen_on(self.node_id, crate::net::Port::Cluster, listener);
        let serving = transport.clone();
        runtime.spawn(async move {
            while let Some(connection) = accepted.recv().await {
                let transport = serving.clone();
                tokio::spawn(async move {
                    let stream = tokio::io::join(connection.reader, connection.writer);
                    let _ = transport.serve_stream(Box::new(stream)).await;
                });
            }
        });
        let seeds = if first { Vec::new() } else { vec![cluster_address(membership.first)] };
        let booting = runtime.spawn(boot_member(deps, transport, seeds));
        self.running = Some(Running { broker: None, booting: Some(booting), store, runtime });
        Ok(())
    }

    /// Starts serving clients and the background work of a booted broker.
    fn serve(&mut self, broker: Arc<Broker>, net: &SimNet) {
        let running = self.running.as_mut().expect("serving a running node");
        let (listener, mut accepted) = tokio::sync::mpsc::unbounded_channel();
        net.listen(self.node_id, listener);
        let shared = ServerShared::for_broker(&broker).expect("the simulator runs without TLS");
        let serving = Arc::clone(&broker);
        running.runtime.spawn(async move {
            while let Some(connection) = accepted.recv().await {
                tokio::spawn(malachi_server::serve_halves(
                    Box::new(connection.reader),
                    Box::new(connection.writer),
                    connection.peer,
                    Arc::clone(&serving),
                    Arc::clone(&shared),
                ));
            }
        });
        {
            let _inside = running.runtime.enter();
            broker.spawn_maintenance();
        }
        running.broker = Some(broker);
    }

    /// Power loss: the disk stops taking writes first, then every task of the node ends.
    pub fn crash(&mut self, net: &SimNet) {
        self.storage.crash_now();
        net.fail_node(self.node_id);
        drop(self.running.take());
    }

    /// Runs the node's runtime for `tick` of its time; a cluster node's boot that finished
    /// starts serving. A boot that failed is the error (the node is then down).
    pub fn step(&mut self, tick: Duration, net: &SimNet) -> Result<(), String> {
        let Some(running) = &mut self.running else { return Ok(()) };
        running.runtime.block_on(async { tokio::time::sleep(tick).await });
        if !running.booting.as_ref().is_some_and(|booting| booting.is_finished()) {
            return Ok(());
        }
        let booting = running.booting.take().expect("a finished boot");
        match running.runtime.block_on(booting) {
            Ok(Ok(broker)) => {
                self.serve(broker, net);
                Ok(())
            }
            Ok(Err(error)) => {
                self.crash(net);
                Err(error)
            }
            Err(panicked) => {
                self.crash(net);
                Err(format!("the boot panicked: {panicked}"))
            }
        }
    }

    /// Spawns `future` on the node's runtime (it runs as the world steps the node): the final
    /// drain, which reads through the log API. `None` when the node is down.
    pub fn spawn<F>(&self, future: F) -> Option<tokio::task::JoinHandle<F::Output>>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.running.as_ref().map(|running| running.runtime.spawn(future))
    }
}

/// A cluster node's boot, as `malachi serve` does it: start, answer peers, join through the
/// seed if this node was never added to the groups, then bootstrap.
async fn boot_member(
    deps: NodeDeps,
    transport: malachi_transport::Transport,
    seeds: Vec<String>,
) -> Result<Arc<Broker>, String> {
    let broker = Broker::start(deps).await.map_err(|error| format!("start: {error}"))?;
    transport.set_handler(malachi_broker::peer::peer_handler(&broker));
    broker.sync_addresses();
    if !seeds.is_empty()
        && !broker.joined()
        && let Err(error) = broker.join(&seeds).await
    {
        broker.shutdown().await;
        return Err(format!("join: {error}"));
    }
    match broker.bootstrap().await {
        Ok(_) => Ok(broker),
        Err(error) => {
            broker.shutdown().await;
            Err(format!("bootstrap: {error}"))
        }
    }
}

fn open_raft_store(storage: &SimStorage, data_dir: &Path) -> Result<GroupStore, String> {
    let path = data_dir.join("raft.redb");
    malachi_log::create_dir_durable(storage, Path::new("/"), data_dir)
        .map_err(|error| format!("data dir: {error}"))?;
    let backend = match storage.exists(&path) {
        Ok(true) => {
            storage.open(&path, OpenMode::Existing).and_then(StorageFileBackend::after_restart)
        }
        Ok(false) => storage.open(&path, OpenMode::CreateNew).and_then(|file| {
            storage.sync_dir(data_dir)?;
            Ok(StorageFileBackend::new(file))
        }),
        Err(error) => Err(error),
    }
    .map_err(|error| format!("raft store file: {error}"))?;
    GroupStore::open_with_backend(backend, WriterMode::Inline)
        .map_err(|error| format!("raft store: {error}"))
}

fn cursor_secret(seed: u64) -> [u8; 32] {
    let mut secret = [0u8; 32];
    SeededEntropy::new(derive_seed(seed, 3)).fill(&mut secret);
    secret
}
