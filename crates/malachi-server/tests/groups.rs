//! Consumer group members over a real socket (keys 32-34, and 7 for leaving): members share a
//! topic's ranges, a range moves only once its reader let it go, a child range is handed out
//! only after the group committed its parent drained, and commits are fenced by generation and
//! ownership.

mod harness;

use std::collections::BTreeSet;

use harness::start;
use malachi_client::{Assignment, Client, ClientConfig, ClientError, Record, Request, Start};
use malachi_wire::messages::RangePosition;
use malachi_wire::shapes::Position;

async fn login(server: &harness::TestServer, user: &str, password: &str) -> Client {
    let config = ClientConfig::new(server.address.to_string()).credentials(user, password);
    Client::connect(config).await.unwrap()
}

fn reason(result: Result<impl std::fmt::Debug, ClientError>) -> String {
    match result {
        Err(error) => error.reason_text().unwrap_or("not a server error").to_string(),
        Ok(answer) => panic!("expected a refusal, got {answer:?}"),
    }
}

/// One past the last record of every range of `topic`, by range id.
async fn range_ends(admin: &Client, topic: &str) -> std::collections::BTreeMap<u32, u64> {
    let lag = admin.group_lag(topic, Some("nobody")).await.unwrap();
    lag.groups[0].ranges.iter().map(|range| (range.range_id, range.end)).collect()
}

/// The range's own position (history index `depth`) at `offset`.
fn at(range: u32, depth: u16, offset: u64) -> RangePosition {
    RangePosition { range, position: Position { source_index: depth, offset } }
}

/// A member: its name and what it was last told.
struct Member {
    name: &'static str,
    told: Assignment,
}

impl Member {
    async fn join(client: &Client, name: &'static str) -> Member {
        let told = client.join_group("orders", "g", name).await.unwrap();
        Member { name, told }
    }

    /// Heartbeats having applied its last answer.
    async fn beat(&mut self, client: &Client) -> &Assignment {
        let generation = self.told.generation;
        self.told = client.group_heartbeat("orders", "g", self.name, generation).await.unwrap();
        &self.told
    }

    fn ranges(&self) -> BTreeSet<u32> {
        self.told.ranges.iter().copied().collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_share_the_ranges_and_commits_are_fenced() {
    let server = start(&[]).await;
    let admin = login(&server, "admin", "admin-password-long").await;
    let client = login(&server, "app", "app123").await;
    admin.create_topic_with_ranges("orders", 4).await.unwrap();
    let records: Vec<Record> = (0..200)
        .map(|i| Record {
            key: Some(format!("k{i}").into()),
            value: format!("v{i}").into(),
            timestamp_ms: 1,
            headers: vec![],
        })
        .collect();
    admin.produce("orders", records).await.unwrap();
    let all: BTreeSet<u32> = range_ends(&admin, "orders").await.into_keys().collect();
    assert_eq!(all.len(), 4);

    // The first member reads everything; a second one gets nothing until the first let go.
    let mut a = Member::join(&client, "a").await;
    assert_eq!(a.ranges(), all);
    let mut b = Member::join(&client, "b").await;
    assert!(b.ranges().is_empty(), "a still reads every range: {:?}", b.told);
    assert_eq!(a.beat(&client).await.ranges.len(), 2, "a is told to give two up");
    a.beat(&client).await; // a applied it: it reads only its two now
    b.beat(&client).await;
    assert_eq!(b.ranges().len(), 2);
    assert!(a.ranges().is_disjoint(&b.ranges()));
    assert_eq!(&a.ranges() | &b.ranges(), all);

    // Fencing: an old generation, a range the member does not hold, an unknown range.
    let generation = b.told.generation;
    let a_range = *a.ranges().first().unwrap();
    let ends = range_ends(&admin, "orders").await;
    let commit = |member: &'static str, generation, offsets| {
        client.commit_offsets("orders", "g", member, generation, offsets)
    };
    let stale = commit("a", 1, vec![at(a_range, 0, 1)]).await;
    assert_eq!(reason(stale), "generation_mismatch");
    assert_eq!(reason(commit("b", generation, vec![at(a_range, 0, 1)]).await), "not_owner");
    assert_eq!(reason(commit("b", generation, vec![at(999, 0, 0)]).await), "no_such_range");
    assert_eq!(reason(commit("z", generation, vec![at(a_range, 0, 0)]).await), "not_owner");

    // a commits its ranges to their ends: the group has only b's records left to read.
    let offsets = a.ranges().iter().map(|&range| at(range, 0, ends[&range])).collect();
    commit("a", generation, offsets).await.unwrap();
    let lag = admin.group_lag("orders", Some("g")).await.unwrap();
    let b_records: u64 = b.ranges().iter().map(|range| ends[range]).sum();
    assert_eq!(lag.groups[0].total, b_records);

    // A split of a's range: its children go out only once the group drained it.
    let (low, high) = admin.split_range("orders", a_range).await.unwrap();
    a.beat(&client).await;
    b.beat(&client).await;
    let told = &a.ranges() | &b.ranges();
    assert!(!told.contains(&low) && !told.contains(&high), "children before the drain: {told:?}");
    assert!(a.ranges().contains(&a_range), "a keeps reading the sealed parent");
    let generation = a.told.generation;
    let sealed_end = range_ends(&admin, "orders").await[&a_range];
    let ancestor = commit("a", generation, vec![at(a_range, 1, sealed_end)]).await;
    assert_eq!(reason(ancestor), "invalid_cursor", "index 1 is past a first-generation range");
    commit("a", generation, vec![at(a_range, 0, sealed_end)]).await.unwrap();
    for _ in 0..2 {
        a.beat(&client).await;
        b.beat(&client).await;
    }
    let active: BTreeSet<u32> =
        all.iter().copied().filter(|&range| range != a_range).chain([low, high]).collect();
    assert!(a.ranges().is_disjoint(&b.ranges()));
    assert_eq!(&a.ranges() | &b.ranges(), active, "the children are handed out after the drain");
    // A child's own position is index 1 of its history (the parent, then itself).
    let child_generation = a.told.generation;
    let holder = if a.ranges().contains(&low) { "a" } else { "b" };
    let parent_position = commit(holder, child_generation, vec![at(low, 0, 0)]).await;
    assert_eq!(reason(parent_position), "invalid_cursor", "index 0 names the parent");
    commit(holder, child_generation, vec![at(low, 1, 0)]).await.unwrap();

    // a leaves: b reads every active range.
    client.leave_group("orders", "g", "a").await.unwrap();
    b.beat(&client).await;
    assert_eq!(b.ranges(), active);
    let gone = client.group_heartbeat("orders", "g", "a", child_generation).await.unwrap();
    assert!(gone.ranges.is_empty(), "a left: it rejoins with nothing to read yet");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_need_consume_and_a_topic() {
    let server = start(&[("ACL_STRICT", "true")]).await;
    let admin = login(&server, "admin", "admin-password-long").await;
    let consumer = login(&server, "consumer", "consumer123").await;
    admin.create_topic("orders").await.unwrap();
    assert_eq!(reason(consumer.join_group("orders", "g", "m").await), "permission_denied");
    assert_eq!(reason(admin.join_group("absent", "g", "m").await), "no_such_topic");
    assert_eq!(reason(admin.join_group("orders", "", "m").await), "invalid_group");
    let told = admin.join_group("orders", "g", "m").await.unwrap();
    assert_eq!(told.ranges.len(), 1);
    assert_eq!(told.session_ms, 30_000);
}

/// Every record of `range` from `start` on, page by page: (offsets read, where to go on).
async fn read_all(client: &Client, range: u32, start: Start) -> (Vec<u64>, Position) {
    let mut offsets = Vec::new();
    let mut start = start;
    loop {
        let (page, entries) = client.fetch_range("orders", range, start, 7, 0).await.unwrap();
        offsets.extend(entries.iter().map(|entry| entry.position.offset));
        assert!(entries.iter().all(|entry| entry.position.source_index == page.next.source_index));
        if entries.is_empty() {
            assert_eq!(page.backlog, 0);
            return (offsets, page.next);
        }
        start = Start::Position(page.next);
    }
}

/// A member reads each of its ranges with positions from the group's checkpoint, commits where
/// it got to, and the group has nothing left; a reader waiting at the end gets the next record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_read_their_ranges_with_positions() {
    let server = start(&[]).await;
    let admin = login(&server, "admin", "admin-password-long").await;
    let client = login(&server, "app", "app123").await;
    admin.create_topic_with_ranges("orders", 2).await.unwrap();
    let records: Vec<Record> = (0..60).map(|i| keyed(&format!("k{i}"))).collect();
    admin.produce("orders", records).await.unwrap();
    let ends = range_ends(&admin, "orders").await;
    let told = client.join_group("orders", "g", "m").await.unwrap();
    assert_eq!(told.ranges.len(), 2);
    let mut offsets_committed = Vec::new();
    for &range in &told.ranges {
        let from_group = Start::Group(Some("g".into()));
        let (offsets, next) = read_all(&client, range, from_group.clone()).await;
        let expected: Vec<u64> = (0..ends[&range]).collect();
        assert_eq!(offsets, expected, "range {range}: every record once, in order");
        assert_eq!(next, Position { source_index: 0, offset: ends[&range] });
        offsets_committed.push(RangePosition { range, position: next });
        let (again, _) =
            read_all(&client, range, Start::Position(Position { source_index: 0, offset: 3 }))
                .await;
        assert_eq!(again.first(), Some(&3), "a position starts a read where it says");
    }
    client.commit_offsets("orders", "g", "m", told.generation, offsets_committed).await.unwrap();
    let lag = admin.group_lag("orders", Some("g")).await.unwrap();
    assert_eq!(lag.groups[0].total, 0);
    for &range in &told.ranges {
        let (rest, _) = read_all(&client, range, Start::Group(Some("g".into()))).await;
        assert!(rest.is_empty(), "the group's checkpoint is past every record of {range}");
    }

    // Refusals: an ancestor's index, a range the topic never had, no codec it can send.
    let range = told.ranges[0];
    let ancestor = Start::Position(Position { source_index: 1, offset: 0 });
    assert_eq!(
        reason(client.fetch_range("orders", range, ancestor, 10, 0).await),
        "invalid_cursor"
    );
    assert_eq!(
        reason(client.fetch_range("orders", 99, Start::Earliest, 10, 0).await),
        "no_such_range"
    );
    let no_codec = Request::FetchRange(malachi_wire::messages::FetchRangeRequest {
        topic: Some("orders".into()),
        range,
        routes_version: 0,
        start: Start::Earliest,
        max_records: 10,
        max_bytes: 0,
        wait_ms: 0,
        accept: malachi_wire::shapes::Accept(2),
    });
    assert_eq!(reason(client.request(no_codec).await.map(|_| ())), "unsupported_codec");

    // Latest starts at the end; a reader at the end of every range waits for the next records.
    for &range in &told.ranges {
        let (page, entries) =
            client.fetch_range("orders", range, Start::Latest, 10, 0).await.unwrap();
        assert!(entries.is_empty());
        assert_eq!(page.next.offset, ends[&range], "latest is the end of range {range}");
    }
    let waiting = told.ranges.iter().map(|&range| {
        let client = &client;
        let end = Start::Position(Position { source_index: 0, offset: ends[&range] });
        async move { client.fetch_range("orders", range, end, 100, 20_000).await.unwrap() }
    });
    let reads = futures_util::future::join_all(waiting);
    let late: Vec<Record> = (0..20).map(|i| keyed(&format!("late{i}"))).collect();
    let produce = async { admin.produce("orders", late).await.unwrap() };
    let (pages, _) = tokio::join!(reads, produce);
    let got: usize = pages.iter().map(|(_, entries)| entries.len()).sum();
    assert!(got > 0 && got <= 20, "the waiting readers got late records: {got}");
    for (&range, (_, entries)) in told.ranges.iter().zip(&pages) {
        assert!(!entries.is_empty(), "range {range} got some of the 20 keys");
        assert_eq!(entries[0].position.offset, ends[&range], "from where it waited");
    }
}

fn keyed(key: &str) -> Record {
    Record {
        key: Some(key.to_string().into()),
        value: key.to_string().into(),
        timestamp_ms: 1,
        headers: vec![],
    }
}
