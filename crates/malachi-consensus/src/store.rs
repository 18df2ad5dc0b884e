//! [`GroupStore`]: the one redb database per node that holds the Raft state of every group.
//!
//! Layout (format version [`FORMAT_VERSION`], recorded in the `store_info` table):
//!
//! | table | key | value |
//! |---|---|---|
//! | `store_info` | `&str` name | `u64` (`format_version`) |
//! | `raft_log` | `(group_id, index)` | serde_json of an openraft log entry |
//! | `raft_group_state` | `(group_id, StateKey)` | serde_json of one per-group record |
//! | `raft_snapshot` | `group_id` | the machine's canonical snapshot bytes |
//!
//! The per-group records ([`StateKey`]) are the vote, the committed log id, the last purged log
//! id, the snapshot meta and the last index the snapshot covers.
//!
//! Approach: all writes of all groups go through one writer thread. It takes every job that is
//! queued, applies them in FIFO order in one redb write transaction and commits once, so groups
//! that write at the same time share one fsync (design.md 4.1). A job is answered only after the
//! commit returned; for a durable job that means after the fsync. Reads go straight to redb
//! from the caller's task; a redb read sees every committed write, so an entry is readable as
//! soon as its append returned.
//!
//! Invariant: a failed commit poisons the store. Every later write fails with
//! [`StoreError::Poisoned`] until the process reopens the file; an fsync is never retried
//! (style.md 7), because after a failed fsync nobody knows what reached the disk.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;

use redb::Database;
use redb::Durability;
use redb::ReadableDatabase;
use redb::ReadableTable;
use redb::TableDefinition;
use tokio::sync::mpsc;
use tokio::sync::oneshot;

use crate::error::StoreError;

/// The on-disk format this build writes and reads. Bump it, and teach `check_format` to refuse
/// or upgrade, when a table or an encoding changes.
pub const FORMAT_VERSION: u64 = 1;

/// Jobs waiting for the writer; a full queue makes writers wait (backpressure, not memory).
const WRITE_QUEUE_JOBS_MAX: usize = 4096;
/// Jobs folded into one transaction at most, so one commit's latency stays bounded.
const BATCH_JOBS_MAX: usize = 1024;

const STORE_INFO: TableDefinition<&str, u64> = TableDefinition::new("store_info");
const LOG: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("raft_log");
const GROUP_STATE: TableDefinition<(u64, u8), &[u8]> = TableDefinition::new("raft_group_state");
const SNAPSHOT: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_snapshot");

/// The per-group records of the `raft_group_state` table. The discriminants are on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum StateKey {
    Vote = 1,
    Committed = 2,
    LastPurged = 3,
    SnapshotMeta = 4,
    /// `Option<u64>`: the last log index the stored snapshot covers. Kept apart from the meta so
    /// the writer can refuse to replace a snapshot by an older one without knowing openraft types.
    SnapshotIndex = 5,
}

/// One node's Raft store, shared by all its groups. Cheap to clone.
#[derive(Clone)]
pub struct GroupStore {
    inner: Arc<StoreInner>,
}

struct StoreInner {
    database: Arc<Database>,
    /// The only sender of the writer's queue; `None` only while the store is being dropped, or
    /// always for an inline store.
    writer: Option<mpsc::Sender<WriteJob>>,
    writer_thread: Option<std::thread::JoinHandle<()>>,
    mode: WriterMode,
    /// `Some(reason)` once a commit failed; shared with the writer thread.
    poison: Arc<Mutex<Option<String>>>,
}

impl Drop for StoreInner {
    /// Closes the queue and joins the writer, so that when the last handle of a store is gone
    /// the file is closed and can be reopened at once (a restart in the same process).
    fn drop(&mut self) {
        drop(self.writer.take());
        if let Some(thread) = self.writer_thread.take()
            && thread.join().is_err()
        {
            tracing::error!("raft store writer thread panicked");
        }
    }
}

/// Where a store's commits run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriterMode {
    /// One writer thread folds the queued writes of all groups into shared fsynced commits.
    Thread,
    /// Every write commits on the caller, at once, one transaction per write: the simulator's
    /// mode, where a thread would make the order of events depend on the OS scheduler.
    Inline,
}

/// One change of a job; every op of every job of a batch commits atomically.
#[derive(Debug)]
pub(crate) enum WriteOp {
    PutEntry {
        group_id: u64,
        index: u64,
        bytes: Vec<u8>,
    },
    /// Removes the entries with `first <= index <= last`.
    RemoveEntries {
        group_id: u64,
        first: u64,
        last: u64,
    },
    PutState {
        group_id: u64,
        key: StateKey,
        bytes: Vec<u8>,
    },
    /// Replaces the group's snapshot unless the stored one covers more of the log.
    PutSnapshot {
        group_id: u64,
        last_index: Option<u64>,
        meta: Vec<u8>,
        data: Vec<u8>,
    },
}

/// Whether the caller must wait for the fsync. Only `Buffered` writes whose loss on a crash is
/// harmless (the committed log id: a lower bound that the leader re-establishes) skip it; they
/// become durable with the next durable commit, since redb commits in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Persist {
    Fsync,
    Buffered,
}

/// A group's stored snapshot: serde_json of openraft's snapshot meta, and the machine's bytes.
pub(crate) struct StoredSnapshot {
    pub(crate) meta: Vec<u8>,
    pub(crate) data: Vec<u8>,
}

struct WriteJob {
    ops: Vec<WriteOp>,
    persist: Persist,
    done: oneshot::Sender<Result<(), StoreError>>,
}

impl GroupStore {
    /// Opens the store at `path`, creating the file and the tables if they do not exist.
    pub fn open(path: impl AsRef<Path>) -> Result<GroupStore, StoreError> {
        let path = path.as_ref();
        let existing = malachi_log::Storage::open(
            &malachi_log::RealStorage,
            path,
            malachi_log::OpenMode::Existing,
        );
        match existing {
            Ok(file) => crate::backend::distrust_page_cache(file.as_ref())
                .map_err(|error| StoreError::Open(format!("{}: {error}", path.display())))?,
            // Created here, empty, so that it gets the storage's private mode: redb would create
            // it with the umask's, and the store holds every user's password hash.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                malachi_log::Storage::open(
                    &malachi_log::RealStorage,
                    path,
                    malachi_log::OpenMode::CreateNew,
                )
                .map_err(|error| StoreError::Open(format!("{}: {error}", path.display())))?;
            }
            Err(error) => return Err(StoreError::Open(format!("{}: {error}", path.display()))),
        }
        let database = Database::create(path)
            .map_err(|error| StoreError::Open(format!("{}: {error}", path.display())))?;
        Self::from_database(database)
    }

    /// Opens a store on a custom redb backend: the seam where the simulator's disk (which can
    /// lose unsynced writes, fail fsync, fill up) plugs in.
    pub fn open_with_backend(
        backend: impl redb::StorageBackend,
        mode: WriterMode,
    ) -> Result<GroupStore, StoreError> {
        let database = Database::builder()
            .create_with_backend(backend)
            .map_err(|error| StoreError::Open(error.to_string()))?;
        match mode {
            WriterMode::Thread => Self::from_database(database),
            WriterMode::Inline => {
                check_format(&database)?;
                let inner = StoreInner {
                    database: Arc::new(database),
                    writer: None,
                    writer_thread: None,
                    mode,
                    poison: Arc::new(Mutex::new(None)),
                };
                Ok(GroupStore { inner: Arc::new(inner) })
            }
        }
    }

    fn from_database(database: Database) -> Result<GroupStore, StoreError> {
        check_format(&database)?;
        let database = Arc::new(database);
        let poison = Arc::new(Mutex::new(None));
        let (writer, queue) = mpsc::channel(WRITE_QUEUE_JOBS_MAX);
        let thread_database = Arc::clone(&database);
        let thread_poison = Arc::clone(&poison);
        let writer_thread = std::thread::Builder::new()
            .name("raft-store-writer".to_string())
            .spawn(move || run_writer(&thread_database, queue, &thread_poison))
            .map_err(|error| StoreError::Open(format!("cannot start the writer: {error}")))?;
        let inner = StoreInner {
            database,
            writer: Some(writer),
            writer_thread: Some(writer_thread),
            mode: WriterMode::Thread,
            poison,
        };
        Ok(GroupStore { inner: Arc::new(inner) })
    }

    /// The number of log entries stored for `group_id` (after compaction, the entries since the
    /// last purge).
    pub fn log_len(&self, group_id: u64) -> Result<u64, StoreError> {
        let transaction = self.begin_read()?;
        let table = transaction.open_table(LOG).map_err(io_error)?;
        let mut count = 0;
        for item in table.range((group_id, 0)..=(group_id, u64::MAX)).map_err(io_error)? {
            item.map_err(io_error)?;
            count += 1;
        }
        Ok(count)
    }

    /// The groups that have any Raft state in this store, in ascending order: what a restarting
    /// broker reopens.
    pub fn group_ids(&self) -> Result<Vec<u64>, StoreError> {
        let transaction = self.begin_read()?;
        let table = transaction.open_table(GROUP_STATE).map_err(io_error)?;
        let mut group_ids: Vec<u64> = Vec::new();
        for item in table.iter().map_err(io_error)? {
            let (key, _) = item.map_err(io_error)?;
            let (group_id, _) = key.value();
            if group_ids.last() != Some(&group_id) {
                group_ids.push(group_id);
            }
        }
        Ok(group_ids)
    }

    /// Why the store refuses writes, if it does.
    pub fn poisoned(&self) -> Option<String> {
        lock_poison(&self.inner.poison).clone()
    }

    /// Queues `ops` as one job and waits until the batch holding it committed (and, for
    /// [`Persist::Fsync`], was fsynced).
    pub(crate) async fn write(
        &self,
        ops: Vec<WriteOp>,
        persist: Persist,
    ) -> Result<(), StoreError> {
        if let Some(reason) = self.poisoned() {
            return Err(StoreError::Poisoned(reason));
        }
        if self.inner.mode == WriterMode::Inline {
            let result = commit_ops(&self.inner.database, ops.iter(), persist == Persist::Fsync);
            if let Err(error) = &result {
                lock_poison(&self.inner.poison).get_or_insert_with(|| error.to_string());
            }
            return result;
        }
        let (done, answer) = oneshot::channel();
        let job = WriteJob { ops, persist, done };
        let writer = self.inner.writer.as_ref().ok_or(StoreError::Closed)?;
        writer.send(job).await.map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// The stored bytes of one per-group record.
    pub(crate) fn read_state(
        &self,
        group_id: u64,
        key: StateKey,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let transaction = self.begin_read()?;
        let table = transaction.open_table(GROUP_STATE).map_err(io_error)?;
        let value = table.get((group_id, key as u8)).map_err(io_error)?;
        Ok(value.map(|guard| guard.value().to_vec()))
    }

    /// The group's snapshot, meta and data read in one transaction so they match.
    pub(crate) fn read_snapshot(
        &self,
        group_id: u64,
    ) -> Result<Option<StoredSnapshot>, StoreError> {
        let transaction = self.begin_read()?;
        let state = transaction.open_table(GROUP_STATE).map_err(io_error)?;
        let Some(meta) = state.get((group_id, StateKey::SnapshotMeta as u8)).map_err(io_error)?
        else {
            return Ok(None);
        };
        let snapshots = transaction.open_table(SNAPSHOT).map_err(io_error)?;
        let Some(data) = snapshots.get(group_id).map_err(io_error)? else {
            let message = format!("group {group_id} has snapshot meta but no snapshot data");
            return Err(StoreError::Corrupt(message));
        };
        Ok(Some(StoredSnapshot { meta: meta.value().to_vec(), data: data.value().to_vec() }))
    }

    /// Up to `count_max` entries of the group with `first <= index <= last`, as (index, bytes).
    pub(crate) fn read_entries(
        &self,
        group_id: u64,
        first: u64,
        last: u64,
        count_max: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
        let transaction = self.begin_read()?;
        let table = transaction.open_table(LOG).map_err(io_error)?;
        let mut entries = Vec::new();
        for item in table.range((group_id, first)..=(group_id, last)).map_err(io_error)? {
            if entries.len() >= count_max {
                break;
            }
            let (key, value) = item.map_err(io_error)?;
            entries.push((key.value().1, value.value().to_vec()));
        }
        Ok(entries)
    }

    /// The group's last log entry, as (index, bytes).
    pub(crate) fn read_last_entry(
        &self,
        group_id: u64,
    ) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
        let transaction = self.begin_read()?;
        let table = transaction.open_table(LOG).map_err(io_error)?;
        let mut range = table.range((group_id, 0)..=(group_id, u64::MAX)).map_err(io_error)?;
        match range.next_back() {
            None => Ok(None),
            Some(item) => {
                let (key, value) = item.map_err(io_error)?;
                Ok(Some((key.value().1, value.value().to_vec())))
            }
        }
    }

    fn begin_read(&self) -> Result<redb::ReadTransaction, StoreError> {
        self.inner.database.begin_read().map_err(io_error)
    }
}

impl fmt::Debug for GroupStore {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.debug_struct("GroupStore").field("poisoned", &self.poisoned()).finish()
    }
}

/// Creates the tables of a new store, or checks the format version of an existing one.
fn check_format(database: &Database) -> Result<(), StoreError> {
    let mut transaction = database.begin_write().map_err(open_error)?;
    transaction.set_durability(Durability::Immediate).map_err(open_error)?;
    {
        let mut info = transaction.open_table(STORE_INFO).map_err(open_error)?;
        let found = info.get("format_version").map_err(open_error)?.map(|guard| guard.value());
        match found {
            Some(FORMAT_VERSION) => {}
            Some(found) => {
                return Err(StoreError::UnsupportedFormat { found, supported: FORMAT_VERSION });
            }
            None => {
                info.insert("format_version", FORMAT_VERSION).map_err(open_error)?;
            }
        }
        transaction.open_table(LOG).map_err(open_error)?;
        transaction.open_table(GROUP_STATE).map_err(open_error)?;
        transaction.open_table(SNAPSHOT).map_err(open_error)?;
    }
    transaction.commit().map_err(open_error)
}

/// The writer thread: batches queued jobs into one transaction each until every sender is gone.
fn run_writer(
    database: &Database,
    mut queue: mpsc::Receiver<WriteJob>,
    poison: &Mutex<Option<String>>,
) {
    let mut batch: Vec<WriteJob> = Vec::with_capacity(BATCH_JOBS_MAX);
    while let Some(first) = queue.blocking_recv() {
        batch.push(first);
        while batch.len() < BATCH_JOBS_MAX {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let poisoned = lock_poison(poison).clone();
        let result = match poisoned {
            Some(reason) => Err(StoreError::Poisoned(reason)),
            None => commit_batch(database, &batch),
        };
        if let Err(error) = &result {
            tracing::error!(%error, jobs = batch.len(), "raft store commit failed; store poisoned");
            lock_poison(poison).get_or_insert_with(|| error.to_string());
        }
        for job in batch.drain(..) {
            // A caller that stopped waiting (its group shut down) needs no answer.
            let _ = job.done.send(result.clone());
        }
    }
}

fn commit_batch(database: &Database, batch: &[WriteJob]) -> Result<(), StoreError> {
    let durable = batch.iter().any(|job| job.persist == Persist::Fsync);
    commit_ops(database, batch.iter().flat_map(|job| job.ops.iter()), durable)
}

/// Commits `ops` as one transaction, fsynced if `durable`.
fn commit_ops<'a>(
    database: &Database,
    ops: impl Iterator<Item = &'a WriteOp>,
    durable: bool,
) -> Result<(), StoreError> {
    let mut transaction = database.begin_write().map_err(io_error)?;
    let durability = if durable { Durability::Immediate } else { Durability::None };
    transaction.set_durability(durability).map_err(io_error)?;
    {
        let mut log = transaction.open_table(LOG).map_err(io_error)?;
        let mut state = transaction.open_table(GROUP_STATE).map_err(io_error)?;
        let mut snapshots = transaction.open_table(SNAPSHOT).map_err(io_error)?;
        for op in ops {
            apply_op(op, &mut log, &mut state, &mut snapshots)?;
        }
    }
    // On any error above, dropping the transaction aborts it: nothing of the batch is visible.
    transaction.commit().map_err(io_error)
}

fn apply_op(
    op: &WriteOp,
    log: &mut redb::Table<(u64, u64), &[u8]>,
    state: &mut redb::Table<(u64, u8), &[u8]>,
    snapshots: &mut redb::Table<u64, &[u8]>,
) -> Result<(), StoreError> {
    match op {
        WriteOp::PutEntry { group_id, index, bytes } => {
            log.insert((*group_id, *index), bytes.as_slice()).map_err(io_error)?;
        }
        WriteOp::RemoveEntries { group_id, first, last } => {
            if first <= last {
                let range = (*group_id, *first)..=(*group_id, *last);
                log.retain_in(range, |_, _| false).map_err(io_error)?;
            }
        }
        WriteOp::PutState { group_id, key, bytes } => {
            state.insert((*group_id, *key as u8), bytes.as_slice()).map_err(io_error)?;
        }
        WriteOp::PutSnapshot { group_id, last_index, meta, data } => {
            let index_key = (*group_id, StateKey::SnapshotIndex as u8);
            let stored: Option<Option<u64>> = match state.get(index_key).map_err(io_error)? {
                None => None,
                Some(guard) => Some(
                    serde_json::from_slice(guard.value())
                        .map_err(|error| StoreError::Corrupt(format!("snapshot index: {error}")))?,
                ),
            };
            if stored.is_some_and(|stored| stored > *last_index) {
                // A snapshot built before a newer one was installed: keep the newer one.
                return Ok(());
            }
            let index_bytes = serde_json::to_vec(last_index)
                .map_err(|error| StoreError::Io(format!("encode snapshot index: {error}")))?;
            state.insert(index_key, index_bytes.as_slice()).map_err(io_error)?;
            let meta_key = (*group_id, StateKey::SnapshotMeta as u8);
            state.insert(meta_key, meta.as_slice()).map_err(io_error)?;
            snapshots.insert(*group_id, data.as_slice()).map_err(io_error)?;
        }
    }
    Ok(())
}

/// The poison flag survives a panic elsewhere: a poisoned std mutex still holds a valid value.
fn lock_poison(poison: &Mutex<Option<String>>) -> std::sync::MutexGuard<'_, Option<String>> {
    poison.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn io_error(error: impl Into<redb::Error>) -> StoreError {
    StoreError::Io(error.into().to_string())
}

fn open_error(error: impl Into<redb::Error>) -> StoreError {
    StoreError::Open(error.into().to_string())
}
