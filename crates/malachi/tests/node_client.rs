//! A client written in another language (Node.js, from wire-protocol.md alone) against a real
//! `malachi serve`: the bytes on the socket, not our own codec, decide compatibility.

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn a_node_client_written_from_the_spec_is_served() {
    let node = Command::new("node").arg("--version").output();
    assert!(
        node.is_ok_and(|output| output.status.success()),
        "Node.js is needed (installed by .ci/run)"
    );
    let dir = tempfile::tempdir().unwrap();
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut broker = Command::new(env!("CARGO_BIN_EXE_malachi"))
        .args(["serve", "--port", &port.to_string(), "--data-dir"])
        .arg(dir.path().join("data"))
        .env("MALACHI_ADMIN_PASS", "admin-password-long")
        .env("MALACHI_DEFAULT_USERS", "app:app123:produce,consume")
        .env("MALACHI_JOURNAL_BYTES", "4194304")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "broker did not come up");
        std::thread::sleep(Duration::from_millis(100));
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/node/wire_smoke.js");
    let output = Command::new("node")
        .args([script, "127.0.0.1", &port.to_string(), "app", "app123"])
        .output()
        .unwrap();
    broker.kill().unwrap();
    broker.wait().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("node wire smoke: ok"), "{stdout}");
}
