//! [`AdminState`], the cluster-wide administrative machine: users (an opaque password hash
//! computed outside, permissions, an optional dashboard role), ACL grants, and failed-login
//! lockouts keyed by (username, client address). Does no I/O: password hashing happens before
//! a command is proposed, and time arrives inside commands as `now_ms`.
//!
//! Users (and the names the broker's configuration seeded, once each) and grants live in
//! `admin/users.rs` and `admin/acl.rs` (with the P(op, topic) authorization rule of
//! wire-protocol.md section 3.0); lockout bookkeeping in `admin/lockout.rs`. Like
//! [`crate::MetaState`], every handler validates before it changes anything, so a refused
//! command leaves the state and its hash unchanged.

mod acl;
mod brokers;
mod lockout;
mod policies;
mod users;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::error::AdminError;
use crate::invariants::InvariantViolation;

pub use brokers::{BROKER_ADDRESS_BYTES_MAX, BROKERS_MAX, BrokerRecord};
pub use lockout::{LOGIN_FAILURES_PER_COMMAND_MAX, LockoutEntry, LockoutPolicy, LoginFailures};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Permission {
    Admin,
    Produce,
    Consume,
}

/// A dashboard role; independent of permissions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Viewer,
    Editor,
    Admin,
}

/// What an ACL grant allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    Produce,
    Consume,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    pub username: String,
    /// A PHC string (Argon2id), computed outside the machine; never returned on the wire.
    pub password_hash: String,
    pub permissions: BTreeSet<Permission>,
    pub role: Option<Role>,
}

/// `pattern` is an exact topic name, or a prefix followed by one trailing `*`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AclGrant {
    pub operation: Operation,
    pub pattern: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdminLimits {
    pub max_users: u32,
    pub max_acls_per_user: u32,
    /// Tracked (username, address) pairs; the least recently failed one is evicted beyond it.
    pub max_lockout_entries: u32,
    pub max_password_hash_bytes: u32,
    /// A client address is an IP literal; 64 bytes hold any IPv6 text form.
    pub max_address_bytes: u32,
    /// Defined storage policies. Absent from snapshots taken before policies lived here.
    #[serde(default = "default_max_policies")]
    pub max_policies: u32,
}

fn default_max_policies() -> u32 {
    AdminLimits::default().max_policies
}

impl Default for AdminLimits {
    fn default() -> AdminLimits {
        AdminLimits {
            max_users: 100_000,
            max_acls_per_user: 10_000,
            max_lockout_entries: 100_000,
            max_password_hash_bytes: 1_024,
            max_address_bytes: 64,
            max_policies: 10_000,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AdminCommand {
    /// `permissions` and `role` are the raw request strings; the machine validates them.
    CreateUser {
        username: String,
        password_hash: String,
        permissions: Vec<String>,
        role: Option<String>,
    },
    /// Also removes the user's ACL grants. Deleting an unknown user is not an error.
    DeleteUser {
        username: String,
    },
    ChangePassword {
        username: String,
        password_hash: String,
    },
    /// `role: None` or `"none"` removes the role.
    SetRole {
        username: String,
        role: Option<String>,
    },
    /// Granting to a username with no account is allowed (mTLS and JWT identities).
    GrantAcl {
        username: String,
        operation: String,
        pattern: String,
    },
    /// Idempotent.
    RevokeAcl {
        username: String,
        operation: String,
        pattern: String,
    },
    RecordLoginFailure {
        username: String,
        address: String,
        now_ms: u64,
    },
    RecordLoginSuccess {
        username: String,
        address: String,
    },
    /// Many failed logins in one command: a flood of failures is a trickle of Raft writes.
    /// Each entry counts as `count` failures in a row at `now_ms`.
    RecordLoginFailures {
        failures: Vec<LoginFailures>,
        now_ms: u64,
    },
    /// Forgets unlocked entries idle for the policy's `reset_after_ms`.
    PruneLockouts {
        now_ms: u64,
    },
    /// Replaces the lockout policy (the broker proposes it at boot when its configuration
    /// differs), so every replica locks out by the same rule.
    SetLockoutPolicy {
        policy: LockoutPolicy,
    },
    /// Records that the broker's configuration seeded `username` (the bootstrap admin, an
    /// account of `MALACHI_DEFAULT_USERS`), whether or not the account still exists.
    /// Idempotent.
    RecordSeeded {
        username: String,
    },
    /// Records a broker of the cluster and where it is reached, replacing what an earlier
    /// registration of the same node id said (a restart on a new address).
    RegisterBroker {
        broker: BrokerRecord,
    },
    /// Marks a registered broker as leaving (decommissioned): it takes no new segments and no
    /// voter seat, and the groups' leaders move its seats to others. `leaving: false` undoes it.
    SetBrokerLeaving {
        node_id: u64,
        leaving: bool,
    },
    /// Forgets a broker that left; refused unless it was marked leaving first.
    RemoveBroker {
        node_id: u64,
    },
    /// Defines or replaces a storage policy from raw request fields.
    DefinePolicy {
        name: String,
        fields: Vec<crate::policy::PolicyField>,
    },
    /// Deletes a storage policy; `bound_topics` are the topics bound to it in every vnode
    /// (refused with `policy_in_use` while any are, unless `force`: they turn unresolved).
    DeletePolicy {
        name: String,
        force: bool,
        bound_topics: Vec<String>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AdminResponse {
    UserCreated,
    UserDeleted {
        existed: bool,
        acls_removed: u64,
    },
    PasswordChanged,
    RoleSet {
        previous: Option<Role>,
    },
    AclGranted {
        added: bool,
    },
    AclRevoked {
        removed: bool,
    },
    /// `locked_until_ms` is set when this failure started a lockout.
    LoginFailureRecorded {
        failures: u32,
        locked_until_ms: Option<u64>,
    },
    LoginSuccessRecorded {
        cleared: bool,
    },
    /// Failures applied, and pairs whose entry was refused (an invalid name or address).
    LoginFailuresRecorded {
        recorded: u64,
        refused: u64,
    },
    LockoutsPruned {
        removed: u64,
    },
    LockoutPolicySet,
    SeededRecorded {
        added: bool,
    },
    BrokerRegistered {
        changed: bool,
    },
    BrokerLeavingSet {
        changed: bool,
    },
    BrokerRemoved,
    PolicyDefined {
        replaced: bool,
    },
    PolicyDeleted {
        existed: bool,
        unresolved_topics: Vec<String>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdminState {
    limits: AdminLimits,
    lockout_policy: LockoutPolicy,
    /// Number of commands accepted so far.
    version: u64,
    users: BTreeMap<String, User>,
    /// Grants by username; a user with no grants has no entry.
    acls: BTreeMap<String, BTreeSet<AclGrant>>,
    /// Failed logins by username, then client address.
    lockouts: BTreeMap<String, BTreeMap<String, LockoutEntry>>,
    /// Entries in `lockouts`, kept so the bound is checked without a scan.
    lockout_entries: u64,
    /// Names the broker's configuration seeded, kept after the account is deleted: a name is
    /// seeded once in the cluster's life, so an account an administrator deleted stays deleted
    /// across restarts. Absent from snapshots taken before it existed.
    #[serde(default)]
    seeded: BTreeSet<String>,
    /// The cluster's brokers by node id. Absent from snapshots taken before it existed.
    #[serde(default)]
    brokers: BTreeMap<u64, BrokerRecord>,
    /// Registered brokers being decommissioned.
    #[serde(default)]
    leaving: BTreeSet<u64>,
    /// The cluster's storage policy definitions by name. Absent from snapshots taken before
    /// they moved here from the vnodes.
    #[serde(default)]
    policies: crate::policy::PolicyDefinitions,
}

impl Default for AdminState {
    fn default() -> AdminState {
        AdminState::new(AdminLimits::default(), LockoutPolicy::default())
    }
}

impl AdminState {
    pub fn new(limits: AdminLimits, lockout_policy: LockoutPolicy) -> AdminState {
        assert!(limits.max_lockout_entries >= 1, "lockout bookkeeping needs room for one pair");
        AdminState {
            limits,
            lockout_policy,
            version: 0,
            users: BTreeMap::new(),
            acls: BTreeMap::new(),
            lockouts: BTreeMap::new(),
            lockout_entries: 0,
            seeded: BTreeSet::new(),
            brokers: BTreeMap::new(),
            leaving: BTreeSet::new(),
            policies: Default::default(),
        }
    }

    /// Applies one command. `Ok` bumps the version; `Err` leaves the state untouched.
    pub fn apply(&mut self, command: AdminCommand) -> Result<AdminResponse, AdminError> {
        let result = match command {
            AdminCommand::CreateUser { username, password_hash, permissions, role } => {
                self.create_user(username, password_hash, &permissions, role.as_deref())
            }
            AdminCommand::DeleteUser { username } => self.delete_user(&username),
            AdminCommand::ChangePassword { username, password_hash } => {
                self.change_password(&username, password_hash)
            }
            AdminCommand::SetRole { username, role } => self.set_role(&username, role.as_deref()),
            AdminCommand::GrantAcl { username, operation, pattern } => {
                self.grant_acl(username, &operation, pattern)
            }
            AdminCommand::RevokeAcl { username, operation, pattern } => {
                self.revoke_acl(&username, &operation, pattern)
            }
            AdminCommand::RecordLoginFailure { username, address, now_ms } => {
                self.record_login_failure(username, address, now_ms)
            }
            AdminCommand::RecordLoginSuccess { username, address } => {
                self.record_login_success(&username, &address)
            }
            AdminCommand::RecordLoginFailures { failures, now_ms } => {
                self.record_login_failures(failures, now_ms)
            }
            AdminCommand::PruneLockouts { now_ms } => Ok(self.prune_lockouts(now_ms)),
            AdminCommand::SetLockoutPolicy { policy } => {
                self.lockout_policy = policy;
                Ok(AdminResponse::LockoutPolicySet)
            }
            AdminCommand::RecordSeeded { username } => self.record_seeded(username),
            AdminCommand::RegisterBroker { broker } => self.register_broker(broker),
            AdminCommand::SetBrokerLeaving { node_id, leaving } => {
                self.set_broker_leaving(node_id, leaving)
            }
            AdminCommand::RemoveBroker { node_id } => self.remove_broker(node_id),
            AdminCommand::DefinePolicy { name, fields } => self.define_policy(name, &fields),
            AdminCommand::DeletePolicy { name, force, bound_topics } => {
                self.delete_policy(&name, force, bound_topics)
            }
        };
        if result.is_ok() {
            self.version += 1;
        }
        assert!(self.lockout_entries <= u64::from(self.limits.max_lockout_entries));
        #[cfg(test)]
        self.check_invariants().expect("admin invariants hold after every command");
        result
    }

    /// xxh3-64 over the canonical JSON of the state (only `BTreeMap`s, no floats).
    pub fn state_hash(&self) -> u64 {
        let bytes = serde_json::to_vec(self).expect("admin state serializes: string keys only");
        xxhash_rust::xxh3::xxh3_64(&bytes)
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn limits(&self) -> &AdminLimits {
        &self.limits
    }

    pub fn lockout_policy(&self) -> &LockoutPolicy {
        &self.lockout_policy
    }

    /// Checks every invariant of the whole state (after restoring a snapshot, and in tests
    /// after every command): no empty grant or lockout maps are kept, the lockout count is
    /// exact and within its bound, and users are keyed by their names.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        let violation = |detail: &str| Err(InvariantViolation { detail: detail.to_string() });
        if self.acls.values().any(BTreeSet::is_empty) {
            return violation("an empty ACL entry is kept");
        }
        if self.lockouts.values().any(BTreeMap::is_empty) {
            return violation("an empty lockout entry is kept");
        }
        let counted: usize = self.lockouts.values().map(BTreeMap::len).sum();
        if counted as u64 != self.lockout_entries {
            return violation("the lockout count is wrong");
        }
        if self.lockout_entries > u64::from(self.limits.max_lockout_entries) {
            return violation("more lockout entries than the limit");
        }
        if self.users.iter().any(|(name, user)| *name != user.username) {
            return violation("a user is keyed by another name");
        }
        if self.brokers.iter().any(|(&id, broker)| id != broker.node_id || id == 0) {
            return violation("a broker is keyed by another id, or by 0");
        }
        if self.brokers.len() > BROKERS_MAX {
            return violation("more brokers than the limit");
        }
        if self.leaving.iter().any(|id| !self.brokers.contains_key(id)) {
            return violation("a broker marked leaving is not registered");
        }
        Ok(())
    }
}

impl Permission {
    pub fn parse(text: &str) -> Option<Permission> {
        match text {
            "admin" => Some(Permission::Admin),
            "produce" => Some(Permission::Produce),
            "consume" => Some(Permission::Consume),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Permission::Admin => "admin",
            Permission::Produce => "produce",
            Permission::Consume => "consume",
        }
    }
}

impl Role {
    /// `None` and `"none"` mean no role; any other unknown text is an error.
    pub fn parse(text: Option<&str>) -> Result<Option<Role>, AdminError> {
        match text {
            None | Some("none") => Ok(None),
            Some("viewer") => Ok(Some(Role::Viewer)),
            Some("editor") => Ok(Some(Role::Editor)),
            Some("admin") => Ok(Some(Role::Admin)),
            Some(_) => Err(AdminError::InvalidRole),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Editor => "editor",
            Role::Admin => "admin",
        }
    }
}

impl Operation {
    pub fn parse(text: &str) -> Result<Operation, AdminError> {
        match text {
            "produce" => Ok(Operation::Produce),
            "consume" => Ok(Operation::Consume),
            _ => Err(AdminError::InvalidOperation),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Produce => "produce",
            Operation::Consume => "consume",
        }
    }

    /// The permission that grants this operation outside strict ACL mode.
    pub fn permission(self) -> Permission {
        match self {
            Operation::Produce => Permission::Produce,
            Operation::Consume => Permission::Consume,
        }
    }
}

#[cfg(test)]
mod tests;
