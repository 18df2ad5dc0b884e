//! ACL grants of [`AdminState`] and the authorization rule P(op, topic) of wire-protocol.md
//! section 3.0. Does no I/O.
//!
//! P(op, topic) holds when the session's permissions (fixed at authentication) include admin;
//! else, outside strict ACL mode, when they include `op`; else only when one of the user's
//! grants (looked up per request, so a revoke takes effect at once) for `op` matches the topic
//! exactly or, for a pattern ending in `*`, by prefix.

use std::collections::BTreeSet;

use super::users::check_username;
use super::{AclGrant, AdminResponse, AdminState, Operation, Permission};
use crate::error::AdminError;
use crate::names::{NAME_MAX_BYTES, is_valid_name};

impl AdminState {
    /// P(op, topic): may a session of `username` holding `permissions_at_auth` do `operation`
    /// on `topic`?
    pub fn allowed(
        &self,
        username: &str,
        permissions_at_auth: &BTreeSet<Permission>,
        operation: Operation,
        topic: &str,
        strict: bool,
    ) -> bool {
        if permissions_at_auth.contains(&Permission::Admin) {
            return true;
        }
        if !strict && permissions_at_auth.contains(&operation.permission()) {
            return true;
        }
        self.acls.get(username).is_some_and(|grants| {
            grants
                .iter()
                .any(|grant| grant.operation == operation && pattern_matches(&grant.pattern, topic))
        })
    }

    /// `(operation, pattern)` grants of a user, sorted (empty when none).
    pub fn list_acls(&self, username: &str) -> Vec<(Operation, &str)> {
        self.acls
            .get(username)
            .map(|grants| grants.iter().map(|g| (g.operation, g.pattern.as_str())).collect())
            .unwrap_or_default()
    }

    pub(super) fn grant_acl(
        &mut self,
        username: String,
        operation: &str,
        pattern: String,
    ) -> Result<AdminResponse, AdminError> {
        let grant = parse_grant(&username, operation, pattern)?;
        let grants = self.acls.get(&username);
        let present = grants.is_some_and(|grants| grants.contains(&grant));
        let limit = self.limits.max_acls_per_user;
        if !present && grants.is_some_and(|grants| grants.len() >= limit as usize) {
            return Err(AdminError::TooManyAcls { limit });
        }
        let added = self.acls.entry(username).or_default().insert(grant);
        assert_eq!(added, !present);
        Ok(AdminResponse::AclGranted { added })
    }

    pub(super) fn revoke_acl(
        &mut self,
        username: &str,
        operation: &str,
        pattern: String,
    ) -> Result<AdminResponse, AdminError> {
        let grant = parse_grant(username, operation, pattern)?;
        let Some(grants) = self.acls.get_mut(username) else {
            return Ok(AdminResponse::AclRevoked { removed: false });
        };
        let removed = grants.remove(&grant);
        if grants.is_empty() {
            self.acls.remove(username);
        }
        Ok(AdminResponse::AclRevoked { removed })
    }
}

fn parse_grant(username: &str, operation: &str, pattern: String) -> Result<AclGrant, AdminError> {
    check_username(username)?;
    let operation = Operation::parse(operation)?;
    if !is_valid_pattern(&pattern) {
        return Err(AdminError::InvalidAcl);
    }
    Ok(AclGrant { operation, pattern })
}

/// A topic name, or a (possibly empty) run of topic-name characters followed by one `*`.
pub(crate) fn is_valid_pattern(pattern: &str) -> bool {
    match pattern.strip_suffix('*') {
        None => is_valid_name(pattern),
        Some(prefix) => {
            prefix.len() < NAME_MAX_BYTES
                && prefix.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        }
    }
}

pub(crate) fn pattern_matches(pattern: &str, topic: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => topic.starts_with(prefix),
        None => pattern == topic,
    }
}
