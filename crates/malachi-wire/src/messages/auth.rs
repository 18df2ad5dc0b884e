//! Section 3.1: the first-frame keys `auth` (0), `mtls_auth` (12, empty request) and
//! `token_auth` (13). All three answer a session token.

use bytes::Bytes;

use crate::layout::{Str, wire_struct};

wire_struct! {
    /// Key 0. Passwords travel in clear text (TLS protects them).
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct AuthRequest {
        pub username: Option<Bytes> = Str,
        pub password: Option<Bytes> = Str,
    }
}

wire_struct! {
    /// Key 13.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct TokenAuthRequest {
        pub jwt: Option<Bytes> = Str,
    }
}

wire_struct! {
    /// The ok answer of keys 0, 12 and 13. A server mints ASCII tokens (the Node client reads every
    /// `str` as UTF-8).
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct TokenResponse {
        pub token: Option<Bytes> = Str,
    }
}
