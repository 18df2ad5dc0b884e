//! `malachi-sim`: replays one seed, or soaks many.
//!
//! ```text
//! cargo run --release -p malachi-sim -- --seed 42            # one run, its trace hash
//! cargo run --release -p malachi-sim -- --seeds 10000        # seeds 0..10000
//! cargo run --release -p malachi-sim -- --minutes 30         # as many seeds as fit
//! cargo run --release -p malachi-sim -- --seed 7 --canary ack-before-fsync
//! cargo run --release -p malachi-sim -- --cluster --seeds 100  # 3- to 5-broker clusters
//! cargo run --release -p malachi-sim -- --cluster --seed 3 --canary coordinate-deposed
//! ```

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use malachi_sim::{
    CLUSTER_FAULT_MS, Canary, ClusterCanary, ClusterOptions, DEFAULT_FAULT_MS, RunOptions,
    RunOutcome, replay_command_of, run, run_cluster,
};

#[derive(Parser, Debug)]
#[command(about = "Malachi's deterministic simulator")]
struct Args {
    /// Run this one seed and print its trace hash.
    #[arg(long)]
    seed: Option<u64>,
    /// Run this many seeds, from --first on.
    #[arg(long)]
    seeds: Option<u64>,
    /// The first seed of a soak.
    #[arg(long, default_value_t = 0)]
    first: u64,
    /// Run seeds until this many minutes have passed.
    #[arg(long)]
    minutes: Option<u64>,
    /// Simulated milliseconds of each run's fault phase [default: 8000, with --cluster 10000]
    #[arg(long)]
    fault_ms: Option<u64>,
    /// Run clusters of 3 to 5 brokers (crashes, partitions between brokers) instead of one.
    #[arg(long)]
    cluster: bool,
    /// Switch on a deliberate bug: ack-before-fsync, skip-split-fence, trust-page-cache,
    /// skip-dir-sync or cut-damage; with --cluster, coordinate-deposed.
    #[arg(long)]
    canary: Option<String>,
    /// Print each run's swarm (its fault rates and workload).
    #[arg(long)]
    verbose: bool,
    /// With --cluster: storage faults on any broker, damaged sealed copies, and the checks
    /// that healing finishes and settled copies agree
    #[arg(long)]
    replica_faults: bool,
    /// With --seed: write the run's history (JSON events) and trace to this file.
    #[arg(long)]
    history: Option<std::path::PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    // The node's own log, for working on one seed: RUST_LOG=info (or finer) prints it.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let known: Vec<&str> = if args.cluster {
        ClusterCanary::ALL.iter().map(|(known, _)| *known).collect()
    } else {
        Canary::ALL.iter().map(|(known, _)| *known).collect()
    };
    if let Some(name) = args.canary.as_deref().filter(|name| !known.contains(name)) {
        eprintln!("unknown canary {name}: use one of {}", known.join(", "));
        return ExitCode::from(2);
    }
    let canary = args.canary.as_deref().and_then(Canary::parse);
    let cluster_canary = args.canary.as_deref().and_then(ClusterCanary::parse);
    let run_seed = |seed| {
        if args.cluster {
            let fault_ms = args.fault_ms.unwrap_or(CLUSTER_FAULT_MS);
            run_cluster(&ClusterOptions {
                seed,
                fault_ms,
                canary: cluster_canary,
                replica_faults: args.replica_faults,
            })
        } else {
            let fault_ms = args.fault_ms.unwrap_or(DEFAULT_FAULT_MS);
            run(&RunOptions { seed, fault_ms, canary })
        }
    };
    if let Some(seed) = args.seed {
        let outcome = run_seed(seed);
        report(&outcome, args.cluster, args.canary.as_deref(), args.verbose);
        if let Some(path) = &args.history {
            let saved = serde_json::json!({ "trace": outcome.trace, "events": outcome.history });
            if let Err(error) = std::fs::write(path, saved.to_string()) {
                eprintln!("{}: {error}", path.display());
                return ExitCode::FAILURE;
            }
        }
        return if outcome.passed() { ExitCode::SUCCESS } else { ExitCode::FAILURE };
    }
    // A soak measures itself with the real clock: that is the operator's time, not the run's.
    let started = Instant::now();
    let deadline = args.minutes.map(|minutes| std::time::Duration::from_secs(minutes * 60));
    let count = args.seeds.unwrap_or(if deadline.is_some() { u64::MAX } else { 100 });
    let (mut runs, mut failures) = (0u64, 0u64);
    for seed in args.first..args.first.saturating_add(count) {
        if deadline.is_some_and(|deadline| started.elapsed() >= deadline) {
            break;
        }
        let outcome = run_seed(seed);
        runs += 1;
        if !outcome.passed() {
            failures += 1;
            report(&outcome, args.cluster, args.canary.as_deref(), true);
        } else if args.verbose {
            report(&outcome, args.cluster, args.canary.as_deref(), true);
        }
    }
    let minutes = started.elapsed().as_secs_f64() / 60.0;
    println!(
        "{runs} seeds, {failures} failed, {:.1} minutes ({:.0} seeds per minute)",
        minutes,
        runs as f64 / minutes.max(1e-9)
    );
    if failures == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

fn report(outcome: &RunOutcome, cluster: bool, canary: Option<&str>, verbose: bool) {
    let stats = &outcome.stats;
    let verdict = if outcome.passed() { "ok" } else { "FAILED" };
    println!(
        "seed {}: {verdict} trace {:016x} ({} events, {} acked produces, {} ms simulated, {} \
         crashes ({} of the process), {} fail-stops, {} resets, {} clock jumps, {} journal \
         checkpoints)",
        outcome.seed,
        outcome.trace_hash,
        stats.history_events,
        stats.acknowledged_produces,
        stats.simulated_ms,
        stats.crashes,
        stats.process_crashes,
        stats.fail_stops,
        stats.connection_resets,
        stats.clock_jumps,
        stats.checkpoints,
    );
    if verbose {
        println!("  swarm: {}", outcome.swarm);
    }
    if !outcome.passed() {
        for violation in outcome.report.violations.iter().take(10) {
            println!("  violation: {violation:?}");
        }
        for finding in &outcome.findings {
            println!("  finding: {finding}");
        }
        println!("  replay: {}", replay_command_of(cluster, outcome.seed, canary));
    }
}
