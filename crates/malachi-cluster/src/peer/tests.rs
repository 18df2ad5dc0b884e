use foca::Codec;
use proptest::prelude::*;

use super::*;

fn peer_strategy() -> impl Strategy<Value = Peer> {
    let text = "[a-z0-9.:-]{0,40}";
    (
        any::<[u8; 4]>(),
        any::<u16>(),
        any::<u64>(),
        any::<u64>(),
        text,
        text,
        prop::collection::btree_map("[a-z]{1,8}", "[a-z0-9-]{0,12}", 0..4),
    )
        .prop_map(
            |(ip, port, generation, broker_id, cluster_addr, client_addr, attributes)| Peer {
                gossip_addr: SocketAddr::from((ip, port)),
                generation,
                broker_id,
                cluster_addr,
                client_addr,
                attributes,
            },
        )
}

fn message_strategy() -> impl Strategy<Value = Message<Peer>> {
    (0u8..=10, any::<u8>(), peer_strategy()).prop_map(|(tag, probe_number, peer)| match tag {
        0 => Message::Ping(probe_number),
        1 => Message::Ack(probe_number),
        2 => Message::PingReq { target: peer, probe_number },
        3 => Message::IndirectPing { origin: peer, probe_number },
        4 => Message::IndirectAck { target: peer, probe_number },
        5 => Message::ForwardedAck { origin: peer, probe_number },
        6 => Message::Announce,
        7 => Message::Feed,
        8 => Message::Gossip,
        9 => Message::Broadcast,
        _ => Message::TurnUndead,
    })
}

proptest! {
    #[test]
    fn headers_and_members_round_trip(
        src in peer_strategy(),
        dst in peer_strategy(),
        src_incarnation in any::<u16>(),
        message in message_strategy(),
        state in 0u8..3,
    ) {
        let header = Header { src: src.clone(), src_incarnation, dst, message };
        let mut bytes = Vec::new();
        PeerCodec.encode_header(&header, &mut bytes).unwrap();
        prop_assert_eq!(PeerCodec.decode_header(&bytes[..]).unwrap(), header);
        let state = [State::Alive, State::Suspect, State::Down][usize::from(state)];
        let member = Member::new(src, src_incarnation, state);
        let mut bytes = Vec::new();
        PeerCodec.encode_member(&member, &mut bytes).unwrap();
        prop_assert_eq!(PeerCodec.decode_member(&bytes[..]).unwrap(), member);
    }

    /// Any prefix of a datagram, or any bytes at all, decode to an error or a value: never a
    /// panic, never a read past the end.
    #[test]
    fn truncated_or_random_bytes_are_refused_cleanly(
        src in peer_strategy(),
        message in message_strategy(),
        cut in any::<prop::sample::Index>(),
        noise in prop::collection::vec(any::<u8>(), 0..200),
    ) {
        let header = Header { src: src.clone(), src_incarnation: 1, dst: src, message };
        let mut bytes = Vec::new();
        PeerCodec.encode_header(&header, &mut bytes).unwrap();
        let cut = cut.index(bytes.len());
        prop_assert_eq!(PeerCodec.decode_header(&bytes[..cut]), Err(CodecError::Truncated));
        let _ = PeerCodec.decode_header(&noise[..]);
        let _ = PeerCodec.decode_member(&noise[..]);
    }
}

#[test]
fn oversized_peers_are_refused_before_anything_is_written() {
    let mut long = Peer::seed(SocketAddr::from(([10, 0, 0, 1], 45892)));
    long.client_addr = "x".repeat(PEER_TEXT_BYTES_MAX + 1);
    let mut crowded = Peer::seed(SocketAddr::from(([10, 0, 0, 1], 45892)));
    crowded.attributes =
        (0..=PEER_ATTRIBUTES_MAX).map(|at| (format!("a{at}"), String::new())).collect();
    let cases = [
        (long, CodecError::TooLong { bytes: PEER_TEXT_BYTES_MAX + 1 }),
        (crowded, CodecError::TooManyAttributes { count: PEER_ATTRIBUTES_MAX + 1 }),
    ];
    for (peer, expected) in cases {
        let mut bytes = Vec::new();
        assert_eq!(PeerCodec.encode_member(&Member::alive(peer), &mut bytes), Err(expected));
    }
}

#[test]
fn a_later_generation_wins_its_address_and_renewal_raises_it() {
    let first =
        Peer { broker_id: 7, generation: 1, ..Peer::seed(SocketAddr::from(([10, 0, 0, 7], 1))) };
    let renewed = first.renew().unwrap();
    assert_eq!(renewed.generation, 2);
    assert!(renewed.win_addr_conflict(&first));
    assert!(!first.win_addr_conflict(&renewed));
    assert!(
        first.win_addr_conflict(&Peer::seed(first.gossip_addr)),
        "a broker beats its seed entry"
    );
}
