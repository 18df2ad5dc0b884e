//! [`GroupMachine`]: openraft's state machine for one group, wrapping a pure [`StateMachine`].
//!
//! The machine lives in memory behind a lock shared with [`crate::RaftGroup::read`]; beside it
//! sit the Raft facts the pure machine must not see (last applied log id, membership). Only
//! snapshots are persisted (in the shared [`GroupStore`]); on restart openraft installs the last
//! snapshot and re-applies the log from there up to the persisted committed log id.
//!
//! Invariant: applied log indexes strictly increase; a violation is an `io::Error`.

use std::io;
use std::sync::Arc;
use std::sync::RwLock;
use std::sync::RwLockReadGuard;
use std::sync::RwLockWriteGuard;

use futures_util::Stream;
use futures_util::StreamExt;
use openraft::EntryPayload;
use openraft::OptionalSend;
use openraft::RaftSnapshotBuilder;
use openraft::storage::EntryResponder;
use openraft::storage::RaftStateMachine;

use crate::StateMachine;
use crate::log_store::decode;
use crate::log_store::encode;
use crate::store::GroupStore;
use crate::store::Persist;
use crate::store::WriteOp;
use crate::type_config::Command;
use crate::type_config::Config;
use crate::type_config::Entry;
use crate::type_config::LogId;
use crate::type_config::Snapshot;
use crate::type_config::SnapshotMeta;
use crate::type_config::StoredMembership;

/// The applied state of a group: the pure machine plus what Raft knows about it.
pub(crate) struct Applied<M: StateMachine> {
    pub(crate) machine: M,
    pub(crate) last_applied: Option<LogId<M>>,
    pub(crate) membership: StoredMembership<M>,
}

/// openraft's state machine and snapshot builder for one group. Cheap to clone; clones share
/// the applied state.
pub(crate) struct GroupMachine<M: StateMachine> {
    store: GroupStore,
    group_id: u64,
    applied: Arc<RwLock<Applied<M>>>,
    /// Counts the live clones of the group's storage objects; see [`crate::RaftGroup::shutdown`].
    liveness: Arc<()>,
}

impl<M: StateMachine> Clone for GroupMachine<M> {
    fn clone(&self) -> Self {
        GroupMachine {
            store: self.store.clone(),
            group_id: self.group_id,
            applied: Arc::clone(&self.applied),
            liveness: Arc::clone(&self.liveness),
        }
    }
}

impl<M: StateMachine> GroupMachine<M> {
    /// An empty machine; openraft fills it from the stored snapshot and log when the group
    /// starts.
    pub(crate) fn new(store: GroupStore, group_id: u64, liveness: Arc<()>) -> Self {
        let applied = Applied {
            machine: M::empty(),
            last_applied: None,
            membership: StoredMembership::<M>::default(),
        };
        GroupMachine { store, group_id, applied: Arc::new(RwLock::new(applied)), liveness }
    }

    /// The applied state, shared with the group's readers.
    pub(crate) fn applied(&self) -> Arc<RwLock<Applied<M>>> {
        Arc::clone(&self.applied)
    }

    fn read(&self) -> RwLockReadGuard<'_, Applied<M>> {
        read_applied(&self.applied)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Applied<M>> {
        // See `read_applied` on a poisoned lock.
        self.applied.write().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Applies one committed entry; `None` answers entries without a command.
    fn apply_entry(&self, entry: Entry<M>) -> io::Result<Option<M::Response>> {
        let mut applied = self.write();
        if applied.last_applied.as_ref().is_some_and(|last| last.index() >= entry.log_id.index()) {
            let message = format!(
                "group {}: apply of index {} after index {:?}",
                self.group_id,
                entry.log_id.index(),
                applied.last_applied.as_ref().map(|last| last.index()),
            );
            return Err(io::Error::new(io::ErrorKind::InvalidData, message));
        }
        applied.last_applied = Some(entry.log_id);
        let response = match entry.payload {
            EntryPayload::Blank => None,
            EntryPayload::Normal(Command(command)) => Some(applied.machine.apply(command)),
            EntryPayload::Membership(membership) => {
                applied.membership = StoredMembership::<M>::new(Some(entry.log_id), membership);
                None
            }
        };
        Ok(response)
    }

    /// Stores a snapshot durably as the group's current one (unless a newer one is stored).
    async fn persist_snapshot(&self, meta: &SnapshotMeta<M>, data: Vec<u8>) -> io::Result<()> {
        let op = WriteOp::PutSnapshot {
            group_id: self.group_id,
            last_index: meta.last_log_id.as_ref().map(|log_id| log_id.index()),
            meta: encode(meta)?,
            data,
        };
        self.store.write(vec![op], Persist::Fsync).await?;
        Ok(())
    }
}

impl<M: StateMachine> RaftSnapshotBuilder<Config<M>> for GroupMachine<M> {
    type SnapshotData = Vec<u8>;

    async fn build_snapshot(&mut self) -> io::Result<Snapshot<M>> {
        // The machine is serialized under the read lock: applies wait for it, reads do not.
        let (meta, data) = {
            let applied = self.read();
            let meta = SnapshotMeta::<M> {
                last_log_id: applied.last_applied,
                last_membership: applied.membership.clone(),
            };
            (meta, applied.machine.snapshot())
        };
        self.persist_snapshot(&meta, data.clone()).await?;
        tracing::debug!(group_id = self.group_id, %meta, bytes = data.len(), "snapshot built");
        Ok(Snapshot::<M> { meta, snapshot: data })
    }
}

impl<M: StateMachine> RaftStateMachine<Config<M>> for GroupMachine<M> {
    type SnapshotData = Vec<u8>;
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> io::Result<(Option<LogId<M>>, StoredMembership<M>)> {
        let applied = self.read();
        Ok((applied.last_applied, applied.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> io::Result<()>
    where
        Strm: Stream<Item = io::Result<EntryResponder<Config<M>>>> + Unpin + OptionalSend,
    {
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            let response = self.apply_entry(entry)?;
            if let Some(responder) = responder {
                responder.send(response);
            }
        }
        Ok(())
    }

    async fn try_create_snapshot_builder(&mut self, _force: bool) -> Option<Self::SnapshotBuilder> {
        Some(self.clone())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<M>,
        snapshot: Vec<u8>,
    ) -> io::Result<()> {
        let machine = M::restore(&snapshot).map_err(|error| {
            let message =
                format!("group {}: snapshot {meta} does not restore: {error}", self.group_id);
            io::Error::new(io::ErrorKind::InvalidData, message)
        })?;
        // On restart openraft installs the snapshot it just read from the store: no rewrite.
        let stored = self.store.read_snapshot(self.group_id)?;
        let already_stored = match &stored {
            None => false,
            Some(stored) => &decode::<SnapshotMeta<M>>(&stored.meta, "snapshot meta")? == meta,
        };
        if !already_stored {
            self.persist_snapshot(meta, snapshot).await?;
        }
        let mut applied = self.write();
        applied.machine = machine;
        applied.last_applied = meta.last_log_id;
        applied.membership = meta.last_membership.clone();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> io::Result<Option<Snapshot<M>>> {
        match self.store.read_snapshot(self.group_id)? {
            None => Ok(None),
            Some(stored) => {
                let meta = decode::<SnapshotMeta<M>>(&stored.meta, "snapshot meta")?;
                Ok(Some(Snapshot::<M> { meta, snapshot: stored.data }))
            }
        }
    }
}

/// Read access to the applied state. A panic inside a machine's `apply` poisons the lock; the
/// state is then whatever the machine left, which reads still see rather than panic again.
pub(crate) fn read_applied<M: StateMachine>(
    applied: &RwLock<Applied<M>>,
) -> RwLockReadGuard<'_, Applied<M>> {
    applied.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}
