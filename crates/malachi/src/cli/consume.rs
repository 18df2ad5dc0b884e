//! `malachi consume TOPIC`: prints records, one value per line or one JSON object per line.
//!
//! Without `--follow` it reads until a page comes back empty (the topic is drained) and exits;
//! with it, it long-polls for new records until Ctrl-C. With `--group`, it joins the group as a
//! member (keys 31-34): processes of one group share its ranges, and each page is committed once
//! it has been printed and flushed (at-least-once: a crash in between prints the page again). `--max N` stops after N records: pages ask for no more than that, but
//! `max` counts per range, so on a topic of several ranges the last page can hold more; such a
//! page is printed only in part and not committed (the next run prints it again).
//!
//! A refusal the broker calls retryable (`metadata_unavailable` while a vnode elects a leader
//! after a broker died, `overloaded`) is waited out with a growing pause, for up to
//! [`RETRY_FOR`] in a row, so a consumer outlives a failover; anything else ends the run.

use std::io::{self, Write};
use std::time::Duration;

use malachi_client::{
    Client, ClientError, Consumer, ConsumerOptions, GroupMember, MemberOptions, Record,
};

use super::Session;
use super::output::json_line;
use super::settings::ConnectionArgs;

/// How long leaving the group may hold up the exit.
const LEAVE_WAIT: Duration = Duration::from_secs(1);
/// How long retryable refusals in a row are waited out before the run fails.
const RETRY_FOR: Duration = Duration::from_secs(60);
/// The first pause after a retryable refusal, doubled after each up to the last.
const RETRY_PAUSE_FIRST: Duration = Duration::from_millis(100);
const RETRY_PAUSE_LAST: Duration = Duration::from_secs(2);

#[derive(clap::Args, Debug)]
pub struct ConsumeArgs {
    #[command(flatten)]
    connection: ConnectionArgs,
    topic: String,
    /// Read from this consumer group's position and commit each page to it.
    #[arg(long, value_name = "GROUP")]
    group: Option<String>,
    /// The member name to read as in --group (default: one made up for this process). The
    /// group's members share its ranges.
    #[arg(long, value_name = "MEMBER", requires = "group")]
    member: Option<String>,
    /// Keep waiting for new records (long poll) instead of exiting once drained.
    #[arg(long)]
    follow: bool,
    /// Read from the oldest record, ignoring the group's position (commits still go to it).
    #[arg(long)]
    from_start: bool,
    /// Exit after printing N records.
    #[arg(long, value_name = "N")]
    max: Option<u64>,
    /// Print one JSON object per record: key, value, headers, timestamp_ms.
    #[arg(long)]
    json: bool,
    /// Records per range per fetch.
    #[arg(long, default_value_t = 500, value_name = "N")]
    page_records: u32,
    /// How long one long poll waits with --follow, in milliseconds (at most 30000).
    #[arg(long, default_value_t = 5000, value_name = "MS")]
    wait_ms: u32,
}

/// What printing a page amounted to.
#[derive(Debug, PartialEq, Eq)]
enum Printed {
    /// Every record of the page.
    Whole,
    /// `--max` was reached inside the page: stop, without committing it.
    CutShort,
    /// Stdout is closed (`| head`): stop quietly.
    Closed,
}

pub async fn run(args: ConsumeArgs) -> Result<(), String> {
    let session = Session::connect(&args.connection).await?;
    let joined = Reader::open(&session.client, &args).await;
    let mut reader = joined.map_err(|error| {
        session.fail_on(&format!("consume from {}", args.topic), &args.topic, &error)
    })?;
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    let mut remaining = args.max.unwrap_or(u64::MAX);
    let mut retries = Retries::default();
    let outcome = loop {
        if remaining == 0 {
            break Ok(());
        }
        // Ask for no more than --max still allows, so that (with one range) a page is never
        // cut short and every printed page can be committed.
        let page_max = u64::from(args.page_records).min(remaining);
        reader.set_max(u32::try_from(page_max).unwrap_or(args.page_records));
        let page = tokio::select! {
            page = reader.next_page() => page,
            _ = &mut interrupted => break Ok(()),
        };
        let records = match page {
            Ok(records) => records,
            Err(error) => match retries.pause_after(error) {
                Ok(pause) => {
                    tokio::select! {
                        () = tokio::time::sleep(pause) => continue,
                        _ = &mut interrupted => break Ok(()),
                    }
                }
                Err(error) => break Err(error),
            },
        };
        retries = Retries::default();
        if records.is_empty() {
            if args.follow {
                continue;
            }
            break Ok(());
        }
        match print_page(&records, &mut remaining, args.json) {
            Printed::Whole => {}
            Printed::CutShort | Printed::Closed => break Ok(()),
        }
        // A commit refused for now is made again before the next page is read.
        if let Err(error) = reader.commit().await
            && let Err(error) = retries.pause_after(error)
        {
            break Err(error);
        }
    };
    if let Reader::Member(member) = reader {
        // Leave at once so the group rebalances now rather than after the session times out.
        // The broker answers in order, so an interrupted long poll delays the answer; past
        // the bound the session simply expires.
        let _ = tokio::time::timeout(LEAVE_WAIT, member.leave()).await;
    }
    outcome.map_err(|error: ClientError| {
        session.fail_on(&format!("consume from {}", args.topic), &args.topic, &error)
    })
}

/// Retryable refusals in a row: how long they have lasted and the next pause.
#[derive(Debug, Default)]
struct Retries {
    first_at: Option<std::time::Instant>,
    pause: Duration,
}

impl Retries {
    /// The pause before trying again after `error`, or the error if it is not retryable or
    /// the refusals have lasted [`RETRY_FOR`]. Only server refusals are retried: the
    /// connection is this run's only one, so a lost connection ends it.
    fn pause_after(&mut self, error: ClientError) -> Result<Duration, ClientError> {
        let retryable = matches!(error, ClientError::Server { retryable: true, .. });
        let first_at = *self.first_at.get_or_insert_with(std::time::Instant::now);
        if !retryable || first_at.elapsed() >= RETRY_FOR {
            return Err(error);
        }
        self.pause = (self.pause * 2).clamp(RETRY_PAUSE_FIRST, RETRY_PAUSE_LAST);
        eprintln!("malachi consume: {error}; trying again in {} ms", self.pause.as_millis());
        Ok(self.pause)
    }
}

/// What reads: a cursor over every range, or, with --group, a member of the group, which reads
/// only the ranges the group hands it.
enum Reader<'a> {
    Cursor(Consumer<'a>),
    Member(GroupMember<'a>),
}

impl<'a> Reader<'a> {
    async fn open(client: &'a Client, args: &ConsumeArgs) -> Result<Reader<'a>, ClientError> {
        let wait_ms = if args.follow { args.wait_ms } else { 0 };
        let Some(group) = &args.group else {
            let options = ConsumerOptions {
                max: args.page_records,
                wait_ms,
                from_start: args.from_start,
                ..ConsumerOptions::default()
            };
            return Ok(Reader::Cursor(Consumer::new(client, &args.topic, options)));
        };
        let member = args.member.clone().unwrap_or_else(made_up_member);
        let options = MemberOptions {
            max: args.page_records,
            wait: Duration::from_millis(wait_ms.into()),
            from_start: args.from_start,
        };
        let member = GroupMember::join(client, &args.topic, group, &member, options).await?;
        Ok(Reader::Member(member))
    }

    async fn next_page(&mut self) -> Result<Vec<Record>, ClientError> {
        match self {
            Reader::Cursor(consumer) => consumer.next_page().await,
            Reader::Member(member) => member.next_page().await,
        }
    }

    async fn commit(&mut self) -> Result<(), ClientError> {
        match self {
            Reader::Cursor(consumer) => consumer.commit().await,
            Reader::Member(member) => member.commit().await,
        }
    }

    fn set_max(&mut self, max: u32) {
        match self {
            Reader::Cursor(consumer) => consumer.set_max(max),
            Reader::Member(member) => member.set_max(max),
        }
    }
}

/// A member name no other process uses: this process's id and the time it started.
fn made_up_member() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    format!("consume-{}-{nanos:x}", std::process::id())
}

/// Prints up to `remaining` records of the page and flushes.
fn print_page(records: &[Record], remaining: &mut u64, json: bool) -> Printed {
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let take = usize::try_from(*remaining).unwrap_or(usize::MAX).min(records.len());
    let written = records[..take]
        .iter()
        .try_for_each(|record| write_record(&mut out, record, json))
        .and_then(|()| out.flush());
    if written.is_err() {
        return Printed::Closed;
    }
    *remaining -= take as u64;
    if take < records.len() { Printed::CutShort } else { Printed::Whole }
}

fn write_record(out: &mut impl Write, record: &Record, json: bool) -> io::Result<()> {
    if json {
        writeln!(out, "{}", json_line(record))
    } else {
        out.write_all(&record.value)?;
        out.write_all(b"\n")
    }
}

#[cfg(test)]
mod tests {
    use malachi_client::RecordBuilder;

    use super::*;

    #[test]
    fn retryable_refusals_are_waited_out_with_growing_pauses_and_others_end_the_run() {
        let mut retries = Retries::default();
        let pauses: Vec<u128> = (0..7)
            .map(|_| retries.pause_after(ClientError::server(b"metadata_unavailable")))
            .map(|pause| pause.expect("retryable").as_millis())
            .collect();
        assert_eq!(pauses, [100, 200, 400, 800, 1600, 2000, 2000]);
        let refused = retries.pause_after(ClientError::server(b"permission_denied"));
        assert!(refused.is_err(), "a final refusal ends the run");
        assert!(Retries::default().pause_after(ClientError::Closed).is_err(), "one connection");
        let mut lasting =
            Retries { first_at: Some(std::time::Instant::now() - RETRY_FOR), ..Default::default() };
        assert!(lasting.pause_after(ClientError::server(b"metadata_unavailable")).is_err());
    }

    #[test]
    fn plain_output_is_the_raw_value_per_line() {
        let mut out = Vec::new();
        let records = [RecordBuilder::new("a").build(), RecordBuilder::new(vec![0xff]).build()];
        for record in &records {
            write_record(&mut out, record, false).expect("writes");
        }
        assert_eq!(out, b"a\n\xff\n");
    }
}
