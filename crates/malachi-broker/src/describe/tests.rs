//! `describe_segments` on one broker on real files, and the pieces it is made of.

use std::path::Path;

use bytes::Bytes;
use malachi_log::Record;

use super::*;
use crate::peer::{DONE, FENCED_OR_GONE};
use crate::produce::Spread;
use crate::testing;
use crate::testkit::TopicBuilder;

#[test]
fn segments_are_listed_in_range_then_segment_order_up_to_the_limit() {
    // Range 0, sealed by a split into ranges 1 and 2, each with its active head.
    let mut builder = TopicBuilder::new(1);
    assert_eq!(builder.split(0), [1, 2]);
    let cases: &[(usize, &[u32])] = &[(10, &[0, 1, 2]), (3, &[0, 1, 2]), (2, &[0, 1]), (0, &[])];
    for (max, ranges) in cases {
        let (_, segments) = listed_segments(builder.state(), "t", *max).expect("the topic");
        let listed: Vec<u32> = segments.iter().map(|segment| segment.range_id).collect();
        assert_eq!(listed, *ranges, "at most {max}");
    }
    let (_, segments) = listed_segments(builder.state(), "t", 10).expect("the topic");
    let seals: Vec<Option<SealInfo>> = segments.iter().map(|segment| segment.seal).collect();
    let split_seal = SealInfo { end_offset: 0, data_bytes: 32 };
    assert_eq!(seals, [Some(split_seal), None, None]);
    for segment in &segments {
        let unasked = CopyDescription { node_id: 1, settled: false, state: None };
        assert_eq!(segment.copies, [unasked], "segment {}", segment.segment_id);
    }
    assert!(listed_segments(builder.state(), "absent", 10).is_none());
}

#[test]
fn copy_state_answers_decode_by_status() {
    let sealed = CopyState { durable_offset: 7, sealed: true };
    let open = CopyState { durable_offset: 0, sealed: false };
    let seven = 7_u64.to_le_bytes();
    let with = |tail: &[u8]| [&[DONE][..], &seven, tail].concat();
    let mut failed = vec![2, 0];
    failed.extend_from_slice(b"storage_damaged");
    // (name, answer, the state or the error's wire reason)
    type Expected = Result<Option<CopyState>, &'static str>;
    let cases: Vec<(&str, Vec<u8>, Expected)> = vec![
        ("sealed at 7", encode_copy_state(sealed), Ok(Some(sealed))),
        ("open and empty", encode_copy_state(open), Ok(Some(open))),
        ("nothing to report", vec![FENCED_OR_GONE], Ok(None)),
        ("the holder's failure", failed, Err("storage_damaged")),
        ("sealed flag 2", with(&[2]), Err("metadata_unavailable")),
        ("no sealed flag", with(&[]), Err("metadata_unavailable")),
        ("a byte after the flag", with(&[1, 0]), Err("metadata_unavailable")),
    ];
    for (name, answer, expected) in cases {
        let decoded = decode_copy_state(&answer).map_err(|error| error.reason());
        assert_eq!(decoded, expected.map_err(str::to_string), "{name}");
    }
}

fn records(count: usize) -> Vec<Record> {
    let record = |at| Record::keyed("k".to_string(), Bytes::from(format!("v{at}")), 1);
    (0..count).map(record).collect()
}

fn segment_files(range_dir: &Path) -> usize {
    let entries = std::fs::read_dir(range_dir).expect("the range's directory");
    let paths = entries.map(|entry| entry.expect("an entry").path());
    paths.filter(|path| path.extension().is_some_and(|extension| extension == "seg")).count()
}

/// `(base_records, recorded seal's end, the one copy's state)` of each segment.
type Row = (u64, Option<u64>, Option<CopyState>);

fn rows(described: &[SegmentDescription]) -> Vec<Row> {
    described
        .iter()
        .map(|segment| {
            assert_eq!(segment.copies.len(), 1, "a broker alone holds the only copy");
            assert_eq!(segment.copies[0].node_id, 1);
            let end = segment.seal.map(|seal| seal.end_offset);
            (segment.base_records, end, segment.copies[0].state)
        })
        .collect()
}

/// Five records sealed by a roll, three in the head. Before a restart both copies are open;
/// after one the sealed copy is opened read-only to answer, the head is not opened, and once
/// its file is lost it is not created again either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_alone_reports_its_copies_and_opens_no_head() {
    let dir = tempfile::tempdir().expect("a directory");
    let config = || testing::config(dir.path(), &[("AUTO_SPLIT_ENABLED", "false")]);
    let broker = testing::open(config()).await;
    let topic_id = broker.create_topic("orders", None, None).await.expect("created");
    broker.produce("orders", records(5), &mut Spread::default()).await.expect("produced");
    broker.roll(topic_id, 0).await.expect("rolled");
    broker.produce("orders", records(3), &mut Spread::default()).await.expect("produced");
    let state = |durable_offset, sealed| Some(CopyState { durable_offset, sealed });

    let described = broker.observer().describe_segments("orders").await.expect("described");
    assert_eq!(rows(&described), [(0, Some(5), state(5, true)), (5, None, state(3, false))]);
    let head = SegmentKey { topic_id, range_id: 0, segment_id: described[1].segment_id };
    let missing = broker.observer().describe_segments("missing").await.expect_err("no such topic");
    assert_eq!(missing.reason(), "no_such_topic");
    broker.shutdown().await;
    drop(broker);

    let broker = testing::open(config()).await;
    let described = broker.observer().describe_segments("orders").await.expect("described");
    assert_eq!(rows(&described), [(0, Some(5), state(5, true)), (5, None, None)]);
    assert!(broker.data.peek(head).is_none(), "describing opened no head");
    broker.shutdown().await;
    drop(broker);

    let range_dir = dir.path().join("topics").join(topic_id.to_string()).join("0");
    let (head_file, _) = malachi_log::segment_paths(&range_dir, head.segment_id);
    std::fs::remove_file(&head_file).expect("the head's file");
    let broker = testing::open(config()).await;
    let described = broker.observer().describe_segments("orders").await.expect("described");
    assert_eq!(rows(&described), [(0, Some(5), state(5, true)), (5, None, None)]);
    assert!(!head_file.exists(), "describing created no file");
    assert_eq!(segment_files(&range_dir), 1);
}
