//! Connection limits: per client address and in total (`MALACHI_MAX_CONN_PER_IP`,
//! `MALACHI_MAX_TOTAL_CONN`), and connections not yet logged in (`MALACHI_MAX_UNAUTHENTICATED_CONN`).
//! A slot is held by a guard and released when the connection ends.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

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
}

/// A held connection slot.
#[derive(Debug)]
pub struct ConnectionSlot {
    limits: Arc<ConnectionLimits>,
    ip: IpAddr,
    authenticated: bool,
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
            return Err(Reason::Overloaded);
        }
        counts.total += 1;
        counts.unauthenticated += 1;
        *counts.per_ip.entry(ip).or_insert(0) += 1;
        Ok(ConnectionSlot { limits: Arc::clone(self), ip, authenticated: false })
    }

    pub fn open_connections(&self) -> u32 {
        self.counts.lock().expect("limits lock poisoned").total
    }
}

impl ConnectionSlot {
    /// The connection logged in: it no longer counts as unauthenticated.
    pub fn logged_in(&mut self) {
        if !std::mem::replace(&mut self.authenticated, true) {
            self.limits.counts.lock().expect("limits lock poisoned").unauthenticated -= 1;
        }
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut counts = self.limits.counts.lock().expect("limits lock poisoned");
        counts.total -= 1;
        if !self.authenticated {
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
        assert_eq!(limits.admit(a).unwrap_err(), Reason::Overloaded);
        first.logged_in();
        first.logged_in();
        let third = limits.admit(a).unwrap();
        assert_eq!(limits.admit(a).unwrap_err(), Reason::Overloaded);
        drop((second, third));
        assert!(limits.admit(a).is_ok());
        drop(first);
        assert_eq!(limits.open_connections(), 0);
    }
}
