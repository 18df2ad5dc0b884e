//! Segment behaviour on both storages: round trips, seal as a fence, recovery, verify, poison,
//! and the crash property that every acknowledged record survives.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;

use super::*;
use crate::format::tests::arb_record;
use crate::storage::{RealStorage, SimFaults, SimStorage};

fn dir() -> PathBuf {
    PathBuf::from("/data/topic-1/range-0")
}

/// Creates a segment after making its directory exist durably, as the data plane does.
fn create(
    storage: Arc<dyn Storage>,
    dir: &Path,
    segment_id: u64,
    config: SegmentConfig,
) -> Result<Arc<Segment>, OpenError> {
    crate::storage::create_dir_durable(&*storage, Path::new("/"), dir)?;
    Segment::create(storage, dir, segment_id, config, &Committer::solo())
}

fn small_config() -> SegmentConfig {
    // Tiny index interval and read chunk so short tests cross chunk and index boundaries.
    SegmentConfig { index_interval_bytes: 64, read_chunk_bytes: 100, ..SegmentConfig::default() }
}

fn records(count: usize, tag: &str) -> Vec<Record> {
    (0..count)
        .map(|at| Record::keyed(format!("key-{}", at % 3), format!("{tag}-{at}"), at as u64))
        .collect()
}

fn read_all(segment: &Segment) -> Vec<StoredRecord> {
    let mut out = Vec::new();
    let mut offset = 0;
    loop {
        let batch = segment.read(offset, 7, 300).unwrap();
        if batch.records.is_empty() {
            return out;
        }
        offset = batch.next_offset;
        out.extend(batch.records);
    }
}

/// Every record a reader gets before the first error.
fn read_readable(segment: &Segment) -> Vec<StoredRecord> {
    let mut out = Vec::new();
    let mut offset = 0;
    while let Ok(batch) = segment.read(offset, 7, 300) {
        if batch.records.is_empty() {
            break;
        }
        offset = batch.next_offset;
        out.extend(batch.records);
    }
    out
}

/// Both storages, for tests that must hold on each.
fn storages() -> Vec<(Arc<dyn Storage>, PathBuf, Option<tempfile::TempDir>)> {
    let temp = tempfile::tempdir().unwrap();
    let real_dir = temp.path().join("range-0");
    vec![(Arc::new(SimStorage::new(1)), dir(), None), (Arc::new(RealStorage), real_dir, Some(temp))]
}

#[test]
fn append_read_reopen_on_both_storages() {
    for (storage, dir, _keep) in storages() {
        let segment = create(Arc::clone(&storage), &dir, 3, small_config()).unwrap();
        let first = segment.append(&records(5, "a")).unwrap();
        let second = segment.append(&records(4, "b")).unwrap();
        assert_eq!((first.first_offset, first.end_offset), (0, 5));
        assert_eq!((second.first_offset, second.end_offset), (5, 9));
        let expected: Vec<Record> = records(5, "a").into_iter().chain(records(4, "b")).collect();
        let got: Vec<Record> = read_all(&segment).into_iter().map(|stored| stored.record).collect();
        assert_eq!(got, expected);
        drop(segment);
        let (reopened, report) =
            Segment::open(Arc::clone(&storage), &dir, 3, small_config(), &Committer::solo())
                .unwrap();
        assert_eq!((report.records, report.bytes_truncated, report.stopped_at), (9, 0, None));
        assert_eq!(reopened.append(&records(1, "c")).unwrap().first_offset, 9);
        assert_eq!(read_all(&reopened).len(), 10);
    }
}

#[test]
fn reads_start_anywhere_and_respect_bounds() {
    let storage: Arc<dyn Storage> = Arc::new(SimStorage::new(2));
    let segment = create(storage, &dir(), 1, small_config()).unwrap();
    segment.append(&records(50, "r")).unwrap();
    for from in [0u64, 1, 17, 49, 50] {
        let batch = segment.read(from, 3, u64::MAX).unwrap();
        let offsets: Vec<u64> = batch.records.iter().map(|stored| stored.offset).collect();
        let expected: Vec<u64> = (from..(from + 3).min(50)).collect();
        assert_eq!(offsets, expected, "from {from}");
        assert_eq!(batch.end_offset, 50);
    }
    // A byte budget smaller than one frame still returns one record.
    assert_eq!(segment.read(0, 10, 1).unwrap().records.len(), 1);
    let out_of_range = segment.read(51, 1, 1).unwrap_err();
    assert!(matches!(
        out_of_range,
        ReadError::OffsetOutOfRange { requested: 51, start: 0, end: 50 }
    ));
}

#[test]
fn seal_is_a_fence_that_survives_reopen() {
    for (storage, dir, _keep) in storages() {
        let segment = create(Arc::clone(&storage), &dir, 9, small_config()).unwrap();
        segment.append(&records(6, "s")).unwrap();
        let seal = segment.seal().unwrap();
        assert_eq!(seal.end_offset, 6);
        assert_eq!(segment.seal().unwrap(), seal, "sealing twice reports the same end");
        assert_eq!(segment.append(&records(1, "x")), Err(AppendError::Sealed { end_offset: 6 }));
        drop(segment);
        let (reopened, report) =
            Segment::open(Arc::clone(&storage), &dir, 9, small_config(), &Committer::solo())
                .unwrap();
        assert!(!report.index_rebuilt, "a sealed segment's index sidecar is used");
        assert_eq!(reopened.status().sealed, Some(seal));
        assert_eq!(reopened.append(&records(1, "x")), Err(AppendError::Sealed { end_offset: 6 }));
        assert_eq!(read_all(&reopened).len(), 6);
    }
}

#[test]
fn a_fence_refuses_appends_takes_fills_and_survives_a_power_loss() {
    let sim = SimStorage::new(5);
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    let segment = create(Arc::clone(&storage), &dir(), 4, small_config()).unwrap();
    segment.append(&records(3, "p")).unwrap();
    let fenced = segment.fence().unwrap();
    assert_eq!(fenced.durable_offset, 3);
    assert!(segment.is_fenced());
    assert_eq!(segment.append(&records(1, "x")), Err(AppendError::Sealed { end_offset: 3 }));
    // A fill copied from another replica goes in, and the copy then seals where it ends.
    let ticket = segment.stage_fill(&records(2, "f")).unwrap();
    segment.wait_durable(ticket).unwrap();
    assert_eq!(segment.fence().unwrap().durable_offset, 5, "fencing again changes nothing");
    drop(segment);
    sim.crash_now();
    sim.restart();
    let (reopened, _) =
        Segment::open(Arc::clone(&storage), &dir(), 4, small_config(), &Committer::solo()).unwrap();
    assert!(reopened.is_fenced(), "the fence is durable");
    assert_eq!(reopened.append(&records(1, "x")), Err(AppendError::Sealed { end_offset: 5 }));
    assert_eq!(reopened.seal().unwrap().end_offset, 5);
    assert_eq!(read_all(&reopened).len(), 5);
    // An unfenced segment is not reopened fenced.
    let plain = create(Arc::clone(&storage), &dir(), 6, small_config()).unwrap();
    plain.append(&records(1, "q")).unwrap();
    drop(plain);
    let (plain, _) = Segment::open(storage, &dir(), 6, small_config(), &Committer::solo()).unwrap();
    assert!(!plain.is_fenced());
    plain.append(&records(1, "r")).unwrap();
}

#[test]
fn sealing_an_empty_segment_works() {
    let storage: Arc<dyn Storage> = Arc::new(SimStorage::new(3));
    let segment = create(Arc::clone(&storage), &dir(), 1, small_config()).unwrap();
    assert_eq!(segment.seal().unwrap(), SealInfo { end_offset: 0, data_bytes: 32 });
    drop(segment);
    let (reopened, _) =
        Segment::open(storage, &dir(), 1, small_config(), &Committer::solo()).unwrap();
    assert_eq!(reopened.append(&records(1, "x")), Err(AppendError::Sealed { end_offset: 0 }));
}

#[test]
fn torn_tail_is_cut_and_reported() {
    let sim = SimStorage::new(4);
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    let segment = create(Arc::clone(&storage), &dir(), 1, small_config()).unwrap();
    segment.append(&records(3, "t")).unwrap();
    let intact_bytes = segment.status().durable_bytes;
    segment.append(&records(1, "torn")).unwrap();
    let (path, _) = segment_paths(&dir(), 1);
    let full = sim.written_bytes(&path).unwrap().len() as u64;
    sim.truncate(&path, full - 3).unwrap();
    drop(segment);
    let (reopened, report) =
        Segment::open(storage, &dir(), 1, small_config(), &Committer::solo()).unwrap();
    assert_eq!(report.records, 3);
    assert_eq!(report.bytes_truncated, full - 3 - intact_bytes);
    assert!(
        matches!(report.stopped_at, Some((position, FrameError::Incomplete { .. })) if position == intact_bytes)
    );
    assert_eq!(reopened.append(&records(1, "next")).unwrap().first_offset, 3);
}

#[test]
fn damaged_or_missing_index_never_changes_what_is_read() {
    let sim = SimStorage::new(5);
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    let segment = create(Arc::clone(&storage), &dir(), 1, small_config()).unwrap();
    segment.append(&records(40, "i")).unwrap();
    segment.seal().unwrap();
    let expected = read_all(&segment);
    drop(segment);
    let (_, index_path) = segment_paths(&dir(), 1);
    // A well-formed index that points into the middle of a frame: the read must fall back.
    let index_bytes = sim.written_bytes(&index_path).unwrap();
    let entry_position_at = crate::index::INDEX_HEADER_BYTES + 16 + 8;
    sim.flip_bit(&index_path, entry_position_at as u64, 0).unwrap();
    let (reopened, report) =
        Segment::open(Arc::clone(&storage), &dir(), 1, small_config(), &Committer::solo()).unwrap();
    assert!(!report.index_rebuilt);
    assert_eq!(read_all(&reopened), expected);
    for from in 0..40 {
        assert_eq!(reopened.read(from, 1, u64::MAX).unwrap().records[0], expected[from as usize]);
    }
    drop(reopened);
    sim.delete(&index_path).unwrap();
    let (rebuilt, report) =
        Segment::open(Arc::clone(&storage), &dir(), 1, small_config(), &Committer::solo()).unwrap();
    assert!(report.index_rebuilt);
    assert_eq!(read_all(&rebuilt), expected);
    assert_eq!(sim.written_bytes(&index_path).unwrap(), index_bytes, "rebuilt index is identical");
}

#[test]
fn verify_reports_every_bad_frame_and_changes_nothing() {
    let sim = SimStorage::new(6);
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    let segment = create(Arc::clone(&storage), &dir(), 1, small_config()).unwrap();
    let mut frame_starts = vec![SEGMENT_HEADER_BYTES];
    for batch in 0..10 {
        segment.append(&records(1, &format!("v{batch}"))).unwrap();
        frame_starts.push(segment.status().durable_bytes);
    }
    segment.seal().unwrap();
    drop(segment);
    let (path, _) = segment_paths(&dir(), 1);
    // Damage the value bytes of frames 2 and 7 (well inside the frames).
    for frame in [2usize, 7] {
        sim.flip_bit(&path, frame_starts[frame] + 40, 3).unwrap();
    }
    let before = sim.written_bytes(&path).unwrap();
    let report = verify_segment(&*storage, &dir(), 1).unwrap();
    let positions: Vec<u64> = report.bad_frames.iter().map(|bad| bad.position).collect();
    assert_eq!(positions, vec![frame_starts[2], frame_starts[7]]);
    assert!(
        report.bad_frames.iter().all(|bad| matches!(bad.error, FrameError::CrcMismatch { .. }))
    );
    assert_eq!(report.records, 8);
    assert_eq!(report.sealed.map(|seal| seal.end_offset), Some(10));
    assert_eq!(sim.written_bytes(&path).unwrap(), before, "verify must not repair");
}

#[test]
fn failed_sync_poisons_until_reopen() {
    let sim = SimStorage::new(7);
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    let segment = create(Arc::clone(&storage), &dir(), 1, small_config()).unwrap();
    segment.append(&records(2, "ok")).unwrap();
    sim.fail_next_syncs(1);
    let cause = PoisonCause::Sync(std::io::ErrorKind::Other);
    assert_eq!(segment.append(&records(1, "lost")), Err(AppendError::Poisoned { cause }));
    assert_eq!(segment.durable_offset(), 2, "a failed sync must not move the durable end");
    // The next call would find a healthy disk, but the segment must not retry the sync.
    let syncs = sim.sync_count();
    assert_eq!(segment.append(&records(1, "later")), Err(AppendError::Poisoned { cause }));
    assert_eq!(sim.sync_count(), syncs);
    assert!(matches!(segment.read(0, 1, 1), Err(ReadError::Poisoned { .. })));
    assert!(matches!(segment.seal(), Err(SealError::Poisoned { .. })));
    drop(segment);
    sim.restart();
    let (reopened, report) =
        Segment::open(storage, &dir(), 1, small_config(), &Committer::solo()).unwrap();
    assert_eq!(report.records, 2, "the unsynced append is gone after a crash");
    assert_eq!(reopened.append(&records(1, "again")).unwrap().first_offset, 2);
}

#[test]
fn full_disk_is_named_and_poisons() {
    let sim = SimStorage::new(8);
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    let segment = create(Arc::clone(&storage), &dir(), 1, small_config()).unwrap();
    sim.set_faults(SimFaults { capacity_bytes: Some(200), ..SimFaults::default() });
    let error = segment.append(&records(10, "big")).unwrap_err();
    assert_eq!(error, AppendError::Poisoned { cause: PoisonCause::NoSpace });
    assert_eq!(error.reason(), "disk_full");
}

#[test]
fn limits_refuse_before_writing() {
    let storage: Arc<dyn Storage> = Arc::new(SimStorage::new(9));
    let config = SegmentConfig {
        limits: Limits { record_bytes_max: 10, ..Limits::default() },
        ..small_config()
    };
    let segment = create(storage, &dir(), 1, config).unwrap();
    let error = segment.append(&[Record::keyed("k", vec![0u8; 20], 0)]).unwrap_err();
    assert_eq!(error.reason(), "record_too_large");
    assert_eq!(segment.status().durable_bytes, SEGMENT_HEADER_BYTES);
    assert_eq!(segment.append(&records(1, "ok")).unwrap().first_offset, 0);
}

#[test]
fn concurrent_appenders_share_syncs_and_keep_their_order() {
    let sim = SimStorage::new(10);
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    crate::storage::create_dir_durable(&*storage, Path::new("/"), &dir()).unwrap();
    // A round lingers 2 ms for more appends (the simulated disk syncs instantly).
    let committer = Committer::new(None, 1, std::time::Duration::from_micros(2_000));
    let segment = Segment::create(storage, &dir(), 1, small_config(), &committer).unwrap();
    let syncs_before = sim.sync_count();
    let threads = 8;
    let appends_per_thread = 50;
    let handles: Vec<_> = (0..threads)
        .map(|thread| {
            let segment = Arc::clone(&segment);
            std::thread::spawn(move || {
                for at in 0..appends_per_thread {
                    let record = Record::keyed(format!("t{thread}"), format!("{at}"), 0);
                    segment.append(&[record]).unwrap();
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
    let syncs = sim.sync_count() - syncs_before;
    assert!(syncs < threads * appends_per_thread, "{syncs} syncs: no group commit happened");
    let all = read_all(&segment);
    assert_eq!(all.len() as u64, threads * appends_per_thread);
    for thread in 0..threads {
        let key = Bytes::from(format!("t{thread}"));
        let values: Vec<u64> = all
            .iter()
            .filter(|stored| stored.record.key.as_ref() == Some(&key))
            .map(|stored| std::str::from_utf8(&stored.record.value).unwrap().parse().unwrap())
            .collect();
        assert_eq!(values, (0..appends_per_thread).collect::<Vec<_>>(), "thread {thread} order");
    }
}

/// One step of the crash property test.
#[derive(Clone, Debug)]
enum Step {
    /// Stage a batch without waiting, as a pipelining producer does.
    Stage(Vec<Record>),
    /// Run one group commit.
    Flush,
    Seal,
}

fn arb_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => proptest::collection::vec(arb_record(), 1..4).prop_map(Step::Stage),
        4 => Just(Step::Flush),
        1 => Just(Step::Seal),
    ]
}

/// Runs `steps` until the scheduled crash, returning what was staged, the acknowledgement
/// watermark as a caller could observe it, and the seal a caller was told about.
fn run_until_crash(segment: &Segment, steps: &[Step]) -> (Vec<Record>, u64, Option<SealInfo>) {
    let mut staged = Vec::new();
    let mut acked = 0;
    let mut seal = None;
    for step in steps {
        match step {
            Step::Stage(batch) => {
                if segment.stage(batch).is_ok() {
                    staged.extend(batch.iter().cloned());
                }
            }
            Step::Flush => {
                let _ = segment.flush();
            }
            Step::Seal => {
                if let Ok(info) = segment.seal() {
                    seal = Some(info);
                }
            }
        }
        // The durable end is the acknowledgement every waiting producer is released by.
        acked = acked.max(segment.durable_offset());
    }
    (staged, acked, seal)
}

fn crash_faults(keep_prefix: bool, tear: bool) -> SimFaults {
    SimFaults {
        crash_keeps_unsynced_prefix: keep_prefix,
        crash_tears_last_write: tear,
        ..SimFaults::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Crash at an arbitrary storage call, recover, and check: every acknowledged record is
    /// present and intact, nothing but a prefix of what was staged is served (no record after a
    /// torn frame), and an acknowledged seal keeps its exact end.
    #[test]
    fn acknowledged_records_survive_any_crash(
        seed in any::<u64>(),
        steps in proptest::collection::vec(arb_step(), 1..30),
        crash_after in 0u64..40,
        keep_prefix in any::<bool>(),
        tear in any::<bool>(),
    ) {
        let sim = SimStorage::new(seed);
        sim.set_faults(crash_faults(keep_prefix, tear));
        let storage: Arc<dyn Storage> = Arc::new(sim.clone());
        let segment = create(Arc::clone(&storage), &dir(), 1, small_config()).unwrap();
        sim.crash_after_ops(crash_after);
        let (staged, acked, seal) = run_until_crash(&segment, &steps);
        drop(segment);
        sim.restart();
        let (reopened, report) = Segment::open(Arc::clone(&storage), &dir(), 1, small_config(), &Committer::solo()).unwrap();
        prop_assert!(report.records >= acked, "recovered {} records, {} were acknowledged", report.records, acked);
        let served = read_all(&reopened);
        prop_assert_eq!(served.len() as u64, report.records);
        for (at, stored) in served.iter().enumerate() {
            prop_assert_eq!(stored.offset, at as u64);
            prop_assert_eq!(&stored.record, &staged[at], "record {} differs from what was staged", at);
        }
        if let Some(seal) = seal {
            prop_assert_eq!(reopened.status().sealed, Some(seal), "an acknowledged seal moved");
            prop_assert_eq!(reopened.append(&records(1, "x")), Err(AppendError::Sealed { end_offset: seal.end_offset }));
        }
    }

    #[test]
    fn any_batches_round_trip(batches in proptest::collection::vec(proptest::collection::vec(arb_record(), 1..5), 1..10)) {
        let storage: Arc<dyn Storage> = Arc::new(SimStorage::new(0));
        let segment = create(storage, &dir(), 1, small_config()).unwrap();
        let mut expected = Vec::new();
        for batch in &batches {
            segment.append(batch).unwrap();
            expected.extend(batch.iter().cloned());
        }
        let served: Vec<Record> = read_all(&segment).into_iter().map(|stored| stored.record).collect();
        prop_assert_eq!(served, expected);
    }
}

#[test]
fn the_crash_test_directory_is_the_one_segments_use() {
    // Guards the helper above: segment files must land where the crash test looks for them.
    let (data, index) = segment_paths(Path::new("/d"), 12);
    assert_eq!(data, PathBuf::from("/d/00000000000000000012.seg"));
    assert_eq!(index, PathBuf::from("/d/00000000000000000012.idx"));
}

/// Appenders that never stop cannot starve a seal, and every one of them is then refused at
/// exactly the sealed end.
#[test]
fn a_seal_is_not_starved_by_a_stream_of_appends() {
    let storage: Arc<dyn Storage> = Arc::new(SimStorage::new(11));
    let segment = create(storage, &dir(), 1, small_config()).unwrap();
    let appenders: Vec<_> = (0..4)
        .map(|thread| {
            let segment = Arc::clone(&segment);
            // Each appends until refused: only the seal can end it.
            std::thread::spawn(move || {
                loop {
                    match segment.append(&records(3, &format!("t{thread}"))) {
                        Ok(_) => {}
                        Err(AppendError::Sealed { end_offset }) => return end_offset,
                        Err(other) => panic!("{other:?}"),
                    }
                }
            })
        })
        .collect();
    // Seal under load: only once the appenders have made real progress.
    while segment.durable_offset() < 300 {
        std::thread::yield_now();
    }
    let seal = segment.seal().unwrap();
    for appender in appenders {
        let refused_at = appender.join().unwrap();
        assert_eq!(refused_at, seal.end_offset, "refusals name the exact sealed end");
    }
    assert!(seal.end_offset >= 300);
    assert_eq!(read_all(&segment).len() as u64, seal.end_offset);
}

/// Only a file no longer than a header, and short or zeroed, counts as unborn; it is judged by
/// what is on the disk, not by what the page cache shows.
#[test]
fn only_a_file_without_a_durable_header_is_unborn() {
    type Damage = fn(&SimStorage, &Path);
    let zero_all: Damage = |sim, path| {
        let zeros = vec![0u8; sim.written_bytes(path).unwrap().len()];
        sim.restore(path, &zeros).unwrap();
    };
    let cases: &[(&str, usize, Damage, bool)] = &[
        ("a healthy segment with records", 3, |_, _| {}, false),
        ("a healthy empty segment", 0, |_, _| {}, false),
        ("a damaged header", 3, |sim, path| sim.flip_bit(path, 0, 0).unwrap(), false),
        ("a zeroed header in front of records", 3, zero_all, false),
        ("a zeroed header alone", 0, zero_all, true),
        (
            "shorter than a header",
            0,
            |sim, path| sim.truncate(path, SEGMENT_HEADER_BYTES - 1).unwrap(),
            true,
        ),
    ];
    for (name, count, damage, unborn) in cases {
        let sim = SimStorage::new(9);
        let storage: Arc<dyn Storage> = Arc::new(sim.clone());
        let segment = create(Arc::clone(&storage), &dir(), 1, small_config()).unwrap();
        if *count > 0 {
            segment.append(&records(*count, "a")).unwrap();
        }
        let (path, _) = segment_paths(&dir(), 1);
        damage(&sim, &path);
        assert_eq!(is_unborn(&*storage, &dir(), 1).unwrap(), *unborn, "{name}");
    }
    // The header write reached the page cache, its sync failed: the disk holds no header.
    let sim = SimStorage::new(9);
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    crate::storage::create_dir_durable(&*storage, Path::new("/"), &dir()).unwrap();
    sim.fail_next_syncs(1);
    assert!(
        Segment::create(Arc::clone(&storage), &dir(), 1, small_config(), &Committer::solo())
            .is_err()
    );
    assert!(is_unborn(&*storage, &dir(), 1).unwrap(), "a header that never reached the disk");
}

/// Writes `count` records to the file without syncing them: what a process crash between
/// `pwritev` and `fdatasync` leaves in the page cache.
fn append_unsynced(storage: &Arc<dyn Storage>, count: usize) {
    let config = SegmentConfig { canary_ack_before_fsync: true, ..small_config() };
    let (segment, _) =
        Segment::open(Arc::clone(storage), &dir(), 1, config, &Committer::solo()).unwrap();
    segment.append(&records(count, "unsynced")).unwrap();
}

/// Recovery makes what it serves durable before serving it: after a process crash the page cache
/// still shows unsynced records, and a power loss later must not take back records that readers
/// (and cursors, and group commits) were shown.
#[test]
fn recovery_syncs_what_it_will_serve() {
    for trust_page_cache in [false, true] {
        let sim = SimStorage::new(21);
        let storage: Arc<dyn Storage> = Arc::new(sim.clone());
        create(Arc::clone(&storage), &dir(), 1, small_config())
            .unwrap()
            .append(&records(2, "a"))
            .unwrap();
        append_unsynced(&storage, 3);
        sim.crash_now();
        sim.restart_process();
        let config = SegmentConfig { canary_trust_page_cache: trust_page_cache, ..small_config() };
        let (segment, report) =
            Segment::open(Arc::clone(&storage), &dir(), 1, config, &Committer::solo()).unwrap();
        assert_eq!(report.records, 5, "a process crash keeps the page cache");
        drop(segment);
        sim.crash_now();
        sim.restart();
        let (_, report) =
            Segment::open(Arc::clone(&storage), &dir(), 1, small_config(), &Committer::solo())
                .unwrap();
        let survived = report.records == 5;
        assert_eq!(survived, !trust_page_cache, "trust_page_cache {trust_page_cache}");
    }
}

/// After a failed `fdatasync` the page cache shows bytes the disk never got, and they are clean,
/// so no later sync writes them. A restart (or a reopen) must see the disk, not those pages.
#[test]
fn a_failed_sync_is_not_trusted_after_a_restart() {
    for trust_page_cache in [false, true] {
        let sim = SimStorage::new(22);
        let storage: Arc<dyn Storage> = Arc::new(sim.clone());
        let segment = create(Arc::clone(&storage), &dir(), 1, small_config()).unwrap();
        segment.append(&records(2, "acked")).unwrap();
        sim.fail_next_syncs(1);
        assert!(segment.append(&records(3, "refused")).is_err());
        drop(segment);
        sim.crash_now();
        sim.restart_process();
        let config = SegmentConfig { canary_trust_page_cache: trust_page_cache, ..small_config() };
        let (segment, report) =
            Segment::open(Arc::clone(&storage), &dir(), 1, config, &Committer::solo()).unwrap();
        let served = report.records;
        let acked = segment.append(&records(1, "after")).unwrap();
        drop(segment);
        sim.crash_now();
        sim.restart();
        let (segment, _) =
            Segment::open(Arc::clone(&storage), &dir(), 1, small_config(), &Committer::solo())
                .unwrap();
        let after = read_readable(&segment);
        let kept = after
            .iter()
            .any(|stored| stored.offset == acked.first_offset && stored.record.value == "after-0");
        if trust_page_cache {
            assert_eq!(served, 5, "the canary serves the clean, unwritten pages");
            assert!(!kept, "and loses the record acknowledged after them");
        } else {
            assert_eq!(served, 2, "only what reached the disk");
            assert!(kept, "the record acknowledged after the restart survives a power loss");
        }
    }
}

/// A bad frame with valid frames of a later write after it is damage among acknowledged
/// records: kept, reported, served up to the damage, refused past it, never cut.
#[test]
fn damage_that_later_writes_follow_is_kept_not_cut() {
    for cut_damage in [false, true] {
        let sim = SimStorage::new(23);
        let storage: Arc<dyn Storage> = Arc::new(sim.clone());
        let segment = create(Arc::clone(&storage), &dir(), 1, small_config()).unwrap();
        segment.append(&records(4, "first")).unwrap();
        let second_write_at = segment.status().durable_bytes;
        segment.append(&records(4, "second")).unwrap();
        segment.append(&records(4, "third")).unwrap();
        drop(segment);
        let (path, _) = segment_paths(&dir(), 1);
        let before = sim.written_bytes(&path).unwrap();
        sim.flip_bit(&path, second_write_at + 12, 3).unwrap();
        let config = SegmentConfig { canary_cut_damage: cut_damage, ..small_config() };
        let (segment, report) =
            Segment::open(Arc::clone(&storage), &dir(), 1, config, &Committer::solo()).unwrap();
        if cut_damage {
            assert_eq!((report.records, report.damage), (4, None));
            continue;
        }
        let damage = report.damage.expect("damage is reported");
        assert_eq!((damage.offset, damage.position, damage.frames_after), (4, second_write_at, 7));
        assert_eq!(report.bytes_truncated, 0);
        assert_eq!(sim.written_bytes(&path).unwrap().len(), before.len(), "nothing is cut");
        assert_eq!(read_readable(&segment).len(), 4, "records before the damage are served");
        assert!(matches!(segment.read(4, 10, 1000), Err(ReadError::Corrupt { .. })));
        assert!(matches!(segment.read(9, 10, 1000), Err(ReadError::Corrupt { .. })));
        assert_eq!(segment.append(&records(1, "x")), Err(AppendError::Sealed { end_offset: 12 }));
        assert_eq!(
            segment.seal().unwrap(),
            SealInfo { end_offset: 12, data_bytes: before.len() as u64 }
        );
    }
}

/// Damage inside the last write, with nothing proving that write was synced, is a torn tail:
/// cut, with the valid frames cut counted for the operator.
#[test]
fn damage_inside_the_last_write_is_a_torn_tail() {
    let sim = SimStorage::new(24);
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    let segment = create(Arc::clone(&storage), &dir(), 1, small_config()).unwrap();
    segment.append(&records(2, "first")).unwrap();
    let last_write_at = segment.status().durable_bytes;
    segment.append(&records(6, "last")).unwrap();
    drop(segment);
    let (path, _) = segment_paths(&dir(), 1);
    let frame = crate::format::frame_bytes(&records(6, "last")[0]);
    sim.flip_bit(&path, last_write_at + frame + 12, 0).unwrap();
    let (segment, report) =
        Segment::open(Arc::clone(&storage), &dir(), 1, small_config(), &Committer::solo()).unwrap();
    assert_eq!((report.records, report.damage, report.valid_frames_cut), (3, None, 4));
    assert_eq!(segment.append(&records(1, "next")).unwrap().first_offset, 3);
}

/// A record may carry a whole segment frame in its value (a backup, a mirror). When such a
/// record is damaged in the last write, a frame inside it whose offset the skipped bytes could
/// not hold must not pass for a later write.
#[test]
fn a_frame_inside_a_torn_record_is_not_a_later_write() {
    let sim = SimStorage::new(26);
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    let segment = create(Arc::clone(&storage), &dir(), 1, small_config()).unwrap();
    segment.append(&records(2, "first")).unwrap();
    let torn_at = segment.status().durable_bytes;
    let mut inner = Vec::new();
    crate::format::encode_record(&mut inner, 1_000, &records(1, "inner")[0], true);
    let carrier = Record::keyed("k", Bytes::from([vec![0u8; 200], inner.clone()].concat()), 1);
    segment.append(&[carrier]).unwrap();
    drop(segment);
    let (path, _) = segment_paths(&dir(), 1);
    sim.flip_bit(&path, torn_at + 12, 1).unwrap();
    let (segment, report) =
        Segment::open(Arc::clone(&storage), &dir(), 1, small_config(), &Committer::solo()).unwrap();
    assert_eq!((report.records, report.damage, report.valid_frames_cut), (2, None, 0));
    assert_eq!(segment.append(&records(1, "next")).unwrap().first_offset, 2);
}

/// A flipped bit in a frame's length field makes the frame claim more bytes than the file has:
/// that is damage when later writes follow, never a torn tail to cut (found by the simulator:
/// seed 37 lost acknowledged records this way).
#[test]
fn a_damaged_length_is_not_a_torn_tail() {
    let sim = SimStorage::new(27);
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    let segment = create(Arc::clone(&storage), &dir(), 1, small_config()).unwrap();
    for round in 0..3 {
        segment.append(&records(2, &format!("w{round}"))).unwrap();
    }
    drop(segment);
    let (path, _) = segment_paths(&dir(), 1);
    // The third byte of the first frame's length: it now claims megabytes.
    sim.flip_bit(&path, SEGMENT_HEADER_BYTES + 4, 3).unwrap();
    let (segment, report) =
        Segment::open(Arc::clone(&storage), &dir(), 1, small_config(), &Committer::solo()).unwrap();
    assert_eq!(report.bytes_truncated, 0, "nothing is cut");
    let damage = report.damage.expect("damage, not a torn tail");
    assert_eq!((damage.offset, damage.frames_after), (0, 5));
    assert_eq!(segment.status().sealed.map(|seal| seal.end_offset), Some(6));
}

#[test]
fn a_clean_close_reopens_without_a_scan() {
    let sim = SimStorage::new(25);
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    let segment = create(Arc::clone(&storage), &dir(), 1, small_config()).unwrap();
    segment.append(&records(30, "a")).unwrap();
    let clean = segment.close_clean().expect("an idle segment closes");
    drop(segment);
    let syncs = sim.sync_count();
    let reopened = Segment::reopen_clean(
        Arc::clone(&storage),
        &dir(),
        1,
        small_config(),
        &Committer::solo(),
        clean,
    )
    .unwrap();
    assert_eq!(sim.sync_count(), syncs, "a clean reopen syncs nothing");
    assert_eq!(read_all(&reopened).len(), 30);
    assert_eq!(reopened.append(&records(1, "b")).unwrap().first_offset, 30);
    let stale = CleanClose { durable_offset: 29, durable_bytes: clean.durable_bytes - 1, ..clean };
    assert!(matches!(
        Segment::reopen_clean(
            Arc::clone(&storage),
            &dir(),
            1,
            small_config(),
            &Committer::solo(),
            stale
        ),
        Err(OpenError::Changed)
    ));
}

/// Segments sharing a node's committer, on one simulated disk.
/// `syncfs`: whether rounds end with one filesystem sync rather than one `fdatasync` per file.
fn node_segments(
    sim: &SimStorage,
    count: u64,
    syncfs: bool,
) -> (Arc<Committer>, Vec<Arc<Segment>>) {
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    crate::storage::create_dir_durable(&*storage, Path::new("/"), &dir()).unwrap();
    let filesystem = syncfs.then(|| storage.filesystem_sync(&dir()).unwrap());
    let committer = Committer::new(filesystem, 4, std::time::Duration::ZERO);
    let segments = (1..=count)
        .map(|id| Segment::create(Arc::clone(&storage), &dir(), id, small_config(), &committer))
        .collect::<Result<_, _>>()
        .unwrap();
    (committer, segments)
}

/// Records staged in many segments become durable in one round with one barrier (one
/// `syncfs`, or one `fdatasync` per file issued together): the node waits once, not once per
/// segment.
#[test]
fn one_round_makes_every_staged_segment_durable_with_one_barrier() {
    for (count, syncfs) in [(1u64, true), (4, true), (32, true), (256, true), (32, false)] {
        let sim = SimStorage::new(30);
        let (committer, segments) = node_segments(&sim, count, syncfs);
        let tickets: Vec<AppendTicket> =
            segments.iter().map(|segment| segment.stage(&records(3, "s")).unwrap()).collect();
        let syncs = sim.sync_count();
        segments[0].wait_durable(tickets[0]).unwrap();
        let expected_syncs = if syncfs { 1 } else { count };
        assert_eq!(sim.sync_count() - syncs, expected_syncs, "{count} segments, one round");
        for (segment, ticket) in segments.iter().zip(&tickets) {
            assert_eq!(segment.durable_offset(), ticket.end_offset, "{count} segments");
        }
        let stats = committer.stats();
        assert_eq!((stats.rounds, stats.batches), (1, count));
        assert_eq!(
            (stats.file_syncs, stats.filesystem_syncs),
            if count == 1 || !syncfs { (count, 0) } else { (0, 1) }
        );
        sim.restart();
        for segment_id in 1..=count {
            let (_, report) = Segment::open(
                Arc::new(sim.clone()),
                &dir(),
                segment_id,
                small_config(),
                &Committer::solo(),
            )
            .unwrap();
            assert_eq!(report.records, 3, "durable through a power loss");
        }
    }
}

/// A failed `syncfs` cannot say whose pages it lost: every segment of its round fails, and so
/// does every segment of the next round (whose pages may have been the ones written back).
#[test]
fn a_failed_filesystem_sync_fails_its_round_and_the_next() {
    let sim = SimStorage::new(31);
    let (_, segments) = node_segments(&sim, 4, true);
    let staged = |at: std::ops::Range<usize>| -> Vec<AppendTicket> {
        at.map(|index| segments[index].stage(&records(2, "x")).unwrap()).collect()
    };
    let first = staged(0..2);
    sim.fail_next_syncs(1);
    assert!(segments[0].wait_durable(first[0]).is_err());
    assert!(segments[1].wait_durable(first[1]).is_err());
    let second = staged(2..4);
    assert!(segments[2].wait_durable(second[0]).is_err(), "the round after a failed syncfs");
    assert!(segments[3].wait_durable(second[1]).is_err());
    for segment in &segments {
        assert!(segment.status().poisoned.is_some());
        assert_eq!(segment.durable_offset(), 0, "nothing acknowledged");
    }
}

/// Many threads appending to many segments of one node: every acknowledged record survives a
/// power loss.
#[test]
fn concurrent_appends_to_many_segments_survive_a_power_loss() {
    let sim = SimStorage::new(32);
    sim.set_faults(crash_faults(true, true));
    let (committer, segments) = node_segments(&sim, 16, false);
    let acked: Vec<u64> = std::thread::scope(|scope| {
        let handles: Vec<_> = segments
            .iter()
            .map(|segment| {
                scope.spawn(move || {
                    let mut acked = 0;
                    for round in 0..20 {
                        if segment.append(&records(2, &format!("r{round}"))).is_err() {
                            break;
                        }
                        acked += 2;
                    }
                    acked
                })
            })
            .collect();
        handles.into_iter().map(|handle| handle.join().unwrap()).collect()
    });
    assert_eq!(committer.stats().batches, acked.iter().sum::<u64>() / 2, "one batch per append");
    sim.crash_now();
    sim.restart();
    for (index, acked) in acked.iter().enumerate() {
        let (segment, _) = Segment::open(
            Arc::new(sim.clone()),
            &dir(),
            index as u64 + 1,
            small_config(),
            &Committer::solo(),
        )
        .unwrap();
        assert!(segment.durable_offset() >= *acked, "segment {index}: acknowledged records lost");
    }
}

/// A segment file the fuzzer (`fuzz/`, target `segment_scan`) found that once broke recovery or
/// verify, byte for byte, with what each must make of it.
struct FuzzerFoundFile {
    name: &'static str,
    hex: &'static str,
    /// Records left by a read-write open, and the bytes it cut.
    records: u64,
    bytes_cut: u64,
    /// Whether a read-only open reports damage.
    damaged: bool,
    /// Where verify reports bad frames.
    bad_frames: &'static [u64],
}

const FUZZER_FOUND_FILES: &[FuzzerFoundFile] = &[
    FuzzerFoundFile {
        // Header: segment 1, base offset 1. Then a checksum-valid seal trailer at position 32
        // counting 0 records: trusted as the file's end, it made the record count 0 - 1 (a
        // subtract overflow at open). It cannot be this file's trailer, so recovery scans.
        name: "a trailer counting fewer records than the base offset",
        hex: "4d4c5347 0100 2000 0100000000000000 0100000000000000 00000000 4eb2b918 \
              534c 14000000 69bfe4d1 0000000000000000 2000000000000000 00000000",
        records: 0,
        bytes_cut: 30,
        damaged: true,
        bad_frames: &[32],
    },
    FuzzerFoundFile {
        // Header: segment 1, base offset 0. Then a checksum-valid record frame at offset
        // u64::MAX: verify expected offset u64::MAX + 1 after it (an add overflow). No record
        // can sit there (the next offset would not fit): `check_frame` refuses it everywhere.
        name: "a record at the last offset",
        hex: "4d4c5347 0100 2000 0100000000000000 0000000000000000 00000000 7e66c829 \
              5246 1f000000 f1254927 ffffffffffffffff e903000000000000 00 00000000 02000000 \
              00000000 0000",
        records: 0,
        bytes_cut: 41,
        damaged: true,
        bad_frames: &[32],
    },
    FuzzerFoundFile {
        // Header: segment 1, base offset u64::MAX. Then a checksum-valid record frame at that
        // offset, the next one expected: recovery counted past it (an add overflow at open).
        // Found reading the scan after the file above, then reproduced with the fuzz target.
        name: "a record at the last offset, where the base offset puts it",
        hex: "4d4c5347 0100 2000 0100000000000000 ffffffffffffffff 00000000 a961808e \
              5246 1e000000 406100de ffffffffffffffff e903000000000000 04 00000000 01000000 \
              00000000 76",
        records: 0,
        bytes_cut: 40,
        damaged: true,
        bad_frames: &[32],
    },
];

#[test]
fn files_the_fuzzer_found_open_and_verify_without_panicking() {
    for found in FUZZER_FOUND_FILES {
        let name = found.name;
        let file = unhex(found.hex);
        let storage = storage_holding(&file);
        let report = verify_segment(&*storage, &dir(), 1).expect(name);
        let bad_frames: Vec<u64> = report.bad_frames.iter().map(|bad| bad.position).collect();
        assert_eq!(bad_frames, found.bad_frames, "{name}");

        let (segment, report) =
            Segment::open(storage, &dir(), 1, small_config(), &Committer::solo()).expect(name);
        assert_eq!((report.records, report.bytes_truncated), (found.records, found.bytes_cut));
        assert_eq!(segment.status().durable_bytes, file.len() as u64 - found.bytes_cut, "{name}");

        let storage = storage_holding(&file);
        let (segment, _) =
            Segment::open_read_only(storage, &dir(), 1, small_config(), &Committer::solo())
                .expect(name);
        assert_eq!(segment.status().damage.is_some(), found.damaged, "{name}");
    }
}

/// A simulated disk holding `file` durably as segment 1 of [`dir`].
fn storage_holding(file: &[u8]) -> Arc<dyn Storage> {
    let storage: Arc<dyn Storage> = Arc::new(SimStorage::new(7));
    crate::storage::create_dir_durable(&*storage, Path::new("/"), &dir()).unwrap();
    let handle = storage.open(&segment_paths(&dir(), 1).0, OpenMode::CreateNew).unwrap();
    handle.write_all_at(&[file], 0).unwrap();
    handle.sync_data().unwrap();
    storage
}

fn unhex(hex: &str) -> Vec<u8> {
    let digits: Vec<u8> = hex.bytes().filter(u8::is_ascii_hexdigit).collect();
    let value = |digit: u8| (digit as char).to_digit(16).expect("a hex digit") as u8;
    digits.chunks(2).map(|pair| value(pair[0]) << 4 | value(pair[1])).collect()
}
