//! A broker as membership knows it ([`Peer`], foca's identity), and the binary codec of SWIM
//! datagrams (docs/cluster.md has the layout).
//!
//! Gossip carries only small state: the broker's id, its addresses, its placement attributes
//! and a generation. Every field is bounded ([`PEER_TEXT_BYTES_MAX`],
//! [`PEER_ATTRIBUTES_MAX`]) so that a datagram with several peers stays within one packet.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use bytes::{Buf, BufMut};
use foca::{Header, Identity, Member, Message, State};

/// The longest address or attribute name or value a peer may carry, in bytes.
pub const PEER_TEXT_BYTES_MAX: usize = 255;
/// The most attributes a peer may carry.
pub const PEER_ATTRIBUTES_MAX: usize = 16;

/// A broker in the cluster's membership.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Peer {
    /// Where its SWIM datagrams go; foca tells members apart by it.
    pub gossip_addr: SocketAddr,
    /// Raised each time the broker starts, so that a restarted broker replaces the identity the
    /// cluster may have declared down. 0 for a seed known only by its address.
    pub generation: u64,
    /// The broker id (0 for a seed known only by its address).
    pub broker_id: u64,
    /// `host:port` of its inter-node (Raft, replication) listener.
    pub cluster_addr: String,
    /// `host:port` clients should use.
    pub client_addr: String,
    /// Placement attributes (`rack=a,zone=eu-1`).
    pub attributes: BTreeMap<String, String>,
}

impl Peer {
    /// A seed broker known only by its gossip address, to announce ourselves to.
    pub fn seed(gossip_addr: SocketAddr) -> Peer {
        Peer {
            gossip_addr,
            generation: 0,
            broker_id: 0,
            cluster_addr: String::new(),
            client_addr: String::new(),
            attributes: BTreeMap::new(),
        }
    }

    /// Whether this is a broker that announced itself (not a seed address placeholder).
    pub fn is_broker(&self) -> bool {
        self.broker_id != 0
    }

    /// Checks the bounds a peer must keep to be gossiped.
    pub fn check(&self) -> Result<(), CodecError> {
        let texts = [&self.cluster_addr, &self.client_addr]
            .into_iter()
            .chain(self.attributes.iter().flat_map(|(name, value)| [name, value]));
        for text in texts {
            if text.len() > PEER_TEXT_BYTES_MAX {
                return Err(CodecError::TooLong { bytes: text.len() });
            }
        }
        if self.attributes.len() > PEER_ATTRIBUTES_MAX {
            return Err(CodecError::TooManyAttributes { count: self.attributes.len() });
        }
        Ok(())
    }
}

impl Identity for Peer {
    type Addr = SocketAddr;

    /// A broker that finds itself declared down rejoins under its next generation.
    fn renew(&self) -> Option<Self> {
        Some(Peer { generation: self.generation.wrapping_add(1).max(1), ..self.clone() })
    }

    fn addr(&self) -> SocketAddr {
        self.gossip_addr
    }

    /// Two identities at one address: the later generation is the broker running there now.
    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        (self.generation, self.broker_id) > (adversary.generation, adversary.broker_id)
    }
}

/// Why a datagram could not be decoded (or a peer could not be encoded).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("datagram truncated")]
    Truncated,
    #[error("unknown {what} tag {tag}")]
    UnknownTag { what: &'static str, tag: u8 },
    #[error("text is not UTF-8")]
    NotUtf8,
    #[error("text of {bytes} bytes is longer than {PEER_TEXT_BYTES_MAX}")]
    TooLong { bytes: usize },
    #[error("{count} attributes, more than {PEER_ATTRIBUTES_MAX}")]
    TooManyAttributes { count: usize },
}

/// foca's codec for [`Peer`]s: our own little-endian layout, with no serde format to choose.
#[derive(Clone, Copy, Debug, Default)]
pub struct PeerCodec;

impl foca::Codec<Peer> for PeerCodec {
    type Error = CodecError;

    fn encode_header(
        &mut self,
        header: &Header<Peer>,
        mut buf: impl BufMut,
    ) -> Result<(), Self::Error> {
        encode_peer(&header.src, &mut buf)?;
        buf.put_u16_le(header.src_incarnation);
        encode_peer(&header.dst, &mut buf)?;
        let (tag, probe, peer) = match &header.message {
            Message::Ping(probe) => (0, Some(*probe), None),
            Message::Ack(probe) => (1, Some(*probe), None),
            Message::PingReq { target, probe_number } => (2, Some(*probe_number), Some(target)),
            Message::IndirectPing { origin, probe_number } => {
                (3, Some(*probe_number), Some(origin))
            }
            Message::IndirectAck { target, probe_number } => (4, Some(*probe_number), Some(target)),
            Message::ForwardedAck { origin, probe_number } => {
                (5, Some(*probe_number), Some(origin))
            }
            Message::Announce => (6, None, None),
            Message::Feed => (7, None, None),
            Message::Gossip => (8, None, None),
            Message::Broadcast => (9, None, None),
            Message::TurnUndead => (10, None, None),
        };
        buf.put_u8(tag);
        if let Some(probe) = probe {
            buf.put_u8(probe);
        }
        if let Some(peer) = peer {
            encode_peer(peer, &mut buf)?;
        }
        Ok(())
    }

    fn decode_header(&mut self, mut buf: impl Buf) -> Result<Header<Peer>, Self::Error> {
        let src = decode_peer(&mut buf)?;
        let src_incarnation = take_u16(&mut buf)?;
        let dst = decode_peer(&mut buf)?;
        let tag = take_u8(&mut buf)?;
        let message = match tag {
            0 => Message::Ping(take_u8(&mut buf)?),
            1 => Message::Ack(take_u8(&mut buf)?),
            2..=5 => {
                let probe_number = take_u8(&mut buf)?;
                let peer = decode_peer(&mut buf)?;
                match tag {
                    2 => Message::PingReq { target: peer, probe_number },
                    3 => Message::IndirectPing { origin: peer, probe_number },
                    4 => Message::IndirectAck { target: peer, probe_number },
                    _ => Message::ForwardedAck { origin: peer, probe_number },
                }
            }
            6 => Message::Announce,
            7 => Message::Feed,
            8 => Message::Gossip,
            9 => Message::Broadcast,
            10 => Message::TurnUndead,
            tag => return Err(CodecError::UnknownTag { what: "message", tag }),
        };
        Ok(Header { src, src_incarnation, dst, message })
    }

    fn encode_member(
        &mut self,
        member: &Member<Peer>,
        mut buf: impl BufMut,
    ) -> Result<(), Self::Error> {
        encode_peer(member.id(), &mut buf)?;
        buf.put_u16_le(member.incarnation());
        buf.put_u8(match member.state() {
            State::Alive => 0,
            State::Suspect => 1,
            State::Down => 2,
        });
        Ok(())
    }

    fn decode_member(&mut self, mut buf: impl Buf) -> Result<Member<Peer>, Self::Error> {
        let peer = decode_peer(&mut buf)?;
        let incarnation = take_u16(&mut buf)?;
        let state = match take_u8(&mut buf)? {
            0 => State::Alive,
            1 => State::Suspect,
            2 => State::Down,
            tag => return Err(CodecError::UnknownTag { what: "member state", tag }),
        };
        Ok(Member::new(peer, incarnation, state))
    }
}

fn encode_peer(peer: &Peer, buf: &mut impl BufMut) -> Result<(), CodecError> {
    peer.check()?;
    match peer.gossip_addr.ip() {
        IpAddr::V4(ip) => {
            buf.put_u8(4);
            buf.put_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            buf.put_u8(6);
            buf.put_slice(&ip.octets());
        }
    }
    buf.put_u16_le(peer.gossip_addr.port());
    buf.put_u64_le(peer.generation);
    buf.put_u64_le(peer.broker_id);
    put_text(buf, &peer.cluster_addr);
    put_text(buf, &peer.client_addr);
    buf.put_u8(peer.attributes.len() as u8);
    for (name, value) in &peer.attributes {
        put_text(buf, name);
        put_text(buf, value);
    }
    Ok(())
}

fn decode_peer(buf: &mut impl Buf) -> Result<Peer, CodecError> {
    let ip = match take_u8(buf)? {
        4 => IpAddr::V4(Ipv4Addr::from(take_array::<4>(buf)?)),
        6 => IpAddr::V6(Ipv6Addr::from(take_array::<16>(buf)?)),
        tag => return Err(CodecError::UnknownTag { what: "address family", tag }),
    };
    let gossip_addr = SocketAddr::new(ip, take_u16(buf)?);
    let generation = u64::from_le_bytes(take_array::<8>(buf)?);
    let broker_id = u64::from_le_bytes(take_array::<8>(buf)?);
    let cluster_addr = take_text(buf)?;
    let client_addr = take_text(buf)?;
    let count = usize::from(take_u8(buf)?);
    if count > PEER_ATTRIBUTES_MAX {
        return Err(CodecError::TooManyAttributes { count });
    }
    let mut attributes = BTreeMap::new();
    for _ in 0..count {
        let name = take_text(buf)?;
        attributes.insert(name, take_text(buf)?);
    }
    Ok(Peer { gossip_addr, generation, broker_id, cluster_addr, client_addr, attributes })
}

fn put_text(buf: &mut impl BufMut, text: &str) {
    // Bounded by `Peer::check` before anything is written.
    buf.put_u8(u8::try_from(text.len()).expect("checked"));
    buf.put_slice(text.as_bytes());
}

fn take_text(buf: &mut impl Buf) -> Result<String, CodecError> {
    let length = usize::from(take_u8(buf)?);
    if buf.remaining() < length {
        return Err(CodecError::Truncated);
    }
    let mut bytes = vec![0u8; length];
    buf.copy_to_slice(&mut bytes);
    String::from_utf8(bytes).map_err(|_| CodecError::NotUtf8)
}

fn take_u8(buf: &mut impl Buf) -> Result<u8, CodecError> {
    Ok(take_array::<1>(buf)?[0])
}

fn take_u16(buf: &mut impl Buf) -> Result<u16, CodecError> {
    Ok(u16::from_le_bytes(take_array::<2>(buf)?))
}

fn take_array<const N: usize>(buf: &mut impl Buf) -> Result<[u8; N], CodecError> {
    if buf.remaining() < N {
        return Err(CodecError::Truncated);
    }
    let mut bytes = [0u8; N];
    buf.copy_to_slice(&mut bytes);
    Ok(bytes)
}

#[cfg(test)]
mod tests;
