//! Proptest strategies for every request, response and push, for the round-trip and
//! never-panic properties beside the code.
//!
//! Each strategy is chosen by an exhaustive `match` over [`ApiKey`], so a new key does not
//! compile until it has a generator, and the round-trip properties cannot skip a type.

use bytes::{Bytes, BytesMut};
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use proptest::sample::select;

use crate::api_key::ApiKey;
use crate::batch::{Codec, PlainEntry, PositionedEntry, encode_batch};
use crate::layout::Sample;
use crate::messages::*;
use crate::record::Record;
use crate::request::{Request, RequestFrame};
use crate::response::{Expect, Response, ResponseFrame};
use crate::shapes::{Accept, PolicyValue, Position, RouteSegment, Start};

pub(crate) fn arb_request_frame() -> impl Strategy<Value = RequestFrame> {
    (any::<u32>(), arb_request()).prop_map(|(corr, request)| RequestFrame::new(corr, request))
}

pub(crate) fn arb_request() -> impl Strategy<Value = Request> {
    select(ApiKey::ALL).prop_flat_map(arb_request_for)
}

/// A response frame and what the client expects on its `corr`: an ok answer, a push or an
/// error.
pub(crate) fn arb_response_frame() -> impl Strategy<Value = (ResponseFrame, Expect)> {
    let replies =
        select(ApiKey::ALL.iter().copied().filter(|key| key.has_reply()).collect::<Vec<_>>());
    let ok =
        (any::<u32>(), replies.prop_flat_map(arb_response_for)).prop_map(|(corr, response)| {
            let expect = Expect::Reply(response.api_key());
            (ResponseFrame::ok(corr, response), expect)
        });
    let push = (any::<u32>(), arb_stream_push())
        .prop_map(|(corr, push)| (ResponseFrame::push(corr, push), Expect::StreamPush));
    let error = (any::<u32>(), bytes(40), select(ApiKey::ALL)).prop_map(|(corr, reason, key)| {
        (ResponseFrame::error_text(corr, reason), Expect::Reply(key))
    });
    prop_oneof![6 => ok, 2 => push, 1 => error]
}

pub(crate) fn arb_request_for(key: ApiKey) -> BoxedStrategy<Request> {
    match key {
        ApiKey::Auth => sample(Request::Auth),
        ApiKey::CreateTopic => sample(Request::CreateTopic),
        ApiKey::Produce => sample(Request::Produce),
        ApiKey::Fetch => sample(Request::Fetch),
        ApiKey::Commit => sample(Request::Commit),
        ApiKey::Subscribe => sample(Request::Subscribe),
        ApiKey::StreamAck => sample(Request::StreamAck),
        ApiKey::LeaveGroup => sample(Request::LeaveGroup),
        ApiKey::CreateUser => sample(Request::CreateUser),
        ApiKey::DeleteUser => sample(Request::DeleteUser),
        ApiKey::ChangePassword => sample(Request::ChangePassword),
        ApiKey::ListUsers => sample(Request::ListUsers),
        ApiKey::MtlsAuth => sample(Request::MtlsAuth),
        ApiKey::TokenAuth => sample(Request::TokenAuth),
        ApiKey::GrantAcl => sample(Request::GrantAcl),
        ApiKey::RevokeAcl => sample(Request::RevokeAcl),
        ApiKey::ListAcls => sample(Request::ListAcls),
        ApiKey::DefinePolicy => sample(Request::DefinePolicy),
        ApiKey::DeletePolicy => sample(Request::DeletePolicy),
        ApiKey::ListPolicies => sample(Request::ListPolicies),
        ApiKey::BindTopicPolicy => sample(Request::BindTopicPolicy),
        ApiKey::GetTopicPolicy => sample(Request::GetTopicPolicy),
        ApiKey::SetRole => sample(Request::SetRole),
        ApiKey::ListUsersWithRoles => sample(Request::ListUsersWithRoles),
        ApiKey::ClusterState => sample(Request::ClusterState),
        ApiKey::TopicRoutes => sample(Request::TopicRoutes),
        ApiKey::OpenStream => sample(Request::OpenStream),
        ApiKey::Append => (AppendRequest::arbitrary(), arb_plain_batch())
            .prop_map(|(append, batch)| Request::Append(AppendRequest { batch, ..append }))
            .boxed(),
        ApiKey::CloseStream => sample(Request::CloseStream),
        ApiKey::OpenConsume => sample(Request::OpenConsume),
        ApiKey::ConsumeAck => sample(Request::ConsumeAck),
        ApiKey::FetchRange => sample(Request::FetchRange),
        ApiKey::JoinGroup => sample(Request::JoinGroup),
        ApiKey::GroupHeartbeat => sample(Request::GroupHeartbeat),
        ApiKey::CommitOffsets => sample(Request::CommitOffsets),
        ApiKey::ListTopics => sample(Request::ListTopics),
        ApiKey::DescribeTopic => sample(Request::DescribeTopic),
        ApiKey::DeleteTopic => sample(Request::DeleteTopic),
        ApiKey::SplitRange => sample(Request::SplitRange),
        ApiKey::MergeRanges => sample(Request::MergeRanges),
        ApiKey::CreateTopicRanges => sample(Request::CreateTopicRanges),
        ApiKey::ClusterStatus => sample(Request::ClusterStatus),
        ApiKey::RemoveBroker => sample(Request::RemoveBroker),
        ApiKey::DescribeSegments => sample(Request::DescribeSegments),
        ApiKey::GroupLag => sample(Request::GroupLag),
        ApiKey::DrainBroker => sample(Request::DrainBroker),
    }
}

pub(crate) fn arb_response_for(key: ApiKey) -> BoxedStrategy<Response> {
    match key {
        ApiKey::Auth => sample(Response::Auth),
        ApiKey::MtlsAuth => sample(Response::MtlsAuth),
        ApiKey::TokenAuth => sample(Response::TokenAuth),
        ApiKey::CreateTopic => sample(Response::CreateTopic),
        ApiKey::Produce => sample(Response::Produce),
        ApiKey::Fetch => sample(Response::Fetch),
        ApiKey::Commit => sample(Response::Commit),
        ApiKey::Subscribe => sample(Response::Subscribe),
        ApiKey::LeaveGroup => sample(Response::LeaveGroup),
        ApiKey::CreateUser => sample(Response::CreateUser),
        ApiKey::DeleteUser => sample(Response::DeleteUser),
        ApiKey::ChangePassword => sample(Response::ChangePassword),
        ApiKey::ListUsers => sample(Response::ListUsers),
        ApiKey::GrantAcl => sample(Response::GrantAcl),
        ApiKey::RevokeAcl => sample(Response::RevokeAcl),
        ApiKey::ListAcls => sample(Response::ListAcls),
        ApiKey::DefinePolicy => sample(Response::DefinePolicy),
        ApiKey::DeletePolicy => sample(Response::DeletePolicy),
        ApiKey::ListPolicies => sample(Response::ListPolicies),
        ApiKey::BindTopicPolicy => sample(Response::BindTopicPolicy),
        ApiKey::GetTopicPolicy => sample(Response::GetTopicPolicy),
        ApiKey::SetRole => sample(Response::SetRole),
        ApiKey::ListUsersWithRoles => sample(Response::ListUsersWithRoles),
        ApiKey::ClusterState => sample(Response::ClusterState),
        ApiKey::TopicRoutes => sample(Response::TopicRoutes),
        ApiKey::OpenStream => sample(Response::OpenStream),
        ApiKey::CloseStream => sample(Response::CloseStream),
        ApiKey::OpenConsume => sample(Response::OpenConsume),
        ApiKey::FetchRange => arb_page().prop_map(Response::FetchRange).boxed(),
        ApiKey::JoinGroup => sample(Response::JoinGroup),
        ApiKey::GroupHeartbeat => sample(Response::GroupHeartbeat),
        ApiKey::CommitOffsets => sample(Response::CommitOffsets),
        ApiKey::ListTopics => sample(Response::ListTopics),
        ApiKey::DescribeTopic => sample(Response::DescribeTopic),
        ApiKey::DeleteTopic => sample(Response::DeleteTopic),
        ApiKey::SplitRange => sample(Response::SplitRange),
        ApiKey::MergeRanges => sample(Response::MergeRanges),
        ApiKey::CreateTopicRanges => sample(Response::CreateTopicRanges),
        ApiKey::ClusterStatus => sample(Response::ClusterStatus),
        ApiKey::RemoveBroker => sample(Response::RemoveBroker),
        ApiKey::DescribeSegments => sample(Response::DescribeSegments),
        ApiKey::GroupLag => sample(Response::GroupLag),
        ApiKey::DrainBroker => sample(Response::DrainBroker),
        ApiKey::StreamAck | ApiKey::Append | ApiKey::ConsumeAck => {
            unreachable!("{key} has no ok reply; callers filter with has_reply")
        }
    }
}

/// Arbitrary values of a payload shape, wrapped in its request or response variant.
fn sample<T: Sample, W: std::fmt::Debug + 'static>(wrap: fn(T) -> W) -> BoxedStrategy<W> {
    T::arbitrary().prop_map(wrap).boxed()
}

/// Pushes carry real pages half the time (see [`arb_page`]).
pub(crate) fn arb_stream_push() -> impl Strategy<Value = StreamPush> {
    let kind = prop_oneof![
        AppendAck::arbitrary().prop_map(PushKind::AppendAck),
        Moved::arbitrary().prop_map(PushKind::Moved),
        arb_page().prop_map(PushKind::Records),
    ];
    (any::<u32>(), kind).prop_map(|(stream_id, kind)| StreamPush { stream_id, kind })
}

fn bytes(len_max: usize) -> impl Strategy<Value = Bytes> + Clone {
    vec(any::<u8>(), 0..len_max).prop_map(Bytes::from)
}

fn opt_str() -> impl Strategy<Value = Option<Bytes>> + Clone {
    option::of(bytes(8))
}

pub(crate) fn arb_record() -> impl Strategy<Value = Record> {
    Record::arbitrary()
}

/// The shapes written by hand (tagged unions and empty payloads) sample as the generated ones
/// do, so they can be fields of generated shapes.
macro_rules! hand_sample {
    ($ty:ty, $minimal:expr, $arbitrary:expr) => {
        impl Sample for $ty {
            fn minimal() -> Self {
                $minimal
            }

            fn arbitrary() -> BoxedStrategy<Self> {
                $arbitrary.boxed()
            }
        }
    };
}

hand_sample!(Empty, Empty, Just(Empty));
hand_sample!(IgnoredPayload, IgnoredPayload, Just(IgnoredPayload));
hand_sample!(Accept, Accept::default(), any::<u8>().prop_map(Accept));
hand_sample!(
    PolicyValue,
    PolicyValue::Null,
    prop_oneof![
        Just(PolicyValue::Null),
        any::<u64>().prop_map(PolicyValue::Integer),
        bytes(8).prop_map(PolicyValue::String),
    ]
);
hand_sample!(
    RouteSegment,
    RouteSegment::Unassigned,
    prop_oneof![
        Just(RouteSegment::Unassigned),
        (any::<u32>(), opt_str())
            .prop_map(|(segment, primary)| RouteSegment::Assigned { segment, primary }),
    ]
);
hand_sample!(
    Start,
    Start::Earliest,
    prop_oneof![
        Just(Start::Earliest),
        Just(Start::Latest),
        Position::arbitrary().prop_map(Start::Position),
        opt_str().prop_map(Start::Group),
    ]
);

/// Batches are opaque at the envelope level: half real codec-0 batches, half arbitrary bytes.
fn arb_plain_batch() -> impl Strategy<Value = Bytes> {
    let entry = (any::<bool>(), arb_record())
        .prop_map(|(tombstone, record)| PlainEntry { tombstone, record });
    let encoded = vec(entry, 0..3).prop_map(|entries| encoded_batch(&entries));
    prop_oneof![encoded, bytes(24)]
}

/// Pages carry real codec-0 batches of positioned entries half the time, arbitrary bytes
/// otherwise.
fn arb_page() -> impl Strategy<Value = Page> {
    let entry = (Position::arbitrary(), any::<bool>(), arb_record())
        .prop_map(|(position, tombstone, record)| PositionedEntry { position, tombstone, record });
    let batch =
        prop_oneof![vec(entry, 0..3).prop_map(|entries| encoded_batch(&entries)), bytes(24)];
    (Page::arbitrary(), batch).prop_map(|(page, batch)| Page { batch, ..page })
}

fn encoded_batch<E: crate::batch::BatchEntry>(entries: &[E]) -> Bytes {
    let mut dst = BytesMut::new();
    encode_batch(entries, Codec::None, &mut dst).expect("small batches encode");
    dst.freeze()
}
