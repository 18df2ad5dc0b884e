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
    broker.groups().commit("jobs", "workers", Some(first.next_cursor.as_bytes())).await.unwrap();
    let rest = broker
        .fetch(&FetchArgs { topic: "jobs", group: Some("workers"), max: 100, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(rest.records.len() as u64, 10 - expected, "the group resumes after its commit");
    let forged = broker
        .groups()
        .commit("jobs", "workers", Some(b"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"))
        .await;
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
            let args = FetchArgs {
                topic: "events",
                cursor: Some(cursor.as_bytes()),
                wait_ms: 30_000,
                ..Default::default()
            };
            broker.fetch(&args).await.unwrap().records.len()
        })
    };
    // The produce must find the fetch parked, so that only the wake-up can answer it.
    testing::until("the fetch is parked", || broker.parked_fetches("events") == 1).await;
    broker.produce("events", vec![record("k", "v".into())], &mut Spread::default()).await.unwrap();
    // Well before the fetch's own 30 s deadline: only a wake-up answers it in time.
    let woken = tokio::time::timeout(std::time::Duration::from_secs(20), waiter).await;
    assert_eq!(woken.expect("woken by the produce, not by its deadline").unwrap(), 1);
    assert_eq!(broker.parked_fetches("events"), 0);

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

/// Reasons the spec names: a range the topic never had is `no_such_range` (not `range_sealed`),
/// and a cursor that is present but empty is `invalid_cursor` (only an absent one means "from
/// the start").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_ranges_and_empty_cursors_get_the_spec_reasons() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open(dir.path()).await;
    broker.create_topic("spec", None, None).await.unwrap();
    let [low, high] = broker.split("spec", 0).await.unwrap();
    let refusals: Vec<(&str, String)> = vec![
        ("split of a range never created", broker.split("spec", 99).await.unwrap_err().reason()),
        ("split of a sealed range", broker.split("spec", 0).await.unwrap_err().reason()),
        ("merge with an unknown range", broker.merge("spec", low, 99).await.unwrap_err().reason()),
        ("merge of a sealed range", broker.merge("spec", 0, high).await.unwrap_err().reason()),
    ];
    let expected = ["no_such_range", "range_sealed", "no_such_range", "range_sealed"];
    for ((what, reason), expected) in refusals.iter().zip(expected) {
        assert_eq!(reason, expected, "{what}");
    }
    broker.produce("spec", vec![record("k", "v".into())], &mut Spread::default()).await.unwrap();
    let empty =
        broker.fetch(&FetchArgs { topic: "spec", cursor: Some(b""), ..Default::default() }).await;
    assert_eq!(empty.unwrap_err().reason(), "invalid_cursor");
    let absent = broker.fetch(&FetchArgs { topic: "spec", ..Default::default() }).await.unwrap();
    assert_eq!(absent.records.len(), 1, "no cursor reads from the start");
}

/// A segment file that metadata lists and the disk lost is damage, reported as such: never
/// counted as expired by a reader, never recreated empty under a producer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_segment_file_is_damage_not_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let settings = [("AUTO_SPLIT_ENABLED", "false")];
    let broker = testing::open(testing::config(dir.path(), &settings)).await;
    broker.create_topic("lost", None, None).await.unwrap();
    let batch = || (0..5).map(|at| record("k", format!("v{at}"))).collect::<Vec<_>>();
    broker.produce("lost", batch(), &mut Spread::default()).await.unwrap();
    let topic_id = broker.topic_named("lost").unwrap().topic_id;
    broker.roll(topic_id, 0).await.unwrap();
    broker.produce("lost", batch(), &mut Spread::default()).await.unwrap();
    broker.shutdown().await;
    drop(broker);
    let range_dir = dir.path().join("topics").join(topic_id.to_string()).join("0");
    let mut files: Vec<_> = std::fs::read_dir(&range_dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "seg"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 2, "a sealed segment and the head");
    std::fs::remove_file(&files[0]).unwrap();
    std::fs::remove_file(&files[1]).unwrap();

    let broker = testing::open(testing::config(dir.path(), &settings)).await;
    let read = broker.fetch(&FetchArgs { topic: "lost", ..Default::default() }).await;
    assert_eq!(read.unwrap_err().reason(), "storage_damaged", "not skipped as expired");
    let produced = broker.produce("lost", batch(), &mut Spread::default()).await;
    assert_eq!(produced.unwrap_err().reason(), "storage_damaged", "not recreated empty");
    assert!(!files[1].exists(), "the lost head was not recreated");
}

/// A delete whose file removal never ran (a crash right after metadata dropped the topic)
/// finishes on the next retention pass, with no retention configured at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_interrupted_before_its_files_went_finishes_later() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open(dir.path()).await;
    broker.create_topic("gone", Some(4), None).await.unwrap();
    broker.produce("gone", vec![record("k", "v".into())], &mut Spread::default()).await.unwrap();
    let topic_id = broker.topic_named("gone").unwrap().topic_id;
    // Metadata forgets the topic; the process "dies" before it deletes a single file.
    let command = malachi_meta::MetaCommand::DeleteTopic { name: "gone".into() };
    broker.ring().named("gone").group.propose(command).await.unwrap().unwrap();
    broker.shutdown().await;
    drop(broker);
    let topic_dir = dir.path().join("topics").join(topic_id.to_string());
    let segment_files = |dir: &std::path::Path| -> usize {
        walk(dir).iter().filter(|path| path.extension().is_some_and(|ext| ext == "seg")).count()
    };
    assert_eq!(segment_files(&topic_dir), 4);
    let broker = open(dir.path()).await;
    broker.run_retention().await.unwrap();
    assert_eq!(segment_files(&topic_dir), 0, "the interrupted delete finished");
    assert!(broker.read_meta_named("gone", |meta| meta.pending_reclaim().is_empty()));
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(walk(&path));
        } else {
            found.push(path);
        }
    }
    found
}

/// A data directory from before policy definitions moved to the administrative group: the
/// definitions its vnode's log holds are moved there at the next start, a topic bound to one
/// resolves to it, and the vnode forgets them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn older_policy_definitions_move_to_the_administrative_group() {
    use malachi_meta::{MetaCommand, PolicyField, PolicyResolution, PolicyValue};
    let dir = tempfile::tempdir().unwrap();
    let broker = open(dir.path()).await;
    broker.create_topic("kept", None, None).await.unwrap();
    // What an older broker wrote to the vnode's log.
    let fields = vec![PolicyField {
        name: "retention.max_age_ms".into(),
        value: PolicyValue::Int(86_400_000),
    }];
    let vnode = &broker.ring().named("kept").group;
    let legacy = [
        MetaCommand::DefinePolicy { name: "daily".into(), fields },
        MetaCommand::BindTopicPolicy { topic: "kept".into(), policy: Some("daily".into()) },
    ];
    for command in legacy {
        vnode.propose(command).await.unwrap().unwrap();
    }
    broker.shutdown().await;
    drop(broker);

    let broker = open(dir.path()).await;
    let policies = broker.admin().list_policies();
    assert_eq!(policies.iter().map(|(name, _)| name.as_str()).collect::<Vec<_>>(), ["daily"]);
    let view = broker.admin().topic_policy("kept").await.unwrap();
    assert_eq!(view.resolution, PolicyResolution::Resolved);
    assert!(broker.read_meta_named("kept", |meta| meta.legacy_policies().is_empty()));
    broker.shutdown().await;
}
