//! The typed payload of every request and ok response, one module per section of the spec, plus
//! [`extensions`] for Malachi's own keys 64–72.
//!
//! Each type is the exact layout of one payload, described once with [`crate::layout`]'s
//! `wire_struct!` (fields in wire order, each naming its encoding): [`crate::Wire::decode`]
//! consumes the whole payload or fails. A wire `str` is `Option<Bytes>` (absent and empty differ) unless the spec
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
    use super::*;
    use crate::batch::{PlainEntry, PositionedEntry};
    use crate::layout::check_shape;
    use crate::record::{Header, Record};
    use crate::shapes::{Accept, PolicyField, PolicyValue, Position, RouteSegment, Start};

    macro_rules! check_shapes {
        ($($shape:ty),* $(,)?) => {
            $( check_shape::<$shape>(stringify!($shape)); )*
        };
    }

    /// Every shape's layout properties ([`check_shape`]): the generated ones and the tagged
    /// unions written by hand.
    #[test]
    fn every_shape_keeps_its_layout_properties() {
        check_shapes![
            AuthRequest,
            TokenAuthRequest,
            TokenResponse,
            CreateUserRequest,
            DeleteUserRequest,
            ChangePasswordRequest,
            ListUsersResponse,
            UserPermissions,
            AclRequest,
            ListAclsRequest,
            ListAclsResponse,
            AclEntry,
            SetRoleRequest,
            ListUsersWithRolesResponse,
            UserWithRole,
            FetchRequest,
            FetchResponse,
            CommitRequest,
            SubscribeRequest,
            StreamAckRequest,
            LeaveGroupRequest,
            RemoveBrokerRequest,
            DrainBrokerRequest,
            DrainBrokerResponse,
            ClusterStatusResponse,
            ClusterBroker,
            ClusterGroup,
            ListTopicsResponse,
            DescribeTopicRequest,
            DescribeTopicResponse,
            DescribeSegmentsRequest,
            DescribeSegmentsResponse,
            CopyDescription,
            GroupLagRequest,
            GroupLagResponse,
            GroupLagDescription,
            DeleteTopicRequest,
            SplitRangeRequest,
            SplitRangeResponse,
            MergeRangesRequest,
            MergeRangesResponse,
            CreateTopicRangesRequest,
            DefinePolicyRequest,
            DeletePolicyRequest,
            ListPoliciesResponse,
            NamedPolicy,
            BindTopicPolicyRequest,
            GetTopicPolicyRequest,
            ClusterStateResponse,
            TopicRoutesRequest,
            TopicRoutesResponse,
            OpenStreamRequest,
            OpenStreamResponse,
            AppendRequest,
            CloseStreamRequest,
            OpenConsumeRequest,
            OpenConsumeResponse,
            ConsumeAckRequest,
            FetchRangeRequest,
            Page,
            JoinGroupRequest,
            GroupHeartbeatRequest,
            CommitOffsetsRequest,
            RangePosition,
            Assignment,
            AppendAck,
            AppendFailure,
            Moved,
            MovedTarget,
            PolicyField,
            Position,
            CreateTopicRequest,
            ProduceRequest,
            ProduceResponse,
            Record,
            Header,
            RangeDescription,
            SegmentDescription,
            RangeLagDescription,
            Broker,
            RangeRoute,
            TopicPolicyResponse,
            EffectiveField,
            BrokerStatus,
            RangeState,
            SegmentState,
            LagStanding,
            Resolution,
            Origin,
            Empty,
            IgnoredPayload,
            Accept,
            PolicyValue,
            RouteSegment,
            Start,
        ];
    }

    /// Batch entries are laid out by the batch codec, not as shapes of their own.
    #[test]
    fn batch_entries_have_their_smallest_encoding() {
        for (name, encoded, bytes_min) in [
            ("plain", PlainEntry::default().encode_to_bytes(), PlainEntry::WIRE_BYTES_MIN),
            (
                "positioned",
                PositionedEntry::default().encode_to_bytes(),
                PositionedEntry::WIRE_BYTES_MIN,
            ),
        ] {
            assert_eq!(encoded.expect("encodes").len(), bytes_min, "{name}");
        }
    }
}
