//! Brokers on hosts of their own: a network namespace per broker, joined by a bridge in one more
//! namespace (the switch), each broker on its host's own address and the default ports (4040,
//! 4042, 45892), the test's clients on an address of the test's own namespace. A firewall rule
//! (nftables) on a host cuts it off from the other brokers while clients still reach it.
//!
//! Needs root (CAP_NET_ADMIN), `ip` (iproute2) and `nft` (nftables); `.ci/run` installs them.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use malachi_client::Client;

use super::BrokerProcess;

/// Test hosts, named after this process so that concurrent runs never meet.
pub struct Network {
    tag: String,
    /// The third octet of the hosts' 10.213.x.0/24.
    subnet: u32,
    hosts: usize,
}

/// Which way a cut drops a host's packets to and from the other brokers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// Nothing passes, either way.
    Both,
    /// The host hears nothing from the others; what it sends still arrives (a one-way partition:
    /// the others hear a broker that never hears them).
    Inbound,
}

impl Network {
    pub fn create(hosts: usize) -> Network {
        let pid = std::process::id();
        // Built first, so that a failing step below still removes what was made (Drop).
        let network =
            Network { tag: format!("ml{}", pid % 100_000), subnet: 20 + pid % 200, hosts };
        network.wire();
        network
    }

    fn wire(&self) {
        let switch = self.switch();
        run(&["ip", "netns", "add", &switch]);
        self.in_ns(&switch, &["ip", "link", "add", "br0", "type", "bridge"]);
        self.in_ns(&switch, &["ip", "link", "set", "br0", "up"]);
        for host in 0..self.hosts {
            let namespace = self.host(host);
            run(&["ip", "netns", "add", &namespace]);
            self.in_ns(&namespace, &["ip", "link", "set", "lo", "up"]);
            let (inner, outer) = (format!("{}h{host}", self.tag), format!("{}s{host}", self.tag));
            run(&["ip", "link", "add", &inner, "type", "veth", "peer", "name", &outer]);
            run(&["ip", "link", "set", &inner, "netns", &namespace]);
            self.plug(&outer);
            let address = format!("{}/24", self.ip(host));
            self.in_ns(&namespace, &["ip", "addr", "add", &address, "dev", &inner]);
            self.in_ns(&namespace, &["ip", "link", "set", &inner, "up"]);
        }
        // The test's clients, on this namespace's end of one more cable.
        let (client, outer) = self.client_link();
        run(&["ip", "link", "add", &client, "type", "veth", "peer", "name", &outer]);
        self.plug(&outer);
        let address = format!("10.213.{}.254/24", self.subnet);
        run(&["ip", "addr", "add", &address, "dev", &client]);
        run(&["ip", "link", "set", &client, "up"]);
    }

    fn switch(&self) -> String {
        format!("{}-sw", self.tag)
    }

    fn host(&self, host: usize) -> String {
        format!("{}-h{host}", self.tag)
    }

    pub fn ip(&self, host: usize) -> String {
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
    pub fn isolate(&self, host: usize) {
        self.cut(host, Cut::Both);
    }

    /// Drops `host`'s packets from (and, for [`Cut::Both`], to) the other brokers; clients still
    /// pass. At most one cut per host at a time: [`Network::heal`] it first.
    pub fn cut(&self, host: usize, cut: Cut) {
        let others: Vec<String> =
            (0..self.hosts).filter(|&h| h != host).map(|h| self.ip(h)).collect();
        let others = others.join(", ");
        let output = match cut {
            Cut::Both => format!(
                "chain output {{ type filter hook output priority 0; policy accept; \
                   ip daddr {{ {others} }} drop; }}\n"
            ),
            Cut::Inbound => String::new(),
        };
        let rules = format!(
            "table inet malachi_cut {{\n\
               chain input {{ type filter hook input priority 0; policy accept; \
                 ip saddr {{ {others} }} drop; }}\n\
               {output}\
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

    /// Removes `host`'s cut.
    pub fn heal(&self, host: usize) {
        self.in_ns(&self.host(host), &["nft", "delete", "table", "inet", "malachi_cut"]);
    }

    /// A broker on `host` with node id `host + 1`, joining through host 0.
    pub fn broker(&self, dir: &std::path::Path, host: usize) -> BrokerProcess {
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

    /// A broker on every host, under `dir/n1`, `dir/n2`..., started.
    pub fn start_brokers(&self, dir: &std::path::Path) -> Brokers {
        let processes: Vec<BrokerProcess> = (0..self.hosts)
            .map(|host| self.broker(&dir.join(format!("n{}", host + 1)), host))
            .collect();
        let children = processes.iter().map(|process| Some(process.spawn())).collect();
        Brokers { processes, children }
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        // Deleting a namespace deletes the cable ends in it, and with them their peers.
        let _ = Command::new("ip").args(["link", "del", &self.client_link().0]).status();
        for namespace in (0..self.hosts).map(|host| self.host(host)).chain([self.switch()]) {
            let _ = Command::new("ip").args(["netns", "del", &namespace]).status();
        }
    }
}

fn run(command: &[&str]) {
    let output = Command::new(command[0]).args(&command[1..]).output();
    let output = output.unwrap_or_else(|error| panic!("{}: {error}", command[0]));
    assert!(
        output.status.success(),
        "{} failed (the test needs root, iproute2 and nftables): {}",
        command.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The brokers of a [`Network`], killed when dropped.
pub struct Brokers {
    pub processes: Vec<BrokerProcess>,
    /// `None` while killed.
    children: Vec<Option<Child>>,
}

impl Brokers {
    /// SIGKILL, waited for.
    pub fn kill(&mut self, host: usize) {
        let mut child = self.children[host].take().expect("running");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// Starts a killed broker again on the same data directory.
    pub fn restart(&mut self, host: usize) {
        assert!(self.children[host].is_none(), "broker {host} is running");
        self.children[host] = Some(self.processes[host].spawn());
    }

    /// Sends `signal` (`STOP`, `CONT`) to a running broker.
    pub fn signal(&self, host: usize, signal: &str) {
        let pid = self.children[host].as_ref().expect("running").id().to_string();
        let status = Command::new("kill").args([&format!("-{signal}"), &pid]).status().unwrap();
        assert!(status.success(), "kill -{signal} {pid}");
    }

    pub async fn admin(&self, host: usize, password: &str) -> Client {
        self.processes[host].connect_as("admin", password).await
    }
}

impl Drop for Brokers {
    fn drop(&mut self) {
        for child in self.children.iter_mut().flatten() {
            // A paused broker dies of SIGKILL too.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Retries `check` until it holds or `seconds` pass; how long it took.
pub async fn eventually<F, Fut>(what: &str, seconds: u64, mut check: F) -> Duration
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

/// Whether `client`'s broker reports every broker in `node_ids` with `status`.
pub async fn reports(client: &Client, node_ids: &[u64], status: u8) -> Result<(), String> {
    let view = client.cluster_status().await.map_err(|error| error.to_string())?;
    let all = node_ids.iter().all(|id| {
        view.brokers.iter().any(|broker| broker.node_id == *id && broker.status == status)
    });
    if all { Ok(()) } else { Err(format!("{:?}", view.brokers)) }
}
