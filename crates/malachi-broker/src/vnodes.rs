//! The ring of vnodes on this broker: one Raft group of metadata per arc of the topic-name hash
//! ring, each with the coordinator that acts while this broker leads it, and the root group
//! that holds the ring itself (`malachi_meta::RingState`).
//!
//! The ring is fixed when the cluster is created (`MALACHI_LOG_VNODES`), so a topic's vnode is
//! a pure function of its name, and a topic or segment id names the vnode that handed it out
//! (`malachi_meta::ring`). Every broker holds every vnode (as a voter, or a learner that reads
//! locally), so the lookups here never leave the broker; what a vnode's leader must do is
//! forwarded by its group (`RaftGroup::propose`) or by the coordinator's calls.
//!
//! Every read and write of topic metadata goes through the helpers here: by name, by id, or
//! over every vnode. An id no vnode of this ring handed out reads as an empty vnode (it names
//! nothing here), never as another vnode's topic.

use std::sync::{LazyLock, Mutex};

use malachi_consensus::{FirstBoot, GroupConfig, GroupStore, RaftGroup};
use malachi_meta::{
    MetaCommand, MetaResponse, MetaState, RingCommand, VnodeArc, vnode_of_id, vnode_of_name,
};

use crate::coordinator::Coordinator;
use crate::error::LogError;
use crate::machines::{MetaMachine, RootMachine};
use crate::node::{BootError, Core};
use crate::topics::map_meta_error;

/// Raft group ids: the administrative group is 0, vnode `v` is group `v` (1 to
/// `malachi_meta::ring::VNODES_MAX`), and the root group sits above every vnode.
pub const ROOT_GROUP_ID: u64 = 1 << 32;

/// How long a broker catching up after its start waits before it asks again the vnodes whose
/// read barrier failed (no leader yet, a leader that did not answer).
const CATCH_UP_RETRY_MS: u64 = 100;

/// One vnode on this broker.
pub struct Vnode {
    pub arc: VnodeArc,
    pub group: RaftGroup<MetaMachine>,
    /// Decides only while this broker leads the vnode.
    pub(crate) coordinator: Mutex<Coordinator>,
    /// Serializes the head moves (roll, split, merge), deletes and expiries of this vnode's
    /// topics on this broker, so two never race for one write head. Produce and fetch never
    /// take it.
    pub(crate) reshape_lock: tokio::sync::Mutex<()>,
    /// The group's (leader, term) when this broker last completed a read barrier on it: its
    /// copy of the metadata had then caught up with everything committed. Unset at boot.
    caught_up_under: Mutex<Option<(Option<u64>, u64)>>,
}

impl Vnode {
    /// Whether this broker's copy of the vnode's metadata is known to have caught up under the
    /// group's current leadership: a read barrier completed since the leader or term last
    /// changed here. Not so after a restart (the copy is as old as the broker's downtime) nor
    /// after an election (this broker may have been cut off): names it resolves then may be
    /// older incarnations of re-created topics, whose copies it holds may have missed the
    /// delete's seal while it was away, so nothing it holds would show that it is behind.
    pub(crate) fn caught_up(&self) -> bool {
        let now = self.group.leader();
        now.0.is_some() && *self.lock_caught_up() == Some(now)
    }

    /// Whether this broker's copy has caught up with the vnode's leader at least once since it
    /// started (a read barrier completed under any leadership): until then it may be as old as
    /// the broker's downtime.
    pub(crate) fn caught_up_since_start(&self) -> bool {
        self.lock_caught_up().is_some()
    }

    /// Takes a read barrier and records the leadership it caught up under.
    pub(crate) async fn catch_up(&self) -> Result<(), malachi_consensus::ConsensusError> {
        let under = self.group.leader();
        self.group.read_barrier().await?;
        *self.lock_caught_up() = Some(under);
        Ok(())
    }

    fn lock_caught_up(&self) -> std::sync::MutexGuard<'_, Option<(Option<u64>, u64)>> {
        self.caught_up_under.lock().expect("caught-up lock poisoned")
    }

    pub fn vnode_id(&self) -> u32 {
        self.arc.vnode_id
    }

    /// The vnode's Raft group id.
    pub fn group_id(&self) -> u64 {
        u64::from(self.arc.vnode_id)
    }
}

/// Every vnode of the ring, in vnode order.
pub struct Ring {
    vnodes: Vec<Vnode>,
}

impl Ring {
    pub fn count(&self) -> u32 {
        self.vnodes.len() as u32
    }

    pub fn iter(&self) -> impl Iterator<Item = &Vnode> {
        self.vnodes.iter()
    }

    /// The vnode holding topic `name`.
    pub fn named(&self, name: &str) -> &Vnode {
        &self.vnodes[vnode_of_name(name, self.count()) as usize - 1]
    }

    /// The vnode that handed out topic or segment `id`, if it is one of this ring's.
    pub fn of_id(&self, id: u64) -> Option<&Vnode> {
        self.by_vnode_id(vnode_of_id(id))
    }

    pub fn by_vnode_id(&self, vnode_id: u32) -> Option<&Vnode> {
        self.vnodes.get((vnode_id as usize).checked_sub(1)?)
    }

    /// The vnode whose Raft group is `group_id`.
    pub fn by_group_id(&self, group_id: u64) -> Option<&Vnode> {
        self.by_vnode_id(u32::try_from(group_id).ok()?)
    }

    pub(crate) async fn shutdown(&self) {
        for vnode in &self.vnodes {
            let _ = vnode.group.shutdown().await;
        }
    }
}

/// A vnode with no topics: what an id outside the ring reads.
static NO_VNODE: LazyLock<MetaState> = LazyLock::new(MetaState::default);

impl Core {
    /// Takes a read barrier on every vnode this broker has not caught up on since it started,
    /// until it has on all of them. A broker back from a restart is ready (`/ready`), and
    /// withdraws its drain notice, only then: a rolling restart stops the next broker only once
    /// this one knows every topic whose new heads may be placed on it, and no leadership is
    /// handed to a copy still catching up. Each barrier is bounded (the groups' propose wait).
    pub async fn catch_up_after_start(&self) {
        loop {
            let mut behind = 0;
            for vnode in self.ring.iter().filter(|vnode| !vnode.caught_up_since_start()) {
                if let Err(error) = vnode.catch_up().await {
                    tracing::debug!(vnode = vnode.vnode_id(), %error, "not caught up yet");
                    behind += 1;
                }
            }
            if behind == 0 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(CATCH_UP_RETRY_MS)).await;
        }
    }

    /// The ring of vnodes.
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// Reads the metadata of the vnode holding topic `name`.
    pub fn read_meta_named<R>(&self, name: &str, read: impl FnOnce(&MetaState) -> R) -> R {
        self.ring.named(name).group.read(|meta| read(&meta.0))
    }

    /// Topic `name` as this broker's metadata has it now.
    pub fn topic_named(&self, name: &str) -> Option<malachi_meta::Topic> {
        self.read_meta_named(name, |meta| meta.topic_by_name(name).cloned())
    }

    /// Reads the metadata of the vnode that handed out topic or segment `id`.
    pub fn read_meta<R>(&self, id: u64, read: impl FnOnce(&MetaState) -> R) -> R {
        match self.ring.of_id(id) {
            Some(vnode) => vnode.group.read(|meta| read(&meta.0)),
            None => read(&NO_VNODE),
        }
    }

    /// Reads every vnode's metadata, concatenating the answers in vnode order.
    pub fn read_every_meta<T>(&self, read: impl Fn(&MetaState) -> Vec<T>) -> Vec<T> {
        self.ring.iter().flat_map(|vnode| vnode.group.read(|meta| read(&meta.0))).collect()
    }

    /// Proposes `command` to the vnode holding topic `name` (forwarded to its leader).
    pub(crate) async fn propose_meta_named(
        &self,
        name: &str,
        command: MetaCommand,
    ) -> Result<MetaResponse, LogError> {
        propose(self.ring.named(name), command).await
    }

    /// Proposes `command` to the vnode that handed out topic or segment `id`.
    pub(crate) async fn propose_meta(
        &self,
        id: u64,
        command: MetaCommand,
    ) -> Result<MetaResponse, LogError> {
        let vnode = self.ring.of_id(id).ok_or(LogError::NoSuchTopic)?;
        propose(vnode, command).await
    }

    /// The vnode that handed out `id`, or `no_such_topic`.
    pub(crate) fn vnode_of(&self, id: u64) -> Result<&Vnode, LogError> {
        self.ring.of_id(id).ok_or(LogError::NoSuchTopic)
    }

    /// The sum of every vnode's metadata version: it grows with every accepted command.
    pub fn metadata_version(&self) -> u64 {
        self.ring.iter().map(|vnode| vnode.group.read(|meta| meta.0.version())).sum()
    }

    /// Claims each vnode's arc where it is unclaimed and this broker can propose it (a vnode's
    /// first command; it fixes the block its ids come from). Idempotent.
    pub(crate) async fn claim_arcs(&self) -> Result<(), LogError> {
        for vnode in self.ring.iter() {
            if vnode.group.read(|meta| meta.0.arc().is_none()) {
                propose(vnode, MetaCommand::ClaimArc { arc: vnode.arc }).await?;
            }
        }
        Ok(())
    }
}

async fn propose(vnode: &Vnode, command: MetaCommand) -> Result<MetaResponse, LogError> {
    vnode.group.propose(command).await?.map_err(map_meta_error)
}

/// What opening the ring needs.
pub(crate) struct RingOpen<'a> {
    pub store: &'a GroupStore,
    pub node_id: u64,
    pub raft: &'a GroupConfig,
    pub transport: std::sync::Arc<dyn malachi_consensus::GroupTransport>,
    pub first_boot: FirstBoot,
    /// The ring's size as a seed told a joining broker (its welcome).
    pub vnodes_hint: Option<u32>,
    /// `MALACHI_LOG_VNODES`: the size of a ring this broker creates.
    pub vnodes_configured: u32,
    pub coordinator: &'a (dyn Fn() -> Coordinator + Send + Sync),
}

/// Opens the root group, learns (or, creating the cluster, defines) the ring, and opens its
/// vnodes.
pub(crate) async fn open_ring(
    open: &RingOpen<'_>,
) -> Result<(RaftGroup<RootMachine>, Ring), BootError> {
    let root = RaftGroup::<RootMachine>::open_with_transport(
        open.store,
        ROOT_GROUP_ID,
        open.node_id,
        open.raft.clone(),
        std::sync::Arc::clone(&open.transport),
        open.first_boot,
    )
    .await?;
    let count = match ring_size(&root, open).await {
        Ok(count) if count != open.vnodes_configured => {
            tracing::warn!(
                vnodes = count,
                configured = open.vnodes_configured,
                "the ring's size was fixed when this cluster (or broker) was created; \
                 MALACHI_LOG_VNODES applies only to a new one"
            );
            count
        }
        Ok(count) => count,
        Err(error) => {
            let _ = root.shutdown().await;
            return Err(error);
        }
    };
    let mut vnodes = Vec::new();
    for vnode_id in 1..=count {
        let group = RaftGroup::<MetaMachine>::open_with_transport(
            open.store,
            u64::from(vnode_id),
            open.node_id,
            open.raft.clone(),
            std::sync::Arc::clone(&open.transport),
            open.first_boot,
        )
        .await;
        let group = match group {
            Ok(group) => group,
            Err(error) => {
                Ring { vnodes }.shutdown().await;
                let _ = root.shutdown().await;
                return Err(error.into());
            }
        };
        vnodes.push(Vnode {
            arc: VnodeArc::of(vnode_id, count),
            group,
            coordinator: Mutex::new((open.coordinator)()),
            reshape_lock: tokio::sync::Mutex::new(()),
            caught_up_under: Mutex::new(None),
        });
    }
    Ok((root, Ring { vnodes }))
}

/// The ring's size: what the root group holds; else what a seed told a joining broker; else,
/// for the broker creating the cluster, the configured size (1 for a data directory from before
/// the ring, whose single vnode holds every topic), defined in the root group before any vnode
/// opens, so a crash cannot leave vnodes of an undefined ring.
async fn ring_size(root: &RaftGroup<RootMachine>, open: &RingOpen<'_>) -> Result<u32, BootError> {
    let defined = || root.read(|ring| ring.0.vnodes());
    let sole_voter = root.voters() == std::collections::BTreeSet::from([open.node_id]);
    if defined().is_none() && open.first_boot == FirstBoot::Initialize && sole_voter {
        let before_the_ring = open.store.group_ids()?.contains(&1);
        let vnodes = if before_the_ring { 1 } else { open.vnodes_configured };
        match root.propose(RingCommand::Define { vnodes }).await? {
            Ok(_) => return Ok(vnodes),
            Err(error) => return Err(BootError::Ring(error.to_string())),
        }
    }
    // The root group applied what it holds before it opened: nothing more arrives until this
    // broker answers its peers, which it does only once started.
    if let Some(count) = defined().or(open.vnodes_hint) {
        return Ok(count);
    }
    Err(BootError::Ring(
        "the ring of vnodes is not known here yet (this broker never finished joining), and no \
         seed told it; start again once a seed (MALACHI_LOG_NODES) answers"
            .into(),
    ))
}
