//! The seeded workload: clients that produce, fetch, commit, reshape and churn topics over the
//! simulated network, recording every operation in the history the checker judges.
//!
//! Actors run as tasks on the clients' paused runtime. Each draws from its own seeded stream,
//! so what one actor does never depends on how often another drew. An operation is invoked in
//! the history before its request is sent and completed when its answer (or failure) arrives:
//! `Ok`, `Fail` only when the server's answer proves nothing was done, `Info` otherwise.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use malachi_broker::node::Broker;
use malachi_check::{
    Commit, Fetch, GroupRead, History, Op, OpId, Produce, ReadRecord, WrittenRecord,
};
use malachi_client::{Client, ClientConfig, ClientError, FetchOptions, Reason, Record};
use malachi_log::rng::SeededRng;
use tokio::task::JoinSet;

use crate::net::SimNet;
use crate::node::SimClock;

/// Runs `request` (an expression over `client`) until it is `Ok`, on a new connection after
/// each failure.
macro_rules! until_ok {
    ($ctx:expr, $client:ident, $request:expr) => {
        loop {
            let result: Result<(), ClientError> = $request;
            if result.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            $client = $ctx.connect().await.into();
        }
    };
}

/// The password of the simulated admin account.
pub use malachi_broker::testing::ADMIN_PASSWORD;
/// The topic producers, cursor readers, the group and the reshaper share.
pub const ORDERS: &str = "orders";
/// The topic bound to a small retention policy.
pub const EVENTS: &str = "events";
/// The topic the churn actor deletes and re-creates.
pub const CHURN: &str = "churn";

const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// What every actor shares.
pub struct Ctx {
    pub net: SimNet,
    /// The nodes clients connect to: each new connection goes to the next in turn, so a
    /// client whose node is down finds another.
    pub node_ids: Vec<u64>,
    pub clock: Arc<SimClock>,
    pub history: Mutex<History>,
    /// Set when the world's fault phase ends: actors finish what they hold and return.
    pub stopping: AtomicBool,
    /// The running node's broker, for observations the wire has no request for.
    pub broker: Mutex<Option<Arc<Broker>>>,
    /// Broken promises the checker's model has no name for (an old cursor accepted by a
    /// re-created topic, ...).
    pub findings: Mutex<Vec<String>>,
    /// Admin actions and their answers, hashed into the trace.
    pub notes: Mutex<Vec<String>>,
    next_client_id: AtomicU64,
}

impl Ctx {
    pub fn new(net: SimNet, node_ids: Vec<u64>, clock: Arc<SimClock>) -> Ctx {
        assert!(!node_ids.is_empty(), "clients need a node");
        Ctx {
            net,
            node_ids,
            clock,
            history: Mutex::new(History::new()),
            stopping: AtomicBool::new(false),
            broker: Mutex::new(None),
            findings: Mutex::new(Vec::new()),
            notes: Mutex::new(Vec::new()),
            next_client_id: AtomicU64::new(1),
        }
    }

    fn clock_ms(&self) -> u64 {
        use malachi_broker::notify::Clock;
        self.clock.now_ms()
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    fn invoke(&self, process: u64, op: Op) -> OpId {
        self.history.lock().expect("history lock poisoned").invoke(process, op)
    }

    fn ok(&self, op_id: OpId) {
        self.history.lock().expect("history lock poisoned").ok(op_id);
    }

    fn ok_with(&self, op_id: OpId, op: Op) {
        self.history.lock().expect("history lock poisoned").ok_with(op_id, op);
    }

    fn fail(&self, op_id: OpId) {
        self.history.lock().expect("history lock poisoned").fail(op_id);
    }

    fn info(&self, op_id: OpId) {
        self.history.lock().expect("history lock poisoned").info(op_id);
    }

    fn note(&self, line: String) {
        self.notes.lock().expect("notes lock poisoned").push(line);
    }

    fn finding(&self, line: String) {
        self.findings.lock().expect("findings lock poisoned").push(line);
    }

    /// One login attempt over a new simulated connection.
    async fn try_connect(&self) -> Result<Client, ClientError> {
        let client_id = self.next_client_id.fetch_add(1, Ordering::SeqCst);
        let node_id = self.node_ids[(client_id % self.node_ids.len() as u64) as usize];
        let (read, write) = self.net.connect(client_id, node_id)?;
        let config = ClientConfig::new(format!("sim-client-{client_id}"))
            .credentials("admin", ADMIN_PASSWORD)
            .connect_timeout(REQUEST_TIMEOUT)
            .request_timeout(REQUEST_TIMEOUT);
        Client::connect_over(config, Box::new(read), Box::new(write)).await
    }

    /// Logs in, retrying every 20 ms until the node answers.
    async fn connect(&self) -> Client {
        let mut failures = 0u64;
        loop {
            match self.try_connect().await {
                Ok(client) => return client,
                Err(error) => {
                    failures += 1;
                    if failures.is_power_of_two() {
                        self.note(format!("login failed {failures} times: {}", error_name(&error)));
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The outcome an error tells: `Fail` only when the server's answer proves the request did
/// nothing. A produce that failed in storage may have appended to some ranges and not others.
fn produce_failed_for_sure(error: &ClientError) -> bool {
    matches!(error.reason(), Some(Reason::NoSuchTopic))
}

/// A produce batch: 1-5 records over a small key space (some keyless), values unique by
/// producer and sequence.
fn batch(
    rng: &mut SeededRng,
    producer: u64,
    prefix: &str,
    sequence: &mut u64,
) -> Vec<WrittenRecord> {
    let count = 1 + rng.below(5);
    (0..count)
        .map(|_| {
            *sequence += 1;
            let key = (!rng.chance(1, 8)).then(|| format!("k{}", rng.below(12)).into_bytes());
            WrittenRecord {
                key,
                value: format!("{prefix}{producer}-{sequence}").into_bytes(),
                producer,
                sequence: *sequence,
            }
        })
        .collect()
}

fn wire_records(records: &[WrittenRecord], now_ms: u64) -> Vec<Record> {
    records
        .iter()
        .map(|record| Record {
            key: record.key.clone().map(Bytes::from),
            value: Bytes::from(record.value.clone()),
            timestamp_ms: now_ms,
            headers: Vec::new(),
        })
        .collect()
}

fn read_records(records: &[Record]) -> Vec<ReadRecord> {
    records
        .iter()
        .map(|record| ReadRecord {
            key: record.key.as_ref().map(|key| key.to_vec()),
            value: record.value.to_vec(),
        })
        .collect()
}

fn cursor_text(cursor: &Bytes) -> String {
    String::from_utf8_lossy(cursor).into_owned()
}

/// How a producer waits for its acknowledgements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProducerMode {
    /// One request at a time; a request with an unknown outcome is re-sent (up to 3 times)
    /// on a new connection.
    AckEach,
    /// Up to `depth` requests in flight on one connection; nothing is re-sent.
    Pipelined { depth: usize },
}

/// Sends one produce and records its outcome; `Err` when the connection should be replaced.
async fn produce_once(
    ctx: &Ctx,
    client: &Client,
    process: u64,
    topic: &str,
    history_topic: &str,
    records: &[WrittenRecord],
    retry_of: Option<OpId>,
) -> Result<OpId, (OpId, bool)> {
    let op = Op::Produce(Produce {
        topic: history_topic.to_string(),
        records: records.to_vec(),
        retry_of,
    });
    let op_id = ctx.invoke(process, op);
    match client.produce(topic, wire_records(records, ctx.clock_ms())).await {
        Ok(_) => {
            ctx.ok(op_id);
            Ok(op_id)
        }
        Err(error) if produce_failed_for_sure(&error) => {
            ctx.fail(op_id);
            Err((op_id, false))
        }
        Err(_) => {
            ctx.info(op_id);
            Err((op_id, true))
        }
    }
}

/// Sends `records` until an attempt's outcome is known: up to four attempts, each retry on a new
/// connection and marked as a retry of the first. `topics` is the wire topic and its name in the
/// history.
async fn produce_with_retries(
    ctx: &Ctx,
    client: &mut Arc<Client>,
    process: u64,
    (topic, history_topic): (&str, &str),
    records: &[WrittenRecord],
) {
    let mut retry_of = None;
    for _attempt in 0..4 {
        match produce_once(ctx, client, process, topic, history_topic, records, retry_of).await {
            Ok(_) | Err((_, false)) => return,
            Err((op_id, true)) => {
                retry_of = Some(retry_of.unwrap_or(op_id));
                *client = Arc::new(ctx.connect().await);
            }
        }
    }
}

/// Creates `topic`; one that already exists is as good.
async fn create_if_missing(client: &Client, topic: &str) -> Result<(), ClientError> {
    match client.create_topic(topic).await {
        Err(error) if error.reason() != Some(Reason::AlreadyExists) => Err(error),
        _ => Ok(()),
    }
}

/// Produces until the world stops, then returns.
pub async fn producer(
    ctx: Arc<Ctx>,
    producer_id: u64,
    topic: &'static str,
    mode: ProducerMode,
    think_ms: u64,
    seed: u64,
) {
    let mut rng = SeededRng::new(seed);
    let mut sequence = 0;
    let process = producer_id;
    let mut client = Arc::new(ctx.connect().await);
    while !ctx.stopping() {
        match mode {
            ProducerMode::AckEach => {
                let records = batch(&mut rng, producer_id, "p", &mut sequence);
                produce_with_retries(&ctx, &mut client, process, (topic, topic), &records).await;
            }
            ProducerMode::Pipelined { depth } => {
                let mut in_flight = JoinSet::new();
                let mut broken = false;
                for _ in 0..depth {
                    let records = batch(&mut rng, producer_id, "p", &mut sequence);
                    let (ctx, client) = (Arc::clone(&ctx), Arc::clone(&client));
                    in_flight.spawn(async move {
                        produce_once(&ctx, &client, process, topic, topic, &records, None).await
                    });
                }
                while let Some(done) = in_flight.join_next().await {
                    broken |= matches!(done, Ok(Err((_, true))));
                }
                if broken {
                    client = Arc::new(ctx.connect().await);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.below(think_ms + 1))).await;
    }
}

/// Reads `topic` by cursor: one chain, restarted from the start now and then.
pub async fn cursor_reader(ctx: Arc<Ctx>, reader: u64, topic: &'static str, seed: u64) {
    let mut rng = SeededRng::new(seed);
    let mut client = ctx.connect().await;
    let mut cursor: Option<Bytes> = None;
    while !ctx.stopping() {
        if rng.chance(1, 40) {
            cursor = None;
        }
        let cursor_in = cursor.as_ref().map(cursor_text);
        let op_id = ctx.invoke(
            reader,
            Op::Fetch(Fetch {
                topic: topic.to_string(),
                reader,
                cursor_in: cursor_in.clone(),
                records: Vec::new(),
                cursor_out: String::new(),
                skipped: 0,
            }),
        );
        let options = FetchOptions {
            cursor: cursor.clone(),
            max: 1 + rng.below(40) as u32,
            wait_ms: rng.below(200) as u32,
            ..FetchOptions::default()
        };
        match client.fetch(topic, &options).await {
            Ok((records, next)) => {
                ctx.ok_with(
                    op_id,
                    Op::Fetch(Fetch {
                        topic: topic.to_string(),
                        reader,
                        cursor_in,
                        records: read_records(&records),
                        cursor_out: cursor_text(&next),
                        skipped: 0,
                    }),
                );
                cursor = Some(next);
            }
            Err(_) => {
                ctx.info(op_id);
                client = ctx.connect().await;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.below(30))).await;
    }
}

/// One group member: fetch its share, commit the page's cursor, observe the committed
/// positions.
pub async fn group_member(ctx: Arc<Ctx>, process: u64, topic: &'static str, seed: u64) {
    let mut rng = SeededRng::new(seed);
    let mut client = ctx.connect().await;
    let group = "g1";
    let mut reader = process * 1_000_000;
    while !ctx.stopping() {
        reader += 1;
        let options = FetchOptions {
            group: Some(group.to_string()),
            member: Some("m0".to_string()),
            max: 1 + rng.below(40) as u32,
            wait_ms: rng.below(100) as u32,
            ..FetchOptions::default()
        };
        let fetch = |records: Vec<ReadRecord>, cursor_out: String| {
            Op::Fetch(Fetch {
                topic: topic.to_string(),
                reader,
                cursor_in: None,
                records,
                cursor_out,
                skipped: 0,
            })
        };
        let op_id = ctx.invoke(process, fetch(Vec::new(), String::new()));
        let next = match client.fetch(topic, &options).await {
            Ok((records, next)) => {
                ctx.ok_with(op_id, fetch(read_records(&records), cursor_text(&next)));
                next
            }
            Err(_) => {
                ctx.info(op_id);
                client = ctx.connect().await;
                continue;
            }
        };
        let commit = Op::Commit(Commit {
            topic: topic.to_string(),
            group: group.to_string(),
            cursor: cursor_text(&next),
        });
        let op_id = ctx.invoke(process, commit);
        match client.commit(topic, group, &next).await {
            Ok(()) => ctx.ok(op_id),
            Err(_) => {
                ctx.info(op_id);
                client = ctx.connect().await;
            }
        }
        observe_group(&ctx, process, topic, group);
        tokio::time::sleep(Duration::from_millis(rng.below(50))).await;
    }
}

/// Reads the group's committed positions straight from the node (the protocol has no request
/// for them yet).
fn observe_group(ctx: &Ctx, process: u64, topic: &str, group: &str) {
    let read = |position| {
        Op::GroupRead(GroupRead { topic: topic.to_string(), group: group.to_string(), position })
    };
    let op_id = ctx.invoke(process, read(Vec::new()));
    let broker = ctx.broker.lock().expect("broker lock poisoned").clone();
    match broker.map(|broker| broker.groups().group_positions(topic, group)) {
        Some(Ok(position)) => ctx.ok_with(op_id, read(position)),
        _ => ctx.info(op_id),
    }
}

/// Splits and merges `topic`'s ranges by hand at random.
pub async fn reshaper(ctx: Arc<Ctx>, topic: &'static str, pause_ms: u64, seed: u64) {
    let mut rng = SeededRng::new(seed);
    let mut client = ctx.connect().await;
    while !ctx.stopping() {
        tokio::time::sleep(Duration::from_millis(1 + rng.below(pause_ms))).await;
        let described = match client.describe_topic(topic).await {
            Ok(described) => described,
            Err(_) => {
                client = ctx.connect().await;
                continue;
            }
        };
        let active: Vec<u32> = described
            .ranges
            .iter()
            .filter(|range| range.state == malachi_client::RangeState::Active)
            .map(|range| range.range_id)
            .collect();
        if active.is_empty() {
            continue;
        }
        let answer = if rng.chance(1, 2) && active.len() > 1 {
            let at = rng.below(active.len() as u64 - 1) as usize;
            let (left, right) = (active[at], active[at + 1]);
            client
                .merge_ranges(topic, left, right)
                .await
                .map(|merged| format!("merged {left}+{right} -> {merged}"))
        } else {
            let range = active[rng.below(active.len() as u64) as usize];
            client.split_range(topic, range).await.map(|(a, b)| format!("split {range} -> {a},{b}"))
        };
        ctx.note(match answer {
            Ok(done) => done,
            Err(error) => format!("reshape refused: {}", error_name(&error)),
        });
    }
}

/// An error's name for the trace: the reason, never detail text.
fn error_name(error: &ClientError) -> String {
    match error {
        ClientError::Server { reason, .. } => reason.split(':').next().unwrap_or("").to_string(),
        ClientError::Transport(error) => format!("transport {:?}", error.kind()),
        ClientError::Protocol(_) => "protocol".to_string(),
        ClientError::Tls(_) => "tls".to_string(),
        ClientError::Timeout => "timeout".to_string(),
        ClientError::Closed => "closed".to_string(),
    }
}

/// Deletes and re-creates one topic, round after round. Each incarnation `k` is the history
/// topic `churn#k`, produced, read and drained before it is deleted: a record of an earlier
/// incarnation read from a later one is then a mismatched or phantom read.
pub async fn churner(ctx: Arc<Ctx>, process: u64, seed: u64) {
    let mut rng = SeededRng::new(seed);
    let mut client = Arc::new(ctx.connect().await);
    let mut sequence = 0;
    let mut old_cursor: Option<Bytes> = None;
    for incarnation in 1.. {
        let history_topic = format!("{CHURN}#{incarnation}");
        until_ok!(ctx, client, create_if_missing(&client, CHURN).await);
        if let Some(cursor) = old_cursor.take() {
            check_old_cursor_refused(&ctx, &client, cursor).await;
        }
        for _ in 0..1 + rng.below(6) {
            let records = batch(&mut rng, process, &format!("c{incarnation}-"), &mut sequence);
            let topics = (CHURN, history_topic.as_str());
            produce_with_retries(&ctx, &mut client, process, topics, &records).await;
        }
        old_cursor = drain_over_wire(&ctx, &mut client, process, CHURN, &history_topic).await;
        if ctx.stopping() {
            return;
        }
        until_ok!(
            ctx,
            client,
            match client.delete_topic(CHURN).await {
                Err(error) if error.reason() != Some(Reason::NoSuchTopic) => Err(error),
                _ => Ok(()),
            }
        );
        ctx.note(format!("churn: incarnation {incarnation} deleted"));
    }
}

/// A cursor of a deleted incarnation must be refused by the new one, not read from.
async fn check_old_cursor_refused(ctx: &Ctx, client: &Client, cursor: Bytes) {
    let options = FetchOptions { cursor: Some(cursor), max: 10, ..FetchOptions::default() };
    match client.fetch(CHURN, &options).await {
        Ok((records, _)) if !records.is_empty() => ctx.finding(format!(
            "a cursor of a deleted incarnation of {CHURN} read {} records from its successor",
            records.len()
        )),
        _ => {}
    }
}

/// Reads a whole topic from its start through the protocol as one `Drain` (retention must not
/// apply to it: the protocol reports no skipped count). Returns the first page's cursor.
async fn drain_over_wire(
    ctx: &Ctx,
    client: &mut Arc<Client>,
    process: u64,
    topic: &str,
    history_topic: &str,
) -> Option<Bytes> {
    loop {
        let op_id = ctx.invoke(
            process,
            Op::Drain(malachi_check::Drain {
                topic: history_topic.to_string(),
                records: Vec::new(),
                skipped: 0,
            }),
        );
        let mut records = Vec::new();
        let mut cursor: Option<Bytes> = None;
        let mut first_cursor = None;
        let outcome = loop {
            let options =
                FetchOptions { cursor: cursor.clone(), max: 500, ..FetchOptions::default() };
            match client.fetch(topic, &options).await {
                Ok((page, next)) => {
                    first_cursor.get_or_insert_with(|| next.clone());
                    if page.is_empty() {
                        break Ok(());
                    }
                    records.extend(read_records(&page));
                    cursor = Some(next);
                }
                Err(error) => break Err(error),
            }
        };
        match outcome {
            Ok(()) => {
                ctx.ok_with(
                    op_id,
                    Op::Drain(malachi_check::Drain {
                        topic: history_topic.to_string(),
                        records,
                        skipped: 0,
                    }),
                );
                return first_cursor;
            }
            Err(error) => {
                ctx.info(op_id);
                ctx.note(format!("drain of {history_topic} failed: {}", error_name(&error)));
                tokio::time::sleep(Duration::from_millis(20)).await;
                *client = Arc::new(ctx.connect().await);
            }
        }
    }
}

/// The final drain of `topic` through the log API on the node (which reports retention's
/// skipped count). Runs on the node's runtime.
/// Produces `record` through the log API on the node: the healed node's proof of progress.
pub async fn produce_on_node(
    broker: Arc<Broker>,
    topic: String,
    record: WrittenRecord,
) -> Result<(), String> {
    let record = malachi_log::Record {
        key: record.key.map(Bytes::from),
        value: Bytes::from(record.value),
        headers: Vec::new(),
        timestamp_ms: 0,
        tombstone: false,
    };
    let mut spread = malachi_broker::produce::Spread::default();
    broker.produce(&topic, vec![record], &mut spread).await.map(|_| ()).map_err(|e| e.to_string())
}

pub async fn drain_on_node(
    broker: Arc<Broker>,
    topic: String,
) -> Result<(Vec<ReadRecord>, u64), String> {
    let mut records = Vec::new();
    let mut skipped = 0;
    let mut cursor: Option<String> = None;
    loop {
        let args = malachi_broker::fetch::FetchArgs {
            topic: &topic,
            cursor: cursor.as_deref().map(str::as_bytes),
            max: 1000,
            ..Default::default()
        };
        let page = broker.fetch(&args).await.map_err(|error| error.to_string())?;
        skipped += page.skipped;
        if page.records.is_empty() {
            return Ok((records, skipped));
        }
        records.extend(page.records.iter().map(|record| ReadRecord {
            key: record.key.as_ref().map(|key| key.to_vec()),
            value: record.value.to_vec(),
        }));
        cursor = Some(page.next_cursor);
    }
}

/// Sets up the topics and the retention policy before the actors start.
pub async fn setup(ctx: Arc<Ctx>, retention_bytes: u64) {
    let mut client = ctx.connect().await;
    for topic in [ORDERS, EVENTS] {
        until_ok!(ctx, client, create_if_missing(&client, topic).await);
    }
    let field = malachi_client::PolicyField {
        name: Some(Bytes::from_static(b"retention.max_bytes")),
        value: malachi_client::PolicyValue::Integer(retention_bytes),
    };
    until_ok!(ctx, client, client.define_policy("short", vec![field.clone()]).await);
    until_ok!(ctx, client, client.bind_topic_policy(EVENTS, Some("short")).await);
}
