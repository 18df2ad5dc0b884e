//! Section 3.4: user and ACL administration, keys 8–11, 14–16, 22–23 (all admin-only; the
//! server checks that before decoding). Permission, operation and role strings are carried as
//! sent: validating them (`invalid_permissions`, `invalid_operation`, `invalid_role`) is the
//! server's job.

use bytes::Bytes;

use crate::error::{DecodeError, EncodeError};
use crate::primitive::{Reader, Wire, Writer};

/// Key 8.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CreateUserRequest {
    pub username: Option<Bytes>,
    pub password: Option<Bytes>,
    /// Wire `perms`: `admin`, `produce`, `consume`.
    pub permissions: Vec<Option<Bytes>>,
}

/// Key 9.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeleteUserRequest {
    pub username: Option<Bytes>,
}

/// Key 10.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChangePasswordRequest {
    pub username: Option<Bytes>,
    pub new_password: Option<Bytes>,
}

/// Key 11's ok answer. Order unspecified.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListUsersResponse {
    pub users: Vec<UserPermissions>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserPermissions {
    pub username: Option<Bytes>,
    pub permissions: Vec<Option<Bytes>>,
}

/// Keys 14 (`grant_acl`) and 15 (`revoke_acl`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AclRequest {
    pub username: Option<Bytes>,
    /// `produce` or `consume`.
    pub operation: Option<Bytes>,
    /// An exact topic name, or a prefix ending in `*`.
    pub pattern: Option<Bytes>,
}

/// Key 16.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListAclsRequest {
    pub username: Option<Bytes>,
}

/// Key 16's ok answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListAclsResponse {
    pub acls: Vec<AclEntry>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AclEntry {
    pub operation: Option<Bytes>,
    pub resource: Option<Bytes>,
}

/// Key 22. `role` is `viewer`, `editor` or `admin`; `none` or absent removes the role.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SetRoleRequest {
    pub username: Option<Bytes>,
    pub role: Option<Bytes>,
}

/// Key 23's ok answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListUsersWithRolesResponse {
    pub users: Vec<UserWithRole>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserWithRole {
    pub username: Option<Bytes>,
    pub permissions: Vec<Option<Bytes>>,
    pub role: Option<Bytes>,
}

impl Wire for CreateUserRequest {
    const WIRE_BYTES_MIN: usize = 2 + 4;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.username.as_deref())?;
        writer.str(self.password.as_deref())?;
        writer.list32(&self.permissions)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(CreateUserRequest {
            username: reader.str()?,
            password: reader.str()?,
            permissions: reader.list32()?,
        })
    }
}

impl Wire for DeleteUserRequest {
    const WIRE_BYTES_MIN: usize = 1;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.username.as_deref())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(DeleteUserRequest { username: reader.str()? })
    }
}

impl Wire for ChangePasswordRequest {
    const WIRE_BYTES_MIN: usize = 2;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.username.as_deref())?;
        writer.str(self.new_password.as_deref())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(ChangePasswordRequest { username: reader.str()?, new_password: reader.str()? })
    }
}

impl Wire for ListUsersResponse {
    const WIRE_BYTES_MIN: usize = 4;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.list32(&self.users)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(ListUsersResponse { users: reader.list32()? })
    }
}

impl Wire for UserPermissions {
    const WIRE_BYTES_MIN: usize = 1 + 4;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.username.as_deref())?;
        writer.list32(&self.permissions)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(UserPermissions { username: reader.str()?, permissions: reader.list32()? })
    }
}

impl Wire for AclRequest {
    const WIRE_BYTES_MIN: usize = 3;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.username.as_deref())?;
        writer.str(self.operation.as_deref())?;
        writer.str(self.pattern.as_deref())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(AclRequest { username: reader.str()?, operation: reader.str()?, pattern: reader.str()? })
    }
}

impl Wire for ListAclsRequest {
    const WIRE_BYTES_MIN: usize = 1;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.username.as_deref())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(ListAclsRequest { username: reader.str()? })
    }
}

impl Wire for ListAclsResponse {
    const WIRE_BYTES_MIN: usize = 4;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.list32(&self.acls)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(ListAclsResponse { acls: reader.list32()? })
    }
}

impl Wire for AclEntry {
    const WIRE_BYTES_MIN: usize = 2;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.operation.as_deref())?;
        writer.str(self.resource.as_deref())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(AclEntry { operation: reader.str()?, resource: reader.str()? })
    }
}

impl Wire for SetRoleRequest {
    const WIRE_BYTES_MIN: usize = 2;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.username.as_deref())?;
        writer.str(self.role.as_deref())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(SetRoleRequest { username: reader.str()?, role: reader.str()? })
    }
}

impl Wire for ListUsersWithRolesResponse {
    const WIRE_BYTES_MIN: usize = 4;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.list32(&self.users)
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(ListUsersWithRolesResponse { users: reader.list32()? })
    }
}

impl Wire for UserWithRole {
    const WIRE_BYTES_MIN: usize = 1 + 4 + 1;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.username.as_deref())?;
        writer.list32(&self.permissions)?;
        writer.str(self.role.as_deref())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(UserWithRole {
            username: reader.str()?,
            permissions: reader.list32()?,
            role: reader.str()?,
        })
    }
}
