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

pub struct SimNode {
    pub node_id: u64,
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
    broker: Arc<Broker>,
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

    pub fn broker(&self) -> Option<Arc<Broker>> {
        self.running.as_ref().map(|running| Arc::clone(&running.broker))
    }

    /// Why the node's Raft store refuses writes, if it does: a real node stops there (fail-stop),
    /// so the world crashes and restarts it.
    pub fn store_poisoned(&self) -> Option<String> {
        self.running.as_ref().and_then(|running| running.store.poisoned())
    }

    /// Boots the node on its disk as it is now. An error is a finding: a node that cannot come
    /// back after a crash.
    pub fn boot(&mut self, clock: Arc<SimClock>, net: &SimNet) -> Result<(), String> {
        assert!(self.running.is_none(), "boot of a running node");
        self.incarnation += 1;
        let runtime = paused_runtime();
        malachi_consensus::seed_raft_rng(derive_seed(self.seed, 1000 + self.incarnation));
        let store = open_raft_store(&self.storage, &self.data_dir)?;
        let deps = NodeDeps {
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
        let (broker, _) = runtime
            .block_on(async {
                tokio::time::timeout(Duration::from_secs(60), Broker::open(deps)).await
            })
            .map_err(|_| "the node did not open within 60 s".to_string())?
            .map_err(|error| format!("the node did not open: {error}"))?;
        let (listener, mut accepted) = tokio::sync::mpsc::unbounded_channel();
        net.listen(self.node_id, listener);
        let shared = ServerShared::for_broker(&broker).expect("the simulator runs without TLS");
        let serving = Arc::clone(&broker);
        runtime.spawn(async move {
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
            let _inside = runtime.enter();
            broker.spawn_maintenance();
        }
        self.running = Some(Running { broker, store, runtime });
        Ok(())
    }

    /// Power loss: the disk stops taking writes first, then every task of the node ends.
    pub fn crash(&mut self, net: &SimNet) {
        self.storage.crash_now();
        net.fail_node(self.node_id);
        drop(self.running.take());
    }

    /// Runs the node's runtime for `tick` of its time.
    pub fn step(&self, tick: Duration) {
        if let Some(running) = &self.running {
            running.runtime.block_on(async { tokio::time::sleep(tick).await });
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
