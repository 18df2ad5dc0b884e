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
//! [`RETRY_FOR`] in a row, so a consumer outlives a failover; anything else ends the run. With
//! `--group`, a lost connection (the broker restarted) is followed by a new one, tried for as
//! long, joining as the same member: the group's committed positions say where to go on.

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
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    let mut run = Run {
        remaining: args.max.unwrap_or(u64::MAX),
        member: args.member.clone().unwrap_or_else(made_up_member),
        from_start: args.from_start,
    };
    // After a lost connection: failures to connect and rejoin, and how long they have lasted.
    let mut rejoining: Option<Retries> = None;
    loop {
        let session = match Session::connect(&args.connection).await {
            Ok(session) => session,
            Err(failure) => {
                let Some(pause) = rejoining.as_mut().and_then(Retries::pause) else {
                    return Err(failure);
                };
                if paused(&failure, pause, interrupted.as_mut()).await {
                    return Ok(());
                }
                continue;
            }
        };
        let fail = |error: &ClientError| {
            session.fail_on(&format!("consume from {}", args.topic), &args.topic, error)
        };
        let reader = match Reader::open(&session.client, &args, &run).await {
            Ok(reader) => reader,
            Err(error) => {
                let transient = is_lost(&error) || error.is_retryable();
                let retries = rejoining.as_mut().filter(|_| transient);
                let Some(pause) = retries.and_then(Retries::pause) else {
                    return Err(fail(&error));
                };
                if paused(&fail(&error), pause, interrupted.as_mut()).await {
                    return Ok(());
                }
                continue;
            }
        };
        match read(reader, &args, &mut run, interrupted.as_mut()).await {
            Ended::Done(outcome) => return outcome.map_err(|error| fail(&error)),
            Ended::Lost(error) => {
                // The group holds the positions: a new connection joins as the same member
                // and goes on from the last commit (a page printed and not yet committed is
                // printed again).
                eprintln!("malachi consume: connection lost ({error}); connecting again");
                run.from_start = false;
                rejoining = Some(Retries::default());
            }
        }
    }
}

/// Says why, then waits `pause` before trying again; whether Ctrl-C came first.
async fn paused(
    failure: &str,
    pause: Duration,
    interrupted: std::pin::Pin<&mut impl std::future::Future>,
) -> bool {
    eprintln!("malachi consume: {failure}; trying again in {} ms", pause.as_millis());
    tokio::select! {
        () = tokio::time::sleep(pause) => false,
        _ = interrupted => true,
    }
}

/// What carries over from one connection to the next.
struct Run {
    /// Records --max still allows.
    remaining: u64,
    /// The member name, kept so a new connection rejoins as the same member.
    member: String,
    /// Whether a reader starts at the oldest records: only the first.
    from_start: bool,
}

/// How reading over one connection ended.
enum Ended {
    /// For good: done, interrupted, or a failure a new connection would not cure.
    Done(Result<(), ClientError>),
    /// The connection failed under a group member: the run goes on over a new one.
    Lost(ClientError),
}

/// Pages from `reader`, printed and committed, until the run ends or (for a group member) the
/// connection is lost.
async fn read(
    mut reader: Reader<'_>,
    args: &ConsumeArgs,
    run: &mut Run,
    mut interrupted: std::pin::Pin<&mut impl std::future::Future>,
) -> Ended {
    let mut retries = Retries::default();
    let outcome = loop {
        if run.remaining == 0 {
            break Ok(());
        }
        // Ask for no more than --max still allows, so that (with one range) a page is never
        // cut short and every printed page can be committed.
        let page_max = u64::from(args.page_records).min(run.remaining);
        reader.set_max(u32::try_from(page_max).unwrap_or(args.page_records));
        let page = tokio::select! {
            page = reader.next_page() => page,
            _ = &mut interrupted => break Ok(()),
        };
        let records = match page {
            Ok(records) => records,
            Err(error) if reader.is_member() && is_lost(&error) => return Ended::Lost(error),
            Err(error) => {
                let Some(pause) = retries.pause_after(&error) else { break Err(error) };
                if paused(&error.to_string(), pause, interrupted.as_mut()).await {
                    break Ok(());
                }
                continue;
            }
        };
        retries = Retries::default();
        if records.is_empty() {
            if args.follow {
                continue;
            }
            break Ok(());
        }
        match print_page(&records, &mut run.remaining, args.json) {
            Printed::Whole => {}
            Printed::CutShort | Printed::Closed => break Ok(()),
        }
        // A commit refused for now is made again before the next page is read.
        match reader.commit().await {
            Err(error) if reader.is_member() && is_lost(&error) => return Ended::Lost(error),
            Err(error) => {
                let Some(pause) = retries.pause_after(&error) else { break Err(error) };
                if paused(&error.to_string(), pause, interrupted.as_mut()).await {
                    break Ok(());
                }
            }
            Ok(()) => {}
        }
    };
    if let Reader::Member(member) = reader {
        // Leave at once so the group rebalances now rather than after the session times out.
        // The broker answers in order, so an interrupted long poll delays the answer; past
        // the bound the session simply expires.
        let _ = tokio::time::timeout(LEAVE_WAIT, member.leave()).await;
    }
    Ended::Done(outcome)
}

/// Whether `error` means the connection is gone (or unanswered): a new one may go on.
fn is_lost(error: &ClientError) -> bool {
    matches!(error, ClientError::Transport(_) | ClientError::Closed | ClientError::Timeout)
}

/// Retryable refusals in a row: how long they have lasted and the next pause.
#[derive(Debug, Default)]
struct Retries {
    first_at: Option<std::time::Instant>,
    pause: Duration,
}

impl Retries {
    /// The pause before trying again after `error`; `None` if it is not retryable or the
    /// refusals have lasted [`RETRY_FOR`]. Only server refusals are retried here; a lost
    /// connection is [`Ended::Lost`].
    fn pause_after(&mut self, error: &ClientError) -> Option<Duration> {
        let retryable = matches!(error, ClientError::Server { retryable: true, .. });
        if retryable { self.pause() } else { None }
    }

    /// The next pause, or `None` once the failures have lasted [`RETRY_FOR`].
    fn pause(&mut self) -> Option<Duration> {
        let first_at = *self.first_at.get_or_insert_with(std::time::Instant::now);
        if first_at.elapsed() >= RETRY_FOR {
            return None;
        }
        self.pause = (self.pause * 2).clamp(RETRY_PAUSE_FIRST, RETRY_PAUSE_LAST);
        Some(self.pause)
    }
}

/// What reads: a cursor over every range, or, with --group, a member of the group, which reads
/// only the ranges the group hands it.
enum Reader<'a> {
    Cursor(Consumer<'a>),
    Member(GroupMember<'a>),
}

impl<'a> Reader<'a> {
    async fn open(
        client: &'a Client,
        args: &ConsumeArgs,
        run: &Run,
    ) -> Result<Reader<'a>, ClientError> {
        let wait_ms = if args.follow { args.wait_ms } else { 0 };
        let Some(group) = &args.group else {
            let options = ConsumerOptions {
                max: args.page_records,
                wait_ms,
                from_start: run.from_start,
                ..ConsumerOptions::default()
            };
            return Ok(Reader::Cursor(Consumer::new(client, &args.topic, options)));
        };
        let options = MemberOptions {
            max: args.page_records,
            wait: Duration::from_millis(wait_ms.into()),
            from_start: run.from_start,
        };
        let member = GroupMember::join(client, &args.topic, group, &run.member, options).await?;
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

    fn is_member(&self) -> bool {
        matches!(self, Reader::Member(_))
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
        let unavailable = ClientError::server(b"metadata_unavailable");
        let mut retries = Retries::default();
        let pauses: Vec<u128> = (0..7)
            .map(|_| retries.pause_after(&unavailable).expect("retryable").as_millis())
            .collect();
        assert_eq!(pauses, [100, 200, 400, 800, 1600, 2000, 2000]);
        let refused = retries.pause_after(&ClientError::server(b"permission_denied"));
        assert!(refused.is_none(), "a final refusal ends the run");
        let closed = Retries::default().pause_after(&ClientError::Closed);
        assert!(closed.is_none(), "a lost connection is not a refusal to wait out");
        let mut lasting =
            Retries { first_at: Some(std::time::Instant::now() - RETRY_FOR), ..Default::default() };
        assert!(lasting.pause_after(&unavailable).is_none(), "waited out for RETRY_FOR at most");
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
