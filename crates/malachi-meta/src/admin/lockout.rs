//! Failed-login lockout bookkeeping of [`AdminState`], keyed by (username, client address).
//! Does no I/O: the time of each attempt arrives inside the command.
//!
//! Every `max_attempts`-th consecutive failure locks the pair. With progressive lockout the
//! duration grows with each lock: 5 failures lock for the base duration (5 min by default), 10
//! for 3x (15 min), 15 for 9x (45 min), 20 for 24x (2 h), 25 and every later multiple for 72x
//! (6 h). A success clears the pair; an unlocked pair idle for `reset_after_ms` starts counting
//! again from zero and may be pruned. Beyond `max_lockout_entries` pairs the least recently
//! failed one is evicted, so a spray of usernames or addresses cannot grow the state unbounded.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::users::check_username;
use super::{AdminResponse, AdminState};
use crate::error::AdminError;

/// Pairs one [`AdminCommand::RecordLoginFailures`](super::AdminCommand) applies.
pub const LOGIN_FAILURES_PER_COMMAND_MAX: usize = 1_000;
/// Failures applied per pair and command: past the longest lock nothing changes but the count.
pub const LOGIN_FAILURES_PER_PAIR_MAX: u32 = 64;

/// Failed logins of one (username, address) pair since the last batch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoginFailures {
    pub username: String,
    pub address: String,
    pub count: u32,
}

/// Duration multipliers of the base lockout for the 1st, 2nd, ... lock in a row.
const PROGRESSIVE_MULTIPLIERS: [u64; 5] = [1, 3, 9, 24, 72];

/// `MALACHI_MAX_AUTH_ATTEMPTS`, `MALACHI_LOCKOUT_DURATION_MS`, `MALACHI_PROGRESSIVE_LOCKOUT`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockoutPolicy {
    /// Failures per lock; 0 disables lockout.
    pub max_attempts: u32,
    pub base_duration_ms: u64,
    pub progressive: bool,
    /// An unlocked pair without a failure for this long is forgotten.
    pub reset_after_ms: u64,
}

impl Default for LockoutPolicy {
    fn default() -> LockoutPolicy {
        LockoutPolicy {
            max_attempts: 5,
            base_duration_ms: 300_000,
            progressive: true,
            reset_after_ms: 86_400_000,
        }
    }
}

impl LockoutPolicy {
    /// How long the `failures`-th consecutive failure locks for, if it locks at all.
    pub fn lock_duration_ms(&self, failures: u32) -> Option<u64> {
        if self.max_attempts == 0 || failures == 0 || !failures.is_multiple_of(self.max_attempts) {
            return None;
        }
        if !self.progressive {
            return Some(self.base_duration_ms);
        }
        let tier = (failures / self.max_attempts) as usize;
        let multiplier = PROGRESSIVE_MULTIPLIERS[tier.min(PROGRESSIVE_MULTIPLIERS.len()) - 1];
        Some(self.base_duration_ms.saturating_mul(multiplier))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockoutEntry {
    /// Consecutive failures since the last success or reset.
    pub failures: u32,
    pub last_failure_ms: u64,
    pub locked_until_ms: Option<u64>,
}

impl LockoutEntry {
    fn is_locked(&self, now_ms: u64) -> bool {
        self.locked_until_ms.is_some_and(|until| until > now_ms)
    }
}

impl AdminState {
    /// When the pair is locked at `now_ms`, the time the lock ends.
    pub fn locked_until(&self, username: &str, address: &str, now_ms: u64) -> Option<u64> {
        let entry = self.lockouts.get(username)?.get(address)?;
        entry.locked_until_ms.filter(|&until| until > now_ms)
    }

    /// (user, address) pairs locked out at `now_ms`.
    pub fn locked_count(&self, now_ms: u64) -> usize {
        self.lockouts.values().flat_map(BTreeMap::values).filter(|e| e.is_locked(now_ms)).count()
    }

    pub fn lockout_entry(&self, username: &str, address: &str) -> Option<&LockoutEntry> {
        self.lockouts.get(username)?.get(address)
    }

    pub(super) fn record_login_failure(
        &mut self,
        username: String,
        address: String,
        now_ms: u64,
    ) -> Result<AdminResponse, AdminError> {
        check_username(&username)?;
        self.check_address(&address)?;
        let known = self.lockout_entry(&username, &address).is_some();
        if !known && self.lockout_entries >= u64::from(self.limits.max_lockout_entries) {
            self.evict_least_recent();
        }
        let policy = self.lockout_policy.clone();
        let by_address = self.lockouts.entry(username).or_default();
        let entry = by_address.entry(address).or_insert_with(|| LockoutEntry {
            failures: 0,
            last_failure_ms: now_ms,
            locked_until_ms: None,
        });
        let idle_ms = now_ms.saturating_sub(entry.last_failure_ms);
        if !entry.is_locked(now_ms) && idle_ms >= policy.reset_after_ms {
            entry.failures = 0;
        }
        entry.failures = entry.failures.saturating_add(1);
        entry.last_failure_ms = now_ms;
        let locked_until_ms =
            policy.lock_duration_ms(entry.failures).map(|d| now_ms.saturating_add(d));
        if locked_until_ms.is_some() {
            entry.locked_until_ms = locked_until_ms;
        }
        let failures = entry.failures;
        if !known {
            self.lockout_entries += 1;
        }
        Ok(AdminResponse::LoginFailureRecorded { failures, locked_until_ms })
    }

    pub(super) fn record_login_failures(
        &mut self,
        failures: Vec<LoginFailures>,
        now_ms: u64,
    ) -> Result<AdminResponse, AdminError> {
        // Bounded work per command: entries beyond the limit are refused, not applied.
        let beyond = failures.len().saturating_sub(LOGIN_FAILURES_PER_COMMAND_MAX) as u64;
        let (mut recorded, mut refused) = (0, beyond);
        for LoginFailures { username, address, count } in
            failures.into_iter().take(LOGIN_FAILURES_PER_COMMAND_MAX)
        {
            for _ in 0..count.min(LOGIN_FAILURES_PER_PAIR_MAX) {
                match self.record_login_failure(username.clone(), address.clone(), now_ms) {
                    Ok(_) => recorded += 1,
                    Err(_) => {
                        refused += 1;
                        break;
                    }
                }
            }
        }
        Ok(AdminResponse::LoginFailuresRecorded { recorded, refused })
    }

    pub(super) fn record_login_success(
        &mut self,
        username: &str,
        address: &str,
    ) -> Result<AdminResponse, AdminError> {
        check_username(username)?;
        self.check_address(address)?;
        let cleared = self.remove_entry(username, address);
        Ok(AdminResponse::LoginSuccessRecorded { cleared })
    }

    pub(super) fn prune_lockouts(&mut self, now_ms: u64) -> AdminResponse {
        let reset_after_ms = self.lockout_policy.reset_after_ms;
        let stale: Vec<(String, String)> = self
            .lockouts
            .iter()
            .flat_map(|(username, by_address)| {
                by_address
                    .iter()
                    .filter(move |(_, entry)| {
                        !entry.is_locked(now_ms)
                            && now_ms.saturating_sub(entry.last_failure_ms) >= reset_after_ms
                    })
                    .map(move |(address, _)| (username.clone(), address.clone()))
            })
            .collect();
        for (username, address) in &stale {
            assert!(self.remove_entry(username, address));
        }
        AdminResponse::LockoutsPruned { removed: stale.len() as u64 }
    }

    fn check_address(&self, address: &str) -> Result<(), AdminError> {
        let too_long = address.len() > self.limits.max_address_bytes as usize;
        if address.is_empty() || too_long || address.chars().any(char::is_control) {
            return Err(AdminError::InvalidAddress);
        }
        Ok(())
    }

    /// Evicts the pair whose last failure is oldest (ties broken by username, then address).
    fn evict_least_recent(&mut self) {
        let oldest = self
            .lockouts
            .iter()
            .flat_map(|(username, by_address)| {
                by_address
                    .iter()
                    .map(move |(address, entry)| (entry.last_failure_ms, username, address))
            })
            .min()
            .map(|(_, username, address)| (username.clone(), address.clone()));
        if let Some((username, address)) = oldest {
            assert!(self.remove_entry(&username, &address));
        }
    }

    fn remove_entry(&mut self, username: &str, address: &str) -> bool {
        let Some(by_address) = self.lockouts.get_mut(username) else { return false };
        let removed = by_address.remove(address).is_some();
        if by_address.is_empty() {
            self.lockouts.remove(username);
        }
        if removed {
            self.lockout_entries -= 1;
        }
        removed
    }
}
