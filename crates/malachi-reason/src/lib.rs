//! The reason strings of error answers and their retry classes: the workspace's one table.
//!
//! Every refusal a client or another broker can see is named here once: the wire's reasons
//! (wire-protocol.md section 4 and the policy reasons of section 3.5), Malachi's own
//! (docs/protocol.md), and the reasons brokers exchange among themselves or log. The log store,
//! the metadata machines, the broker and the server map their typed errors into [`Reason`];
//! the client recognises the same texts. Whether a request may be retried is decided here and
//! nowhere else ([`Reason::is_retryable`]). This crate depends on nothing and does no I/O.
//!
//! Most reasons are sent as their bare name. A few carry detail after the name, and
//! [`Reason::from_wire`] recognises them by that leading name: the policy reasons
//! (`policy_in_use: a, b`, `timeout: the control plane ...`) and two Erlang terms Malachi renders
//! as text (`{:unroutable, "k1"}`, `{:unknown_codec, 7}`).

use std::fmt;

macro_rules! reasons {
    ($( $(#[$doc:meta])* $variant:ident = $text:literal, )*) => {
        /// A reason an error answer can carry.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Reason {
            $( $(#[$doc])* $variant, )*
        }

        impl Reason {
            /// Every reason: section 4's table in its order, then Malachi's own, then the internal ones.
            pub const ALL: &'static [Reason] = &[$( Reason::$variant, )*];

            /// The exact wire text (for detail-carrying reasons, the leading name).
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( Reason::$variant => $text, )*
                }
            }
        }
    };
}

reasons! {
    /// Per-IP connection cap; sent with `corr = 0` at accept, then close.
    ConnectionLimitExceeded = "connection_limit_exceeded",
    /// Global connection cap; sent with `corr = 0` at accept, then close.
    GlobalLimitExceeded = "global_limit_exceeded",
    FrameTooLarge = "frame_too_large",
    AuthRequired = "auth_required",
    InvalidCredentials = "invalid_credentials",
    AccountLocked = "account_locked",
    /// The per-IP auth rate limit (not the user quota, which is `rate_limited`).
    RateLimitExceeded = "rate_limit_exceeded",
    MtlsAuthDisabled = "mtls_auth_disabled",
    MtlsAuthUnavailable = "mtls_auth_unavailable",
    NoPeerCertificate = "no_peer_certificate",
    /// Malachi: the broker requires TLS and the client spoke plain TCP (corr 0, then close).
    TlsRequired = "tls_required",
    OidcAuthDisabled = "oidc_auth_disabled",
    OidcMisconfigured = "oidc_misconfigured",
    MalformedRequest = "malformed_request",
    UnknownApiKey = "unknown_api_key",
    UnexpectedFrame = "unexpected_frame",
    PermissionDenied = "permission_denied",
    RateLimited = "rate_limited",
    QuotaTooSmall = "quota_too_small",
    Overloaded = "overloaded",
    Migrating = "migrating",
    NotOwner = "not_owner",
    MetadataUnavailable = "metadata_unavailable",
    NoQuorum = "no_quorum",
    NoSuchTopic = "no_such_topic",
    InvalidTopicName = "invalid_topic_name",
    AlreadyExists = "already_exists",
    InvalidCursor = "invalid_cursor",
    /// Sent as the Erlang term `{:unroutable, "<key>"}`; see [`Reason::unroutable_text`].
    Unroutable = "unroutable",
    InvalidPermissions = "invalid_permissions",
    UserExists = "user_exists",
    UserNotFound = "user_not_found",
    PersistFailed = "persist_failed",
    InvalidOperation = "invalid_operation",
    InvalidAcl = "invalid_acl",
    InvalidRole = "invalid_role",
    InvalidPolicyName = "invalid_policy_name",
    InvalidTopic = "invalid_topic",
    InvalidPolicy = "invalid_policy",
    NoSuchPolicy = "no_such_policy",
    /// Sent as `policy_in_use: <topic>, <topic>`.
    PolicyInUse = "policy_in_use",
    /// Sent as `bindings_unavailable: …; retry`.
    BindingsUnavailable = "bindings_unavailable",
    /// Sent as `unknown_policy_field: <field>`.
    UnknownPolicyField = "unknown_policy_field",
    /// Sent as `invalid_policy_field: <field>`.
    InvalidPolicyField = "invalid_policy_field",
    /// Sent as `duplicate_policy_field: <field>`.
    DuplicatePolicyField = "duplicate_policy_field",
    /// Sent as `unsupported_policy_field: <field>: <upgrade message>`.
    UnsupportedPolicyField = "unsupported_policy_field",
    /// Sent as `unsupported_command: <upgrade message>`.
    UnsupportedCommand = "unsupported_command",
    /// Sent as [`CONTROL_PLANE_TIMEOUT_TEXT`]; the change may still apply.
    Timeout = "timeout",
    Unsupported = "unsupported",
    Unavailable = "unavailable",
    StaleRoutes = "stale_routes",
    Moved = "moved",
    UnknownStream = "unknown_stream",
    UnsupportedCodec = "unsupported_codec",
    BatchTooLarge = "batch_too_large",
    BatchSizeMismatch = "batch_size_mismatch",
    BatchCountMismatch = "batch_count_mismatch",
    MalformedBatch = "malformed_batch",
    /// Sent inside `append_ack` as the Erlang term `{:unknown_codec, n}` (section 2.4).
    UnknownCodec = "unknown_codec",
    // Malachi's own reasons (docs/protocol.md); the original never sends them.
    /// A write or fsync failed; the store refuses writes until the broker restarts.
    StorageFailed = "storage_failed",
    /// The data disk is full; writes are refused until space is freed.
    DiskFull = "disk_full",
    /// Stored records are damaged or missing (a bad frame, a lost segment file): served up to
    /// the damage, refused past it, never silently skipped.
    StorageDamaged = "storage_damaged",
    /// A new password (create_user, change_password) shorter than `MALACHI_MIN_PASSWORD_LEN`.
    InvalidPassword = "invalid_password",
    /// A topic create beyond `MALACHI_MAX_TOPICS` or the creator's `MALACHI_MAX_TOPICS_PER_USER`.
    TooManyTopics = "too_many_topics",
    /// One record's key, value and headers exceed the per-record limit.
    RecordTooLarge = "record_too_large",
    KeyTooLarge = "key_too_large",
    TooManyHeaders = "too_many_headers",
    /// One produce carries more records than one append may.
    BatchTooManyRecords = "batch_too_many_records",
    /// `create_topic_ranges` with a count that is not a power of two within the limit.
    InvalidRangeCount = "invalid_range_count",
    /// A split would exceed the topic's active-range limit; or a fetch's position spans more
    /// ranges than one cursor may name.
    TooManyRanges = "too_many_ranges",
    /// A split of a range of width 1.
    RangeTooSmall = "range_too_small",
    /// A merge of two ranges that are not the halves of one aligned block.
    NotBuddies = "not_buddies",
    /// A split or merge whose range could not be fenced in the data plane; nothing changed.
    Unfenced = "unfenced",
    /// A split or merge naming a range the topic does not have.
    NoSuchRange = "no_such_range",
    /// A split or merge of a range that is already sealed.
    RangeSealed = "range_sealed",
    /// Malachi: `remove_broker` names a broker the cluster has not registered.
    NoSuchBroker = "no_such_broker",
    /// Malachi: `remove_broker` of a broker that still holds sealed segments, without `force`
    /// (each segment has one copy until segments are replicated).
    BrokerHoldsSegments = "broker_holds_segments",
    /// Malachi: `remove_broker` sent to the broker it names; send it through another.
    CannotRemoveSelf = "cannot_remove_self",
    /// Malachi: `drain_broker` names a broker that did not answer the broker asking it.
    BrokerUnreachable = "broker_unreachable",
    /// Malachi: the live brokers cannot hold a new segment's replicas under the hard
    /// placement constraints (`MALACHI_LOG_PLACEMENT_POLICY=hard`); retry once more are up.
    PlacementUnmet = "placement_unmet",
    // Reasons of the metadata machines and of brokers among themselves. A client sees them only
    // as the text of an administrative refusal, or where a broker passes a peer's answer on.
    /// A segment append reached a sealed segment (a roll or a failover sealed the head).
    SegmentSealed = "segment_sealed",
    /// A coordinator's command carried an older term than the vnode's current coordinator.
    StaleCoordinator = "stale_coordinator",
    /// A coordinator's command reached a vnode that has no coordinator yet.
    NotCoordinated = "not_coordinated",
    InvalidSegmentRoll = "invalid_segment_roll",
    InvalidReplicas = "invalid_replicas",
    /// A command for a topic reached a vnode whose ring arc does not own it.
    WrongVnode = "wrong_vnode",
    ArcRefused = "arc_refused",
    /// A seal named a segment that is not its range's active one.
    SealMismatch = "seal_mismatch",
    SegmentAlreadySealed = "segment_already_sealed",
    SealConflict = "seal_conflict",
    RangeHistoryFull = "range_history_full",
    TooManySegments = "too_many_segments",
    InvalidGroup = "invalid_group",
    GenerationMismatch = "generation_mismatch",
    TooManyGroups = "too_many_groups",
    /// Ours: a consumer group has as many members as it may (`max_members_per_group`).
    TooManyMembers = "too_many_members",
    SegmentActive = "segment_active",
    SegmentNotOldest = "segment_not_oldest",
    SegmentRangeMismatch = "segment_range_mismatch",
    TooManyItems = "too_many_items",
    InvalidUsername = "invalid_username",
    InvalidPasswordHash = "invalid_password_hash",
    InvalidAddress = "invalid_address",
    TooManyUsers = "too_many_users",
    TooManyAcls = "too_many_acls",
    InvalidBroker = "invalid_broker",
    // The console's refusals, in the `error` field of its HTTP answers.
    /// A console request without a valid session.
    LoginRequired = "login_required",
    /// A console change whose `Origin` is not the console's own.
    CrossSiteRequest = "cross_site_request",
    /// A console change without its session's CSRF token.
    CsrfTokenMismatch = "csrf_token_mismatch",
}

/// The full text of the policy `timeout` reason (section 3.5).
pub const CONTROL_PLANE_TIMEOUT_TEXT: &str = "timeout: the control plane did not answer in time; \
     the change may still apply, read it back before retrying";

impl Reason {
    /// Whether the same request may succeed if sent again unchanged, now or after a back-off:
    /// the "yes" and "later" rows of section 4's client-action column (docs/protocol.md for
    /// Malachi's own reasons). The one retry table of the workspace.
    pub const fn is_retryable(self) -> bool {
        matches!(
            self,
            Reason::ConnectionLimitExceeded
                | Reason::GlobalLimitExceeded
                | Reason::AccountLocked
                | Reason::RateLimitExceeded
                | Reason::RateLimited
                | Reason::Overloaded
                | Reason::Migrating
                | Reason::NotOwner
                | Reason::MetadataUnavailable
                | Reason::NoQuorum
                | Reason::Unroutable
                | Reason::PersistFailed
                | Reason::BindingsUnavailable
                | Reason::Timeout
                | Reason::Unavailable
                | Reason::Unfenced
                | Reason::PlacementUnmet
                | Reason::BrokerUnreachable
                // The store recovers a failed file on its next use, and retention frees a full
                // disk: both pass, and in a cluster the retry may reach other copies.
                | Reason::StorageFailed
                | Reason::DiskFull
        )
    }

    /// Whether the client must re-read the topic's routes (key 25) and reopen its stream before
    /// trying again (section 3.6); these are not retryable as they are.
    pub const fn requires_route_refresh(self) -> bool {
        matches!(self, Reason::StaleRoutes | Reason::Moved)
    }

    /// Recognises a received reason text: an exact name, a name followed by `:` and detail, or
    /// an Erlang term `{:name, ...}`. Unknown text gives `None` (treat it as a failure).
    pub fn from_wire(text: &[u8]) -> Option<Reason> {
        let name = match text.strip_prefix(b"{:") {
            Some(term) => term.split(|&byte| byte == b',').next()?,
            None => text.split(|&byte| byte == b':').next()?,
        };
        Reason::ALL.iter().copied().find(|reason| reason.as_str().as_bytes() == name)
    }

    /// The text Malachi sends for a key no active range covers: the Erlang rendering of
    /// `{:unroutable, key}`. A printable UTF-8 key is quoted; other bytes use `<<1, 2>>`
    /// notation; an absent key is `nil`.
    pub fn unroutable_text(key: Option<&[u8]>) -> String {
        format!("{{:unroutable, {}}}", erlang_binary(key))
    }
}

/// Lets a reason be compared with the text it stands for (`error.reason() == "no_quorum"`).
impl PartialEq<&str> for Reason {
    fn eq(&self, text: &&str) -> bool {
        self.as_str() == *text
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.as_str())
    }
}

fn erlang_binary(bytes: Option<&[u8]>) -> String {
    let Some(bytes) = bytes else {
        return "nil".to_owned();
    };
    match std::str::from_utf8(bytes) {
        Ok(text) if !text.chars().any(char::is_control) => {
            format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
        }
        _ => {
            let listed: Vec<String> = bytes.iter().map(u8::to_string).collect();
            format!("<<{}>>", listed.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_are_unique_snake_case_and_round_trip() {
        for (index, reason) in Reason::ALL.iter().enumerate() {
            let text = reason.as_str();
            assert!(text.bytes().all(|byte| byte.is_ascii_lowercase() || byte == b'_'), "{text}");
            assert_eq!(Reason::from_wire(text.as_bytes()), Some(*reason));
            let others = &Reason::ALL[index + 1..];
            assert!(others.iter().all(|other| other.as_str() != text), "{text} twice");
        }
    }

    #[test]
    fn wire_texts_of_section_4() {
        let cases: &[(&str, Reason)] = &[
            ("frame_too_large", Reason::FrameTooLarge),
            ("malformed_request", Reason::MalformedRequest),
            ("unknown_api_key", Reason::UnknownApiKey),
            ("auth_required", Reason::AuthRequired),
            ("invalid_credentials", Reason::InvalidCredentials),
            ("rate_limit_exceeded", Reason::RateLimitExceeded),
            ("rate_limited", Reason::RateLimited),
            ("no_such_topic", Reason::NoSuchTopic),
            ("not_owner", Reason::NotOwner),
            ("batch_count_mismatch", Reason::BatchCountMismatch),
        ];
        for (text, reason) in cases {
            assert_eq!(reason.as_str(), *text);
            assert_eq!(reason.to_string(), *text);
        }
    }

    #[test]
    fn detail_carrying_texts_are_recognised() {
        let cases: &[(&str, Option<Reason>)] = &[
            ("policy_in_use: orders, audit", Some(Reason::PolicyInUse)),
            ("bindings_unavailable: no leader; retry", Some(Reason::BindingsUnavailable)),
            ("unsupported_policy_field: spread_by: upgrade", Some(Reason::UnsupportedPolicyField)),
            (CONTROL_PLANE_TIMEOUT_TEXT, Some(Reason::Timeout)),
            ("{:unroutable, \"k1\"}", Some(Reason::Unroutable)),
            ("{:unknown_codec, 7}", Some(Reason::UnknownCodec)),
            ("{:something_else, 1}", None),
            ("not_owner_really", None),
            ("", None),
            ("{:", None),
        ];
        for (text, expected) in cases {
            assert_eq!(Reason::from_wire(text.as_bytes()), *expected, "{text}");
        }
    }

    #[test]
    fn retryable_follows_the_client_action_column() {
        let cases: &[(Reason, bool)] = &[
            (Reason::ConnectionLimitExceeded, true),
            (Reason::AccountLocked, true),
            (Reason::RateLimitExceeded, true),
            (Reason::RateLimited, true),
            (Reason::Overloaded, true),
            (Reason::Migrating, true),
            (Reason::NotOwner, true),
            (Reason::MetadataUnavailable, true),
            (Reason::NoQuorum, true),
            (Reason::Unroutable, true),
            (Reason::PersistFailed, true),
            (Reason::BindingsUnavailable, true),
            (Reason::Timeout, true),
            (Reason::Unavailable, true),
            (Reason::FrameTooLarge, false),
            (Reason::InvalidCredentials, false),
            (Reason::MalformedRequest, false),
            (Reason::PermissionDenied, false),
            (Reason::QuotaTooSmall, false),
            (Reason::NoSuchTopic, false),
            (Reason::InvalidCursor, false),
            (Reason::UserExists, false),
            (Reason::PolicyInUse, false),
            (Reason::StaleRoutes, false),
            (Reason::Moved, false),
            (Reason::MalformedBatch, false),
            (Reason::Unfenced, true),
            (Reason::StorageFailed, true),
            (Reason::DiskFull, true),
            (Reason::SegmentSealed, false),
            (Reason::StaleCoordinator, false),
            (Reason::GenerationMismatch, false),
            (Reason::StorageDamaged, false),
            (Reason::TooManyTopics, false),
            (Reason::RecordTooLarge, false),
            (Reason::NotBuddies, false),
            (Reason::InvalidRangeCount, false),
            (Reason::InvalidPassword, false),
            (Reason::PlacementUnmet, true),
        ];
        for (reason, retryable) in cases {
            assert_eq!(reason.is_retryable(), *retryable, "{reason}");
        }
        assert!(Reason::StaleRoutes.requires_route_refresh());
        assert!(!Reason::NotOwner.requires_route_refresh());
    }

    #[test]
    fn unroutable_renders_like_erlang() {
        let cases: &[(Option<&[u8]>, &str)] = &[
            (Some(b"k1"), "{:unroutable, \"k1\"}"),
            (Some(b"a\"b"), "{:unroutable, \"a\\\"b\"}"),
            (Some(b""), "{:unroutable, \"\"}"),
            (Some(&[0, 255]), "{:unroutable, <<0, 255>>}"),
            (None, "{:unroutable, nil}"),
        ];
        for (key, text) in cases {
            assert_eq!(Reason::unroutable_text(*key), *text);
            assert_eq!(Reason::from_wire(text.as_bytes()), Some(Reason::Unroutable));
        }
    }
}
