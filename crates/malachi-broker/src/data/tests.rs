//! The data plane on the simulated disk: what a missing or unborn file means given what
//! metadata says, the open-handle cap, and deletes that race creates.

use std::path::Path;

use malachi_log::{SimStorage, Storage};

use super::*;

fn key(segment_id: u64) -> SegmentKey {
    SegmentKey { topic_id: 1, range_id: 0, segment_id }
}

fn plane(sim: &SimStorage, open_max: usize) -> DataPlane {
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    malachi_log::create_dir_durable(&*storage, Path::new("/"), Path::new("/data")).unwrap();
    DataPlane::with_io_mode(storage, Path::new("/data"), SegmentConfig::default(), IoMode::Inline)
        .unwrap()
        .with_open_segments_max(open_max)
}

fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(future)
}

fn records(count: usize) -> Vec<Record> {
    (0..count).map(|at| Record::keyed("k", format!("v{at}"), at as u64)).collect()
}

/// What opening a segment whose file is missing does, by what metadata says of it.
#[test]
fn a_missing_file_is_created_only_if_it_never_was() {
    let cases: &[(Option<Listed>, &str)] = &[
        (Some(Listed::ActiveUnborn), "created"),
        (Some(Listed::ActiveCreated), "damaged"),
        (Some(Listed::Sealed { end_offset: 3 }), "damaged"),
        (None, "gone"),
    ];
    for (listed, expected) in cases {
        let sim = SimStorage::new(1);
        let data = plane(&sim, 16);
        let outcome = block_on(data.open(key(1), || *listed));
        let got = match outcome {
            Ok(opened) if opened.report_created => "created",
            Ok(_) => "opened",
            Err(DataError::Damaged { .. }) => "damaged",
            Err(DataError::Gone(_)) => "gone",
            Err(other) => panic!("{listed:?}: {other}"),
        };
        assert_eq!(got, *expected, "{listed:?}");
        assert_eq!(sim.exists(&data.segment_path(key(1))).unwrap(), got == "created");
    }
}

/// A file with no durable header holds nothing anyone was promised, unless metadata sealed it.
#[test]
fn an_unborn_file_is_created_again_unless_sealed() {
    let cases: &[(Listed, bool)] = &[
        (Listed::ActiveUnborn, true),
        (Listed::ActiveCreated, true),
        (Listed::Sealed { end_offset: 0 }, false),
    ];
    for (listed, recreated) in cases {
        let sim = SimStorage::new(2);
        let data = plane(&sim, 16);
        block_on(data.open(key(1), || Some(Listed::ActiveUnborn))).unwrap();
        let path = data.segment_path(key(1));
        sim.restore(&path, &[0u8; 32]).unwrap();
        data.forget(key(1));
        let outcome = block_on(data.open(key(1), || Some(*listed)));
        assert_eq!(outcome.is_ok(), *recreated, "{listed:?}: {outcome:?}");
        if let Ok(opened) = outcome {
            assert_eq!(opened.segment.durable_offset(), 0, "a new, empty segment");
        }
    }
}

/// A segment directory created by the data plane survives a power loss with its file.
#[test]
fn a_created_segment_survives_a_power_loss() {
    let sim = SimStorage::new(3);
    let data = plane(&sim, 16);
    let segment = block_on(data.open(key(1), || Some(Listed::ActiveUnborn))).unwrap().segment;
    segment.append(&records(3)).unwrap();
    sim.crash_now();
    sim.restart();
    let data = plane(&sim, 16);
    let segment = block_on(data.open(key(1), || Some(Listed::ActiveCreated))).unwrap().segment;
    assert_eq!(segment.durable_offset(), 3);
}

/// A handle a failed write poisoned is never handed out again: the next open recovers the
/// file from the disk, whoever asks (a fence or a fill, not only a produce that evicts it).
#[test]
fn an_open_never_hands_out_a_poisoned_handle() {
    let sim = SimStorage::new(4);
    let data = plane(&sim, 16);
    let segment = block_on(data.open(key(1), || Some(Listed::ActiveUnborn))).unwrap().segment;
    segment.append(&records(3)).unwrap();
    sim.set_faults(malachi_log::SimFaults { write_failure_per_mille: 1000, ..Default::default() });
    assert!(segment.append(&records(2)).is_err(), "the write fails");
    assert!(segment.status().poisoned.is_some());
    sim.set_faults(malachi_log::SimFaults::default());
    let reopened = block_on(data.open(key(1), || Some(Listed::ActiveCreated))).unwrap();
    assert!(reopened.fresh, "recovered from the disk");
    assert!(!Arc::ptr_eq(&reopened.segment, &segment));
    assert!(reopened.segment.status().poisoned.is_none());
    assert_eq!(reopened.segment.durable_offset(), 3, "what was durable stays");
}

/// Beyond the cap, idle handles close (active ones too) and reopen without recovery; a handle
/// someone holds is never closed, so one file never has two handles.
#[test]
fn idle_segments_beyond_the_cap_close_and_reopen_on_use() {
    let sim = SimStorage::new(4);
    let data = plane(&sim, 4);
    let held = block_on(data.open(key(1), || Some(Listed::ActiveUnborn))).unwrap().segment;
    held.append(&records(2)).unwrap();
    for segment_id in 2..=20 {
        let opened = block_on(data.open(key(segment_id), || Some(Listed::ActiveUnborn))).unwrap();
        opened.segment.append(&records(segment_id as usize)).unwrap();
        if segment_id % 2 == 0 {
            opened.segment.seal().unwrap();
        }
    }
    assert!(data.open_segments() <= 4, "{} open", data.open_segments());
    assert!(data.peek(key(1)).is_some_and(|open| Arc::ptr_eq(&open, &held)), "held stays open");
    let syncs = sim.sync_count();
    for segment_id in 2..=20 {
        let segment =
            block_on(data.open(key(segment_id), || Some(Listed::ActiveCreated))).unwrap().segment;
        assert_eq!(segment.durable_offset(), segment_id, "segment {segment_id}");
        assert_eq!(segment.status().sealed.is_some(), segment_id % 2 == 0);
    }
    assert_eq!(sim.sync_count(), syncs, "clean reopens recover nothing");
    assert!(data.recoveries().is_empty());
}

/// A produce that read metadata before a delete must not create the file after the delete
/// removed it: the open asks metadata again under the segment's gate.
#[test]
fn an_open_after_a_delete_creates_no_orphan() {
    let sim = SimStorage::new(5);
    let data = plane(&sim, 16);
    block_on(data.open(key(1), || Some(Listed::ActiveUnborn))).unwrap();
    block_on(data.remove(key(1))).unwrap();
    let outcome = block_on(data.open(key(1), || None));
    assert!(matches!(outcome, Err(DataError::Gone(_))), "{outcome:?}");
    assert!(!sim.exists(&data.segment_path(key(1))).unwrap(), "no orphan file");
}

/// A sealed segment whose file ends short of the length metadata recorded (its trailer and last
/// frames lost at a frame boundary) refuses reads from where it ends, rather than answering as if
/// nothing more was ever written.
#[test]
fn a_sealed_segment_shorter_than_recorded_is_damage() {
    let sim = SimStorage::new(6);
    let data = plane(&sim, 16);
    let segment = block_on(data.open(key(1), || Some(Listed::ActiveUnborn))).unwrap().segment;
    segment.append(&records(3)).unwrap();
    let two_records = {
        let batch = segment.read(0, 2, u64::MAX).unwrap();
        assert_eq!(batch.records.len(), 2);
        segment.read(2, 1, u64::MAX).unwrap();
        // Position of the third frame: header plus the first two frames.
        32 + records(2).iter().map(malachi_log::format::frame_bytes).sum::<u64>()
    };
    segment.seal().unwrap();
    drop(segment);
    data.forget(key(1));
    sim.truncate(&data.segment_path(key(1)), two_records).unwrap();
    let segment =
        block_on(data.open(key(1), || Some(Listed::Sealed { end_offset: 3 }))).unwrap().segment;
    assert_eq!(segment.read(0, 10, u64::MAX).unwrap().records.len(), 2);
    assert!(matches!(segment.read(2, 10, u64::MAX), Err(ReadError::Corrupt { .. })));
    assert_eq!(sim.written_bytes(&data.segment_path(key(1))).unwrap().len() as u64, two_records);
}
