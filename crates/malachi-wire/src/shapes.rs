//! The tagged shapes of section 2.3, shared by the policy keys (17–21) and the stream keys
//! (24–34). An unknown tag is a decode error, never a silent default.

use bytes::Bytes;

use crate::error::{DecodeError, EncodeError};
use crate::layout::{Item, Str, U16, U64, wire_struct};
use crate::primitive::{Reader, Wire, Writer};

/// A policy rule's value. The tag replaces the `str` presence flag: there is no flag byte.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyValue {
    /// Tag 0: the rule is off.
    Null,
    /// Tag 1. 0 is a real bound, not "off".
    Integer(u64),
    /// Tag 2: `len:u32` + bytes.
    String(Bytes),
}

wire_struct! {
    /// One named rule of a policy. Decoders accept unknown names: the server refuses them by name.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct PolicyField {
        pub name: Option<Bytes> = Str,
        pub value: PolicyValue = Item,
    }
}

wire_struct! {
    /// A place in a range's history: `source_index` counts the range's ancestors oldest first, then
    /// the range itself; `offset` is within that source.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub struct Position {
        pub source_index: u16 = U16,
        pub offset: u64 = U64,
    }
}

/// Where a range consumer starts (keys 29 and 31).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Start {
    /// Tag 0.
    Earliest,
    /// Tag 1.
    Latest,
    /// Tag 2.
    Position(Position),
    /// Tag 3: that group's checkpoint.
    Group(Option<Bytes>),
}

/// The codecs a consumer accepts, bit `n` for codec `n` (bit 0 none, bit 1 zstd). Bits above 1
/// are kept, not refused, so a future codec needs no new api key on this side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Accept(pub u8);

/// Which node leads a range's current segment, if the server knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteSegment {
    /// Tag 0.
    Unassigned,
    /// Tag 1.
    Assigned { segment: u32, primary: Option<Bytes> },
}

impl Accept {
    pub const NONE: Accept = Accept(1 << 0);
    pub const ZSTD: Accept = Accept(1 << 1);

    pub const fn accepts(self, codec: crate::batch::Codec) -> bool {
        self.0 & (1 << (codec as u8)) != 0
    }
}

impl Wire for PolicyValue {
    const WIRE_BYTES_MIN: usize = 1;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        match self {
            PolicyValue::Null => writer.u8(0),
            PolicyValue::Integer(value) => {
                writer.u8(1);
                writer.u64(*value);
            }
            PolicyValue::String(value) => {
                writer.u8(2);
                writer.bytes32(value)?;
            }
        }
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        match reader.u8()? {
            0 => Ok(PolicyValue::Null),
            1 => reader.u64().map(PolicyValue::Integer),
            2 => reader.bytes32().map(PolicyValue::String),
            tag => Err(DecodeError::UnknownTag { field: "policy value", tag }),
        }
    }
}

impl Wire for Start {
    const WIRE_BYTES_MIN: usize = 1;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        match self {
            Start::Earliest => writer.u8(0),
            Start::Latest => writer.u8(1),
            Start::Position(position) => {
                writer.u8(2);
                writer.item(position)?;
            }
            Start::Group(group) => {
                writer.u8(3);
                writer.str(group.as_deref())?;
            }
        }
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        match reader.u8()? {
            0 => Ok(Start::Earliest),
            1 => Ok(Start::Latest),
            2 => reader.item().map(Start::Position),
            3 => reader.str().map(Start::Group),
            tag => Err(DecodeError::UnknownTag { field: "start", tag }),
        }
    }
}

impl Wire for Accept {
    const WIRE_BYTES_MIN: usize = 1;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u8(self.0);
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        reader.u8().map(Accept)
    }
}

impl Wire for RouteSegment {
    const WIRE_BYTES_MIN: usize = 1;

    fn write(&self, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        match self {
            RouteSegment::Unassigned => writer.u8(0),
            RouteSegment::Assigned { segment, primary } => {
                writer.u8(1);
                writer.u32(*segment);
                writer.str(primary.as_deref())?;
            }
        }
        Ok(())
    }

    fn read(reader: &mut Reader) -> Result<Self, DecodeError> {
        match reader.u8()? {
            0 => Ok(RouteSegment::Unassigned),
            1 => Ok(RouteSegment::Assigned { segment: reader.u32()?, primary: reader.str()? }),
            tag => Err(DecodeError::UnknownTag { field: "route segment", tag }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Codec;
    use crate::vectors::hex;

    fn check<T: Wire + PartialEq + std::fmt::Debug>(cases: &[(&str, Result<T, DecodeError>)]) {
        for (input, expected) in cases {
            assert_eq!(&T::decode(hex(input)), expected, "{input}");
            if let Ok(value) = expected {
                assert_eq!(value.encode_to_bytes(), Ok(hex(input)), "{input}");
            }
        }
    }

    #[test]
    fn policy_values() {
        check(&[
            ("00", Ok(PolicyValue::Null)),
            ("01 0000000000000000", Ok(PolicyValue::Integer(0))),
            ("02 00000002 6161", Ok(PolicyValue::String("aa".into()))),
            ("02 00000000", Ok(PolicyValue::String(Bytes::new()))),
            ("03", Err(DecodeError::UnknownTag { field: "policy value", tag: 3 })),
            ("01 00", Err(DecodeError::Truncated { needed: 8, remaining: 1 })),
        ]);
    }

    #[test]
    fn starts() {
        let position = Position { source_index: 1, offset: 2 };
        check(&[
            ("00", Ok(Start::Earliest)),
            ("01", Ok(Start::Latest)),
            ("02 0001 0000000000000002", Ok(Start::Position(position))),
            ("03 00", Ok(Start::Group(None))),
            ("03 01 00000001 67", Ok(Start::Group(Some("g".into())))),
            ("04", Err(DecodeError::UnknownTag { field: "start", tag: 4 })),
        ]);
    }

    #[test]
    fn route_segments() {
        check(&[
            ("00", Ok(RouteSegment::Unassigned)),
            (
                "01 00000007 01 00000002 6e31",
                Ok(RouteSegment::Assigned { segment: 7, primary: Some("n1".into()) }),
            ),
            ("01 00000007 00", Ok(RouteSegment::Assigned { segment: 7, primary: None })),
            ("02", Err(DecodeError::UnknownTag { field: "route segment", tag: 2 })),
        ]);
    }

    #[test]
    fn accept_bits() {
        let cases: &[(u8, bool, bool)] =
            &[(0, false, false), (1, true, false), (2, false, true), (3, true, true)];
        for (bits, none, zstd) in cases {
            assert_eq!(Accept(*bits).accepts(Codec::None), *none);
            assert_eq!(Accept(*bits).accepts(Codec::Zstd), *zstd);
        }
    }
}
