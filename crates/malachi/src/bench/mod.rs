//! `malachi bench`: benchmarks that print their figures next to a baseline from the same run.

mod group;
mod histogram;
mod hostile;
mod storage;
mod wire;

use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// The segment store against raw `pwrite` + `fdatasync` on the same disk.
    Storage(storage::StorageArgs),
    /// Load on a running broker over the wire protocol: records/s, MB/s, ack latency.
    Wire(wire::WireArgs),
    /// The `wire` produce load alone, then while strangers who never log in attack the port
    /// (idle connections, oversized first frames, password guessing from many addresses).
    Hostile(hostile::HostileArgs),
    /// A consumer group of several members draining a topic against a group of one, with
    /// consumption the bottleneck (a pause per record).
    Group(group::GroupArgs),
}

pub fn run(command: BenchCommand) -> Result<(), String> {
    match command {
        BenchCommand::Storage(args) => storage::run(&args),
        BenchCommand::Wire(args) => wire::run(&args),
        BenchCommand::Hostile(args) => hostile::run(&args),
        BenchCommand::Group(args) => group::run(&args),
    }
}

/// The runtime a benchmark's load runs on.
fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|error| format!("cannot start the async runtime: {error}"))
}
