//! The response side of section 1.1: the envelope (`corr:u32`, `error_code:u16`, payload) and
//! the typed ok payload of every api key, plus error answers and stream pushes.
//!
//! A response does not name its key: the client knows what it asked on each `corr`. So decoding
//! is two steps as well: [`ResponseEnvelope::parse`] gives the `corr` and the error code, the
//! client looks up what it expects on that `corr` ([`Expect`]), and
//! [`ResponseEnvelope::decode`] decodes the payload accordingly. Error answers decode the same
//! whatever was expected.

use bytes::{BufMut, Bytes, BytesMut};

use crate::api_key::ApiKey;
use crate::error::{BodyTooShort, DecodeError, EncodeError};
use crate::frame::{FrameBody, write_frame};
use crate::limits::ENVELOPE_BYTES;
use crate::messages::*;
use crate::primitive::{Reader, Wire, Writer};
use crate::reason::Reason;

/// `error_code` of an ok frame (answers and pushes).
pub const ERROR_CODE_OK: u16 = 0;
/// `error_code` Malachi sends on errors; a client treats every non-zero code as an error.
pub const ERROR_CODE_ERROR: u16 = 1;

macro_rules! responses {
    (
        replies { $( $(#[$doc:meta])* $key:ident($payload:ty), )* }
        no_reply { $( $silent:ident ),* }
    ) => {
        /// A decoded ok payload; the variant names the api key it answers.
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum Response {
            $( $(#[$doc])* $key($payload), )*
        }

        impl Response {
            pub fn api_key(&self) -> ApiKey {
                match self {
                    $( Response::$key(_) => ApiKey::$key, )*
                }
            }

            /// Decodes the ok payload answering `api_key`.
            pub fn decode_payload(
                api_key: ApiKey,
                payload: Bytes,
            ) -> Result<Response, DecodeError> {
                match api_key {
                    $( ApiKey::$key => <$payload as Wire>::decode(payload).map(Response::$key), )*
                    $( ApiKey::$silent )|* => Err(DecodeError::NoReply { api_key }),
                }
            }

            fn write_payload(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
                match self {
                    $( Response::$key(payload) => payload.write(writer), )*
                }
            }
        }
    };
}

responses! {
    replies {
        Auth(TokenResponse),
        CreateTopic(Empty),
        Produce(ProduceResponse),
        Fetch(FetchResponse),
        Commit(Empty),
        /// A push on the subscription: subscribe's success itself sends nothing.
        Subscribe(FetchResponse),
        LeaveGroup(Empty),
        CreateUser(Empty),
        DeleteUser(Empty),
        ChangePassword(Empty),
        ListUsers(ListUsersResponse),
        MtlsAuth(TokenResponse),
        TokenAuth(TokenResponse),
        GrantAcl(Empty),
        RevokeAcl(Empty),
        ListAcls(ListAclsResponse),
        DefinePolicy(Empty),
        DeletePolicy(Empty),
        ListPolicies(ListPoliciesResponse),
        BindTopicPolicy(Empty),
        GetTopicPolicy(TopicPolicyResponse),
        SetRole(Empty),
        ListUsersWithRoles(ListUsersWithRolesResponse),
        ClusterState(ClusterStateResponse),
        TopicRoutes(TopicRoutesResponse),
        /// The first ok frame on the open_stream's `corr`; later ones are [`StreamPush`]es.
        OpenStream(OpenStreamResponse),
        CloseStream(Empty),
        /// The first ok frame on the open_consume's `corr`; later ones are [`StreamPush`]es.
        OpenConsume(OpenConsumeResponse),
        FetchRange(Page),
        JoinGroup(Assignment),
        GroupHeartbeat(Assignment),
        CommitOffsets(Empty),
        ListTopics(ListTopicsResponse),
        DescribeTopic(DescribeTopicResponse),
        DeleteTopic(Empty),
        SplitRange(SplitRangeResponse),
        MergeRanges(MergeRangesResponse),
        CreateTopicRanges(Empty),
        ClusterStatus(ClusterStatusResponse),
        RemoveBroker(Empty),
        DescribeSegments(DescribeSegmentsResponse),
        GroupLag(GroupLagResponse),
        DrainBroker(DrainBrokerResponse),
    }
    no_reply { StreamAck, Append, ConsumeAck }
}

/// What a response frame carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResponseBody {
    /// `error_code` 0, the ok payload of the request on this `corr`.
    Ok(Response),
    /// `error_code` 0, a push on an open stream's `corr`.
    Push(StreamPush),
    /// `error_code` non-zero (1 when we send it), the payload one present `str`.
    Error { reason: Bytes },
}

/// A whole response: the request's `corr` (0 where none can be named) and its body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResponseFrame {
    pub corr: u32,
    pub body: ResponseBody,
}

/// What the client expects on a `corr`, which decides how an ok payload is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// The answer to a request with this key (for `subscribe`: each push of the subscription).
    Reply(ApiKey),
    /// A push on an open stream (after the open_stream / open_consume answer).
    StreamPush,
}

/// A response body split into its envelope fields, the payload not yet decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResponseEnvelope {
    pub corr: u32,
    pub error_code: u16,
    pub payload: Bytes,
}

impl ResponseFrame {
    pub fn ok(corr: u32, response: Response) -> ResponseFrame {
        ResponseFrame { corr, body: ResponseBody::Ok(response) }
    }

    pub fn push(corr: u32, push: StreamPush) -> ResponseFrame {
        ResponseFrame { corr, body: ResponseBody::Push(push) }
    }

    pub fn error(corr: u32, reason: Reason) -> ResponseFrame {
        ResponseFrame::error_text(corr, Bytes::from_static(reason.as_str().as_bytes()))
    }

    /// An error with detail after the reason name (`policy_in_use: a, b`, `{:unroutable, "k"}`).
    pub fn error_text(corr: u32, reason: impl Into<Bytes>) -> ResponseFrame {
        ResponseFrame { corr, body: ResponseBody::Error { reason: reason.into() } }
    }

    /// Appends the whole frame, length prefix included; see [`write_frame`].
    pub fn encode_frame(
        &self,
        max_frame_bytes: u32,
        dst: &mut BytesMut,
    ) -> Result<(), EncodeError> {
        write_frame(self, max_frame_bytes, dst)
    }

    fn error_code(&self) -> u16 {
        match self.body {
            ResponseBody::Ok(_) | ResponseBody::Push(_) => ERROR_CODE_OK,
            ResponseBody::Error { .. } => ERROR_CODE_ERROR,
        }
    }

    fn write_payload(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        match &self.body {
            ResponseBody::Ok(response) => response.write_payload(writer),
            ResponseBody::Push(push) => push.write(writer),
            ResponseBody::Error { reason } => writer.present_str(reason),
        }
    }
}

impl FrameBody for ResponseFrame {
    fn encode_body(&self, dst: &mut BytesMut) -> Result<(), EncodeError> {
        let start = dst.len();
        dst.put_u32(self.corr);
        dst.put_u16(self.error_code());
        let result = self.write_payload(&mut Writer::new(dst));
        if result.is_err() {
            dst.truncate(start);
        }
        result
    }
}

impl ResponseEnvelope {
    pub fn parse(mut body: Bytes) -> Result<ResponseEnvelope, BodyTooShort> {
        let Some(header) = body.get(..ENVELOPE_BYTES) else {
            return Err(BodyTooShort { len: body.len() });
        };
        let corr = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
        let error_code = u16::from_be_bytes([header[4], header[5]]);
        let payload = body.split_off(ENVELOPE_BYTES);
        Ok(ResponseEnvelope { corr, error_code, payload })
    }

    pub fn is_error(&self) -> bool {
        self.error_code != ERROR_CODE_OK
    }

    /// Decodes the payload: an error's reason whatever `expect` says, else per `expect`.
    pub fn decode(self, expect: Expect) -> Result<ResponseFrame, DecodeError> {
        let body = if self.is_error() {
            let mut reader = Reader::new(self.payload);
            let reason = reader.present_str("error reason")?;
            reader.finish()?;
            ResponseBody::Error { reason }
        } else {
            match expect {
                Expect::Reply(api_key) => {
                    ResponseBody::Ok(Response::decode_payload(api_key, self.payload)?)
                }
                Expect::StreamPush => ResponseBody::Push(StreamPush::decode(self.payload)?),
            }
        };
        Ok(ResponseFrame { corr: self.corr, body })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use proptest::test_runner::TestRunner;

    use super::*;
    use crate::arbitrary::{arb_response_for, arb_response_frame, arb_stream_push};
    use crate::frame::split_frame;
    use crate::limits::FRAME_BYTES_MAX_DEFAULT;
    use crate::vectors::hex;

    #[test]
    fn bodies_that_fail_to_decode() {
        use DecodeError::*;
        let fetch = Expect::Reply(ApiKey::Fetch);
        let cases: &[(&str, &str, Expect, DecodeError)] = &[
            ("absent error reason", "00000001 0001 00", fetch, AbsentStr { field: "error reason" }),
            (
                "error reason then a trailing byte",
                "00000001 0001 01 00000001 78 00",
                fetch,
                TrailingBytes { count: 1 },
            ),
            (
                "fetch answer without a cursor",
                "00000004 0000 00000000 00",
                fetch,
                AbsentStr { field: "next_cursor" },
            ),
            (
                "create_topic ok with a payload",
                "00000002 0000 00",
                Expect::Reply(ApiKey::CreateTopic),
                TrailingBytes { count: 1 },
            ),
            (
                "an ok frame on a stream_ack corr",
                "00000007 0000",
                Expect::Reply(ApiKey::StreamAck),
                NoReply { api_key: ApiKey::StreamAck },
            ),
            (
                "push kind 3",
                "00000010 0000 03 00000005",
                Expect::StreamPush,
                UnknownTag { field: "push kind", tag: 3 },
            ),
            (
                "broker status 3",
                "00000001 0000 0000000000000001 00 0001 00 00 0000 03 0000",
                Expect::Reply(ApiKey::ClusterState),
                UnknownTag { field: "broker status", tag: 3 },
            ),
            (
                "resolution 3",
                "00000001 0000 00 00 03 00 0000",
                Expect::Reply(ApiKey::GetTopicPolicy),
                UnknownTag { field: "resolution", tag: 3 },
            ),
        ];
        for (name, body, expect, expected) in cases {
            let envelope = ResponseEnvelope::parse(hex(body)).expect("6+ bytes");
            assert_eq!(envelope.decode(*expect), Err(*expected), "{name}");
        }
    }

    #[test]
    fn short_bodies_and_error_codes() {
        assert_eq!(ResponseEnvelope::parse(hex("0000000100")), Err(BodyTooShort { len: 5 }));
        // Any non-zero code is an error, whatever the client expected.
        let envelope =
            ResponseEnvelope::parse(hex("00000009 0002 01 00000001 78")).expect("parses");
        assert!(envelope.is_error());
        let expected = ResponseFrame::error_text(9, "x");
        assert_eq!(envelope.decode(Expect::StreamPush), Ok(expected));
    }

    fn assert_round_trip(frame: ResponseFrame, expect: Expect) -> Result<(), TestCaseError> {
        let mut dst = BytesMut::new();
        frame.encode_frame(FRAME_BYTES_MAX_DEFAULT, &mut dst).expect("encodes");
        let body = split_frame(&mut dst, FRAME_BYTES_MAX_DEFAULT);
        let body = body.expect("within the limit").expect("complete");
        prop_assert!(dst.is_empty());
        let envelope = ResponseEnvelope::parse(body).expect("6+ bytes");
        prop_assert_eq!(envelope.decode(expect), Ok(frame));
        Ok(())
    }

    /// Every key with an ok reply, each with its own runs, then pushes and errors.
    #[test]
    fn every_response_type_round_trips() {
        for key in ApiKey::ALL.iter().filter(|key| key.has_reply()) {
            let mut runner = TestRunner::new(ProptestConfig::with_cases(64));
            let strategy = (any::<u32>(), arb_response_for(*key));
            let result = runner.run(&strategy, |(corr, response)| {
                assert_round_trip(ResponseFrame::ok(corr, response), Expect::Reply(*key))
            });
            result.unwrap_or_else(|failure| panic!("{key}: {failure}"));
        }
        let mut runner = TestRunner::new(ProptestConfig::with_cases(256));
        let result = runner.run(&(any::<u32>(), arb_stream_push()), |(corr, push)| {
            assert_round_trip(ResponseFrame::push(corr, push), Expect::StreamPush)
        });
        result.unwrap_or_else(|failure| panic!("push: {failure}"));
    }

    proptest! {
        #[test]
        fn mixed_frames_round_trip((frame, expect) in arb_response_frame()) {
            assert_round_trip(frame, expect)?;
        }

        #[test]
        fn arbitrary_payloads_never_panic(
            payload in proptest::collection::vec(any::<u8>(), 0..256),
            error_code in 0_u16..3,
        ) {
            let expects = ApiKey::ALL.iter().map(|key| Expect::Reply(*key));
            for expect in expects.chain([Expect::StreamPush]) {
                let envelope = ResponseEnvelope {
                    corr: 1,
                    error_code,
                    payload: Bytes::from(payload.clone()),
                };
                let _ = envelope.decode(expect);
            }
        }

        #[test]
        fn truncated_and_mutated_frames_never_panic(
            (frame, expect) in arb_response_frame(),
            flip_at in any::<prop::sample::Index>(),
            flip_to in any::<u8>(),
        ) {
            let mut dst = BytesMut::new();
            frame.encode_frame(FRAME_BYTES_MAX_DEFAULT, &mut dst).expect("encodes");
            let whole = dst.freeze();
            for cut in 4..whole.len() {
                if let Ok(envelope) = ResponseEnvelope::parse(whole.slice(4..cut)) {
                    let _ = envelope.decode(expect);
                }
            }
            let mut mutated = whole[4..].to_vec();
            let at = flip_at.index(mutated.len());
            mutated[at] = flip_to;
            if let Ok(envelope) = ResponseEnvelope::parse(Bytes::from(mutated)) {
                let _ = envelope.decode(expect);
            }
        }
    }
}
