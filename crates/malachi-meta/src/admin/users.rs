//! User accounts of [`AdminState`]: create, delete (with the user's grants), change password,
//! set role, and the listings. Does no I/O.

use std::collections::BTreeSet;

use super::{AdminResponse, AdminState, Permission, Role, User};
use crate::error::AdminError;
use crate::names::is_valid_label;

impl AdminState {
    pub fn user(&self, username: &str) -> Option<&User> {
        self.users.get(username)
    }

    /// `(username, permissions)` sorted by username, permissions in admin, produce, consume
    /// order.
    pub fn list_users(&self) -> Vec<(&str, Vec<Permission>)> {
        self.users
            .values()
            .map(|user| (user.username.as_str(), user.permissions.iter().copied().collect()))
            .collect()
    }

    /// As [`AdminState::list_users`], with each user's role.
    pub fn list_users_with_roles(&self) -> Vec<(&str, Vec<Permission>, Option<Role>)> {
        self.users
            .values()
            .map(|user| {
                let permissions = user.permissions.iter().copied().collect();
                (user.username.as_str(), permissions, user.role)
            })
            .collect()
    }

    /// Whether the broker's configuration seeded `username` already (see
    /// [`super::AdminCommand::RecordSeeded`]).
    pub fn was_seeded(&self, username: &str) -> bool {
        self.seeded.contains(username)
    }

    pub(super) fn create_user(
        &mut self,
        username: String,
        password_hash: String,
        permissions: &[String],
        role: Option<&str>,
    ) -> Result<AdminResponse, AdminError> {
        check_username(&username)?;
        self.check_password_hash(&password_hash)?;
        let permissions = permissions
            .iter()
            .map(|text| Permission::parse(text).ok_or(AdminError::InvalidPermissions))
            .collect::<Result<BTreeSet<Permission>, AdminError>>()?;
        let role = Role::parse(role)?;
        if self.users.contains_key(&username) {
            return Err(AdminError::UserExists);
        }
        let limit = self.limits.max_users;
        if self.users.len() >= limit as usize {
            return Err(AdminError::TooManyUsers { limit });
        }
        let user = User { username: username.clone(), password_hash, permissions, role };
        self.users.insert(username, user);
        Ok(AdminResponse::UserCreated)
    }

    pub(super) fn delete_user(&mut self, username: &str) -> Result<AdminResponse, AdminError> {
        check_username(username)?;
        let existed = self.users.remove(username).is_some();
        let acls_removed = self.acls.remove(username).map_or(0, |grants| grants.len() as u64);
        Ok(AdminResponse::UserDeleted { existed, acls_removed })
    }

    pub(super) fn change_password(
        &mut self,
        username: &str,
        password_hash: String,
    ) -> Result<AdminResponse, AdminError> {
        self.check_password_hash(&password_hash)?;
        let user = self.users.get_mut(username).ok_or(AdminError::UserNotFound)?;
        user.password_hash = password_hash;
        Ok(AdminResponse::PasswordChanged)
    }

    pub(super) fn set_role(
        &mut self,
        username: &str,
        role: Option<&str>,
    ) -> Result<AdminResponse, AdminError> {
        let role = Role::parse(role)?;
        let user = self.users.get_mut(username).ok_or(AdminError::UserNotFound)?;
        let previous = std::mem::replace(&mut user.role, role);
        Ok(AdminResponse::RoleSet { previous })
    }

    pub(super) fn record_seeded(&mut self, username: String) -> Result<AdminResponse, AdminError> {
        check_username(&username)?;
        if self.seeded.contains(&username) {
            return Ok(AdminResponse::SeededRecorded { added: false });
        }
        // Seeded names come from one node's configuration; the user bound keeps them finite.
        let limit = self.limits.max_users;
        if self.seeded.len() >= limit as usize {
            return Err(AdminError::TooManyUsers { limit });
        }
        self.seeded.insert(username);
        Ok(AdminResponse::SeededRecorded { added: true })
    }

    fn check_password_hash(&self, password_hash: &str) -> Result<(), AdminError> {
        let too_long = password_hash.len() > self.limits.max_password_hash_bytes as usize;
        if password_hash.is_empty() || too_long {
            return Err(AdminError::InvalidPasswordHash);
        }
        Ok(())
    }
}

pub(super) fn check_username(username: &str) -> Result<(), AdminError> {
    if is_valid_label(username) { Ok(()) } else { Err(AdminError::InvalidUsername) }
}
