//! Failed-login bookkeeping, batched: a flood of wrong passwords (from many addresses, each
//! within the per-address rate limit) must not become a flood of Raft writes.
//!
//! A failure joins a pending table keyed by (username, address). If no batch is being written,
//! the login that found none writes one: it takes the whole table (up to a command's worth) and
//! proposes a single `RecordLoginFailures`, and goes on while failures keep arriving; the others
//! only add to the table and answer at once. So at most one lockout write is in flight per
//! broker, each carrying everything that failed while the previous one committed. The table is
//! bounded: past [`PENDING_PAIRS_MAX`] new pairs are dropped (counted and logged), which costs
//! a spraying attacker lockouts it could not use, while the per-address rate limit still holds.

use std::collections::BTreeMap;
use std::sync::Mutex;

use malachi_broker::node::Broker;
use malachi_meta::AdminCommand;
use malachi_meta::admin::{LOGIN_FAILURES_PER_COMMAND_MAX, LoginFailures};

/// Distinct (username, address) pairs waiting for the next batch.
pub const PENDING_PAIRS_MAX: usize = 10_000;

#[derive(Debug, Default)]
pub struct LockoutBatcher {
    state: Mutex<Pending>,
}

#[derive(Debug, Default)]
struct Pending {
    failures: BTreeMap<(String, String), u32>,
    /// A login is writing batches; new failures wait for it.
    writing: bool,
    /// Failures dropped because the table was full, not yet logged.
    dropped: u64,
}

impl LockoutBatcher {
    /// Records one failed login; returns once it is committed, or at once if another login is
    /// writing the batches (it will include this one).
    pub async fn record(&self, broker: &Broker, username: String, address: String) {
        if !self.add(username, address) {
            return;
        }
        loop {
            let Some(batch) = self.take() else { return };
            let now_ms = broker.clock().now_ms();
            let command = AdminCommand::RecordLoginFailures { failures: batch, now_ms };
            if let Err(error) = broker.admin_command(command).await {
                tracing::warn!(%error, "failed logins could not be recorded");
            }
        }
    }

    /// Adds a failure; true if the caller is now the writer.
    fn add(&self, username: String, address: String) -> bool {
        let mut pending = self.state.lock().expect("lockout lock poisoned");
        let full = pending.failures.len() >= PENDING_PAIRS_MAX;
        match pending.failures.get_mut(&(username.clone(), address.clone())) {
            Some(count) => *count = count.saturating_add(1),
            None if full => pending.dropped += 1,
            None => {
                pending.failures.insert((username, address), 1);
            }
        }
        !std::mem::replace(&mut pending.writing, true)
    }

    /// The next batch, or `None` (and the writer's turn ends) when nothing is pending.
    fn take(&self) -> Option<Vec<LoginFailures>> {
        let mut pending = self.state.lock().expect("lockout lock poisoned");
        if pending.dropped > 0 {
            tracing::warn!(
                dropped = pending.dropped,
                "failed logins beyond {PENDING_PAIRS_MAX} pending pairs were not counted"
            );
            pending.dropped = 0;
        }
        if pending.failures.is_empty() {
            pending.writing = false;
            return None;
        }
        let mut batch = Vec::new();
        while batch.len() < LOGIN_FAILURES_PER_COMMAND_MAX {
            let Some(((username, address), count)) = pending.failures.pop_first() else { break };
            batch.push(LoginFailures { username, address, count });
        }
        Some(batch)
    }

    #[cfg(test)]
    fn pending_pairs(&self) -> usize {
        self.state.lock().unwrap().failures.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_writer_takes_everything_that_failed_meanwhile() {
        let batcher = LockoutBatcher::default();
        assert!(batcher.add("bob".into(), "a".into()), "the first failure writes");
        assert!(!batcher.add("bob".into(), "a".into()), "later ones wait for the writer");
        assert!(!batcher.add("eve".into(), "b".into()));
        let batch = batcher.take().expect("a batch");
        let counts: Vec<_> = batch.iter().map(|f| (f.username.as_str(), f.count)).collect();
        assert_eq!(counts, [("bob", 2), ("eve", 1)]);
        assert!(!batcher.add("eve".into(), "b".into()), "still the same writer's turn");
        assert_eq!(batcher.take().map(|batch| batch.len()), Some(1));
        assert!(batcher.take().is_none(), "nothing pending ends the turn");
        assert!(batcher.add("bob".into(), "a".into()), "the next failure writes again");
    }

    #[test]
    fn the_pending_table_and_each_batch_are_bounded() {
        let batcher = LockoutBatcher::default();
        for index in 0..PENDING_PAIRS_MAX + 50 {
            batcher.add("u".into(), index.to_string());
        }
        assert_eq!(batcher.pending_pairs(), PENDING_PAIRS_MAX);
        let sizes: Vec<usize> = std::iter::from_fn(|| batcher.take().map(|b| b.len())).collect();
        assert_eq!(sizes.len(), PENDING_PAIRS_MAX.div_ceil(LOGIN_FAILURES_PER_COMMAND_MAX));
        assert!(sizes.iter().all(|size| *size <= LOGIN_FAILURES_PER_COMMAND_MAX));
    }
}
