//! An in-memory disk for the simulator and for crash tests.
//!
//! Each file keeps two views: `written` (what reads see, the page cache) and `durable` (what
//! survives a power loss), plus the list of operations written since the last successful sync.
//! A power loss ([`SimStorage::restart`]) keeps the durable bytes and, depending on
//! [`SimFaults`], a random prefix of the unsynced operations with the last one possibly torn. A
//! process crash ([`SimStorage::restart_process`]) loses nothing: the kernel keeps the page
//! cache, so unsynced bytes are still read after it, and may still vanish at a later power loss.
//! A failed sync behaves as Linux does: the pending pages are marked clean without being
//! written, so reads still see them, a later sync succeeds without making them durable, and only
//! [`StorageFile::drop_clean_cache`] makes reads see the disk again. File and directory
//! creations and removals become durable only when their parent directory is synced.
//!
//! All randomness comes from the seed passed to [`SimStorage::new`]; maps are ordered, so the
//! same seed and the same calls give the same bytes.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{FilesystemSync, OpenMode, Storage, StorageFile};
use crate::rng::SeededRng;

/// Fault rates and crash behaviour; all off by default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimFaults {
    /// Chance, per thousand, that a `sync_data` fails with EIO.
    pub sync_failure_per_mille: u64,
    /// Chance, per thousand, that a write fails with EIO before writing anything.
    pub write_failure_per_mille: u64,
    /// Total bytes the disk holds; a write that would grow past it fails with ENOSPC.
    pub capacity_bytes: Option<u64>,
    /// On a crash, keep a random prefix of the unsynced operations instead of none of them.
    pub crash_keeps_unsynced_prefix: bool,
    /// On a crash, cut the last kept unsynced write at a random byte.
    pub crash_tears_last_write: bool,
}

/// The simulated disk. Cloning shares the same disk.
#[derive(Clone, Debug)]
pub struct SimStorage {
    state: Arc<Mutex<SimState>>,
}

#[derive(Debug)]
struct SimState {
    rng: SeededRng,
    faults: SimFaults,
    /// Bumped by every restart; handles opened before it are stale, as after a reboot.
    epoch: u64,
    /// Crashed and not yet restarted: every call fails.
    down: bool,
    /// Mutating calls left before a scheduled crash.
    ops_until_crash: Option<u64>,
    /// Syncs that will fail regardless of the rates, for tests that need one exact failure.
    forced_sync_failures: u64,
    next_file_id: u64,
    /// Directories and whether their entry in the parent is durable. The root always is.
    dirs: BTreeMap<PathBuf, bool>,
    files: BTreeMap<PathBuf, SimFile>,
    /// Durable files removed since their directory was last synced; a crash brings them back.
    unsynced_removals: BTreeMap<PathBuf, SimFile>,
    syncs: u64,
    failed_syncs: u64,
}

#[derive(Clone, Debug)]
struct SimFile {
    id: u64,
    written: Vec<u8>,
    durable: Vec<u8>,
    unsynced: Vec<PendingOp>,
    /// The directory entry survives a crash (it was created before a `sync_dir`).
    entry_durable: bool,
    /// A failed `syncfs` dropped some of this file's pages: its next `sync_data` reports it, as
    /// Linux reports a write-back error to every descriptor of the file once.
    unreported_error: bool,
}

#[derive(Clone, Debug)]
enum PendingOp {
    Write { position: u64, bytes: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug)]
struct SimFileHandle {
    state: Arc<Mutex<SimState>>,
    path: PathBuf,
    id: u64,
    epoch: u64,
}

impl SimStorage {
    /// How many handles share this disk: the simulator checks that a stopped node's disk is
    /// held by the node alone (a broker that stops releases every file it held).
    pub fn holders(&self) -> usize {
        Arc::strong_count(&self.state)
    }

    pub fn new(seed: u64) -> SimStorage {
        SimStorage {
            state: Arc::new(Mutex::new(SimState {
                rng: SeededRng::new(seed),
                faults: SimFaults::default(),
                epoch: 0,
                down: false,
                ops_until_crash: None,
                forced_sync_failures: 0,
                next_file_id: 1,
                dirs: BTreeMap::new(),
                files: BTreeMap::new(),
                unsynced_removals: BTreeMap::new(),
                syncs: 0,
                failed_syncs: 0,
            })),
        }
    }

    pub fn set_faults(&self, faults: SimFaults) {
        self.lock().faults = faults;
    }

    /// Power loss now: every call fails until [`SimStorage::restart`].
    pub fn crash_now(&self) {
        self.lock().down = true;
    }

    /// Power loss just before the `ops`-th next mutating call (write, sync, set_len, create,
    /// remove, sync_dir); that call and every later one fail until restart.
    pub fn crash_after_ops(&self, ops: u64) {
        self.lock().ops_until_crash = Some(ops);
    }

    pub fn is_down(&self) -> bool {
        self.lock().down
    }

    /// Reboots after a power loss (or without one, which loses the same unsynced state):
    /// applies the crash rules to every file and directory and makes every open handle stale.
    pub fn restart(&self) {
        let mut state = self.lock();
        state.restart();
    }

    /// Restarts after the process died while the machine stayed up: every open handle is stale,
    /// and nothing is lost. Unsynced bytes stay readable (and may vanish at a later power loss).
    pub fn restart_process(&self) {
        let mut state = self.lock();
        state.down = false;
        state.ops_until_crash = None;
        state.epoch += 1;
    }

    /// Bytes the files hold now (written, synced or not): what a capacity limit counts.
    pub fn used_bytes(&self) -> u64 {
        self.lock().used_bytes()
    }

    /// The next `count` syncs fail with EIO.
    pub fn fail_next_syncs(&self, count: u64) {
        self.lock().forced_sync_failures = count;
    }

    /// Successful and failed `sync_data` calls so far.
    pub fn sync_count(&self) -> u64 {
        self.lock().syncs
    }

    /// Failed `sync_data` calls so far.
    pub fn failed_sync_count(&self) -> u64 {
        self.lock().failed_syncs
    }

    /// Media damage: flips one bit in both views of the file.
    pub fn flip_bit(&self, path: &Path, position: u64, bit: u8) -> io::Result<()> {
        let mut state = self.lock();
        let file = state.files.get_mut(path).ok_or_else(|| not_found(path))?;
        let mask = 1u8 << (bit % 8);
        for view in [&mut file.written, &mut file.durable] {
            if let Some(byte) = view.get_mut(position as usize) {
                *byte ^= mask;
            }
        }
        Ok(())
    }

    /// Media damage: cuts the file to `len` bytes in both views.
    pub fn truncate(&self, path: &Path, len: u64) -> io::Result<()> {
        let mut state = self.lock();
        let file = state.files.get_mut(path).ok_or_else(|| not_found(path))?;
        file.written.truncate(len as usize);
        file.durable.truncate(len as usize);
        Ok(())
    }

    /// Repair of media damage (a healthy copy written back): both views become `bytes`.
    /// Refused with `NotFound` for a file that is gone (deleted since it was damaged).
    pub fn restore(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let mut state = self.lock();
        let file = state.files.get_mut(path).ok_or_else(|| not_found(path))?;
        file.written = bytes.to_vec();
        file.durable = bytes.to_vec();
        file.unsynced.clear();
        Ok(())
    }

    /// Media damage: the file is gone, durably.
    pub fn delete(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.unsynced_removals.remove(path);
        state.files.remove(path).map(|_| ()).ok_or_else(|| not_found(path))
    }

    /// The bytes reads would see now.
    pub fn written_bytes(&self, path: &Path) -> Option<Vec<u8>> {
        self.lock().files.get(path).map(|file| file.written.clone())
    }

    /// The bytes a crash is certain to keep.
    pub fn durable_bytes(&self, path: &Path) -> Option<Vec<u8>> {
        self.lock().files.get(path).map(|file| file.durable.clone())
    }

    fn lock(&self) -> MutexGuard<'_, SimState> {
        self.state.lock().expect("sim storage lock poisoned")
    }
}

impl SimState {
    /// Accounts one mutating call against a scheduled crash.
    fn tick(&mut self) -> io::Result<()> {
        if self.down {
            return Err(crashed());
        }
        match self.ops_until_crash {
            Some(0) => {
                self.down = true;
                self.ops_until_crash = None;
                Err(crashed())
            }
            Some(left) => {
                self.ops_until_crash = Some(left - 1);
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn check_up(&self) -> io::Result<()> {
        if self.down { Err(crashed()) } else { Ok(()) }
    }

    fn restart(&mut self) {
        // Parents sort before their children, so one pass decides every directory.
        let mut surviving = BTreeSet::new();
        for (dir, durable) in &self.dirs {
            let parent_survives = dir.parent().is_none_or(|parent| surviving.contains(parent));
            if dir.parent().is_none() || (*durable && parent_survives) {
                surviving.insert(dir.clone());
            }
        }
        self.dirs.retain(|dir, _| surviving.contains(dir));
        let in_surviving_dir =
            |path: &Path| path.parent().is_some_and(|parent| surviving.contains(parent));
        self.files.retain(|path, file| file.entry_durable && in_surviving_dir(path));
        let removed = std::mem::take(&mut self.unsynced_removals);
        self.files.extend(removed.into_iter().filter(|(path, _)| in_surviving_dir(path)));
        let paths: Vec<PathBuf> = self.files.keys().cloned().collect();
        for path in paths {
            let mut file = self.files.remove(&path).expect("listed above");
            self.apply_crash(&mut file);
            self.files.insert(path, file);
        }
        self.down = false;
        self.ops_until_crash = None;
        self.epoch += 1;
    }

    /// The durable bytes plus whatever the fault settings let survive of the unsynced tail.
    fn apply_crash(&mut self, file: &mut SimFile) {
        let pending = std::mem::take(&mut file.unsynced);
        let mut kept = 0;
        if self.faults.crash_keeps_unsynced_prefix && !pending.is_empty() {
            kept = self.rng.below(pending.len() as u64 + 1) as usize;
        }
        let mut content = std::mem::take(&mut file.durable);
        for (index, op) in pending.into_iter().take(kept).enumerate() {
            let last = index + 1 == kept;
            match op {
                PendingOp::SetLen(len) => content.resize(len as usize, 0),
                PendingOp::Write { position, mut bytes } => {
                    if last && self.faults.crash_tears_last_write {
                        let torn = self.rng.below(bytes.len() as u64 + 1) as usize;
                        bytes.truncate(torn);
                    }
                    write_into(&mut content, position, &bytes);
                }
            }
        }
        file.written = content.clone();
        file.durable = content;
    }

    fn used_bytes(&self) -> u64 {
        self.files.values().map(|file| file.written.len() as u64).sum()
    }

    /// Whether `handle` is a file removed (or replaced) since it was opened, in this
    /// incarnation: on Linux an open descriptor outlives the name, so writes and syncs through
    /// it succeed (on an inode nothing can reach again) rather than fail.
    fn orphaned(&self, handle: &SimFileHandle) -> bool {
        handle.epoch == self.epoch
            && self.files.get(&handle.path).is_none_or(|file| file.id != handle.id)
    }

    fn file(&mut self, handle: &SimFileHandle) -> io::Result<&mut SimFile> {
        if handle.epoch != self.epoch {
            return Err(io::Error::other("stale file handle from before a restart"));
        }
        match self.files.get_mut(&handle.path) {
            Some(file) if file.id == handle.id => Ok(file),
            _ => Err(io::Error::new(io::ErrorKind::NotFound, "file was removed")),
        }
    }
}

impl Storage for SimStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.tick()?;
        for ancestor in dir.ancestors() {
            // The root (and a relative path's empty base) always exists, durably.
            let is_root = ancestor.parent().is_none() || ancestor.as_os_str().is_empty();
            state.dirs.entry(ancestor.to_path_buf()).or_insert(is_root);
        }
        Ok(())
    }

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>> {
        let mut state = self.lock();
        if mode == OpenMode::Existing {
            state.check_up()?;
        } else {
            state.tick()?;
        }
        let parent = path.parent().unwrap_or(Path::new(""));
        if !state.dirs.contains_key(parent) {
            return Err(not_found(parent));
        }
        let exists = state.files.contains_key(path);
        match (mode, exists) {
            (OpenMode::Existing, false) => return Err(not_found(path)),
            (OpenMode::CreateNew, true) => {
                return Err(io::Error::new(io::ErrorKind::AlreadyExists, "file exists"));
            }
            (OpenMode::Truncate, true) => {
                let file = state.files.get_mut(path).expect("exists");
                file.written.clear();
                file.unsynced.push(PendingOp::SetLen(0));
            }
            (OpenMode::CreateNew | OpenMode::Truncate, false) => {
                let id = state.next_file_id;
                state.next_file_id += 1;
                let file = SimFile {
                    id,
                    written: Vec::new(),
                    durable: Vec::new(),
                    unsynced: Vec::new(),
                    entry_durable: false,
                    unreported_error: false,
                };
                state.files.insert(path.to_path_buf(), file);
            }
            (OpenMode::Existing, true) => {}
        }
        let id = state.files[path].id;
        Ok(Box::new(SimFileHandle {
            state: Arc::clone(&self.state),
            path: path.to_path_buf(),
            id,
            epoch: state.epoch,
        }))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.tick()?;
        let file = state.files.remove(path).ok_or_else(|| not_found(path))?;
        if file.entry_durable {
            state.unsynced_removals.insert(path.to_path_buf(), file);
        }
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.tick()?;
        let mut file = state.files.remove(from).ok_or_else(|| not_found(from))?;
        if file.entry_durable {
            // Until the directory is synced, a crash finds the file under its old name.
            state.unsynced_removals.insert(from.to_path_buf(), file.clone());
        }
        file.entry_durable = false;
        if let Some(replaced) = state.files.insert(to.to_path_buf(), file)
            && replaced.entry_durable
        {
            state.unsynced_removals.insert(to.to_path_buf(), replaced);
        }
        Ok(())
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        let state = self.lock();
        state.check_up()?;
        let is_root = path.parent().is_none();
        Ok(is_root || state.files.contains_key(path) || state.dirs.contains_key(path))
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let state = self.lock();
        state.check_up()?;
        if !state.dirs.contains_key(dir) {
            return Err(not_found(dir));
        }
        Ok(state.files.keys().filter(|path| path.parent() == Some(dir)).cloned().collect())
    }

    fn filesystem_sync(&self, _dir: &Path) -> io::Result<Box<dyn FilesystemSync>> {
        self.lock().check_up()?;
        Ok(Box::new(SimFilesystemSync { state: Arc::clone(&self.state) }))
    }

    /// The simulated disk has no owners or modes: nothing to restrict, and no fault tick, so a
    /// seed's faults land where they always did.
    fn restrict_dir(&self, _dir: &Path) -> io::Result<Option<u32>> {
        Ok(None)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.tick()?;
        if !state.dirs.contains_key(dir) {
            return Err(not_found(dir));
        }
        for (path, file) in state.files.iter_mut() {
            if path.parent() == Some(dir) {
                file.entry_durable = true;
            }
        }
        for (path, durable) in state.dirs.iter_mut() {
            if path.parent() == Some(dir) {
                *durable = true;
            }
        }
        state.unsynced_removals.retain(|path, _| path.parent() != Some(dir));
        Ok(())
    }
}

impl StorageFile for SimFileHandle {
    fn size_bytes(&self) -> io::Result<u64> {
        let mut state = self.state.lock().expect("sim storage lock poisoned");
        state.check_up()?;
        Ok(state.file(self)?.written.len() as u64)
    }

    fn read_at(&self, buf: &mut [u8], position: u64) -> io::Result<usize> {
        let mut state = self.state.lock().expect("sim storage lock poisoned");
        state.check_up()?;
        let file = state.file(self)?;
        let start = (position as usize).min(file.written.len());
        let end = (start + buf.len()).min(file.written.len());
        buf[..end - start].copy_from_slice(&file.written[start..end]);
        Ok(end - start)
    }

    fn write_all_at(&self, bufs: &[&[u8]], position: u64) -> io::Result<()> {
        let mut state = self.state.lock().expect("sim storage lock poisoned");
        state.tick()?;
        if state.orphaned(self) {
            return Ok(());
        }
        let total: usize = bufs.iter().map(|buf| buf.len()).sum();
        let current_len = state.file(self)?.written.len() as u64;
        let growth = (position + total as u64).saturating_sub(current_len);
        if let Some(capacity) = state.faults.capacity_bytes
            && state.used_bytes() + growth > capacity
        {
            return Err(io::Error::new(io::ErrorKind::StorageFull, "simulated ENOSPC"));
        }
        let per_mille = state.faults.write_failure_per_mille;
        if per_mille > 0 && state.rng.chance(per_mille, 1000) {
            return Err(io::Error::other("simulated EIO on write"));
        }
        let mut bytes = Vec::with_capacity(total);
        for buf in bufs {
            bytes.extend_from_slice(buf);
        }
        let file = state.file(self)?;
        write_into(&mut file.written, position, &bytes);
        file.unsynced.push(PendingOp::Write { position, bytes });
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut state = self.state.lock().expect("sim storage lock poisoned");
        state.tick()?;
        if state.orphaned(self) {
            return Ok(());
        }
        state.syncs += 1;
        let forced = state.forced_sync_failures > 0;
        let per_mille = state.faults.sync_failure_per_mille;
        let failed = forced || (per_mille > 0 && state.rng.chance(per_mille, 1000));
        if forced {
            state.forced_sync_failures -= 1;
        }
        let file = state.file(self)?;
        let unreported = std::mem::take(&mut file.unreported_error);
        if failed || unreported {
            // The kernel marks the pages clean without writing them: they are lost on a crash
            // and no later sync will retry them.
            file.unsynced.clear();
            state.failed_syncs += 1;
            return Err(io::Error::other("simulated EIO on fdatasync"));
        }
        file.sync_pending();
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut state = self.state.lock().expect("sim storage lock poisoned");
        state.tick()?;
        let file = state.file(self)?;
        file.written.resize(len as usize, 0);
        file.unsynced.push(PendingOp::SetLen(len));
        Ok(())
    }

    fn drop_clean_cache(&self) -> io::Result<()> {
        let mut state = self.state.lock().expect("sim storage lock poisoned");
        state.check_up()?;
        let file = state.file(self)?;
        // Dirty pages stay; clean ones are read again from the disk, so pages a failed sync
        // marked clean without writing show the disk's bytes again.
        let mut content = file.durable.clone();
        for op in &file.unsynced {
            match op {
                PendingOp::SetLen(len) => content.resize(*len as usize, 0),
                PendingOp::Write { position, bytes } => write_into(&mut content, *position, bytes),
            }
        }
        file.written = content;
        Ok(())
    }
}

impl SimFile {
    /// Applies exactly the pending operations: pages dropped by an earlier failed sync stay lost.
    fn sync_pending(&mut self) {
        for op in std::mem::take(&mut self.unsynced) {
            match op {
                PendingOp::SetLen(len) => self.durable.resize(len as usize, 0),
                PendingOp::Write { position, bytes } => {
                    write_into(&mut self.durable, position, &bytes)
                }
            }
        }
    }
}

/// `syncfs` on the simulated disk: every file's pending writes and every directory entry become
/// durable at once. A failure (at the disk's sync failure rate) drops the pending pages of some
/// of the files that had any, chosen by the seed, and each of those files also reports the error
/// to its own next `fdatasync`, as Linux does.
#[derive(Debug)]
struct SimFilesystemSync {
    state: Arc<Mutex<SimState>>,
}

impl FilesystemSync for SimFilesystemSync {
    fn sync_all(&self) -> io::Result<()> {
        let mut state = self.state.lock().expect("sim storage lock poisoned");
        state.tick()?;
        state.syncs += 1;
        let forced = state.forced_sync_failures > 0;
        let per_mille = state.faults.sync_failure_per_mille;
        let failed = forced || (per_mille > 0 && state.rng.chance(per_mille, 1000));
        if forced {
            state.forced_sync_failures -= 1;
        }
        if failed {
            state.failed_syncs += 1;
            let dirty: Vec<PathBuf> = state
                .files
                .iter()
                .filter(|(_, file)| !file.unsynced.is_empty())
                .map(|(path, _)| path.clone())
                .collect();
            let first_lost = if dirty.is_empty() { 0 } else { state.rng.below(dirty.len() as u64) };
            for (at, path) in dirty.iter().enumerate() {
                let lost = at as u64 == first_lost || state.rng.chance(1, 2);
                let file = state.files.get_mut(path).expect("listed above");
                if lost {
                    file.unsynced.clear();
                    file.unreported_error = true;
                } else {
                    file.sync_pending();
                }
            }
            return Err(io::Error::other("simulated EIO on syncfs"));
        }
        for file in state.files.values_mut() {
            file.sync_pending();
            file.entry_durable = true;
        }
        for durable in state.dirs.values_mut() {
            *durable = true;
        }
        state.unsynced_removals.clear();
        Ok(())
    }
}

fn write_into(target: &mut Vec<u8>, position: u64, bytes: &[u8]) {
    let start = position as usize;
    if target.len() < start + bytes.len() {
        target.resize(start + bytes.len(), 0);
    }
    target[start..start + bytes.len()].copy_from_slice(bytes);
}

fn crashed() -> io::Error {
    io::Error::other("simulated crash: storage is down")
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("{} not found", path.display()))
}

#[cfg(test)]
mod tests;
