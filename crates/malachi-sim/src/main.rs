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
    RunOutcome, run, run_cluster,
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
    // Each seed's run and the command that replays it, with every flag this one was given.
    let run_seed = |seed| {
        if args.cluster {
            let fault_ms = args.fault_ms.unwrap_or(CLUSTER_FAULT_MS);
            let options = ClusterOptions {
                seed,
                fault_ms,
                canary: cluster_canary,
                replica_faults: args.replica_faults,
            };
            (run_cluster(&options), options.replay_command())
        } else {
            let fault_ms = args.fault_ms.unwrap_or(DEFAULT_FAULT_MS);
            let options = RunOptions { seed, fault_ms, canary };
            (run(&options), options.replay_command())
        }
    };
    if let Some(seed) = args.seed {
        let (outcome, replay) = run_seed(seed);
        report(&outcome, &replay, args.verbose);
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
        let (outcome, replay) = run_seed(seed);
        runs += 1;
        if !outcome.passed() {
            failures += 1;
        }
        if !outcome.passed() || args.verbose {
            report(&outcome, &replay, true);
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

fn report(outcome: &RunOutcome, replay: &str, verbose: bool) {
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
        println!("  replay: {replay}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The words after `--` of a replay command, as the shell would pass them.
    fn parsed(command: &str) -> Args {
        let words = command.split_whitespace().skip_while(|word| *word != "--").skip(1);
        Args::try_parse_from(std::iter::once("malachi-sim").chain(words)).expect(command)
    }

    /// A replay command parses back into the options it was printed from: a flag it dropped
    /// would replay another run (as `--replica-faults` once was, replaying a passing one).
    #[test]
    fn a_replay_command_carries_every_flag_of_its_run() {
        let cluster_runs = [
            ClusterOptions::new(8_112_110),
            ClusterOptions { replica_faults: true, ..ClusterOptions::new(8_112_110) },
            ClusterOptions {
                fault_ms: 30_000,
                canary: Some(ClusterCanary::PromoteFollower),
                replica_faults: true,
                seed: 3,
            },
        ];
        for options in cluster_runs {
            let args = parsed(&options.replay_command());
            assert!(args.cluster);
            assert_eq!(args.seed, Some(options.seed));
            assert_eq!(args.fault_ms.unwrap_or(CLUSTER_FAULT_MS), options.fault_ms);
            assert_eq!(args.canary.as_deref().and_then(ClusterCanary::parse), options.canary);
            assert_eq!(args.replica_faults, options.replica_faults);
        }
        let node_runs = [
            RunOptions::new(28),
            RunOptions { fault_ms: 1_000, canary: Some(Canary::CutDamage), seed: 7 },
        ];
        for options in node_runs {
            let args = parsed(&options.replay_command());
            assert!(!args.cluster && !args.replica_faults);
            assert_eq!(args.seed, Some(options.seed));
            assert_eq!(args.fault_ms.unwrap_or(DEFAULT_FAULT_MS), options.fault_ms);
            assert_eq!(args.canary.as_deref().and_then(Canary::parse), options.canary);
        }
    }
}
