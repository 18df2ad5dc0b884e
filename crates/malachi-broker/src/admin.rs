//! The administrative service: the accounts a broker seeds at boot (the bootstrap admin and
//! `MALACHI_DEFAULT_USERS`), password hashing, and the retention policies (`policies.rs`).
//! Users, grants and policies live in the administrative Raft group; this service writes them.

use std::io;
use std::sync::Arc;

use malachi_meta::{AdminCommand, AdminError, LockoutPolicy};

use crate::auth;

use crate::node::{BootError, BootReport, Core, data_dir_error};

/// The administrative service. Its own state is how passwords are hashed and whether the
/// bootstrap admin's credentials are written for the local CLI.
pub struct Admin {
    core: Arc<Core>,
    password_cost: auth::PasswordCost,
    write_admin_credentials: bool,
}

services_on_core!(Admin);

impl Admin {
    pub(crate) fn new(
        core: Arc<Core>,
        password_cost: auth::PasswordCost,
        write_admin_credentials: bool,
    ) -> Admin {
        Admin { core, password_cost, write_admin_credentials }
    }

    /// The accounts the configuration asks for, each seeded once in the cluster's life: the
    /// bootstrap admin (from `MALACHI_ADMIN_PASS`, else generated, printed once and stored 0600
    /// for the local CLI), then `MALACHI_DEFAULT_USERS`. A seeded name is recorded in the admin
    /// machine, so an account an administrator deleted stays deleted across restarts, while a
    /// name added to `MALACHI_DEFAULT_USERS` later is still created at the next boot.
    pub(crate) async fn bootstrap_users(&self) -> Result<BootReport, BootError> {
        let mut report = BootReport::default();
        let seed_users = self.seed_users()?;
        self.apply_lockout_policy().await?;
        if self.needs_seeding("admin") {
            if self.user_missing("admin") {
                self.create_admin(&mut report).await?;
            }
            self.record_seeded("admin").await?;
        }
        for user in seed_users.into_iter().filter(|user| self.needs_seeding(&user.username)) {
            if self.user_missing(&user.username) {
                let (name, password) = (&user.username, &user.password);
                self.create_user_hashed(name, password, user.permissions, user.role).await?;
                report.seeded_users.push(user.username.clone());
            }
            // An account that exists already (made by hand, or seeded before names were
            // recorded) is kept as it is, and recorded like one created now.
            self.record_seeded(&user.username).await?;
        }
        Ok(report)
    }

    /// Creates the bootstrap admin with `MALACHI_ADMIN_PASS`, or a generated password that the
    /// report carries to the operator's screen once. The credentials file is written, durably,
    /// before the account is committed: if the write fails, the boot stops while no account has
    /// a password that nobody can read.
    async fn create_admin(&self, report: &mut BootReport) -> Result<(), BootError> {
        let password = match &self.config.admin_pass {
            Some(password) => password.clone(),
            None => auth::new_password(&*self.entropy, self.config.min_password_len),
        };
        if self.write_admin_credentials {
            self.write_admin_credentials_first(&password)?;
        }
        self.create_user_hashed("admin", &password, vec!["admin".into()], None).await?;
        if self.config.admin_pass.is_none() {
            report.generated_admin_password = Some(password);
        }
        Ok(())
    }

    /// Writes `admin.credentials` for an admin account about to be created. A file already
    /// there was left by an earlier boot that stopped between writing it and committing the
    /// account (only a missing, never seeded admin gets here): its password never worked
    /// anywhere. It is removed unread, since it may have been planted while the directory was
    /// looser, and written afresh; a link is removed, never followed.
    fn write_admin_credentials_first(&self, password: &str) -> Result<(), BootError> {
        let data_dir = &self.config.data_dir;
        let write = || auth::write_admin_credentials(data_dir, "admin", password);
        let written = match write() {
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
                let path = auth::admin_credentials_path(data_dir);
                tracing::warn!(
                    path = %path.display(),
                    "replacing admin credentials left by a boot that stopped before it created \
                     the admin account (their password never worked)"
                );
                std::fs::remove_file(&path).and_then(|()| write())
            }
            written => written,
        };
        written.map_err(|source| data_dir_error(data_dir, source))
    }

    fn needs_seeding(&self, username: &str) -> bool {
        !self.admin.read(|admin| admin.0.was_seeded(username))
    }

    fn user_missing(&self, username: &str) -> bool {
        self.admin.read(|admin| admin.0.user(username).is_none())
    }

    /// Records `username` as seeded, so that no later boot seeds it again.
    async fn record_seeded(&self, username: &str) -> Result<(), BootError> {
        let command = AdminCommand::RecordSeeded { username: username.into() };
        match self.admin.propose(command).await? {
            Ok(_) => Ok(()),
            Err(error) => Err(BootError::Users(format!("user {username}: {}", error.reason()))),
        }
    }

    /// The accounts `MALACHI_DEFAULT_USERS` asks for, after checking every password against
    /// `MALACHI_MIN_PASSWORD_LEN` (the configuration checks `MALACHI_ADMIN_PASS` as it loads).
    /// One short password stops the boot, naming its user, before anything is created: a
    /// broker that started without an account its operator configured would fail later, at
    /// some client's login, far from the cause.
    fn seed_users(&self) -> Result<Vec<auth::SeedUser>, BootError> {
        let Some(spec) =
            self.config.default_users.as_deref().filter(|_| !self.config.disable_default_users)
        else {
            return Ok(Vec::new());
        };
        let users = auth::parse_seed_users(spec).map_err(BootError::Users)?;
        let min_chars = self.config.min_password_len;
        for user in &users {
            auth::check_password_length(&user.password, min_chars).map_err(|_| {
                BootError::ShortSeedPassword { username: user.username.clone(), min_chars }
            })?;
        }
        Ok(users)
    }

    /// Makes the replicated lockout rule match `MALACHI_MAX_AUTH_ATTEMPTS`,
    /// `MALACHI_LOCKOUT_DURATION_MS` and `MALACHI_PROGRESSIVE_LOCKOUT`.
    async fn apply_lockout_policy(&self) -> Result<(), BootError> {
        let wanted = LockoutPolicy {
            max_attempts: self.config.max_auth_attempts,
            base_duration_ms: self.config.lockout_duration_ms,
            progressive: self.config.progressive_lockout,
            ..LockoutPolicy::default()
        };
        if self.admin.read(|admin| admin.0.lockout_policy() == &wanted) {
            return Ok(());
        }
        match self.admin.propose(AdminCommand::SetLockoutPolicy { policy: wanted }).await? {
            Ok(_) => Ok(()),
            Err(error) => Err(BootError::Users(format!("lockout policy: {}", error.reason()))),
        }
    }

    async fn create_user_hashed(
        &self,
        username: &str,
        password: &str,
        permissions: Vec<String>,
        role: Option<String>,
    ) -> Result<(), BootError> {
        let password_hash = self
            .hash_new_password(password.to_string())
            .await
            .map_err(|error| BootError::Users(format!("user {username}: {error}")))?;
        let command = AdminCommand::CreateUser {
            username: username.into(),
            password_hash,
            permissions,
            role,
        };
        match self.admin.propose(command).await? {
            Ok(_) | Err(AdminError::UserExists) => Ok(()),
            Err(error) => Err(BootError::Users(format!("user {username}: {}", error.reason()))),
        }
    }

    /// Hashes a new password after checking it against `MALACHI_MIN_PASSWORD_LEN`: the only way
    /// a new password reaches the admin machine (create_user, change_password, seeded users),
    /// so none escapes the rule. The check comes first: a refused password costs no Argon2 work.
    pub async fn hash_new_password(
        &self,
        password: String,
    ) -> Result<String, auth::PasswordTooShort> {
        auth::check_password_length(&password, self.config.min_password_len)?;
        Ok(self.hash_password(password).await)
    }

    /// Argon2id costs tens of milliseconds of CPU: it runs where blocking work runs, never on
    /// an async worker (inline only under the simulator).
    async fn hash_password(&self, password: String) -> String {
        let entropy = Arc::clone(&self.entropy);
        let cost = self.password_cost;
        self.data.run(move || auth::hash_password_with(&password, &*entropy, cost)).await
    }
}
