//! Malachi's binary wire protocol, shared by the broker and the client: framing, the request and
//! response envelopes, a typed request and response for every api key (0..=34, and Malachi's own
//! 64..=72 of `docs/protocol.md`), records, the
//! batch codec, and the reason strings of error answers. The contract is
//! `shared/spec/wire-protocol.md`, byte for byte; its section 6 test vectors are golden tests
//! here.
//!
//! What this crate owns: turning bytes into typed values and back, and refusing bytes that do not
//! follow the contract with a typed error that names the wire reason to answer with.
//!
//! What it must never do:
//! * I/O of its own. The only contact with a socket is through the `tokio_util` codec traits of
//!   [`FrameCodec`]; everything else is a pure function over buffers.
//! * Permission or session logic. It tells the server which key a request carries before the
//!   payload is decoded ([`RequestEnvelope`], [`ApiKey::requires_admin`]) so the server can apply
//!   the order of section 3.0, but it never decides who may do what.
//! * Panic, allocate in proportion to an untrusted count, or recurse, whatever the input. Every
//!   read checks its bytes exist first; list counts are checked against the bytes left before
//!   anything is allocated; the grammar has no recursive shape.
//!
//! Layout, from the outside in: [`frame`] (length prefix), [`request`] and [`response`]
//! (envelopes and the per-key dispatch), [`messages`] (one module per section of the spec),
//! [`shapes`] and [`record`] (values shared by several keys), [`batch`] (section 2.4),
//! [`primitive`] (section 2's encodings and the [`Wire`] trait), [`layout`] (the macros that
//! write a payload's codec, minimum size and test samples from one description), [`reason`] and
//! [`error`].

pub mod api_key;
pub mod batch;
pub mod error;
pub mod frame;
pub mod layout;
pub mod limits;
pub mod messages;
pub mod primitive;
pub mod reason;
pub mod record;
pub mod request;
pub mod response;
pub mod shapes;

#[cfg(test)]
mod arbitrary;
#[cfg(test)]
mod extension_vectors;
#[cfg(test)]
mod vectors;

pub use api_key::ApiKey;
pub use batch::{
    BatchEntry, BatchHeader, BatchLimits, Codec, PlainEntry, PositionedEntry, decode_batch,
    encode_batch,
};
pub use error::{
    BatchError, BodyTooShort, DecodeError, EncodeError, FrameError, FrameTooLarge, RequestError,
};
pub use frame::{FrameBody, FrameCodec, split_frame, write_frame};
pub use primitive::{Reader, Wire, Writer};
pub use reason::Reason;
pub use record::{Header, Record};
pub use request::{Request, RequestEnvelope, RequestFrame};
pub use response::{Expect, Response, ResponseBody, ResponseEnvelope, ResponseFrame};
pub use shapes::{Accept, PolicyField, PolicyValue, Position, RouteSegment, Start};
