//! Section 3.1: the first-frame keys `auth` (0), `mtls_auth` (12, empty request) and
//! `token_auth` (13). All three answer a session token.

use bytes::Bytes;

use crate::error::{DecodeError, EncodeError};
use crate::primitive::{Reader, Wire, Writer};

/// Key 0. Passwords travel in clear text (TLS protects them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuthRequest {
    pub username: Option<Bytes>,
    pub password: Option<Bytes>,
}

/// Key 13.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenAuthRequest {
    pub jwt: Option<Bytes>,
}

/// The ok answer of keys 0, 12 and 13. A server mints ASCII tokens (the Node client reads every
/// `str` as UTF-8).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenResponse {
    pub token: Option<Bytes>,
}

impl Wire for AuthRequest {
    const WIRE_BYTES_MIN: usize = 2;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.username.as_deref())?;
        writer.str(self.password.as_deref())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(AuthRequest { username: reader.str()?, password: reader.str()? })
    }
}

impl Wire for TokenAuthRequest {
    const WIRE_BYTES_MIN: usize = 1;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.jwt.as_deref())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(TokenAuthRequest { jwt: reader.str()? })
    }
}

impl Wire for TokenResponse {
    const WIRE_BYTES_MIN: usize = 1;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.token.as_deref())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(TokenResponse { token: reader.str()? })
    }
}
