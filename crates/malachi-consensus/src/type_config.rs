//! The openraft type configuration of a group replicating a machine `M`.
//!
//! Every openraft type the crate names goes through the aliases at the bottom of this file, so an
//! openraft upgrade that renames or reshapes them is fixed here first. None of these types leave
//! the crate: callers see commands, responses, node ids and indexes only.

use std::cmp::Ordering;
use std::fmt;
use std::marker::PhantomData;

use openraft::RaftTypeConfig;
use serde::Deserialize;
use serde::Serialize;

use crate::StateMachine;

/// The `RaftTypeConfig` of a group of machine `M`: node ids are `u64` broker ids, nodes carry no
/// address (the transport resolves a broker id itself), terms are `u64`.
///
/// The `PhantomData<fn() -> M>` keeps the type `Send + Sync + Copy` whatever `M` is; the trait
/// bounds openraft wants (`Ord`, `Default`, ...) are written out by hand because a derive would
/// demand them of `M` too.
pub(crate) struct GroupTypeConfig<M>(PhantomData<fn() -> M>);

/// A command as openraft's log payload. openraft wants `Display` on its payload; machines only
/// promise `Debug`, so this wrapper prints the `Debug` form. Serialized transparently: the log
/// stores exactly the command's serde_json.
#[derive(Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct Command<T>(pub(crate) T);

impl<T: fmt::Debug> fmt::Debug for Command<T> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(formatter)
    }
}

impl<T: fmt::Debug> fmt::Display for Command<T> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{:?}", self.0)
    }
}

impl<M: StateMachine> RaftTypeConfig for GroupTypeConfig<M> {
    type D = Command<M::Command>;
    /// `None` answers the entries that carry no command (blank and membership entries), which
    /// openraft also routes through the responder.
    type R = Option<M::Response>;
    type NodeId = u64;
    type Node = openraft::EmptyNode;
    type Term = u64;
    type LeaderId = openraft::impls::leader_id_adv::LeaderId<u64, u64>;
    type Vote = openraft::impls::Vote<Self::LeaderId>;
    type Payload = openraft::EntryPayload<Self::D, u64, Self::Node>;
    type Entry =
        openraft::Entry<<Self::LeaderId as openraft::vote::RaftLeaderId>::Committed, Self::Payload>;
    type AsyncRuntime = crate::runtime::MalachiRuntime;
    type Responder<T>
        = openraft::impls::ProgressResponder<Self, T>
    where
        T: openraft::OptionalSend + 'static;
    type Batch<T>
        = openraft::impls::InlineBatch<T>
    where
        T: openraft::OptionalSend + 'static;
    type ErrorSource = openraft::impls::BoxedErrorSource;
}

// The bounds RaftTypeConfig requires of the marker type itself. The type has one value, so all
// instances are equal.
impl<M> Clone for GroupTypeConfig<M> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<M> Copy for GroupTypeConfig<M> {}
impl<M> Default for GroupTypeConfig<M> {
    fn default() -> Self {
        Self(PhantomData)
    }
}
impl<M> fmt::Debug for GroupTypeConfig<M> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("GroupTypeConfig")
    }
}
impl<M> PartialEq for GroupTypeConfig<M> {
    fn eq(&self, _other: &Self) -> bool {
        true
    }
}
impl<M> Eq for GroupTypeConfig<M> {}
impl<M> PartialOrd for GroupTypeConfig<M> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<M> Ord for GroupTypeConfig<M> {
    fn cmp(&self, _other: &Self) -> Ordering {
        Ordering::Equal
    }
}

/// Short names for the openraft types of a group of machine `M`.
pub(crate) type Config<M> = GroupTypeConfig<M>;
pub(crate) type LogId<M> = openraft::type_config::alias::LogIdOf<Config<M>>;
pub(crate) type Entry<M> = <Config<M> as RaftTypeConfig>::Entry;
pub(crate) type Vote<M> = <Config<M> as RaftTypeConfig>::Vote;
pub(crate) type StoredMembership<M> = openraft::type_config::alias::StoredMembershipOf<Config<M>>;
pub(crate) type SnapshotMeta<M> = openraft::type_config::alias::SnapshotMetaOf<Config<M>>;
pub(crate) type Snapshot<M> = openraft::type_config::alias::SnapshotOf<Config<M>, Vec<u8>>;
pub(crate) type Raft<M> = openraft::Raft<Config<M>, crate::group_machine::GroupMachine<M>>;
