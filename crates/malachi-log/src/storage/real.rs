//! The production storage: plain files, `pwritev`, `fdatasync`.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::{DIR_MODE, FILE_MODE, FilesystemSync, OpenMode, Storage, StorageFile};

/// Files on the local filesystem.
#[derive(Clone, Copy, Debug, Default)]
pub struct RealStorage;

#[derive(Debug)]
struct RealFile {
    file: File,
}

/// `pwritev` takes at most this many buffers per call (Linux `IOV_MAX`).
const IOVECS_PER_CALL_MAX: usize = 1024;

impl Storage for RealStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        fs::DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir)
    }

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>> {
        let mut options = OpenOptions::new();
        // The mode only applies to a file this call creates.
        options.read(true).write(true).mode(FILE_MODE);
        match mode {
            OpenMode::Existing => {}
            OpenMode::CreateNew => {
                // A new file is never made through a symbolic link planted at its name: O_EXCL
                // already refuses one, O_NOFOLLOW says so again at the system call.
                options.create_new(true).custom_flags(libc::O_NOFOLLOW);
            }
            OpenMode::Truncate => {
                options.create(true).truncate(true);
            }
        }
        Ok(Box::new(RealFile { file: options.open(path)? }))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        path.try_exists()
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let mut paths = Vec::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                paths.push(entry.path());
            }
        }
        paths.sort();
        Ok(paths)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn filesystem_sync(&self, dir: &Path) -> io::Result<Box<dyn FilesystemSync>> {
        Ok(Box::new(RealFilesystemSync { dir: File::open(dir)? }))
    }

    fn restrict_dir(&self, dir: &Path) -> io::Result<Option<u32>> {
        let mode = fs::metadata(dir)?.permissions().mode() & 0o7777;
        if mode & !DIR_MODE == 0 {
            return Ok(None);
        }
        fs::set_permissions(dir, fs::Permissions::from_mode(DIR_MODE))?;
        Ok(Some(mode))
    }
}

/// `syncfs` through one descriptor held for the node's life: Linux reports a write-back error to
/// each descriptor's next `syncfs` once, counting from when it was opened.
#[derive(Debug)]
struct RealFilesystemSync {
    dir: File,
}

impl FilesystemSync for RealFilesystemSync {
    fn sync_all(&self) -> io::Result<()> {
        // SAFETY: syncfs takes a descriptor this struct owns.
        if unsafe { libc::syncfs(self.dir.as_raw_fd()) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

impl StorageFile for RealFile {
    fn size_bytes(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn read_at(&self, buf: &mut [u8], position: u64) -> io::Result<usize> {
        let mut filled = 0;
        while filled < buf.len() {
            match self.file.read_at(&mut buf[filled..], position + filled as u64) {
                Ok(0) => break,
                Ok(read) => filled += read,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
        Ok(filled)
    }

    fn write_all_at(&self, bufs: &[&[u8]], position: u64) -> io::Result<()> {
        let mut bufs: Vec<&[u8]> = bufs.iter().copied().filter(|buf| !buf.is_empty()).collect();
        let mut position = position;
        while !bufs.is_empty() {
            let count = bufs.len().min(IOVECS_PER_CALL_MAX);
            let iovecs: Vec<libc::iovec> = bufs[..count]
                .iter()
                .map(|buf| libc::iovec { iov_base: buf.as_ptr() as *mut _, iov_len: buf.len() })
                .collect();
            // SAFETY: the iovecs point into live slices borrowed for the duration of the call.
            let written = unsafe {
                libc::pwritev(self.file.as_raw_fd(), iovecs.as_ptr(), count as i32, position as i64)
            };
            if written < 0 {
                let error = io::Error::last_os_error();
                if error.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(error);
            }
            if written == 0 {
                return Err(io::Error::new(io::ErrorKind::WriteZero, "pwritev wrote nothing"));
            }
            position += written as u64;
            consume(&mut bufs, written as usize);
        }
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn start_writeback(&self, position: u64, len: u64) {
        // SAFETY: a hint on a descriptor this handle owns; its result is deliberately unused.
        unsafe {
            libc::sync_file_range(
                self.file.as_raw_fd(),
                position as i64,
                len as i64,
                libc::SYNC_FILE_RANGE_WRITE,
            );
        }
    }

    fn drop_clean_cache(&self) -> io::Result<()> {
        // SAFETY: a plain advisory call on a descriptor this handle owns.
        let code =
            unsafe { libc::posix_fadvise(self.file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if code == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(code)) }
    }
}

/// Drops the first `written` bytes from `bufs` after a (possibly partial) vectored write.
fn consume(bufs: &mut Vec<&[u8]>, mut written: usize) {
    let mut done = 0;
    while done < bufs.len() && written >= bufs[done].len() {
        written -= bufs[done].len();
        done += 1;
    }
    bufs.drain(..done);
    if written > 0 {
        bufs[0] = &bufs[0][written..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consume_handles_partial_writes() {
        type Case<'a> = (&'a [&'a [u8]], usize, &'a [&'a [u8]]);
        let cases: &[Case] = &[
            (&[b"abc", b"de"], 0, &[b"abc", b"de"]),
            (&[b"abc", b"de"], 2, &[b"c", b"de"]),
            (&[b"abc", b"de"], 3, &[b"de"]),
            (&[b"abc", b"de"], 4, &[b"e"]),
            (&[b"abc", b"de"], 5, &[]),
        ];
        for (input, written, expected) in cases {
            let mut bufs = input.to_vec();
            consume(&mut bufs, *written);
            assert_eq!(bufs, expected.to_vec(), "written {written}");
        }
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    /// Whatever the umask lets through, what the broker creates is its user's alone.
    #[test]
    fn created_directories_and_files_are_private() {
        // SAFETY: umask only swaps the process's creation mask; nextest runs each test in a
        // process of its own, and the common default is set, not a looser one.
        unsafe { libc::umask(0o022) };
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("a/b/c");
        RealStorage.create_dir_all(&nested).unwrap();
        for level in ["a", "a/b", "a/b/c"] {
            assert_eq!(mode(&dir.path().join(level)), DIR_MODE, "{level}");
        }
        let cases = [("new", OpenMode::CreateNew), ("truncated", OpenMode::Truncate)];
        for (name, open_mode) in cases {
            let path = nested.join(name);
            RealStorage.open(&path, open_mode).unwrap();
            assert_eq!(mode(&path), FILE_MODE, "{name}");
        }
    }

    #[test]
    fn a_new_file_is_never_created_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        for existing in [false, true] {
            let link = dir.path().join(format!("link-{existing}"));
            if existing {
                fs::write(&target, b"untouched").unwrap();
            }
            std::os::unix::fs::symlink(&target, &link).unwrap();
            assert!(RealStorage.open(&link, OpenMode::CreateNew).is_err(), "{existing}");
            let contents = fs::read(&target).ok();
            assert_eq!(contents, existing.then(|| b"untouched".to_vec()), "{existing}");
        }
    }

    #[test]
    fn a_loose_directory_is_restricted_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [(0o755, Some(0o755)), (0o770, Some(0o770)), (0o700, None), (0o500, None)];
        for (before, reported) in cases {
            fs::set_permissions(dir.path(), fs::Permissions::from_mode(before)).unwrap();
            assert_eq!(RealStorage.restrict_dir(dir.path()).unwrap(), reported, "{before:o}");
            let expected = if reported.is_some() { DIR_MODE } else { before };
            assert_eq!(mode(dir.path()), expected, "{before:o}");
        }
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
    }

    #[test]
    fn vectored_write_then_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = RealStorage.open(&path, OpenMode::CreateNew).unwrap();
        file.write_all_at(&[b"hello ", b"", b"world"], 3).unwrap();
        file.sync_data().unwrap();
        let mut buf = vec![0u8; 20];
        let read = file.read_at(&mut buf, 0).unwrap();
        assert_eq!(&buf[..read], b"\0\0\0hello world");
        assert!(
            RealStorage.open(&path, OpenMode::CreateNew).is_err(),
            "create_new must not clobber"
        );
    }
}
