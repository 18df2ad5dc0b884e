//! The log API end to end on one node, on real files: topics, produce, fetch with cursors across
//! splits and merges, groups, restart.

use std::sync::Arc;

use bytes::Bytes;
use malachi_broker::fetch::FetchArgs;
use malachi_broker::node::Broker;
use malachi_broker::produce::Spread;
use malachi_broker::testing;
use malachi_log::Record;

async fn open(dir: &std::path::Path) -> Arc<Broker> {
    testing::open(testing::config(dir, &[])).await
}

fn record(key: &str, value: String) -> Record {
    Record::keyed(key.to_string(), Bytes::from(value), 1)
}

/// Reads everything from `cursor` on, following cursors until a page comes back empty.
async fn drain(broker: &Broker, topic: &str, mut cursor: Option<String>) -> (Vec<Record>, String) {
    let mut all = Vec::new();
    loop {
        let args = FetchArgs {
            topic,
            cursor: cursor.as_deref().map(str::as_bytes),
            max: 7,
            ..FetchArgs::default()
        };
        let page = broker.fetch(&args).await.unwrap();
        let empty = page.records.is_empty();
        all.extend(page.records);
        cursor = Some(page.next_cursor);
        if empty {
            return (all, cursor.unwrap());
        }
    }
}

/// Values of `key` in read order.
fn values_of(records: &[Record], key: &str) -> Vec<String> {
    records
        .iter()
        .filter(|record| record.key.as_deref() == Some(key.as_bytes()))
        .map(|record| String::from_utf8(record.value.to_vec()).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_order_survives_splits_merges_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open(dir.path()).await;
    broker.create_topic("orders", None, None).await.unwrap();
    let keys = ["alpha", "beta", "gamma", "delta", "epsilon"];
    let mut spread = Spread::default();
    let mut sequence = 0;
    let mut produce_round = |broker: Arc<Broker>| {
        let batch: Vec<Record> = (0..20)
            .map(|at| {
                sequence += 1;
                record(keys[at % keys.len()], format!("{sequence:05}"))
            })
            .collect();
        async move {
            let mut spread = Spread::default();
            broker.produce("orders", batch, &mut spread).await.unwrap()
        }
    };
    assert_eq!(produce_round(Arc::clone(&broker)).await, 20);
    // A reader takes a cursor before any reshaping.
    let (early, early_cursor) = drain(&broker, "orders", None).await;
    assert_eq!(early.len(), 20);
    let [low, high] = broker.split("orders", 0).await.unwrap();
    produce_round(Arc::clone(&broker)).await;
    broker.split("orders", low).await.unwrap();
    produce_round(Arc::clone(&broker)).await;
    let info = broker.describe_topic("orders").await.unwrap();
    let active: Vec<u32> =
        info.ranges.iter().filter(|range| range.active).map(|range| range.range_id).collect();
    assert_eq!(active.len(), 3);
    let low_children: Vec<u32> =
        info.ranges.iter().find(|range| range.range_id == low).unwrap().children.clone();
    broker.merge("orders", low_children[0], low_children[1]).await.unwrap();
    produce_round(Arc::clone(&broker)).await;
    broker
        .produce("orders", vec![Record { key: None, ..record("x", "keyless".into()) }], &mut spread)
        .await
        .unwrap();

    let (from_start, _) = drain(&broker, "orders", None).await;
    assert_eq!(from_start.len(), 81, "every acknowledged record, once");
    for key in keys {
        let values = values_of(&from_start, key);
        let mut sorted = values.clone();
        sorted.sort();
        assert_eq!(values, sorted, "order of {key}");
    }
    let (after_early, _) = drain(&broker, "orders", Some(early_cursor.clone())).await;
    assert_eq!(after_early.len(), 61, "the old cursor continues after the split without loss");

    broker.shutdown().await;
    drop(broker);
    let broker = open(dir.path()).await;
    let (again, _) = drain(&broker, "orders", None).await;
    assert_eq!(again, from_start, "a restart keeps every record and its order");
    let (after_restart, _) = drain(&broker, "orders", Some(early_cursor)).await;
    assert_eq!(after_restart.len(), 61, "cursors survive a restart");
    assert!(
        broker
            .describe_topic("orders")
            .await
            .unwrap()
            .ranges
            .iter()
            .any(|range| range.range_id == high)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_commit_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open(dir.path()).await;
    broker.create_topic("jobs", Some(2), None).await.unwrap();
    let records: Vec<Record> =
        (0..10).map(|at| record(&format!("k{at}"), format!("{at}"))).collect();
    broker.produce("jobs", records, &mut Spread::default()).await.unwrap();
    let first = broker
        .fetch(&FetchArgs { topic: "jobs", group: Some("workers"), max: 3, ..Default::default() })
        .await
        .unwrap();
    let per_range: Vec<u64> = broker
        .describe_topic("jobs")
        .await
        .unwrap()
        .ranges
        .iter()
        .map(|range| range.records)
        .collect();
    assert_eq!(per_range.len(), 2);
    let expected: u64 = per_range.iter().map(|&records| records.min(3)).sum();
    assert_eq!(first.records.len() as u64, expected, "max applies per range: {per_range:?}");
    broker.commit("jobs", "workers", Some(first.next_cursor.as_bytes())).await.unwrap();
    let rest = broker
        .fetch(&FetchArgs { topic: "jobs", group: Some("workers"), max: 100, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(rest.records.len() as u64, 10 - expected, "the group resumes after its commit");
    let forged =
        broker.commit("jobs", "workers", Some(b"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")).await;
    assert_eq!(forged.unwrap_err().reason(), "invalid_cursor");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_wakes_on_produce_and_deleted_topics_come_back_new() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open(dir.path()).await;
    broker.create_topic("events", None, None).await.unwrap();
    let (_, cursor) = drain(&broker, "events", None).await;
    let waiter = {
        let broker = Arc::clone(&broker);
        let cursor = cursor.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let args = FetchArgs {
                topic: "events",
                cursor: Some(cursor.as_bytes()),
                wait_ms: 10_000,
                ..Default::default()
            };
            let page = broker.fetch(&args).await.unwrap();
            (page.records.len(), started.elapsed())
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    broker.produce("events", vec![record("k", "v".into())], &mut Spread::default()).await.unwrap();
    let (count, waited) = waiter.await.unwrap();
    assert_eq!(count, 1);
    assert!(waited < std::time::Duration::from_secs(5), "woken by the produce, not the timeout");

    broker.delete_topic("events").await.unwrap();
    assert_eq!(
        broker
            .produce("events", vec![record("k", "v".into())], &mut Spread::default())
            .await
            .unwrap_err()
            .reason(),
        "no_such_topic"
    );
    broker.create_topic("events", None, None).await.unwrap();
    let stale = broker
        .fetch(&FetchArgs {
            topic: "events",
            cursor: Some(cursor.as_bytes()),
            ..Default::default()
        })
        .await;
    assert_eq!(
        stale.unwrap_err().reason(),
        "invalid_cursor",
        "a cursor of the deleted topic is foreign"
    );
    let (fresh, _) = drain(&broker, "events", None).await;
    assert!(fresh.is_empty(), "the re-created topic starts empty");
}
