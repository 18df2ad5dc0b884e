//! The test vectors V1..V22 of the spec's section 6 as golden tests: encoding the expected value
//! gives exactly the vector's bytes, and decoding the bytes gives exactly the value. Also the
//! small helpers the other test modules share.

use bytes::{Bytes, BytesMut};

use crate::api_key::ApiKey;
use crate::batch::{Codec, PlainEntry, encode_batch};
use crate::error::{BodyTooShort, FrameTooLarge, RequestError};
use crate::frame::split_frame;
use crate::limits::FRAME_BYTES_MAX_DEFAULT;
use crate::messages::*;
use crate::reason::Reason;
use crate::record::{Header, Record};
use crate::request::{Request, RequestFrame};
use crate::response::{Expect, Response, ResponseEnvelope, ResponseFrame};

/// Bytes from the spec's hex notation; spaces (and line breaks) separate fields.
pub(crate) fn hex(text: &str) -> Bytes {
    let digits: Vec<u8> = text.bytes().filter(|byte| !byte.is_ascii_whitespace()).collect();
    assert!(digits.len().is_multiple_of(2), "odd number of hex digits in {text:?}");
    let pairs = digits.chunks(2).map(|pair| {
        let pair = std::str::from_utf8(pair).expect("ASCII");
        u8::from_str_radix(pair, 16).expect("hex digits")
    });
    pairs.collect()
}

/// `TS` of section 6 (2026-01-01T00:00:00Z) plus `plus_ms`.
pub(crate) fn timestamp(plus_ms: u64) -> u64 {
    1_767_225_600_000 + plus_ms
}

/// What a vector's bytes are.
enum Golden {
    Request(RequestFrame),
    Response(ResponseFrame, Expect),
    /// A client frame the server must refuse with this error (answered by the next vector).
    BadRequest(RequestError),
    /// A client frame refused from its length bytes alone.
    Oversize(FrameTooLarge),
}

fn s(text: &str) -> Option<Bytes> {
    Some(Bytes::copy_from_slice(text.as_bytes()))
}

/// Cursor `C` of section 6.
fn cursor() -> Bytes {
    Bytes::from_static(b"g3QAAAAA")
}

/// The two records of V6 and V9.
fn v6_records() -> Vec<Record> {
    let header = |name: &'static str, value: &'static str| Header {
        name: Bytes::from_static(name.as_bytes()),
        value: Bytes::from_static(value.as_bytes()),
    };
    vec![
        Record {
            key: s("k1"),
            value: "v1".into(),
            timestamp_ms: timestamp(0),
            headers: vec![header("x-seq", "1")],
        },
        Record {
            key: None,
            value: "v2".into(),
            timestamp_ms: timestamp(1),
            headers: vec![header("a", "b"), header("c", "")],
        },
    ]
}

fn k1_v1() -> Record {
    Record { key: s("k1"), value: "v1".into(), timestamp_ms: timestamp(0), headers: Vec::new() }
}

fn request(corr: u32, request: Request) -> Golden {
    Golden::Request(RequestFrame::new(corr, request))
}

fn ok(corr: u32, response: Response) -> Golden {
    let expect = Expect::Reply(response.api_key());
    Golden::Response(ResponseFrame::ok(corr, response), expect)
}

fn error(corr: u32, reason: Reason, expected: ApiKey) -> Golden {
    Golden::Response(ResponseFrame::error(corr, reason), Expect::Reply(expected))
}

fn vectors() -> Vec<(&'static str, &'static str, Golden)> {
    let mut all = auth_and_produce_vectors();
    all.extend(consume_vectors());
    all.extend(refusal_vectors());
    all.extend(admin_and_stream_vectors());
    all
}

fn auth_and_produce_vectors() -> Vec<(&'static str, &'static str, Golden)> {
    let auth = AuthRequest { username: s("app"), password: s("app123") };
    let orders = CreateTopicRequest { topic: s("orders"), keyspace_bits: 8 };
    let produce = ProduceRequest { topic: s("orders"), records: v6_records() };
    vec![
        (
            "V1 auth request",
            "00000019 0000 00000001 01 00000003 617070 01 00000006 617070313233",
            request(1, Request::Auth(auth)),
        ),
        (
            "V2 auth ok",
            "00000012 00000001 0000 01 00000007 746f6b5f616263",
            ok(1, Response::Auth(TokenResponse { token: s("tok_abc") })),
        ),
        (
            "V3 auth failure",
            "0000001e 00000001 0001 01 00000013 696e76616c69645f63726564656e7469616c73",
            error(1, Reason::InvalidCredentials, ApiKey::Auth),
        ),
        (
            "V4 create_topic request",
            "00000012 0001 00000002 01 00000006 6f7264657273 08",
            request(2, Request::CreateTopic(orders)),
        ),
        ("V5 create_topic ok", "00000006 00000002 0000", ok(2, Response::CreateTopic(Empty))),
        (
            "V6 produce request",
            "00000068 0002 00000003 01 00000006 6f7264657273 00000002
             01 00000002 6b31 00000002 7631 0000019b76daa800 00000001 01 00000005 782d736571
             01 00000001 31
             00 00000002 7632 0000019b76daa801 00000002 01 00000001 61 01 00000001 62
             01 00000001 63 01 00000000",
            request(3, Request::Produce(produce)),
        ),
        (
            "V7 produce ok",
            "0000000a 00000003 0000 00000002",
            ok(3, Response::Produce(ProduceResponse { count: 2 })),
        ),
    ]
}

fn consume_vectors() -> Vec<(&'static str, &'static str, Golden)> {
    let fetch = FetchRequest {
        topic: s("orders"),
        cursor: None,
        group: s("g1"),
        member: None,
        max_records: 100,
        wait_ms: 5000,
    };
    let fetched = FetchResponse { records: v6_records(), next_cursor: cursor() };
    let commit = CommitRequest { topic: s("orders"), group: s("g1"), cursor: Some(cursor()) };
    let subscribe = SubscribeRequest {
        topic: s("orders"),
        group: s("live"),
        member: None,
        window_records: 100,
        max_records: 50,
    };
    let pushed = FetchResponse { records: vec![k1_v1()], next_cursor: cursor() };
    let ack = StreamAckRequest {
        topic: s("orders"),
        group: s("live"),
        member: None,
        cursor: Some(cursor()),
        count: 1,
    };
    vec![
        (
            "V8 fetch request",
            "00000022 0003 00000004 01 00000006 6f7264657273 00 01 00000002 6731 00 00000064
             00001388",
            request(4, Request::Fetch(fetch)),
        ),
        (
            "V9 fetch ok",
            "0000006a 00000004 0000 00000002
             01 00000002 6b31 00000002 7631 0000019b76daa800 00000001 01 00000005 782d736571
             01 00000001 31
             00 00000002 7632 0000019b76daa801 00000002 01 00000001 61 01 00000001 62
             01 00000001 63 01 00000000
             01 00000008 6733514141414141",
            ok(4, Response::Fetch(fetched)),
        ),
        (
            "V10 commit request",
            "00000025 0004 00000005 01 00000006 6f7264657273 01 00000002 6731
             01 00000008 6733514141414141",
            request(5, Request::Commit(commit)),
        ),
        ("V11 commit ok", "00000006 00000005 0000", ok(5, Response::Commit(Empty))),
        (
            "V12 subscribe request",
            "00000023 0005 00000006 01 00000006 6f7264657273 01 00000004 6c697665 00 00000064
             00000032",
            request(6, Request::Subscribe(subscribe)),
        ),
        (
            "V13 push on the subscription",
            "00000030 00000006 0000 00000001 01 00000002 6b31 00000002 7631 0000019b76daa800
             00000000 01 00000008 6733514141414141",
            ok(6, Response::Subscribe(pushed)),
        ),
        (
            "V14 stream_ack request",
            "0000002c 0006 00000007 01 00000006 6f7264657273 01 00000004 6c697665 00
             01 00000008 6733514141414141 00000001",
            request(7, Request::StreamAck(ack)),
        ),
    ]
}

fn refusal_vectors() -> Vec<(&'static str, &'static str, Golden)> {
    let empty_produce = ProduceRequest { topic: s("orders"), records: Vec::new() };
    vec![
        (
            "V15 error response",
            "00000018 00000003 0001 01 0000000d 6e6f5f737563685f746f706963",
            error(3, Reason::NoSuchTopic, ApiKey::Produce),
        ),
        (
            "V16 unknown api key, request",
            "00000006 0063 0000000a",
            Golden::BadRequest(RequestError::UnknownApiKey { api_key: 99, corr: 10 }),
        ),
        (
            "V16 unknown api key, answer",
            "0000001a 0000000a 0001 01 0000000f 756e6b6e6f776e5f6170695f6b6579",
            error(10, Reason::UnknownApiKey, ApiKey::Auth),
        ),
        (
            "V17 frame too large, request",
            "01000001",
            Golden::Oversize(FrameTooLarge { len: 16_777_217, max: FRAME_BYTES_MAX_DEFAULT }),
        ),
        (
            "V17 frame too large, answer",
            "0000001a 00000000 0001 01 0000000f 6672616d655f746f6f5f6c61726765",
            error(0, Reason::FrameTooLarge, ApiKey::Auth),
        ),
        (
            "V18 truncated envelope, request",
            "00000003 000200",
            Golden::BadRequest(BodyTooShort { len: 3 }.into()),
        ),
        (
            "V18 truncated envelope, answer",
            "0000001c 00000000 0001 01 00000011 6d616c666f726d65645f72657175657374",
            error(0, Reason::MalformedRequest, ApiKey::Auth),
        ),
        (
            "V19 request before auth, request",
            "00000015 0002 00000001 01 00000006 6f7264657273 00000000",
            request(1, Request::Produce(empty_produce)),
        ),
        (
            "V19 request before auth, answer",
            "00000018 00000001 0001 01 0000000d 617574685f7265717569726564",
            error(1, Reason::AuthRequired, ApiKey::Produce),
        ),
    ]
}

fn admin_and_stream_vectors() -> Vec<(&'static str, &'static str, Golden)> {
    let bob = UserPermissions { username: s("bob"), permissions: vec![s("produce"), s("consume")] };
    let mut batch = BytesMut::new();
    let entry = PlainEntry { tombstone: false, record: k1_v1() };
    encode_batch(&[entry], Codec::None, &mut batch).expect("encodes");
    let append = AppendRequest { stream_id: 5, sequence: 0, batch: batch.freeze() };
    let ack = AppendAck {
        acked_sequence: 1,
        window_appends: 16,
        window_bytes: 2 * 1024 * 1024,
        errors: Vec::new(),
    };
    let push = StreamPush { stream_id: 5, kind: PushKind::AppendAck(ack) };
    vec![
        (
            "V20 list_users ok",
            "0000002e 0000000c 0000 00000001 01 00000003 626f62 00000002 01 00000007 70726f64756365
             01 00000007 636f6e73756d65",
            ok(12, Response::ListUsers(ListUsersResponse { users: vec![bob] })),
        ),
        (
            "V21 append request",
            "00000039 001b 00000010 00000005 0000000000000000 00 00000001 0000001a 0000001a
             00 01 00000002 6b31 00000002 7631 0000019b76daa800 00000000",
            request(16, Request::Append(append)),
        ),
        (
            "V22 append_ack push",
            "0000001d 00000010 0000 00 00000005 0000000000000001 00000010 00200000 0000",
            Golden::Response(ResponseFrame::push(16, push), Expect::StreamPush),
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
fn section_6_vectors_encode_and_decode_exactly() {
    let all = vectors();
    assert_eq!(all.len(), 26, "V1..V22, with V16-V19 as request and answer");
    for (name, text, golden) in all {
        let bytes = hex(text);
        match golden {
            Golden::Request(frame) => {
                let mut encoded = BytesMut::new();
                frame.encode_frame(FRAME_BYTES_MAX_DEFAULT, &mut encoded).expect(name);
                assert_eq!(encoded.freeze(), bytes, "{name}: encode");
                assert_eq!(RequestFrame::decode(split_one(&bytes)), Ok(frame), "{name}: decode");
            }
            Golden::Response(frame, expect) => {
                let mut encoded = BytesMut::new();
                frame.encode_frame(FRAME_BYTES_MAX_DEFAULT, &mut encoded).expect(name);
                assert_eq!(encoded.freeze(), bytes, "{name}: encode");
                let envelope = ResponseEnvelope::parse(split_one(&bytes)).expect(name);
                assert_eq!(envelope.decode(expect), Ok(frame), "{name}: decode");
            }
            Golden::BadRequest(error) => {
                let decoded = RequestFrame::decode(split_one(&bytes));
                assert_eq!(decoded, Err(error), "{name}: decode");
            }
            Golden::Oversize(error) => {
                let mut buf = BytesMut::from(&bytes[..]);
                let split = split_frame(&mut buf, FRAME_BYTES_MAX_DEFAULT);
                assert_eq!(split, Err(error), "{name}: refused before the body");
                assert_eq!(error.reason(), Reason::FrameTooLarge);
            }
        }
    }
}

#[test]
fn v21_batch_decodes_to_its_entry() {
    let body = split_one(&hex(
        "00000039 001b 00000010 00000005 0000000000000000
        00 00000001 0000001a 0000001a 00 01 00000002 6b31 00000002 7631 0000019b76daa800 00000000",
    ));
    let Ok(RequestFrame { request: Request::Append(append), .. }) = RequestFrame::decode(body)
    else {
        panic!("V21 decodes as an append");
    };
    let entries = append.entries(crate::batch::BatchLimits::default());
    assert_eq!(entries, Ok(vec![PlainEntry { tombstone: false, record: k1_v1() }]));
}

#[test]
fn refusals_answer_with_the_vectors_reason_and_corr() {
    let cases: &[(RequestError, Reason, u32)] = &[
        (RequestError::UnknownApiKey { api_key: 99, corr: 10 }, Reason::UnknownApiKey, 10),
        (BodyTooShort { len: 3 }.into(), Reason::MalformedRequest, 0),
    ];
    for (error, reason, corr) in cases {
        assert_eq!((error.reason(), error.corr()), (*reason, *corr));
    }
}
