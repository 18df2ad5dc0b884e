//! Typed errors of the codec, each naming the wire reason (section 4) a server answers with.
//!
//! The split follows who can act on them: [`DecodeError`] is a peer's bad payload
//! (`malformed_request`, the connection goes on); [`FrameTooLarge`] ends the connection;
//! [`BodyTooShort`] and [`RequestError`] carry the `corr` to answer on; [`BatchError`] travels
//! inside an `append_ack`; [`EncodeError`] is our own bug or an over-limit value we were asked to
//! send, never the peer's fault.

use std::io;

use crate::api_key::ApiKey;
use crate::batch::Codec;
use crate::reason::Reason;

/// A payload that does not follow its layout. Always answered `malformed_request`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("a {needed}-byte field starts with only {remaining} bytes left")]
    Truncated { needed: usize, remaining: usize },
    #[error("{count} bytes follow the end of the layout")]
    TrailingBytes { count: usize },
    #[error("str flag {flag} is neither 0 (absent) nor 1 (present)")]
    InvalidStrFlag { flag: u8 },
    #[error("bool byte {value} is neither 0 nor 1")]
    InvalidBool { value: u8 },
    #[error("{field} tag {tag} is unknown")]
    UnknownTag { field: &'static str, tag: u8 },
    #[error("a list of {count} items cannot fit in the {remaining} bytes left")]
    CountTooLarge { count: u32, remaining: usize },
    #[error("{field} must be a present str")]
    AbsentStr { field: &'static str },
    #[error("{field} must not be 0")]
    Zero { field: &'static str },
    #[error("batch entry flags {flags:#04x} set a bit other than bit 0 (tombstone)")]
    InvalidEntryFlags { flags: u8 },
    #[error("api key {api_key} is never answered with an ok reply")]
    NoReply { api_key: ApiKey },
}

impl DecodeError {
    pub fn reason(&self) -> Reason {
        Reason::MalformedRequest
    }
}

/// A frame whose declared length exceeds the limit, detected from its 4 length bytes alone.
/// The server answers `frame_too_large` with `corr = 0` and closes the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("frame declares {len} bytes, the limit is {max}")]
pub struct FrameTooLarge {
    pub len: u32,
    pub max: u32,
}

impl FrameTooLarge {
    pub fn reason(&self) -> Reason {
        Reason::FrameTooLarge
    }
}

/// A body too short to hold its envelope (6 bytes). The request cannot be named, so the server
/// answers `malformed_request` with `corr = 0` (`auth_required` in the auth phase).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a {len}-byte body cannot hold the 6-byte envelope")]
pub struct BodyTooShort {
    pub len: usize,
}

/// Why a request body could not become a [`crate::Request`], with the `corr` to answer on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error(transparent)]
    BodyTooShort(#[from] BodyTooShort),
    #[error("api key {api_key} is unknown (corr {corr})")]
    UnknownApiKey { api_key: u16, corr: u32 },
    #[error("{api_key} payload is malformed (corr {corr}): {error}")]
    Malformed { api_key: ApiKey, corr: u32, error: DecodeError },
}

impl RequestError {
    /// The `corr` of the error answer: 0 when the envelope itself is unreadable. (In SUBSCRIBED
    /// mode the server answers an undecodable `stream_ack` on `corr` 0 instead, section 3.3.)
    pub fn corr(&self) -> u32 {
        match self {
            RequestError::BodyTooShort(_) => 0,
            RequestError::UnknownApiKey { corr, .. } | RequestError::Malformed { corr, .. } => {
                *corr
            }
        }
    }

    /// The reason of the error answer in the REQUEST phase (the auth phase answers every one of
    /// these `auth_required`, section 5).
    pub fn reason(&self) -> Reason {
        match self {
            RequestError::BodyTooShort(_) | RequestError::Malformed { .. } => {
                Reason::MalformedRequest
            }
            RequestError::UnknownApiKey { .. } => Reason::UnknownApiKey,
        }
    }
}

/// A batch refused by the checks of section 2.4, in the order they run. A server reports it
/// per append inside `append_ack.errors`; it is not a `malformed_request`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("malformed batch: {0}")]
    Malformed(DecodeError),
    #[error("unknown batch codec {codec}")]
    UnknownCodec { codec: u8 },
    #[error("batch inflates to {inflated_size} bytes, the limit is {max}")]
    TooLarge { inflated_size: u32, max: u32 },
    #[error("batch payload is {size} bytes but declares {inflated_size} inflated bytes")]
    SizeMismatch { size: u32, inflated_size: u32 },
    #[error("{bytes_left} bytes are left after the batch's {count} entries")]
    CountMismatch { count: u32, bytes_left: usize },
    #[error("batch codec {codec:?} is known but not implemented by this build")]
    CodecNotImplemented { codec: Codec },
}

impl BatchError {
    pub fn reason(&self) -> Reason {
        match self {
            BatchError::Malformed(_) => Reason::MalformedBatch,
            BatchError::UnknownCodec { .. } => Reason::UnknownCodec,
            BatchError::TooLarge { .. } => Reason::BatchTooLarge,
            BatchError::SizeMismatch { .. } => Reason::BatchSizeMismatch,
            BatchError::CountMismatch { .. } => Reason::BatchCountMismatch,
            BatchError::CodecNotImplemented { .. } => Reason::UnsupportedCodec,
        }
    }

    /// The exact reason text for `append_ack.errors`. Malachi renders the unknown codec as the
    /// Erlang term `{:unknown_codec, n}` (section 2.4); every other reason is its bare name.
    pub fn wire_text(&self) -> String {
        match self {
            BatchError::UnknownCodec { codec } => format!("{{:unknown_codec, {codec}}}"),
            other => other.reason().as_str().to_owned(),
        }
    }
}

/// A value this side was asked to send that the wire cannot carry. Nothing is left in the
/// output buffer when an encode fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    #[error("a {len}-byte str or byte field exceeds the u32 length prefix")]
    FieldTooLong { len: usize },
    #[error("a list of {len} items exceeds its count's maximum {max}")]
    ListTooLong { len: usize, max: usize },
    #[error("a frame body of {len} bytes exceeds the limit {max}")]
    FrameTooLarge { len: usize, max: u32 },
    #[error("batch codec {codec:?} is known but not implemented by this build")]
    CodecNotImplemented { codec: Codec },
}

/// The error of [`crate::FrameCodec`]'s `tokio_util` traits: the codec's own refusals plus the
/// transport's I/O errors, which the traits require.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error(transparent)]
    TooLarge(#[from] FrameTooLarge),
    #[error(transparent)]
    Encode(#[from] EncodeError),
    #[error(transparent)]
    Io(#[from] io::Error),
}
