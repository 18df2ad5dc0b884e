//! [`GroupLog`]: openraft's log storage for one group, on the shared [`GroupStore`].
//!
//! Entries, vote, committed and last purged log id are serde_json in redb (layout in `store`).
//! Every write awaits the writer's commit, so a write that returned is readable, and an append's
//! `IOFlushed` callback runs only after its batch was fsynced.
//!
//! Invariant: the stored log of a group is `(last_purged, last]` without a hole. Appends are
//! checked to be consecutive before they are written, reads are checked to be consecutive after
//! they are read; a violation is an `io::Error` (openraft then stops the group), never a panic.

use std::fmt::Debug;
use std::io;
use std::marker::PhantomData;
use std::ops::Bound;
use std::ops::RangeBounds;
use std::sync::Arc;

use openraft::LogState;
use openraft::OptionalSend;
use openraft::RaftLogReader;
use openraft::entry::RaftEntry;
use openraft::storage::IOFlushed;
use openraft::storage::RaftLogStorage;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::StateMachine;
use crate::error::StoreError;
use crate::store::GroupStore;
use crate::store::Persist;
use crate::store::StateKey;
use crate::store::WriteOp;
use crate::type_config::Config;
use crate::type_config::Entry;
use crate::type_config::LogId;
use crate::type_config::Vote;

/// Entries returned by one `limited_get_log_entries` call at most: bounds the memory of one
/// replication read.
const READ_ENTRIES_MAX: usize = 4096;

/// The log storage of one group. Cheap to clone: the clone is also its log reader.
pub(crate) struct GroupLog<M> {
    store: GroupStore,
    group_id: u64,
    /// Counts the live clones of the group's storage objects; see [`crate::RaftGroup::shutdown`].
    liveness: Arc<()>,
    machine: PhantomData<fn() -> M>,
}

impl<M> GroupLog<M> {
    pub(crate) fn new(store: GroupStore, group_id: u64, liveness: Arc<()>) -> Self {
        GroupLog { store, group_id, liveness, machine: PhantomData }
    }
}

impl<M> Clone for GroupLog<M> {
    fn clone(&self) -> Self {
        GroupLog::new(self.store.clone(), self.group_id, Arc::clone(&self.liveness))
    }
}

impl<M: StateMachine> GroupLog<M> {
    /// Reads the entries with `first <= index <= last`, at most `count_max` of them, checking
    /// that they are consecutive and stored under their own index.
    fn read_range(&self, first: u64, last: u64, count_max: usize) -> io::Result<Vec<Entry<M>>> {
        let raw = self.store.read_entries(self.group_id, first, last, count_max)?;
        let mut entries: Vec<Entry<M>> = Vec::with_capacity(raw.len());
        for (index, bytes) in raw {
            let entry: Entry<M> = decode(&bytes, "log entry")?;
            if entry.index() != index {
                let message = format!("entry stored at index {index} has index {}", entry.index());
                return Err(corrupt(self.group_id, message));
            }
            if let Some(previous) = entries.last()
                && previous.index() + 1 != index
            {
                let message = format!("hole in the log between {} and {index}", previous.index());
                return Err(corrupt(self.group_id, message));
            }
            entries.push(entry);
        }
        Ok(entries)
    }

    fn read_log_id(&self, key: StateKey) -> io::Result<Option<LogId<M>>> {
        read_state::<Option<LogId<M>>>(&self.store, self.group_id, key).map(Option::flatten)
    }
}

impl<M: StateMachine> RaftLogReader<Config<M>> for GroupLog<M> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> io::Result<Vec<Entry<M>>> {
        match inclusive_bounds(&range) {
            None => Ok(Vec::new()),
            Some((first, last)) => self.read_range(first, last, usize::MAX),
        }
    }

    async fn read_vote(&mut self) -> io::Result<Option<Vote<M>>> {
        read_state(&self.store, self.group_id, StateKey::Vote)
    }

    async fn limited_get_log_entries(&mut self, start: u64, end: u64) -> io::Result<Vec<Entry<M>>> {
        match inclusive_bounds(&(start..end)) {
            None => Ok(Vec::new()),
            Some((first, last)) => self.read_range(first, last, READ_ENTRIES_MAX),
        }
    }
}

impl<M: StateMachine> RaftLogStorage<Config<M>> for GroupLog<M> {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> io::Result<LogState<Config<M>>> {
        let last_purged_log_id = self.read_log_id(StateKey::LastPurged)?;
        let last_log_id = match self.store.read_last_entry(self.group_id)? {
            None => last_purged_log_id,
            Some((_, bytes)) => Some(decode::<Entry<M>>(&bytes, "log entry")?.log_id()),
        };
        Ok(LogState { last_purged_log_id, last_log_id })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<M>) -> io::Result<()> {
        let op = self.put_state(StateKey::Vote, vote)?;
        self.store.write(vec![op], Persist::Fsync).await?;
        Ok(())
    }

    async fn save_committed(&mut self, committed: Option<LogId<M>>) -> io::Result<()> {
        // Buffered: a committed log id lost in a crash only makes the restart replay less
        // before the leader re-establishes it; it rides on the next fsync.
        let op = self.put_state(StateKey::Committed, &committed)?;
        self.store.write(vec![op], Persist::Buffered).await?;
        Ok(())
    }

    async fn read_committed(&mut self) -> io::Result<Option<LogId<M>>> {
        self.read_log_id(StateKey::Committed)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<Config<M>>) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry<M>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut ops = Vec::new();
        let mut previous_index: Option<u64> = None;
        for entry in entries {
            let index = entry.index();
            if previous_index.is_some_and(|previous| previous + 1 != index) {
                let message = format!("append is not consecutive at index {index}");
                return Err(corrupt(self.group_id, message));
            }
            previous_index = Some(index);
            let bytes = encode(&entry)?;
            ops.push(WriteOp::PutEntry { group_id: self.group_id, index, bytes });
        }
        let result = self.store.write(ops, Persist::Fsync).await.map_err(io::Error::from);
        // Invariant: the callback learns of success only after the commit fsynced.
        match result {
            Ok(()) => {
                callback.io_completed(Ok(()));
                Ok(())
            }
            Err(error) => {
                callback.io_completed(Err(io::Error::new(error.kind(), error.to_string())));
                Err(error)
            }
        }
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId<M>>) -> io::Result<()> {
        let first = match &last_log_id {
            None => 0,
            Some(log_id) => log_id.index() + 1,
        };
        let op = WriteOp::RemoveEntries { group_id: self.group_id, first, last: u64::MAX };
        self.store.write(vec![op], Persist::Fsync).await?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<M>) -> io::Result<()> {
        let purged = self.read_log_id(StateKey::LastPurged)?;
        if purged.as_ref().is_some_and(|purged| purged > &log_id) {
            let message = format!("purge to {log_id} is behind the last purge");
            return Err(corrupt(self.group_id, message));
        }
        // The entries and the purge mark go in one job, so no reader ever sees one without the
        // other.
        let ops = vec![
            WriteOp::RemoveEntries { group_id: self.group_id, first: 0, last: log_id.index() },
            self.put_state(StateKey::LastPurged, &Some(log_id))?,
        ];
        self.store.write(ops, Persist::Fsync).await?;
        Ok(())
    }
}

impl<M> GroupLog<M> {
    fn put_state<T: Serialize>(&self, key: StateKey, value: &T) -> io::Result<WriteOp> {
        Ok(WriteOp::PutState { group_id: self.group_id, key, bytes: encode(value)? })
    }
}

/// `range` as inclusive `(first, last)` indexes, or `None` when it is empty.
fn inclusive_bounds(range: &impl RangeBounds<u64>) -> Option<(u64, u64)> {
    let first = match range.start_bound() {
        Bound::Included(start) => *start,
        Bound::Excluded(start) => start.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let last = match range.end_bound() {
        Bound::Included(end) => *end,
        Bound::Excluded(end) => end.checked_sub(1)?,
        Bound::Unbounded => u64::MAX,
    };
    (first <= last).then_some((first, last))
}

pub(crate) fn read_state<T: DeserializeOwned>(
    store: &GroupStore,
    group_id: u64,
    key: StateKey,
) -> io::Result<Option<T>> {
    match store.read_state(group_id, key)? {
        None => Ok(None),
        Some(bytes) => Ok(Some(decode(&bytes, "group state")?)),
    }
}

pub(crate) fn encode<T: Serialize>(value: &T) -> io::Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(io::Error::other)
}

pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8], what: &str) -> io::Result<T> {
    serde_json::from_slice(bytes).map_err(|error| {
        let message = format!("{what} does not decode: {error}");
        io::Error::new(io::ErrorKind::InvalidData, StoreError::Corrupt(message))
    })
}

fn corrupt(group_id: u64, message: String) -> io::Error {
    let error = StoreError::Corrupt(format!("group {group_id}: {message}"));
    io::Error::new(io::ErrorKind::InvalidData, error)
}

impl From<StoreError> for io::Error {
    fn from(error: StoreError) -> io::Error {
        let kind = match error {
            StoreError::Corrupt(_) => io::ErrorKind::InvalidData,
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, error)
    }
}

#[cfg(test)]
mod tests {
    use std::ops::Bound;

    use super::inclusive_bounds;

    #[test]
    fn inclusive_bounds_table() {
        let cases: [(&str, Option<(u64, u64)>); 8] = [
            ("3..7", inclusive_bounds(&(3..7))),
            ("3..=7", inclusive_bounds(&(3..=7))),
            ("3..3", inclusive_bounds(&(3..3))),
            ("..", inclusive_bounds(&(..))),
            ("..0", inclusive_bounds(&(..0))),
            ("5..", inclusive_bounds(&(5..))),
            ("max..=max", inclusive_bounds(&(u64::MAX..=u64::MAX))),
            ("7..3", inclusive_bounds(&(Bound::Included(7), Bound::Excluded(3)))),
        ];
        let expected = [
            Some((3, 6)),
            Some((3, 7)),
            None,
            Some((0, u64::MAX)),
            None,
            Some((5, u64::MAX)),
            Some((u64::MAX, u64::MAX)),
            None,
        ];
        for ((name, got), want) in cases.into_iter().zip(expected) {
            assert_eq!(got, want, "{name}");
        }
    }
}
