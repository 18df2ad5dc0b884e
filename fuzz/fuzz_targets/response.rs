//! Fuzzes the client's response decoding: `ResponseEnvelope::parse`, then `decode` with what the
//! client expects on that `corr` (the answer to one api key, or a stream push); and the batch a
//! page carries (`Page::entries`), which the client reads records from.
//!
//! What must hold, whatever the bytes:
//! * the envelope is the body's first six bytes, and a body is refused only when shorter;
//! * any non-zero `error_code` is an error answer whatever was expected, and zero never is;
//! * a response that decodes re-encodes to a body that decodes to the same response, and to the
//!   very same bytes once the error code is written as Malachi writes it (1);
//! * a page's batch that decodes re-encodes to the very same bytes.
//!
//! Input: byte 0 picks the expectation (an api key by index, or a stream push), the rest is the
//! response body.

#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use malachi_wire::frame::split_frame;
use malachi_wire::limits::{ENVELOPE_BYTES, FRAME_BYTES_MAX_DEFAULT};
use malachi_wire::messages::{Page, PushKind};
use malachi_wire::response::ERROR_CODE_ERROR;
use malachi_wire::{
    ApiKey, BatchLimits, Codec, Expect, Response, ResponseBody, ResponseEnvelope, ResponseFrame,
    encode_batch,
};

fuzz_target!(|input: &[u8]| {
    let [pick, body @ ..] = input else {
        return;
    };
    let keys = ApiKey::ALL;
    let expect = match keys.get(usize::from(*pick) % (keys.len() + 1)) {
        Some(key) => Expect::Reply(*key),
        None => Expect::StreamPush,
    };
    let body = Bytes::copy_from_slice(body);
    let Ok(envelope) = ResponseEnvelope::parse(body.clone()) else {
        assert!(body.len() < ENVELOPE_BYTES, "a whole envelope was refused");
        return;
    };
    assert_eq!(envelope.corr, u32::from_be_bytes([body[0], body[1], body[2], body[3]]));
    assert_eq!(envelope.error_code, u16::from_be_bytes([body[4], body[5]]));
    assert_eq!(envelope.payload, body.slice(ENVELOPE_BYTES..));

    let is_error = envelope.is_error();
    assert_eq!(is_error, envelope.error_code != 0);
    let Ok(frame) = envelope.decode(expect) else {
        return;
    };
    assert_eq!(frame.corr, u32::from_be_bytes([body[0], body[1], body[2], body[3]]));
    assert_eq!(is_error, matches!(frame.body, ResponseBody::Error { .. }), "error code ignored");
    if let (ResponseBody::Ok(response), Expect::Reply(key)) = (&frame.body, expect) {
        assert_eq!(response.api_key(), key, "the answer is not to the key expected");
    }

    let encoded = reencode(&frame);
    let decoded = ResponseEnvelope::parse(encoded.clone()).expect("6+ bytes").decode(expect);
    assert_eq!(decoded, Ok(frame.clone()), "no round trip");
    let mut canonical = body.to_vec();
    if is_error {
        canonical[4..6].copy_from_slice(&ERROR_CODE_ERROR.to_be_bytes());
    }
    assert_eq!(&encoded[..], &canonical[..], "the response layout is not canonical");
    if let Some(page) = page_of(&frame.body) {
        check_batch(page);
    }
});

/// The frame's body as the server would send it.
fn reencode(frame: &ResponseFrame) -> Bytes {
    let mut buffer = BytesMut::new();
    frame.encode_frame(FRAME_BYTES_MAX_DEFAULT, &mut buffer).expect("a decoded response encodes");
    let body = split_frame(&mut buffer, FRAME_BYTES_MAX_DEFAULT).expect("within the bound");
    assert!(buffer.is_empty(), "one response is one frame");
    body.expect("a whole frame was written")
}

/// The page a response carries records in: a `fetch_range` answer or a `records` push.
fn page_of(body: &ResponseBody) -> Option<&Page> {
    match body {
        ResponseBody::Ok(Response::FetchRange(page)) => Some(page),
        ResponseBody::Push(push) => match &push.kind {
            PushKind::Records(page) => Some(page),
            _ => None,
        },
        _ => None,
    }
}

/// The page's batch, decoded as the client does, re-encodes to its own bytes.
fn check_batch(page: &Page) {
    let Ok(entries) = page.entries(BatchLimits::default()) else {
        return;
    };
    let mut encoded = BytesMut::new();
    encode_batch(&entries, Codec::None, &mut encoded).expect("decoded entries encode");
    assert_eq!(&encoded[..], &page.batch[..], "the batch layout is not canonical");
}
