//! A logical unit behind an SRP session as a block device.
//!
//! [`Disk::open`] clears the unit attentions a new nexus sees (TEST UNIT
//! READY until GOOD, as the SCSI midlayer's scan does), reads the standard
//! INQUIRY data, the capacity (READ CAPACITY(16)) and the device
//! identification VPD page (0x83), which names the LU across paths and
//! reconnects. Reads and writes are READ(16)/WRITE(16) split at the
//! transfer size; errors carry the decoded sense.
//!
//! A unit attention that says the LUN inventory or a capacity changed is
//! noted on the session ([`Session::note_sense`]) before the command is
//! sent again, for whoever rescans; [`Disk::recheck`] reads the capacity
//! again (and refuses a LUN that became another LU).

use crate::changes::Change;
use crate::session::{Answer, CmdResult, Session, SessionError, Xfer};
use scsi::SenseKey;
use srp::initiator::Status;
use srp::wire::Lun;
use std::io;
use std::sync::Arc;

/// What INQUIRY and READ CAPACITY said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskInfo {
    /// T10 vendor identification.
    pub vendor: String,
    /// Product identification.
    pub product: String,
    /// Product revision.
    pub revision: String,
    /// Logical block size.
    pub block_size: u32,
    /// Number of logical blocks when the LUN was opened ([`Disk::blocks`]
    /// has it now).
    pub blocks: u64,
    /// The NAA designator of VPD page 0x83, if any (hex).
    pub naa: Option<String>,
    /// What the LU says of ALUA on this path, when INQUIRY's TPGS is not
    /// 00b.
    pub alua: Option<PathAlua>,
}

/// ALUA as one path sees it (SPC-4 5.16): INQUIRY's TPGS field and the
/// target port's designators of VPD page 0x83.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathAlua {
    /// TPGS: 01b implicit, 10b explicit, 11b both.
    pub tpgs: u8,
    /// The relative target port identifier of the port this path uses.
    pub relative_port: Option<u16>,
    /// The target port group of that port.
    pub group: Option<u16>,
}

/// A command a target port refused for its asymmetric access state
/// (NOT READY, LOGICAL UNIT NOT ACCESSIBLE 04/0Ah, 04/0Bh, 04/0Ch): the
/// command did not run, so it may be sent down another path (or again,
/// after a transition) without doubt. The payload of the `io::Error`
/// the disk returns; [`alua_refusal`] finds it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: target port {state} (NOT READY, ASC/ASCQ 04/{ascq:02x})")]
pub struct AluaRefusal {
    pub what: String,
    /// The state the sense names: standby, unavailable or transitioning.
    pub state: scsi::AccessState,
    ascq: u8,
}

impl AluaRefusal {
    /// The refusal `sense` reports, if it is one.
    pub fn of_sense(what: &str, sense: &[u8]) -> Option<AluaRefusal> {
        use scsi::{AccessState as S, Asc};
        let (key, asc) = scsi::sense::decode_key_asc(sense)?;
        if key != SenseKey::NotReady {
            return None;
        }
        let state = match asc {
            Asc::LU_NOT_ACCESSIBLE_TRANSITION => S::Transitioning,
            Asc::LU_NOT_ACCESSIBLE_STANDBY => S::Standby,
            Asc::LU_NOT_ACCESSIBLE_UNAVAILABLE => S::Unavailable,
            _ => return None,
        };
        Some(AluaRefusal {
            what: what.to_string(),
            state,
            ascq: asc.1,
        })
    }
}

/// The ALUA refusal an I/O error carries, if any.
pub fn alua_refusal(e: &io::Error) -> Option<AluaRefusal> {
    e.get_ref()?.downcast_ref::<AluaRefusal>().cloned()
}

/// A bound on commands in flight, shared by whoever it limits: one LUN
/// (ib_srp's `max_cmd_per_lun`, the SCSI device's queue depth) or every
/// LUN of one target (`target_can_queue`, the SCSI target's
/// `can_queue`). A command waits for a place before it is sent, as the
/// SCSI midlayer holds a request while the device or target is busy.
#[derive(Debug)]
pub struct QueueLimit {
    max: usize,
    /// (in flight now, most ever in flight).
    st: std::sync::Mutex<(usize, usize)>,
    cv: std::sync::Condvar,
}

/// A place taken in a [`QueueLimit`]; dropping it gives the place back.
#[derive(Debug)]
pub struct QueuePlace<'a>(&'a QueueLimit);

impl QueueLimit {
    /// At most `max` (at least 1) commands in flight.
    pub fn new(max: usize) -> Arc<QueueLimit> {
        Arc::new(QueueLimit {
            max: max.max(1),
            st: std::sync::Mutex::new((0, 0)),
            cv: std::sync::Condvar::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (usize, usize)> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The bound.
    pub fn max(&self) -> usize {
        self.max
    }

    /// The most commands that were ever in flight at once.
    pub fn peak(&self) -> usize {
        self.lock().1
    }

    /// Commands in flight now.
    pub fn in_flight(&self) -> usize {
        self.lock().0
    }

    /// Waits for a place.
    pub fn take(&self) -> QueuePlace<'_> {
        let mut st = self.lock();
        while st.0 >= self.max {
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.0 += 1;
        st.1 = st.1.max(st.0);
        QueuePlace(self)
    }

    /// A place if one is free now.
    pub fn try_take(&self) -> Option<QueuePlace<'_>> {
        let mut st = self.lock();
        if st.0 >= self.max {
            return None;
        }
        st.0 += 1;
        st.1 = st.1.max(st.0);
        Some(QueuePlace(self))
    }
}

impl Drop for QueuePlace<'_> {
    fn drop(&mut self) {
        let mut st = self.0.lock();
        st.0 -= 1;
        drop(st);
        self.0.cv.notify_one();
    }
}

/// A LUN as a block device, over one channel or several (ib_srp's
/// `ch_count`: channels of one I_T nexus, I/O spread round robin).
pub struct Disk {
    session: Arc<Session>,
    /// Every channel, `session` first.
    channels: Vec<Arc<Session>>,
    next: std::sync::atomic::AtomicUsize,
    lun: Lun,
    info: DiskInfo,
    /// Logical blocks now: READ CAPACITY at open, again at each
    /// [`Disk::recheck`].
    blocks: std::sync::atomic::AtomicU64,
    max_transfer: usize,
    /// Commands in flight on this LUN (`max_cmd_per_lun`).
    lun_queue: Option<Arc<QueueLimit>>,
    /// Commands in flight on every LUN of the target (`target_can_queue`).
    target_queue: Option<Arc<QueueLimit>>,
}

/// Places taken for one command (LUN first, then target, so two LUNs
/// never hold each other's).
struct Places<'a>(
    #[allow(dead_code)] Option<QueuePlace<'a>>,
    #[allow(dead_code)] Option<QueuePlace<'a>>,
);

/// A SCSI command that did not end GOOD, in words.
pub fn describe(r: &CmdResult) -> String {
    use scsi::Status as S;
    let code = match r.status {
        Status::Scsi(code) => code,
        Status::Aborted => return "aborted by the error handler".into(),
        Status::Reset => return "ended by a reset".into(),
        Status::TransportFailed => return "transport failed".into(),
    };
    match S::from_code(code) {
        Some(S::CheckCondition) if r.sense.len() >= 14 => {
            let (key, asc, ascq) = sense_triple(&r.sense);
            format!("CHECK CONDITION, sense key {key:#x}, ASC/ASCQ {asc:#04x}/{ascq:#04x}")
        }
        Some(S::CheckCondition) => "CHECK CONDITION without sense data".into(),
        Some(S::Busy) => "BUSY".into(),
        Some(S::ReservationConflict) => "RESERVATION CONFLICT".into(),
        Some(S::TaskSetFull) => "TASK SET FULL".into(),
        Some(S::TaskAborted) => "TASK ABORTED".into(),
        Some(S::ConditionMet) => "CONDITION MET".into(),
        Some(S::Good | S::AcaActive) | None => format!("SCSI status {code:#04x}"),
    }
}

/// Sense key, ASC, ASCQ of fixed or descriptor sense data (zeroes when
/// there is too little of it), as [`scsi::sense::decode_key_asc`] reads them.
pub fn sense_triple(s: &[u8]) -> (u8, u8, u8) {
    scsi::sense::decode_key_asc(s).map_or((0, 0, 0), |(key, asc)| (key.into(), asc.0, asc.1))
}

/// The sense key of a command's sense data; NO SENSE when it has none.
fn sense_key(sense: &[u8]) -> SenseKey {
    scsi::sense::decode_key_asc(sense).map_or(SenseKey::NoSense, |(key, _)| key)
}

/// `status` is the SCSI status `s`.
fn is_scsi(status: Status, s: scsi::Status) -> bool {
    status == Status::Scsi(s.code())
}

/// A command's bad ending as an I/O error of `kind`, except that one
/// ended by its channel's failure is in doubt ([`crate::fence`]), which
/// [`crate::remote::RemoteDisk`] reconnects on.
fn status_error(what: &str, r: &CmdResult, kind: io::ErrorKind) -> io::Error {
    let msg = format!("{what}: {}", describe(r));
    if r.status == Status::TransportFailed {
        crate::fence::in_doubt(msg)
    } else {
        io::Error::new(kind, msg)
    }
}

/// Session errors as I/O errors; a lost connection is `ConnectionAborted`
/// (what [`crate::remote::RemoteDisk`] reconnects on).
fn io_err(what: &str, e: SessionError) -> io::Error {
    let kind = match e {
        SessionError::Closed | SessionError::Submit(srp::initiator::SubmitError::NotLoggedIn) => {
            io::ErrorKind::ConnectionAborted
        }
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, format!("{what}: {e}"))
}

impl Disk {
    /// Opens LUN `lun` (single-level, as REPORT LUNS numbers it).
    pub fn open(session: Arc<Session>, lun: u16) -> io::Result<Disk> {
        let lun = Lun::from_u64((lun as u64) << 48);
        // A new nexus gets POWER ON / LUNS CHANGED unit attentions; clear them.
        let mut ready = false;
        for _ in 0..8 {
            let r = session
                .execute(lun, &[0u8; 6], Xfer::None)
                .map_err(|e| io_err("TEST UNIT READY", e))?;
            if r.good() {
                ready = true;
                break;
            }
            session.note_sense(&r.sense);
            if AluaRefusal::of_sense("TEST UNIT READY", &r.sense).is_some() {
                // The LU is there; this port's group does not serve media
                // access now (standby, unavailable, in transition). The
                // path opens, and a multipath device routes by the state.
                ready = true;
                break;
            }
            if sense_key(&r.sense) != SenseKey::UnitAttention {
                return Err(io::Error::other(format!(
                    "LUN {} not ready: {}",
                    lun.to_u64() >> 48,
                    describe(&r)
                )));
            }
        }
        if !ready {
            return Err(io::Error::other("unit attentions do not clear"));
        }
        let inq = Self::cmd(
            &session,
            lun,
            &[0x12, 0, 0, 0, 96, 0],
            Xfer::In(96),
            "INQUIRY",
            None,
        )?;
        let text = |r: std::ops::Range<usize>| {
            String::from_utf8_lossy(inq.data.get(r).unwrap_or(&[]))
                .trim()
                .to_string()
        };
        let (blocks, block_size) = Self::read_capacity(&session, lun)?;
        let vpd83 = Self::vpd83(&session, lun);
        let naa = vpd83.as_deref().and_then(naa_of);
        // SPC-4 6.6.2: TPGS, byte 5 bits 5..4.
        let tpgs = inq.data.get(5).map_or(0, |b| (b >> 4) & 3);
        let alua = (tpgs != 0).then(|| {
            let (relative_port, group) = vpd83.as_deref().map_or((None, None), port_designators);
            PathAlua {
                tpgs,
                relative_port,
                group,
            }
        });
        // Like sd: the block limits page's MAXIMUM TRANSFER LENGTH caps one
        // command, and so does what the descriptors of one SRP_CMD can
        // describe (sg_tablesize = cmd_sg_entries without external tables).
        let mut max_transfer = 1usize << 20;
        if let Ok(b0) = Self::cmd(
            &session,
            lun,
            &[0x12, 1, 0xb0, 0, 64, 0],
            Xfer::In(64),
            "VPD B0",
            None,
        ) {
            if b0.data.len() >= 12 {
                let blocks = u32::from_be_bytes(b0.data[8..12].try_into().expect("4 bytes"));
                if blocks > 0 {
                    max_transfer = blocks as usize * block_size as usize;
                }
            }
        }
        if let Some(cap) = session.max_transfer_by_segments() {
            max_transfer = max_transfer.min(cap);
        }
        Ok(Disk {
            info: DiskInfo {
                vendor: text(8..16),
                product: text(16..32),
                revision: text(32..36),
                block_size,
                blocks,
                naa,
                alua,
            },
            blocks: std::sync::atomic::AtomicU64::new(blocks),
            channels: vec![session.clone()],
            next: std::sync::atomic::AtomicUsize::new(0),
            session,
            lun,
            max_transfer,
            lun_queue: None,
            target_queue: None,
        })
    }

    /// Bounds the commands in flight: `lun` for this LUN alone (ib_srp's
    /// `max_cmd_per_lun`), `target` shared by every LUN of the target
    /// (`target_can_queue`). Keep the same limits across reconnects by
    /// giving each new `Disk` of the LUN the same `Arc`s.
    pub fn with_queue_limits(
        mut self,
        lun: Option<Arc<QueueLimit>>,
        target: Option<Arc<QueueLimit>>,
    ) -> Disk {
        self.lun_queue = lun;
        self.target_queue = target;
        self
    }

    /// The per-LUN bound, if any.
    pub fn lun_queue(&self) -> Option<&Arc<QueueLimit>> {
        self.lun_queue.as_ref()
    }

    /// Waits for a place for one command.
    fn places(&self) -> Places<'_> {
        let lun = self.lun_queue.as_deref().map(QueueLimit::take);
        let target = self.target_queue.as_deref().map(QueueLimit::take);
        Places(lun, target)
    }

    /// A place for one command if both limits have one free now.
    fn try_places(&self) -> Option<Places<'_>> {
        let lun = match self.lun_queue.as_deref() {
            Some(q) => Some(q.try_take()?),
            None => None,
        };
        let target = match self.target_queue.as_deref() {
            Some(q) => Some(q.try_take()?),
            None => None,
        };
        Some(Places(lun, target))
    }

    /// READ CAPACITY(16) (SBC-3 5.16): blocks and block size.
    fn read_capacity(session: &Session, lun: Lun) -> io::Result<(u64, u32)> {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x9e;
        cdb[1] = 0x10;
        cdb[13] = 32;
        let cap = Self::cmd(session, lun, &cdb, Xfer::In(32), "READ CAPACITY(16)", None)?;
        if cap.data.len() < 12 {
            return Err(io::Error::other(
                "READ CAPACITY(16) returned too little data",
            ));
        }
        let last = u64::from_be_bytes(cap.data[0..8].try_into().expect("8 bytes"));
        let block_size = u32::from_be_bytes(cap.data[8..12].try_into().expect("4 bytes"));
        if block_size == 0 || !block_size.is_multiple_of(512) {
            return Err(io::Error::other(format!(
                "unusable block size {block_size}"
            )));
        }
        Ok((last.saturating_add(1), block_size))
    }

    /// The NAA designator of the device identification VPD page, if any.
    fn naa(session: &Session, lun: Lun) -> Option<String> {
        Self::vpd83(session, lun).as_deref().and_then(naa_of)
    }

    /// The device identification VPD page (0x83), if it could be read.
    fn vpd83(session: &Session, lun: Lun) -> Option<Vec<u8>> {
        Self::cmd(
            session,
            lun,
            &[0x12, 1, 0x83, 1, 0, 0],
            Xfer::In(256),
            "INQUIRY VPD 0x83",
            None,
        )
        .ok()
        .map(|v| v.data)
    }

    /// REPORT TARGET PORT GROUPS (SPC-4 6.36, extended header): the
    /// target port groups and their states as the target says now.
    ///
    /// # Errors
    /// The command failed (a target without ALUA refuses it) or its data
    /// does not parse.
    pub fn report_target_port_groups(&self) -> io::Result<Vec<scsi::alua::ReportedGroup>> {
        let alloc: u32 = 4096;
        let mut cdb = [0u8; 12];
        cdb[0] = 0xa3;
        cdb[1] = 0x20 | 0x0a; // PARAMETER DATA FORMAT 001b, SERVICE ACTION 0Ah
        cdb[6..10].copy_from_slice(&alloc.to_be_bytes());
        let r = Self::cmd(
            &self.session,
            self.lun,
            &cdb,
            Xfer::In(alloc as usize),
            "REPORT TARGET PORT GROUPS",
            None,
        )?;
        scsi::alua::parse_report(&r.data)
            .map(|(groups, _)| groups)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// ASYMMETRIC ACCESS STATE CHANGED unit attentions the disk's
    /// channels met (see [`Session::alua_changes`]).
    pub fn alua_changes(&self) -> u64 {
        self.channels.iter().map(|c| c.alua_changes()).sum()
    }

    /// Logical blocks now (see [`Disk::recheck`]).
    pub fn blocks(&self) -> u64 {
        self.blocks.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Looks at the LU again, as a rescan does: the identification must
    /// be the one it had at open, and the capacity is read again (I/O is
    /// bounded by the new one from now on). Returns the blocks now.
    ///
    /// # Errors
    /// The commands failed; `NotFound` when the LUN now names another LU
    /// (another NAA designator) or has another block size: it is not this
    /// disk any more.
    pub fn recheck(&self) -> io::Result<u64> {
        let n = self.lun.to_u64() >> 48;
        let naa = Self::naa(&self.session, self.lun);
        if naa != self.info.naa {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "LUN {n} is another LU now (NAA {naa:?}, was {:?})",
                    self.info.naa
                ),
            ));
        }
        let (blocks, bs) = Self::read_capacity(&self.session, self.lun)?;
        if bs != self.info.block_size {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "LUN {n} has {bs}-byte blocks now, was {}",
                    self.info.block_size
                ),
            ));
        }
        self.blocks
            .store(blocks, std::sync::atomic::Ordering::Relaxed);
        Ok(blocks)
    }

    /// Runs one command, retried as the midlayer retries it. With
    /// `follow`, a CAPACITY DATA HAS CHANGED unit attention on the way
    /// makes it read the capacity again into `follow` once the command is
    /// through: the disk's own I/O keeps its size current without a rescan.
    fn cmd(
        session: &Session,
        lun: Lun,
        cdb: &[u8],
        mut xfer: Xfer<'_>,
        what: &str,
        follow: Option<&std::sync::atomic::AtomicU64>,
    ) -> io::Result<CmdResult> {
        let mut resized = false;
        // As the SCSI midlayer does: a command ended by a reset or an
        // abort, or refused with a unit attention (the reset's, a LUN inventory or
        // capacity change), is sent again, a bounded number of times.
        let mut tries = 0;
        loop {
            let r = if tries == 0 {
                session.execute(lun, cdb, xfer.reborrow())
            } else {
                session.execute_retry(lun, cdb, xfer.reborrow(), srp::wire::TaskAttr::Simple)
            }
            .map_err(|e| io_err(what, e))?;
            if r.good() {
                if let (true, Some(blocks)) = (resized, follow) {
                    if let Ok((b, _)) = Self::read_capacity(session, lun) {
                        blocks.store(b, std::sync::atomic::Ordering::Relaxed);
                    }
                }
                return Ok(r);
            }
            // An aborted command is retried too, as the midlayer retries
            // a command its error handler aborted after a timeout.
            let retry = match r.status {
                Status::Reset | Status::Aborted => true,
                s if is_scsi(s, scsi::Status::TaskAborted) => true,
                s if is_scsi(s, scsi::Status::CheckCondition) => {
                    session.note_sense(&r.sense);
                    resized |= Change::of_sense(&r.sense) == Some(Change::Capacity);
                    sense_key(&r.sense) == SenseKey::UnitAttention
                }
                _ => false,
            };
            tries += 1;
            if !retry || tries > 5 {
                if let Some(a) = AluaRefusal::of_sense(what, &r.sense) {
                    return Err(io::Error::other(a));
                }
                return Err(status_error(what, &r, io::ErrorKind::Other));
            }
        }
    }

    /// INQUIRY and capacity.
    pub fn info(&self) -> &DiskInfo {
        &self.info
    }

    /// The session underneath (channel 0).
    pub fn session(&self) -> &Arc<Session> {
        &self.session
    }

    /// Adds channels of the same I_T nexus (logged in MULTI after the
    /// first); I/O goes round robin over all of them.
    pub fn with_channels(mut self, more: impl IntoIterator<Item = Arc<Session>>) -> Disk {
        self.channels.extend(more);
        self
    }

    /// Every channel, channel 0 first.
    pub fn channels(&self) -> &[Arc<Session>] {
        &self.channels
    }

    /// Whether any channel has closed or failed: the nexus needs a new
    /// login (Linux reconnects all channels of a target port together).
    pub fn any_channel_closed(&self) -> bool {
        self.channels.iter().any(|s| s.is_closed())
    }

    /// The channel for the next command.
    fn pick(&self) -> &Session {
        let n = self.channels.len();
        if n == 1 {
            return &self.session;
        }
        let k = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        &self.channels[k % n]
    }

    /// Largest single READ/WRITE, in bytes (rounded down to blocks).
    pub fn max_transfer(&self) -> usize {
        self.max_transfer
    }

    /// Lowers the largest single READ/WRITE (the `max_sect` login key).
    pub fn limit_transfer(&mut self, bytes: usize) {
        let bs = self.info.block_size as usize;
        self.max_transfer = (self.max_transfer.min(bytes) / bs).max(1) * bs;
    }

    fn rw16(&self, write: bool, lba: u64, blocks: u32) -> [u8; 16] {
        let mut cdb = [0u8; 16];
        cdb[0] = if write { 0x8a } else { 0x88 };
        cdb[2..10].copy_from_slice(&lba.to_be_bytes());
        cdb[10..14].copy_from_slice(&blocks.to_be_bytes());
        cdb
    }

    fn check_range(&self, lba: u64, len: usize) -> io::Result<u32> {
        let bs = self.info.block_size as usize;
        if !len.is_multiple_of(bs) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{len} bytes is not a whole number of {bs}-byte blocks"),
            ));
        }
        let blocks = (len / bs) as u64;
        let end_now = self.blocks();
        if lba.checked_add(blocks).is_none_or(|end| end > end_now) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("blocks {lba}+{blocks} are beyond the end ({end_now})"),
            ));
        }
        Ok(blocks as u32)
    }

    /// Reads `buf.len()` bytes from block `lba`.
    pub fn read(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check_range(lba, buf.len())?;
        let bs = self.info.block_size as usize;
        let step = (self.max_transfer / bs).max(1) * bs;
        for (i, chunk) in buf.chunks_mut(step).enumerate() {
            let at = lba + (i * step / bs) as u64;
            let cdb = self.rw16(false, at, (chunk.len() / bs) as u32);
            let want = chunk.len();
            let _places = self.places();
            let r = Self::cmd(
                self.pick(),
                self.lun,
                &cdb,
                Xfer::InTo(chunk),
                "READ(16)",
                Some(&self.blocks),
            )?;
            if let Some(srp::initiator::Residual::Under(n)) = r.residual {
                if n > 0 {
                    return Err(io::Error::other(format!(
                        "READ(16) returned {} of {want} bytes",
                        want.saturating_sub(n as usize)
                    )));
                }
            }
        }
        Ok(())
    }

    /// Writes `data` at block `lba`.
    pub fn write(&self, lba: u64, data: &[u8]) -> io::Result<()> {
        self.check_range(lba, data.len())?;
        let bs = self.info.block_size as usize;
        let step = (self.max_transfer / bs).max(1) * bs;
        for (i, chunk) in data.chunks(step).enumerate() {
            let at = lba + (i * step / bs) as u64;
            let cdb = self.rw16(true, at, (chunk.len() / bs) as u32);
            let _places = self.places();
            Self::cmd(
                self.pick(),
                self.lun,
                &cdb,
                Xfer::Out(chunk),
                "WRITE(16)",
                Some(&self.blocks),
            )?;
        }
        Ok(())
    }

    /// UNMAP of `blocks` blocks from `lba` (SBC-3 5.28), split into
    /// descriptors of at most 2^32-1 blocks. A target without thin
    /// provisioning refuses it with ILLEGAL REQUEST, reported as
    /// `Unsupported`.
    pub fn unmap(&self, lba: u64, blocks: u64) -> io::Result<()> {
        if blocks == 0 {
            return Ok(());
        }
        let end = lba
            .checked_add(blocks)
            .filter(|e| *e <= self.blocks())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "UNMAP beyond the end"))?;
        let mut at = lba;
        while at < end {
            // One descriptor per command keeps within any target's
            // MAXIMUM UNMAP BLOCK DESCRIPTOR COUNT.
            let n = (end - at).min(u32::MAX as u64 >> 1);
            let list = unmap_list(at, n as u32);
            let cdb = [0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0];
            let _places = self.places();
            let r = self
                .pick()
                .execute(self.lun, &cdb, Xfer::Out(&list))
                .map_err(|e| io_err("UNMAP", e))?;
            if !r.good() {
                let kind = if sense_key(&r.sense) == SenseKey::IllegalRequest {
                    io::ErrorKind::Unsupported
                } else {
                    io::ErrorKind::Other
                };
                return Err(status_error("UNMAP", &r, kind));
            }
            at += n;
        }
        Ok(())
    }

    /// SYNCHRONIZE CACHE(10) over the whole LU.
    pub fn flush(&self) -> io::Result<()> {
        let _places = self.places();
        Self::cmd(
            &self.session,
            self.lun,
            &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            Xfer::None,
            "SYNCHRONIZE CACHE",
            Some(&self.blocks),
        )
        .map(|_| ())
    }
}

/// The UNMAP parameter list of one block descriptor (SBC-3 5.28.2).
fn unmap_list(lba: u64, blocks: u32) -> [u8; 24] {
    let mut list = [0u8; 24];
    list[0..2].copy_from_slice(&22u16.to_be_bytes());
    list[2..4].copy_from_slice(&16u16.to_be_bytes());
    list[8..16].copy_from_slice(&lba.to_be_bytes());
    list[16..20].copy_from_slice(&blocks.to_be_bytes());
    list
}

/// The relative target port identifier and target port group
/// designators (association 01b, types 4h and 5h, SPC-4 7.8.6.5 and
/// 7.8.6.7) of a device identification VPD page.
pub(crate) fn port_designators(page: &[u8]) -> (Option<u16>, Option<u16>) {
    let (mut rel, mut group) = (None, None);
    let Some(len) = page
        .get(2..4)
        .map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
    else {
        return (None, None);
    };
    let body = page.get(4..(4 + len).min(page.len())).unwrap_or(&[]);
    let mut at = 0;
    while at + 4 <= body.len() {
        let dlen = body[at + 3] as usize;
        let Some(d) = body.get(at + 4..at + 4 + dlen) else {
            break;
        };
        let assoc_target_port = body[at + 1] & 0x30 == 0x10;
        if assoc_target_port && dlen == 4 {
            let v = u16::from_be_bytes([d[2], d[3]]);
            match body[at + 1] & 0x0f {
                4 => rel = Some(v),
                5 => group = Some(v),
                _ => {}
            }
        }
        at += 4 + dlen;
    }
    (rel, group)
}

/// The first NAA designator of a device identification VPD page, in hex.
pub(crate) fn naa_of(page: &[u8]) -> Option<String> {
    let len = u16::from_be_bytes([*page.get(2)?, *page.get(3)?]) as usize;
    let body = page.get(4..(4 + len).min(page.len()))?;
    let mut at = 0;
    while at + 4 <= body.len() {
        let dlen = body[at + 3] as usize;
        let kind = body[at + 1] & 0x0f;
        let d = body.get(at + 4..at + 4 + dlen)?;
        if kind == 3 {
            return Some(d.iter().map(|b| format!("{b:02x}")).collect());
        }
        at += 4 + dlen;
    }
    None
}

impl blockload::BlockDevice for Disk {
    fn block_size(&self) -> u32 {
        self.info.block_size
    }
    fn num_blocks(&self) -> u64 {
        self.blocks()
    }
    fn read_at(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
        self.read(lba, buf)
    }
    fn write_at(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
        self.write(lba, buf)
    }
    fn flush(&self) -> io::Result<()> {
        Disk::flush(self)
    }
    fn unmap(&self, lba: u64, blocks: u64) -> io::Result<()> {
        Disk::unmap(self, lba, blocks)
    }
    fn queue(&self, depth: usize) -> Option<Box<dyn blockload::IoQueue + '_>> {
        Some(Box::new(DiskQueue {
            disk: self,
            session: self.pick(),
            slots: (0..depth).map(|_| None).collect(),
            kept: (0..depth).map(|_| None).collect(),
            ready: std::collections::VecDeque::new(),
            turn: 0,
        }))
    }
}

/// What a [`DiskQueue`] slot's command does.
enum Op {
    /// READ(16) of `len` bytes; `in_place`: its data stays in the
    /// session's pool ([`blockload::IoQueue::start_read_in_place`]).
    Read { in_place: bool },
    /// WRITE(16) of `len` bytes from the slot's buffer, which holds them
    /// until the slot completes (for a retry after a reset or abort).
    Write,
    /// SYNCHRONIZE CACHE(10).
    Flush,
    /// UNMAP with this parameter list (boxed: a slot's command stays
    /// small enough to be moved without a call to memcpy).
    Unmap(Box<[u8; 24]>),
}

impl Op {
    fn name(&self) -> &'static str {
        match self {
            Op::Read { .. } => "READ(16)",
            Op::Write => "WRITE(16)",
            Op::Flush => "SYNCHRONIZE CACHE",
            Op::Unmap(_) => "UNMAP",
        }
    }
}

/// One command of a [`DiskQueue`] slot.
struct Queued<'a> {
    started: crate::session::Started,
    cdb: [u8; 16],
    /// The CDB's length (10 or 16 bytes).
    cdb_len: u8,
    /// Its bytes are the started command's (`Started::data_len`).
    op: Op,
    /// Its places in the LUN's and the target's queue limits.
    _places: Places<'a>,
}

/// Several commands in flight on one channel from one thread
/// ([`Session::start`] / [`Session::wait_any`]): no thread per command and
/// no wake-up per command but the caller's own.
struct DiskQueue<'a> {
    disk: &'a Disk,
    session: &'a Session,
    slots: Vec<Option<Queued<'a>>>,
    /// Per slot, the data of its last read in place, in the pool until
    /// the slot starts again.
    kept: Vec<Option<crate::session::Kept>>,
    /// Slots that ended before `complete_one` was asked (refused at
    /// start, or finished early to free a place in a queue limit), with
    /// the data of a read finished early.
    ready: std::collections::VecDeque<(usize, Ended)>,
    /// The slot after the one whose answer was taken last: where the next
    /// look for an answer starts. Answers mostly come in the order the
    /// commands went, so the look mostly ends at its first slot.
    turn: usize,
}

/// How a command that ended before `complete_one` stands.
enum Ended {
    /// Its outcome, and a read's data.
    Done(io::Result<()>, Option<Vec<u8>>),
    /// A write to send again (after a reset or an abort) once its slot's
    /// buffer is at hand: `complete_one` has it, `finish_early` does not.
    Resend(Resend),
}

/// A WRITE(16) to send again from its slot's buffer.
struct Resend {
    cdb: [u8; 16],
    cdb_len: u8,
    len: usize,
}

impl<'a> DiskQueue<'a> {
    fn check_slot(&self, slot: usize) -> io::Result<()> {
        if self.slots.get(slot).is_none_or(|s| s.is_some())
            || (!self.ready.is_empty() && self.ready.iter().any(|(s, _)| *s == slot))
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("slot {slot} is busy or out of range"),
            ));
        }
        Ok(())
    }

    /// A place in the queue limits for `slot`'s command: while this
    /// queue holds some, end one of its own commands rather than wait for
    /// itself. The slot's kept read data goes before this waits for other
    /// threads.
    fn take_places(&mut self, slot: usize) -> Places<'a> {
        let disk: &'a Disk = self.disk;
        loop {
            if let Some(p) = disk.try_places() {
                return p;
            }
            if !self.finish_early() {
                self.kept[slot] = None;
                return disk.places();
            }
        }
    }

    /// Sends `cdb` with `xfer` for `op` in `slot`. The slot's kept read
    /// data (of its last command) goes as it starts again: its pages are
    /// given back under the start's hold of the session lock. The ways of
    /// starting a slot that do not come here drop it themselves.
    /// `cdb` is the CDB's first `cdb_len` bytes, kept whole as the slot
    /// keeps it (no copy of a slice of a length known only at run time).
    fn send(
        &mut self,
        slot: usize,
        (cdb, cdb_len): ([u8; 16], u8),
        xfer: &Xfer<'_>,
        op: Op,
    ) -> io::Result<()> {
        let places = self.take_places(slot);
        // Sent with the others started before this queue next waits.
        let started = self.session.start_batched_after(
            self.kept[slot].as_mut(),
            self.disk.lun,
            &cdb[..usize::from(cdb_len)],
            xfer,
            srp::wire::TaskAttr::Simple,
        );
        // Left with no pages (or none to begin with).
        self.kept[slot] = None;
        let started = started.map_err(|e| io_err(op.name(), e))?;
        self.slots[slot] = Some(Queued {
            started,
            cdb,
            cdb_len,
            op,
            _places: places,
        });
        Ok(())
    }

    /// SYNCHRONIZE CACHE(10) over the whole LU, started.
    fn start_flush(&mut self, slot: usize) -> io::Result<()> {
        self.check_slot(slot)?;
        let mut cdb = [0; 16];
        cdb[0] = 0x35;
        self.send(slot, (cdb, 10), &Xfer::None, Op::Flush)
    }

    /// UNMAP of one descriptor, started; a range one descriptor cannot
    /// hold goes the synchronous way ([`Disk::unmap`]).
    fn start_unmap(&mut self, slot: usize, lba: u64, blocks: u64) -> io::Result<()> {
        self.check_slot(slot)?;
        if lba
            .checked_add(blocks)
            .is_none_or(|end| end > self.disk.blocks())
        {
            self.kept[slot] = None;
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "UNMAP beyond the end",
            ));
        }
        if blocks == 0 || blocks > u64::from(u32::MAX >> 1) {
            self.kept[slot] = None;
            while self.finish_early() {}
            let r = self.disk.unmap(lba, blocks);
            self.ready.push_back((slot, Ended::Done(r, None)));
            return Ok(());
        }
        let list = Box::new(unmap_list(lba, blocks as u32));
        let mut cdb = [0; 16];
        cdb[0] = 0x42;
        cdb[8] = 24;
        let xfer_list = *list;
        self.send(slot, (cdb, 10), &Xfer::Out(&xfer_list), Op::Unmap(list))
    }

    fn start(
        &mut self,
        slot: usize,
        write: bool,
        lba: u64,
        len: usize,
        data: Option<&[u8]>,
        in_place: bool,
    ) -> io::Result<()> {
        self.check_slot(slot)?;
        let blocks = match self.disk.check_range(lba, len) {
            Ok(b) => b,
            Err(e) => {
                self.kept[slot] = None;
                return Err(e);
            }
        };
        if len > self.disk.max_transfer {
            // Larger than one command: the plain path splits it (and
            // waits for places this queue may hold: give them back first).
            self.kept[slot] = None;
            while self.finish_early() {}
            let r = match data {
                Some(d) => self.disk.write(lba, d),
                None => Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "a queued read larger than one command",
                )),
            };
            self.ready.push_back((slot, Ended::Done(r, None)));
            return Ok(());
        }
        let cdb = self.disk.rw16(write, lba, blocks);
        let (xfer, op) = match data {
            // Not copied: a retry after a reset or an abort sends the
            // slot's buffer again (`IoQueue::start_write`).
            Some(d) => (Xfer::Out(d), Op::Write),
            None => (Xfer::In(len), Op::Read { in_place }),
        };
        self.send(slot, (cdb, 16), &xfer, op)
    }

    /// Waits until one of this queue's commands has its answer; its slot
    /// and the answer, taken, or `None` when none is in flight.
    fn wait_any(&mut self) -> Option<(usize, Answer)> {
        let n = self.slots.len();
        let turn = self.turn.min(n);
        let slots = &self.slots;
        // Slots turn..n, then 0..turn (a `chain` of the two cost more).
        let (slot, answer) = self
            .session
            .wait_any_answer((turn..turn + n).filter_map(|i| {
                let i = if i >= n { i - n } else { i };
                slots[i].as_ref().map(|q| (i, &q.started))
            }))?;
        self.turn = slot + 1;
        Some((slot, answer))
    }

    /// Waits for one of this queue's commands and keeps its outcome (and
    /// a read's data) for `complete_one`; false when none is in flight.
    fn finish_early(&mut self) -> bool {
        let Some((slot, answer)) = self.wait_any() else {
            return false;
        };
        let Some(q) = self.slots[slot].take() else {
            return false;
        };
        let mut data = matches!(q.op, Op::Read { .. }).then(|| vec![0u8; q.started.data_len()]);
        let mut kept = None;
        let ended = match self.finish(q, answer, data.as_deref_mut(), &mut kept) {
            // Kept in the pool: no data to copy at completion.
            Ok(r) if kept.is_some() => Ended::Done(r, None),
            Ok(r) => Ended::Done(r, data),
            Err(resend) => Ended::Resend(resend),
        };
        self.kept[slot] = kept;
        self.ready.push_back((slot, ended));
        true
    }

    /// Ends command `q`, whose answer is `answer`, with `buf`, its slot's
    /// buffer when at hand: a read lands there, a write to retry is sent
    /// again from there. A write to retry without it comes back as `Err`,
    /// for [`Self::resend`]. A read in place that succeeded leaves its
    /// data in the pool, in `kept` (retried, it lands in `buf` after all).
    fn finish(
        &self,
        q: Queued<'_>,
        answer: Answer,
        buf: Option<&mut [u8]>,
        kept: &mut Option<crate::session::Kept>,
    ) -> Result<io::Result<()>, Resend> {
        let what = q.op.name();
        let reading = matches!(q.op, Op::Read { .. });
        let len = q.started.data_len();
        let (mut xfer, source) = match (reading, buf) {
            (true, Some(b)) => {
                let n = len.min(b.len());
                (Xfer::InTo(&mut b[..n]), None)
            }
            (true, None) => (Xfer::In(len), None),
            (false, b) => (Xfer::None, b),
        };
        let r = match q.op {
            Op::Read { in_place: true } => {
                let (r, k) = self.session.finish_kept_answered(q.started, answer);
                *kept = k;
                r
            }
            _ => self
                .session
                .finish_answered(q.started, answer, xfer.reborrow()),
        };
        if let (Op::Unmap(_), false) = (&q.op, r.good()) {
            // No thin provisioning: ILLEGAL REQUEST, as Disk::unmap says.
            if is_scsi(r.status, scsi::Status::CheckCondition)
                && sense_key(&r.sense) == SenseKey::IllegalRequest
            {
                return Ok(Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("UNMAP: {}", describe(&r)),
                )));
            }
        }
        if r.good() {
            if let Some(srp::initiator::Residual::Under(n)) = r.residual {
                if n > 0 && reading {
                    *kept = None;
                    return Ok(Err(io::Error::other(format!(
                        "READ(16) returned {} of {} bytes",
                        len.saturating_sub(n as usize),
                        len
                    ))));
                }
            }
            return Ok(Ok(()));
        }
        // The channel failed under it: in doubt, and nothing to retry on.
        if r.status == Status::TransportFailed {
            return Ok(Err(status_error(what, &r, io::ErrorKind::Other)));
        }
        // Not GOOD: the synchronous path retries what the midlayer would
        // (a reset, an abort, a unit attention) and reports the rest.
        let retry = match (&q.op, xfer) {
            (Op::Write, _) => {
                let resend = Resend {
                    cdb: q.cdb,
                    cdb_len: q.cdb_len,
                    len,
                };
                return match source {
                    Some(b) => Ok(self.resend(&resend, b)),
                    None => Err(resend),
                };
            }
            (Op::Unmap(d), _) => Xfer::Out(&d[..]),
            (_, x) => x,
        };
        Ok(self.retry(&q.cdb[..usize::from(q.cdb_len)], retry, what))
    }

    /// Sends `what` again the synchronous way.
    fn retry(&self, cdb: &[u8], xfer: Xfer<'_>, what: &str) -> io::Result<()> {
        Disk::cmd(
            self.session,
            self.disk.lun,
            cdb,
            xfer,
            what,
            Some(&self.disk.blocks),
        )
        .map(|_| ())
    }

    /// Sends a write again from `data`, its slot's buffer, which holds the
    /// bytes first sent ([`blockload::IoQueue::start_write`]).
    fn resend(&self, w: &Resend, data: &[u8]) -> io::Result<()> {
        let Some(d) = data.get(..w.len) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "WRITE(16) to send again: its slot's buffer holds {} bytes, not the {} first sent",
                    data.len(),
                    w.len
                ),
            ));
        };
        self.retry(&w.cdb[..usize::from(w.cdb_len)], Xfer::Out(d), "WRITE(16)")
    }
}

impl blockload::IoQueue for DiskQueue<'_> {
    fn start_read(&mut self, slot: usize, lba: u64, len: usize) -> io::Result<()> {
        self.start(slot, false, lba, len, None, false)
    }
    fn start_write(&mut self, slot: usize, lba: u64, data: &[u8]) -> io::Result<()> {
        self.start(slot, true, lba, data.len(), Some(data), false)
    }
    fn start_read_in_place(&mut self, slot: usize, lba: u64, len: usize) -> io::Result<()> {
        self.start(slot, false, lba, len, None, true)
    }
    fn read_back(&mut self, slot: usize, out: &mut [u8]) -> io::Result<()> {
        if let Some(k) = self.kept.get(slot).and_then(Option::as_ref) {
            k.read(out);
        }
        Ok(())
    }
    fn start_flush(&mut self, slot: usize) -> io::Result<()> {
        DiskQueue::start_flush(self, slot)
    }
    fn start_unmap(&mut self, slot: usize, lba: u64, blocks: u64) -> io::Result<()> {
        DiskQueue::start_unmap(self, slot, lba, blocks)
    }
    fn complete_one(&mut self, bufs: &mut [Vec<u8>]) -> Option<(usize, io::Result<()>)> {
        if let Some((slot, ended)) = self.ready.pop_front() {
            let r = match ended {
                Ended::Done(r, data) => {
                    if let (Some(d), Some(b)) = (data, bufs.get_mut(slot)) {
                        let n = d.len().min(b.len());
                        b[..n].copy_from_slice(&d[..n]);
                    }
                    r
                }
                Ended::Resend(w) => self.resend(&w, bufs.get(slot).map_or(&[][..], Vec::as_slice)),
            };
            return Some((slot, r));
        }
        let (slot, answer) = self.wait_any()?;
        let q = self.slots[slot].take()?;
        let buf = bufs.get_mut(slot).map(Vec::as_mut_slice);
        let mut kept = None;
        let r = self.finish(q, answer, buf, &mut kept);
        self.kept[slot] = kept;
        let r = match r {
            Ok(r) => r,
            // `bufs` has no buffer for this slot: nothing to send again.
            Err(w) => self.resend(&w, &[]),
        };
        Some((slot, r))
    }
}

impl Drop for DiskQueue<'_> {
    fn drop(&mut self) {
        // Every started command is finished, so its pool pages come back.
        for q in self.slots.iter_mut().filter_map(Option::take) {
            let _ = self.session.finish(q.started, Xfer::None);
        }
    }
}

/// REPORT LUNS (SPC-4 6.33) through LUN 0: the LUN numbers the session's
/// initiator may see (single-level peripheral or flat addressing).
pub fn report_luns(session: &Session) -> io::Result<Vec<u16>> {
    let lun0 = Lun::from_u64(0);
    let mut alloc: u32 = 16 + 8 * 256;
    for _ in 0..3 {
        let mut cdb = [0u8; 12];
        cdb[0] = 0xa0;
        cdb[6..10].copy_from_slice(&alloc.to_be_bytes());
        let r = session
            .execute(lun0, &cdb, Xfer::In(alloc as usize))
            .map_err(|e| io_err("REPORT LUNS", e))?;
        if !r.good() {
            session.note_sense(&r.sense);
            if sense_key(&r.sense) == SenseKey::UnitAttention {
                continue; // a unit attention first; REPORT LUNS again
            }
            return Err(io::Error::other(format!("REPORT LUNS: {}", describe(&r))));
        }
        if r.data.len() < 8 {
            return Err(io::Error::other("REPORT LUNS returned too little data"));
        }
        let len = u32::from_be_bytes(r.data[0..4].try_into().expect("4 bytes"));
        if len + 8 > alloc {
            alloc = len.saturating_add(8);
            continue;
        }
        let list = r.data.get(8..8 + len as usize).unwrap_or(&r.data[8..]);
        return Ok(list
            .chunks_exact(8)
            .map(|e| u16::from_be_bytes([e[0] & 0x3f, e[1]]))
            .collect());
    }
    Err(io::Error::other("REPORT LUNS: the list keeps changing"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use scsi::{Asc, Sense};

    #[test]
    fn vpd83_port_designators() {
        // NAA (LU), then relative target port 2 and target port group 7
        // (association 01b), as srptd sends them; a group designator of
        // the LU association (00b) is not the port's.
        let page = [
            0x00, 0x83, 0x00, 0x24, //
            0x01, 0x03, 0x00, 0x08, 0x50, 1, 2, 3, 4, 5, 6, 7, // NAA
            0x01, 0x14, 0x00, 0x04, 0, 0, 0, 2, // relative target port 2
            0x01, 0x05, 0x00, 0x04, 0, 0, 0, 9, // type 5 of the LU: ignored
            0x01, 0x15, 0x00, 0x04, 0, 0, 0, 7, // target port group 7
        ];
        assert_eq!(port_designators(&page), (Some(2), Some(7)));
        assert_eq!(naa_of(&page).as_deref(), Some("5001020304050607"));
        // Cut pages give what they hold, never a panic.
        assert_eq!(port_designators(&page[..28]), (Some(2), None));
        assert_eq!(port_designators(&page[..3]), (None, None));
    }

    #[test]
    fn alua_refusals_are_the_three_not_ready_codes() {
        let of = |key, asc| {
            let s = Sense::new(key, asc);
            (
                AluaRefusal::of_sense("READ(16)", &s.to_fixed()).map(|r| r.state),
                AluaRefusal::of_sense("READ(16)", &s.to_descriptor()).map(|r| r.state),
            )
        };
        let nr = SenseKey::NotReady;
        assert_eq!(
            of(nr, Asc::LU_NOT_ACCESSIBLE_STANDBY),
            (
                Some(scsi::AccessState::Standby),
                Some(scsi::AccessState::Standby)
            )
        );
        assert_eq!(
            of(nr, Asc::LU_NOT_ACCESSIBLE_UNAVAILABLE).0,
            Some(scsi::AccessState::Unavailable)
        );
        assert_eq!(
            of(nr, Asc::LU_NOT_ACCESSIBLE_TRANSITION).0,
            Some(scsi::AccessState::Transitioning)
        );
        assert_eq!(of(nr, Asc(0x04, 0x01)).0, None, "becoming ready");
        assert_eq!(
            of(SenseKey::UnitAttention, Asc::LU_NOT_ACCESSIBLE_STANDBY).0,
            None
        );
        let s = Sense::new(nr, Asc::LU_NOT_ACCESSIBLE_STANDBY).to_fixed();
        let e = io::Error::other(AluaRefusal::of_sense("WRITE(16)", &s).unwrap());
        assert_eq!(
            e.to_string(),
            "WRITE(16): target port standby (NOT READY, ASC/ASCQ 04/0b)"
        );
        assert_eq!(
            alua_refusal(&e).map(|r| r.state),
            Some(scsi::AccessState::Standby)
        );
        assert_eq!(alua_refusal(&io::Error::other("x")), None);
    }
}
