//! Consumer group members as real processes: two `malachi consume --group g --follow` share a
//! topic's ranges (every record printed once, each key's records in order by whichever member
//! reads them), and when one exits the other takes its ranges over.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::BrokerProcess;
use malachi_client::{Client, Record, RecordBuilder};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

/// Keys per batch, and records per key.
const KEYS: usize = 8;
const PER_KEY: usize = 10;
/// Bounds every wait for printed records: a failure, never a pace.
const PRINT_WAIT: Duration = Duration::from_secs(60);

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `malachi consume --group g --member NAME --follow` whose printed lines arrive on `lines`.
fn consumer(
    broker: &BrokerProcess,
    name: &'static str,
    lines: UnboundedSender<(String, String)>,
) -> Killed {
    let mut child = Command::new(env!("CARGO_BIN_EXE_malachi"))
        .args(["consume", "orders", "--group", "g", "--member", name, "--follow"])
        .args(["--wait-ms", "500", "--server", &broker.address()])
        .args(["--user", "app", "--password", common::PASSWORD])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines.send((name.to_string(), line));
        }
    });
    Killed(child)
}

/// Batch `batch`: PER_KEY records for each of KEYS keys, valued `b<batch>:k<key>:<seq>`.
async fn produce_batch(client: &Client, batch: usize) -> BTreeSet<String> {
    let mut values = BTreeSet::new();
    let mut records: Vec<Record> = Vec::new();
    for seq in 0..PER_KEY {
        for key in 0..KEYS {
            let value = format!("b{batch}:k{key}:{seq}");
            records.push(RecordBuilder::new(value.clone()).key(format!("k{key}")).build());
            values.insert(value);
        }
    }
    client.produce("orders", records).await.unwrap();
    values
}

/// Who printed each value of `expected`, in the order each printed them; waits until every
/// one was printed (other batches' lines are passed over).
async fn printed(
    lines: &mut UnboundedReceiver<(String, String)>,
    expected: &BTreeSet<String>,
    broker: &BrokerProcess,
) -> Vec<(String, String)> {
    let mut seen = Vec::new();
    let mut missing = expected.clone();
    while !missing.is_empty() {
        let Ok(Some((who, line))) = tokio::time::timeout(PRINT_WAIT, lines.recv()).await else {
            panic!("never printed: {missing:?}\n{}", broker.log());
        };
        if expected.contains(&line) {
            missing.remove(&line);
            seen.push((who, line));
        }
    }
    seen
}

/// Every value printed once, and each key's records in order by each member that printed them.
fn assert_once_and_in_order(seen: &[(String, String)], expected: &BTreeSet<String>) {
    let values: Vec<&String> = seen.iter().map(|(_, value)| value).collect();
    assert_eq!(values.len(), expected.len(), "printed twice: {seen:?}");
    let mut last: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for (who, value) in seen {
        let mut parts = value.split(':');
        let (_, key, seq) = (parts.next(), parts.next().unwrap(), parts.next().unwrap());
        let seq: usize = seq.parse().unwrap();
        if let Some(previous) = last.insert((who, key), seq) {
            assert!(previous < seq, "{who} printed {key}:{seq} after {key}:{previous}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_of_one_group_share_the_ranges_and_take_over_on_exit() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::new(dir.path());
    let _serve = Killed(broker.spawn());
    let client = broker.connect().await;
    client.create_topic_with_ranges("orders", 4).await.unwrap();
    let (sender, mut lines) = unbounded_channel();
    let mut a = consumer(&broker, "a", sender.clone());
    let _b = consumer(&broker, "b", sender);

    // Batches until both members print some of one: the group has dealt ranges to both.
    let mut batch = 0;
    loop {
        batch += 1;
        assert!(batch <= 100, "one member never got a range\n{}", broker.log());
        let expected = produce_batch(&client, batch).await;
        let seen = printed(&mut lines, &expected, &broker).await;
        let printers: BTreeSet<&str> = seen.iter().map(|(who, _)| who.as_str()).collect();
        if printers.len() == 2 {
            eprintln!("both members printed from batch {batch} on");
            break;
        }
    }
    batch += 1;
    let expected = produce_batch(&client, batch).await;
    assert_once_and_in_order(&printed(&mut lines, &expected, &broker).await, &expected);

    // Every range splits, each read to its end before: the group hands the children out only
    // after a member commits its parent drained, which it does once it finds it sealed.
    let admin = broker.connect_as("admin", "admin-password-long").await;
    let described = admin.describe_topic("orders").await.unwrap();
    for range in described.ranges.iter().filter(|range| range.children.is_empty()) {
        admin.split_range("orders", range.range_id).await.unwrap();
    }
    batch += 1;
    let expected = produce_batch(&client, batch).await;
    assert_once_and_in_order(&printed(&mut lines, &expected, &broker).await, &expected);

    // a stops (Ctrl-C) and leaves: b reads every range.
    // SAFETY: a plain signal to a child this test owns.
    assert_eq!(unsafe { libc::kill(a.0.id() as i32, libc::SIGINT) }, 0);
    assert!(a.0.wait().unwrap().success(), "a exits cleanly on Ctrl-C");
    batch += 1;
    let expected = produce_batch(&client, batch).await;
    let seen = printed(&mut lines, &expected, &broker).await;
    assert_once_and_in_order(&seen, &expected);
    assert!(seen.iter().all(|(who, _)| who == "b"), "a left, so b read it all: {seen:?}");
}
