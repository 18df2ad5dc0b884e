//! [`RaftGroup`]: one openraft group replicating a [`StateMachine`], and its [`GroupConfig`].
//!
//! The group owns the openraft handle; everything openraft-shaped (errors, metrics, requests)
//! is translated here into [`ConsensusError`] and plain ids and indexes.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::RwLock;
use std::sync::Weak;
use std::time::Duration;

use openraft::Instant as _;
use openraft::ServerState;
use openraft::SnapshotPolicy;
use openraft::error::ClientWriteError;
use openraft::error::Fatal;
use openraft::error::InitializeError;
use openraft::error::LinearizableReadError;
use openraft::error::RaftError;
use openraft::metrics::WaitError;
use openraft::type_config::TypeConfigExt;
use openraft::type_config::alias::InstantOf;
use serde::Deserialize;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::StateMachine;
use crate::error::ConsensusError;
use crate::error::StoreError;
use crate::group_machine::Applied;
use crate::group_machine::GroupMachine;
use crate::group_machine::read_applied;
use crate::log_store::GroupLog;
use crate::network::GroupNetwork;
use crate::network::GroupTransport;
use crate::network::MessageKind;
use crate::network::NoPeers;
use crate::network::TransportError;
use crate::network::decode_snapshot;
use crate::store::GroupStore;
use crate::type_config::Command;
use crate::type_config::Config;
use crate::type_config::Raft;

/// Tunables of one group. Times are openraft's, in milliseconds of its runtime's clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupConfig {
    /// Build a snapshot once this many entries were committed since the last one, then purge
    /// the log up to it: the stored log of a group stays near this many entries.
    pub snapshot_every_entries: u64,
    /// How often a leader heartbeats its followers.
    pub heartbeat_interval_ms: u64,
    /// A follower that heard no leader for a random time in `[min, max)` starts an election.
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// How long [`RaftGroup::open`] waits for this node to lead and to have applied the log.
    pub open_wait_ms: u64,
    /// How long [`RaftGroup::propose`] keeps looking for a leader (elections, forwarding
    /// refused by a node that just lost leadership) before it answers `NotLeader`.
    pub propose_wait_ms: u64,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig {
            snapshot_every_entries: 1024,
            heartbeat_interval_ms: 50,
            election_timeout_min_ms: 150,
            election_timeout_max_ms: 300,
            open_wait_ms: 10_000,
            propose_wait_ms: 5_000,
        }
    }
}

impl GroupConfig {
    fn to_openraft(&self, group_id: u64) -> Result<openraft::Config, ConsensusError> {
        if self.snapshot_every_entries == 0 {
            return Err(ConsensusError::Config("snapshot_every_entries must be > 0".to_string()));
        }
        let config = openraft::Config {
            cluster_name: format!("malachi-group-{group_id}"),
            heartbeat_interval: self.heartbeat_interval_ms,
            election_timeout_min: self.election_timeout_min_ms,
            election_timeout_max: self.election_timeout_max_ms,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(self.snapshot_every_entries),
            // openraft keeps 1000 snapshotted entries by default; we purge all of them, so the
            // stored log is bounded by `snapshot_every_entries` plus what is in flight.
            max_in_snapshot_log_to_keep: 0,
            purge_batch_size: 1,
            // A node that has not heard from a leader (a broker back from a restart, before the
            // leaders' heartbeats reach it) first asks whether it could win, and raises its
            // term only then. Without it every restart set off elections in every group: the
            // restarted broker's higher terms unseated live leaders (a rolling restart's
            // longest stall, 724 ms, was that storm). Peers with a live leader refuse.
            enable_pre_vote: Some(true),
            ..openraft::Config::default()
        };
        config.validate().map_err(|error| ConsensusError::Config(error.to_string()))
    }
}

/// How often and how long [`RaftGroup::shutdown`] checks that openraft's detached tasks let go
/// of the group's storage objects.
const SHUTDOWN_POLL_MS: u64 = 2;
const SHUTDOWN_POLLS_MAX: u32 = 2500;

/// One Raft group on this node: proposals go in, responses of the applied machine come out.
pub struct RaftGroup<M: StateMachine> {
    group_id: u64,
    node_id: u64,
    raft: Raft<M>,
    /// The state openraft applies to, shared with the group's `GroupMachine`.
    applied: Arc<RwLock<Applied<M>>>,
    /// Alive while any clone of the group's `GroupLog` or `GroupMachine` is.
    liveness: Weak<()>,
    store: GroupStore,
    transport: Arc<dyn GroupTransport>,
    propose_wait_ms: u64,
    /// Membership changes one at a time: openraft refuses a change while another is
    /// uncommitted, and brokers joining together must not fail for it.
    membership_lock: tokio::sync::Mutex<()>,
    /// Set when the group begins to shut down: messages from peers are refused from then on,
    /// rather than handed to a Raft core that is stopping (openraft logs each such message as an
    /// error, which at every graceful stop read as trouble).
    closing: std::sync::atomic::AtomicBool,
}

/// How a group starts on this node when its store holds no membership yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FirstBoot {
    /// Become the group's only voter (a single broker, or the first broker of a cluster).
    Initialize,
    /// Wait to be added by the group's leader (a broker joining a cluster).
    AwaitLeader,
}

/// The leader's answer to a read barrier asked of it.
#[derive(Debug, Serialize, Deserialize)]
enum ReadIndex {
    At { log_index: u64 },
    NotLeader { leader_hint: Option<u64> },
}

/// A forwarded write's outcome, as the leader answers it.
#[derive(Serialize, Deserialize)]
enum Forwarded<R> {
    Applied { response: R, log_index: u64 },
    NotLeader { leader_hint: Option<u64> },
    OutcomeUnknown { leader_hint: Option<u64> },
    Failed { detail: String },
}

/// Sleeps between attempts to find a leader: the first few are short (a leader is usually
/// known within an election timeout), then they grow to this.
const PROPOSE_RETRY_MS_MAX: u64 = 200;

impl<M: StateMachine> RaftGroup<M> {
    /// Opens group `group_id` as node `node_id` with no peers (see [`NoPeers`]).
    ///
    /// First boot (no membership of the group stored): initializes the membership
    /// `{node_id}`. Restart: openraft recovers vote, log, committed log id and the last snapshot
    /// from the store and replays. Either way this returns once the node leads the group and
    /// has applied its whole log, or fails with [`ConsensusError::Timeout`] after
    /// `config.open_wait_ms`.
    pub async fn open(
        store: &GroupStore,
        group_id: u64,
        node_id: u64,
        config: GroupConfig,
    ) -> Result<RaftGroup<M>, ConsensusError> {
        let transport: Arc<dyn GroupTransport> = Arc::new(NoPeers);
        Self::open_with_transport(
            store,
            group_id,
            node_id,
            config,
            transport,
            FirstBoot::Initialize,
        )
        .await
    }

    /// [`RaftGroup::open`] with the transport that reaches this group's peers.
    ///
    /// A group whose only voter is this node returns once it leads with its log applied, as
    /// [`RaftGroup::open`] does. A group with other voters, or none yet (`AwaitLeader` on a
    /// first boot), returns as soon as openraft runs: its leader is elected, or adds this node,
    /// with the peers' help, and reads are local until then.
    pub async fn open_with_transport(
        store: &GroupStore,
        group_id: u64,
        node_id: u64,
        config: GroupConfig,
        transport: Arc<dyn GroupTransport>,
        first_boot: FirstBoot,
    ) -> Result<RaftGroup<M>, ConsensusError> {
        let raft_config = Arc::new(config.to_openraft(group_id)?);
        let liveness = Arc::new(());
        let weak_liveness = Arc::downgrade(&liveness);
        let machine = GroupMachine::<M>::new(store.clone(), group_id, Arc::clone(&liveness));
        let applied = machine.applied();
        let log = GroupLog::<M>::new(store.clone(), group_id, liveness);
        let network = GroupNetwork::<M>::new(group_id, node_id, Arc::clone(&transport));
        let raft = openraft::Raft::new(node_id, raft_config, network, log, machine)
            .await
            .map_err(|fatal| fatal_error(store, fatal))?;
        let group = RaftGroup {
            group_id,
            node_id,
            raft,
            applied,
            liveness: weak_liveness,
            store: store.clone(),
            transport,
            propose_wait_ms: config.propose_wait_ms,
            membership_lock: tokio::sync::Mutex::new(()),
            closing: std::sync::atomic::AtomicBool::new(false),
        };
        let started = group.start(config.open_wait_ms, first_boot).await;
        if let Err(error) = started {
            // Do not leave a half-open group running against the store.
            let _ = group.shutdown().await;
            return Err(error);
        }
        tracing::info!(group_id, node_id, applied = ?group.applied_index(), "group open");
        Ok(group)
    }

    /// Proposes `command`; returns the machine's response once the entry is committed (fsynced
    /// by a quorum of the group's voters) and applied on this node.
    ///
    /// On a node that does not lead the group the command is forwarded to the leader, and the
    /// answer waits until this node has applied the entry too, so a read here right after sees
    /// the write. While no leader is known (an election) it retries for up to
    /// `propose_wait_ms`, then answers `NotLeader`.
    pub async fn propose(&self, command: M::Command) -> Result<M::Response, ConsensusError> {
        let mut waited_ms = 0;
        let mut attempt = 0u32;
        loop {
            let error = match self.propose_here(command.clone()).await {
                Ok((response, _)) => return Ok(response),
                Err(ConsensusError::NotLeader { leader_hint: Some(leader) })
                    if leader != self.node_id =>
                {
                    match self.forward(leader, &command).await {
                        Ok((response, log_index)) => {
                            self.wait_applied(log_index).await?;
                            return Ok(response);
                        }
                        Err(error) => error,
                    }
                }
                Err(error) => error,
            };
            if !matches!(error, ConsensusError::NotLeader { .. })
                || waited_ms >= self.propose_wait_ms
            {
                return Err(error);
            }
            let pause_ms = (10u64 << attempt.min(5)).min(PROPOSE_RETRY_MS_MAX);
            attempt += 1;
            waited_ms += pause_ms;
            Config::<M>::sleep(Duration::from_millis(pause_ms)).await;
        }
    }

    /// Proposes `command` on this node only, and only while it leads the group in `term`: a
    /// decision made while leading is never carried into another term, nor forwarded to
    /// another leader (the coordinator's fence). Elsewhere `NotLeader`, with the leader known.
    pub async fn propose_as_leader(
        &self,
        command: M::Command,
        term: u64,
    ) -> Result<M::Response, ConsensusError> {
        let (leader, current_term) = self.leader();
        if leader != Some(self.node_id) || current_term != term {
            return Err(ConsensusError::NotLeader { leader_hint: leader });
        }
        self.propose_here(command).await.map(|(response, _)| response)
    }

    /// Proposes on this node only; with the entry's log index.
    async fn propose_here(
        &self,
        command: M::Command,
    ) -> Result<(M::Response, u64), ConsensusError> {
        match self.raft.client_write(Command(command)).await {
            Ok(written) => {
                let index = written.log_id.index();
                let response = written.data.ok_or_else(|| {
                    ConsensusError::Internal(
                        "a command entry was applied without a response".into(),
                    )
                })?;
                Ok((response, index))
            }
            Err(RaftError::APIError(error)) => Err(write_error(error)),
            Err(RaftError::Fatal(fatal)) => Err(fatal_error(&self.store, fatal)),
        }
    }

    /// Sends `command` to `leader` to propose there. A leader that cannot be reached, or that
    /// no longer leads, answers `NotLeader` (retried by the caller); a call lost after it was
    /// sent is `OutcomeUnknown`, since the leader may have committed it.
    async fn forward(
        &self,
        leader: u64,
        command: &M::Command,
    ) -> Result<(M::Response, u64), ConsensusError> {
        let payload = serde_json::to_vec(command)
            .map_err(|error| ConsensusError::Internal(error.to_string()))?;
        let message = crate::network::RaftMessage {
            group_id: self.group_id,
            source_node_id: self.node_id,
            target_node_id: leader,
            kind: MessageKind::ClientWrite,
            timeout_ms: self.propose_wait_ms,
            payload,
        };
        // A leader cut off (not dead: its connection just goes silent) would hold the call for
        // the whole timeout. Once this node sees another leader, or starts an election, the
        // call's fate is unknown at once, so the caller hears in about an election timeout.
        let wait = self.raft.wait(Some(Duration::from_millis(self.propose_wait_ms)));
        let deposed =
            wait.metrics(move |metrics| metrics.current_leader != Some(leader), "leader deposed");
        let sent = tokio::select! {
            biased;
            sent = self.transport.send(message) => sent,
            Ok(metrics) = deposed => {
                tracing::debug!(group_id = self.group_id, leader, "forwarded-to leader deposed");
                let leader_hint = metrics.current_leader.filter(|&hint| hint != leader);
                return Err(ConsensusError::OutcomeUnknown { leader_hint });
            }
        };
        let answer = match sent {
            Ok(answer) => answer,
            Err(TransportError::Unreachable(detail)) => {
                tracing::debug!(group_id = self.group_id, leader, %detail, "leader unreachable");
                return Err(ConsensusError::NotLeader { leader_hint: None });
            }
            Err(TransportError::Failed(detail)) => {
                tracing::debug!(group_id = self.group_id, leader, %detail, "forward failed");
                return Err(ConsensusError::NotLeader { leader_hint: None });
            }
            Err(TransportError::Timeout | TransportError::Lost(_)) => {
                return Err(ConsensusError::OutcomeUnknown { leader_hint: Some(leader) });
            }
        };
        match decode_message::<Forwarded<M::Response>>(&answer)? {
            Forwarded::Applied { response, log_index } => Ok((response, log_index)),
            // A hint pointing back here, or at the node that refused, would loop: drop it.
            Forwarded::NotLeader { leader_hint } => Err(ConsensusError::NotLeader {
                leader_hint: leader_hint.filter(|&hint| hint != leader),
            }),
            Forwarded::OutcomeUnknown { leader_hint } => {
                Err(ConsensusError::OutcomeUnknown { leader_hint })
            }
            Forwarded::Failed { detail } => Err(ConsensusError::Internal(detail)),
        }
    }

    /// A read barrier: waits until this node has applied everything the group committed before
    /// the call, so that a read here afterwards sees every write acknowledged anywhere before
    /// it. The leader confirms with a quorum that it still leads; another node asks the leader
    /// for that commit index. Reads are local and may lag otherwise; this is for the reads
    /// whose answer would be wrong if they lagged (a topic created a moment ago through another
    /// broker must not be `no_such_topic`).
    ///
    /// While no leader is known, or the one asked no longer leads (an election, a leadership
    /// handed over), it retries as [`RaftGroup::propose`] does. The whole barrier is bounded by
    /// `propose_wait_ms` on the runtime's clock: a leader that does not answer in time ends it
    /// (`Timeout`), it is not asked again.
    pub async fn read_barrier(&self) -> Result<(), ConsensusError> {
        let deadline = Config::<M>::now() + Duration::from_millis(self.propose_wait_ms);
        let mut attempt = 0u32;
        loop {
            let index = match self.leader().0 {
                Some(leader) if leader == self.node_id => self.read_index_here().await,
                Some(leader) => self.read_index_from(leader, deadline).await,
                None => Err(ConsensusError::NotLeader { leader_hint: None }),
            };
            let error = match index {
                Ok(index) => return self.wait_applied(index).await,
                Err(error @ ConsensusError::NotLeader { .. }) => error,
                Err(error) => return Err(error),
            };
            let pause = Duration::from_millis((10u64 << attempt.min(5)).min(PROPOSE_RETRY_MS_MAX));
            if Config::<M>::now() + pause >= deadline {
                return Err(error);
            }
            tracing::trace!(group_id = self.group_id, %error, "read barrier: no leader yet");
            attempt += 1;
            Config::<M>::sleep(pause).await;
        }
    }

    /// The index a read on the leader must wait for, once a quorum confirmed it leads: the end
    /// of the leader's own log, not only what it knows to be committed. A leader that restarted
    /// resumes its term without a new blank entry, and its commit index then starts from what it
    /// had applied, behind entries the cluster committed before the restart (simulator seed
    /// 2000505: a topic created just before both its brokers lost power read as absent, its
    /// delete answered `no_such_topic`, and a re-created topic of the name read the old one's
    /// records). Everything in a leader's log is kept and will commit under it, so waiting for
    /// its end is linearizable whatever the commit index says.
    async fn read_index_here(&self) -> Result<u64, ConsensusError> {
        match self.raft.ensure_linearizable(openraft::raft::ReadPolicy::ReadIndex).await {
            Ok(read) => {
                let last = self.raft.metrics().borrow().last_log_index.unwrap_or(0);
                Ok(read.index().max(last))
            }
            Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(forward))) => {
                Err(ConsensusError::NotLeader { leader_hint: forward.leader_id })
            }
            Err(RaftError::APIError(LinearizableReadError::QuorumNotEnough(_))) => {
                Err(ConsensusError::NotLeader { leader_hint: None })
            }
            Err(RaftError::Fatal(fatal)) => Err(fatal_error(&self.store, fatal)),
        }
    }

    /// Asks `leader` for its commit index, waiting no later than `deadline`. A leader that
    /// cannot be reached is `NotLeader` (another may be elected); one that does not answer in
    /// time is `Timeout`.
    async fn read_index_from(
        &self,
        leader: u64,
        deadline: InstantOf<Config<M>>,
    ) -> Result<u64, ConsensusError> {
        let left = deadline.saturating_duration_since(Config::<M>::now());
        let timeout_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX).max(1);
        let message = crate::network::RaftMessage {
            group_id: self.group_id,
            source_node_id: self.node_id,
            target_node_id: leader,
            kind: MessageKind::ReadIndex,
            timeout_ms,
            payload: Vec::new(),
        };
        let answer = self.transport.send(message).await.map_err(|error| {
            tracing::debug!(group_id = self.group_id, leader, %error, "read index failed");
            match error {
                TransportError::Timeout | TransportError::Lost(_) => ConsensusError::Timeout {
                    waited_ms: timeout_ms,
                    waiting_for: "the group's leader to confirm its commit index",
                },
                TransportError::Unreachable(_) | TransportError::Failed(_) => {
                    ConsensusError::NotLeader { leader_hint: None }
                }
            }
        })?;
        match decode_message::<ReadIndex>(&answer)? {
            ReadIndex::At { log_index } => Ok(log_index),
            ReadIndex::NotLeader { leader_hint } => Err(ConsensusError::NotLeader { leader_hint }),
        }
    }

    /// Waits until this node applied the entry at `log_index` (bounded by `propose_wait_ms`).
    async fn wait_applied(&self, log_index: u64) -> Result<(), ConsensusError> {
        let wait = self.raft.wait(Some(Duration::from_millis(self.propose_wait_ms)));
        match wait.applied_index_at_least(Some(log_index), "forwarded write applied").await {
            Ok(_) => Ok(()),
            Err(WaitError::Timeout(..)) => Err(ConsensusError::Timeout {
                waited_ms: self.propose_wait_ms,
                waiting_for: "this node to apply a write its leader committed",
            }),
            Err(WaitError::ShuttingDown) => Err(stopped_error(&self.store)),
        }
    }

    /// Adds `node_id` to the group, as a learner that is caught up first, then (when
    /// `as_voter`) as a voter. Only on the leader; elsewhere `NotLeader` with a hint.
    pub async fn add_member(&self, node_id: u64, as_voter: bool) -> Result<(), ConsensusError> {
        let _one_at_a_time = self.membership_lock.lock().await;
        let node = openraft::EmptyNode {};
        if !self.voters().contains(&node_id) {
            self.raft
                .add_learner(node_id, node, true)
                .await
                .map_err(|error| self.write_failure(error))?;
        }
        if as_voter && !self.voters().contains(&node_id) {
            let change = openraft::ChangeMembers::AddVoterIds(BTreeSet::from([node_id]));
            self.raft
                .change_membership(change, false)
                .await
                .map_err(|error| self.write_failure(error))?;
        }
        Ok(())
    }

    /// Adds `node_id` as a learner without waiting for it to catch up (the leader replicates to
    /// it from now on). Only on the leader; a member already is left as it is.
    pub async fn add_learner(&self, node_id: u64) -> Result<(), ConsensusError> {
        let _one_at_a_time = self.membership_lock.lock().await;
        if self.voters().contains(&node_id) || self.learners().contains(&node_id) {
            return Ok(());
        }
        self.raft
            .add_learner(node_id, openraft::EmptyNode {}, false)
            .await
            .map(drop)
            .map_err(|error| self.write_failure(error))
    }

    /// On the leader: whether `node_id` has every entry of the leader's log (a leadership
    /// handed to it can be taken at once). `false` elsewhere, or for a node not replicated to.
    pub fn caught_up(&self, node_id: u64) -> bool {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let Some(replication) = &metrics.replication else { return false };
        let matched = replication.get(&node_id).and_then(|log_id| log_id.as_ref());
        matched.is_some_and(|log_id| Some(log_id.index()) >= metrics.last_log_index)
    }

    /// Takes `node_id` out of the group's voters, keeping it as a learner (`keep_learner`, so
    /// it still holds the metadata) or removing it entirely. Only on the leader; a node that is
    /// no voter (or no member) is left as it is.
    pub async fn remove_member(
        &self,
        node_id: u64,
        keep_learner: bool,
    ) -> Result<(), ConsensusError> {
        let _one_at_a_time = self.membership_lock.lock().await;
        if self.voters().contains(&node_id) {
            let change = openraft::ChangeMembers::RemoveVoters(BTreeSet::from([node_id]));
            self.raft
                .change_membership(change, keep_learner)
                .await
                .map_err(|error| self.write_failure(error))?;
        }
        if !keep_learner && self.learners().contains(&node_id) {
            let change = openraft::ChangeMembers::RemoveNodes(BTreeSet::from([node_id]));
            self.raft
                .change_membership(change, false)
                .await
                .map_err(|error| self.write_failure(error))?;
        }
        Ok(())
    }

    fn write_failure(
        &self,
        error: RaftError<Config<M>, ClientWriteError<Config<M>>>,
    ) -> ConsensusError {
        match error {
            RaftError::APIError(error) => write_error(error),
            RaftError::Fatal(fatal) => fatal_error(&self.store, fatal),
        }
    }

    /// Hands the leadership to voter `to`: this node stops leading and `to` starts an election
    /// at once, which it wins when its log is as long as a quorum's. Ignored unless this node
    /// leads; a transfer that does not take ends with an ordinary election.
    pub async fn transfer_leader(&self, to: u64) -> Result<(), ConsensusError> {
        self.raft
            .trigger()
            .transfer_leader(to)
            .await
            .map_err(|fatal| fatal_error(&self.store, fatal))
    }

    /// The group's voters in its latest membership this node knows.
    pub fn voters(&self) -> BTreeSet<u64> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        metrics.membership_config.membership().voter_ids().collect()
    }

    /// Whether `node_id` is a voter or learner of the group's latest membership this node
    /// knows, or this node knows no voters yet (it is joining): the check of a Raft message's
    /// sender, made for every message, so it allocates nothing.
    pub fn may_hear_from(&self, node_id: u64) -> bool {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let membership = metrics.membership_config.membership();
        let mut voters = membership.voter_ids().peekable();
        voters.peek().is_none()
            || membership.voter_ids().any(|voter| voter == node_id)
            || membership.learner_ids().any(|learner| learner == node_id)
    }

    /// The group's learners in its latest membership this node knows.
    pub fn learners(&self) -> BTreeSet<u64> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        metrics.membership_config.membership().learner_ids().collect()
    }

    /// The leader this node knows of, and the term it knows.
    pub fn leader(&self) -> (Option<u64>, u64) {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        (metrics.current_leader, metrics.current_term)
    }

    /// Runs `read` on the applied state. Local: on a follower, or right after a leader change,
    /// it may lag the group's latest commit.
    pub fn read<R>(&self, read: impl FnOnce(&M) -> R) -> R {
        read(&read_applied(&self.applied).machine)
    }

    /// The log index of the last applied entry (`None` before the first).
    pub fn applied_index(&self) -> Option<u64> {
        read_applied(&self.applied).last_applied.as_ref().map(|log_id| log_id.index())
    }

    /// Log entries this node holds but has not applied yet (its apply lag).
    pub fn apply_lag(&self) -> u64 {
        let last = self.raft.metrics().borrow().last_log_index;
        let applied = self.applied_index();
        match (last, applied) {
            (Some(last), Some(applied)) => last.saturating_sub(applied),
            (Some(last), None) => last + 1,
            (None, _) => 0,
        }
    }

    /// Whether this node currently leads the group.
    pub fn is_leader(&self) -> bool {
        self.raft.is_leader()
    }

    pub fn group_id(&self) -> u64 {
        self.group_id
    }

    pub fn node_id(&self) -> u64 {
        self.node_id
    }

    /// Handles a message a peer's [`GroupTransport`] delivered for this group; the returned
    /// bytes are the answer to send back.
    /// `sender` is the node the transport authenticated the message's connection as: a
    /// message speaking for a leader or a candidate is refused unless that node sent it, so a
    /// broker cannot vote, lead or install a snapshot in another's name. (Client writes and
    /// read-index requests come from any broker of the cluster, forwarding for its clients.)
    pub async fn handle_message(
        &self,
        kind: MessageKind,
        payload: &[u8],
        sender: u64,
    ) -> Result<Vec<u8>, ConsensusError> {
        if self.closing.load(std::sync::atomic::Ordering::Acquire) {
            return Err(ConsensusError::Shutdown);
        }
        let store = &self.store;
        match kind {
            MessageKind::AppendEntries => {
                let request: openraft::raft::AppendEntriesRequest<Config<M>> =
                    decode_message(payload)?;
                speaks_for(sender, &request.vote)?;
                let answer = self.raft.append_entries(request).await;
                encode_message(&answer.map_err(|error| raft_error(store, error))?)
            }
            MessageKind::Vote => {
                let request: openraft::raft::VoteRequest<Config<M>> = decode_message(payload)?;
                speaks_for(sender, &request.vote)?;
                let answer = self.raft.vote(request).await;
                encode_message(&answer.map_err(|error| raft_error(store, error))?)
            }
            MessageKind::PreVote => {
                let request: openraft::raft::VoteRequest<Config<M>> = decode_message(payload)?;
                speaks_for(sender, &request.vote)?;
                let answer = self.raft.pre_vote(request).await;
                encode_message(&answer.map_err(|error| raft_error(store, error))?)
            }
            MessageKind::FullSnapshot => {
                let (vote, snapshot) =
                    decode_snapshot::<M>(payload).map_err(ConsensusError::Malformed)?;
                speaks_for(sender, &vote)?;
                let answer = self.raft.install_full_snapshot(vote, snapshot).await;
                encode_message(&answer.map_err(|fatal| fatal_error(store, fatal))?)
            }
            MessageKind::ClientWrite => {
                let command: M::Command = decode_message(payload)?;
                let answer = match self.propose_here(command).await {
                    Ok((response, log_index)) => Forwarded::Applied { response, log_index },
                    Err(ConsensusError::NotLeader { leader_hint }) => {
                        Forwarded::NotLeader { leader_hint }
                    }
                    Err(ConsensusError::OutcomeUnknown { leader_hint }) => {
                        Forwarded::OutcomeUnknown { leader_hint }
                    }
                    Err(error) => Forwarded::Failed { detail: error.to_string() },
                };
                encode_message(&answer)
            }
            MessageKind::TransferLeader => {
                let request: openraft::raft::TransferLeaderRequest<Config<M>> =
                    decode_message(payload)?;
                speaks_for(sender, request.from_leader())?;
                let answer = self.raft.handle_transfer_leader(request).await;
                encode_message(&answer.map_err(|fatal| fatal_error(store, fatal))?)
            }
            MessageKind::ReadIndex => {
                let answer = match self.read_index_here().await {
                    Ok(log_index) => ReadIndex::At { log_index },
                    Err(ConsensusError::NotLeader { leader_hint }) => {
                        ReadIndex::NotLeader { leader_hint }
                    }
                    Err(error) => return Err(error),
                };
                encode_message(&answer)
            }
        }
    }

    /// Stops the group and waits until openraft's tasks let go of the store, so that once the
    /// last [`GroupStore`] handle is dropped the file is closed and can be reopened.
    ///
    /// Always call it: a group that is only dropped keeps its tasks (and its hold on the store)
    /// until the runtime ends.
    pub async fn shutdown(&self) -> Result<(), ConsensusError> {
        self.closing.store(true, std::sync::atomic::Ordering::Release);
        self.raft.shutdown().await.map_err(|error| ConsensusError::Internal(error.to_string()))?;
        // openraft joins its core but not its state machine worker nor a snapshot build; they
        // end on their own once the core is gone.
        for _ in 0..SHUTDOWN_POLLS_MAX {
            if self.liveness.strong_count() == 0 {
                return Ok(());
            }
            Config::<M>::sleep(Duration::from_millis(SHUTDOWN_POLL_MS)).await;
        }
        Err(ConsensusError::Timeout {
            waited_ms: SHUTDOWN_POLL_MS * u64::from(SHUTDOWN_POLLS_MAX),
            waiting_for: "openraft's tasks to release the store",
        })
    }

    async fn start(&self, open_wait_ms: u64, first_boot: FirstBoot) -> Result<(), ConsensusError> {
        // openraft's own test of a first boot: no membership in the log or the snapshot. (A
        // vote alone, from a crash inside `initialize`, does not count.)
        let initialized = self.raft.is_initialized().await;
        let initialized = initialized.map_err(|fatal| fatal_error(&self.store, fatal))?;
        if !initialized && first_boot == FirstBoot::AwaitLeader {
            return Ok(());
        }
        if !initialized {
            let members = BTreeSet::from([self.node_id]);
            match self.raft.initialize(members).await {
                Ok(()) | Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {}
                Err(RaftError::APIError(error)) => {
                    return Err(ConsensusError::Internal(error.to_string()));
                }
                Err(RaftError::Fatal(fatal)) => return Err(fatal_error(&self.store, fatal)),
            }
        } else if self.voters() != BTreeSet::from([self.node_id]) {
            // Other voters: an election needs them, and waiting here for one would keep a
            // restarted broker from serving reads of what it already has.
            return Ok(());
        }
        self.wait_until_serving(open_wait_ms).await
    }

    /// Waits until this node leads and has applied everything in its log: after a restart,
    /// reads then see every entry committed before it.
    async fn wait_until_serving(&self, open_wait_ms: u64) -> Result<(), ConsensusError> {
        let node_id = self.node_id;
        let serving = move |metrics: &openraft::RaftMetrics<Config<M>>| {
            let committed = metrics.cluster_committed.as_ref().map(|log_id| log_id.index());
            let applied = metrics.last_applied.as_ref().map(|log_id| log_id.index());
            metrics.state == ServerState::Leader
                && metrics.current_leader == Some(node_id)
                && metrics.last_log_index.is_some()
                && committed >= metrics.last_log_index
                && applied >= metrics.last_log_index
        };
        let wait = self.raft.wait(Some(Duration::from_millis(open_wait_ms)));
        match wait.metrics(serving, "leader with its log applied").await {
            Ok(_) => Ok(()),
            Err(WaitError::Timeout(..)) => {
                if let Some(reason) = self.store.poisoned() {
                    return Err(ConsensusError::Storage(StoreError::Poisoned(reason)));
                }
                Err(ConsensusError::Timeout {
                    waited_ms: open_wait_ms,
                    waiting_for: "leadership with the log applied",
                })
            }
            Err(WaitError::ShuttingDown) => Err(stopped_error(&self.store)),
        }
    }
}

fn write_error(error: ClientWriteError<Config<impl StateMachine>>) -> ConsensusError {
    match error {
        ClientWriteError::ForwardToLeader(forward) => {
            ConsensusError::NotLeader { leader_hint: forward.leader_id }
        }
        ClientWriteError::LogEntryDiscarded(forward) => {
            ConsensusError::OutcomeUnknown { leader_hint: forward.leader_id }
        }
        other => ConsensusError::Internal(other.to_string()),
    }
}

/// A fatal openraft error. A poisoned store is the root cause of any stop that follows it, so
/// it is reported first.
fn fatal_error<M: StateMachine>(store: &GroupStore, fatal: Fatal<Config<M>>) -> ConsensusError {
    if let Some(reason) = store.poisoned() {
        return ConsensusError::Storage(StoreError::Poisoned(reason));
    }
    match fatal {
        Fatal::StorageError(error) => ConsensusError::Storage(StoreError::Io(error.to_string())),
        Fatal::Panicked => ConsensusError::Internal("the raft core panicked".to_string()),
        Fatal::Stopped => ConsensusError::Shutdown,
    }
}

fn stopped_error(store: &GroupStore) -> ConsensusError {
    match store.poisoned() {
        Some(reason) => ConsensusError::Storage(StoreError::Poisoned(reason)),
        None => ConsensusError::Shutdown,
    }
}

/// Refuses a message whose vote names another node than the one that sent it.
fn speaks_for<V>(sender: u64, vote: &V) -> Result<(), ConsensusError>
where
    V: openraft::vote::RaftVote,
    V::LeaderId: openraft::vote::RaftLeaderId<NodeId = u64>,
{
    use openraft::vote::RaftLeaderId as _;
    let claimed = *vote.leader_id().node_id();
    if claimed == sender {
        return Ok(());
    }
    Err(ConsensusError::Impersonation { sender, claimed })
}

fn raft_error<M: StateMachine>(store: &GroupStore, error: RaftError<Config<M>>) -> ConsensusError {
    match error {
        RaftError::APIError(never) => match never {},
        RaftError::Fatal(fatal) => fatal_error(store, fatal),
    }
}

fn decode_message<T: DeserializeOwned>(payload: &[u8]) -> Result<T, ConsensusError> {
    serde_json::from_slice(payload).map_err(|error| ConsensusError::Malformed(error.to_string()))
}

fn encode_message<T: Serialize>(answer: &T) -> Result<Vec<u8>, ConsensusError> {
    serde_json::to_vec(answer).map_err(|error| ConsensusError::Internal(error.to_string()))
}
