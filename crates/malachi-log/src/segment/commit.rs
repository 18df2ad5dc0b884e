//! Group commit for a whole node: one round makes every segment with staged records durable.
//!
//! A broker holds hundreds or thousands of segments, and a per-segment group commit that syncs
//! each segment on its own schedule does not scale with them (measured: 32 ranges ran at 0.11 of
//! one range's throughput, about 15 `fdatasync`s per produce request). So segments stage
//! records and register as dirty here; a *round* then takes the staged batch of every dirty
//! segment, writes each with one vectored write, and makes them all durable with one barrier,
//! then moves their durable ends. The barrier is `fdatasync` of every written file, issued
//! together from a few threads (the filesystem's journal folds concurrent syncs into one
//! commit), or, when configured for a data directory on a filesystem of its own, one `syncfs`.
//! `syncfs` measured faster here, but it also flushes every other writer of the filesystem, so
//! on a shared one a build or a log file sets our latency.
//!
//! Rounds are leader/follower, like the per-segment group commit they replace: whoever waits
//! for durability and finds no round running runs one; everyone else waits for the round that
//! covers their records. What is staged while a round runs goes into the next one, so a busy
//! node runs back-to-back rounds with everything that arrived during the previous barrier.
//!
//! A failed barrier is never retried and never attributed more finely than it can be: a failed
//! `fdatasync` poisons its segment; a failed `syncfs` poisons every segment of its round *and*
//! of the next one, because Linux reports a writeback error to the first `syncfs` after it,
//! which may be the round running while a later round's pages were being written back.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

use super::Segment;
use crate::error::PoisonCause;
use crate::storage::FilesystemSync;

/// Durable writes of a node, and how many barriers they cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Rounds that wrote at least one segment.
    pub rounds: u64,
    /// Segment batches those rounds wrote.
    pub batches: u64,
    /// `fdatasync` calls of rounds that wrote one segment (or had no filesystem barrier).
    pub file_syncs: u64,
    /// `syncfs` calls of rounds that wrote several.
    pub filesystem_syncs: u64,
}

/// The node's group commit; shared by every segment the node has open.
#[derive(Debug)]
pub struct Committer {
    /// The barrier for rounds of several segments: `syncfs` through this handle, or (`None`)
    /// `fdatasync` of each written file.
    filesystem: Option<Box<dyn FilesystemSync>>,
    /// Threads that issue a round's `fdatasync`s together (1: one after the other, as the
    /// simulator needs, whose schedule must not depend on OS threads).
    parallel_syncs: usize,
    /// How long a round leader waits for more records before it starts.
    linger: Duration,
    state: Mutex<CommitState>,
    /// Signalled when a round ends.
    round_done: Condvar,
}

#[derive(Debug, Default)]
struct CommitState {
    /// Segments that staged records since a round last took their batch.
    dirty: Vec<Weak<Segment>>,
    running: bool,
    /// Rounds finished so far.
    finished: u64,
    /// The previous round's `syncfs` failed: this one fails too (see the module header).
    fail_next: bool,
    stats: CommitStats,
}

impl Committer {
    /// A committer whose rounds of several segments end with one `syncfs` through `filesystem`,
    /// or with `fdatasync` of each file, up to `parallel_syncs` at a time.
    pub fn new(
        filesystem: Option<Box<dyn FilesystemSync>>,
        parallel_syncs: usize,
        linger: Duration,
    ) -> Arc<Committer> {
        Arc::new(Committer {
            filesystem,
            parallel_syncs: parallel_syncs.max(1),
            linger,
            state: Mutex::new(CommitState::default()),
            round_done: Condvar::new(),
        })
    }

    /// A committer for a segment used on its own: each round syncs its files one by one.
    pub fn solo() -> Arc<Committer> {
        Committer::new(None, 1, Duration::ZERO)
    }

    pub fn stats(&self) -> CommitStats {
        self.lock().stats
    }

    /// Registers a segment that has just staged its first pending record.
    pub(crate) fn mark_dirty(&self, segment: Weak<Segment>) {
        self.lock().dirty.push(segment);
    }

    /// Waits until `done` holds, running rounds while nobody else is. `done` is checked before
    /// each wait and after each round; it must become true once a round took what it waits for.
    pub(crate) fn wait_until(&self, mut done: impl FnMut() -> bool) {
        let mut state = self.lock();
        loop {
            // `done` locks a segment; never hold the committer's lock across it.
            drop(state);
            if done() {
                return;
            }
            state = self.lock();
            if state.running {
                let finished = state.finished;
                state = self
                    .round_done
                    .wait_while(state, |state| state.running && state.finished == finished)
                    .expect("committer lock poisoned");
            } else {
                state = self.run_round(state);
            }
        }
    }

    /// One round: take every dirty segment's batch, write them, one barrier, publish.
    fn run_round<'a>(
        &'a self,
        mut state: MutexGuard<'a, CommitState>,
    ) -> MutexGuard<'a, CommitState> {
        state.running = true;
        if !self.linger.is_zero() {
            // Let more records arrive; a round signal (none while we run) cannot end it early.
            state = self
                .round_done
                .wait_timeout(state, self.linger)
                .expect("committer lock poisoned")
                .0;
        }
        let dirty = std::mem::take(&mut state.dirty);
        let fail_this = std::mem::take(&mut state.fail_next);
        drop(state);
        let jobs: Vec<(Arc<Segment>, super::core::FlushJob)> = dirty
            .iter()
            .filter_map(Weak::upgrade)
            .filter_map(|segment| segment.take_job().map(|job| (segment, job)))
            .collect();
        let (outcomes, barrier) = self.write_and_sync(&jobs, fail_this);
        let batches = jobs.len();
        for ((segment, job), outcome) in jobs.into_iter().zip(outcomes) {
            segment.finish_job(job, outcome);
        }
        let mut state = self.lock();
        if let Barrier::Filesystem(Err(())) = barrier {
            state.fail_next = true;
        }
        state.stats.record(barrier, batches);
        state.running = false;
        state.finished += 1;
        self.round_done.notify_all();
        state
    }

    /// Writes every job, then makes the written ones durable together. Returns each job's
    /// outcome and which barrier ran.
    fn write_and_sync(
        &self,
        jobs: &[(Arc<Segment>, super::core::FlushJob)],
        fail_this: bool,
    ) -> (Vec<Result<(), PoisonCause>>, Barrier) {
        let mut outcomes: Vec<Result<(), PoisonCause>> =
            jobs.iter().map(|(segment, job)| segment.write_job(job)).collect();
        // The canary acknowledges its segments' batches without any barrier.
        let written: Vec<usize> = (0..jobs.len())
            .filter(|&at| outcomes[at].is_ok() && !jobs[at].0.skips_sync())
            .collect();
        let failed = |error: &std::io::Error| PoisonCause::Sync(error.kind());
        let barrier = if written.is_empty() {
            Barrier::None
        } else if fail_this {
            // The previous syncfs reported an error that may have been this round's pages.
            let error = std::io::Error::other("a writeback error reported to the previous syncfs");
            for &at in &written {
                outcomes[at] = Err(failed(&error));
            }
            Barrier::Forced
        } else if let (Some(filesystem), true) = (&self.filesystem, written.len() > 1) {
            let synced = filesystem.sync_all();
            if let Err(error) = &synced {
                for &at in &written {
                    outcomes[at] = Err(failed(error));
                }
            }
            Barrier::Filesystem(synced.map_err(|_| ()))
        } else {
            // Never retried: after a failed fdatasync the kernel may have dropped the pages.
            let segments: Vec<&Segment> = written.iter().map(|&at| &*jobs[at].0).collect();
            for (&at, synced) in written.iter().zip(self.sync_files(&segments)) {
                if let Err(error) = synced {
                    outcomes[at] = Err(failed(&error));
                }
            }
            Barrier::Files(written.len() as u64)
        };
        (outcomes, barrier)
    }

    /// `fdatasync` of every segment's file, up to `parallel_syncs` at once; one result each.
    fn sync_files(&self, segments: &[&Segment]) -> Vec<std::io::Result<()>> {
        let threads = self.parallel_syncs.min(segments.len());
        if threads <= 1 {
            return segments.iter().map(|segment| segment.sync_file()).collect();
        }
        let next = std::sync::atomic::AtomicUsize::new(0);
        let results: Vec<Mutex<Option<std::io::Result<()>>>> =
            segments.iter().map(|_| Mutex::new(None)).collect();
        let work = || {
            loop {
                let at = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(segment) = segments.get(at) else { return };
                *results[at].lock().expect("sync result lock poisoned") = Some(segment.sync_file());
            }
        };
        std::thread::scope(|scope| {
            for _ in 1..threads {
                scope.spawn(work);
            }
            work();
        });
        results
            .into_iter()
            .map(|result| {
                result.into_inner().expect("sync result lock poisoned").expect("every file synced")
            })
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, CommitState> {
        self.state.lock().expect("committer lock poisoned")
    }
}

/// What made a round durable.
#[derive(Clone, Copy, Debug)]
enum Barrier {
    None,
    /// Failed without a barrier, for the previous `syncfs`'s error.
    Forced,
    Files(u64),
    Filesystem(Result<(), ()>),
}

impl CommitStats {
    fn record(&mut self, barrier: Barrier, batches: usize) {
        match barrier {
            Barrier::None | Barrier::Forced => return,
            Barrier::Files(count) => self.file_syncs += count,
            Barrier::Filesystem(_) => self.filesystem_syncs += 1,
        }
        self.rounds += 1;
        self.batches += batches as u64;
    }
}
