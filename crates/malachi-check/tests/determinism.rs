//! The determinism lint for all decision code of the workspace: these sources may not name a
//! hash map or set, a clock, a random number generator, or (where marked) floating point, I/O or
//! a runtime. Decision logic takes its time, randomness, disk and network from outside; that is
//! what lets one seed replay a whole run.

use std::path::{Path, PathBuf};

/// Forbidden everywhere in decision code, with why.
const ALWAYS: &[(&str, &str)] = &[
    ("HashMap", "iteration order is unspecified; use BTreeMap"),
    ("HashSet", "iteration order is unspecified; use BTreeSet"),
    ("Instant::now", "no clock: take the time as an argument"),
    ("SystemTime", "no clock: take the time as an argument"),
    ("thread_rng", "no ambient randomness: take a seeded generator"),
    ("rand::", "no ambient randomness: take a seeded generator"),
    ("getrandom", "no ambient randomness: take entropy as an argument"),
    ("RandomState", "seeded per process: hashes and orders differ run to run"),
    ("DefaultHasher", "not stable across releases; use xxh3 for anything kept or routed"),
    ("thread::sleep", "no real-time waits: use the runtime's timer, which the simulator drives"),
    ("wait_timeout", "no real-time waits: use the runtime's timer, which the simulator drives"),
    ("chrono", "no clock: take the time as an argument"),
];

/// Forbidden in the pure state machines and the checker, which do no I/O at all.
const PURE: &[(&str, &str)] = &[
    ("f32", "no floating point in decisions"),
    ("f64", "no floating point in decisions"),
    ("std::fs", "no I/O"),
    ("std::net", "no I/O"),
    ("std::env", "no configuration read while deciding"),
    ("tokio", "no runtime"),
    ("println!", "no output: results are returned"),
];

/// Decision code, relative to the workspace root, and whether it must also be pure.
const DECISION_CODE: &[(&str, bool)] = &[
    ("crates/malachi-meta/src", true),
    ("crates/malachi-reason/src", true),
    ("crates/malachi-check/src", true),
    ("crates/malachi-broker/src/frontier.rs", true),
    ("crates/malachi-broker/src/load.rs", true),
    ("crates/malachi-broker/src/cursor.rs", true),
    ("crates/malachi-log/src/segment/core.rs", true),
    ("crates/malachi-log/src/format.rs", true),
    ("crates/malachi-log/src/rng.rs", true),
    ("crates/malachi-broker/src/produce.rs", false),
    ("crates/malachi-broker/src/fetch.rs", false),
    ("crates/malachi-broker/src/groups.rs", false),
    ("crates/malachi-broker/src/topics.rs", false),
    ("crates/malachi-broker/src/maintenance.rs", false),
    ("crates/malachi-broker/src/data.rs", false),
    ("crates/malachi-broker/src/segments.rs", false),
    ("crates/malachi-broker/src/machines.rs", false),
    ("crates/malachi-broker/src/notify.rs", false),
    // The cluster's decisions on a broker: the vnodes, their coordinators, the seats and
    // leadership, policies, forwarding.
    ("crates/malachi-broker/src/vnodes.rs", false),
    // The coordinator's decisions are a sans-IO machine (its driver is `coordinate.rs`).
    ("crates/malachi-broker/src/coordinator.rs", true),
    ("crates/malachi-broker/src/coordinator", true),
    ("crates/malachi-broker/src/coordinate.rs", false),
    ("crates/malachi-broker/src/heads.rs", false),
    ("crates/malachi-broker/src/seats.rs", false),
    ("crates/malachi-broker/src/handover.rs", false),
    ("crates/malachi-broker/src/policies.rs", false),
    ("crates/malachi-broker/src/cluster.rs", false),
    ("crates/malachi-broker/src/remote.rs", false),
    ("crates/malachi-broker/src/peer", false),
    // The services' drivers (`node.rs` is the composition root that wires them).
    ("crates/malachi-broker/src/node.rs", false),
    ("crates/malachi-broker/src/replica.rs", false),
    ("crates/malachi-broker/src/replica", false),
    ("crates/malachi-broker/src/heal.rs", false),
    // Healing's plan for a segment is pure (its driver is `heal.rs`).
    ("crates/malachi-broker/src/heal", true),
    ("crates/malachi-broker/src/admin.rs", false),
    ("crates/malachi-broker/src/scrape.rs", false),
    ("crates/malachi-sim/src/cluster.rs", false),
    // The client port: every request handler, the connection phases, the limits.
    ("crates/malachi-server/src", false),
    // Raft behind our API; `runtime.rs` is where the seeded randomness is injected, and
    // `store.rs` the redb writer thread.
    ("crates/malachi-consensus/src/group.rs", false),
    ("crates/malachi-consensus/src/group_machine.rs", false),
    ("crates/malachi-consensus/src/log_store.rs", false),
    ("crates/malachi-consensus/src/machine.rs", false),
    ("crates/malachi-consensus/src/network.rs", false),
    ("crates/malachi-consensus/src/watch.rs", false),
    ("crates/malachi-consensus/src/backend.rs", false),
    // Replication's primary, its follower side and failover are pure machines; membership is
    // sans-IO too, but it names socket address types (`std::net`).
    ("crates/malachi-cluster/src/lib.rs", true),
    ("crates/malachi-cluster/src/replication.rs", true),
    ("crates/malachi-cluster/src/replication", true),
    ("crates/malachi-cluster/src/failover.rs", true),
    ("crates/malachi-cluster/src/failover", true),
    ("crates/malachi-cluster/src/follower.rs", true),
    ("crates/malachi-cluster/src/follower", true),
    ("crates/malachi-cluster/src/membership.rs", false),
    ("crates/malachi-cluster/src/membership", false),
    ("crates/malachi-cluster/src/peer.rs", false),
    ("crates/malachi-cluster/src/peer", false),
    ("crates/malachi-sim/src/world.rs", false),
    ("crates/malachi-sim/src/net.rs", false),
    ("crates/malachi-sim/src/node.rs", false),
    ("crates/malachi-sim/src/workload.rs", false),
];

/// Code the simulator runs: it may use the runtime, but not the runtime's own randomness, which
/// stable tokio cannot seed.
const SIMULATED_CODE: &[&str] = &[
    "crates/malachi-broker/src",
    "crates/malachi-server/src",
    "crates/malachi-consensus/src",
    "crates/malachi-client/src",
    "crates/malachi-log/src",
];

fn rust_files(path: &Path, found: &mut Vec<PathBuf>) {
    if path.is_file() {
        found.push(path.to_path_buf());
        return;
    }
    let entries =
        std::fs::read_dir(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() || path.extension().is_some_and(|extension| extension == "rs") {
            rust_files(&path, found);
        }
    }
}

#[test]
fn decision_code_names_no_source_of_nondeterminism() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut checked = 0;
    for (relative, pure) in DECISION_CODE {
        let mut files = Vec::new();
        rust_files(&workspace.join(relative), &mut files);
        files.sort();
        let rules = ALWAYS.iter().chain(if *pure { PURE } else { &[] });
        let rules: Vec<&(&str, &str)> = rules.collect();
        for file in &files {
            let text = std::fs::read_to_string(file).expect("a readable source file");
            for (number, line) in text.lines().enumerate() {
                for (token, why) in &rules {
                    assert!(
                        !line.contains(token),
                        "{}:{}: `{token}`: {why}",
                        file.display(),
                        number + 1
                    );
                }
            }
            checked += 1;
        }
    }
    assert!(checked > 40, "checked only {checked} files: is the table out of date?");
}

/// `tokio::sync::watch` wakes its waiters in a random order and an unbiased `select!` picks a
/// random ready branch; both draw from tokio's unseedable runtime generator, so a simulated run
/// would stop replaying. (The watch was found that way: a seed gave two trace hashes.)
#[test]
fn simulated_code_uses_no_runtime_randomness() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    for relative in SIMULATED_CODE {
        rust_files(&workspace.join(relative), &mut files);
    }
    files.sort();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("a readable source file");
        let lines: Vec<&str> = text.lines().collect();
        for (number, line) in lines.iter().enumerate() {
            let at = || format!("{}:{}", file.display(), number + 1);
            assert!(
                !line.contains("sync::watch"),
                "{}: tokio's watch; use malachi_consensus::watch",
                at()
            );
            if line.trim_start().starts_with("//") || !line.contains("select!") {
                continue;
            }
            let next = lines[number + 1..].iter().find(|line| !line.trim().is_empty());
            assert!(
                next.is_some_and(|next| next.trim() == "biased;"),
                "{}: a `select!` without `biased;`",
                at()
            );
        }
    }
    assert!(files.len() > 60, "checked only {} files", files.len());
}
