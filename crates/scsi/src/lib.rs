//! A transport-agnostic SCSI target core: what SCST's core and device
//! handlers are for an SRP target.
//!
//! A front end (SRP today, others later) hands the core a CDB for a
//! `(nexus, LUN)`. [`Target::plan`] tells it, before execution, the data
//! direction and length the CDB implies (so SRP can fetch data-out with an
//! RDMA READ first); [`Target::execute`] then runs the command against the
//! LUN's [`Device`] and returns a [`ScsiResponse`]. Protocol outcomes are
//! data: a CHECK CONDITION is an `Ok` response carrying [`Sense`].
//!
//! Contract:
//! - One opcode table ([`opcode`]) drives parsing, names and the list of
//!   supported commands; anything not in it is ILLEGAL REQUEST / INVALID
//!   COMMAND OPERATION CODE (SPC-4 4.5.6).
//! - Unit attentions are kept per I_T nexus and LUN and reported once each,
//!   oldest first (SAM-5 5.14, SPC-4 5.13).
//! - LUN masking follows SCST: a target's default LUN set, replaced per
//!   initiator name by a group's set.
//!
//! What it refuses: it knows nothing of RDMA or SRP; it does no I/O
//! scheduling of its own (execution is synchronous on the caller's thread);
//! it never panics on a malformed CDB.
//!
//! Device handlers: [`Ram`], [`NullIo`], [`FileIo`] (pread/pwrite,
//! write-through, fdatasync for SYNCHRONIZE CACHE and FUA) and [`BlockIo`]
//! (O_DIRECT with aligned bounce buffers).
//!
//! Persistent reservations ([`pr`]): REGISTER (and IGNORE), RESERVE,
//! RELEASE, CLEAR, PREEMPT for all six types, REGISTER AND MOVE, enforced
//! per I_T nexus; READ KEYS, READ RESERVATION, REPORT CAPABILITIES and
//! READ FULL STATUS; APTPL state kept in `DeviceConfig::pr_file` and
//! restored on start. Initiators are named by strings; [`TransportId`]
//! maps SRP, FC and iSCSI TransportIDs to those names and back, and
//! target ports get relative target port identifiers from 1 in the order
//! they are first seen ([`Target::relative_port_id`], reported in VPD 83h).
//!
//! Task management ([`task`]): ABORT TASK, ABORT TASK SET, CLEAR TASK
//! SET, LOGICAL UNIT RESET, I_T NEXUS RESET mark commands submitted with
//! [`Target::submit`] aborted; they complete as TASK ABORTED.
//!
//! Task attributes: [`Target::submit_attr`] puts a command in its logical
//! unit's task set, where an ORDERED task waits for every older one, any
//! task waits for an older ORDERED one, and HEAD OF QUEUE starts at once.
//! Execution runs on the caller's thread (the transport brings the
//! threads).
//!
//! VERIFY compares with the data-out when BYTCHK asks (01b: block by
//! block, 11b: one block against all), MISCOMPARE giving the offset.
//!
//! Protection information ([`pi`], SBC-3 4.22): `DeviceConfig::protection`
//! formats a unit with T10 DIF type 1, 2 or 3; the store keeps 8 bytes
//! per block ([`Ram::with_pi`]; [`FileIo::with_pi`] in a side file).
//! READ/WRITE(10/12/16) with RDPROTECT/WRPROTECT (type 2: READ(32)/
//! WRITE(32), with expected reference and application tags) move data and
//! PI interleaved, 520 bytes per 512-byte block, which [`Target::plan`]
//! counts; the guard and tags are checked as SBC-3 tables 95 and 101 say,
//! failures are ABORTED COMMAND 10/01, 10/02 or 10/03 with the LBA, and
//! with RDPROTECT/WRPROTECT 0 the target generates, checks and strips PI
//! itself. Units without PI refuse the protect fields (INVALID FIELD IN
//! CDB). Not here: FORMAT UNIT (the type is chosen at creation), PI in
//! WRITE SAME/VERIFY/COMPARE AND WRITE CDBs (refused; those commands keep
//! PI current), protection interval exponents, the application tag mode
//! page, and PI on nullio and blockio stores.

pub mod backend;
pub mod cdb;
pub mod emulation;
pub mod fuzz;
pub mod lun;
pub mod opcode;
pub mod pi;
pub mod pr;
pub mod sense;
pub mod target;
pub mod task;
pub mod transport_id;
pub mod ua;

pub use backend::{Backend, BlockIo, FileIo, NullIo, Ram};
pub use cdb::{Command, DataDir, Plan};
pub use emulation::{Device, DeviceConfig, DeviceStats};
pub use lun::Lun;
pub use opcode::Opcode;
pub use pi::{crc16_t10dif, PiType};
pub use sense::{Asc, Sense, SenseKey};
pub use target::{GroupMap, LunMaps, Nexus, Residual, ScsiResponse, Status, Target, TaskAttr};
pub use task::{ServiceResponse, Tmf, TmfResponse};
pub use transport_id::{ProtocolId, TransportId};
