//! What the process-level tests share: a real `malachi serve` on real files, a client that waits
//! for it, and a reader that drains a topic.

#![allow(dead_code)] // each test binary uses its own part

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use malachi_client::{Client, ClientConfig, FetchOptions, Record};

pub const PASSWORD: &str = "app-password-1";

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A broker under `dir` (data in `dir/data`, its log appended to `dir/broker.log`), with the
/// user `app` allowed to produce and consume.
pub struct BrokerProcess {
    pub dir: PathBuf,
    pub port: u16,
    pub env: Vec<(String, String)>,
    /// Runs in the child before `exec` (limits, for example).
    pub pre_exec: Option<fn() -> std::io::Result<()>>,
}

impl BrokerProcess {
    pub fn new(dir: &Path) -> BrokerProcess {
        BrokerProcess { dir: dir.to_path_buf(), port: free_port(), env: Vec::new(), pre_exec: None }
    }

    pub fn env(mut self, name: &str, value: impl Into<String>) -> BrokerProcess {
        self.env.push((name.to_string(), value.into()));
        self
    }

    pub fn spawn(&self) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("broker.log"))
            .unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_malachi"));
        command
            .args(["serve", "--data-dir"])
            .arg(self.dir.join("data"))
            .args(["--port", &self.port.to_string()])
            .env("MALACHI_ADMIN_PASS", "admin-password-long")
            .env("MALACHI_DEFAULT_USERS", format!("app:{PASSWORD}:produce,consume"))
            .env("MALACHI_AUTO_SPLIT_ENABLED", "false")
            .env("MALACHI_JOURNAL_BYTES", "4194304")
            .envs(self.env.iter().map(|(name, value)| (name, value)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
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
        connect(self.port, "app", PASSWORD)
            .await
            .unwrap_or_else(|error| panic!("{error}\n{}", self.log()))
    }

    pub async fn connect_as(&self, user: &str, password: &str) -> Client {
        connect(self.port, user, password)
            .await
            .unwrap_or_else(|error| panic!("{error}\n{}", self.log()))
    }
}

/// A client of the broker on `port`, retrying for 30 s while it starts.
pub async fn connect(port: u16, user: &str, password: &str) -> Result<Client, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let config = ClientConfig::new(format!("127.0.0.1:{port}")).credentials(user, password);
        match Client::connect(config).await {
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
