//! `malachi bench group`: how much faster a consumer group of several members drains a topic
//! than a group of one, when consumption is the bottleneck.
//!
//! The bottleneck is arranged, not hoped for: after each page a member pauses `--work-us` per
//! record, as an application spending that long on each record would. It is a pause, not a
//! busy loop, so members running on this machine do not compete for its cores (a busy loop
//! would measure the cores, not the group). The topic gets `--ranges` ranges (the largest
//! power of two below at creation, then splits) and `--records` records over `--keys` keys,
//! the same number in each range, once; then rounds alternate a fresh group of one member and
//! a fresh group of `--members`.
//!
//! A round's clock starts once its members' shares have settled (every active range dealt to
//! exactly one) and stops when every record has been read by some member; a record read twice
//! (a page another member had read and not committed) counts once. A fresh group starts at
//! the topic's first ranges, so before the members join, a primer member commits the split
//! (empty) parents drained and leaves: the timed part reads only the active ranges.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use malachi_client::{
    Client, ClientError, GroupMember, MemberOptions, Position, RangePosition, RangeState,
    RecordBuilder,
};
use tokio::sync::Barrier;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::wire::login;
use crate::cli::settings::{ConnectionArgs, Settings};

/// Records per produce request while loading the topic.
const LOAD_BATCH: u64 = 1_000;
/// Records per page a member reads.
const PAGE_RECORDS: u32 = 500;
/// How long a member with nothing new waits for more before it looks again.
const MEMBER_WAIT: Duration = Duration::from_millis(100);
/// Heartbeat rounds the members get to settle their shares.
const SETTLE_ROUNDS: usize = 20;

#[derive(clap::Args, Debug)]
pub struct GroupArgs {
    #[command(flatten)]
    connection: ConnectionArgs,
    /// Members of the group measured against a group of one.
    #[arg(long, default_value_t = 3, value_name = "N")]
    members: usize,
    /// Active ranges of the topic (2 to 256).
    #[arg(long, default_value_t = 12, value_name = "N")]
    ranges: u32,
    /// Records in the topic.
    #[arg(long, default_value_t = 60_000, value_name = "N")]
    records: u64,
    /// Bytes of each record's value (at least 8: the record's number).
    #[arg(long, default_value_t = 100, value_name = "B")]
    record_bytes: usize,
    /// Distinct keys, as many in each range.
    #[arg(long, default_value_t = 1_000, value_name = "K")]
    keys: u64,
    /// What a member spends on each record it reads, in microseconds (a pause).
    #[arg(long, default_value_t = 100, value_name = "US")]
    work_us: u64,
    /// Rounds, each a group of one then a group of `--members`.
    #[arg(long, default_value_t = 3, value_name = "N")]
    rounds: usize,
    /// The topic's name prefix; each run creates a fresh topic.
    #[arg(long, default_value = "malachi-bench-group")]
    topic: String,
}

pub fn run(args: &GroupArgs) -> Result<(), String> {
    let valid = args.members >= 1
        && (2..=256).contains(&args.ranges)
        && args.records >= 1
        && args.record_bytes >= 8
        && args.keys >= 1
        && args.rounds >= 1;
    if !valid {
        return Err("--members, --records, --keys and --rounds must be at least 1, --ranges \
                    2 to 256, --record-bytes at least 8"
            .into());
    }
    let runtime = super::runtime()?;
    runtime.block_on(measure(args))
}

async fn measure(args: &GroupArgs) -> Result<(), String> {
    let settings = Settings::load(&args.connection)?;
    let fail = |action: &str, error: ClientError| settings.explain(action, None, &error);
    let client = login(&settings).await.map_err(|error| fail("login", error))?;
    let topic = format!("{}-{}", args.topic, malachi_client::now_ms());
    let parents = prepare(&client, args, &topic).await.map_err(|e| fail("prepare", e))?;
    println!(
        "{topic}: {} ranges, {} records of {} B over {} keys; each member spends {} us a record",
        args.ranges, args.records, args.record_bytes, args.keys, args.work_us
    );
    let mut ratios = Vec::new();
    for round in 0..args.rounds {
        let mut rates = Vec::new();
        for members in [1, args.members] {
            let group = format!("bench-{round}-{members}");
            let drain = Drain { settings: &settings, args, topic: &topic, group: &group };
            let elapsed = drain.run(members, &parents).await.map_err(|e| fail("drain", e))?;
            let per_s = args.records as f64 / elapsed.as_secs_f64();
            println!(
                "round {}: {members} member(s) drained it in {:.2} s, {per_s:.0} records/s",
                round + 1,
                elapsed.as_secs_f64()
            );
            rates.push(per_s);
        }
        let ratio = rates[1] / rates[0];
        println!("round {}: {} members / 1 member = {ratio:.2}x", round + 1, args.members);
        ratios.push(ratio);
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "{} members / 1 member: min {:.2}x, median {:.2}x, max {:.2}x over {} rounds",
        args.members,
        ratios[0],
        ratios[ratios.len() / 2],
        ratios[ratios.len() - 1],
        ratios.len()
    );
    Ok(())
}

/// Creates `topic` with `args.ranges` active ranges and loads its records. The split parents
/// (empty: the records come after the splits).
async fn prepare(client: &Client, args: &GroupArgs, topic: &str) -> Result<Vec<u32>, ClientError> {
    let created = 1u32 << (31 - args.ranges.leading_zeros());
    client.create_topic_with_ranges(topic, created).await?;
    let described = client.describe_topic(topic).await?;
    let to_split: Vec<u32> = described
        .ranges
        .iter()
        .take((args.ranges - created) as usize)
        .map(|range| range.range_id)
        .collect();
    for &range_id in &to_split {
        client.split_range(topic, range_id).await?;
    }
    let active = client.describe_topic(topic).await?.ranges;
    let extents: Vec<(u64, u64)> = active
        .iter()
        .filter(|range| range.state == RangeState::Active)
        .map(|range| (range.start, range.end_inclusive))
        .collect();
    let per_range = (args.keys / extents.len() as u64).max(1) as usize;
    let keys = keys_by_range(&extents, per_range);
    let padding = vec![b'x'; args.record_bytes - 8];
    for first in (0..args.records).step_by(LOAD_BATCH as usize) {
        let batch = (first..args.records.min(first + LOAD_BATCH))
            .map(|number| {
                let mut value = number.to_be_bytes().to_vec();
                value.extend_from_slice(&padding);
                let range = &keys[number as usize % keys.len()];
                let key = &range[number as usize / keys.len() % range.len()];
                RecordBuilder::new(value).key(key.clone()).build()
            })
            .collect();
        client.produce(topic, batch).await?;
    }
    Ok(to_split)
}

/// `per_range` keys whose records land in each of the ranges `extents` (keyspace points, first
/// and last). Records are dealt over the ranges evenly: the halves a split leaves are narrower
/// than the ranges it did not touch, and keys spread by hash alone would give them fewer
/// records, so a member's share of the work would not be its share of the ranges.
fn keys_by_range(extents: &[(u64, u64)], per_range: usize) -> Vec<Vec<String>> {
    let mut keys = vec![Vec::new(); extents.len()];
    let mut candidate = 0u64;
    while keys.iter().any(|range: &Vec<String>| range.len() < per_range) {
        let key = format!("k{candidate}");
        candidate += 1;
        let point = malachi_meta::keyspace::key_point(key.as_bytes());
        let at = extents.iter().position(|&(first, last)| (first..=last).contains(&point));
        let range = &mut keys[at.expect("the active ranges tile the keyspace")];
        if range.len() < per_range {
            range.push(key);
        }
    }
    keys
}

/// One group draining the topic.
struct Drain<'a> {
    settings: &'a Settings,
    args: &'a GroupArgs,
    topic: &'a str,
    group: &'a str,
}

impl Drain<'_> {
    /// How long `members` members took to read every record, from the moment their shares
    /// settled.
    async fn run(&self, members: usize, parents: &[u32]) -> Result<Duration, ClientError> {
        let primer = login(self.settings).await?;
        prime(&primer, self.topic, self.group, parents).await?;
        let shared = Arc::new(Shared {
            seen: (0..self.args.records).map(|_| AtomicBool::new(false)).collect(),
            read: AtomicU64::new(0),
            shares: Mutex::default(),
            barrier: Barrier::new(members),
            started: Mutex::default(),
            finished: Mutex::default(),
        });
        let mut tasks = JoinSet::new();
        for index in 0..members {
            let client = login(self.settings).await?;
            let reader = Reader {
                topic: self.topic.to_string(),
                group: self.group.to_string(),
                name: format!("member-{index}"),
                work_per_record: Duration::from_micros(self.args.work_us),
                shared: shared.clone(),
            };
            tasks.spawn(reader.drain(client));
        }
        while let Some(joined) = tasks.join_next().await {
            joined.expect("a member task panicked")?;
        }
        let started = shared.started.lock().expect("lock").expect("started");
        let finished = shared.finished.lock().expect("lock").expect("finished");
        Ok(finished - started)
    }
}

/// Commits the topic's split parents (empty) drained for `group`, so that its members are dealt
/// the active ranges at once, then leaves.
async fn prime(
    client: &Client,
    topic: &str,
    group: &str,
    parents: &[u32],
) -> Result<(), ClientError> {
    if parents.is_empty() {
        return Ok(()); // no split: the group starts at the active ranges
    }
    let told = client.join_group(topic, group, "primer").await?;
    let drained: Vec<RangePosition> = parents
        .iter()
        .filter(|range| told.ranges.contains(range))
        .map(|&range| RangePosition { range, position: Position { source_index: 0, offset: 0 } })
        .collect();
    client.commit_offsets(topic, group, "primer", told.generation, drained).await?;
    client.leave_group(topic, group, "primer").await
}

/// What a group's members share.
struct Shared {
    /// Which records some member has read, by number.
    seen: Vec<AtomicBool>,
    /// How many of them.
    read: AtomicU64,
    /// Each member's ranges as it last applied them.
    shares: Mutex<BTreeMap<String, Vec<u32>>>,
    barrier: Barrier,
    started: Mutex<Option<Instant>>,
    finished: Mutex<Option<Instant>>,
}

impl Shared {
    /// Every range in exactly one share, and no share holding a sealed range's place.
    fn settled(&self, active: &BTreeSet<u32>) -> bool {
        let shares = self.shares.lock().expect("shares lock");
        let dealt: Vec<u32> = shares.values().flatten().copied().collect();
        let distinct: BTreeSet<u32> = dealt.iter().copied().collect();
        distinct.len() == dealt.len() && &distinct == active
    }

    /// Marks the record numbered by `value`'s first 8 bytes read; whether it is the last.
    fn mark(&self, value: &[u8]) -> bool {
        let number = u64::from_be_bytes(value[..8].try_into().expect("8 bytes")) as usize;
        let first = !self.seen[number].swap(true, Ordering::Relaxed);
        first && self.read.fetch_add(1, Ordering::Relaxed) + 1 == self.seen.len() as u64
    }

    fn done(&self) -> bool {
        self.read.load(Ordering::Relaxed) == self.seen.len() as u64
    }
}

/// One member of a draining group.
struct Reader {
    topic: String,
    group: String,
    name: String,
    work_per_record: Duration,
    shared: Arc<Shared>,
}

impl Reader {
    async fn drain(self, client: Client) -> Result<(), ClientError> {
        let options = MemberOptions { max: PAGE_RECORDS, wait: MEMBER_WAIT, from_start: false };
        let mut member =
            GroupMember::join(&client, &self.topic, &self.group, &self.name, options).await?;
        let active = active_ranges(&client, &self.topic).await?;
        self.shared.barrier.wait().await; // every member joined
        self.settle(&mut member, &active).await?;
        if self.shared.barrier.wait().await.is_leader() {
            *self.shared.started.lock().expect("lock") = Some(Instant::now());
        }
        while !self.shared.done() {
            let page = member.next_page().await?;
            for record in &page {
                if self.shared.mark(&record.value) {
                    *self.shared.finished.lock().expect("lock") = Some(Instant::now());
                }
            }
            tokio::time::sleep(self.work_per_record * page.len() as u32).await;
        }
        self.shared.barrier.wait().await; // nobody leaves while another still reads
        member.leave().await
    }

    /// Heartbeats in rounds with the other members until every active range is dealt to
    /// exactly one of them.
    async fn settle(
        &self,
        member: &mut GroupMember<'_>,
        active: &BTreeSet<u32>,
    ) -> Result<(), ClientError> {
        for _ in 0..SETTLE_ROUNDS {
            member.refresh().await?;
            let mine = member.ranges().to_vec();
            self.shared.shares.lock().expect("shares lock").insert(self.name.clone(), mine);
            self.shared.barrier.wait().await;
            let settled = self.shared.settled(active);
            self.shared.barrier.wait().await;
            if settled {
                return Ok(());
            }
        }
        Err(ClientError::Protocol(format!("shares did not settle in {SETTLE_ROUNDS} rounds")))
    }
}

async fn active_ranges(client: &Client, topic: &str) -> Result<BTreeSet<u32>, ClientError> {
    let described = client.describe_topic(topic).await?;
    let active = described.ranges.iter().filter(|range| range.state == RangeState::Active);
    Ok(active.map(|range| range.range_id).collect())
}
