//! Credentials: Argon2id password hashes, session tokens, the admin bootstrap, seeded users and
//! the per-IP login rate limit. Randomness comes through [`Entropy`] so the simulator can seed it;
//! the rate limiter takes time as an argument.
//!
//! An unknown user and a wrong password must be indistinguishable, in the answer and in time, so
//! a check against a missing user still runs one full Argon2id verification against a fixed
//! dummy hash.

use malachi_reason::Reason;
use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::net::{IpAddr, Ipv6Addr};
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

/// Characters of a generated admin password when the minimum asks for fewer: 144 random bits.
pub const GENERATED_PASSWORD_CHARS: u32 = 24;

/// A random password for the bootstrap admin: URL-safe characters, [`GENERATED_PASSWORD_CHARS`]
/// of them or `min_chars` if that is more, so it always passes [`check_password_length`].
pub fn new_password(entropy: &dyn Entropy, min_chars: u32) -> String {
    let chars = min_chars.max(GENERATED_PASSWORD_CHARS) as usize;
    // Base64 carries 6 bits per character: enough bytes for `chars` characters, then cut.
    let mut bytes = vec![0u8; chars.div_ceil(4) * 3];
    entropy.fill(&mut bytes);
    let mut password = URL_SAFE_NO_PAD.encode(bytes);
    password.truncate(chars);
    password
}

/// A new password shorter than `MALACHI_MIN_PASSWORD_LEN`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a password needs at least {min_chars} characters (MALACHI_MIN_PASSWORD_LEN)")]
pub struct PasswordTooShort {
    pub min_chars: u32,
}

impl PasswordTooShort {
    /// The wire reason. Section 3.4 names none for a password refused by policy; ours is
    /// documented in docs/protocol.md.
    pub fn reason(&self) -> Reason {
        Reason::InvalidPassword
    }
}

/// Checks a new password against the minimum length. Length is counted in characters (Unicode
/// scalar values), not bytes, so a password of accented letters is not judged twice as long.
pub fn check_password_length(password: &str, min_chars: u32) -> Result<(), PasswordTooShort> {
    let long_enough = password.chars().count() >= min_chars as usize;
    if long_enough { Ok(()) } else { Err(PasswordTooShort { min_chars }) }
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

/// Writes `admin.credentials`: created exclusively (never over an existing file, never through a
/// symbolic link), mode 0600, and synced with its directory before this returns, so the caller
/// can commit the account it describes knowing the password is on the disk. Values are JSON
/// strings (which read as TOML too), so any password survives the round trip, `"` and `\`
/// included.
pub fn write_admin_credentials(data_dir: &Path, username: &str, password: &str) -> io::Result<()> {
    use malachi_log::{OpenMode, RealStorage, Storage};
    let text = format_admin_credentials(username, password);
    let file = RealStorage.open(&admin_credentials_path(data_dir), OpenMode::CreateNew)?;
    file.write_all_at(&[text.as_bytes()], 0)?;
    file.sync_data()?;
    RealStorage.sync_dir(data_dir)
}

/// Reads `admin.credentials` back: `(username, password)`.
pub fn read_admin_credentials(data_dir: &Path) -> io::Result<(String, String)> {
    let text = std::fs::read_to_string(admin_credentials_path(data_dir))?;
    parse_admin_credentials(&text)
        .map_err(|detail| io::Error::new(io::ErrorKind::InvalidData, detail))
}

fn format_admin_credentials(username: &str, password: &str) -> String {
    let quote = |value: &str| serde_json::to_string(value).expect("a string serializes");
    format!(
        "# The bootstrap admin, for the local CLI. Values are JSON strings.\n\
         username = {}\npassword = {}\n",
        quote(username),
        quote(password)
    )
}

fn parse_admin_credentials(text: &str) -> Result<(String, String), String> {
    let value = |key: &str| -> Result<String, String> {
        let (_, quoted) = text
            .lines()
            .filter(|line| !line.trim_start().starts_with('#'))
            .filter_map(|line| line.split_once('='))
            .find(|(name, _)| name.trim() == key)
            .ok_or_else(|| format!("no {key} in credentials"))?;
        serde_json::from_str(quoted.trim()).map_err(|error| format!("{key}: {error}"))
    };
    Ok((value("username")?, value("password")?))
}

/// Failed logins per client per sliding window (`MALACHI_AUTH_RATE_LIMIT` per
/// `MALACHI_AUTH_RATE_WINDOW_MS`). Only failures count: a guesser fails, while a developer running
/// CLI commands in a loop logs in successfully every time and should never be throttled.
///
/// A client is an IPv4 address or an IPv6 /64 (one host usually holds a whole /64, so counting
/// single IPv6 addresses would give a guesser 2^64 budgets). The check and the count are one step
/// ([`AuthRateLimiter::begin`]): every login is counted as a failure *before* its password is
/// checked and refunded if it succeeds, so concurrent guesses from one client cannot all pass
/// the check before any is counted. Memory is bounded: each client keeps at most
/// `attempts_max` times, and at most [`AUTH_RATE_CLIENTS_MAX`] clients are tracked; beyond
/// that, those whose last failure is oldest are forgotten first.
#[derive(Debug)]
pub struct AuthRateLimiter {
    attempts_max: u32,
    window_ms: u64,
    clients_max: usize,
    failures: BTreeMap<IpAddr, VecDeque<u64>>,
}

/// Clients the login rate limiter tracks at most.
pub const AUTH_RATE_CLIENTS_MAX: usize = 100_000;

/// A client used up its failed logins for the window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimited;

/// A login counted against its client, to refund if it succeeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoginAttempt {
    client: IpAddr,
    at_ms: u64,
}

/// The client a peer address counts as: IPv4 (also when mapped into IPv6) as is, IPv6 by /64.
pub fn rate_client(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V4(_) => address,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
    }
}

impl AuthRateLimiter {
    pub fn new(attempts_max: u32, window_ms: u64) -> AuthRateLimiter {
        AuthRateLimiter::with_capacity(attempts_max, window_ms, AUTH_RATE_CLIENTS_MAX)
    }

    pub fn with_capacity(attempts_max: u32, window_ms: u64, clients_max: usize) -> AuthRateLimiter {
        AuthRateLimiter { attempts_max, window_ms, clients_max, failures: BTreeMap::new() }
    }

    /// Counts a login from `address` as a failure, unless its client has used up its failures
    /// in the window (`Err`: refuse it without checking the password).
    pub fn begin(&mut self, address: IpAddr, now_ms: u64) -> Result<LoginAttempt, RateLimited> {
        let client = rate_client(address);
        let (window_ms, attempts_max) = (self.window_ms, self.attempts_max as usize);
        let recent = self.failures.entry(client).or_default();
        while recent.front().is_some_and(|&at| at + window_ms <= now_ms) {
            recent.pop_front();
        }
        if recent.len() >= attempts_max {
            return Err(RateLimited);
        }
        recent.push_back(now_ms);
        self.bound(now_ms);
        Ok(LoginAttempt { client, at_ms: now_ms })
    }

    /// The login succeeded (or was never judged): it no longer counts.
    pub fn refund(&mut self, attempt: LoginAttempt) {
        if let Some(recent) = self.failures.get_mut(&attempt.client) {
            if let Some(at) = recent.iter().rposition(|&at| at == attempt.at_ms) {
                recent.remove(at);
            }
            if recent.is_empty() {
                self.failures.remove(&attempt.client);
            }
        }
    }

    /// Clients tracked now.
    pub fn clients(&self) -> usize {
        self.failures.len()
    }

    /// Keeps at most `clients_max` clients: those with no failure in the window go first, then
    /// those whose last failure is oldest, a quarter at a time (so the sort is paid rarely).
    fn bound(&mut self, now_ms: u64) {
        if self.failures.len() <= self.clients_max {
            return;
        }
        let window_ms = self.window_ms;
        self.failures.retain(|_, recent| recent.back().is_some_and(|&at| at + window_ms > now_ms));
        if self.failures.len() <= self.clients_max {
            return;
        }
        let mut by_age: Vec<(u64, IpAddr)> = self
            .failures
            .iter()
            .map(|(client, recent)| (recent.back().copied().unwrap_or(0), *client))
            .collect();
        by_age.sort_unstable();
        let forget = self.failures.len() - self.clients_max * 3 / 4;
        for (_, client) in by_age.into_iter().take(forget) {
            self.failures.remove(&client);
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
    fn logins_are_counted_before_they_are_checked_and_refunded_on_success() {
        let mut limiter = AuthRateLimiter::new(3, 1_000);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        // Three logins in flight at once: all counted; a fourth is refused before any answered.
        let attempts: Vec<LoginAttempt> = (0..3).map(|_| limiter.begin(ip, 10).unwrap()).collect();
        assert_eq!(limiter.begin(ip, 10), Err(RateLimited));
        limiter.refund(attempts[0]);
        assert!(limiter.begin(ip, 11).is_ok(), "a success gives its place back");
        assert_eq!(limiter.begin(ip, 11), Err(RateLimited));
        assert!(limiter.begin(ip, 1_011).is_ok(), "the window slides");
        assert!(limiter.begin("10.0.0.2".parse().unwrap(), 11).is_ok(), "per client");
    }

    #[test]
    fn an_ipv6_client_is_its_64() {
        let cases = [
            ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::"),
            ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::"),
            ("::ffff:192.0.2.7", "192.0.2.7"),
            ("192.0.2.7", "192.0.2.7"),
        ];
        for (address, client) in cases {
            let expected: IpAddr = client.parse().unwrap();
            assert_eq!(rate_client(address.parse().unwrap()), expected, "{address}");
        }
        let mut limiter = AuthRateLimiter::new(1, 1_000);
        assert!(limiter.begin("2001:db8::1".parse().unwrap(), 0).is_ok());
        assert_eq!(limiter.begin("2001:db8::2".parse().unwrap(), 0), Err(RateLimited), "same /64");
        assert!(limiter.begin("2001:db8:0:1::1".parse().unwrap(), 0).is_ok(), "next /64");
    }

    /// A flood from ever new clients keeps memory bounded, and forgets the oldest first.
    #[test]
    fn the_clients_tracked_are_bounded() {
        let mut limiter = AuthRateLimiter::with_capacity(1, 1_000_000, 100);
        let first: IpAddr = "10.0.0.0".parse().unwrap();
        limiter.begin(first, 0).unwrap();
        for at in 1..10_000u32 {
            let client = IpAddr::from(std::net::Ipv4Addr::from(0x0b00_0000 + at));
            limiter.begin(client, u64::from(at)).unwrap();
            assert!(limiter.clients() <= 100, "{} clients after {at}", limiter.clients());
        }
        assert!(limiter.begin(first, 10_000).is_ok(), "the oldest client was forgotten");
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
    fn new_passwords_meet_the_minimum_length() {
        let cases = [
            ("", 12, false),
            ("abcdefghijk", 12, false),
            ("abcdefghijkl", 12, true),
            ("a longer pass phrase", 12, true),
            // Characters, not bytes: six two-byte letters are six characters.
            ("éééééé", 12, false),
            ("éééééééééééé", 12, true),
            ("", 0, true),
            ("x", 1, true),
        ];
        for (password, min_chars, accepted) in cases {
            let checked = check_password_length(password, min_chars);
            assert_eq!(checked.is_ok(), accepted, "{password:?} against {min_chars}");
            if let Err(error) = checked {
                assert_eq!(error.reason(), "invalid_password");
            }
        }
    }

    #[test]
    fn generated_passwords_pass_the_minimum() {
        for min_chars in [0, 12, 24, 25, 40, 101] {
            let password = new_password(&OsEntropy, min_chars);
            let expected = min_chars.max(GENERATED_PASSWORD_CHARS) as usize;
            assert_eq!(password.len(), expected, "minimum {min_chars}");
            assert!(check_password_length(&password, min_chars).is_ok());
            assert!(
                password.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"-_".contains(&byte))
            );
        }
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
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        for _ in 0..5 {
            let success = limiter.begin(ip, 0).unwrap();
            limiter.refund(success);
        }
        assert_eq!(limiter.clients(), 0, "successful logins are never counted");
        limiter.begin(ip, 0).unwrap();
        limiter.begin(ip, 10).unwrap();
        let cases = [(20, false), (999, false), (1000, true)];
        for (now_ms, allowed) in cases {
            assert_eq!(limiter.begin(ip, now_ms).is_ok(), allowed, "at {now_ms}");
        }
    }

    #[test]
    fn admin_credentials_are_private_exclusive_and_never_followed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = admin_credentials_path(dir.path());
        write_admin_credentials(dir.path(), "admin", "p4ss-w0rd-long").unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = write_admin_credentials(dir.path(), "admin", "another-password");
        assert_eq!(again.unwrap_err().kind(), io::ErrorKind::AlreadyExists);
        let kept = ("admin".to_string(), "p4ss-w0rd-long".to_string());
        assert_eq!(read_admin_credentials(dir.path()).unwrap(), kept, "never overwritten");

        // A link planted at the name, to a file or to nowhere, is not written through.
        for target in ["victim", "missing"] {
            let other = tempfile::tempdir().unwrap();
            std::fs::remove_file(&path).unwrap();
            if target == "victim" {
                std::fs::write(other.path().join(target), "untouched").unwrap();
            }
            std::os::unix::fs::symlink(other.path().join(target), &path).unwrap();
            assert!(write_admin_credentials(dir.path(), "admin", "x").is_err(), "{target}");
            let written = std::fs::read_to_string(other.path().join(target)).ok();
            let expected = (target == "victim").then(|| "untouched".to_string());
            assert_eq!(written, expected, "{target}");
            std::fs::remove_file(&path).unwrap();
            std::fs::write(&path, "").unwrap();
        }
    }

    #[test]
    fn admin_credentials_keep_any_password() {
        let passwords = [
            "plain",
            "quo\"te",
            "back\\slash",
            "\\\"",
            "a = b",
            " spaced ",
            "#hash",
            "new\nline",
            "é✓",
        ];
        for password in passwords {
            let dir = tempfile::tempdir().unwrap();
            write_admin_credentials(dir.path(), "admin", password).unwrap();
            let read = read_admin_credentials(dir.path()).unwrap();
            assert_eq!(read, ("admin".to_string(), password.to_string()), "{password:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn admin_credentials_round_trip(username in "\\PC*", password in "\\PC*") {
            let text = format_admin_credentials(&username, &password);
            proptest::prop_assert_eq!(parse_admin_credentials(&text), Ok((username, password)));
        }
    }
}
