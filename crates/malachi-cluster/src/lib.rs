//! Malachi's cluster layer: how brokers find each other and agree on who is alive.
//!
//! Membership ([`membership::Membership`], SWIM through foca), the gossiped broker identity
//! with its datagram codec ([`peer`]), the quorum replication of a segment from its
//! primary's side ([`replication::Primary`]) and its followers' ([`follower`]), and the failover that seals a segment whose
//! primary is gone ([`failover::Failover`]). Everything here is sans-IO: time, randomness
//! and datagrams come from the caller, so one seed replays a whole cluster in the simulator.
//! This crate must never read a clock, open a socket or draw OS randomness.

pub mod failover;
pub mod follower;
pub mod membership;
pub mod peer;
pub mod replication;

/// A simulator canary's switch as these machines read it: off in every build without the
/// `canaries` feature, which only the simulator (and this crate's own tests) turn on.
#[inline(always)]
pub const fn canary(switch: bool) -> bool {
    cfg!(feature = "canaries") && switch
}

pub use membership::{
    Change, Membership, MembershipConfig, MembershipError, PeerStatus, Refusal, Roster,
};
pub use peer::{CodecError, Peer, PeerCodec};
