//! Tables for users, ACL grants, the authorization rule and lockouts.

use std::collections::BTreeSet;

use super::*;

const MINUTE_MS: u64 = 60_000;

/// (user, permissions at auth, operation, topic, strict, allowed)
type AuthCase<'a> = (&'a str, &'a BTreeSet<Permission>, Operation, &'a str, bool, bool);

fn create_user(username: &str, permissions: &[&str], role: Option<&str>) -> AdminCommand {
    AdminCommand::CreateUser {
        username: username.to_string(),
        password_hash: format!("$argon2id$v=19$m=19456,t=2,p=1$c2FsdA$hash-of-{username}"),
        permissions: permissions.iter().map(|p| p.to_string()).collect(),
        role: role.map(str::to_string),
    }
}

fn grant(username: &str, operation: &str, pattern: &str) -> AdminCommand {
    AdminCommand::GrantAcl {
        username: username.into(),
        operation: operation.into(),
        pattern: pattern.into(),
    }
}

fn revoke(username: &str, operation: &str, pattern: &str) -> AdminCommand {
    AdminCommand::RevokeAcl {
        username: username.into(),
        operation: operation.into(),
        pattern: pattern.into(),
    }
}

fn failure(username: &str, address: &str, now_ms: u64) -> AdminCommand {
    AdminCommand::RecordLoginFailure { username: username.into(), address: address.into(), now_ms }
}

fn apply_ok(state: &mut AdminState, command: AdminCommand) -> AdminResponse {
    match state.apply(command.clone()) {
        Ok(response) => response,
        Err(error) => panic!("{command:?} refused: {}", error.reason()),
    }
}

fn assert_refused(state: &mut AdminState, command: AdminCommand, reason: &str) {
    let (before, hash) = (state.clone(), state.state_hash());
    match state.apply(command.clone()) {
        Ok(response) => panic!("{command:?} accepted: {response:?}"),
        Err(error) => assert_eq!(error.reason_text(), reason, "{command:?}"),
    }
    assert_eq!((state.state_hash(), &*state), (hash, &before), "{command:?} changed the state");
}

fn seeded() -> AdminState {
    let mut state = AdminState::default();
    apply_ok(&mut state, create_user("admin", &["admin"], Some("admin")));
    apply_ok(&mut state, create_user("app", &["produce", "consume", "produce"], None));
    apply_ok(&mut state, create_user("reader", &[], Some("viewer")));
    state
}

#[test]
fn users_are_created_listed_and_deleted_with_their_grants() {
    let mut state = seeded();
    let listed = state.list_users_with_roles();
    assert_eq!(
        listed,
        vec![
            ("admin", vec![Permission::Admin], Some(Role::Admin)),
            ("app", vec![Permission::Produce, Permission::Consume], None),
            ("reader", vec![], Some(Role::Viewer)),
        ]
    );
    apply_ok(&mut state, grant("app", "produce", "orders"));
    apply_ok(&mut state, grant("app", "consume", "logs.*"));
    let response = apply_ok(&mut state, AdminCommand::DeleteUser { username: "app".into() });
    assert_eq!(response, AdminResponse::UserDeleted { existed: true, acls_removed: 2 });
    assert!(state.list_acls("app").is_empty() && state.user("app").is_none());
    let response = apply_ok(&mut state, AdminCommand::DeleteUser { username: "app".into() });
    assert_eq!(response, AdminResponse::UserDeleted { existed: false, acls_removed: 0 });
}

#[test]
fn user_refusals() {
    let limits = AdminLimits { max_users: 3, ..AdminLimits::default() };
    let mut state = AdminState::new(limits, LockoutPolicy::default());
    apply_ok(&mut state, create_user("admin", &["admin"], None));
    apply_ok(&mut state, create_user("other", &[], None));
    let change = |username: &str, hash: &str| AdminCommand::ChangePassword {
        username: username.into(),
        password_hash: hash.into(),
    };
    let role = |username: &str, role: Option<&str>| AdminCommand::SetRole {
        username: username.into(),
        role: role.map(str::to_string),
    };
    let cases: Vec<(AdminCommand, &str)> = vec![
        (create_user("new", &["produce", "write"], None), "invalid_permissions"),
        (create_user("new", &["Admin"], None), "invalid_permissions"),
        (create_user("new", &[], Some("owner")), "invalid_role"),
        (create_user("admin", &["admin"], None), "user_exists"),
        (create_user("", &[], None), "invalid_username"),
        (create_user("a\tb", &[], None), "invalid_username"),
        (
            AdminCommand::CreateUser {
                username: "x".into(),
                password_hash: String::new(),
                permissions: vec![],
                role: None,
            },
            "invalid_password_hash",
        ),
        (change("ghost", "$argon2id$x"), "user_not_found"),
        (change("admin", ""), "invalid_password_hash"),
        (role("ghost", Some("viewer")), "user_not_found"),
        (role("admin", Some("root")), "invalid_role"),
        (AdminCommand::DeleteUser { username: String::new() }, "invalid_username"),
    ];
    for (command, reason) in cases {
        assert_refused(&mut state, command, reason);
    }
    apply_ok(&mut state, create_user("third", &[], None));
    assert_refused(&mut state, create_user("fourth", &[], None), "too_many_users");
}

/// A seeded name stays recorded after its account is deleted, so the broker never seeds it
/// again; recording is idempotent, survives a snapshot, and is bounded.
#[test]
fn seeded_names_outlive_their_accounts() {
    let mut state = seeded();
    let record = |username: &str| AdminCommand::RecordSeeded { username: username.into() };
    let steps: &[(&str, bool)] = &[("admin", true), ("admin", false), ("app", true)];
    for (username, added) in steps {
        let response = apply_ok(&mut state, record(username));
        assert_eq!(response, AdminResponse::SeededRecorded { added: *added }, "{username}");
    }
    apply_ok(&mut state, AdminCommand::DeleteUser { username: "app".into() });
    assert!(state.was_seeded("app") && state.user("app").is_none(), "deleted, still seeded");
    assert!(state.was_seeded("admin") && !state.was_seeded("reader"));
    assert_refused(&mut state, record(""), "invalid_username");

    let restored: AdminState =
        serde_json::from_slice(&serde_json::to_vec(&state).unwrap()).unwrap();
    assert!(restored.was_seeded("app"), "kept in snapshots");
    let mut older = serde_json::to_value(&state).unwrap();
    older.as_object_mut().unwrap().remove("seeded");
    let older: AdminState = serde_json::from_value(older).unwrap();
    assert!(!older.was_seeded("admin"), "a snapshot from before seeding was recorded restores");

    let limits = AdminLimits { max_users: 1, ..AdminLimits::default() };
    let mut small = AdminState::new(limits, LockoutPolicy::default());
    apply_ok(&mut small, record("admin"));
    assert_refused(&mut small, record("app"), "too_many_users");
}

#[test]
fn password_and_role_changes() {
    let mut state = seeded();
    let command = AdminCommand::ChangePassword {
        username: "app".into(),
        password_hash: "$argon2id$new".into(),
    };
    assert_eq!(apply_ok(&mut state, command), AdminResponse::PasswordChanged);
    assert_eq!(state.user("app").expect("user").password_hash, "$argon2id$new");
    let steps: &[(Option<&str>, Option<Role>, Option<Role>)] = &[
        (Some("editor"), None, Some(Role::Editor)),
        (Some("admin"), Some(Role::Editor), Some(Role::Admin)),
        (Some("none"), Some(Role::Admin), None),
        (Some("viewer"), None, Some(Role::Viewer)),
        (None, Some(Role::Viewer), None),
    ];
    for &(role, previous, now) in steps {
        let command =
            AdminCommand::SetRole { username: "app".into(), role: role.map(str::to_string) };
        assert_eq!(apply_ok(&mut state, command), AdminResponse::RoleSet { previous });
        assert_eq!(state.user("app").expect("user").role, now);
    }
}

#[test]
fn acl_grant_and_revoke_table() {
    let mut state = seeded();
    let cases: Vec<(AdminCommand, AdminResponse)> = vec![
        (grant("app", "produce", "orders"), AdminResponse::AclGranted { added: true }),
        (grant("app", "produce", "orders"), AdminResponse::AclGranted { added: false }),
        (grant("app", "consume", "orders"), AdminResponse::AclGranted { added: true }),
        (grant("app", "consume", "*"), AdminResponse::AclGranted { added: true }),
        (grant("ghost", "consume", "logs-*"), AdminResponse::AclGranted { added: true }),
        (revoke("app", "consume", "*"), AdminResponse::AclRevoked { removed: true }),
        (revoke("app", "consume", "*"), AdminResponse::AclRevoked { removed: false }),
        (revoke("nobody", "produce", "x"), AdminResponse::AclRevoked { removed: false }),
    ];
    for (command, expected) in cases {
        assert_eq!(apply_ok(&mut state, command.clone()), expected, "{command:?}");
    }
    let listed = state.list_acls("app");
    assert_eq!(listed, vec![(Operation::Produce, "orders"), (Operation::Consume, "orders")]);
    let refusals: Vec<(AdminCommand, &str)> = vec![
        (grant("app", "read", "orders"), "invalid_operation"),
        (grant("app", "admin", "orders"), "invalid_operation"),
        (grant("app", "produce", ""), "invalid_acl"),
        (grant("app", "produce", "a*b"), "invalid_acl"),
        (grant("app", "produce", "**"), "invalid_acl"),
        (grant("app", "produce", "bad topic"), "invalid_acl"),
        (grant("app", "produce", ".."), "invalid_acl"),
        (revoke("app", "write", "orders"), "invalid_operation"),
        (revoke("app", "produce", "x*y"), "invalid_acl"),
    ];
    for (command, reason) in refusals {
        assert_refused(&mut state, command, reason);
    }
    let limits = AdminLimits { max_acls_per_user: 1, ..AdminLimits::default() };
    let mut small = AdminState::new(limits, LockoutPolicy::default());
    apply_ok(&mut small, grant("u", "produce", "a"));
    apply_ok(&mut small, grant("u", "produce", "a"));
    assert_refused(&mut small, grant("u", "produce", "b"), "too_many_acls");
}

#[test]
fn allowed_follows_the_p_op_topic_rule() {
    let mut state = seeded();
    apply_ok(&mut state, grant("reader", "consume", "logs.*"));
    apply_ok(&mut state, grant("reader", "produce", "inbox"));
    let perms = |list: &[Permission]| list.iter().copied().collect::<BTreeSet<_>>();
    let admin = perms(&[Permission::Admin]);
    let producer = perms(&[Permission::Produce]);
    let none = perms(&[]);
    use Operation::{Consume, Produce};
    // (user, permissions at auth, operation, topic, strict, allowed)
    let cases: Vec<AuthCase> = vec![
        ("admin", &admin, Produce, "anything", true, true),
        ("app", &producer, Produce, "orders", false, true),
        ("app", &producer, Produce, "orders", true, false),
        ("app", &producer, Consume, "orders", false, false),
        ("reader", &none, Consume, "logs.app", true, true),
        ("reader", &none, Consume, "logs.", false, true),
        ("reader", &none, Consume, "logs", false, false),
        ("reader", &none, Consume, "logsx", false, false),
        ("reader", &none, Produce, "logs.app", false, false),
        ("reader", &none, Produce, "inbox", true, true),
        ("reader", &none, Produce, "inbox2", true, false),
        ("reader", &producer, Consume, "other", false, false),
        ("ghost", &none, Consume, "logs.app", false, false),
    ];
    for (user, permissions, operation, topic, strict, allowed) in cases {
        assert_eq!(
            state.allowed(user, permissions, operation, topic, strict),
            allowed,
            "{user} {operation:?} {topic} strict={strict}"
        );
    }
    apply_ok(&mut state, revoke("reader", "consume", "logs.*"));
    assert!(!state.allowed("reader", &none, Consume, "logs.app", true), "revokes apply at once");
}

#[test]
fn lockout_progression_table() {
    let policy = LockoutPolicy::default();
    // (failure number, lock duration)
    let cases: &[(u32, Option<u64>)] = &[
        (1, None),
        (4, None),
        (5, Some(5 * MINUTE_MS)),
        (6, None),
        (10, Some(15 * MINUTE_MS)),
        (15, Some(45 * MINUTE_MS)),
        (20, Some(120 * MINUTE_MS)),
        (25, Some(360 * MINUTE_MS)),
        (26, None),
        (30, Some(360 * MINUTE_MS)),
        (500, Some(360 * MINUTE_MS)),
    ];
    for &(failures, duration) in cases {
        assert_eq!(policy.lock_duration_ms(failures), duration, "failure {failures}");
    }
    let flat = LockoutPolicy { progressive: false, ..LockoutPolicy::default() };
    assert_eq!(flat.lock_duration_ms(20), Some(5 * MINUTE_MS));
    let off = LockoutPolicy { max_attempts: 0, ..LockoutPolicy::default() };
    assert_eq!(off.lock_duration_ms(5), None);
}

#[test]
fn failures_lock_per_username_and_address() {
    let mut state = AdminState::default();
    let start = 1_000_000;
    for attempt in 1..=5u64 {
        let response = apply_ok(&mut state, failure("bob", "10.0.0.1", start + attempt));
        let locked_until_ms = (attempt == 5).then_some(start + 5 + 5 * MINUTE_MS);
        assert_eq!(
            response,
            AdminResponse::LoginFailureRecorded { failures: attempt as u32, locked_until_ms }
        );
    }
    assert_eq!(state.locked_until("bob", "10.0.0.1", start + 6), Some(start + 5 + 5 * MINUTE_MS));
    assert_eq!(state.locked_until("bob", "10.0.0.1", start + 5 + 5 * MINUTE_MS), None);
    assert_eq!(state.locked_until("bob", "10.0.0.2", start + 6), None, "per address");
    assert_eq!(state.locked_until("alice", "10.0.0.1", start + 6), None, "per username");
    let success =
        AdminCommand::RecordLoginSuccess { username: "bob".into(), address: "10.0.0.1".into() };
    assert_eq!(
        apply_ok(&mut state, success.clone()),
        AdminResponse::LoginSuccessRecorded { cleared: true }
    );
    assert_eq!(
        apply_ok(&mut state, success),
        AdminResponse::LoginSuccessRecorded { cleared: false }
    );
    assert_refused(&mut state, failure("", "10.0.0.1", 0), "invalid_username");
    assert_refused(&mut state, failure("bob", "", 0), "invalid_address");
    assert_refused(&mut state, failure("bob", &"1".repeat(65), 0), "invalid_address");
}

#[test]
fn idle_entries_reset_and_are_pruned() {
    let mut state = AdminState::default();
    let day_ms = LockoutPolicy::default().reset_after_ms;
    apply_ok(&mut state, failure("bob", "a", 0));
    apply_ok(&mut state, failure("bob", "a", 1));
    let response = apply_ok(&mut state, failure("bob", "a", 1 + day_ms));
    assert_eq!(
        response,
        AdminResponse::LoginFailureRecorded { failures: 1, locked_until_ms: None }
    );
    apply_ok(&mut state, failure("eve", "b", 2 + day_ms));
    let response = apply_ok(&mut state, AdminCommand::PruneLockouts { now_ms: 1 + 2 * day_ms });
    assert_eq!(response, AdminResponse::LockoutsPruned { removed: 1 });
    assert!(state.lockout_entry("bob", "a").is_none());
    assert_eq!(state.lockout_entry("eve", "b").map(|entry| entry.failures), Some(1));
}

#[test]
fn lockout_entries_are_bounded_by_evicting_the_least_recent() {
    let limits = AdminLimits { max_lockout_entries: 2, ..AdminLimits::default() };
    let mut state = AdminState::new(limits, LockoutPolicy::default());
    apply_ok(&mut state, failure("a", "1", 10));
    apply_ok(&mut state, failure("b", "1", 5));
    apply_ok(&mut state, failure("a", "1", 20));
    apply_ok(&mut state, failure("c", "1", 30));
    assert!(state.lockout_entry("b", "1").is_none(), "b failed least recently");
    assert_eq!(state.lockout_entry("a", "1").map(|entry| entry.failures), Some(2));
    assert!(state.lockout_entry("c", "1").is_some());
}

#[test]
fn admin_replay_and_serde_round_trip_are_identical() {
    let commands = vec![
        create_user("admin", &["admin"], None),
        grant("admin", "produce", "x*"),
        failure("admin", "::1", 7),
        AdminCommand::SetRole { username: "admin".into(), role: Some("editor".into()) },
    ];
    let mut first = AdminState::default();
    let mut second = AdminState::default();
    for command in &commands {
        apply_ok(&mut first, command.clone());
        apply_ok(&mut second, command.clone());
    }
    assert_eq!(first.state_hash(), second.state_hash());
    assert_eq!(first.version(), 4);
    let json = serde_json::to_string(&first).expect("serializes");
    let restored: AdminState = serde_json::from_str(&json).expect("deserializes");
    assert_eq!((restored.state_hash(), &restored), (first.state_hash(), &first));
}

#[test]
fn the_lockout_policy_is_replicated_state() {
    let mut state = AdminState::default();
    let policy =
        LockoutPolicy { max_attempts: 2, base_duration_ms: 1_000, ..LockoutPolicy::default() };
    apply_ok(&mut state, AdminCommand::SetLockoutPolicy { policy: policy.clone() });
    assert_eq!(state.lockout_policy(), &policy);
    apply_ok(&mut state, failure("ann", "10.0.0.1", 0));
    assert_eq!(state.locked_until("ann", "10.0.0.1", 0), None, "one failure is below the limit");
    apply_ok(&mut state, failure("ann", "10.0.0.1", 0));
    assert_eq!(state.locked_until("ann", "10.0.0.1", 500), Some(1_000), "the second failure locks");
    assert_eq!(state.locked_until("ann", "10.0.0.1", 1_000), None, "for the configured duration");
}

#[test]
fn batched_failures_lock_as_the_same_failures_one_by_one() {
    let entry = |username: &str, address: &str, count| LoginFailures {
        username: username.into(),
        address: address.into(),
        count,
    };
    let mut batched = AdminState::default();
    let failures =
        vec![entry("bob", "10.0.0.1", 4), entry("eve", "10.0.0.2", 1), entry("", "x", 3)];
    let batch = AdminCommand::RecordLoginFailures { failures, now_ms: 1_000 };
    let response = apply_ok(&mut batched, batch);
    assert_eq!(response, AdminResponse::LoginFailuresRecorded { recorded: 5, refused: 1 });
    let mut one_by_one = AdminState::default();
    for _ in 0..4 {
        apply_ok(&mut one_by_one, failure("bob", "10.0.0.1", 1_000));
    }
    apply_ok(&mut one_by_one, failure("eve", "10.0.0.2", 1_000));
    assert_eq!(
        batched.lockout_entry("bob", "10.0.0.1"),
        one_by_one.lockout_entry("bob", "10.0.0.1")
    );
    assert_eq!(batched.locked_until("bob", "10.0.0.1", 1_001), None, "4 failures do not lock");
    let fifth = vec![entry("bob", "10.0.0.1", 1)];
    apply_ok(&mut batched, AdminCommand::RecordLoginFailures { failures: fifth, now_ms: 2_000 });
    assert!(batched.locked_until("bob", "10.0.0.1", 2_001).is_some(), "the fifth locks");
    let many =
        (0..LOGIN_FAILURES_PER_COMMAND_MAX + 5).map(|i| entry("u", &i.to_string(), 1)).collect();
    let response =
        apply_ok(&mut batched, AdminCommand::RecordLoginFailures { failures: many, now_ms: 3_000 });
    let limit = LOGIN_FAILURES_PER_COMMAND_MAX as u64;
    assert_eq!(response, AdminResponse::LoginFailuresRecorded { recorded: limit, refused: 5 });
}
