//! `malachi group list` and `malachi group describe`: consumer groups and how far behind they
//! are (key 73), every topic's or one topic's.

use clap::Subcommand;
use malachi_client::{GroupLagDescription, GroupLagResponse, LagStanding, RangeState};

use super::Session;
use super::output::{lossy, table};
use super::settings::ConnectionArgs;

#[derive(clap::Args, Debug)]
pub struct GroupArgs {
    #[command(flatten)]
    connection: ConnectionArgs,
    #[command(subcommand)]
    command: GroupCommand,
}

#[derive(Subcommand, Debug)]
enum GroupCommand {
    /// List the consumer groups that committed a position, with their lag in records (every
    /// topic the user may consume, or one).
    List {
        /// Only this topic's groups.
        #[arg(long)]
        topic: Option<String>,
    },
    /// Show one group's position and lag in each range of a topic.
    Describe { topic: String, group: String },
}

pub async fn run(args: GroupArgs) -> Result<(), String> {
    let session = Session::connect(&args.connection).await?;
    match args.command {
        GroupCommand::List { topic } => {
            let topics = match topic {
                Some(topic) => vec![topic],
                None => {
                    let listed = session.client.list_topics().await;
                    listed.map_err(|error| session.fail("list topics", &error))?
                }
            };
            let mut answers = Vec::with_capacity(topics.len());
            for topic in &topics {
                match session.client.group_lag(topic, None).await {
                    Ok(answer) => answers.push(answer),
                    // A topic the user may list but not consume has no groups to show.
                    Err(error) if topics.len() > 1 => {
                        eprintln!("{}", session.fail_on("group lag", topic, &error));
                    }
                    Err(error) => return Err(session.fail_on("group lag", topic, &error)),
                }
            }
            print!("{}", list_text(&answers));
        }
        GroupCommand::Describe { topic, group } => {
            let answer = session.client.group_lag(&topic, Some(&group)).await;
            let answer = answer.map_err(|error| session.fail_on("group lag", &topic, &error))?;
            let described = answer.groups.first().ok_or("the broker answered no group")?;
            print!("{}", describe_text(&topic, described));
        }
    }
    Ok(())
}

/// One line per group: topic, group, lag, ranges behind.
fn list_text(answers: &[GroupLagResponse]) -> String {
    let rows: Vec<Vec<String>> = answers
        .iter()
        .flat_map(|answer| {
            answer.groups.iter().map(|group| {
                let behind = group.ranges.iter().filter(|range| range.lag > 0).count();
                vec![
                    lossy(answer.topic.as_deref()),
                    lossy(group.group.as_deref()),
                    group.total.to_string(),
                    behind.to_string(),
                ]
            })
        })
        .collect();
    if rows.is_empty() {
        return "no consumer group has committed a position\n".into();
    }
    table(&["TOPIC", "GROUP", "LAG", "RANGES BEHIND"], &rows)
}

/// The group's total lag, then one line per range it has yet to finish or stands in.
fn describe_text(topic: &str, group: &GroupLagDescription) -> String {
    let name = lossy(group.group.as_deref());
    let mut text = format!("topic {topic}  group {name}  lag {} records\n\n", group.total);
    let rows: Vec<Vec<String>> = group
        .ranges
        .iter()
        .filter(|range| range.standing != LagStanding::Drained || range.lag > 0)
        .map(|range| {
            let state = match range.state {
                RangeState::Active => "active",
                RangeState::Sealed => "sealed",
            };
            let position = match range.standing {
                LagStanding::At => range.position.to_string(),
                LagStanding::Drained => "drained".into(),
                LagStanding::Ahead => "not reached".into(),
            };
            vec![
                range.range_id.to_string(),
                state.into(),
                position,
                range.end.to_string(),
                range.lag.to_string(),
            ]
        })
        .collect();
    text.push_str(&table(&["RANGE", "STATE", "POSITION", "END", "LAG"], &rows));
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use malachi_client::RangeLagDescription;

    fn range(
        range_id: u32,
        standing: LagStanding,
        position: u64,
        end: u64,
        lag: u64,
    ) -> RangeLagDescription {
        let state =
            if standing == LagStanding::Drained { RangeState::Sealed } else { RangeState::Active };
        RangeLagDescription { range_id, state, standing, position, end, lag }
    }

    fn group() -> GroupLagDescription {
        GroupLagDescription {
            group: Some("billing".into()),
            total: 13,
            updated_ms: 0,
            ranges: vec![
                range(0, LagStanding::Drained, 0, 10, 0),
                range(1, LagStanding::At, 7, 10, 3),
                range(2, LagStanding::Ahead, 0, 10, 10),
            ],
        }
    }

    #[test]
    fn a_group_is_described_range_by_range() {
        let text = describe_text("orders", &group());
        let expected = "topic orders  group billing  lag 13 records\n\n\
            RANGE  STATE   POSITION     END  LAG\n\
            1      active  7            10   3\n\
            2      active  not reached  10   10\n";
        assert_eq!(text, expected);
    }

    #[test]
    fn groups_are_listed_with_their_lag() {
        let answer = GroupLagResponse { topic: Some("orders".into()), groups: vec![group()] };
        let expected = "TOPIC   GROUP    LAG  RANGES BEHIND\norders  billing  13   2\n";
        assert_eq!(list_text(&[answer]), expected);
        assert_eq!(list_text(&[]), "no consumer group has committed a position\n");
    }
}
