//! Proptest strategies for every request, response and push, for the round-trip and
//! never-panic properties beside the code.
//!
//! Each strategy is chosen by an exhaustive `match` over [`ApiKey`], so a new key does not
//! compile until it has a generator, and the round-trip properties cannot skip a type.

use std::num::NonZeroU32;

use bytes::{Bytes, BytesMut};
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use proptest::sample::select;

use crate::api_key::ApiKey;
use crate::batch::{Codec, PlainEntry, PositionedEntry, encode_batch};
use crate::messages::*;
use crate::record::{Header, Record};
use crate::request::{Request, RequestFrame};
use crate::response::{Expect, Response, ResponseFrame};
use crate::shapes::{Accept, PolicyField, PolicyValue, Position, RouteSegment, Start};

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
        ApiKey::Auth => (opt_str(), opt_str())
            .prop_map(|(username, password)| Request::Auth(AuthRequest { username, password }))
            .boxed(),
        ApiKey::CreateTopic => (opt_str(), any::<u8>())
            .prop_map(|(topic, keyspace_bits)| {
                Request::CreateTopic(CreateTopicRequest { topic, keyspace_bits })
            })
            .boxed(),
        ApiKey::Produce => (opt_str(), vec(arb_record(), 0..4))
            .prop_map(|(topic, records)| Request::Produce(ProduceRequest { topic, records }))
            .boxed(),
        ApiKey::Fetch => (opt_str(), opt_str(), opt_str(), opt_str(), any::<u32>(), any::<u32>())
            .prop_map(|(topic, cursor, group, member, max_records, wait_ms)| {
                Request::Fetch(FetchRequest { topic, cursor, group, member, max_records, wait_ms })
            })
            .boxed(),
        ApiKey::Commit => (opt_str(), opt_str(), opt_str())
            .prop_map(|(topic, group, cursor)| {
                Request::Commit(CommitRequest { topic, group, cursor })
            })
            .boxed(),
        ApiKey::Subscribe => (opt_str(), opt_str(), opt_str(), any::<u32>(), any::<u32>())
            .prop_map(|(topic, group, member, window_records, max_records)| {
                Request::Subscribe(SubscribeRequest {
                    topic,
                    group,
                    member,
                    window_records,
                    max_records,
                })
            })
            .boxed(),
        ApiKey::StreamAck => (opt_str(), opt_str(), opt_str(), opt_str(), any::<u32>())
            .prop_map(|(topic, group, member, cursor, count)| {
                Request::StreamAck(StreamAckRequest { topic, group, member, cursor, count })
            })
            .boxed(),
        ApiKey::LeaveGroup => (opt_str(), opt_str(), opt_str())
            .prop_map(|(topic, group, member)| {
                Request::LeaveGroup(LeaveGroupRequest { topic, group, member })
            })
            .boxed(),
        ApiKey::CreateUser => (opt_str(), opt_str(), vec(opt_str(), 0..4))
            .prop_map(|(username, password, permissions)| {
                Request::CreateUser(CreateUserRequest { username, password, permissions })
            })
            .boxed(),
        ApiKey::DeleteUser => opt_str()
            .prop_map(|username| Request::DeleteUser(DeleteUserRequest { username }))
            .boxed(),
        ApiKey::ChangePassword => (opt_str(), opt_str())
            .prop_map(|(username, new_password)| {
                Request::ChangePassword(ChangePasswordRequest { username, new_password })
            })
            .boxed(),
        ApiKey::ListUsers => Just(Request::ListUsers(IgnoredPayload)).boxed(),
        ApiKey::MtlsAuth => Just(Request::MtlsAuth(Empty)).boxed(),
        ApiKey::TokenAuth => {
            opt_str().prop_map(|jwt| Request::TokenAuth(TokenAuthRequest { jwt })).boxed()
        }
        ApiKey::GrantAcl => arb_acl_request().prop_map(Request::GrantAcl).boxed(),
        ApiKey::RevokeAcl => arb_acl_request().prop_map(Request::RevokeAcl).boxed(),
        ApiKey::ListAcls => {
            opt_str().prop_map(|username| Request::ListAcls(ListAclsRequest { username })).boxed()
        }
        ApiKey::DefinePolicy => (opt_str(), vec(arb_policy_field(), 0..4))
            .prop_map(|(name, fields)| Request::DefinePolicy(DefinePolicyRequest { name, fields }))
            .boxed(),
        ApiKey::DeletePolicy => (opt_str(), any::<bool>())
            .prop_map(|(name, force)| Request::DeletePolicy(DeletePolicyRequest { name, force }))
            .boxed(),
        ApiKey::ListPolicies => Just(Request::ListPolicies(Empty)).boxed(),
        ApiKey::BindTopicPolicy => (opt_str(), opt_str())
            .prop_map(|(topic, name)| {
                Request::BindTopicPolicy(BindTopicPolicyRequest { topic, name })
            })
            .boxed(),
        ApiKey::GetTopicPolicy => opt_str()
            .prop_map(|topic| Request::GetTopicPolicy(GetTopicPolicyRequest { topic }))
            .boxed(),
        ApiKey::SetRole => (opt_str(), opt_str())
            .prop_map(|(username, role)| Request::SetRole(SetRoleRequest { username, role }))
            .boxed(),
        ApiKey::ListUsersWithRoles => Just(Request::ListUsersWithRoles(IgnoredPayload)).boxed(),
        ApiKey::ClusterState => Just(Request::ClusterState(Empty)).boxed(),
        ApiKey::TopicRoutes => {
            opt_str().prop_map(|topic| Request::TopicRoutes(TopicRoutesRequest { topic })).boxed()
        }
        ApiKey::OpenStream => arb_open_stream().prop_map(Request::OpenStream).boxed(),
        ApiKey::Append => (any::<u32>(), any::<u64>(), arb_plain_batch())
            .prop_map(|(stream_id, sequence, batch)| {
                Request::Append(AppendRequest { stream_id, sequence, batch })
            })
            .boxed(),
        ApiKey::CloseStream => any::<u32>()
            .prop_map(|stream_id| Request::CloseStream(CloseStreamRequest { stream_id }))
            .boxed(),
        ApiKey::OpenConsume => arb_open_consume().prop_map(Request::OpenConsume).boxed(),
        ApiKey::ConsumeAck => (any::<u32>(), arb_position(), any::<u32>())
            .prop_map(|(stream_id, position, window)| {
                Request::ConsumeAck(ConsumeAckRequest { stream_id, position, window })
            })
            .boxed(),
        ApiKey::FetchRange => arb_fetch_range().prop_map(Request::FetchRange).boxed(),
        ApiKey::JoinGroup => (opt_str(), opt_str(), opt_str())
            .prop_map(|(topic, group, member)| {
                Request::JoinGroup(JoinGroupRequest { topic, group, member })
            })
            .boxed(),
        ApiKey::GroupHeartbeat => (opt_str(), opt_str(), opt_str(), any::<u64>())
            .prop_map(|(topic, group, member, generation)| {
                Request::GroupHeartbeat(GroupHeartbeatRequest { topic, group, member, generation })
            })
            .boxed(),
        ApiKey::CommitOffsets => arb_commit_offsets().prop_map(Request::CommitOffsets).boxed(),
        ApiKey::ListTopics => Just(Request::ListTopics(Empty)).boxed(),
        ApiKey::DescribeTopic => opt_str()
            .prop_map(|topic| Request::DescribeTopic(DescribeTopicRequest { topic }))
            .boxed(),
        ApiKey::DeleteTopic => {
            opt_str().prop_map(|topic| Request::DeleteTopic(DeleteTopicRequest { topic })).boxed()
        }
        ApiKey::SplitRange => (opt_str(), any::<u32>())
            .prop_map(|(topic, range_id)| {
                Request::SplitRange(SplitRangeRequest { topic, range_id })
            })
            .boxed(),
        ApiKey::MergeRanges => (opt_str(), any::<u32>(), any::<u32>())
            .prop_map(|(topic, left, right)| {
                Request::MergeRanges(MergeRangesRequest { topic, left, right })
            })
            .boxed(),
        ApiKey::CreateTopicRanges => (opt_str(), any::<u32>())
            .prop_map(|(topic, initial_ranges)| {
                Request::CreateTopicRanges(CreateTopicRangesRequest { topic, initial_ranges })
            })
            .boxed(),
        ApiKey::ClusterStatus => Just(Request::ClusterStatus(Empty)).boxed(),
        ApiKey::RemoveBroker => (any::<u64>(), any::<bool>())
            .prop_map(|(node_id, force)| {
                Request::RemoveBroker(RemoveBrokerRequest { node_id, force })
            })
            .boxed(),
        ApiKey::DescribeSegments => opt_str()
            .prop_map(|topic| Request::DescribeSegments(DescribeSegmentsRequest { topic }))
            .boxed(),
        ApiKey::GroupLag => (opt_str(), opt_str())
            .prop_map(|(topic, group)| Request::GroupLag(GroupLagRequest { topic, group }))
            .boxed(),
        ApiKey::DrainBroker => (any::<u64>(), any::<bool>())
            .prop_map(|(node_id, draining)| {
                Request::DrainBroker(DrainBrokerRequest { node_id, draining })
            })
            .boxed(),
    }
}

fn arb_cluster_status() -> impl Strategy<Value = ClusterStatusResponse> {
    let broker = (any::<u64>(), opt_str(), opt_str(), any::<u8>(), vec(opt_str(), 0..3)).prop_map(
        |(node_id, cluster_address, client_address, status, attributes)| ClusterBroker {
            node_id,
            cluster_address,
            client_address,
            status,
            attributes,
        },
    );
    let ids = || vec(any::<u64>(), 0..4);
    let group = (any::<u64>(), any::<u64>(), any::<u64>(), ids(), ids()).prop_map(
        |(group_id, leader, term, voters, learners)| ClusterGroup {
            group_id,
            leader,
            term,
            voters,
            learners,
        },
    );
    (any::<u64>(), opt_str(), vec(broker, 0..3), vec(group, 0..3), any::<u16>()).prop_map(
        |(node_id, cluster_id, brokers, groups, replicas_wanted)| ClusterStatusResponse {
            node_id,
            cluster_id,
            brokers,
            groups,
            replicas_wanted,
        },
    )
}

pub(crate) fn arb_response_for(key: ApiKey) -> BoxedStrategy<Response> {
    let token = || opt_str().prop_map(|token| TokenResponse { token });
    match key {
        ApiKey::Auth => token().prop_map(Response::Auth).boxed(),
        ApiKey::MtlsAuth => token().prop_map(Response::MtlsAuth).boxed(),
        ApiKey::TokenAuth => token().prop_map(Response::TokenAuth).boxed(),
        ApiKey::CreateTopic => Just(Response::CreateTopic(Empty)).boxed(),
        ApiKey::Produce => {
            any::<u32>().prop_map(|count| Response::Produce(ProduceResponse { count })).boxed()
        }
        ApiKey::Fetch => arb_fetch_response().prop_map(Response::Fetch).boxed(),
        ApiKey::Commit => Just(Response::Commit(Empty)).boxed(),
        ApiKey::Subscribe => arb_fetch_response().prop_map(Response::Subscribe).boxed(),
        ApiKey::LeaveGroup => Just(Response::LeaveGroup(Empty)).boxed(),
        ApiKey::CreateUser => Just(Response::CreateUser(Empty)).boxed(),
        ApiKey::DeleteUser => Just(Response::DeleteUser(Empty)).boxed(),
        ApiKey::ChangePassword => Just(Response::ChangePassword(Empty)).boxed(),
        ApiKey::ListUsers => vec((opt_str(), vec(opt_str(), 0..3)), 0..3)
            .prop_map(|users| {
                let users = users
                    .into_iter()
                    .map(|(username, permissions)| UserPermissions { username, permissions })
                    .collect();
                Response::ListUsers(ListUsersResponse { users })
            })
            .boxed(),
        ApiKey::GrantAcl => Just(Response::GrantAcl(Empty)).boxed(),
        ApiKey::RevokeAcl => Just(Response::RevokeAcl(Empty)).boxed(),
        ApiKey::ListAcls => vec((opt_str(), opt_str()), 0..3)
            .prop_map(|acls| {
                let acls = acls
                    .into_iter()
                    .map(|(operation, resource)| AclEntry { operation, resource })
                    .collect();
                Response::ListAcls(ListAclsResponse { acls })
            })
            .boxed(),
        ApiKey::DefinePolicy => Just(Response::DefinePolicy(Empty)).boxed(),
        ApiKey::DeletePolicy => Just(Response::DeletePolicy(Empty)).boxed(),
        ApiKey::ListPolicies => vec((opt_str(), vec(arb_policy_field(), 0..3)), 0..3)
            .prop_map(|policies| {
                let policies = policies
                    .into_iter()
                    .map(|(name, fields)| NamedPolicy { name, fields })
                    .collect();
                Response::ListPolicies(ListPoliciesResponse { policies })
            })
            .boxed(),
        ApiKey::BindTopicPolicy => Just(Response::BindTopicPolicy(Empty)).boxed(),
        ApiKey::GetTopicPolicy => arb_topic_policy().prop_map(Response::GetTopicPolicy).boxed(),
        ApiKey::SetRole => Just(Response::SetRole(Empty)).boxed(),
        ApiKey::ListUsersWithRoles => vec((opt_str(), vec(opt_str(), 0..3), opt_str()), 0..3)
            .prop_map(|users| {
                let users = users
                    .into_iter()
                    .map(|(username, permissions, role)| UserWithRole {
                        username,
                        permissions,
                        role,
                    })
                    .collect();
                Response::ListUsersWithRoles(ListUsersWithRolesResponse { users })
            })
            .boxed(),
        ApiKey::ClusterState => arb_cluster_state().prop_map(Response::ClusterState).boxed(),
        ApiKey::TopicRoutes => arb_topic_routes().prop_map(Response::TopicRoutes).boxed(),
        ApiKey::OpenStream => {
            (any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>(), any::<u64>())
                .prop_map(|(stream_id, segment, window_appends, window_bytes, routes_version)| {
                    Response::OpenStream(OpenStreamResponse {
                        stream_id,
                        segment,
                        window_appends,
                        window_bytes,
                        routes_version,
                    })
                })
                .boxed()
        }
        ApiKey::CloseStream => Just(Response::CloseStream(Empty)).boxed(),
        ApiKey::OpenConsume => (any::<u32>(), arb_position())
            .prop_map(|(stream_id, position)| {
                Response::OpenConsume(OpenConsumeResponse { stream_id, position })
            })
            .boxed(),
        ApiKey::FetchRange => arb_page().prop_map(Response::FetchRange).boxed(),
        ApiKey::JoinGroup => arb_assignment().prop_map(Response::JoinGroup).boxed(),
        ApiKey::GroupHeartbeat => arb_assignment().prop_map(Response::GroupHeartbeat).boxed(),
        ApiKey::CommitOffsets => Just(Response::CommitOffsets(Empty)).boxed(),
        ApiKey::ListTopics => vec(opt_str(), 0..4)
            .prop_map(|topics| Response::ListTopics(ListTopicsResponse { topics }))
            .boxed(),
        ApiKey::DescribeTopic => arb_describe_topic().prop_map(Response::DescribeTopic).boxed(),
        ApiKey::DeleteTopic => Just(Response::DeleteTopic(Empty)).boxed(),
        ApiKey::SplitRange => (any::<u32>(), any::<u32>())
            .prop_map(|(low, high)| Response::SplitRange(SplitRangeResponse { low, high }))
            .boxed(),
        ApiKey::MergeRanges => any::<u32>()
            .prop_map(|range_id| Response::MergeRanges(MergeRangesResponse { range_id }))
            .boxed(),
        ApiKey::CreateTopicRanges => Just(Response::CreateTopicRanges(Empty)).boxed(),
        ApiKey::ClusterStatus => arb_cluster_status().prop_map(Response::ClusterStatus).boxed(),
        ApiKey::RemoveBroker => Just(Response::RemoveBroker(Empty)).boxed(),
        ApiKey::DescribeSegments => {
            arb_describe_segments().prop_map(Response::DescribeSegments).boxed()
        }
        ApiKey::GroupLag => arb_group_lag().prop_map(Response::GroupLag).boxed(),
        ApiKey::DrainBroker => {
            (any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>())
                .prop_map(|(told, moved, kept, rolled, left)| {
                    Response::DrainBroker(DrainBrokerResponse {
                        brokers_told: told,
                        leaderships_moved: moved,
                        leaderships_kept: kept,
                        heads_rolled: rolled,
                        heads_left: left,
                    })
                })
                .boxed()
        }
        ApiKey::StreamAck | ApiKey::Append | ApiKey::ConsumeAck => {
            unreachable!("{key} has no ok reply; callers filter with has_reply")
        }
    }
}

pub(crate) fn arb_stream_push() -> impl Strategy<Value = StreamPush> {
    let failure =
        (any::<u64>(), opt_str()).prop_map(|(sequence, reason)| AppendFailure { sequence, reason });
    let ack = (any::<u64>(), any::<u32>(), any::<u32>(), vec(failure, 0..3)).prop_map(
        |(acked_sequence, window_appends, window_bytes, errors)| {
            PushKind::AppendAck(AppendAck { acked_sequence, window_appends, window_bytes, errors })
        },
    );
    let target = (any::<u32>(), arb_route_segment())
        .prop_map(|(range, segment)| MovedTarget { range, segment });
    let moved = (opt_str(), any::<u64>(), vec(target, 0..3)).prop_map(
        |(reason, routes_version, targets)| {
            PushKind::Moved(Moved { reason, routes_version, targets })
        },
    );
    let records = arb_page().prop_map(PushKind::Records);
    (any::<u32>(), prop_oneof![ack, moved, records])
        .prop_map(|(stream_id, kind)| StreamPush { stream_id, kind })
}

fn bytes(len_max: usize) -> impl Strategy<Value = Bytes> + Clone {
    vec(any::<u8>(), 0..len_max).prop_map(Bytes::from)
}

fn opt_str() -> impl Strategy<Value = Option<Bytes>> + Clone {
    option::of(bytes(8))
}

fn nonzero() -> impl Strategy<Value = NonZeroU32> {
    (1..=u32::MAX).prop_map(|value| NonZeroU32::new(value).expect("1.. is not zero"))
}

pub(crate) fn arb_record() -> impl Strategy<Value = Record> {
    let header = (bytes(6), bytes(6)).prop_map(|(name, value)| Header { name, value });
    (opt_str(), bytes(16), any::<u64>(), vec(header, 0..3)).prop_map(
        |(key, value, timestamp_ms, headers)| Record { key, value, timestamp_ms, headers },
    )
}

fn arb_fetch_response() -> impl Strategy<Value = FetchResponse> {
    (vec(arb_record(), 0..3), bytes(12))
        .prop_map(|(records, next_cursor)| FetchResponse { records, next_cursor })
}

fn arb_acl_request() -> impl Strategy<Value = AclRequest> {
    (opt_str(), opt_str(), opt_str()).prop_map(|(username, operation, pattern)| AclRequest {
        username,
        operation,
        pattern,
    })
}

fn arb_policy_value() -> impl Strategy<Value = PolicyValue> + Clone {
    prop_oneof![
        Just(PolicyValue::Null),
        any::<u64>().prop_map(PolicyValue::Integer),
        bytes(8).prop_map(PolicyValue::String),
    ]
}

fn arb_policy_field() -> impl Strategy<Value = PolicyField> + Clone {
    (opt_str(), arb_policy_value()).prop_map(|(name, value)| PolicyField { name, value })
}

fn arb_topic_policy() -> impl Strategy<Value = TopicPolicyResponse> {
    let resolution = select(vec![Resolution::None, Resolution::Resolved, Resolution::Unresolved]);
    let origin = select(vec![Origin::Global, Origin::Policy, Origin::UnresolvedBackstop]);
    let effective = (opt_str(), arb_policy_value(), origin)
        .prop_map(|(name, value, origin)| EffectiveField { name, value, origin });
    let definition = option::of(vec(arb_policy_field(), 0..3));
    (opt_str(), opt_str(), resolution, definition, vec(effective, 0..3)).prop_map(
        |(topic, policy, resolution, definition, effective)| TopicPolicyResponse {
            topic,
            policy,
            resolution,
            definition,
            effective,
        },
    )
}

fn arb_cluster_state() -> impl Strategy<Value = ClusterStateResponse> {
    let status = select(vec![BrokerStatus::Alive, BrokerStatus::Suspect, BrokerStatus::Dead]);
    let broker = (opt_str(), opt_str(), any::<u16>(), status)
        .prop_map(|(id, host, port, status)| Broker { id, host, port, status });
    (any::<u64>(), any::<bool>(), vec(broker, 0..3), vec(any::<u32>(), 0..4)).prop_map(
        |(version, streams_enabled, brokers, vnodes)| ClusterStateResponse {
            version,
            streams_enabled,
            brokers,
            vnodes,
        },
    )
}

fn arb_topic_routes() -> impl Strategy<Value = TopicRoutesResponse> {
    let state = select(vec![RangeState::Active, RangeState::Sealed]);
    let range = (any::<u32>(), any::<u64>(), any::<u64>(), state, arb_route_segment()).prop_map(
        |(range, key_start, key_end, state, segment)| RangeRoute {
            range,
            key_start,
            key_end,
            state,
            segment,
        },
    );
    (opt_str(), any::<u64>(), any::<u8>(), vec(range, 0..3)).prop_map(
        |(topic, version, keyspace_bits, ranges)| TopicRoutesResponse {
            topic,
            version,
            keyspace_bits,
            ranges,
        },
    )
}

fn arb_describe_topic() -> impl Strategy<Value = DescribeTopicResponse> {
    let state = select(vec![RangeState::Active, RangeState::Sealed]);
    let bounds = (any::<u32>(), any::<u64>(), any::<u64>(), state);
    let family = (vec(any::<u32>(), 0..3), vec(any::<u32>(), 0..3));
    let counts = (any::<u32>(), any::<u64>(), any::<u64>());
    let range = (bounds, family, counts).prop_map(
        |(
            (range_id, start, end_inclusive, state),
            (parents, children),
            (segments, records, expired_records),
        )| RangeDescription {
            range_id,
            start,
            end_inclusive,
            state,
            parents,
            children,
            segments,
            records,
            expired_records,
        },
    );
    (opt_str(), any::<u64>(), any::<u64>(), opt_str(), vec(range, 0..3)).prop_map(
        |(topic, topic_id, created_ms, policy, ranges)| DescribeTopicResponse {
            topic,
            topic_id,
            created_ms,
            policy,
            ranges,
        },
    )
}

fn arb_describe_segments() -> impl Strategy<Value = DescribeSegmentsResponse> {
    let copy = (any::<u64>(), any::<bool>(), any::<bool>(), any::<u64>(), any::<bool>()).prop_map(
        |(node_id, settled, answered, durable_offset, sealed)| CopyDescription {
            node_id,
            settled,
            answered,
            durable_offset,
            sealed,
        },
    );
    let state = select(vec![SegmentState::Active, SegmentState::Sealed]);
    let place = (any::<u32>(), any::<u64>(), any::<u64>());
    let seal = (state, any::<u64>(), any::<u64>());
    let segment = (place, seal, vec(copy, 0..4)).prop_map(
        |((range_id, segment_id, base_records), (state, end_offset, data_bytes), copies)| {
            SegmentDescription {
                range_id,
                segment_id,
                base_records,
                state,
                end_offset,
                data_bytes,
                copies,
            }
        },
    );
    (opt_str(), vec(segment, 0..3))
        .prop_map(|(topic, segments)| DescribeSegmentsResponse { topic, segments })
}

fn arb_group_lag() -> impl Strategy<Value = GroupLagResponse> {
    let state = select(vec![RangeState::Active, RangeState::Sealed]);
    let standing = select(vec![LagStanding::At, LagStanding::Drained, LagStanding::Ahead]);
    let range = (any::<u32>(), state, standing, any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
        |(range_id, state, standing, position, end, lag)| RangeLagDescription {
            range_id,
            state,
            standing,
            position,
            end,
            lag,
        },
    );
    let group = (opt_str(), any::<u64>(), any::<u64>(), vec(range, 0..4)).prop_map(
        |(group, total, updated_ms, ranges)| GroupLagDescription {
            group,
            total,
            updated_ms,
            ranges,
        },
    );
    (opt_str(), vec(group, 0..3)).prop_map(|(topic, groups)| GroupLagResponse { topic, groups })
}

fn arb_route_segment() -> impl Strategy<Value = RouteSegment> + Clone {
    prop_oneof![
        Just(RouteSegment::Unassigned),
        (any::<u32>(), opt_str())
            .prop_map(|(segment, primary)| RouteSegment::Assigned { segment, primary }),
    ]
}

fn arb_position() -> impl Strategy<Value = Position> + Clone {
    (any::<u16>(), any::<u64>())
        .prop_map(|(source_index, offset)| Position { source_index, offset })
}

fn arb_start() -> impl Strategy<Value = Start> {
    prop_oneof![
        Just(Start::Earliest),
        Just(Start::Latest),
        arb_position().prop_map(Start::Position),
        opt_str().prop_map(Start::Group),
    ]
}

fn arb_open_stream() -> impl Strategy<Value = OpenStreamRequest> {
    let head = (opt_str(), any::<u32>(), any::<u64>(), any::<u8>());
    let tail = (nonzero(), nonzero(), opt_str(), opt_str());
    (head, tail).prop_map(
        |(
            (topic, range, routes_version, codec),
            (window_appends, window_bytes, producer_id, label),
        )| {
            OpenStreamRequest {
                topic,
                range,
                routes_version,
                codec,
                window_appends,
                window_bytes,
                producer_id,
                label,
            }
        },
    )
}

fn arb_open_consume() -> impl Strategy<Value = OpenConsumeRequest> {
    let head = (opt_str(), any::<u32>(), any::<u64>(), arb_start());
    let tail = (nonzero(), any::<u32>(), any::<u32>(), any::<u8>());
    (head, tail).prop_map(
        |((topic, range, routes_version, start), (window, max_records, max_bytes, accept))| {
            OpenConsumeRequest {
                topic,
                range,
                routes_version,
                start,
                window,
                max_records,
                max_bytes,
                accept: Accept(accept),
            }
        },
    )
}

fn arb_fetch_range() -> impl Strategy<Value = FetchRangeRequest> {
    let head = (opt_str(), any::<u32>(), any::<u64>(), arb_start());
    let tail = (any::<u32>(), any::<u32>(), any::<u32>(), any::<u8>());
    (head, tail).prop_map(
        |((topic, range, routes_version, start), (max_records, max_bytes, wait_ms, accept))| {
            FetchRangeRequest {
                topic,
                range,
                routes_version,
                start,
                max_records,
                max_bytes,
                wait_ms,
                accept: Accept(accept),
            }
        },
    )
}

fn arb_commit_offsets() -> impl Strategy<Value = CommitOffsetsRequest> {
    let offset = (any::<u32>(), arb_position())
        .prop_map(|(range, position)| RangePosition { range, position });
    (opt_str(), opt_str(), opt_str(), any::<u64>(), vec(offset, 0..3)).prop_map(
        |(topic, group, member, generation, offsets)| CommitOffsetsRequest {
            topic,
            group,
            member,
            generation,
            offsets,
        },
    )
}

fn arb_assignment() -> impl Strategy<Value = Assignment> {
    (any::<u64>(), any::<u32>(), vec(any::<u32>(), 0..4))
        .prop_map(|(generation, session_ms, ranges)| Assignment { generation, session_ms, ranges })
}

/// Batches are opaque at the envelope level: half real codec-0 batches, half arbitrary bytes.
fn arb_plain_batch() -> impl Strategy<Value = Bytes> {
    let entry = (any::<bool>(), arb_record())
        .prop_map(|(tombstone, record)| PlainEntry { tombstone, record });
    let encoded = vec(entry, 0..3).prop_map(|entries| encoded_batch(&entries));
    prop_oneof![encoded, bytes(24)]
}

fn arb_page() -> impl Strategy<Value = Page> {
    let entry = (arb_position(), any::<bool>(), arb_record())
        .prop_map(|(position, tombstone, record)| PositionedEntry { position, tombstone, record });
    let batch =
        prop_oneof![vec(entry, 0..3).prop_map(|entries| encoded_batch(&entries)), bytes(24)];
    (arb_position(), any::<u32>(), any::<u64>(), any::<u64>(), any::<bool>(), batch).prop_map(
        |(next, skip, backlog, expired, expired_exact, batch)| Page {
            next,
            skip,
            backlog,
            expired,
            expired_exact,
            batch,
        },
    )
}

fn encoded_batch<E: crate::batch::BatchEntry>(entries: &[E]) -> Bytes {
    let mut dst = BytesMut::new();
    encode_batch(entries, Codec::None, &mut dst).expect("small batches encode");
    dst.freeze()
}
