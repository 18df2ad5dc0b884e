//! Fuzzes the server's request decoding in the order a connection runs it: the envelope
//! (`RequestEnvelope::parse`), the key (`envelope.key()`), then the payload (`envelope.decode()`);
//! and, for an `append`, the batch it carries (`AppendRequest::entries`).
//!
//! What must hold, whatever the bytes:
//! * the envelope is the body's first six bytes and the payload the rest, and a body is refused
//!   only when it is shorter than that;
//! * a key is known exactly when `ApiKey::from_u16` knows it, and every error answers on the
//!   request's own `corr` (0 only for a body too short to name it);
//! * a request that decodes re-encodes to a body that decodes to the same request, and to the
//!   very same bytes: the layout is canonical, except the two keys whose payload is ignored;
//! * a batch that decodes re-encodes to the very same bytes (codec 0 is canonical).

#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use malachi_wire::frame::split_frame;
use malachi_wire::limits::{ENVELOPE_BYTES, FRAME_BYTES_MAX_DEFAULT};
use malachi_wire::{
    ApiKey, BatchLimits, BodyTooShort, Codec, Request, RequestEnvelope, RequestError, RequestFrame,
    encode_batch,
};

fuzz_target!(|body: &[u8]| {
    let body = Bytes::copy_from_slice(body);
    let envelope = match RequestEnvelope::parse(body.clone()) {
        Ok(envelope) => envelope,
        Err(BodyTooShort { len }) => {
            assert!(len == body.len() && len < ENVELOPE_BYTES, "a whole envelope was refused");
            let error = RequestFrame::decode(body).expect_err("parse refused it");
            assert_eq!(error.corr(), 0, "an unnamed request is answered on corr 0");
            return;
        }
    };
    assert_eq!(envelope.api_key, u16::from_be_bytes([body[0], body[1]]));
    assert_eq!(envelope.corr, u32::from_be_bytes([body[2], body[3], body[4], body[5]]));
    assert_eq!(envelope.payload, body.slice(ENVELOPE_BYTES..));

    let key = match envelope.key() {
        Ok(key) => key,
        Err(error) => {
            assert_eq!(ApiKey::from_u16(envelope.api_key), None, "a known key was refused");
            let expected =
                RequestError::UnknownApiKey { api_key: envelope.api_key, corr: envelope.corr };
            assert_eq!(error, expected);
            return;
        }
    };
    assert_eq!(key.as_u16(), envelope.api_key, "the key is not the one sent");

    let corr = envelope.corr;
    let frame = match envelope.clone().decode() {
        Ok(frame) => frame,
        Err(error) => {
            assert!(matches!(error, RequestError::Malformed { .. }), "{error}");
            assert_eq!(error.corr(), corr, "an error answers on another corr");
            return;
        }
    };
    assert_eq!(frame.corr, corr);
    assert_eq!(frame.request.api_key(), key, "the request is not of the key sent");
    assert_eq!(Request::decode_payload(key, envelope.payload), Ok(frame.request.clone()));

    let encoded = reencode(&frame);
    assert_eq!(RequestFrame::decode(encoded.clone()), Ok(frame.clone()), "no round trip");
    if !matches!(key, ApiKey::ListUsers | ApiKey::ListUsersWithRoles) {
        assert_eq!(encoded, body, "the request layout is not canonical");
    }
    if let Request::Append(append) = &frame.request {
        check_batch(append);
    }
});

/// The frame's body as this side would send it.
fn reencode(frame: &RequestFrame) -> Bytes {
    let mut buffer = BytesMut::new();
    frame.encode_frame(FRAME_BYTES_MAX_DEFAULT, &mut buffer).expect("a decoded request encodes");
    let body = split_frame(&mut buffer, FRAME_BYTES_MAX_DEFAULT).expect("within the bound");
    assert!(buffer.is_empty(), "one request is one frame");
    body.expect("a whole frame was written")
}

/// The append's batch, decoded as the server does, re-encodes to its own bytes.
fn check_batch(append: &malachi_wire::messages::AppendRequest) {
    let Ok(entries) = append.entries(BatchLimits::default()) else {
        return;
    };
    let mut encoded = BytesMut::new();
    encode_batch(&entries, Codec::None, &mut encoded).expect("decoded entries encode");
    assert_eq!(&encoded[..], &append.batch[..], "the batch layout is not canonical");
}
