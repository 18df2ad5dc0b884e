//! Clusters of [`Membership`]s on a simulated network, one thread, one seed: datagrams are
//! delivered after a seeded 1-3 ms, brokers are killed, restarted and cut off.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use super::*;

const GOSSIP_PORT: u16 = 45892;

fn address(node: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, node as u8 + 1], GOSSIP_PORT))
}

fn peer(node: usize, generation: u64) -> Peer {
    Peer {
        gossip_addr: address(node),
        generation,
        broker_id: node as u64 + 1,
        cluster_addr: format!("10.0.0.{}:4042", node + 1),
        client_addr: format!("10.0.0.{}:4040", node + 1),
        attributes: BTreeMap::from([("zone".to_string(), format!("z{}", node % 2))]),
    }
}

struct Cluster {
    nodes: Vec<Option<Membership>>,
    /// Datagrams by delivery time, then send order: (to, bytes).
    in_flight: BTreeMap<(u64, u64), (usize, Vec<u8>)>,
    sent: u64,
    /// (from, to) pairs whose datagrams are dropped.
    cut: BTreeSet<(usize, usize)>,
    now_ms: u64,
    seed: u64,
    rng: u64,
    /// Every change any node reported: (time, node, change).
    log: Vec<(u64, usize, Change)>,
}

impl Cluster {
    /// `size` brokers; the first starts alone, the others join through its address.
    fn start(size: usize, seed: u64) -> Cluster {
        let mut cluster = Cluster {
            nodes: (0..size).map(|_| None).collect(),
            in_flight: BTreeMap::new(),
            sent: 0,
            cut: BTreeSet::new(),
            now_ms: 0,
            seed,
            rng: seed,
            log: Vec::new(),
        };
        for node in 0..size {
            cluster.boot(node, 1);
        }
        cluster
    }

    fn boot(&mut self, node: usize, generation: u64) {
        let seed = self.seed ^ (node as u64) << 32 ^ generation;
        let config = MembershipConfig::default();
        let mut membership = Membership::new(peer(node, generation), seed, self.now_ms, &config)
            .expect("test peers are small");
        membership.join(&[address(0)]);
        self.nodes[node] = Some(membership);
    }

    fn kill(&mut self, node: usize) {
        self.nodes[node] = None;
    }

    fn cut_off(&mut self, node: usize) {
        for other in 0..self.nodes.len() {
            self.cut.insert((node, other));
            self.cut.insert((other, node));
        }
    }

    fn delay_ms(&mut self) -> u64 {
        self.rng = self.rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        1 + (self.rng >> 33) % 3
    }

    fn step(&mut self) {
        self.now_ms += 1;
        let due: Vec<(u64, u64)> =
            self.in_flight.range(..=(self.now_ms, u64::MAX)).map(|(key, _)| *key).collect();
        for key in due {
            let (to, data) = self.in_flight.remove(&key).expect("listed");
            if let Some(node) = self.nodes[to].as_mut() {
                // Refused datagrams (from ourselves, stale) are SWIM's business, not a failure.
                let _ = node.handle_datagram(&data);
            }
        }
        for from in 0..self.nodes.len() {
            let Some(node) = self.nodes[from].as_mut() else { continue };
            node.advance_to(self.now_ms);
            let outgoing = node.take_outgoing();
            let changes = node.take_changes();
            for change in changes {
                self.log.push((self.now_ms, from, change));
            }
            for (to_address, data) in outgoing {
                let to =
                    (0..self.nodes.len()).find(|&at| address(at) == to_address).expect("a node");
                if self.cut.contains(&(from, to)) {
                    continue;
                }
                let at = self.now_ms + self.delay_ms();
                self.in_flight.insert((at, self.sent), (to, data));
                self.sent += 1;
            }
        }
    }

    /// Runs until `done` holds (checked every 10 ms) or `limit_ms` pass; the time it took.
    fn run_until(&mut self, limit_ms: u64, mut done: impl FnMut(&Cluster) -> bool) -> Option<u64> {
        let start = self.now_ms;
        while self.now_ms - start < limit_ms {
            self.step();
            if self.now_ms.is_multiple_of(10) && done(self) {
                return Some(self.now_ms - start);
            }
        }
        None
    }

    /// What `observer` thinks of every other broker: id -> (generation, status).
    fn view(&self, observer: usize) -> BTreeMap<u64, (u64, PeerStatus)> {
        let node = self.nodes[observer].as_ref().expect("a live observer");
        node.members()
            .into_iter()
            .map(|(peer, status)| (peer.broker_id, (peer.generation, status)))
            .collect()
    }

    /// Whether every live node except `except` sees `broker` (a node index) with `status`.
    fn all_see(&self, broker: usize, status: PeerStatus, except: &[usize]) -> bool {
        (0..self.nodes.len())
            .filter(|at| *at != broker && !except.contains(at) && self.nodes[*at].is_some())
            .all(|at| {
                self.view(at).get(&(broker as u64 + 1)).is_some_and(|(_, seen)| *seen == status)
            })
    }
}

fn converged(cluster: &Cluster) -> bool {
    (0..cluster.nodes.len()).all(|broker| cluster.all_see(broker, PeerStatus::Alive, &[]))
}

/// Bounds on liveness, generous against the timings (probe 1 s, suspicion 3 s); not speed.
const JOIN_LIMIT_MS: u64 = 10_000;
const DETECT_LIMIT_MS: u64 = 15_000;
const HEAL_LIMIT_MS: u64 = 40_000;

#[test]
fn brokers_joining_through_one_seed_all_see_each_other_with_their_attributes() {
    for seed in 0..5 {
        let mut cluster = Cluster::start(5, seed);
        let took = cluster.run_until(JOIN_LIMIT_MS, converged);
        assert!(took.is_some(), "seed {seed}: no convergence: {:?}", cluster.view(4));
        let members = cluster.nodes[3].as_ref().unwrap().members();
        let seen_1 = &members.iter().find(|(peer, _)| peer.broker_id == 1).unwrap().0;
        assert_eq!(seen_1, &peer(0, 1), "seed {seed}: gossiped as announced");
        assert_eq!(members.len(), 4, "seed {seed}: the others, not ourselves, not the seed entry");
    }
}

#[test]
fn a_dead_broker_is_suspected_then_declared_dead_by_everyone() {
    for seed in 0..5 {
        let mut cluster = Cluster::start(5, seed);
        cluster.run_until(JOIN_LIMIT_MS, converged).expect("converged");
        cluster.kill(4);
        let mut suspected = false;
        let took = cluster.run_until(DETECT_LIMIT_MS, |cluster| {
            suspected |= (0..4).any(|at| cluster.view(at)[&5].1 == PeerStatus::Suspect);
            cluster.all_see(4, PeerStatus::Dead, &[])
        });
        assert!(took.is_some(), "seed {seed}: not declared dead: {:?}", cluster.view(0));
        assert!(suspected, "seed {seed}: declared dead without being suspected first");
        let downs = cluster
            .log
            .iter()
            .filter(|(_, _, change)| matches!(change, Change::Down(p) if p.broker_id == 5));
        assert_eq!(downs.count(), 4, "seed {seed}: each survivor reports the death once");
    }
}

#[test]
fn a_restarted_broker_rejoins_as_the_same_broker() {
    let mut cluster = Cluster::start(4, 11);
    cluster.run_until(JOIN_LIMIT_MS, converged).expect("converged");
    cluster.kill(3);
    cluster
        .run_until(DETECT_LIMIT_MS, |cluster| cluster.all_see(3, PeerStatus::Dead, &[]))
        .expect("dead");
    cluster.boot(3, 2);
    cluster.run_until(JOIN_LIMIT_MS, converged).expect("rejoined");
    for observer in 0..3 {
        assert_eq!(cluster.view(observer)[&4], (2, PeerStatus::Alive), "seen by {observer}");
    }
}

#[test]
fn a_cut_off_broker_and_the_rest_see_each_other_dead_then_heal() {
    let mut cluster = Cluster::start(5, 21);
    cluster.run_until(JOIN_LIMIT_MS, converged).expect("converged");
    cluster.cut_off(2);
    let split = cluster.run_until(DETECT_LIMIT_MS, |cluster| {
        let isolated_sees_all_dead =
            cluster.view(2).values().all(|(_, status)| *status == PeerStatus::Dead);
        cluster.all_see(2, PeerStatus::Dead, &[]) && isolated_sees_all_dead
    });
    assert!(split.is_some(), "majority {:?}, isolated {:?}", cluster.view(0), cluster.view(2));
    let majority_sound =
        [0, 1, 3, 4].iter().all(|&broker| cluster.all_see(broker, PeerStatus::Alive, &[2]));
    assert!(majority_sound, "the majority side still sees itself alive");
    cluster.cut.clear();
    let healed = cluster.run_until(HEAL_LIMIT_MS, converged);
    assert!(healed.is_some(), "not healed: {:?} / {:?}", cluster.view(0), cluster.view(2));
}

#[test]
fn one_seed_replays_the_same_history() {
    let history = |seed| {
        let mut cluster = Cluster::start(4, seed);
        cluster.run_until(JOIN_LIMIT_MS, converged);
        cluster.kill(1);
        cluster.run_until(DETECT_LIMIT_MS, |cluster| cluster.all_see(1, PeerStatus::Dead, &[]));
        cluster.boot(1, 2);
        cluster.run_until(JOIN_LIMIT_MS, converged);
        (cluster.log, cluster.sent)
    };
    assert_eq!(history(5), history(5));
    assert_ne!(history(5).1, history(6).1, "the seed matters");
}

/// Cuts both ways and one-way cuts (a broker hears nothing while the others still hear it),
/// one after another as the chaos drill strikes them: once they end, everyone sees everyone
/// alive. A broker declared down itself has foca discard its suspect-to-down timers; before
/// membership expired suspicions that outlived them, a peer could stay suspect for good.
#[test]
fn every_cut_heals_even_when_a_suspicion_outlives_its_timer() {
    let next =
        |state: u64| state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    for seed in 0..24 {
        let mut cluster = Cluster::start(3, seed);
        cluster.run_until(JOIN_LIMIT_MS, converged).expect("converged");
        let mut rng = next(seed + 1);
        for _ in 0..6 {
            rng = next(rng);
            let node = (rng >> 33) as usize % 3;
            if (rng >> 40) & 1 == 1 {
                cluster
                    .cut
                    .extend((0..3).filter(|&other| other != node).map(|other| (other, node)));
            } else {
                cluster.cut_off(node);
            }
            cluster.run_until(2_000 + (rng >> 20) % 4_000, |_| false);
            cluster.cut.clear();
            cluster.run_until(200 + (rng >> 12) % 2_000, |_| false);
        }
        // As the broker's driver does: every 5 s, announce to the brokers not seen alive.
        let mut healed = false;
        for _ in 0..HEAL_LIMIT_MS / 5_000 {
            for at in 0..3 {
                let view = cluster.view(at);
                let silent: Vec<SocketAddr> = (0..3)
                    .filter(|&other| other != at)
                    .filter(|&other| {
                        view.get(&(other as u64 + 1)).is_none_or(|(_, s)| *s != PeerStatus::Alive)
                    })
                    .map(address)
                    .collect();
                cluster.nodes[at].as_mut().expect("alive").join(&silent);
            }
            if cluster.run_until(5_000, converged).is_some() {
                healed = true;
                break;
            }
        }
        let views: Vec<_> = (0..3).map(|at| cluster.view(at)).collect();
        assert!(healed, "seed {seed}: not healed: {views:?}");
    }
}

/// Forged datagrams, as a key holder or anyone (gossip unsealed) could send them, change
/// nothing once every broker knows the roster: a live broker superseded by a made-up
/// generation (this used to hold it dead for a day), a stranger, a broker at another address.
#[test]
fn forged_identities_do_not_enter_membership() {
    let roster = Roster::new((0..3).map(|node| (node as u64 + 1, address(node))).collect());
    let stranger = Peer { broker_id: 99, ..peer(2, 1) };
    let forgeries = [
        ("a generation of 2^63", peer(1, 1 << 63)),
        ("an unregistered broker", Peer { gossip_addr: address(7), ..stranger.clone() }),
        ("a registered broker at another's address", Peer { broker_id: 2, ..peer(2, 50) }),
    ];
    for (what, forged) in forgeries {
        let mut cluster = Cluster::start(3, 7);
        for node in cluster.nodes.iter_mut().flatten() {
            node.set_roster(roster.clone());
        }
        cluster.run_until(JOIN_LIMIT_MS, converged).expect("converged");
        let before: Vec<_> = (0..3).map(|at| cluster.view(at)).collect();
        let mut datagram = Vec::new();
        let header = foca::Header {
            src: forged.clone(),
            src_incarnation: 0,
            dst: peer(0, 1),
            message: foca::Message::Announce,
        };
        foca::Codec::encode_header(&mut PeerCodec, &header, &mut datagram).expect("small");
        let refused = cluster.nodes[0].as_mut().expect("alive").handle_datagram(&datagram);
        assert!(matches!(refused, Err(MembershipError::Refused(_))), "{what}: {refused:?}");
        cluster.run_until(DETECT_LIMIT_MS, |_| false);
        let after: Vec<_> = (0..3).map(|at| cluster.view(at)).collect();
        assert_eq!(after, before, "{what}: membership changed");
    }
}
