//! The typed payload of every request and ok response, one module per section of the spec, plus
//! [`extensions`] for Malachi's own keys 64–72.
//!
//! Each type is the exact layout of one payload: [`crate::Wire::decode`] consumes the whole
//! payload or fails. A wire `str` is `Option<Bytes>` (absent and empty differ) unless the spec
//! requires it present, in which case it is `Bytes` and an absent one is a decode error. Field
//! comments give the wire name where the Rust name adds a unit.

pub mod admin;
pub mod auth;
pub mod consume;
pub mod extensions;
pub mod policy;
pub mod produce;
pub mod streams;

use crate::error::{DecodeError, EncodeError};
use crate::primitive::{Reader, Wire, Writer};

pub use admin::*;
pub use auth::*;
pub use consume::*;
pub use extensions::*;
pub use policy::*;
pub use produce::*;
pub use streams::*;

/// A payload that must be empty: any byte makes the request malformed (`list_policies`,
/// `cluster_state`, `mtls_auth`, and every ok response without content).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Empty;

/// A payload whose bytes are ignored, whatever they are: Malachi's `list_users` and
/// `list_users_with_roles` accept any payload (section 7 item 10). Encodes as nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IgnoredPayload;

impl Wire for Empty {
    const WIRE_BYTES_MIN: usize = 0;

    fn write(&self, _writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        Ok(())
    }

    fn read(_reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(Empty)
    }
}

impl Wire for IgnoredPayload {
    const WIRE_BYTES_MIN: usize = 0;

    fn write(&self, _writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        reader.rest();
        Ok(IgnoredPayload)
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use bytes::Bytes;

    use super::*;
    use crate::batch::{PlainEntry, PositionedEntry};
    use crate::record::{Header, Record};
    use crate::shapes::{Accept, PolicyField, PolicyValue, Position, RouteSegment, Start};

    /// `WIRE_BYTES_MIN` is what a list count is checked against: too large and a valid list is
    /// refused, too small and the check lets a forged count through. So the smallest value of
    /// each shape must encode to exactly that many bytes.
    fn assert_minimal<T: Wire>(name: &str, value: &T) {
        let encoded = value.encode_to_bytes().expect("minimal values encode");
        assert_eq!(encoded.len(), T::WIRE_BYTES_MIN, "{name}");
    }

    macro_rules! assert_all_minimal {
        ($($value:expr),* $(,)?) => {
            $( assert_minimal(stringify!($value), &$value); )*
        };
    }

    #[test]
    fn wire_bytes_min_is_the_smallest_encoding() {
        let one = NonZeroU32::MIN;
        let null_field = PolicyField { name: None, value: PolicyValue::Null };
        assert_all_minimal![
            None::<Bytes>,
            0_u32,
            Record::default(),
            Header::default(),
            PolicyValue::Null,
            null_field,
            Position::default(),
            Start::Earliest,
            Accept::default(),
            RouteSegment::Unassigned,
            PlainEntry::default(),
            PositionedEntry::default(),
            Empty,
            IgnoredPayload,
        ];
        assert_all_minimal![
            AuthRequest::default(),
            TokenAuthRequest::default(),
            TokenResponse::default(),
            CreateTopicRequest::default(),
            ProduceRequest::default(),
            ProduceResponse::default(),
            FetchRequest::default(),
            FetchResponse::default(),
            CommitRequest::default(),
            SubscribeRequest::default(),
            StreamAckRequest::default(),
            LeaveGroupRequest::default(),
        ];
        assert_all_minimal![
            CreateUserRequest::default(),
            DeleteUserRequest::default(),
            ChangePasswordRequest::default(),
            ListUsersResponse::default(),
            UserPermissions::default(),
            AclRequest::default(),
            ListAclsRequest::default(),
            ListAclsResponse::default(),
            AclEntry::default(),
            SetRoleRequest::default(),
            ListUsersWithRolesResponse::default(),
            UserWithRole::default(),
        ];
        assert_all_minimal![
            DefinePolicyRequest::default(),
            DeletePolicyRequest::default(),
            ListPoliciesResponse::default(),
            NamedPolicy::default(),
            BindTopicPolicyRequest::default(),
            GetTopicPolicyRequest::default(),
            TopicPolicyResponse::default(),
            EffectiveField { name: None, value: PolicyValue::Null, origin: Origin::Global },
        ];
        assert_all_minimal![
            ClusterStateResponse::default(),
            Broker { id: None, host: None, port: 0, status: BrokerStatus::Alive },
            TopicRoutesRequest::default(),
            TopicRoutesResponse::default(),
            RangeRoute {
                range: 0,
                key_start: 0,
                key_end: 0,
                state: RangeState::Active,
                segment: RouteSegment::Unassigned,
            },
            OpenStreamRequest {
                topic: None,
                range: 0,
                routes_version: 0,
                codec: 0,
                window_appends: one,
                window_bytes: one,
                producer_id: None,
                label: None,
            },
            OpenStreamResponse::default(),
            AppendRequest::default(),
            CloseStreamRequest::default(),
        ];
        assert_all_minimal![
            OpenConsumeRequest {
                topic: None,
                range: 0,
                routes_version: 0,
                start: Start::Earliest,
                window: one,
                max_records: 0,
                max_bytes: 0,
                accept: Accept::default(),
            },
            OpenConsumeResponse::default(),
            ConsumeAckRequest::default(),
            FetchRangeRequest {
                topic: None,
                range: 0,
                routes_version: 0,
                start: Start::Earliest,
                max_records: 0,
                max_bytes: 0,
                wait_ms: 0,
                accept: Accept::default(),
            },
            Page::default(),
            JoinGroupRequest::default(),
            GroupHeartbeatRequest::default(),
            CommitOffsetsRequest::default(),
            RangePosition::default(),
            Assignment::default(),
        ];
        assert_all_minimal![
            StreamPush { stream_id: 0, kind: PushKind::Moved(Moved::default()) },
            AppendAck::default(),
            AppendFailure::default(),
            Moved::default(),
            MovedTarget { range: 0, segment: RouteSegment::Unassigned },
        ];
    }
}
