//! The peer codec: every call survives its encoding, has exactly one encoding, and a damaged
//! or unknown one is refused by name, never misread.

use malachi_consensus::MessageKind;
use malachi_log::SealInfo;
use malachi_meta::BrokerRecord;
use malachi_transport::{Request, Service};
use proptest::prelude::*;

use super::records::tests::record;
use super::*;

fn key() -> impl Strategy<Value = SegmentKey> {
    (any::<u64>(), any::<u32>(), any::<u64>())
        .prop_map(|(topic_id, range_id, segment_id)| SegmentKey { topic_id, range_id, segment_id })
}

fn data_call() -> impl Strategy<Value = DataCall> {
    let records = || proptest::collection::vec(record(), 0..6);
    let read = || (any::<u64>(), any::<u32>(), any::<u64>());
    prop_oneof![
        records().prop_map(|records| DataCall::Append { records }),
        read().prop_map(|(from, wanted, bytes_max)| DataCall::Read { from, wanted, bytes_max }),
        Just(DataCall::End),
        Just(DataCall::Seal),
        Just(DataCall::Create),
        (any::<u64>(), any::<u64>(), records()).prop_map(|(start, acked_end, records)| {
            DataCall::Replicate { start, acked_end, records }
        }),
        Just(DataCall::Fence),
        (any::<u64>(), any::<u64>()).prop_map(|(source, end)| DataCall::Fill { source, end }),
        any::<u64>().prop_map(|end| DataCall::SealAt { end }),
        read().prop_map(|(from, wanted, bytes_max)| DataCall::ReadRaw { from, wanted, bytes_max }),
        (any::<u64>(), any::<u64>(), proptest::collection::vec(any::<u64>(), 0..6)).prop_map(
            |(end_offset, data_bytes, sources)| DataCall::Settle {
                seal: SealInfo { end_offset, data_bytes },
                sources,
            }
        ),
        Just(DataCall::CopyState),
    ]
}

fn text() -> impl Strategy<Value = String> {
    "[a-z0-9.:]{0,24}"
}

fn call() -> impl Strategy<Value = PeerCall> {
    let kinds = [
        MessageKind::AppendEntries,
        MessageKind::Vote,
        MessageKind::PreVote,
        MessageKind::FullSnapshot,
        MessageKind::ClientWrite,
        MessageKind::ReadIndex,
        MessageKind::TransferLeader,
    ];
    let ask =
        prop_oneof![
            (any::<u64>(), any::<u32>())
                .prop_map(|(topic_id, range_id)| Ask::Roll { topic_id, range_id }),
            (any::<u64>(), proptest::collection::vec(any::<(u64, u32, u64, u64)>(), 0..4))
                .prop_map(|(reporter, rates)| Ask::Load { reporter, rates }),
            (any::<u64>(), any::<u32>())
                .prop_map(|(topic_id, range_id)| Ask::Split { topic_id, range_id }),
            (any::<u64>(), any::<u32>(), any::<u32>())
                .prop_map(|(topic_id, left, right)| Ask::Merge { topic_id, left, right }),
        ];
    prop_oneof![
        (any::<u64>(), proptest::sample::select(kinds.to_vec()), any::<Vec<u8>>())
            .prop_map(|(group_id, kind, body)| PeerCall::Raft { group_id, kind, body }),
        Just(PeerCall::Welcome),
        (any::<u64>(), text(), text()).prop_map(|(node_id, address, attribute)| {
            PeerCall::Join(BrokerRecord {
                node_id,
                cluster_address: address.clone(),
                client_address: address.clone(),
                attributes: [("zone".to_string(), attribute)].into_iter().collect(),
                gossip_address: address,
            })
        }),
        (any::<u64>(), any::<u64>(), text()).prop_map(|(group_id, node_id, cluster_address)| {
            PeerCall::AddMember(AddMember { group_id, node_id, cluster_address })
        }),
        (any::<u64>(), ask).prop_map(|(group_id, ask)| PeerCall::Coordinate { group_id, ask }),
        (any::<u64>(), text(), any::<[u8; 32]>()).prop_map(|(node_id, cluster_address, proof)| {
            PeerCall::Enroll(EnrollRequest { node_id, cluster_address, proof })
        }),
        any::<bool>().prop_map(|draining| PeerCall::Draining { draining }),
        any::<bool>().prop_map(|draining| PeerCall::HandOver { draining }),
        (key(), data_call()).prop_map(|(key, call)| PeerCall::Data { key, call }),
    ]
}

fn data_request(kind: u8, payload: Vec<u8>) -> Request {
    Request { service: Service::Data, group_id: 0, kind, payload }
}

proptest! {
    #[test]
    fn every_call_survives_its_encoding(call in call()) {
        let request = call.encode();
        prop_assert_eq!(PeerCall::decode(request.clone()).unwrap(), call.clone());
        // The enrollment, and nothing else, is what a stranger's request may carry.
        let enrollment = PeerCall::decode_enrollment(request);
        prop_assert_eq!(enrollment.is_some(), matches!(call, PeerCall::Enroll(_)));
    }

    /// A data call has exactly one encoding: every strict prefix and every extra byte is
    /// refused.
    #[test]
    fn a_data_call_has_one_encoding(key in key(), call in data_call(), extra in any::<u8>()) {
        let request = PeerCall::Data { key, call }.encode();
        for cut in 0..request.payload.len() {
            let cut = data_request(request.kind, request.payload[..cut].to_vec());
            prop_assert!(PeerCall::decode(cut).is_err());
        }
        let mut longer = request.payload.clone();
        longer.push(extra);
        prop_assert!(PeerCall::decode(data_request(request.kind, longer)).is_err());
    }
}

#[test]
fn kinds_are_one_table() {
    // The wire values: a change here breaks every broker of the previous release.
    let cases: [(DataCall, u8, &str); 12] = [
        (DataCall::Append { records: Vec::new() }, 1, "append"),
        (DataCall::Read { from: 0, wanted: 0, bytes_max: 0 }, 2, "read"),
        (DataCall::End, 3, "end"),
        (DataCall::Seal, 4, "seal"),
        (DataCall::Create, 5, "create"),
        (DataCall::Replicate { start: 0, acked_end: 0, records: Vec::new() }, 6, "replicate"),
        (DataCall::Fence, 7, "fence"),
        (DataCall::Fill { source: 0, end: 0 }, 8, "fill"),
        (DataCall::SealAt { end: 0 }, 9, "seal-at"),
        (DataCall::ReadRaw { from: 0, wanted: 0, bytes_max: 0 }, 10, "read-raw"),
        (
            DataCall::Settle { seal: SealInfo { end_offset: 0, data_bytes: 0 }, sources: vec![] },
            11,
            "settle",
        ),
        (DataCall::CopyState, 12, "copy-state"),
    ];
    let key = SegmentKey { topic_id: 1, range_id: 2, segment_id: 3 };
    for (call, kind, name) in cases {
        let request = PeerCall::Data { key, call }.encode();
        assert_eq!((request.service, request.kind), (Service::Data, kind), "{name}");
        assert_eq!(PeerCall::decode(request).unwrap().name(), name);
    }
    let cluster = [
        (PeerCall::Welcome, 1),
        (PeerCall::Coordinate { group_id: 9, ask: Ask::Roll { topic_id: 1, range_id: 0 } }, 4),
        (PeerCall::Coordinate { group_id: 9, ask: Ask::Load { reporter: 1, rates: vec![] } }, 5),
        (PeerCall::Coordinate { group_id: 9, ask: Ask::Split { topic_id: 1, range_id: 0 } }, 6),
        (PeerCall::Draining { draining: true }, 8),
        (PeerCall::HandOver { draining: false }, 9),
    ];
    for (call, kind) in cluster {
        let request = call.encode();
        assert_eq!((request.service, request.kind), (Service::Cluster, kind), "{call:?}");
    }
}

#[test]
fn a_golden_data_call() {
    // A fill of segment (1, 2, 3) up to 7 from broker 5, byte for byte.
    let key = SegmentKey { topic_id: 1, range_id: 2, segment_id: 3 };
    let request = PeerCall::Data { key, call: DataCall::Fill { source: 5, end: 7 } }.encode();
    let mut expected = Vec::new();
    expected.extend_from_slice(&1u64.to_le_bytes());
    expected.extend_from_slice(&2u32.to_le_bytes());
    expected.extend_from_slice(&3u64.to_le_bytes());
    expected.extend_from_slice(&5u64.to_le_bytes());
    expected.extend_from_slice(&7u64.to_le_bytes());
    assert_eq!(request.payload, expected);
}

#[test]
fn malformed_calls_are_refused_by_name() {
    let key = [0u8; KEY_BYTES];
    let cases: Vec<(&str, Request, PeerCallError)> = vec![
        (
            "unknown data kind",
            data_request(13, key.to_vec()),
            PeerCallError::UnknownKind { service: Service::Data, kind: 13 },
        ),
        (
            "unknown cluster kind",
            Request { service: Service::Cluster, group_id: 0, kind: 99, payload: vec![] },
            PeerCallError::UnknownKind { service: Service::Cluster, kind: 99 },
        ),
        (
            "unknown Raft kind",
            Request { service: Service::Raft, group_id: 0, kind: 0, payload: vec![] },
            PeerCallError::UnknownKind { service: Service::Raft, kind: 0 },
        ),
        ("short key", data_request(3, vec![0; 19]), PeerCallError::Truncated("data")),
        (
            "bytes after an end",
            data_request(3, [&key[..], &[1]].concat()),
            PeerCallError::Trailing { call: "end", bytes: 1 },
        ),
        (
            "welcome with a body",
            Request { service: Service::Cluster, group_id: 0, kind: 1, payload: vec![b'{'] },
            PeerCallError::Trailing { call: "welcome", bytes: 1 },
        ),
    ];
    for (name, request, expected) in cases {
        assert_eq!(PeerCall::decode(request).unwrap_err(), expected, "{name}");
    }
    // A settle that declares more sources than it carries reserves nothing for them.
    let mut settle = key.to_vec();
    settle.extend_from_slice(&[0; 16]);
    settle.push(255);
    let refused = PeerCall::decode(data_request(11, settle)).unwrap_err();
    assert!(refused.to_string().contains("255 sources declared"), "{refused}");
    // A call whose kind disagrees with what it carries.
    let roll = PeerCall::Coordinate { group_id: 1, ask: Ask::Roll { topic_id: 1, range_id: 0 } };
    let mut request = roll.encode();
    request.kind = 6;
    assert!(matches!(PeerCall::decode(request), Err(PeerCallError::Malformed { .. })));
    let add =
        PeerCall::AddMember(AddMember { group_id: 4, node_id: 2, cluster_address: "a".into() });
    let mut request = add.encode();
    request.group_id = 5;
    assert!(matches!(PeerCall::decode(request), Err(PeerCallError::Malformed { .. })));
    // Calls that name no group refuse one, so that no call has two encodings (found by the
    // peer_frame fuzz target: a data call's group id was ignored).
    let fence = PeerCall::Data {
        key: SegmentKey { topic_id: 1, range_id: 0, segment_id: 2 },
        call: DataCall::Fence,
    };
    for call in [PeerCall::Welcome, fence] {
        let mut request = call.encode();
        request.group_id = 1;
        assert!(matches!(PeerCall::decode(request), Err(PeerCallError::Malformed { .. })));
    }
}
