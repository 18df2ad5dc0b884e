//! `malachi produce TOPIC [VALUE...]`: one record per value given, else one per line of stdin.
//!
//! Stdin is read on its own thread (reads block) and turned into records there; the async side
//! gathers them into produce requests of at most `--batch-records` records and about
//! `--batch-bytes` bytes, and keeps up to [`REQUESTS_IN_FLIGHT_MAX`] requests pipelined on the
//! connection. The broker handles a connection's requests in arrival order, so records of one
//! key keep their order. A spinner on stderr counts acknowledged records once stdin has passed
//! [`PROGRESS_AFTER_LINES`] lines, when stderr is a terminal.

use std::io::{BufRead, IsTerminal};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use malachi_client::{Client, ClientError, ProduceBatch, Record, RecordBuilder};
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::task::JoinSet;

use super::Session;
use super::settings::ConnectionArgs;

/// Produce requests outstanding on the connection at once.
const REQUESTS_IN_FLIGHT_MAX: usize = 4;
/// Stdin lines after which the progress spinner appears.
const PROGRESS_AFTER_LINES: u64 = 5000;
/// Records read ahead of the batches being sent.
const RECORDS_QUEUED_MAX: usize = 8192;

#[derive(clap::Args, Debug)]
pub struct ProduceArgs {
    #[command(flatten)]
    connection: ConnectionArgs,
    topic: String,
    /// Values of the records; without any, each line of standard input is one record.
    values: Vec<String>,
    /// Key of every record.
    #[arg(long, value_name = "KEY", conflicts_with = "keys_from_line")]
    key: Option<String>,
    /// A header on every record, NAME=VALUE (repeatable).
    #[arg(long = "header", value_name = "NAME=VALUE", value_parser = parse_header)]
    headers: Vec<(String, String)>,
    /// Split each value at the first SEP into key and value (a value without SEP has no key).
    #[arg(long, value_name = "SEP")]
    keys_from_line: Option<String>,
    /// Records per produce request, at most.
    #[arg(long, default_value_t = ProduceBatch::RECORDS_MAX_DEFAULT, value_name = "N")]
    batch_records: usize,
    /// Bytes per produce request, about (a larger record goes alone).
    #[arg(long, default_value_t = ProduceBatch::WIRE_BYTES_MAX_DEFAULT, value_name = "BYTES")]
    batch_bytes: usize,
}

/// How each input line becomes a record.
#[derive(Clone, Debug)]
struct Shape {
    key: Option<Bytes>,
    headers: Vec<(String, String)>,
    separator: Option<Vec<u8>>,
}

pub async fn run(args: ProduceArgs) -> Result<(), String> {
    let session = Session::connect(&args.connection).await?;
    let shape = Shape {
        key: args.key.as_deref().map(|key| Bytes::copy_from_slice(key.as_bytes())),
        headers: args.headers.clone(),
        separator: args.keys_from_line.as_ref().map(|sep| sep.as_bytes().to_vec()),
    };
    if shape.separator.as_ref().is_some_and(Vec::is_empty) {
        return Err("--keys-from-line needs a non-empty separator".into());
    }
    let (records, queue) = mpsc::channel(RECORDS_QUEUED_MAX);
    let from_stdin = args.values.is_empty();
    let values = args.values.clone();
    let reader = std::thread::spawn(move || match from_stdin {
        true => read_stdin(&shape, &records),
        false => {
            for value in values {
                if records.blocking_send(shape.record(value.as_bytes())).is_err() {
                    break;
                }
            }
            Ok(())
        }
    });
    let batch = ProduceBatch::with_limits(args.batch_records, args.batch_bytes);
    let progress = from_stdin && std::io::stderr().is_terminal();
    let sent = send_all(&session, &args.topic, queue, batch, progress).await;
    let read = reader.join().map_err(|_| "the stdin reader panicked".to_string())?;
    let count = sent?;
    read.map_err(|error| format!("reading standard input: {error}"))?;
    eprintln!("produced {count} records to {}", args.topic);
    Ok(())
}

/// Batches the queued records and sends them, a few requests in flight; returns the count
/// acknowledged. A batch goes when the next record does not fit, or as soon as no record is
/// waiting (so a slow input, `tail -f`, is sent line by line rather than held back).
async fn send_all(
    session: &Session,
    topic: &str,
    mut queue: mpsc::Receiver<Record>,
    batch: ProduceBatch,
    progress: bool,
) -> Result<u64, String> {
    let mut sender = Sender {
        client: Arc::clone(&session.client),
        topic: topic.to_string(),
        batch,
        in_flight: JoinSet::new(),
        acknowledged: 0,
        progress: Progress { bar: None, enabled: progress, records_read: 0 },
    };
    let fail = |error: ClientError| session.fail_on(&format!("produce to {topic}"), topic, &error);
    loop {
        let next = match queue.try_recv() {
            Ok(record) => Some(record),
            Err(TryRecvError::Empty) => {
                sender.flush().await.map_err(fail)?;
                queue.recv().await
            }
            Err(TryRecvError::Disconnected) => None,
        };
        let Some(record) = next else { break };
        if !sender.batch.fits(&record) {
            sender.flush().await.map_err(fail)?;
        }
        sender.progress.read_one();
        sender.batch.push(record);
    }
    sender.flush().await.map_err(fail)?;
    sender.finish().await.map_err(fail)
}

/// The batch being filled and the requests in flight.
struct Sender {
    client: Arc<Client>,
    topic: String,
    batch: ProduceBatch,
    in_flight: JoinSet<Result<u32, ClientError>>,
    acknowledged: u64,
    progress: Progress,
}

impl Sender {
    /// Sends the batch, if any, first waiting for a request to finish when enough are in
    /// flight.
    async fn flush(&mut self) -> Result<(), ClientError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        if self.in_flight.len() >= REQUESTS_IN_FLIGHT_MAX {
            self.join_one().await?;
        }
        let (client, topic, records) =
            (Arc::clone(&self.client), self.topic.clone(), self.batch.take());
        self.in_flight.spawn(async move { client.produce(&topic, records).await });
        Ok(())
    }

    /// Waits for every request still in flight; returns the total acknowledged.
    async fn finish(mut self) -> Result<u64, ClientError> {
        while !self.in_flight.is_empty() {
            self.join_one().await?;
        }
        self.progress.finish();
        Ok(self.acknowledged)
    }

    async fn join_one(&mut self) -> Result<(), ClientError> {
        let count = match self.in_flight.join_next().await {
            Some(Ok(answer)) => answer?,
            Some(Err(_)) => return Err(ClientError::Closed),
            None => 0,
        };
        self.acknowledged += u64::from(count);
        self.progress.show(self.acknowledged);
        Ok(())
    }
}

/// The spinner, created only once enough lines went by.
struct Progress {
    bar: Option<ProgressBar>,
    enabled: bool,
    records_read: u64,
}

impl Progress {
    fn read_one(&mut self) {
        self.records_read += 1;
        if self.enabled && self.bar.is_none() && self.records_read > PROGRESS_AFTER_LINES {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            let template = "{spinner} {human_pos} records acknowledged in {elapsed}";
            let style = ProgressStyle::with_template(template)
                .unwrap_or_else(|_| ProgressStyle::default_spinner());
            bar.set_style(style);
            bar.enable_steady_tick(Duration::from_millis(120));
            self.bar = Some(bar);
        }
    }

    fn show(&self, acknowledged: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(acknowledged);
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl Shape {
    fn record(&self, line: &[u8]) -> Record {
        let (key, value) = match &self.separator {
            Some(separator) => match split_once(line, separator) {
                Some((key, value)) => (Some(Bytes::copy_from_slice(key)), value),
                None => (None, line),
            },
            None => (self.key.clone(), line),
        };
        let mut builder = RecordBuilder::new(Bytes::copy_from_slice(value));
        if let Some(key) = key {
            builder = builder.key(key);
        }
        for (name, value) in &self.headers {
            builder = builder.header(name, value);
        }
        builder.build()
    }
}

/// Reads stdin line by line (bytes, not necessarily UTF-8) until EOF or until the sender's
/// receiver is gone (the produce failed).
fn read_stdin(shape: &Shape, records: &mpsc::Sender<Record>) -> std::io::Result<()> {
    let mut stdin = std::io::stdin().lock();
    let mut line = Vec::new();
    loop {
        line.clear();
        if stdin.read_until(b'\n', &mut line)? == 0 {
            return Ok(());
        }
        if records.blocking_send(shape.record(trim_line_end(&line))).is_err() {
            return Ok(());
        }
    }
}

/// A line without its `\n` or `\r\n`.
fn trim_line_end(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

fn split_once<'a>(line: &'a [u8], separator: &[u8]) -> Option<(&'a [u8], &'a [u8])> {
    let at = line.windows(separator.len()).position(|window| window == separator)?;
    Some((&line[..at], &line[at + separator.len()..]))
}

/// `NAME=VALUE`; the value may be empty or hold `=`, the name may not be empty.
fn parse_header(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_string(), value.to_string())),
        _ => Err(format!("expected NAME=VALUE, got {text:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header flag and the (name, value) it parses to, if any.
    type HeaderCase = (&'static str, Option<(&'static str, &'static str)>);

    /// A shape, an input line, and the record's key and value.
    type LineCase = (Shape, &'static [u8], Option<&'static [u8]>, &'static [u8]);

    #[test]
    fn headers_parse_as_name_equals_value() {
        let cases: &[HeaderCase] = &[
            ("x-seq=1", Some(("x-seq", "1"))),
            ("trace=", Some(("trace", ""))),
            ("q=a=b", Some(("q", "a=b"))),
            ("=v", None),
            ("novalue", None),
        ];
        for (text, expected) in cases {
            let parsed = parse_header(text).ok();
            let expected = expected.map(|(name, value)| (name.to_string(), value.to_string()));
            assert_eq!(parsed, expected, "{text}");
        }
    }

    #[test]
    fn lines_become_records() {
        let shape = |key: Option<&str>, separator: Option<&str>| Shape {
            key: key.map(|key| Bytes::copy_from_slice(key.as_bytes())),
            headers: vec![("src".to_string(), "cli".to_string())],
            separator: separator.map(|sep| sep.as_bytes().to_vec()),
        };
        let cases: &[LineCase] = &[
            (shape(None, None), b"hello", None, b"hello"),
            (shape(Some("k"), None), b"hello", Some(b"k"), b"hello"),
            (shape(None, Some(":")), b"k1:v:1", Some(b"k1"), b"v:1"),
            (shape(None, Some("::")), b"k1::v", Some(b"k1"), b"v"),
            (shape(None, Some(":")), b"no separator", None, b"no separator"),
            (shape(None, Some(":")), b":v", Some(b""), b"v"),
        ];
        for (shape, line, key, value) in cases {
            let record = shape.record(line);
            assert_eq!(record.key.as_deref(), *key, "{line:?}");
            assert_eq!(&record.value[..], *value, "{line:?}");
            assert_eq!(record.headers.len(), 1);
        }
    }

    #[test]
    fn line_ends_are_trimmed() {
        let cases: &[(&[u8], &[u8])] =
            &[(b"a\n", b"a"), (b"a\r\n", b"a"), (b"a", b"a"), (b"\n", b""), (b"a\r", b"a")];
        for (line, expected) in cases {
            assert_eq!(trim_line_end(line), *expected);
        }
    }
}
