//! The primitive encodings of section 2 (big-endian unsigned integers, `bool`, `str`, `list16`,
//! `list32`) and the [`Wire`] trait that every payload shape implements on top of them.
//!
//! A [`Reader`] owns a `Bytes` and hands out sub-slices of it without copying. Every read checks
//! that its bytes exist before touching them, so no input can make it panic. A list count is
//! checked against the bytes left (count × the item's smallest encoding) before anything is
//! allocated, and the up-front reservation is capped besides, so a forged count of four billion
//! fails at once instead of reserving memory.
//!
//! A [`Writer`] appends to a `BytesMut`. Lengths and counts that do not fit their field are
//! refused with an [`EncodeError`] rather than truncated; [`Wire::encode`] removes whatever a
//! failed encode had written.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::error::{DecodeError, EncodeError};
use crate::limits::{LIST16_ITEMS_MAX, PREALLOCATED_ITEMS_MAX};

/// A shape with a fixed wire layout.
pub trait Wire: Sized {
    /// The fewest bytes any encoding of this shape takes; list counts are checked against it.
    const WIRE_BYTES_MIN: usize;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError>;

    fn read(reader: &mut Reader) -> Result<Self, DecodeError>;

    /// Appends the encoding to `dst`, or leaves `dst` as it was on error.
    fn encode(&self, dst: &mut BytesMut) -> Result<(), EncodeError> {
        let start = dst.len();
        let result = self.write(&mut Writer::new(dst));
        if result.is_err() {
            dst.truncate(start);
        }
        result
    }

    fn encode_to_bytes(&self) -> Result<Bytes, EncodeError> {
        let mut dst = BytesMut::new();
        self.encode(&mut dst)?;
        Ok(dst.freeze())
    }

    /// Decodes a whole payload: the layout must consume every byte (section 1.1).
    fn decode(payload: Bytes) -> Result<Self, DecodeError> {
        let mut reader = Reader::new(payload);
        let value = Self::read(&mut reader)?;
        reader.finish()?;
        Ok(value)
    }
}

/// Reads section 2's primitives from the front of a buffer.
#[derive(Clone, Debug)]
pub struct Reader {
    rest: Bytes,
}

impl Reader {
    pub fn new(bytes: Bytes) -> Reader {
        Reader { rest: bytes }
    }

    pub fn remaining(&self) -> usize {
        self.rest.len()
    }

    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        self.need(1)?;
        Ok(self.rest.get_u8())
    }

    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        self.need(2)?;
        Ok(self.rest.get_u16())
    }

    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        self.need(4)?;
        Ok(self.rest.get_u32())
    }

    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        self.need(8)?;
        Ok(self.rest.get_u64())
    }

    pub fn bool(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(DecodeError::InvalidBool { value }),
        }
    }

    /// A `str`: `None` for flag 0 (absent), the bytes for flag 1. Absent and empty differ.
    pub fn str(&mut self) -> Result<Option<Bytes>, DecodeError> {
        match self.u8()? {
            0 => Ok(None),
            1 => self.bytes32().map(Some),
            flag => Err(DecodeError::InvalidStrFlag { flag }),
        }
    }

    /// A `str` the layout requires to be present; `field` names it in the error.
    pub fn present_str(&mut self, field: &'static str) -> Result<Bytes, DecodeError> {
        self.str()?.ok_or(DecodeError::AbsentStr { field })
    }

    /// `len:u32` then `len` bytes, without a presence flag.
    pub fn bytes32(&mut self) -> Result<Bytes, DecodeError> {
        let len = self.u32()?;
        self.take(widen(len))
    }

    pub fn item<T: Wire>(&mut self) -> Result<T, DecodeError> {
        T::read(self)
    }

    pub fn list32<T: Wire>(&mut self) -> Result<Vec<T>, DecodeError> {
        let count = self.u32()?;
        self.items(count)
    }

    pub fn list16<T: Wire>(&mut self) -> Result<Vec<T>, DecodeError> {
        let count = self.u16()?;
        self.items(u32::from(count))
    }

    /// Everything left, for a field that extends to the end of its payload.
    pub fn rest(&mut self) -> Bytes {
        std::mem::take(&mut self.rest)
    }

    /// Succeeds only if every byte was consumed.
    pub fn finish(self) -> Result<(), DecodeError> {
        match self.rest.len() {
            0 => Ok(()),
            count => Err(DecodeError::TrailingBytes { count }),
        }
    }

    pub(crate) fn items<T: Wire>(&mut self, count: u32) -> Result<Vec<T>, DecodeError> {
        let count_items = widen(count);
        let bytes_min = count_items.saturating_mul(T::WIRE_BYTES_MIN);
        if bytes_min > self.rest.len() {
            return Err(DecodeError::CountTooLarge { count, remaining: self.rest.len() });
        }
        let mut items = Vec::with_capacity(count_items.min(PREALLOCATED_ITEMS_MAX));
        for _ in 0..count {
            items.push(T::read(self)?);
        }
        Ok(items)
    }

    fn take(&mut self, len: usize) -> Result<Bytes, DecodeError> {
        self.need(len)?;
        Ok(self.rest.split_to(len))
    }

    fn need(&self, needed: usize) -> Result<(), DecodeError> {
        if self.rest.len() < needed {
            return Err(DecodeError::Truncated { needed, remaining: self.rest.len() });
        }
        Ok(())
    }
}

/// Appends section 2's primitives to a buffer.
#[derive(Debug)]
pub struct Writer<'a> {
    out: &'a mut BytesMut,
}

impl<'a> Writer<'a> {
    pub fn new(out: &'a mut BytesMut) -> Writer<'a> {
        Writer { out }
    }

    pub fn u8(&mut self, value: u8) {
        self.out.put_u8(value);
    }

    pub fn u16(&mut self, value: u16) {
        self.out.put_u16(value);
    }

    pub fn u32(&mut self, value: u32) {
        self.out.put_u32(value);
    }

    pub fn u64(&mut self, value: u64) {
        self.out.put_u64(value);
    }

    pub fn bool(&mut self, value: bool) {
        self.out.put_u8(u8::from(value));
    }

    /// A `str`: flag 0 for `None`, flag 1 and the bytes otherwise.
    pub fn str(&mut self, value: Option<&[u8]>) -> Result<(), EncodeError> {
        match value {
            None => {
                self.u8(0);
                Ok(())
            }
            Some(bytes) => self.present_str(bytes),
        }
    }

    pub fn present_str(&mut self, value: &[u8]) -> Result<(), EncodeError> {
        let len = length_u32(value.len())?;
        self.u8(1);
        self.u32(len);
        self.out.put_slice(value);
        Ok(())
    }

    /// `len:u32` then the bytes, without a presence flag.
    pub fn bytes32(&mut self, value: &[u8]) -> Result<(), EncodeError> {
        self.u32(length_u32(value.len())?);
        self.out.put_slice(value);
        Ok(())
    }

    /// Bytes as they are, for a field that extends to the end of its payload.
    pub fn raw(&mut self, value: &[u8]) {
        self.out.put_slice(value);
    }

    pub fn item<T: Wire>(&mut self, value: &T) -> Result<(), EncodeError> {
        value.write(self)
    }

    pub fn list32<T: Wire>(&mut self, items: &[T]) -> Result<(), EncodeError> {
        let max = widen(u32::MAX);
        let count = u32::try_from(items.len())
            .map_err(|_| EncodeError::ListTooLong { len: items.len(), max })?;
        self.u32(count);
        items.iter().try_for_each(|item| item.write(self))
    }

    pub fn list16<T: Wire>(&mut self, items: &[T]) -> Result<(), EncodeError> {
        let max = LIST16_ITEMS_MAX;
        let count = u16::try_from(items.len())
            .map_err(|_| EncodeError::ListTooLong { len: items.len(), max })?;
        self.u16(count);
        items.iter().try_for_each(|item| item.write(self))
    }

    /// Bytes written to the underlying buffer so far, including what preceded this writer.
    pub(crate) fn position(&self) -> usize {
        self.out.len()
    }

    /// Overwrites a u32 written earlier, for lengths known only once their content is written.
    pub(crate) fn patch_u32(&mut self, at: usize, value: u32) {
        self.out[at..at + 4].copy_from_slice(&value.to_be_bytes());
    }
}

/// A list of `str` (`list32<str>`, permission lists) is a list of optional byte strings.
impl Wire for Option<Bytes> {
    const WIRE_BYTES_MIN: usize = 1;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(self.as_deref())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        reader.str()
    }
}

/// `list16<u32>` (vnodes, assigned ranges).
impl Wire for u32 {
    const WIRE_BYTES_MIN: usize = 4;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u32(*self);
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        reader.u32()
    }
}

/// `list16<u64>` (node ids).
impl Wire for u64 {
    const WIRE_BYTES_MIN: usize = 8;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u64(*self);
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        reader.u64()
    }
}

/// A u32 from the wire as an in-memory length. Saturates on targets where `usize` is narrower,
/// which then fails the bounds check that always follows.
pub(crate) fn widen(value: u32) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

pub(crate) fn length_u32(len: usize) -> Result<u32, EncodeError> {
    u32::try_from(len).map_err(|_| EncodeError::FieldTooLong { len })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(bytes: &[u8]) -> Reader {
        Reader::new(Bytes::copy_from_slice(bytes))
    }

    /// An input and what `Reader::str` must make of it.
    type StrCase = (&'static [u8], Result<Option<&'static [u8]>, DecodeError>);

    #[test]
    fn str_flags_and_lengths() {
        let cases: &[StrCase] = &[
            (&[0], Ok(None)),
            (&[1, 0, 0, 0, 0], Ok(Some(b""))),
            (&[1, 0, 0, 0, 2, b'h', b'i'], Ok(Some(b"hi"))),
            (&[2], Err(DecodeError::InvalidStrFlag { flag: 2 })),
            (&[0xff, 0, 0, 0, 0], Err(DecodeError::InvalidStrFlag { flag: 0xff })),
            (&[], Err(DecodeError::Truncated { needed: 1, remaining: 0 })),
            (&[1, 0, 0], Err(DecodeError::Truncated { needed: 4, remaining: 2 })),
            (&[1, 0, 0, 0, 3, b'h'], Err(DecodeError::Truncated { needed: 3, remaining: 1 })),
            (
                &[1, 0xff, 0xff, 0xff, 0xff],
                Err(DecodeError::Truncated { needed: widen(u32::MAX), remaining: 0 }),
            ),
        ];
        for (input, expected) in cases {
            let got = reader(input).str();
            let expected = expected.map(|value| value.map(Bytes::copy_from_slice));
            assert_eq!(got, expected, "input {input:?}");
        }
    }

    #[test]
    fn bools() {
        let cases: &[(u8, Result<bool, DecodeError>)] = &[
            (0, Ok(false)),
            (1, Ok(true)),
            (2, Err(DecodeError::InvalidBool { value: 2 })),
            (0x80, Err(DecodeError::InvalidBool { value: 0x80 })),
        ];
        for (input, expected) in cases {
            assert_eq!(reader(&[*input]).bool(), *expected, "input {input}");
        }
    }

    #[test]
    fn huge_counts_fail_before_allocating() {
        // list32<str> of 4,294,967,295 items with 10 bytes behind it.
        let strs = reader(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).list32();
        let expected = DecodeError::CountTooLarge { count: u32::MAX, remaining: 10 };
        assert_eq!(strs.map(|_: Vec<Option<Bytes>>| ()), Err(expected));
        // list32<u32> whose 3 items would need 12 bytes, with 8 present.
        let numbers = reader(&[0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 2]).list32::<u32>();
        assert_eq!(numbers, Err(DecodeError::CountTooLarge { count: 3, remaining: 8 }));
        let list16 = reader(&[0xff, 0xff, 0, 0, 0, 7]).list16::<u32>();
        assert_eq!(list16, Err(DecodeError::CountTooLarge { count: 0xffff, remaining: 4 }));
        // Exactly enough bytes for the minimum passes the check, then decodes item by item.
        let fits = reader(&[0, 0, 0, 3, 0, 0, 0]).list32::<Option<Bytes>>();
        assert_eq!(fits, Ok(vec![None, None, None]));
    }

    #[test]
    fn trailing_bytes_are_counted() {
        let mut input = reader(&[0, 0, 0, 1, 9, 9]);
        assert_eq!(input.u32(), Ok(1));
        assert_eq!(input.finish(), Err(DecodeError::TrailingBytes { count: 2 }));
    }

    #[test]
    fn list16_refuses_more_than_65535_items() {
        let items = vec![0_u32; LIST16_ITEMS_MAX + 1];
        let mut out = BytesMut::from(&b"keep"[..]);
        struct Many(Vec<u32>);
        impl Wire for Many {
            const WIRE_BYTES_MIN: usize = 2;
            fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
                writer.u8(7);
                writer.list16(&self.0)
            }
            fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
                reader.u8()?;
                reader.list16().map(Many)
            }
        }
        let error = EncodeError::ListTooLong { len: LIST16_ITEMS_MAX + 1, max: LIST16_ITEMS_MAX };
        assert_eq!(Many(items).encode(&mut out), Err(error));
        assert_eq!(&out[..], b"keep", "a failed encode leaves the buffer as it was");
        let most = Many(vec![1; LIST16_ITEMS_MAX]).encode_to_bytes().expect("65,535 fit");
        assert_eq!(&most[..3], &[7, 0xff, 0xff]);
        assert_eq!(Many::decode(most).map(|many| many.0.len()), Ok(LIST16_ITEMS_MAX));
    }
}
