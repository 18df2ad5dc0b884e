//! The chaos drill on containers: three brokers of the image `scripts/build-image` makes (from
//! the binary under test), on a Docker network of their own, under keyed produce load through
//! every broker, while a schedule drawn from one seed fails them one at a time the ways
//! containers fail:
//!
//! * `docker kill` (SIGKILL), then `docker start` on the same volume;
//! * `docker pause` (the cgroup frozen: sockets open, nothing answered), then `unpause`;
//! * `docker network disconnect` (cut off from brokers and clients alike), then `connect`;
//! * `docker stop` (SIGTERM: the hand-over), then `docker start`;
//!
//! and the whole cluster, broker after broker, as operators change it:
//!
//! * a rolling restart (`docker stop`, then `docker start`, each broker once, the next only
//!   when the last is back);
//! * an upgrade: each container stopped, removed and run again from the other release's image
//!   on the same volume. With `MALACHI_DRILL_OLD_BIN` (a binary of an earlier release) the
//!   cluster starts on that release, the drill's first event upgrades it to the binary under
//!   test, later ones roll it back and forward again, and it ends on the binary under test;
//!   without it both images hold the binary under test (a re-creation, as a new image is
//!   deployed). Every drill's first event is an upgrade.
//!
//! For each event, and each broker of a whole-cluster one, it prints the longest any producer
//! waited for an acknowledgement; at the end every acknowledged record must read back through
//! every broker, each key in order.
//!
//! CI runs a short drill (`MALACHI_CONTAINER_DRILL_SECS`, 30 s by default); the long one is a
//! documented command of at least 100 events (docs/testing.md, "The chaos drill on containers"):
//!
//! ```sh
//! MALACHI_CONTAINER_DRILL_SECS=1200 cargo nextest run -p malachi --test containers --no-capture
//! MALACHI_DRILL_OLD_BIN=/path/to/old/malachi MALACHI_CONTAINER_DRILL_SECS=600 \
//!     cargo nextest run -p malachi --test containers --no-capture
//! ```
//!
//! `MALACHI_DRILL_SEED` replays a schedule; `MALACHI_DRILL_LOGS=DIR` keeps each broker's log
//! there (`brokerN.log`, every container it ran in, appended), and `RUST_LOG` is passed to the
//! brokers. Needs a Docker engine and
//! `objcopy` (binutils).

mod common;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use common::drill::{self, Schedule, longest_gap_in, setting};
use common::load::{Load, assert_read_back};

const ADMIN_PASSWORD: &str = "admin-password-long";
const TOKEN: &str = "container-drill-token-0123456789abcdef";
const BROKERS: usize = 3;
const TOPICS: [&str; 2] = ["boxed1", "boxed2"];
const DRILL_SECS_DEFAULT: u64 = 30;
/// How long a fault is held, and the quiet after it, in milliseconds.
const HOLD_MS: std::ops::Range<u64> = 500..5_000;
const QUIET_MS: std::ops::Range<u64> = 1_000..3_000;
/// How long the cluster may take to be whole again after the schedule, in seconds.
const CONVERGE_S: u64 = 120;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    Kill,
    Pause,
    Disconnect,
    Restart,
    /// Every broker in turn: stopped with SIGTERM and started again.
    RollingRestart,
    /// Every broker in turn: stopped with SIGTERM and run again from the other image.
    Upgrade,
}

const FAULTS: [Fault; 6] = [
    Fault::Kill,
    Fault::Pause,
    Fault::Disconnect,
    Fault::Restart,
    Fault::RollingRestart,
    Fault::Upgrade,
];

/// How long `docker stop` lets a broker hand its work over before it kills it, in seconds:
/// longer than the broker's own shutdown deadline (`MALACHI_SHUTDOWN_TIMEOUT_MS`).
const STOP_TIMEOUT_S: &str = "40";

/// Runs `docker` with `args`; its standard output, or a panic with its standard error.
fn docker(args: &[&str]) -> String {
    let output = Command::new("docker").args(args).output().expect("docker is installed");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "docker {args:?}: {stderr}");
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// The drill's containers, network, volumes and image, removed when it ends (passed or not).
struct Cluster {
    prefix: String,
    /// The images of the two releases: `[earlier, under test]` (the same binary in both when no
    /// earlier one is given).
    images: [String; 2],
    /// Which of `images` each broker runs.
    release: Vec<std::cell::Cell<usize>>,
    network: String,
    /// `10.x.y.` of the network: broker `i` (from 0) is `.(11 + i)`.
    subnet: String,
}

impl Cluster {
    fn create() -> Cluster {
        remove_leftovers();
        let id = std::process::id();
        let prefix = format!("malachi-drill-{id}");
        let under_test = env!("CARGO_BIN_EXE_malachi").to_string();
        let earlier = std::env::var("MALACHI_DRILL_OLD_BIN").unwrap_or(under_test.clone());
        let images = [format!("{prefix}:earlier"), format!("{prefix}:test")];
        build_image(&images[0], &earlier);
        build_image(&images[1], &under_test);
        let release = (0..BROKERS).map(|_| std::cell::Cell::new(0)).collect();
        let subnet = format!("10.{}.{}.", 100 + id % 100, (id / 100) % 250);
        let network = format!("{prefix}-net");
        let cluster = Cluster { prefix, images, release, network, subnet };
        let range = format!("--subnet={}0/24", cluster.subnet);
        docker(&["network", "create", &range, &cluster.network]);
        cluster
    }

    fn name(&self, broker: usize) -> String {
        format!("{}-{}", self.prefix, broker + 1)
    }

    fn ip(&self, broker: usize) -> String {
        format!("{}{}", self.subnet, 11 + broker)
    }

    fn address(&self, broker: usize) -> String {
        format!("{}:4040", self.ip(broker))
    }

    fn run(&self, broker: usize) {
        let env = |name: &str, value: &str| ["--env".to_string(), format!("{name}={value}")];
        let mut args: Vec<String> = ["run", "--detach", "--name", &self.name(broker)]
            .into_iter()
            .map(str::to_string)
            .collect();
        args.extend(["--network".into(), self.network.clone(), "--ip".into(), self.ip(broker)]);
        args.extend(["--volume".into(), format!("{}:/data", self.name(broker))]);
        args.extend(env("MALACHI_CLUSTER_TOKEN", TOKEN));
        args.extend(env("MALACHI_ADMIN_PASS", ADMIN_PASSWORD));
        args.extend(env("MALACHI_CLUSTER_PORT", "4042"));
        args.extend(env("MALACHI_NODE_ID", &(broker + 1).to_string()));
        args.extend(env("MALACHI_ADVERTISE_HOST", &self.ip(broker)));
        args.extend(env("MALACHI_AUTO_SPLIT_ENABLED", "false"));
        if let Ok(filter) = std::env::var("RUST_LOG") {
            args.extend(env("RUST_LOG", &filter));
        }
        if broker > 0 {
            args.extend(env("MALACHI_LOG_NODES", &format!("{}:4042", self.ip(0))));
        }
        args.push(self.images[self.release[broker].get()].clone());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        docker(&args);
    }

    /// Stops `broker` with SIGTERM, removes its container and runs it again from the other
    /// release's image on the same volume.
    fn replace(&self, broker: usize) {
        let name = self.name(broker);
        docker(&["stop", "--time", STOP_TIMEOUT_S, &name]);
        self.keep_log(broker);
        docker(&["rm", &name]);
        self.release[broker].set(1 - self.release[broker].get());
        self.run(broker);
    }

    fn inflict(&self, broker: usize, fault: Fault) {
        let name = self.name(broker);
        match fault {
            Fault::Kill => docker(&["kill", &name]),
            Fault::Pause => docker(&["pause", &name]),
            Fault::Disconnect => docker(&["network", "disconnect", &self.network, &name]),
            Fault::Restart | Fault::RollingRestart => {
                docker(&["stop", "--time", STOP_TIMEOUT_S, &name])
            }
            Fault::Upgrade => {
                self.replace(broker);
                String::new()
            }
        };
    }

    fn undo(&self, broker: usize, fault: Fault) {
        let name = self.name(broker);
        match fault {
            Fault::Kill | Fault::Restart | Fault::RollingRestart => docker(&["start", &name]),
            Fault::Upgrade => String::new(),
            Fault::Pause => docker(&["unpause", &name]),
            Fault::Disconnect => {
                docker(&["network", "connect", "--ip", &self.ip(broker), &self.network, &name])
            }
        };
    }

    /// With `MALACHI_DRILL_LOGS=DIR`, appends the log of `broker`'s container to
    /// `DIR/brokerN.log` (before the container is removed, so a log outlives its upgrades).
    fn keep_log(&self, broker: usize) {
        let Some(dir) = std::env::var_os("MALACHI_DRILL_LOGS").map(std::path::PathBuf::from) else {
            return;
        };
        let logs =
            Command::new("docker").args(["logs", "--timestamps", &self.name(broker)]).output();
        let Ok(logs) = logs else { return };
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join(format!("broker{}.log", broker + 1));
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path);
        if let Ok(mut file) = file {
            use std::io::Write;
            let _ = file.write_all(&logs.stderr);
        }
    }

    async fn admin(&self, broker: usize) -> malachi_client::Client {
        common::connect_to(&self.address(broker), "admin", ADMIN_PASSWORD)
            .await
            .unwrap_or_else(|error| panic!("broker {}: {error}", broker + 1))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let quiet = |args: &[&str]| {
            let _ = Command::new("docker").args(args).output();
        };
        for broker in 0..BROKERS {
            let name = self.name(broker);
            self.keep_log(broker);
            if std::thread::panicking() {
                let logs = Command::new("docker").args(["logs", "--tail", "60", &name]).output();
                if let Ok(logs) = logs {
                    eprintln!("--- {name}\n{}", String::from_utf8_lossy(&logs.stderr));
                }
            }
            quiet(&["rm", "--force", &name]);
            quiet(&["volume", "rm", "--force", &name]);
        }
        quiet(&["network", "rm", &self.network]);
        for image in &self.images {
            quiet(&["image", "rm", "--force", image]);
        }
    }
}

/// Builds the image `tag` around `binary` with `scripts/build-image`.
fn build_image(tag: &str, binary: &str) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/build-image");
    let built = Command::new("bash")
        .arg(script)
        .arg(tag)
        .env("MALACHI_BIN", binary)
        .output()
        .expect("bash runs scripts/build-image");
    let stderr = String::from_utf8_lossy(&built.stderr);
    assert!(built.status.success(), "scripts/build-image {binary}: {stderr}");
}

/// Removes what an earlier drill left when its process was killed (a test runner's timeout) and
/// its `Drop` never ran: every `malachi-drill-<pid>` container, volume, network and image whose
/// process is gone.
fn remove_leftovers() {
    let gone = |name: &str| {
        let pid =
            name.strip_prefix("malachi-drill-").and_then(|rest| rest.split(['-', ':']).next());
        pid.is_some_and(|pid| !std::path::Path::new("/proc").join(pid).exists())
    };
    let list = |args: &[&str]| -> Vec<String> {
        docker(args).lines().map(str::to_string).filter(|name| gone(name)).collect()
    };
    for name in list(&["ps", "--all", "--format", "{{.Names}}"]) {
        docker(&["rm", "--force", &name]);
    }
    for name in list(&["volume", "ls", "--quiet"]) {
        docker(&["volume", "rm", "--force", &name]);
    }
    for name in list(&["network", "ls", "--format", "{{.Name}}"]) {
        docker(&["network", "rm", &name]);
    }
    for name in list(&["image", "ls", "--format", "{{.Repository}}:{{.Tag}}"]) {
        docker(&["image", "rm", "--force", &name]);
    }
}

/// One fault of one broker, from when it was inflicted until the broker was back.
struct Event {
    fault: Fault,
    broker: usize,
    begun: Instant,
    /// When the fault was undone (the container started, unpaused, connected again).
    undone: Instant,
    ended: Instant,
}

/// Inflicts `fault` on `broker`, holds it for `hold`, undoes it, and waits until the broker is
/// back in the cluster as every broker sees it and ready (the event lasts until then).
async fn strike(
    cluster: &Cluster,
    broker: usize,
    fault: Fault,
    hold: Duration,
    everyone: &[u64],
) -> Event {
    let begun = Instant::now();
    cluster.inflict(broker, fault);
    tokio::time::sleep(hold).await;
    cluster.undo(broker, fault);
    let undone = Instant::now();
    let back = cluster.admin(broker).await;
    common::cluster_ready(std::slice::from_ref(&back), everyone).await;
    // As an operator's rolling restart does (docs/operations.md), the next event only once the
    // broker answers `/ready`: its metadata caught up, not only seen alive.
    common::until_ready(&format!("{}:4041", cluster.ip(broker)), CONVERGE_S).await;
    if fault == Fault::Upgrade {
        eprintln!(
            "  broker {} now runs {}",
            broker + 1,
            cluster.images[cluster.release[broker].get()]
        );
    }
    Event { fault, broker, begun, undone, ended: Instant::now() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_container_chaos_drill_loses_nothing() {
    let drill = Duration::from_secs(setting("MALACHI_CONTAINER_DRILL_SECS", DRILL_SECS_DEFAULT));
    let seed = drill::seed();
    eprintln!("container drill: seed {seed} (MALACHI_DRILL_SEED replays it), {drill:?}");
    let mut schedule = Schedule::new(seed);
    let cluster = Cluster::create();
    for broker in 0..BROKERS {
        cluster.run(broker);
    }
    let mut admins = Vec::new();
    for broker in 0..BROKERS {
        admins.push(cluster.admin(broker).await);
    }
    let everyone: Vec<u64> = (1..=BROKERS as u64).collect();
    common::cluster_ready(&admins, &everyone).await;
    for topic in TOPICS {
        common::network::eventually("the topic is created", 30, || async {
            match admins[0].create_topic_with_ranges(topic, 2).await {
                Ok(_) => Ok(()),
                Err(error) if error.reason() == Some(malachi_client::Reason::AlreadyExists) => {
                    Ok(())
                }
                Err(error) => Err(error.to_string()),
            }
        })
        .await;
    }
    let addresses: Vec<String> = (0..BROKERS).map(|broker| cluster.address(broker)).collect();
    let load = Load::start_with(&addresses, &TOPICS, 2 * BROKERS, ADMIN_PASSWORD, 1_024);

    let started = Instant::now();
    let mut events: Vec<Event> = Vec::new();
    while started.elapsed() < drill {
        let fault = if events.is_empty() {
            Fault::Upgrade
        } else {
            FAULTS[schedule.below(FAULTS.len() as u64) as usize]
        };
        eprintln!(
            "t+{:.1}s {fault:?} ({} acknowledged so far)",
            started.elapsed().as_secs_f64(),
            load.acked_count()
        );
        if matches!(fault, Fault::RollingRestart | Fault::Upgrade) {
            for broker in 0..BROKERS {
                events.push(strike(&cluster, broker, fault, Duration::ZERO, &everyone).await);
            }
        } else {
            let broker = schedule.below(BROKERS as u64) as usize;
            let hold = Duration::from_millis(schedule.within(HOLD_MS));
            eprintln!("  broker {} for {hold:?}", broker + 1);
            events.push(strike(&cluster, broker, fault, hold, &everyone).await);
        }
        tokio::time::sleep(Duration::from_millis(schedule.within(QUIET_MS))).await;
    }
    // The cluster ends on the build under test (an even number of upgrades left it rolled back).
    for broker in 0..BROKERS {
        if cluster.release[broker].get() == 0 {
            events.push(strike(&cluster, broker, Fault::Upgrade, Duration::ZERO, &everyone).await);
        }
    }

    let mut clients = Vec::new();
    for broker in 0..BROKERS {
        clients.push(cluster.admin(broker).await);
    }
    common::cluster_ready(&clients, &everyone).await;
    for (broker, client) in clients.iter().enumerate() {
        common::network::eventually("produce through every broker", CONVERGE_S, || async {
            let record = malachi_client::RecordBuilder::new(format!("after/{broker}=0")).build();
            let topic = TOPICS[broker % TOPICS.len()];
            client.produce(topic, vec![record]).await.map(drop).map_err(|e| e.to_string())
        })
        .await;
    }
    let producer_acks = load.producer_acks();
    let (acked, acked_at) = load.stop().await;
    let total: usize = acked.values().map(Vec::len).sum();
    assert!(total > 0, "nothing was acknowledged");
    for broker in 0..BROKERS {
        assert_read_back(&cluster.admin(broker).await, &TOPICS, &acked).await;
    }
    // Per event: the longest the load as a whole went without an acknowledgement, and the
    // longest any one producer waited (one connected to the failed broker waits until its
    // request fails or is answered, then moves on to another broker).
    let mut stalls: BTreeMap<Fault, Vec<(u128, u128)>> = BTreeMap::new();
    let any_producer = |window: (Instant, Instant)| {
        let gaps = producer_acks.values().map(|times| longest_gap_in(times, window));
        gaps.max().unwrap_or_default()
    };
    for Event { fault, broker, begun, undone, ended } in &events {
        let whole = longest_gap_in(&acked_at, (*begun, *ended));
        let any = any_producer((*begun, *ended));
        // Which half of the event the waits fell in: while the broker was away, or while it
        // came back.
        let (away, back) = ((*begun, *undone), (*undone, *ended));
        eprintln!(
            "{fault:?} broker {}: the load waited {whole:?} at most ({:?} while away, {:?} coming \
             back), one producer {any:?} ({:?} away, {:?} back)",
            broker + 1,
            longest_gap_in(&acked_at, away),
            longest_gap_in(&acked_at, back),
            any_producer(away),
            any_producer(back),
        );
        stalls.entry(*fault).or_default().push((whole.as_millis(), any.as_millis()));
    }
    eprintln!(
        "container drill seed {seed}: {} events over {drill:?}; {total} records acknowledged, all \
         read back in order through every broker; per event (the load's longest wait, one \
         producer's longest wait) in ms by fault: {stalls:?}",
        events.len()
    );
}
