//! One simulated run: the node, the network, the clients, the faults and the clock, advanced
//! together one millisecond tick at a time from one seed.
//!
//! A run has three phases. Faults: the workload runs while the seed's swarm of faults strikes.
//! Heal: every fault is lifted, a dead node is restarted, the actors finish what they hold.
//! Drain: every topic is read from its start, so a record the checker cannot find is lost.
//! Then the history is checked and the run's trace (faults, admin answers, every history
//! event) is hashed: the same seed gives the same hash, run after run.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use malachi_broker::data::SegmentKey;
use malachi_broker::node::Canaries;
use malachi_check::{CheckReport, Drain, EventKind, History, Op, Produce, WrittenRecord};
use malachi_log::rng::SeededRng;
use malachi_log::{SimFaults, SimStorage};
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

use crate::net::{NetFaults, SimNet};
use crate::node::{SimClock, SimNode, derive_seed, paused_runtime};
use crate::workload::{self, Ctx, EVENTS, ORDERS, ProducerMode};

/// The simulated wall clock starts here (2026-01-01T00:00:00Z).
pub(crate) const EPOCH_MS: u64 = 1_767_225_600_000;
const TICK: Duration = Duration::from_millis(1);
/// Ticks the heal phase may take before the run is declared stuck.
const HEAL_TICKS_MAX: u64 = 120_000;
const NODE_ID: u64 = 1;
/// The process and producer id of the final produce (actors' ids start at 2).
const FINAL_PRODUCER: u64 = 1;

/// A deliberate bug to run with, to prove the checks catch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Canary {
    AckBeforeFsync,
    SkipSplitFence,
    /// Recovery trusts the page cache: no sync and no cache drop before it scans.
    TrustPageCache,
    /// New directories are created without syncing their parents.
    SkipDirSync,
    /// Recovery cuts at the first bad frame even when later writes follow it.
    CutDamage,
}

impl Canary {
    pub const ALL: [(&'static str, Canary); 5] = [
        ("ack-before-fsync", Canary::AckBeforeFsync),
        ("skip-split-fence", Canary::SkipSplitFence),
        ("trust-page-cache", Canary::TrustPageCache),
        ("skip-dir-sync", Canary::SkipDirSync),
        ("cut-damage", Canary::CutDamage),
    ];

    pub fn parse(name: &str) -> Option<Canary> {
        Canary::ALL.iter().find(|(known, _)| *known == name).map(|(_, canary)| *canary)
    }

    pub fn name(self) -> &'static str {
        Canary::ALL.iter().find(|(_, known)| *known == self).expect("every canary is named").0
    }
}

/// How the node goes down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CrashKind {
    /// The machine loses power: unsynced writes are lost (or kept in part, or torn).
    Power,
    /// The process dies and the kernel keeps the page cache: unsynced writes are still read
    /// after the restart and may vanish at a later power loss.
    Process,
}

#[derive(Clone, Debug)]
pub struct RunOptions {
    pub seed: u64,
    /// Simulated milliseconds of the fault phase.
    pub fault_ms: u64,
    pub canary: Option<Canary>,
}

/// Simulated milliseconds of a run's fault phase unless told otherwise.
pub const DEFAULT_FAULT_MS: u64 = 8_000;

impl RunOptions {
    pub fn new(seed: u64) -> RunOptions {
        RunOptions { seed, fault_ms: DEFAULT_FAULT_MS, canary: None }
    }

    /// The command that replays this run: every flag it was run with.
    pub fn replay_command(&self) -> String {
        let mut flags = vec![format!("--seed {}", self.seed)];
        if self.fault_ms != DEFAULT_FAULT_MS {
            flags.push(format!("--fault-ms {}", self.fault_ms));
        }
        if let Some(canary) = self.canary {
            flags.push(format!("--canary {}", canary.name()));
        }
        crate::replay_command(&flags)
    }
}

/// What a run did, in numbers.
#[derive(Clone, Debug, Default)]
pub struct RunStats {
    pub simulated_ms: u64,
    pub crashes: u64,
    pub process_crashes: u64,
    pub acknowledged_produces: u64,
    pub fail_stops: u64,
    pub clock_jumps: u64,
    pub connection_resets: u64,
    pub history_events: u64,
    /// Journal checkpoints the node's incarnations ran before they went down (or the end).
    pub checkpoints: u64,
}

pub struct RunOutcome {
    pub seed: u64,
    pub trace_hash: u64,
    pub report: CheckReport,
    /// Broken promises outside the checker's model (a panic, a node that would not boot, a
    /// stuck workload, an old cursor accepted), each a sentence.
    pub findings: Vec<String>,
    pub stats: RunStats,
    pub swarm: String,
    /// The run's history, for saving beside a failing report.
    pub history: History,
    /// The world's own trace: faults, boots, admin answers.
    pub trace: Vec<String>,
}

impl RunOutcome {
    pub fn passed(&self) -> bool {
        self.report.is_ok() && self.findings.is_empty()
    }

    /// The names of everything that failed, checker violations first.
    pub fn failure_names(&self) -> Vec<String> {
        let mut names: Vec<String> =
            self.report.violation_names().into_iter().map(str::to_string).collect();
        names.extend(self.findings.iter().cloned());
        names
    }
}

/// This seed's fault rates and workload shape ("swarm testing": each seed stresses a different
/// mix).
#[derive(Clone, Debug)]
struct Swarm {
    /// Mean milliseconds between crashes of the node.
    crash_every_ms: Option<u64>,
    /// In thousandths, how many crashes are process crashes (the rest are power losses).
    process_crash_per_mille: u64,
    /// A failed `fdatasync` is followed by a crash within 50 ms: the sequence where a restart
    /// must not trust the pages the failed sync left clean.
    crash_after_sync_failure: bool,
    down_ms_max: u64,
    disk: SimFaults,
    /// Milliseconds of a full disk, at a random time of the fault phase.
    enospc_ms: Option<u64>,
    net: NetFaults,
    /// Mean milliseconds between partitions of the clients from the node, and their length.
    partition_every_ms: Option<u64>,
    partition_ms_max: u64,
    clock_jump_every_ms: Option<u64>,
    /// Mean milliseconds between media damage (a flipped bit or a cut) in a sealed segment.
    damage_every_ms: Option<u64>,
    /// How long damage stays before it is repaired (as re-replication from a healthy copy would).
    damage_ms: u64,
    /// In thousandths, how much damage strikes an active segment rather than a sealed one.
    damage_active_per_mille: u64,
    producers: Vec<(ProducerMode, u64)>,
    cursor_readers: u64,
    group_member: bool,
    reshaper: bool,
    /// The reshaper waits up to this long between reshapes.
    reshape_pause_ms: u64,
    churner: bool,
    auto_split: bool,
    segment_max_bytes: u64,
    retention_bytes: u64,
    /// How group-commit rounds of several segments become durable: `journal`, `files` or
    /// `filesystem`.
    barrier: &'static str,
    /// The journal's size: its checkpoints begin at half of it.
    journal_bytes: u64,
    /// Segment files open at once; half of it behind the journal begins a checkpoint.
    max_open_segments: u64,
}

impl Swarm {
    fn draw(rng: &mut SeededRng, canary: Option<Canary>) -> Swarm {
        let mut pick = |choices: &[u64]| choices[rng.below(choices.len() as u64) as usize];
        let crash_every_ms = [None, Some(1_500), Some(4_000)][pick(&[0, 1, 2]) as usize];
        let process_crash_per_mille = pick(&[0, 500, 1000]);
        let crash_after_sync_failure = pick(&[0, 1]) == 1;
        let down_ms_max = pick(&[1, 200, 2_000]);
        let disk = SimFaults {
            sync_failure_per_mille: pick(&[0, 0, 1]),
            write_failure_per_mille: pick(&[0, 0, 1]),
            capacity_bytes: None,
            crash_keeps_unsynced_prefix: pick(&[0, 1]) == 1,
            crash_tears_last_write: pick(&[0, 1]) == 1,
        };
        let enospc_ms = [None, None, Some(300), Some(2_000)][pick(&[0, 1, 2, 3]) as usize];
        let net =
            NetFaults { delay_max_ms: pick(&[0, 2, 20, 200]), reset_per_100k: pick(&[0, 30, 300]) };
        let partition_every_ms = [None, None, Some(3_000)][pick(&[0, 1, 2]) as usize];
        let partition_ms_max = pick(&[200, 5_000]);
        let clock_jump_every_ms = [None, Some(2_000)][pick(&[0, 1]) as usize];
        let damage_every_ms = [None, None, Some(1_000)][pick(&[0, 1, 2]) as usize];
        let damage_ms = pick(&[50, 500]);
        let producer_count = pick(&[1, 2, 3]);
        let producers = (0..producer_count)
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
            crash_every_ms,
            process_crash_per_mille,
            crash_after_sync_failure,
            down_ms_max,
            disk,
            enospc_ms,
            net,
            partition_every_ms,
            partition_ms_max,
            clock_jump_every_ms,
            damage_every_ms,
            damage_ms,
            damage_active_per_mille: 500,
            producers,
            cursor_readers: pick(&[1, 2]),
            group_member: pick(&[0, 1]) == 1,
            reshaper: pick(&[0, 1, 1]) == 1,
            reshape_pause_ms: pick(&[50, 200, 800]),
            churner: pick(&[0, 1]) == 1,
            auto_split: pick(&[0, 1]) == 1,
            segment_max_bytes: pick(&[4_096, 16_384, 262_144]),
            retention_bytes: pick(&[8_192, 65_536]),
            barrier: ["journal", "journal", "files", "filesystem"][pick(&[0, 1, 2, 3]) as usize],
            journal_bytes: pick(&[1 << 20, 2 << 20]),
            max_open_segments: pick(&[16, 32, 1_024]),
        };
        match canary {
            Some(Canary::AckBeforeFsync) => {
                swarm.crash_every_ms = Some(1_000);
                swarm.disk.crash_keeps_unsynced_prefix = false;
            }
            Some(Canary::SkipSplitFence) => {
                swarm.reshaper = true;
                swarm.reshape_pause_ms = 20;
                swarm.producers = vec![(ProducerMode::Pipelined { depth: 4 }, 0); 3];
            }
            Some(Canary::TrustPageCache) => {
                swarm.crash_every_ms = Some(1_000);
                swarm.process_crash_per_mille = 500;
                swarm.disk.sync_failure_per_mille = 20;
                swarm.crash_after_sync_failure = true;
            }
            Some(Canary::SkipDirSync) => {
                swarm.crash_every_ms = Some(1_000);
                swarm.process_crash_per_mille = 0;
            }
            Some(Canary::CutDamage) => {
                swarm.damage_every_ms = Some(200);
                swarm.damage_active_per_mille = 1000;
                swarm.crash_every_ms = None;
            }
            None => {}
        }
        swarm
    }

    fn settings(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AUTO_SPLIT_ENABLED", self.auto_split.to_string()),
            ("AUTO_SPLIT_WINDOW_MS", "1000".into()),
            ("SPLIT_RECORDS_PER_S", "300".into()),
            ("MERGE_RECORDS_PER_S", "40".into()),
            ("RESHAPE_COOLDOWN_MS", "500".into()),
            ("SEGMENT_MAX_BYTES", self.segment_max_bytes.to_string()),
            ("RETENTION_INTERVAL_MS", "250".into()),
            ("GROUP_COMMIT_BARRIER", self.barrier.into()),
            ("JOURNAL_BYTES", self.journal_bytes.to_string()),
            ("MAX_OPEN_SEGMENTS", self.max_open_segments.to_string()),
        ]
    }
}

/// A segment file damaged on purpose, and how to undo it.
struct Damage {
    how: DamageKind,
    key: SegmentKey,
    path: PathBuf,
    until_ms: u64,
}

enum DamageKind {
    /// A sealed segment cut short at `position` (its trailer lost), with its healthy bytes.
    Cut { original: Vec<u8>, position: u64 },
    /// One bit flipped, in a sealed segment or among an active one's durable records; flipping
    /// it again repairs it, unless the healthy byte was written back meanwhile (a journal
    /// replay rewrites what it holds).
    Flip { position: u64, bit: u8, healthy: u8 },
}

struct World {
    options: RunOptions,
    rng: SeededRng,
    swarm: Swarm,
    clock: Arc<SimClock>,
    net: SimNet,
    node: SimNode,
    clients: Runtime,
    ctx: Arc<Ctx>,
    now_ms: u64,
    clock_offset_ms: i64,
    restart_at_ms: Option<u64>,
    /// How the node went down, so the restart keeps or drops the page cache.
    down_kind: CrashKind,
    /// A crash the world has scheduled (after a failed sync, after active damage).
    crash_at_ms: Option<(u64, CrashKind)>,
    /// Failed syncs seen so far, to notice a new one.
    failed_syncs_seen: u64,
    enospc_window: Option<(u64, u64)>,
    damage: Option<Damage>,
    faults_on: bool,
    trace: Vec<String>,
    findings: Vec<String>,
    stats: RunStats,
}

/// Runs one seed to its verdict.
pub fn run(options: &RunOptions) -> RunOutcome {
    crate::panics::reset();
    let mut world = World::new(options.clone());
    world.run_phases();
    let disk = world.node.storage.clone();
    let mut outcome = world.finish();
    // A broker that stops releases every task, buffer and file it held: once the world is gone
    // (the clients' runtime too, which may hold the broker's last handles), nothing but this
    // handle holds its disk.
    let holders = disk.holders() - 1;
    if holders != 0 {
        outcome.findings.push(format!("the broker's disk is held {holders} times after the run"));
    }
    outcome
}

impl World {
    fn new(options: RunOptions) -> World {
        let seed = options.seed;
        let mut rng = SeededRng::new(derive_seed(seed, 1));
        let swarm = Swarm::draw(&mut rng, options.canary);
        let clock = Arc::new(SimClock::default());
        clock.set(EPOCH_MS);
        let net = SimNet::new(derive_seed(seed, 2));
        let storage = SimStorage::new(derive_seed(seed, 4));
        let settings = swarm.settings();
        let settings: Vec<(&str, &str)> =
            settings.iter().map(|(name, value)| (*name, value.as_str())).collect();
        let config = malachi_broker::testing::config(Path::new("/sim/node-1"), &settings);
        let canaries = Canaries {
            ack_before_fsync: options.canary == Some(Canary::AckBeforeFsync),
            skip_split_fence: options.canary == Some(Canary::SkipSplitFence),
            trust_page_cache: options.canary == Some(Canary::TrustPageCache),
            skip_dir_sync: options.canary == Some(Canary::SkipDirSync),
            cut_damage: options.canary == Some(Canary::CutDamage),
            ..Canaries::default()
        };
        let node = SimNode::new(NODE_ID, seed, config, canaries, storage);
        let ctx = Arc::new(Ctx::new(net.clone(), vec![NODE_ID], Arc::clone(&clock)));
        let enospc_window = swarm.enospc_ms.map(|length| {
            let start = rng.below(options.fault_ms.max(1));
            (start, start + length)
        });
        World {
            options,
            rng,
            swarm,
            clock,
            net,
            node,
            clients: paused_runtime(),
            ctx,
            now_ms: 0,
            clock_offset_ms: 0,
            restart_at_ms: None,
            down_kind: CrashKind::Power,
            crash_at_ms: None,
            failed_syncs_seen: 0,
            enospc_window,
            damage: None,
            faults_on: false,
            trace: Vec::new(),
            findings: Vec::new(),
            stats: RunStats::default(),
        }
    }

    fn run_phases(&mut self) {
        if let Err(error) = self.boot() {
            self.findings.push(format!("the node did not boot on an empty disk: {error}"));
            return;
        }
        let workload = self.start_workload();
        self.set_faults(true);
        for _ in 0..self.options.fault_ms {
            self.tick();
        }
        self.set_faults(false);
        self.ctx.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
        self.record("heal".into());
        let mut waited = 0;
        while !workload.is_finished() {
            if waited == HEAL_TICKS_MAX {
                self.findings.push(format!(
                    "the workload did not finish within {HEAL_TICKS_MAX} ms of healing"
                ));
                return;
            }
            self.tick();
            waited += 1;
        }
        self.final_produce(ORDERS);
        for topic in [ORDERS, EVENTS] {
            self.final_drain(topic);
        }
    }

    /// Starts the setup and then every actor of the swarm; the handle finishes when they all
    /// have.
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
                actors.spawn(workload::reshaper(
                    Arc::clone(&ctx),
                    ORDERS,
                    swarm.reshape_pause_ms,
                    seed,
                ));
            }
            if swarm.churner {
                let (id, seed) = seed_for();
                actors.spawn(workload::churner(Arc::clone(&ctx), id, seed));
            }
            while actors.join_next().await.is_some() {}
        })
    }

    /// One millisecond of the world: faults, the clock, the network, the node, the clients.
    fn tick(&mut self) {
        self.now_ms += 1;
        if self.faults_on {
            self.strike();
        }
        if let Some(at) = self.restart_at_ms
            && self.now_ms >= at
        {
            self.restart();
        }
        let wall_ms = (EPOCH_MS as i64 + self.now_ms as i64 + self.clock_offset_ms) as u64;
        self.clock.set(wall_ms);
        self.net.deliver(self.now_ms);
        // A single node boots in the foreground: stepping it never finishes a boot.
        let _ = self.node.step(TICK, &self.net);
        if self.node.broker().is_some_and(|broker| broker.data_plane().commit_failed()) {
            // A failed journal checkpoint stops writes until a restart replays the journal.
            self.record("fail-stop: group commit".into());
            self.stats.fail_stops += 1;
            self.crash(1, CrashKind::Process);
        } else if let Some(reason) = self.node.store_poisoned() {
            // A node whose Raft store failed stops (fail-stop), as a real one exits: the
            // process dies, the kernel keeps the page cache, and it comes back at once.
            self.record(format!("fail-stop: raft store {}", reason_name(&reason)));
            self.stats.fail_stops += 1;
            self.crash(1, CrashKind::Process);
        }
        self.clients.block_on(async { tokio::time::sleep(TICK).await });
    }

    /// This tick's faults, by the swarm's rates.
    fn strike(&mut self) {
        let swarm = &self.swarm;
        if let Some(every) = swarm.crash_every_ms
            && self.node.is_up()
            && self.rng.chance(1, every)
        {
            let kind = self.draw_crash_kind();
            self.crash_now(kind);
        }
        self.strike_scheduled_crash();
        if let Some(every) = self.swarm.partition_every_ms
            && self.rng.chance(1, every)
        {
            let length_ms = 1 + self.rng.below(self.swarm.partition_ms_max);
            self.net.partition_until(self.now_ms + length_ms);
            self.record(format!("partition for {length_ms} ms"));
        }
        if let Some(every) = self.swarm.clock_jump_every_ms
            && self.rng.chance(1, every)
        {
            let jump_ms = self.rng.below(600_000) as i64 - 30_000;
            self.clock_offset_ms += jump_ms;
            self.stats.clock_jumps += 1;
            self.record(format!("clock jumps {jump_ms} ms"));
        }
        if let Some(every) = self.swarm.damage_every_ms
            && self.damage.is_none()
            && self.rng.chance(1, every)
        {
            if self.rng.chance(self.swarm.damage_active_per_mille, 1000) {
                self.damage_active_segment();
            } else {
                self.damage_sealed_segment();
            }
        }
        if self.damage.as_ref().is_some_and(|damage| self.now_ms >= damage.until_ms) {
            self.repair_damage();
        }
        if let Some((start, end)) = self.enospc_window {
            if self.now_ms == start {
                let capacity = self.node.storage.used_bytes() + self.rng.below(64 * 1024);
                self.apply_disk_faults(Some(capacity));
                self.record(format!("disk full at {capacity} bytes"));
            } else if self.now_ms == end {
                self.apply_disk_faults(None);
                self.record("disk space freed".into());
            }
        }
    }

    fn apply_disk_faults(&self, capacity_bytes: Option<u64>) {
        let faults = if self.faults_on {
            SimFaults { capacity_bytes, ..self.swarm.disk }
        } else {
            SimFaults {
                crash_keeps_unsynced_prefix: self.swarm.disk.crash_keeps_unsynced_prefix,
                crash_tears_last_write: self.swarm.disk.crash_tears_last_write,
                ..SimFaults::default()
            }
        };
        self.node.storage.set_faults(faults);
    }

    fn set_faults(&mut self, on: bool) {
        self.faults_on = on;
        if !on {
            self.repair_damage();
        }
        self.apply_disk_faults(None);
        self.net.set_faults(if on { self.swarm.net } else { NetFaults::default() });
        if !on {
            self.net.partition_until(0);
        }
        if !on && !self.node.is_up() {
            self.restart_at_ms = Some(self.now_ms);
        }
    }

    fn draw_crash_kind(&mut self) -> CrashKind {
        if self.rng.chance(self.swarm.process_crash_per_mille, 1000) {
            CrashKind::Process
        } else {
            CrashKind::Power
        }
    }

    /// A random crash of the given kind, now.
    fn crash_now(&mut self, kind: CrashKind) {
        let down_ms = 1 + self.rng.below(self.swarm.down_ms_max);
        self.record(format!("crash ({kind:?}), down {down_ms} ms"));
        self.crash(down_ms, kind);
    }

    /// Schedules a crash after each failed sync (if the swarm says so), and strikes the
    /// scheduled crash when its time comes.
    fn strike_scheduled_crash(&mut self) {
        let failed_syncs = self.node.storage.failed_sync_count();
        if failed_syncs > self.failed_syncs_seen {
            self.failed_syncs_seen = failed_syncs;
            if self.swarm.crash_after_sync_failure && self.crash_at_ms.is_none() {
                let at_ms = self.now_ms + self.rng.below(50);
                self.crash_at_ms = Some((at_ms, CrashKind::Process));
            }
        }
        if let Some((at_ms, kind)) = self.crash_at_ms
            && self.now_ms >= at_ms
        {
            self.crash_at_ms = None;
            if self.node.is_up() {
                self.crash_now(kind);
            }
        }
    }

    fn crash(&mut self, down_ms: u64, kind: CrashKind) {
        // A node restarts on a flipped bit (a sealed segment opens by its intact trailer and
        // refuses the damaged frame; an active one keeps the damage and refuses past it). A
        // cut is repaired first: restarting on a sealed segment without its trailer is future
        // work (a replica would supply the segment).
        if self.damage.as_ref().is_some_and(|damage| matches!(damage.how, DamageKind::Cut { .. })) {
            self.repair_damage();
        }
        self.count_checkpoints();
        self.stats.crashes += 1;
        if kind == CrashKind::Process {
            self.stats.process_crashes += 1;
        }
        self.down_kind = kind;
        self.node.crash(&self.net);
        *self.ctx.broker.lock().expect("broker lock poisoned") = None;
        self.restart_at_ms = Some(self.now_ms + down_ms);
    }

    fn restart(&mut self) {
        self.restart_at_ms = None;
        match self.down_kind {
            CrashKind::Power => self.node.storage.restart(),
            CrashKind::Process => self.node.storage.restart_process(),
        }
        if let Err(error) = self.boot() {
            self.record(format!("boot failed: {}", reason_name(&error)));
            if self.faults_on {
                // A full or failing disk may keep a node down; it tries again later.
                self.node.storage.crash_now();
                self.down_kind = CrashKind::Process;
                self.restart_at_ms = Some(self.now_ms + 200);
            } else {
                self.findings.push(format!("the node did not restart on a healthy disk: {error}"));
            }
        }
    }

    /// Segments of the workload topics, sealed or active, with their sealed data size.
    fn workload_segments(&self) -> Vec<(SegmentKey, Option<u64>)> {
        let Some(broker) = self.node.broker() else { return Vec::new() };
        let mut segments = Vec::new();
        for name in [ORDERS, EVENTS] {
            broker.read_meta_named(name, |meta| {
                let Some(topic) = meta.topic_by_name(name) else { return };
                for &range_id in topic.ranges.keys() {
                    for segment in meta.range_segments(topic.topic_id, range_id) {
                        let segment_id = segment.segment_id;
                        let key = SegmentKey { topic_id: topic.topic_id, range_id, segment_id };
                        segments.push((key, segment.sealed_length().map(|(_, bytes)| bytes)));
                    }
                }
            });
        }
        segments
    }

    /// Flips a bit in, or cuts, the frames of a random sealed segment of a workload topic.
    fn damage_sealed_segment(&mut self) {
        let header_bytes = malachi_log::format::SEGMENT_HEADER_BYTES;
        let sealed: Vec<(SegmentKey, u64)> = self
            .workload_segments()
            .into_iter()
            .filter_map(|(key, sealed)| {
                sealed.filter(|&bytes| bytes > header_bytes).map(|b| (key, b))
            })
            .collect();
        if sealed.is_empty() {
            return;
        }
        let (key, data_bytes) = sealed[self.rng.below(sealed.len() as u64) as usize];
        let position = header_bytes + self.rng.below(data_bytes - header_bytes);
        if self.rng.chance(1, 2) {
            let path = self.segment_path(key);
            let Some(original) = self.node.storage.written_bytes(&path) else { return };
            if self.node.storage.truncate(&path, position).is_ok() {
                self.note_damage(key, path, DamageKind::Cut { original, position }, "cut");
            }
        } else {
            self.flip(key, position, "flip");
        }
    }

    /// Flips a bit among an active segment's durable records, before the start of its last
    /// durable write, so recovery can prove the damage is not a torn write; then crashes the
    /// node soon, so recovery meets it. Damage inside the last write is indistinguishable from
    /// a torn write and is not injected (docs/storage-format.md says why).
    fn damage_active_segment(&mut self) {
        let active: Vec<SegmentKey> = self
            .workload_segments()
            .into_iter()
            .filter(|(_, sealed)| sealed.is_none())
            .map(|(key, _)| key)
            .collect();
        if active.is_empty() {
            return;
        }
        let key = active[self.rng.below(active.len() as u64) as usize];
        let path = self.segment_path(key);
        let Some(durable) = self.node.storage.durable_bytes(&path) else { return };
        let Some(last_write) = last_write_start(&durable) else { return };
        let header_bytes = malachi_log::format::SEGMENT_HEADER_BYTES;
        let position = header_bytes + self.rng.below(last_write - header_bytes);
        if self.flip(key, position, "flip active") {
            let at_ms = self.now_ms + 10 + self.rng.below(90);
            let kind = self.draw_crash_kind();
            self.crash_at_ms.get_or_insert((at_ms, kind));
        }
    }

    fn flip(&mut self, key: SegmentKey, position: u64, what: &str) -> bool {
        let path = self.segment_path(key);
        let bit = self.rng.below(8) as u8;
        let Some(healthy) = self.durable_byte(&path, position) else { return false };
        if self.node.storage.flip_bit(&path, position, bit).is_err() {
            return false;
        }
        self.note_damage(key, path, DamageKind::Flip { position, bit, healthy }, what);
        true
    }

    fn durable_byte(&self, path: &Path, position: u64) -> Option<u8> {
        self.node.storage.durable_bytes(path)?.get(usize::try_from(position).ok()?).copied()
    }

    fn segment_path(&self, key: SegmentKey) -> PathBuf {
        let dir = self.node.data_dir.join("topics");
        let dir = dir.join(key.topic_id.to_string()).join(key.range_id.to_string());
        malachi_log::segment_paths(&dir, key.segment_id).0
    }

    fn note_damage(&mut self, key: SegmentKey, path: PathBuf, how: DamageKind, what: &str) {
        let (DamageKind::Cut { position, .. } | DamageKind::Flip { position, .. }) = &how;
        let where_ = format!("{}/{}/{}", key.topic_id, key.range_id, key.segment_id);
        self.record(format!("damage: {what} segment {where_} at byte {position}"));
        let until_ms = self.now_ms + self.swarm.damage_ms;
        self.damage = Some(Damage { how, key, path, until_ms });
    }

    /// Undoes the damage (as re-replication from a healthy copy would), unless retention
    /// deleted the segment meanwhile, and makes the node open it afresh if its open handle saw
    /// the damage. A healthy active handle is left alone: the repair is visible to it, and a
    /// second handle on a file that takes appends must never exist.
    fn repair_damage(&mut self) {
        let Some(damage) = self.damage.take() else { return };
        let restored = match &damage.how {
            DamageKind::Cut { original, .. } => self.node.storage.restore(&damage.path, original),
            DamageKind::Flip { position, bit, healthy } => {
                match self.durable_byte(&damage.path, *position) {
                    Some(byte) if byte != *healthy => {
                        self.node.storage.flip_bit(&damage.path, *position, *bit)
                    }
                    Some(_) => Ok(()),
                    None => Err(std::io::ErrorKind::NotFound.into()),
                }
            }
        };
        if let Some(broker) = self.node.broker() {
            let segment_id = damage.key.segment_id;
            let sealed = broker.read_meta(segment_id, |meta| {
                meta.segment(segment_id).is_none_or(|segment| !segment.is_active())
            });
            let data = broker.data_plane();
            let status = data.peek(damage.key).map(|segment| segment.status());
            let takes_appends =
                status.is_some_and(|status| status.sealed.is_none() && status.damage.is_none());
            if sealed || !takes_appends {
                data.forget(damage.key);
            }
        }
        self.record(format!(
            "damage repaired ({})",
            if restored.is_ok() { "restored" } else { "gone" }
        ));
    }

    fn boot(&mut self) -> Result<(), String> {
        self.node.boot(Arc::clone(&self.clock), &self.net)?;
        *self.ctx.broker.lock().expect("broker lock poisoned") = self.node.broker();
        self.record(format!("boot {}", self.node.incarnation));
        Ok(())
    }

    /// Produces one record through the log API on the healed node: a run must end with at least
    /// one acknowledged write, or it proves nothing (and a node that acknowledges nothing once
    /// every fault is lifted is broken).
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
        for attempt in 0..3 {
            let op = Op::Produce(Produce {
                topic: topic.to_string(),
                records: vec![record.clone()],
                retry_of,
            });
            let Some(broker) = self.node.broker() else { break };
            let op_id = self.history_mut(|history| history.invoke(FINAL_PRODUCER, op));
            retry_of.get_or_insert(op_id);
            let future = workload::produce_on_node(broker, topic.to_string(), record.clone());
            let Some(task) = self.node.spawn(future) else { break };
            let mut waited = 0;
            while !task.is_finished() && waited < HEAL_TICKS_MAX {
                self.tick();
                waited += 1;
            }
            let result = if task.is_finished() {
                self.clients.block_on(task).unwrap_or_else(|error| Err(error.to_string()))
            } else {
                Err("the produce did not finish".to_string())
            };
            match result {
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
        self.findings.push(format!("the healed node refused a produce to {topic} three times"));
    }

    /// Reads `topic` whole through the log API on the node (which reports retention's skipped
    /// count) as the topic's final drain.
    fn final_drain(&mut self, topic: &str) {
        let op = |records, skipped| Op::Drain(Drain { topic: topic.to_string(), records, skipped });
        for _attempt in 0..3 {
            let Some(broker) = self.node.broker() else { break };
            let op_id = self.history_mut(|history| history.invoke(0, op(Vec::new(), 0)));
            let Some(task) = self.node.spawn(workload::drain_on_node(broker, topic.to_string()))
            else {
                break;
            };
            let mut waited = 0;
            while !task.is_finished() && waited < HEAL_TICKS_MAX {
                self.tick();
                waited += 1;
            }
            let result = if task.is_finished() {
                self.clients.block_on(task).unwrap_or_else(|error| Err(error.to_string()))
            } else {
                Err("the drain did not finish".to_string())
            };
            match result {
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
        self.findings.push(format!("the final drain of {topic} failed three times"));
    }

    fn history_mut<T>(&self, change: impl FnOnce(&mut History) -> T) -> T {
        change(&mut self.ctx.history.lock().expect("history lock poisoned"))
    }

    fn record(&mut self, line: String) {
        self.trace.push(format!("{} {line}", self.now_ms));
    }

    /// Adds the running incarnation's journal checkpoints to the run's.
    fn count_checkpoints(&mut self) {
        if let Some(broker) = self.node.broker() {
            self.stats.checkpoints += broker.data_plane().commit_stats().checkpoints;
        }
    }

    fn finish(mut self) -> RunOutcome {
        self.count_checkpoints();
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
            // A run in which nothing was acknowledged cannot lose anything: it proves nothing.
            self.findings.push("no produce was acknowledged".to_string());
        }
        let report = history.check();
        let notes = self.ctx.notes.lock().expect("notes lock poisoned").clone();
        let trace_hash = trace_hash(&self.trace, &notes, &history);
        let swarm = format!("{:?}", self.swarm);
        // The node's tasks go before the clients' runtime, which may hold its last handles.
        self.node.crash(&self.net);
        RunOutcome {
            seed: self.options.seed,
            trace_hash,
            report,
            findings: self.findings,
            stats: self.stats,
            swarm,
            history,
            trace: self.trace.into_iter().chain(notes).collect(),
        }
    }
}

/// The hash of a run: its trace, its notes and every history event.
pub(crate) fn trace_hash(trace: &[String], notes: &[String], history: &History) -> u64 {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    for line in trace.iter().chain(notes.iter()) {
        hasher.update(line.as_bytes());
        hasher.update(b"\n");
    }
    for event in history.events() {
        hasher.update(&serde_json::to_vec(event).expect("events serialize"));
    }
    hasher.digest()
}

/// Where the last write that a valid frame shows began (a frame with the batch-start flag),
/// scanning from the header; `None` if no write after the first one is intact.
fn last_write_start(bytes: &[u8]) -> Option<u64> {
    use malachi_log::format::{FrameKind, SEGMENT_HEADER_BYTES, check_frame};
    let mut position = SEGMENT_HEADER_BYTES as usize;
    let mut last = None;
    while position < bytes.len() {
        let Ok(frame) = check_frame(&bytes[position..]) else { break };
        if let FrameKind::Record { batch_start: true, .. } = frame.kind
            && position > SEGMENT_HEADER_BYTES as usize
        {
            last = Some(position as u64);
        }
        position += frame.frame_bytes as usize;
    }
    last
}

/// The first word of an error text (a reason name), so that detail text with addresses or
/// counts never enters the trace.
pub(crate) fn reason_name(text: &str) -> String {
    text.split([':', ' ']).next().unwrap_or("").to_string()
}
