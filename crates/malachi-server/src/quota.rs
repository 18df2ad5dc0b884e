//! Per-user quotas of the original (`MALACHI_PUBLISH_RATE_LIMIT`, `_SUBSCRIBE_RATE_LIMIT`), and
//! Malachi's byte quota on publishing (`MALACHI_PUBLISH_BYTE_RATE_LIMIT`).
//!
//! Each is a token bucket per user that holds one second's worth and refills continuously from
//! the broker's clock. A produce is charged its record count and payload bytes before the write
//! (wire-protocol.md section 3.2): over quota is `rate_limited`, one request larger than a
//! whole window is `quota_too_small` (it could never pass). A subscribe takes one token.
//! Buckets live on the broker the client is connected to; they are not replicated.

use std::collections::BTreeMap;
use std::sync::Mutex;

use malachi_broker::config::SecurityConfig;
use malachi_wire::Reason;

/// Users with a bucket before full buckets (which equal no bucket) are forgotten.
pub const QUOTA_USERS_MAX: usize = 100_000;

/// The quotas of one client port.
#[derive(Debug)]
pub struct Quotas {
    publish_records_per_s: u64,
    publish_bytes_per_s: u64,
    subscribes_per_s: u64,
    publish: Mutex<BTreeMap<String, [Bucket; 2]>>,
    subscribe: Mutex<BTreeMap<String, [Bucket; 1]>>,
}

/// Tokens in thousandths, so that refill at a low rate over a few milliseconds is not lost
/// to rounding.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    milli_tokens: u64,
    at_ms: u64,
}

impl Quotas {
    pub fn new(config: &SecurityConfig) -> Quotas {
        Quotas {
            publish_records_per_s: config.publish_records_per_s.into(),
            publish_bytes_per_s: config.publish_bytes_per_s,
            subscribes_per_s: config.subscribe_requests_per_s.into(),
            publish: Mutex::default(),
            subscribe: Mutex::default(),
        }
    }

    /// Charges a produce of `records` records and `bytes` payload bytes to `user`.
    pub fn charge_publish(
        &self,
        user: &str,
        records: u64,
        bytes: u64,
        now_ms: u64,
    ) -> Result<(), Reason> {
        let rates = [self.publish_records_per_s, self.publish_bytes_per_s];
        charge(&self.publish, user, rates, [records, bytes], now_ms)
    }

    /// Charges one subscription to `user`.
    pub fn charge_subscribe(&self, user: &str, now_ms: u64) -> Result<(), Reason> {
        charge(&self.subscribe, user, [self.subscribes_per_s], [1], now_ms)
    }
}

/// Takes `amounts[i]` from bucket `i` of `user` (rate 0: unlimited), all or nothing.
fn charge<const N: usize>(
    buckets: &Mutex<BTreeMap<String, [Bucket; N]>>,
    user: &str,
    rates_per_s: [u64; N],
    amounts: [u64; N],
    now_ms: u64,
) -> Result<(), Reason> {
    if rates_per_s.iter().all(|rate| *rate == 0) {
        return Ok(());
    }
    for (rate, amount) in rates_per_s.iter().zip(amounts) {
        if *rate != 0 && amount > *rate {
            return Err(Reason::QuotaTooSmall);
        }
    }
    let mut buckets = buckets.lock().expect("quota lock poisoned");
    if !buckets.contains_key(user) && buckets.len() >= QUOTA_USERS_MAX {
        forget_full(&mut buckets, rates_per_s, now_ms);
        // Still full of users mid-window: the one charged longest ago starts afresh. Users
        // are provisioned by administrators, so this is a bound, not a path in practice.
        if buckets.len() >= QUOTA_USERS_MAX {
            let oldest = buckets
                .iter()
                .min_by_key(|(_, user_buckets)| user_buckets.iter().map(|b| b.at_ms).max())
                .map(|(name, _)| name.clone());
            buckets.remove(&oldest.expect("the map is not empty"));
        }
    }
    let full = rates_per_s.map(|rate| Bucket { milli_tokens: rate * 1000, at_ms: now_ms });
    let user_buckets = buckets.entry(user.to_string()).or_insert(full);
    for (bucket, rate) in user_buckets.iter_mut().zip(rates_per_s) {
        bucket.refill(rate, now_ms);
    }
    let enough = user_buckets
        .iter()
        .zip(rates_per_s.iter().zip(amounts))
        .all(|(bucket, (rate, amount))| *rate == 0 || bucket.milli_tokens >= amount * 1000);
    if !enough {
        return Err(Reason::RateLimited);
    }
    for (bucket, amount) in user_buckets.iter_mut().zip(amounts) {
        bucket.milli_tokens = bucket.milli_tokens.saturating_sub(amount * 1000);
    }
    Ok(())
}

/// Drops the buckets that have refilled completely: a user without one starts full anyway.
fn forget_full<const N: usize>(
    buckets: &mut BTreeMap<String, [Bucket; N]>,
    rates_per_s: [u64; N],
    now_ms: u64,
) {
    buckets.retain(|_, user_buckets| {
        user_buckets.iter_mut().zip(rates_per_s).any(|(bucket, rate)| {
            bucket.refill(rate, now_ms);
            bucket.milli_tokens < rate * 1000
        })
    });
}

impl Bucket {
    /// Adds what `rate_per_s` earned since the last look, up to one second's worth.
    fn refill(&mut self, rate_per_s: u64, now_ms: u64) {
        let elapsed_ms = now_ms.saturating_sub(self.at_ms);
        let earned = rate_per_s.saturating_mul(elapsed_ms);
        self.milli_tokens = self.milli_tokens.saturating_add(earned).min(rate_per_s * 1000);
        self.at_ms = self.at_ms.max(now_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quotas(records: u32, bytes: u64, subscribes: u32) -> Quotas {
        Quotas::new(&SecurityConfig {
            publish_records_per_s: records,
            publish_bytes_per_s: bytes,
            subscribe_requests_per_s: subscribes,
            ..SecurityConfig::default()
        })
    }

    #[test]
    fn publish_quota_charges_records_and_bytes() {
        let quotas = quotas(100, 10_000, 0);
        /// (user, records, bytes, at ms, expected)
        type Step = (&'static str, u64, u64, u64, Result<(), Reason>);
        let steps: [Step; 9] = [
            ("a", 101, 10, 0, Err(Reason::QuotaTooSmall)),
            ("a", 1, 10_001, 0, Err(Reason::QuotaTooSmall)),
            ("a", 60, 100, 0, Ok(())),
            ("a", 60, 100, 0, Err(Reason::RateLimited)),
            ("b", 60, 100, 0, Ok(())),
            ("a", 40, 100, 0, Ok(())),
            // 100 ms refill 10 records.
            ("a", 10, 100, 100, Ok(())),
            ("a", 1, 100, 100, Err(Reason::RateLimited)),
            // Bytes run out before records: nothing is taken from either.
            ("b", 1, 9_950, 0, Err(Reason::RateLimited)),
        ];
        for (index, (user, records, bytes, at_ms, expected)) in steps.into_iter().enumerate() {
            assert_eq!(
                quotas.charge_publish(user, records, bytes, at_ms),
                expected,
                "step {index}"
            );
        }
        let refunded = quotas.charge_publish("b", 40, 9_900, 0);
        assert_eq!(refunded, Ok(()), "a refused charge took nothing");
    }

    #[test]
    fn no_quota_is_no_limit_and_subscribes_take_one_token() {
        let quotas = quotas(0, 0, 2);
        for _ in 0..1_000 {
            assert_eq!(quotas.charge_publish("a", 1_000_000, 1 << 40, 0), Ok(()));
        }
        let outcomes: Vec<_> = (0..3).map(|_| quotas.charge_subscribe("a", 0)).collect();
        assert_eq!(outcomes, [Ok(()), Ok(()), Err(Reason::RateLimited)]);
        assert_eq!(quotas.charge_subscribe("a", 500), Ok(()), "half a second refills one");
    }

    #[test]
    fn memory_is_bounded_by_forgetting_full_buckets() {
        let quotas = quotas(0, 0, 1);
        for user in 0..QUOTA_USERS_MAX + 10 {
            let _ = quotas.charge_subscribe(&user.to_string(), 0);
        }
        assert!(quotas.subscribe.lock().unwrap().len() <= QUOTA_USERS_MAX);
        // A second later every bucket is full again and the next new user clears them.
        let _ = quotas.charge_subscribe("late", 1_000);
        assert_eq!(quotas.subscribe.lock().unwrap().len(), 1);
    }
}
