//! The request side of section 1.1: the envelope (`api_key:u16`, `corr:u32`, payload) and the
//! typed [`Request`] of every api key.
//!
//! A server decodes in two steps so it can keep section 3.0's order: [`RequestEnvelope::parse`]
//! names the key and `corr` without touching the payload (admin keys check `admin` at this
//! point, and the auth phase checks for keys 0/12/13), then [`RequestEnvelope::decode`] decodes
//! the payload. [`RequestFrame::decode`] does both at once for callers that need no step between.

use bytes::{BufMut, Bytes, BytesMut};

use crate::api_key::ApiKey;
use crate::error::{BodyTooShort, DecodeError, EncodeError, RequestError};
use crate::frame::{FrameBody, write_frame};
use crate::limits::ENVELOPE_BYTES;
use crate::messages::*;
use crate::primitive::{Wire, Writer};

macro_rules! requests {
    ($( $(#[$doc:meta])* $key:ident($payload:ty), )*) => {
        /// A decoded request payload; the variant names its api key.
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum Request {
            $( $(#[$doc])* $key($payload), )*
        }

        impl Request {
            pub fn api_key(&self) -> ApiKey {
                match self {
                    $( Request::$key(_) => ApiKey::$key, )*
                }
            }

            /// Decodes the payload of a request whose key is already known.
            pub fn decode_payload(api_key: ApiKey, payload: Bytes) -> Result<Request, DecodeError> {
                match api_key {
                    $( ApiKey::$key => <$payload as Wire>::decode(payload).map(Request::$key), )*
                }
            }

            fn write_payload(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
                match self {
                    $( Request::$key(payload) => payload.write(writer), )*
                }
            }

            #[cfg(test)]
            fn payload_bytes_min(api_key: ApiKey) -> usize {
                match api_key {
                    $( ApiKey::$key => <$payload as Wire>::WIRE_BYTES_MIN, )*
                }
            }
        }
    };
}

requests! {
    Auth(AuthRequest),
    CreateTopic(CreateTopicRequest),
    Produce(ProduceRequest),
    Fetch(FetchRequest),
    Commit(CommitRequest),
    Subscribe(SubscribeRequest),
    StreamAck(StreamAckRequest),
    LeaveGroup(LeaveGroupRequest),
    CreateUser(CreateUserRequest),
    DeleteUser(DeleteUserRequest),
    ChangePassword(ChangePasswordRequest),
    /// Malachi ignores whatever payload comes with it.
    ListUsers(IgnoredPayload),
    MtlsAuth(Empty),
    TokenAuth(TokenAuthRequest),
    GrantAcl(AclRequest),
    RevokeAcl(AclRequest),
    ListAcls(ListAclsRequest),
    DefinePolicy(DefinePolicyRequest),
    DeletePolicy(DeletePolicyRequest),
    /// The payload must be empty.
    ListPolicies(Empty),
    BindTopicPolicy(BindTopicPolicyRequest),
    GetTopicPolicy(GetTopicPolicyRequest),
    SetRole(SetRoleRequest),
    /// Malachi ignores whatever payload comes with it.
    ListUsersWithRoles(IgnoredPayload),
    /// The payload must be empty.
    ClusterState(Empty),
    TopicRoutes(TopicRoutesRequest),
    OpenStream(OpenStreamRequest),
    Append(AppendRequest),
    CloseStream(CloseStreamRequest),
    OpenConsume(OpenConsumeRequest),
    ConsumeAck(ConsumeAckRequest),
    FetchRange(FetchRangeRequest),
    JoinGroup(JoinGroupRequest),
    GroupHeartbeat(GroupHeartbeatRequest),
    CommitOffsets(CommitOffsetsRequest),
    /// The payload must be empty.
    ListTopics(Empty),
    DescribeTopic(DescribeTopicRequest),
    DeleteTopic(DeleteTopicRequest),
    SplitRange(SplitRangeRequest),
    MergeRanges(MergeRangesRequest),
    CreateTopicRanges(CreateTopicRangesRequest),
    /// The payload must be empty.
    ClusterStatus(Empty),
    RemoveBroker(RemoveBrokerRequest),
    DescribeSegments(DescribeSegmentsRequest),
    GroupLag(GroupLagRequest),
    DrainBroker(DrainBrokerRequest),
}

/// A request body split into its envelope fields, the payload not yet decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestEnvelope {
    /// As sent: it may name no known key.
    pub api_key: u16,
    pub corr: u32,
    pub payload: Bytes,
}

/// A whole request: the client's `corr` and the typed request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestFrame {
    pub corr: u32,
    pub request: Request,
}

impl RequestEnvelope {
    pub fn parse(mut body: Bytes) -> Result<RequestEnvelope, BodyTooShort> {
        let Some(header) = body.get(..ENVELOPE_BYTES) else {
            return Err(BodyTooShort { len: body.len() });
        };
        let api_key = u16::from_be_bytes([header[0], header[1]]);
        let corr = u32::from_be_bytes([header[2], header[3], header[4], header[5]]);
        let payload = body.split_off(ENVELOPE_BYTES);
        Ok(RequestEnvelope { api_key, corr, payload })
    }

    /// The known key, or `unknown_api_key` on this request's `corr`.
    pub fn key(&self) -> Result<ApiKey, RequestError> {
        ApiKey::from_u16(self.api_key)
            .ok_or(RequestError::UnknownApiKey { api_key: self.api_key, corr: self.corr })
    }

    /// Decodes the payload; failures are `malformed_request` on this request's `corr`.
    pub fn decode(self) -> Result<RequestFrame, RequestError> {
        let api_key = self.key()?;
        let corr = self.corr;
        let request = Request::decode_payload(api_key, self.payload)
            .map_err(|error| RequestError::Malformed { api_key, corr, error })?;
        Ok(RequestFrame { corr, request })
    }
}

impl RequestFrame {
    pub fn new(corr: u32, request: Request) -> RequestFrame {
        RequestFrame { corr, request }
    }

    /// Decodes a whole request body (a frame without its length prefix).
    pub fn decode(body: Bytes) -> Result<RequestFrame, RequestError> {
        RequestEnvelope::parse(body)?.decode()
    }

    /// Appends the whole frame, length prefix included; see [`write_frame`].
    pub fn encode_frame(
        &self,
        max_frame_bytes: u32,
        dst: &mut BytesMut,
    ) -> Result<(), EncodeError> {
        write_frame(self, max_frame_bytes, dst)
    }
}

impl FrameBody for RequestFrame {
    fn encode_body(&self, dst: &mut BytesMut) -> Result<(), EncodeError> {
        let start = dst.len();
        dst.put_u16(self.request.api_key().as_u16());
        dst.put_u32(self.corr);
        let result = self.request.write_payload(&mut Writer::new(dst));
        if result.is_err() {
            dst.truncate(start);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use proptest::test_runner::TestRunner;

    use super::*;
    use crate::arbitrary::{arb_request, arb_request_for, arb_request_frame};
    use crate::limits::FRAME_BYTES_MAX_DEFAULT;
    use crate::vectors::hex;

    fn malformed(api_key: ApiKey, corr: u32, error: DecodeError) -> RequestError {
        RequestError::Malformed { api_key, corr, error }
    }

    #[test]
    fn bodies_that_fail_to_decode() {
        use DecodeError::*;
        let cases: &[(&str, &str, RequestError)] = &[
            ("empty body", "", BodyTooShort { len: 0 }.into()),
            ("3-byte body (V18)", "000200", BodyTooShort { len: 3 }.into()),
            ("5-byte body", "0002 000000", BodyTooShort { len: 5 }.into()),
            (
                "unknown key 99 (V16)",
                "0063 0000000a",
                RequestError::UnknownApiKey { api_key: 99, corr: 10 },
            ),
            (
                "first unknown key, 35",
                "0023 00000001 00",
                RequestError::UnknownApiKey { api_key: 35, corr: 1 },
            ),
            (
                "trailing byte",
                "0001 00000002 01 00000001 61 08 ff",
                malformed(ApiKey::CreateTopic, 2, TrailingBytes { count: 1 }),
            ),
            (
                "short payload",
                "0001 00000002 01 00000001 61",
                malformed(ApiKey::CreateTopic, 2, Truncated { needed: 1, remaining: 0 }),
            ),
            (
                "str flag 2",
                "0000 00000001 02 00000003 617070 00",
                malformed(ApiKey::Auth, 1, InvalidStrFlag { flag: 2 }),
            ),
            (
                "four billion records in 10 bytes",
                "0002 00000003 00 ffffffff 00000000000000000000",
                malformed(ApiKey::Produce, 3, CountTooLarge { count: u32::MAX, remaining: 10 }),
            ),
            (
                "four billion permissions in 10 bytes",
                "0008 00000004 00 00 ffffffff 00000000000000000000",
                malformed(ApiKey::CreateUser, 4, CountTooLarge { count: u32::MAX, remaining: 10 }),
            ),
            (
                "absent header name in a produce",
                "0002 00000003 00 00000001 \
                 00 00000000 0000000000000000 00000001 00 01 00000004 76767676",
                malformed(ApiKey::Produce, 3, AbsentStr { field: "header name" }),
            ),
            (
                "list_policies must be empty",
                "0013 00000005 00",
                malformed(ApiKey::ListPolicies, 5, TrailingBytes { count: 1 }),
            ),
            (
                "cluster_state must be empty",
                "0018 00000006 0000",
                malformed(ApiKey::ClusterState, 6, TrailingBytes { count: 2 }),
            ),
            (
                "mtls_auth must be empty",
                "000c 00000001 00",
                malformed(ApiKey::MtlsAuth, 1, TrailingBytes { count: 1 }),
            ),
            (
                "delete_policy force 2",
                "0012 00000007 00 02",
                malformed(ApiKey::DeletePolicy, 7, InvalidBool { value: 2 }),
            ),
            (
                "open_stream window_appends 0",
                "001a 00000008 00 00000000 0000000000000000 00 00000000 00000001 00 00",
                malformed(ApiKey::OpenStream, 8, Zero { field: "window_appends" }),
            ),
            (
                "open_consume window 0",
                "001d 00000009 00 00000000 0000000000000000 00 00000000 00000000 00000000 01",
                malformed(ApiKey::OpenConsume, 9, Zero { field: "window" }),
            ),
            (
                "fetch_range start tag 4",
                "001f 0000000a 00 00000000 0000000000000000 04",
                malformed(ApiKey::FetchRange, 10, UnknownTag { field: "start", tag: 4 }),
            ),
            (
                "append without its sequence",
                "001b 0000000b 00000005 00000000000000",
                malformed(ApiKey::Append, 11, Truncated { needed: 8, remaining: 7 }),
            ),
        ];
        for (name, body, expected) in cases {
            assert_eq!(RequestFrame::decode(hex(body)), Err(*expected), "{name}");
        }
    }

    #[test]
    fn error_answers_name_reason_and_corr() {
        let cases: &[(RequestError, &str, u32)] = &[
            (BodyTooShort { len: 3 }.into(), "malformed_request", 0),
            (RequestError::UnknownApiKey { api_key: 99, corr: 10 }, "unknown_api_key", 10),
            (
                malformed(ApiKey::Fetch, 4, DecodeError::InvalidBool { value: 9 }),
                "malformed_request",
                4,
            ),
        ];
        for (error, reason, corr) in cases {
            assert_eq!((error.reason().as_str(), error.corr()), (*reason, *corr), "{error}");
        }
    }

    #[test]
    fn payloads_that_decode() {
        let cases: &[(&str, &str, Request)] = &[
            (
                "list_users ignores its payload",
                "000b 00000001 deadbeef",
                Request::ListUsers(IgnoredPayload),
            ),
            ("list_users with none", "000b 00000001", Request::ListUsers(IgnoredPayload)),
            (
                "list_users_with_roles ignores its payload",
                "0017 00000001 02",
                Request::ListUsersWithRoles(IgnoredPayload),
            ),
            ("empty list_policies", "0013 00000001", Request::ListPolicies(Empty)),
            (
                "append keeps a bad batch for append_ack to report",
                "001b 00000001 00000005 0000000000000000 ff",
                Request::Append(AppendRequest {
                    stream_id: 5,
                    sequence: 0,
                    batch: Bytes::from_static(&[0xff]),
                }),
            ),
        ];
        for (name, body, request) in cases {
            let expected = RequestFrame { corr: 1, request: request.clone() };
            assert_eq!(RequestFrame::decode(hex(body)), Ok(expected), "{name}");
        }
    }

    #[test]
    fn admin_keys_are_named_before_their_payload_is_decoded() {
        let envelope = RequestEnvelope::parse(hex("0008 00000004 02")).expect("6+ bytes");
        let key = envelope.key().expect("known key");
        assert!(key.requires_admin(), "the server answers permission_denied here if not admin");
        assert!(envelope.decode().is_err(), "the payload itself is garbled");
    }

    /// Every key, each with its own runs, so no request type is left to chance.
    #[test]
    fn every_request_type_round_trips() {
        for key in ApiKey::ALL {
            let mut runner = TestRunner::new(ProptestConfig::with_cases(64));
            let strategy = (any::<u32>(), arb_request_for(*key));
            let result = runner.run(&strategy, |(corr, request)| {
                let frame = RequestFrame::new(corr, request);
                let mut dst = BytesMut::new();
                frame.encode_frame(FRAME_BYTES_MAX_DEFAULT, &mut dst).expect("encodes");
                let body = split_one(&mut dst);
                prop_assert_eq!(RequestFrame::decode(body), Ok(frame));
                Ok(())
            });
            result.unwrap_or_else(|failure| panic!("{key}: {failure}"));
        }
    }

    proptest! {
        #[test]
        fn payload_is_at_least_its_minimum(request in arb_request()) {
            let mut dst = BytesMut::new();
            request.write_payload(&mut Writer::new(&mut dst)).expect("encodes");
            prop_assert!(dst.len() >= Request::payload_bytes_min(request.api_key()));
        }

        #[test]
        fn arbitrary_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = RequestFrame::decode(Bytes::from(body));
        }

        #[test]
        fn arbitrary_payloads_for_every_key_never_panic(
            payload in proptest::collection::vec(any::<u8>(), 0..256),
        ) {
            for key in ApiKey::ALL {
                let _ = Request::decode_payload(*key, Bytes::from(payload.clone()));
            }
        }

        #[test]
        fn truncated_and_mutated_frames_never_panic(
            frame in arb_request_frame(),
            flip_at in any::<prop::sample::Index>(),
            flip_to in any::<u8>(),
        ) {
            let mut dst = BytesMut::new();
            frame.encode_frame(FRAME_BYTES_MAX_DEFAULT, &mut dst).expect("encodes");
            let whole = dst.freeze();
            for cut in 0..whole.len() {
                let mut partial = BytesMut::from(&whole[..cut]);
                let split = crate::frame::split_frame(&mut partial, FRAME_BYTES_MAX_DEFAULT);
                prop_assert_eq!(split, Ok(None), "a cut frame is incomplete, never an error");
                if cut >= 4 {
                    let _ = RequestFrame::decode(whole.slice(4..cut));
                }
            }
            let mut mutated = whole[4..].to_vec();
            if !mutated.is_empty() {
                let at = flip_at.index(mutated.len());
                mutated[at] = flip_to;
                let _ = RequestFrame::decode(Bytes::from(mutated));
            }
        }
    }

    fn split_one(dst: &mut BytesMut) -> Bytes {
        let body = crate::frame::split_frame(dst, FRAME_BYTES_MAX_DEFAULT);
        let body = body.expect("within the limit").expect("complete");
        assert!(dst.is_empty(), "exactly one frame");
        body
    }
}
