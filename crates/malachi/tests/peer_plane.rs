//! The inter-node port under attack, from another process that knows its address (issue 23,
//! docs/security.md): a stranger without a certificate gets a refusal and nothing else, a
//! broker of another CA is refused at the handshake, a plain-text peer cannot speak at all, and
//! a member's credentials register only that member. Each attack is followed by a check that
//! nothing changed.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{BrokerProcess, free_port};
use malachi_broker::enroll::{EnrollRequest, WRONG_TOKEN};
use malachi_broker::peer::{CLUSTER_ENROLL, PeerCall, STRANGERS_ENROLL_ONLY};
use malachi_consensus::MessageKind;
use malachi_transport::pki::{ClusterCa, ClusterFiles};
use malachi_transport::{CallError, ClusterTls, Request, Security, Service, Transport};

const ADMIN_PASSWORD: &str = "admin-password-long";
const WAIT: Duration = Duration::from_secs(5);

/// A broker that created a cluster, and its inter-node address.
struct Seed {
    process: BrokerProcess,
    child: std::process::Child,
    cluster_address: String,
}

impl Drop for Seed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn seed(dir: &std::path::Path) -> Seed {
    std::fs::create_dir_all(dir).unwrap();
    let cluster_port = free_port();
    let process = BrokerProcess::new(dir)
        .env("MALACHI_NODE_ID", "1")
        .env("MALACHI_CLUSTER_PORT", cluster_port.to_string())
        .env("MALACHI_CLUSTER_GOSSIP_PORT", free_port().to_string());
    let child = process.spawn();
    process.connect_as("admin", ADMIN_PASSWORD).await;
    Seed { process, child, cluster_address: format!("127.0.0.1:{cluster_port}") }
}

fn request(service: Service, group_id: u64, kind: u8, payload: &[u8]) -> Request {
    Request { service, group_id, kind, payload: payload.to_vec() }
}

/// What an attacker would send: the metadata calls the issue's black-box run got through.
fn attacks() -> Vec<(&'static str, Request)> {
    let create_admin = br#"{"CreateUser":{"username":"mallory","password_hash":"x","permissions":["admin"],"role":null}}"#;
    vec![
        ("welcome", PeerCall::Welcome.encode()),
        ("join", request(Service::Cluster, 0, 2, br#"{"node_id":9,"cluster_address":"x:1"}"#)),
        ("draining", request(Service::Cluster, 0, 8, br#"{"draining":true}"#)),
        ("hand-over", request(Service::Cluster, 0, 9, br#"{"draining":true}"#)),
        ("client write", request(Service::Raft, 0, MessageKind::ClientWrite.code(), create_admin)),
        ("vote", request(Service::Raft, 0, MessageKind::Vote.code(), b"{}")),
        ("append", request(Service::Data, 0, 1, &[0u8; 20])),
        ("settle", request(Service::Data, 0, 11, &[0u8; 37])),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_gets_a_refusal_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let seed = seed(dir.path()).await;
    let stranger = Transport::new(9, "", Security::Unenrolled);
    for (name, attack) in attacks() {
        let answer = stranger.call_as_stranger(&seed.cluster_address, |_| attack, WAIT).await;
        assert!(
            matches!(&answer, Err(CallError::Failed(reason)) if reason == STRANGERS_ENROLL_ONLY),
            "{name}: {answer:?}"
        );
    }
    // An enrollment with a proof made from a guessed token.
    let guess = "a-guessed-token-of-at-least-32-characters";
    let enroll = |binding: [u8; 32]| {
        let proof =
            malachi_transport::pki::proof(guess, malachi_transport::pki::JOINER_ROLE, &binding);
        PeerCall::Enroll(EnrollRequest { node_id: 9, cluster_address: "127.0.0.1:1".into(), proof })
            .encode()
    };
    let answer = stranger.call_as_stranger(&seed.cluster_address, enroll, WAIT).await;
    assert!(
        matches!(&answer, Err(CallError::Failed(reason)) if reason == WRONG_TOKEN),
        "{answer:?}"
    );
    // A stranger's frames are small: a large one ends its connection unread.
    let large = vec![0u8; 1 << 20];
    let answer = stranger
        .call_as_stranger(
            &seed.cluster_address,
            |_| request(Service::Cluster, 0, CLUSTER_ENROLL, &large),
            WAIT,
        )
        .await;
    assert!(
        matches!(answer, Err(CallError::Lost { .. } | CallError::Unreachable { .. })),
        "{answer:?}"
    );
    // A plain-text peer, as every broker was before: its hello is not a TLS handshake.
    let plain = Transport::new(9, "", Security::Insecure);
    let answer = plain.call_address(&seed.cluster_address, PeerCall::Welcome.encode(), WAIT).await;
    assert!(answer.is_err(), "{answer:?}");
    nothing_changed(&seed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_of_another_ca_is_refused_at_the_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let seed = seed(&dir.path().join("seed")).await;
    // An impostor with a certificate for node 1, the seed's own id, from a CA of its own.
    let ca = ClusterCa::generate("ffffffffffffffffffffffffffffffff").unwrap();
    let files = ClusterFiles::in_data_dir(&dir.path().join("impostor"));
    files
        .write(&ca.credentials, &ca.issue(1).unwrap(), "unused-token-0123456789abcdef0123")
        .unwrap();
    let tls = Arc::new(ClusterTls::load(files).unwrap());
    let impostor = Transport::new(1, "", Security::Tls(tls));
    for (name, attack) in attacks() {
        let answer = impostor.call_address(&seed.cluster_address, attack, WAIT).await;
        assert!(matches!(answer, Err(CallError::Refused { .. })), "{name}: {answer:?}");
    }
    nothing_changed(&seed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_credentials_speak_for_that_member_alone() {
    let dir = tempfile::tempdir().unwrap();
    let seed = seed(dir.path()).await;
    // The seed's own certificate, as a member that went rogue would hold it: it may not
    // register another broker (to redirect node 2's traffic, say).
    let files = ClusterFiles::in_data_dir(&dir.path().join("data"));
    let member = Transport::new(1, "", Security::Tls(Arc::new(ClusterTls::load(files).unwrap())));
    let record = br#"{"node_id":2,"cluster_address":"127.0.0.1:1","client_address":"127.0.0.1:1","attributes":{},"gossip_address":"127.0.0.1:1"}"#;
    let join = request(Service::Cluster, 0, 2, record);
    let answer = member.call_address(&seed.cluster_address, join, WAIT).await;
    assert!(
        matches!(&answer, Err(CallError::Failed(reason)) if reason.contains("registers itself")),
        "{answer:?}"
    );
    nothing_changed(&seed).await;
}

/// The cluster still has its one broker, and no user but those it was started with.
async fn nothing_changed(seed: &Seed) {
    let admin = seed.process.connect_as("admin", ADMIN_PASSWORD).await;
    let status = admin.cluster_status().await.unwrap();
    assert_eq!(status.brokers.len(), 1, "{status:?}");
    let refused = seed.process.try_connect_as("mallory", "x").await;
    assert!(refused.is_err(), "a user was created");
    let log = seed.process.log();
    assert!(!log.contains("panicked"), "{log}");
}
