//! Consumer group members as real processes: two `malachi consume --group g --follow` share a
//! topic's ranges (every record printed once, each key's records in order by whichever member
//! reads them), when one exits the other takes its ranges over at once, and when one is killed
//! the other takes them over once the killed one's session runs out.

mod common;

use common::BrokerProcess;
use common::group::{
    Killed, assert_once_and_in_order, consumer, printed, produce_batch, until_each_prints,
};
use tokio::sync::mpsc::unbounded_channel;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_of_one_group_share_the_ranges_and_take_over_on_exit() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::new(dir.path());
    let _serve = Killed(broker.spawn());
    let client = broker.connect().await;
    client.create_topic_with_ranges("orders", 4).await.unwrap();
    let (sender, mut lines) = unbounded_channel();
    let mut a = consumer(&broker, "a", sender.clone());
    let _b = consumer(&broker, "b", sender);

    // Batches until both members print some of one: the group has dealt ranges to both.
    let mut batch = until_each_prints(&client, &mut lines, &broker, 2, 0).await;
    batch += 1;
    let expected = produce_batch(&client, batch).await;
    assert_once_and_in_order(&printed(&mut lines, &expected, &broker).await, &expected);

    // Every range splits, each read to its end before: the group hands the children out only
    // after a member commits its parent drained, which it does once it finds it sealed.
    let admin = broker.connect_as("admin", "admin-password-long").await;
    let described = admin.describe_topic("orders").await.unwrap();
    for range in described.ranges.iter().filter(|range| range.children.is_empty()) {
        admin.split_range("orders", range.range_id).await.unwrap();
    }
    batch += 1;
    let expected = produce_batch(&client, batch).await;
    assert_once_and_in_order(&printed(&mut lines, &expected, &broker).await, &expected);

    // a stops (Ctrl-C) and leaves: b reads every range.
    // SAFETY: a plain signal to a child this test owns.
    assert_eq!(unsafe { libc::kill(a.0.id() as i32, libc::SIGINT) }, 0);
    assert!(a.0.wait().unwrap().success(), "a exits cleanly on Ctrl-C");
    batch += 1;
    let expected = produce_batch(&client, batch).await;
    let seen = printed(&mut lines, &expected, &broker).await;
    assert_once_and_in_order(&seen, &expected);
    assert!(seen.iter().all(|(who, _)| who == "b"), "a left, so b read it all: {seen:?}");
}

/// A member killed (SIGKILL: it cannot leave) keeps its ranges until its session runs out
/// (`MALACHI_GROUP_SESSION_TIMEOUT_MS`, 3 s here); then the other member reads them all, each
/// record once and each key in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_consumer_s_ranges_go_to_the_others_when_its_session_runs_out() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::new(dir.path()).env("MALACHI_GROUP_SESSION_TIMEOUT_MS", "3000");
    let _serve = Killed(broker.spawn());
    let client = broker.connect().await;
    client.create_topic_with_ranges("orders", 4).await.unwrap();
    let (sender, mut lines) = unbounded_channel();
    let a = consumer(&broker, "a", sender.clone());
    let _b = consumer(&broker, "b", sender);
    let batch = until_each_prints(&client, &mut lines, &broker, 2, 0).await;

    drop(a); // SIGKILL
    let killed_at = std::time::Instant::now();
    let expected = produce_batch(&client, batch + 1).await;
    let seen = printed(&mut lines, &expected, &broker).await;
    assert_once_and_in_order(&seen, &expected);
    assert!(seen.iter().all(|(who, _)| who == "b"), "a is dead, so b read it all: {seen:?}");
    eprintln!("b read a's ranges {} ms after the kill", killed_at.elapsed().as_millis());
}
