//! Fuzzes the frame decoder a connection runs on every byte it receives: `FrameCodec` as the
//! `tokio_util` `Decoder`, fed the stream in chunks the input chooses.
//!
//! What must hold, whatever the bytes:
//! * every body handed out is within the codec's bound;
//! * framing is canonical: the bodies re-encoded are exactly the bytes the decoder consumed;
//! * how the stream is cut into reads does not change what comes out (chunked equals whole);
//! * what is left over is one incomplete frame, or the head of one that was refused as too large
//!   and left untouched.
//!
//! Input: byte 0 picks the bound (small, so refusals happen; 255 for the default 16 MiB), byte 1
//! the read size, the rest is the stream.

#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use malachi_wire::frame::declared_len;
use malachi_wire::limits::{FRAME_BYTES_MAX_DEFAULT, FRAME_LENGTH_BYTES};
use malachi_wire::{FrameCodec, FrameError};
use tokio_util::codec::{Decoder, Encoder};

fuzz_target!(|input: &[u8]| {
    let [bound, read, stream @ ..] = input else {
        return;
    };
    let max = if *bound == u8::MAX { FRAME_BYTES_MAX_DEFAULT } else { u32::from(*bound) * 4 };
    let read_bytes = usize::from(*read % 64) + 1;

    let whole = decode_in_reads(max, stream, stream.len().max(1));
    let chunked = decode_in_reads(max, stream, read_bytes);
    assert_eq!(chunked.bodies, whole.bodies, "the reads' sizes changed the frames");
    assert_eq!(chunked.refused, whole.refused, "the reads' sizes changed the refusal");
    // After a refusal the connection reads no further, so only the refused head is compared.
    assert!(whole.left.starts_with(&chunked.left), "the reads' sizes changed what is left");
    if whole.refused.is_none() {
        assert_eq!(chunked.left, whole.left, "the reads' sizes changed what is left");
    }

    let mut codec = FrameCodec::new(max);
    let mut encoded = BytesMut::new();
    for body in &whole.bodies {
        assert!(body.len() as u64 <= u64::from(max), "a body over the bound was handed out");
        codec.encode(&body[..], &mut encoded).expect("a decoded body re-encodes");
    }
    let consumed = stream.len() - whole.left.len();
    assert_eq!(&encoded[..], &stream[..consumed], "framing is not canonical");
    assert_eq!(&whole.left[..], &stream[consumed..], "the leftover is not the stream's tail");

    match (whole.refused, declared_len(&whole.left)) {
        (Some(len), declared) => {
            assert_eq!(declared, Some(len), "a refused frame's head was consumed");
            assert!(len > max, "a frame within the bound was refused");
        }
        (None, None) => assert!(whole.left.len() < FRAME_LENGTH_BYTES),
        (None, Some(len)) => {
            assert!(len <= max, "an oversize frame was not refused");
            let body_bytes = whole.left.len() - FRAME_LENGTH_BYTES;
            assert!((body_bytes as u64) < u64::from(len), "a complete frame was left behind");
        }
    }
});

/// What one pass of the decoder over a stream produced.
struct Decoded {
    bodies: Vec<bytes::Bytes>,
    /// The declared length of the frame refused as too large, if one was.
    refused: Option<u32>,
    /// The bytes still buffered when the stream ran out or the refusal came.
    left: BytesMut,
}

/// Feeds `stream` to a fresh codec `read_bytes` at a time, as a socket would, decoding after
/// each read until the codec asks for more. Stops at the first refusal, as a connection does.
fn decode_in_reads(max: u32, stream: &[u8], read_bytes: usize) -> Decoded {
    let mut codec = FrameCodec::new(max);
    let mut buffer = BytesMut::new();
    let mut bodies = Vec::new();
    for read in stream.chunks(read_bytes) {
        buffer.extend_from_slice(read);
        loop {
            match codec.decode(&mut buffer) {
                Ok(Some(body)) => bodies.push(body),
                Ok(None) => break,
                Err(FrameError::TooLarge(too_large)) => {
                    assert_eq!(too_large.max, max);
                    return Decoded { bodies, refused: Some(too_large.len), left: buffer };
                }
                Err(other) => panic!("decoding can only refuse a size: {other}"),
            }
        }
    }
    Decoded { bodies, refused: None, left: buffer }
}
