//! The disk seam: every byte the segment store reads or writes goes through these two traits.
//!
//! [`RealStorage`] is the production implementation over files, with positioned vectored writes
//! and `fdatasync`. [`SimStorage`] keeps everything in memory for the deterministic simulator and
//! for crash tests: it keeps written and durable bytes apart and injects faults on demand.
//! Neither decides anything; the segment store above them owns every decision.

mod real;
mod sim;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

pub use real::RealStorage;
pub use sim::{SimFaults, SimStorage};

/// Creates `dir` and every missing directory between `root` and it, and makes each of them
/// durable: a new directory's entry lives in its parent, so each level's parent is synced. Every
/// level's parent is synced, even where the directory already existed, because an earlier
/// attempt may have created it and stopped before that sync (a few syncs, once per directory
/// and process: the caller remembers what it made durable). `root` must already be durable (the
/// data directory, made so at boot).
pub fn create_dir_durable(storage: &dyn Storage, root: &Path, dir: &Path) -> io::Result<()> {
    assert!(dir.starts_with(root), "{} is not under {}", dir.display(), root.display());
    // The filesystem root has no parent and always exists.
    let levels: Vec<&Path> =
        dir.ancestors().take_while(|level| *level != root && level.parent().is_some()).collect();
    for level in levels.into_iter().rev() {
        let parent = match level.parent() {
            Some(parent) if parent.as_os_str().is_empty() => Path::new("."),
            Some(parent) => parent,
            None => unreachable!("a level below root has a parent"),
        };
        if !storage.exists(level)? {
            storage.create_dir_all(level)?;
        }
        storage.sync_dir(parent)?;
    }
    Ok(())
}

/// How [`Storage::open`] treats an existing or missing file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Open a file that must exist.
    Existing,
    /// Create a file that must not exist.
    CreateNew,
    /// Create the file, or empty it if it exists (derived files only, such as indexes).
    Truncate,
}

/// Mode of every directory a [`Storage`] creates: the broker's user only. The data directory
/// holds password hashes (the Raft store), the cursor secret and every record.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every file a [`Storage`] creates, for the same reason.
pub const FILE_MODE: u32 = 0o600;

/// A directory tree of files.
pub trait Storage: Send + Sync + fmt::Debug {
    /// Creates `dir` and its missing ancestors, each with [`DIR_MODE`]. Not durable by itself:
    /// see [`create_dir_durable`].
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Opens `path`; a file it creates gets [`FILE_MODE`].
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>>;
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Renames a file, replacing `to` if it exists; durable once the directory is synced.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Whether a file or a directory exists at `path`.
    fn exists(&self, path: &Path) -> io::Result<bool>;
    /// Paths of the files directly in `dir`, sorted.
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>>;
    /// Makes creations and removals in `dir` durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// A handle that makes everything written to the filesystem holding `dir` durable at once
    /// (`syncfs`), for group commit over many files. Open it before the writes it must cover:
    /// it reports every write-back error that happens after it was opened, once.
    fn filesystem_sync(&self, dir: &Path) -> io::Result<Box<dyn FilesystemSync>>;
    /// Gives `dir` [`DIR_MODE`] if it allows more (a directory made by an older version, or
    /// by hand under a loose umask), and returns the mode it had; `None` if it was private.
    fn restrict_dir(&self, dir: &Path) -> io::Result<Option<u32>>;
}

/// One barrier for every file of a filesystem (see [`Storage::filesystem_sync`]).
pub trait FilesystemSync: Send + Sync + fmt::Debug {
    /// `syncfs`: after `Ok`, everything written to any file of the filesystem before the call
    /// survives a crash. After an error, any write since the previous call may be lost, and
    /// which one cannot be known: treat them all as failed.
    fn sync_all(&self) -> io::Result<()>;
}

/// One open file. Positioned calls only, so one handle serves concurrent readers and a writer.
pub trait StorageFile: Send + Sync + fmt::Debug {
    fn size_bytes(&self) -> io::Result<u64>;
    /// Fills `buf` from `position`; returns fewer bytes only at the end of the file.
    fn read_at(&self, buf: &mut [u8], position: u64) -> io::Result<usize>;
    /// Writes all of `bufs`, in order, starting at `position`.
    fn write_all_at(&self, bufs: &[&[u8]], position: u64) -> io::Result<()>;
    /// `fdatasync`: after `Ok`, everything written before the call survives a crash. After an
    /// error nothing can be assumed, and calling it again proves nothing (the kernel may have
    /// dropped the dirty pages); the caller must treat the file as failed.
    fn sync_data(&self) -> io::Result<()>;
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Asks the kernel to forget this file's cached pages that are not dirty, so the next reads
    /// come from the device. After a failed `fdatasync` Linux keeps pages it marked clean
    /// without writing them, and reads serve bytes the disk does not hold; recovery syncs, then
    /// drops the cache, then reads what really is on the disk.
    fn drop_clean_cache(&self) -> io::Result<()>;
    /// Starts writing back `len` bytes from `position` without waiting and without any
    /// durability promise (`sync_file_range(SYNC_FILE_RANGE_WRITE)`), so that a later
    /// `fdatasync` finds little left to do. A hint: errors are the later sync's to report.
    fn start_writeback(&self, _position: u64, _len: u64) {}
}
