//! Login by JWT (key 13, `MALACHI_OIDC_*`): the token's signature is checked against a public
//! key file, its `iss` and `aud` must be the configured ones, its `alg` one of the configured
//! asymmetric algorithms, and `exp` (and `nbf` if present) hold against the broker's clock with
//! a small leeway. The configured claim (`sub` by default) names a user that must exist; that
//! user's stored permissions apply.
//!
//! Time comes from the caller (the broker's clock), not from the library, so that the simulator
//! decides when a token expires. The key file is re-read when it changes, like the TLS files.

use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use malachi_broker::config::OidcConfig;
use serde_json::{Map, Value};

/// Why a token did not log in. Every `Invalid` is answered `invalid_credentials` (the wire has
/// one reason for a bad token); the cause is logged for the operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenRefusal {
    /// No usable public key: `oidc_misconfigured`.
    Misconfigured,
    Invalid(TokenProblem),
}

/// What was wrong with a token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenProblem {
    #[error("the token does not decode or names an unknown algorithm")]
    Malformed,
    #[error("the token's algorithm is not accepted")]
    AlgorithmNotAccepted,
    #[error("the public key does not fit the token's algorithm")]
    KeyMismatch,
    #[error("the signature does not verify")]
    BadSignature,
    #[error("the issuer is not the configured one")]
    WrongIssuer,
    #[error("the audience is not the configured one")]
    WrongAudience,
    #[error("a required claim (exp, iss, aud) is missing")]
    MissingClaim,
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet")]
    NotYetValid,
    #[error("the identity claim is missing or not a string")]
    NoIdentity,
}

/// Checks tokens against the configured key and claims.
#[derive(Debug)]
pub struct TokenVerifier {
    config: OidcConfig,
    key: Mutex<KeyFile>,
}

#[derive(Debug, Default)]
struct KeyFile {
    /// (device, inode, size, modification ns) when last read.
    stamp: Option<(u64, u64, u64, i64)>,
    /// The PEM bytes, if they parse as a key for one of the configured algorithms.
    pem: Option<Vec<u8>>,
}

impl TokenVerifier {
    pub fn new(config: OidcConfig) -> TokenVerifier {
        let verifier = TokenVerifier { config, key: Mutex::default() };
        if verifier.key_pem().is_none() {
            tracing::error!(
                key_file = ?verifier.config.public_key_file,
                "MALACHI_OIDC_AUTH is on but MALACHI_OIDC_PUBLIC_KEY_FILE gives no usable public \
                 key: token logins are answered oidc_misconfigured"
            );
        }
        verifier
    }

    /// The user `token` names, checked at `now_ms` (milliseconds since the Unix epoch).
    pub fn verify(&self, token: &str, now_ms: u64) -> Result<String, TokenRefusal> {
        let pem = self.key_pem().ok_or(TokenRefusal::Misconfigured)?;
        self.verify_with(&pem, token, now_ms).map_err(TokenRefusal::Invalid)
    }

    fn verify_with(&self, pem: &[u8], token: &str, now_ms: u64) -> Result<String, TokenProblem> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| TokenProblem::Malformed)?;
        let accepted = |name: &String| name.parse::<Algorithm>().ok() == Some(header.alg);
        if !self.config.algorithms.iter().any(accepted) {
            return Err(TokenProblem::AlgorithmNotAccepted);
        }
        let key = decoding_key(header.alg, pem).ok_or(TokenProblem::KeyMismatch)?;
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.config.issuer]);
        validation.set_audience(&[&self.config.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        // Times are checked below against the caller's clock.
        validation.validate_exp = false;
        validation.validate_nbf = false;
        let claims = jsonwebtoken::decode::<Map<String, Value>>(token, &key, &validation)
            .map_err(|error| problem(&error))?
            .claims;
        self.check_times(&claims, now_ms)?;
        match claims.get(&self.config.identity_claim) {
            Some(Value::String(user)) if !user.is_empty() => Ok(user.clone()),
            _ => Err(TokenProblem::NoIdentity),
        }
    }

    fn check_times(&self, claims: &Map<String, Value>, now_ms: u64) -> Result<(), TokenProblem> {
        let now_s = now_ms / 1000;
        let leeway_s = self.config.leeway_s;
        let seconds = |claim: &str| claims.get(claim).map(|value| value.as_u64());
        match seconds("exp") {
            Some(Some(exp)) if now_s <= exp.saturating_add(leeway_s) => {}
            Some(Some(_)) => return Err(TokenProblem::Expired),
            _ => return Err(TokenProblem::MissingClaim),
        }
        match seconds("nbf") {
            None => Ok(()),
            Some(Some(nbf)) if now_s.saturating_add(leeway_s) >= nbf => Ok(()),
            Some(_) => Err(TokenProblem::NotYetValid),
        }
    }

    /// The key file's bytes, re-read if the file changed since the last look.
    fn key_pem(&self) -> Option<Vec<u8>> {
        let path = self.config.public_key_file.as_ref()?;
        let stamp = std::fs::metadata(path).ok().map(|meta| {
            (meta.dev(), meta.ino(), meta.len(), meta.mtime_nsec() + meta.mtime() * 1_000_000_000)
        });
        let mut key = self.key.lock().expect("key lock poisoned");
        if stamp != key.stamp || key.stamp.is_none() {
            key.stamp = stamp;
            key.pem = std::fs::read(path).ok().filter(|pem| self.fits_an_algorithm(pem));
            match &key.pem {
                Some(_) => tracing::info!(key_file = %path.display(), "OIDC public key loaded"),
                None => tracing::warn!(key_file = %path.display(), "OIDC public key unreadable"),
            }
        }
        key.pem.clone()
    }

    fn fits_an_algorithm(&self, pem: &[u8]) -> bool {
        self.config
            .algorithms
            .iter()
            .filter_map(|name| name.parse::<Algorithm>().ok())
            .any(|algorithm| decoding_key(algorithm, pem).is_some())
    }
}

/// The key for `algorithm`'s family from a PEM public key, if it is one of that family.
fn decoding_key(algorithm: Algorithm, pem: &[u8]) -> Option<DecodingKey> {
    use Algorithm::*;
    match algorithm {
        RS256 | RS384 | RS512 | PS256 | PS384 | PS512 => DecodingKey::from_rsa_pem(pem).ok(),
        ES256 | ES384 => DecodingKey::from_ec_pem(pem).ok(),
        EdDSA => DecodingKey::from_ed_pem(pem).ok(),
        // HMAC: never, and nothing the library may add later; the configuration refuses
        // these names too.
        _ => None,
    }
}

fn problem(error: &jsonwebtoken::errors::Error) -> TokenProblem {
    use jsonwebtoken::errors::ErrorKind;
    match error.kind() {
        ErrorKind::InvalidSignature => TokenProblem::BadSignature,
        ErrorKind::InvalidIssuer => TokenProblem::WrongIssuer,
        ErrorKind::InvalidAudience => TokenProblem::WrongAudience,
        ErrorKind::MissingRequiredClaim(_) => TokenProblem::MissingClaim,
        ErrorKind::InvalidAlgorithm | ErrorKind::InvalidKeyFormat => TokenProblem::KeyMismatch,
        _ => TokenProblem::Malformed,
    }
}

#[cfg(test)]
mod tests {
    use jsonwebtoken::{EncodingKey, Header};
    use serde_json::json;

    use super::*;

    const NOW_S: u64 = 1_800_000_000;

    struct Keys {
        private_pem: String,
        public_pem: String,
    }

    fn rsa_keys() -> Keys {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).expect("RSA key");
        Keys { private_pem: pair.serialize_pem(), public_pem: pair.public_key_pem() }
    }

    fn verifier(dir: &std::path::Path, public_pem: &str) -> TokenVerifier {
        let path = dir.join("issuer.pem");
        std::fs::write(&path, public_pem).expect("writes the key");
        TokenVerifier::new(OidcConfig {
            public_key_file: Some(path),
            issuer: "https://idp.example".into(),
            audience: "malachi".into(),
            algorithms: vec!["RS256".into()],
            identity_claim: "sub".into(),
            leeway_s: 60,
        })
    }

    fn claims() -> Value {
        json!({"sub": "app", "iss": "https://idp.example", "aud": "malachi", "exp": NOW_S + 600})
    }

    fn with(change: &[(&str, Value)]) -> Value {
        let mut claims = claims();
        for (name, value) in change {
            match value {
                Value::Null => claims.as_object_mut().unwrap().remove(*name),
                value => claims.as_object_mut().unwrap().insert(name.to_string(), value.clone()),
            };
        }
        claims
    }

    fn sign(keys: &Keys, algorithm: Algorithm, claims: &Value) -> String {
        let key = EncodingKey::from_rsa_pem(keys.private_pem.as_bytes()).expect("private key");
        jsonwebtoken::encode(&Header::new(algorithm), claims, &key).expect("signs")
    }

    fn unsigned(claims: &Value) -> String {
        use base64::Engine;
        let encode = |value: &Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(value.to_string())
        };
        format!("{}.{}.", encode(&json!({"alg": "none", "typ": "JWT"})), encode(claims))
    }

    #[test]
    fn tokens_are_checked_claim_by_claim() {
        let dir = tempfile::tempdir().unwrap();
        let keys = rsa_keys();
        let other = rsa_keys();
        let verifier = verifier(dir.path(), &keys.public_pem);
        let hmac_with_public_key = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims(),
            &EncodingKey::from_secret(keys.public_pem.as_bytes()).unwrap(),
        )
        .unwrap();
        let invalid = |problem| Err(TokenRefusal::Invalid(problem));
        let cases: Vec<(&str, String, Result<String, TokenRefusal>)> = vec![
            ("valid", sign(&keys, Algorithm::RS256, &claims()), Ok("app".into())),
            (
                "expired within leeway",
                sign(&keys, Algorithm::RS256, &with(&[("exp", json!(NOW_S - 30))])),
                Ok("app".into()),
            ),
            (
                "expired",
                sign(&keys, Algorithm::RS256, &with(&[("exp", json!(NOW_S - 61))])),
                invalid(TokenProblem::Expired),
            ),
            (
                "not yet valid",
                sign(&keys, Algorithm::RS256, &with(&[("nbf", json!(NOW_S + 120))])),
                invalid(TokenProblem::NotYetValid),
            ),
            (
                "no exp",
                sign(&keys, Algorithm::RS256, &with(&[("exp", Value::Null)])),
                invalid(TokenProblem::MissingClaim),
            ),
            (
                "wrong issuer",
                sign(&keys, Algorithm::RS256, &with(&[("iss", json!("https://evil"))])),
                invalid(TokenProblem::WrongIssuer),
            ),
            (
                "wrong audience",
                sign(&keys, Algorithm::RS256, &with(&[("aud", json!("other-service"))])),
                invalid(TokenProblem::WrongAudience),
            ),
            (
                "no identity",
                sign(&keys, Algorithm::RS256, &with(&[("sub", Value::Null)])),
                invalid(TokenProblem::NoIdentity),
            ),
            (
                "signed by another key",
                sign(&other, Algorithm::RS256, &claims()),
                invalid(TokenProblem::BadSignature),
            ),
            (
                "an algorithm not allowed",
                sign(&keys, Algorithm::RS384, &claims()),
                invalid(TokenProblem::AlgorithmNotAccepted),
            ),
            ("alg none", unsigned(&claims()), invalid(TokenProblem::Malformed)),
            (
                "HMAC keyed with the public key",
                hmac_with_public_key,
                invalid(TokenProblem::AlgorithmNotAccepted),
            ),
            ("garbage", "not.a.token".into(), invalid(TokenProblem::Malformed)),
        ];
        for (name, token, expected) in cases {
            assert_eq!(verifier.verify(&token, NOW_S * 1000), expected, "{name}");
        }
        let mut tampered = sign(&keys, Algorithm::RS256, &claims());
        tampered.insert(tampered.rfind('.').unwrap() - 2, 'x');
        assert!(verifier.verify(&tampered, NOW_S * 1000).is_err(), "a changed payload is refused");
    }

    #[test]
    fn a_missing_or_foreign_key_is_misconfigured_and_a_replaced_key_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let (first, second) = (rsa_keys(), rsa_keys());
        let missing = TokenVerifier::new(OidcConfig {
            public_key_file: Some(dir.path().join("absent.pem")),
            ..verifier(dir.path(), &first.public_pem).config
        });
        let token = sign(&first, Algorithm::RS256, &claims());
        assert_eq!(missing.verify(&token, NOW_S * 1000), Err(TokenRefusal::Misconfigured));
        let not_a_key =
            verifier(dir.path(), "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n");
        assert_eq!(not_a_key.verify(&token, NOW_S * 1000), Err(TokenRefusal::Misconfigured));
        let rotating = verifier(dir.path(), &first.public_pem);
        assert_eq!(rotating.verify(&token, NOW_S * 1000), Ok("app".into()));
        // The issuer rotates its key: the file is rewritten and read again at the next login.
        let path = dir.path().join("issuer.pem");
        std::fs::write(dir.path().join("next.pem"), &second.public_pem).unwrap();
        std::fs::rename(dir.path().join("next.pem"), &path).unwrap();
        let refused = rotating.verify(&token, NOW_S * 1000);
        assert_eq!(refused, Err(TokenRefusal::Invalid(TokenProblem::BadSignature)));
        let new_token = sign(&second, Algorithm::RS256, &claims());
        assert_eq!(rotating.verify(&new_token, NOW_S * 1000), Ok("app".into()));
    }
}
