//! Tests of the whole crate: groups over a real redb file in a temp dir, the openraft storage
//! conformance suite, a store whose fsync fails, and golden encodings of what is on disk.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::time::Duration;

use openraft::entry::RaftEntry;
use openraft::testing::log::StoreBuilder;
use openraft::testing::log::Suite;
use openraft::vote::RaftLeaderId;
use serde::Deserialize;
use serde::Serialize;

use crate::ConsensusError;
use crate::FirstBoot;
use crate::GroupConfig;
use crate::GroupStore;
use crate::GroupTransport;
use crate::MessageKind;
use crate::RaftGroup;
use crate::RaftMessage;
use crate::StateMachine;
use crate::StoreError;
use crate::TransportError;
use crate::TransportFuture;
use crate::group_machine::GroupMachine;
use crate::log_store::GroupLog;
use crate::network::decode_snapshot;
use crate::type_config::Command;
use crate::type_config::Config;
use crate::type_config::Entry;
use crate::type_config::LogId;
use crate::type_config::Vote;

/// The test machine: named counters.
#[derive(Debug, Default, PartialEq, Eq)]
struct Counters {
    counts: BTreeMap<String, u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
enum CounterCommand {
    Add { key: String, amount: u64 },
}

impl StateMachine for Counters {
    type Command = CounterCommand;
    /// The counter's value after the command.
    type Response = u64;

    fn apply(&mut self, command: CounterCommand) -> u64 {
        match command {
            CounterCommand::Add { key, amount } => {
                let count = self.counts.entry(key).or_insert(0);
                *count = count.saturating_add(amount);
                *count
            }
        }
    }

    fn snapshot(&self) -> Vec<u8> {
        // A BTreeMap serializes in key order: canonical bytes.
        serde_json::to_vec(&self.counts).unwrap_or_default()
    }

    fn restore(bytes: &[u8]) -> Result<Self, String> {
        let counts = serde_json::from_slice(bytes).map_err(|error| error.to_string())?;
        Ok(Counters { counts })
    }

    fn empty() -> Self {
        Counters::default()
    }
}

fn add(key: &str, amount: u64) -> CounterCommand {
    CounterCommand::Add { key: key.to_string(), amount }
}

/// Short timeouts: a single voter has no one to wait for.
fn fast_config(snapshot_every_entries: u64) -> GroupConfig {
    GroupConfig {
        snapshot_every_entries,
        heartbeat_interval_ms: 20,
        election_timeout_min_ms: 50,
        election_timeout_max_ms: 100,
        open_wait_ms: 10_000,
        propose_wait_ms: 5_000,
    }
}

fn store_path(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("raft.redb")
}

async fn open_group(store: &GroupStore, group_id: u64, config: GroupConfig) -> RaftGroup<Counters> {
    match RaftGroup::<Counters>::open(store, group_id, 1, config).await {
        Ok(group) => group,
        Err(error) => panic!("open group {group_id}: {error}"),
    }
}

/// Proposes `count` adds spread over five keys; checks each response against a local model.
async fn propose_adds(group: &RaftGroup<Counters>, model: &mut Counters, count: u64) {
    for step in 0..count {
        let command = add(&format!("key-{}", step % 5), step + 1);
        let expected = model.apply(command.clone());
        let response = group.propose(command).await.expect("propose");
        assert_eq!(response, expected, "response of step {step}");
    }
}

fn file_bytes(path: &Path) -> u64 {
    std::fs::metadata(path).expect("store file metadata").len()
}

#[tokio::test]
async fn proposals_survive_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut model = Counters::empty();
    let (snapshot_before, applied_before) = {
        let store = GroupStore::open(store_path(&dir)).expect("open store");
        let group = open_group(&store, 7, fast_config(1024)).await;
        assert!(group.is_leader());
        propose_adds(&group, &mut model, 40).await;
        let before = (group.read(|machine| machine.snapshot()), group.applied_index());
        group.shutdown().await.expect("shutdown");
        assert_eq!(group.propose(add("late", 1)).await, Err(ConsensusError::Shutdown));
        before
    };
    assert_eq!(snapshot_before, model.snapshot());

    let store = GroupStore::open(store_path(&dir)).expect("reopen store");
    let group = open_group(&store, 7, fast_config(1024)).await;
    assert_eq!(group.read(|machine| machine.snapshot()), snapshot_before);
    // The restarted leader applied the whole old log before open returned.
    assert!(group.applied_index() >= applied_before);
    propose_adds(&group, &mut model, 10).await;
    assert_eq!(group.read(|machine| machine.snapshot()), model.snapshot());
    group.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn groups_sharing_a_store_stay_independent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut models = [Counters::empty(), Counters::empty()];
    {
        let store = GroupStore::open(store_path(&dir)).expect("open store");
        let first = open_group(&store, 1, fast_config(10)).await;
        let second = open_group(&store, 2, fast_config(10)).await;
        // Interleaved, and concurrently, so their writes share batches.
        for round in 0..15_u64 {
            let (left, right) = tokio::join!(
                first.propose(add("a", round)),
                second.propose(add("b", 100 + round)),
            );
            assert_eq!(left.expect("first"), models[0].apply(add("a", round)));
            assert_eq!(right.expect("second"), models[1].apply(add("b", 100 + round)));
        }
        first.shutdown().await.expect("shutdown first");
        second.shutdown().await.expect("shutdown second");
    }
    let store = GroupStore::open(store_path(&dir)).expect("reopen store");
    assert_eq!(store.group_ids().expect("group ids"), vec![1, 2]);
    for (group_id, model) in [1_u64, 2].into_iter().zip(&models) {
        let group = open_group(&store, group_id, fast_config(10)).await;
        assert_eq!(group.read(|machine| machine.snapshot()), model.snapshot(), "group {group_id}");
        group.shutdown().await.expect("shutdown");
    }
}

/// Polls until the group's stored log is at most `entries_max` long; compaction runs in the
/// background after the proposals returned.
async fn wait_for_compaction(store: &GroupStore, group_id: u64, entries_max: u64) -> u64 {
    for _ in 0..500 {
        let len = store.log_len(group_id).expect("log len");
        if len <= entries_max {
            return len;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    store.log_len(group_id).expect("log len")
}

/// Proposes `rounds` rounds of `SLOTS` concurrent adds, one per key `slot-N`, so that their
/// batching cannot change any response; checks the responses against the model.
async fn propose_rounds(group: &RaftGroup<Counters>, model: &mut Counters, rounds: u64) {
    const SLOTS: u64 = 20;
    for round in 0..rounds {
        let commands: Vec<CounterCommand> =
            (0..SLOTS).map(|slot| add(&format!("slot-{slot}"), round + 1)).collect();
        let proposals = commands.iter().map(|command| group.propose(command.clone()));
        let responses = futures_util::future::join_all(proposals).await;
        for (command, response) in commands.into_iter().zip(responses) {
            assert_eq!(response.expect("propose"), model.apply(command));
        }
    }
}

#[tokio::test]
async fn snapshots_bound_the_log_and_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = store_path(&dir);
    let mut model = Counters::empty();
    let snapshot = {
        let store = GroupStore::open(&path).expect("open store");
        let group = open_group(&store, 3, fast_config(10)).await;
        propose_rounds(&group, &mut model, 10).await;
        let len = wait_for_compaction(&store, 3, 29).await;
        assert!(len < 30, "{len} log entries stored after 200 proposals");

        propose_rounds(&group, &mut model, 15).await;
        let bytes_warm = file_bytes(&path);
        propose_rounds(&group, &mut model, 75).await;
        let bytes_later = file_bytes(&path);
        // 1500 more entries are over 150 KiB of serde_json alone: a log that is not purged, or
        // freed pages that are not reused, would grow the file by more than this.
        let growth = bytes_later.saturating_sub(bytes_warm);
        assert!(growth < 64 * 1024, "file grew from {bytes_warm} to {bytes_later} bytes");
        let len = wait_for_compaction(&store, 3, 29).await;
        assert!(len < 30, "{len} log entries stored after 2000 proposals");

        let snapshot = group.read(|machine| machine.snapshot());
        group.shutdown().await.expect("shutdown");
        snapshot
    };
    assert_eq!(snapshot, model.snapshot());

    let store = GroupStore::open(&path).expect("reopen store");
    let group = open_group(&store, 3, fast_config(10)).await;
    assert_eq!(group.read(|machine| machine.snapshot()), snapshot);
    propose_rounds(&group, &mut model, 1).await;
    group.shutdown().await.expect("shutdown");
}

#[test]
fn a_file_that_is_not_a_store_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = store_path(&dir);
    std::fs::write(&path, vec![0x5a; 64 * 1024]).expect("write garbage");
    match GroupStore::open(&path) {
        Err(StoreError::Open(message)) => assert!(!message.is_empty()),
        other => panic!("expected an open error, got {other:?}"),
    }
    let missing_dir = dir.path().join("missing").join("raft.redb");
    assert!(matches!(GroupStore::open(missing_dir), Err(StoreError::Open(_))));
}

#[test]
fn a_second_open_of_the_same_file_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _store = GroupStore::open(store_path(&dir)).expect("open store");
    assert!(matches!(GroupStore::open(store_path(&dir)), Err(StoreError::Open(_))));
}

/// An in-memory redb backend whose fsync can be made to fail.
#[derive(Debug)]
struct FailingSync {
    memory: redb::backends::InMemoryBackend,
    fail_sync: Arc<AtomicBool>,
}

impl redb::StorageBackend for FailingSync {
    fn len(&self) -> Result<u64, std::io::Error> {
        self.memory.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        self.memory.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        self.memory.set_len(len)
    }
    fn sync_data(&self) -> Result<(), std::io::Error> {
        if self.fail_sync.load(Ordering::SeqCst) {
            return Err(std::io::Error::other("injected fsync failure"));
        }
        self.memory.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        self.memory.write(offset, data)
    }
}

#[tokio::test]
async fn a_failed_fsync_stops_the_group_with_a_typed_error() {
    let fail_sync = Arc::new(AtomicBool::new(false));
    let backend = FailingSync {
        memory: redb::backends::InMemoryBackend::new(),
        fail_sync: fail_sync.clone(),
    };
    let store =
        GroupStore::open_with_backend(backend, crate::WriterMode::Thread).expect("open store");
    let group = open_group(&store, 1, fast_config(1024)).await;
    assert_eq!(group.propose(add("x", 1)).await, Ok(1));

    fail_sync.store(true, Ordering::SeqCst);
    let error = group.propose(add("x", 1)).await.expect_err("a write after a failed fsync");
    assert!(matches!(error, ConsensusError::Storage(StoreError::Poisoned(_))), "{error:?}");
    assert!(store.poisoned().is_some());

    // Poisoned until reopened: even with a healthy disk again, nothing more is written.
    fail_sync.store(false, Ordering::SeqCst);
    let error = group.propose(add("x", 1)).await.expect_err("a write to a poisoned store");
    assert!(matches!(error, ConsensusError::Storage(_)), "{error:?}");
    assert_eq!(group.read(|machine| machine.counts.get("x").copied()), Some(1));
    let _ = group.shutdown().await;
}

#[tokio::test]
async fn invalid_configs_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = GroupStore::open(store_path(&dir)).expect("open store");
    let cases = [
        ("no snapshots", GroupConfig { snapshot_every_entries: 0, ..fast_config(10) }),
        (
            "empty election window",
            GroupConfig {
                election_timeout_min_ms: 100,
                election_timeout_max_ms: 100,
                ..fast_config(10)
            },
        ),
        (
            "heartbeat slower than elections",
            GroupConfig { heartbeat_interval_ms: 60, ..fast_config(10) },
        ),
    ];
    for (name, config) in cases {
        let opened = RaftGroup::<Counters>::open(&store, 1, 1, config).await;
        assert!(matches!(opened, Err(ConsensusError::Config(_))), "{name}");
    }
    // Nothing was written for a group that never opened.
    assert_eq!(store.group_ids().expect("group ids"), Vec::<u64>::new());
}

#[tokio::test]
async fn a_stale_vote_request_from_a_peer_is_rejected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = GroupStore::open(store_path(&dir)).expect("open store");
    let group = open_group(&store, 5, fast_config(1024)).await;
    // Node 2 asks for a vote in term 0 with an empty log: behind the leader (term >= 1).
    let request =
        openraft::raft::VoteRequest::<Config<Counters>>::new(Vote::<Counters>::new(0, 2), None);
    let payload = serde_json::to_vec(&request).expect("encode");
    let answer = group.handle_message(MessageKind::Vote, &payload, 2).await.expect("vote answer");
    let answer: openraft::raft::VoteResponse<Config<Counters>> =
        serde_json::from_slice(&answer).expect("decode");
    assert!(!answer.vote_granted);
    assert!(group.is_leader());

    let malformed = group.handle_message(MessageKind::AppendEntries, b"{not json", 2).await;
    assert!(matches!(malformed, Err(ConsensusError::Malformed(_))));
    // A vote (even a leadership-transfer one, which skips the lease) in another node's name is
    // refused before Raft sees it: node 3 asks on node 2's behalf in a far later term.
    let mut forged =
        openraft::raft::VoteRequest::<Config<Counters>>::new(Vote::<Counters>::new(99, 2), None);
    forged.leadership_transfer = true;
    let payload = serde_json::to_vec(&forged).expect("encode");
    let refused = group.handle_message(MessageKind::Vote, &payload, 3).await;
    assert!(
        matches!(refused, Err(ConsensusError::Impersonation { sender: 3, claimed: 2 })),
        "{refused:?}"
    );
    assert!(group.is_leader(), "the forged vote moved the group");
    group.shutdown().await.expect("shutdown");
}

#[test]
fn malformed_snapshot_messages_are_errors() {
    let too_long = [0xff, 0xff, 0xff, 0x7f, b'{'];
    let cases: [(&str, &[u8]); 4] = [
        ("empty", &[]),
        ("short length", &[1, 0]),
        ("length beyond the payload", &too_long),
        ("header not json", &[3, 0, 0, 0, b'a', b'b', b'c', 1, 2]),
    ];
    for (name, payload) in cases {
        assert!(decode_snapshot::<Counters>(payload).is_err(), "{name}");
    }
}

#[test]
fn message_kind_codes_round_trip() {
    let kinds = [
        (MessageKind::AppendEntries, 1),
        (MessageKind::Vote, 2),
        (MessageKind::PreVote, 3),
        (MessageKind::FullSnapshot, 4),
        (MessageKind::ClientWrite, 5),
        (MessageKind::ReadIndex, 6),
        (MessageKind::TransferLeader, 7),
    ];
    for (kind, code) in kinds {
        assert_eq!(kind.code(), code);
        assert_eq!(MessageKind::from_code(code), Some(kind));
    }
    assert_eq!(MessageKind::from_code(0), None);
    assert_eq!(MessageKind::from_code(8), None);
}

fn log_id(term: u64, node_id: u64, index: u64) -> LogId<Counters> {
    let leader_id = <Config<Counters> as openraft::RaftTypeConfig>::LeaderId::new(term, node_id);
    LogId::<Counters>::new(leader_id.to_committed(), index)
}

/// The serde_json of what the store writes. An openraft upgrade that changes any of these
/// changes the on-disk format: bump FORMAT_VERSION and handle old files before updating them.
#[test]
fn golden_encodings_on_disk() {
    let entry = Entry::<Counters>::new_normal(log_id(3, 1, 7), Command(add("k", 2)));
    let blank = Entry::<Counters>::new_blank(log_id(3, 1, 8));
    let vote = Vote::<Counters>::new_committed(3, 1);
    let cases = [
        (
            serde_json::to_string(&entry),
            concat!(
                r#"{"log_id":{"leader_id":{"term":3,"node_id":1},"index":7},"#,
                r#""payload":{"Normal":{"Add":{"key":"k","amount":2}}}}"#
            ),
        ),
        (
            serde_json::to_string(&blank),
            r#"{"log_id":{"leader_id":{"term":3,"node_id":1},"index":8},"payload":"Blank"}"#,
        ),
        (serde_json::to_string(&vote), r#"{"leader_id":{"term":3,"node_id":1},"committed":true}"#),
        (
            serde_json::to_string(&Some(log_id(3, 1, 8))),
            r#"{"leader_id":{"term":3,"node_id":1},"index":8}"#,
        ),
    ];
    for (got, want) in cases {
        assert_eq!(got.expect("encode"), want);
    }
}

/// Builds a fresh store in a temp dir for each case of openraft's storage suite.
struct SuiteBuilder;

impl StoreBuilder<Config<Counters>, GroupLog<Counters>, GroupMachine<Counters>, tempfile::TempDir>
    for SuiteBuilder
{
    async fn build(
        &self,
    ) -> Result<
        (tempfile::TempDir, GroupLog<Counters>, GroupMachine<Counters>),
        openraft::StorageError<Config<Counters>>,
    > {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = GroupStore::open(store_path(&dir)).expect("open store");
        let liveness = Arc::new(());
        let log = GroupLog::new(store.clone(), 11, Arc::clone(&liveness));
        let machine = GroupMachine::new(store, 11, liveness);
        Ok((dir, log, machine))
    }
}

/// Paused time: the suite sleeps a second after each append whose callback it checks (eight
/// times); our callbacks run before `append` returns, so skipping the sleeps loses nothing.
#[tokio::test(start_paused = true)]
async fn openraft_storage_suite() {
    if let Err(error) = Suite::test_all(SuiteBuilder).await {
        panic!("openraft storage suite: {error}");
    }
}

/// The Raft store on the simulated disk: a power loss after acknowledged proposals keeps every
/// one of them (redb commits are fsynced before the proposal returns), whatever happens to the
/// unsynced tail.
#[tokio::test]
async fn acknowledged_proposals_survive_a_crash_of_the_simulated_disk() {
    for mode in [crate::WriterMode::Thread, crate::WriterMode::Inline] {
        proposals_survive_a_crash(mode).await;
    }
}

async fn proposals_survive_a_crash(mode: crate::WriterMode) {
    use malachi_log::{OpenMode, SimFaults, SimStorage, Storage};
    let sim = SimStorage::new(42);
    sim.set_faults(SimFaults {
        crash_keeps_unsynced_prefix: true,
        crash_tears_last_write: true,
        ..SimFaults::default()
    });
    let dir = std::path::Path::new("/node");
    malachi_log::create_dir_durable(&sim, std::path::Path::new("/"), dir).unwrap();
    let path = dir.join("raft.redb");
    let mut model = Counters::empty();
    {
        let file = sim.open(&path, OpenMode::CreateNew).unwrap();
        sim.sync_dir(dir).unwrap();
        let store = GroupStore::open_with_backend(crate::StorageFileBackend::new(file), mode)
            .expect("open store");
        let group = open_group(&store, 3, fast_config(16)).await;
        propose_adds(&group, &mut model, 50).await;
        // Power loss with the group still running: no clean shutdown, no final flush.
        sim.crash_now();
        let _ = group.shutdown().await;
    }
    sim.restart();
    let file = sim.open(&path, OpenMode::Existing).unwrap();
    let backend = crate::StorageFileBackend::after_restart(file).unwrap();
    let store = GroupStore::open_with_backend(backend, mode).expect("reopen store");
    let group = open_group(&store, 3, fast_config(16)).await;
    assert_eq!(group.read(|machine| machine.snapshot()), model.snapshot());
    group.shutdown().await.expect("shutdown");
}

/// Nodes of one process reaching each other's groups directly; a node taken `down` is
/// unreachable both ways, as a crashed broker is.
#[derive(Clone, Default)]
struct LocalNet {
    groups: Arc<std::sync::RwLock<BTreeMap<u64, Arc<RaftGroup<Counters>>>>>,
    /// Nodes cut off silently: messages to or from them never complete, as on a connection
    /// whose packets a firewall drops.
    silenced: Arc<std::sync::RwLock<BTreeSet<u64>>>,
}

impl LocalNet {
    fn down(&self, node_id: u64) -> Arc<RaftGroup<Counters>> {
        self.groups.write().unwrap().remove(&node_id).expect("node was up")
    }

    fn silence(&self, node_id: u64) {
        self.silenced.write().unwrap().insert(node_id);
    }
}

impl GroupTransport for LocalNet {
    fn send(&self, message: RaftMessage) -> TransportFuture {
        let silenced = self.silenced.read().unwrap();
        if silenced.contains(&message.source_node_id) || silenced.contains(&message.target_node_id)
        {
            return Box::pin(std::future::pending());
        }
        let groups = self.groups.read().unwrap();
        let (Some(_), Some(target)) =
            (groups.get(&message.source_node_id), groups.get(&message.target_node_id).cloned())
        else {
            return Box::pin(async { Err(TransportError::Unreachable("down".into())) });
        };
        Box::pin(async move {
            target
                .handle_message(message.kind, &message.payload, message.source_node_id)
                .await
                .map_err(|error| TransportError::Failed(error.to_string()))
        })
    }
}

async fn open_member(
    dir: &tempfile::TempDir,
    net: &LocalNet,
    node_id: u64,
    first_boot: FirstBoot,
) -> Arc<RaftGroup<Counters>> {
    let store = GroupStore::open(dir.path().join(format!("node-{node_id}.redb"))).unwrap();
    let transport: Arc<dyn GroupTransport> = Arc::new(net.clone());
    let group =
        RaftGroup::open_with_transport(&store, 7, node_id, fast_config(64), transport, first_boot)
            .await
            .unwrap();
    let group = Arc::new(group);
    net.groups.write().unwrap().insert(node_id, Arc::clone(&group));
    group
}

/// Three voters of group 7, node 1 leading.
async fn three_voters(dir: &tempfile::TempDir, net: &LocalNet) -> [Arc<RaftGroup<Counters>>; 3] {
    let first = open_member(dir, net, 1, FirstBoot::Initialize).await;
    let second = open_member(dir, net, 2, FirstBoot::AwaitLeader).await;
    let third = open_member(dir, net, 3, FirstBoot::AwaitLeader).await;
    first.add_member(2, true).await.unwrap();
    first.add_member(3, true).await.unwrap();
    [first, second, third]
}

/// Three voters: writes proposed on a follower are forwarded and readable there at once; the
/// leader's crash stalls writes only until the others elect a new one.
#[tokio::test]
async fn followers_forward_writes_and_survive_the_leaders_crash() {
    let dir = tempfile::tempdir().unwrap();
    let net = LocalNet::default();
    let first = open_member(&dir, &net, 1, FirstBoot::Initialize).await;
    let second = open_member(&dir, &net, 2, FirstBoot::AwaitLeader).await;
    let third = open_member(&dir, &net, 3, FirstBoot::AwaitLeader).await;
    // A joiner is nobody's voter until the leader adds it, and a follower cannot add anyone.
    assert!(second.voters().is_empty());
    assert!(matches!(second.add_member(3, true).await, Err(ConsensusError::NotLeader { .. })));
    first.add_member(2, true).await.unwrap();
    first.add_member(3, true).await.unwrap();
    // Adding a voter again changes nothing.
    first.add_member(3, true).await.unwrap();
    assert_eq!(first.voters(), [1, 2, 3].into());
    assert_eq!(first.leader().0, Some(1));

    assert_eq!(third.propose(add("a", 5)).await.unwrap(), 5);
    // Read-your-writes on the follower that forwarded.
    assert_eq!(third.read(|counters| counters.counts.get("a").copied()), Some(5));
    assert_eq!(second.propose(add("a", 1)).await.unwrap(), 6);

    let crashed = net.down(1);
    crashed.shutdown().await.unwrap();
    assert_eq!(second.propose(add("a", 1)).await.unwrap(), 7);
    // The other survivor writes through the new leader (or is it) and sees everything.
    assert_eq!(third.propose(add("a", 0)).await.unwrap(), 7);
    let (leader, term) = second.leader();
    assert!(matches!(leader, Some(2 | 3)), "{leader:?}");
    assert!(term > 1, "a new election happened");
    for group in [second, third] {
        group.shutdown().await.unwrap();
    }
}

/// With no quorum reachable, a proposal gives up after `propose_wait_ms` with a typed error,
/// never hangs.
#[tokio::test]
async fn a_minority_refuses_writes_in_bounded_time() {
    let dir = tempfile::tempdir().unwrap();
    let net = LocalNet::default();
    let [first, second, third] = three_voters(&dir, &net).await;
    for node in [1, 2] {
        net.down(node).shutdown().await.unwrap();
    }
    let refused = third.propose(add("a", 1)).await.unwrap_err();
    assert!(
        matches!(refused, ConsensusError::NotLeader { .. } | ConsensusError::OutcomeUnknown { .. }),
        "{refused:?}"
    );
    assert_eq!(third.read(|counters| counters.counts.get("a").copied()), None);
    third.shutdown().await.unwrap();
    drop((first, second));
}

/// A write forwarded to a leader that went silent (cut off, not dead) is answered as soon as
/// this node sees the leader deposed, not after the forward's whole timeout; the next write
/// goes to the new leader.
#[tokio::test]
async fn a_forward_to_a_silenced_leader_ends_with_its_leadership() {
    let dir = tempfile::tempdir().unwrap();
    let net = LocalNet::default();
    let [first, second, third] = three_voters(&dir, &net).await;
    assert_eq!(second.propose(add("a", 1)).await.unwrap(), 1);
    net.silence(1);
    // fast_config's forward timeout is 5 s; well before it, the followers elect another leader.
    let forwarded = tokio::time::timeout(Duration::from_millis(4_000), second.propose(add("a", 1)));
    match forwarded.await.expect("the forward waited out its timeout") {
        Err(ConsensusError::OutcomeUnknown { .. }) | Ok(_) => {}
        Err(other) => panic!("{other:?}"),
    }
    let count = third.propose(add("a", 0)).await.unwrap();
    assert!((1..=2).contains(&count), "{count}");
    assert!(matches!(second.leader().0, Some(2 | 3)));
    for group in [second, third] {
        group.shutdown().await.unwrap();
    }
    drop(first);
}

/// A read barrier on any member waits until that member has applied what the leader had
/// committed; with the leader gone and no quorum left, it answers `NotLeader`, never hangs.
#[tokio::test]
async fn a_read_barrier_catches_a_member_up_or_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let net = LocalNet::default();
    let [first, second, third] = three_voters(&dir, &net).await;
    for round in 1..=20u64 {
        first.propose(add("a", 1)).await.unwrap();
        for member in [&first, &second, &third] {
            member.read_barrier().await.unwrap();
            assert_eq!(member.read(|counters| counters.counts.get("a").copied()), Some(round));
        }
    }
    for node in [1, 2] {
        net.down(node).shutdown().await.unwrap();
    }
    let refused = tokio::time::timeout(Duration::from_secs(20), third.read_barrier());
    let refused = refused.await.expect("the barrier gave up in bounded time");
    assert!(matches!(refused, Err(ConsensusError::NotLeader { .. })), "{refused:?}");
    third.shutdown().await.unwrap();
    drop((first, second));
}

/// A leader hands its leadership to a voter: that voter leads in a later term, everything
/// committed before is there, and writes go on through any member. A transfer to a node
/// that is not a voter leaves the leader leading.
#[tokio::test]
async fn the_leadership_moves_to_the_voter_it_is_handed_to() {
    let dir = tempfile::tempdir().unwrap();
    let net = LocalNet::default();
    let [first, second, third] = three_voters(&dir, &net).await;
    assert_eq!(first.propose(add("a", 3)).await.unwrap(), 3);
    let (_, term_before) = first.leader();
    first.transfer_leader(3).await.unwrap();
    for _ in 0..2_000 {
        if third.is_leader() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(third.is_leader(), "node 3 did not take the leadership: {:?}", third.leader());
    assert!(third.leader().1 > term_before);
    assert_eq!(third.read(|counters| counters.counts.get("a").copied()), Some(3));
    assert_eq!(first.propose(add("a", 1)).await.unwrap(), 4, "forwarded to the new leader");
    third.transfer_leader(9).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(second.propose(add("a", 1)).await.unwrap(), 5);
    for group in [first, second, third] {
        group.shutdown().await.unwrap();
    }
}

/// How long a voter stays cut off in [`a_voter_back_from_an_absence_leaves_the_leader_leading`]:
/// many election timeouts of `fast_config` (50-100 ms).
const ABSENCE_MS: u64 = 1_000;

/// A voter that was away (a broker restarting, a cut link) comes back without unseating the
/// leader: while it hears no leader it asks whether it could win before it raises its term
/// (Pre-Vote), and a majority that hears its leader refuses. Without Pre-Vote it came back with
/// a term ten elections higher, and the leader of every group stepped down for it.
#[tokio::test]
async fn a_voter_back_from_an_absence_leaves_the_leader_leading() {
    let dir = tempfile::tempdir().unwrap();
    let net = LocalNet::default();
    let [first, second, third] = three_voters(&dir, &net).await;
    assert_eq!(second.propose(add("a", 1)).await.unwrap(), 1);
    let before = first.leader();
    assert_eq!(before.0, Some(1));
    let away = net.down(3);
    tokio::time::sleep(Duration::from_millis(ABSENCE_MS)).await;
    assert_eq!(second.propose(add("a", 1)).await.unwrap(), 2, "written while it was away");
    net.groups.write().unwrap().insert(3, Arc::clone(&away));
    third.read_barrier().await.unwrap();
    assert_eq!(third.read(|counters| counters.counts.get("a").copied()), Some(2));
    assert_eq!(second.propose(add("a", 1)).await.unwrap(), 3);
    assert_eq!(third.leader(), before, "the returning voter follows the same leader and term");
    assert_eq!(first.leader(), before, "the leader kept its leadership and term");
    assert_eq!(second.leader(), before);
    for group in [first, second, third] {
        group.shutdown().await.unwrap();
    }
}
