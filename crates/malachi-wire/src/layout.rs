//! One description per payload layout. [`wire_struct!`] takes a struct whose fields each name
//! their encoding (`pub topic: Option<Bytes> = Str`) and writes the struct, its [`Wire`] codec
//! (fields in declaration order) and its `WIRE_BYTES_MIN` (the sum of its fields' minimums), and
//! under test the [`Sample`] values its property tests use: the smallest value and a proptest
//! strategy. [`wire_enum!`] does the same for a one-byte tag. A layout is written once, so the
//! writer, the reader, the minimum and the generators cannot disagree.
//!
//! Shapes that are not a sequence of fields (tagged unions whose tag selects what follows, such
//! as [`crate::shapes::PolicyValue`] or [`crate::messages::StreamPush`]) implement [`Wire`] by
//! hand; as fields they use [`Item`].

use std::num::NonZeroU32;

use bytes::Bytes;

use crate::error::{DecodeError, EncodeError};
use crate::primitive::{Reader, Wire, Writer};

/// How one field of type `T` is laid out (section 2's primitives).
pub trait Field<T> {
    /// The fewest bytes any value of the field encodes to.
    const BYTES_MIN: usize;

    fn write(value: &T, writer: &mut Writer<'_>) -> Result<(), EncodeError>;

    /// `field` names the field in errors that need it (an absent required `str`, a zero
    /// window).
    fn read(reader: &mut Reader, field: &'static str) -> Result<T, DecodeError>;
}

/// `u8`.
pub struct U8;
/// `u16`.
pub struct U16;
/// `u32`.
pub struct U32;
/// `u64`.
pub struct U64;
/// `bool` (one byte, 0 or 1).
pub struct Bool;
/// `str` that may be absent: `Option<Bytes>`.
pub struct Str;
/// `str` the layout requires present: `Bytes`, an absent one is a decode error naming the field.
pub struct PresentStr;
/// `len:u32` then the bytes, without a presence flag.
pub struct Bytes32;
/// Everything to the end of the payload (an encoded batch); only as a payload's last field.
pub struct Rest;
/// A `u32` that must not be 0 (stream windows): 0 is a decode error naming the field.
pub struct NonZero32;
/// A nested shape with its own [`Wire`] layout.
pub struct Item;
/// `list16<T>`.
pub struct List16;
/// `list32<T>`.
pub struct List32;
/// `bool` then, when true, the value in encoding `E`: an optional part of a payload.
pub struct Flagged<E>(std::marker::PhantomData<E>);

macro_rules! integer_field {
    ($encoding:ty, $ty:ty, $method:ident) => {
        impl Field<$ty> for $encoding {
            const BYTES_MIN: usize = std::mem::size_of::<$ty>();

            fn write(value: &$ty, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
                writer.$method(*value);
                Ok(())
            }

            fn read(reader: &mut Reader, _field: &'static str) -> Result<$ty, DecodeError> {
                reader.$method()
            }
        }
    };
}

integer_field!(U8, u8, u8);
integer_field!(U16, u16, u16);
integer_field!(U32, u32, u32);
integer_field!(U64, u64, u64);
integer_field!(Bool, bool, bool);

impl Field<Option<Bytes>> for Str {
    const BYTES_MIN: usize = 1;

    fn write(value: &Option<Bytes>, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.str(value.as_deref())
    }

    fn read(reader: &mut Reader, _field: &'static str) -> Result<Option<Bytes>, DecodeError> {
        reader.str()
    }
}

impl Field<Bytes> for PresentStr {
    const BYTES_MIN: usize = 1 + 4;

    fn write(value: &Bytes, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.present_str(value)
    }

    fn read(reader: &mut Reader, field: &'static str) -> Result<Bytes, DecodeError> {
        reader.present_str(field)
    }
}

impl Field<Bytes> for Bytes32 {
    const BYTES_MIN: usize = 4;

    fn write(value: &Bytes, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.bytes32(value)
    }

    fn read(reader: &mut Reader, _field: &'static str) -> Result<Bytes, DecodeError> {
        reader.bytes32()
    }
}

impl Field<Bytes> for Rest {
    const BYTES_MIN: usize = 0;

    fn write(value: &Bytes, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.raw(value);
        Ok(())
    }

    fn read(reader: &mut Reader, _field: &'static str) -> Result<Bytes, DecodeError> {
        Ok(reader.rest())
    }
}

impl Field<NonZeroU32> for NonZero32 {
    const BYTES_MIN: usize = 4;

    fn write(value: &NonZeroU32, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.u32(value.get());
        Ok(())
    }

    fn read(reader: &mut Reader, field: &'static str) -> Result<NonZeroU32, DecodeError> {
        NonZeroU32::new(reader.u32()?).ok_or(DecodeError::Zero { field })
    }
}

impl<T: Wire> Field<T> for Item {
    const BYTES_MIN: usize = T::WIRE_BYTES_MIN;

    fn write(value: &T, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.item(value)
    }

    fn read(reader: &mut Reader, _field: &'static str) -> Result<T, DecodeError> {
        reader.item()
    }
}

impl<T: Wire> Field<Vec<T>> for List16 {
    const BYTES_MIN: usize = 2;

    fn write(value: &Vec<T>, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.list16(value)
    }

    fn read(reader: &mut Reader, _field: &'static str) -> Result<Vec<T>, DecodeError> {
        reader.list16()
    }
}

impl<T: Wire> Field<Vec<T>> for List32 {
    const BYTES_MIN: usize = 4;

    fn write(value: &Vec<T>, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.list32(value)
    }

    fn read(reader: &mut Reader, _field: &'static str) -> Result<Vec<T>, DecodeError> {
        reader.list32()
    }
}

impl<T, E: Field<T>> Field<Option<T>> for Flagged<E> {
    const BYTES_MIN: usize = 1;

    fn write(value: &Option<T>, writer: &mut Writer<'_>) -> Result<(), EncodeError> {
        writer.bool(value.is_some());
        match value {
            Some(value) => E::write(value, writer),
            None => Ok(()),
        }
    }

    fn read(reader: &mut Reader, field: &'static str) -> Result<Option<T>, DecodeError> {
        match reader.bool()? {
            true => E::read(reader, field).map(Some),
            false => Ok(None),
        }
    }
}

/// A struct whose fields are laid out one after another, each in the encoding it names.
/// A field's decode errors name it as written, or as the `as "..."` after its encoding says.
///
/// ```text
/// wire_struct! {
///     /// Key 1.
///     #[derive(Clone, Debug, Default, PartialEq, Eq)]
///     pub struct CreateTopicRequest {
///         pub topic: Option<Bytes> = Str,
///         pub keyspace_bits: u8 = U8,
///     }
/// }
/// ```
macro_rules! wire_struct {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $(
                $(#[$field_meta:meta])*
                $field_vis:vis $field:ident : $ty:ty = $encoding:ty $(as $wire_name:literal)?
            ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $( $(#[$field_meta])* $field_vis $field: $ty, )*
        }

        impl $crate::primitive::Wire for $name {
            const WIRE_BYTES_MIN: usize =
                0 $( + <$encoding as $crate::layout::Field<$ty>>::BYTES_MIN )*;

            fn write(
                &self,
                writer: &mut $crate::primitive::Writer<'_>,
            ) -> Result<(), $crate::error::EncodeError> {
                $( <$encoding as $crate::layout::Field<$ty>>::write(&self.$field, writer)?; )*
                let _ = writer;
                Ok(())
            }

            fn read(
                reader: &mut $crate::primitive::Reader,
            ) -> Result<Self, $crate::error::DecodeError> {
                let _ = &reader;
                Ok($name {
                    $( $field: <$encoding as $crate::layout::Field<$ty>>::read(
                        reader,
                        $crate::layout::field_name!($field $(, $wire_name)?),
                    )?, )*
                })
            }
        }

        #[cfg(test)]
        impl $crate::layout::Sample for $name {
            fn minimal() -> Self {
                $name {
                    $( $field: <$encoding as $crate::layout::SampleField<$ty>>::minimal(), )*
                }
            }

            fn arbitrary() -> proptest::strategy::BoxedStrategy<Self> {
                use proptest::strategy::Strategy;
                let strategy = proptest::strategy::Just(Self::minimal()).boxed();
                $(
                    let strategy =
                        (strategy, <$encoding as $crate::layout::SampleField<$ty>>::arbitrary())
                            .prop_map(|(mut value, field)| {
                                value.$field = field;
                                value
                            })
                            .boxed();
                )*
                strategy
            }
        }
    };
}

/// A one-byte tag: `wire_enum! { pub enum RangeState as "range state" { Active = 0, ... } }`.
/// An unknown tag is a decode error naming the field.
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident as $what:literal {
            $( $(#[$variant_meta:meta])* $variant:ident = $tag:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        $vis enum $name {
            $( $(#[$variant_meta])* $variant = $tag, )+
        }

        impl $name {
            /// Every value, in tag order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn from_tag(tag: u8) -> Option<$name> {
                match tag {
                    $( $tag => Some($name::$variant), )+
                    _ => None,
                }
            }
        }

        impl $crate::primitive::Wire for $name {
            const WIRE_BYTES_MIN: usize = 1;

            fn write(
                &self,
                writer: &mut $crate::primitive::Writer<'_>,
            ) -> Result<(), $crate::error::EncodeError> {
                writer.u8(*self as u8);
                Ok(())
            }

            fn read(
                reader: &mut $crate::primitive::Reader,
            ) -> Result<Self, $crate::error::DecodeError> {
                let tag = reader.u8()?;
                $name::from_tag(tag)
                    .ok_or($crate::error::DecodeError::UnknownTag { field: $what, tag })
            }
        }

        #[cfg(test)]
        impl $crate::layout::Sample for $name {
            fn minimal() -> Self {
                $name::ALL[0]
            }

            fn arbitrary() -> proptest::strategy::BoxedStrategy<Self> {
                use proptest::strategy::Strategy;
                proptest::sample::select($name::ALL).boxed()
            }
        }
    };
}

/// The name a field's decode errors give: its Rust name, or the one its description gives after
/// `as` (`pub name: Bytes = PresentStr as "header name"`).
macro_rules! field_name {
    ($field:ident) => {
        stringify!($field)
    };
    ($field:ident, $wire_name:literal) => {
        $wire_name
    };
}

pub(crate) use {field_name, wire_enum, wire_struct};

/// The values a shape's property tests draw: its smallest encoding and arbitrary ones.
#[cfg(test)]
pub(crate) trait Sample: Sized + Clone + std::fmt::Debug + 'static {
    /// The value that encodes to exactly `WIRE_BYTES_MIN` bytes.
    fn minimal() -> Self;

    fn arbitrary() -> proptest::strategy::BoxedStrategy<Self>;
}

/// [`Sample`] for a field in one encoding.
#[cfg(test)]
pub(crate) trait SampleField<T> {
    fn minimal() -> T;

    fn arbitrary() -> proptest::strategy::BoxedStrategy<T>;
}

/// The properties every shape keeps, checked for each shape listed in the messages' tests:
/// its smallest value encodes to exactly `WIRE_BYTES_MIN` bytes (what list counts are checked
/// against: too large and a valid list is refused, too small and a forged count gets through)
/// and decodes back, and arbitrary values round-trip.
#[cfg(test)]
pub(crate) fn check_shape<T: Wire + Sample + PartialEq>(name: &str) {
    use proptest::test_runner::TestRunner;

    let minimal = T::minimal();
    let encoded = minimal.encode_to_bytes().expect("minimal values encode");
    assert_eq!(encoded.len(), T::WIRE_BYTES_MIN, "{name}: the smallest encoding");
    assert_eq!(T::decode(encoded).as_ref(), Ok(&minimal), "{name}: the smallest value");
    let result = TestRunner::default().run(&T::arbitrary(), |value| {
        let encoded = value.encode_to_bytes().expect("sampled values encode");
        proptest::prop_assert_eq!(T::decode(encoded), Ok(value));
        Ok(())
    });
    if let Err(error) = result {
        panic!("{name} does not round-trip: {error}");
    }
}

#[cfg(test)]
mod sample {
    use proptest::collection::vec;
    use proptest::prelude::*;

    use super::*;

    /// Short byte strings: long ones add nothing the codec does not already do for short ones.
    const SAMPLE_BYTES_MAX: usize = 24;
    /// Items per sampled list.
    const SAMPLE_ITEMS_MAX: usize = 4;

    fn bytes() -> BoxedStrategy<Bytes> {
        vec(any::<u8>(), 0..SAMPLE_BYTES_MAX).prop_map(Bytes::from).boxed()
    }

    macro_rules! integer_sample {
        ($encoding:ty, $ty:ty) => {
            impl SampleField<$ty> for $encoding {
                fn minimal() -> $ty {
                    <$ty>::default()
                }

                fn arbitrary() -> BoxedStrategy<$ty> {
                    any::<$ty>().boxed()
                }
            }
        };
    }

    integer_sample!(U8, u8);
    integer_sample!(U16, u16);
    integer_sample!(U32, u32);
    integer_sample!(U64, u64);
    integer_sample!(Bool, bool);

    impl SampleField<Option<Bytes>> for Str {
        fn minimal() -> Option<Bytes> {
            None
        }

        fn arbitrary() -> BoxedStrategy<Option<Bytes>> {
            proptest::option::of(bytes()).boxed()
        }
    }

    impl SampleField<Bytes> for PresentStr {
        fn minimal() -> Bytes {
            Bytes::new()
        }

        fn arbitrary() -> BoxedStrategy<Bytes> {
            bytes()
        }
    }

    impl SampleField<Bytes> for Bytes32 {
        fn minimal() -> Bytes {
            Bytes::new()
        }

        fn arbitrary() -> BoxedStrategy<Bytes> {
            bytes()
        }
    }

    impl SampleField<Bytes> for Rest {
        fn minimal() -> Bytes {
            Bytes::new()
        }

        fn arbitrary() -> BoxedStrategy<Bytes> {
            bytes()
        }
    }

    impl SampleField<NonZeroU32> for NonZero32 {
        fn minimal() -> NonZeroU32 {
            NonZeroU32::MIN
        }

        fn arbitrary() -> BoxedStrategy<NonZeroU32> {
            (1..=u32::MAX).prop_map(|value| NonZeroU32::new(value).expect("not 0")).boxed()
        }
    }

    impl<T: Sample> SampleField<T> for Item {
        fn minimal() -> T {
            T::minimal()
        }

        fn arbitrary() -> BoxedStrategy<T> {
            T::arbitrary()
        }
    }

    impl<T: Sample> SampleField<Vec<T>> for List16 {
        fn minimal() -> Vec<T> {
            Vec::new()
        }

        fn arbitrary() -> BoxedStrategy<Vec<T>> {
            vec(T::arbitrary(), 0..SAMPLE_ITEMS_MAX).boxed()
        }
    }

    impl<T: Sample> SampleField<Vec<T>> for List32 {
        fn minimal() -> Vec<T> {
            Vec::new()
        }

        fn arbitrary() -> BoxedStrategy<Vec<T>> {
            vec(T::arbitrary(), 0..SAMPLE_ITEMS_MAX).boxed()
        }
    }

    impl<T: std::fmt::Debug + 'static, E: SampleField<T>> SampleField<Option<T>> for Flagged<E> {
        fn minimal() -> Option<T> {
            None
        }

        fn arbitrary() -> BoxedStrategy<Option<T>> {
            proptest::option::of(E::arbitrary()).boxed()
        }
    }

    /// List items that are primitives (`list32<str>`, `list16<u32>`, `list16<u64>`).
    impl Sample for Option<Bytes> {
        fn minimal() -> Self {
            None
        }

        fn arbitrary() -> BoxedStrategy<Self> {
            Str::arbitrary()
        }
    }

    impl Sample for u32 {
        fn minimal() -> Self {
            0
        }

        fn arbitrary() -> BoxedStrategy<Self> {
            any::<u32>().boxed()
        }
    }

    impl Sample for u64 {
        fn minimal() -> Self {
            0
        }

        fn arbitrary() -> BoxedStrategy<Self> {
            any::<u64>().boxed()
        }
    }
}
