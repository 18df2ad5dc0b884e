//! Consumer group members as real processes: two `malachi consume --group g --follow` share a
//! topic's ranges (every record printed once, each key's records in order by whichever member
//! reads them), when one exits the other takes its ranges over at once, and when one is killed
//! the other takes them over once the killed one's session runs out.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::BrokerProcess;
use common::group::{
    Killed, PRINT_WAIT, assert_once_and_in_order, batch_of, consumer, consumer_as, printed,
    produce_batch, until_each_prints,
};
use malachi_client::Client;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

/// Starts `broker`, and a client once it has created `orders` with 4 ranges.
async fn serve_orders(broker: &BrokerProcess) -> (Killed, Client) {
    let serve = Killed(broker.spawn());
    let client = broker.connect().await;
    client.create_topic_with_ranges("orders", 4).await.unwrap();
    (serve, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_of_one_group_share_the_ranges_and_take_over_on_exit() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::new(dir.path());
    let (_serve, client) = serve_orders(&broker).await;
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
    let (_serve, client) = serve_orders(&broker).await;
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

/// What the churn test does between stretches of printing.
#[derive(Clone, Copy, Debug)]
enum Churn {
    /// SIGKILL consumer `i`, then start it again under its member name.
    Kill(usize),
    /// Ctrl-C consumer `i` (it leaves the group), then start it again.
    Interrupt(usize),
    /// Split the first active range.
    Split,
    /// Merge the two halves of the last split back.
    Merge,
}

const CHURN: [Churn; 9] = [
    Churn::Kill(0),
    Churn::Split,
    Churn::Kill(1),
    Churn::Merge,
    Churn::Interrupt(2),
    Churn::Split,
    Churn::Kill(0),
    Churn::Merge,
    Churn::Kill(2),
];
/// Lines printed between two churn steps.
const PRINTED_PER_STEP: usize = 200;

/// Batches one after another until `stop`: the values acknowledged, and those of batches
/// refused (not retried, so never stored twice; they may or may not be printed).
async fn produce_until(
    client: Client,
    stop: Arc<AtomicBool>,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut acked, mut unknown) = (BTreeSet::new(), BTreeSet::new());
    for batch in 1.. {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let (records, values) = batch_of(batch);
        match client.produce("orders", records).await {
            Ok(_) => acked.extend(values),
            Err(_) => unknown.extend(values),
        }
        // A steady trickle, not a flood: the consumers must keep up between churn steps.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (acked, unknown)
}

/// Receives lines into `seen` until `done(seen)`; each line must come within PRINT_WAIT.
async fn receive_until(
    lines: &mut UnboundedReceiver<(String, String)>,
    seen: &mut Vec<(String, String)>,
    broker: &BrokerProcess,
    mut done: impl FnMut(&[(String, String)]) -> bool,
) {
    while !done(seen) {
        let Ok(Some(line)) = tokio::time::timeout(PRINT_WAIT, lines.recv()).await else {
            panic!("nothing printed for {PRINT_WAIT:?}\n{}", broker.log());
        };
        seen.push(line);
    }
}

/// `b<batch>:k<key>:<seq>` as (key, (batch, seq)): a key's records in the order produced.
fn produced_order(value: &str) -> (String, (usize, usize)) {
    let mut parts = value.split(':');
    let batch = parts.next().unwrap()[1..].parse().unwrap();
    let key = parts.next().unwrap().to_string();
    (key, (batch, parts.next().unwrap().parse().unwrap()))
}

/// Three consumers of one group while a producer keeps writing: one at a time is killed
/// (SIGKILL) or stopped (Ctrl-C) and started again under its member name, and ranges split
/// and merge in between. Every acknowledged record is printed; a record printed twice was
/// printed by a process killed before it committed it (at-least-once, never two live members
/// reading one range, never a commit lost); each process prints each key's records in the
/// order they were produced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_killed_and_restarted_under_load_and_reshaping_miss_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::new(dir.path());
    let (_serve, client) = serve_orders(&broker).await;
    let admin = broker.connect_as("admin", "admin-password-long").await;
    let (sender, mut lines) = unbounded_channel();
    let names = ["a", "b", "c"];
    let mut incarnations = [0usize; 3];
    let label = |name: &str, incarnation: usize| format!("{name}#{incarnation}");
    let mut running: Vec<Killed> = names
        .iter()
        .map(|name| consumer_as(&broker, name, label(name, 0), sender.clone()))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let producer = tokio::spawn(produce_until(client, stop.clone()));

    let mut seen = Vec::new();
    let mut killed = BTreeSet::new();
    let mut halves = None;
    for step in CHURN {
        let target = seen.len() + PRINTED_PER_STEP;
        receive_until(&mut lines, &mut seen, &broker, |seen| seen.len() >= target).await;
        eprintln!("{step:?} after {} lines", seen.len());
        match step {
            Churn::Kill(i) | Churn::Interrupt(i) => {
                let process = &mut running[i].0;
                if let Churn::Kill(_) = step {
                    process.kill().unwrap();
                    killed.insert(label(names[i], incarnations[i]));
                } else {
                    // SAFETY: a plain signal to a child this test owns.
                    assert_eq!(unsafe { libc::kill(process.id() as i32, libc::SIGINT) }, 0);
                }
                let status = process.wait().unwrap();
                assert!(matches!(step, Churn::Kill(_)) || status.success(), "Ctrl-C exits cleanly");
                incarnations[i] += 1;
                let again = label(names[i], incarnations[i]);
                running[i] = consumer_as(&broker, names[i], again, sender.clone());
            }
            Churn::Split => {
                let described = admin.describe_topic("orders").await.unwrap();
                let active = described.ranges.iter().find(|range| range.children.is_empty());
                halves = Some(admin.split_range("orders", active.unwrap().range_id).await.unwrap());
            }
            Churn::Merge => {
                let (low, high) = halves.take().unwrap();
                admin.merge_ranges("orders", low, high).await.unwrap();
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let (acked, unknown) = producer.await.unwrap();
    receive_until(&mut lines, &mut seen, &broker, |seen| {
        let printed: BTreeSet<&String> = seen.iter().map(|(_, value)| value).collect();
        acked.iter().all(|value| printed.contains(value))
    })
    .await;
    eprintln!(
        "{} acknowledged, {} refused, {} lines printed",
        acked.len(),
        unknown.len(),
        seen.len()
    );

    let mut printers: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut last: BTreeMap<(&str, String), (usize, usize)> = BTreeMap::new();
    for (who, value) in &seen {
        printers.entry(value.as_str()).or_default().push(who.as_str());
        let (key, order) = produced_order(value);
        if let Some(previous) = last.insert((who.as_str(), key.clone()), order) {
            assert!(previous < order, "{who} printed {value} after {key} at {previous:?}");
        }
    }
    for (value, who) in &printers {
        let live = who.iter().filter(|who| !killed.contains(**who)).count();
        assert!(
            live <= 1 || unknown.contains(*value),
            "{value} printed by {who:?}, of which only {killed:?} were killed"
        );
    }
}

/// A member whose broker is killed and started again connects again and rejoins as the same
/// member: it prints every record produced after the restart, once and in key order (the
/// group's membership and positions are on the broker's disk).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_rejoins_when_its_broker_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::new(dir.path());
    let (serve, client) = serve_orders(&broker).await;
    let (sender, mut lines) = unbounded_channel();
    let _a = consumer(&broker, "a", sender);
    let expected = produce_batch(&client, 1).await;
    assert_once_and_in_order(&printed(&mut lines, &expected, &broker).await, &expected);

    drop(serve); // SIGKILL
    let _serve = Killed(broker.spawn());
    let client = broker.connect().await;
    let expected = produce_batch(&client, 2).await;
    assert_once_and_in_order(&printed(&mut lines, &expected, &broker).await, &expected);
}

/// A member paused (SIGSTOP) past its session loses its ranges to the other, which prints what
/// arrives meanwhile; woken (SIGCONT), the paused one must not print what its interrupted long
/// poll brings back from a range that is no longer its own: it re-learns its ranges first.
/// Every record of the batches produced during and after the pause is printed exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_paused_past_its_session_prints_nothing_another_member_reads() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::new(dir.path()).env("MALACHI_GROUP_SESSION_TIMEOUT_MS", "3000");
    let (_serve, client) = serve_orders(&broker).await;
    let (sender, mut lines) = unbounded_channel();
    let a = consumer(&broker, "a", sender.clone());
    let _b = consumer(&broker, "b", sender);
    let batch = until_each_prints(&client, &mut lines, &broker, 2, 0).await;

    let signal = |name: i32| {
        // SAFETY: a plain signal to a child this test owns.
        assert_eq!(unsafe { libc::kill(a.0.id() as i32, name) }, 0);
    };
    signal(libc::SIGSTOP);
    let during = produce_batch(&client, batch + 1).await;
    let mut seen = Vec::new();
    receive_until(&mut lines, &mut seen, &broker, |seen| {
        let by_b: BTreeSet<&String> =
            seen.iter().filter(|(who, _)| who == "b").map(|(_, value)| value).collect();
        during.iter().all(|value| by_b.contains(value))
    })
    .await;
    signal(libc::SIGCONT);
    let after = produce_batch(&client, batch + 2).await;
    receive_until(&mut lines, &mut seen, &broker, |seen| {
        let printed: BTreeSet<&String> = seen.iter().map(|(_, value)| value).collect();
        after.iter().all(|value| printed.contains(value))
    })
    .await;
    for expected in [during, after] {
        let checked: Vec<(String, String)> =
            seen.iter().filter(|(_, value)| expected.contains(value)).cloned().collect();
        assert_once_and_in_order(&checked, &expected);
    }
}
