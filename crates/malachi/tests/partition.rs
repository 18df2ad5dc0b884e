//! Three brokers on three hosts of their own: network namespaces joined by a bridge, each
//! broker on its host's own address and the default ports (4040, 4042, 45892), the test's
//! clients on a fourth address in the test's own namespace. A firewall rule on one host then
//! cuts the broker leading the metadata group off from the other two (the clients still reach
//! it), under produce load through the others:
//!
//! * the majority side elects a new leader and keeps serving metadata writes;
//! * the isolated broker refuses metadata writes (`metadata_unavailable`) rather than
//!   diverging, and what it refused never appears anywhere;
//! * after the cut heals, every broker converges on one history: the writes made during the
//!   partition, every broker alive again, and every acknowledged record readable through every
//!   broker, each key in order.
//!
//! Needs root (CAP_NET_ADMIN), `ip` (iproute2) and `nft` (nftables); `.ci/run` installs them.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::BrokerProcess;
use common::load::{Load, assert_read_back};
use malachi_client::{Client, RecordBuilder};

const ADMIN_PASSWORD: &str = "admin-password-long";
const HOSTS: usize = 3;

/// Test hosts: a namespace per broker and one for the switch, named after this process so that
/// concurrent runs never meet.
struct Network {
    tag: String,
    /// The third octet of the hosts' 10.213.x.0/24.
    subnet: u32,
}

impl Network {
    fn create() -> Network {
        let pid = std::process::id();
        // Built first, so that a failing step below still removes what was made (Drop).
        let network = Network { tag: format!("ml{}", pid % 100_000), subnet: 20 + pid % 200 };
        network.wire();
        network
    }

    fn wire(&self) {
        let network = self;
        let switch = network.switch();
        run(&["ip", "netns", "add", &switch]);
        network.in_ns(&switch, &["ip", "link", "add", "br0", "type", "bridge"]);
        network.in_ns(&switch, &["ip", "link", "set", "br0", "up"]);
        for host in 0..HOSTS {
            let namespace = network.host(host);
            run(&["ip", "netns", "add", &namespace]);
            network.in_ns(&namespace, &["ip", "link", "set", "lo", "up"]);
            let (inner, outer) =
                (format!("{}h{host}", network.tag), format!("{}s{host}", network.tag));
            run(&["ip", "link", "add", &inner, "type", "veth", "peer", "name", &outer]);
            run(&["ip", "link", "set", &inner, "netns", &namespace]);
            network.plug(&outer);
            let address = format!("{}/24", network.ip(host));
            network.in_ns(&namespace, &["ip", "addr", "add", &address, "dev", &inner]);
            network.in_ns(&namespace, &["ip", "link", "set", &inner, "up"]);
        }
        // The test's clients, on this namespace's end of one more cable.
        let (client, outer) = network.client_link();
        run(&["ip", "link", "add", &client, "type", "veth", "peer", "name", &outer]);
        network.plug(&outer);
        let address = format!("10.213.{}.254/24", network.subnet);
        run(&["ip", "addr", "add", &address, "dev", &client]);
        run(&["ip", "link", "set", &client, "up"]);
    }

    fn switch(&self) -> String {
        format!("{}-sw", self.tag)
    }

    fn host(&self, host: usize) -> String {
        format!("{}-h{host}", self.tag)
    }

    fn ip(&self, host: usize) -> String {
        format!("10.213.{}.{}", self.subnet, host + 1)
    }

    fn client_link(&self) -> (String, String) {
        (format!("{}c", self.tag), format!("{}cs", self.tag))
    }

    /// Moves `link` into the switch namespace and onto its bridge.
    fn plug(&self, link: &str) {
        let switch = self.switch();
        run(&["ip", "link", "set", link, "netns", &switch]);
        self.in_ns(&switch, &["ip", "link", "set", link, "master", "br0"]);
        self.in_ns(&switch, &["ip", "link", "set", link, "up"]);
    }

    fn in_ns(&self, namespace: &str, command: &[&str]) {
        let mut full = vec!["ip", "netns", "exec", namespace];
        full.extend_from_slice(command);
        run(&full);
    }

    /// Drops every packet between `host` and the other brokers, both ways; clients still pass.
    fn isolate(&self, host: usize) {
        let others: Vec<String> = (0..HOSTS).filter(|&h| h != host).map(|h| self.ip(h)).collect();
        let others = others.join(", ");
        let rules = format!(
            "table inet malachi_cut {{\n\
               chain input {{ type filter hook input priority 0; policy accept; \
                 ip saddr {{ {others} }} drop; }}\n\
               chain output {{ type filter hook output priority 0; policy accept; \
                 ip daddr {{ {others} }} drop; }}\n\
             }}\n"
        );
        let mut nft = Command::new("ip")
            .args(["netns", "exec", &self.host(host), "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .spawn()
            .expect("nft (nftables) is needed");
        use std::io::Write;
        nft.stdin.take().unwrap().write_all(rules.as_bytes()).unwrap();
        assert!(nft.wait().unwrap().success(), "nft refused the cut");
    }

    fn heal(&self, host: usize) {
        self.in_ns(&self.host(host), &["nft", "delete", "table", "inet", "malachi_cut"]);
    }

    fn broker(&self, dir: &std::path::Path, host: usize) -> BrokerProcess {
        std::fs::create_dir_all(dir).unwrap();
        let mut process = BrokerProcess::new(dir)
            .env("MALACHI_NODE_ID", (host + 1).to_string())
            .env("MALACHI_CLUSTER_PORT", "4042");
        if host > 0 {
            process = process.env("MALACHI_LOG_NODES", format!("{}:4042", self.ip(0)));
        }
        process.host = self.ip(host);
        process.port = 4040;
        process.wrapper = ["ip", "netns", "exec", &self.host(host)].map(String::from).to_vec();
        process
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        // Deleting a namespace deletes the cable ends in it, and with them their peers.
        let _ = Command::new("ip").args(["link", "del", &self.client_link().0]).status();
        for namespace in (0..HOSTS).map(|host| self.host(host)).chain([self.switch()]) {
            let _ = Command::new("ip").args(["netns", "del", &namespace]).status();
        }
    }
}

fn run(command: &[&str]) {
    let output = Command::new(command[0]).args(&command[1..]).output();
    let output = output.unwrap_or_else(|error| panic!("{}: {error}", command[0]));
    assert!(
        output.status.success(),
        "{} failed (the partition test needs root, iproute2 and nftables): {}",
        command.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
}

struct Brokers {
    processes: Vec<BrokerProcess>,
    children: Vec<Child>,
}

impl Drop for Brokers {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Retries `check` until it holds or `seconds` pass.
async fn eventually<F, Fut>(what: &str, seconds: u64, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let started = Instant::now();
    loop {
        match check().await {
            Ok(()) => return started.elapsed(),
            Err(error) if started.elapsed() > Duration::from_secs(seconds) => {
                panic!("{what}: {error}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The broker leading the vnode that holds `topic`.
async fn vnode_leader(client: &Client, topic: &str) -> Result<u64, String> {
    let status = client.cluster_status().await.map_err(|error| error.to_string())?;
    match common::leader_of(&status, topic) {
        0 => Err("no vnode leader yet".into()),
        leader => Ok(leader),
    }
}

/// Whether `client`'s broker reports every broker in `node_ids` with `status`.
async fn reports(client: &Client, node_ids: &[u64], status: u8) -> Result<(), String> {
    let view = client.cluster_status().await.map_err(|error| error.to_string())?;
    let all = node_ids.iter().all(|id| {
        view.brokers.iter().any(|broker| broker.node_id == *id && broker.status == status)
    });
    if all { Ok(()) } else { Err(format!("{:?}", view.brokers)) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_broker_refuses_and_everything_converges_after_healing() {
    let network = Network::create();
    let dir = tempfile::tempdir().unwrap();
    let processes: Vec<BrokerProcess> = (0..HOSTS)
        .map(|host| network.broker(&dir.path().join(format!("n{}", host + 1)), host))
        .collect();
    let children = processes.iter().map(BrokerProcess::spawn).collect();
    let brokers = Brokers { processes, children };
    let mut clients = Vec::new();
    for process in &brokers.processes {
        clients.push(process.connect_as("admin", ADMIN_PASSWORD).await);
    }
    // A topic created through each broker, with records in it (placement spreads them).
    for (host, client) in clients.iter().enumerate() {
        let topic = format!("held{}", host + 1);
        client.create_topic_with_ranges(&topic, 2).await.unwrap();
        let batch = (0..20)
            .map(|i| {
                RecordBuilder::new(format!("{topic}/seed={i}")).key(format!("{topic}/seed")).build()
            })
            .collect();
        client.produce(&topic, batch).await.unwrap();
    }
    eventually("every broker alive everywhere", 20, || async {
        for client in &clients {
            reports(client, &[1, 2, 3], 0).await?;
        }
        Ok(())
    })
    .await;
    // Cut off the leader of the vnode the majority writes to next.
    let leader = || async { vnode_leader(&clients[0], "during").await.map(drop) };
    eventually("a vnode leader", 10, leader).await;
    let isolated = vnode_leader(&clients[0], "during").await.unwrap() as usize - 1;
    let majority: Vec<usize> = (0..HOSTS).filter(|&host| host != isolated).collect();

    // Load through the majority brokers, on the topics created through them (a producer whose
    // topic lies on the isolated broker waits for the heal; what it had acknowledged stays).
    let addresses: Vec<String> =
        majority.iter().map(|&host| brokers.processes[host].address()).collect();
    let topics: Vec<String> = majority.iter().map(|&host| format!("held{}", host + 1)).collect();
    let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
    let load = Load::start(&addresses, &topics, 2 * majority.len(), ADMIN_PASSWORD);
    tokio::time::sleep(Duration::from_millis(1000)).await;

    network.isolate(isolated);
    let cut_at = Instant::now();
    // The majority elects a leader and takes metadata writes.
    let writer = &clients[majority[0]];
    eventually("the majority takes a metadata write", 15, || async {
        match writer.create_topic("during").await {
            Ok(()) => Ok(()),
            Err(error) if error.reason() == Some(malachi_client::Reason::AlreadyExists) => Ok(()),
            Err(error) => Err(error.to_string()),
        }
    })
    .await;
    let stall = cut_at.elapsed();
    clients[majority[1]].create_user("during-user", "user-password-1", &["consume"]).await.unwrap();
    // The isolated broker refuses a write rather than taking it alone.
    let refused = clients[isolated].create_topic("isolated").await.unwrap_err();
    assert!(refused.is_retryable(), "the isolated broker answered {refused}");
    for client in &clients {
        let seen = client.list_topics().await.unwrap();
        assert!(!seen.contains(&"isolated".to_string()), "{seen:?}");
    }
    // Each side sees the other as gone.
    let isolated_id = isolated as u64 + 1;
    let majority_ids: Vec<u64> = majority.iter().map(|&host| host as u64 + 1).collect();
    eventually("the majority reports the isolated broker dead", 20, || async {
        reports(&clients[majority[0]], &[isolated_id], 2).await
    })
    .await;
    eventually("the isolated broker reports the others dead", 20, || async {
        reports(&clients[isolated], &majority_ids, 2).await
    })
    .await;

    network.heal(isolated);
    let healed_at = Instant::now();
    let converged = eventually("every broker converges", 30, || async {
        for client in &clients {
            reports(client, &[1, 2, 3], 0).await?;
            let topics = client.list_topics().await.map_err(|error| error.to_string())?;
            if !topics.contains(&"during".to_string()) || topics.contains(&"isolated".to_string()) {
                return Err(format!("topics {topics:?}"));
            }
            let users = client.list_users().await.map_err(|error| error.to_string())?;
            if !users.iter().any(|user| user.username == "during-user") {
                return Err("during-user missing".into());
            }
        }
        Ok(())
    })
    .await;
    eventually("the healed broker takes metadata writes again", 15, || async {
        clients[isolated].create_topic("after-heal").await.map_err(|error| error.to_string())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let (acked, _) = load.stop().await;

    // Every acknowledged record, through every broker, each key in order.
    let total: usize = acked.values().map(Vec::len).sum();
    assert!(total > 0, "nothing was acknowledged");
    for client in &clients {
        assert_read_back(client, &topics, &acked).await;
    }
    eprintln!(
        "isolated broker {isolated_id} (the written vnode's leader): metadata writes through the majority \
         stalled {stall:?}; converged {converged:?} after healing ({:?} since); {total} records \
         acknowledged during the run, all read back through every broker",
        healed_at.elapsed()
    );
}

/// The primary of a replicated head is cut off from its two followers (and from the clients'
/// producers, which write through the other brokers) under load. The majority's failover
/// seals the head from the two copies it reaches and rolls the range onto live brokers, so
/// producers are acknowledged again; after the heal the cut-off copy, which may hold records
/// no quorum acknowledged, is settled to the recorded seal, and every acknowledged record
/// reads back through every broker, each key in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_cut_off_from_its_followers_is_sealed_around_and_settled_after_healing() {
    let network = Network::create();
    let dir = tempfile::tempdir().unwrap();
    let processes: Vec<BrokerProcess> = (0..HOSTS)
        .map(|host| network.broker(&dir.path().join(format!("n{}", host + 1)), host))
        .collect();
    let children = processes.iter().map(BrokerProcess::spawn).collect();
    let brokers = Brokers { processes, children };
    let mut clients = Vec::new();
    for process in &brokers.processes {
        clients.push(process.connect_as("admin", ADMIN_PASSWORD).await);
    }
    eventually("every broker alive everywhere", 20, || async {
        for client in &clients {
            reports(client, &[1, 2, 3], 0).await?;
        }
        Ok(())
    })
    .await;
    eventually("the topic is created", 15, || async {
        match clients[0].create_topic("cut").await {
            Ok(()) => Ok(()),
            Err(error) if error.reason() == Some(malachi_client::Reason::AlreadyExists) => Ok(()),
            Err(error) => Err(error.to_string()),
        }
    })
    .await;
    clients[0].produce("cut", vec![RecordBuilder::new("warm=0").build()]).await.unwrap();
    let described = clients[0].describe_segments("cut").await.unwrap();
    let primary = described.segments[0].copies[0].node_id as usize - 1;
    let others: Vec<usize> = (0..HOSTS).filter(|&host| host != primary).collect();

    let addresses: Vec<String> =
        others.iter().map(|&host| brokers.processes[host].address()).collect();
    let load = Load::start(&addresses, &["cut"], 2 * others.len(), ADMIN_PASSWORD);
    let acked_count = || load.acked_count();
    tokio::time::sleep(Duration::from_millis(1000)).await;

    network.isolate(primary);
    let at_cut = acked_count();
    let resumed = eventually("producers are acknowledged again", 20, || async {
        let now = acked_count();
        if now > at_cut + 40 {
            Ok(())
        } else {
            Err(format!("{now} acknowledged, {at_cut} at the cut"))
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1000)).await;

    network.heal(primary);
    eventually("every broker alive everywhere after the heal", 30, || async {
        for client in &clients {
            reports(client, &[1, 2, 3], 0).await?;
        }
        Ok(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let (acked, _) = load.stop().await;
    let head_id = described.segments[0].segment_id;
    let settled = eventually(
        "the cut-off primary's head is sealed and settled on every copy",
        60,
        || async {
            let described =
                clients[others[0]].describe_segments("cut").await.map_err(|e| e.to_string())?;
            let head = described.segments.iter().find(|segment| segment.segment_id == head_id);
            let done = head.is_some_and(|head| {
                head.state == malachi_client::SegmentState::Sealed
                    && head.copies.iter().all(|copy| copy.settled)
            });
            if done { Ok(()) } else { Err(format!("{head:?}")) }
        },
    )
    .await;

    let total: usize = acked.values().map(Vec::len).sum();
    for client in &clients {
        assert_read_back(client, &["cut"], &acked).await;
    }
    eprintln!(
        "primary broker {} cut off: producers acknowledged again {resumed:?} after the cut; its \
         head settled on every copy {settled:?} after the heal; {total} records acknowledged, \
         all read back through every broker",
        primary + 1
    );
}
