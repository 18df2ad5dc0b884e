//! A data directory written by an earlier release opens under this build and serves everything it
//! held (docs/operations.md, "Upgrades and compatibility"). Each fixture under `tests/fixtures/`
//! was written by `scripts/make-datadir-fixture` with the release it is named after and killed
//! with SIGKILL, so opening it also replays that release's journal. The test copies it, starts
//! this build's `malachi serve` on the copy and reads it back through the CLI as a user would:
//! every record with its key, value, headers and timestamp, each key in the order it was
//! produced; the consumer group's committed position; the users, grants and policies; the
//! ranges a split left. Then it writes to it, so the directory is a live one, not a museum.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{BrokerProcess, PASSWORD};

/// The releases whose data directories this build promises to open.
const FIXTURES: [&str; 1] = ["datadir-0.1.0"];
const ADMIN: (&str, &str) = ("admin", "admin-password-long");
const READER: (&str, &str) = ("reader", "reader-password-1");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_directories_of_earlier_releases_open_and_serve_every_record() {
    for name in FIXTURES {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
        let work = tempfile::tempdir().unwrap();
        copy_tree(&fixture.join("data"), &work.path().join("data"));
        let broker = BrokerProcess::new(work.path());
        let _process = Running(broker.spawn());
        broker.connect().await;
        let log = broker.log();
        let replayed = log.lines().find(|line| line.contains("replayed the node journal"));
        let replayed = replayed.unwrap_or_else(|| panic!("{name}: no journal replay\n{log}"));
        assert!(!replayed.contains("rounds: 0,"), "{name}: the fixture's rounds: {replayed}");
        check_fixture(&broker, &fixture);
    }
}

/// A broker killed when the test ends, passed or failed.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn check_fixture(broker: &BrokerProcess, fixture: &Path) {
    let cli = Cli { server: broker.address() };
    let expected =
        |file: &str| std::fs::read_to_string(fixture.join("expected").join(file)).unwrap();
    for topic in ["fixture-orders", "fixture-events"] {
        let read = cli.run(ADMIN, &["consume", topic, "--json"]);
        assert_same_records(topic, &expected(&format!("{topic}.jsonl")), &read, &broker.log());
    }
    let next = cli.run(ADMIN, &["consume", "fixture-events", "--group", "billing"]);
    assert_eq!(next, expected("billing.txt"), "group billing resumes after its commit");

    let as_reader = cli.run(READER, &["consume", "fixture-orders"]);
    assert_eq!(as_reader.lines().count(), 300, "the user and its grant were kept");
    assert!(cli.run(ADMIN, &["policy", "list"]).contains("keep-week"));
    let ranges = |describe: &str| {
        let table = describe.split("\n\n").nth(1).map(str::to_owned);
        table.unwrap_or_else(|| panic!("no range table in {describe}"))
    };
    let described = cli.run(ADMIN, &["topic", "describe", "fixture-orders"]);
    assert_eq!(ranges(&described), ranges(&expected("fixture-orders.describe")));

    cli.run(("app", PASSWORD), &["produce", "fixture-orders", "after", "--key", "k1"]);
    let read = cli.run(ADMIN, &["consume", "fixture-orders"]);
    assert_eq!(read.lines().filter(|line| *line == "after").count(), 1, "{read}");
}

/// Both reads hold the same records, and each key's records in the same order (ranges are read
/// in an order of their own, so the lines of different keys may interleave differently).
fn assert_same_records(topic: &str, expected: &str, read: &str, log: &str) {
    let by_key = |text: &str| {
        let mut keys: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for line in text.lines() {
            let record: serde_json::Value = serde_json::from_str(line).unwrap();
            keys.entry(record["key"].to_string()).or_default().push(line.to_string());
        }
        keys
    };
    let (expected, read) = (by_key(expected), by_key(read));
    assert!(!expected.is_empty(), "{topic}: the fixture holds no records");
    assert_eq!(read, expected, "{topic} reads back as it was written\n{log}");
}

struct Cli {
    server: String,
}

impl Cli {
    fn run(&self, (user, password): (&str, &str), args: &[&str]) -> String {
        let output = Command::new(env!("CARGO_BIN_EXE_malachi"))
            .args(args)
            .args(["--server", &self.server, "--user", user, "--password", password])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{args:?} as {user}: {stderr}");
        String::from_utf8(output.stdout).unwrap()
    }
}

fn copy_tree(from: &Path, to: &PathBuf) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}
