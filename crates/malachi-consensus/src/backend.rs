//! A redb storage backend over Malachi's disk seam (`malachi_log::StorageFile`), so the Raft store
//! can live on the simulator's disk, which loses unsynced writes on a crash, tears the last one,
//! and fails fsync on demand, exactly like the segment files beside it.

use std::io;

use malachi_log::StorageFile;

/// One file of a `malachi_log::Storage`, as redb's backend.
#[derive(Debug)]
pub struct StorageFileBackend {
    file: Box<dyn StorageFile>,
}

impl StorageFileBackend {
    pub fn new(file: Box<dyn StorageFile>) -> StorageFileBackend {
        StorageFileBackend { file }
    }

    /// A backend over a store file that this process did not write last (a restart): see
    /// [`distrust_page_cache`].
    pub fn after_restart(file: Box<dyn StorageFile>) -> io::Result<StorageFileBackend> {
        distrust_page_cache(file.as_ref())?;
        Ok(StorageFileBackend { file })
    }
}

/// Makes a store file read as the disk holds it: what the page cache holds dirty is synced, and
/// clean cached pages are dropped, because after a failed `fdatasync` (the node then stopped)
/// the kernel keeps pages it marked clean without writing them, and redb would trust them.
pub fn distrust_page_cache(file: &dyn StorageFile) -> io::Result<()> {
    file.sync_data()?;
    file.drop_clean_cache()
}

impl redb::StorageBackend for StorageFileBackend {
    fn len(&self) -> Result<u64, io::Error> {
        self.file.size_bytes()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        let read = self.file.read_at(out, offset)?;
        if read != out.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past the end of the store",
            ));
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.file.set_len(len)
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        self.file.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.file.write_all_at(&[data], offset)
    }
}
