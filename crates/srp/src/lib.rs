//! The SCSI RDMA Protocol (SRP): information units on the wire, and (later)
//! sans-IO initiator and target sessions built on them.
//!
//! SRP (T10 SRP r16a, plus the immediate-data extension of SRP2 as Linux
//! uses it) carries SCSI commands over a reliable RDMA channel: the login
//! travels in connection-manager private data, every other information unit
//! (IU) is one RC SEND, and the data moves by RDMA READ/WRITE against memory
//! descriptors that the SRP_CMD carries.
//!
//! [`wire`] has a view (`*Packet<T>`) and a `Repr` for every IU: views read
//! and write fields in place over any byte buffer; reprs hold validated values
//! and emit exactly the bytes Linux `ib_srp`/`ib_srpt` put on the wire for the
//! same fields (reserved bytes zero). Open code spaces (IU types, login
//! reject reasons, task-management functions, task attributes) parse to an
//! `Unknown(n)` variant instead of failing.
//!
//! ```
//! use srp::wire::{Iu, Rsp, RspCode, RspFlags, Tag};
//!
//! // A target answers a task management request...
//! let code = RspCode::Complete.to_response_data();
//! let rsp = Rsp {
//!     sol_not: 0,
//!     req_lim_delta: 1,
//!     tag: Tag(0x8000_0000),
//!     flags: RspFlags::default(),
//!     status: 0,
//!     data_out_res_cnt: 0,
//!     data_in_res_cnt: 0,
//!     response_data: Some(&code),
//!     sense_data: None,
//! };
//! let bytes = Iu::Rsp(rsp).to_vec().unwrap();
//! assert_eq!(bytes.len(), 40);
//!
//! // ...and the initiator decodes whatever arrives, by opcode.
//! match Iu::parse(&bytes, None).unwrap() {
//!     Iu::Rsp(r) => assert_eq!(r.response_code(), Some(RspCode::Complete)),
//!     other => panic!("unexpected {}", other.iu_type()),
//! }
//! ```
//!
//! Contract: every parser takes untrusted bytes and bounds-checks every length
//! and count against the IU length; bad input gives a [`wire::Error`], never a
//! panic or a read out of bounds. What this crate refuses to do: interpret
//! LUNs or CDBs (that is the SCSI core's job), touch memory that descriptors
//! point at, or do any I/O.

#![forbid(unsafe_code)]

pub mod initiator;
mod spare;
pub mod target;
pub mod wire;

/// The RDMA CM port SRP targets are usually found on: srptd's default
/// `rdma_cm_port`, and the port of the `dest=ip:5555` login strings LIO
/// and SCST ib_srpt set-ups use. A convention, not a protocol constant:
/// SRP over RDMA CM has no assigned port.
pub const RDMA_CM_PORT: u16 = 5555;
