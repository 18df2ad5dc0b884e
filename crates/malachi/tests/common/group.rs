//! Consumer group members as processes, shared by the group tests and the cluster tests: a
//! `malachi consume --group` whose printed lines arrive on a channel, batches of keyed records,
//! and the check that every value was printed once with each key's records in order.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use malachi_client::{Client, Record, RecordBuilder};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use super::BrokerProcess;

/// Keys per batch, and records per key.
pub const KEYS: usize = 8;
pub const PER_KEY: usize = 10;
/// Bounds every wait for printed records: a failure, never a pace.
pub const PRINT_WAIT: Duration = Duration::from_secs(60);

pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `malachi consume --group g --member NAME --follow` whose printed lines arrive on `lines`.
pub fn consumer(
    broker: &BrokerProcess,
    name: &'static str,
    lines: UnboundedSender<(String, String)>,
) -> Killed {
    consumer_as(broker, name, name.to_string(), lines)
}

/// As [`consumer`], its lines labelled `label` (one process of several under one member name).
pub fn consumer_as(
    broker: &BrokerProcess,
    name: &str,
    label: String,
    lines: UnboundedSender<(String, String)>,
) -> Killed {
    let mut child = Command::new(env!("CARGO_BIN_EXE_malachi"))
        .args(["consume", "orders", "--group", "g", "--member", name, "--follow"])
        .args(["--wait-ms", "500", "--server", &broker.address()])
        .args(["--user", "app", "--password", super::PASSWORD])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines.send((label.clone(), line));
        }
    });
    Killed(child)
}

/// Batch `batch`: PER_KEY records for each of KEYS keys, valued `b<batch>:k<key>:<seq>`.
pub fn batch_of(batch: usize) -> (Vec<Record>, BTreeSet<String>) {
    let mut values = BTreeSet::new();
    let mut records: Vec<Record> = Vec::new();
    for seq in 0..PER_KEY {
        for key in 0..KEYS {
            let value = format!("b{batch}:k{key}:{seq}");
            records.push(RecordBuilder::new(value.clone()).key(format!("k{key}")).build());
            values.insert(value);
        }
    }
    (records, values)
}

/// Produces batch `batch` (see [`batch_of`]); its values.
pub async fn produce_batch(client: &Client, batch: usize) -> BTreeSet<String> {
    let (records, values) = batch_of(batch);
    client.produce("orders", records).await.unwrap();
    values
}

/// Who printed each value of `expected`, in the order each printed them; waits until every
/// one was printed (other batches' lines are passed over).
pub async fn printed(
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
pub fn assert_once_and_in_order(seen: &[(String, String)], expected: &BTreeSet<String>) {
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

/// Batches after `batch` until `members` members print some of one (the group has dealt ranges
/// to each); the number of the last batch.
pub async fn until_each_prints(
    client: &Client,
    lines: &mut UnboundedReceiver<(String, String)>,
    broker: &BrokerProcess,
    members: usize,
    mut batch: usize,
) -> usize {
    let first = batch;
    loop {
        batch += 1;
        assert!(batch <= first + 100, "a member never got a range\n{}", broker.log());
        let expected = produce_batch(client, batch).await;
        let seen = printed(lines, &expected, broker).await;
        let printers: BTreeSet<&str> = seen.iter().map(|(who, _)| who.as_str()).collect();
        if printers.len() == members {
            eprintln!("every member printed from batch {batch} on");
            return batch;
        }
    }
}
