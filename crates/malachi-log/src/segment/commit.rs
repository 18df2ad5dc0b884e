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

use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use std::time::Duration;

use std::path::PathBuf;

use super::Segment;
use super::core::FlushJob;
use crate::error::PoisonCause;
use crate::journal::{Journal, JournalEntry};
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
    /// Rounds made durable by the node journal (one write and one `fdatasync` each).
    pub journal_rounds: u64,
    /// Checkpoints: segment files written behind the journal, synced so it could start over.
    pub checkpoints: u64,
}

/// What the group commit reports for operators (`/metrics`): the broker registers these same
/// histograms (clones share their counts) in its registry.
#[derive(Clone, Debug)]
pub struct CommitMetrics {
    /// Seconds one round takes to make its writes durable: the journal's write and
    /// `fdatasync` (by default), or the segment files' writes and `fdatasync`s or `syncfs`.
    pub sync_seconds: Histogram,
    /// Bytes one round wrote, over every segment it made durable.
    pub round_bytes: Histogram,
    /// Segments one round made durable.
    pub round_segments: Histogram,
}

impl Default for CommitMetrics {
    fn default() -> CommitMetrics {
        CommitMetrics {
            // 50 us to about 1.6 s.
            sync_seconds: Histogram::new(exponential_buckets(50e-6, 2.0, 16)),
            // 1 KiB to 64 MiB.
            round_bytes: Histogram::new(exponential_buckets(1024.0, 4.0, 9)),
            // 1 to 1,024.
            round_segments: Histogram::new(exponential_buckets(1.0, 2.0, 11)),
        }
    }
}

/// The node's group commit; shared by every segment the node has open.
#[derive(Debug)]
pub struct Committer {
    metrics: CommitMetrics,
    /// The barrier for rounds of several segments: `syncfs` through this handle, or (`None`)
    /// `fdatasync` of each written file.
    filesystem: Option<Box<dyn FilesystemSync>>,
    /// Threads that issue a round's `fdatasync`s together (1: one after the other, as the
    /// simulator needs, whose schedule must not depend on OS threads).
    parallel_syncs: usize,
    /// How long a round leader waits for more records before it starts.
    linger: Duration,
    /// The node journal, for rounds of several segments (see `crate::journal`).
    journal: Option<Mutex<JournalState>>,
    /// Signalled when a checkpoint run beside the rounds ends.
    checkpoint_finished: Condvar,
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
    /// A checkpoint failed: segment files hold acknowledged bytes the disk may not, which only
    /// replaying the journal after a restart restores. Every round fails until then.
    failed: bool,
    stats: CommitStats,
}

#[derive(Debug)]
struct JournalState {
    journal: Journal,
    /// The directory entries' paths are relative to.
    root: PathBuf,
    /// Segments written behind the journal since the last checkpoint began (each once). They
    /// stay open until the next one: their files must be synced before the journal lets go of
    /// their bytes.
    behind: Vec<Arc<Segment>>,
    /// More segments than this behind the journal begin a checkpoint, and a round that finds
    /// them while one runs waits for it, so that the segments held open (at most twice this,
    /// and two rounds') never crowd out the node's open-segment cap and file descriptors.
    behind_max: usize,
    /// A checkpoint is syncing files beside the rounds ([`Committer::checkpoint_if_due`]).
    checkpointing: bool,
    /// A journal write or sync failed: it is not used again in this process.
    broken: bool,
    /// The eighth of the journal at which write-back behind it was last started.
    eighths_kicked: u64,
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
            metrics: CommitMetrics::default(),
            filesystem,
            parallel_syncs: parallel_syncs.max(1),
            linger,
            journal: None,
            checkpoint_finished: Condvar::new(),
            state: Mutex::new(CommitState::default()),
            round_done: Condvar::new(),
        })
    }

    /// A committer whose rounds of several segments go through `journal` (opened, and so
    /// replayed, before any segment it will see), entries naming files relative to `root`.
    pub fn with_journal(
        filesystem: Option<Box<dyn FilesystemSync>>,
        parallel_syncs: usize,
        linger: Duration,
        journal: Journal,
        (root, behind_max): (PathBuf, usize),
    ) -> Arc<Committer> {
        let behind_max = behind_max.max(2);
        let state = JournalState {
            journal,
            root,
            behind: Vec::new(),
            behind_max,
            checkpointing: false,
            broken: false,
            eighths_kicked: 0,
        };
        Arc::new(Committer {
            metrics: CommitMetrics::default(),
            filesystem,
            parallel_syncs: parallel_syncs.max(1),
            linger,
            journal: Some(Mutex::new(state)),
            checkpoint_finished: Condvar::new(),
            state: Mutex::new(CommitState::default()),
            round_done: Condvar::new(),
        })
    }

    /// Whether a failed sync stopped all writes until a restart (only behind a journal).
    pub fn failed(&self) -> bool {
        self.lock().failed
    }

    /// A segment file's `fdatasync` failed. Behind a journal the pages it dropped may hold
    /// acknowledged bytes written behind it, which only a replay restores: nothing may recover
    /// (and cut) that file in this process, so the committer stops taking writes and the node
    /// must restart. Without a journal the segment's own poison is enough.
    pub fn sync_failed(&self) {
        if self.journal.is_some() {
            self.lock().failed = true;
        }
    }

    /// A committer for a segment used on its own: each round syncs its files one by one.
    pub fn solo() -> Arc<Committer> {
        Committer::new(None, 1, Duration::ZERO)
    }

    pub fn stats(&self) -> CommitStats {
        self.lock().stats
    }

    /// The histograms this committer's rounds fill.
    pub fn metrics(&self) -> &CommitMetrics {
        &self.metrics
    }

    /// Registers a segment that has just staged its first pending record.
    /// Lets go of the segments held open behind the journal, unsynced, for an owner that goes
    /// away (a broker that stops): the journal holds their bytes and the next open replays it,
    /// as after a crash. Each of them holds this committer, so until then neither is freed (the
    /// simulator, which runs many brokers in one process, kept every stopped one's disk).
    pub fn release_segments(&self) {
        let behind = self.lock_journal().map(|mut state| std::mem::take(&mut state.behind));
        drop(behind);
    }

    /// At a clean stop: syncs every segment file written behind the journal and empties it, so
    /// the next open replays nothing. Returns whether it did; if not (no journal, or a sync or
    /// the header write failed), the journal keeps every entry and the next open replays them,
    /// as after a crash. Rounds may run beside it or after it as at any other checkpoint.
    pub fn checkpoint_at_close(&self) -> bool {
        let Some(journal) = self.lock_journal() else { return false };
        let (journal, checkpointed) = self.checkpoint(journal);
        drop(journal);
        if checkpointed.is_ok() {
            self.lock().stats.checkpoints += 1;
        }
        checkpointed.is_ok()
    }

    pub(crate) fn mark_dirty(&self, segment: Weak<Segment>) {
        self.lock().dirty.push(segment);
    }

    /// Waits until `done` holds, running rounds while nobody else is. `done` is checked before
    /// each wait and after each round; it must become true once a round took what it waits for.
    /// A round leader also runs a checkpoint that came due, after its round and beside the next.
    pub(crate) fn wait_until(&self, mut done: impl FnMut() -> bool) {
        loop {
            // `done` locks a segment; never hold the committer's lock across it.
            if done() {
                return;
            }
            let state = self.lock();
            if state.running {
                let finished = state.finished;
                drop(
                    self.round_done
                        .wait_while(state, |state| state.running && state.finished == finished)
                        .expect("committer lock poisoned"),
                );
            } else {
                self.run_round(state);
                self.checkpoint_if_due();
            }
        }
    }

    /// One round: take every dirty segment's batch, write them, one barrier, publish.
    fn run_round(&self, mut state: MutexGuard<'_, CommitState>) {
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
        let fail_this = std::mem::take(&mut state.fail_next) || state.failed;
        drop(state);
        let jobs: Vec<(Arc<Segment>, FlushJob)> = dirty
            .iter()
            .filter_map(Weak::upgrade)
            .filter_map(|segment| segment.take_job().map(|job| (segment, job)))
            .collect();
        // Measured for operators only: nothing decides on it.
        let started = std::time::Instant::now();
        let journaled = if fail_this { None } else { self.journaled_round(&jobs) };
        let (outcomes, barrier) = match journaled {
            Some(done) => done,
            None => self.write_and_sync(&jobs, fail_this),
        };
        let batches = jobs.len();
        if batches > 0 {
            let bytes: usize = jobs.iter().map(|(_, job)| job.buffer.len()).sum();
            self.metrics.sync_seconds.observe(started.elapsed().as_secs_f64());
            self.metrics.round_bytes.observe(bytes as f64);
            self.metrics.round_segments.observe(batches as f64);
        }
        for ((segment, job), outcome) in jobs.into_iter().zip(outcomes) {
            segment.finish_job(job, outcome);
        }
        let mut state = self.lock();
        match barrier {
            Barrier::Filesystem(Err(())) => state.fail_next = true,
            Barrier::Journal { checkpoint: Some(Err(())), .. } => state.failed = true,
            _ => {}
        }
        state.stats.record(barrier, batches);
        state.running = false;
        state.finished += 1;
        self.round_done.notify_all();
    }

    /// A round through the journal: the entries are written and synced there first, then each
    /// segment's bytes are written behind (no sync). `None` when the journal is not for this
    /// round (no journal, a broken one, a round larger than the journal, the canary); the caller
    /// then writes and syncs the segment files themselves.
    fn journaled_round(
        &self,
        jobs: &[(Arc<Segment>, FlushJob)],
    ) -> Option<(Vec<Result<(), PoisonCause>>, Barrier)> {
        let mut journal = self.lock_journal()?;
        // Every round goes through the journal while it works, even a round of one segment: a
        // segment written around the journal could later be overwritten by a replay of an
        // older journal entry for the same bytes (one whose write behind had failed).
        if journal.broken || jobs.is_empty() {
            return None;
        }
        // The canary: the journal is written but not synced before the acknowledgement.
        let sync = !jobs.iter().any(|(segment, _)| segment.skips_sync());
        let root = journal.root.clone();
        let entries: Vec<JournalEntry<'_>> = jobs
            .iter()
            .map(|(segment, job)| JournalEntry {
                path: segment.path_under(&root),
                position: job.position,
                bytes: &job.buffer,
            })
            .collect();
        let mut checkpoints = 0;
        if entries.iter().any(|entry| !journal.journal.could_fit(std::slice::from_ref(entry))) {
            // One batch is larger than the journal: the round goes around it, after a
            // checkpoint, so that no older entry for these files can ever be replayed over it.
            let (journal, checkpointed) = self.checkpoint(journal);
            drop(journal);
            if checkpointed.is_err() {
                return Some(self.fail_round(jobs, "a journal checkpoint failed", Some(Err(()))));
            }
            self.lock().stats.checkpoints += 1;
            return None;
        }
        if journal.behind.len() > journal.behind_max {
            // Crowded while a checkpoint runs: it must finish before more files are held open.
            journal = self.wait_for_checkpoint(journal);
        }
        let mut outcomes = Vec::with_capacity(jobs.len());
        let mut start = 0;
        while start < jobs.len() {
            // As many entries as fit; if not even one does, the running checkpoint may free
            // enough, else one here.
            if !journal.journal.fits(&entries[start..=start]) {
                journal = self.wait_for_checkpoint(journal);
            }
            if !journal.journal.fits(&entries[start..=start]) {
                checkpoints += 1;
                let checkpointed;
                (journal, checkpointed) = self.checkpoint(journal);
                if checkpointed.is_err() {
                    return Some(self.fail_round(
                        jobs,
                        "a journal checkpoint failed",
                        Some(Err(())),
                    ));
                }
            }
            let mut end = start + 1;
            while end < jobs.len() && journal.journal.fits(&entries[start..=end]) {
                end += 1;
            }
            if let Err(error) = journal.journal.write_round(&entries[start..end], sync) {
                // Stop depending on the journal: what was written behind it must be durable.
                let checkpointed;
                (journal, checkpointed) = self.checkpoint(journal);
                journal.broken = true;
                let checkpoint = Some(checkpointed);
                let kind = error.kind();
                let mut failed = self.fail_round(jobs, "a journal write failed", checkpoint);
                failed.0.iter_mut().for_each(|outcome| *outcome = Err(PoisonCause::Sync(kind)));
                return Some(failed);
            }
            // Behind the journal before any later checkpoint, which syncs what is behind it.
            for (segment, job) in &jobs[start..end] {
                let outcome = segment.write_job(job);
                if outcome.is_ok() {
                    segment.nudge_writeback(job);
                }
                // A failed write behind is in the journal all the same; the segment poisons.
                if outcome.is_ok() && !journal.behind.iter().any(|held| Arc::ptr_eq(held, segment))
                {
                    journal.behind.push(Arc::clone(segment));
                }
                outcomes.push(outcome);
            }
            start = end;
        }
        if outcomes.iter().any(Result::is_err) {
            // A batch whose write behind failed is in the journal, yet its segment will be
            // reopened at the same end and written over by other batches; replaying it then
            // would bring its records back over (and past) theirs (found by the soak: seed
            // 100786, repeated writes at one position during a full disk). A checkpoint, before
            // anyone learns of the failure, puts it out of replay's reach.
            checkpoints += 1;
            let checkpointed;
            (journal, checkpointed) = self.checkpoint(journal);
            if checkpointed.is_err() {
                drop(journal);
                return Some(self.fail_round(jobs, "a journal checkpoint failed", Some(Err(()))));
            }
        }
        // Each eighth of the journal, start writing back everything behind it, so that the
        // checkpoint at its end finds the files mostly written and stalls its round briefly.
        let eighths = journal.journal.eighths_used();
        if eighths != journal.eighths_kicked {
            journal.eighths_kicked = eighths;
            journal.behind.iter().for_each(|segment| segment.start_writeback_all());
        }
        let checkpoint = (checkpoints > 0).then_some(Ok(()));
        Some((outcomes, Barrier::Journal { checkpoint }))
    }

    /// Every job of a round fails, for `why`.
    fn fail_round(
        &self,
        jobs: &[(Arc<Segment>, FlushJob)],
        why: &str,
        checkpoint: Option<Result<(), ()>>,
    ) -> (Vec<Result<(), PoisonCause>>, Barrier) {
        let error = std::io::Error::other(why.to_string());
        (vec![Err(PoisonCause::Sync(error.kind())); jobs.len()], Barrier::Journal { checkpoint })
    }

    /// After a round, by its leader with no lock held: when half the journal is used since the
    /// last checkpoint, or more segments than allowed are held open behind it, begins a
    /// checkpoint and syncs the files behind it while other threads go on running rounds. A
    /// failed sync stops the committer (see [`Committer::checkpoint`]).
    fn checkpoint_if_due(&self) {
        let Some(mut journal) = self.lock_journal() else { return };
        let due = journal.journal.eighths_used() >= 4 || journal.behind.len() > journal.behind_max;
        // Never after a failed sync: the journal must keep every entry for the restart's replay.
        if journal.broken || journal.checkpointing || !due || self.lock().failed {
            return;
        }
        let mark = journal.journal.mark();
        let behind = std::mem::take(&mut journal.behind);
        journal.checkpointing = true;
        drop(journal);
        let synced = self.sync_behind(&behind);
        let mut journal = self.lock_journal().expect("a journal");
        journal.checkpointing = false;
        self.checkpoint_finished.notify_all();
        // Again: a sync that failed elsewhere meanwhile may have dropped bytes behind the mark.
        let failed = self.lock().failed;
        if synced.is_err()
            || failed
            || journal.broken
            || journal.journal.checkpoint_done(mark).is_err()
        {
            journal.broken = true;
            self.lock().failed = true;
        }
        self.lock().stats.checkpoints += 1;
    }

    /// Waits for a checkpoint running beside the rounds to end.
    fn wait_for_checkpoint<'a>(
        &'a self,
        journal: MutexGuard<'a, JournalState>,
    ) -> MutexGuard<'a, JournalState> {
        self.checkpoint_finished
            .wait_while(journal, |journal| journal.checkpointing)
            .expect("journal lock poisoned")
    }

    /// Syncs every segment file written behind the journal and lets it start over, after any
    /// checkpoint running beside the rounds (whose files would otherwise be declared durable
    /// before they are). On failure the journal keeps everything (nothing is rewound) and the
    /// committer stops taking writes: only a restart's replay can restore what the failed
    /// syncs dropped.
    fn checkpoint<'a>(
        &'a self,
        journal: MutexGuard<'a, JournalState>,
    ) -> (MutexGuard<'a, JournalState>, Result<(), ()>) {
        let mut journal = self.wait_for_checkpoint(journal);
        let behind = std::mem::take(&mut journal.behind);
        // Never after a failed sync anywhere (see `checkpoint_if_due`).
        if journal.broken
            || self.sync_behind(&behind).is_err()
            || self.lock().failed
            || journal.journal.checkpoint_now().is_err()
        {
            journal.broken = true;
            return (journal, Err(()));
        }
        (journal, Ok(()))
    }

    /// Syncs the files of segments written behind the journal: one `syncfs` if configured,
    /// else their `fdatasync`s together.
    fn sync_behind(&self, behind: &[Arc<Segment>]) -> Result<(), ()> {
        let synced = match &self.filesystem {
            Some(filesystem) if behind.len() > 1 => vec![filesystem.sync_all()],
            _ => {
                let segments: Vec<&Segment> = behind.iter().map(|segment| &**segment).collect();
                self.sync_files(&segments)
            }
        };
        if synced.iter().any(Result::is_err) { Err(()) } else { Ok(()) }
    }

    fn lock_journal(&self) -> Option<MutexGuard<'_, JournalState>> {
        Some(self.journal.as_ref()?.lock().expect("journal lock poisoned"))
    }

    /// Writes every job, then makes the written ones durable together. Returns each job's
    /// outcome and which barrier ran.
    fn write_and_sync(
        &self,
        jobs: &[(Arc<Segment>, FlushJob)],
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
    /// The journal's write and sync, after a checkpoint if one was needed.
    Journal {
        checkpoint: Option<Result<(), ()>>,
    },
}

impl CommitStats {
    fn record(&mut self, barrier: Barrier, batches: usize) {
        match barrier {
            Barrier::None | Barrier::Forced => return,
            Barrier::Files(count) => self.file_syncs += count,
            Barrier::Filesystem(_) => self.filesystem_syncs += 1,
            Barrier::Journal { checkpoint } => {
                self.journal_rounds += 1;
                self.checkpoints += u64::from(checkpoint.is_some());
            }
        }
        self.rounds += 1;
        self.batches += batches as u64;
    }
}
