//! Who may enter membership. Every datagram is screened here before foca reads it, so the
//! member table only ever holds registered brokers, each at its registered gossip address,
//! with a generation no further ahead than this broker's clock allows.
//!
//! The sealing of datagrams (the cluster's AEAD key) keeps strangers out; this keeps a key
//! holder, or anyone at all when gossip runs unsealed, from inventing brokers, moving a broker
//! to another address, or superseding a broker's live identity with a made-up generation
//! (one forged announce with generation 2^63 used to hold a live broker dead for a day).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use bytes::{Buf, BufMut};
use foca::{Codec, Message};

use crate::peer::{CodecError, Peer, PeerCodec};

/// How far ahead of this broker's clock a generation may be. A broker's first generation is
/// its clock at start (each rejoin adds one), so this is the clock skew between brokers that
/// membership tolerates; a generation further ahead is refused.
pub const GENERATION_AHEAD_MS_MAX: u64 = 10 * 60 * 1_000;
/// The most members (gossip addresses) the table holds. foca keeps one member per address,
/// and with a roster only registered brokers' addresses enter, so this bounds the unscreened
/// case (no roster yet) and matches the registry's own limit.
pub const MEMBERS_MAX: usize = 1_024;

/// The registered brokers, by node id, at their registered gossip addresses (resolved).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Roster {
    addresses: BTreeMap<u64, SocketAddr>,
}

impl Roster {
    pub fn new(addresses: BTreeMap<u64, SocketAddr>) -> Roster {
        Roster { addresses }
    }
}

/// Why a broker identity was kept out of membership.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("broker {broker_id} is not registered")]
    Unregistered { broker_id: u64 },
    #[error("broker {broker_id} gossips from {claimed}, but is registered at {registered}")]
    WrongAddress { broker_id: u64, claimed: SocketAddr, registered: SocketAddr },
    #[error(
        "generation {generation} is more than {GENERATION_AHEAD_MS_MAX} ms ahead of this broker's clock ({now_ms} ms)"
    )]
    GenerationAhead { generation: u64, now_ms: u64 },
    #[error("the member table already holds {MEMBERS_MAX} members")]
    TableFull,
}

/// What a datagram is screened against.
pub(super) struct Screen<'a> {
    /// `None`: no registry known yet, so only the generation and table bounds apply.
    pub roster: Option<&'a Roster>,
    /// Gossip addresses already in the member table.
    pub members: &'a BTreeSet<SocketAddr>,
    pub now_ms: u64,
}

/// Why a datagram was not handed to foca.
#[derive(Debug)]
pub(super) enum Screened {
    Malformed(CodecError),
    Refused(Refusal),
}

impl Screen<'_> {
    /// Whether `peer` may be in membership.
    fn admits(&self, peer: &Peer) -> Result<(), Refusal> {
        let ahead_max = self.now_ms.saturating_add(GENERATION_AHEAD_MS_MAX);
        if peer.generation > ahead_max {
            return Err(Refusal::GenerationAhead {
                generation: peer.generation,
                now_ms: self.now_ms,
            });
        }
        if let Some(roster) = self.roster {
            let broker_id = peer.broker_id;
            let Some(&registered) = roster.addresses.get(&broker_id) else {
                return Err(Refusal::Unregistered { broker_id });
            };
            if registered != peer.gossip_addr {
                let claimed = peer.gossip_addr;
                return Err(Refusal::WrongAddress { broker_id, claimed, registered });
            }
        }
        if !self.members.contains(&peer.gossip_addr) && self.members.len() >= MEMBERS_MAX {
            return Err(Refusal::TableFull);
        }
        Ok(())
    }

    /// Screens `datagram`: refused whole when its sender, or the broker its message names, may
    /// not be heard; otherwise handed on with every member update this screen refuses taken
    /// out (as it came when none was). The receiver (the header's destination) is foca's to
    /// check: it is this broker, or a seed address placeholder.
    pub fn datagram<'d>(&self, datagram: &'d [u8]) -> Result<Cow<'d, [u8]>, Screened> {
        let mut rest = datagram;
        let header = PeerCodec.decode_header(&mut rest).map_err(Screened::Malformed)?;
        self.admits(&header.src).map_err(Screened::Refused)?;
        if let Some(named) = named_peer(&header.message) {
            self.admits(named).map_err(Screened::Refused)?;
        }
        // foca reads a member list after every header but a broadcast's when two or more
        // bytes follow (a count, big-endian, then the members); anything else it judges.
        if rest.len() < 2 || header.message == Message::Broadcast {
            return Ok(Cow::Borrowed(datagram));
        }
        let header_bytes = &datagram[..datagram.len() - rest.len()];
        // The count is the sender's word: nothing is reserved for it, and a count the bytes
        // do not hold ends in a truncated member.
        let count = rest.get_u16();
        let mut kept = Vec::new();
        let mut refused = 0usize;
        for _ in 0..count {
            let member = PeerCodec.decode_member(&mut rest).map_err(Screened::Malformed)?;
            match self.admits(member.id()) {
                Ok(()) => kept.push(member),
                Err(_) => refused += 1,
            }
        }
        if refused == 0 {
            return Ok(Cow::Borrowed(datagram));
        }
        let mut rebuilt = Vec::with_capacity(datagram.len());
        rebuilt.extend_from_slice(header_bytes);
        rebuilt.put_u16(u16::try_from(kept.len()).expect("fewer than were counted"));
        for member in &kept {
            PeerCodec.encode_member(member, &mut rebuilt).map_err(Screened::Malformed)?;
        }
        rebuilt.extend_from_slice(rest);
        Ok(Cow::Owned(rebuilt))
    }
}

/// The broker a probe message names besides its sender and receiver.
fn named_peer(message: &Message<Peer>) -> Option<&Peer> {
    match message {
        Message::PingReq { target, .. } | Message::IndirectAck { target, .. } => Some(target),
        Message::IndirectPing { origin, .. } | Message::ForwardedAck { origin, .. } => Some(origin),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use foca::{Header, Member, State};

    use super::*;

    fn address(node: u8) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, node], 45892))
    }

    fn peer(broker_id: u8, at: u8, generation: u64) -> Peer {
        Peer { generation, broker_id: u64::from(broker_id), ..Peer::seed(address(at)) }
    }

    fn encode(src: Peer, message: Message<Peer>, updates: &[Member<Peer>]) -> Vec<u8> {
        let mut datagram = Vec::new();
        let header = Header { src, src_incarnation: 0, dst: Peer::seed(address(1)), message };
        PeerCodec.encode_header(&header, &mut datagram).expect("small");
        if !updates.is_empty() {
            datagram.put_u16(updates.len() as u16);
            for member in updates {
                PeerCodec.encode_member(member, &mut datagram).expect("small");
            }
        }
        datagram
    }

    fn encode_member_bytes(member: &Member<Peer>) -> usize {
        let mut bytes = Vec::new();
        PeerCodec.encode_member(member, &mut bytes).expect("small");
        bytes.len()
    }

    fn decode_updates(datagram: &[u8]) -> Vec<u64> {
        let mut rest = datagram;
        PeerCodec.decode_header(&mut rest).expect("a header");
        let count = rest.get_u16();
        (0..count)
            .map(|_| PeerCodec.decode_member(&mut rest).expect("a member").id().broker_id)
            .collect()
    }

    const NOW_MS: u64 = 1_000_000;

    /// A sender (or the broker a probe names) is screened whole; each case: the sender, then
    /// the refusal expected, if any.
    #[test]
    fn only_registered_brokers_at_their_addresses_with_a_near_generation_are_heard() {
        let roster = Roster::new(BTreeMap::from([(2, address(2)), (3, address(3))]));
        let members = BTreeSet::from([address(2), address(3)]);
        let screen = Screen { roster: Some(&roster), members: &members, now_ms: NOW_MS };
        let cases = [
            (peer(2, 2, NOW_MS), None),
            (peer(2, 2, NOW_MS + GENERATION_AHEAD_MS_MAX), None),
            (
                peer(2, 2, 1 << 63),
                Some(Refusal::GenerationAhead { generation: 1 << 63, now_ms: NOW_MS }),
            ),
            (
                peer(2, 2, NOW_MS + GENERATION_AHEAD_MS_MAX + 1),
                Some(Refusal::GenerationAhead {
                    generation: NOW_MS + GENERATION_AHEAD_MS_MAX + 1,
                    now_ms: NOW_MS,
                }),
            ),
            (peer(9, 9, 1), Some(Refusal::Unregistered { broker_id: 9 })),
            (peer(0, 2, 0), Some(Refusal::Unregistered { broker_id: 0 })),
            (
                peer(2, 3, 5),
                Some(Refusal::WrongAddress {
                    broker_id: 2,
                    claimed: address(3),
                    registered: address(2),
                }),
            ),
        ];
        for (sender, expected) in cases {
            let as_sender = encode(sender.clone(), Message::Announce, &[]);
            let named = Message::PingReq { target: sender.clone(), probe_number: 1 };
            let as_target = encode(peer(3, 3, 1), named, &[]);
            for datagram in [as_sender, as_target] {
                let refused = match screen.datagram(&datagram) {
                    Ok(passed) => {
                        assert_eq!(&passed[..], &datagram[..], "{sender:?} passes unchanged");
                        None
                    }
                    Err(Screened::Refused(refusal)) => Some(refusal),
                    Err(Screened::Malformed(error)) => panic!("{sender:?}: {error}"),
                };
                assert_eq!(refused, expected, "{sender:?}");
            }
        }
    }

    #[test]
    fn refused_updates_are_taken_out_and_the_rest_are_kept() {
        let roster = Roster::new(BTreeMap::from([(2, address(2)), (3, address(3))]));
        let members = BTreeSet::from([address(2), address(3)]);
        let screen = Screen { roster: Some(&roster), members: &members, now_ms: NOW_MS };
        let updates = [
            Member::new(peer(3, 3, 7), 0, State::Alive),
            Member::new(peer(3, 3, 1 << 63), 0, State::Down),
            Member::new(peer(9, 9, 1), 0, State::Alive),
            Member::new(peer(2, 3, 8), 0, State::Down),
            Member::new(peer(2, 2, 8), 1, State::Suspect),
        ];
        let datagram = encode(peer(2, 2, 8), Message::Gossip, &updates);
        let passed = screen.datagram(&datagram).expect("the sender is heard");
        assert_eq!(decode_updates(&passed), [3, 2]);
        // Nothing refused: handed on as it came.
        let clean = encode(peer(2, 2, 8), Message::Gossip, &updates[..1]);
        assert!(matches!(screen.datagram(&clean), Ok(Cow::Borrowed(_))));
        // Malformed is told apart from refused; a count of members the bytes do not hold is
        // malformed, whatever it claims.
        let truncated = &datagram[..datagram.len() - 1];
        assert!(matches!(screen.datagram(truncated), Err(Screened::Malformed(_))));
        let mut inflated = encode(peer(2, 2, 8), Message::Gossip, &updates[..1]);
        let header_bytes = inflated.len() - encode_member_bytes(&updates[0]) - 2;
        inflated[header_bytes..header_bytes + 2].copy_from_slice(&u16::MAX.to_be_bytes());
        assert!(matches!(screen.datagram(&inflated), Err(Screened::Malformed(_))));
    }

    #[test]
    fn without_a_roster_the_table_is_still_capped() {
        let members: BTreeSet<SocketAddr> = (0..MEMBERS_MAX as u32)
            .map(|n| SocketAddr::from(([10, 1, (n >> 8) as u8, n as u8], 45892)))
            .collect();
        let screen = Screen { roster: None, members: &members, now_ms: NOW_MS };
        let known = Peer { generation: 1, broker_id: 5, ..Peer::seed(*members.first().unwrap()) };
        let new = peer(6, 6, 1);
        assert!(screen.datagram(&encode(known, Message::Announce, &[])).is_ok());
        let datagram = encode(new, Message::Announce, &[]);
        let refused = screen.datagram(&datagram);
        assert!(matches!(refused, Err(Screened::Refused(Refusal::TableFull))));
    }
}
