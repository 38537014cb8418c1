//! Declarative helpers that derive [`crate::Xdr`] for the common shapes:
//! structs whose fields are all XDR items in order, C-like enums with
//! explicit values, and bounded opaque newtypes.

/// A struct encoded as its fields in declaration order.
macro_rules! xdr_struct {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq, Eq, Default)]
        #[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
        pub struct $name { $($(#[$fm])* pub $field: $ty),* }

        impl $crate::Xdr for $name {
            #[allow(unused_variables)]
            fn encode<S: $crate::XdrSink + ?Sized>(&self, s: &mut S) {
                $( $crate::Xdr::encode(&self.$field, s); )*
            }
            #[allow(unused_variables)]
            fn decode(d: &mut $crate::Decoder) -> $crate::Result<Self> {
                Ok(Self { $( $field: $crate::Xdr::decode(d)?, )* })
            }
            fn encoded_len(&self) -> usize {
                0 $( + $crate::Xdr::encoded_len(&self.$field) )*
            }
        }
    };
}

/// A C-like enum with explicit wire values; unknown values are decode errors.
macro_rules! xdr_enum {
    ($(#[$m:meta])* pub enum $name:ident ($what:literal) { $($(#[$vm:meta])* $var:ident = $val:expr),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
        #[repr(u32)]
        pub enum $name { $($(#[$vm])* $var = $val),* }

        impl $name {
            /// The enum value for a wire value, if it has one.
            pub fn from_u32(v: u32) -> Option<Self> {
                match v {
                    $( x if x == $val => Some(Self::$var), )*
                    _ => None,
                }
            }
        }

        impl From<$name> for u32 {
            fn from(v: $name) -> u32 {
                v as u32
            }
        }

        impl $crate::Xdr for $name {
            fn encode<S: $crate::XdrSink + ?Sized>(&self, s: &mut S) {
                s.put_u32_be(*self as u32);
            }
            fn decode(d: &mut $crate::Decoder) -> $crate::Result<Self> {
                let v = d.u32($what)?;
                Self::from_u32(v).ok_or($crate::XdrError::BadValue { what: $what, value: v })
            }
            fn encoded_len(&self) -> usize {
                4
            }
        }
    };
}

/// A variable-length opaque (or string) with a maximum length, held as a
/// `Bytes` slice of the input. `payload` marks DDP-eligible items, which are
/// encoded through [`crate::XdrSink::put_payload`] and decoded through
/// [`crate::Decoder::payload`].
macro_rules! xdr_opaque {
    ($(#[$m:meta])* pub struct $name:ident, max = $max:expr, what = $what:literal, payload = $payload:tt) => {
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
        pub struct $name(pub bytes::Bytes);

        impl $name {
            /// The largest length the field allows.
            pub const MAX: u32 = $max;

            /// Wraps bytes (not checked against [`Self::MAX`]: the encoder
            /// writes what it is given; the decoder enforces the maximum).
            pub fn new(b: impl Into<bytes::Bytes>) -> Self {
                Self(b.into())
            }

            /// The contents.
            pub fn as_bytes(&self) -> &[u8] {
                &self.0
            }
        }

        impl std::ops::Deref for $name {
            type Target = bytes::Bytes;
            fn deref(&self) -> &bytes::Bytes {
                &self.0
            }
        }

        impl From<&'static str> for $name {
            fn from(s: &'static str) -> Self {
                Self(bytes::Bytes::from_static(s.as_bytes()))
            }
        }

        impl From<Vec<u8>> for $name {
            fn from(v: Vec<u8>) -> Self {
                Self(bytes::Bytes::from(v))
            }
        }

        impl From<bytes::Bytes> for $name {
            fn from(v: bytes::Bytes) -> Self {
                Self(v)
            }
        }

        impl $crate::Xdr for $name {
            fn encode<S: $crate::XdrSink + ?Sized>(&self, s: &mut S) {
                xdr_opaque!(@encode $payload, s, &self.0);
            }
            fn decode(d: &mut $crate::Decoder) -> $crate::Result<Self> {
                Ok(Self(xdr_opaque!(@decode $payload, d, $what, $max)?))
            }
            fn encoded_len(&self) -> usize {
                4 + $crate::roundup(self.0.len())
            }
        }

        #[cfg(feature = "arbitrary")]
        impl proptest::arbitrary::Arbitrary for $name {
            type Parameters = ();
            type Strategy = proptest::strategy::BoxedStrategy<Self>;
            fn arbitrary_with(_: ()) -> Self::Strategy {
                use proptest::strategy::Strategy;
                proptest::collection::vec(proptest::num::u8::ANY, 0..=($max as usize).min(70))
                    .prop_map(|v| Self(bytes::Bytes::from(v)))
                    .boxed()
            }
        }
    };
    (@encode true, $s:ident, $b:expr) => {
        $crate::encode_payload($s, &$crate::Payload::from(($b).clone()))
    };
    (@encode false, $s:ident, $b:expr) => { $crate::encode_opaque($s, $b) };
    (@decode true, $d:ident, $what:literal, $max:expr) => {
        $d.payload($what, $max).map(|p| p.to_contiguous())
    };
    (@decode false, $d:ident, $what:literal, $max:expr) => { $d.opaque($what, $max) };
}
