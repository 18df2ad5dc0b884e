//! Malachi's deterministic simulator: a whole node (the real log API, Raft groups, storage
//! engine and client-protocol server), its disk, the network and a seeded workload of clients,
//! all in one thread, all driven from one seed. The same seed replays the same run, bit for
//! bit; its trace hash proves it.
//!
//! What comes from outside, and from where in a run:
//!
//! * time: every runtime (the node's, the clients') is a paused tokio runtime that the world
//!   advances one millisecond per tick; the broker's wall clock is a [`node::SimClock`] the
//!   world sets (and jumps);
//! * randomness: every stream is derived from the seed: the swarm of faults, each actor, the
//!   disk, the network, the node's entropy, openraft's election timeouts
//!   ([`malachi_consensus::seed_raft_rng`]);
//! * the disk: [`malachi_log::SimStorage`] under the segments and the Raft store (committed
//!   inline, no writer thread);
//! * the network: [`net::SimNet`] pipes between the clients and the node's server, and between
//!   the brokers of a simulated cluster ([`cluster`]: 3 to 5 brokers on the real inter-node
//!   transport, crashed, restarted and partitioned).
//!
//! See `docs/testing.md` for what a run covers and how to replay one.

pub mod cluster;
pub mod net;
pub mod node;
mod panics;
pub mod workload;
pub mod world;

pub use cluster::{CLUSTER_FAULT_MS, ClusterCanary, ClusterOptions, run_cluster};
pub use world::{Canary, DEFAULT_FAULT_MS, RunOptions, RunOutcome, RunStats, run};

/// The command that replays a run, given the flags that differ from a default run.
fn replay_command(flags: &[String]) -> String {
    let mut command = String::from("cargo run --release -p malachi-sim --");
    for flag in flags {
        command.push(' ');
        command.push_str(flag);
    }
    command
}
