//! `malachi bench storage`: the segment store against the raw disk, measured in the same run.
//!
//! For each record size it measures, on real files under `--dir`:
//! * throughput with concurrent appenders and group commit, against a raw writer that does one
//!   `pwrite` + `fdatasync` per buffer of the same bytes the appenders keep in flight together
//!   (the best any writer can do with that much data outstanding);
//! * append-to-durable latency at light load (one appender, one record at a time), against one
//!   `pwrite` + `fdatasync` of one record-sized buffer;
//! * sequential read throughput of the data just written, against `pread` of the same file.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use malachi_log::journal::Journal;
use malachi_log::{Committer, RealStorage, Record, Segment, SegmentConfig, Storage, segment_paths};
use serde::Serialize;

use super::histogram::Latencies;

#[derive(clap::Args, Debug)]
pub struct StorageArgs {
    /// Directory for the benchmark's files, on the disk to measure; removed afterwards.
    #[arg(long, default_value = "malachi-bench-data")]
    dir: PathBuf,
    /// Record sizes in bytes (key and value together).
    #[arg(long, value_delimiter = ',', default_values_t = [100, 1024, 16384])]
    sizes: Vec<u32>,
    /// Concurrent appender threads.
    #[arg(long, default_value_t = 16)]
    appenders: u32,
    /// Segments the appenders spread over (appender i writes to segment i mod N), all sharing
    /// one group commit, as a broker's segments do.
    #[arg(long, default_value_t = 1)]
    segments: u32,
    /// How a group-commit round becomes durable: journal (the broker's default), files or
    /// filesystem.
    #[arg(long, default_value = "journal")]
    barrier: String,
    /// Bytes all appenders keep in flight together; each append carries its share.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    inflight_bytes: u64,
    /// Seconds per throughput measurement.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Throughput runs per size, alternating store and raw; the medians are reported, which
    /// keeps a burst of noise from another process out of the ratio.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Appends per light-load latency measurement.
    #[arg(long, default_value_t = 2000)]
    light_iterations: u32,
    /// Print one JSON object per record size instead of a table.
    #[arg(long)]
    json: bool,
}

/// One line of results.
#[derive(Debug, Serialize)]
struct Figures {
    record_bytes: u32,
    appenders: u32,
    segments: u32,
    records_per_append: u32,
    mb_per_s: f64,
    records_per_s: f64,
    raw_mb_per_s: f64,
    ratio: f64,
    p50_us: u64,
    p99_us: u64,
    p999_us: u64,
    light_p50_us: u64,
    light_p99_us: u64,
    light_p999_us: u64,
    raw_light_p50_us: u64,
    raw_light_p99_us: u64,
    raw_light_p999_us: u64,
    light_p99_ratio: f64,
    read_mb_per_s: f64,
    raw_read_mb_per_s: f64,
    read_ratio: f64,
}

/// Stop a throughput run after this many bytes even if time remains, to bound disk use.
const RUN_BYTES_MAX: u64 = 2 * 1024 * 1024 * 1024;
const KEY_BYTES: usize = 8;

pub fn run(args: &StorageArgs) -> Result<(), String> {
    if args.sizes.iter().any(|&size| (size as usize) < KEY_BYTES) || args.appenders == 0 {
        return Err(format!("sizes must be at least {KEY_BYTES} bytes and appenders at least 1"));
    }
    fs::create_dir_all(&args.dir).map_err(|error| format!("{}: {error}", args.dir.display()))?;
    if !args.json {
        print_header(args);
    }
    for &size in &args.sizes {
        let figures =
            measure_size(args, size).map_err(|error| format!("record size {size}: {error}"))?;
        if args.json {
            println!("{}", serde_json::to_string(&figures).expect("figures serialize"));
        } else {
            print_row(&figures);
        }
    }
    fs::remove_dir_all(&args.dir).map_err(|error| format!("cleaning up: {error}"))?;
    Ok(())
}

fn measure_size(args: &StorageArgs, size: u32) -> std::io::Result<Figures> {
    let dir = args.dir.join(format!("records-{size}"));
    let _ = fs::remove_dir_all(&dir);
    let storage: Arc<dyn Storage> = Arc::new(RealStorage);
    let records_per_append =
        (args.inflight_bytes / (u64::from(args.appenders) * u64::from(size))).max(1) as u32;
    let duration = Duration::from_secs_f64(args.seconds);

    let inflight = u64::from(args.appenders) * u64::from(records_per_append) * u64::from(size);
    let mut rounds = Vec::new();
    let mut raw_rounds = Vec::new();
    let mut reads = (0.0, 0.0);
    for round in 0..args.rounds.max(1) {
        let round_dir = dir.join(format!("concurrent-{round}"));
        let segments = node_segments(&storage, &round_dir, args.segments, &args.barrier)?;
        rounds.push(concurrent_appends(
            &segments,
            args.appenders,
            records_per_append,
            size,
            duration,
        ));
        if round == 0 {
            reads = read_back(&segments[0], &round_dir, size)?;
        }
        drop(segments);
        fs::remove_dir_all(&round_dir)?;
        raw_rounds.push(raw_writes(&dir.join("raw.dat"), inflight, duration)?);
    }
    let (read_mb_per_s, raw_read_mb_per_s) = reads;
    rounds.sort_by(|left, right| left.mb_per_s.total_cmp(&right.mb_per_s));
    raw_rounds.sort_by(f64::total_cmp);
    let mut concurrent = rounds.swap_remove(rounds.len() / 2);
    let raw_mb_per_s = raw_rounds[raw_rounds.len() / 2];

    let light_segment = create_segment(&storage, &dir.join("light"))?;
    let (mut light, mut raw_light) =
        light_appends(&light_segment, &dir.join("raw-light.dat"), size, args.light_iterations)?;
    fs::remove_dir_all(&dir)?;

    let light_p99_us = light.percentile_us(0.99);
    let raw_light_p99_us = raw_light.percentile_us(0.99);
    Ok(Figures {
        record_bytes: size,
        appenders: args.appenders,
        segments: args.segments,
        records_per_append,
        mb_per_s: concurrent.mb_per_s,
        records_per_s: concurrent.records_per_s,
        raw_mb_per_s,
        ratio: concurrent.mb_per_s / raw_mb_per_s,
        p50_us: concurrent.latencies.percentile_us(0.5),
        p99_us: concurrent.latencies.percentile_us(0.99),
        p999_us: concurrent.latencies.percentile_us(0.999),
        light_p50_us: light.percentile_us(0.5),
        light_p99_us,
        light_p999_us: light.percentile_us(0.999),
        raw_light_p50_us: raw_light.percentile_us(0.5),
        raw_light_p99_us,
        raw_light_p999_us: raw_light.percentile_us(0.999),
        light_p99_ratio: light_p99_us as f64 / raw_light_p99_us.max(1) as f64,
        read_mb_per_s,
        raw_read_mb_per_s,
        read_ratio: read_mb_per_s / raw_read_mb_per_s,
    })
}

/// Journal size of the benchmark's node: a checkpoint every 64 MiB of rounds.
const JOURNAL_BYTES: u64 = 64 * 1024 * 1024;

/// `count` segments in `dir` sharing one group commit made durable as `barrier` says.
fn node_segments(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    count: u32,
    barrier: &str,
) -> std::io::Result<Vec<Arc<Segment>>> {
    storage.create_dir_all(dir)?;
    let linger = Duration::ZERO;
    let committer = match barrier {
        "journal" => {
            let (journal, _) = Journal::open(storage, dir, JOURNAL_BYTES)?;
            Committer::with_journal(None, 16, linger, journal, (dir.to_path_buf(), 1024))
        }
        "files" => Committer::new(None, 16, linger),
        "filesystem" => Committer::new(Some(storage.filesystem_sync(dir)?), 16, linger),
        other => return Err(std::io::Error::other(format!("unknown barrier {other}"))),
    };
    (1..=u64::from(count.max(1)))
        .map(|id| {
            Segment::create(Arc::clone(storage), dir, id, SegmentConfig::default(), &committer)
                .map_err(std::io::Error::other)
        })
        .collect()
}

fn create_segment(storage: &Arc<dyn Storage>, dir: &Path) -> std::io::Result<Arc<Segment>> {
    storage.create_dir_all(dir)?;
    Segment::create(Arc::clone(storage), dir, 1, SegmentConfig::default(), &Committer::solo())
        .map_err(std::io::Error::other)
}

/// A record of exactly `size` user bytes: an 8-byte key and the rest as value.
fn sample_record(size: u32, seed: u64) -> Record {
    let key = format!("{:08}", seed % 100_000_000);
    let value: Vec<u8> =
        (0..size as usize - KEY_BYTES).map(|at| (at as u64 ^ seed) as u8).collect();
    Record::keyed(key, Bytes::from(value), 1_767_225_600_000)
}

struct Throughput {
    mb_per_s: f64,
    records_per_s: f64,
    latencies: Latencies,
}

fn concurrent_appends(
    segments: &[Arc<Segment>],
    appenders: u32,
    records_per_append: u32,
    size: u32,
    duration: Duration,
) -> Throughput {
    let stop = Arc::new(AtomicBool::new(false));
    let appends_max =
        RUN_BYTES_MAX / (u64::from(appenders) * u64::from(records_per_append) * u64::from(size));
    let started = Instant::now();
    let threads: Vec<_> = (0..appenders)
        .map(|appender| {
            let segment = Arc::clone(&segments[appender as usize % segments.len()]);
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let batch: Vec<Record> = (0..records_per_append)
                    .map(|at| sample_record(size, u64::from(appender) * 1_000_003 + u64::from(at)))
                    .collect();
                let mut latencies = Latencies::default();
                let mut appends = 0u64;
                while !stop.load(Ordering::Relaxed) && appends < appends_max.max(1) {
                    let begun = Instant::now();
                    segment.append(&batch).expect("benchmark append failed");
                    latencies.record_us(begun.elapsed().as_micros() as u64);
                    appends += 1;
                }
                latencies
            })
        })
        .collect();
    std::thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    let mut latencies = Latencies::default();
    for thread in threads {
        latencies.merge(thread.join().expect("appender thread panicked"));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let records = latencies.len() as f64 * f64::from(records_per_append);
    Throughput {
        mb_per_s: records * f64::from(size) / elapsed / 1e6,
        records_per_s: records / elapsed,
        latencies,
    }
}

/// Reads the whole segment back, then the same file with plain `pread`s; MB/s of user bytes
/// and of file bytes respectively.
fn read_back(segment: &Segment, dir: &Path, size: u32) -> std::io::Result<(f64, f64)> {
    let started = Instant::now();
    let mut offset = 0;
    let mut records = 0u64;
    loop {
        let batch = segment.read(offset, 10_000, 8 * 1024 * 1024).map_err(std::io::Error::other)?;
        if batch.records.is_empty() {
            break;
        }
        records += batch.records.len() as u64;
        offset = batch.next_offset;
    }
    let read_mb_per_s = (records * u64::from(size)) as f64 / started.elapsed().as_secs_f64() / 1e6;
    let (path, _) = segment_paths(dir, 1);
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    let mut buffer = vec![0u8; 8 * 1024 * 1024];
    let started = Instant::now();
    let mut position = 0;
    while position < len {
        let read = file.read_at(&mut buffer, position)?;
        position += read.max(1) as u64;
    }
    Ok((read_mb_per_s, len as f64 / started.elapsed().as_secs_f64() / 1e6))
}

/// One writer: `pwrite` of `buffer_bytes`, then `fdatasync`, repeated.
fn raw_writes(path: &Path, buffer_bytes: u64, duration: Duration) -> std::io::Result<f64> {
    let file = OpenOptions::new().create_new(true).write(true).open(path)?;
    let buffer: Vec<u8> = (0..buffer_bytes).map(|at| at as u8).collect();
    let started = Instant::now();
    let mut written = 0u64;
    while started.elapsed() < duration && written < RUN_BYTES_MAX {
        file.write_all_at(&buffer, written)?;
        file.sync_data()?;
        written += buffer_bytes;
    }
    let mb_per_s = written as f64 / started.elapsed().as_secs_f64() / 1e6;
    fs::remove_file(path)?;
    Ok(mb_per_s)
}

/// Light load: one record at a time, alternating a store append and a raw `pwrite` +
/// `fdatasync` of the same size, so both see the same background disk activity.
fn light_appends(
    segment: &Segment,
    raw_path: &Path,
    size: u32,
    iterations: u32,
) -> std::io::Result<(Latencies, Latencies)> {
    let record = [sample_record(size, 1)];
    let raw_file = OpenOptions::new().create_new(true).write(true).open(raw_path)?;
    let raw_buffer = vec![7u8; size as usize];
    let mut ours = Latencies::default();
    let mut raw = Latencies::default();
    for iteration in 0..u64::from(iterations) {
        let begun = Instant::now();
        segment.append(&record).map_err(std::io::Error::other)?;
        ours.record_us(begun.elapsed().as_micros() as u64);
        let begun = Instant::now();
        raw_file.write_all_at(&raw_buffer, iteration * u64::from(size))?;
        raw_file.sync_data()?;
        raw.record_us(begun.elapsed().as_micros() as u64);
    }
    fs::remove_file(raw_path)?;
    Ok((ours, raw))
}

fn print_header(args: &StorageArgs) {
    println!(
        "segment store vs raw pwrite+fdatasync in {} ({} appenders over {} segment(s), {} \
         barrier, {} KiB in flight, {} s per run)",
        args.dir.display(),
        args.appenders,
        args.segments,
        args.barrier,
        args.inflight_bytes / 1024,
        args.seconds
    );
    println!(
        "{:>7} {:>9} {:>10} {:>9} {:>6} | {:>21} | {:>8} {:>8} {:>6} | {:>8} {:>8} {:>6}",
        "record",
        "MB/s",
        "records/s",
        "raw MB/s",
        "ratio",
        "ack p50/p99/p999 us",
        "light99",
        "raw99",
        "ratio",
        "read",
        "raw read",
        "ratio"
    );
}

fn print_row(f: &Figures) {
    println!(
        "{:>7} {:>9.1} {:>10.0} {:>9.1} {:>6.2} | {:>21} | {:>8} {:>8} {:>6.2} | {:>8.0} {:>8.0} {:>6.2}",
        f.record_bytes,
        f.mb_per_s,
        f.records_per_s,
        f.raw_mb_per_s,
        f.ratio,
        format!("{}/{}/{}", f.p50_us, f.p99_us, f.p999_us),
        f.light_p99_us,
        f.raw_light_p99_us,
        f.light_p99_ratio,
        f.read_mb_per_s,
        f.raw_read_mb_per_s,
        f.read_ratio
    );
}
