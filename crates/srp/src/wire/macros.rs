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
