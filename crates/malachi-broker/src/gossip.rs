//! The broker's SWIM membership on `MALACHI_CLUSTER_GOSSIP_PORT` (UDP): a thin driver around
//! `malachi_cluster::Membership`, which decides everything without I/O.
//!
//! The driver hands membership the broker's clock, the datagrams received and a seed from the
//! broker's entropy; it sends what membership asks to send and publishes every member's status
//! to [`MemberStatuses`], where the rest of the broker reads it (`cluster_state`, `malachi
//! cluster status`, and the forwarding of segment calls, which answers at once for a broker
//! known dead instead of waiting out a connect timeout).
//!
//! Whom to announce to comes from the administrative machine: every registered broker's gossip
//! address. A broker announces itself at start to all of them, and again every
//! [`REANNOUNCE_MS`] to those it has not heard alive, so a broker that started before its peers
//! (or across a healed partition) finds them without an operator.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

pub use malachi_cluster::PeerStatus;
use malachi_cluster::{Change, Membership, MembershipConfig, MembershipError, Peer, Roster};
use malachi_transport::gossip_seal::GossipSeal;
use tokio::net::UdpSocket;
use tokio::sync::oneshot;

use crate::node::{Broker, Core};

/// Pause between announcements to registered brokers not heard alive.
pub const REANNOUNCE_MS: u64 = 5_000;

/// How often gossip looks a registered broker's name up again. The loop turns many times a
/// second and must not start a lookup each turn; a container back at another address is
/// followed within this, well inside the [`REANNOUNCE_MS`] an unheard broker waits anyway.
pub const RESOLVE_EVERY_MS: u64 = 1_000;
/// The least time between two log lines about refused datagrams.
const REFUSED_LOG_MS: u64 = 10_000;
/// The largest datagram read; membership refuses anything above its own 1,400-byte limit.
const DATAGRAM_BYTES_MAX: usize = 2_048;
/// The longest the driver sleeps without looking at the registry and the clock.
const IDLE_MS_MAX: u64 = 1_000;

/// Every broker's status as membership last reported it, for the rest of the broker.
#[derive(Debug, Default)]
pub struct MemberStatuses {
    /// When the driver started (`None`: no membership runs, as for a broker alone).
    started_ms: Option<u64>,
    /// The brokers membership knows, by node id.
    heard: BTreeMap<u64, PeerStatus>,
    /// Since when each broker has been dead (reported dead, or never heard from past the grace
    /// time), by node id.
    dead_since_ms: BTreeMap<u64, u64>,
}

impl MemberStatuses {
    /// `node_id`'s status at `now_ms`, as seen by broker `me`. Without membership every broker
    /// counts as alive (a broker alone, or before the driver starts). A registered broker never
    /// heard from is suspect for as long as a live one takes to answer, then dead.
    pub fn status(&self, me: u64, node_id: u64, now_ms: u64, grace_ms: u64) -> PeerStatus {
        let Some(started_ms) = self.started_ms else { return PeerStatus::Alive };
        if node_id == me {
            return PeerStatus::Alive;
        }
        match self.heard.get(&node_id) {
            Some(status) => *status,
            None if now_ms < started_ms.saturating_add(grace_ms) => PeerStatus::Suspect,
            None => PeerStatus::Dead,
        }
    }

    /// How long `node_id` has been dead at `now_ms` (0 while it is not, or without membership).
    pub fn dead_for_ms(&self, me: u64, node_id: u64, now_ms: u64, grace_ms: u64) -> u64 {
        if self.status(me, node_id, now_ms, grace_ms) != PeerStatus::Dead {
            return 0;
        }
        let since = match self.dead_since_ms.get(&node_id) {
            Some(since) => *since,
            // Never heard from: dead since the grace time ran out.
            None => self.started_ms.map_or(now_ms, |started| started.saturating_add(grace_ms)),
        };
        now_ms.saturating_sub(since)
    }

    /// Takes in what membership reports now.
    fn publish(&mut self, heard: BTreeMap<u64, PeerStatus>, now_ms: u64) {
        for (node_id, status) in &heard {
            if *status == PeerStatus::Dead {
                self.dead_since_ms.entry(*node_id).or_insert(now_ms);
            } else {
                self.dead_since_ms.remove(node_id);
            }
        }
        self.dead_since_ms.retain(|node_id, _| heard.contains_key(node_id));
        self.heard = heard;
    }
}

/// How long a registered broker may stay unheard before it counts as dead: a probe period,
/// its indirect probes and the suspicion time, as membership itself would take.
pub fn unheard_grace_ms(config: &MembershipConfig) -> u64 {
    config.probe_period_ms + config.probe_rtt_ms + config.suspect_to_down_ms
}

/// The running driver; [`Gossip::leave`] stops it and tells the others.
pub struct Gossip {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Gossip {
    /// Announces this broker's departure (so the others need not wait to suspect it) and
    /// stops the driver.
    pub async fn leave(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), &mut self.task).await;
        self.task.abort();
    }
}

impl Core {
    /// Starts membership on `socket` (bound to the gossip port), advertising `gossip_addr`.
    /// `seal`, when set, seals every datagram sent and drops every one received that does not
    /// open (docs/security.md, "Between brokers").
    pub fn spawn_gossip(
        &self,
        socket: UdpSocket,
        gossip_addr: SocketAddr,
        seal: Option<Arc<GossipSeal>>,
    ) -> Result<Gossip, String> {
        let record = self.own_record();
        let me = Peer {
            gossip_addr,
            // Rises at every start, so a restarted broker supersedes the identity the others
            // may have declared down.
            generation: self.clock.now_ms().max(1),
            broker_id: self.node_id,
            cluster_addr: record.cluster_address,
            client_addr: record.client_address,
            attributes: record.attributes,
        };
        let mut seed = [0u8; 8];
        self.entropy.fill(&mut seed);
        let config = MembershipConfig::default();
        let now_ms = self.clock.now_ms();
        let membership = Membership::new(me, u64::from_le_bytes(seed), now_ms, &config)
            .map_err(|error| error.to_string())?;
        {
            let mut statuses = self.statuses.lock().expect("statuses lock poisoned");
            statuses.started_ms = Some(now_ms);
            statuses.heard.clear();
            statuses.dead_since_ms.clear();
        }
        let (stop, stopped) = oneshot::channel();
        let driver = Driver {
            broker: self.me.clone(),
            socket,
            seal,
            membership: Some(membership),
            resolver: malachi_transport::Resolver::default(),
            announced_ms: BTreeMap::new(),
            looked_up_ms: BTreeMap::new(),
            refused_logged_ms: None,
            refused_unlogged: 0,
        };
        let task = tokio::spawn(driver.run(stopped));
        Ok(Gossip { stop: Some(stop), task })
    }

    /// `node_id`'s membership status now.
    pub fn member_status(&self, node_id: u64) -> PeerStatus {
        let grace_ms = unheard_grace_ms(&MembershipConfig::default());
        let statuses = self.statuses.lock().expect("statuses lock poisoned");
        statuses.status(self.node_id, node_id, self.clock.now_ms(), grace_ms)
    }

    /// Whether membership runs (and so tells live brokers from dead ones).
    pub fn membership_running(&self) -> bool {
        self.statuses.lock().expect("statuses lock poisoned").started_ms.is_some()
    }

    /// How long `node_id` has been dead, as membership tells (0 while it is not).
    pub fn dead_for_ms(&self, node_id: u64) -> u64 {
        let grace_ms = unheard_grace_ms(&MembershipConfig::default());
        let statuses = self.statuses.lock().expect("statuses lock poisoned");
        statuses.dead_for_ms(self.node_id, node_id, self.clock.now_ms(), grace_ms)
    }
}

struct Driver {
    broker: Weak<Broker>,
    socket: UdpSocket,
    seal: Option<Arc<GossipSeal>>,
    /// `None` once left.
    membership: Option<Membership>,
    /// Resolves registered brokers' gossip addresses, one lookup per name at a time.
    resolver: malachi_transport::Resolver,
    /// When each address was last announced to.
    announced_ms: BTreeMap<SocketAddr, u64>,
    /// When each registered gossip name was last looked up.
    looked_up_ms: BTreeMap<String, u64>,
    /// When a refused datagram was last logged, and how many were refused since.
    refused_logged_ms: Option<u64>,
    refused_unlogged: u64,
}

impl Driver {
    async fn run(mut self, mut stopped: oneshot::Receiver<()>) {
        let mut buffer = vec![0u8; DATAGRAM_BYTES_MAX];
        loop {
            let Some(broker) = self.broker.upgrade() else { return };
            self.announce(&broker).await;
            let now_ms = broker.clock.now_ms();
            let membership = self.membership.as_mut().expect("running");
            membership.advance_to(now_ms);
            self.flush(&broker).await;
            let membership = self.membership.as_ref().expect("running");
            let wake_ms = membership.next_deadline_ms().unwrap_or(u64::MAX);
            let sleep_ms = wake_ms.saturating_sub(now_ms).clamp(1, IDLE_MS_MAX);
            drop(broker);
            tokio::select! {
                biased;
                _ = &mut stopped => break,
                received = self.socket.recv_from(&mut buffer) => {
                    if let Ok((bytes, from)) = received {
                        self.receive(&buffer[..bytes], from);
                    }
                }
                () = tokio::time::sleep(Duration::from_millis(sleep_ms)) => {}
            }
        }
        if let Some(membership) = self.membership.take() {
            for (to, datagram) in membership.leave() {
                self.send(&datagram, to).await;
            }
        }
    }

    /// Hands a received datagram to membership, once it opens under the seal.
    fn receive(&mut self, datagram: &[u8], from: SocketAddr) {
        let opened;
        let plain = match &self.seal {
            None => datagram,
            Some(seal) => match seal.open(datagram) {
                Some(plain) => {
                    opened = plain;
                    &opened[..]
                }
                None => {
                    tracing::debug!(%from, "a gossip datagram that does not open under the cluster's key was dropped");
                    return;
                }
            },
        };
        let membership = self.membership.as_mut().expect("running");
        match membership.handle_datagram(plain) {
            Ok(()) => {}
            Err(error @ MembershipError::Refused(_)) => self.refused(from, &error),
            Err(error) => tracing::debug!(%error, "gossip datagram dropped"),
        }
    }

    /// Logs a refused datagram: the first of every [`REFUSED_LOG_MS`], with how many were
    /// refused since, so a flood of forgeries does not flood the log. A broker registered a
    /// moment ago may be refused once or twice until its registration reaches this broker.
    fn refused(&mut self, from: SocketAddr, error: &MembershipError) {
        self.refused_unlogged += 1;
        let now_ms = self.broker.upgrade().map_or(0, |broker| broker.clock.now_ms());
        if self.refused_logged_ms.is_some_and(|at| now_ms < at.saturating_add(REFUSED_LOG_MS)) {
            return;
        }
        tracing::warn!(
            %from,
            %error,
            refused = self.refused_unlogged,
            "gossip about a broker that membership may not hold was refused"
        );
        self.refused_logged_ms = Some(now_ms);
        self.refused_unlogged = 0;
    }

    /// Sends one datagram, sealed if gossip is. One lost here is one SWIM loses anyway; it
    /// retries by design.
    async fn send(&self, datagram: &[u8], to: SocketAddr) {
        let _ = match &self.seal {
            None => self.socket.send_to(datagram, to).await,
            Some(seal) => self.socket.send_to(&seal.seal_random(datagram), to).await,
        };
    }

    /// Tells membership the registered brokers (only they may be members, each at its
    /// registered gossip address), and announces this broker to those not heard alive lately.
    async fn announce(&mut self, broker: &Broker) {
        let now_ms = broker.clock.now_ms();
        let membership = self.membership.as_ref().expect("running");
        let alive: BTreeSet<u64> = membership
            .members()
            .into_iter()
            .filter(|(_, status)| *status == PeerStatus::Alive)
            .map(|(peer, _)| peer.broker_id)
            .collect();
        let me = membership.me().clone();
        let mut roster = BTreeMap::from([(me.broker_id, me.gossip_addr)]);
        let mut due = Vec::new();
        for record in broker.brokers() {
            if record.node_id == broker.node_id || record.gossip_address.is_empty() {
                continue;
            }
            let Some(address) = self.resolve(&record.gossip_address, now_ms) else { continue };
            roster.insert(record.node_id, address);
            if alive.contains(&record.node_id) {
                continue;
            }
            let last_ms = self.announced_ms.get(&address).copied();
            if last_ms.is_none_or(|last_ms| now_ms >= last_ms.saturating_add(REANNOUNCE_MS)) {
                self.announced_ms.insert(address, now_ms);
                due.push(address);
            }
        }
        let membership = self.membership.as_mut().expect("running");
        membership.set_roster(Roster::new(roster));
        if !due.is_empty() {
            membership.join(&due);
        }
    }

    /// A registered gossip address's socket address, without waiting: a name not resolved
    /// yet is skipped this turn (its lookup runs beside), and a name whose container came back
    /// elsewhere is followed on a later turn. Each name is looked up at most every
    /// [`RESOLVE_EVERY_MS`].
    fn resolve(&mut self, address: &str, now_ms: u64) -> Option<SocketAddr> {
        let found = if lookup_due(self.looked_up_ms.get(address).copied(), now_ms) {
            self.looked_up_ms.insert(address.to_string(), now_ms);
            self.resolver.known(address)
        } else {
            self.resolver.last(address)
        };
        found?.first().copied()
    }

    /// Sends what membership asked to send, logs its changes, and publishes the statuses.
    async fn flush(&mut self, broker: &Broker) {
        let membership = self.membership.as_mut().expect("running");
        let outgoing = membership.take_outgoing();
        for change in membership.take_changes() {
            match change {
                Change::Up(peer) => tracing::info!(node_id = peer.broker_id, "broker up"),
                Change::Down(peer) => tracing::warn!(node_id = peer.broker_id, "broker down"),
                Change::Rejoined(peer) => tracing::warn!(
                    generation = peer.generation,
                    "this broker was declared down (a partition or a pause) and rejoined"
                ),
            }
        }
        let heard = membership
            .members()
            .into_iter()
            .map(|(peer, status)| (peer.broker_id, status))
            .collect();
        let now_ms = broker.clock.now_ms();
        broker.statuses.lock().expect("statuses lock poisoned").publish(heard, now_ms);
        for (to, datagram) in outgoing {
            self.send(&datagram, to).await;
        }
    }
}

/// Whether a name last looked up at `last_ms` (never: `None`) is due another lookup.
fn lookup_due(last_ms: Option<u64>, now_ms: u64) -> bool {
    last_ms.is_none_or(|last_ms| now_ms >= last_ms.saturating_add(RESOLVE_EVERY_MS))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_looked_up_at_most_every_resolve_interval() {
        let cases = [
            // (last looked up, now, due)
            (None, 0, true),
            (Some(1_000), 1_000, false),
            (Some(1_000), 1_000 + RESOLVE_EVERY_MS - 1, false),
            (Some(1_000), 1_000 + RESOLVE_EVERY_MS, true),
            // A clock that stepped back waits out the interval from the last lookup.
            (Some(5_000), 4_000, false),
        ];
        for (last_ms, now_ms, due) in cases {
            assert_eq!(lookup_due(last_ms, now_ms), due, "{last_ms:?} at {now_ms}");
        }
    }

    #[test]
    fn statuses_come_from_membership_once_it_runs() {
        let grace_ms = 5_000;
        let alone = MemberStatuses::default();
        assert_eq!(alone.status(1, 2, 10_000, grace_ms), PeerStatus::Alive);
        let mut statuses = MemberStatuses { started_ms: Some(1_000), ..MemberStatuses::default() };
        let heard = BTreeMap::from([(2, PeerStatus::Alive), (3, PeerStatus::Dead)]);
        statuses.publish(heard, 1_000);
        let cases = [
            // (node, now_ms, status)
            (1, 1_000, PeerStatus::Alive),
            (2, 1_000, PeerStatus::Alive),
            (3, 1_000, PeerStatus::Dead),
            (4, 1_000, PeerStatus::Suspect),
            (4, 5_999, PeerStatus::Suspect),
            (4, 6_000, PeerStatus::Dead),
        ];
        for (node_id, now_ms, expected) in cases {
            assert_eq!(statuses.status(1, node_id, now_ms, grace_ms), expected, "{node_id}");
        }
        // Dead since it was first reported dead; a broker never heard from since the grace
        // time ran out; an alive one not at all, and a revived one forgets its death.
        let dead_for = |statuses: &MemberStatuses, node_id, now_ms| {
            statuses.dead_for_ms(1, node_id, now_ms, grace_ms)
        };
        assert_eq!(dead_for(&statuses, 3, 4_000), 3_000);
        assert_eq!(dead_for(&statuses, 4, 9_000), 3_000);
        assert_eq!(dead_for(&statuses, 2, 9_000), 0);
        statuses.publish(BTreeMap::from([(3, PeerStatus::Alive)]), 5_000);
        statuses.publish(BTreeMap::from([(3, PeerStatus::Dead)]), 8_000);
        assert_eq!(dead_for(&statuses, 3, 9_000), 1_000);
    }
}
