//! Framing (section 1): every message is `len:u32` followed by `len` body bytes.
//!
//! The size check runs as soon as the 4 length bytes are buffered, before any of the body has
//! arrived, so an oversize frame is refused without buffering it; complete frames in front of it
//! are still handed out first. Nothing is reserved ahead for a declared length: a peer that
//! declares 16 MiB and sends nothing costs only what it actually sent.
//!
//! [`split_frame`] and [`write_frame`] are the pure functions; [`FrameCodec`] wraps them in the
//! `tokio_util` codec traits for the connection drivers.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use crate::error::{EncodeError, FrameError, FrameTooLarge};
use crate::limits::{FRAME_BYTES_MAX_DEFAULT, FRAME_LENGTH_BYTES};
use crate::primitive::widen;

/// Takes one complete frame's body off the front of `buf`. `Ok(None)` means more bytes are
/// needed (an expected condition, not an error). `Err` leaves `buf` untouched: the connection is
/// to be answered `frame_too_large` (corr 0) and closed.
pub fn split_frame(
    buf: &mut BytesMut,
    max_frame_bytes: u32,
) -> Result<Option<Bytes>, FrameTooLarge> {
    let Some(len) = declared_len(buf) else {
        return Ok(None);
    };
    if len > max_frame_bytes {
        return Err(FrameTooLarge { len, max: max_frame_bytes });
    }
    let body_bytes = widen(len);
    if buf.len() - FRAME_LENGTH_BYTES < body_bytes {
        return Ok(None);
    }
    buf.advance(FRAME_LENGTH_BYTES);
    Ok(Some(buf.split_to(body_bytes).freeze()))
}

/// The length a buffered frame declares, once its 4 length bytes are there.
pub fn declared_len(buf: &[u8]) -> Option<u32> {
    let prefix: [u8; FRAME_LENGTH_BYTES] = buf.get(..FRAME_LENGTH_BYTES)?.try_into().ok()?;
    Some(u32::from_be_bytes(prefix))
}

/// Something that can be written as a frame body: raw bytes, or a typed request or response.
pub trait FrameBody {
    fn encode_body(&self, dst: &mut BytesMut) -> Result<(), EncodeError>;
}

/// Appends one frame (length prefix and body) to `dst`. A body over `max_frame_bytes` is refused
/// (a server must never emit one, section 1.2) and `dst` is left as it was.
pub fn write_frame<B: FrameBody + ?Sized>(
    body: &B,
    max_frame_bytes: u32,
    dst: &mut BytesMut,
) -> Result<(), EncodeError> {
    let start = dst.len();
    dst.put_u32(0); // the length, patched once the body is written
    let result = body.encode_body(dst).and_then(|()| {
        let len = dst.len() - start - FRAME_LENGTH_BYTES;
        match u32::try_from(len) {
            Ok(len_u32) if len_u32 <= max_frame_bytes => Ok(len_u32),
            _ => Err(EncodeError::FrameTooLarge { len, max: max_frame_bytes }),
        }
    });
    match result {
        Ok(len) => {
            dst[start..start + FRAME_LENGTH_BYTES].copy_from_slice(&len.to_be_bytes());
            Ok(())
        }
        Err(error) => {
            dst.truncate(start);
            Err(error)
        }
    }
}

/// The `tokio_util` codec: decodes frame bodies as `Bytes`, encodes any [`FrameBody`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameCodec {
    max_frame_bytes: u32,
}

impl FrameCodec {
    /// `max_frame_bytes` bounds both directions; a body of exactly that size is accepted.
    pub fn new(max_frame_bytes: u32) -> FrameCodec {
        FrameCodec { max_frame_bytes }
    }

    pub fn max_frame_bytes(&self) -> u32 {
        self.max_frame_bytes
    }

    /// Changes the bound from the next frame on (a connection raises it after login).
    pub fn set_max_frame_bytes(&mut self, max_frame_bytes: u32) {
        self.max_frame_bytes = max_frame_bytes;
    }
}

impl Default for FrameCodec {
    fn default() -> FrameCodec {
        FrameCodec::new(FRAME_BYTES_MAX_DEFAULT)
    }
}

impl Decoder for FrameCodec {
    type Item = Bytes;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Bytes>, FrameError> {
        Ok(split_frame(src, self.max_frame_bytes)?)
    }
}

impl<B: FrameBody> Encoder<B> for FrameCodec {
    type Error = FrameError;

    fn encode(&mut self, item: B, dst: &mut BytesMut) -> Result<(), FrameError> {
        Ok(write_frame(&item, self.max_frame_bytes, dst)?)
    }
}

impl FrameBody for [u8] {
    fn encode_body(&self, dst: &mut BytesMut) -> Result<(), EncodeError> {
        dst.put_slice(self);
        Ok(())
    }
}

impl FrameBody for Bytes {
    fn encode_body(&self, dst: &mut BytesMut) -> Result<(), EncodeError> {
        self.as_ref().encode_body(dst)
    }
}

impl<T: FrameBody + ?Sized> FrameBody for &T {
    fn encode_body(&self, dst: &mut BytesMut) -> Result<(), EncodeError> {
        (**self).encode_body(dst)
    }
}

#[cfg(test)]
mod tests {
    use proptest::collection::vec;
    use proptest::prelude::*;

    use super::*;
    use crate::vectors::hex;

    enum Expect {
        Frame(&'static str),
        NeedMore,
        TooLarge(u32),
    }

    #[test]
    fn split_frame_table() {
        let cases: &[(&str, u32, Expect)] = &[
            ("", 16, Expect::NeedMore),
            ("000000", 16, Expect::NeedMore),
            ("00000000", 16, Expect::Frame("")),
            ("00000003 0102", 16, Expect::NeedMore),
            ("00000003 010203", 16, Expect::Frame("010203")),
            ("00000010", 16, Expect::NeedMore),
            ("00000011", 16, Expect::TooLarge(17)),
            ("ffffffff 00", 16, Expect::TooLarge(u32::MAX)),
            ("01000000", FRAME_BYTES_MAX_DEFAULT, Expect::NeedMore),
            ("01000001", FRAME_BYTES_MAX_DEFAULT, Expect::TooLarge(16_777_217)),
        ];
        for (input, max, expected) in cases {
            let mut buf = BytesMut::from(&hex(input)[..]);
            let got = split_frame(&mut buf, *max);
            match expected {
                Expect::Frame(body) => assert_eq!(got, Ok(Some(hex(body))), "{input}"),
                Expect::NeedMore => {
                    assert_eq!(got, Ok(None), "{input}");
                    assert_eq!(buf.freeze(), hex(input), "{input}: untouched");
                }
                Expect::TooLarge(len) => {
                    assert_eq!(got, Err(FrameTooLarge { len: *len, max: *max }), "{input}");
                    assert_eq!(buf.freeze(), hex(input), "{input}: untouched");
                }
            }
        }
    }

    #[test]
    fn frame_of_exactly_max_is_accepted_in_both_directions() {
        let max = FRAME_BYTES_MAX_DEFAULT;
        let body = vec![0xab; widen(max)];
        let mut codec = FrameCodec::default();
        let mut buf = BytesMut::new();
        codec.encode(&body[..], &mut buf).expect("len == max encodes");
        assert_eq!(&buf[..4], &[0x01, 0x00, 0x00, 0x00]);
        let decoded = codec.decode(&mut buf).expect("len == max decodes");
        assert_eq!(decoded.map(|body| body.len()), Some(widen(max)));
        assert!(buf.is_empty());

        let over = vec![0; widen(max) + 1];
        let mut dst = BytesMut::from(&b"kept"[..]);
        let error = codec.encode(&over[..], &mut dst).expect_err("len > max is refused");
        assert!(matches!(error, FrameError::Encode(EncodeError::FrameTooLarge { .. })));
        assert_eq!(&dst[..], b"kept");
    }

    #[test]
    fn frames_before_an_oversize_one_come_out_first() {
        let mut codec = FrameCodec::new(8);
        let mut buf = BytesMut::from(&hex("00000001 aa 00000002 bbcc 00000009")[..]);
        assert_eq!(codec.decode(&mut buf).ok().flatten(), Some(hex("aa")));
        assert_eq!(codec.decode(&mut buf).ok().flatten(), Some(hex("bbcc")));
        let error = codec.decode(&mut buf).expect_err("9 > 8");
        assert!(matches!(error, FrameError::TooLarge(FrameTooLarge { len: 9, max: 8 })));
    }

    #[test]
    fn body_arriving_byte_by_byte() {
        let frame = hex("00000003 010203");
        let mut codec = FrameCodec::default();
        let mut buf = BytesMut::new();
        for (index, byte) in frame.iter().enumerate() {
            buf.put_u8(*byte);
            let got = codec.decode(&mut buf).expect("never too large");
            let complete = index + 1 == frame.len();
            assert_eq!(got, complete.then(|| hex("010203")), "after {} bytes", index + 1);
        }
    }

    proptest! {
        #[test]
        fn frames_survive_any_chunking(
            bodies in vec(vec(any::<u8>(), 0..40), 0..6),
            chunk_bytes in 1_usize..17,
        ) {
            let mut codec = FrameCodec::new(64);
            let mut stream = BytesMut::new();
            for body in &bodies {
                codec.encode(&body[..], &mut stream).expect("within 64 bytes");
            }
            let mut buf = BytesMut::new();
            let mut decoded = Vec::new();
            for chunk in stream.chunks(chunk_bytes) {
                buf.extend_from_slice(chunk);
                while let Some(body) = codec.decode(&mut buf).expect("within 64 bytes") {
                    decoded.push(body.to_vec());
                }
            }
            prop_assert!(buf.is_empty());
            prop_assert_eq!(decoded, bodies);
        }

        #[test]
        fn arbitrary_streams_never_panic(stream in vec(any::<u8>(), 0..256), max in any::<u32>()) {
            let mut buf = BytesMut::from(&stream[..]);
            let mut codec = FrameCodec::new(max);
            while let Ok(Some(body)) = codec.decode(&mut buf) {
                prop_assert!(body.len() <= widen(max));
            }
        }
    }
}
