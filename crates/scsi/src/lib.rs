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
//! buffered or O_DIRECT ([`FileIo::direct`], bounce buffers aligned to the
//! logical block size), write-through, fdatasync for SYNCHRONIZE CACHE and
//! FUA) and [`BlockIo`] (O_DIRECT with aligned bounce buffers; on a block
//! device the size and logical block size are the device's, BLKSSZGET, and
//! a LU's block size must be a multiple of it). The write cache is what
//! the caching page's WCE says: with WCE=0 (configured, or set by MODE
//! SELECT) every write reaches the store as FUA, so fileio and blockio
//! make it durable before it completes.
//!
//! Pass-through ([`passthrough`], SCST's `scst_disk`): a unit made with
//! [`Device::pass_through`] sends its commands to a real device
//! ([`SgDevice`]: SG_IO on `/dev/sgN`) with the direction and length the
//! transport gives, and returns the device's status and sense as they
//! came; REPORT LUNS, unit attentions, persistent reservations and a
//! configured identity stay the target's, and LOGICAL UNIT RESET resets
//! the device.
//!
//! Thin provisioning (`DeviceConfig::thin`): UNMAP, and WRITE SAME with
//! UNMAP of a zero block, ask the store to deallocate
//! ([`Backend::unmap`]): fileio punches a hole (fallocate PUNCH_HOLE |
//! KEEP_SIZE), blockio deallocates through the same call on the device,
//! which the kernel turns into a discard or write-zeroes that guarantees
//! zeroes, or refuses; a store that cannot gets zeroes written. A bare
//! BLKDISCARD is not used: it does not promise zeroes, and the unit
//! reports LBPRZ (VPD B2h, READ CAPACITY(16) LBPME/LBPRZ).
//!
//! `DeviceConfig::rotational` is VPD B1h's MEDIUM ROTATION RATE: 0001h
//! (non-rotating) when off, 0000h (not reported, which Linux takes as
//! rotating) when on, since a target does not know a disk's real rate.
//!
//! Queue limits: a logical unit's task set holds at most
//! `DeviceConfig::queue_depth` commands (default 128, all nexuses
//! together); [`Target::submit`] answers one more without running it:
//! TASK SET FULL when the nexus has tasks of its own in the set, BUSY
//! when it has none (SAM-5 5.3.1).
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
//! ALUA ([`alua`], SPC-4 5.16): [`Target::set_alua`] sets target port
//! groups (which target ports, by relative target port identifier, so a
//! group may list ports of another target on the same LU; each group's asymmetric access state:
//! active/optimized, active/non-optimized, standby, unavailable,
//! transitioning; PREF); INQUIRY reports TPGS (implicit, or implicit and
//! explicit when SET TARGET PORT GROUPS is allowed), VPD 83h the port's
//! group beside its relative port, REPORT TARGET PORT GROUPS both header
//! formats. A state refuses the commands SPC-4 5.16.2.4 does not let it
//! run with NOT READY and 04/0Ah, 04/0Bh or 04/0Ch; every change
//! ([`Target::set_group_state`], a new configuration, SET TARGET PORT
//! GROUPS) raises ASYMMETRIC ACCESS STATE CHANGED (2A/06) on every nexus
//! that has reached a logical unit (but the one that sent the SET). The
//! groups are the target's, one logical unit group for every unit. A
//! pass-through unit's commands are refused by state too, the core
//! answers REPORT/SET TARGET PORT GROUPS for it, and its INQUIRY data
//! carries the target's TPGS and VPD 83h the port's relative port and
//! group in place of the device's own.
//!
//! Virtual CD-ROM ([`vcdrom`], SCST's `vcdrom`): a read-only MMC unit
//! (type 05h, removable, 2048-byte blocks) over an ISO image, with READ
//! TOC, GET CONFIGURATION, GET EVENT STATUS NOTIFICATION, page 2Ah, no
//! medium as NOT READY 3A/00, writes as DATA PROTECT, and the image
//! changed or ejected at run time ([`Target::change_medium`], 28/00 to
//! every nexus).
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
//!
//! Not here yet: a data API of scatter lists (data-in/data-out are whole
//! `Vec`s and slices, one copy in and one out of the store), and an
//! asynchronous engine (io_uring); execution stays on the caller's thread.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod alua;
pub mod backend;
pub mod bufs;
pub mod cdb;
pub mod detach;
pub mod emulation;
pub mod fuzz;
pub mod lun;
pub mod opcode;
pub mod passthrough;
pub mod pi;
pub mod pr;
pub mod sense;
pub mod target;
pub mod task;
pub mod transport_id;
pub mod ua;
pub mod vcdrom;

pub use alua::{AccessState, Alua, PortGroup};
pub use backend::{Backend, BlockIo, FileIo, NullIo, Ram};
pub use bufs::Buffers;
pub use cdb::{Command, DataDir, Plan};
pub use detach::Detachable;
pub use emulation::{Device, DeviceConfig, DeviceError, DeviceStats, ThreadsPool};
pub use lun::Lun;
pub use opcode::Opcode;
pub use passthrough::{PassThrough, SgDevice};
pub use pi::{crc16_t10dif, PiType};
pub use sense::{Asc, Sense, SenseKey};
pub use target::{
    GroupMap, LunMaps, Nexus, PortMap, Residual, Route, ScsiResponse, Status, Target, TaskAttr,
};
pub use task::{ServiceResponse, Tmf, TmfResponse};
pub use transport_id::{ProtocolId, TransportId};
pub use vcdrom::VCdrom;
