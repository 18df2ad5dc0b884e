//! This node's segment files: where they live, which are open, and the blocking calls into
//! `malachi-log` made off the async threads.
//!
//! Layout under the data directory: `topics/<topic_id>/<range_id>/<segment_id>.seg` (+ `.idx`).
//! Segments are opened lazily. The first open of a file in this process is a recovery (the file
//! is synced and read as it is on the disk, never as the page cache shows it); a segment that
//! went idle and was closed to stay under the open-handle cap reopens from what it was when it
//! closed, without a scan. The data plane decides nothing: metadata says which segments exist,
//! which is active, when to seal and what to delete, and the caller hands that in ([`Listed`]).
//!
//! Concurrency: the map of open handles is behind one short lock that is never held across I/O;
//! opening, creating and removing one segment is serialised by that segment's own gate, so a
//! delete can never interleave with a create of the same file (no orphan files), and the
//! blocking part runs where the [`IoMode`] says.

use malachi_log::canary;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use malachi_log::journal::Journal;
use malachi_log::{
    AppendError, AppendTicket, CleanClose, CommitStats, Committer, OpenError, ReadBatch, ReadError,
    Record, RecoveryReport, SealError, SealInfo, Segment, SegmentConfig, Storage,
    create_dir_durable, segment_paths,
};

/// Names one segment on this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SegmentKey {
    pub topic_id: u64,
    pub range_id: u32,
    pub segment_id: u64,
}

/// What metadata says of a segment, as far as its file is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listed {
    /// Active, and this node never reported its file created: a missing file is a create that
    /// has not happened yet (or crashed before it did) and is created now.
    ActiveUnborn,
    /// Active, and this node reported its file created: a missing file is damage.
    ActiveCreated,
    /// Sealed at this record count: a missing or headerless file is damage.
    Sealed { end_offset: u64 },
}

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error(transparent)]
    Append(#[from] AppendError),
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Seal(#[from] SealError),
    #[error("opening segment {key:?}: {source}")]
    Open { key: SegmentKey, source: OpenError },
    /// Metadata lists the segment, and its file is missing or cannot be a segment: lost or
    /// damaged data, reported and kept, never recreated empty.
    #[error("segment {key:?} is damaged: {detail}")]
    Damaged { key: SegmentKey, detail: String },
    /// Metadata no longer lists the segment (its topic was deleted, retention expired it).
    #[error("segment {0:?} no longer exists")]
    Gone(SegmentKey),
    /// The segment's replicas are on other brokers of the cluster, not this one.
    #[error("segment {key:?} is held by brokers {holders:?}, not this one")]
    Elsewhere { key: SegmentKey, holders: Vec<u64> },
    #[error("storage: {0}")]
    Io(#[from] io::Error),
}

/// How a round of the group commit that wrote several segments makes them durable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Barrier {
    /// One sequential write and `fdatasync` of the node journal; the segment files are written
    /// behind and synced at checkpoints (`malachi_log::journal`).
    #[default]
    Journal,
    /// `fdatasync` of each written file, issued together.
    Files,
    /// One `syncfs` of the data directory's filesystem: faster on a filesystem of its own, but
    /// it also flushes every other writer of a shared one.
    Filesystem,
}

/// Threads that issue one round's `fdatasync`s together.
const PARALLEL_SYNCS: usize = 16;

/// What a data plane's group commit is made of.
struct CommitSetup<'a> {
    config: &'a SegmentConfig,
    io_mode: IoMode,
    barrier: Barrier,
    journal_bytes: u64,
    open_segments_max: usize,
}

fn committer_for(
    storage: &Arc<dyn Storage>,
    data_dir: &Path,
    commit: CommitSetup<'_>,
) -> io::Result<Arc<Committer>> {
    let parallel = if commit.io_mode == IoMode::Inline { 1 } else { PARALLEL_SYNCS };
    let linger = std::time::Duration::from_micros(commit.config.group_commit.linger_us);
    match commit.barrier {
        Barrier::Journal => {
            let (journal, report) = Journal::open(storage, data_dir, commit.journal_bytes)?;
            if report.entries > 0 {
                tracing::info!(?report, "replayed the node journal into the segment files");
            }
            // Half the open-segment cap may be held open behind the journal, twice while a
            // checkpoint runs beside the rounds: at most the cap again (most of them are the
            // active segments the cap counts anyway).
            let behind = (data_dir.to_path_buf(), commit.open_segments_max / 2);
            Ok(Committer::with_journal(None, parallel, linger, journal, behind))
        }
        // Opened before any segment write, so it sees every write-back error after boot.
        Barrier::Filesystem => {
            Ok(Committer::new(Some(storage.filesystem_sync(data_dir)?), parallel, linger))
        }
        Barrier::Files => Ok(Committer::new(None, parallel, linger)),
    }
}

/// Where blocking storage calls run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IoMode {
    /// On the runtime's blocking threads, so an `fdatasync` never stalls an async worker.
    #[default]
    Threads,
    /// On the calling task: for the deterministic simulator, whose disk answers at once and
    /// whose schedule must not depend on OS threads.
    Inline,
}

/// A segment as [`DataPlane::open`] returns it.
#[derive(Debug)]
pub struct Opened {
    pub segment: Arc<Segment>,
    /// This call opened the file (it was not open): the caller may act on what it found.
    pub fresh: bool,
    /// Metadata has not heard that this node's file exists (it was created now, or by a call
    /// whose report was lost): the caller reports it.
    pub report_created: bool,
    /// This call created the file: it holds nothing, and nothing of it was ever shipped.
    pub created: bool,
}

/// Recovery reports kept for inspection.
const RECOVERIES_KEPT_MAX: usize = 1024;

/// Handles kept open at once unless configured otherwise (`MALACHI_MAX_OPEN_SEGMENTS`); idle
/// segments beyond it, least recently used first, are closed and reopen on their next use.
pub const OPEN_SEGMENTS_MAX_DEFAULT: usize = 1024;

/// Least recently used handles looked at per insert when closing beyond the cap; busy ones are
/// skipped, so the cap may be exceeded while every old handle is in use.
const EVICTION_CANDIDATES_MAX: usize = 32;

/// Segment files of one node.
#[derive(Debug)]
pub struct DataPlane {
    io_mode: IoMode,
    storage: Arc<dyn Storage>,
    /// The data directory, durable since boot: new directories below it are made durable.
    data_dir: PathBuf,
    root: PathBuf,
    config: SegmentConfig,
    /// The node's group commit: every segment's staged records are made durable together.
    committer: Arc<Committer>,
    open_segments_max: usize,
    /// Shared with the blocking open tasks, which register what they open before they let go
    /// of the segment's gate.
    open: Arc<Mutex<OpenSegments>>,
    /// One gate per segment being opened, created or removed.
    gates: Mutex<BTreeMap<SegmentKey, Arc<tokio::sync::Mutex<()>>>>,
    /// Range directories made durable by this process.
    durable_dirs: Mutex<BTreeSet<(u64, u32)>>,
    /// Recovery reports of segments opened since start (the most recent ones), for operators.
    recoveries: Mutex<VecDeque<(SegmentKey, RecoveryReport)>>,
    /// The simulator's canary: directories are created without syncing their parents.
    canary_skip_dir_sync: bool,
}

impl Drop for DataPlane {
    /// The segments the journal holds open behind it hold its committer: released here, or a
    /// stopped broker's journal, segments and files would never be freed.
    fn drop(&mut self) {
        self.committer.release_segments();
    }
}

#[derive(Debug)]
struct Handle {
    segment: Arc<Segment>,
    last_use: u64,
}

/// Open handles with least-recently-used closing; every operation is O(log n).
#[derive(Debug, Default)]
struct OpenSegments {
    handles: BTreeMap<SegmentKey, Handle>,
    /// Handles by last use, oldest first.
    by_use: BTreeMap<u64, SegmentKey>,
    /// Segments closed while idle, with what they held: they reopen without recovery. Any
    /// other open (after a restart, after a failed write) recovers from the disk.
    closed: BTreeMap<SegmentKey, CleanClose>,
    /// Bumped by every use; a handle's `last_use` is the value at its last use.
    uses: u64,
}

impl OpenSegments {
    fn get(&mut self, key: &SegmentKey) -> Option<Arc<Segment>> {
        let handle = self.handles.get_mut(key)?;
        self.uses += 1;
        self.by_use.remove(&handle.last_use);
        handle.last_use = self.uses;
        self.by_use.insert(self.uses, *key);
        Some(Arc::clone(&handle.segment))
    }

    fn is(&self, key: &SegmentKey, segment: &Arc<Segment>) -> bool {
        self.handles.get(key).is_some_and(|handle| Arc::ptr_eq(&handle.segment, segment))
    }

    /// Inserts a handle and closes idle ones beyond `max`, least recently used first. Returns
    /// the closed handles, to be dropped (closing their files) outside the lock.
    fn insert(&mut self, key: SegmentKey, segment: Arc<Segment>, max: usize) -> Vec<Arc<Segment>> {
        self.remove(&key);
        self.closed.remove(&key);
        self.uses += 1;
        self.by_use.insert(self.uses, key);
        self.handles.insert(key, Handle { segment, last_use: self.uses });
        let mut closed = Vec::new();
        let excess = self.handles.len().saturating_sub(max);
        if excess == 0 {
            return closed;
        }
        let candidates: Vec<(u64, SegmentKey)> = self
            .by_use
            .iter()
            .take(EVICTION_CANDIDATES_MAX)
            .map(|(&last_use, &key)| (last_use, key))
            .collect();
        for (last_use, candidate) in candidates {
            if closed.len() == excess {
                break;
            }
            let segment = &self.handles[&candidate].segment;
            // Held elsewhere means in use (an append, a read): a second handle on one file
            // must never exist, so only an unshared handle may close.
            if Arc::strong_count(segment) > 1 {
                continue;
            }
            let Some(clean) = segment.close_clean() else { continue };
            self.by_use.remove(&last_use);
            let handle = self.handles.remove(&candidate).expect("indexed by use");
            self.closed.insert(candidate, clean);
            closed.push(handle.segment);
        }
        closed
    }

    fn remove(&mut self, key: &SegmentKey) -> Option<Arc<Segment>> {
        let handle = self.handles.remove(key)?;
        self.by_use.remove(&handle.last_use);
        Some(handle.segment)
    }

    fn len(&self) -> usize {
        self.handles.len()
    }
}

impl DataPlane {
    /// The data plane of the node whose data directory `data_dir` exists, durably.
    pub fn new(
        storage: Arc<dyn Storage>,
        data_dir: &Path,
        config: SegmentConfig,
    ) -> io::Result<DataPlane> {
        DataPlane::with_io_mode(storage, data_dir, config, IoMode::Threads)
    }

    pub fn with_io_mode(
        storage: Arc<dyn Storage>,
        data_dir: &Path,
        config: SegmentConfig,
        io_mode: IoMode,
    ) -> io::Result<DataPlane> {
        let commit = CommitSetup {
            config: &config,
            io_mode,
            barrier: Barrier::Files,
            journal_bytes: 0,
            open_segments_max: OPEN_SEGMENTS_MAX_DEFAULT,
        };
        let committer = committer_for(&storage, data_dir, commit)?;
        Ok(DataPlane {
            io_mode,
            storage,
            data_dir: data_dir.to_path_buf(),
            root: data_dir.join("topics"),
            config,
            committer,
            open_segments_max: OPEN_SEGMENTS_MAX_DEFAULT,
            open: Arc::new(Mutex::new(OpenSegments::default())),
            gates: Mutex::new(BTreeMap::new()),
            durable_dirs: Mutex::new(BTreeSet::new()),
            recoveries: Mutex::new(VecDeque::new()),
            canary_skip_dir_sync: false,
        })
    }

    /// How rounds of several segments become durable (`MALACHI_GROUP_COMMIT_BARRIER`): through
    /// the node journal of `journal_bytes` (opened and replayed here, before any segment), one
    /// `syncfs`, or an `fdatasync` per file. Before the first segment opens.
    pub fn with_barrier(mut self, barrier: Barrier, journal_bytes: u64) -> io::Result<DataPlane> {
        assert_eq!(self.open_segments(), 0, "the barrier is chosen before segments open");
        let commit = CommitSetup {
            config: &self.config,
            io_mode: self.io_mode,
            barrier,
            journal_bytes,
            open_segments_max: self.open_segments_max,
        };
        self.committer = committer_for(&self.storage, &self.data_dir, commit)?;
        Ok(self)
    }

    /// At a clean stop, after everything else: syncs the segment files written behind the
    /// node journal and empties it, so the next start replays nothing (see
    /// [`Committer::checkpoint_at_close`]). Returns whether it did. Blocks on file syncs.
    pub fn checkpoint_at_close(&self) -> bool {
        self.committer.checkpoint_at_close()
    }

    /// Whether the group commit stopped taking writes (a journal checkpoint failed): only a
    /// restart, replaying the journal, makes the node writable again.
    pub fn commit_failed(&self) -> bool {
        self.committer.failed()
    }

    /// Rounds of the node's group commit so far, and the barriers they cost.
    pub fn commit_stats(&self) -> CommitStats {
        self.committer.stats()
    }

    /// The group commit's histograms (round latency and sizes), for the broker's registry.
    pub fn commit_metrics(&self) -> malachi_log::CommitMetrics {
        self.committer.metrics().clone()
    }

    /// The simulator's canary (see `Canaries::skip_dir_sync`); never set elsewhere.
    pub fn with_canary_skip_dir_sync(mut self, on: bool) -> DataPlane {
        self.canary_skip_dir_sync = on;
        self
    }

    /// Caps the handles kept open (at least 2: an active segment and one being read).
    pub fn with_open_segments_max(mut self, max: usize) -> DataPlane {
        self.open_segments_max = max.max(2);
        self
    }

    pub fn config(&self) -> &SegmentConfig {
        &self.config
    }

    fn range_dir(&self, topic_id: u64, range_id: u32) -> PathBuf {
        self.root.join(topic_id.to_string()).join(range_id.to_string())
    }

    /// `(durable_offset, durable_bytes)` of a segment that is open or closed cleanly; no I/O.
    pub fn durable_end(&self, key: SegmentKey) -> Option<(u64, u64)> {
        self.durable_state(key).map(|state| (state.durable_offset, state.durable_bytes))
    }

    /// Where a segment that is open, or closed cleanly, ends and whether it is sealed (what a
    /// clean close would record now); no I/O, and nothing opened.
    pub fn durable_state(&self, key: SegmentKey) -> Option<CleanClose> {
        // The segment's own lock may be held across a seal's fsync: never wait for it while
        // holding the map's.
        let segment = {
            let open = self.lock_open();
            match open.handles.get(&key) {
                Some(handle) => Arc::clone(&handle.segment),
                None => return open.closed.get(&key).copied(),
            }
        };
        let status = segment.status();
        Some(CleanClose {
            durable_offset: status.durable_offset,
            durable_bytes: status.durable_bytes,
            sealed: status.sealed.is_some(),
        })
    }

    /// The handle if the segment is open now; no I/O.
    pub fn peek(&self, key: SegmentKey) -> Option<Arc<Segment>> {
        self.lock_open().get(&key)
    }

    /// The open segment, opening (recovering, or creating) its file on first use. `listed` is
    /// asked under the segment's gate, right before any file is touched, so an answer about a
    /// segment being deleted is never stale by the time a file would be created.
    ///
    /// Cancellation-safe: the gate travels with the blocking work, and the task registers the
    /// handle it opened before letting the gate go, so a caller that stops waiting never leaves
    /// a half-done open that a second open could race (two handles on one file could both
    /// write).
    pub async fn open(
        &self,
        key: SegmentKey,
        listed: impl FnOnce() -> Option<Listed>,
    ) -> Result<Opened, DataError> {
        if let Some(segment) = self.usable(key) {
            return Ok(Opened { segment, fresh: false, report_created: false, created: false });
        }
        let gate = self.gate(key);
        let held = Arc::clone(&gate).lock_owned().await;
        let outcome = self.open_gated(key, listed, held).await;
        self.release_gate(key, gate);
        outcome
    }

    async fn open_gated(
        &self,
        key: SegmentKey,
        listed: impl FnOnce() -> Option<Listed>,
        held: tokio::sync::OwnedMutexGuard<()>,
    ) -> Result<Opened, DataError> {
        if let Some(segment) = self.usable(key) {
            return Ok(Opened { segment, fresh: false, report_created: false, created: false });
        }
        let listed = listed().ok_or(DataError::Gone(key))?;
        if self.committer.failed() {
            // Files written behind the journal may lack acknowledged bytes the page cache
            // showed: only a restart's replay restores them, so nothing is recovered until then.
            return Err(DataError::Io(io::Error::other(
                "the group commit failed a sync: the broker must restart to replay its journal",
            )));
        }
        let clean = self.lock_open().closed.remove(&key);
        let ensure_dir = match canary(self.canary_skip_dir_sync) {
            true => EnsureDir::WithoutSync,
            false if self.durable_dirs_lock().contains(&(key.topic_id, key.range_id)) => {
                EnsureDir::Done
            }
            false => EnsureDir::Durably,
        };
        let task = OpenTask {
            storage: Arc::clone(&self.storage),
            committer: Arc::clone(&self.committer),
            data_dir: self.data_dir.clone(),
            dir: self.range_dir(key.topic_id, key.range_id),
            config: self.config,
            key,
            listed,
            clean,
            ensure_dir,
        };
        let open = Arc::clone(&self.open);
        let open_max = self.open_segments_max;
        let opened = self
            .run(move || {
                let opened = task.run()?;
                let segment = opened.0;
                let closed = open.lock().expect("data plane lock poisoned").insert(
                    key,
                    Arc::clone(&segment),
                    open_max,
                );
                // Closed handles close their files here, outside the lock; the gate goes last.
                drop(closed);
                drop(held);
                Ok::<_, DataError>((segment, opened.1, opened.2))
            })
            .await;
        let (segment, report, created) = match opened {
            Ok(opened) => opened,
            Err(error) => {
                tracing::warn!(?key, %error, "opening a segment failed");
                return Err(error);
            }
        };
        self.durable_dirs_lock().insert((key.topic_id, key.range_id));
        if let Some(report) = report {
            self.note_recovery(key, report);
        }
        let report_created = listed == Listed::ActiveUnborn;
        Ok(Opened { segment, fresh: true, report_created, created })
    }

    fn gate(&self, key: SegmentKey) -> Arc<tokio::sync::Mutex<()>> {
        let mut gates = self.gates.lock().expect("gates lock poisoned");
        Arc::clone(gates.entry(key).or_default())
    }

    /// Drops the gate's entry once nobody else holds or waits for it.
    fn release_gate(&self, key: SegmentKey, gate: Arc<tokio::sync::Mutex<()>>) {
        let mut gates = self.gates.lock().expect("gates lock poisoned");
        // One reference in the map, one here: nobody else waits.
        if Arc::strong_count(&gate) == 2 {
            gates.remove(&key);
        }
    }

    fn note_recovery(&self, key: SegmentKey, report: RecoveryReport) {
        if let Some(damage) = report.damage {
            tracing::error!(
                ?key,
                ?damage,
                "damaged records in a segment: served up to the damage, refused past it; the \
                 file is kept as it is"
            );
        } else if report.valid_frames_cut > 0 {
            tracing::warn!(
                ?key,
                valid_frames_cut = report.valid_frames_cut,
                bytes_cut = report.bytes_truncated,
                "recovery cut a torn last write that held valid frames after a bad one"
            );
        } else if report.bytes_truncated > 0 {
            tracing::info!(?key, bytes_cut = report.bytes_truncated, "recovery cut a torn tail");
        }
        let mut recoveries = self.recoveries.lock().expect("data plane lock poisoned");
        if recoveries.len() >= RECOVERIES_KEPT_MAX {
            recoveries.pop_front();
        }
        recoveries.push_back((key, report));
    }

    /// The open handle of `key`, unless a failed write or sync poisoned it: that one is
    /// forgotten, so whoever opens the segment next (a produce, a fence, a fill, a settle)
    /// recovers it from the disk instead of failing on it.
    fn usable(&self, key: SegmentKey) -> Option<Arc<Segment>> {
        let segment = self.peek(key)?;
        if segment.status().poisoned.is_none() {
            return Some(segment);
        }
        self.evict_poisoned(key, &segment);
        None
    }

    /// Forgets a segment whose write or sync failed, if `segment` is still the open handle, so
    /// the next use recovers it from what is on the disk. A handle opened since is left alone.
    pub fn evict_poisoned(&self, key: SegmentKey, segment: &Arc<Segment>) {
        let mut open = self.lock_open();
        if open.is(&key, segment) {
            open.remove(&key);
            tracing::warn!(?key, cause = ?segment.status().poisoned, "segment poisoned");
        }
    }

    /// The data file of a segment.
    /// Re-reads this node's file of `key` and checks every frame (read-only: it repairs
    /// nothing); `Damaged` when it cannot be read as a segment at all.
    pub async fn verify(&self, key: SegmentKey) -> Result<malachi_log::VerifyReport, DataError> {
        let storage = Arc::clone(&self.storage);
        let dir = self.range_dir(key.topic_id, key.range_id);
        self.run(move || malachi_log::verify_segment(&*storage, &dir, key.segment_id))
            .await
            .map_err(|error| DataError::Damaged { key, detail: error.to_string() })
    }

    pub fn segment_path(&self, key: SegmentKey) -> PathBuf {
        segment_paths(&self.range_dir(key.topic_id, key.range_id), key.segment_id).0
    }

    /// Drops a segment's open handle, so its next use recovers the file afresh (after the file
    /// was repaired from another copy).
    pub fn forget(&self, key: SegmentKey) {
        let mut open = self.lock_open();
        open.remove(&key);
        open.closed.remove(&key);
    }

    /// Segment handles open now.
    pub fn open_segments(&self) -> usize {
        self.lock_open().len()
    }

    pub fn recoveries(&self) -> Vec<(SegmentKey, RecoveryReport)> {
        self.recoveries.lock().expect("data plane lock poisoned").iter().cloned().collect()
    }

    /// Deletes a segment's files; a file already gone is not an error. Metadata no longer
    /// lists the segment, so no open can create it again once this holds its gate.
    pub async fn remove(&self, key: SegmentKey) -> Result<(), DataError> {
        let gate = self.gate(key);
        let held = Arc::clone(&gate).lock_owned().await;
        {
            let mut open = self.lock_open();
            open.remove(&key);
            open.closed.remove(&key);
        }
        let storage = Arc::clone(&self.storage);
        let dir = self.range_dir(key.topic_id, key.range_id);
        // The gate travels with the deletion, so a cancelled caller never lets an open in
        // while the files are half gone.
        let outcome = self
            .run(move || {
                let removed = remove_files(&*storage, &dir, key.segment_id);
                drop(held);
                removed
            })
            .await;
        self.release_gate(key, gate);
        outcome.map_err(|error| {
            tracing::warn!(?key, %error, "deleting a segment's files failed");
            DataError::Io(error)
        })
    }

    fn lock_open(&self) -> MutexGuard<'_, OpenSegments> {
        self.open.lock().expect("data plane lock poisoned")
    }

    fn durable_dirs_lock(&self) -> MutexGuard<'_, BTreeSet<(u64, u32)>> {
        self.durable_dirs.lock().expect("data plane lock poisoned")
    }
}

/// One open of a segment's file, run where blocking calls run.
struct OpenTask {
    storage: Arc<dyn Storage>,
    committer: Arc<Committer>,
    data_dir: PathBuf,
    dir: PathBuf,
    config: SegmentConfig,
    key: SegmentKey,
    listed: Listed,
    clean: Option<CleanClose>,
    ensure_dir: EnsureDir,
}

/// What a create must do for the segment's range directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EnsureDir {
    /// This process made it durable already.
    Done,
    /// Create it and every missing level, each made durable in its parent.
    Durably,
    /// The canary: create it, sync nothing.
    WithoutSync,
}

/// The segment, what recovering it found, and whether its file was created now.
type OpenOutcome = Result<(Arc<Segment>, Option<RecoveryReport>, bool), DataError>;

impl OpenTask {
    fn run(self) -> OpenOutcome {
        let key = self.key;
        if let Some(clean) = self.clean {
            let storage = Arc::clone(&self.storage);
            let committer = &self.committer;
            let id = key.segment_id;
            match Segment::reopen_clean(storage, &self.dir, id, self.config, committer, clean) {
                Ok(segment) => return Ok((segment, None, false)),
                Err(error) => tracing::warn!(?key, %error, "a closed segment changed; recovering"),
            }
        }
        let (data_path, _) = segment_paths(&self.dir, key.segment_id);
        if !self.storage.exists(&data_path)? {
            return match self.listed {
                Listed::ActiveUnborn => self.create(),
                Listed::ActiveCreated | Listed::Sealed { .. } => Err(DataError::Damaged {
                    key,
                    detail: format!("its file {} is missing", data_path.display()),
                }),
            };
        }
        self.recover()
    }

    fn create(&self) -> OpenOutcome {
        match self.ensure_dir {
            EnsureDir::Done => {}
            EnsureDir::Durably => create_dir_durable(&*self.storage, &self.data_dir, &self.dir)?,
            EnsureDir::WithoutSync => self.storage.create_dir_all(&self.dir)?,
        }
        let storage = Arc::clone(&self.storage);
        Segment::create(storage, &self.dir, self.key.segment_id, self.config, &self.committer)
            .map(|segment| (segment, None, true))
            .map_err(|source| DataError::Open { key: self.key, source })
    }

    fn recover(&self) -> OpenOutcome {
        let key = self.key;
        let storage = Arc::clone(&self.storage);
        let opened = match self.listed {
            // A sealed segment's file is never cut: anything wrong with it is damage, and so is
            // ending short of the length metadata recorded.
            Listed::Sealed { end_offset } => {
                let committer = &self.committer;
                Segment::open_read_only(storage, &self.dir, key.segment_id, self.config, committer)
                    .inspect(|(segment, _)| segment.expect_end(end_offset))
            }
            Listed::ActiveUnborn | Listed::ActiveCreated => {
                Segment::open(storage, &self.dir, key.segment_id, self.config, &self.committer)
            }
        };
        match opened {
            Ok((segment, report)) => Ok((segment, Some(report), false)),
            Err(OpenError::BadHeader(error)) => {
                let sealed = matches!(self.listed, Listed::Sealed { .. });
                // Its sync, like recovery's, may drop bytes only the journal holds.
                let unborn = !sealed
                    && malachi_log::is_unborn(&*self.storage, &self.dir, key.segment_id)
                        .inspect_err(|_| self.committer.sync_failed())?;
                if unborn {
                    // Its create never became durable, so it holds nothing anyone was promised
                    // (found by the simulator: a range whose new head hit a failed fdatasync
                    // refused every later produce).
                    remove_files(&*self.storage, &self.dir, key.segment_id)?;
                    return self.create();
                }
                Err(DataError::Damaged { key, detail: format!("its header: {error}") })
            }
            Err(OpenError::WrongSegment { expected, found }) => Err(DataError::Damaged {
                key,
                detail: format!("its file holds segment {found}, not {expected}"),
            }),
            Err(source) => Err(DataError::Open { key, source }),
        }
    }
}

/// Deletes a segment's data, index and fence files and makes the deletion durable.
fn remove_files(storage: &dyn Storage, dir: &Path, segment_id: u64) -> io::Result<()> {
    let (data_path, index_path) = segment_paths(dir, segment_id);
    let fence = malachi_log::fence_path(dir, segment_id);
    for path in [data_path, index_path, fence] {
        storage.remove(&path).or_else(ignore_missing)?;
    }
    storage.sync_dir(dir).or_else(ignore_missing)
}

fn ignore_missing(error: io::Error) -> io::Result<()> {
    if error.kind() == io::ErrorKind::NotFound { Ok(()) } else { Err(error) }
}

impl DataPlane {
    /// Appends and waits for `fdatasync`.
    pub async fn append(
        &self,
        segment: Arc<Segment>,
        records: Vec<Record>,
    ) -> Result<AppendTicket, AppendError> {
        self.run(move || segment.append(&records)).await
    }

    /// Appends to several segments at once: stages every batch, then waits until all are
    /// durable, so one round of the group commit covers them all. One outcome per batch.
    pub async fn append_all(
        &self,
        batches: Vec<(Arc<Segment>, Vec<Record>)>,
    ) -> Vec<Result<AppendTicket, AppendError>> {
        self.run(move || {
            let staged: Vec<_> =
                batches.iter().map(|(segment, records)| segment.stage(records)).collect();
            batches
                .iter()
                .zip(staged)
                .map(|((segment, _), staged)| {
                    let ticket = staged?;
                    segment.wait_durable(ticket).map(|()| ticket)
                })
                .collect()
        })
        .await
    }

    pub async fn read(
        &self,
        segment: Arc<Segment>,
        from_offset: u64,
        records_max: u32,
        bytes_max: u64,
    ) -> Result<ReadBatch, ReadError> {
        self.run(move || segment.read(from_offset, records_max, bytes_max)).await
    }

    pub async fn seal(&self, segment: Arc<Segment>) -> Result<SealInfo, SealError> {
        self.run(move || segment.seal()).await
    }

    /// Where blocking calls run (the server runs logins' Argon2 the same way).
    pub fn io_mode(&self) -> IoMode {
        self.io_mode
    }

    /// Runs a blocking storage call where the I/O mode says.
    pub async fn run<T: Send + 'static>(&self, call: impl FnOnce() -> T + Send + 'static) -> T {
        match self.io_mode {
            IoMode::Inline => call(),
            IoMode::Threads => {
                tokio::task::spawn_blocking(call).await.expect("storage task panicked")
            }
        }
    }
}

#[cfg(test)]
mod tests;
