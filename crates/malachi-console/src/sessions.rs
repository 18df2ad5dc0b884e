//! Console sessions: who logged in, from where, until when. Sans-IO: the time and the tokens
//! come in as arguments, so the rules are tested without a clock.
//!
//! A session is a random token in an `HttpOnly`, `SameSite=Strict` cookie. It ends
//! `MALACHI_SESSION_TIMEOUT_SEC` after its last use, at logout, or when it is presented from
//! another address than the one it logged in from (`MALACHI_SESSION_IP_BINDING`). Each session
//! carries a CSRF token that every state-changing request must echo in a header, which another
//! site's page cannot set.

use std::collections::BTreeMap;
use std::net::IpAddr;

/// Sessions kept at once; the oldest is dropped to make room (a login flood cannot grow it).
pub const SESSIONS_MAX: usize = 10_000;

/// One logged-in console user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsoleSession {
    pub username: String,
    pub admin: bool,
    /// Echoed in `x-malachi-csrf` by every request that changes something.
    pub csrf: String,
    pub address: IpAddr,
    pub last_used_ms: u64,
}

/// Why a presented session was not accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    Unknown,
    Expired,
    OtherAddress,
}

#[derive(Debug)]
pub struct Sessions {
    timeout_ms: u64,
    ip_binding: bool,
    by_token: BTreeMap<String, ConsoleSession>,
}

impl Sessions {
    pub fn new(timeout_ms: u64, ip_binding: bool) -> Sessions {
        Sessions { timeout_ms, ip_binding, by_token: BTreeMap::new() }
    }

    /// Starts a session under `token` (random, from the caller).
    pub fn open(&mut self, token: String, session: ConsoleSession) {
        if self.by_token.len() >= SESSIONS_MAX {
            let oldest = self
                .by_token
                .iter()
                .min_by_key(|(_, session)| session.last_used_ms)
                .map(|(token, _)| token.clone());
            if let Some(oldest) = oldest {
                self.by_token.remove(&oldest);
            }
        }
        self.by_token.insert(token, session);
    }

    /// The session under `token` presented from `address` at `now_ms`, its use recorded; an
    /// expired one is forgotten.
    pub fn touch(
        &mut self,
        token: &str,
        address: IpAddr,
        now_ms: u64,
    ) -> Result<ConsoleSession, Refused> {
        let session = self.by_token.get_mut(token).ok_or(Refused::Unknown)?;
        if now_ms.saturating_sub(session.last_used_ms) >= self.timeout_ms {
            self.by_token.remove(token);
            return Err(Refused::Expired);
        }
        if self.ip_binding && session.address != address {
            return Err(Refused::OtherAddress);
        }
        session.last_used_ms = now_ms;
        Ok(session.clone())
    }

    pub fn close(&mut self, token: &str) {
        self.by_token.remove(token);
    }

    pub fn len(&self) -> usize {
        self.by_token.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_token.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(address: [u8; 4], at_ms: u64) -> ConsoleSession {
        ConsoleSession {
            username: "admin".into(),
            admin: true,
            csrf: "c".into(),
            address: IpAddr::from(address),
            last_used_ms: at_ms,
        }
    }

    #[test]
    fn sessions_table() {
        let here = IpAddr::from([10, 0, 0, 1]);
        let there = IpAddr::from([10, 0, 0, 2]);
        // (ip binding, token presented, from, at ms, outcome)
        type Case<'a> = (bool, &'a str, IpAddr, u64, Result<(), Refused>);
        let cases: &[Case] = &[
            (true, "t", here, 1_000, Ok(())),
            (true, "t", here, 1_000 + 59_999, Ok(())),
            (true, "t", here, 1_000 + 60_000, Err(Refused::Expired)),
            (true, "nope", here, 1_000, Err(Refused::Unknown)),
            (true, "t", there, 1_000, Err(Refused::OtherAddress)),
            (false, "t", there, 1_000, Ok(())),
        ];
        for &(binding, token, from, at_ms, expected) in cases {
            let mut sessions = Sessions::new(60_000, binding);
            sessions.open("t".into(), session([10, 0, 0, 1], 1_000));
            let outcome = sessions.touch(token, from, at_ms).map(drop);
            assert_eq!(outcome, expected, "{token} from {from} at {at_ms}, binding {binding}");
        }
    }

    #[test]
    fn use_extends_a_session_and_expiry_forgets_it() {
        let here = IpAddr::from([10, 0, 0, 1]);
        let mut sessions = Sessions::new(60_000, true);
        sessions.open("t".into(), session([10, 0, 0, 1], 0));
        assert!(sessions.touch("t", here, 50_000).is_ok());
        assert!(sessions.touch("t", here, 100_000).is_ok(), "the last use counts");
        assert_eq!(sessions.touch("t", here, 160_000), Err(Refused::Expired));
        assert!(sessions.is_empty(), "an expired session is forgotten");
        sessions.open("t".into(), session([10, 0, 0, 1], 0));
        sessions.close("t");
        assert_eq!(sessions.touch("t", here, 1), Err(Refused::Unknown));
    }

    #[test]
    fn the_oldest_session_makes_room() {
        let mut sessions = Sessions::new(u64::MAX, false);
        for at in 0..SESSIONS_MAX as u64 {
            sessions.open(format!("t{at}"), session([10, 0, 0, 1], at + 1));
        }
        sessions.open("new".into(), session([10, 0, 0, 1], 0));
        assert_eq!(sessions.len(), SESSIONS_MAX);
        let here = IpAddr::from([10, 0, 0, 1]);
        assert_eq!(sessions.touch("t0", here, 5), Err(Refused::Unknown), "the oldest went");
        assert!(sessions.touch("new", here, 5).is_ok());
    }
}
