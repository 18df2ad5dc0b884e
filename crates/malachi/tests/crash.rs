//! Process-level durability: a real `malachi serve` on real files, killed with SIGKILL while
//! producers wait for acks, then restarted. Every acknowledged record must be there, in
//! per-key acknowledgement order, and a cursor held across the crash must not serve a record
//! twice.

use std::collections::{BTreeMap, BTreeSet};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use malachi_client::{Client, ClientConfig, FetchOptions, Record, RecordBuilder};

const PASSWORD: &str = "app-password-1";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn spawn_broker(dir: &std::path::Path, port: u16) -> Child {
    let log =
        std::fs::OpenOptions::new().create(true).append(true).open(dir.join("broker.log")).unwrap();
    Command::new(env!("CARGO_BIN_EXE_malachi"))
        .args(["serve", "--data-dir"])
        .arg(dir.join("data"))
        .args(["--port", &port.to_string()])
        .env("MALACHI_ADMIN_PASS", "admin-password-long")
        .env("MALACHI_DEFAULT_USERS", format!("app:{PASSWORD}:produce,consume"))
        .env("MALACHI_AUTO_SPLIT_ENABLED", "false")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starting malachi serve")
}

async fn connect(port: u16) -> Client {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let config = ClientConfig::new(format!("127.0.0.1:{port}")).credentials("app", PASSWORD);
        match Client::connect(config).await {
            Ok(client) => return client,
            Err(error) if Instant::now() < deadline => {
                let _ = error;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("broker did not come up: {error}"),
        }
    }
}

/// Reads from `cursor` until a page comes back empty.
async fn drain(client: &Client, cursor: Option<Bytes>) -> (Vec<Record>, Bytes) {
    let mut cursor = cursor;
    let mut records = Vec::new();
    loop {
        let options = FetchOptions { cursor: cursor.clone(), max: 500, ..FetchOptions::default() };
        let (page, next) = client.fetch("crash", &options).await.unwrap();
        cursor = Some(next);
        if page.is_empty() {
            return (records, cursor.unwrap());
        }
        records.extend(page);
    }
}

fn value(record: &Record) -> String {
    String::from_utf8(record.value.to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_produce_loses_no_acknowledged_record() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut broker = spawn_broker(dir.path(), port);
    let admin = connect(port).await;
    admin.create_topic_with_ranges("crash", 2).await.unwrap();
    let (_, start_cursor) = drain(&admin, None).await;

    let acked: Arc<Mutex<BTreeMap<String, Vec<u64>>>> = Arc::default();
    let mut producers = Vec::new();
    for producer in 0..4 {
        let acked = Arc::clone(&acked);
        producers.push(tokio::spawn(async move {
            let client = connect(port).await;
            let key = format!("p{producer}");
            for sequence in 0u64.. {
                let record = RecordBuilder::new(format!("{key}-{sequence:08}")).key(&key).build();
                if client.produce("crash", vec![record]).await.is_err() {
                    return;
                }
                acked.lock().unwrap().entry(key.clone()).or_default().push(sequence);
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
    assert!(acked_total > 50, "producers got {acked_total} acks before the kill");

    let mut broker = spawn_broker(dir.path(), port);
    let client = connect(port).await;
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
            "{key}: {} read, {} acknowledged",
            read.len(),
            sequences.len()
        );
        assert_eq!(
            &read[..sequences.len()],
            &sequences[..],
            "{key}: acknowledged records lost or reordered"
        );
    }
    for record in &everything {
        assert!(seen.contains(&value(record)), "the follower missed {}", value(record));
    }
    broker.kill().unwrap();
    broker.wait().unwrap();
}
