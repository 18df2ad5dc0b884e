//! Guarantees under reshaping, on real files: per-key order while splits and merges run
//! concurrently with producers, load-driven splits, and retention with skip counts.

use std::sync::Arc;

use bytes::Bytes;
use malachi_broker::fetch::FetchArgs;
use malachi_broker::node::Broker;
use malachi_broker::produce::Spread;
use malachi_broker::testing;
use malachi_log::Record;

async fn open(dir: &std::path::Path, settings: &[(&str, &str)]) -> Arc<Broker> {
    testing::open(testing::config(dir, settings)).await
}

async fn read_all(
    broker: &Broker,
    topic: &str,
    mut cursor: Option<String>,
) -> (Vec<Record>, u64, String) {
    let mut records = Vec::new();
    let mut skipped = 0;
    loop {
        let args = FetchArgs {
            topic,
            cursor: cursor.as_deref().map(str::as_bytes),
            max: 50,
            ..FetchArgs::default()
        };
        let page = broker.fetch(&args).await.unwrap();
        skipped += page.skipped;
        let done = page.records.is_empty();
        records.extend(page.records);
        cursor = Some(page.next_cursor);
        if done {
            return (records, skipped, cursor.unwrap());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_order_holds_while_ranges_split_and_merge_under_load() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open(dir.path(), &[("AUTO_SPLIT_ENABLED", "false")]).await;
    broker.create_topic("t", None, None).await.unwrap();
    let producers = 4;
    let per_producer = 150;
    let mut tasks = Vec::new();
    for producer in 0..producers {
        let broker = Arc::clone(&broker);
        tasks.push(tokio::spawn(async move {
            let mut spread = Spread::default();
            for sequence in 0..per_producer {
                // Each producer owns one key and waits for every ack: per-key order is owed.
                let record = Record::keyed(
                    format!("key-{producer}"),
                    Bytes::from(format!("{sequence:06}")),
                    0,
                );
                broker.produce("t", vec![record], &mut spread).await.unwrap();
            }
        }));
    }
    // Reshape concurrently: split, split a child, merge the grandchildren back, split again.
    let reshaper = {
        let broker = Arc::clone(&broker);
        tokio::spawn(async move {
            for _ in 0..3 {
                let info = broker.describe_topic("t").await.unwrap();
                let widest = info
                    .ranges
                    .iter()
                    .filter(|range| range.active)
                    .max_by_key(|range| range.end_inclusive - range.start)
                    .unwrap()
                    .range_id;
                let [low, _] = broker.split("t", widest).await.unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                let [a, b] = broker.split("t", low).await.unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                broker.merge("t", a, b).await.unwrap();
            }
        })
    };
    for task in tasks {
        task.await.unwrap();
    }
    reshaper.await.unwrap();
    let (records, _, _) = read_all(&broker, "t", None).await;
    assert_eq!(records.len(), producers * per_producer, "no acknowledged record lost or doubled");
    for producer in 0..producers {
        let key = format!("key-{producer}");
        let values: Vec<String> = records
            .iter()
            .filter(|record| record.key.as_deref() == Some(key.as_bytes()))
            .map(|record| String::from_utf8(record.value.to_vec()).unwrap())
            .collect();
        let expected: Vec<String> =
            (0..per_producer).map(|sequence| format!("{sequence:06}")).collect();
        assert_eq!(values, expected, "records of {key} in acknowledgement order");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_splits_a_hot_range_and_merges_cold_buddies() {
    let dir = tempfile::tempdir().unwrap();
    let settings = [
        ("SPLIT_RECORDS_PER_S", "100"),
        ("MERGE_RECORDS_PER_S", "50"),
        ("RESHAPE_COOLDOWN_MS", "0"),
        ("AUTO_SPLIT_WINDOW_MS", "1000"),
    ];
    let broker = open(dir.path(), &settings).await;
    broker.create_topic("hot", None, None).await.unwrap();
    let records: Vec<Record> =
        (0..2000).map(|at| Record::keyed(format!("k{at}"), Bytes::from_static(b"v"), 0)).collect();
    broker.produce("hot", records, &mut Spread::default()).await.unwrap();
    broker.coordination().coordinate_once().await;
    async fn active(broker: &Broker) -> usize {
        let info = broker.describe_topic("hot").await.unwrap();
        info.ranges.iter().filter(|range| range.active).count()
    }
    assert_eq!(active(&broker).await, 2, "2000 records in a 1 s window is over 100/s: split");
    // With no traffic for a whole window both halves are cold buddies: merge.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    broker.coordination().coordinate_once().await;
    assert_eq!(active(&broker).await, 1, "cold buddies merge back");
    let (read, _, _) = read_all(&broker, "hot", None).await;
    assert_eq!(read.len(), 2000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_sealed_segments_and_readers_learn_what_they_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let settings = [
        ("SEGMENT_MAX_BYTES", "4096"),
        ("RETENTION_MAX_BYTES", "8192"),
        ("AUTO_SPLIT_ENABLED", "false"),
    ];
    let broker = open(dir.path(), &settings).await;
    broker.create_topic("logs", None, None).await.unwrap();
    let (_, _, start_cursor) = read_all(&broker, "logs", None).await;
    for batch in 0..20 {
        let records: Vec<Record> = (0..10)
            .map(|at| {
                Record::keyed("k", Bytes::from(format!("{batch:03}-{at:03}-{}", "x".repeat(80))), 0)
            })
            .collect();
        broker.produce("logs", records, &mut Spread::default()).await.unwrap();
        // The size-triggered roll runs in the background: let it finish before the next batch.
        testing::until("the roll is done", || broker.rolls_pending() == 0).await;
    }
    let info = broker.describe_topic("logs").await.unwrap();
    assert!(info.ranges[0].segments > 3, "segments rolled by size: {info:?}");
    let expired = broker.run_retention().await.unwrap();
    assert!(expired > 0, "over 8 KiB per range: the oldest sealed segments go");
    let (records, skipped, _) = read_all(&broker, "logs", Some(start_cursor)).await;
    assert_eq!(skipped, expired, "the old cursor is told exactly how many records it skipped");
    assert_eq!(records.len() as u64 + skipped, 200);
    let first = String::from_utf8(records[0].value.to_vec()).unwrap();
    assert_eq!(
        first[..7],
        format!("{:03}-{:03}", skipped / 10, skipped % 10),
        "resumes at the oldest retained record"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_fit_the_frame_and_lose_nothing_across_segments() {
    let dir = tempfile::tempdir().unwrap();
    let settings = [
        ("MAX_FRAME_SIZE", "16384"),
        ("SEGMENT_MAX_BYTES", "4096"),
        ("AUTO_SPLIT_ENABLED", "false"),
    ];
    let broker = open(dir.path(), &settings).await;
    broker.create_topic("big", Some(2), None).await.unwrap();
    for at in 0..30 {
        let record = Record::keyed(
            format!("k{}", at % 4),
            Bytes::from(format!("{at:04}{}", "x".repeat(1500))),
            0,
        );
        broker.produce("big", vec![record], &mut Spread::default()).await.unwrap();
        testing::until("the roll is done", || broker.rolls_pending() == 0).await;
    }
    let info = broker.describe_topic("big").await.unwrap();
    assert!(info.ranges.iter().any(|range| range.segments > 2), "segments rolled: {info:?}");
    let stored: u64 = info.ranges.iter().map(|range| range.records).sum();
    assert_eq!(stored, 30, "{info:#?}");
    let mut cursor: Option<String> = None;
    let mut values = Vec::new();
    loop {
        let args = FetchArgs {
            topic: "big",
            cursor: cursor.as_deref().map(str::as_bytes),
            max: 1000,
            ..FetchArgs::default()
        };
        let page = broker.fetch(&args).await.unwrap();
        let bytes: u64 = page.records.iter().map(malachi_broker::fetch::wire_bytes).sum();
        assert!(
            bytes + page.next_cursor.len() as u64 + 64 <= 16384,
            "a page of {bytes} bytes overflows the frame"
        );
        if page.records.is_empty() {
            break;
        }
        values.extend(
            page.records
                .iter()
                .map(|record| String::from_utf8(record.value[..4].to_vec()).unwrap()),
        );
        cursor = Some(page.next_cursor);
    }
    values.sort();
    let expected: Vec<String> = (0..30).map(|at| format!("{at:04}")).collect();
    assert_eq!(values, expected, "every record exactly once");
}
