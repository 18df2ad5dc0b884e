//! `malachi bench hostile`: what strangers can do to a running broker. The same produce load as
//! `bench wire` runs twice, alone (the baseline) and while strangers who never log in attack
//! the client port from many loopback addresses (127.x.y.z: Linux routes all of 127/8 to lo):
//!
//! * idle connections that never send a byte, each held until the broker closes it;
//! * first frames announcing 16 MiB and sending 1 MiB of them;
//! * wrong-password logins as `admin`, spread over `--addresses` source addresses.
//!
//! It prints the producer's MB/s and ack p99 in both runs, their ratio, the answers the
//! strangers got by reason, and, with `--pid`, the broker's resident memory before, at its peak
//! during, and after the attack.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use malachi_wire::messages::AuthRequest;
use malachi_wire::{
    ApiKey, Expect, Request, RequestFrame, ResponseBody, ResponseEnvelope, split_frame,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinSet;

use super::wire::{self, WireArgs};

#[derive(clap::Args, Debug)]
pub struct HostileArgs {
    /// The producer's load (as `bench wire`; `--seconds` is per run).
    #[command(flatten)]
    load: WireArgs,
    /// The broker's process id: its resident memory is sampled from /proc.
    #[arg(long, value_name = "PID")]
    pid: Option<u32>,
    /// Tasks holding connections that never log in.
    #[arg(long, default_value_t = 1000, value_name = "N")]
    idle: u32,
    /// Tasks sending oversized first frames, one connection after another.
    #[arg(long, default_value_t = 16, value_name = "N")]
    oversized: u32,
    /// Tasks guessing passwords, one connection after another.
    #[arg(long, default_value_t = 32, value_name = "N")]
    guessers: u32,
    /// Distinct source addresses the strangers use (127.1.0.0 upwards).
    #[arg(long, default_value_t = 4096, value_name = "N")]
    addresses: u32,
    /// Each stranger's pause before its next connection after the broker answered it.
    #[arg(long, default_value_t = 5, value_name = "MS")]
    pause_ms: u64,
}

/// Bytes a too-large first frame announces, and how much of it a stranger sends.
const OVERSIZED_ANNOUNCED_BYTES: u32 = 16 * 1024 * 1024;
const OVERSIZED_SENT_BYTES: usize = 1024 * 1024;
/// Logins timed during the attack.
const LOGINS_MEASURED: usize = 10;
/// How often the broker's memory is sampled.
const RSS_SAMPLE_INTERVAL: Duration = Duration::from_millis(200);

/// Answers the strangers got, by kind and reason.
type Outcomes = Arc<Mutex<BTreeMap<String, u64>>>;

pub fn run(args: &HostileArgs) -> Result<(), String> {
    let runtime = super::runtime()?;
    runtime.block_on(hostile(args))
}

async fn hostile(args: &HostileArgs) -> Result<(), String> {
    let target = resolve(args)?;
    let topic = [args.load.topic.clone()];
    let rss_before = args.pid.and_then(resident_mib);
    let baseline =
        wire::measure_with(&args.load, &topic, None, wire::connect_all(&args.load).await?).await?;
    // The producers of the second run log in before the attack: logins under attack are
    // measured on their own below.
    let producers = wire::connect_all(&args.load).await?;
    let outcomes: Outcomes = Arc::default();
    // The baseline's own writing grows the broker (journal buffer, indexes); the attack is
    // measured from here.
    let rss_attack_start = args.pid.and_then(resident_mib);
    let peak = Arc::new(Mutex::new(rss_attack_start.unwrap_or(0.0)));
    let mut attack = JoinSet::new();
    spawn_attack(args, target, &outcomes, &mut attack);
    if let Some(pid) = args.pid {
        let peak = Arc::clone(&peak);
        attack.spawn(async move {
            loop {
                if let Some(mib) = resident_mib(pid) {
                    let mut peak = peak.lock().expect("peak lock");
                    *peak = peak.max(mib);
                }
                tokio::time::sleep(RSS_SAMPLE_INTERVAL).await;
            }
        });
    }
    // Let the strangers reach their steady state before measuring.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let settings = crate::cli::settings::Settings::load(args.load.connection())?;
    let attacked = wire::measure_with(&args.load, &topic, None, producers).await;
    // After the load: idle producers would be closed by the broker's idle timeout meanwhile.
    let logins = login_times(&settings).await;
    attack.abort_all();
    while attack.join_next().await.is_some() {}
    let attacked = attacked?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_after = args.pid.and_then(resident_mib);
    let ratio = attacked.produced_mb_per_s / baseline.produced_mb_per_s.max(f64::MIN_POSITIVE);
    println!("hostile load against {target}: {} producer connection(s)", args.load.connections);
    println!(
        "  baseline      {:8.1} MB/s  ack p99 {:7.2} ms",
        baseline.produced_mb_per_s,
        baseline.ack_p99_us as f64 / 1000.0
    );
    println!(
        "  under attack  {:8.1} MB/s  ack p99 {:7.2} ms  ({ratio:.2} of baseline)",
        attacked.produced_mb_per_s,
        attacked.ack_p99_us as f64 / 1000.0
    );
    println!("  a legitimate login under attack: {logins}");
    if let (Some(before), Some(start), Some(after)) = (rss_before, rss_attack_start, rss_after) {
        let peak = *peak.lock().expect("peak lock");
        println!(
            "  broker RSS    before the baseline {before:.0} MiB, as the attack starts {start:.0} \
             MiB, peak {peak:.0} MiB, after {after:.0} MiB"
        );
    }
    let outcomes = outcomes.lock().expect("outcomes lock");
    println!(
        "  strangers: {} idle, {} oversized, {} guessers over {} addresses, {} ms between tries",
        args.idle, args.oversized, args.guessers, args.addresses, args.pause_ms
    );
    for (outcome, count) in outcomes.iter() {
        println!("    {outcome:<40} {count:>9}");
    }
    Ok(())
}

/// Logins of the configured user during the attack: how many of [`LOGINS_MEASURED`] got in
/// (each retrying `overloaded` for a while, as `bench wire` does) and how long they took.
async fn login_times(settings: &crate::cli::settings::Settings) -> String {
    let mut took_ms = Vec::new();
    let mut refused = 0;
    for _ in 0..LOGINS_MEASURED {
        let started = std::time::Instant::now();
        match wire::login(settings).await {
            Ok(_) => took_ms.push(started.elapsed().as_secs_f64() * 1000.0),
            Err(_) => refused += 1,
        }
    }
    took_ms.sort_by(f64::total_cmp);
    let at = |q: f64| took_ms.get(((took_ms.len() as f64 - 1.0) * q) as usize).copied();
    match (at(0.5), at(1.0)) {
        (Some(p50), Some(max)) => format!(
            "{} of {LOGINS_MEASURED} in, p50 {p50:.0} ms, max {max:.0} ms, {refused} gave up",
            took_ms.len()
        ),
        _ => format!("0 of {LOGINS_MEASURED} in"),
    }
}

fn resolve(args: &HostileArgs) -> Result<SocketAddr, String> {
    let settings = crate::cli::settings::Settings::load(args.load.connection())?;
    let target: SocketAddr = settings
        .server
        .parse()
        .map_err(|_| format!("{}: bench hostile needs an IPv4 address:port", settings.server))?;
    if !target.ip().is_loopback() {
        return Err("bench hostile only attacks a broker on this machine's loopback".into());
    }
    Ok(target)
}

fn spawn_attack(
    args: &HostileArgs,
    target: SocketAddr,
    outcomes: &Outcomes,
    tasks: &mut JoinSet<()>,
) {
    let addresses = args.addresses.max(1);
    let kinds =
        [(Kind::Idle, args.idle), (Kind::Oversized, args.oversized), (Kind::Guess, args.guessers)];
    let mut next_address = 0u32;
    for (kind, count) in kinds {
        for _ in 0..count {
            let first = next_address;
            next_address += 1;
            let outcomes = Arc::clone(outcomes);
            let pause = Duration::from_millis(args.pause_ms);
            tasks.spawn(async move {
                let mut round = 0u32;
                loop {
                    let source = source_address(first.wrapping_add(round) % addresses);
                    round = round.wrapping_add(count.max(1));
                    let outcome = match connect_from(source, target).await {
                        Ok(stream) => stranger(kind, stream).await,
                        Err(error) => format!("connect failed: {:?}", error.kind()),
                    };
                    let paused = !outcome.ends_with("closed by the broker");
                    *outcomes
                        .lock()
                        .expect("outcomes lock")
                        .entry(format!("{} {outcome}", kind.name()))
                        .or_default() += 1;
                    if paused {
                        tokio::time::sleep(pause).await;
                    }
                }
            });
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Idle,
    Oversized,
    Guess,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Idle => "idle:",
            Kind::Oversized => "oversized:",
            Kind::Guess => "login:",
        }
    }
}

/// 127.1.0.0 + index.
fn source_address(index: u32) -> SocketAddr {
    let base = u32::from(Ipv4Addr::new(127, 1, 0, 0));
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(base + index), 0))
}

async fn connect_from(source: SocketAddr, target: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(source)?;
    socket.connect(target).await
}

/// One stranger's connection; what the broker answered.
async fn stranger(kind: Kind, mut stream: TcpStream) -> String {
    match kind {
        Kind::Idle => {}
        Kind::Oversized => {
            let mut bytes = OVERSIZED_ANNOUNCED_BYTES.to_be_bytes().to_vec();
            bytes.resize(4 + OVERSIZED_SENT_BYTES, 0);
            // The broker may answer and close before all of it is sent.
            let _ = stream.write_all(&bytes).await;
        }
        Kind::Guess => {
            let login = Request::Auth(AuthRequest {
                username: Some("admin".into()),
                password: Some("not-the-password".into()),
            });
            let mut bytes = BytesMut::new();
            RequestFrame::new(1, login).encode_frame(16 * 1024, &mut bytes).expect("encodes");
            if stream.write_all(&bytes).await.is_err() {
                return "write failed".into();
            }
        }
    }
    answer(&mut stream).await
}

/// The reason of the broker's first answer, or how the connection ended without one.
async fn answer(stream: &mut TcpStream) -> String {
    let mut buffer = BytesMut::new();
    loop {
        if let Ok(Some(body)) = split_frame(&mut buffer, 1024 * 1024) {
            let expect = Expect::Reply(ApiKey::Auth);
            let frame = ResponseEnvelope::parse(body).ok().and_then(|e| e.decode(expect).ok());
            return match frame.map(|frame| frame.body) {
                Some(ResponseBody::Error { reason }) => {
                    String::from_utf8_lossy(&reason).into_owned()
                }
                Some(_) => "answered ok".into(),
                None => "undecodable answer".into(),
            };
        }
        match stream.read_buf(&mut buffer).await {
            Ok(0) => return "no answer, closed by the broker".into(),
            Ok(_) => {}
            Err(error) => return format!("{:?}, closed by the broker", error.kind()),
        }
    }
}

/// Resident memory of `pid` in MiB, from /proc.
fn resident_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}
