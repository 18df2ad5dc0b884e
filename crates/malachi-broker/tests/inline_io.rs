//! The seam the deterministic simulator needs: a whole broker on one thread, its segments on the
//! simulated disk, its cursor secret given, blocking storage calls made inline.

use std::sync::Arc;

use bytes::Bytes;
use malachi_broker::auth::OsEntropy;
use malachi_broker::data::IoMode;
use malachi_broker::fetch::FetchArgs;
use malachi_broker::node::{Broker, NodeDeps};
use malachi_broker::notify::SystemClock;
use malachi_broker::produce::Spread;
use malachi_broker::testing;
use malachi_consensus::GroupConfig;
use malachi_log::{Record, SimStorage};

#[tokio::test(flavor = "current_thread")]
async fn a_broker_runs_on_one_thread_over_the_simulated_disk() {
    let dir = tempfile::tempdir().unwrap();
    let sim = SimStorage::new(7);
    let deps = NodeDeps {
        config: testing::config(dir.path(), &[("AUTO_SPLIT_ENABLED", "false")]),
        node_id: 1,
        storage: Arc::new(sim.clone()),
        clock: Arc::new(SystemClock),
        entropy: Arc::new(OsEntropy),
        raft: GroupConfig::default(),
        io_mode: IoMode::Inline,
        cursor_secret: Some([9; 32]),
        cluster: None,
        raft_store: None,
        canaries: Default::default(),
        password_cost: Default::default(),
        write_admin_credentials: true,
    };
    let (broker, _) = Broker::open(deps).await.unwrap();
    broker.create_topic("sim", None, None).await.unwrap();
    let mut spread = Spread::default();
    let batch = |tag: &str| {
        (0..10)
            .map(|at| Record::keyed(format!("k{at}"), Bytes::from(format!("{tag}{at}")), 0))
            .collect::<Vec<_>>()
    };
    broker.produce("sim", batch("a"), &mut spread).await.unwrap();
    broker.split("sim", 0).await.unwrap();
    broker.produce("sim", batch("b"), &mut spread).await.unwrap();
    let page =
        broker.fetch(&FetchArgs { topic: "sim", max: 100, ..FetchArgs::default() }).await.unwrap();
    assert_eq!(page.records.len(), 20);
    assert!(
        !dir.path().join("cursor.secret").exists(),
        "the given secret is used, no file written"
    );
    assert!(sim.sync_count() >= 3, "segment syncs went to the simulated disk");
    assert!(!dir.path().join("topics").exists(), "no segment file on the real disk");
    broker.shutdown().await;
}
