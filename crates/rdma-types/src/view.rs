//! Fixed-layout views over byte buffers, the one way the wire crates
//! write them (smoltcp's `Packet<T: AsRef<[u8]>>` shape): [`crate::view!`]
//! makes the view type, its constructors and a getter (on `AsRef`) and a
//! setter (on `AsMut`) per field; [`Field`] says how a field's value sits
//! in its byte range.

/// A value stored in a fixed byte range of a wire header, big-endian for
/// integers (network byte order).
pub trait Field: Sized {
    /// Reads the value from exactly its bytes (zero if the range has
    /// another length, which a view's layout table never gives).
    fn get(b: &[u8]) -> Self;
    /// Writes the value into exactly its bytes.
    fn put(self, b: &mut [u8]);
}

macro_rules! be_field {
    ($($t:ty),*) => {$(
        impl Field for $t {
            fn get(b: &[u8]) -> Self {
                <$t>::from_be_bytes(b.try_into().unwrap_or_default())
            }
            fn put(self, b: &mut [u8]) {
                b.copy_from_slice(&self.to_be_bytes())
            }
        }
    )*};
}
be_field!(u8, u16, u32, u64, i32);

/// Defines a fixed-layout view: the struct over a buffer `T`, the length
/// of its fixed part (`LEN`, `header_len()`), `new_unchecked`,
/// `new_checked` (the buffer holds the fixed part, else the crate's
/// `check(what, need, have)` error), `into_inner`, and per field a getter
/// on `AsRef` and a setter on `AsMut` over its byte range ([`Field`]).
/// Fields with other encodings get hand-written accessors beside it.
///
/// ```ignore
/// rdma_types::view! {
///     /// A simple reply header.
///     pub struct SimpleReply; len 16; "simple reply", check_len => Error;
///     /// Reply magic.
///     magic / set_magic: u32 = field::MAGIC;
/// }
/// ```
#[macro_export]
macro_rules! view {
    (
        $(#[$meta:meta])*
        pub struct $name:ident; len $len:expr; $what:literal, $check:path => $err:ty;
        $( $(#[$fmeta:meta])* $get:ident / $set:ident : $ty:ty = $range:expr; )*
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Bytes of the fixed part.
            pub const LEN: usize = $len;

            /// Wraps a buffer without checking its length; accessors panic
            /// on a buffer shorter than the fixed part.
            pub const fn new_unchecked(buffer: T) -> Self {
                $name { buffer }
            }

            /// Wraps a buffer after checking that it holds the fixed part.
            ///
            /// # Errors
            /// The buffer is shorter than the fixed part.
            pub fn new_checked(buffer: T) -> ::core::result::Result<Self, $err> {
                $check($what, $len, buffer.as_ref().len())?;
                Ok($name { buffer })
            }

            /// The wrapped buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }

            /// Length of the fixed part.
            pub const fn header_len() -> usize {
                $len
            }

            $(
                $(#[$fmeta])*
                pub fn $get(&self) -> $ty {
                    <$ty as $crate::view::Field>::get(&self.buffer.as_ref()[$range])
                }
            )*
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $name<T> {
            $(
                #[doc = concat!("Sets the field read by [`", stringify!($get), "`](Self::", stringify!($get), ").")]
                pub fn $set(&mut self, value: $ty) {
                    $crate::view::Field::put(value, &mut self.buffer.as_mut()[$range])
                }
            )*
        }
    };
}

#[cfg(test)]
mod tests {
    use super::Field;

    #[derive(Debug, PartialEq)]
    pub struct Short {
        need: usize,
        have: usize,
    }

    fn check(_what: &'static str, need: usize, have: usize) -> Result<(), Short> {
        if have < need {
            Err(Short { need, have })
        } else {
            Ok(())
        }
    }

    mod field {
        use core::ops::Range;
        pub const A: Range<usize> = 0..2;
        pub const B: Range<usize> = 2..6;
    }

    crate::view! {
        /// A test layout.
        pub struct Two; len 6; "two", check => Short;
        /// First.
        a / set_a: u16 = field::A;
        /// Second.
        b / set_b: u32 = field::B;
    }

    #[test]
    fn fields_are_big_endian_and_short_buffers_are_refused() {
        let mut buf = [0u8; 6];
        let mut v = Two::new_checked(&mut buf[..]).unwrap();
        v.set_a(0x0102);
        v.set_b(0x0304_0506);
        assert_eq!((v.a(), v.b()), (0x0102, 0x0304_0506));
        assert_eq!(buf, [1, 2, 3, 4, 5, 6]);
        assert_eq!(
            Two::new_checked(&buf[..5]).unwrap_err(),
            Short { need: 6, have: 5 }
        );
        assert_eq!((Two::<&[u8]>::LEN, Two::<&[u8]>::header_len()), (6, 6));
        assert_eq!(u8::get(&[7]), 7);
        assert_eq!(Two::new_unchecked([9u8; 6]).into_inner(), [9u8; 6]);
    }
}
