//! Replicated segments on the data plane: a segment's records on `n` brokers, acknowledged
//! once `q = floor(n/2) + 1` of them fsynced them (design.md, invariant 3).
//!
//! The primary (the first replica) stages each batch in its own copy and ships it to the
//! followers; [`malachi_cluster::replication::Primary`] decides what to ship and when a batch
//! is acknowledged, and this module is its driver: batches go in as they are staged (under the
//! head's lock, so in offset order, and inside the blocking call that stages them, so a
//! producer that goes away never leaves a batch half registered), each follower's answer goes
//! in as it arrives, and what the machine asks for is done at once: a span shipped by a task
//! of its own, the quorum-durable end published to the produces waiting on it, `no_quorum`
//! to those that cannot reach one (and a roll requested, so the range moves on).
//!
//! A follower appends what its primary ships in offset order, each batch through its own group
//! commit, and answers its durable end; a batch that does not start where its copy ends is
//! refused with that end, and the primary ships again from there. A sealed copy refuses every
//! batch (`fenced`): that is how a failover's seal stops a primary that is still alive.
//!
//! Readers never see records past the quorum-durable end: the primary knows it, and a follower
//! knows what its primary last told it (every shipped batch carries it).
//!
//! A primary replicates only a head it created in this process: after a restart it does not
//! know what its followers hold (they may hold records its own crash lost), so it takes no
//! appends there and asks for the head to be sealed by failover (`failover.rs`), which seals
//! at the highest durable end a quorum of the replicas reports.

use malachi_log::canary;
use malachi_reason::Reason;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use malachi_cluster::follower::{self, Copy as FollowerCopy, Placement, Refusal};
use malachi_cluster::replication::{Action, Primary, ReplicationConfig};
use malachi_consensus::watch;
use malachi_log::{AppendError, AppendTicket, Record, Segment};

use crate::data::{Listed, SegmentKey};
use crate::error::LogError;
use crate::node::Core;
use crate::peer::{DataCall, Shipped, decode_shipped, encode_shipped};

mod failover;
pub(crate) use failover::Write;

/// How long a follower waits for the batches before one that arrived early (calls are handled
/// concurrently) before it refuses it with its end.
const GAP_WAIT_MS: u64 = 200;
/// How long after a failed ship a follower is tried again.
const RETRY_MS: u64 = 200;
/// Records in one span shipped from the file.
const CATCH_UP_RECORDS_MAX: u64 = 4_096;

/// What the produces waiting on a head learn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Acked {
    /// Records below this are durable on a quorum.
    pub(crate) end: u64,
    /// From this offset on, nothing will be acknowledged: `no_quorum`.
    pub(crate) refused_from: Option<u64>,
}

/// The primary's side of one replicated head this broker created.
pub(crate) struct Head {
    key: SegmentKey,
    state: Mutex<HeadState>,
    acked: watch::Sender<Acked>,
}

struct HeadState {
    machine: Primary,
    /// Batches staged and not yet on every follower in reach, by first offset.
    batches: BTreeMap<u64, Arc<[Record]>>,
    /// The primary's own copy lost records it had staged: only failover may seal the head.
    lost: bool,
}

impl Head {
    fn lock(&self) -> MutexGuard<'_, HeadState> {
        self.state.lock().expect("replicated head lock poisoned")
    }

    pub(crate) fn acked(&self) -> Acked {
        *self.acked.borrow()
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<Acked> {
        self.acked.subscribe()
    }

    /// Stages `records` in the primary's copy and registers them with the machine, in one step
    /// under the head's lock: batches enter the machine in offset order.
    fn stage(
        &self,
        segment: &Segment,
        records: &[Record],
        now_ms: u64,
    ) -> Result<(AppendTicket, Vec<Action>), AppendError> {
        let mut state = self.lock();
        self.check_copy(&mut state, segment);
        if !state.machine.writable() {
            // No quorum was reached for an earlier batch: the head waits for its seal.
            return Err(AppendError::Sealed { end_offset: state.machine.acked_end() });
        }
        let ticket = segment.stage(records)?;
        let bytes = records.iter().map(Record::user_bytes).sum();
        state.machine.staged(ticket.first_offset, ticket.end_offset, bytes, now_ms);
        state.batches.insert(ticket.first_offset, Arc::from(records));
        Ok((ticket, state.take()))
    }

    /// Whether this broker's copy lost records it had staged and shipped (a failed write or
    /// sync reopened it from the disk): the followers may hold records it no longer has, and
    /// staging others at those offsets, or sealing it short, would make the copies differ. Such
    /// a head takes nothing more and is marked lost; failover decides where it ends.
    fn check_copy(&self, state: &mut HeadState, segment: &Segment) -> bool {
        if !state.lost && segment.staged_end() != state.machine.staged_end() {
            tracing::warn!(key = ?self.key, copy_end = segment.staged_end(),
                staged_end = state.machine.staged_end(), "the primary's copy lost staged records");
            state.lost = true;
            state.machine.fence();
        }
        state.lost
    }

    /// [`Head::check_copy`] under the head's lock.
    pub(crate) fn copy_lost(&self, segment: &Segment) -> bool {
        let mut state = self.lock();
        self.check_copy(&mut state, segment)
    }

    /// Feeds the machine one event and returns what it asks for.
    fn step(&self, event: impl FnOnce(&mut Primary)) -> Vec<Action> {
        let mut state = self.lock();
        event(&mut state.machine);
        state.take()
    }

    /// Records `[start, end)` if they are still held in memory (within one staged batch).
    fn held(&self, start: u64, end: u64) -> Option<Vec<Record>> {
        let state = self.lock();
        let (&first, batch) = state.batches.range(..=start).next_back()?;
        let last = first + batch.len() as u64;
        (end <= last).then(|| batch[(start - first) as usize..(end - first) as usize].to_vec())
    }
}

impl HeadState {
    fn take(&mut self) -> Vec<Action> {
        let held_from = self.machine.held_from();
        // Batches wholly below what the machine still holds are on every follower in reach.
        while let Some(entry) = self.batches.first_entry() {
            if *entry.key() + entry.get().len() as u64 > held_from {
                break;
            }
            entry.remove();
        }
        self.machine.take_actions()
    }
}

/// This broker's replicated heads and follower copies.
#[derive(Default)]
pub(crate) struct Replication {
    heads: Mutex<BTreeMap<SegmentKey, Arc<Head>>>,
    copies: Mutex<BTreeMap<SegmentKey, FollowerCopy>>,
    /// Serialises the staging of one follower copy (check where it ends, then stage).
    copy_gates: Mutex<BTreeMap<SegmentKey, Arc<Mutex<()>>>>,
    /// Signalled by every batch staged in a follower copy: batches that arrived early wait on it.
    copy_staged: Mutex<BTreeMap<SegmentKey, watch::Sender<()>>>,
    /// Serialises the fills of one copy: two failovers of a segment at once (the primary's
    /// and the coordinator's) must not both copy the same missing records into it.
    fill_gates: Mutex<BTreeMap<SegmentKey, Arc<tokio::sync::Mutex<()>>>>,
    /// Active heads this broker is the primary of whose file an earlier process wrote: it
    /// does not know what a quorum of them holds, so only failover may decide where they end.
    recovered: Mutex<BTreeSet<SegmentKey>>,
}

impl std::fmt::Debug for Replication {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Replication").finish_non_exhaustive()
    }
}

impl Replication {
    pub(crate) fn head(&self, key: SegmentKey) -> Option<Arc<Head>> {
        self.heads.lock().expect("heads lock poisoned").get(&key).cloned()
    }

    /// Every head held here, and whether a quorum refused it (it takes no appends until
    /// failover seals it).
    pub(crate) fn heads_refused(&self) -> Vec<(SegmentKey, bool)> {
        let heads = self.heads.lock().expect("heads lock poisoned");
        heads.values().map(|head| (head.key, head.acked().refused_from.is_some())).collect()
    }

    /// Records staged on this broker's heads that each follower has yet to make durable,
    /// summed over the heads.
    pub(crate) fn lag_by_follower(&self) -> BTreeMap<u64, u64> {
        let heads: Vec<Arc<Head>> =
            self.heads.lock().expect("heads lock poisoned").values().cloned().collect();
        let mut lag = BTreeMap::new();
        for head in heads {
            for (node, records) in head.lock().machine.follower_lag() {
                *lag.entry(node).or_insert(0) += records;
            }
        }
        lag
    }

    /// Forgets the heads and copies of segments that are no longer active.
    pub(crate) fn forget(&self, key: SegmentKey) {
        self.heads.lock().expect("heads lock poisoned").remove(&key);
        self.copies.lock().expect("copies lock poisoned").remove(&key);
        self.copy_gates.lock().expect("copy gates lock poisoned").remove(&key);
        self.copy_staged.lock().expect("copy staged lock poisoned").remove(&key);
        self.fill_gates.lock().expect("fill gates lock poisoned").remove(&key);
        self.recovered.lock().expect("recovered lock poisoned").remove(&key);
    }

    /// Whether `key` is a head an earlier process of this broker was the primary of.
    pub(crate) fn is_recovered(&self, key: SegmentKey) -> bool {
        self.recovered.lock().expect("recovered lock poisoned").contains(&key)
    }

    pub(crate) fn fill_gate(&self, key: SegmentKey) -> Arc<tokio::sync::Mutex<()>> {
        let mut gates = self.fill_gates.lock().expect("fill gates lock poisoned");
        Arc::clone(gates.entry(key).or_default())
    }

    /// The signal of batches staged in the follower copy of `key`, and a receiver of it that
    /// has seen every earlier batch.
    fn copy_staged(&self, key: SegmentKey) -> (watch::Sender<()>, watch::Receiver<()>) {
        let mut signals = self.copy_staged.lock().expect("copy staged lock poisoned");
        let signal = signals.entry(key).or_insert_with(|| watch::channel(()).0);
        (signal.clone(), signal.subscribe())
    }

    fn copy_gate(&self, key: SegmentKey) -> Arc<Mutex<()>> {
        let mut gates = self.copy_gates.lock().expect("copy gates lock poisoned");
        Arc::clone(gates.entry(key).or_default())
    }

    pub(crate) fn visible_end(&self, key: SegmentKey) -> u64 {
        let copies = self.copies.lock().expect("copies lock poisoned");
        copies.get(&key).map_or(0, |copy| copy.visible_end())
    }

    fn saw_acked(&self, key: SegmentKey, acked_end: u64, durable: u64) {
        let mut copies = self.copies.lock().expect("copies lock poisoned");
        copies.entry(key).or_default().acked(acked_end, durable);
    }
}

pub(crate) use malachi_cluster::follower::Role;

/// A span of a head's records to ship to a follower, in the follower's window `epoch`.
#[derive(Clone, Copy, Debug)]
struct Span {
    follower: u64,
    start: u64,
    end: u64,
    epoch: u64,
}

/// The replication service: this broker's side of the replication protocol for the heads it is
/// the primary of (shipping spans to followers, counting their answers through
/// [`Primary`]), for the copies it follows (staging and appending what primaries ship), and
/// failover (`failover.rs`: probing, fencing, filling and sealing the copies of a head whose
/// primary is gone). The only place a replicated append is acknowledged.
pub struct Replicator {
    core: Arc<Core>,
    /// The replicated heads this broker is the primary of, and its follower copies.
    replication: Replication,
    /// Brokers a failover's probe could not reach, until when (ms): kept out of new segments'
    /// replica sets while membership has yet to call them dead, so the segment that replaces
    /// a dead primary's head does not go to it again.
    unreachable_until_ms: Mutex<BTreeMap<u64, u64>>,
}

services_on_core!(Replicator);

impl Replicator {
    pub(crate) fn new(core: Arc<Core>) -> Replicator {
        Replicator {
            core,
            replication: Replication::default(),
            unreachable_until_ms: Mutex::default(),
        }
    }

    /// Asks for a roll of `key`'s range. Spans ship on tasks that hold this service alone, so
    /// the broker may be gone: then nobody is left to roll anything.
    fn request_roll(&self, key: SegmentKey) {
        if let Some(broker) = self.self_handle() {
            broker.coordination.request_roll(key.topic_id, key.range_id);
        }
    }

    /// This service, for a task of its own to hold; `None` once the broker is stopping.
    fn handle(&self) -> Option<Arc<Replicator>> {
        self.self_handle().map(|broker| Arc::clone(&broker.replicator))
    }

    /// Drops what this broker holds of `key`'s replication (its topic deleted, or sealed).
    pub(crate) fn forget(&self, key: SegmentKey) {
        self.replication.forget(key);
    }

    /// The gate that serialises the fills and settles of this broker's copy of `key`.
    pub(crate) fn fill_gate(&self, key: SegmentKey) -> Arc<tokio::sync::Mutex<()>> {
        self.replication.fill_gate(key)
    }

    /// Whether this broker holds replication state for head `key` as its primary.
    pub(crate) fn holds_head(&self, key: SegmentKey) -> bool {
        self.replication.head(key).is_some()
    }

    /// The heads held here, each with whether a quorum refused it.
    pub(crate) fn heads_refused(&self) -> Vec<(SegmentKey, bool)> {
        self.replication.heads_refused()
    }

    /// Where readers of this broker's copy of active segment `key` stop, given where it is
    /// durable: a follower at what its primary said is acknowledged, a primary at what a
    /// quorum acknowledged. `None` for a head this broker is the primary of but has no state
    /// for (restarted since it created it): it does not know what a quorum holds, so failover
    /// must seal it first.
    pub(crate) fn readable_end(&self, key: SegmentKey, durable: u64) -> Option<u64> {
        match self.role(key) {
            Some(Role::Follower { .. }) => Some(self.replication.visible_end(key).min(durable)),
            Some(Role::Primary { .. }) => match self.replication.head(key) {
                Some(head) => Some(head.acked().end.min(durable)),
                None if self.replication.is_recovered(key) => None,
                // Sealed here by a seal a quorum holds (its state is dropped only then), or
                // created a moment ago and empty.
                None => Some(durable),
            },
            _ => Some(durable),
        }
    }

    /// `key`'s replicas as this broker sees them; `None` once metadata no longer lists it.
    pub(crate) fn role(&self, key: SegmentKey) -> Option<Role> {
        let node_id = self.node_id;
        self.read_meta(key.segment_id, |meta| {
            Some(Role::of(&meta.segment(key.segment_id)?.replicas, node_id))
        })
    }

    /// `key`'s replicas, the primary first; `None` once metadata no longer lists it.
    pub(crate) fn replicas(&self, key: SegmentKey) -> Option<Vec<u64>> {
        self.read_meta(key.segment_id, |meta| {
            meta.segment(key.segment_id).map(|segment| segment.replicas.clone())
        })
    }

    fn replication_config(&self) -> ReplicationConfig {
        ReplicationConfig {
            quorum_wait_ms: self.config.cluster.replication_timeout_ms,
            catch_up_records_max: CATCH_UP_RECORDS_MAX,
            held_bytes_max: self.config.cluster.replication_held_bytes_max,
            canary_short_answer_wedges: self.canaries.short_answer_wedges,
            ..ReplicationConfig::default()
        }
    }

    /// Records staged on this broker's heads that each follower has yet to make durable,
    /// summed over the heads (the simulator's check that followers catch up).
    pub fn follower_lag(&self) -> BTreeMap<u64, u64> {
        self.replication.lag_by_follower()
    }

    /// Called when this broker opened `key`'s file that an earlier process wrote: a head it
    /// is the primary of is marked recovered (only failover may seal it).
    pub(crate) fn recovered_copy(&self, key: SegmentKey) {
        if matches!(self.role(key), Some(Role::Primary { .. }))
            && matches!(self.listed(key), Some(Listed::ActiveCreated | Listed::ActiveUnborn))
            && self.replication.head(key).is_none()
        {
            self.replication.recovered.lock().expect("recovered lock poisoned").insert(key);
        }
    }

    /// Called when this broker opened `key` and created its file: a head it is the primary
    /// of starts replicating from offset 0.
    pub(crate) fn created_copy(&self, key: SegmentKey) {
        let Some(Role::Primary { followers }) = self.role(key) else { return };
        let active = self.read_meta(key.segment_id, |meta| {
            meta.segment(key.segment_id).is_some_and(|segment| segment.is_active())
        });
        if !active {
            return;
        }
        let head = Arc::new(Head {
            key,
            state: Mutex::new(HeadState {
                machine: Primary::new(&followers, 0, self.replication_config()),
                batches: BTreeMap::new(),
                lost: false,
            }),
            acked: watch::channel(Acked::default()).0,
        });
        self.replication.heads.lock().expect("heads lock poisoned").entry(key).or_insert(head);
    }

    /// Appends `records` to `segment`, a replicated head this broker is the primary of, and
    /// returns once a quorum of its replicas has them durable. `Sealed` when the head takes no
    /// appends here (sealed, being sealed, or not replicable by this process): the caller
    /// re-routes after the roll this asks for.
    pub(crate) async fn append_replicated(
        &self,
        key: SegmentKey,
        segment: Arc<Segment>,
        records: Vec<Record>,
    ) -> Result<AppendTicket, ReplicatedAppendError> {
        let Some(head) = self.replication.head(key) else {
            // Restarted since it created the head: only failover may decide where it ends.
            self.request_roll(key);
            return Err(ReplicatedAppendError::Append(AppendError::Sealed { end_offset: 0 }));
        };
        let replicator = self.handle().expect("a serving broker is held by an Arc");
        let now_ms = self.clock.now_ms();
        let staging = Arc::clone(&head);
        let ticket = self
            .data
            .run(move || {
                let (ticket, actions) = staging.stage(&segment, &records, now_ms)?;
                replicator.execute(&staging, actions);
                segment.wait_durable(ticket)?;
                let durable = segment.durable_offset();
                let actions = staging.step(|machine| machine.local_durable(durable));
                replicator.execute(&staging, actions);
                Ok::<_, AppendError>(ticket)
            })
            .await;
        let ticket = match ticket {
            Ok(ticket) => ticket,
            Err(error) => {
                self.after_local_failure(&head);
                return Err(ReplicatedAppendError::Append(error));
            }
        };
        if !canary(self.canaries.ack_primary_only) {
            self.wait_acked(&head, ticket.end_offset).await?;
        }
        Ok(ticket)
    }

    /// After a batch could not be staged or synced here, or a seal found the copy short: what
    /// the machine asks for is done, and a head whose copy lost staged records is handed to
    /// failover, as after a restart.
    pub(crate) fn after_local_failure(&self, head: &Arc<Head>) {
        let (actions, lost) = {
            let mut state = head.lock();
            (state.take(), state.lost)
        };
        if let Some(replicator) = self.handle() {
            replicator.execute(head, actions);
        }
        if lost {
            self.replication.heads.lock().expect("heads lock poisoned").remove(&head.key);
            self.replication.recovered.lock().expect("recovered lock poisoned").insert(head.key);
            self.request_roll(head.key);
        }
    }

    /// Waits until a quorum acknowledged everything below `end`, ticking the machine so a batch
    /// without a quorum is refused in bounded time.
    async fn wait_acked(&self, head: &Arc<Head>, end: u64) -> Result<(), ReplicatedAppendError> {
        let tick = Duration::from_millis((self.config.cluster.replication_timeout_ms / 4).max(10));
        let mut acked = head.acked.subscribe();
        loop {
            let now = *acked.borrow_and_update();
            if now.end >= end {
                return Ok(());
            }
            if now.refused_from.is_some_and(|from| from < end) {
                return Err(ReplicatedAppendError::NoQuorum);
            }
            if tokio::time::timeout(tick, acked.changed()).await.is_err() {
                let now_ms = self.clock.now_ms();
                let actions = head.step(|machine| machine.tick(now_ms));
                if let Some(replicator) = self.handle() {
                    replicator.execute(head, actions);
                }
            }
        }
    }

    /// Does what the machine asked, at once and without waiting: spans go out on tasks of
    /// their own.
    fn execute(self: &Arc<Self>, head: &Arc<Head>, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Ship { follower, start, end, epoch } => {
                    let broker = Arc::clone(self);
                    let head = Arc::clone(head);
                    let span = Span { follower, start, end, epoch };
                    tokio::spawn(async move { broker.ship(head, span).await });
                }
                Action::Acked { end } => {
                    head.acked.send_modify(|acked| acked.end = acked.end.max(end));
                }
                Action::NoQuorum { from } => {
                    tracing::warn!(key = ?head.key, from, "no quorum of the replicas: the head \
                        takes no more appends and is sealed");
                    head.acked.send_modify(|acked| {
                        acked.refused_from.get_or_insert(from);
                    });
                    self.request_roll(head.key);
                }
            }
        }
    }

    /// Ships a span of the head to its follower and feeds the answer back.
    async fn ship(self: Arc<Self>, head: Arc<Head>, span: Span) {
        let Span { follower, start, end, epoch } = span;
        let key = head.key;
        let records = match head.held(start, end) {
            Some(records) => Ok(records),
            None => self.records_from_file(key, start, end).await,
        };
        let answer = match records {
            Ok(records) => {
                let acked_end = head.acked().end;
                let call = DataCall::Replicate { start, acked_end, records };
                let answer = self.data_call(follower, key, call).await;
                answer.map(|answer| decode_shipped(&answer))
            }
            Err(error) => Ok(Err(error)),
        };
        let actions = match answer {
            Ok(Ok(Shipped::Durable(durable))) => {
                head.step(|machine| machine.follower_durable(follower, durable))
            }
            Ok(Ok(Shipped::Refused(durable))) => {
                head.step(|machine| machine.follower_refused(follower, durable, epoch))
            }
            Ok(Ok(Shipped::Fenced)) => {
                tracing::info!(?key, follower, "a follower's copy is sealed: the head is fenced");
                head.step(Primary::fence)
            }
            Ok(Err(error)) | Err(error) => {
                tracing::debug!(?key, follower, %error, "shipping to a follower failed");
                let mut out_of_reach = false;
                let actions = head.step(|machine| {
                    out_of_reach = machine.follower_unreachable(follower, epoch);
                });
                self.execute(&head, actions);
                // The other spans of the window fail too; only the failure that put the
                // follower out of reach retries it.
                if !out_of_reach {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(RETRY_MS)).await;
                head.step(|machine| machine.retry_follower(follower))
            }
        };
        self.execute(&head, actions);
    }

    /// Records `[start, end)` of this broker's copy, as many as
    /// `MALACHI_REPLICATION_CATCH_UP_BYTES` holds (at least one): the follower answers a span cut short with its new end, and the machine
    /// ships on from there. A copy that cannot be read, or holds nothing at `start`, fails the
    /// span (retried after a pause), rather than shipping nothing and having the follower
    /// answer an end that moves nothing.
    async fn records_from_file(
        &self,
        key: SegmentKey,
        start: u64,
        end: u64,
    ) -> Result<Vec<Record>, LogError> {
        let segment = self.segment(key).await?;
        let wanted = u32::try_from(end - start).unwrap_or(u32::MAX);
        let bytes_max = self.config.cluster.replication_catch_up_bytes;
        match self.data.read(segment, start, wanted, bytes_max).await {
            Ok(batch) if batch.records.is_empty() => {
                tracing::warn!(
                    ?key,
                    start,
                    end,
                    "this copy holds no records to ship at the start of a span"
                );
                let detail = format!("no records at {start} to ship");
                Err(LogError::Storage { reason: Reason::StorageFailed, detail })
            }
            Ok(batch) => Ok(batch.records.into_iter().map(|stored| stored.record).collect()),
            Err(error) => {
                tracing::warn!(?key, start, %error, "reading records to ship failed");
                Err(LogError::Storage { reason: Reason::StorageFailed, detail: error.to_string() })
            }
        }
    }

    /// A batch the primary of `key` shipped to this broker's copy: appended in offset order,
    /// answered with the copy's durable end once the batch is durable here.
    pub(crate) async fn replicate_here(
        &self,
        source: u64,
        key: SegmentKey,
        start: u64,
        acked_end: u64,
        records: Vec<Record>,
    ) -> Vec<u8> {
        let appended = self.append_copy(source, key, start, records).await;
        if let Ok(Shipped::Durable(durable)) = appended {
            self.replication.saw_acked(key, acked_end, durable);
        }
        encode_shipped(appended)
    }

    async fn append_copy(
        &self,
        source: u64,
        key: SegmentKey,
        start: u64,
        records: Vec<Record>,
    ) -> Result<Shipped, LogError> {
        let role = self.role(key).ok_or(LogError::NoSuchTopic)?;
        match follower::admit(&role, source) {
            Ok(()) => {}
            Err(Refusal::PrimaryHere) => {
                return Err(LogError::NotOwner { holders: vec![self.node_id] });
            }
            Err(Refusal::NotFromPrimary) => return Err(LogError::NotOwner { holders: Vec::new() }),
        }
        let segment = self.segment(key).await?;
        match self.stage_in_order(&segment, key, start, Arc::from(records)).await {
            Ok(Some(durable)) => Ok(Shipped::Durable(durable)),
            Err(AppendError::Sealed { .. }) => Ok(Shipped::Fenced),
            Err(error) => Err(crate::data::DataError::Append(error).into()),
            // The batches before it never came: the primary ships again from this copy's end.
            Ok(None) => Ok(Shipped::Refused(segment.durable_offset())),
        }
    }

    /// Stages a shipped batch in this broker's copy once the copy reaches its start (calls
    /// are handled concurrently, so the batches before it may still be on their way) and
    /// waits until it is durable, in one blocking call; the copy's durable end. Woken by every
    /// batch staged in the copy, never by polling. `None` when the batches before it did not
    /// come within [`GAP_WAIT_MS`], or the copy was forgotten.
    async fn stage_in_order(
        &self,
        segment: &Arc<Segment>,
        key: SegmentKey,
        start: u64,
        records: Arc<[Record]>,
    ) -> Result<Option<u64>, AppendError> {
        let (signal, mut staged) = self.replication.copy_staged(key);
        let gate = self.replication.copy_gate(key);
        let deadline_ms = self.clock.now_ms() + GAP_WAIT_MS;
        loop {
            if start <= segment.staged_end() {
                let (staging, gate, records) =
                    (Arc::clone(segment), Arc::clone(&gate), Arc::clone(&records));
                let signal = signal.clone();
                let ticket = self
                    .data
                    .run(move || {
                        let gate = gate.lock().expect("copy gate poisoned");
                        let Some(ticket) = stage_copy(&staging, start, &records)? else {
                            return Ok(None);
                        };
                        drop(gate);
                        // Inside the blocking work, so a caller that stopped waiting still
                        // wakes the batches behind this one.
                        signal.send_modify(|_| ());
                        staging.wait_durable(ticket)?;
                        Ok::<_, AppendError>(Some(staging.durable_offset()))
                    })
                    .await?;
                if ticket.is_some() {
                    return Ok(ticket);
                }
            }
            let left_ms = deadline_ms.saturating_sub(self.clock.now_ms());
            let woken =
                tokio::time::timeout(Duration::from_millis(left_ms), staged.changed()).await;
            if !matches!(woken, Ok(Ok(()))) {
                return Ok(None);
            }
        }
    }

    /// The quorum-durable end of active segment `key` as this broker knows it: the primary's
    /// acknowledged end, what a follower's primary last told it; `None` when this broker
    /// cannot tell (a primary restarted since it created the head).
    pub(crate) fn visible_end(&self, key: SegmentKey) -> Option<u64> {
        match self.role(key)? {
            Role::Alone | Role::Outside { .. } => None,
            Role::Primary { .. } => self.replication.head(key).map(|head| head.acked().end),
            Role::Follower { .. } => Some(self.replication.visible_end(key)),
        }
    }
}

/// Stages `records` (shipped to start at `start`) in a follower's copy: the part it does not
/// hold yet, where [`follower::place`] puts it. `None`: a gap, the batches before it have not
/// arrived.
fn stage_copy(
    segment: &Segment,
    start: u64,
    records: &[Record],
) -> Result<Option<AppendTicket>, AppendError> {
    let end_offset = start + records.len() as u64;
    match follower::place(segment.staged_end(), start, records.len()) {
        Placement::Gap => Ok(None),
        Placement::Held => Ok(Some(AppendTicket { first_offset: start, end_offset })),
        Placement::Stage { skip } => segment.stage(&records[skip..]).map(Some),
    }
}

/// Why a replicated append was not acknowledged.
#[derive(Debug)]
pub(crate) enum ReplicatedAppendError {
    Append(AppendError),
    NoQuorum,
}
