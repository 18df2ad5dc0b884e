//! `malachi cluster status`: the brokers of the cluster and its Raft groups, as the broker
//! answering sees them (key 70, admin); `malachi cluster remove`: decommission one (key 71).

use clap::Subcommand;
use malachi_client::{ClusterBroker, ClusterGroup, ClusterStatusResponse};

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
    /// voters) as the broker answering sees them (admin).
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
}

pub async fn run(args: ClusterArgs) -> Result<(), String> {
    let session = Session::connect(&args.connection).await?;
    match args.command {
        ClusterCommand::Status => {
            let status = session.client.cluster_status().await;
            let status = status.map_err(|error| session.fail("cluster status", &error))?;
            print!("{}", status_text(&status));
        }
        ClusterCommand::Remove { broker, force } => {
            let removed = session.client.remove_broker(broker, force).await;
            removed.map_err(|error| session.fail("cluster remove", &error))?;
            println!("removed broker {broker} from the cluster");
        }
    }
    Ok(())
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
        2 => "dead",
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
}
