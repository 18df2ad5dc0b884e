//! Section 3.4: user and ACL administration, keys 8–11, 14–16, 22–23 (all admin-only; the
//! server checks that before decoding). Permission, operation and role strings are carried as
//! sent: validating them (`invalid_permissions`, `invalid_operation`, `invalid_role`) is the
//! server's job.

use bytes::Bytes;

use crate::layout::{List32, Str, wire_struct};

wire_struct! {
    /// Key 8.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct CreateUserRequest {
        pub username: Option<Bytes> = Str,
        pub password: Option<Bytes> = Str,
        /// Wire `perms`: `admin`, `produce`, `consume`.
        pub permissions: Vec<Option<Bytes>> = List32,
    }
}

wire_struct! {
    /// Key 9.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct DeleteUserRequest {
        pub username: Option<Bytes> = Str,
    }
}

wire_struct! {
    /// Key 10.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct ChangePasswordRequest {
        pub username: Option<Bytes> = Str,
        pub new_password: Option<Bytes> = Str,
    }
}

wire_struct! {
    /// Key 11's ok answer. Order unspecified.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct ListUsersResponse {
        pub users: Vec<UserPermissions> = List32,
    }
}

wire_struct! {
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct UserPermissions {
        pub username: Option<Bytes> = Str,
        pub permissions: Vec<Option<Bytes>> = List32,
    }
}

wire_struct! {
    /// Keys 14 (`grant_acl`) and 15 (`revoke_acl`).
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct AclRequest {
        pub username: Option<Bytes> = Str,
        /// `produce` or `consume`.
        pub operation: Option<Bytes> = Str,
        /// An exact topic name, or a prefix ending in `*`.
        pub pattern: Option<Bytes> = Str,
    }
}

wire_struct! {
    /// Key 16.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct ListAclsRequest {
        pub username: Option<Bytes> = Str,
    }
}

wire_struct! {
    /// Key 16's ok answer.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct ListAclsResponse {
        pub acls: Vec<AclEntry> = List32,
    }
}

wire_struct! {
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct AclEntry {
        pub operation: Option<Bytes> = Str,
        pub resource: Option<Bytes> = Str,
    }
}

wire_struct! {
    /// Key 22. `role` is `viewer`, `editor` or `admin`; `none` or absent removes the role.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct SetRoleRequest {
        pub username: Option<Bytes> = Str,
        pub role: Option<Bytes> = Str,
    }
}

wire_struct! {
    /// Key 23's ok answer.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct ListUsersWithRolesResponse {
        pub users: Vec<UserWithRole> = List32,
    }
}

wire_struct! {
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct UserWithRole {
        pub username: Option<Bytes> = Str,
        pub permissions: Vec<Option<Bytes>> = List32,
        pub role: Option<Bytes> = Str,
    }
}
