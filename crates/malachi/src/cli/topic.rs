//! `malachi topic create|list|describe|delete|split|merge`.

use clap::Subcommand;
use malachi_client::{DescribeTopicResponse, RangeDescription, RangeState};

use super::Session;
use super::output::{lossy, table, utc_time};
use super::settings::ConnectionArgs;

#[derive(clap::Args, Debug)]
pub struct TopicArgs {
    #[command(flatten)]
    connection: ConnectionArgs,
    #[command(subcommand)]
    command: TopicCommand,
}

#[derive(Subcommand, Debug)]
enum TopicCommand {
    /// Create a topic.
    Create {
        name: String,
        /// Start with this many ranges (a power of two) instead of one.
        #[arg(long, value_name = "N")]
        ranges: Option<u32>,
    },
    /// List every topic's name.
    List,
    /// Show a topic and the table of its ranges.
    Describe { name: String },
    /// Delete a topic and its records (admin).
    Delete { name: String },
    /// Split an active range into its two halves (admin).
    Split { name: String, range_id: u32 },
    /// Merge two active buddy ranges back into one (admin).
    Merge { name: String, left: u32, right: u32 },
}

pub async fn run(args: TopicArgs) -> Result<(), String> {
    let session = Session::connect(&args.connection).await?;
    let client = &session.client;
    match args.command {
        TopicCommand::Create { name, ranges } => {
            let created = match ranges {
                None => client.create_topic(&name).await,
                Some(ranges) => client.create_topic_with_ranges(&name, ranges).await,
            };
            created.map_err(|error| session.fail_on("create topic", &name, &error))?;
            println!("created topic {name}");
        }
        TopicCommand::List => {
            let topics = client.list_topics().await.map_err(|e| session.fail("list topics", &e))?;
            for topic in topics {
                println!("{topic}");
            }
        }
        TopicCommand::Describe { name } => {
            let described = client.describe_topic(&name).await;
            let described =
                described.map_err(|error| session.fail_on("describe", &name, &error))?;
            print!("{}", describe_text(&described));
        }
        TopicCommand::Delete { name } => {
            client.delete_topic(&name).await.map_err(|e| session.fail_on("delete", &name, &e))?;
            println!("deleted topic {name}");
        }
        TopicCommand::Split { name, range_id } => {
            let split = client.split_range(&name, range_id).await;
            let (low, high) = split.map_err(|error| session.fail_on("split", &name, &error))?;
            println!("split range {range_id} of {name} into {low} and {high}");
        }
        TopicCommand::Merge { name, left, right } => {
            let merged = client.merge_ranges(&name, left, right).await;
            let merged = merged.map_err(|error| session.fail_on("merge", &name, &error))?;
            println!("merged ranges {left} and {right} of {name} into {merged}");
        }
    }
    Ok(())
}

/// The topic's facts, then one row per range.
fn describe_text(described: &DescribeTopicResponse) -> String {
    let policy = described.policy.as_deref().map_or("(none)".to_string(), |name| lossy(Some(name)));
    let mut text = format!(
        "topic    {}\nid       {}\ncreated  {}\npolicy   {}\n\n",
        lossy(described.topic.as_deref()),
        described.topic_id,
        utc_time(described.created_ms),
        policy,
    );
    let headers =
        ["RANGE", "STATE", "START", "END", "PARENTS", "CHILDREN", "SEGMENTS", "RECORDS", "EXPIRED"];
    let rows: Vec<Vec<String>> = described.ranges.iter().map(range_row).collect();
    text.push_str(&table(&headers, &rows));
    text
}

fn range_row(range: &RangeDescription) -> Vec<String> {
    let list = |ids: &[u32]| {
        let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
        if ids.is_empty() { "-".to_string() } else { ids.join(",") }
    };
    let state = match range.state {
        RangeState::Active => "active",
        RangeState::Sealed => "sealed",
    };
    vec![
        range.range_id.to_string(),
        state.to_string(),
        format!("{:#018x}", range.start),
        format!("{:#018x}", range.end_inclusive),
        list(&range.parents),
        list(&range.children),
        range.segments.to_string(),
        range.records.to_string(),
        range.expired_records.to_string(),
    ]
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    #[test]
    fn describe_prints_facts_and_ranges() {
        let range = |range_id, start, end_inclusive, state, parents: &[u32], children: &[u32]| {
            RangeDescription {
                range_id,
                start,
                end_inclusive,
                state,
                parents: parents.to_vec(),
                children: children.to_vec(),
                segments: 1,
                records: 10,
                expired_records: 0,
            }
        };
        let described = DescribeTopicResponse {
            topic: Some(Bytes::from_static(b"orders")),
            topic_id: 7,
            created_ms: 1_767_225_600_000,
            policy: None,
            ranges: vec![
                range(0, 0, u64::MAX, RangeState::Sealed, &[], &[1, 2]),
                range(1, 0, (1 << 63) - 1, RangeState::Active, &[0], &[]),
            ],
        };
        let expected = "\
topic    orders
id       7
created  2026-01-01T00:00:00.000Z
policy   (none)

RANGE  STATE   START               END                 PARENTS  CHILDREN  SEGMENTS  RECORDS  EXPIRED
0      sealed  0x0000000000000000  0xffffffffffffffff  -        1,2       1         10       0
1      active  0x0000000000000000  0x7fffffffffffffff  0        -         1         10       0
";
        assert_eq!(describe_text(&described), expected);
    }
}
