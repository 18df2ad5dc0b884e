//! The broker as a member of a cluster: it answers its peers' calls (Raft messages of its
//! groups, welcome, join, add-member), admits joining brokers, keeps the transport's address
//! book in step with the registered brokers, and reports the cluster to operators.
//!
//! Joining (docs/cluster.md): the new broker asks a seed for a *welcome* (cluster id, cursor
//! secret, the brokers and their addresses), records the cluster id and secret in its data
//! directory, opens its groups waiting for a leader, then asks to *join*. The admitting side
//! registers the broker in the administrative machine, then has each group's leader add it:
//! as a learner that catches up first, then as a voter while the group has fewer voters than it
//! wants (5 for the administrative group, 3 for the vnode), as a learner beyond, so that every
//! broker holds the metadata to read locally.

use std::time::Duration;

use malachi_consensus::{ConsensusError, MessageKind, RaftGroup, StateMachine};
use malachi_meta::{AdminCommand, BrokerRecord};
use malachi_transport::Transport;
use serde::{Deserialize, Serialize};

use crate::node::{ADMIN_GROUP_ID, Core};
use crate::peer::{AddMember, PeerCall};
use crate::vnodes::ROOT_GROUP_ID;

/// Voters the administrative group keeps when it has the brokers: it survives two failures.
pub const ADMIN_VOTERS_MAX: usize = 5;
/// How long a join waits for the groups' leaders to catch the new broker up.
pub const JOIN_WAIT_MS: u64 = 30_000;
/// Pause between rounds of join attempts over the seeds.
const JOIN_RETRY_MS: u64 = 500;
/// How long one call to a peer may take (adding a member waits for it to catch up).
const CALL_TIMEOUT_MS: u64 = JOIN_WAIT_MS;
/// How long a seed may take to answer a welcome: it reads local state, so a seed that takes
/// longer is paused or cut off, and a restarting broker should not wait on it (its callers
/// retry, or go on without).
const WELCOME_TIMEOUT_MS: u64 = 3_000;

/// What a seed tells a broker about to join.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Welcome {
    pub cluster_id: String,
    /// The cluster's cursor secret: a cursor one broker issued must verify on every other.
    pub cursor_secret: [u8; 32],
    pub brokers: Vec<BrokerRecord>,
    /// The ring's size, so a joining broker opens every vnode before the leaders add it.
    /// Absent from the welcome of a broker from before the ring: one vnode.
    #[serde(default)]
    pub vnodes: Option<u32>,
}

impl Core {
    /// How many replicas a segment should have: the replication factor, or fewer in a cluster
    /// of fewer brokers that take new work.
    pub fn replicas_wanted(&self) -> usize {
        let view = self.cluster_view();
        let members = view
            .brokers
            .iter()
            .filter(|broker| self.broker().seats.takes_new_work(broker.record.node_id))
            .count();
        self.config.cluster.replication_factor.min(members.max(1))
    }

    /// The inter-node transport, for a broker of a cluster.
    pub fn transport(&self) -> Option<&Transport> {
        self.cluster.as_ref().map(|(transport, _)| transport)
    }

    /// What this broker registers of itself.
    pub fn own_record(&self) -> BrokerRecord {
        let cluster = &self.config.cluster;
        BrokerRecord {
            node_id: self.node_id,
            cluster_address: cluster.advertised_cluster_address(),
            client_address: crate::config::join_host_port(
                &cluster.advertise_host,
                self.config.tcp_port,
            ),
            attributes: self.config.attributes.clone(),
            gossip_address: cluster.advertised_gossip_address(),
        }
    }

    /// The brokers the administrative machine knows, in node id order.
    pub fn brokers(&self) -> Vec<BrokerRecord> {
        self.admin.read(|admin| admin.0.brokers().cloned().collect())
    }

    /// Points the transport at every registered broker's inter-node address.
    pub fn sync_addresses(&self) {
        let Some(transport) = self.transport() else { return };
        for broker in self.brokers() {
            if broker.node_id != self.node_id {
                transport.set_address(broker.node_id, &broker.cluster_address);
            }
        }
    }

    /// Records this broker (and where it is reached) in the administrative machine, when what
    /// is recorded differs: at every start of a broker of a cluster, so a broker restarted on
    /// another address is found there.
    pub async fn register_self(&self) -> Result<(), ConsensusError> {
        let record = self.own_record();
        if self.admin.read(|admin| admin.0.broker(self.node_id) == Some(&record)) {
            return Ok(());
        }
        match self.admin.propose(AdminCommand::RegisterBroker { broker: record }).await? {
            Ok(_) => Ok(()),
            Err(error) => Err(ConsensusError::Internal(error.to_string())),
        }
    }

    /// Joins the cluster through the first of `seeds` that admits this broker, then waits
    /// until both groups have caught it up. Retries every seed until `JOIN_WAIT_MS` ran out.
    pub async fn join(&self, seeds: &[String]) -> Result<(), String> {
        let transport = self.transport().ok_or("this broker has no cluster transport")?;
        let request = PeerCall::Join(self.own_record()).encode();
        let timeout = Duration::from_millis(CALL_TIMEOUT_MS);
        let mut last_error = String::from("no seed configured");
        for _ in 0..JOIN_WAIT_MS / JOIN_RETRY_MS {
            for seed in seeds {
                match transport.call_address(seed, request.clone(), timeout).await {
                    Ok(_) => {
                        self.wait_admitted().await?;
                        self.sync_addresses();
                        return Ok(());
                    }
                    Err(error) => {
                        tracing::warn!(%seed, %error, "joining through this seed failed");
                        last_error = format!("{seed}: {error}");
                    }
                }
            }
            // A refusal names a cause retrying cannot fix (another cluster, a taken id).
            if last_error.contains("refused by") || last_error.contains("is taken") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(JOIN_RETRY_MS)).await;
        }
        Err(format!("could not join the cluster: {last_error}"))
    }

    /// Waits until this broker has applied its own registration and knows every group's
    /// leader: from then on its reads include everything committed before it joined.
    async fn wait_admitted(&self) -> Result<(), String> {
        const POLL_MS: u64 = 20;
        for _ in 0..JOIN_WAIT_MS / POLL_MS {
            let registered = self.admin.read(|admin| admin.0.broker(self.node_id).is_some());
            let led = self.admin.leader().0.is_some()
                && self.root.leader().0.is_some()
                && self.ring.iter().all(|vnode| vnode.group.leader().0.is_some());
            if registered && led {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
        }
        Err(format!("admitted, but not caught up within {JOIN_WAIT_MS} ms"))
    }

    /// A Raft message from `sender`: of a member of the group (or a registered broker, whose
    /// membership this broker may not have applied yet), speaking for itself alone.
    pub(crate) async fn answer_raft(
        &self,
        sender: u64,
        group_id: u64,
        kind: MessageKind,
        payload: &[u8],
    ) -> Result<Vec<u8>, String> {
        let answer = match group_id {
            ADMIN_GROUP_ID => {
                admits(self, &self.admin, sender)?;
                self.admin.handle_message(kind, payload, sender).await
            }
            ROOT_GROUP_ID => {
                admits(self, &self.root, sender)?;
                self.root.handle_message(kind, payload, sender).await
            }
            group_id => match self.ring.by_group_id(group_id) {
                Some(vnode) => {
                    admits(self, &vnode.group, sender)?;
                    vnode.group.handle_message(kind, payload, sender).await
                }
                None => return Err(format!("group {group_id} is not on this broker")),
            },
        };
        answer.map_err(|error| error.to_string())
    }

    /// Answers a join: `sender` registers itself, never another broker.
    pub(crate) async fn answer_join(
        &self,
        sender: u64,
        record: BrokerRecord,
    ) -> Result<Vec<u8>, String> {
        if record.node_id != sender {
            return Err(format!(
                "node {sender} asked to register node {}: a broker registers itself",
                record.node_id
            ));
        }
        self.admit(record).await?;
        Ok(crate::peer::json(&self.brokers()))
    }

    pub(crate) fn welcome(&self) -> Welcome {
        Welcome {
            cluster_id: self.cluster.as_ref().map(|(_, id)| id.clone()).unwrap_or_default(),
            cursor_secret: self.cursors.secret(),
            brokers: self.brokers(),
            vnodes: Some(self.ring.count()),
        }
    }

    /// Registers `record` and has both groups' leaders add it. A node id already registered
    /// at another inter-node address is refused: two brokers with one id would corrupt Raft.
    async fn admit(&self, record: BrokerRecord) -> Result<(), String> {
        let taken = self.admin.read(|admin| {
            admin
                .0
                .broker(record.node_id)
                .filter(|known| known.cluster_address != record.cluster_address)
                .cloned()
        });
        if let Some(known) = taken {
            return Err(format!(
                "node id {} is taken by the broker at {}; start the new broker with another \
                 --node-id (MALACHI_NODE_ID)",
                record.node_id, known.cluster_address
            ));
        }
        let (node_id, cluster_address) = (record.node_id, record.cluster_address.clone());
        let registered = self.admin.propose(AdminCommand::RegisterBroker { broker: record });
        registered.await.map_err(|error| error.to_string())?.map_err(|error| error.to_string())?;
        for group_id in self.group_ids() {
            let add = AddMember { group_id, node_id, cluster_address: cluster_address.clone() };
            self.add_to_group(add).await?;
        }
        tracing::info!(node_id, %cluster_address, "broker joined the cluster");
        Ok(())
    }

    /// Adds a broker to a group if this broker leads it, or asks the leader to.
    pub(crate) async fn add_to_group(&self, add: AddMember) -> Result<(), String> {
        let vnode_voters = self.config.cluster.vnode_voters;
        match add.group_id {
            ADMIN_GROUP_ID => self.add_member_to(&self.admin, ADMIN_VOTERS_MAX, add).await,
            ROOT_GROUP_ID => self.add_member_to(&self.root, vnode_voters, add).await,
            group_id => match self.ring.by_group_id(group_id) {
                Some(vnode) => self.add_member_to(&vnode.group, vnode_voters, add).await,
                None => Err(format!("group {group_id} is not on this broker")),
            },
        }
    }

    async fn add_member_to<M: StateMachine>(
        &self,
        group: &RaftGroup<M>,
        voters_wanted: usize,
        add: AddMember,
    ) -> Result<(), String> {
        let transport = self.transport().ok_or("this broker has no cluster transport")?;
        let leader = group.leader().0;
        if leader == Some(self.node_id) {
            transport.set_address(add.node_id, &add.cluster_address);
            let as_voter = group.voters().len() < voters_wanted;
            return group
                .add_member(add.node_id, as_voter)
                .await
                .map_err(|error| error.to_string());
        }
        let Some(leader) = leader else {
            return Err(format!("group {} has no leader now; retry", add.group_id));
        };
        let request = PeerCall::AddMember(add).encode();
        transport
            .call(leader, request, Duration::from_millis(CALL_TIMEOUT_MS))
            .await
            .map(drop)
            .map_err(|error| error.to_string())
    }

    /// Whether every group on this broker knows its voters: a broker that does not is a new
    /// one, or one whose join stopped part-way, and joins (again) through its seeds.
    pub fn joined(&self) -> bool {
        let knows = |voters: std::collections::BTreeSet<u64>| !voters.is_empty();
        knows(self.admin.voters())
            && knows(self.root.voters())
            && self.ring.iter().all(|vnode| knows(vnode.group.voters()))
    }

    /// Every Raft group on this broker: the administrative group, the root, the vnodes.
    pub fn group_ids(&self) -> Vec<u64> {
        [ADMIN_GROUP_ID, ROOT_GROUP_ID]
            .into_iter()
            .chain(self.ring.iter().map(|vnode| vnode.group_id()))
            .collect()
    }

    /// The cluster as this broker sees it, for `malachi cluster status` and `cluster_state`.
    pub fn cluster_view(&self) -> ClusterView {
        let group = |group_id, (leader, term): (Option<u64>, u64), voters, learners| GroupView {
            group_id,
            leader,
            term,
            voters,
            learners,
        };
        // A broker alone has registered nobody: it reports itself.
        let mut records = self.brokers();
        if records.is_empty() {
            records.push(self.own_record());
        }
        let brokers = records
            .into_iter()
            .map(|record| BrokerView { status: self.member_status(record.node_id), record })
            .collect();
        ClusterView {
            node_id: self.node_id,
            cluster_id: self.cluster.as_ref().map(|(_, id)| id.clone()),
            brokers,
            groups: [
                group(
                    ADMIN_GROUP_ID,
                    self.admin.leader(),
                    self.admin.voters(),
                    self.admin.learners(),
                ),
                group(ROOT_GROUP_ID, self.root.leader(), self.root.voters(), self.root.learners()),
            ]
            .into_iter()
            .chain(self.ring.iter().map(|vnode| {
                let raft = &vnode.group;
                group(vnode.group_id(), raft.leader(), raft.voters(), raft.learners())
            }))
            .collect(),
        }
    }
}

/// Logs each change of a group's leader this broker sees, so operators (and the cluster tests)
/// can tell from the logs who led what, when.
#[derive(Debug, Default)]
pub struct LeaderLog {
    seen: std::collections::BTreeMap<u64, (Option<u64>, u64)>,
}

impl LeaderLog {
    pub fn note(&mut self, view: &ClusterView) {
        for group in &view.groups {
            let now = (group.leader, group.term);
            if self.seen.insert(group.group_id, now) != Some(now) {
                tracing::info!(
                    group_id = group.group_id,
                    leader = ?group.leader,
                    term = group.term,
                    leads = group.leader == Some(view.node_id),
                    "group leader"
                );
            }
        }
    }
}

/// The cluster as one broker sees it.
#[derive(Clone, Debug)]
pub struct ClusterView {
    pub node_id: u64,
    pub cluster_id: Option<String>,
    /// Every registered broker (this one alone: itself), in node id order.
    pub brokers: Vec<BrokerView>,
    pub groups: Vec<GroupView>,
}

/// A registered broker and its membership status as this broker sees it.
#[derive(Clone, Debug)]
pub struct BrokerView {
    pub record: BrokerRecord,
    pub status: malachi_cluster::PeerStatus,
}

/// One Raft group: who leads it in which term, and its members.
#[derive(Clone, Debug)]
pub struct GroupView {
    pub group_id: u64,
    pub leader: Option<u64>,
    pub term: u64,
    pub voters: std::collections::BTreeSet<u64>,
    pub learners: std::collections::BTreeSet<u64>,
}

/// Whether `sender` may speak in `group`: a voter or learner of it, or a registered broker (a
/// group this broker has not caught up on may have added members it does not know yet; one
/// with no membership yet is this broker's own, joining).
fn admits<M: StateMachine>(broker: &Core, group: &RaftGroup<M>, sender: u64) -> Result<(), String> {
    if group.may_hear_from(sender) || broker.admin.read(|admin| admin.0.broker(sender).is_some()) {
        return Ok(());
    }
    Err(format!("node {sender} is neither a member of this group nor a registered broker"))
}

/// Asks the broker at `seed` (an inter-node address) for the cluster's welcome.
pub async fn fetch_welcome(transport: &Transport, seed: &str) -> Result<Welcome, String> {
    let request = PeerCall::Welcome.encode();
    let (_, answer) = transport
        .call_address(seed, request, Duration::from_millis(WELCOME_TIMEOUT_MS))
        .await
        .map_err(|error| format!("{seed}: {error}"))?;
    decode(&answer)
}

fn decode<T: serde::de::DeserializeOwned>(payload: &[u8]) -> Result<T, String> {
    serde_json::from_slice(payload).map_err(|error| format!("malformed cluster call: {error}"))
}
