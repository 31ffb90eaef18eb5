//! Management datagram (MAD) wire formats: IBA chapters 12 to 16.
//!
//! A MAD is 256 bytes carried on QP0 (SMPs) or QP1 (GMPs). This crate
//! decodes and encodes them and nothing else: the common MAD header
//! ([`mad`]), subnet management packets ([`smp`]), RMPP segmentation
//! ([`rmpp`]), subnet administration records ([`sa`]), connection
//! management messages and the RDMA CM private-data header ([`cm`]) and
//! device management attributes ([`dm`]).
//!
//! Contract: every layout is a view (`Packet<T: AsRef<[u8]>>`-style, with
//! `new_checked` for untrusted bytes) plus a `Repr` with `parse`,
//! `buffer_len` and `emit`. Open code spaces (classes, methods, attribute
//! IDs, reject reasons) are enums with an `Unknown(n)` variant made from one
//! table that also gives `Display`. An attribute we do not know passes
//! through as raw bytes; it is never an error. Parsing never panics on any
//! input.
//!
//! What it refuses to do: I/O, timers, retries, TID allocation and agent
//! state. Those belong to the MAD agents above; [`rmpp`] offers only pure
//! segmentation and reassembly.

#![forbid(unsafe_code)]

#[macro_use]
extern crate rdma_types;

mod bytes;
pub mod cm;
pub mod dm;
pub mod mad;
pub mod rmpp;
pub mod sa;
pub mod smp;

#[doc(hidden)]
pub mod fuzz;
#[cfg(test)]
mod fuzz_tests;

pub use mad::{Mad, MadHeaderRepr, MadRepr, MadStatus, Method, MgmtClass, MAD_SIZE};

/// Why bytes could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The buffer is shorter than the layout needs.
    #[error("truncated: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes the layout needs.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// A field holds a value the layout forbids.
    #[error("malformed {what}: {value:#x}")]
    Malformed {
        /// The field.
        what: &'static str,
        /// The offending value.
        value: u64,
    },
    /// The MAD is not of the class or attribute the caller asked for.
    #[error("wrong MAD: expected {expected}")]
    WrongKind {
        /// What was expected.
        expected: &'static str,
    },
}

/// Result of decoding.
pub type Result<T> = core::result::Result<T, Error>;

/// Fails with [`Error::Truncated`] unless `buf` has `need` bytes.
pub(crate) fn check_len(buf: &[u8], need: usize) -> Result<()> {
    if buf.len() < need {
        Err(Error::Truncated {
            need,
            have: buf.len(),
        })
    } else {
        Ok(())
    }
}
