//! Process-level checks of the durable end: a real broker whose `fdatasync` fails once (an
//! LD_PRELOAD shim), and one that runs out of file descriptors. Acknowledged records survive,
//! the broker keeps serving, and every storage failure is in its log with its cause.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{BrokerProcess, drain, value};
use malachi_client::{Reason, RecordBuilder};

/// Builds the fdatasync-failing shim with the C compiler (gcc is on every machine of this
/// project's kind; .ci/run checks for it).
fn build_shim(dir: &Path) -> PathBuf {
    let source = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/preload/failsync.c");
    let library = dir.join("libfailsync.so");
    let output = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&library)
        .arg(source)
        .arg("-ldl")
        .output()
        .expect("a C compiler (cc) is needed to build the fdatasync shim");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    library
}

async fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Where a failed `fdatasync` strikes, and what the broker must do about it.
struct FsyncCase {
    name: &'static str,
    /// `MALACHI_GROUP_COMMIT_BARRIER`.
    barrier: &'static str,
    /// Which file's sync fails (a path suffix).
    file: &'static str,
    /// The broker stops rather than go on (it must restart to replay its journal).
    stops: bool,
}

const FSYNC_CASES: &[FsyncCase] = &[
    // The produce is refused, the segment poisons, the range rolls, producers go on.
    FsyncCase { name: "a segment, no journal", barrier: "files", file: ".seg", stops: false },
    // The round is refused, the journal is abandoned after a checkpoint, producers go on.
    FsyncCase { name: "the journal", barrier: "journal", file: "/journal", stops: false },
    // A checkpoint cannot make the files behind the journal durable: the broker stops, and
    // its restart replays the journal.
    FsyncCase {
        name: "a segment behind the journal",
        barrier: "journal",
        file: ".seg",
        stops: true,
    },
];

/// A failed `fdatasync` under load, wherever it strikes: nothing it covered is acknowledged,
/// the broker heals (or stops and heals on restart), and after a kill -9 and a restart every
/// acknowledged record is there, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fsync_is_refused_then_healed_and_nothing_acknowledged_is_lost() {
    for case in FSYNC_CASES {
        failed_fsync(case).await;
    }
}

async fn failed_fsync(case: &FsyncCase) {
    let dir = tempfile::tempdir().unwrap();
    let shim = build_shim(dir.path());
    let trigger = dir.path().join("fail-next-fsync");
    let process = BrokerProcess::new(dir.path())
        .env("LD_PRELOAD", shim.display().to_string())
        .env("FAILSYNC_TRIGGER", trigger.display().to_string())
        .env("FAILSYNC_SUFFIX", case.file)
        .env("MALACHI_GROUP_COMMIT_BARRIER", case.barrier)
        // A small journal, so that checkpoints come every few hundred records.
        .env("MALACHI_JOURNAL_BYTES", "1048576");
    let mut broker = process.spawn();
    let admin = process.connect().await;
    admin.create_topic("sync").await.unwrap();
    let load = Load::start(process.port, 2);
    wait_for("first acks", Duration::from_secs(20), || load.acked_count() > 100).await;
    std::fs::write(&trigger, b"").unwrap();
    wait_for("the failing fsync", Duration::from_secs(20), || !trigger.exists()).await;
    if case.stops {
        let stopped = || broker.try_wait().unwrap().is_some();
        wait_for("the broker to stop", Duration::from_secs(20), stopped).await;
        let log = process.log();
        assert!(log.contains("a restart replays the journal"), "{}: said why:\n{log}", case.name);
    } else {
        let refused = || load.refused.load(Ordering::SeqCst) > 0;
        wait_for("a refusal", Duration::from_secs(20), refused).await;
        let after_failure = load.acked_count();
        let healed = || load.acked_count() > after_failure + 100;
        wait_for("acks after the failure", Duration::from_secs(20), healed).await;
        let log = process.log();
        assert!(log.contains("an append failed on storage"), "{}: logged:\n{log}", case.name);
        assert!(log.contains("fdatasync failed"), "{}: with its cause:\n{log}", case.name);
    }
    let acked = load.stop().await;
    let _ = broker.kill();
    broker.wait().unwrap();

    let restarted = BrokerProcess {
        env: vec![("MALACHI_GROUP_COMMIT_BARRIER".into(), case.barrier.into())],
        ..process
    };
    let mut broker = restarted.spawn();
    let client = restarted.connect().await;
    let (everything, _) = drain(&client, "sync", None).await;
    for (key, sequences) in &acked {
        let read: Vec<u64> = everything
            .iter()
            .filter(|record| record.key.as_deref() == Some(key.as_bytes()))
            .map(|record| value(record)[key.len() + 1..].parse().unwrap())
            .collect();
        let mut acked_in_read = read.iter().filter(|sequence| sequences.contains(sequence));
        for sequence in sequences {
            let found = acked_in_read.next();
            assert_eq!(found, Some(sequence), "{}: {key}: acknowledged record lost", case.name);
        }
    }
    broker.kill().unwrap();
    broker.wait().unwrap();
}

/// Producers, each with its own key, counting what is acknowledged and what is refused
/// `storage_failed`; a lost connection (the broker stopped) ends a producer.
struct Load {
    acked: Arc<Mutex<BTreeMap<String, Vec<u64>>>>,
    refused: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    producers: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(port: u16, producers: u32) -> Load {
        let acked: Arc<Mutex<BTreeMap<String, Vec<u64>>>> = Arc::default();
        let refused = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let producers = (0..producers)
            .map(|producer| {
                let (acked, refused, stop) =
                    (Arc::clone(&acked), Arc::clone(&refused), Arc::clone(&stop));
                tokio::spawn(async move {
                    let client = common::connect(port, "app", common::PASSWORD).await.unwrap();
                    let key = format!("p{producer}");
                    for sequence in 0u64.. {
                        if stop.load(Ordering::SeqCst) {
                            return;
                        }
                        let record =
                            RecordBuilder::new(format!("{key}-{sequence:08}")).key(&key).build();
                        match client.produce("sync", vec![record]).await {
                            Ok(_) => {
                                acked.lock().unwrap().entry(key.clone()).or_default().push(sequence)
                            }
                            Err(error) if error.reason() == Some(Reason::StorageFailed) => {
                                refused.fetch_add(1, Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                            Err(_) => return,
                        }
                    }
                })
            })
            .collect();
        Load { acked, refused, stop, producers }
    }

    fn acked_count(&self) -> usize {
        self.acked.lock().unwrap().values().map(Vec::len).sum()
    }

    async fn stop(self) -> BTreeMap<String, Vec<u64>> {
        self.stop.store(true, Ordering::SeqCst);
        for producer in self.producers {
            producer.await.unwrap();
        }
        self.acked.lock().unwrap().clone()
    }
}

/// Soft and hard descriptor limit of the broker under test.
const DESCRIPTOR_LIMIT: u64 = 256;

fn limit_descriptors() -> std::io::Result<()> {
    let limit = libc::rlimit { rlim_cur: DESCRIPTOR_LIMIT, rlim_max: DESCRIPTOR_LIMIT };
    // SAFETY: setrlimit is async-signal-safe and reads only the struct passed in.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A producing user creates topics of 256 ranges under a limit of 256 descriptors: the broker
/// closes idle segment files instead of running out, keeps accepting connections, creating
/// topics and serving produce and fetch on every range.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_ranges_under_a_low_descriptor_limit_keep_the_broker_serving() {
    let dir = tempfile::tempdir().unwrap();
    let mut process = BrokerProcess::new(dir.path());
    process.pre_exec = Some(limit_descriptors);
    let mut broker = process.spawn();
    let client = process.connect().await;
    for topic in 0..4 {
        client.create_topic_with_ranges(&format!("wide-{topic}"), 256).await.unwrap();
    }
    let keys = 600;
    for topic in 0..4 {
        let records = (0..keys)
            .map(|at| RecordBuilder::new(format!("v{at}")).key(format!("k{at}")).build())
            .collect();
        client.produce(&format!("wide-{topic}"), records).await.unwrap();
    }
    let other = process.connect().await;
    other.create_topic("narrow").await.unwrap();
    other.produce("narrow", vec![RecordBuilder::new("one").build()]).await.unwrap();
    for topic in 0..4 {
        let (records, _) = drain(&other, &format!("wide-{topic}"), None).await;
        assert_eq!(records.len(), keys, "wide-{topic}");
    }
    let log = process.log();
    assert!(log.contains("MALACHI_MAX_OPEN_SEGMENTS lowered"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    broker.kill().unwrap();
    broker.wait().unwrap();
}
