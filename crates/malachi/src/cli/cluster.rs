//! `malachi cluster status`: the brokers of the cluster and its Raft groups, as the broker
//! answering sees them (key 70, admin), then the segments that lack a copy (key 72 for every
//! topic); `malachi cluster remove`: decommission one (key 71); `malachi cluster drain` and
//! `undrain`: a broker hands its work over for maintenance and takes it again (key 74).

use std::collections::BTreeSet;

use clap::Subcommand;
use malachi_client::{
    ClusterBroker, ClusterGroup, ClusterStatusResponse, CopyDescription, DescribeSegmentsResponse,
    DrainBrokerResponse, SegmentDescription, SegmentState,
};

use super::Session;
use super::output::{lossy, table};
use super::settings::ConnectionArgs;

#[derive(clap::Args, Debug)]
pub struct ClusterArgs {
    #[command(flatten)]
    connection: ConnectionArgs,
    #[command(subcommand)]
    command: ClusterCommand,
}

#[derive(Subcommand, Debug)]
enum ClusterCommand {
    /// Show the brokers (status, addresses, attributes) and the Raft groups (leader, term,
    /// voters) as the broker answering sees them, then the under-replicated segments: those
    /// with a copy whose broker is dead or does not answer, or that healing has not settled
    /// yet (admin).
    Status,
    /// Decommission a broker: its voter seats move to other brokers, the write heads it holds
    /// roll onto others, then the cluster forgets it (admin; send it through another broker).
    Remove {
        broker: u64,
        /// Remove it even while it holds sealed segments: each has one copy until segments are
        /// replicated, so their records go with the broker.
        #[arg(long)]
        force: bool,
    },
    /// Hand a broker's work over without stopping it, for maintenance: its Raft leaderships
    /// move to other brokers, the write heads it is primary of roll onto others, and no new
    /// head or leadership goes to it until `undrain` or its restart (admin; any broker).
    Drain { broker: u64 },
    /// Let a drained broker take work again: new heads and leaderships may go to it (admin).
    Undrain { broker: u64 },
}

pub async fn run(args: ClusterArgs) -> Result<(), String> {
    let session = Session::connect(&args.connection).await?;
    match args.command {
        ClusterCommand::Status => {
            let status = session.client.cluster_status().await;
            let status = status.map_err(|error| session.fail("cluster status", &error))?;
            print!("{}", status_text(&status));
            let described = describe_every_topic(&session).await?;
            let wanted = usize::from(status.replicas_wanted);
            print!("\n{}", under_replicated_text(&described, &status.brokers, wanted));
        }
        ClusterCommand::Remove { broker, force } => {
            let removed = session.client.remove_broker(broker, force).await;
            removed.map_err(|error| session.fail("cluster remove", &error))?;
            println!("removed broker {broker} from the cluster");
        }
        ClusterCommand::Drain { broker } => {
            let drained = session.client.drain_broker(broker, true).await;
            let report = drained.map_err(|error| session.fail("cluster drain", &error))?;
            println!("{}", drain_text(broker, &report));
        }
        ClusterCommand::Undrain { broker } => {
            let undrained = session.client.drain_broker(broker, false).await;
            undrained.map_err(|error| session.fail("cluster undrain", &error))?;
            println!("broker {broker} takes work again");
        }
    }
    Ok(())
}

/// What a drain moved, and what it could not.
fn drain_text(broker: u64, report: &DrainBrokerResponse) -> String {
    let mut text = format!(
        "broker {broker} drained: {} brokers told, {} Raft leaderships moved, {} write heads rolled",
        report.brokers_told, report.leaderships_moved, report.heads_rolled
    );
    if report.leaderships_kept > 0 || report.heads_left > 0 {
        text.push_str(&format!(
            "
not moved (no live, caught-up broker took them): {} leaderships, {} write heads",
            report.leaderships_kept, report.heads_left
        ));
    }
    text
}

/// The answering broker and the cluster id, then a table of brokers and one of groups.
fn status_text(status: &ClusterStatusResponse) -> String {
    let cluster =
        status.cluster_id.as_deref().map_or("(a broker alone)".into(), |id| lossy(Some(id)));
    let mut text = format!("cluster  {cluster}\nanswered by broker {}\n\n", status.node_id);
    let headers = ["BROKER", "STATUS", "CLIENT", "INTER-NODE", "ATTRIBUTES"];
    let rows: Vec<Vec<String>> = status.brokers.iter().map(broker_row).collect();
    text.push_str(&table(&headers, &rows));
    text.push('\n');
    let headers = ["GROUP", "LEADER", "TERM", "VOTERS", "LEARNERS"];
    let rows: Vec<Vec<String>> = status.groups.iter().map(group_row).collect();
    text.push_str(&table(&headers, &rows));
    text
}

/// Under-replicated segments named one per line at most; the summary counts them all.
const UNDER_REPLICATED_SHOWN_MAX: usize = 20;

/// `cluster_status`'s status of a dead broker.
const STATUS_DEAD: u8 = 2;

/// Every topic's segments; a topic that cannot be described (deleted a moment ago, say) is
/// reported on standard error and left out.
async fn describe_every_topic(session: &Session) -> Result<Vec<DescribeSegmentsResponse>, String> {
    let topics = session.client.list_topics().await;
    let topics = topics.map_err(|error| session.fail("list topics", &error))?;
    let mut described = Vec::with_capacity(topics.len());
    for topic in topics {
        match session.client.describe_segments(&topic).await {
            Ok(segments) => described.push(segments),
            Err(error) => eprintln!("{}", session.fail_on("describe segments", &topic, &error)),
        }
    }
    Ok(described)
}

/// A summary line, then the first under-replicated segments with their missing copies: each
/// segment should have `wanted` replicas.
fn under_replicated_text(
    topics: &[DescribeSegmentsResponse],
    brokers: &[ClusterBroker],
    wanted: usize,
) -> String {
    let dead: BTreeSet<u64> = brokers
        .iter()
        .filter(|broker| broker.status == STATUS_DEAD)
        .map(|broker| broker.node_id)
        .collect();
    let (mut under_replicated, mut healing) = (0, 0);
    let mut rows = Vec::new();
    for topic in topics {
        for segment in &topic.segments {
            let mut missing = missing_copies(segment, &dead);
            if segment.copies.len() < wanted {
                missing.push(format!("({} of {wanted} placed)", segment.copies.len()));
            }
            if missing.is_empty() {
                continue;
            }
            under_replicated += 1;
            healing += usize::from(is_healing(segment));
            if rows.len() < UNDER_REPLICATED_SHOWN_MAX {
                rows.push(under_replicated_row(topic, segment, &missing));
            }
        }
    }
    let mut text = format!(
        "under-replicated segments\nunder-replicated: {under_replicated} segments ({healing} \
         healing)\n"
    );
    if !rows.is_empty() {
        text.push('\n');
        text.push_str(&table(&["TOPIC", "RANGE", "SEGMENT", "STATE", "MISSING"], &rows));
    }
    if under_replicated > rows.len() {
        text.push_str(&format!("... and {} more\n", under_replicated - rows.len()));
    }
    text
}

fn under_replicated_row(
    topic: &DescribeSegmentsResponse,
    segment: &SegmentDescription,
    missing: &[String],
) -> Vec<String> {
    let state = match segment.state {
        SegmentState::Active => "active",
        SegmentState::Sealed => "sealed",
    };
    vec![
        lossy(topic.topic.as_deref()),
        segment.range_id.to_string(),
        segment.segment_id.to_string(),
        state.to_string(),
        missing.join(", "),
    ]
}

/// A sealed segment with replicas whose copies metadata does not record as settled yet: the
/// healer checks or rebuilds them. A single copy has nothing to heal from.
fn is_healing(segment: &SegmentDescription) -> bool {
    segment.state == SegmentState::Sealed
        && segment.copies.len() > 1
        && segment.copies.iter().any(|copy| !copy.settled)
}

/// Each copy of `segment` that is missing, with why: `3 (unsettled, dead)`.
fn missing_copies(segment: &SegmentDescription, dead: &BTreeSet<u64>) -> Vec<String> {
    let healing = is_healing(segment);
    let why = |copy: &CopyDescription| {
        let mut why = Vec::new();
        if healing && !copy.settled {
            why.push("unsettled");
        }
        if dead.contains(&copy.node_id) {
            why.push("dead");
        } else if !copy.answered {
            why.push("not answering");
        }
        why
    };
    segment
        .copies
        .iter()
        .filter_map(|copy| {
            let why = why(copy);
            (!why.is_empty()).then(|| format!("{} ({})", copy.node_id, why.join(", ")))
        })
        .collect()
}

fn broker_row(broker: &ClusterBroker) -> Vec<String> {
    let attributes: Vec<String> =
        broker.attributes.iter().map(|attribute| lossy(attribute.as_deref())).collect();
    vec![
        broker.node_id.to_string(),
        status_name(broker.status).to_string(),
        broker.client_address.as_deref().map_or("-".into(), |address| lossy(Some(address))),
        broker.cluster_address.as_deref().map_or("-".into(), |address| lossy(Some(address))),
        if attributes.is_empty() { "-".into() } else { attributes.join(",") },
    ]
}

fn group_row(group: &ClusterGroup) -> Vec<String> {
    let list = |ids: &[u64]| {
        let ids: Vec<String> = ids.iter().map(u64::to_string).collect();
        if ids.is_empty() { "-".to_string() } else { ids.join(",") }
    };
    vec![
        group_name(group.group_id),
        if group.leader == 0 { "(none)".into() } else { group.leader.to_string() },
        group.term.to_string(),
        list(&group.voters),
        list(&group.learners),
    ]
}

/// The statuses of `cluster_state` (key 24).
fn status_name(status: u8) -> &'static str {
    match status {
        0 => "alive",
        1 => "suspect",
        STATUS_DEAD => "dead",
        _ => "unknown",
    }
}

fn group_name(group_id: u64) -> String {
    match group_id {
        0 => "admin".into(),
        malachi_broker::vnodes::ROOT_GROUP_ID => "root (ring)".into(),
        vnode => format!("vnode {vnode}"),
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    #[test]
    fn status_prints_brokers_and_groups() {
        let status = ClusterStatusResponse {
            node_id: 2,
            cluster_id: Some(Bytes::from_static(b"c1")),
            brokers: vec![
                ClusterBroker {
                    node_id: 1,
                    cluster_address: Some(Bytes::from_static(b"10.0.0.1:4042")),
                    client_address: Some(Bytes::from_static(b"10.0.0.1:4040")),
                    status: 0,
                    attributes: vec![Some(Bytes::from_static(b"rack=a"))],
                },
                ClusterBroker {
                    node_id: 2,
                    cluster_address: None,
                    client_address: Some(Bytes::from_static(b"10.0.0.2:4040")),
                    status: 2,
                    attributes: Vec::new(),
                },
            ],
            groups: vec![
                ClusterGroup {
                    group_id: 0,
                    leader: 1,
                    term: 4,
                    voters: vec![1, 2],
                    learners: vec![],
                },
                ClusterGroup {
                    group_id: malachi_broker::vnodes::ROOT_GROUP_ID,
                    leader: 1,
                    term: 1,
                    voters: vec![1],
                    learners: vec![],
                },
                ClusterGroup {
                    group_id: 1,
                    leader: 0,
                    term: 2,
                    voters: vec![1],
                    learners: vec![2],
                },
            ],
            replicas_wanted: 3,
        };
        let text = status_text(&status);
        let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
        assert_eq!(lines[0], "cluster  c1");
        assert_eq!(lines[1], "answered by broker 2");
        let row = |first: &str| -> Vec<&str> {
            let line = lines.iter().find(|line| line.starts_with(first)).expect(first);
            line.split_whitespace().collect()
        };
        assert_eq!(row("1 "), ["1", "alive", "10.0.0.1:4040", "10.0.0.1:4042", "rack=a"]);
        assert_eq!(row("2 "), ["2", "dead", "10.0.0.2:4040", "-", "-"]);
        assert_eq!(row("admin"), ["admin", "1", "4", "1,2", "-"]);
        assert_eq!(row("root"), ["root", "(ring)", "1", "1", "1", "-"]);
        assert_eq!(row("vnode"), ["vnode", "1", "(none)", "2", "1", "2"]);
    }

    /// `(node, answered, settled)` per copy.
    fn segment(segment_id: u64, sealed: bool, copies: &[(u64, bool, bool)]) -> SegmentDescription {
        let copies = copies
            .iter()
            .map(|&(node_id, answered, settled)| CopyDescription {
                node_id,
                settled,
                answered,
                durable_offset: if answered { 10 } else { 0 },
                sealed: answered && sealed,
            })
            .collect();
        SegmentDescription {
            range_id: 0,
            segment_id,
            base_records: 0,
            state: if sealed { SegmentState::Sealed } else { SegmentState::Active },
            end_offset: if sealed { 10 } else { 0 },
            data_bytes: if sealed { 300 } else { 0 },
            copies,
        }
    }

    fn topic(name: &'static str, segments: Vec<SegmentDescription>) -> DescribeSegmentsResponse {
        DescribeSegmentsResponse { topic: Some(Bytes::from_static(name.as_bytes())), segments }
    }

    #[test]
    fn under_replicated_segments_name_their_missing_copies() {
        let broker =
            |node_id, status| ClusterBroker { node_id, status, ..ClusterBroker::default() };
        let brokers = [broker(1, 0), broker(2, 0), broker(3, STATUS_DEAD), broker(4, 1)];
        let whole = segment(1, true, &[(1, true, true), (2, true, true), (4, true, true)]);
        let settling = segment(2, true, &[(1, true, true), (2, true, false), (4, true, true)]);
        // Dead as membership tells, whatever it answered a moment before.
        let answered_dead = segment(7, true, &[(1, true, true), (3, true, true)]);
        let on_dead = segment(3, false, &[(1, true, false), (2, true, false), (3, false, false)]);
        let silent = segment(4, false, &[(2, false, false), (1, true, false)]);
        let alone = segment(5, true, &[(1, true, false)]);
        let both = segment(6, true, &[(3, false, false), (1, true, true)]);
        let header = "TOPIC   RANGE  SEGMENT  STATE   MISSING\n";
        // (topics described, expected text after the section's title)
        let cases: Vec<(Vec<DescribeSegmentsResponse>, String)> = vec![
            (Vec::new(), "under-replicated: 0 segments (0 healing)\n".into()),
            (
                vec![topic("orders", vec![whole.clone(), alone])],
                "under-replicated: 0 segments (0 healing)\n".into(),
            ),
            (
                vec![topic("orders", vec![whole, settling, on_dead]), topic("audit", vec![silent])],
                format!(
                    "under-replicated: 3 segments (1 healing)\n\n{header}\
                     orders  0      2        sealed  2 (unsettled)\n\
                     orders  0      3        active  3 (dead)\n\
                     audit   0      4        active  2 (not answering)\n"
                ),
            ),
            (
                vec![topic("orders", vec![both, answered_dead])],
                "under-replicated: 2 segments (1 healing)\n\n\
                 TOPIC   RANGE  SEGMENT  STATE   MISSING\n\
                 orders  0      6        sealed  3 (unsettled, dead)\n\
                 orders  0      7        sealed  3 (dead)\n"
                    .into(),
            ),
        ];
        for (topics, expected) in cases {
            let text = under_replicated_text(&topics, &brokers, 1);
            assert_eq!(text, format!("under-replicated segments\n{expected}"));
        }
    }

    /// A segment placed on fewer brokers than the replication factor is under-replicated even
    /// with every copy it has settled and answering.
    #[test]
    fn segments_placed_on_too_few_brokers_are_under_replicated() {
        let brokers: Vec<ClusterBroker> =
            (1..=3).map(|node_id| ClusterBroker { node_id, ..ClusterBroker::default() }).collect();
        let two = segment(1, true, &[(1, true, true), (2, true, true)]);
        let three = segment(2, true, &[(1, true, true), (2, true, true), (3, true, true)]);
        let described = [topic("orders", vec![two, three])];
        // (replicas wanted, expected text after the section's title)
        let cases = [
            (2, "under-replicated: 0 segments (0 healing)\n".to_string()),
            (
                3,
                "under-replicated: 1 segments (0 healing)\n\n\
                 TOPIC   RANGE  SEGMENT  STATE   MISSING\n\
                 orders  0      1        sealed  (2 of 3 placed)\n"
                    .to_string(),
            ),
        ];
        for (wanted, expected) in cases {
            let text = under_replicated_text(&described, &brokers, wanted);
            assert_eq!(text, format!("under-replicated segments\n{expected}"), "{wanted}");
        }
    }

    #[test]
    fn only_the_first_under_replicated_segments_are_named() {
        let missing = |segment_id| segment(segment_id, false, &[(1, false, false)]);
        let segments = (1..=25).map(missing).collect();
        let text = under_replicated_text(&[topic("orders", segments)], &[], 1);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1], "under-replicated: 25 segments (0 healing)");
        let named = lines.iter().filter(|line| line.starts_with("orders")).count();
        assert_eq!(named, UNDER_REPLICATED_SHOWN_MAX);
        assert_eq!(lines.last(), Some(&"... and 5 more"));
    }
}
