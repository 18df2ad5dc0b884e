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

/// A failed `fdatasync` under load: the produce that waited on it is refused `storage_failed`
/// (never acknowledged), the range rolls to a new segment and producers are acknowledged
/// again without a restart, and after a kill -9 every acknowledged record is there in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fsync_is_refused_then_healed_and_nothing_acknowledged_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let shim = build_shim(dir.path());
    let trigger = dir.path().join("fail-next-fsync");
    let process = BrokerProcess::new(dir.path())
        .env("LD_PRELOAD", shim.display().to_string())
        .env("FAILSYNC_TRIGGER", trigger.display().to_string());
    let mut broker = process.spawn();
    let admin = process.connect().await;
    admin.create_topic("sync").await.unwrap();

    let acked: Arc<Mutex<BTreeMap<String, Vec<u64>>>> = Arc::default();
    let refused = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut producers = Vec::new();
    for producer in 0..2 {
        let (acked, refused, stop) = (Arc::clone(&acked), Arc::clone(&refused), Arc::clone(&stop));
        let port = process.port;
        producers.push(tokio::spawn(async move {
            let client = common::connect(port, "app", common::PASSWORD).await.unwrap();
            let key = format!("p{producer}");
            for sequence in 0u64.. {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let record = RecordBuilder::new(format!("{key}-{sequence:08}")).key(&key).build();
                match client.produce("sync", vec![record]).await {
                    Ok(_) => acked.lock().unwrap().entry(key.clone()).or_default().push(sequence),
                    Err(error) => {
                        assert_eq!(error.reason(), Some(Reason::StorageFailed), "{error}");
                        refused.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
        }));
    }
    let acked_count = || acked.lock().unwrap().values().map(Vec::len).sum::<usize>();
    wait_for("first acks", Duration::from_secs(20), || acked_count() > 100).await;
    std::fs::write(&trigger, b"").unwrap();
    wait_for("the failing fsync", Duration::from_secs(20), || !trigger.exists()).await;
    wait_for("a refusal", Duration::from_secs(20), || refused.load(Ordering::SeqCst) > 0).await;
    let after_failure = acked_count();
    wait_for("acks after the failure", Duration::from_secs(20), || {
        acked_count() > after_failure + 100
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    for producer in producers {
        producer.await.unwrap();
    }
    let log = process.log();
    assert!(log.contains("an append failed on storage"), "the failure is logged:\n{log}");
    assert!(log.contains("fdatasync failed"), "with its cause:\n{log}");
    broker.kill().unwrap();
    broker.wait().unwrap();

    let restarted = BrokerProcess { env: Vec::new(), ..process };
    let mut broker = restarted.spawn();
    let client = restarted.connect().await;
    let (everything, _) = drain(&client, "sync", None).await;
    for (key, sequences) in acked.lock().unwrap().iter() {
        let read: Vec<u64> = everything
            .iter()
            .filter(|record| record.key.as_deref() == Some(key.as_bytes()))
            .map(|record| value(record)[key.len() + 1..].parse().unwrap())
            .collect();
        let mut acked_in_read = read.iter().filter(|sequence| sequences.contains(sequence));
        for sequence in sequences {
            assert_eq!(acked_in_read.next(), Some(sequence), "{key}: acknowledged record lost");
        }
    }
    broker.kill().unwrap();
    broker.wait().unwrap();
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
