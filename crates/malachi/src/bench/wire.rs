//! `malachi bench wire`: load on a running broker over the real protocol, with
//! `malachi-client`. Start the broker separately (`malachi serve`); this only generates load
//! and measures what comes back.
//!
//! Each connection runs a closed loop (one request outstanding at a time): producers send
//! batches of `--batch` records and time each acknowledgement; consumers page through the
//! topic with cursors and time each fetch. `--mode mixed` splits the connections between the
//! two, consumers long-polling behind the producers. Before the run it measures the protocol's
//! floor on the same connection: round trips of a commit without a cursor, which the broker
//! answers without touching storage; the ack latency is printed next to it as a ratio.
//!
//! Retryable refusals (`overloaded`, `not_owner`, ...) are counted and retried after a short
//! pause; any other error stops the run.
//!
//! `--ranges 1,4,32,256` runs the same load once per range count, each on a fresh topic (or
//! `--topics` fresh topics sharing the ranges), and prints each run's throughput as a ratio of
//! the first run's: the first value is the baseline of the same invocation. When the broker's
//! data directory is on this machine (`--data-dir`), the device's cache flushes are counted
//! from `/sys/dev/block` and reported per produce request.

use std::time::Duration;

use bytes::Bytes;
use clap::ValueEnum;
use malachi_client::{Client, ClientError, FetchOptions, Reason, Record, Request, now_ms};
use malachi_wire::messages::CommitRequest;
use serde::Serialize;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::histogram::Latencies;
use crate::cli::settings::{ConnectionArgs, Settings};

#[derive(clap::Args, Debug)]
pub struct WireArgs {
    #[command(flatten)]
    connection: ConnectionArgs,
    /// Connections, each running one request at a time.
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub(super) connections: u32,
    /// Records per produce request.
    #[arg(long, default_value_t = 100, value_name = "R")]
    batch: u32,
    /// Bytes of each record's value.
    #[arg(long, default_value_t = 100, value_name = "B")]
    record_bytes: u32,
    /// Distinct keys, used round-robin; 0 sends records without keys.
    #[arg(long, default_value_t = 1000, value_name = "K")]
    keys: u32,
    /// Seconds of load.
    #[arg(long, default_value_t = 10.0, value_name = "S")]
    seconds: f64,
    #[arg(long, value_enum, default_value_t = Mode::Produce)]
    mode: Mode,
    /// Topic to use; created if missing.
    #[arg(long, default_value = "malachi-bench")]
    pub(super) topic: String,
    /// Ranges of the topic (a power of two), or a list of them: one run per value, each on
    /// fresh topics named after the topic, the count and the run.
    #[arg(long, value_name = "N,...", value_delimiter = ',')]
    ranges: Vec<u32>,
    /// Topics the connections spread over (connection i uses topic i mod N); with `--ranges`,
    /// each topic gets the range count divided by this.
    #[arg(long, default_value_t = 1, value_name = "N")]
    topics: u32,
    /// The broker's data directory, if on this machine: its disk's cache flushes are counted.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<std::path::PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum Mode {
    /// Every connection produces.
    Produce,
    /// Every connection reads the topic from the start, over and over.
    Consume,
    /// Half the connections (rounded up) produce, the others follow the topic.
    Mixed,
}

/// The run's results.
#[derive(Debug, Serialize)]
pub(super) struct Figures {
    mode: Mode,
    connections: u32,
    batch: u32,
    record_bytes: u32,
    keys: u32,
    seconds: f64,
    produced_records: u64,
    produced_records_per_s: f64,
    pub(super) produced_mb_per_s: f64,
    ack_p50_us: u64,
    pub(super) ack_p99_us: u64,
    ack_p999_us: u64,
    consumed_records: u64,
    consumed_records_per_s: f64,
    consumed_mb_per_s: f64,
    fetch_p50_us: u64,
    fetch_p99_us: u64,
    fetch_p999_us: u64,
    /// The floor: a round trip the broker answers without storage work.
    round_trip_p50_us: u64,
    round_trip_p99_us: u64,
    /// `ack_p50_us / round_trip_p50_us`.
    ack_to_round_trip_p50: f64,
    retried_errors: u64,
    /// The retried errors by the server's reason.
    retried_reasons: std::collections::BTreeMap<String, u64>,
    /// The longest any producing connection went without an acknowledgement (from the start
    /// of the load or its last one), retries included: the stall a failover costs.
    longest_ack_gap_ms: u64,
    /// Ranges over all topics of this run (0: an existing topic, as it was).
    ranges: u32,
    topics: u32,
    produce_requests: u64,
    /// Cache flushes the broker's disk completed per produce request (`--data-dir`).
    disk_flushes_per_request: Option<f64>,
    /// Produced MB/s over the first run's, with `--ranges`.
    mb_per_s_vs_first: f64,
}

/// What one connection did.
#[derive(Debug, Default)]
struct Tally {
    requests: u64,
    records: u64,
    /// Key and value bytes.
    bytes: u64,
    latencies: Latencies,
    retried_errors: u64,
    retried_reasons: std::collections::BTreeMap<String, u64>,
    longest_ack_gap_us: u64,
}

/// Round trips measured for the floor.
const ROUND_TRIPS: u32 = 200;
/// Logins retried on a retryable refusal before the run stops.
const LOGIN_RETRIES: u32 = 500;
/// Pause before retrying a retryable refusal.
const RETRY_PAUSE: Duration = Duration::from_millis(20);
/// Long poll of a consumer that follows producers (mixed mode).
const FOLLOW_WAIT_MS: u32 = 200;
/// Records per range per fetch.
const FETCH_RECORDS: u32 = 1000;

pub fn run(args: &WireArgs) -> Result<(), String> {
    if args.connections == 0 || args.batch == 0 || args.seconds.is_nan() || args.seconds <= 0.0 {
        return Err("--connections, --batch and --seconds must be positive".into());
    }
    let runtime = super::runtime()?;
    let runs: Vec<Option<u32>> = if args.ranges.is_empty() {
        vec![None]
    } else {
        args.ranges.iter().copied().map(Some).collect()
    };
    let mut first_mb_per_s = None;
    for (run, ranges) in runs.into_iter().enumerate() {
        let topics = topic_names(args, ranges, run);
        let mut figures = runtime.block_on(measure(args, &topics, ranges))?;
        let first = *first_mb_per_s.get_or_insert(figures.produced_mb_per_s);
        figures.mb_per_s_vs_first =
            if first > 0.0 { figures.produced_mb_per_s / first } else { 0.0 };
        if args.json {
            println!("{}", serde_json::to_string(&figures).expect("figures serialize"));
        } else {
            print_text(args, &figures);
        }
    }
    Ok(())
}

/// The topics of one run: the named topic as it is without `--ranges`, else fresh ones.
fn topic_names(args: &WireArgs, ranges: Option<u32>, run: usize) -> Vec<String> {
    let stamp = now_ms();
    (0..args.topics.max(1))
        .map(|index| match (ranges, args.topics) {
            (None, 1) => args.topic.clone(),
            (None, _) => format!("{}-{index}", args.topic),
            (Some(ranges), _) => format!("{}-{ranges}r-{stamp}-{run}-{index}", args.topic),
        })
        .collect()
}

impl WireArgs {
    pub(super) fn connection(&self) -> &ConnectionArgs {
        &self.connection
    }
}

/// `args.connections` logged-in clients.
pub(super) async fn connect_all(args: &WireArgs) -> Result<Vec<Client>, String> {
    let settings = Settings::load(&args.connection)?;
    let mut clients = Vec::new();
    for _ in 0..args.connections {
        let client = login(&settings).await;
        clients.push(client.map_err(|error| settings.explain("login", None, &error))?);
    }
    Ok(clients)
}

async fn measure(
    args: &WireArgs,
    topics: &[String],
    ranges: Option<u32>,
) -> Result<Figures, String> {
    let clients = connect_all(args).await?;
    measure_with(args, topics, ranges, clients).await
}

/// One run of the load over `clients`, which must be `args.connections` logged-in clients.
pub(super) async fn measure_with(
    args: &WireArgs,
    topics: &[String],
    ranges: Option<u32>,
    clients: Vec<Client>,
) -> Result<Figures, String> {
    let settings = Settings::load(&args.connection)?;
    let fail = |action: &str, error: ClientError| settings.explain(action, None, &error);
    let per_topic = ranges.map(|ranges| (ranges / topics.len() as u32).max(1));
    for topic in topics {
        ensure_topic(&clients[0], topic, per_topic)
            .await
            .map_err(|error| fail("create the topic", error))?;
    }
    let mut floor = round_trips(&clients[0], &topics[0]).await;
    let flushes_before = args.data_dir.as_deref().and_then(disk_flushes);
    let producers = match args.mode {
        Mode::Produce => clients.len(),
        Mode::Consume => 0,
        Mode::Mixed => clients.len().div_ceil(2),
    };
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(args.seconds);
    let mut produced = JoinSet::new();
    let mut consumed = JoinSet::new();
    for (index, client) in clients.into_iter().enumerate() {
        let load = Load::new(args, &topics[index % topics.len()], index, deadline);
        if index < producers {
            produced.spawn(load.produce(client));
        } else {
            consumed.spawn(load.consume(client, args.mode == Mode::Mixed));
        }
    }
    let produced = gather(produced).await.map_err(|error| fail("produce", error))?;
    let consumed = gather(consumed).await.map_err(|error| fail("fetch", error))?;
    if args.mode == Mode::Consume && consumed.records == 0 {
        return Err(format!("{} holds no records: run `--mode produce` first", topics[0]));
    }
    let seconds = started.elapsed().as_secs_f64();
    let flushes = match (flushes_before, args.data_dir.as_deref().and_then(disk_flushes)) {
        (Some(before), Some(after)) => Some(after.saturating_sub(before)),
        _ => None,
    };
    let mut figures = figures(args, seconds, produced, consumed, &mut floor);
    figures.ranges = per_topic.map_or(0, |ranges| ranges * topics.len() as u32);
    figures.topics = topics.len() as u32;
    figures.disk_flushes_per_request =
        flushes.map(|flushes| flushes as f64 / figures.produce_requests.max(1) as f64);
    Ok(figures)
}

/// A logged-in client, retrying refusals that say "later" (`overloaded` while strangers flood
/// the password checks, in `bench hostile`) for up to [`LOGIN_RETRIES`] pauses.
pub(super) async fn login(settings: &Settings) -> Result<Client, ClientError> {
    let mut attempt = 0;
    loop {
        match Client::connect(settings.client_config()).await {
            Err(error) if error.is_retryable() && attempt < LOGIN_RETRIES => {
                attempt += 1;
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            outcome => return outcome,
        }
    }
}

/// Cache flushes the disk holding `dir` has completed (`/sys/dev/block/<dev>/stat`, field 16;
/// a partition's counts are its disk's). `None` where the kernel does not say.
fn disk_flushes(dir: &std::path::Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let device = std::fs::metadata(dir).ok()?.dev();
    let (major, minor) = (libc::major(device), libc::minor(device));
    let base = std::path::PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    let stat =
        if base.join("partition").exists() { base.join("../stat") } else { base.join("stat") };
    let text = std::fs::read_to_string(stat).ok()?;
    text.split_whitespace().nth(15)?.parse().ok()
}

async fn ensure_topic(
    client: &Client,
    topic: &str,
    ranges: Option<u32>,
) -> Result<(), ClientError> {
    let created = match ranges {
        None => client.create_topic(topic).await,
        Some(ranges) => client.create_topic_with_ranges(topic, ranges).await,
    };
    match created {
        Err(error) if error.reason() == Some(Reason::AlreadyExists) => Ok(()),
        other => other,
    }
}

/// Sequential commits without a cursor: answered ok with no storage work (wire-protocol.md
/// section 3.3). Empty if the broker refuses them.
async fn round_trips(client: &Client, topic: &str) -> Latencies {
    let mut latencies = Latencies::default();
    for _ in 0..ROUND_TRIPS {
        let request = CommitRequest {
            topic: Some(Bytes::copy_from_slice(topic.as_bytes())),
            group: Some(Bytes::from_static(b"malachi-bench")),
            cursor: None,
        };
        let sent = Instant::now();
        if client.request(Request::Commit(request)).await.is_err() {
            return Latencies::default();
        }
        latencies.record_us(micros(sent.elapsed()));
    }
    latencies
}

/// One connection's share of the load.
struct Load {
    topic: String,
    batch: u32,
    value: Bytes,
    keys: u32,
    /// Where this connection starts in the key rotation, so connections interleave keys.
    key_offset: u64,
    deadline: Instant,
}

impl Load {
    fn new(args: &WireArgs, topic: &str, index: usize, deadline: Instant) -> Load {
        let value_len = usize::try_from(args.record_bytes).unwrap_or(usize::MAX);
        Load {
            topic: topic.to_string(),
            batch: args.batch,
            value: Bytes::from(vec![b'x'; value_len]),
            keys: args.keys,
            key_offset: index as u64 * 7919,
            deadline,
        }
    }

    async fn produce(self, client: Client) -> Result<Tally, ClientError> {
        let mut tally = Tally::default();
        let mut sequence = self.key_offset;
        let mut last_ack = Instant::now();
        while Instant::now() < self.deadline {
            let timestamp_ms = now_ms();
            let records: Vec<Record> = (0..self.batch)
                .map(|_| {
                    sequence += 1;
                    self.record(sequence, timestamp_ms)
                })
                .collect();
            let bytes: u64 = records.iter().map(record_bytes).sum();
            let sent = Instant::now();
            match client.produce(&self.topic, records).await {
                Ok(count) => {
                    tally.latencies.record_us(micros(sent.elapsed()));
                    tally.longest_ack_gap_us =
                        tally.longest_ack_gap_us.max(micros(last_ack.elapsed()));
                    last_ack = Instant::now();
                    tally.requests += 1;
                    tally.records += u64::from(count);
                    tally.bytes += bytes;
                }
                Err(error) => retry_or_stop(error, &mut tally).await?,
            }
        }
        Ok(tally)
    }

    async fn consume(self, client: Client, follow: bool) -> Result<Tally, ClientError> {
        let mut tally = Tally::default();
        let wait_ms = if follow { FOLLOW_WAIT_MS } else { 0 };
        let mut cursor = None;
        while Instant::now() < self.deadline {
            let options = FetchOptions {
                cursor: cursor.clone(),
                max: FETCH_RECORDS,
                wait_ms,
                ..Default::default()
            };
            let sent = Instant::now();
            match client.fetch(&self.topic, &options).await {
                Ok((records, next_cursor)) => {
                    tally.latencies.record_us(micros(sent.elapsed()));
                    tally.records += records.len() as u64;
                    tally.bytes += records.iter().map(record_bytes).sum::<u64>();
                    let drained = records.is_empty();
                    // Reading mode starts over once drained; following mode waits for more.
                    cursor = if drained && !follow { None } else { Some(next_cursor) };
                    if drained && !follow && tally.records == 0 {
                        break; // an empty topic: nothing to read
                    }
                }
                Err(error) => retry_or_stop(error, &mut tally).await?,
            }
        }
        Ok(tally)
    }

    fn record(&self, sequence: u64, timestamp_ms: u64) -> Record {
        let key = (self.keys > 0)
            .then(|| Bytes::from(format!("key-{}", sequence % u64::from(self.keys))));
        Record { key, value: self.value.clone(), timestamp_ms, headers: Vec::new() }
    }
}

async fn retry_or_stop(error: ClientError, tally: &mut Tally) -> Result<(), ClientError> {
    let ClientError::Server { reason, retryable: true } = error else { return Err(error) };
    tally.retried_errors += 1;
    *tally.retried_reasons.entry(reason).or_default() += 1;
    tokio::time::sleep(RETRY_PAUSE).await;
    Ok(())
}

async fn gather(mut tasks: JoinSet<Result<Tally, ClientError>>) -> Result<Tally, ClientError> {
    let mut total = Tally::default();
    while let Some(joined) = tasks.join_next().await {
        let tally = joined.map_err(|_| ClientError::Closed)??;
        total.requests += tally.requests;
        total.records += tally.records;
        total.bytes += tally.bytes;
        total.retried_errors += tally.retried_errors;
        for (reason, count) in tally.retried_reasons {
            *total.retried_reasons.entry(reason).or_default() += count;
        }
        total.longest_ack_gap_us = total.longest_ack_gap_us.max(tally.longest_ack_gap_us);
        total.latencies.merge(tally.latencies);
    }
    Ok(total)
}

fn figures(
    args: &WireArgs,
    seconds: f64,
    mut produced: Tally,
    mut consumed: Tally,
    floor: &mut Latencies,
) -> Figures {
    let ack_p50_us = produced.latencies.percentile_us(0.5);
    let round_trip_p50_us = floor.percentile_us(0.5);
    Figures {
        mode: args.mode,
        connections: args.connections,
        batch: args.batch,
        record_bytes: args.record_bytes,
        keys: args.keys,
        seconds,
        produced_records: produced.records,
        produced_records_per_s: produced.records as f64 / seconds,
        produced_mb_per_s: produced.bytes as f64 / seconds / 1e6,
        ack_p50_us,
        ack_p99_us: produced.latencies.percentile_us(0.99),
        ack_p999_us: produced.latencies.percentile_us(0.999),
        consumed_records: consumed.records,
        consumed_records_per_s: consumed.records as f64 / seconds,
        consumed_mb_per_s: consumed.bytes as f64 / seconds / 1e6,
        fetch_p50_us: consumed.latencies.percentile_us(0.5),
        fetch_p99_us: consumed.latencies.percentile_us(0.99),
        fetch_p999_us: consumed.latencies.percentile_us(0.999),
        round_trip_p50_us,
        round_trip_p99_us: floor.percentile_us(0.99),
        ack_to_round_trip_p50: ratio(ack_p50_us, round_trip_p50_us),
        retried_errors: produced.retried_errors + consumed.retried_errors,
        retried_reasons: {
            let mut reasons = std::mem::take(&mut produced.retried_reasons);
            for (reason, count) in std::mem::take(&mut consumed.retried_reasons) {
                *reasons.entry(reason).or_default() += count;
            }
            reasons
        },
        longest_ack_gap_ms: produced.longest_ack_gap_us / 1_000,
        ranges: 0,
        topics: 1,
        produce_requests: produced.requests,
        disk_flushes_per_request: None,
        mb_per_s_vs_first: 1.0,
    }
}

fn print_text(args: &WireArgs, figures: &Figures) {
    let shape = match figures.ranges {
        0 => format!("topic {}", args.topic),
        ranges => format!("{ranges} ranges over {} topic(s)", figures.topics),
    };
    println!(
        "bench wire: {} mode, {} connections, {} records x {} B per produce, {} keys, {shape}, \
         {:.1} s",
        args.mode.to_possible_value().map(|value| value.get_name().to_string()).unwrap_or_default(),
        args.connections,
        args.batch,
        args.record_bytes,
        args.keys,
        figures.seconds
    );
    if args.mode != Mode::Consume {
        let flushes = figures
            .disk_flushes_per_request
            .map_or(String::new(), |flushes| format!("   {flushes:.2} disk flushes/request"));
        println!(
            "produced  {:>12.0} records/s {:>9.1} MB/s ({:.2} of the first run)   ack \
             p50/p99/p999 {}/{}/{} us{flushes}",
            figures.produced_records_per_s,
            figures.produced_mb_per_s,
            figures.mb_per_s_vs_first,
            figures.ack_p50_us,
            figures.ack_p99_us,
            figures.ack_p999_us
        );
    }
    if args.mode != Mode::Produce {
        println!(
            "consumed  {:>12.0} records/s {:>9.1} MB/s   fetch p50/p99/p999 {}/{}/{} us",
            figures.consumed_records_per_s,
            figures.consumed_mb_per_s,
            figures.fetch_p50_us,
            figures.fetch_p99_us,
            figures.fetch_p999_us
        );
    }
    println!(
        "floor     round trip p50/p99 {}/{} us (ack p50 / round trip p50: {:.1}); \
         {} retried errors; longest without an ack {} ms",
        figures.round_trip_p50_us,
        figures.round_trip_p99_us,
        figures.ack_to_round_trip_p50,
        figures.retried_errors,
        figures.longest_ack_gap_ms
    );
}

fn record_bytes(record: &Record) -> u64 {
    (record.key.as_ref().map_or(0, Bytes::len) + record.value.len()) as u64
}

fn micros(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX)
}

fn ratio(numerator: u64, denominator: u64) -> f64 {
    if denominator == 0 { 0.0 } else { numerator as f64 / denominator as f64 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_rotate_through_the_keys() {
        let load = |keys| Load {
            topic: "t".into(),
            batch: 1,
            value: Bytes::from_static(b"vv"),
            keys,
            key_offset: 0,
            deadline: Instant::now(),
        };
        let keyed = load(3);
        let keys: Vec<Option<Bytes>> =
            (0..4).map(|sequence| keyed.record(sequence, 0).key).collect();
        let expected = ["key-0", "key-1", "key-2", "key-0"].map(|key| Some(Bytes::from(key)));
        assert_eq!(keys, expected);
        assert_eq!(record_bytes(&keyed.record(1, 0)), 5 + 2);
        assert_eq!(load(0).record(5, 0).key, None, "0 keys: records without keys");
        assert_eq!(ratio(300, 100), 3.0);
        assert_eq!(ratio(300, 0), 0.0);
    }
}
