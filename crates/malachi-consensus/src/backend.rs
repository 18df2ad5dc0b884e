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
