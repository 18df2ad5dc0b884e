//! `malachi topic create|list|describe|delete|split|merge`.

use clap::Subcommand;
use malachi_client::{
    CopyDescription, DescribeSegmentsResponse, DescribeTopicResponse, RangeDescription, RangeState,
    SegmentDescription, SegmentState,
};

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
    /// Show a topic, the table of its ranges, and the table of its segments with their copies.
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
            // A broker without key 72 still describes the ranges.
            match client.describe_segments(&name).await {
                Ok(segments) => print!("\n{}", segments_text(&segments, &described)),
                Err(error) => println!("\nsegments not described: {error}"),
            }
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

/// One row per segment: where it sits in its range, its recorded seal, and its copies in
/// replica order (the primary starred): each one's end as its broker reports it (`?`: it did
/// not answer), which are sealed, which metadata records as settled.
fn segments_text(segments: &DescribeSegmentsResponse, described: &DescribeTopicResponse) -> String {
    let headers = [
        "RANGE", "SEGMENT", "BASE", "STATE", "RECORDS", "BYTES", "REPLICAS", "ENDS", "SEALED",
        "SETTLED",
    ];
    let rows: Vec<Vec<String>> = segments.segments.iter().map(segment_row).collect();
    let mut text = table(&headers, &rows);
    let retained: u64 = described.ranges.iter().map(|range| u64::from(range.segments)).sum();
    if (rows.len() as u64) < retained {
        text.push_str(&format!("(the first {} of {retained} segments)\n", rows.len()));
    }
    text
}

fn segment_row(segment: &SegmentDescription) -> Vec<String> {
    let copies = &segment.copies;
    let star = |at: usize| if at == 0 { "*" } else { "" };
    let replicas: Vec<String> = copies
        .iter()
        .enumerate()
        .map(|(at, copy)| format!("{}{}", copy.node_id, star(at)))
        .collect();
    let ends: Vec<String> = copies
        .iter()
        .map(|copy| if copy.answered { copy.durable_offset.to_string() } else { "?".into() })
        .collect();
    let (state, records, bytes) = match segment.state {
        SegmentState::Active => ("active", "-".into(), "-".into()),
        SegmentState::Sealed => {
            ("sealed", segment.end_offset.to_string(), segment.data_bytes.to_string())
        }
    };
    vec![
        segment.range_id.to_string(),
        segment.segment_id.to_string(),
        segment.base_records.to_string(),
        state.to_string(),
        records,
        bytes,
        replicas.join(" "),
        ends.join(" "),
        nodes_where(copies, |copy| copy.sealed),
        nodes_where(copies, |copy| copy.settled),
    ]
}

/// The node ids of the copies that `holds`, comma separated; `-` for none.
fn nodes_where(copies: &[CopyDescription], holds: impl Fn(&CopyDescription) -> bool) -> String {
    let nodes: Vec<String> =
        copies.iter().filter(|copy| holds(copy)).map(|copy| copy.node_id.to_string()).collect();
    if nodes.is_empty() { "-".to_string() } else { nodes.join(",") }
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

    fn copy(node_id: u64, answer: Option<(u64, bool)>, settled: bool) -> CopyDescription {
        CopyDescription {
            node_id,
            settled,
            answered: answer.is_some(),
            durable_offset: answer.map_or(0, |(end, _)| end),
            sealed: answer.is_some_and(|(_, sealed)| sealed),
        }
    }

    fn segment(
        segment_id: u64,
        seal: Option<(u64, u64)>,
        copies: &[CopyDescription],
    ) -> SegmentDescription {
        SegmentDescription {
            range_id: 0,
            segment_id,
            base_records: if seal.is_some() { 0 } else { 120 },
            state: if seal.is_some() { SegmentState::Sealed } else { SegmentState::Active },
            end_offset: seal.map_or(0, |(records, _)| records),
            data_bytes: seal.map_or(0, |(_, bytes)| bytes),
            copies: copies.to_vec(),
        }
    }

    #[test]
    fn segments_print_their_copies() {
        let sealed = segment(
            3,
            Some((120, 4096)),
            &[
                copy(1, Some((120, true)), true),
                copy(2, Some((120, true)), true),
                copy(3, None, false),
            ],
        );
        let head = segment(
            5,
            None,
            &[
                copy(2, Some((120, false)), false),
                copy(3, None, false),
                copy(1, Some((118, false)), false),
            ],
        );
        let unanswered = segment(6, None, &[copy(4, None, false)]);
        let described = |segments: u32| DescribeTopicResponse {
            ranges: vec![RangeDescription {
                range_id: 0,
                start: 0,
                end_inclusive: u64::MAX,
                state: RangeState::Active,
                parents: Vec::new(),
                children: Vec::new(),
                segments,
                records: 240,
                expired_records: 0,
            }],
            ..DescribeTopicResponse::default()
        };
        let header =
            "RANGE  SEGMENT  BASE  STATE   RECORDS  BYTES  REPLICAS  ENDS       SEALED  SETTLED\n";
        let sealed_row =
            "0      3        0     sealed  120      4096   1* 2 3    120 120 ?  1,2     1,2\n";
        let head_row =
            "0      5        120   active  -        -      2* 3 1    120 ? 118  -       -\n";
        // (segments listed, segments the topic retains, expected text)
        let cases: Vec<(Vec<SegmentDescription>, u32, String)> = vec![
            (vec![sealed.clone(), head.clone()], 2, format!("{header}{sealed_row}{head_row}")),
            (
                vec![sealed, head],
                3,
                format!("{header}{sealed_row}{head_row}(the first 2 of 3 segments)\n"),
            ),
            (
                vec![unanswered],
                1,
                "RANGE  SEGMENT  BASE  STATE   RECORDS  BYTES  REPLICAS  ENDS  SEALED  SETTLED\n\
                 0      6        120   active  -        -      4*        ?     -       -\n"
                    .to_string(),
            ),
            (
                Vec::new(),
                0,
                "RANGE  SEGMENT  BASE  STATE  RECORDS  BYTES  REPLICAS  ENDS  SEALED  SETTLED\n"
                    .to_string(),
            ),
        ];
        for (segments, retained, expected) in cases {
            let answer = DescribeSegmentsResponse { topic: None, segments };
            assert_eq!(segments_text(&answer, &described(retained)), expected);
        }
    }
}
