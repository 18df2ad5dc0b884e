//! A data directory keeps the node id it was first started with: `malachi serve` with another
//! id refuses to start, naming both, and a start without one takes the recorded id.

mod common;

use common::BrokerProcess;
use malachi_client::RecordBuilder;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_keeps_its_node_id() {
    let dir = tempfile::tempdir().unwrap();
    let first = BrokerProcess::new(dir.path()).env("MALACHI_NODE_ID", "7");
    let mut broker = first.spawn();
    let client = first.connect().await;
    client.create_topic("kept").await.unwrap();
    client.produce("kept", vec![RecordBuilder::new("before").build()]).await.unwrap();
    broker.kill().unwrap();
    broker.wait().unwrap();
    assert!(first.log().contains("(node 7, cluster "), "{}", first.log());

    let other = BrokerProcess::new(dir.path()).env("MALACHI_NODE_ID", "8");
    let status = other.spawn().wait().unwrap();
    assert!(!status.success(), "a second identity for one directory must not start");
    assert!(other.log().contains("records node 7, but node 8 was asked for"), "{}", other.log());

    let plain = BrokerProcess::new(dir.path());
    let mut broker = plain.spawn();
    let client = plain.connect().await;
    let (records, _) = common::drain(&client, "kept", None).await;
    assert_eq!(records.len(), 1, "node 7's data is served after a restart without --node-id");
    broker.kill().unwrap();
    broker.wait().unwrap();
    let starts = plain.log().matches("(node 7, cluster ").count();
    assert_eq!(starts, 2, "{}", plain.log());
}
