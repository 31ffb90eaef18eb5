//! Table generators of the SRP wire format (open code spaces themselves
//! are `rdma_types::open_enum!`): each invocation is the only place its
//! codes, names and (for IU types) sizes are written down.

/// The IU type table: opcode, name and fixed length of each IU.
macro_rules! iu_types {
    (
        $(#[$meta:meta])*
        $name:ident { $( $var:ident = $val:literal, $text:literal, $len:literal; )+ }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $( #[doc = $text] $var, )+
            /// An opcode outside the table.
            Unknown(u8),
        }

        impl From<u8> for $name {
            fn from(v: u8) -> Self {
                match v {
                    $( $val => $name::$var, )+
                    other => $name::Unknown(other),
                }
            }
        }

        impl From<$name> for u8 {
            fn from(v: $name) -> Self {
                match v {
                    $( $name::$var => $val, )+
                    $name::Unknown(other) => other,
                }
            }
        }

        impl $name {
            /// The name used by SRP r16a and Linux (`"SRP_CMD"`), or
            /// `"unknown IU type"`.
            pub fn name(self) -> &'static str {
                match self {
                    $( $name::$var => $text, )+
                    $name::Unknown(_) => "unknown IU type",
                }
            }
            /// Length of the fixed part of the IU, `None` for unknown types.
            pub fn fixed_len(self) -> Option<usize> {
                match self {
                    $( $name::$var => Some($len), )+
                    $name::Unknown(_) => None,
                }
            }
        }

        impl core::fmt::Display for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                match self {
                    $name::Unknown(v) => write!(f, "unknown IU type {:#04x}", v),
                    _ => f.write_str(self.name()),
                }
            }
        }
    };
}

/// A fixed-layout view: `new_unchecked`, `new_checked` (length only),
/// a getter on `AsRef` and a setter on `AsMut` for each field of the
/// private `field` module in scope.
macro_rules! view {
    (
        $(#[$meta:meta])*
        $name:ident, $iu:literal, $len:expr, {
            $( $(#[$fmeta:meta])* $get:ident, $set:ident: $ty:ty = $range:ident; )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Wrap a buffer without checking its length; getters and
            /// setters panic if it is shorter than the fixed part.
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Wrap a buffer after checking that it holds the fixed part.
            ///
            /// # Errors
            /// [`Error::Truncated`](crate::wire::Error::Truncated).
            pub fn new_checked(buffer: T) -> $crate::wire::Result<Self> {
                $crate::wire::check_len($iu, buffer.as_ref(), $len)?;
                Ok(Self { buffer })
            }

            /// The wrapped buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }

            $(
                $(#[$fmeta])*
                pub fn $get(&self) -> $ty {
                    <$ty as $crate::wire::WireField>::get(&self.buffer.as_ref()[field::$range])
                }
            )*
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $name<T> {
            $(
                #[doc = concat!("Set the field read by [`", stringify!($get), "`](Self::", stringify!($get), ").")]
                pub fn $set(&mut self, value: $ty) {
                    $crate::wire::WireField::put(value, &mut self.buffer.as_mut()[field::$range])
                }
            )*
        }
    };
}
