//! This node's segment files: where they live, which are open, and the blocking calls into
//! `malachi-log` made off the async threads.
//!
//! Layout under the data directory: `topics/<topic_id>/<range_id>/<segment_id>.seg` (+ `.idx`).
//! Segments are opened lazily and kept open; opening an unsealed one runs recovery. The data plane
//! decides nothing: metadata says which segment is active, when to seal, what to delete.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use malachi_log::{
    AppendError, AppendTicket, OpenError, ReadBatch, ReadError, Record, RecoveryReport, SealError,
    SealInfo, Segment, SegmentConfig, Storage, segment_paths,
};

/// Names one segment on this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SegmentKey {
    pub topic_id: u64,
    pub range_id: u32,
    pub segment_id: u64,
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
    #[error("segment {0:?} has no file on this node")]
    Missing(SegmentKey),
    #[error("storage: {0}")]
    Io(#[from] io::Error),
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

/// Segment files of one node.
#[derive(Debug)]
pub struct DataPlane {
    io_mode: IoMode,
    storage: Arc<dyn Storage>,
    root: PathBuf,
    config: SegmentConfig,
    open: Mutex<OpenSegments>,
    /// Recovery reports of segments opened since start (the most recent ones), for operators.
    recoveries: Mutex<Vec<(SegmentKey, RecoveryReport)>>,
    /// Where poisoned segments were last durable. After a failed `fdatasync` the page cache may
    /// still show bytes that never reached the disk; reopening must cut them off rather than let
    /// recovery trust them.
    poisoned_ends: Mutex<BTreeMap<SegmentKey, u64>>,
    /// Segments whose create failed. Their file may exist and even read back well from the page
    /// cache while its header never reached the disk, so it is never opened: the next create
    /// replaces it. (Found by the simulator: appends to such a file were acknowledged, and a
    /// restart found a zeroed header in front of them.)
    failed_creates: Mutex<BTreeSet<SegmentKey>>,
}

/// Recovery reports kept for inspection.
const RECOVERIES_KEPT_MAX: usize = 1024;

/// Sealed segments kept open at once; the least recently used are closed beyond it (each holds
/// a file descriptor and its sparse index). Active segments are never closed.
pub const OPEN_SEALED_SEGMENTS_MAX: usize = 256;

/// Open segment handles with least-recently-used closing of sealed ones.
#[derive(Debug, Default)]
struct OpenSegments {
    handles: BTreeMap<SegmentKey, (Arc<Segment>, u64)>,
    /// Bumped by every use; the handle's value is its last use.
    uses: u64,
}

impl OpenSegments {
    fn get(&mut self, key: &SegmentKey) -> Option<Arc<Segment>> {
        self.uses += 1;
        let uses = self.uses;
        self.handles.get_mut(key).map(|(segment, last_use)| {
            *last_use = uses;
            Arc::clone(segment)
        })
    }

    fn is(&self, key: &SegmentKey, segment: &Arc<Segment>) -> bool {
        self.handles.get(key).is_some_and(|(current, _)| Arc::ptr_eq(current, segment))
    }

    fn insert(&mut self, key: SegmentKey, segment: Arc<Segment>) {
        self.uses += 1;
        self.handles.insert(key, (segment, self.uses));
        let sealed =
            self.handles.values().filter(|(segment, _)| segment.status().sealed.is_some()).count();
        if sealed > OPEN_SEALED_SEGMENTS_MAX {
            let coldest = self
                .handles
                .iter()
                .filter(|(_, (segment, _))| segment.status().sealed.is_some())
                .min_by_key(|(_, (_, last_use))| *last_use)
                .map(|(key, _)| *key);
            if let Some(coldest) = coldest {
                // Readers holding it keep it open until they finish.
                self.handles.remove(&coldest);
            }
        }
    }

    fn remove(&mut self, key: &SegmentKey) {
        self.handles.remove(key);
    }

    fn len(&self) -> usize {
        self.handles.len()
    }
}

impl DataPlane {
    pub fn new(storage: Arc<dyn Storage>, data_dir: &Path, config: SegmentConfig) -> DataPlane {
        DataPlane::with_io_mode(storage, data_dir, config, IoMode::Threads)
    }

    pub fn with_io_mode(
        storage: Arc<dyn Storage>,
        data_dir: &Path,
        config: SegmentConfig,
        io_mode: IoMode,
    ) -> DataPlane {
        DataPlane {
            io_mode,
            storage,
            root: data_dir.join("topics"),
            config,
            open: Mutex::new(OpenSegments::default()),
            recoveries: Mutex::new(Vec::new()),
            poisoned_ends: Mutex::new(BTreeMap::new()),
            failed_creates: Mutex::new(BTreeSet::new()),
        }
    }

    pub fn config(&self) -> &SegmentConfig {
        &self.config
    }

    fn range_dir(&self, topic_id: u64, range_id: u32) -> PathBuf {
        self.root.join(topic_id.to_string()).join(range_id.to_string())
    }

    /// Creates the file of a segment metadata has just created (idempotent: an existing file,
    /// say from a create that crashed before metadata heard of it, is opened instead).
    pub fn create(&self, key: SegmentKey) -> Result<Arc<Segment>, DataError> {
        let mut open = self.open.lock().expect("data plane lock poisoned");
        if let Some(segment) = open.get(&key) {
            return Ok(segment);
        }
        let dir = self.range_dir(key.topic_id, key.range_id);
        let (data_path, index_path) = segment_paths(&dir, key.segment_id);
        let failed_before =
            self.failed_creates.lock().expect("data plane lock poisoned").contains(&key);
        if failed_before {
            self.storage.remove(&data_path).or_else(ignore_missing)?;
            self.storage.remove(&index_path).or_else(ignore_missing)?;
        }
        let segment = if self.storage.exists(&data_path)? {
            self.open_existing(key, &dir)?
        } else {
            match Segment::create(Arc::clone(&self.storage), &dir, key.segment_id, self.config) {
                Ok(segment) => {
                    self.failed_creates.lock().expect("data plane lock poisoned").remove(&key);
                    segment
                }
                Err(source) => {
                    self.failed_creates.lock().expect("data plane lock poisoned").insert(key);
                    return Err(DataError::Open { key, source });
                }
            }
        };
        let segment = Arc::new(segment);
        open.insert(key, Arc::clone(&segment));
        Ok(segment)
    }

    /// The open segment, opening (and recovering) its file on first use.
    pub fn get(&self, key: SegmentKey) -> Result<Arc<Segment>, DataError> {
        let mut open = self.open.lock().expect("data plane lock poisoned");
        if let Some(segment) = open.get(&key) {
            return Ok(segment);
        }
        let dir = self.range_dir(key.topic_id, key.range_id);
        let (data_path, _) = segment_paths(&dir, key.segment_id);
        let failed_create =
            self.failed_creates.lock().expect("data plane lock poisoned").contains(&key);
        if failed_create || !self.storage.exists(&data_path)? {
            return Err(DataError::Missing(key));
        }
        let segment = Arc::new(self.open_existing(key, &dir)?);
        open.insert(key, Arc::clone(&segment));
        Ok(segment)
    }

    fn open_existing(&self, key: SegmentKey, dir: &Path) -> Result<Segment, DataError> {
        let poisoned_end =
            self.poisoned_ends.lock().expect("data plane lock poisoned").remove(&key);
        if let Some(durable_bytes) = poisoned_end {
            let (data_path, _) = segment_paths(dir, key.segment_id);
            let file = self.storage.open(&data_path, malachi_log::OpenMode::Existing)?;
            file.set_len(durable_bytes)?;
            file.sync_data()?;
        }
        let opened = Segment::open(Arc::clone(&self.storage), dir, key.segment_id, self.config);
        let (segment, report) = match opened {
            Err(OpenError::BadHeader(_))
                if malachi_log::is_unborn(&*self.storage, dir, key.segment_id)? =>
            {
                // Its create failed before the header was durable (found by the simulator: a
                // range whose new head hit a failed fdatasync refused every later produce).
                let (data_path, index_path) = segment_paths(dir, key.segment_id);
                self.storage.remove(&data_path)?;
                self.storage.remove(&index_path).or_else(ignore_missing)?;
                let segment =
                    Segment::create(Arc::clone(&self.storage), dir, key.segment_id, self.config)
                        .map_err(|source| DataError::Open { key, source })?;
                return Ok(segment);
            }
            other => other.map_err(|source| DataError::Open { key, source })?,
        };
        let mut recoveries = self.recoveries.lock().expect("data plane lock poisoned");
        if recoveries.len() >= RECOVERIES_KEPT_MAX {
            recoveries.remove(0);
        }
        recoveries.push((key, report));
        Ok(segment)
    }

    /// Forgets a segment whose write or sync failed, if `segment` is still the open handle, so
    /// the next use reopens it cut back to what was durable. A handle opened since is left alone.
    pub fn evict_poisoned(&self, key: SegmentKey, segment: &Arc<Segment>) {
        let mut open = self.open.lock().expect("data plane lock poisoned");
        if open.is(&key, segment) {
            open.remove(&key);
            let durable_bytes = segment.status().durable_bytes;
            self.poisoned_ends.lock().expect("data plane lock poisoned").insert(key, durable_bytes);
        }
    }

    /// The data file of a segment.
    pub fn segment_path(&self, key: SegmentKey) -> PathBuf {
        segment_paths(&self.range_dir(key.topic_id, key.range_id), key.segment_id).0
    }

    /// Drops a segment's open handle, so its next use opens the file afresh (after the file was
    /// repaired from another copy).
    pub fn forget(&self, key: SegmentKey) {
        self.open.lock().expect("data plane lock poisoned").remove(&key);
    }

    /// Segment handles open now.
    pub fn open_segments(&self) -> usize {
        self.open.lock().expect("data plane lock poisoned").len()
    }

    pub fn recoveries(&self) -> Vec<(SegmentKey, RecoveryReport)> {
        self.recoveries.lock().expect("data plane lock poisoned").clone()
    }

    /// Deletes a segment's files; a file already gone is not an error.
    pub fn remove(&self, key: SegmentKey) -> Result<(), DataError> {
        // Held across the deletion, so a concurrent `get` cannot reopen the file in between.
        let mut open = self.open.lock().expect("data plane lock poisoned");
        open.remove(&key);
        let dir = self.range_dir(key.topic_id, key.range_id);
        let (data_path, index_path) = segment_paths(&dir, key.segment_id);
        for path in [data_path, index_path] {
            match self.storage.remove(&path) {
                Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error.into()),
                _ => {}
            }
        }
        self.storage.sync_dir(&dir).or_else(ignore_missing)?;
        Ok(())
    }
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
mod tests {
    use super::*;
    use malachi_log::SimStorage;

    #[test]
    fn sealed_segments_beyond_the_cap_are_closed_and_reopen_on_use() {
        let data = DataPlane::new(
            Arc::new(SimStorage::new(1)),
            Path::new("/data"),
            SegmentConfig::default(),
        );
        let active = SegmentKey { topic_id: 1, range_id: 0, segment_id: 0 };
        data.create(active).unwrap();
        let sealed_count = OPEN_SEALED_SEGMENTS_MAX as u64 + 10;
        for segment_id in 1..=sealed_count {
            let key = SegmentKey { topic_id: 1, range_id: 0, segment_id };
            data.create(key).unwrap().seal().unwrap();
            // Touch the segment once more so the cap sees it sealed.
            data.get(key).unwrap();
        }
        assert!(
            data.open_segments() <= OPEN_SEALED_SEGMENTS_MAX + 2,
            "{} open",
            data.open_segments()
        );
        let first = SegmentKey { topic_id: 1, range_id: 0, segment_id: 1 };
        assert_eq!(data.get(first).unwrap().status().sealed.map(|seal| seal.end_offset), Some(0));
        assert!(
            data.get(active).unwrap().status().sealed.is_none(),
            "the active segment stays open"
        );
    }
}
