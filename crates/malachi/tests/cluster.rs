//! Three real `malachi serve` processes on 127.0.0.1 forming one cluster: metadata (topics,
//! users, ACLs) written through any broker is seen through every other, produce and fetch work
//! through the broker holding the segments, the vnodes' leadership spreads over the brokers,
//! and kill -9 of a vnode's leader leaves the other two serving metadata at once; the killed
//! broker rejoins as the same member.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Child;
use std::time::{Duration, Instant};

use common::drill::longest_gap_in;
use common::group::{
    assert_once_and_in_order, consumer, printed, produce_batch, until_each_prints,
};
use common::load::{Load, assert_read_back};
use common::{BrokerProcess, free_port, leader_of, vnodes_led};
use malachi_client::{
    Client, ClientConfig, ClusterStatusResponse, FetchOptions, RangeState, RecordBuilder,
    SegmentState,
};
use malachi_transport::gossip_seal::GossipSeal;
use malachi_transport::pki::{ClusterCa, ClusterFiles, Credentials};
use tokio::sync::mpsc::unbounded_channel;

const ADMIN_PASSWORD: &str = "admin-password-long";

struct Member {
    process: BrokerProcess,
    child: Option<Child>,
}

impl Member {
    fn new(dir: &std::path::Path, node_id: u64, cluster_port: u16, seed: Option<u16>) -> Member {
        std::fs::create_dir_all(dir).unwrap();
        let mut process = BrokerProcess::new(dir)
            .env("MALACHI_NODE_ID", node_id.to_string())
            .env("MALACHI_CLUSTER_PORT", cluster_port.to_string())
            .env("MALACHI_CLUSTER_GOSSIP_PORT", free_port().to_string());
        if let Some(seed) = seed {
            process = process.env("MALACHI_LOG_NODES", format!("127.0.0.1:{seed}"));
        }
        Member { process, child: None }
    }

    fn start(&mut self) {
        self.child = Some(self.process.spawn());
    }

    fn kill(&mut self) {
        let mut child = self.child.take().expect("running");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// Sends `signal` (`STOP`, `CONT`) to the running broker.
    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let mut kill = std::process::Command::new("kill");
        kill.args([&format!("-{signal}"), &pid]);
        assert!(kill.status().unwrap().success(), "kill -{signal} {pid}");
    }

    async fn admin(&self) -> Client {
        self.process.connect_as("admin", ADMIN_PASSWORD).await
    }

    /// SIGTERM, then waits for the broker to exit; whether it exited cleanly.
    fn terminate(&mut self) -> bool {
        self.signal("TERM");
        let status = self.child.take().expect("running").wait().unwrap();
        status.success()
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Retries `check` for up to 10 s: a follower applies what its leader committed a moment later.
async fn eventually<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    eventually_within(what, 10, check).await
}

/// Retries `check` for up to `seconds`.
async fn eventually_within<F, Fut>(what: &str, seconds: u64, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + Duration::from_secs(seconds);
    loop {
        match check().await {
            Ok(()) => return,
            Err(error) if Instant::now() > deadline => panic!("{what}: {error}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Waits until every group has a leader and the vnodes' leadership has spread over the
/// `brokers` brokers (each leads as many as any other, give or take one), so that no hand-over
/// moves a leader under the test.
async fn leadership_spread(client: &Client, brokers: u64) -> ClusterStatusResponse {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = client.cluster_status().await.unwrap();
        let led = vnodes_led(&status);
        let vnodes = status.groups.len() as u64 - 2;
        let even =
            led.values().max().zip(led.values().min()).is_some_and(|(max, min)| max - min <= 1);
        let spread = status.groups.iter().all(|group| group.leader != 0)
            && led.len() as u64 == brokers.min(vnodes)
            && even;
        if spread {
            eprintln!("vnode leadership spread: {led:?}");
            return status;
        }
        assert!(Instant::now() < deadline, "the vnodes' leadership did not spread: {led:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn produce_and_read_back(client: &Client, topic: &str, records: u32) {
    let batch = (0..records)
        .map(|i| RecordBuilder::new(format!("{topic}-{i}")).key(format!("k{}", i % 4)).build())
        .collect();
    assert_eq!(client.produce(topic, batch).await.unwrap(), records);
    let (read, _) = common::drain(client, topic, None).await;
    assert_eq!(read.len(), records as usize, "{topic}");
}

/// Creates `topic` with `ranges` ranges. Right after the start a vnode may have no leader yet
/// (`metadata_unavailable`, retryable): retried as a client would, an earlier attempt that did
/// create it counting.
async fn create_topic(client: &Client, topic: &str, ranges: u32) {
    // After a leader's kill the survivors elect another; on a loaded machine that takes longer
    // than a follower's catching up, which `eventually`'s 10 s are sized for.
    eventually_within(&format!("{topic} is created"), 30, || async {
        let created = match ranges {
            1 => client.create_topic(topic).await,
            _ => client.create_topic_with_ranges(topic, ranges).await,
        };
        match created {
            Ok(_) => Ok(()),
            Err(error) if format!("{error:?}").contains("already_exists") => Ok(()),
            Err(error) => Err(format!("{error:?}")),
        }
    })
    .await;
}

/// `count` brokers under `dir`: the first starts the cluster, the others join through it.
/// Returns once every broker sees every other alive and every group led (`cluster_ready`).
async fn start_cluster(dir: &std::path::Path, count: usize) -> Vec<Member> {
    start_cluster_with(dir, count, &[]).await
}

/// As [`start_cluster`], every broker with the settings `env` too.
async fn start_cluster_with(
    dir: &std::path::Path,
    count: usize,
    env: &[(&str, &str)],
) -> Vec<Member> {
    let env: Vec<(String, String)> =
        env.iter().map(|(name, value)| (name.to_string(), value.to_string())).collect();
    start_cluster_of(dir, count, |_| env.clone()).await
}

/// As [`start_cluster`], broker `i` (from 0) with the settings `env_of(i)` too.
async fn start_cluster_of(
    dir: &std::path::Path,
    count: usize,
    env_of: impl Fn(usize) -> Vec<(String, String)>,
) -> Vec<Member> {
    let cluster_ports: Vec<u16> = (0..count).map(|_| free_port()).collect();
    let mut members: Vec<Member> = (0..count)
        .map(|i| {
            let seed = (i > 0).then_some(cluster_ports[0]);
            let dir = dir.join(format!("n{}", i + 1));
            let mut member = Member::new(&dir, i as u64 + 1, cluster_ports[i], seed);
            member.process.env.extend(env_of(i));
            member
        })
        .collect();
    for member in &mut members {
        member.start();
    }
    let mut clients = Vec::new();
    for member in &members {
        clients.push(member.admin().await);
    }
    let node_ids: Vec<u64> = (1..=count as u64).collect();
    common::cluster_ready(&clients, &node_ids).await;
    members
}

/// The Node client written from the wire spec runs unchanged against every broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_client_is_served_by_every_broker() {
    let dir = tempfile::tempdir().unwrap();
    let members = start_cluster(dir.path(), 3).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/node/wire_smoke.js");
    for member in &members {
        member.admin().await;
        let port = member.process.port.to_string();
        let output = std::process::Command::new("node")
            .args([script, "127.0.0.1", &port, "app", common::PASSWORD])
            .output()
            .expect("Node.js is needed (installed by .ci/run)");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "broker on {port}: {stdout}{stderr}");
        assert!(stdout.contains("node wire smoke: ok"), "{stdout}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_brokers_share_metadata_and_survive_a_leader_kill() {
    let dir = tempfile::tempdir().unwrap();
    let mut members = start_cluster(dir.path(), 3).await;
    let mut clients = Vec::new();
    for member in &members {
        clients.push(member.admin().await);
    }

    // Every broker writes metadata and data of its own, and every broker reads all of it.
    for (i, client) in clients.iter().enumerate() {
        let topic = format!("t{}", i + 1);
        create_topic(client, &topic, 1).await;
        produce_and_read_back(client, &topic, 20).await;
        client
            .create_user(&format!("user{}", i + 1), "user-password-1", &["consume"])
            .await
            .unwrap();
    }
    for (i, client) in clients.iter().enumerate() {
        eventually(&format!("broker {} sees everything", i + 1), || async {
            let topics = client.list_topics().await.map_err(|e| e.to_string())?;
            let users = client.list_users().await.map_err(|e| e.to_string())?;
            let users: Vec<String> = users.into_iter().map(|user| user.username).collect();
            let complete = ["t1", "t2", "t3"].iter().all(|t| topics.contains(&t.to_string()))
                && ["user1", "user2", "user3"].iter().all(|u| users.contains(&u.to_string()));
            if complete { Ok(()) } else { Err(format!("{topics:?} {users:?}")) }
        })
        .await;
    }
    // Every broker reports the same three brokers and agrees on the groups' leaders.
    for (i, client) in clients.iter().enumerate() {
        eventually(&format!("broker {} reports the cluster", i + 1), || async {
            let status = client.cluster_status().await.map_err(|e| e.to_string())?;
            let brokers: Vec<u64> = status.brokers.iter().map(|broker| broker.node_id).collect();
            let leaders: Vec<u64> = status.groups.iter().map(|group| group.leader).collect();
            let voters = status.groups.iter().all(|group| group.voters == [1, 2, 3]);
            let first = clients[0].cluster_status().await.map_err(|e| e.to_string())?;
            let agreed: Vec<u64> = first.groups.iter().map(|group| group.leader).collect();
            let ok = status.node_id == i as u64 + 1
                && brokers == [1, 2, 3]
                && voters
                && leaders == agreed
                && leaders.iter().all(|leader| (1..=3).contains(leader));
            if ok { Ok(()) } else { Err(format!("{status:?} against leaders {agreed:?}")) }
        })
        .await;
    }
    // A user created through broker 3 logs in through broker 1 and is held to an ACL granted
    // through broker 2.
    clients[1].grant_acl("user3", "consume", "t1").await.unwrap();
    eventually("user3 reads t1 through broker 1", || async {
        let user = common::connect(members[0].process.port, "user3", "user-password-1").await?;
        let options = FetchOptions { max: 100, ..FetchOptions::default() };
        user.fetch("t1", &options).await.map(drop).map_err(|e| e.to_string())
    })
    .await;
    // Any broker serves any topic: produce through every broker to every topic (the records
    // go to the broker holding the segment), then read every topic through every broker.
    for (i, client) in clients.iter().enumerate() {
        for topic in ["t1", "t2", "t3"] {
            let batch = (0..5)
                .map(|n| {
                    RecordBuilder::new(format!("via{}-{n}", i + 1)).key(format!("k{n}")).build()
                })
                .collect();
            assert_eq!(client.produce(topic, batch).await.unwrap(), 5, "{topic} via {}", i + 1);
        }
    }
    for client in &clients {
        for topic in ["t1", "t2", "t3"] {
            let (read, _) = common::drain(client, topic, None).await;
            assert_eq!(read.len(), 35, "{topic}");
            // Per key, the records of each producing broker are in the order produced.
            for via in 1..=3 {
                let mine: Vec<String> = read
                    .iter()
                    .map(common::value)
                    .filter(|value| value.starts_with(&format!("via{via}-")))
                    .collect();
                let expected: Vec<String> = (0..5).map(|n| format!("via{via}-{n}")).collect();
                let mut sorted = mine.clone();
                sorted.sort();
                assert_eq!(sorted, expected, "{topic}");
            }
        }
    }

    // Kill the broker leading the vnode that holds the next topic, measured from the kill to
    // the first metadata write to that vnode that succeeds through a survivor.
    let status = leadership_spread(&clients[0], 3).await;
    let leader = leader_of(&status, "after-kill") as usize - 1;
    members[leader].kill();
    let survivor = (leader + 1) % 3;
    let killed_at = Instant::now();
    // A client retries `metadata_unavailable` (retryable) while the survivors elect a leader;
    // the broker retries inside its own bound first, which a loaded machine may outlast.
    create_topic(&clients[survivor], "after-kill", 1).await;
    let stall = killed_at.elapsed();
    eprintln!("vnode leader (broker {}) killed: metadata write stalled {stall:?}", leader + 1);
    let other = (leader + 2) % 3;
    clients[other].create_user("late", "user-password-1", &["consume"]).await.unwrap();
    let topics = clients[other].list_topics().await.unwrap();
    assert!(topics.contains(&"after-kill".to_string()), "{topics:?}");
    // Every segment has a copy on each broker (three replicas): every topic is read in full
    // and takes produce through either survivor. A head whose primary was killed answers a
    // retryable reason until failover sealed it on the survivors and its range rolled.
    for topic in ["t1", "t2", "t3"] {
        for client in [&clients[survivor], &clients[other]] {
            eventually_within(
                "every acknowledged record is read through a survivor",
                30,
                || async {
                    match try_drain(client, topic).await {
                        Ok(35) => Ok(()),
                        Ok(read) => Err(format!("{topic}: {read} records")),
                        Err(error) if error.is_retryable() => Err(format!("{topic}: {error}")),
                        Err(error) => panic!("{topic}: {error}"),
                    }
                },
            )
            .await;
        }
        eventually_within("produce through a survivor resumes", 30, || async {
            let batch = vec![RecordBuilder::new("after-kill").build()];
            clients[survivor].produce(topic, batch).await.map(drop).map_err(|e| e.to_string())
        })
        .await;
        eprintln!(
            "{topic}: produce through a survivor resumed {:?} after the kill",
            killed_at.elapsed()
        );
    }
    // Membership declares the killed broker dead on both survivors.
    let killed_id = leader as u64 + 1;
    for client in [&clients[survivor], &clients[other]] {
        status_becomes(client, killed_id, 2).await;
    }
    eprintln!("killed broker {killed_id} reported dead after {:?}", killed_at.elapsed());

    // The killed broker comes back as the same member and catches up.
    members[leader].start();
    let back = members[leader].admin().await;
    eventually("the restarted broker caught up", || async {
        let topics = back.list_topics().await.map_err(|e| e.to_string())?;
        if topics.contains(&"after-kill".to_string()) { Ok(()) } else { Err(format!("{topics:?}")) }
    })
    .await;
    for topic in ["t1", "t2", "t3"] {
        let (read, _) = common::drain(&back, topic, None).await;
        assert_eq!(read.len(), 36, "{topic}: every segment survived the kill");
    }
    create_topic(&back, "after-restart", 1).await;
    // ... and alive again, as seen by every broker.
    for client in clients.iter().enumerate().filter(|(i, _)| *i != leader).map(|(_, c)| c) {
        status_becomes(client, killed_id, 0).await;
    }
    status_becomes(&back, killed_id, 0).await;
}

/// `describe_segments` through every broker lists the head with its three copies in one replica
/// order (metadata's, the primary first), and every copy holds the acknowledged records once
/// the last follower caught up; the CLI prints them and finds nothing under-replicated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_broker_describes_each_copy_of_a_segment() {
    let dir = tempfile::tempdir().unwrap();
    let members = start_cluster(dir.path(), 3).await;
    let mut clients = Vec::new();
    for member in &members {
        clients.push(member.admin().await);
    }
    // Replicas go to live brokers only: wait until all three are.
    for node_id in 1..=3 {
        status_becomes(&clients[0], node_id, 0).await;
    }
    create_topic(&clients[0], "copies", 1).await;
    let batch = (0..12).map(|n| RecordBuilder::new(format!("r{n}")).build()).collect();
    assert_eq!(clients[0].produce("copies", batch).await.unwrap(), 12);
    let mut orders = Vec::new();
    for (at, client) in clients.iter().enumerate() {
        eventually(&format!("broker {} describes every copy at 12", at + 1), || async {
            let described = client.describe_segments("copies").await.map_err(|e| e.to_string())?;
            let [head] = &described.segments[..] else { return Err(format!("{described:?}")) };
            let mut nodes: Vec<u64> = head.copies.iter().map(|copy| copy.node_id).collect();
            nodes.sort();
            let caught_up = head.copies.iter().all(|copy| {
                copy.answered && copy.durable_offset == 12 && !copy.sealed && !copy.settled
            });
            let ok = head.state == SegmentState::Active && nodes == [1, 2, 3] && caught_up;
            if ok { Ok(()) } else { Err(format!("{head:?}")) }
        })
        .await;
        let described = client.describe_segments("copies").await.unwrap();
        let order: Vec<u64> = described.segments[0].copies.iter().map(|c| c.node_id).collect();
        orders.push(order);
    }
    assert!(orders.iter().all(|order| *order == orders[0]), "one replica order: {orders:?}");

    let server = members[1].process.address();
    let cli = |args: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_malachi"))
            .args(args)
            .args(["--server", &server, "--user", "admin", "--password", ADMIN_PASSWORD])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "{args:?}: {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        stdout
    };
    let replicas: Vec<String> = orders[0].iter().map(u64::to_string).collect();
    let described = cli(&["topic", "describe", "copies"]);
    let row = described.lines().find(|line| line.contains(" active ") && line.contains('*'));
    let row: Vec<&str> = row.unwrap_or_else(|| panic!("{described}")).split_whitespace().collect();
    let primary = format!("{}*", replicas[0]);
    let expected = [primary.as_str(), &replicas[1], &replicas[2], "12", "12", "12", "-", "-"];
    assert_eq!(row[6..], expected, "{described}");
    let status = cli(&["cluster", "status"]);
    assert!(status.contains("under-replicated: 0 segments (0 healing)"), "{status}");
}

/// The records of `topic` from its start, or the first refusal.
async fn try_drain(client: &Client, topic: &str) -> Result<usize, malachi_client::ClientError> {
    let mut cursor = None;
    let mut count = 0;
    loop {
        let options = FetchOptions { cursor: cursor.clone(), max: 500, ..FetchOptions::default() };
        let (page, next) = client.fetch(topic, &options).await?;
        if page.is_empty() {
            return Ok(count);
        }
        count += page.len();
        cursor = Some(next);
    }
}

/// Waits (up to 20 s: SWIM takes about 5 s to declare a broker dead) until `client`'s broker
/// reports broker `node_id` with `status` in both `cluster_state` and `cluster_status`.
async fn status_becomes(client: &Client, node_id: u64, status: u8) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let extension = client.cluster_status().await.unwrap();
        let reported = extension.brokers.iter().find(|broker| broker.node_id == node_id);
        let state = client.cluster_state().await.unwrap();
        let original = state
            .brokers
            .iter()
            .find(|broker| broker.id.as_deref() == Some(node_id.to_string().as_bytes()));
        let original = original.map(|broker| broker.status as u8);
        if reported.map(|broker| broker.status) == Some(status) && original == Some(status) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "broker {} never reported {node_id} with status {status}: {extension:?}",
            extension.node_id
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A broker whose data directory belongs to another cluster is refused when it tries to join,
/// with an error that says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_of_another_cluster_cannot_join() {
    let dir = tempfile::tempdir().unwrap();
    let (first_port, stray_port) = (free_port(), free_port());
    let mut first = Member::new(&dir.path().join("a"), 1, first_port, None);
    first.start();
    first.admin().await;
    // The stray broker starts a cluster of its own, stops, then is pointed at the first.
    let mut stray = Member::new(&dir.path().join("b"), 2, stray_port, None);
    stray.start();
    stray.admin().await;
    stray.kill();
    let mut joiner = Member::new(&dir.path().join("b"), 2, stray_port, Some(first_port));
    joiner.start();
    let status = joiner.child.as_mut().unwrap().wait().unwrap();
    assert!(!status.success());
    let log = joiner.process.log();
    assert!(log.contains("not signed by this cluster's CA"), "{log}");
}

/// Joining takes the cluster's token: without it the joiner stops with a reason naming the
/// setting; with a wrong one the seed refuses it and it stops; nothing of either is registered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_without_the_token_cannot_join() {
    let dir = tempfile::tempdir().unwrap();
    let first_port = free_port();
    let mut first = Member::new(&dir.path().join("a"), 1, first_port, None);
    first.start();
    let admin = first.admin().await;
    let cases = [
        ("b", None, "joining a cluster takes its token"),
        ("c", Some("a-wrong-token-of-at-least-32-characters"), "wrong cluster token"),
    ];
    for (name, token, expected) in cases {
        let mut joiner = Member::new(&dir.path().join(name), 2, free_port(), Some(first_port));
        match token {
            None => joiner.process.unset.push("MALACHI_CLUSTER_TOKEN".into()),
            Some(token) => joiner.process.env.push(("MALACHI_CLUSTER_TOKEN".into(), token.into())),
        }
        joiner.start();
        let status = joiner.child.as_mut().unwrap().wait().unwrap();
        assert!(!status.success(), "{name}");
        let log = joiner.process.log();
        assert!(log.contains(expected), "{name}: {log}");
        assert!(
            !dir.path().join(name).join("data").join("cluster").join("node.crt").exists(),
            "{name} was given a certificate"
        );
    }
    let status = admin.cluster_status().await.unwrap();
    assert_eq!(status.brokers.len(), 1, "{status:?}");
    assert!(first.process.log().contains("wrong cluster token"));
}

/// An operator's CA and node certificate files for broker `node_id` (from 1), under `dir`.
fn provided_files(dir: &std::path::Path, node_id: u64) -> ClusterFiles {
    let dir = dir.join(format!("pki{node_id}"));
    ClusterFiles {
        ca_cert: dir.join("ca.crt"),
        ca_key: None,
        node_cert: dir.join("node.crt"),
        node_key: dir.join("node.key"),
        token: None,
    }
}

/// Writes broker `node_id`'s files: `trusted` CA certificates, a certificate from `issuer`.
fn write_provided(files: &ClusterFiles, trusted: &[&ClusterCa], issuer: &ClusterCa, node_id: u64) {
    let bundle = Credentials {
        cert_pem: trusted.iter().map(|ca| ca.credentials.cert_pem.as_str()).collect(),
        key_pem: String::new(),
    };
    files.write(&bundle, &issuer.issue(node_id).unwrap(), "").unwrap();
}

/// The inter-node certificates move to a new CA under produce load, with no restart, as
/// docs/security.md ("Rotation") tells an operator to: the new CA joins every broker's CA file,
/// each broker's certificate is replaced by one of the new CA, the old CA leaves every CA file.
/// Producers see no failure meanwhile (connections already open keep their session). Then a
/// broker is killed and restarted: it can present and accept only the new CA's certificates,
/// and it rejoins, so the others serve and accept theirs. Every acknowledged record is read back
/// through every broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inter_node_certificates_rotate_to_a_new_ca_under_load() {
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (ClusterCa::generate("old").unwrap(), ClusterCa::generate("new").unwrap());
    let files: Vec<ClusterFiles> =
        (1..=3).map(|node_id| provided_files(dir.path(), node_id)).collect();
    for (node_id, files) in (1..).zip(&files) {
        write_provided(files, &[&old], &old, node_id);
    }
    let mut members = start_cluster_of(dir.path(), 3, |i| {
        let paths = [
            ("MALACHI_CLUSTER_TLS_CACERTFILE", &files[i].ca_cert),
            ("MALACHI_CLUSTER_TLS_CERTFILE", &files[i].node_cert),
            ("MALACHI_CLUSTER_TLS_KEYFILE", &files[i].node_key),
        ];
        paths.iter().map(|(name, path)| (name.to_string(), path.display().to_string())).collect()
    })
    .await;
    let admin = members[0].admin().await;
    create_topic(&admin, "rotated", 4).await;
    let addresses: Vec<String> = members.iter().map(|member| member.process.address()).collect();
    let load = Load::start(&addresses, &["rotated"], 6, ADMIN_PASSWORD);
    let acked_past = |count: usize| {
        let load = &load;
        async move {
            let acked = load.acked_count();
            if acked > count { Ok(()) } else { Err(format!("{acked} acknowledged")) }
        }
    };
    eventually_within("the load is acknowledged", 30, || acked_past(200)).await;
    let steps: [(&str, &[&ClusterCa], &ClusterCa); 3] = [
        ("the new CA is trusted too", &[&old, &new], &old),
        ("the certificates are the new CA's", &[&old, &new], &new),
        ("the old CA is trusted no more", &[&new], &new),
    ];
    for (step, trusted, issuer) in steps {
        for (node_id, files) in (1..).zip(&files) {
            write_provided(files, trusted, issuer, node_id);
        }
        let acked = load.acked_count();
        eventually_within(step, 30, || acked_past(acked + 200)).await;
        assert_eq!(load.failure_count(), 0, "a produce failed once {step}");
    }
    members[2].kill();
    members[2].start();
    let mut clients = Vec::new();
    for member in &members {
        clients.push(member.admin().await);
    }
    common::cluster_ready(&clients, &[1, 2, 3]).await;
    let acked = load.acked_count();
    eventually_within("the load goes on", 30, || acked_past(acked + 200)).await;
    let (acked, _) = load.stop().await;
    for client in &clients {
        assert_read_back(client, &["rotated"], &acked).await;
    }
}

/// A SWIM announce as foca's codec lays it out (docs/cluster.md): `broker_id` at `from`, with
/// `generation`, announcing itself to the broker at `to`. Addresses and attributes left empty.
fn announce(from: SocketAddr, broker_id: u64, generation: u64, to: SocketAddr) -> Vec<u8> {
    let peer = |at: SocketAddr, generation: u64, broker_id: u64| {
        let SocketAddr::V4(at) = at else { panic!("IPv4 only") };
        let mut bytes = vec![4];
        bytes.extend_from_slice(&at.ip().octets());
        bytes.extend_from_slice(&at.port().to_le_bytes());
        bytes.extend_from_slice(&generation.to_le_bytes());
        bytes.extend_from_slice(&broker_id.to_le_bytes());
        // Cluster address, client address, attributes: all empty.
        bytes.extend_from_slice(&[0, 0, 0]);
        bytes
    };
    let mut datagram = peer(from, generation, broker_id);
    datagram.extend_from_slice(&0u16.to_le_bytes());
    datagram.extend(peer(to, 0, 0));
    datagram.push(6);
    datagram
}

/// Gossip sealed with the cluster's token, as any member holding it could send, cannot forge
/// membership (issue 23): an announce of broker 2 with generation 2^63 once made broker 1 hold
/// broker 2 dead for a day. Now broker 1 refuses it, and broker 2 is never held dead over the
/// time SWIM would take to declare the superseded identity dead (4.5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_gossip_announce_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let members = start_cluster(dir.path(), 2).await;
    let gossip_address = |member: &Member| {
        let env = &member.process.env;
        let (_, port) = env.iter().find(|(name, _)| name == "MALACHI_CLUSTER_GOSSIP_PORT").unwrap();
        SocketAddr::from(([127, 0, 0, 1], port.parse::<u16>().unwrap()))
    };
    let victim = gossip_address(&members[0]);
    let forged = announce(gossip_address(&members[1]), 2, 1 << 63, victim);
    let seal = GossipSeal::from_tokens(&[common::CLUSTER_TOKEN]);
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    // The refusal names the generation (a broker that registered a moment ago may have been
    // refused too, for another reason).
    let refused = format!("generation {} is more than", 1u64 << 63);
    eventually_within("broker 1 refuses the forged announce", 30, || {
        socket.send_to(&seal.seal_random(&forged), victim).unwrap();
        let log = members[0].process.log();
        let found = log.contains(&refused);
        async move { found.then_some(()).ok_or_else(|| "not refused yet".to_string()) }
    })
    .await;
    let admin = members[0].admin().await;
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(8) {
        let view = admin.cluster_status().await.unwrap();
        let broker = view.brokers.iter().find(|broker| broker.node_id == 2);
        assert!(broker.is_some_and(|broker| broker.status != 2), "broker 2 held dead: {view:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Producers through every broker while the vnode leader is killed and restarted: every
/// acknowledged record is read back through every broker, each key in acknowledgement order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_under_load_loses_no_acknowledged_record() {
    let dir = tempfile::tempdir().unwrap();
    let mut members = start_cluster(dir.path(), 3).await;
    let mut clients = Vec::new();
    for member in &members {
        clients.push(member.admin().await);
    }
    // Topics created through each broker; placement spreads their segments, so the kill takes
    // some of their data with it until the broker is back.
    let topics = ["load1", "load2", "load3"];
    for (client, topic) in clients.iter().zip(topics) {
        create_topic(client, topic, 4).await;
    }
    let addresses: Vec<String> = members.iter().map(|member| member.process.address()).collect();
    let load = Load::start(&addresses, &topics, 6, ADMIN_PASSWORD);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // The leader of load1's vnode dies (and, with it, the vnodes it leads besides).
    let status = clients[0].cluster_status().await.unwrap();
    let leader = leader_of(&status, "load1") as usize - 1;
    members[leader].kill();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    members[leader].start();
    members[leader].admin().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (acked, _) = load.stop().await;
    let total: usize = acked.values().map(Vec::len).sum();
    assert!(total > 0, "nothing was acknowledged");
    for member in &members {
        assert_read_back(&member.admin().await, &topics, &acked).await;
    }
    eprintln!("{total} acknowledged records across a kill of broker {}, all read back", leader + 1);
}

/// A rolling restart with SIGTERM under load: each broker in turn hands its work over (its
/// leaderships to caught-up voters, the heads it is primary of rolled onto the others), exits
/// cleanly, and is started again; producers move to another broker when theirs closes. Nothing
/// acknowledged is lost, every broker ends with no head it leads left behind, and the stall
/// each restart cost is printed (the target, in docs/operations.md, is measured by
/// `scripts/rolling-restart`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_with_sigterm_hands_the_work_over_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut members = start_cluster(dir.path(), 3).await;
    let client = members[0].admin().await;
    let topics = ["rolling1", "rolling2"];
    for topic in topics {
        create_topic(&client, topic, 4).await;
    }
    let addresses: Vec<String> = members.iter().map(|member| member.process.address()).collect();
    let load = Load::start_with(&addresses, &topics, 6, ADMIN_PASSWORD, 1_200);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut windows = Vec::new();
    for (at, member) in members.iter_mut().enumerate() {
        let begun = Instant::now();
        assert!(member.terminate(), "broker {} did not exit cleanly on SIGTERM", at + 1);
        let log = member.process.log();
        let report = log.lines().rev().find(|line| line.contains("handed this broker's work over"));
        let report = report.expect("the broker logged its hand-over");
        assert!(report.contains("heads_left: 0"), "heads were left behind: {report}");
        member.start();
        let back = member.admin().await;
        for node_id in 1..=3 {
            status_becomes(&back, node_id, 0).await;
        }
        until_ready(member).await;
        windows.push((begun, Instant::now()));
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    let (acked, acked_at) = load.stop().await;
    for (at, window) in windows.iter().enumerate() {
        let gap = longest_gap_in(&acked_at, *window);
        eprintln!("restart of broker {}: longest wait for an acknowledgement {gap:?}", at + 1);
    }
    for member in &members {
        assert_read_back(&member.admin().await, &topics, &acked).await;
    }
    eprintln!("{} acknowledged records across three restarts, all read back", acked_at.len() * 4);
}

/// A self-signed certificate for `localhost` and `127.0.0.1` written under `dir` as
/// `name.crt` and `name.key`; the paths.
fn write_certificate(dir: &std::path::Path, name: &str) -> (String, String) {
    let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    let certified = rcgen::generate_simple_self_signed(names).unwrap();
    let (cert, key) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    (cert.display().to_string(), key.display().to_string())
}

/// The client port's TLS settings with the certificate `cert` and its key `key`.
fn client_tls(cert: &str, key: &str) -> Vec<(String, String)> {
    [("MALACHI_ENABLE_TLS", "true"), ("MALACHI_TLS_CERTFILE", cert), ("MALACHI_TLS_KEYFILE", key)]
        .into_iter()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect()
}

/// Clients that trust `ca_file` (PEM) only.
fn trusting(ca_file: &std::path::Path) -> malachi_client::TlsOptions {
    malachi_client::TlsOptions { ca_file: Some(ca_file.to_path_buf()), ..Default::default() }
}

/// The client port's certificate replaced broker by broker under load (a renewal, or a move to a
/// new issuer, docs/operations.md): producers over TLS that trust both the old and the new
/// certificate keep producing while each broker restarts on its new one; at the end every broker
/// presents the new certificate (a client trusting only it connects to each, one trusting only
/// the old one is refused by each), and every acknowledged record reads back through every broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_replaced_broker_by_broker_under_load_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (old_cert, old_key) = write_certificate(dir.path(), "old");
    let (new_cert, new_key) = write_certificate(dir.path(), "new");
    let both = dir.path().join("both.pem");
    let bundle =
        std::fs::read_to_string(&old_cert).unwrap() + &std::fs::read_to_string(&new_cert).unwrap();
    std::fs::write(&both, bundle).unwrap();
    let mut members = start_cluster_of(dir.path(), 3, |_| client_tls(&old_cert, &old_key)).await;
    let client = members[0].admin().await;
    let topics = ["renewed1", "renewed2"];
    for topic in topics {
        create_topic(&client, topic, 2).await;
    }
    let addresses: Vec<String> = members.iter().map(|member| member.process.address()).collect();
    let load = Load::start_over(&addresses, &topics, 6, ADMIN_PASSWORD, 512, Some(trusting(&both)));
    tokio::time::sleep(Duration::from_millis(1000)).await;
    for (at, member) in members.iter_mut().enumerate() {
        assert!(member.terminate(), "broker {} did not exit cleanly on SIGTERM", at + 1);
        member.process.env.retain(|(name, _)| !name.starts_with("MALACHI_TLS_"));
        member.process.env.extend(client_tls(&new_cert, &new_key));
        member.start();
        let back = member.admin().await;
        for node_id in 1..=3 {
            status_becomes(&back, node_id, 0).await;
        }
        until_ready(member).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let failures = load.failure_count();
    let (acked, _) = load.stop().await;
    assert!(!acked.is_empty(), "nothing was acknowledged over TLS");
    let (new_only, old_only) = (dir.path().join("new.crt"), dir.path().join("old.crt"));
    for member in &members {
        let address = member.process.address();
        let config = |trust| {
            ClientConfig::new(address.clone()).credentials("admin", ADMIN_PASSWORD).tls(trust)
        };
        Client::connect(config(trusting(&new_only))).await.expect("the new certificate is served");
        let refused = Client::connect(config(trusting(&old_only))).await;
        assert!(refused.is_err(), "broker at {address} still presents the old certificate");
        assert_read_back(&member.admin().await, &topics, &acked).await;
    }
    eprintln!(
        "certificates replaced on three brokers under load; {failures} produce calls retried"
    );
}

/// Topics created while a broker is away, so that its copies of the vnodes miss entries.
const TOPICS_WHILE_AWAY: usize = 64;

/// A broker back from a restart answers `/ready` only once its copy of every vnode has caught
/// up with the leader: at its first 200, each vnode has applied at least what the others had
/// applied before it started (the topics created while it was away). Knowing a leader and
/// having applied what it knows is committed is not enough: a follower back from a restart may
/// not have heard yet what was committed meanwhile. A rolling restart waits on `/ready` before
/// it stops the next broker, whose heads are then rolled onto brokers that know their topics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_broker_is_ready_only_once_its_metadata_caught_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut members = start_cluster(dir.path(), 3).await;
    assert!(members[2].terminate(), "broker 3 did not exit cleanly on SIGTERM");
    let client = members[0].admin().await;
    for topic in 0..TOPICS_WHILE_AWAY {
        create_topic(&client, &format!("away{topic}"), 1).await;
    }
    let mut applied: BTreeMap<String, f64> = BTreeMap::new();
    for member in &members[..2] {
        for (group, index) in vnodes_applied(member).await {
            let most = applied.entry(group).or_default();
            *most = most.max(index);
        }
    }
    assert_eq!(applied.len(), 8, "every vnode's applied index is reported: {applied:?}");
    members[2].start();
    until_ready(&members[2]).await;
    let seen = vnodes_applied(&members[2]).await;
    for (group, index) in &applied {
        let here = seen.get(group).copied().unwrap_or(-1.0);
        assert!(here >= *index, "ready with {group} applied to {here}, behind {index}: {seen:?}");
    }
    let back = members[2].admin().await;
    for topic in 0..TOPICS_WHILE_AWAY {
        back.describe_topic(&format!("away{topic}")).await.expect("known through broker 3");
    }
}

/// Waits until `member` answers `/ready` with 200, as a rolling restart waits before it stops
/// the next broker (docs/operations.md).
async fn until_ready(member: &Member) {
    common::until_ready(&format!("127.0.0.1:{}", member.process.dashboard_port), 60).await;
}

/// Each vnode's applied Raft index on `member`, from its `/metrics`, keyed `vnode-N`.
async fn vnodes_applied(member: &Member) -> BTreeMap<String, f64> {
    let address = format!("127.0.0.1:{}", member.process.dashboard_port);
    let metrics = common::http::get(&address, "/metrics", &[]).await;
    let samples = common::http::parse_prometheus(&metrics.body);
    let prefix = "malachi_raft_applied_index{group=\"";
    samples
        .into_iter()
        .filter_map(|(series, index)| {
            let group = series.strip_prefix(prefix)?.strip_suffix("\"}")?;
            group.starts_with("vnode-").then(|| (group.to_string(), index))
        })
        .collect()
}

/// How a test takes a head's primary away under load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PrimaryFailure {
    /// SIGKILL, and it stays down.
    Kill,
    /// SIGSTOP for a while (a stalled process: its sockets stay open, it answers nothing), then
    /// SIGCONT: it comes back to find its head sealed around it.
    Pause,
}

/// The primary of a replicated head fails under load: the head is sealed by failover from the
/// two other copies, the range rolls to a new segment off the failed broker, producers
/// (connected to the others) are acknowledged again, and every acknowledged record is read back
/// in order through every live broker (a paused one too, once it is back).
async fn primary_fails_under_load(failure: PrimaryFailure) {
    let dir = tempfile::tempdir().unwrap();
    let mut members = start_cluster(dir.path(), 3).await;
    let client = members[0].admin().await;
    for node_id in 1..=3 {
        status_becomes(&client, node_id, 0).await;
    }
    create_topic(&client, "primary", 1).await;
    client.produce("primary", vec![RecordBuilder::new("warm=0").build()]).await.unwrap();
    // The range's head now (metadata may have rolled the first segment already).
    let described = client.describe_segments("primary").await.unwrap();
    let head = described.segments.iter().rfind(|segment| segment.state == SegmentState::Active);
    let head = head.expect("an active head").clone();
    let primary = head.copies[0].node_id as usize - 1;
    let survivors: Vec<usize> = (0..3).filter(|&at| at != primary).collect();
    let addresses: Vec<String> =
        survivors.iter().map(|&at| members[at].process.address()).collect();
    let load = Load::start(&addresses, &["primary"], 4, ADMIN_PASSWORD);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let failed_at = Instant::now();
    match failure {
        PrimaryFailure::Kill => members[primary].kill(),
        PrimaryFailure::Pause => members[primary].signal("STOP"),
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    if failure == PrimaryFailure::Pause {
        members[primary].signal("CONT");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let (acked, acked_at) = load.stop().await;
    let after: Vec<&Instant> = acked_at.iter().filter(|at| **at > failed_at).collect();
    assert!(after.len() > 10, "produce did not resume after the primary failed: {}", after.len());
    // The longest the producers went without an acknowledgement from the failure on.
    let from_failure = acked_at.iter().filter(|at| **at <= failed_at).max().unwrap_or(&failed_at);
    let stall = std::iter::once(from_failure)
        .chain(after.iter().copied())
        .collect::<Vec<_>>()
        .windows(2)
        .map(|pair| pair[1].duration_since(*pair[0]))
        .max()
        .unwrap_or_default();
    eprintln!(
        "primary broker {} ({failure:?}): {} acknowledgements before, {} after, stall {stall:?}",
        primary + 1,
        acked_at.len() - after.len(),
        after.len()
    );
    let readers: Vec<usize> = match failure {
        PrimaryFailure::Kill => survivors.clone(),
        PrimaryFailure::Pause => (0..3).collect(),
    };
    for &at in &readers {
        assert_read_back(&members[at].admin().await, &["primary"], &acked).await;
    }
    let survivor = members[survivors[0]].admin().await;
    let described = survivor.describe_segments("primary").await.unwrap();
    let failed_head = described.segments.iter().find(|s| s.segment_id == head.segment_id);
    let failed_head = failed_head.expect("the failed primary's head is still listed");
    assert_eq!(
        failed_head.state,
        SegmentState::Sealed,
        "the failed primary's head is sealed: {failed_head:?}"
    );
    let head = described.segments.last().unwrap();
    let failed = primary as u64 + 1;
    assert!(
        head.copies.iter().all(|copy| copy.node_id != failed),
        "new head on the failed: {head:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_primary_under_load_loses_nothing_and_produce_resumes() {
    primary_fails_under_load(PrimaryFailure::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pausing_a_primary_under_load_loses_nothing_and_produce_resumes() {
    primary_fails_under_load(PrimaryFailure::Pause).await;
}

/// The file of `segment_id` under a broker's data directory (topics/<topic>/<range>/).
fn segment_file(data_dir: &std::path::Path, segment_id: u64) -> Option<std::path::PathBuf> {
    let name = format!("{segment_id:020}.seg");
    for topic in std::fs::read_dir(data_dir.join("topics")).ok()? {
        for range in std::fs::read_dir(topic.ok()?.path()).ok()? {
            let path = range.ok()?.path().join(&name);
            if path.exists() {
                return Some(path);
            }
        }
    }
    None
}

/// Whether the file of a sealed copy verifies: every frame's checksum and the seal at
/// `data_bytes`.
fn copy_verifies(path: &std::path::Path, segment_id: u64, data_bytes: u64) -> Result<(), String> {
    let dir = path.parent().expect("a range directory");
    let storage = malachi_log::RealStorage;
    let report =
        malachi_log::verify_segment(&storage, dir, segment_id).map_err(|e| e.to_string())?;
    let sealed_at = report.sealed.map(|seal| seal.data_bytes);
    if report.bad_frames.is_empty() && sealed_at == Some(data_bytes) {
        Ok(())
    } else {
        Err(format!("{} bad frames, sealed at {sealed_at:?}", report.bad_frames.len()))
    }
}

/// Sealed segments of a replicated topic whose copies a follower loses on disk (its file
/// deleted, cut in half, a byte flipped): the scrubber finds each and rebuilds it from a copy
/// that verifies, metadata records it settled again, and every record reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_follower_copies_are_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let settings = [
        ("MALACHI_SEGMENT_MAX_BYTES", "4096"),
        ("MALACHI_AUTO_SPLIT_ENABLED", "false"),
        ("MALACHI_SCRUB_ENABLED", "true"),
        ("MALACHI_SCRUB_INTERVAL_MS", "200"),
        ("MALACHI_SCRUB_SEGMENTS_PER_TICK", "4"),
    ];
    let members = start_cluster_with(dir.path(), 3, &settings).await;
    let client = members[0].admin().await;
    for node_id in 1..=3 {
        status_becomes(&client, node_id, 0).await;
    }
    create_topic(&client, "damage", 1).await;
    let mut produced = 0;
    for batch in 0..30 {
        let records: Vec<_> = (0..10)
            .map(|n| RecordBuilder::new(format!("b{batch}-r{n}-{}", "x".repeat(80))).build())
            .collect();
        produced += client.produce("damage", records).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let settled = loop {
        let described = client.describe_segments("damage").await.unwrap();
        let settled: Vec<_> = described
            .segments
            .into_iter()
            .filter(|segment| {
                segment.state == SegmentState::Sealed
                    && segment.copies.len() == 3
                    && segment.copies.iter().all(|copy| copy.settled)
            })
            .collect();
        if settled.len() >= 3 {
            break settled;
        }
        assert!(Instant::now() < deadline, "three sealed segments never settled: {settled:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let data_dir = |node_id: u64| dir.path().join(format!("n{node_id}")).join("data");
    let mut damaged = Vec::new();
    for (segment, how) in settled.iter().zip(["delete", "truncate", "flip"]) {
        let follower = segment.copies[1].node_id;
        let path = segment_file(&data_dir(follower), segment.segment_id).expect("the copy's file");
        let length = std::fs::metadata(&path).unwrap().len();
        match how {
            "delete" => std::fs::remove_file(&path).unwrap(),
            "truncate" => std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(length / 2)
                .unwrap(),
            _ => {
                let mut bytes = std::fs::read(&path).unwrap();
                bytes[length as usize / 2] ^= 0x40;
                std::fs::write(&path, bytes).unwrap();
            }
        }
        eprintln!("{how}: broker {follower}'s copy of segment {}", segment.segment_id);
        damaged.push((segment.segment_id, segment.data_bytes, follower, path));
    }
    for (segment_id, data_bytes, follower, path) in &damaged {
        eventually_within(
            &format!("broker {follower}'s copy of {segment_id} rebuilt"),
            60,
            || async {
                copy_verifies(path, *segment_id, *data_bytes)?;
                let described =
                    client.describe_segments("damage").await.map_err(|e| e.to_string())?;
                let segment = described.segments.iter().find(|s| s.segment_id == *segment_id);
                let settled = segment.is_some_and(|s| s.copies.iter().all(|copy| copy.settled));
                if settled { Ok(()) } else { Err(format!("not settled: {segment:?}")) }
            },
        )
        .await;
    }
    for member in &members {
        let (records, _) = common::drain(&member.admin().await, "damage", None).await;
        assert_eq!(records.len(), produced as usize, "every record reads back");
    }
}

/// A broker that dies for good (its disk lost with it): once membership has held it dead for
/// MALACHI_REPLICA_REPLACE_AFTER_MS, each sealed segment it held a replica of gets a new one on
/// the broker that had none, rebuilt and settled, and only then does the dead replica leave the
/// set; every record reads back through every live broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_move_off_a_broker_dead_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let settings = [
        ("MALACHI_SEGMENT_MAX_BYTES", "4096"),
        ("MALACHI_AUTO_SPLIT_ENABLED", "false"),
        ("MALACHI_REPLICA_REPLACE_AFTER_MS", "1000"),
    ];
    let mut members = start_cluster_with(dir.path(), 4, &settings).await;
    let client = members[0].admin().await;
    for node_id in 1..=4 {
        status_becomes(&client, node_id, 0).await;
    }
    create_topic(&client, "moved", 1).await;
    let mut produced = 0;
    for batch in 0..20 {
        let records: Vec<_> = (0..10)
            .map(|n| RecordBuilder::new(format!("b{batch}-r{n}-{}", "x".repeat(80))).build())
            .collect();
        produced += client.produce("moved", records).await.unwrap();
    }
    let settled_sealed = || async {
        let described = client.describe_segments("moved").await.map_err(|e| e.to_string())?;
        Ok::<_, String>(
            described
                .segments
                .into_iter()
                .filter(|segment| {
                    segment.state == SegmentState::Sealed
                        && segment.copies.len() == 3
                        && segment.copies.iter().all(|copy| copy.settled)
                })
                .collect::<Vec<_>>(),
        )
    };
    eventually_within("two sealed segments settled on three replicas", 30, || async {
        let settled = settled_sealed().await?;
        if settled.len() >= 2 { Ok(()) } else { Err(format!("{settled:?}")) }
    })
    .await;
    let sealed = settled_sealed().await.unwrap();
    let holders = |segment: &malachi_client::SegmentDescription| -> Vec<u64> {
        segment.copies.iter().map(|copy| copy.node_id).collect()
    };
    let victim = (2..=4)
        .find(|node| sealed.iter().any(|segment| holders(segment).contains(node)))
        .expect("a broker other than 1 holds a sealed copy");
    let held: Vec<u64> = sealed
        .iter()
        .filter(|segment| holders(segment).contains(&victim))
        .map(|segment| segment.segment_id)
        .collect();
    members[victim as usize - 1].kill();
    let killed_at = Instant::now();
    eprintln!("broker {victim}, holding copies of {held:?}, killed for good");
    eventually_within("every copy of the dead broker moved and settled", 60, || async {
        let described = client.describe_segments("moved").await.map_err(|e| e.to_string())?;
        for segment_id in &held {
            let segment = described.segments.iter().find(|s| s.segment_id == *segment_id);
            let Some(segment) = segment else { return Err(format!("{segment_id} is gone")) };
            let nodes = holders(segment);
            let moved = nodes.len() == 3
                && !nodes.contains(&victim)
                && segment.copies.iter().all(|copy| copy.settled);
            if !moved {
                return Err(format!("segment {segment_id}: {:?}", segment.copies));
            }
        }
        Ok(())
    })
    .await;
    eprintln!("the dead broker's copies moved {:?} after the kill", killed_at.elapsed());
    for (index, member) in members.iter().enumerate() {
        if index as u64 + 1 == victim {
            continue;
        }
        let (records, _) = common::drain(&member.admin().await, "moved", None).await;
        assert_eq!(records.len(), produced as usize, "every record reads back");
    }
    // The dead broker returns: the copies it no longer holds a replica of are deleted there.
    let returned = &mut members[victim as usize - 1];
    returned.start();
    let returned_dir = returned.process.dir.clone();
    eventually_within("the returned broker deleted its dropped copies", 60, || async {
        let left: Vec<u64> = held
            .iter()
            .copied()
            .filter(|id| find_dir_holding(&returned_dir, &format!("{id:020}.seg")).is_some())
            .collect();
        if left.is_empty() { Ok(()) } else { Err(format!("files of {left:?} are left")) }
    })
    .await;
}

/// The vnode's leader coordinates for every broker: heads held anywhere roll when they fill, a
/// topic under load through the other brokers splits, an operator's split through a broker
/// that does not lead is carried out by the leader, and only the leader logs reshapes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vnode_leader_coordinates_for_every_broker() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("MALACHI_SEGMENT_MAX_BYTES", "4096"),
        ("MALACHI_AUTO_SPLIT_ENABLED", "true"),
        ("MALACHI_AUTO_SPLIT_WINDOW_MS", "2000"),
        ("MALACHI_SPLIT_RECORDS_PER_S", "200"),
        ("MALACHI_MERGE_RECORDS_PER_S", "0"),
        ("MALACHI_RESHAPE_COOLDOWN_MS", "1000"),
    ];
    let members = start_cluster_with(dir.path(), 3, &env).await;
    let mut clients = Vec::new();
    for member in &members {
        clients.push(member.admin().await);
    }
    let status = leadership_spread(&clients[0], 3).await;
    // The two topics live in vnodes of one leader, so that the reshapes of both are its own.
    let names: Vec<String> = (0..64).map(|n| format!("busy{n}")).collect();
    let leader = leader_of(&status, "manual");
    let busy = names.iter().find(|name| leader_of(&status, name) == leader).expect("a name");
    let followers: Vec<usize> = (0..3).filter(|&i| i as u64 + 1 != leader).collect();

    // An operator's split through a follower.
    let follower = &clients[followers[0]];
    create_topic(follower, "manual", 1).await;
    produce_and_read_back(follower, "manual", 10).await;
    assert_eq!(follower.split_range("manual", 0).await.unwrap(), (1, 2));
    let described = follower.describe_topic("manual").await.unwrap();
    assert_eq!(
        described.ranges.iter().filter(|range| range.state == RangeState::Active).count(),
        2
    );

    // Load through both followers until heads have filled and rolled and the hot range split:
    // as long as that takes on this machine (the split follows the measured rate, which a slow
    // machine reaches later), not for a fixed time.
    create_topic(follower, busy, 1).await;
    let mut acknowledged = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        for &at in &followers {
            let batch = (0..100)
                .map(|n| {
                    RecordBuilder::new(format!("{n:04}{}", "x".repeat(100)))
                        .key(format!("k{n}"))
                        .build()
                })
                .collect();
            acknowledged += clients[at].produce(busy, batch).await.unwrap() as usize;
        }
        let described = follower.describe_topic(busy).await.unwrap();
        let active = described.ranges.iter().filter(|r| r.state == RangeState::Active).count();
        let rolled = described.ranges.iter().any(|range| range.segments > 1);
        if active > 1 && rolled {
            break;
        }
        assert!(Instant::now() < deadline, "the busy topic did not roll and split: {described:?}");
    }
    for client in &clients {
        let (read, _) = common::drain(client, busy, None).await;
        assert_eq!(read.len(), acknowledged, "every acknowledged record, through every broker");
    }
    // The leader logs the reshape once it applied it, a moment after metadata shows it.
    let leader_log = &members[leader as usize - 1].process;
    eventually("the vnode leader logged the reshape", || async {
        let logged = leader_log.log().contains("reshaped");
        if logged { Ok(()) } else { Err("not yet".to_string()) }
    })
    .await;
    for (at, member) in members.iter().enumerate() {
        let reshaped = member.process.log().contains("reshaped");
        assert_eq!(reshaped, at as u64 + 1 == leader, "broker {} logged a reshape", at + 1);
    }
    let after = clients[0].cluster_status().await.unwrap();
    assert_eq!(leader_of(&after, busy), leader, "the leadership stayed where it settled");
}

/// Seats follow the brokers: the vnode seat of a broker dead longer than
/// MALACHI_VOTER_REPLACE_AFTER_MS moves to a live learner, and `cluster remove` decommissions a
/// voter (its seats move, then the cluster forgets it) while metadata and data keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seats_move_off_dead_and_removed_brokers() {
    let dir = tempfile::tempdir().unwrap();
    let env = [("MALACHI_VOTER_REPLACE_AFTER_MS", "1000")];
    let mut members = start_cluster_with(dir.path(), 4, &env).await;
    let mut clients = Vec::new();
    for member in &members {
        clients.push(member.admin().await);
    }
    let seats = |status: &malachi_client::ClusterStatusResponse, group_id: u64| {
        let group = status.groups.iter().find(|group| group.group_id == group_id);
        group.map(|group| (group.voters.clone(), group.learners.clone(), group.leader))
    };
    // Which three brokers vote in the vnode depends on the order the joiners were admitted.
    eventually("four brokers: all vote in admin, three in the vnode", || async {
        let status = clients[0].cluster_status().await.map_err(|e| e.to_string())?;
        let (admin, vnode_now) = (seats(&status, 0), seats(&status, 1));
        let settled = admin.is_some_and(|(voters, _, _)| voters == [1, 2, 3, 4])
            && vnode_now.as_ref().is_some_and(|(voters, learners, leader)| {
                voters.len() == 3 && learners.len() == 1 && *leader != 0
            });
        if settled { Ok(()) } else { Err(format!("{status:?}")) }
    })
    .await;
    let status = clients[0].cluster_status().await.unwrap();
    let (voters, learners, leader) = seats(&status, 1).expect("the vnode group");
    let learner = learners[0];
    let victim = *voters.iter().find(|&&id| id != 1 && id != leader).expect("a follower voter");
    create_topic(&clients[0], "kept", 1).await;
    produce_and_read_back(&clients[0], "kept", 10).await;

    // The victim dies: its vnode seat goes to the learner once membership held it dead 1 s.
    members[victim as usize - 1].kill();
    let mut expected: Vec<u64> = voters.iter().copied().filter(|&id| id != victim).collect();
    expected.push(learner);
    expected.sort_unstable();
    let killed_at = Instant::now();
    eventually_within("the dead broker's seat moves to the learner", 30, || async {
        let status = clients[0].cluster_status().await.map_err(|e| e.to_string())?;
        let now = seats(&status, 1).map(|(voters, _, _)| voters);
        if now.as_ref() == Some(&expected) { Ok(()) } else { Err(format!("{status:?}")) }
    })
    .await;
    eprintln!(
        "broker {victim}'s vnode seat moved to {learner} {:?} after the kill",
        killed_at.elapsed()
    );
    create_topic(&clients[0], "after-move", 1).await;
    members[victim as usize - 1].start();
    clients[victim as usize - 1] = members[victim as usize - 1].admin().await;

    // Refusals name their cause.
    let unknown = clients[0].remove_broker(99, false).await.unwrap_err();
    assert_eq!(unknown.reason(), Some(malachi_client::Reason::NoSuchBroker), "{unknown}");
    let removed = *expected.iter().find(|&&id| id != 1).expect("another voter");
    let itself = clients[removed as usize - 1].remove_broker(removed, false).await.unwrap_err();
    assert_eq!(itself.reason(), Some(malachi_client::Reason::CannotRemoveSelf), "{itself}");

    // A vnode voter is decommissioned through broker 1: its seats move (the restarted victim
    // is the learner now), then it is forgotten.
    clients[0].remove_broker(removed, true).await.unwrap();
    let remaining: Vec<u64> = (1..=4).filter(|&id| id != removed).collect();
    eventually("the removed broker is gone from the cluster", || async {
        let status = clients[0].cluster_status().await.map_err(|e| e.to_string())?;
        let brokers: Vec<u64> = status.brokers.iter().map(|broker| broker.node_id).collect();
        let gone = brokers == remaining
            && status.groups.iter().all(|group| {
                !group.voters.contains(&removed) && !group.learners.contains(&removed)
            })
            && seats(&status, 1).is_some_and(|(voters, _, _)| voters.len() == 3);
        if gone { Ok(()) } else { Err(format!("{status:?}")) }
    })
    .await;
    for &id in &remaining {
        let topic = format!("after-remove-{id}");
        let client = &clients[id as usize - 1];
        create_topic(client, &topic, 1).await;
        produce_and_read_back(client, &topic, 10).await;
        let topics = client.list_topics().await.unwrap();
        assert!(topics.contains(&"after-move".to_string()), "{topics:?}");
    }
}

/// Segments placed on two of three brokers while the third was down regain their third copy
/// once it returns (issue 25): the head is rolled onto three brokers, healing adds the missing
/// replica to each sealed segment and rebuilds it, `/metrics` counts them under-replicated
/// until then, and every copy holds every record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segments_placed_while_a_broker_was_down_regain_their_copies() {
    let dir = tempfile::tempdir().unwrap();
    let settings = [("MALACHI_SEGMENT_MAX_BYTES", "8192"), ("MALACHI_AUTO_SPLIT_ENABLED", "false")];
    let mut members = start_cluster_with(dir.path(), 3, &settings).await;
    let client = members[0].admin().await;
    members[2].kill();
    status_becomes(&client, 3, 2).await;
    create_topic(&client, "regrown", 1).await;
    let mut produced = Vec::new();
    for batch in 0..40 {
        let values: Vec<String> =
            (0..10).map(|n| format!("b{batch}-r{n}-{}", "x".repeat(200))).collect();
        let records =
            values.iter().map(|value| RecordBuilder::new(value.clone()).build()).collect();
        client.produce("regrown", records).await.unwrap();
        produced.extend(values);
    }
    let described = client.describe_segments("regrown").await.unwrap();
    // Whether the head rolled while the broker was down depends on timing (a full head rolls
    // on a later append): the head itself was placed on two brokers and must grow too.
    assert!(!described.segments.is_empty());
    for segment in &described.segments {
        let holders: Vec<u64> = segment.copies.iter().map(|copy| copy.node_id).collect();
        assert_eq!(holders.len(), 2, "placed on the two live brokers: {holders:?}");
    }
    assert!(under_replicated(&members[..2]).await >= described.segments.len() as f64);

    members[2].start();
    eventually_within("every segment holds three settled copies", 90, || async {
        let described = client.describe_segments("regrown").await.map_err(|e| e.to_string())?;
        let whole = described.segments.iter().all(|segment| {
            segment.copies.len() == 3
                && (segment.state == SegmentState::Active
                    || segment.copies.iter().all(|copy| copy.settled))
        });
        let sealed = described.segments.iter().any(|s| s.state == SegmentState::Sealed);
        if whole && sealed { Ok(()) } else { Err(format!("{:?}", described.segments)) }
    })
    .await;
    eventually_within("no broker counts a segment under-replicated", 30, || async {
        let count = under_replicated(&members).await;
        if count == 0.0 { Ok(()) } else { Err(format!("{count} under-replicated")) }
    })
    .await;
    for member in &members {
        let (records, _) = common::drain(&member.admin().await, "regrown", None).await;
        let values: Vec<String> = records.iter().map(common::value).collect();
        assert_eq!(values, produced, "every record reads back through every broker");
    }

    // Each broker's own copy of each sealed segment, read from its files with the brokers
    // stopped, holds the same records.
    let described = client.describe_segments("regrown").await.unwrap();
    let sealed: Vec<_> =
        described.segments.iter().filter(|segment| segment.state == SegmentState::Sealed).collect();
    for member in &mut members {
        member.kill();
    }
    for (index, member) in members.iter().enumerate() {
        let mut values = Vec::new();
        for segment in &sealed {
            values.extend(copy_values(&member.process.dir, segment.segment_id));
        }
        assert_eq!(values, produced[..values.len()], "broker {}'s copies", index + 1);
        let sealed_records: usize = sealed.iter().map(|s| s.end_offset as usize).sum();
        assert_eq!(values.len(), sealed_records, "broker {}'s copies are whole", index + 1);
    }
}

/// `malachi_under_replicated_segments` summed over `members` (each vnode's leader reports its
/// own).
async fn under_replicated(members: &[Member]) -> f64 {
    let mut count = 0.0;
    for member in members {
        let address = format!("127.0.0.1:{}", member.process.dashboard_port);
        let metrics = common::http::get(&address, "/metrics", &[]).await;
        let samples = common::http::parse_prometheus(&metrics.body);
        count += samples.get("malachi_under_replicated_segments").copied().unwrap_or(0.0);
    }
    count
}

/// The values of the records in segment `segment_id`'s file under `data_dir`, read as the
/// broker would read them (the broker stopped).
fn copy_values(data_dir: &std::path::Path, segment_id: u64) -> Vec<String> {
    let name = format!("{segment_id:020}.seg");
    let range_dir = find_dir_holding(data_dir, &name)
        .unwrap_or_else(|| panic!("{name} under {}", data_dir.display()));
    let storage: std::sync::Arc<dyn malachi_log::Storage> =
        std::sync::Arc::new(malachi_log::RealStorage);
    let committer = malachi_log::Committer::new(None, 1, Duration::ZERO);
    let config = malachi_log::SegmentConfig::default();
    let (segment, _) =
        malachi_log::Segment::open_read_only(storage, &range_dir, segment_id, config, &committer)
            .unwrap();
    let mut values = Vec::new();
    loop {
        let batch = segment.read(values.len() as u64, 1_000, 1 << 20).unwrap();
        if batch.records.is_empty() {
            return values;
        }
        values.extend(
            batch
                .records
                .iter()
                .map(|stored| String::from_utf8(stored.record.value.to_vec()).unwrap()),
        );
    }
}

fn find_dir_holding(dir: &std::path::Path, name: &str) -> Option<std::path::PathBuf> {
    for entry in std::fs::read_dir(dir).ok()? {
        let path = entry.ok()?.path();
        if path.file_name().is_some_and(|file| file == name) {
            return Some(dir.to_path_buf());
        }
        if path.is_dir()
            && let Some(found) = find_dir_holding(&path, name)
        {
            return Some(found);
        }
    }
    None
}

/// The most common path to a cluster: one broker started alone with nothing configured, later
/// restarted with an inter-node port and joined by two more. Its topics' metadata ends spread
/// over vnodes led by all three (the ring of a broker alone has the cluster's size from its
/// first start), and every topic reads back whole through every broker, also while it grows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_started_alone_grows_into_three_with_its_metadata_spread() {
    let dir = tempfile::tempdir().unwrap();
    let topics: Vec<String> = (0..8).map(|n| format!("grown{n}")).collect();
    let alone = BrokerProcess::new(&dir.path().join("n1"));
    std::fs::create_dir_all(&alone.dir).unwrap();
    let mut process = alone.spawn();
    let client = alone.connect_as("admin", ADMIN_PASSWORD).await;
    for topic in &topics {
        create_topic(&client, topic, 1).await;
        produce_and_read_back(&client, topic, 20).await;
    }
    process.kill().unwrap();
    process.wait().unwrap();

    let ports = [free_port(), free_port(), free_port()];
    let mut members: Vec<Member> = (0..3)
        .map(|i| {
            let seed = (i > 0).then_some(ports[0]);
            Member::new(&dir.path().join(format!("n{}", i + 1)), i as u64 + 1, ports[i], seed)
        })
        .collect();
    members[0].start();
    let first = members[0].admin().await;
    let reads = Reads::start(members[0].process.address(), topics.clone());
    members[1].start();
    members[2].start();
    let mut clients = Vec::new();
    for member in &members {
        clients.push(member.admin().await);
    }
    common::cluster_ready(&clients, &[1, 2, 3]).await;
    let status = leadership_spread(&first, 3).await;
    let leaders: std::collections::BTreeSet<u64> =
        topics.iter().map(|topic| leader_of(&status, topic)).collect();
    assert!(leaders.len() >= 2, "the topics' vnodes are led by one broker: {leaders:?}");
    let failures = reads.stop().await;
    assert!(failures.is_empty(), "a topic was unreadable while the cluster grew: {failures:?}");
    for (at, client) in clients.iter().enumerate() {
        for topic in &topics {
            let (records, _) = common::drain(client, topic, None).await;
            assert_eq!(records.len(), 20, "{topic} through broker {}", at + 1);
        }
    }
}

/// Reads every topic through one broker in a loop until stopped, keeping each failure that is
/// not retryable (an election's `metadata_unavailable` is, as for any client).
struct Reads {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<Vec<String>>,
}

impl Reads {
    fn start(address: String, topics: Vec<String>) -> Reads {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let client = common::connect_to(&address, "admin", ADMIN_PASSWORD).await.unwrap();
            let mut failures = Vec::new();
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                for topic in &topics {
                    match try_drain(&client, topic).await {
                        Ok(20) => {}
                        Ok(other) => failures.push(format!("{topic}: {other} records")),
                        Err(error) if error.is_retryable() => {}
                        Err(error) => failures.push(format!("{topic}: {error}")),
                    }
                }
            }
            failures
        });
        Reads { stop, task }
    }

    async fn stop(self) -> Vec<String> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

/// `malachi cluster drain` through another broker: the drained broker hands its Raft
/// leaderships and the write heads it is primary of to the others and keeps serving clients;
/// once undrained, leadership spreads back to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_broker_leads_nothing_serves_on_and_takes_work_again() {
    let dir = tempfile::tempdir().unwrap();
    let members = start_cluster(dir.path(), 3).await;
    let client = members[0].admin().await;
    create_topic(&client, "drained", 4).await;
    produce_and_read_back(&client, "drained", 40).await;
    leadership_spread(&client, 3).await;
    let primaries = |segments: &malachi_client::DescribeSegmentsResponse| -> Vec<u64> {
        let active = segments.segments.iter().filter(|s| s.state == SegmentState::Active);
        active.map(|segment| segment.copies[0].node_id).collect()
    };

    // The primary of a head is drained, through another broker.
    let target = primaries(&client.describe_segments("drained").await.unwrap())[0];
    let asking = members[target as usize % 3].admin().await;
    let report = asking.drain_broker(target, true).await.unwrap();
    eprintln!("drained broker {target}: {report:?}");
    assert_eq!((report.brokers_told, report.leaderships_kept, report.heads_left), (2, 0, 0));
    assert!(report.leaderships_moved > 0, "every broker led vnodes after the spread: {report:?}");
    assert!(report.heads_rolled > 0, "broker {target} was a head's primary: {report:?}");
    let drained = members[target as usize - 1].admin().await;
    eventually("the drained broker leads no group and is no head's primary", || async {
        let status = drained.cluster_status().await.map_err(|error| error.to_string())?;
        let led: Vec<u64> =
            status.groups.iter().filter(|g| g.leader == target).map(|g| g.group_id).collect();
        let segments = drained.describe_segments("drained").await.map_err(|e| e.to_string())?;
        let primaries = primaries(&segments);
        if led.is_empty() && !primaries.contains(&target) && primaries.len() == 4 {
            Ok(())
        } else {
            Err(format!("leads {led:?}; primaries {primaries:?}"))
        }
    })
    .await;
    create_topic(&drained, "drained-after", 2).await;
    let records = (0..20).map(|i| RecordBuilder::new(format!("after-{i}")).build()).collect();
    assert_eq!(drained.produce("drained-after", records).await.unwrap(), 20);
    let segments = drained.describe_segments("drained-after").await.unwrap();
    let primaries = primaries(&segments);
    assert!(!primaries.contains(&target), "a new head's primary is the drained broker");
    let (records, _) = common::drain(&drained, "drained", None).await;
    assert_eq!(records.len(), 40, "the drained broker still serves reads");

    let undrained = asking.drain_broker(target, false).await.unwrap();
    assert_eq!(undrained.heads_rolled, 0, "taking work again moves nothing");
    leadership_spread(&client, 3).await;
    let missing = client.drain_broker(9, true).await.unwrap_err();
    assert_eq!(missing.reason(), Some(malachi_client::Reason::NoSuchBroker), "{missing:?}");
}

/// A setting changed broker by broker under load (docs/operations.md, "A rolling restart"): each
/// broker in turn is stopped with SIGTERM and started with a placement attribute and a
/// retention default it did not have. Every broker ends up known by its new attribute, nothing
/// acknowledged is lost, and every record reads back through every broker. (Certificates
/// changed the same way: `inter_node_certificates_rotate_to_a_new_ca_under_load`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setting_changed_broker_by_broker_under_load_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut members = start_cluster(dir.path(), 3).await;
    let client = members[0].admin().await;
    let topics = ["changed1", "changed2"];
    for topic in topics {
        create_topic(&client, topic, 2).await;
    }
    let addresses: Vec<String> = members.iter().map(|member| member.process.address()).collect();
    let load = Load::start_with(&addresses, &topics, 6, ADMIN_PASSWORD, 512);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    for (at, member) in members.iter_mut().enumerate() {
        assert!(member.terminate(), "broker {} did not exit cleanly on SIGTERM", at + 1);
        let rack = format!("rack=r{}", at + 1);
        member.process.env.push(("MALACHI_LOG_ATTRIBUTES".into(), rack));
        member.process.env.push(("MALACHI_RETENTION_MAX_AGE_MS".into(), "604800000".into()));
        member.start();
        let back = member.admin().await;
        for node_id in 1..=3 {
            status_becomes(&back, node_id, 0).await;
        }
        until_ready(member).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (acked, _) = load.stop().await;
    let client = members[0].admin().await;
    eventually("every broker is known by its new attribute", || async {
        let status = client.cluster_status().await.map_err(|error| error.to_string())?;
        let racks: Vec<String> = status
            .brokers
            .iter()
            .map(|broker| {
                let attributes = broker.attributes.iter().flatten();
                attributes.map(|attribute| String::from_utf8_lossy(attribute)).collect()
            })
            .collect();
        let expected: Vec<String> = (1..=3).map(|n| format!("rack=r{n}")).collect();
        if racks == expected { Ok(()) } else { Err(format!("{racks:?}")) }
    })
    .await;
    for member in &members {
        assert_read_back(&member.admin().await, &topics, &acked).await;
    }
}

/// A broker that lost its data directory (a disk replaced) and starts again with the same node
/// id and address is refused at enrollment, by name: as the same Raft voter with empty logs it
/// would make the leaders' view of its log run backwards, which stopped their Raft cores. The
/// cluster serves on; once the old member is removed, the broker joins afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_lost_its_directory_rejoins_only_after_its_removal() {
    let dir = tempfile::tempdir().unwrap();
    let mut members = start_cluster(dir.path(), 3).await;
    let client = members[0].admin().await;
    create_topic(&client, "lost-disk", 1).await;
    produce_and_read_back(&client, "lost-disk", 10).await;
    members[2].kill();
    std::fs::remove_dir_all(members[2].process.dir.join("data")).unwrap();
    members[2].start();
    let status = members[2].child.as_mut().unwrap().wait().unwrap();
    assert!(!status.success(), "a broker without its directory joined as its old self");
    let log = members[2].process.log();
    assert!(log.contains("cannot rejoin as the same member"), "{log}");
    // A fresh connection: the refused broker retried its enrollment for longer than a client
    // connection may stay idle.
    let client = members[0].admin().await;
    let records = (0..10).map(|i| RecordBuilder::new(format!("after-{i}")).build()).collect();
    assert_eq!(client.produce("lost-disk", records).await.unwrap(), 10);
    for member in &members[..2] {
        assert!(!member.process.log().contains("panicked"), "{}", member.process.log());
    }

    members[1].admin().await.remove_broker(3, true).await.unwrap();
    std::fs::remove_dir_all(members[2].process.dir.join("data")).unwrap();
    members[2].start();
    let back = members[2].admin().await;
    common::cluster_ready(&[back], &[1, 2, 3]).await;
    let (read, _) = common::drain(&members[2].admin().await, "lost-disk", None).await;
    assert_eq!(read.len(), 20, "the rejoined broker serves the topic");
}

/// Produces one batch over many keys (so over every range) to `topic`, retrying the retryable
/// refusals of a cluster failing over, until one is acknowledged: every range's head is then
/// writable again. The batch itself is not checked (a retried one may be stored twice).
async fn until_writable(client: &Client, topic: &str) {
    eventually_within(&format!("{topic} takes writes"), 60, || async {
        let probe = (0..64).map(|key| RecordBuilder::new("probe").key(format!("p{key}")).build());
        match client.produce(topic, probe.collect()).await {
            Ok(_) => Ok(()),
            Err(error) if error.is_retryable() => Err(error.to_string()),
            Err(error) => panic!("produce to {topic}: {error}"),
        }
    })
    .await;
}

/// A consumer group outlives the broker leading its metadata: two `malachi consume --group`
/// processes on another broker wait out the vnode's election (their commits are refused
/// `metadata_unavailable` meanwhile) and go on reading every record once, each key in order,
/// across the kill and a split of every range after it. Membership and positions are the
/// vnode's replicated metadata, so the survivors know the group as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_group_outlives_the_death_of_its_metadata_leader() {
    let dir = tempfile::tempdir().unwrap();
    let mut members = start_cluster(dir.path(), 3).await;
    create_topic(&members[0].admin().await, "orders", 4).await;
    let status = leadership_spread(&members[0].admin().await, 3).await;
    let leader = leader_of(&status, "orders");
    let mut doomed = members.remove(leader as usize - 1);
    let served = &members[0];
    let client = served.process.connect().await;
    let (sender, mut lines) = unbounded_channel();
    let _a = consumer(&served.process, "a", sender.clone());
    let _b = consumer(&served.process, "b", sender);
    let mut batch = until_each_prints(&client, &mut lines, &served.process, 2, 0).await;

    doomed.kill();
    eprintln!("killed broker {leader}, the leader of the vnode holding orders");
    until_writable(&client, "orders").await;
    batch += 1;
    let expected = produce_batch(&client, batch).await;
    assert_once_and_in_order(&printed(&mut lines, &expected, &served.process).await, &expected);

    let admin = served.admin().await;
    let described = admin.describe_topic("orders").await.unwrap();
    for range in described.ranges.iter().filter(|range| range.children.is_empty()) {
        eventually_within(&format!("range {} splits", range.range_id), 30, || async {
            admin.split_range("orders", range.range_id).await.map(drop).map_err(|e| e.to_string())
        })
        .await;
    }
    until_writable(&client, "orders").await;
    batch += 1;
    let expected = produce_batch(&client, batch).await;
    let seen = printed(&mut lines, &expected, &served.process).await;
    assert_once_and_in_order(&seen, &expected);
}
