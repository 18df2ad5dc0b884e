//! Credentials: Argon2id password hashes, session tokens, the admin bootstrap, seeded users and
//! the per-IP login rate limit. Randomness comes through [`Entropy`] so the simulator can seed it;
//! the rate limiter takes time as an argument.
//!
//! An unknown user and a wrong password must be indistinguishable, in the answer and in time, so
//! a check against a missing user still runs one full Argon2id verification against a fixed
//! dummy hash.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};

use argon2::{Argon2, PasswordHash, PasswordHasher, PasswordVerifier};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// A source of random bytes.
pub trait Entropy: Send + Sync {
    fn fill(&self, bytes: &mut [u8]);
}

/// The operating system's generator.
#[derive(Clone, Copy, Debug, Default)]
pub struct OsEntropy;

impl Entropy for OsEntropy {
    fn fill(&self, bytes: &mut [u8]) {
        getrandom::fill(bytes).expect("the operating system has no random source");
    }
}

/// How much work a new password hash costs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PasswordCost {
    /// The argon2 crate's recommended Argon2id parameters: every real broker.
    #[default]
    Standard,
    /// Argon2id's minimum memory and one pass: only for the simulator, whose thousands of
    /// seeded runs each log in dozens of clients on one core. Verification reads the cost from
    /// the stored hash, so this changes nothing but the hashes it writes.
    Minimal,
}

/// Hashes `password` with Argon2id (the crate's recommended parameters) and a fresh salt.
pub fn hash_password(password: &str, entropy: &dyn Entropy) -> String {
    hash_password_with(password, entropy, PasswordCost::Standard)
}

/// Hashes `password` at `cost` with a fresh salt.
pub fn hash_password_with(password: &str, entropy: &dyn Entropy, cost: PasswordCost) -> String {
    let mut salt = [0u8; 16];
    entropy.fill(&mut salt);
    let hasher = match cost {
        PasswordCost::Standard => Argon2::default(),
        PasswordCost::Minimal => Argon2::new(
            argon2::Algorithm::Argon2id,
            argon2::Version::V0x13,
            argon2::Params::new(argon2::Params::MIN_M_COST, 1, 1, None)
                .expect("the minimum Argon2 parameters are valid"),
        ),
    };
    hasher
        .hash_password_with_salt(password.as_bytes(), &salt)
        .expect("Argon2id accepts any password with a 16-byte salt")
        .to_string()
}

/// Checks `password` against a stored PHC hash; `None` (no such user) costs the same as a miss.
pub fn verify_password(stored: Option<&str>, password: &str) -> bool {
    let hash = stored.unwrap_or(DUMMY_HASH);
    let matches = PasswordHash::new(hash)
        .map(|parsed| Argon2::default().verify_password(password.as_bytes(), &parsed).is_ok())
        .unwrap_or(false);
    matches && stored.is_some()
}

/// Argon2id of a random password nobody knows, with the default parameters, so that checking an
/// unknown user costs one real verification.
const DUMMY_HASH: &str =
    "$argon2id$v=19$m=19456,t=2,p=1$bWFsYWNoaWR1bW15$2J1YQmBsUU3l9rpYx0kx9VjwTMqV6RtqyJEVfoGSDXU";

/// A session token: 32 random bytes, 43 URL-safe characters (the original's shape).
pub fn new_token(entropy: &dyn Entropy) -> String {
    let mut bytes = [0u8; 32];
    entropy.fill(&mut bytes);
    URL_SAFE_NO_PAD.encode(bytes)
}

/// A random password for the bootstrap admin: 24 URL-safe characters.
pub fn new_password(entropy: &dyn Entropy) -> String {
    let mut bytes = [0u8; 18];
    entropy.fill(&mut bytes);
    URL_SAFE_NO_PAD.encode(bytes)
}

/// A user named in `MALACHI_DEFAULT_USERS`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeedUser {
    pub username: String,
    pub password: String,
    pub permissions: Vec<String>,
    pub role: Option<String>,
}

pub const PERMISSIONS: [&str; 3] = ["admin", "produce", "consume"];

/// Parses `user:pass:perm,perm[:role];...`.
pub fn parse_seed_users(spec: &str) -> Result<Vec<SeedUser>, String> {
    let mut users = Vec::new();
    for entry in spec.split(';').map(str::trim).filter(|entry| !entry.is_empty()) {
        let parts: Vec<&str> = entry.split(':').collect();
        if !(3..=4).contains(&parts.len()) || parts[0].is_empty() || parts[1].is_empty() {
            return Err(format!(
                "MALACHI_DEFAULT_USERS: {entry:?} is not user:pass:perm,perm[:role]"
            ));
        }
        let permissions: Vec<String> = parts[2]
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(String::from)
            .collect();
        if let Some(bad) = permissions.iter().find(|p| !PERMISSIONS.contains(&p.as_str())) {
            return Err(format!(
                "MALACHI_DEFAULT_USERS: unknown permission {bad:?} for {}",
                parts[0]
            ));
        }
        users.push(SeedUser {
            username: parts[0].to_string(),
            password: parts[1].to_string(),
            permissions,
            role: parts.get(3).map(|role| role.to_string()),
        });
    }
    Ok(users)
}

/// The file holding the bootstrap admin's credentials, readable by the local CLI only.
pub fn admin_credentials_path(data_dir: &Path) -> PathBuf {
    data_dir.join("admin.credentials")
}

/// Writes `admin.credentials` with mode 0600.
pub fn write_admin_credentials(data_dir: &Path, username: &str, password: &str) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = admin_credentials_path(data_dir);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)?;
    writeln!(file, "username = {username:?}\npassword = {password:?}")?;
    file.sync_all()
}

/// Reads `admin.credentials` back: `(username, password)`.
pub fn read_admin_credentials(data_dir: &Path) -> io::Result<(String, String)> {
    let text = std::fs::read_to_string(admin_credentials_path(data_dir))?;
    let value = |key: &str| -> io::Result<String> {
        text.lines()
            .filter_map(|line| line.split_once('='))
            .find(|(name, _)| name.trim() == key)
            .map(|(_, value)| value.trim().trim_matches('"').to_string())
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidData, format!("no {key} in credentials"))
            })
    };
    Ok((value("username")?, value("password")?))
}

/// Failed logins per client address per sliding window (`MALACHI_AUTH_RATE_LIMIT` per
/// `MALACHI_AUTH_RATE_WINDOW_MS`). Only failures count: a guesser fails, while a developer running
/// CLI commands in a loop logs in successfully every time and should never be throttled. Bounded:
/// at most `ips_max` addresses are tracked.
#[derive(Debug)]
pub struct AuthRateLimiter {
    attempts_max: u32,
    window_ms: u64,
    ips_max: usize,
    failures: BTreeMap<String, VecDeque<u64>>,
}

impl AuthRateLimiter {
    pub fn new(attempts_max: u32, window_ms: u64) -> AuthRateLimiter {
        AuthRateLimiter { attempts_max, window_ms, ips_max: 100_000, failures: BTreeMap::new() }
    }

    /// Whether `ip` has used up its failures in the current window.
    pub fn is_limited(&mut self, ip: &str, now_ms: u64) -> bool {
        let window_ms = self.window_ms;
        let Some(recent) = self.failures.get_mut(ip) else { return false };
        while recent.front().is_some_and(|&at| at + window_ms <= now_ms) {
            recent.pop_front();
        }
        recent.len() as u64 >= u64::from(self.attempts_max)
    }

    /// Counts one failed login from `ip`.
    pub fn record_failure(&mut self, ip: &str, now_ms: u64) {
        self.failures.entry(ip.to_string()).or_default().push_back(now_ms);
        if self.failures.len() > self.ips_max {
            let window_ms = self.window_ms;
            self.failures
                .retain(|_, recent| recent.back().is_some_and(|&at| at + window_ms > now_ms));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(u8);
    impl Entropy for Fixed {
        fn fill(&self, bytes: &mut [u8]) {
            bytes.fill(self.0);
        }
    }

    #[test]
    fn hashes_verify_and_misses_fail() {
        let hash = hash_password("correct horse", &Fixed(1));
        assert!(hash.starts_with("$argon2id$"));
        assert!(verify_password(Some(&hash), "correct horse"));
        assert!(!verify_password(Some(&hash), "wrong horse"));
        assert!(!verify_password(None, "correct horse"));
        assert!(!verify_password(Some("not a hash"), "x"));
        assert_ne!(hash, hash_password("correct horse", &Fixed(2)), "salts differ");
    }

    #[test]
    fn the_dummy_hash_parses() {
        // If it did not, unknown users would be answered faster than wrong passwords.
        assert!(PasswordHash::new(DUMMY_HASH).is_ok());
    }

    #[test]
    fn tokens_have_the_originals_shape() {
        let token = new_token(&OsEntropy);
        assert_eq!(token.len(), 43);
        assert!(
            token.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_')
        );
    }

    #[test]
    fn seed_users_parse() {
        let users =
            parse_seed_users("admin:admin123:admin; app:app123:produce,consume:editor;").unwrap();
        assert_eq!(users.len(), 2);
        assert_eq!(users[1].permissions, vec!["produce", "consume"]);
        assert_eq!(users[1].role.as_deref(), Some("editor"));
        for bad in ["nopass", "a::admin", "a:b:fly", "a:b:c:d:e"] {
            assert!(parse_seed_users(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_failures_count_and_the_window_slides() {
        let mut limiter = AuthRateLimiter::new(2, 1000);
        let ip = "10.0.0.1";
        assert!(!limiter.is_limited(ip, 0), "successful logins are never counted");
        limiter.record_failure(ip, 0);
        limiter.record_failure(ip, 10);
        let cases = [(20, true), (999, true), (1000, false)];
        for (now_ms, limited) in cases {
            assert_eq!(limiter.is_limited(ip, now_ms), limited, "at {now_ms}");
        }
        assert!(!limiter.is_limited("10.0.0.2", 20), "limits are per address");
    }

    #[test]
    fn admin_credentials_round_trip_with_0600() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        write_admin_credentials(dir.path(), "admin", "p4ss-w0rd-long").unwrap();
        assert_eq!(
            read_admin_credentials(dir.path()).unwrap(),
            ("admin".into(), "p4ss-w0rd-long".into())
        );
        let mode =
            std::fs::metadata(admin_credentials_path(dir.path())).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
