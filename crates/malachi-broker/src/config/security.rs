//! The security settings of config-reference.md's "Security" table that the client port uses:
//! TLS, login by client certificate (key 12) and by JWT (key 13), and per-user quotas. Parsed
//! and checked here so that a broker with a half-configured TLS or OIDC setup refuses to start
//! with a message naming the variable, instead of serving in clear text or accepting any token.

use std::path::PathBuf;

use super::{ConfigError, Sources};

/// Everything the client port needs to know about transport security and alternative logins.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SecurityConfig {
    /// `Some` when `MALACHI_ENABLE_TLS` is on.
    pub tls: Option<TlsConfig>,
    /// Login by client certificate (key 12).
    pub mtls: MtlsConfig,
    /// `Some` when `MALACHI_OIDC_AUTH` is on: login by JWT (key 13).
    pub oidc: Option<OidcConfig>,
    /// Records a user may publish per second (`MALACHI_PUBLISH_RATE_LIMIT`); 0 is no limit.
    pub publish_records_per_s: u32,
    /// Payload bytes a user may publish per second (`MALACHI_PUBLISH_BYTE_RATE_LIMIT`, a
    /// Malachi addition); 0 is no limit.
    pub publish_bytes_per_s: u64,
    /// Subscriptions and fetches a user may open per second (`MALACHI_SUBSCRIBE_RATE_LIMIT`);
    /// 0 is no limit.
    pub subscribe_requests_per_s: u32,
}

/// TLS on the client port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsConfig {
    /// `MALACHI_REQUIRE_TLS`: refuse plain TCP (`tls_required`). Off, one port serves both.
    pub require: bool,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// CA bundle that client certificates must chain to; required by `verify_peer`.
    pub ca_cert_file: Option<PathBuf>,
    pub verify: TlsVerify,
    /// `MALACHI_TLS_FAIL_IF_NO_PEER_CERT`: with `verify_peer`, refuse a handshake without a
    /// client certificate (otherwise such clients may still log in by password).
    pub fail_if_no_peer_cert: bool,
}

/// `MALACHI_TLS_VERIFY`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsVerify {
    /// Client certificates are not asked for (mTLS login answers `mtls_auth_unavailable`).
    None,
    /// Client certificates are asked for and checked against the CA bundle.
    Peer,
}

/// `MALACHI_MTLS_AUTH` / `MALACHI_MTLS_POLICY`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MtlsConfig {
    pub enabled: bool,
    pub policy: MtlsPolicy,
}

/// Which part of a verified client certificate names the user.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MtlsPolicy {
    /// The subject's common name (`cn`).
    #[default]
    CommonName,
    /// The first subject alternative name of this kind (`san:uri`, `san:dns`, `san:email`).
    SanUri,
    SanDns,
    SanEmail,
}

/// JWT login (`MALACHI_OIDC_*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OidcConfig {
    /// PEM public key the tokens are signed with. Unset or unreadable: logins answer
    /// `oidc_misconfigured`.
    pub public_key_file: Option<PathBuf>,
    /// Required `iss`.
    pub issuer: String,
    /// Required `aud`.
    pub audience: String,
    /// Accepted `alg`s; asymmetric only (never `none`, never an HMAC keyed by a public key).
    pub algorithms: Vec<String>,
    /// The claim naming the user (`sub`).
    pub identity_claim: String,
    /// Clock skew forgiven on `exp` and `nbf`.
    pub leeway_s: u64,
}

/// Signature algorithms a token may use: those verified with a public key. `none` and the
/// HMAC family are absent on purpose: with HMAC the "public" key file would be the secret.
pub const OIDC_ALGORITHMS: [&str; 9] =
    ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA"];

/// Default `MALACHI_OIDC_LEEWAY_S`: a minute of clock skew between the issuer and the broker.
pub const OIDC_LEEWAY_S_DEFAULT: u64 = 60;

pub(super) fn load(sources: &Sources<'_>) -> Result<SecurityConfig, ConfigError> {
    Ok(SecurityConfig {
        tls: tls(sources)?,
        mtls: MtlsConfig {
            enabled: sources.flag("MTLS_AUTH", false)?,
            policy: mtls_policy(sources)?,
        },
        oidc: oidc(sources)?,
        publish_records_per_s: sources.number("PUBLISH_RATE_LIMIT", 0)?,
        publish_bytes_per_s: sources.number("PUBLISH_BYTE_RATE_LIMIT", 0)?,
        subscribe_requests_per_s: sources.number("SUBSCRIBE_RATE_LIMIT", 0)?,
    })
}

fn tls(sources: &Sources<'_>) -> Result<Option<TlsConfig>, ConfigError> {
    let require = sources.flag("REQUIRE_TLS", false)?;
    if !sources.flag("ENABLE_TLS", false)? {
        if require {
            return Err(missing("MALACHI_REQUIRE_TLS", "needs MALACHI_ENABLE_TLS=true"));
        }
        return Ok(None);
    }
    let cert_file = sources.text("TLS_CERTFILE").ok_or_else(|| {
        missing("MALACHI_TLS_CERTFILE", "must name a PEM certificate chain when TLS is enabled")
    })?;
    let key_file = sources.text("TLS_KEYFILE").ok_or_else(|| {
        missing("MALACHI_TLS_KEYFILE", "must name a PEM private key when TLS is enabled")
    })?;
    let ca_cert_file = sources.text("TLS_CACERTFILE").map(PathBuf::from);
    let verify = match sources.raw("TLS_VERIFY") {
        None => TlsVerify::None,
        Some((variable, value)) => match value.trim() {
            "verify_none" | "" => TlsVerify::None,
            "verify_peer" => TlsVerify::Peer,
            _ => {
                return Err(ConfigError::Invalid {
                    name: variable,
                    value,
                    expected: "verify_none or verify_peer",
                });
            }
        },
    };
    if verify == TlsVerify::Peer && ca_cert_file.is_none() {
        return Err(missing(
            "MALACHI_TLS_CACERTFILE",
            "must name the CA bundle client certificates chain to when MALACHI_TLS_VERIFY=verify_peer",
        ));
    }
    Ok(Some(TlsConfig {
        require,
        cert_file: cert_file.into(),
        key_file: key_file.into(),
        ca_cert_file,
        verify,
        fail_if_no_peer_cert: sources.flag("TLS_FAIL_IF_NO_PEER_CERT", false)?,
    }))
}

fn mtls_policy(sources: &Sources<'_>) -> Result<MtlsPolicy, ConfigError> {
    let Some((variable, value)) = sources.raw("MTLS_POLICY") else {
        return Ok(MtlsPolicy::default());
    };
    match value.trim() {
        "cn" => Ok(MtlsPolicy::CommonName),
        "san:uri" => Ok(MtlsPolicy::SanUri),
        "san:dns" => Ok(MtlsPolicy::SanDns),
        "san:email" => Ok(MtlsPolicy::SanEmail),
        _ => Err(ConfigError::Invalid {
            name: variable,
            value,
            expected: "cn, san:uri, san:dns or san:email",
        }),
    }
}

fn oidc(sources: &Sources<'_>) -> Result<Option<OidcConfig>, ConfigError> {
    if !sources.flag("OIDC_AUTH", false)? {
        return Ok(None);
    }
    // A token minted for another service by the same issuer must not log in here, so both
    // are required rather than skipped when unset.
    let issuer = sources.text("OIDC_ISSUER").ok_or_else(|| {
        missing("MALACHI_OIDC_ISSUER", "must be set when MALACHI_OIDC_AUTH is on")
    })?;
    let audience = sources.text("OIDC_AUDIENCE").ok_or_else(|| {
        missing("MALACHI_OIDC_AUDIENCE", "must be set when MALACHI_OIDC_AUTH is on")
    })?;
    let algorithms = oidc_algorithms(sources)?;
    Ok(Some(OidcConfig {
        public_key_file: sources.text("OIDC_PUBLIC_KEY_FILE").map(PathBuf::from),
        issuer,
        audience,
        algorithms,
        identity_claim: sources.text("OIDC_IDENTITY_CLAIM").unwrap_or_else(|| "sub".into()),
        leeway_s: sources.number("OIDC_LEEWAY_S", OIDC_LEEWAY_S_DEFAULT)?,
    }))
}

fn oidc_algorithms(sources: &Sources<'_>) -> Result<Vec<String>, ConfigError> {
    let Some((variable, value)) = sources.raw("OIDC_ALGORITHM") else {
        return Ok(vec!["RS256".into()]);
    };
    let mut algorithms = Vec::new();
    for name in value.split(',').map(str::trim).filter(|name| !name.is_empty()) {
        if !OIDC_ALGORITHMS.contains(&name) {
            return Err(ConfigError::OutOfRange {
                name: variable,
                problem: format!(
                    "{name:?} is not accepted: one or more of {} (none and HMAC never)",
                    OIDC_ALGORITHMS.join(", ")
                ),
            });
        }
        if !algorithms.iter().any(|known| known == name) {
            algorithms.push(name.to_string());
        }
    }
    if algorithms.is_empty() {
        return Err(missing("MALACHI_OIDC_ALGORITHM", "names no algorithm"));
    }
    Ok(algorithms)
}

fn missing(name: &str, problem: &str) -> ConfigError {
    ConfigError::OutOfRange { name: name.into(), problem: problem.into() }
}

#[cfg(test)]
mod tests {
    use super::super::tests::load;
    use super::*;

    #[test]
    fn security_is_off_by_default() {
        let config = load(&[], &[], &[]).unwrap();
        assert_eq!(config.security, SecurityConfig::default());
    }

    #[test]
    fn tls_and_oidc_settings_parse() {
        let config = load(
            &[],
            &[
                ("MALACHI_ENABLE_TLS", "true"),
                ("MALACHI_REQUIRE_TLS", "true"),
                ("MALACHI_TLS_CERTFILE", "/c.pem"),
                ("MALACHI_TLS_KEYFILE", "/k.pem"),
                ("MALACHI_TLS_CACERTFILE", "/ca.pem"),
                ("MALACHI_TLS_VERIFY", "verify_peer"),
                ("MALACHI_MTLS_AUTH", "true"),
                ("MALACHI_MTLS_POLICY", "san:email"),
                ("MALACHI_OIDC_AUTH", "true"),
                ("MALACHI_OIDC_ISSUER", "https://idp"),
                ("MALACHI_OIDC_AUDIENCE", "malachi"),
                ("MALACHI_OIDC_ALGORITHM", "RS256, ES256,RS256"),
            ],
            &[],
        )
        .unwrap();
        let tls = config.security.tls.expect("tls on");
        assert!(tls.require && tls.verify == TlsVerify::Peer && !tls.fail_if_no_peer_cert);
        assert_eq!(tls.ca_cert_file, Some(PathBuf::from("/ca.pem")));
        assert_eq!(
            config.security.mtls,
            MtlsConfig { enabled: true, policy: MtlsPolicy::SanEmail }
        );
        let oidc = config.security.oidc.expect("oidc on");
        assert_eq!(oidc.algorithms, ["RS256", "ES256"]);
        assert_eq!((oidc.identity_claim.as_str(), oidc.leeway_s), ("sub", 60));
    }

    #[test]
    fn half_configured_security_refuses_to_start() {
        let tls = [("MALACHI_ENABLE_TLS", "true"), ("MALACHI_TLS_CERTFILE", "/c.pem")];
        let oidc = [
            ("MALACHI_OIDC_AUTH", "true"),
            ("MALACHI_OIDC_ISSUER", "i"),
            ("MALACHI_OIDC_AUDIENCE", "a"),
        ];
        let cases: [(Vec<(&str, &str)>, &str); 7] = [
            (vec![("MALACHI_REQUIRE_TLS", "true")], "MALACHI_REQUIRE_TLS: needs"),
            (vec![("MALACHI_ENABLE_TLS", "true")], "MALACHI_TLS_CERTFILE: must name"),
            (tls.to_vec(), "MALACHI_TLS_KEYFILE: must name"),
            (
                [&tls[..], &[("MALACHI_TLS_KEYFILE", "/k"), ("MALACHI_TLS_VERIFY", "verify_peer")]]
                    .concat(),
                "MALACHI_TLS_CACERTFILE: must name",
            ),
            (vec![("MALACHI_OIDC_AUTH", "true")], "MALACHI_OIDC_ISSUER: must be set"),
            (
                [&oidc[..], &[("MALACHI_OIDC_ALGORITHM", "none")]].concat(),
                "MALACHI_OIDC_ALGORITHM: \"none\" is not accepted",
            ),
            (
                [&oidc[..], &[("MALACHI_OIDC_ALGORITHM", "HS256")]].concat(),
                "MALACHI_OIDC_ALGORITHM: \"HS256\" is not accepted",
            ),
        ];
        for (env, expected) in cases {
            let message = load(&[], &env, &[]).unwrap_err().to_string();
            assert!(message.starts_with(expected), "{env:?}: {message}");
        }
    }
}
