//! Token login (key 13): `TokenVerifier::verify` on arbitrary text, against a fixed RS256 public
//! key whose private half signed exactly one token (the seed `seeds/jwt/valid-rs256`, user
//! `app`, issuer and audience as configured, expiring in 2100). Asserts that nothing panics, that
//! the key is always usable (never `Misconfigured`), and that whatever verifies names `app`:
//! the fuzzer cannot sign, so any other identity would be a forgery getting through.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use malachi_broker::config::OidcConfig;
use malachi_server::jwt::{TokenRefusal, TokenVerifier};

const PUBLIC_KEY_PEM: &str = "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAoTO/oSvAASN0b042SSpC\nKQql/B8r/PMYUmbeyXz+qH0dIWQcd7/g9OXnhFh4oF7bo8KO0n484TsJ2NHJ+7SH\nPgox+NAnVvu0E+zH+qGUYtIIIdca/bAyQmcZu2xv807Omhyoa5Pxv/JoGt/ATjiM\nAGXh6t4CfIFxQDrbJJ88fJiM/bri0sKhyPLIZ1n7YRVC7RQjFOQOK6lwViZke8hF\nkdVmyJM+iOkJ7odD9diOSpfPJHEgf5S8di7HQxasL8sHEwW5i5HWmUFFpJgG1hyb\nJKnx36m+EjT6NFxZHxlUDog5yEOIYJGgm7gRprCRarZMKIYHHzmhfAXj3uxd+fNT\nfwIDAQAB\n-----END PUBLIC KEY-----\n";
/// 2026-12-01, in milliseconds: the seed token is valid then.
const NOW_MS: u64 = 1_796_083_200_000;

fn verifier() -> &'static TokenVerifier {
    static VERIFIER: OnceLock<TokenVerifier> = OnceLock::new();
    VERIFIER.get_or_init(|| {
        let path = std::env::temp_dir().join(format!("malachi-fuzz-jwt-{}.pem", std::process::id()));
        std::fs::write(&path, PUBLIC_KEY_PEM).expect("writes the key");
        TokenVerifier::new(OidcConfig {
            public_key_file: Some(path),
            issuer: "https://idp.example".into(),
            audience: "malachi".into(),
            algorithms: vec!["RS256".into(), "ES256".into(), "EdDSA".into()],
            identity_claim: "sub".into(),
            leeway_s: 60,
        })
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(token) = std::str::from_utf8(data) else { return };
    match verifier().verify(token, NOW_MS) {
        Ok(user) => assert_eq!(user, "app", "a token nobody signed verified: {token:?}"),
        Err(TokenRefusal::Misconfigured) => panic!("the key stopped loading"),
        Err(TokenRefusal::Invalid(_)) => {}
    }
});
