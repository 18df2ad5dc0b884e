//! One broker's view of the cluster's membership: SWIM (foca), driven sans-IO.
//!
//! [`Membership`] owns foca and everything foca asks of its runtime: the datagrams to send
//! ([`Membership::take_outgoing`]), the timers (kept here by deadline and fired by
//! [`Membership::advance_to`] with the caller's clock), and the member changes
//! ([`Membership::take_changes`]). Its randomness is a seeded stream. Nothing here reads a
//! clock, a socket or the OS's randomness, so the simulator drives a whole cluster of them in
//! one thread, and the broker's UDP driver is a thin loop around the same calls.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::num::{NonZeroU8, NonZeroUsize};
use std::time::Duration;

use foca::{
    AccumulatingRuntime, Config, Foca, Member, NoCustomBroadcast, OwnedNotification, State, Timer,
};

use crate::peer::{CodecError, Peer, PeerCodec};

mod roster;
pub use roster::{GENERATION_AHEAD_MS_MAX, MEMBERS_MAX, Refusal, Roster};
use roster::{Screen, Screened};

/// A broker's status as the cluster sees it; the numbers are `cluster_state`'s (key 24).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PeerStatus {
    Alive = 0,
    /// Missed its probes; declared dead unless it refutes within the suspicion time.
    Suspect = 1,
    Dead = 2,
}

/// What the rest of the broker hears of membership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Up(Peer),
    Down(Peer),
    /// We were declared down (a partition, a long pause) and rejoined as this identity.
    Rejoined(Peer),
}

/// Timings of the protocol, in milliseconds of the caller's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MembershipConfig {
    /// One member probed per period.
    pub probe_period_ms: u64,
    /// How long a probe waits for its ack before asking others to probe indirectly.
    pub probe_rtt_ms: u64,
    /// How long a suspect has to refute before it is declared dead.
    pub suspect_to_down_ms: u64,
    /// Gossip to a few members this often, so news spreads faster than probes alone.
    pub gossip_period_ms: u64,
    /// Announce ourselves to a random member this often (heals a cluster split in two).
    pub announce_period_ms: u64,
    /// Announce ourselves to members we consider dead this often (they may only be cut off).
    pub announce_to_dead_period_ms: u64,
    /// The largest datagram, in bytes.
    pub max_datagram_bytes: usize,
}

impl Default for MembershipConfig {
    /// A LAN cluster of a few to a few dozen brokers: a dead broker is suspected within about
    /// two probe periods and declared dead 3 s later (detection in about 4-5 s).
    fn default() -> MembershipConfig {
        MembershipConfig {
            probe_period_ms: 1_000,
            probe_rtt_ms: 500,
            suspect_to_down_ms: 3_000,
            gossip_period_ms: 200,
            announce_period_ms: 10_000,
            announce_to_dead_period_ms: 5_000,
            max_datagram_bytes: 1_400,
        }
    }
}

impl MembershipConfig {
    fn foca(&self) -> Config {
        let periodic = |period_ms: u64, members: usize| foca::PeriodicParams {
            frequency: Duration::from_millis(period_ms),
            num_members: NonZeroUsize::new(members).expect("non-zero"),
        };
        Config {
            probe_period: Duration::from_millis(self.probe_period_ms),
            probe_rtt: Duration::from_millis(self.probe_rtt_ms),
            num_indirect_probes: NonZeroUsize::new(3).expect("non-zero"),
            max_transmissions: NonZeroU8::new(10).expect("non-zero"),
            suspect_to_down_after: Duration::from_millis(self.suspect_to_down_ms),
            // Dead members are kept (and announced to) for a day: a broker cut off for hours
            // must still find its way back.
            remove_down_after: Some(Duration::from_secs(24 * 60 * 60)),
            max_packet_size: NonZeroUsize::new(self.max_datagram_bytes).expect("non-zero"),
            notify_down_members: true,
            periodic_announce: Some(periodic(self.announce_period_ms, 1)),
            periodic_announce_to_down_members: Some(periodic(self.announce_to_dead_period_ms, 2)),
            periodic_gossip: Some(periodic(self.gossip_period_ms, 3)),
        }
    }
}

/// Why membership refused something.
#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    #[error("this broker cannot be gossiped: {0}")]
    Peer(#[from] CodecError),
    /// A datagram that is not SWIM, is from ourselves, or is too large; dropped.
    #[error("datagram refused: {0}")]
    Datagram(String),
    /// A datagram from, or naming, a broker membership may not hold; dropped.
    #[error("datagram refused: {0}")]
    Refused(#[from] Refusal),
}

/// The membership of one broker.
pub struct Membership {
    foca: Foca<Peer, PeerCodec, SeededRng, NoCustomBroadcast>,
    runtime: AccumulatingRuntime<Peer>,
    now_ms: u64,
    /// foca's timers by deadline, then by the order they were asked for.
    timers: BTreeMap<(u64, u64), Timer<Peer>>,
    timers_asked: u64,
    outgoing: Vec<(SocketAddr, Vec<u8>)>,
    changes: Vec<Change>,
    /// How long a suspect may stay so before this broker declares it down itself
    /// ([`Membership::expire_stale_suspicions`]).
    stale_suspicion_ms: u64,
    /// Members held suspect, by gossip address and generation: the incarnation they were
    /// suspected at and since when.
    suspected: BTreeMap<(SocketAddr, u64), (u16, u64)>,
    /// The registered brokers; `None` until the caller tells them ([`Membership::set_roster`]).
    roster: Option<Roster>,
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Membership")
            .field("me", self.foca.identity())
            .field("now_ms", &self.now_ms)
            .finish_non_exhaustive()
    }
}

impl Membership {
    /// Membership for `me`, starting at `now_ms`, its random choices drawn from `seed`.
    pub fn new(
        me: Peer,
        seed: u64,
        now_ms: u64,
        config: &MembershipConfig,
    ) -> Result<Membership, MembershipError> {
        me.check()?;
        let foca = Foca::new(me, config.foca(), SeededRng { state: seed }, PeerCodec);
        Ok(Membership {
            foca,
            runtime: AccumulatingRuntime::new(),
            now_ms,
            timers: BTreeMap::new(),
            timers_asked: 0,
            outgoing: Vec::new(),
            changes: Vec::new(),
            stale_suspicion_ms: config.suspect_to_down_ms.saturating_mul(2),
            suspected: BTreeMap::new(),
            roster: None,
        })
    }

    /// This broker as it is gossiped now (its generation rises when it rejoins).
    pub fn me(&self) -> &Peer {
        self.foca.identity()
    }

    /// Announces this broker to seed brokers, known by their gossip addresses; any one that is
    /// alive lets us in. Our own address among them is skipped.
    pub fn join(&mut self, seeds: &[SocketAddr]) {
        for &seed in seeds {
            if seed != self.me().gossip_addr {
                // Cannot fail: a seed placeholder always encodes.
                let _ = self.foca.announce(Peer::seed(seed), &mut self.runtime);
            }
        }
        self.pump();
    }

    /// Tells who may be in membership from now on: datagrams from, or naming, any other broker
    /// are refused, and updates about one are dropped (module `roster`).
    pub fn set_roster(&mut self, roster: Roster) {
        self.roster = Some(roster);
    }

    /// Takes in a datagram received from the network, once screened against the roster.
    pub fn handle_datagram(&mut self, data: &[u8]) -> Result<(), MembershipError> {
        let members = self.foca.iter_membership_state().map(|member| member.id().gossip_addr);
        let members = members.collect();
        let screen =
            Screen { roster: self.roster.as_ref(), members: &members, now_ms: self.now_ms };
        let screened = match screen.datagram(data) {
            Ok(screened) => screened,
            Err(Screened::Refused(refusal)) => return Err(refusal.into()),
            Err(Screened::Malformed(error)) => {
                return Err(MembershipError::Datagram(error.to_string()));
            }
        };
        let handled = self.foca.handle_data(&screened, &mut self.runtime);
        self.pump();
        handled.map_err(|error| MembershipError::Datagram(error.to_string()))
    }

    /// Moves the clock to `now_ms` and fires every timer due by then, in deadline order.
    pub fn advance_to(&mut self, now_ms: u64) {
        self.now_ms = self.now_ms.max(now_ms);
        while let Some(entry) = self.timers.first_entry() {
            if entry.key().0 > self.now_ms {
                break;
            }
            let timer = entry.remove();
            // A stale timer (a member since renamed or removed) is foca's to ignore.
            let _ = self.foca.handle_timer(timer, &mut self.runtime);
            self.pump();
        }
        self.expire_stale_suspicions();
    }

    /// Declares down every member held suspect at one incarnation for twice the suspicion
    /// time. foca declares a suspect down on a timer, but discards every timer it set when this
    /// broker itself is declared down or loses all its members (it trusts nothing it learned
    /// before); a suspicion raised before that was then never resolved unless the suspect
    /// heard of it and refuted it, and a peer stayed suspect for good (the chaos drill saw one
    /// after a cut healed). Declaring it down is what the lost timer would have done: the peer
    /// hears of it and rejoins under its next generation, as after any false suspicion.
    fn expire_stale_suspicions(&mut self) {
        let now_ms = self.now_ms;
        let mut suspected = BTreeMap::new();
        let mut stale = Vec::new();
        for member in self.foca.iter_membership_state() {
            if member.state() != State::Suspect {
                continue;
            }
            let peer = member.id();
            let key = (peer.gossip_addr, peer.generation);
            let since_ms = match self.suspected.get(&key) {
                Some(&(incarnation, since_ms)) if incarnation == member.incarnation() => since_ms,
                _ => now_ms,
            };
            suspected.insert(key, (member.incarnation(), since_ms));
            if now_ms.saturating_sub(since_ms) >= self.stale_suspicion_ms {
                stale.push(peer.clone());
            }
        }
        self.suspected = suspected;
        if stale.is_empty() {
            return;
        }
        for peer in &stale {
            self.suspected.remove(&(peer.gossip_addr, peer.generation));
        }
        // Cannot fail: the members are known and encode (they were decoded).
        let _ = self.foca.apply_many(stale.into_iter().map(Member::down), true, &mut self.runtime);
        self.pump();
    }

    /// When [`Membership::advance_to`] next has something to do.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        let timer = self.timers.first_key_value().map(|((deadline_ms, _), _)| *deadline_ms);
        let suspicion = self
            .suspected
            .values()
            .map(|&(_, since_ms)| since_ms.saturating_add(self.stale_suspicion_ms))
            .min();
        timer.into_iter().chain(suspicion).min()
    }

    /// Datagrams to send, with where to.
    pub fn take_outgoing(&mut self) -> Vec<(SocketAddr, Vec<u8>)> {
        std::mem::take(&mut self.outgoing)
    }

    /// Member changes since the last call, in the order they happened.
    pub fn take_changes(&mut self) -> Vec<Change> {
        std::mem::take(&mut self.changes)
    }

    /// Every other broker we know of with its status, by broker id (the latest generation of
    /// each; seeds we never heard from are not brokers and are left out).
    pub fn members(&self) -> Vec<(Peer, PeerStatus)> {
        let mut latest: BTreeMap<u64, (Peer, PeerStatus)> = BTreeMap::new();
        for member in self.foca.iter_membership_state() {
            let peer = member.id();
            if !peer.is_broker() || peer.broker_id == self.me().broker_id {
                continue;
            }
            let status = match member.state() {
                State::Alive => PeerStatus::Alive,
                State::Suspect => PeerStatus::Suspect,
                State::Down => PeerStatus::Dead,
            };
            let newer = latest
                .get(&peer.broker_id)
                .is_none_or(|(known, _)| peer.generation > known.generation);
            if newer {
                latest.insert(peer.broker_id, (peer.clone(), status));
            }
        }
        latest.into_values().collect()
    }

    /// Tells the others we are leaving (a clean shutdown), so they need not wait to suspect us.
    pub fn leave(mut self) -> Vec<(SocketAddr, Vec<u8>)> {
        // Cannot fail: our own identity always encodes (checked at `new`).
        let _ = self.foca.leave_cluster(&mut self.runtime);
        self.pump();
        self.take_outgoing()
    }

    /// Moves what foca asked of its runtime into our queues and timers.
    fn pump(&mut self) {
        while let Some((to, data)) = self.runtime.to_send() {
            self.outgoing.push((to.gossip_addr, data.to_vec()));
        }
        while let Some((after, timer)) = self.runtime.to_schedule() {
            let after_ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
            let deadline_ms = self.now_ms.saturating_add(after_ms);
            self.timers.insert((deadline_ms, self.timers_asked), timer);
            self.timers_asked += 1;
        }
        while let Some(notification) = self.runtime.to_notify() {
            let change = match notification {
                OwnedNotification::MemberUp(peer) if peer.is_broker() => Change::Up(peer),
                OwnedNotification::MemberDown(peer) if peer.is_broker() => Change::Down(peer),
                OwnedNotification::Rejoin(peer) => Change::Rejoined(peer),
                _ => continue,
            };
            self.changes.push(change);
        }
    }
}

/// SplitMix64: foca's random choices (whom to probe, whom to gossip to) from a seed.
#[derive(Debug)]
struct SeededRng {
    state: u64,
}

impl SeededRng {
    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

impl rand_core::TryRng for SeededRng {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        Ok((self.next() >> 32) as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        Ok(self.next())
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        for chunk in dst.chunks_mut(8) {
            let word = self.next().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
