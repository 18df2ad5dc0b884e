//! Connection limits: per client address and in total (`MALACHI_MAX_CONN_PER_IP`,
//! `MALACHI_MAX_TOTAL_CONN`), and connections not yet logged in (`MALACHI_MAX_UNAUTHENTICATED_CONN`).
//! A slot is held by a guard and released when the connection ends.
//!
//! When the not-logged-in places are all taken, a new connection evicts the oldest one that has
//! not yet sent its whole first frame (a "silent" one) rather than being refused: strangers who
//! hold connections open without logging in then only push each other out, and a client that
//! sends its login at once still gets in. The evicted connection is answered `overloaded`. Only
//! when every such place holds a login being judged is the newcomer refused `overloaded`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use malachi_wire::Reason;

/// The largest frame read before login: an auth request is a user name and a password (or a
/// token of a few KiB), so a stranger announcing megabytes is answered `frame_too_large` and
/// closed before anything of it is buffered. The configured frame limit applies after login.
pub const AUTH_FRAME_BYTES_MAX: u32 = 16 * 1024;

#[derive(Debug)]
pub struct ConnectionLimits {
    enabled: bool,
    per_ip_max: u32,
    total_max: u32,
    /// Connections that have not logged in yet, always enforced: what a stranger can hold open
    /// (each for at most the auth timeout) whatever the other limits say.
    unauthenticated_max: u32,
    counts: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    total: u32,
    unauthenticated: u32,
    per_ip: BTreeMap<IpAddr, u32>,
    /// Not-logged-in connections that have not sent a whole first frame, oldest first.
    silent: BTreeMap<u64, Arc<Eviction>>,
    next_admission: u64,
}

/// How a silent connection learns it was evicted.
#[derive(Debug, Default)]
struct Eviction {
    evicted: AtomicBool,
    notify: Notify,
}

/// A held connection slot.
#[derive(Debug)]
pub struct ConnectionSlot {
    limits: Arc<ConnectionLimits>,
    ip: IpAddr,
    /// No longer counted as not logged in: logged in, or evicted (which released that place).
    authenticated: bool,
    admission: u64,
    eviction: Arc<Eviction>,
}

impl ConnectionLimits {
    pub fn new(
        enabled: bool,
        (per_ip_max, total_max): (u32, u32),
        unauthenticated_max: u32,
    ) -> Arc<ConnectionLimits> {
        Arc::new(ConnectionLimits {
            enabled,
            per_ip_max,
            total_max,
            unauthenticated_max,
            counts: Mutex::default(),
        })
    }

    /// Takes a slot for a connection from `ip`, not yet logged in, or names the limit it would
    /// break: `overloaded` when too many connections are logging in at once.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<ConnectionSlot, Reason> {
        let mut counts = self.counts.lock().expect("limits lock poisoned");
        if self.enabled {
            if counts.total >= self.total_max {
                return Err(Reason::GlobalLimitExceeded);
            }
            if counts.per_ip.get(&ip).copied().unwrap_or(0) >= self.per_ip_max {
                return Err(Reason::ConnectionLimitExceeded);
            }
        }
        if counts.unauthenticated >= self.unauthenticated_max {
            let Some((_, oldest)) = counts.silent.pop_first() else {
                return Err(Reason::Overloaded);
            };
            oldest.evicted.store(true, Ordering::SeqCst);
            oldest.notify.notify_one();
            counts.unauthenticated -= 1;
        }
        counts.total += 1;
        counts.unauthenticated += 1;
        *counts.per_ip.entry(ip).or_insert(0) += 1;
        let admission = counts.next_admission;
        counts.next_admission += 1;
        let eviction = Arc::new(Eviction::default());
        counts.silent.insert(admission, Arc::clone(&eviction));
        Ok(ConnectionSlot {
            limits: Arc::clone(self),
            ip,
            authenticated: false,
            admission,
            eviction,
        })
    }

    pub fn open_connections(&self) -> u32 {
        self.counts.lock().expect("limits lock poisoned").total
    }
}

impl ConnectionSlot {
    /// The connection's first frame arrived whole: it is being judged and is no longer evicted.
    /// Its place is released when it logs in or closes.
    pub fn heard(&self) {
        self.limits.counts.lock().expect("limits lock poisoned").silent.remove(&self.admission);
    }

    /// Completes when a newcomer evicted this connection while it was silent.
    pub async fn evicted(&self) {
        if self.eviction.evicted.load(Ordering::SeqCst) {
            return;
        }
        self.eviction.notify.notified().await;
    }

    /// The connection logged in: it no longer counts as unauthenticated.
    pub fn logged_in(&mut self) {
        let mut counts = self.limits.counts.lock().expect("limits lock poisoned");
        counts.silent.remove(&self.admission);
        let evicted = self.eviction.evicted.load(Ordering::SeqCst);
        if !std::mem::replace(&mut self.authenticated, true) && !evicted {
            counts.unauthenticated -= 1;
        }
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut counts = self.limits.counts.lock().expect("limits lock poisoned");
        counts.total -= 1;
        counts.silent.remove(&self.admission);
        // An evicted slot released its not-logged-in place when it was evicted.
        if !self.authenticated && !self.eviction.evicted.load(Ordering::SeqCst) {
            counts.unauthenticated -= 1;
        }
        if let Some(count) = counts.per_ip.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                counts.per_ip.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_per_address_and_in_total() {
        let limits = ConnectionLimits::new(true, (2, 3), 100);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = limits.admit(a).unwrap();
        let _second = limits.admit(a).unwrap();
        assert_eq!(limits.admit(a).unwrap_err(), Reason::ConnectionLimitExceeded);
        let _third = limits.admit(b).unwrap();
        assert_eq!(limits.admit(b).unwrap_err(), Reason::GlobalLimitExceeded);
        drop(first);
        assert!(limits.admit(a).is_ok(), "a closed connection frees its slot");
        let disabled = ConnectionLimits::new(false, (0, 0), 100);
        assert!(disabled.admit(a).is_ok());
    }

    /// Connections logging in are bounded even when the other limits are off; a login frees
    /// its place at once, a connection that never logs in when it closes.
    #[test]
    fn connections_not_logged_in_are_bounded() {
        let limits = ConnectionLimits::new(false, (0, 0), 2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let mut first = limits.admit(a).unwrap();
        let second = limits.admit(a).unwrap();
        first.heard();
        second.heard();
        assert_eq!(limits.admit(a).unwrap_err(), Reason::Overloaded, "both are being judged");
        first.logged_in();
        first.logged_in();
        let third = limits.admit(a).unwrap();
        third.heard();
        assert_eq!(limits.admit(a).unwrap_err(), Reason::Overloaded);
        drop((second, third));
        assert!(limits.admit(a).is_ok());
        drop(first);
        assert_eq!(limits.open_connections(), 0);
    }

    /// A newcomer evicts the oldest silent stranger instead of being refused.
    #[tokio::test]
    async fn the_oldest_silent_connection_makes_way() {
        let limits = ConnectionLimits::new(false, (0, 0), 2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let oldest = limits.admit(a).unwrap();
        let judged = limits.admit(a).unwrap();
        judged.heard();
        let newcomer = limits.admit(a).expect("the oldest silent one makes way");
        oldest.evicted().await;
        newcomer.heard();
        assert_eq!(limits.admit(a).unwrap_err(), Reason::Overloaded, "logins being judged stay");
        drop(oldest);
        assert_eq!(
            limits.admit(a).unwrap_err(),
            Reason::Overloaded,
            "an evicted slot freed its place once"
        );
        drop(judged);
        let mut last = limits.admit(a).expect("a judged login that closed frees its place");
        last.logged_in();
        drop((newcomer, last));
        assert_eq!(limits.open_connections(), 0);
        let counts = limits.counts.lock().unwrap();
        assert_eq!((counts.unauthenticated, counts.silent.len()), (0, 0), "nothing leaks");
    }
}
