//! Fuzzes what a broker does with a datagram on its gossip port: the seal is opened first
//! (`malachi-transport`'s `gossip_seal.rs`), and what opens is handed to SWIM
//! (`malachi-cluster`'s membership, foca and the peer codec).
//!
//! What must hold, whatever the bytes:
//! * no panic in opening, nor in membership reading a datagram a member sealed (members are
//!   trusted with the key, not with well-formed bytes);
//! * nothing the fuzzer makes opens under the cluster's key unless it sealed it: the input
//!   itself never opens (forging takes the key), while the input sealed opens to itself.
//!
//! Input: any bytes, read as a datagram.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use malachi_cluster::{Membership, MembershipConfig, Peer};
use malachi_transport::gossip_seal::GossipSeal;

const TOKEN: &str = "fuzz-cluster-token-0123456789abcdef";

fn seal() -> &'static GossipSeal {
    static SEAL: OnceLock<GossipSeal> = OnceLock::new();
    SEAL.get_or_init(|| GossipSeal::from_tokens(&[TOKEN]))
}

fuzz_target!(|input: &[u8]| {
    let seal = seal();
    assert_eq!(seal.open(input), None, "bytes the fuzzer made opened under the key");
    let sealed = seal.seal(input, [9; 12]);
    assert_eq!(seal.open(&sealed).as_deref(), Some(input), "a sealed datagram did not open");

    let me = Peer {
        gossip_addr: "127.0.0.1:45892".parse().expect("an address"),
        generation: 1,
        broker_id: 1,
        cluster_addr: "127.0.0.1:4042".into(),
        client_addr: "127.0.0.1:4040".into(),
        attributes: Default::default(),
    };
    let mut membership =
        Membership::new(me, 7, 1_000, &MembershipConfig::default()).expect("a valid identity");
    let _ = membership.handle_datagram(input);
    membership.advance_to(10_000);
});
