//! One simulated run of a cluster: 3 to 5 real brokers (each its own paused runtime, disk and
//! Raft store) talking through the real inter-node transport over the simulated network, the
//! same seeded workload of clients spread over the brokers, and the cluster's faults: crashes
//! and restarts of any broker (power loss or process), partitions between brokers (one broker
//! cut off, one way or both, or the cluster split in two), and message delay and connection
//! resets between them. Then every fault heals, every broker is up, and the history is checked
//! as for one node; the metadata's coordinator fence adds a finding of its own (a coordinator
//! command of an old term that reached the log after a newer one's).
//!
//! Same seed, same trace hash: every broker's runtime, every random stream and the network are
//! driven from the one seed, one millisecond per tick, brokers stepped in order.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use malachi_broker::data::SegmentKey;
use malachi_broker::node::Canaries;
use malachi_check::{Drain, EventKind, History, Op, Produce, WrittenRecord};
use malachi_log::rng::SeededRng;
use malachi_log::{SimFaults, SimStorage};
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

use crate::net::{NetFaults, SimNet};
use crate::node::{Membership, SimClock, SimNode, cluster_address, derive_seed, paused_runtime};
use crate::workload::{self, Ctx, EVENTS, ORDERS, ProducerMode};
use crate::world::{EPOCH_MS, RunOutcome, RunStats, reason_name, trace_hash};

const TICK: Duration = Duration::from_millis(1);
/// Ticks the heal phase (and each final step) may take before the run is declared stuck.
const HEAL_TICKS_MAX: u64 = 120_000;
/// The final produce and drains are tried this often, `FINAL_RETRY_PAUSE_MS` apart, before a
/// healed cluster counts as refusing them (a retryable refusal is what a client retries).
const FINAL_ATTEMPTS: u32 = 10;
const FINAL_RETRY_PAUSE_MS: u64 = 500;
/// The process and producer id of the final produce (actors' ids start at 2).
const FINAL_PRODUCER: u64 = 1;

/// A deliberate bug of the cluster, to prove the checks catch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterCanary {
    /// The coordinator keeps deciding after losing the vnode's leadership and forwards its
    /// commands to the new leader instead of fencing them by term.
    CoordinateDeposed,
    /// A replicated append is acknowledged after the primary's own fsync only.
    AckPrimaryOnly,
    /// Failover promotes a follower (the one furthest behind) instead of sealing at the
    /// highest durable end.
    PromoteFollower,
    /// Failover seals with fewer than `n - q + 1` copies answering.
    SealWithoutEnoughAnswers,
    /// A replication span answered short of its end stays in flight for good: the follower is
    /// shipped nothing more (the wedge of issue 25).
    ShortAnswerWedges,
}

impl ClusterCanary {
    pub const ALL: [(&'static str, ClusterCanary); 5] = [
        ("coordinate-deposed", ClusterCanary::CoordinateDeposed),
        ("ack-primary-only", ClusterCanary::AckPrimaryOnly),
        ("promote-follower", ClusterCanary::PromoteFollower),
        ("seal-few-answers", ClusterCanary::SealWithoutEnoughAnswers),
        ("short-answer-wedge", ClusterCanary::ShortAnswerWedges),
    ];

    pub fn parse(name: &str) -> Option<ClusterCanary> {
        ClusterCanary::ALL.iter().find(|(known, _)| *known == name).map(|(_, canary)| *canary)
    }

    pub fn name(self) -> &'static str {
        ClusterCanary::ALL
            .iter()
            .find(|(_, known)| *known == self)
            .expect("every canary is named")
            .0
    }
}

#[derive(Clone, Debug)]
pub struct ClusterOptions {
    pub seed: u64,
    /// Simulated milliseconds of the fault phase.
    pub fault_ms: u64,
    pub canary: Option<ClusterCanary>,
    /// The replication faults and checks (storage faults on any broker, damaged sealed
    /// copies, waiting for healing, comparing settled copies). Off by default until the
    /// findings they surfaced are fixed (docs/testing.md).
    pub replica_faults: bool,
}

/// Simulated milliseconds of a cluster run's fault phase unless told otherwise.
pub const CLUSTER_FAULT_MS: u64 = 10_000;

impl ClusterOptions {
    pub fn new(seed: u64) -> ClusterOptions {
        ClusterOptions { seed, fault_ms: CLUSTER_FAULT_MS, canary: None, replica_faults: false }
    }

    /// The command that replays this run: every flag it was run with (a replay without
    /// `--replica-faults` of a run that had them passes, and hides what failed).
    pub fn replay_command(&self) -> String {
        let mut flags = vec!["--cluster".to_string(), format!("--seed {}", self.seed)];
        if self.fault_ms != CLUSTER_FAULT_MS {
            flags.push(format!("--fault-ms {}", self.fault_ms));
        }
        if let Some(canary) = self.canary {
            flags.push(format!("--canary {}", canary.name()));
        }
        if self.replica_faults {
            flags.push("--replica-faults".to_string());
        }
        crate::replay_command(&flags)
    }
}

/// This seed's cluster and fault mix.
#[derive(Clone, Debug)]
struct Swarm {
    nodes: u64,
    /// Mean milliseconds between crashes of some broker.
    crash_every_ms: Option<u64>,
    /// In thousandths, how many crashes keep the page cache (the rest are power losses).
    process_crash_per_mille: u64,
    down_ms_max: u64,
    /// Mean milliseconds between partitions between brokers, and their length.
    partition_every_ms: Option<u64>,
    partition_ms_max: u64,
    net: NetFaults,
    producers: Vec<(ProducerMode, u64)>,
    cursor_readers: u64,
    group_member: bool,
    reshaper: bool,
    reshape_pause_ms: u64,
    churner: bool,
    auto_split: bool,
    segment_max_bytes: u64,
    retention_bytes: u64,
    /// Vnodes on the ring (`MALACHI_LOG_VNODES`).
    vnodes: u64,
    /// Replicas per segment (`MALACHI_LOG_REPLICATION_FACTOR`).
    replication_factor: u64,
    /// `MALACHI_REPLICA_REPLACE_AFTER_MS`.
    replica_replace_after_ms: u64,
    /// Every broker's disk faults while faults are on.
    disk: SimFaults,
    /// A broker whose group commit failed a sync restarts (as a supervisor restarts a broker
    /// that stops); otherwise it stays up refusing writes until the heal.
    restart_after_sync_failure: bool,
    /// Mean milliseconds between one broker's disk filling up, and how long it stays full.
    full_disk_every_ms: Option<u64>,
    full_disk_ms: u64,
    /// Mean milliseconds between a bit flip or a cut of a sealed copy at rest.
    damage_every_ms: Option<u64>,
    /// The replication faults and checks are on (`ClusterOptions::replica_faults`).
    replica_faults: bool,
    /// `MALACHI_REPLICATION_CATCH_UP_BYTES`: small, a follower catching up from the file is
    /// shipped spans cut short and answers inside them.
    catch_up_bytes: u64,
    /// `MALACHI_REPLICATION_HELD_BYTES_MAX`: small, a follower that falls behind is shipped
    /// from the file, not from memory.
    held_bytes_max: u64,
}

impl Swarm {
    fn draw(rng: &mut SeededRng, canary: Option<ClusterCanary>, replica_faults: bool) -> Swarm {
        let mut pick = |choices: &[u64]| choices[rng.below(choices.len() as u64) as usize];
        let producers = (0..pick(&[1, 2, 3]))
            .map(|_| {
                let mode = if pick(&[0, 1]) == 0 {
                    ProducerMode::AckEach
                } else {
                    ProducerMode::Pipelined { depth: pick(&[2, 4]) as usize }
                };
                (mode, pick(&[0, 5, 40]))
            })
            .collect();
        let mut swarm = Swarm {
            nodes: pick(&[3, 3, 3, 5]),
            crash_every_ms: [None, Some(2_000), Some(5_000)][pick(&[0, 1, 2]) as usize],
            process_crash_per_mille: pick(&[0, 500, 1000]),
            down_ms_max: pick(&[200, 3_000]),
            partition_every_ms: [None, Some(1_500), Some(4_000)][pick(&[0, 1, 2]) as usize],
            partition_ms_max: pick(&[300, 3_000]),
            net: NetFaults { delay_max_ms: pick(&[0, 2, 20]), reset_per_100k: pick(&[0, 0, 30]) },
            producers,
            cursor_readers: pick(&[1, 2]),
            group_member: pick(&[0, 1]) == 1,
            reshaper: pick(&[0, 1, 1]) == 1,
            reshape_pause_ms: pick(&[100, 400]),
            churner: pick(&[0, 1]) == 1,
            auto_split: pick(&[0, 1]) == 1,
            segment_max_bytes: pick(&[4_096, 16_384, 262_144]),
            retention_bytes: pick(&[8_192, 65_536]),
            vnodes: pick(&[1, 3, 8]),
            replication_factor: 3,
            replica_replace_after_ms: 60_000,
            disk: SimFaults::default(),
            restart_after_sync_failure: false,
            full_disk_every_ms: None,
            full_disk_ms: 0,
            damage_every_ms: None,
            replica_faults,
            catch_up_bytes: 4 << 20,
            held_bytes_max: 64 << 20,
        };
        // Drawn only when asked for, so that the seeds without them keep their swarms.
        if replica_faults {
            swarm.replica_replace_after_ms = pick(&[2_000, 60_000]);
            swarm.disk = SimFaults {
                sync_failure_per_mille: pick(&[0, 0, 1]),
                write_failure_per_mille: pick(&[0, 0, 1]),
                capacity_bytes: None,
                crash_keeps_unsynced_prefix: pick(&[0, 1]) == 1,
                crash_tears_last_write: pick(&[0, 1]) == 1,
            };
            swarm.restart_after_sync_failure = pick(&[0, 1]) == 1;
            swarm.full_disk_every_ms = [None, None, Some(3_000)][pick(&[0, 1, 2]) as usize];
            swarm.full_disk_ms = pick(&[300, 2_000]);
            swarm.damage_every_ms = [None, Some(700), Some(2_000)][pick(&[0, 1, 2]) as usize];
            if swarm.nodes == 5 {
                swarm.replication_factor = pick(&[3, 5]);
            }
        }
        if canary == Some(ClusterCanary::CoordinateDeposed) {
            // Leadership must move while the coordinators are busy.
            swarm.partition_every_ms = Some(800);
            swarm.partition_ms_max = 2_000;
            swarm.crash_every_ms = None;
            swarm.segment_max_bytes = 4_096;
            swarm.reshaper = true;
            swarm.reshape_pause_ms = 50;
            swarm.producers = vec![(ProducerMode::Pipelined { depth: 4 }, 0); 3];
        }
        if matches!(
            canary,
            Some(
                ClusterCanary::AckPrimaryOnly
                    | ClusterCanary::PromoteFollower
                    | ClusterCanary::SealWithoutEnoughAnswers
            )
        ) {
            // Primaries must be lost with records their followers lack: brokers cut off and
            // killed often, for longer than membership takes to call them dead, under load.
            swarm.crash_every_ms = Some(1_500);
            swarm.down_ms_max = 3_000;
            swarm.process_crash_per_mille = 0;
            swarm.partition_every_ms = Some(1_500);
            swarm.partition_ms_max = 3_000;
            swarm.net.delay_max_ms = 20;
            swarm.producers = vec![(ProducerMode::Pipelined { depth: 4 }, 0); 3];
            swarm.reshaper = false;
            swarm.segment_max_bytes = 262_144;
        }
        if canary == Some(ClusterCanary::ShortAnswerWedges) {
            // Followers must fall behind and catch up from the file in spans cut short, on a
            // head that lives long enough to be checked: cut off often, never killed.
            swarm.nodes = 3;
            swarm.crash_every_ms = None;
            swarm.partition_every_ms = Some(1_500);
            swarm.partition_ms_max = 3_000;
            swarm.producers = vec![(ProducerMode::Pipelined { depth: 4 }, 0); 3];
            swarm.reshaper = false;
            swarm.churner = false;
            swarm.auto_split = false;
            swarm.segment_max_bytes = 262_144;
        }
        if canary == Some(ClusterCanary::SealWithoutEnoughAnswers) {
            // Two of a segment's three replicas must be down while a metadata quorum stands,
            // which three brokers cannot have.
            swarm.nodes = 5;
        }
        swarm
    }

    /// The replication limits, drawn from a stream of their own so that the rest of every
    /// seed's swarm stays what it was before they were drawn.
    fn draw_replication_limits(&mut self, rng: &mut SeededRng, canary: Option<ClusterCanary>) {
        let mut pick = |choices: &[u64]| choices[rng.below(choices.len() as u64) as usize];
        self.catch_up_bytes = pick(&[4 << 20, 4 << 20, 2_048, 300]);
        self.held_bytes_max = pick(&[64 << 20, 64 << 20, 16_384, 2_048]);
        if canary == Some(ClusterCanary::ShortAnswerWedges) {
            self.catch_up_bytes = 300;
            self.held_bytes_max = 2_048;
        }
    }

    fn settings(&self, node_id: u64) -> Vec<(&'static str, String)> {
        let mut settings = vec![
            ("AUTO_SPLIT_ENABLED", self.auto_split.to_string()),
            ("AUTO_SPLIT_WINDOW_MS", "1000".into()),
            ("SPLIT_RECORDS_PER_S", "300".into()),
            ("MERGE_RECORDS_PER_S", "40".into()),
            ("RESHAPE_COOLDOWN_MS", "500".into()),
            ("SEGMENT_MAX_BYTES", self.segment_max_bytes.to_string()),
            ("RETENTION_INTERVAL_MS", "250".into()),
            ("CLUSTER_PORT", "4042".into()),
            ("ADVERTISE_HOST", format!("node-{node_id}")),
            ("NODE_ID", node_id.to_string()),
            ("LOG_VNODES", self.vnodes.to_string()),
            ("REPLICATION_CATCH_UP_BYTES", self.catch_up_bytes.to_string()),
            ("REPLICATION_HELD_BYTES_MAX", self.held_bytes_max.to_string()),
        ];
        if self.replica_faults {
            settings.extend([
                ("LOG_REPLICATION_FACTOR", self.replication_factor.to_string()),
                ("REPLICA_REPLACE_AFTER_MS", self.replica_replace_after_ms.to_string()),
                ("SCRUB_INTERVAL_MS", "500".into()),
                ("SCRUB_SEGMENTS_PER_TICK", "16".into()),
            ]);
        }
        settings
    }
}

/// Runs one cluster seed to its verdict.
pub fn run_cluster(options: &ClusterOptions) -> RunOutcome {
    crate::panics::reset();
    let mut world = ClusterWorld::new(options.clone());
    world.run_phases();
    world.finish()
}

struct Down {
    restart_at_ms: u64,
    process: bool,
}

struct ClusterWorld {
    options: ClusterOptions,
    rng: SeededRng,
    swarm: Swarm,
    clock: Arc<SimClock>,
    net: SimNet,
    nodes: Vec<SimNode>,
    /// Brokers down, by index, with when they come back.
    down: Vec<Option<Down>>,
    partition_until_ms: Option<u64>,
    /// The broker whose disk is full now, by index, and until when.
    full_disk: Option<(usize, u64)>,
    /// Segments a copy of which the world damaged (one copy each, so intact ones remain).
    damaged: std::collections::BTreeSet<SegmentKey>,
    clients: Runtime,
    ctx: Arc<Ctx>,
    now_ms: u64,
    faults_on: bool,
    trace: Vec<String>,
    findings: Vec<String>,
    stats: RunStats,
}

impl ClusterWorld {
    fn new(options: ClusterOptions) -> ClusterWorld {
        let seed = options.seed;
        let mut rng = SeededRng::new(derive_seed(seed, 1));
        let mut swarm = Swarm::draw(&mut rng, options.canary, options.replica_faults);
        swarm.draw_replication_limits(&mut SeededRng::new(derive_seed(seed, 50)), options.canary);
        let clock = Arc::new(SimClock::default());
        clock.set(EPOCH_MS);
        let net = SimNet::new(derive_seed(seed, 2));
        let canary = |which: ClusterCanary| options.canary == Some(which);
        let canaries = Canaries {
            coordinate_deposed: canary(ClusterCanary::CoordinateDeposed),
            ack_primary_only: canary(ClusterCanary::AckPrimaryOnly),
            promote_follower: canary(ClusterCanary::PromoteFollower),
            seal_without_enough_answers: canary(ClusterCanary::SealWithoutEnoughAnswers),
            short_answer_wedges: canary(ClusterCanary::ShortAnswerWedges),
            ..Canaries::default()
        };
        let nodes: Vec<SimNode> = (1..=swarm.nodes)
            .map(|node_id| {
                let settings = swarm.settings(node_id);
                let settings: Vec<(&str, &str)> =
                    settings.iter().map(|(name, value)| (*name, value.as_str())).collect();
                let dir = format!("/sim/node-{node_id}");
                let config = malachi_broker::testing::config(Path::new(&dir), &settings);
                let storage = SimStorage::new(derive_seed(seed, 4 + node_id));
                let mut node = SimNode::new(node_id, seed ^ node_id, config, canaries, storage);
                node.membership = Some(Membership { first: 1 });
                node
            })
            .collect();
        let node_ids = (1..=swarm.nodes).collect();
        let ctx = Arc::new(Ctx::new(net.clone(), node_ids, Arc::clone(&clock)));
        ClusterWorld {
            options,
            rng,
            down: (0..swarm.nodes).map(|_| None).collect(),
            swarm,
            clock,
            net,
            nodes,
            partition_until_ms: None,
            full_disk: None,
            damaged: Default::default(),
            clients: paused_runtime(),
            ctx,
            now_ms: 0,
            faults_on: false,
            trace: Vec::new(),
            findings: Vec::new(),
            stats: RunStats::default(),
        }
    }

    fn run_phases(&mut self) {
        for index in 0..self.nodes.len() {
            self.boot(index);
        }
        // The cluster forms before the faults begin: every broker joined and serving.
        if !self.tick_until(|world| world.nodes.iter().all(SimNode::is_serving)) {
            self.findings.push("the cluster did not form on empty disks".into());
            return;
        }
        self.record("cluster formed".into());
        let workload = self.start_workload();
        self.faults_on = true;
        self.net.set_faults(self.swarm.net);
        self.apply_disk_faults();
        for _ in 0..self.options.fault_ms {
            self.tick();
        }
        self.heal();
        self.ctx.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
        if !self.tick_until(|_| workload.is_finished()) {
            self.findings.push(format!("the workload did not finish within {HEAL_TICKS_MAX} ms"));
            return;
        }
        if !self.tick_until(|world| world.nodes.iter().all(SimNode::is_serving)) {
            self.findings.push("a broker did not come back once every fault healed".into());
            return;
        }
        self.final_produce(ORDERS);
        self.wait_for_followers();
        let healed = self.options.replica_faults && self.wait_for_healing();
        for topic in [ORDERS, EVENTS] {
            self.final_drain(topic);
        }
        self.check_fence();
        if healed {
            self.check_copies();
        }
    }

    /// Ticks until `done` holds; `false` after `HEAL_TICKS_MAX` ticks.
    fn tick_until(&mut self, mut done: impl FnMut(&ClusterWorld) -> bool) -> bool {
        for _ in 0..HEAL_TICKS_MAX {
            if done(self) {
                return true;
            }
            self.tick();
        }
        done(self)
    }

    fn start_workload(&mut self) -> JoinHandle<()> {
        let ctx = Arc::clone(&self.ctx);
        let swarm = self.swarm.clone();
        let seed = self.options.seed;
        self.clients.spawn(async move {
            workload::setup(Arc::clone(&ctx), swarm.retention_bytes).await;
            let mut actors = tokio::task::JoinSet::new();
            let mut next_id = 1u64;
            let mut seed_for = || {
                next_id += 1;
                (next_id, derive_seed(seed, 100 + next_id))
            };
            for (index, &(mode, think_ms)) in swarm.producers.iter().enumerate() {
                let topic = if index == 1 { EVENTS } else { ORDERS };
                let (id, seed) = seed_for();
                actors.spawn(workload::producer(Arc::clone(&ctx), id, topic, mode, think_ms, seed));
            }
            for index in 0..swarm.cursor_readers {
                let topic = if index == 1 { EVENTS } else { ORDERS };
                let (id, seed) = seed_for();
                actors.spawn(workload::cursor_reader(Arc::clone(&ctx), id, topic, seed));
            }
            if swarm.group_member {
                let (id, seed) = seed_for();
                actors.spawn(workload::group_member(Arc::clone(&ctx), id, ORDERS, seed));
            }
            if swarm.reshaper {
                let (_, seed) = seed_for();
                let pause_ms = swarm.reshape_pause_ms;
                actors.spawn(workload::reshaper(Arc::clone(&ctx), ORDERS, pause_ms, seed));
            }
            if swarm.churner {
                let (id, seed) = seed_for();
                actors.spawn(workload::churner(Arc::clone(&ctx), id, seed));
            }
            while actors.join_next().await.is_some() {}
        })
    }

    /// One millisecond: faults, the clock, the network, every broker in order, the clients.
    fn tick(&mut self) {
        self.now_ms += 1;
        if self.faults_on {
            self.strike();
        }
        self.restart_due();
        self.clock.set(EPOCH_MS + self.now_ms);
        self.net.deliver(self.now_ms);
        for index in 0..self.nodes.len() {
            if let Err(error) = self.nodes[index].step(TICK, &self.net) {
                self.record(format!("node {} boot failed: {}", index + 1, reason_name(&error)));
                self.schedule_restart(index, 200, true);
            } else if let Some(reason) = self.nodes[index].store_poisoned() {
                // A broker whose Raft store failed stops, as a real one exits.
                self.record(format!("node {} fail-stop: {}", index + 1, reason_name(&reason)));
                self.stats.fail_stops += 1;
                self.crash(index, 1, true);
            } else if self.nodes[index].commit_failed()
                && (self.swarm.restart_after_sync_failure || !self.faults_on)
            {
                // Only a restart's journal replay makes it writable again.
                self.record(format!("node {} restarts: its group commit failed", index + 1));
                self.stats.fail_stops += 1;
                self.crash(index, 1, true);
            }
        }
        self.clients.block_on(async { tokio::time::sleep(TICK).await });
    }

    fn strike(&mut self) {
        if let Some(every) = self.swarm.crash_every_ms
            && self.rng.chance(1, every)
        {
            let index = self.rng.below(self.swarm.nodes) as usize;
            if self.nodes[index].is_up() {
                let down_ms = 1 + self.rng.below(self.swarm.down_ms_max);
                let process = self.rng.chance(self.swarm.process_crash_per_mille, 1000);
                self.record(format!(
                    "crash node {} (process {process}), down {down_ms} ms",
                    index + 1
                ));
                self.crash(index, down_ms, process);
            }
        }
        if let Some(until) = self.partition_until_ms
            && self.now_ms >= until
        {
            self.net.heal_cuts();
            self.partition_until_ms = None;
            self.record("partition healed".into());
        }
        if let Some(every) = self.swarm.partition_every_ms
            && self.partition_until_ms.is_none()
            && self.rng.chance(1, every)
        {
            self.partition();
        }
        self.strike_disks();
    }

    /// Fills one broker's disk for a while, and damages sealed copies at rest.
    fn strike_disks(&mut self) {
        if let Some((index, until)) = self.full_disk
            && self.now_ms >= until
        {
            self.full_disk = None;
            self.apply_disk_faults();
            self.record(format!("node {} disk space freed", index + 1));
        }
        if let Some(every) = self.swarm.full_disk_every_ms
            && self.full_disk.is_none()
            && self.rng.chance(1, every)
        {
            let index = self.rng.below(self.swarm.nodes) as usize;
            let storage = &self.nodes[index].storage;
            let capacity = storage.used_bytes() + self.rng.below(64 * 1024);
            storage.set_faults(SimFaults { capacity_bytes: Some(capacity), ..self.swarm.disk });
            self.full_disk = Some((index, self.now_ms + self.swarm.full_disk_ms));
            self.record(format!("node {} disk full at {capacity} bytes", index + 1));
        }
        if let Some(every) = self.swarm.damage_every_ms
            && self.rng.chance(1, every)
        {
            self.damage_sealed_copy();
        }
    }

    /// Every broker's disk faults as the phase wants them: the swarm's while faults are on
    /// (a crash keeps what the swarm says of unsynced writes either way).
    fn apply_disk_faults(&self) {
        let disk = self.swarm.disk.clone();
        let faults = match self.faults_on {
            true => disk,
            false => SimFaults {
                crash_keeps_unsynced_prefix: disk.crash_keeps_unsynced_prefix,
                crash_tears_last_write: disk.crash_tears_last_write,
                ..SimFaults::default()
            },
        };
        for node in &self.nodes {
            node.storage.set_faults(faults.clone());
        }
    }

    /// Flips a bit in, or cuts, one serving broker's copy of a sealed replicated segment of
    /// a workload topic, one copy per segment at most, and only where another copy holds every
    /// sealed record (settled, or an unsettled copy that verifies that far on a broker whose
    /// group commit has not failed; see [`ClusterWorld::holds`]): healing must find
    /// the damage and rebuild it from the others. Without that peer the copy may be the only
    /// one (seed 8112110: the primary's disk failed before its first sync, failover sealed on
    /// the follower's copy alone, and damaging that copy lost the segment: a second failure,
    /// which no replica set of two survives).
    fn damage_sealed_copy(&mut self) {
        let index = self.rng.below(self.swarm.nodes) as usize;
        let Some(broker) = self.nodes[index].broker() else { return };
        let node_id = index as u64 + 1;
        let header_bytes = malachi_log::format::SEGMENT_HEADER_BYTES;
        let candidates: Vec<(SegmentKey, u64)> = sealed_segments(&broker)
            .into_iter()
            .filter(|sealed| {
                sealed.replicas.contains(&node_id)
                    && sealed.replicas.iter().any(|&other| {
                        other != node_id
                            && (sealed.settled_on.contains(&other) || self.holds(other, sealed))
                    })
                    && sealed.data_bytes > header_bytes
                    && !self.damaged.contains(&sealed.key)
            })
            .map(|sealed| (sealed.key, sealed.data_bytes))
            .collect();
        if candidates.is_empty() {
            return;
        }
        let (key, data_bytes) = candidates[self.rng.below(candidates.len() as u64) as usize];
        let path = segment_path(&self.nodes[index].data_dir, key);
        let position = header_bytes + self.rng.below(data_bytes - header_bytes);
        let storage = &self.nodes[index].storage;
        let (what, done) = if self.rng.chance(1, 2) {
            ("cut", storage.truncate(&path, position))
        } else {
            let bit = self.rng.below(8) as u8;
            ("flip", storage.flip_bit(&path, position, bit))
        };
        if done.is_ok() {
            self.damaged.insert(key);
            self.record(format!(
                "damage: {what} node {node_id}'s copy of {}/{}/{} at byte {position}",
                key.topic_id, key.range_id, key.segment_id
            ));
        }
    }

    /// Ticks until every sealed replicated segment of the workload topics is settled on every
    /// replica (healing finished); `false`, with a finding, if it never is.
    /// Damage counts as healed once no settled copy fails its checks: the scrubber found and
    /// rebuilt every flipped bit and cut.
    fn wait_for_healing(&mut self) -> bool {
        let healed = self.tick_until(|world| {
            world.unsettled().is_empty_or_unknown() && world.damaged_settled_copies().is_empty()
        });
        if !healed {
            let unsettled = self.unsettled();
            let damaged = self.damaged_settled_copies();
            self.findings.push(format!(
                "HealingStuck: once every fault healed, sealed segments never settled or grew back to \
                 their replicas ({unsettled:?}) \
                 or damaged settled copies were never repaired ({damaged:?})"
            ));
        } else {
            self.record("healing finished".into());
        }
        healed
    }

    /// Ticks until no primary has records a follower lacks: once every fault healed, every
    /// follower is in reach and must come to hold every record of every head (a finding
    /// otherwise: a follower wedged behind, as after a span answered short before issue 25).
    fn wait_for_followers(&mut self) {
        let caught_up = self.tick_until(|world| world.followers_behind().is_empty());
        if !caught_up {
            let behind = self.followers_behind();
            self.findings.push(format!(
                "FollowersBehind: once every fault healed, followers never caught up with their \
                 primaries (primary, follower, records): {behind:?}"
            ));
        }
    }

    /// `(primary, follower, records the follower lacks)` over every serving broker's heads.
    fn followers_behind(&self) -> Vec<(u64, u64, u64)> {
        let mut behind = Vec::new();
        for (index, node) in self.nodes.iter().enumerate() {
            let Some(broker) = node.broker() else { continue };
            for (follower, records) in broker.replicator().follower_lag() {
                if records > 0 {
                    behind.push((index as u64 + 1, follower, records));
                }
            }
        }
        behind
    }

    /// Whether `node_id`'s copy of `sealed` holds every record of the seal, intact, in a way a
    /// restart keeps. A broker whose group commit failed a sync holds its unsynced writes only
    /// in pages the kernel marked clean without writing: reads see them until it restarts and
    /// replays its journal, which lacks them (seed 9204064: the primary's sync failed, failover
    /// sealed on the follower's copy alone, the world damaged that copy because the primary's
    /// file still read whole, and the primary's restart cut it short of the seal).
    fn holds(&self, node_id: u64, sealed: &SealedSegment) -> bool {
        let node = &self.nodes[node_id as usize - 1];
        if node.commit_failed() {
            return false;
        }
        let dir = range_dir(&node.data_dir, sealed.key);
        malachi_log::verify_segment(&node.storage, &dir, sealed.key.segment_id)
            .is_ok_and(|report| report.bad_frames.is_empty() && report.records >= sealed.end_offset)
    }

    /// Settled copies of sealed replicated segments that do not verify as sealed at their
    /// recorded length (damage the scrubber has not repaired yet).
    fn damaged_settled_copies(&self) -> Vec<String> {
        let Some(index) = self.serving() else { return Vec::new() };
        let Some(broker) = self.nodes[index].broker() else { return Vec::new() };
        let mut damaged = Vec::new();
        for sealed in sealed_segments(&broker) {
            for &node_id in &sealed.settled_on {
                let node = &self.nodes[node_id as usize - 1];
                let dir = range_dir(&node.data_dir, sealed.key);
                let report =
                    malachi_log::verify_segment(&node.storage, &dir, sealed.key.segment_id);
                let intact = report.is_ok_and(|report| {
                    report.bad_frames.is_empty()
                        && report.sealed.is_some_and(|seal| seal.data_bytes == sealed.data_bytes)
                });
                if !intact {
                    damaged.push(format!("{} on node {node_id}", sealed.key.segment_id));
                }
            }
        }
        damaged
    }

    /// Sealed segments with fewer replicas than the replication factor (or than the brokers,
    /// if fewer) or with a replica whose copy is not settled, as a serving broker's metadata
    /// says.
    fn unsettled(&self) -> Unsettled {
        let Some(index) = self.serving() else { return Unsettled(None) };
        let Some(broker) = self.nodes[index].broker() else { return Unsettled(None) };
        // Every broker is back: a segment placed on fewer (while some were down) must have
        // grown back to the replication factor, each copy settled.
        let wanted = (self.swarm.replication_factor as usize).min(self.nodes.len());
        let open: Vec<String> = sealed_segments(&broker)
            .into_iter()
            .filter(|sealed| {
                sealed.replicas.len() < wanted
                    || sealed.replicas.iter().any(|r| !sealed.settled_on.contains(r))
            })
            .map(|sealed| {
                format!(
                    "{} replicas {:?} settled {:?}",
                    sealed.key.segment_id, sealed.replicas, sealed.settled_on
                )
            })
            .collect();
        Unsettled(Some(open))
    }

    /// Every settled copy of a sealed replicated segment holds the same bytes: the recorded
    /// length, and the same file on every replica but for each copy's own write marks (see
    /// [`without_write_marks`]). Each broker's copies are judged by its own metadata view: a
    /// broker deletes a copy only once its view no longer lists it (expired, or dropped), so
    /// another broker's view, which may lag behind, would count a copy rightly deleted.
    fn check_copies(&mut self) {
        let mut copies: BTreeMap<SegmentKey, Vec<(u64, Vec<u8>)>> = BTreeMap::new();
        for (index, node) in self.nodes.iter().enumerate() {
            let Some(broker) = node.broker() else { continue };
            let node_id = index as u64 + 1;
            let settled_here = sealed_segments(&broker)
                .into_iter()
                .filter(|sealed| sealed.settled_on.contains(&node_id));
            for sealed in settled_here {
                let bytes = node.storage.written_bytes(&segment_path(&node.data_dir, sealed.key));
                let Some(bytes) = bytes.map(without_write_marks) else {
                    self.findings.push(format!(
                        "CopiesDiffer: segment {} is settled on node {node_id}, which has no file",
                        sealed.key.segment_id
                    ));
                    continue;
                };
                copies.entry(sealed.key).or_default().push((node_id, bytes));
            }
        }
        let mut compared = 0u64;
        for (key, copies) in &copies {
            let (first, expected) = &copies[0];
            for (node_id, bytes) in &copies[1..] {
                if bytes == expected {
                    compared += 1;
                    continue;
                }
                let at = expected.iter().zip(bytes).position(|(a, b)| a != b);
                self.findings.push(format!(
                    "CopiesDiffer: segment {}'s settled copies on nodes {first} and {node_id} \
                     differ ({} and {} bytes, first at byte {at:?})",
                    key.segment_id,
                    expected.len(),
                    bytes.len()
                ));
            }
        }
        self.record(format!("settled copies compared: {compared} identical"));
    }

    /// Cuts the brokers apart for a while: one broker from the rest (both ways, or only its
    /// sends, or only what it receives), or the cluster in two halves.
    fn partition(&mut self) {
        let nodes = self.swarm.nodes;
        let length_ms = 1 + self.rng.below(self.swarm.partition_ms_max);
        let one = 1 + self.rng.below(nodes);
        let kind = self.rng.below(4);
        let mut cuts = Vec::new();
        for other in (1..=nodes).filter(|&other| other != one) {
            match kind {
                0 | 3 => cuts.extend([(one, other), (other, one)]),
                1 => cuts.push((one, other)),
                _ => cuts.push((other, one)),
            }
        }
        if kind == 3 {
            // Two halves: the first half of the ids against the rest.
            cuts.clear();
            let half = nodes / 2;
            for low in 1..=half {
                for high in half + 1..=nodes {
                    cuts.extend([(low, high), (high, low)]);
                }
            }
        }
        for &(from, to) in &cuts {
            self.net.cut(from, to);
        }
        let what = ["isolated", "sends cut", "receives cut", "halves"][kind as usize];
        self.record(format!("partition: node {one} {what} for {length_ms} ms"));
        self.partition_until_ms = Some(self.now_ms + length_ms);
    }

    fn crash(&mut self, index: usize, down_ms: u64, process: bool) {
        self.stats.crashes += 1;
        if process {
            self.stats.process_crashes += 1;
        }
        self.nodes[index].crash(&self.net);
        self.schedule_restart(index, down_ms, process);
    }

    fn schedule_restart(&mut self, index: usize, down_ms: u64, process: bool) {
        self.down[index] = Some(Down { restart_at_ms: self.now_ms + down_ms, process });
    }

    fn restart_due(&mut self) {
        for index in 0..self.nodes.len() {
            let due =
                self.down[index].as_ref().is_some_and(|down| self.now_ms >= down.restart_at_ms);
            if !due {
                continue;
            }
            let down = self.down[index].take().expect("due");
            let storage = &self.nodes[index].storage;
            if down.process {
                storage.restart_process()
            } else {
                storage.restart()
            }
            self.boot(index);
        }
    }

    fn boot(&mut self, index: usize) {
        let node = &mut self.nodes[index];
        match node.boot(Arc::clone(&self.clock), &self.net) {
            Ok(()) => {
                let incarnation = node.incarnation;
                self.record(format!("boot node {} ({incarnation})", index + 1));
            }
            Err(error) => {
                self.record(format!("node {} boot failed: {}", index + 1, reason_name(&error)));
                self.schedule_restart(index, 200, true);
            }
        }
    }

    /// Lifts every fault: partitions heal, the network is clean, every down broker restarts.
    fn heal(&mut self) {
        self.faults_on = false;
        self.full_disk = None;
        self.apply_disk_faults();
        self.net.heal_cuts();
        self.net.set_faults(NetFaults::default());
        self.partition_until_ms = None;
        for down in self.down.iter_mut().flatten() {
            down.restart_at_ms = self.now_ms;
        }
        self.record("heal".into());
    }

    /// A serving broker, for the final produce and drain through the log API.
    fn serving(&self) -> Option<usize> {
        (0..self.nodes.len()).find(|&index| self.nodes[index].is_serving())
    }

    /// Runs `future` (made from a serving broker) on that broker's runtime until it finishes,
    /// ticking the whole world meanwhile.
    fn on_a_broker<T: Send + 'static>(
        &mut self,
        make: impl FnOnce(
            Arc<malachi_broker::node::Broker>,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<T, String>> + Send>,
        >,
    ) -> Result<T, String> {
        let index = self.serving().ok_or("no broker is serving")?;
        let broker = self.nodes[index].broker().ok_or("no broker is serving")?;
        let task = self.nodes[index].spawn(make(broker)).ok_or("the broker went down")?;
        let finished = self.tick_until(|_| task.is_finished());
        if !finished {
            return Err("did not finish".into());
        }
        self.clients.block_on(task).unwrap_or_else(|error| Err(error.to_string()))
    }

    /// Lets the healed cluster settle before a final call is retried: brokers restarted at
    /// the heal elect leaders and hand vnodes' leadership over, as a client's retry would wait.
    fn pause_before_retry(&mut self) {
        for _ in 0..FINAL_RETRY_PAUSE_MS {
            self.tick();
        }
    }

    fn final_produce(&mut self, topic: &str) {
        let record = WrittenRecord {
            key: Some(b"final".to_vec()),
            value: format!("final-{}", self.options.seed).into_bytes(),
            producer: FINAL_PRODUCER,
            sequence: 1,
        };
        // A failed attempt's outcome is unknown: the next one is its retry, so that a record
        // written by both is one write, not two.
        let mut retry_of = None;
        for attempt in 0..FINAL_ATTEMPTS {
            if attempt > 0 {
                self.pause_before_retry();
            }
            let op = Op::Produce(Produce {
                topic: topic.to_string(),
                records: vec![record.clone()],
                retry_of,
            });
            let op_id = self.history_mut(|history| history.invoke(FINAL_PRODUCER, op));
            retry_of.get_or_insert(op_id);
            let (topic, record) = (topic.to_string(), record.clone());
            match self.on_a_broker(move |broker| {
                Box::pin(workload::produce_on_node(broker, topic, record))
            }) {
                Ok(()) => {
                    self.history_mut(|history| history.ok(op_id));
                    return;
                }
                Err(error) => {
                    self.history_mut(|history| history.info(op_id));
                    self.record(format!("final produce {attempt} failed: {}", reason_name(&error)));
                }
            }
        }
        self.findings.push(format!(
            "the healed cluster refused a produce to {topic} {FINAL_ATTEMPTS} times"
        ));
    }

    fn final_drain(&mut self, topic: &str) {
        let op = |records, skipped| Op::Drain(Drain { topic: topic.to_string(), records, skipped });
        for attempt in 0..FINAL_ATTEMPTS {
            if attempt > 0 {
                self.pause_before_retry();
            }
            let op_id = self.history_mut(|history| history.invoke(0, op(Vec::new(), 0)));
            let name = topic.to_string();
            match self.on_a_broker(move |broker| Box::pin(workload::drain_on_node(broker, name))) {
                Ok((records, skipped)) => {
                    self.history_mut(|history| history.ok_with(op_id, op(records, skipped)));
                    return;
                }
                Err(error) => {
                    self.history_mut(|history| history.info(op_id));
                    self.record(format!("drain of {topic} failed: {}", reason_name(&error)));
                }
            }
        }
        self.findings.push(format!("the final drain of {topic} failed {FINAL_ATTEMPTS} times"));
    }

    /// The coordinator fence: a command of an old term that reached the log after a newer
    /// coordinator's means a deposed coordinator acted. Every replica counts the same; any
    /// broker's count is the cluster's.
    fn check_fence(&mut self) {
        let Some(index) = self.serving() else { return };
        let Some(broker) = self.nodes[index].broker() else { return };
        let stale: u64 =
            broker.read_every_meta(|meta| vec![meta.stale_coordinator_commands()]).iter().sum();
        if stale > 0 {
            self.findings.push(format!(
                "StaleCoordinator: {stale} coordinator commands of an old term reached the log \
                 after a newer coordinator's"
            ));
        }
    }

    fn history_mut<T>(&self, change: impl FnOnce(&mut History) -> T) -> T {
        change(&mut self.ctx.history.lock().expect("history lock poisoned"))
    }

    fn record(&mut self, line: String) {
        self.trace.push(format!("{} {line}", self.now_ms));
    }

    /// A broker that stops releases every task, buffer and file it held (or it would after a
    /// failover in production too): once all are down, each disk is held by its node alone.
    fn check_released(&mut self) {
        for node in &self.nodes {
            let holders = node.storage.holders();
            if holders != 1 {
                let id = node.node_id;
                self.findings
                    .push(format!("broker {id}'s disk is held {holders} times after it stopped"));
            }
        }
    }

    fn finish(mut self) -> RunOutcome {
        self.stats.simulated_ms = self.now_ms;
        self.stats.connection_resets = self.net.resets();
        self.findings.extend(self.ctx.findings.lock().expect("findings lock poisoned").drain(..));
        self.findings
            .extend(crate::panics::take().into_iter().map(|panic| format!("panic: {panic}")));
        let history = self.ctx.history.lock().expect("history lock poisoned").clone();
        self.stats.history_events = history.events().len() as u64;
        self.stats.acknowledged_produces = history
            .events()
            .iter()
            .filter(|event| event.kind == EventKind::Ok && matches!(event.op, Op::Produce(_)))
            .count() as u64;
        if self.stats.acknowledged_produces == 0 {
            self.findings.push("no produce was acknowledged".to_string());
        }
        let report = history.check();
        let notes = self.ctx.notes.lock().expect("notes lock poisoned").clone();
        let trace_hash = trace_hash(&self.trace, &notes, &history);
        let swarm = format!("{:?}", self.swarm);
        for node in &mut self.nodes {
            node.crash(&self.net);
        }
        self.check_released();
        let seed_line =
            format!("cluster of {} (seeds at {})", self.swarm.nodes, cluster_address(1));
        RunOutcome {
            seed: self.options.seed,
            trace_hash,
            report,
            findings: self.findings,
            stats: self.stats,
            swarm,
            history,
            trace: std::iter::once(seed_line).chain(self.trace).chain(notes).collect(),
        }
    }
}

/// Unsettled sealed copies as a serving broker sees them; `None` while none serves.
#[derive(Debug)]
struct Unsettled(Option<Vec<String>>);

impl Unsettled {
    fn is_empty_or_unknown(&self) -> bool {
        self.0.as_ref().is_some_and(Vec::is_empty)
    }
}

/// A sealed replicated segment of a workload topic, as one broker's metadata records it.
struct SealedSegment {
    key: SegmentKey,
    /// Records in the sealed segment (its offsets start at 0).
    end_offset: u64,
    data_bytes: u64,
    replicas: Vec<u64>,
    settled_on: Vec<u64>,
}

fn sealed_segments(broker: &malachi_broker::node::Broker) -> Vec<SealedSegment> {
    let mut sealed = Vec::new();
    for name in [ORDERS, EVENTS] {
        broker.read_meta_named(name, |meta| {
            let Some(topic) = meta.topic_by_name(name) else { return };
            for &range_id in topic.ranges.keys() {
                for segment in meta.range_segments(topic.topic_id, range_id) {
                    let Some((end_offset, data_bytes)) = segment.sealed_length() else {
                        continue;
                    };
                    let segment_id = segment.segment_id;
                    sealed.push(SealedSegment {
                        key: SegmentKey { topic_id: topic.topic_id, range_id, segment_id },
                        end_offset,
                        data_bytes,
                        replicas: segment.replicas.clone(),
                        settled_on: segment.settled_on.clone(),
                    });
                }
            }
        });
    }
    sealed
}

fn range_dir(data_dir: &Path, key: SegmentKey) -> std::path::PathBuf {
    data_dir.join("topics").join(key.topic_id.to_string()).join(key.range_id.to_string())
}

fn segment_path(data_dir: &Path, key: SegmentKey) -> std::path::PathBuf {
    malachi_log::segment_paths(&range_dir(data_dir, key), key.segment_id).0
}

/// A segment file with every record frame's write mark cleared: the batch-start flag (the
/// first record of one of this copy's own group-commit writes, which recovery uses to tell a
/// torn tail from damage) and the frame checksum that covers it. Everything else (the header,
/// every record's offset, timestamp, key, value and headers, every frame's place, the seal
/// trailer) must be the same on every settled copy.
fn without_write_marks(mut bytes: Vec<u8>) -> Vec<u8> {
    use malachi_log::format::{FLAG_BATCH_START, FRAME_HEADER_BYTES, RECORD_MAGIC};
    /// Where the flags byte sits in a record frame: after the offset and the timestamp.
    const FLAGS_AT: usize = FRAME_HEADER_BYTES + 16;
    let mut at = malachi_log::format::SEGMENT_HEADER_BYTES as usize;
    while at + FLAGS_AT < bytes.len() && bytes[at..at + 2] == RECORD_MAGIC {
        let length = u32::from_le_bytes(bytes[at + 2..at + 6].try_into().expect("4 bytes"));
        bytes[at + 6..at + 10].fill(0);
        bytes[at + FLAGS_AT] &= !FLAG_BATCH_START;
        at += FRAME_HEADER_BYTES + length as usize;
    }
    bytes
}
