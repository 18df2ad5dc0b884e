//! One broker node: its Raft groups, its segment files, its cursor key, and the background work
//! (segment rolls, load-driven reshapes, retention). The log API itself is in `produce.rs`,
//! `fetch.rs`, `topics.rs` and `groups.rs`, as methods of [`Broker`].

use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex};

use malachi_consensus::{FirstBoot, GroupConfig, GroupStore, GroupTransport, NoPeers, RaftGroup};
use malachi_log::{GroupCommitConfig, Limits, SegmentConfig, Storage};
use malachi_meta::AdminCommand;

use crate::auth::{self, Entropy};
use crate::config::BrokerConfig;
use crate::coordinator::{Coordinator, CoordinatorConfig};
use crate::cursor::CursorKey;
use crate::data::{DataPlane, IoMode};
use crate::error::LogError;
use crate::machines::{AdminMachine, RootMachine};
use crate::notify::{Clock, Notifier};
use crate::vnodes::{Ring, RingOpen};

/// The administrative group's Raft group id (the vnodes' and the root's are in `vnodes.rs`).
pub const ADMIN_GROUP_ID: u64 = 0;

/// Everything a node needs from outside: configuration, disk, time, randomness.
pub struct NodeDeps {
    pub config: BrokerConfig,
    pub node_id: u64,
    pub storage: Arc<dyn Storage>,
    pub clock: Arc<dyn Clock>,
    pub entropy: Arc<dyn Entropy>,
    pub raft: GroupConfig,
    /// Where blocking storage and hashing calls run (the simulator runs them inline).
    pub io_mode: IoMode,
    /// The cursor secret; `None` loads it from (or creates it in) the data directory.
    pub cursor_secret: Option<[u8; 32]>,
    /// The node's Raft store; `None` opens `raft.redb` in the data directory. The simulator
    /// passes a store on its simulated disk, committing inline.
    pub raft_store: Option<GroupStore>,
    /// Deliberate bugs the simulator switches on to prove its checks bite; all off otherwise.
    pub canaries: Canaries,
    /// The work of new password hashes ([`auth::PasswordCost::Minimal`] only in the simulator).
    pub password_cost: auth::PasswordCost,
    /// Write the generated admin password to a 0600 file in the data directory for the local
    /// CLI (real nodes); the simulator's nodes have no real directory to write it to.
    pub write_admin_credentials: bool,
    /// The other brokers: `None` for a broker alone (its groups have one voter, itself).
    pub cluster: Option<ClusterDeps>,
}

/// What a broker of a cluster takes from outside.
pub struct ClusterDeps {
    /// The inter-node transport; the broker answers its calls once started
    /// (`crate::peer::PeerHandler`).
    pub transport: malachi_transport::Transport,
    /// The cluster's id, as recorded in the data directory.
    pub cluster_id: String,
    /// Whether a new data directory starts the cluster or waits to be added to it.
    pub first_boot: FirstBoot,
    /// The ring's size as a seed's welcome told it (a joining broker's first boot).
    pub vnodes_hint: Option<u32>,
    /// Where the cluster CA and join token are, for admitting brokers (`crate::enroll`);
    /// `None` when the inter-node port is insecure.
    pub cluster_files: Option<malachi_transport::pki::ClusterFiles>,
}

/// Deliberate bugs, each one a broken guarantee the simulator must catch. Never on outside the
/// simulator's canary runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Canaries {
    /// Segments acknowledge a flush before (without) its `fdatasync`.
    pub ack_before_fsync: bool,
    /// A split records the parent's current end without sealing it first, so appends still in
    /// flight land past the end metadata recorded.
    pub skip_split_fence: bool,
    /// Segment recovery trusts the page cache (no sync, no cache drop): after a failed sync
    /// or a process crash it serves bytes that never reached the disk.
    pub trust_page_cache: bool,
    /// New directories are created without syncing their parents, so a power loss can take a
    /// whole range directory with its synced files.
    pub skip_dir_sync: bool,
    /// Segment recovery cuts at the first bad frame even when later writes follow it.
    pub cut_damage: bool,
    /// The coordinator keeps deciding after it lost the vnode's leadership, and its commands
    /// are forwarded to whoever leads now instead of being fenced by the term they were
    /// decided in.
    pub coordinate_deposed: bool,
    /// A replicated append is acknowledged once the primary's own copy is durable, without
    /// waiting for a quorum of the replicas.
    pub ack_primary_only: bool,
    /// Failover promotes a follower instead of sealing at the highest durable end: the copy
    /// of the follower furthest behind decides where the segment ends, as an unlucky election
    /// would.
    pub promote_follower: bool,
    /// Failover seals with whatever copies answer, even fewer than `n - q + 1`.
    pub seal_without_enough_answers: bool,
    /// A replication span answered short of its end stays in flight for good and the follower
    /// is shipped nothing more (the wedge issue 25 fixed).
    pub short_answer_wedges: bool,
}

impl NodeDeps {
    /// A production node: real files, the system clock, the OS's randomness, blocking I/O on
    /// blocking threads, the cursor secret kept in the data directory.
    pub fn production(config: BrokerConfig, node_id: u64) -> NodeDeps {
        NodeDeps {
            config,
            node_id,
            storage: Arc::new(malachi_log::RealStorage),
            clock: Arc::new(crate::notify::SystemClock),
            entropy: Arc::new(auth::OsEntropy),
            raft: GroupConfig::default(),
            io_mode: IoMode::Threads,
            cursor_secret: None,
            raft_store: None,
            canaries: Canaries::default(),
            password_cost: auth::PasswordCost::Standard,
            write_admin_credentials: true,
            cluster: None,
        }
    }
}

/// What boot found or did, for the operator's first screen.
#[derive(Debug, Default)]
pub struct BootReport {
    /// A generated admin password, printed once on first boot.
    pub generated_admin_password: Option<String>,
    pub seeded_users: Vec<String>,
}

pub struct Broker {
    pub(crate) core: Arc<Core>,
    /// The Raft groups' voter seats and the vnodes' leadership.
    pub(crate) seats: crate::seats::Seats,
    /// Replication and failover of the heads this broker holds copies of.
    pub(crate) replicator: Arc<crate::replica::Replicator>,
    /// Coordinating the vnodes this broker leads, and rolls of the heads it holds.
    pub(crate) coordination: crate::coordinate::Coordination,
    /// Settling, rebuilding, moving and growing copies of sealed segments.
    pub(crate) healer: crate::heal::Healer,
    /// Users, their passwords and seeding, and retention policies.
    pub(crate) admin_service: crate::admin::Admin,
    /// Consumer groups: positions and members.
    pub(crate) groups: crate::groups::Groups,
    /// What operators see: metrics, readiness, copies, consumer lag.
    pub(crate) observer: crate::scrape::Observer,
    /// Handing work over before a stop, and which brokers are draining.
    pub(crate) handover: crate::handover::Handover,
}

/// What every service of a broker shares: its identity and configuration, its clock and
/// randomness, the ring of vnodes and the other Raft groups, the data plane, the transport to
/// other brokers and what membership knows of them, and the metrics. Its methods are the
/// plumbing the services build on: reading and proposing metadata, opening segments, calling
/// other brokers.
pub struct Core {
    pub(crate) config: BrokerConfig,
    pub(crate) node_id: u64,
    /// The vnodes, each a Raft group of topic metadata with its coordinator.
    pub(crate) ring: Ring,
    /// The root group: the ring itself.
    pub(crate) root: RaftGroup<RootMachine>,
    pub(crate) admin: RaftGroup<AdminMachine>,
    pub(crate) data: DataPlane,
    pub(crate) cursors: CursorKey,
    pub(crate) notifier: Notifier,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) entropy: Arc<dyn Entropy>,
    pub(crate) canaries: Canaries,
    /// The inter-node transport and the cluster id; `None` for a broker alone.
    pub(crate) cluster: Option<(malachi_transport::Transport, String)>,
    /// The cluster CA and token files, for enrolling brokers; `None` when insecure or alone.
    pub(crate) cluster_files: Option<malachi_transport::pki::ClusterFiles>,
    /// Every broker's membership status, as the SWIM driver (`gossip.rs`) last published it.
    pub(crate) statuses: Mutex<crate::gossip::MemberStatuses>,
    /// The broker that owns this core, for background tasks and for one service to reach
    /// another.
    pub(crate) me: std::sync::Weak<Broker>,
    /// What operators see at `/metrics`.
    pub(crate) metrics: crate::metrics::Metrics,
}

services_on_core!(Broker);

impl Core {
    /// The broker this core belongs to, for one service to call another. Every caller runs on
    /// behalf of a live broker (a request, the maintenance tick, a task holding the broker);
    /// code on a task that holds a service alone (replication's spans) uses
    /// [`Core::self_handle`], which may find the broker gone.
    pub(crate) fn broker(&self) -> Arc<Broker> {
        self.me.upgrade().expect("a service runs inside its live broker")
    }

    /// Reads the administrative state (users, grants, lockouts, brokers, policies), as applied
    /// on this broker.
    pub fn read_admin<R>(&self, read: impl FnOnce(&malachi_meta::AdminState) -> R) -> R {
        self.admin.read(|admin| read(&admin.0))
    }

    /// Proposes an administrative command (forwarded to the group's leader). A refusal is
    /// `LogError::Admin`; no answer from the group is `LogError::Unavailable`.
    pub async fn admin_command(
        &self,
        command: AdminCommand,
    ) -> Result<malachi_meta::AdminResponse, LogError> {
        self.admin.propose(command).await?.map_err(LogError::Admin)
    }

    /// What operators see at `/metrics`, for the server to count into.
    pub fn metrics(&self) -> &crate::metrics::Metrics {
        &self.metrics
    }

    /// The broker, for a background task to hold; `None` once it is stopping.
    pub(crate) fn self_handle(&self) -> Option<Arc<Broker>> {
        self.me.upgrade()
    }
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Broker").field("node_id", &self.node_id).finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("data directory {path}: {source}")]
    DataDir { path: String, source: io::Error },
    #[error("metadata store: {0}")]
    Consensus(#[from] malachi_consensus::ConsensusError),
    #[error("metadata store: {0}")]
    Store(#[from] malachi_consensus::StoreError),
    #[error("{0}")]
    Users(String),
    /// The ring of vnodes could not be learned or defined.
    #[error("the ring of vnodes: {0}")]
    Ring(String),
    /// A `MALACHI_DEFAULT_USERS` password is shorter than `MALACHI_MIN_PASSWORD_LEN`.
    #[error(
        "MALACHI_DEFAULT_USERS: the password of user {username:?} has fewer than {min_chars} \
         characters (MALACHI_MIN_PASSWORD_LEN)"
    )]
    ShortSeedPassword { username: String, min_chars: u32 },
}

impl Broker {
    /// [`Broker::start`], then [`Broker::bootstrap`]: a broker ready to serve.
    pub async fn open(deps: NodeDeps) -> Result<(Arc<Broker>, BootReport), BootError> {
        let broker = Broker::start(deps).await?;
        match broker.bootstrap().await {
            Ok(report) => Ok((broker, report)),
            Err(error) => {
                // Stop the Raft groups, which release the store, before reporting: the caller
                // may open the directory again in this process once it fixed the cause.
                broker.shutdown().await;
                Err(error)
            }
        }
    }

    /// Opens the Raft groups, the cursor key and the segment store. A broker joining a cluster
    /// answers its peers from here on, and is added to the groups by their leaders before it
    /// can [`Broker::bootstrap`].
    pub async fn start(deps: NodeDeps) -> Result<Arc<Broker>, BootError> {
        let data_dir = deps.config.data_dir.clone();
        create_data_dir(&*deps.storage, &data_dir)
            .map_err(|source| data_dir_error(&data_dir, source))?;
        let store = match deps.raft_store {
            Some(store) => store,
            None => GroupStore::open(data_dir.join("raft.redb"))?,
        };
        let (transport, first_boot): (Arc<dyn GroupTransport>, _) = match &deps.cluster {
            Some(cluster) => (Arc::new(cluster.transport.clone()), cluster.first_boot),
            None => (Arc::new(NoPeers), FirstBoot::Initialize),
        };
        let (node_id, config) = (deps.node_id, &deps.raft);
        let admin = RaftGroup::<AdminMachine>::open_with_transport(
            &store,
            ADMIN_GROUP_ID,
            node_id,
            config.clone(),
            Arc::clone(&transport),
            first_boot,
        )
        .await?;
        let coordinator =
            || Coordinator::new(coordinator_config(&deps.config), deps.canaries.coordinate_deposed);
        let ring = RingOpen {
            store: &store,
            node_id,
            raft: config,
            transport,
            first_boot,
            vnodes_hint: deps.cluster.as_ref().and_then(|cluster| cluster.vnodes_hint),
            vnodes_configured: deps.config.cluster.vnodes,
            coordinator: &coordinator,
        };
        let (root, ring) = match crate::vnodes::open_ring(&ring).await {
            Ok(opened) => opened,
            Err(error) => {
                let _ = admin.shutdown().await;
                return Err(error);
            }
        };
        let cursors = match deps.cursor_secret {
            Some(secret) => CursorKey::new(secret),
            None => load_cursor_key(&data_dir, &*deps.entropy)
                .map_err(|source| data_dir_error(&data_dir, source))?,
        };
        let segments = SegmentConfig {
            canary_ack_before_fsync: deps.canaries.ack_before_fsync,
            canary_trust_page_cache: deps.canaries.trust_page_cache,
            canary_cut_damage: deps.canaries.cut_damage,
            ..segment_config(&deps.config)
        };
        let data =
            DataPlane::with_io_mode(Arc::clone(&deps.storage), &data_dir, segments, deps.io_mode)
                .map(|data| data.with_open_segments_max(deps.config.max_open_segments as usize))
                .and_then(|data| {
                    data.with_barrier(deps.config.group_commit_barrier, deps.config.journal_bytes)
                })
                .map_err(|source| data_dir_error(&data_dir, source))?
                .with_canary_skip_dir_sync(deps.canaries.skip_dir_sync);
        let metrics = crate::metrics::Metrics::new(
            deps.config.dashboard.metrics_topics_max as usize,
            &data.commit_metrics(),
        );
        let broker = Arc::new_cyclic(|me| {
            let core = Arc::new(Core {
                me: me.clone(),
                metrics,
                config: deps.config,
                node_id: deps.node_id,
                ring,
                root,
                admin,
                data,
                cursors,
                notifier: Notifier::default(),
                clock: deps.clock,
                entropy: deps.entropy,
                canaries: deps.canaries,
                cluster_files: deps
                    .cluster
                    .as_ref()
                    .and_then(|cluster| cluster.cluster_files.clone()),
                cluster: deps.cluster.map(|cluster| (cluster.transport, cluster.cluster_id)),
                statuses: Mutex::new(Default::default()),
            });
            Broker {
                observer: crate::scrape::Observer::new(Arc::clone(&core)),
                handover: crate::handover::Handover::new(Arc::clone(&core)),
                groups: crate::groups::Groups::new(Arc::clone(&core)),
                admin_service: crate::admin::Admin::new(
                    Arc::clone(&core),
                    deps.password_cost,
                    deps.write_admin_credentials,
                ),
                seats: crate::seats::Seats::new(Arc::clone(&core)),
                replicator: Arc::new(crate::replica::Replicator::new(Arc::clone(&core))),
                healer: crate::heal::Healer::new(Arc::clone(&core)),
                coordination: crate::coordinate::Coordination::new(Arc::clone(&core)),
                core,
            }
        });
        Ok(broker)
    }

    /// Seeds the accounts the configuration asks for and makes the replicated lockout rule
    /// match it. In a cluster, a joined broker finds them seeded already.
    pub async fn bootstrap(&self) -> Result<BootReport, BootError> {
        let report = self.admin_service.bootstrap_users().await?;
        // Where this broker can (it created the cluster, or leads), each vnode claims its arc
        // now; one that cannot yet is claimed before its first topic (`create_topic`).
        if let Err(error) = self.claim_arcs().await {
            tracing::warn!(%error, "claiming the vnodes' arcs failed; retried at the first create");
        }
        if let Err(error) = self.admin_service.migrate_legacy_policies().await {
            tracing::warn!(%error, "moving older policy definitions failed; retried at the next start");
        }
        if self.cluster.is_some() {
            // Without a quorum now, the registration waits for the next start; the addresses
            // recorded before still reach this broker unless it moved.
            if let Err(error) = self.register_self().await {
                tracing::warn!(%error, "recording this broker in the cluster failed");
            }
            self.sync_addresses();
        }
        Ok(report)
    }

    pub fn node_id(&self) -> u64 {
        self.node_id
    }

    pub fn config(&self) -> &BrokerConfig {
        &self.config
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    pub fn entropy(&self) -> &Arc<dyn Entropy> {
        &self.entropy
    }

    /// The administrative group, for tests and the simulator's checks; the server reads and
    /// writes through [`Broker::read_admin`] and [`Broker::admin_command`].
    pub fn admin_group(&self) -> &RaftGroup<AdminMachine> {
        &self.admin
    }

    /// The administrative service: users' passwords and retention policies.
    pub fn admin(&self) -> &crate::admin::Admin {
        &self.admin_service
    }

    /// The consumer groups service.
    pub fn groups(&self) -> &crate::groups::Groups {
        &self.groups
    }

    /// The observing service: metrics, readiness, copies, consumer lag.
    pub fn observer(&self) -> &crate::scrape::Observer {
        &self.observer
    }

    /// The seats service: the operator's decommission of a broker.
    pub fn seats(&self) -> &crate::seats::Seats {
        &self.seats
    }

    /// The coordination service, for tests that drive it a tick at a time.
    pub fn coordination(&self) -> &crate::coordinate::Coordination {
        &self.coordination
    }

    /// The replication service, for the simulator's checks.
    pub fn handover(&self) -> &crate::handover::Handover {
        &self.handover
    }

    pub fn replicator(&self) -> &crate::replica::Replicator {
        &self.replicator
    }

    pub fn data_plane(&self) -> &DataPlane {
        &self.data
    }

    /// Stops the Raft groups; segment files are closed as the last handles drop.
    pub async fn shutdown(&self) {
        self.ring.shutdown().await;
        let _ = self.root.shutdown().await;
        let _ = self.admin.shutdown().await;
    }
}

/// What the coordinator takes from the configuration.
pub fn coordinator_config(config: &BrokerConfig) -> CoordinatorConfig {
    CoordinatorConfig {
        load: config.load,
        retention_interval_ms: config.retention_interval_ms,
        retention: retention_defaults(config),
    }
}

/// The cluster-wide retention a topic without a policy is held to.
pub fn retention_defaults(config: &BrokerConfig) -> malachi_meta::RetentionDefaults {
    malachi_meta::RetentionDefaults {
        max_age_ms: config.retention_max_age_ms,
        max_bytes: config.retention_max_bytes,
        unresolved_policy_max_age_ms: config.retention_unresolved_policy_max_age_ms,
    }
}

pub fn segment_config(config: &BrokerConfig) -> SegmentConfig {
    SegmentConfig {
        limits: Limits::default(),
        group_commit: GroupCommitConfig {
            batch_records_max: config.group_commit_max_records,
            batch_bytes_max: config.group_commit_max_bytes,
            linger_us: config.group_commit_linger_us,
        },
        ..SegmentConfig::default()
    }
}

/// The cursor secret: 32 random bytes created on first boot, kept 0600 in the data directory, so
/// cursors survive restarts and cannot be forged.
fn load_cursor_key(data_dir: &Path, entropy: &dyn Entropy) -> io::Result<CursorKey> {
    let path = data_dir.join("cursor.secret");
    match std::fs::read(&path) {
        Ok(bytes) => {
            let secret: [u8; 32] = bytes.try_into().map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} is not 32 bytes", path.display()),
                )
            })?;
            Ok(CursorKey::new(secret))
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            let mut secret = [0u8; 32];
            entropy.fill(&mut secret);
            write_cursor_secret(data_dir, secret)?;
            Ok(CursorKey::new(secret))
        }
        Err(error) => Err(error),
    }
}

/// Records the cursor secret in the data directory (0600, synced, renamed into place): a new
/// one at first boot, or the cluster's, which a joining broker receives from its seed.
pub fn write_cursor_secret(data_dir: &Path, secret: [u8; 32]) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let temp = data_dir.join("cursor.secret.tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temp)?;
    file.write_all(&secret)?;
    file.sync_all()?;
    std::fs::rename(&temp, data_dir.join("cursor.secret"))?;
    std::fs::File::open(data_dir)?.sync_all()
}

/// Creates the data directory durably: every missing level below the nearest existing
/// ancestor, each made durable in its parent, and each private to the broker's user. A data
/// directory that already exists with a looser mode (from an older version, or made by hand) is
/// made private too, and the log says so: it holds password hashes and the cursor secret.
pub fn create_data_dir(storage: &dyn Storage, data_dir: &Path) -> io::Result<()> {
    let mut existing = data_dir;
    while !existing.as_os_str().is_empty() && !storage.exists(existing)? {
        existing = existing.parent().unwrap_or(Path::new(""));
    }
    malachi_log::create_dir_durable(storage, existing, data_dir)?;
    if let Some(before) = storage.restrict_dir(data_dir)? {
        tracing::warn!(
            path = %data_dir.display(),
            "data directory had mode {before:o}, allowing other users in; changed it to {:o}",
            malachi_log::DIR_MODE
        );
    }
    Ok(())
}

pub(crate) fn data_dir_error(path: &Path, source: io::Error) -> BootError {
    BootError::DataDir { path: path.display().to_string(), source }
}

#[cfg(test)]
mod tests;
