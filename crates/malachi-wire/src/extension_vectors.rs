//! Golden vectors for Malachi's own keys 64–74, one request and one ok answer each, in the
//! notation of section 6 (`docs/protocol.md` repeats them). Computed by a small independent
//! Python encoder written from the layouts in `docs/protocol.md`; they pin the bytes so the
//! server, the client and the document cannot drift apart.

use bytes::{Bytes, BytesMut};

use crate::api_key::ApiKey;
use crate::frame::split_frame;
use crate::limits::FRAME_BYTES_MAX_DEFAULT;
use crate::messages::*;
use crate::reason::Reason;
use crate::request::{Request, RequestFrame};
use crate::response::{Expect, Response, ResponseEnvelope, ResponseFrame};
use crate::vectors::{hex, timestamp};

enum Golden {
    Request(RequestFrame),
    Response(ResponseFrame, Expect),
}

fn orders() -> Option<Bytes> {
    Some(Bytes::from_static(b"orders"))
}

fn g1() -> Option<Bytes> {
    Some(Bytes::from_static(b"g1"))
}

/// E19: group g1 on `orders`, last committed at `TS`: range 0 (sealed) drained, range 1 at 7
/// of 10, range 2 not reached yet with 3 records.
fn lag_described() -> GroupLagResponse {
    let range = |range_id, state, standing, position, end, lag| RangeLagDescription {
        range_id,
        state,
        standing,
        position,
        end,
        lag,
    };
    let ranges = vec![
        range(0, RangeState::Sealed, LagStanding::Drained, 0, 10, 0),
        range(1, RangeState::Active, LagStanding::At, 7, 10, 3),
        range(2, RangeState::Active, LagStanding::Ahead, 0, 3, 3),
    ];
    let group = GroupLagDescription { group: g1(), total: 6, updated_ms: timestamp(0), ranges };
    GroupLagResponse { topic: orders(), groups: vec![group] }
}

fn request(corr: u32, request: Request) -> Golden {
    Golden::Request(RequestFrame::new(corr, request))
}

fn ok(corr: u32, response: Response) -> Golden {
    let expect = Expect::Reply(response.api_key());
    Golden::Response(ResponseFrame::ok(corr, response), expect)
}

/// A topic split once: range 0 sealed with children 1 and 2, which tile the keyspace.
fn described() -> DescribeTopicResponse {
    let range = |range_id, start, end_inclusive, state, parents: &[u32], children: &[u32]| {
        RangeDescription {
            range_id,
            start,
            end_inclusive,
            state,
            parents: parents.to_vec(),
            children: children.to_vec(),
            segments: 0,
            records: 0,
            expired_records: 0,
        }
    };
    let half = 1_u64 << 63;
    let ranges = vec![
        RangeDescription {
            segments: 1,
            records: 10,
            ..range(0, 0, u64::MAX, RangeState::Sealed, &[], &[1, 2])
        },
        RangeDescription {
            segments: 1,
            records: 4,
            ..range(1, 0, half - 1, RangeState::Active, &[0], &[])
        },
        RangeDescription {
            segments: 2,
            records: 6,
            expired_records: 3,
            ..range(2, half, u64::MAX, RangeState::Active, &[0], &[])
        },
    ];
    DescribeTopicResponse {
        topic: orders(),
        topic_id: 7,
        created_ms: timestamp(0),
        policy: Some(Bytes::from_static(b"short")),
        ranges,
    }
}

/// Range 0 of a three-replica topic: segment 3 sealed at 10 records, settled on brokers 1 and 2
/// while broker 3 does not answer; segment 5 its active head, primary 2, broker 1 a record
/// behind.
fn segments_described() -> DescribeSegmentsResponse {
    let copy = |node_id, settled, answered, durable_offset, sealed| CopyDescription {
        node_id,
        settled,
        answered,
        durable_offset,
        sealed,
    };
    let silent = |node_id| copy(node_id, false, false, 0, false);
    let sealed = SegmentDescription {
        range_id: 0,
        segment_id: 3,
        base_records: 0,
        state: SegmentState::Sealed,
        end_offset: 10,
        data_bytes: 420,
        copies: vec![copy(1, true, true, 10, true), copy(2, true, true, 10, true), silent(3)],
    };
    let head = SegmentDescription {
        range_id: 0,
        segment_id: 5,
        base_records: 10,
        state: SegmentState::Active,
        end_offset: 0,
        data_bytes: 0,
        copies: vec![copy(2, false, true, 4, false), silent(3), copy(1, false, true, 3, false)],
    };
    DescribeSegmentsResponse { topic: orders(), segments: vec![sealed, head] }
}

fn vectors() -> Vec<(&'static str, &'static str, Golden)> {
    let names = vec![Some(Bytes::from_static(b"audit")), orders()];
    vec![
        (
            "E1 list_topics request",
            "00000006 0040 00000014",
            request(20, Request::ListTopics(Empty)),
        ),
        (
            "E2 list_topics ok",
            "0000001f 00000014 0000 00000002 01 00000005 6175646974 01 00000006 6f7264657273",
            ok(20, Response::ListTopics(ListTopicsResponse { topics: names })),
        ),
        (
            "E3 describe_topic request",
            "00000011 0041 00000015 01 00000006 6f7264657273",
            request(21, Request::DescribeTopic(DescribeTopicRequest { topic: orders() })),
        ),
        (
            "E4 describe_topic ok",
            "000000c6 00000015 0000 01 00000006 6f7264657273 0000000000000007 0000019b76daa800
             01 00000005 73686f7274 00000003
             00000000 0000000000000000 ffffffffffffffff 01 0000 0002 00000001 00000002
             00000001 000000000000000a 0000000000000000
             00000001 0000000000000000 7fffffffffffffff 00 0001 00000000 0000
             00000001 0000000000000004 0000000000000000
             00000002 8000000000000000 ffffffffffffffff 00 0001 00000000 0000
             00000002 0000000000000006 0000000000000003",
            ok(21, Response::DescribeTopic(described())),
        ),
        (
            "E5 delete_topic request",
            "00000011 0042 00000016 01 00000006 6f7264657273",
            request(22, Request::DeleteTopic(DeleteTopicRequest { topic: orders() })),
        ),
        ("E6 delete_topic ok", "00000006 00000016 0000", ok(22, Response::DeleteTopic(Empty))),
        (
            "E7 split_range request",
            "00000015 0043 00000017 01 00000006 6f7264657273 00000002",
            request(23, Request::SplitRange(SplitRangeRequest { topic: orders(), range_id: 2 })),
        ),
        (
            "E8 split_range ok",
            "0000000e 00000017 0000 00000003 00000004",
            ok(23, Response::SplitRange(SplitRangeResponse { low: 3, high: 4 })),
        ),
        (
            "E9 merge_ranges request",
            "00000019 0044 00000018 01 00000006 6f7264657273 00000003 00000004",
            request(
                24,
                Request::MergeRanges(MergeRangesRequest { topic: orders(), left: 3, right: 4 }),
            ),
        ),
        (
            "E10 merge_ranges ok",
            "0000000a 00000018 0000 00000005",
            ok(24, Response::MergeRanges(MergeRangesResponse { range_id: 5 })),
        ),
        (
            "E11 create_topic_ranges request",
            "00000015 0045 00000019 01 00000006 6f7264657273 00000004",
            request(
                25,
                Request::CreateTopicRanges(CreateTopicRangesRequest {
                    topic: orders(),
                    initial_ranges: 4,
                }),
            ),
        ),
        (
            "E12 create_topic_ranges ok",
            "00000006 00000019 0000",
            ok(25, Response::CreateTopicRanges(Empty)),
        ),
        (
            "E12a cluster_status request",
            "00000006 0046 0000001a",
            request(26, Request::ClusterStatus(Empty)),
        ),
        (
            "E12b cluster_status ok",
            "0000006d 0000001a 0000 0000000000000002 01 00000002 6331 \
             0001 0000000000000002 01 00000003 683a31 01 00000003 683a32 00 \
             0001 01 00000006 7261636b3d61 \
             0001 0000000000000000 0000000000000002 0000000000000003 \
             0002 0000000000000001 0000000000000002 0000 \
             0003",
            ok(
                26,
                Response::ClusterStatus(ClusterStatusResponse {
                    node_id: 2,
                    cluster_id: Some(Bytes::from_static(b"c1")),
                    brokers: vec![ClusterBroker {
                        node_id: 2,
                        cluster_address: Some(Bytes::from_static(b"h:1")),
                        client_address: Some(Bytes::from_static(b"h:2")),
                        status: 0,
                        attributes: vec![Some(Bytes::from_static(b"rack=a"))],
                    }],
                    groups: vec![ClusterGroup {
                        group_id: 0,
                        leader: 2,
                        term: 3,
                        voters: vec![1, 2],
                        learners: Vec::new(),
                    }],
                    replicas_wanted: 3,
                }),
            ),
        ),
        (
            "E14 remove_broker request, broker 3, force",
            "0000000f 0047 0000001b 0000000000000003 01",
            request(27, Request::RemoveBroker(RemoveBrokerRequest { node_id: 3, force: true })),
        ),
        ("E15 remove_broker ok", "00000006 0000001b 0000", ok(27, Response::RemoveBroker(Empty))),
        (
            "E16 describe_segments request",
            "00000011 0048 0000001c 01 00000006 6f7264657273",
            request(28, Request::DescribeSegments(DescribeSegmentsRequest { topic: orders() })),
        ),
        (
            "E17 describe_segments ok",
            "000000d5 0000001c 0000 01 00000006 6f7264657273 00000002
             00000000 0000000000000003 0000000000000000 01 000000000000000a 00000000000001a4
             0003 0000000000000001 01 01 000000000000000a 01
             0000000000000002 01 01 000000000000000a 01
             0000000000000003 00 00 0000000000000000 00
             00000000 0000000000000005 000000000000000a 00 0000000000000000 0000000000000000
             0003 0000000000000002 00 01 0000000000000004 00
             0000000000000003 00 00 0000000000000000 00
             0000000000000001 00 01 0000000000000003 00",
            ok(28, Response::DescribeSegments(segments_described())),
        ),
        (
            "E18 group_lag request, group g1",
            "00000018 0049 0000001d 01 00000006 6f7264657273 01 00000002 6731",
            request(29, Request::GroupLag(GroupLagRequest { topic: orders(), group: g1() })),
        ),
        (
            "E19 group_lag ok",
            "0000008a 0000001d 0000 01 00000006 6f7264657273 00000001
             01 00000002 6731 0000000000000006 0000019b76daa800 00000003
             00000000 01 01 0000000000000000 000000000000000a 0000000000000000
             00000001 00 00 0000000000000007 000000000000000a 0000000000000003
             00000002 00 02 0000000000000000 0000000000000003 0000000000000003",
            ok(29, Response::GroupLag(lag_described())),
        ),
        (
            "E20 drain_broker request, broker 2, draining",
            "0000000f 004a 0000001e 0000000000000002 01",
            request(30, Request::DrainBroker(DrainBrokerRequest { node_id: 2, draining: true })),
        ),
        (
            "E21 drain_broker ok: 2 told, 4 moved, 3 rolled",
            "0000001a 0000001e 0000 00000002 00000004 00000000 00000003 00000000",
            ok(
                30,
                Response::DrainBroker(DrainBrokerResponse {
                    brokers_told: 2,
                    leaderships_moved: 4,
                    leaderships_kept: 0,
                    heads_rolled: 3,
                    heads_left: 0,
                }),
            ),
        ),
        (
            "E13 split_range refused",
            "00000016 00000017 0001 01 0000000b 6e6f745f62756464696573",
            Golden::Response(
                ResponseFrame::error(23, Reason::NotBuddies),
                Expect::Reply(ApiKey::SplitRange),
            ),
        ),
    ]
}

fn split_one(bytes: &Bytes) -> Bytes {
    let mut buf = BytesMut::from(&bytes[..]);
    let body = split_frame(&mut buf, FRAME_BYTES_MAX_DEFAULT).expect("within the limit");
    assert!(buf.is_empty(), "exactly one frame");
    body.expect("a complete frame")
}

#[test]
fn extension_vectors_encode_and_decode_exactly() {
    for (name, text, golden) in vectors() {
        let bytes = hex(text);
        let mut encoded = BytesMut::new();
        match golden {
            Golden::Request(frame) => {
                frame.encode_frame(FRAME_BYTES_MAX_DEFAULT, &mut encoded).expect(name);
                assert_eq!(encoded.freeze(), bytes, "{name}: encode");
                assert_eq!(RequestFrame::decode(split_one(&bytes)), Ok(frame), "{name}: decode");
            }
            Golden::Response(frame, expect) => {
                frame.encode_frame(FRAME_BYTES_MAX_DEFAULT, &mut encoded).expect(name);
                assert_eq!(encoded.freeze(), bytes, "{name}: encode");
                let envelope = ResponseEnvelope::parse(split_one(&bytes)).expect(name);
                assert_eq!(envelope.decode(expect), Ok(frame), "{name}: decode");
            }
        }
    }
}

#[test]
fn extension_payloads_are_exact() {
    use crate::error::{DecodeError, RequestError};
    let malformed = |api_key, corr, error| RequestError::Malformed { api_key, corr, error };
    let cases: &[(&str, &str, RequestError)] = &[
        (
            "list_topics must be empty",
            "0040 00000001 00",
            malformed(ApiKey::ListTopics, 1, DecodeError::TrailingBytes { count: 1 }),
        ),
        (
            "split_range without its range id",
            "0043 00000002 01 00000001 61",
            malformed(ApiKey::SplitRange, 2, DecodeError::Truncated { needed: 4, remaining: 0 }),
        ),
        (
            "merge_ranges with a trailing byte",
            "0044 00000003 00 00000001 00000002 ff",
            malformed(ApiKey::MergeRanges, 3, DecodeError::TrailingBytes { count: 1 }),
        ),
        (
            "create_topic_ranges with a str flag 2",
            "0045 00000004 02 00000004",
            malformed(ApiKey::CreateTopicRanges, 4, DecodeError::InvalidStrFlag { flag: 2 }),
        ),
        (
            "describe_segments without its topic",
            "0048 00000005",
            malformed(
                ApiKey::DescribeSegments,
                5,
                DecodeError::Truncated { needed: 1, remaining: 0 },
            ),
        ),
        (
            "group_lag without its group",
            "0049 00000007 01 00000001 61",
            malformed(ApiKey::GroupLag, 7, DecodeError::Truncated { needed: 1, remaining: 0 }),
        ),
        (
            "drain_broker without its flag",
            "004a 00000006 0000000000000002",
            malformed(ApiKey::DrainBroker, 6, DecodeError::Truncated { needed: 1, remaining: 0 }),
        ),
        (
            "key 75 is unknown",
            "004b 00000006",
            RequestError::UnknownApiKey { api_key: 75, corr: 6 },
        ),
    ];
    for (name, body, expected) in cases {
        assert_eq!(RequestFrame::decode(hex(body)), Err(*expected), "{name}");
    }
    let state_2 = "00000001 0000 00 0000000000000000 0000000000000000 00 00000001
                   00000000 0000000000000000 0000000000000000 02 0000 0000
                   00000000 0000000000000000 0000000000000000";
    let envelope = ResponseEnvelope::parse(hex(state_2)).expect("6+ bytes");
    let error = DecodeError::UnknownTag { field: "range state", tag: 2 };
    assert_eq!(envelope.decode(Expect::Reply(ApiKey::DescribeTopic)), Err(error));
}

#[test]
fn describe_segments_answers_are_exact() {
    use crate::error::DecodeError;
    // One segment (range 0, segment 3, base 0) with one copy (broker 1), the bytes after the
    // segment's `base` and the copy's `node_id` varied.
    let answer = |seal: &str, copy: &str| {
        format!(
            "00000001 0000 00 00000001 00000000 0000000000000003 0000000000000000 {seal}
             0001 0000000000000001 {copy}"
        )
    };
    let seal = "01 000000000000000a 00000000000001a4";
    let copy = "01 01 000000000000000a 01";
    let cases: &[(&str, String, DecodeError)] = &[
        (
            "segment state 2",
            answer("02 000000000000000a 00000000000001a4", copy),
            DecodeError::UnknownTag { field: "segment state", tag: 2 },
        ),
        (
            "settled 2",
            answer(seal, "02 01 000000000000000a 01"),
            DecodeError::InvalidBool { value: 2 },
        ),
        (
            "answered 2",
            answer(seal, "01 02 000000000000000a 01"),
            DecodeError::InvalidBool { value: 2 },
        ),
        (
            "sealed 2",
            answer(seal, "01 01 000000000000000a 02"),
            DecodeError::InvalidBool { value: 2 },
        ),
        (
            "a copy without its sealed flag: 18 bytes cannot hold one 19-byte copy",
            answer(seal, "01 01 000000000000000a"),
            DecodeError::CountTooLarge { count: 1, remaining: 18 },
        ),
        (
            "a byte after the last copy",
            answer(seal, "01 01 000000000000000a 01 00"),
            DecodeError::TrailingBytes { count: 1 },
        ),
    ];
    for (name, body, expected) in cases {
        let envelope = ResponseEnvelope::parse(hex(body)).expect("6+ bytes");
        let decoded = envelope.decode(Expect::Reply(ApiKey::DescribeSegments));
        assert_eq!(decoded, Err(*expected), "{name}");
    }
    let well_formed = ResponseEnvelope::parse(hex(&answer(seal, copy))).expect("6+ bytes");
    assert!(well_formed.decode(Expect::Reply(ApiKey::DescribeSegments)).is_ok());
}
