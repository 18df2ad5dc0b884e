//! The chaos drill: brokers on hosts of their own (network namespaces, as `partition.rs`) under
//! produce load through every broker, while a schedule drawn from one seed keeps failing them,
//! one fault at a time, each held for a while and then undone:
//!
//! * kill -9, then a restart on the same data directory;
//! * SIGSTOP, then SIGCONT (a stalled process whose sockets stay open);
//! * a cut from the other brokers, both ways (clients still reach it);
//! * a one-way cut: the broker hears nothing from the others while they still hear it;
//!
//! and, beside the faults, splits and merges of the topics' ranges through any broker. When the
//! schedule ends every fault is undone and the drill checks what a user would:
//!
//! * produce is acknowledged again through every broker;
//! * every broker converges: all alive, every Raft group led, every sealed segment settled on
//!   each of its copies, every active one's primary answering;
//! * every acknowledged record reads back through every broker, each key in the order it was
//!   produced.
//!
//! CI runs a short drill (`MALACHI_DRILL_SECS`, 40 s by default). The long one is a documented
//! command (docs/testing.md, "The chaos drill"):
//!
//! ```sh
//! MALACHI_DRILL_SECS=1800 cargo nextest run -p malachi --test chaos --no-capture
//! ```
//!
//! `MALACHI_DRILL_SEED` replays a schedule (the processes' own timing still differs run to run);
//! `MALACHI_DRILL_BROKERS` (3 to 5) sets the cluster's size.
//!
//! Needs root (CAP_NET_ADMIN), `ip` (iproute2) and `nft` (nftables); `.ci/run` installs them.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::drill::{self, Schedule, setting};
use common::load::{Load, assert_read_back};
use common::network::{Brokers, Cut, Network, eventually, reports};
use malachi_client::{Client, RangeDescription, RangeState, SegmentState};

const ADMIN_PASSWORD: &str = "admin-password-long";
const DRILL_SECS_DEFAULT: u64 = 40;
const TOPICS: [&str; 3] = ["chaos1", "chaos2", "chaos3"];
/// Splits stop once a topic has this many active ranges; merges take it back down.
const ACTIVE_RANGES_MAX: usize = 8;
/// How long a fault is held, and the quiet after it, in milliseconds: from the low end (a blip
/// membership never notices) to beyond the 3 s after which a silent link is given up on.
const HOLD_MS: std::ops::Range<u64> = 500..6_000;
const QUIET_MS: std::ops::Range<u64> = 300..3_000;
/// The bounds of convergence once the schedule ends, in seconds.
const CONVERGE_S: u64 = 120;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    Kill,
    Pause,
    Isolate,
    Deafen,
    /// Cut off both ways for long ([`AWAY_MS`]): its followers fall behind across many
    /// replication windows and catch up from the files once back; heads created meanwhile are
    /// placed on the other brokers and must grow back to three copies.
    Away,
}

const FAULTS: [Fault; 5] = [Fault::Kill, Fault::Pause, Fault::Isolate, Fault::Deafen, Fault::Away];

/// The brokers' replication factor (the default).
const REPLICATION_FACTOR: usize = 3;

/// How long an [`Fault::Away`] lasts.
const AWAY_MS: std::ops::Range<u64> = 8_000..20_000;

/// Each record's value, at least: over 1 KiB, so a catch-up span read from a file (4 MiB at
/// most) carries fewer records than it covers, as the issue 25 wedge needed.
const VALUE_BYTES: usize = 1_536;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chaos_drill_loses_nothing_and_converges() {
    let drill = Duration::from_secs(setting("MALACHI_DRILL_SECS", DRILL_SECS_DEFAULT));
    let hosts = setting("MALACHI_DRILL_BROKERS", 3).clamp(3, 5) as usize;
    let seed = drill::seed();
    eprintln!(
        "chaos drill: seed {seed} (MALACHI_DRILL_SEED replays it), {hosts} brokers, {drill:?}"
    );
    let mut schedule = Schedule::new(seed);

    let network = Network::create(hosts);
    // Kept when the drill fails, with each broker's log (`n1/broker.log`...).
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("chaos-{seed}-{}", std::process::id()));
    eprintln!("chaos drill: brokers under {}", dir.display());
    let mut brokers = network.start_brokers(&dir);
    let memory = MemoryWatch::start(&dir);
    let everyone: Vec<u64> = (1..=hosts as u64).collect();
    let mut admins = Vec::new();
    for host in 0..hosts {
        admins.push(brokers.admin(host, ADMIN_PASSWORD).await);
    }
    common::cluster_ready(&admins, &everyone).await;
    let first = admins.swap_remove(0);
    for topic in TOPICS {
        eventually("the topic is created", 15, || async {
            match first.create_topic_with_ranges(topic, 2).await {
                Ok(_) => Ok(()),
                Err(error) if error.reason() == Some(malachi_client::Reason::AlreadyExists) => {
                    Ok(())
                }
                Err(error) => Err(error.to_string()),
            }
        })
        .await;
    }
    let addresses: Vec<String> =
        brokers.processes.iter().map(|process| process.address()).collect();
    let load = Load::start_with(&addresses, &TOPICS, 2 * hosts, ADMIN_PASSWORD, VALUE_BYTES);
    let reshaper = Reshaper::start(addresses.clone(), schedule.next());

    let started = Instant::now();
    let mut held: BTreeMap<Fault, usize> = BTreeMap::new();
    while started.elapsed() < drill {
        let fault = FAULTS[schedule.below(FAULTS.len() as u64) as usize];
        let host = schedule.below(hosts as u64) as usize;
        let hold_ms = if fault == Fault::Away { AWAY_MS } else { HOLD_MS };
        let hold = Duration::from_millis(schedule.within(hold_ms));
        eprintln!(
            "t+{:.1}s {fault:?} broker {} for {hold:?} ({} acknowledged so far)",
            started.elapsed().as_secs_f64(),
            host + 1,
            load.acked_count()
        );
        inflict(&network, &mut brokers, host, fault);
        tokio::time::sleep(hold).await;
        undo(&network, &mut brokers, host, fault);
        *held.entry(fault).or_default() += 1;
        tokio::time::sleep(Duration::from_millis(schedule.within(QUIET_MS))).await;
        memory.check();
    }
    let schedule_ended = Instant::now();
    let reshapes = reshaper.stop().await;
    eprintln!(
        "t+{:.1}s schedule over: {held:?}; reshaping {reshapes:?}",
        started.elapsed().as_secs_f64()
    );
    let phase = |what: &str| {
        eprintln!("t+{:.1}s {what}", started.elapsed().as_secs_f64());
    };

    // Produce is acknowledged again through every broker (the load's producers are spread over
    // all of them, and each must be heard from).
    let mut clients = Vec::new();
    for host in 0..hosts {
        clients.push(brokers.admin(host, ADMIN_PASSWORD).await);
    }
    for (host, client) in clients.iter().enumerate() {
        eventually("produce through every broker", CONVERGE_S, || async {
            let record = malachi_client::RecordBuilder::new(format!("after/{host}=0")).build();
            client
                .produce(TOPICS[host % TOPICS.len()], vec![record])
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        })
        .await;
        phase(&format!("produce acknowledged through broker {}", host + 1));
    }
    let (acked, acked_at) = load.stop().await;
    phase("load stopped");
    let converged = eventually("every broker converges", CONVERGE_S, || async {
        for client in &clients {
            converged(client, &everyone).await?;
        }
        Ok(())
    })
    .await;
    phase("converged");
    let recovered = schedule_ended.elapsed();
    memory.check();

    let total: usize = acked.values().map(Vec::len).sum();
    assert!(total > 0, "nothing was acknowledged");
    // Fresh connections: a broker closes one idle longer than `MALACHI_TCP_RECV_TIMEOUT`
    // (30 s), and reading everything back through one broker may take longer than that.
    for host in 0..hosts {
        assert_read_back(&brokers.admin(host, ADMIN_PASSWORD).await, &TOPICS, &acked).await;
    }
    let longest_gap = acked_at.windows(2).map(|pair| pair[1] - pair[0]).max().unwrap_or_default();
    let peaks = memory.stop();
    eprintln!(
        "chaos drill seed {seed}: {held:?} over {drill:?}; reshaping {reshapes:?}; {total} records \
         acknowledged, all read back in order through every broker; longest gap between \
         acknowledgements {longest_gap:?}; converged {converged:?} after the last fault ({recovered:?} \
         after the schedule ended); peak resident memory per broker {peaks:?} MiB"
    );
    drop(brokers);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn inflict(network: &Network, brokers: &mut Brokers, host: usize, fault: Fault) {
    match fault {
        Fault::Kill => brokers.kill(host),
        Fault::Pause => brokers.signal(host, "STOP"),
        Fault::Isolate | Fault::Away => network.cut(host, Cut::Both),
        Fault::Deafen => network.cut(host, Cut::Inbound),
    }
}

fn undo(network: &Network, brokers: &mut Brokers, host: usize, fault: Fault) {
    match fault {
        Fault::Kill => brokers.restart(host),
        Fault::Pause => brokers.signal(host, "CONT"),
        Fault::Isolate | Fault::Deafen | Fault::Away => network.heal(host),
    }
}

/// Whether `client`'s broker sees the cluster whole again: every broker alive, every Raft
/// group with a leader, every segment of the drill's topics on as many copies as the
/// replication factor asks (3, the default; segments placed while a broker was away grow
/// back), every sealed one settled on each copy, and every active segment's primary answering. (A follower's copy of an active segment may rightly
/// not answer: a restarted follower opens it only when the primary next ships records.)
async fn converged(client: &Client, everyone: &[u64]) -> Result<(), String> {
    reports(client, everyone, 0).await?;
    let status = client.cluster_status().await.map_err(|error| error.to_string())?;
    if let Some(group) = status.groups.iter().find(|group| group.leader == 0) {
        return Err(format!("group {} has no leader", group.group_id));
    }
    for topic in TOPICS {
        let described = client.describe_segments(topic).await.map_err(|e| e.to_string())?;
        for segment in &described.segments {
            let wanted = REPLICATION_FACTOR.min(everyone.len());
            if segment.copies.len() < wanted {
                return Err(format!("{topic}: fewer than {wanted} copies: {segment:?}"));
            }
            let whole = match segment.state {
                SegmentState::Sealed => segment.copies.iter().all(|copy| copy.settled),
                SegmentState::Active => segment.copies.first().is_some_and(|copy| copy.answered),
            };
            if !whole {
                return Err(format!("{topic}: {segment:?}"));
            }
        }
    }
    Ok(())
}

/// Splits and merges the drill's topics through any broker, on a schedule of its own, until
/// stopped; what the brokers answered, by outcome.
struct Reshaper {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<BTreeMap<String, usize>>,
}

impl Reshaper {
    fn start(addresses: Vec<String>, seed: u64) -> Reshaper {
        let stop: Arc<AtomicBool> = Arc::default();
        let stopped = Arc::clone(&stop);
        let task = tokio::spawn(async move {
            let mut schedule = Schedule::new(seed);
            let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
            while !stopped.load(Ordering::Relaxed) {
                let pause = schedule.within(500..2_500);
                tokio::time::sleep(Duration::from_millis(pause)).await;
                let address = &addresses[schedule.below(addresses.len() as u64) as usize];
                let topic = TOPICS[schedule.below(TOPICS.len() as u64) as usize];
                // A broker that is down or cut off makes the attempt fail: counted, not fatal.
                let outcome = match common::connect_to(address, "admin", ADMIN_PASSWORD).await {
                    Ok(client) => reshape(&client, topic, &mut schedule).await,
                    Err(_) => "no connection".to_string(),
                };
                *outcomes.entry(outcome).or_default() += 1;
            }
            outcomes
        });
        Reshaper { stop, task }
    }

    async fn stop(self) -> BTreeMap<String, usize> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

/// One split of a random active range, or, once the topic has many, one merge of a pair of
/// active buddies; the outcome in a word.
async fn reshape(client: &Client, topic: &str, schedule: &mut Schedule) -> String {
    let described = match client.describe_topic(topic).await {
        Ok(described) => described,
        Err(error) => return format!("describe: {}", error.reason_text().unwrap_or("failed")),
    };
    let active: Vec<&RangeDescription> =
        described.ranges.iter().filter(|range| range.state == RangeState::Active).collect();
    let buddies = described.ranges.iter().find_map(|parent| match parent.children[..] {
        [low, high]
            if active.iter().filter(|r| r.range_id == low || r.range_id == high).count() == 2 =>
        {
            Some((low, high))
        }
        _ => None,
    });
    let merge = active.len() >= ACTIVE_RANGES_MAX || (active.len() > 2 && schedule.below(3) == 0);
    let answer = match (merge, buddies) {
        (true, Some((low, high))) => client.merge_ranges(topic, low, high).await.map(|_| "merged"),
        _ if active.is_empty() || active.len() >= ACTIVE_RANGES_MAX => return "left alone".into(),
        _ => {
            let range = active[schedule.below(active.len() as u64) as usize].range_id;
            client.split_range(topic, range).await.map(|_| "split")
        }
    };
    match answer {
        Ok(done) => done.to_string(),
        Err(error) => error.reason_text().unwrap_or("failed").to_string(),
    }
}

/// The most resident memory a broker may hold during the drill: its topics hold a few hundred
/// MiB of records, so growth far past that is a leak or an unbounded queue (one drill saw a
/// broker grow to 19 GiB after a SIGCONT and be killed by the kernel).
const BROKER_RSS_MAX_MIB: u64 = 2_048;

/// Samples every broker's resident memory (processes whose command line names the drill's
/// directory) four times a second, keeping each broker's peak. A broker above
/// [`BROKER_RSS_MAX_MIB`] has its threads' stacks written beside its log (`n*/stacks.txt`,
/// with gdb when installed) and fails the drill at its next check.
struct MemoryWatch {
    stop: Arc<AtomicBool>,
    state: Arc<std::sync::Mutex<MemoryState>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
struct MemoryState {
    /// By broker directory name (`n1`...), in MiB.
    peaks: BTreeMap<String, u64>,
    over: Option<String>,
}

impl MemoryWatch {
    fn start(dir: &std::path::Path) -> MemoryWatch {
        let stop: Arc<AtomicBool> = Arc::default();
        let state: Arc<std::sync::Mutex<MemoryState>> = Arc::default();
        let (stopped, shared, dir) = (Arc::clone(&stop), Arc::clone(&state), dir.to_path_buf());
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                for (broker, pid, mib) in broker_memory(&dir) {
                    let mut state = shared.lock().unwrap();
                    let peak = state.peaks.entry(broker.clone()).or_default();
                    *peak = (*peak).max(mib);
                    if mib > BROKER_RSS_MAX_MIB && state.over.is_none() {
                        state.over = Some(format!("broker {broker} (pid {pid}) holds {mib} MiB"));
                        drop(state);
                        dump_stacks(pid, &dir.join(&broker).join("stacks.txt"));
                    }
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        });
        MemoryWatch { stop, state, thread: Some(thread) }
    }

    fn check(&self) {
        // Taken out before panicking, so the lock is not poisoned for the sampling thread.
        let over = self.state.lock().unwrap().over.clone();
        if let Some(over) = over {
            panic!("a broker's memory ran away: {over} (limit {BROKER_RSS_MAX_MIB} MiB)");
        }
    }

    /// Each broker's peak, in MiB.
    fn stop(mut self) -> BTreeMap<String, u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap();
        self.check();
        std::mem::take(&mut self.state.lock().unwrap().peaks)
    }
}

/// `(broker directory name, pid, resident MiB)` of every running broker under `dir`.
fn broker_memory(dir: &std::path::Path) -> Vec<(String, u32, u64)> {
    let marker = dir.to_string_lossy().into_owned();
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let command = std::fs::read(entry.path().join("cmdline")).ok()?;
            let command = String::from_utf8_lossy(&command).replace('\0', " ");
            let at = command.find(&marker)? + marker.len() + 1;
            let broker = command[at..].split('/').next()?.to_string();
            let status = std::fs::read_to_string(entry.path().join("status")).ok()?;
            let kib: u64 = status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))?
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()?;
            Some((broker, pid, kib / 1024))
        })
        .collect()
}

/// Every thread's stack of `pid` into `path`, when gdb is there to take them.
fn dump_stacks(pid: u32, path: &std::path::Path) {
    let output = std::process::Command::new("gdb")
        .args(["-batch", "-p", &pid.to_string(), "-ex", "thread apply all bt 40"])
        .output();
    if let Ok(output) = output {
        let _ = std::fs::write(path, output.stdout);
    }
}
