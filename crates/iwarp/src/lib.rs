//! A sans-IO iWARP engine: RDMAP (RFC 5040) over DDP (RFC 5041) over MPA
//! (RFC 5044, with RFC 6581's enhanced connection setup), for one TCP
//! connection.
//!
//! The engine turns the bytes of a TCP stream into placements in
//! registered memory and completions, and posted work into bytes for the
//! stream. It never touches a socket, a thread or a clock: the driver hands
//! in whatever the socket read, in pieces of any size (an FPDU may be split
//! or joined with others at any byte), and writes out what the engine
//! produces. Memory is reached only through the [`Memory`] trait, so every
//! STag is checked before a byte is placed.
//!
//! Modules, bottom up: [`mpa`] (request/reply frames, FPDU framing and
//! CRC32c, the stream receiver; it knows nothing of what the ULPDUs hold),
//! [`ddp`] (the segment header with the RDMAP control byte it carries,
//! segmentation), [`rdmap`] (the opcode table, Read Request), and
//! [`Connection`], the state machine that joins them. [`terminate`] is the
//! one table of TERMINATE causes every layer reports through, and the
//! TERMINATE body.
//!
//! What it refuses to do: markers (never requested; a peer that asks for
//! them gets a reject reply), MPA revision 2's RTR exchange (never offered;
//! a reply that demands one is terminated), choose addresses or open
//! sockets. Any bytes from the peer give a value or a TERMINATE with the
//! RFCs' layer, error type and code, never a panic, and buffering is
//! bounded by one FPDU plus one MPA frame.

#![forbid(unsafe_code)]

pub mod ddp;
pub mod mpa;
pub mod rdmap;
pub mod terminate;
mod types;

mod conn;

pub use conn::{
    Access, Completion, Config, ConfigError, Connection, Event, Memory, MemoryError, MpaRefusal,
    RecvWqe, Role, SendOp, SendWqe, Sge, State, WcKind, WcStatus,
};
pub use terminate::{TermCause, TermCode};

#[doc(hidden)]
pub mod fuzz;
pub use types::{Msn, STag};

#[cfg(test)]
mod tests;
