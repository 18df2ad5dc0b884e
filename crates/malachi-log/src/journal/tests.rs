//! The journal alone (rounds, replay, checkpoints) and under a committer of many segments,
//! through power losses at every point.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::*;
use crate::record::Record;
use crate::segment::{Committer, Segment, SegmentConfig};
use crate::storage::{SimFaults, SimStorage, create_dir_durable};

fn root() -> PathBuf {
    PathBuf::from("/node")
}

fn sim_with_root(seed: u64) -> (SimStorage, Arc<dyn Storage>) {
    let sim = SimStorage::new(seed);
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    create_dir_durable(&*storage, Path::new("/"), &root().join("segments")).unwrap();
    (sim, storage)
}

/// A file the journal replays into.
fn target(storage: &Arc<dyn Storage>, name: &str) -> PathBuf {
    let path = root().join("segments").join(name);
    storage.open(&path, OpenMode::CreateNew).unwrap();
    storage.sync_dir(&root().join("segments")).unwrap();
    PathBuf::from("segments").join(name)
}

#[test]
fn durable_rounds_are_replayed_into_their_files_and_a_torn_one_is_not() {
    let (sim, storage) = sim_with_root(1);
    let (a, b) = (target(&storage, "a"), target(&storage, "b"));
    let (mut journal, report) = Journal::open(&storage, &root(), JOURNAL_BYTES_MIN).unwrap();
    assert_eq!(report, ReplayReport::default(), "a new journal has nothing to replay");
    let round = |bytes_a: &'static [u8], at_a, bytes_b: &'static [u8], at_b| {
        [
            JournalEntry { path: &a, position: at_a, bytes: bytes_a },
            JournalEntry { path: &b, position: at_b, bytes: bytes_b },
        ]
    };
    journal.write_round(&round(b"hello", 0, b"wor", 0), true).unwrap();
    journal.write_round(&round(b" there", 5, b"ld", 3), true).unwrap();
    // A third round reaches the page cache only, then the power goes.
    sim.set_faults(SimFaults { crash_keeps_unsynced_prefix: false, ..SimFaults::default() });
    let third = round(b"!!", 11, b"??", 5);
    let buffer = {
        let mut buffer = Vec::new();
        for entry in &third {
            encode_entry(&mut buffer, 3, entry);
        }
        buffer
    };
    journal.file.write_all_at(&[&buffer], journal.position).unwrap();
    drop(journal);
    sim.restart();
    let (_, report) = Journal::open(&storage, &root(), JOURNAL_BYTES_MIN).unwrap();
    assert_eq!((report.rounds, report.entries, report.files), (2, 4, 2));
    let file_a = sim.durable_bytes(&root().join(&a)).unwrap();
    let file_b = sim.durable_bytes(&root().join(&b)).unwrap();
    assert_eq!((&file_a[..], &file_b[..]), (&b"hello there"[..], &b"world"[..]));
}

#[test]
fn a_checkpoint_starts_over_and_replay_ignores_the_previous_lap() {
    let (sim, storage) = sim_with_root(2);
    let a = target(&storage, "a");
    let (mut journal, _) = Journal::open(&storage, &root(), JOURNAL_BYTES_MIN).unwrap();
    let chunk = vec![7u8; 100_000];
    let mut rounds_before_rewind = 0;
    let mut position = 0;
    loop {
        let entry = [JournalEntry { path: &a, position, bytes: &chunk }];
        if !journal.fits(&entry) {
            break;
        }
        journal.write_round(&entry, true).unwrap();
        position += chunk.len() as u64;
        rounds_before_rewind += 1;
    }
    assert!(rounds_before_rewind >= 9, "a 1 MiB journal holds {rounds_before_rewind} rounds");
    // The checkpoint promises the file is durable: make it so, as the committer does.
    let file = storage.open(&root().join(&a), OpenMode::Existing).unwrap();
    file.write_all_at(&[&vec![7u8; position as usize]], 0).unwrap();
    file.sync_data().unwrap();
    journal.checkpoint_now().unwrap();
    let late = [JournalEntry { path: &a, position, bytes: b"late" }];
    journal.write_round(&late, true).unwrap();
    drop(journal);
    sim.restart();
    let (_, report) = Journal::open(&storage, &root(), JOURNAL_BYTES_MIN).unwrap();
    assert_eq!((report.rounds, report.entries), (1, 1), "only the round after the checkpoint");
    let bytes = sim.durable_bytes(&root().join(&a)).unwrap();
    assert_eq!(&bytes[position as usize..], b"late");
}

/// A checkpoint begun at a mark while rounds go on: the rounds after the mark wrap to the front
/// once the end is reached, never over the mark's round, and replay reads them across the wrap.
#[test]
fn rounds_after_a_mark_wrap_to_the_front_and_replay_across_the_wrap() {
    let (sim, storage) = sim_with_root(5);
    let a = target(&storage, "a");
    let (mut journal, _) = Journal::open(&storage, &root(), JOURNAL_BYTES_MIN).unwrap();
    let chunk_bytes = 100_000u64;
    let chunk = |round: u64| vec![u8::try_from(round).unwrap(); chunk_bytes as usize];
    let write = |journal: &mut Journal, round: u64| {
        let bytes = chunk(round);
        let entry = [JournalEntry { path: &a, position: round * chunk_bytes, bytes: &bytes }];
        let fits = journal.fits(&entry);
        if fits {
            journal.write_round(&entry, true).unwrap();
        }
        fits
    };
    for round in 0..6 {
        assert!(write(&mut journal, round));
    }
    // Rounds 0-5 are made durable in the file, as the checkpoint's syncs would.
    let mark = journal.mark();
    let file = storage.open(&root().join(&a), OpenMode::Existing).unwrap();
    let synced: Vec<u8> = (0..6).flat_map(chunk).collect();
    file.write_all_at(&[&synced], 0).unwrap();
    file.sync_data().unwrap();
    let mut round = 6;
    while write(&mut journal, round) {
        round += 1;
    }
    let before_checkpoint = round;
    assert!(before_checkpoint < 12, "without the checkpoint the mark's round is kept");
    journal.checkpoint_done(mark).unwrap();
    while write(&mut journal, round) {
        round += 1;
    }
    assert!(round >= before_checkpoint + 5, "the front was free: {before_checkpoint}..{round}");
    // The rounds after the mark reached the journal only.
    drop((journal, file));
    sim.crash_now();
    sim.restart();
    let (_, report) = Journal::open(&storage, &root(), JOURNAL_BYTES_MIN).unwrap();
    assert_eq!(report.rounds, round - 6, "every round since the mark, across the wrap");
    let expected: Vec<u8> = (0..round).flat_map(chunk).collect();
    assert_eq!(sim.durable_bytes(&root().join(&a)).unwrap(), expected);
}

#[test]
fn entries_of_a_deleted_file_are_skipped() {
    let (sim, storage) = sim_with_root(3);
    let a = target(&storage, "a");
    let (mut journal, _) = Journal::open(&storage, &root(), JOURNAL_BYTES_MIN).unwrap();
    journal.write_round(&[JournalEntry { path: &a, position: 0, bytes: b"x" }], true).unwrap();
    storage.remove(&root().join(&a)).unwrap();
    storage.sync_dir(&root().join("segments")).unwrap();
    drop(journal);
    sim.restart();
    let (_, report) = Journal::open(&storage, &root(), JOURNAL_BYTES_MIN).unwrap();
    assert_eq!((report.entries, report.skipped), (0, 1));
    assert!(!storage.exists(&root().join(&a)).unwrap(), "replay never creates a file");
}

fn records(count: usize, tag: &str) -> Vec<Record> {
    let filler = "x".repeat(200);
    (0..count)
        .map(|at| Record::keyed(format!("k{}", at % 3), format!("{tag}-{at}-{filler}"), 1))
        .collect()
}

/// A node of `count` segments whose rounds go through a small journal (so checkpoints
/// happen every few rounds).
fn journaled_node(storage: &Arc<dyn Storage>, count: u64) -> (Arc<Committer>, Vec<Arc<Segment>>) {
    journaled_node_syncing(storage, count, 1)
}

/// As [`journaled_node`], with up to `parallel_syncs` `fdatasync`s at once.
fn journaled_node_syncing(
    storage: &Arc<dyn Storage>,
    count: u64,
    parallel_syncs: usize,
) -> (Arc<Committer>, Vec<Arc<Segment>>) {
    let (journal, _) = Journal::open(storage, &root(), JOURNAL_BYTES_MIN).unwrap();
    let committer = Committer::with_journal(
        None,
        parallel_syncs,
        std::time::Duration::ZERO,
        journal,
        (root(), 1024),
    );
    let dir = root().join("segments");
    let segments = (1..=count)
        .map(|id| {
            Segment::open(Arc::clone(storage), &dir, id, SegmentConfig::default(), &committer)
                .map(|(segment, _)| segment)
                .or_else(|_| {
                    Segment::create(
                        Arc::clone(storage),
                        &dir,
                        id,
                        SegmentConfig::default(),
                        &committer,
                    )
                })
                .unwrap()
        })
        .collect();
    (committer, segments)
}

/// Rounds of many segments cost one journal write and sync, not one sync per segment.
#[test]
fn a_round_of_many_segments_is_one_journal_sync() {
    let (sim, storage) = sim_with_root(4);
    let (committer, segments) = journaled_node(&storage, 32);
    let tickets: Vec<_> =
        segments.iter().map(|segment| segment.stage(&records(3, "r")).unwrap()).collect();
    let syncs = sim.sync_count();
    segments[0].wait_durable(tickets[0]).unwrap();
    assert_eq!(sim.sync_count() - syncs, 1, "one fdatasync, the journal's");
    let stats = committer.stats();
    assert_eq!((stats.journal_rounds, stats.batches, stats.file_syncs), (1, 32, 0));
    for (segment, ticket) in segments.iter().zip(tickets) {
        assert_eq!(segment.durable_offset(), ticket.end_offset);
    }
}

/// Segments written behind the journal hold its committer, and it holds them until the next
/// checkpoint: an owner that goes away releases them, or the committer, its journal and every
/// such segment's file stay in memory for good (the simulator's soaks grew by 20 MB a seed).
#[test]
fn released_segments_free_the_committer() {
    let (_sim, storage) = sim_with_root(4);
    let (committer, segments) = journaled_node(&storage, 8);
    let tickets: Vec<_> =
        segments.iter().map(|segment| segment.stage(&records(3, "r")).unwrap()).collect();
    for (segment, ticket) in segments.iter().zip(tickets) {
        segment.wait_durable(ticket).unwrap();
    }
    let held = Arc::downgrade(&committer);
    let segment_held = Arc::downgrade(&segments[0]);
    drop(segments);
    assert!(segment_held.upgrade().is_some(), "written behind the journal, held until released");
    committer.release_segments();
    drop(committer);
    assert!(held.upgrade().is_none(), "the committer outlived its owner");
    assert!(segment_held.upgrade().is_none(), "a segment outlived its owner");
}

/// The crash property for the journal: rounds of many segments, checkpoints among them, and a
/// power loss before any mutating call; after the restart (replay, then segment recovery)
/// every acknowledged record is there.
#[test]
fn acknowledged_records_survive_a_power_loss_anywhere_around_the_journal() {
    for crash_after in (0..600).step_by(11).chain([u64::MAX]) {
        let (sim, storage) = sim_with_root(crash_after.wrapping_add(100));
        sim.set_faults(SimFaults {
            crash_keeps_unsynced_prefix: crash_after % 2 == 0,
            crash_tears_last_write: true,
            ..SimFaults::default()
        });
        let acked = {
            let (committer, segments) = journaled_node(&storage, 6);
            sim.crash_after_ops(crash_after);
            let mut acked = vec![0u64; segments.len()];
            'rounds: for round in 0..60 {
                let tickets: Vec<_> = segments
                    .iter()
                    .map(|segment| segment.stage(&records(40, &format!("{round}"))))
                    .collect();
                for (at, ticket) in tickets.into_iter().enumerate() {
                    let Ok(ticket) = ticket else { break 'rounds };
                    if segments[at].wait_durable(ticket).is_err() {
                        break 'rounds;
                    }
                    acked[at] = ticket.end_offset;
                }
            }
            if crash_after == u64::MAX {
                assert!(committer.stats().checkpoints >= 2, "{:?}", committer.stats());
            }
            drop(committer);
            acked
        };
        sim.crash_now();
        sim.restart();
        let (_, segments) = journaled_node(&storage, 6);
        for (at, segment) in segments.iter().enumerate() {
            assert!(
                segment.durable_offset() >= acked[at],
                "crash after {crash_after} ops: segment {at} holds {} of {} acknowledged",
                segment.durable_offset(),
                acked[at]
            );
        }
    }
}

/// Writers on threads of their own, so that rounds run while a checkpoint syncs the files
/// behind the journal and wrap around its mark; then a power loss. Every acknowledged record
/// is there after the restart, and the run did checkpoint beside rounds.
#[test]
fn rounds_beside_a_running_checkpoint_lose_nothing_at_a_power_loss() {
    const WRITERS: usize = 4;
    const SEGMENTS_PER_WRITER: usize = 2;
    for seed in 0..8u64 {
        let (sim, storage) = sim_with_root(seed + 300);
        let segment_count = (WRITERS * SEGMENTS_PER_WRITER) as u64;
        let (committer, segments) = journaled_node_syncing(&storage, segment_count, 4);
        let segments = Arc::new(segments);
        let writers: Vec<_> = (0..WRITERS)
            .map(|writer| {
                let segments = Arc::clone(&segments);
                std::thread::spawn(move || {
                    let mine = writer * SEGMENTS_PER_WRITER..(writer + 1) * SEGMENTS_PER_WRITER;
                    let mut acked = vec![0u64; SEGMENTS_PER_WRITER];
                    for round in 0..40 {
                        for (slot, at) in mine.clone().enumerate() {
                            let tag = format!("{writer}-{round}");
                            let ticket = segments[at].stage(&records(30, &tag)).unwrap();
                            segments[at].wait_durable(ticket).unwrap();
                            acked[slot] = ticket.end_offset;
                        }
                    }
                    acked
                })
            })
            .collect();
        let acked: Vec<u64> =
            writers.into_iter().flat_map(|writer| writer.join().unwrap()).collect();
        let stats = committer.stats();
        assert!(stats.checkpoints >= 3, "seed {seed}: {stats:?}");
        drop((committer, segments));
        sim.crash_now();
        sim.restart();
        let (_, segments) = journaled_node(&storage, segment_count);
        for (at, segment) in segments.iter().enumerate() {
            assert_eq!(segment.durable_offset(), acked[at], "seed {seed}: segment {at}");
        }
    }
}

/// Found by the soak (seed 102643): a segment reopened after a failed write synced its file at
/// open, and that sync failed, dropping acknowledged bytes written behind the journal; the
/// committer went on, a later checkpoint let the journal forget them, and recovery cut them.
/// A failed sync at open now stops the committer (no more rounds, no checkpoint), and a restart
/// replays the journal: everything acknowledged is there.
#[test]
fn a_failed_sync_when_a_segment_reopens_stops_the_committer_and_loses_nothing() {
    let (sim, storage) = sim_with_root(7);
    let acked = {
        let (committer, segments) = journaled_node(&storage, 2);
        let mut acked = Vec::new();
        for (at, segment) in segments.iter().enumerate() {
            let ticket = segment.stage(&records(20, &format!("s{at}"))).unwrap();
            segment.wait_durable(ticket).unwrap();
            acked.push(ticket.end_offset);
        }
        // Reopened (as after a poisoned write), and its open-time sync fails.
        sim.fail_next_syncs(1);
        let dir = root().join("segments");
        let reopened =
            Segment::open(Arc::clone(&storage), &dir, 1, SegmentConfig::default(), &committer);
        assert!(reopened.is_err(), "the failed sync fails the open");
        assert!(committer.failed(), "the committer stops until a restart replays the journal");
        let refused = segments[1].stage(&records(1, "after"));
        if let Ok(ticket) = refused {
            assert!(segments[1].wait_durable(ticket).is_err(), "no round after the failure");
        }
        acked
    };
    sim.restart_process();
    let (_, segments) = journaled_node(&storage, 2);
    for (at, segment) in segments.iter().enumerate() {
        // The refused record may survive too (a process crash keeps what was written).
        assert!(segment.durable_offset() >= acked[at], "segment {at}: {acked:?}");
    }
}

/// Found by the soak (seed 100786): during a full disk, a batch reached the journal but not its
/// segment (the segment grows; the preallocated journal does not); the segment was reopened at
/// the same end and a shorter batch written there. Replaying both put the failed batch's tail
/// after the acknowledged one, as records. A failed write behind now checkpoints the journal
/// before the failure is reported, so the failed batch is never replayed.
#[test]
fn a_batch_whose_write_behind_failed_is_never_replayed_over_later_ones() {
    let (sim, storage) = sim_with_root(8);
    let dir = root().join("segments");
    let acked = {
        let (committer, segments) = journaled_node(&storage, 1);
        let first = segments[0].stage(&records(2, "first")).unwrap();
        segments[0].wait_durable(first).unwrap();
        // The disk is full: the journal (preallocated) takes the batch, the segment does not.
        let full = SimFaults { capacity_bytes: Some(sim.used_bytes()), ..SimFaults::default() };
        sim.set_faults(full);
        // Frames of the same size as the later batch's, so that the failed batch's second
        // frame starts where the later batch ends, with the next offset: it would pass as a
        // record.
        let failed = segments[0].stage(&records(4, "fail")).unwrap();
        assert!(segments[0].wait_durable(failed).is_err(), "the segment cannot grow");
        sim.set_faults(SimFaults::default());
        // Reopened at its durable end, as the broker does with a poisoned head.
        let (reopened, _) =
            Segment::open(Arc::clone(&storage), &dir, 1, SegmentConfig::default(), &committer)
                .unwrap();
        let later = reopened.stage(&records(1, "late")).unwrap();
        reopened.wait_durable(later).unwrap();
        later.end_offset
    };
    sim.crash_now();
    sim.restart();
    let (_, segments) = journaled_node(&storage, 1);
    assert_eq!(segments[0].durable_offset(), acked, "nothing of the failed batch came back");
    let read = segments[0].read(0, 100, 1 << 20).unwrap();
    let last = read.records.last().unwrap();
    assert!(String::from_utf8_lossy(&last.record.value).starts_with("late-0"), "{last:?}");
}

/// A journal whose header a newer release wrote (a version after this one's) is refused by
/// name, with the file untouched: replaying entries of a layout this release does not know could
/// write garbage into segment files.
#[test]
fn a_journal_of_a_newer_release_is_refused_and_left_alone() {
    let (_sim, storage) = sim_with_root(9);
    drop(Journal::open(&storage, &root(), JOURNAL_BYTES_MIN).unwrap());
    let path = root().join(JOURNAL_FILE);
    let file = storage.open(&path, OpenMode::Existing).unwrap();
    let mut header = [0u8; 32];
    file.read_at(&mut header, 0).unwrap();
    header[4..6].copy_from_slice(&(HEADER_VERSION + 1).to_le_bytes());
    let crc = crc32c::crc32c(&header[0..24]);
    header[24..28].copy_from_slice(&crc.to_le_bytes());
    file.write_all_at(&[&header], 0).unwrap();
    file.sync_data().unwrap();
    let Err(refused) = Journal::open(&storage, &root(), JOURNAL_BYTES_MIN) else {
        panic!("a journal of a newer release was opened");
    };
    assert!(refused.to_string().contains("written by a newer release"), "{refused}");
    let mut after = [0u8; 32];
    file.read_at(&mut after, 0).unwrap();
    assert_eq!(after, header, "the header is left as the newer release wrote it");
}

/// A clean stop empties the journal: everything written behind it is synced into the segment
/// files, so a power loss right after loses nothing and the next open replays nothing. Without
/// the close the same rounds are replayed (the journal alone held them durably).
#[test]
fn a_checkpoint_at_close_leaves_nothing_to_replay() {
    for close in [true, false] {
        let (sim, storage) = sim_with_root(7);
        let acked = {
            let (committer, segments) = journaled_node(&storage, 4);
            let tickets: Vec<_> =
                segments.iter().map(|segment| segment.stage(&records(5, "c")).unwrap()).collect();
            for (segment, ticket) in segments.iter().zip(&tickets) {
                segment.wait_durable(*ticket).unwrap();
            }
            assert_eq!(committer.stats().checkpoints, 0, "nothing checkpointed before the close");
            if close {
                assert!(committer.checkpoint_at_close(), "the journal empties");
            }
            committer.release_segments();
            tickets.iter().map(|ticket| ticket.end_offset).collect::<Vec<_>>()
        };
        sim.crash_now();
        sim.restart();
        let (_, report) = Journal::open(&storage, &root(), JOURNAL_BYTES_MIN).unwrap();
        let replayed = if close { 0 } else { 4 };
        assert_eq!(report.entries, replayed, "close {close}: {report:?}");
        let (_, segments) = journaled_node(&storage, 4);
        for (segment, acked) in segments.iter().zip(acked) {
            assert_eq!(segment.durable_offset(), acked, "close {close}");
        }
    }
}

/// Without a journal there is nothing to empty at close.
#[test]
fn a_checkpoint_at_close_without_a_journal_does_nothing() {
    assert!(!Committer::solo().checkpoint_at_close());
}
