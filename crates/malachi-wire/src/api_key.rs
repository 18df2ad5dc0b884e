//! The api keys 0..=34 of section 3, and Malachi's own 64..=74 (`docs/protocol.md`), with the
//! facts a server needs before it decodes a payload.

use std::fmt;

macro_rules! api_keys {
    ($( $(#[$doc:meta])* $variant:ident = $value:literal $name:literal, )*) => {
        /// A request's `api_key`. Values outside 0..=34 and 64..=74 are not representable: they
        /// are [`crate::RequestError::UnknownApiKey`] at the envelope.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u16)]
        pub enum ApiKey {
            $( $(#[$doc])* $variant = $value, )*
        }

        impl ApiKey {
            /// Every key, in numeric order: the original's 0..=34, then Malachi's 64..=74.
            pub const ALL: &'static [ApiKey] = &[$( ApiKey::$variant, )*];

            pub const fn from_u16(value: u16) -> Option<ApiKey> {
                match value {
                    $( $value => Some(ApiKey::$variant), )*
                    _ => None,
                }
            }

            /// The name used by the spec and the Node client (`create_topic`).
            pub const fn name(self) -> &'static str {
                match self {
                    $( ApiKey::$variant => $name, )*
                }
            }
        }
    };
}

api_keys! {
    Auth = 0 "auth",
    CreateTopic = 1 "create_topic",
    Produce = 2 "produce",
    Fetch = 3 "fetch",
    Commit = 4 "commit",
    Subscribe = 5 "subscribe",
    /// Never answered.
    StreamAck = 6 "stream_ack",
    LeaveGroup = 7 "leave_group",
    CreateUser = 8 "create_user",
    DeleteUser = 9 "delete_user",
    ChangePassword = 10 "change_password",
    ListUsers = 11 "list_users",
    MtlsAuth = 12 "mtls_auth",
    TokenAuth = 13 "token_auth",
    GrantAcl = 14 "grant_acl",
    RevokeAcl = 15 "revoke_acl",
    ListAcls = 16 "list_acls",
    DefinePolicy = 17 "define_policy",
    DeletePolicy = 18 "delete_policy",
    ListPolicies = 19 "list_policies",
    BindTopicPolicy = 20 "bind_topic_policy",
    GetTopicPolicy = 21 "get_topic_policy",
    SetRole = 22 "set_role",
    ListUsersWithRoles = 23 "list_users_with_roles",
    ClusterState = 24 "cluster_state",
    TopicRoutes = 25 "topic_routes",
    OpenStream = 26 "open_stream",
    /// Answered only by `append_ack` pushes on the open_stream's `corr` (or an error).
    Append = 27 "append",
    CloseStream = 28 "close_stream",
    OpenConsume = 29 "open_consume",
    /// Answered only on failure.
    ConsumeAck = 30 "consume_ack",
    FetchRange = 31 "fetch_range",
    JoinGroup = 32 "join_group",
    GroupHeartbeat = 33 "group_heartbeat",
    CommitOffsets = 34 "commit_offsets",
    // Malachi's own keys (docs/protocol.md); an original client never sends them.
    ListTopics = 64 "list_topics",
    DescribeTopic = 65 "describe_topic",
    DeleteTopic = 66 "delete_topic",
    SplitRange = 67 "split_range",
    MergeRanges = 68 "merge_ranges",
    CreateTopicRanges = 69 "create_topic_ranges",
    ClusterStatus = 70 "cluster_status",
    RemoveBroker = 71 "remove_broker",
    DescribeSegments = 72 "describe_segments",
    GroupLag = 73 "group_lag",
    DrainBroker = 74 "drain_broker",
}

impl ApiKey {
    pub const fn as_u16(self) -> u16 {
        self as u16
    }

    /// Keys valid only as a connection's first frame (section 5); after authentication they
    /// are answered `unknown_api_key`.
    pub const fn is_auth(self) -> bool {
        matches!(self, ApiKey::Auth | ApiKey::MtlsAuth | ApiKey::TokenAuth)
    }

    /// Keys 8–11 and 14–23, and our 66–68 (delete, split, merge), 70 (cluster status), 71
    /// (remove broker) and 74 (drain broker). Section 3.0: for these the
    /// server checks `admin` before decoding the payload, so a non-admin gets
    /// `permission_denied` even for a garbled payload. Keys 1–7 decode first and check
    /// permissions after.
    pub const fn requires_admin(self) -> bool {
        matches!(self.as_u16(), 8..=11 | 14..=23 | 66..=68 | 70 | 71 | 74)
    }

    /// Malachi's own keys (64..=74), which the original protocol does not have.
    pub const fn is_extension(self) -> bool {
        self.as_u16() >= ApiKey::ListTopics.as_u16()
    }

    /// Keys whose success sends no ok frame on their own `corr` (section 1.3): `stream_ack`,
    /// `append` and `consume_ack`. `subscribe` is not among them: its ok frames are pushes.
    pub const fn has_reply(self) -> bool {
        !matches!(self, ApiKey::StreamAck | ApiKey::Append | ApiKey::ConsumeAck)
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{} ({})", self.name(), self.as_u16())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_dense_from_0_to_34_then_64_to_74() {
        assert_eq!(ApiKey::ALL.len(), 35 + 11);
        let values = (0_u16..=34).chain(64..=74);
        for (value, key) in values.zip(ApiKey::ALL) {
            assert_eq!(key.as_u16(), value);
            assert_eq!(ApiKey::from_u16(value), Some(*key));
            assert_eq!(key.is_extension(), value >= 64, "{key}");
        }
        for value in [35, 63, 75, 99, 0x00ff, u16::MAX] {
            assert_eq!(ApiKey::from_u16(value), None);
        }
    }

    #[test]
    fn classification_table() {
        // (key, is_auth, requires_admin, has_reply)
        let cases: &[(ApiKey, bool, bool, bool)] = &[
            (ApiKey::Auth, true, false, true),
            (ApiKey::Produce, false, false, true),
            (ApiKey::StreamAck, false, false, false),
            (ApiKey::LeaveGroup, false, false, true),
            (ApiKey::CreateUser, false, true, true),
            (ApiKey::ListUsers, false, true, true),
            (ApiKey::MtlsAuth, true, false, true),
            (ApiKey::TokenAuth, true, false, true),
            (ApiKey::GrantAcl, false, true, true),
            (ApiKey::DefinePolicy, false, true, true),
            (ApiKey::ListUsersWithRoles, false, true, true),
            (ApiKey::ClusterState, false, false, true),
            (ApiKey::Append, false, false, false),
            (ApiKey::ConsumeAck, false, false, false),
            (ApiKey::CommitOffsets, false, false, true),
            (ApiKey::ListTopics, false, false, true),
            (ApiKey::DescribeTopic, false, false, true),
            (ApiKey::DeleteTopic, false, true, true),
            (ApiKey::SplitRange, false, true, true),
            (ApiKey::MergeRanges, false, true, true),
            (ApiKey::CreateTopicRanges, false, false, true),
            (ApiKey::ClusterStatus, false, true, true),
            (ApiKey::RemoveBroker, false, true, true),
            (ApiKey::DescribeSegments, false, false, true),
            (ApiKey::GroupLag, false, false, true),
            (ApiKey::DrainBroker, false, true, true),
        ];
        for (key, auth, admin, reply) in cases {
            assert_eq!(key.is_auth(), *auth, "{key}");
            assert_eq!(key.requires_admin(), *admin, "{key}");
            assert_eq!(key.has_reply(), *reply, "{key}");
        }
        let admin_count = ApiKey::ALL.iter().filter(|key| key.requires_admin()).count();
        assert_eq!(admin_count, 14 + 6, "8-11, 14-23, 66-68, 70, 71 and 74");
    }
}
