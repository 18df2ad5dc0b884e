//! Process-level durability: a real `malachi serve` on real files, killed with SIGKILL while
//! producers wait for acks, then restarted. Every acknowledged record must be there, in
//! per-key acknowledgement order, and a cursor held across the crash must not serve a record
//! twice.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{BrokerProcess, value};
use malachi_client::RecordBuilder;

async fn drain(
    client: &malachi_client::Client,
    cursor: Option<bytes::Bytes>,
) -> (Vec<malachi_client::Record>, bytes::Bytes) {
    common::drain(client, "crash", cursor).await
}

/// Keys each producer spreads its batches over: with 32 ranges a batch lands on many of them,
/// so each produce is one group-commit round of many segments (the journal's case).
const KEYS_PER_PRODUCER: usize = 16;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_produce_loses_no_acknowledged_record() {
    for ranges in [2, 32] {
        sigkill_mid_produce(ranges).await;
    }
}

async fn sigkill_mid_produce(ranges: u32) {
    let dir = tempfile::tempdir().unwrap();
    let process = BrokerProcess::new(dir.path());
    let mut broker = process.spawn();
    let admin = process.connect().await;
    admin.create_topic_with_ranges("crash", ranges).await.unwrap();
    let (_, start_cursor) = drain(&admin, None).await;

    let acked: Arc<Mutex<BTreeMap<String, Vec<u64>>>> = Arc::default();
    let mut producers = Vec::new();
    for producer in 0..4 {
        let acked = Arc::clone(&acked);
        let port = process.port;
        producers.push(tokio::spawn(async move {
            let client = common::connect(port, "app", common::PASSWORD).await.unwrap();
            let keys: Vec<String> =
                (0..KEYS_PER_PRODUCER).map(|key| format!("p{producer}k{key}")).collect();
            for sequence in 0u64.. {
                let records = keys
                    .iter()
                    .map(|key| RecordBuilder::new(format!("{key}-{sequence:08}")).key(key).build())
                    .collect();
                if client.produce("crash", records).await.is_err() {
                    return;
                }
                let mut acked = acked.lock().unwrap();
                for key in &keys {
                    acked.entry(key.clone()).or_default().push(sequence);
                }
            }
        }));
    }
    // A reader follows the topic with its own cursor across the crash.
    let mut seen = Vec::new();
    let mut cursor = Some(start_cursor.clone());
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1500) {
        let (page, next) = drain(&admin, cursor.clone()).await;
        seen.extend(page.iter().map(value));
        cursor = Some(next);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    broker.kill().expect("SIGKILL");
    broker.wait().unwrap();
    for producer in producers {
        producer.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    let acked_total: usize = acked.values().map(Vec::len).sum();
    assert!(
        acked_total > 50,
        "{ranges} ranges: {acked_total} records acknowledged before the kill"
    );

    let mut broker = process.spawn();
    let client = process.connect().await;
    let (after, _) = drain(&client, cursor).await;
    seen.extend(after.iter().map(value));
    let distinct: BTreeSet<&String> = seen.iter().collect();
    assert_eq!(distinct.len(), seen.len(), "a cursor held across the crash served a record twice");

    let (everything, _) = drain(&client, Some(start_cursor)).await;
    for (key, sequences) in &acked {
        let read: Vec<u64> = everything
            .iter()
            .filter(|record| record.key.as_deref() == Some(key.as_bytes()))
            .map(|record| value(record)[key.len() + 1..].parse().unwrap())
            .collect();
        // Unacknowledged records in flight at the kill may or may not exist, after the acked ones.
        assert!(
            read.len() >= sequences.len(),
            "{ranges} ranges: {key}: {} read, {} acknowledged",
            read.len(),
            sequences.len()
        );
        assert_eq!(
            &read[..sequences.len()],
            &sequences[..],
            "{ranges} ranges: {key}: acknowledged records lost or reordered"
        );
    }
    for record in &everything {
        assert!(distinct.contains(&value(record)), "the follower missed {}", value(record));
    }
    broker.kill().unwrap();
    broker.wait().unwrap();
}

/// A clean stop (SIGTERM) empties the node journal, so the next start replays nothing and
/// every acknowledged record is there; a SIGKILL of the same broker leaves rounds to replay
/// (which is what makes the first half a check rather than the default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_leaves_no_journal_to_replay() {
    let dir = tempfile::tempdir().unwrap();
    let process = BrokerProcess::new(dir.path());
    let mut broker = process.spawn();
    let mut client = process.connect().await;
    client.create_topic_with_ranges("crash", 4).await.unwrap();
    let mut produced = Vec::new();
    for stop in ["TERM", "KILL"] {
        for batch in 0..20 {
            let records: Vec<_> = (0..8)
                .map(|at| format!("{stop}-{batch:02}-{at}"))
                .map(|value| RecordBuilder::new(value.clone()).key(value).build())
                .collect();
            client.produce("crash", records).await.unwrap();
            produced.extend((0..8).map(|at| format!("{stop}-{batch:02}-{at}")));
        }
        let before = process.log().len();
        let signal = format!("-{stop}");
        let pid = broker.id().to_string();
        assert!(
            std::process::Command::new("kill").args([&signal, &pid]).status().unwrap().success()
        );
        let status = broker.wait().unwrap();
        assert_eq!(status.success(), stop == "TERM", "{stop}: {status}");
        broker = process.spawn();
        client = process.connect().await;
        let (everything, _) = drain(&client, None).await;
        let mut read: Vec<String> = everything.iter().map(value).collect();
        read.sort();
        let mut expected = produced.clone();
        expected.sort();
        assert_eq!(read, expected, "after {stop}: acknowledged records lost or doubled");
        let log = process.log();
        let replayed =
            log[before..].lines().find(|line| line.contains("replayed the node journal"));
        match stop {
            "TERM" => assert!(replayed.is_none(), "a clean stop left a journal: {replayed:?}"),
            _ => {
                assert!(replayed.is_some(), "a SIGKILL left nothing to replay:\n{}", &log[before..])
            }
        }
    }
    broker.kill().unwrap();
    broker.wait().unwrap();
}
