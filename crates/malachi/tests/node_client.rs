//! A client written in another language (Node.js, from wire-protocol.md alone) against a real
//! `malachi serve`: the bytes on the socket, not our own codec, decide compatibility. Run twice:
//! over plain TCP, and over TLS through Node's own `tls` module against a TLS-only broker.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

#[test]
fn a_node_client_written_from_the_spec_is_served() {
    let dir = tempfile::tempdir().unwrap();
    run_node_smoke(dir.path(), &[], &[]);
}

#[test]
fn a_node_client_is_served_over_tls_and_plain_tcp_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let certified =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .unwrap();
    let (cert, key) = (dir.path().join("broker.crt"), dir.path().join("broker.key"));
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    let env = [
        ("MALACHI_ENABLE_TLS", "true".to_string()),
        ("MALACHI_REQUIRE_TLS", "true".to_string()),
        ("MALACHI_TLS_CERTFILE", cert.display().to_string()),
        ("MALACHI_TLS_KEYFILE", key.display().to_string()),
    ];
    // The script first checks that plain TCP is answered `tls_required`, then runs over TLS
    // trusting the broker's certificate.
    run_node_smoke(dir.path(), &env, &[cert.display().to_string()]);
}

/// Starts a broker with `env`, runs the Node script with `extra_args`, and checks it passed.
fn run_node_smoke(dir: &Path, env: &[(&str, String)], extra_args: &[String]) {
    let node = Command::new("node").arg("--version").output();
    assert!(
        node.is_ok_and(|output| output.status.success()),
        "Node.js is needed (installed by .ci/run)"
    );
    let port = common::free_port();
    let mut broker = Command::new(env!("CARGO_BIN_EXE_malachi"))
        .args(["serve", "--port", &port.to_string(), "--data-dir"])
        .arg(dir.join("data"))
        .env("MALACHI_ADMIN_PASS", "admin-password-long")
        .env("MALACHI_DEFAULT_USERS", "app:app123:produce,consume")
        // The spec's account has a six-character password, below the default minimum of 12.
        .env("MALACHI_MIN_PASSWORD_LEN", "6")
        .env("MALACHI_JOURNAL_BYTES", "4194304")
        .env("MALACHI_DASHBOARD_PORT", common::free_port().to_string())
        .envs(env.iter().map(|(name, value)| (name, value)))
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
        .args(extra_args)
        .output()
        .unwrap();
    broker.kill().unwrap();
    broker.wait().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("node wire smoke: ok"), "{stdout}");
}
