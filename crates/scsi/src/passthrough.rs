//! The pass-through device handler (SCST's `scst_disk`): a logical unit
//! whose commands go to a real SCSI device, so disks, RAID volumes, tapes
//! and changers are exported as they are.
//!
//! The handler knows no opcode table: direction and length come from the
//! transport (an SRP command's data descriptors), so a command the core
//! has never heard of (a tape's REWIND, a changer's MOVE MEDIUM) passes.
//! The device's status and sense go back as the device gave them.
//!
//! What stays the target's (see [`crate::Target`]): REPORT LUNS and
//! REQUEST SENSE of a pending unit attention, unit attentions of every
//! nexus, persistent reservations (emulated: the device sees one
//! initiator, the target; PERSISTENT RESERVE IN/OUT never reach it, and
//! SPC-2 RESERVE/RELEASE are refused as the emulated devices refuse them),
//! NACA (refused: the device's ACA would hold every nexus at once), and
//! the identity the configuration overrides ([`Identity`]): vendor and
//! product are written over the device's standard INQUIRY data; a
//! configured serial makes the target answer VPD 80h and 83h itself
//! (serial, NAA from the serial, relative target port), with the device's
//! peripheral byte. Unset, the device's own identity passes.
//!
//! ALUA is the target's too: with target port groups configured, standard
//! INQUIRY data carries the target's TPGS field in place of the device's,
//! and VPD 83h the port's relative target port and target port group
//! designators in place of any target-port ones of the device (SPC-4
//! 7.8.6.6, 7.8.6.7), as for an emulated unit, so an initiator matches
//! REPORT TARGET PORT GROUPS (the core's) to the path it came by.
//!
//! A LOGICAL UNIT RESET resets the device ([`Executor::reset_device`];
//! the unit attention the device then reports once is the one the core
//! already gave every nexus, so it is not passed on). A unit attention
//! the device reports otherwise (capacity or mode parameters changed) goes
//! to the nexus whose command met it and is queued for every other one.
//!
//! A device that is gone (ENODEV or ENXIO from the ioctl, the host's "no
//! connect") ends the logical unit: every command from then on is ILLEGAL
//! REQUEST / LOGICAL UNIT NOT SUPPORTED, at once, without touching the node.
//!
//! Execution is synchronous on the caller's thread ([`crate::Backend`]
//! `never_blocks` is false, so a transport runs it on a worker).
//! [`SgDevice`] is the Linux executor: SG_IO on a `/dev/sgN` node, the
//! data moved straight between the transport's pieces and the device by
//! the ioctl's scatter list (`iovec_count`); or SG_IO on the device's
//! block SCSI generic node (`/dev/bsg/H:C:T:L`, interface version 4),
//! which takes one flat buffer (pieces are gathered into one and
//! scattered back) and no reset, so a LOGICAL UNIT RESET goes through
//! the device's sg or disk node found in sysfs. The host gives a command
//! [`DEFAULT_TIMEOUT_MS`], or [`LONG_TIMEOUT_MS`] when it may move a
//! medium or work on all of it ([`is_long_opcode`]: a tape's REWIND, a
//! changer's MOVE MEDIUM), as SCST's tape and changer handlers do.

use crate::bufs::Buffers;
use crate::cdb::DataDir;
use crate::sense::{decode_key_asc, Asc, Sense, SenseKey};
use crate::target::{Residual, ScsiResponse, Status};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

/// Most bytes one command moves through the handler; a transport asking
/// for more gets ILLEGAL REQUEST (the sg driver would refuse it anyway,
/// later and less clearly).
pub const MAX_TRANSFER: usize = 32 << 20;

/// Most pieces one command's data may be in (the kernel's UIO_MAXIOV).
pub const MAX_PIECES: usize = 1024;

/// Longest sense data kept (SPC-4 4.5.1: 252 bytes at most).
pub const MAX_SENSE: usize = 252;

/// How long a command may take before the host gives up on it.
pub const DEFAULT_TIMEOUT_MS: u32 = 60_000;

/// How long a command that moves a medium or works on all of it may take
/// (a tape's REWIND or ERASE, a changer's MOVE MEDIUM, a disk's FORMAT
/// UNIT): four hours, SCST's long timeout for tapes and changers
/// (14000 s), rounded up.
pub const LONG_TIMEOUT_MS: u32 = 4 * 3600 * 1000;

/// Whether `opcode` may run for minutes or hours on some device type:
/// REWIND / REZERO UNIT, FORMAT UNIT / FORMAT MEDIUM, REASSIGN BLOCKS /
/// INITIALIZE ELEMENT STATUS, WRITE FILEMARKS, SPACE(6), ERASE(6), START
/// STOP UNIT / LOAD UNLOAD, LOCATE(10), SYNCHRONIZE CACHE(10),
/// INITIALIZE ELEMENT STATUS WITH RANGE, SANITIZE, SPACE(16) /
/// SYNCHRONIZE CACHE(16), LOCATE(16), ERASE(16), MOVE MEDIUM, EXCHANGE
/// MEDIUM, MOVE MEDIUM ATTACHED. The handler knows no device type, so
/// an opcode long on any type gets the long timeout on all (a disk's
/// obsolete REZERO UNIT included).
pub fn is_long_opcode(opcode: u8) -> bool {
    matches!(
        opcode,
        0x01 | 0x04
            | 0x07
            | 0x10
            | 0x11
            | 0x19
            | 0x1b
            | 0x2b
            | 0x35
            | 0x37
            | 0x48
            | 0x91
            | 0x92
            | 0x93
            | 0xa5
            | 0xa6
            | 0xa7
    )
}

/// A command's data as the executor moves it.
pub enum Data<'a, 'b> {
    None,
    /// Data-in, filled from the front.
    In(&'a mut [&'b mut [u8]]),
    /// Data-out, sent in order.
    Out(&'a [&'b [u8]]),
}

impl Data<'_, '_> {
    /// Bytes the pieces hold together.
    pub fn len(&self) -> usize {
        match self {
            Data::None => 0,
            Data::In(p) => p.iter().map(|p| p.len()).sum(),
            Data::Out(p) => p.iter().map(|p| p.len()).sum(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dir(&self) -> DataDir {
        match self {
            Data::None => DataDir::None,
            Data::In(_) => DataDir::In,
            Data::Out(_) => DataDir::Out,
        }
    }
}

/// What the device answered to one command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The status byte (SAM-5 table 33), as the device sent it.
    pub status: u8,
    /// Sense data as the device sent it (empty: none).
    pub sense: Vec<u8>,
    /// Bytes of the transfer that did not move (data-in the device did
    /// not send, data-out it did not take).
    pub resid: usize,
}

/// Why an executor could not get an answer from the device.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The device (or its node) is gone: the logical unit ends.
    #[error("the device is gone ({0}): it was removed or went offline")]
    Gone(String),
    /// The host adapter or its driver failed the command, not the
    /// device (a timeout, a bus reset): the initiator may retry.
    #[error("host status {host:#04x}, driver status {driver:#04x}")]
    Transport { host: u16, driver: u16 },
    /// The host has no room for the command now (the sg driver's 16
    /// requests per open node, EDOM; EAGAIN, EBUSY, ENOMEM, EINTR): BUSY,
    /// which an initiator retries.
    #[error("the host has no room for the command now: {0}")]
    Busy(std::io::Error),
    /// The request itself was refused (EINVAL: too many or too large
    /// pieces for the host).
    #[error("the device refused the request: {0}")]
    Refused(std::io::Error),
}

/// Runs CDBs on one device. [`SgDevice`] does it with SG_IO; tests put a
/// fake here to see what the handler sends and what it makes of answers.
pub trait Executor: Send + Sync {
    /// Runs `cdb` moving `data`, waiting at most `timeout_ms`.
    ///
    /// # Errors
    /// [`ExecError`]: no answer from the device.
    fn execute(&self, cdb: &[u8], data: Data<'_, '_>, timeout_ms: u32)
        -> Result<Answer, ExecError>;

    /// Resets the device (a LOGICAL UNIT RESET from an initiator).
    ///
    /// # Errors
    /// [`ExecError`] when the host cannot reset it.
    fn reset_device(&self) -> Result<(), ExecError>;
}

/// The identity the configuration overrides; what is `false` here comes
/// from the device. Values are the device's [`crate::DeviceConfig`]'s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Identity {
    /// Standard INQUIRY's T10 VENDOR IDENTIFICATION.
    pub vendor: bool,
    /// Standard INQUIRY's PRODUCT IDENTIFICATION.
    pub product: bool,
    /// VPD 80h and 83h answered by the target from `serial` and `naa`.
    pub serial: bool,
}

/// The handler of one pass-through logical unit.
pub struct PassThrough {
    exec: Box<dyn Executor>,
    identity: Identity,
    timeout_ms: u32,
    gone: AtomicBool,
    /// The device was reset by a LOGICAL UNIT RESET and will report it
    /// once; the core has told every nexus already.
    reset_reported: AtomicBool,
}

/// The target port a command came through, as INQUIRY shows it: its
/// relative target port identifier and, with ALUA groups configured, the
/// TPGS field (SPC-4 6.6.2; 0 without groups) and the port's group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PortView {
    pub(crate) rtpi: u16,
    pub(crate) tpgs: u8,
    pub(crate) group: Option<u16>,
}

/// What the target does after a passed command besides answering it.
pub(crate) struct Passed {
    pub(crate) response: ScsiResponse,
    /// A unit attention the device reported, for the other nexuses.
    pub(crate) unit_attention: Option<Asc>,
}

impl PassThrough {
    pub fn new(exec: Box<dyn Executor>, identity: Identity) -> PassThrough {
        PassThrough {
            exec,
            identity,
            timeout_ms: DEFAULT_TIMEOUT_MS,
            gone: AtomicBool::new(false),
            reset_reported: AtomicBool::new(false),
        }
    }

    /// The timeout of an ordinary command, in milliseconds (at least 1);
    /// [`is_long_opcode`] commands get at least [`LONG_TIMEOUT_MS`].
    pub fn with_timeout_ms(mut self, ms: u32) -> PassThrough {
        self.timeout_ms = ms.max(1);
        self
    }

    pub fn identity(&self) -> Identity {
        self.identity
    }

    /// Whether the device went away; the logical unit then answers every
    /// command with LOGICAL UNIT NOT SUPPORTED.
    pub fn is_gone(&self) -> bool {
        self.gone.load(SeqCst)
    }

    /// Resets the device for a LOGICAL UNIT RESET; false when it could
    /// not be (gone, or the host refused).
    pub(crate) fn reset(&self) -> bool {
        if self.is_gone() {
            return false;
        }
        match self.exec.reset_device() {
            Ok(()) => {
                self.reset_reported.store(true, SeqCst);
                true
            }
            Err(ExecError::Gone(_)) => {
                self.gone.store(true, SeqCst);
                false
            }
            Err(_) => false,
        }
    }

    /// Sends `cdb` to the device once, handling what the handler handles
    /// (a gone device, the reset's own unit attention).
    fn send(&self, cdb: &[u8], mut data: Data<'_, '_>) -> Result<Answer, Sense> {
        if self.is_gone() {
            return Err(gone_sense());
        }
        let len = data.len();
        // The unit attention of a reset the core reported already is
        // skipped once: the command runs again.
        for _ in 0..2 {
            let d = match &mut data {
                Data::None => Data::None,
                Data::In(p) => Data::In(&mut p[..]),
                Data::Out(p) => Data::Out(p),
            };
            let timeout = if cdb.first().is_some_and(|&op| is_long_opcode(op)) {
                self.timeout_ms.max(LONG_TIMEOUT_MS)
            } else {
                self.timeout_ms
            };
            match self.exec.execute(cdb, d, timeout) {
                Ok(a) => {
                    let reset_ua = a.status == Status::CheckCondition.code()
                        && matches!(
                            decode_key_asc(&a.sense),
                            Some((SenseKey::UnitAttention, Asc(0x29, _)))
                        );
                    if reset_ua && self.reset_reported.swap(false, SeqCst) {
                        continue;
                    }
                    return Ok(a);
                }
                Err(ExecError::Gone(_)) => {
                    self.gone.store(true, SeqCst);
                    return Err(gone_sense());
                }
                // SAM-5: a failure of the service delivery, not the
                // device's: ABORTED COMMAND, which an initiator retries.
                Err(ExecError::Transport { .. }) => {
                    return Err(Sense::new(
                        SenseKey::AbortedCommand,
                        Asc::INTERNAL_TARGET_FAILURE,
                    ))
                }
                Err(ExecError::Busy(_)) => {
                    return Ok(Answer {
                        status: Status::Busy.code(),
                        sense: Vec::new(),
                        resid: len,
                    })
                }
                Err(ExecError::Refused(_)) => {
                    return Err(Sense::new(
                        SenseKey::IllegalRequest,
                        Asc::INVALID_FIELD_IN_CDB,
                    ))
                }
            }
        }
        Err(Sense::new(SenseKey::UnitAttention, Asc::BUS_DEVICE_RESET))
    }

    /// Runs one command on the device: data-out from `data_out` (flat) or
    /// the data-out pieces of `bufs`; data-in into the data-in pieces of
    /// `bufs`, or into the response's vector (`expected` bytes at most).
    /// The direction is the transport's: data-out when there is any,
    /// else data-in when `expected` is not 0.
    pub(crate) fn run(
        &self,
        dev: &crate::Device,
        port: PortView,
        cdb: &[u8],
        data_out: &[u8],
        bufs: Option<&mut Buffers<'_, '_>>,
        expected: u64,
    ) -> Passed {
        let r = self.run_inner(dev, port, cdb, data_out, bufs, expected);
        let (response, unit_attention) = match r {
            Ok((answer, data_in, moved)) => answer_response(answer, data_in, moved, expected),
            Err(s) => (
                ScsiResponse {
                    status: Status::CheckCondition,
                    sense: Some(s),
                    device_sense: None,
                    data_in: Vec::new(),
                    residual: under(expected, 0),
                    descriptor_sense: false,
                },
                None,
            ),
        };
        Passed {
            response,
            unit_attention,
        }
    }

    /// The answer, the data-in in a vector (when there were no pieces)
    /// and the bytes moved.
    fn run_inner(
        &self,
        dev: &crate::Device,
        port: PortView,
        cdb: &[u8],
        data_out: &[u8],
        bufs: Option<&mut Buffers<'_, '_>>,
        expected: u64,
    ) -> Result<(Answer, Vec<u8>, u64), Sense> {
        let (dir, len) = transfer(data_out, bufs.as_deref(), expected)?;
        if let Some(page) = inquiry_page(cdb) {
            return self.inquiry(dev, port, cdb, page, len, bufs);
        }
        match (dir, bufs) {
            (DataDir::None, _) => {
                let a = self.send(cdb, Data::None)?;
                Ok((a, Vec::new(), 0))
            }
            (DataDir::Out, b) => {
                let pieces = match b {
                    Some(b) if data_out.is_empty() => b.data_out_for(len).ok_or_else(too_many)?,
                    _ => vec![data_out.get(..len).unwrap_or(data_out)],
                };
                if pieces.len() > MAX_PIECES {
                    return Err(too_many());
                }
                let a = self.send(cdb, Data::Out(&pieces))?;
                let moved = len.saturating_sub(a.resid) as u64;
                Ok((a, Vec::new(), moved))
            }
            (DataDir::In, Some(b)) if b.has_data_in() => {
                let mut pieces = b.data_in_for(len);
                if pieces.len() > MAX_PIECES {
                    return Err(too_many());
                }
                let a = self.send(cdb, Data::In(&mut pieces))?;
                let moved = len.saturating_sub(a.resid);
                b.placed = Some(moved);
                Ok((a, Vec::new(), moved as u64))
            }
            (DataDir::In, _) => {
                let mut v = vec![0u8; len];
                let a = self.send(cdb, Data::In(&mut [&mut v[..]]))?;
                v.truncate(len.saturating_sub(a.resid));
                let moved = v.len() as u64;
                Ok((a, v, moved))
            }
        }
    }

    /// INQUIRY: the device's answer with the configured vendor and
    /// product (and the target's TPGS) written over it, or VPD 80h/83h
    /// from the configuration, or the device's VPD 83h with the port's
    /// designators when ALUA groups are configured.
    fn inquiry(
        &self,
        dev: &crate::Device,
        port: PortView,
        cdb: &[u8],
        page: Option<u8>,
        len: usize,
        bufs: Option<&mut Buffers<'_, '_>>,
    ) -> Result<(Answer, Vec<u8>, u64), Sense> {
        let mut v = vec![0u8; len];
        let answer = match page {
            Some(p @ (0x80 | 0x83)) if self.identity.serial => {
                // The peripheral byte is the device's (its type: a tape
                // stays a tape).
                let mut std = [0u8; 36];
                let probe = [0x12, 0, 0, 0, std.len() as u8, 0];
                let peripheral = match self.send(&probe, Data::In(&mut [&mut std[..]])) {
                    Ok(a) if a.status == Status::Good.code() && a.resid < std.len() => std[0],
                    _ => 0,
                };
                let mut d = dev.inquiry(true, p)?;
                if p == 0x83 {
                    add_port_designators(&mut d, port);
                }
                d[0] = peripheral;
                good_from(&mut v, &d)
            }
            Some(0x83) if port.group.is_some() => {
                // The whole page, whatever the initiator's allocation, so
                // the designators go after the device's last one.
                let mut d = vec![0u8; VPD_83_MAX];
                let probe = [0x12, 0x01, 0x83, 0x10, 0x00, 0];
                let a = self.send(&probe, Data::In(&mut [&mut d[..]]))?;
                if a.status != Status::Good.code() {
                    return Ok((a, Vec::new(), 0));
                }
                d.truncate(VPD_83_MAX.saturating_sub(a.resid));
                let mut d = without_port_designators(&d);
                add_port_designators(&mut d, port);
                good_from(&mut v, &d)
            }
            _ => {
                let a = self.send(cdb, Data::In(&mut [&mut v[..]]))?;
                v.truncate(len.saturating_sub(a.resid));
                if page.is_none() && a.status == Status::Good.code() {
                    self.patch_standard(dev, port, &mut v);
                }
                a
            }
        };
        let moved = v.len() as u64;
        match bufs {
            Some(b) if b.has_data_in() => {
                b.copy_in(&v);
                Ok((answer, Vec::new(), moved))
            }
            _ => Ok((answer, v, moved)),
        }
    }

    /// Writes the configured identity over standard INQUIRY data (SPC-4
    /// 6.6.2), as far as the data goes, clears NORMACA (the target
    /// refuses NACA=1 for a passed device) and, with ALUA groups, puts
    /// the target's TPGS in byte 5 bits 5..4.
    fn patch_standard(&self, dev: &crate::Device, port: PortView, d: &mut [u8]) {
        fn put(d: &mut [u8], at: usize, s: &str, n: usize) {
            let field = crate::emulation::pad(s, n);
            for (k, b) in field.into_iter().enumerate() {
                if let Some(x) = d.get_mut(at + k) {
                    *x = b;
                }
            }
        }
        if let Some(b) = d.get_mut(3) {
            *b &= !0x20;
        }
        if port.tpgs != 0 {
            if let Some(b) = d.get_mut(5) {
                *b = (*b & !0x30) | (port.tpgs << 4);
            }
        }
        if self.identity.vendor {
            put(d, 8, &dev.config.vendor, 8);
        }
        if self.identity.product {
            put(d, 16, &dev.config.product, 16);
        }
    }
}

/// Most bytes of a device's VPD 83h the handler reads to add the port's
/// designators (the page's length field allows 64 KiB; devices send a
/// few hundred bytes).
const VPD_83_MAX: usize = 4096;

/// GOOD with `d` as the data-in, cut to `v`'s length (the allocation).
fn good_from(v: &mut Vec<u8>, d: &[u8]) -> Answer {
    let n = d.len().min(v.len());
    let resid = v.len() - n;
    v.truncate(n);
    v.copy_from_slice(&d[..n]);
    Answer {
        status: Status::Good.code(),
        sense: Vec::new(),
        resid,
    }
}

/// The port's relative target port designator and, with ALUA groups, its
/// target port group designator, appended to VPD 83h data.
fn add_port_designators(d: &mut Vec<u8>, port: PortView) {
    crate::target::add_relative_port(d, port.rtpi);
    if let Some(g) = port.group {
        crate::alua::add_group_designator(d, g);
    }
}

/// A device's VPD 83h page without its relative target port and target
/// port group designators (association 01b, types 4h and 5h: SPC-4
/// 7.8.6.6, 7.8.6.7), which are the target's; the rest as it was, its
/// PAGE LENGTH recomputed. A designator running past the data ends it.
fn without_port_designators(d: &[u8]) -> Vec<u8> {
    let mut out: Vec<u8> = d.iter().take(4).copied().collect();
    out.resize(4, 0);
    let mut at = 4;
    while let Some(h) = d.get(at..at + 4) {
        let end = at + 4 + usize::from(h[3]);
        let Some(whole) = d.get(at..end) else { break };
        let association = (h[1] >> 4) & 0x3;
        let kind = h[1] & 0x0f;
        if !(association == 1 && matches!(kind, 4 | 5)) {
            out.extend_from_slice(whole);
        }
        at = end;
    }
    let len = (out.len() - 4).min(0xffff) as u16;
    out[2..4].copy_from_slice(&len.to_be_bytes());
    out
}

/// Whether the core parses the command's data-out itself (PERSISTENT
/// RESERVE OUT: the reservations are the core's), so it gathers it.
pub(crate) fn core_parses_data_out(cdb: &[u8]) -> bool {
    cdb.first() == Some(&0x5f)
}

fn gone_sense() -> Sense {
    Sense::new(SenseKey::IllegalRequest, Asc::LOGICAL_UNIT_NOT_SUPPORTED)
}

fn too_many() -> Sense {
    Sense::new(SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_CDB)
}

fn under(expected: u64, moved: u64) -> Residual {
    if moved < expected {
        Residual::Under(expected - moved)
    } else {
        Residual::None
    }
}

/// INQUIRY's page: `Some(None)` for standard data, `Some(Some(p))` for
/// VPD page `p`, `None` for another command (or a CDB too short to say).
pub(crate) fn inquiry_page(cdb: &[u8]) -> Option<Option<u8>> {
    match cdb {
        [0x12, b1, page, ..] if cdb.len() >= 6 => Some((b1 & 0x01 != 0).then_some(*page)),
        _ => None,
    }
}

/// Direction and length of a command's transfer, from what the transport
/// brought: data-out when it brought any (flat or in pieces), else
/// data-in of `expected` bytes (at most what the pieces hold).
///
/// # Errors
/// ILLEGAL REQUEST / INVALID FIELD IN CDB past [`MAX_TRANSFER`].
pub(crate) fn transfer(
    data_out: &[u8],
    bufs: Option<&Buffers<'_, '_>>,
    expected: u64,
) -> Result<(DataDir, usize), Sense> {
    let pieces_out = bufs.map_or(0, |b| b.data_out_len());
    let (dir, len) = if !data_out.is_empty() {
        (DataDir::Out, data_out.len() as u64)
    } else if pieces_out > 0 {
        (DataDir::Out, pieces_out as u64)
    } else if expected > 0 {
        let room = match bufs {
            Some(b) if b.has_data_in() => (b.capacity() as u64).min(expected),
            _ => expected,
        };
        (DataDir::In, room)
    } else {
        (DataDir::None, 0)
    };
    if len > MAX_TRANSFER as u64 {
        return Err(too_many());
    }
    Ok((dir, len as usize))
}

/// The response to a device's answer, and the unit attention it carries
/// for the other nexuses (not a reset's: see the module docs).
fn answer_response(
    a: Answer,
    data_in: Vec<u8>,
    moved: u64,
    expected: u64,
) -> (ScsiResponse, Option<Asc>) {
    let mut sense = a.sense;
    sense.truncate(MAX_SENSE);
    let decoded = decode_key_asc(&sense);
    let (status, sense, device_sense) = match Status::from_code(a.status) {
        Some(s) if s == Status::CheckCondition && sense.is_empty() => {
            // A CHECK CONDITION without sense: say so rather than send an
            // empty one (SPC-4 4.5.1 wants sense with it).
            let s = Sense::new(SenseKey::HardwareError, Asc::INTERNAL_TARGET_FAILURE);
            (Status::CheckCondition, Some(s), None)
        }
        Some(s) => {
            let keep = s == Status::CheckCondition || !sense.is_empty();
            let parsed = decoded.map(|(k, asc)| Sense::new(k, asc));
            (s, parsed.filter(|_| keep), keep.then_some(sense))
        }
        // A status the core has no name for (obsolete, reserved).
        None => {
            let s = Sense::new(SenseKey::HardwareError, Asc::INTERNAL_TARGET_FAILURE);
            (Status::CheckCondition, Some(s), None)
        }
    };
    let ua = match (status, decoded) {
        (Status::CheckCondition, Some((SenseKey::UnitAttention, asc))) if asc.0 != 0x29 => {
            Some(asc)
        }
        _ => None,
    };
    let good = matches!(status, Status::Good | Status::ConditionMet);
    let response = ScsiResponse {
        status,
        sense,
        device_sense,
        data_in: if good || status == Status::CheckCondition {
            data_in
        } else {
            Vec::new()
        },
        residual: under(expected, moved),
        descriptor_sense: false,
    };
    (response, ua)
}

pub use sg::SgDevice;

/// SG_IO on a Linux sg node (`/dev/sgN`).
mod sg {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;

    /// `sg_io_hdr_t` of `<scsi/sg.h>` (interface version 3).
    #[repr(C)]
    struct SgIoHdr {
        interface_id: libc::c_int,
        dxfer_direction: libc::c_int,
        cmd_len: libc::c_uchar,
        mx_sb_len: libc::c_uchar,
        iovec_count: libc::c_ushort,
        dxfer_len: libc::c_uint,
        dxferp: *mut libc::c_void,
        cmdp: *const libc::c_uchar,
        sbp: *mut libc::c_uchar,
        timeout: libc::c_uint,
        flags: libc::c_uint,
        pack_id: libc::c_int,
        usr_ptr: *mut libc::c_void,
        status: libc::c_uchar,
        masked_status: libc::c_uchar,
        msg_status: libc::c_uchar,
        sb_len_wr: libc::c_uchar,
        host_status: libc::c_ushort,
        driver_status: libc::c_ushort,
        resid: libc::c_int,
        duration: libc::c_uint,
        info: libc::c_uint,
    }

    // The layout the kernel reads on 64-bit Linux (pahole of sg_io_hdr).
    #[cfg(target_pointer_width = "64")]
    const _: () = {
        assert!(std::mem::size_of::<SgIoHdr>() == 88);
        assert!(std::mem::offset_of!(SgIoHdr, dxferp) == 16);
        assert!(std::mem::offset_of!(SgIoHdr, usr_ptr) == 56);
        assert!(std::mem::offset_of!(SgIoHdr, status) == 64);
        assert!(std::mem::offset_of!(SgIoHdr, resid) == 72);
        assert!(std::mem::offset_of!(SgIoHdr, info) == 80);
    };

    const SG_IO: libc::c_ulong = 0x2285;
    const SG_SCSI_RESET: libc::c_ulong = 0x2284;
    const SG_SCSI_RESET_DEVICE: libc::c_int = 1;
    const SG_GET_VERSION_NUM: libc::c_ulong = 0x2282;
    const SG_DXFER_NONE: libc::c_int = -1;
    const SG_DXFER_TO_DEV: libc::c_int = -2;
    const SG_DXFER_FROM_DEV: libc::c_int = -3;
    /// Host status "no connect": the device is gone (Linux DID_NO_CONNECT).
    const DID_NO_CONNECT: u16 = 0x01;
    /// Driver status bits other than "sense follows" mean the driver
    /// failed the command (Linux DRIVER_SENSE is 08h).
    const DRIVER_SENSE: u16 = 0x08;

    /// The sg driver's character major (Documentation/admin-guide/devices.txt).
    pub const SG_MAJOR: u32 = 21;

    /// `struct sg_io_v4` of `<linux/bsg.h>`: what SG_IO on a bsg node
    /// takes (pointers as u64, data flat: the SCSI bsg ignores iovec
    /// counts and refuses data both ways).
    #[repr(C)]
    #[derive(Default)]
    struct SgIoV4 {
        guard: i32,
        protocol: u32,
        subprotocol: u32,
        request_len: u32,
        request: u64,
        request_tag: u64,
        request_attr: u32,
        request_priority: u32,
        request_extra: u32,
        max_response_len: u32,
        response: u64,
        dout_iovec_count: u32,
        dout_xfer_len: u32,
        din_iovec_count: u32,
        din_xfer_len: u32,
        dout_xferp: u64,
        din_xferp: u64,
        timeout: u32,
        flags: u32,
        usr_ptr: u64,
        spare_in: u32,
        driver_status: u32,
        transport_status: u32,
        device_status: u32,
        retry_delay: u32,
        info: u32,
        duration: u32,
        response_len: u32,
        din_resid: i32,
        dout_resid: i32,
        generated_tag: u64,
        spare_out: u32,
        padding: u32,
    }

    // The layout of <linux/bsg.h> (offsetof of Debian's header; no pointers,
    // so the same on every ABI).
    const _: () = {
        assert!(std::mem::size_of::<SgIoV4>() == 160);
        assert!(std::mem::offset_of!(SgIoV4, response) == 48);
        assert!(std::mem::offset_of!(SgIoV4, dout_xferp) == 72);
        assert!(std::mem::offset_of!(SgIoV4, timeout) == 88);
        assert!(std::mem::offset_of!(SgIoV4, device_status) == 116);
        assert!(std::mem::offset_of!(SgIoV4, din_resid) == 136);
        assert!(std::mem::offset_of!(SgIoV4, generated_tag) == 144);
    };

    /// An open sg node, or a bsg node.
    pub struct SgDevice {
        file: std::fs::File,
        /// A bsg node: the sysfs directory of its SCSI device (where the
        /// nodes a reset can go through are listed).
        bsg: Option<std::path::PathBuf>,
    }

    /// The sysfs directory of the SCSI device behind bsg node `major:minor`
    /// (`/sys/dev/char/M:m` is `.../H:C:T:L/bsg/H:C:T:L`); `None` when the
    /// node is not a bsg one.
    fn bsg_device_dir(major: u32, minor: u32) -> Option<std::path::PathBuf> {
        let class = std::fs::canonicalize(format!("/sys/dev/char/{major}:{minor}")).ok()?;
        let parent = class.parent()?;
        (parent.file_name()? == "bsg").then(|| parent.parent().map(|p| p.to_path_buf()))?
    }

    /// Why a path cannot be a pass-through device.
    #[derive(Debug, thiserror::Error)]
    pub enum SgOpenError {
        #[error("cannot open {path} read-write: {source}")]
        Open {
            path: String,
            #[source]
            source: std::io::Error,
        },
        #[error("{path} is not a character device: name the sg node of the device (lsscsi -g)")]
        NotChar { path: String },
        #[error(
            "{path} is character device {major}:{minor}, not one of the sg driver (major 21) \
             nor a bsg node: name the sg node of the device (lsscsi -g; modprobe sg) or its \
             /dev/bsg/H:C:T:L node"
        )]
        NotSg {
            path: String,
            major: u32,
            minor: u32,
        },
        #[error("{path}: the node does not answer SG_GET_VERSION_NUM: {source}")]
        NoVersion {
            path: String,
            #[source]
            source: std::io::Error,
        },
    }

    impl SgDevice {
        /// Opens `path` read-write, refusing anything but a node of the sg
        /// driver or a bsg node.
        ///
        /// # Errors
        /// [`SgOpenError`], with what to do.
        pub fn open(path: &std::path::Path) -> Result<SgDevice, SgOpenError> {
            use std::os::unix::fs::{FileTypeExt, MetadataExt};
            let shown = path.display().to_string();
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .map_err(|source| SgOpenError::Open {
                    path: shown.clone(),
                    source,
                })?;
            let meta = file.metadata().map_err(|source| SgOpenError::Open {
                path: shown.clone(),
                source,
            })?;
            if !meta.file_type().is_char_device() {
                return Err(SgOpenError::NotChar { path: shown });
            }
            let rdev = meta.rdev();
            let (major, minor) = (libc::major(rdev), libc::minor(rdev));
            let bsg = if major == SG_MAJOR {
                None
            } else {
                Some(bsg_device_dir(major, minor).ok_or(SgOpenError::NotSg {
                    path: shown.clone(),
                    major,
                    minor,
                })?)
            };
            let mut version: libc::c_int = 0;
            // SAFETY: SG_GET_VERSION_NUM writes one int to the pointer,
            // which points at `version`, alive for the call.
            let r = unsafe { libc::ioctl(file.as_raw_fd(), SG_GET_VERSION_NUM as _, &mut version) };
            if r < 0 {
                return Err(SgOpenError::NoVersion {
                    path: shown,
                    source: std::io::Error::last_os_error(),
                });
            }
            Ok(SgDevice { file, bsg })
        }

        /// Whether this is a bsg node.
        pub fn is_bsg(&self) -> bool {
            self.bsg.is_some()
        }

        /// SG_IO version 4 on a bsg node: one flat buffer, gathered from
        /// the pieces and scattered back when there are several.
        fn execute_bsg(
            &self,
            cdb: &[u8],
            data: Data<'_, '_>,
            timeout_ms: u32,
        ) -> Result<Answer, ExecError> {
            let len = data.len();
            if len > MAX_TRANSFER {
                return Err(ExecError::Refused(std::io::Error::other(
                    "transfer too large",
                )));
            }
            let mut sense = [0u8; MAX_SENSE];
            let mut h = SgIoV4 {
                guard: b'Q' as i32,
                request_len: cdb.len() as u32,
                request: cdb.as_ptr() as u64,
                max_response_len: sense.len() as u32,
                response: sense.as_mut_ptr() as u64,
                timeout: timeout_ms,
                ..SgIoV4::default()
            };
            let mut bounce = Vec::new();
            let mut data = data;
            match &mut data {
                Data::None => {}
                Data::Out(p) => {
                    if let [one] = &p[..] {
                        h.dout_xferp = one.as_ptr() as u64;
                    } else {
                        bounce = p.concat();
                        h.dout_xferp = bounce.as_ptr() as u64;
                    }
                    h.dout_xfer_len = len as u32;
                }
                Data::In(p) => {
                    if let [one] = &mut p[..] {
                        h.din_xferp = one.as_mut_ptr() as u64;
                    } else {
                        bounce = vec![0u8; len];
                        h.din_xferp = bounce.as_mut_ptr() as u64;
                    }
                    h.din_xfer_len = len as u32;
                }
            }
            if len == 0 {
                (h.dout_xfer_len, h.din_xfer_len) = (0, 0);
            }
            // SAFETY: `h` points at the CDB, the sense buffer and one data
            // buffer (a piece of the caller's, borrowed for the call, or
            // `bounce`), each alive and unmoved for the call and at least
            // as long as the header says. The kernel writes data-in only
            // into the din buffer (mutably borrowed or ours) and sense
            // only into `sense` (max_response_len bytes).
            let r = unsafe { libc::ioctl(self.file.as_raw_fd(), SG_IO as _, &mut h) };
            if r < 0 {
                return Err(gone_or(std::io::Error::last_os_error()));
            }
            let host = h.transport_status as u16;
            if host == DID_NO_CONNECT {
                return Err(ExecError::Gone("host status DID_NO_CONNECT".into()));
            }
            let driver = h.driver_status as u16;
            if host != 0 || driver & !DRIVER_SENSE != 0 {
                return Err(ExecError::Transport { host, driver });
            }
            let resid = if h.din_xfer_len > 0 {
                h.din_resid
            } else {
                h.dout_resid
            };
            if let (Data::In(pieces), false) = (&mut data, bounce.is_empty()) {
                let mut at = 0;
                for piece in pieces.iter_mut() {
                    let n = piece.len();
                    piece.copy_from_slice(&bounce[at..at + n]);
                    at += n;
                }
            }
            let written = (h.response_len as usize).min(sense.len());
            Ok(Answer {
                status: h.device_status as u8,
                sense: sense[..written].to_vec(),
                resid: usize::try_from(resid).unwrap_or(0).min(len),
            })
        }

        /// The node a bsg device's reset goes through: its sg node, else
        /// its disk (both take SG_SCSI_RESET; a bsg node does not).
        fn reset_node(dir: &std::path::Path) -> Option<std::path::PathBuf> {
            ["scsi_generic", "block"].iter().find_map(|sub| {
                let name = std::fs::read_dir(dir.join(sub)).ok()?.flatten().next()?;
                Some(std::path::Path::new("/dev").join(name.file_name()))
            })
        }
    }

    fn gone_or(e: std::io::Error) -> ExecError {
        match e.raw_os_error() {
            Some(libc::ENODEV | libc::ENXIO) => ExecError::Gone(e.to_string()),
            Some(libc::EDOM | libc::EAGAIN | libc::EBUSY | libc::ENOMEM | libc::EINTR) => {
                ExecError::Busy(e)
            }
            _ => ExecError::Refused(e),
        }
    }

    impl Executor for SgDevice {
        fn execute(
            &self,
            cdb: &[u8],
            data: Data<'_, '_>,
            timeout_ms: u32,
        ) -> Result<Answer, ExecError> {
            let bad = |m: &str| ExecError::Refused(std::io::Error::other(m.to_string()));
            if cdb.is_empty() || cdb.len() > 255 {
                return Err(bad("CDB length"));
            }
            if self.bsg.is_some() {
                return self.execute_bsg(cdb, data, timeout_ms);
            }
            let len = data.len();
            // The pieces stay borrowed by the caller for the whole call;
            // data-in pointers come from the mutable borrow.
            let (dir, mut iov): (libc::c_int, Vec<libc::iovec>) = match data {
                Data::None => (SG_DXFER_NONE, Vec::new()),
                Data::In(p) => (
                    SG_DXFER_FROM_DEV,
                    p.iter_mut()
                        .map(|b| libc::iovec {
                            iov_base: b.as_mut_ptr().cast(),
                            iov_len: b.len(),
                        })
                        .collect(),
                ),
                Data::Out(p) => (
                    SG_DXFER_TO_DEV,
                    p.iter()
                        .map(|b| libc::iovec {
                            iov_base: b.as_ptr() as *mut libc::c_void,
                            iov_len: b.len(),
                        })
                        .collect(),
                ),
            };
            iov.retain(|v| v.iov_len > 0);
            if iov.len() > MAX_PIECES || len > MAX_TRANSFER {
                return Err(bad("transfer too large"));
            }
            let dir = if iov.is_empty() { SG_DXFER_NONE } else { dir };
            let mut sense = [0u8; MAX_SENSE];
            let mut h = SgIoHdr {
                interface_id: b'S' as libc::c_int,
                dxfer_direction: dir,
                cmd_len: cdb.len() as u8,
                mx_sb_len: sense.len() as u8,
                iovec_count: iov.len() as u16,
                dxfer_len: len as u32,
                dxferp: if iov.is_empty() {
                    std::ptr::null_mut()
                } else {
                    iov.as_mut_ptr().cast()
                },
                cmdp: cdb.as_ptr(),
                sbp: sense.as_mut_ptr(),
                timeout: timeout_ms,
                flags: 0,
                pack_id: 0,
                usr_ptr: std::ptr::null_mut(),
                status: 0,
                masked_status: 0,
                msg_status: 0,
                sb_len_wr: 0,
                host_status: 0,
                driver_status: 0,
                resid: 0,
                duration: 0,
                info: 0,
            };
            // SAFETY: `h` points at the CDB, the sense buffer and the iovec
            // array, whose bases are the caller's pieces: all alive and
            // unmoved for the call, each the length the header says. The
            // kernel writes data-in only into the pieces (borrowed mutably
            // as `Data::In`) and sense only into `sense` (mx_sb_len bytes);
            // data-out pieces are only read.
            let r = unsafe { libc::ioctl(self.file.as_raw_fd(), SG_IO as _, &mut h) };
            if r < 0 {
                return Err(gone_or(std::io::Error::last_os_error()));
            }
            if h.host_status == DID_NO_CONNECT {
                return Err(ExecError::Gone("host status DID_NO_CONNECT".into()));
            }
            if h.host_status != 0 || h.driver_status & !DRIVER_SENSE != 0 {
                return Err(ExecError::Transport {
                    host: h.host_status,
                    driver: h.driver_status,
                });
            }
            let written = (h.sb_len_wr as usize).min(sense.len());
            Ok(Answer {
                status: h.status,
                sense: sense[..written].to_vec(),
                resid: usize::try_from(h.resid).unwrap_or(0).min(len),
            })
        }

        fn reset_device(&self) -> Result<(), ExecError> {
            let other;
            let fd = match &self.bsg {
                None => self.file.as_raw_fd(),
                Some(dir) => {
                    if !dir.exists() {
                        return Err(ExecError::Gone(format!("{} is gone", dir.display())));
                    }
                    let node = Self::reset_node(dir).ok_or_else(|| {
                        ExecError::Refused(std::io::Error::other(
                            "a bsg node cannot reset its device, and the device has no sg or \
                             disk node to do it through (modprobe sg)",
                        ))
                    })?;
                    other = std::fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .custom_flags(libc::O_NONBLOCK)
                        .open(&node)
                        .map_err(gone_or)?;
                    other.as_raw_fd()
                }
            };
            let mut what: libc::c_int = SG_SCSI_RESET_DEVICE;
            // SAFETY: SG_SCSI_RESET reads one int from the pointer, which
            // points at `what`, alive for the call.
            let r = unsafe { libc::ioctl(fd, SG_SCSI_RESET as _, &mut what) };
            if r < 0 {
                return Err(gone_or(std::io::Error::last_os_error()));
            }
            Ok(())
        }
    }
}

pub use sg::{SgOpenError, SG_MAJOR};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_sg_node_opens() {
        let e = SgDevice::open(std::path::Path::new("/dev/null"))
            .err()
            .unwrap();
        assert!(matches!(e, SgOpenError::NotSg { major: 1, .. }), "{e}");
        assert!(e.to_string().contains("major 21"), "{e}");
        let dir = std::env::temp_dir().join(format!("pt-open-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("plain");
        std::fs::write(&file, b"x").unwrap();
        let e = SgDevice::open(&file).err().unwrap();
        assert!(matches!(e, SgOpenError::NotChar { .. }), "{e}");
        let e = SgDevice::open(&dir.join("absent")).err().unwrap();
        match e {
            SgOpenError::Open { source, .. } => {
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound)
            }
            e => panic!("{e}"),
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_devices_port_designators_give_way_to_the_targets() {
        // T10 vendor ID (LU), relative port 3 (01b/4h), group 9 (01b/5h),
        // an NAA of the target port (01b/3h, kept), then a designator
        // whose length runs past the data (dropped: the page was cut).
        let mut d = vec![0x00, 0x83, 0, 0];
        d.extend_from_slice(&[0x02, 0x01, 0, 4, b'A', b'B', b'C', b'D']);
        d.extend_from_slice(&[0x01, 0x14, 0, 4, 0, 0, 0, 3]);
        d.extend_from_slice(&[0x01, 0x15, 0, 4, 0, 0, 0, 9]);
        d.extend_from_slice(&[0x01, 0x13, 0, 8, 0x50, 1, 2, 3, 4, 5, 6, 7]);
        d.extend_from_slice(&[0x01, 0x03, 0, 16, 0x60]);
        let mut out = without_port_designators(&d);
        assert_eq!(&out[4..12], &d[4..12]);
        assert_eq!(&out[12..24], &d[28..40]);
        assert_eq!(out.len(), 24);
        assert_eq!(u16::from_be_bytes([out[2], out[3]]), 20);
        let port = PortView {
            rtpi: 2,
            tpgs: 1,
            group: Some(0x0102),
        };
        add_port_designators(&mut out, port);
        assert_eq!(
            &out[24..],
            &[1, 0x14, 0, 4, 0, 0, 0, 2, 1, 0x15, 0, 4, 0, 0, 1, 2]
        );
        assert_eq!(u16::from_be_bytes([out[2], out[3]]), 36);
        // Less than a header: an empty page.
        assert_eq!(without_port_designators(&[0, 0x83]), [0, 0x83, 0, 0]);
    }

    #[test]
    fn the_transport_decides_direction_and_length() {
        assert_eq!(transfer(&[], None, 0).unwrap(), (DataDir::None, 0));
        assert_eq!(transfer(&[], None, 4096).unwrap(), (DataDir::In, 4096));
        assert_eq!(transfer(&[1; 10], None, 10).unwrap(), (DataDir::Out, 10));
        // Pieces smaller than the expected length bound the data-in.
        let mut a = [0u8; 100];
        let mut p: Vec<&mut [u8]> = vec![&mut a];
        let b = Buffers::data_in(&mut p);
        assert_eq!(transfer(&[], Some(&b), 4096).unwrap(), (DataDir::In, 100));
        let big = MAX_TRANSFER as u64 + 1;
        let s = transfer(&[], None, big).unwrap_err();
        assert_eq!(s.key, SenseKey::IllegalRequest);
        assert_eq!(inquiry_page(&[0x12, 1, 0x80, 0, 255, 0]), Some(Some(0x80)));
        assert_eq!(inquiry_page(&[0x12, 0, 0, 0, 36, 0]), Some(None));
        assert_eq!(inquiry_page(&[0x12, 1]), None, "too short to be an INQUIRY");
    }
}
