//! What the process-level tests share: a real `malachi serve` on real files, a client that waits
//! for it, and a reader that drains a topic.

#![allow(dead_code)] // each test binary uses its own part

pub mod drill;
pub mod group;
pub mod http;
pub mod load;
pub mod network;
pub mod webdriver;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use malachi_client::{Client, ClientConfig, FetchOptions, Record};

pub const PASSWORD: &str = "app-password-1";
/// The join token every test broker of a cluster is started with, as a compose file would.
pub const CLUSTER_TOKEN: &str = "test-cluster-token-0123456789abcdef";

/// Ports handed to test brokers come from here, below the kernel's ephemeral range (32768 and
/// up on Linux): a port the kernel handed out with `bind(0)` and the test released may be taken
/// as the source port of any outgoing connection before the broker binds it (CI saw exactly
/// that). Each port is reserved across the test processes by a file created exclusively.
const TEST_PORTS: std::ops::Range<u16> = 20_000..32_000;

/// A port no other test of this run holds, free on 127.0.0.1 for TCP and UDP now.
pub fn free_port() -> u16 {
    let reservations = std::env::temp_dir().join("malachi-test-ports");
    std::fs::create_dir_all(&reservations).unwrap();
    let span = u64::from(TEST_PORTS.end - TEST_PORTS.start);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    let mut pick = u64::from(std::process::id()) ^ now.unwrap_or_default().as_nanos() as u64;
    for _ in 0..span {
        pick = pick.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let port = TEST_PORTS.start + ((pick >> 33) % span) as u16;
        if !reserve(&reservations.join(port.to_string())) {
            continue;
        }
        let tcp = TcpListener::bind(("127.0.0.1", port));
        let udp = std::net::UdpSocket::bind(("127.0.0.1", port));
        if tcp.is_ok() && udp.is_ok() {
            return port;
        }
    }
    panic!("no free test port left in {TEST_PORTS:?} (reservations in {})", reservations.display());
}

/// How long a port stays reserved: longer than any test holds its brokers.
const RESERVATION_S: u64 = 15 * 60;

/// Creates `path` exclusively; a reservation older than `RESERVATION_S` is taken over.
fn reserve(path: &Path) -> bool {
    let create = || std::fs::OpenOptions::new().write(true).create_new(true).open(path);
    if create().is_ok() {
        return true;
    }
    let age = std::fs::metadata(path).and_then(|meta| meta.modified()).ok();
    let stale = age
        .and_then(|modified| modified.elapsed().ok())
        .is_some_and(|age| age.as_secs() > RESERVATION_S);
    stale && std::fs::remove_file(path).is_ok() && create().is_ok()
}

/// A broker under `dir` (data in `dir/data`, its log appended to `dir/broker.log`), with the
/// user `app` allowed to produce and consume.
pub struct BrokerProcess {
    pub dir: PathBuf,
    /// The address the broker binds and clients dial (127.0.0.1 unless on a test host).
    pub host: String,
    pub port: u16,
    /// The HTTP port (`/health`, `/ready`, `/metrics`, the console).
    pub dashboard_port: u16,
    /// A command the broker runs under (`ip netns exec <host>` for a test host).
    pub wrapper: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Variables removed from the child's environment (set by default, or inherited).
    pub unset: Vec<String>,
    /// Runs in the child before `exec` (limits, for example).
    pub pre_exec: Option<fn() -> std::io::Result<()>>,
}

impl BrokerProcess {
    pub fn new(dir: &Path) -> BrokerProcess {
        BrokerProcess {
            dir: dir.to_path_buf(),
            host: "127.0.0.1".into(),
            port: free_port(),
            dashboard_port: free_port(),
            wrapper: Vec::new(),
            env: Vec::new(),
            unset: Vec::new(),
            pre_exec: None,
        }
    }

    /// The client address, `host:port`.
    pub fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    pub fn env(mut self, name: &str, value: impl Into<String>) -> BrokerProcess {
        self.env.push((name.to_string(), value.into()));
        self
    }

    /// Leaves `name` out of the broker's environment.
    pub fn unset(mut self, name: &str) -> BrokerProcess {
        self.unset.push(name.to_string());
        self
    }

    pub fn spawn(&self) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("broker.log"))
            .unwrap();
        let binary = env!("CARGO_BIN_EXE_malachi");
        let mut command = match self.wrapper.split_first() {
            None => Command::new(binary),
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(binary);
                command
            }
        };
        command
            .args(["serve", "--data-dir"])
            .arg(self.dir.join("data"))
            .args(["--port", &self.port.to_string(), "--bind", &self.host])
            .args(["--dashboard-port", &self.dashboard_port.to_string()])
            .env("MALACHI_ADMIN_PASS", "admin-password-long")
            .env("MALACHI_DEFAULT_USERS", format!("app:{PASSWORD}:produce,consume"))
            .env("MALACHI_AUTO_SPLIT_ENABLED", "false")
            .env("MALACHI_JOURNAL_BYTES", "4194304")
            .env("MALACHI_CLUSTER_TOKEN", CLUSTER_TOKEN)
            .envs(self.env.iter().map(|(name, value)| (name, value)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        for name in &self.unset {
            command.env_remove(name);
        }
        if let Some(pre_exec) = self.pre_exec {
            use std::os::unix::process::CommandExt;
            // SAFETY: the hook only makes async-signal-safe system calls.
            unsafe { command.pre_exec(pre_exec) };
        }
        command.spawn().expect("starting malachi serve")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("broker.log")).unwrap_or_default()
    }

    pub async fn connect(&self) -> Client {
        self.connect_as("app", PASSWORD).await
    }

    /// One login attempt, no retries.
    pub async fn try_connect_as(
        &self,
        user: &str,
        password: &str,
    ) -> Result<Client, malachi_client::ClientError> {
        Client::connect(ClientConfig::new(self.address()).credentials(user, password)).await
    }

    pub async fn connect_as(&self, user: &str, password: &str) -> Client {
        connect_to(&self.address(), user, password)
            .await
            .unwrap_or_else(|error| panic!("{error}\n{}", self.log()))
    }
}

/// A client of the broker on `127.0.0.1:port`, retrying for 30 s while it starts.
pub async fn connect(port: u16, user: &str, password: &str) -> Result<Client, String> {
    connect_to(&format!("127.0.0.1:{port}"), user, password).await
}

/// A client of the broker at `address`, retrying for 30 s while it starts.
pub async fn connect_to(address: &str, user: &str, password: &str) -> Result<Client, String> {
    connect_with(ClientConfig::new(address.to_string()).credentials(user, password)).await
}

/// A client configured by `config`, retrying for 30 s while its broker starts.
pub async fn connect_with(config: ClientConfig) -> Result<Client, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match Client::connect(config.clone()).await {
            Ok(client) => return Ok(client),
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => return Err(format!("broker did not come up: {error}")),
        }
    }
}

/// Reads `topic` from `cursor` until a page comes back empty.
pub async fn drain(client: &Client, topic: &str, cursor: Option<Bytes>) -> (Vec<Record>, Bytes) {
    let mut cursor = cursor;
    let mut records = Vec::new();
    loop {
        let options = FetchOptions { cursor: cursor.clone(), max: 500, ..FetchOptions::default() };
        let (page, next) = client.fetch(topic, &options).await.unwrap();
        cursor = Some(next);
        if page.is_empty() {
            return (records, cursor.unwrap());
        }
        records.extend(page);
    }
}

pub fn value(record: &Record) -> String {
    String::from_utf8(record.value.to_vec()).unwrap()
}

/// The vnode groups of the ring (group ids 1 to 256; 0 is the administrative group, the root
/// sits above), and which holds `topic`, as every broker computes it.
pub fn vnode_of(status: &malachi_client::ClusterStatusResponse, topic: &str) -> u64 {
    let vnodes = status.groups.iter().filter(|group| (1..=256).contains(&group.group_id)).count();
    u64::from(malachi_meta::vnode_of_name(topic, vnodes as u32))
}

/// The broker leading the vnode that holds `topic` (0: none known).
pub fn leader_of(status: &malachi_client::ClusterStatusResponse, topic: &str) -> u64 {
    let group_id = vnode_of(status, topic);
    status.groups.iter().find(|group| group.group_id == group_id).map_or(0, |group| group.leader)
}

/// How many vnodes each broker leads, by node id.
pub fn vnodes_led(
    status: &malachi_client::ClusterStatusResponse,
) -> std::collections::BTreeMap<u64, usize> {
    let mut led = std::collections::BTreeMap::new();
    for group in status.groups.iter().filter(|group| (1..=256).contains(&group.group_id)) {
        *led.entry(group.leader).or_default() += 1;
    }
    led
}

/// Waits until the broker of every client in `clients` reports each broker of `node_ids` alive
/// and every Raft group led, as a client retrying the retryable reasons of a cluster still
/// starting would (`metadata_unavailable` while a group has no leader, `no_quorum` while
/// membership has not yet seen the brokers a new segment needs). A test's first request comes
/// after this, never right after the processes start.
pub async fn cluster_ready(clients: &[Client], node_ids: &[u64]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    for client in clients {
        loop {
            let problem = match client.cluster_status().await {
                Err(error) => format!("cluster status: {error}"),
                Ok(status) => ready_problem(&status, node_ids),
            };
            if problem.is_empty() {
                break;
            }
            assert!(Instant::now() < deadline, "the cluster never became ready: {problem}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Waits up to `seconds` until the broker whose HTTP port is `http_address` answers `/ready`
/// with 200 (its metadata caught up), as a rolling restart waits before it stops the next
/// broker (docs/operations.md).
pub async fn until_ready(http_address: &str, seconds: u64) {
    network::eventually("the broker answers /ready", seconds, || async {
        match http::try_get(http_address, "/ready").await {
            Some(answer) if answer.status == 200 => Ok(()),
            Some(answer) => Err(answer.body),
            None => Err("no answer".into()),
        }
    })
    .await;
}

/// What keeps `status` from being a ready cluster of `node_ids` (empty: nothing).
fn ready_problem(status: &malachi_client::ClusterStatusResponse, node_ids: &[u64]) -> String {
    let alive =
        |id: &u64| status.brokers.iter().any(|broker| broker.node_id == *id && broker.status == 0);
    if let Some(missing) = node_ids.iter().find(|id| !alive(id)) {
        return format!("broker {} does not see broker {missing} alive: {:?}", status.node_id, {
            &status.brokers
        });
    }
    match status.groups.iter().find(|group| group.leader == 0) {
        Some(group) => {
            format!("broker {} knows no leader of group {}", status.node_id, group.group_id)
        }
        None if status.groups.is_empty() => format!("broker {} lists no groups", status.node_id),
        None => String::new(),
    }
}
