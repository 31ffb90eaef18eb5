//! SPC-4 / SBC-3 command emulation for one logical unit.

use crate::backend::Backend;
use crate::bufs::Buffers;
use crate::cdb::Command;
use crate::cdb::Expected;
use crate::opcode::Opcode;
use crate::passthrough::PassThrough;
use crate::pi::{Checks, PiType, Tuple, Want, PI_LEN};
use crate::sense::{Asc, Sense, SenseKey};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, RwLock};

/// Device attributes (SCST device handler parameters).
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    pub vendor: String,
    pub product: String,
    pub revision: String,
    pub serial: String,
    /// NAA IEEE Registered identifier (NAA 5): top nibble forced to 5.
    pub naa: u64,
    /// 512 or 4096.
    pub block_size: u32,
    pub read_only: bool,
    /// Report the write cache as enabled (caching page WCE).
    pub write_cache: bool,
    /// Thin provisioning: UNMAP and WRITE SAME with UNMAP accepted
    /// (unmapped blocks read as zeroes, LBPRZ).
    pub thin: bool,
    /// Where persistent reservations with APTPL are kept (SCST keeps them
    /// next to the device); `None`: APTPL is accepted but not persisted.
    pub pr_file: Option<std::path::PathBuf>,
    /// Accept NACA=1 in the CONTROL byte: a CHECK CONDITION then
    /// establishes an ACA condition (SAM-5 5.9), and standard INQUIRY says
    /// NormACA. Off: NACA=1 is an invalid field.
    pub norm_aca: bool,
    /// Formatted with protection information of this type (SBC-3 4.22):
    /// the store must keep 8 bytes per block ([`Ram::with_pi`],
    /// [`crate::FileIo::with_pi`]). `None`: no PI; RDPROTECT/WRPROTECT
    /// other than 0 are refused.
    ///
    /// [`Ram::with_pi`]: crate::Ram::with_pi
    pub protection: Option<PiType>,
    /// A rotating medium. VPD B1h MEDIUM ROTATION RATE (SBC-3 6.5.2)
    /// says 0001h (non-rotating: an initiator may skip seek-avoiding
    /// scheduling) when false, and 0000h (rate not reported, which Linux
    /// treats as rotational) when true: the target does not know a real
    /// disk's rate, so it reports none rather than invent one.
    pub rotational: bool,
    /// Most commands of this logical unit in the task set at once (all
    /// initiators together); one more gets TASK SET FULL without running
    /// (SAM-5 5.3.1). At least 1.
    pub queue_depth: u32,
    /// A removable medium (SCST's `removable`): standard INQUIRY's RMB
    /// bit, which Linux shows as the disk's `removable` attribute.
    pub removable: bool,
    /// The store sits behind a non-volatile cache (SCST's `nv_cache`, for
    /// a target on a UPS or with battery-backed memory): a write is
    /// stable once it reaches the store, so neither FUA nor SYNCHRONIZE
    /// CACHE makes it flush, and Extended INQUIRY (VPD 86h) says NV_SUP.
    /// Off: FUA and SYNCHRONIZE CACHE flush the store.
    pub nv_cache: bool,
    /// Threads of the unit's own for its commands' blocking I/O (SCST's
    /// `threads_num`): a transport runs the unit's commands that may
    /// block on that many threads kept for it, so a slow device does not
    /// hold up the others' commands. 0: the transport's shared workers.
    pub threads_num: u32,
    /// Whose those threads are (SCST's `threads_pool_type`).
    pub threads_pool: ThreadsPool,
}

/// Whose a unit's own threads ([`DeviceConfig::threads_num`]) are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ThreadsPool {
    /// Each session (I_T nexus) gets `threads_num` threads of its own for
    /// the unit, ending with the session, so one initiator's slow commands
    /// never wait behind another's (SCST's `per_initiator`, its default).
    #[default]
    PerInitiator,
    /// One pool of `threads_num` threads for every session of a target
    /// port (SCST's `shared`).
    Shared,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            vendor: "RUSTSCST".into(),
            product: "VDISK".into(),
            revision: "0001".into(),
            serial: "0".into(),
            naa: 0x5001_4050_0000_0000,
            block_size: 512,
            read_only: false,
            write_cache: true,
            thin: false,
            pr_file: None,
            norm_aca: true,
            protection: None,
            rotational: false,
            queue_depth: DEFAULT_QUEUE_DEPTH,
            removable: false,
            nv_cache: false,
            threads_num: 0,
            threads_pool: ThreadsPool::PerInitiator,
        }
    }
}

/// [`DeviceConfig::queue_depth`] unless configured.
pub const DEFAULT_QUEUE_DEPTH: u32 = 128;

/// Largest transfer accepted in one command, in blocks (VPD B0h).
pub const MAX_TRANSFER_BLOCKS: u32 = 8192;

/// Largest COMPARE AND WRITE, in blocks (VPD B0h).
pub const MAX_CAW_BLOCKS: u32 = 16;
/// Most UNMAP block descriptors accepted in one command (VPD B0h).
pub const MAX_UNMAP_DESCRIPTORS: u32 = 256;

/// A logical unit: attributes plus storage.
pub struct Device {
    pub config: DeviceConfig,
    backend: Arc<dyn Backend>,
    /// Writers share it; COMPARE AND WRITE holds it alone, so it is atomic
    /// against every other writer of this device (SBC-3 5.2).
    io_lock: RwLock<()>,
    /// On a device with protection information, a block's data and its
    /// tuple change together: writers hold this alone, readers share it,
    /// so a read never pairs new data with an old guard.
    pi_lock: RwLock<()>,
    /// The current [`ModeState`], packed ([`ModeState::bits`]): every
    /// command reads it, so no lock that commands on other threads share.
    mode: AtomicU8,
    /// Persistent reservations of this logical unit.
    pr: std::sync::Mutex<crate::pr::PrState>,
    /// Whether `pr` holds a reservation, written under its lock whenever
    /// it may have changed: without one nothing conflicts, so a READ or
    /// WRITE checks this instead of taking the lock.
    reserved: AtomicBool,
    stats: Counters,
    /// A pass-through unit's handler: its commands go to the device, not
    /// to the emulation or `backend` (which then holds nothing).
    pass: Option<PassThrough>,
    /// The virtual CD-ROM, for a `vcdrom` unit.
    cdrom: Option<crate::VCdrom>,
}

/// The store of a pass-through unit: none (its commands never reach it).
struct NoStore;

impl Backend for NoStore {
    fn size(&self) -> u64 {
        0
    }
    fn read(&self, _: u64, _: &mut [u8]) -> std::io::Result<()> {
        Err(std::io::ErrorKind::Unsupported.into())
    }
    fn write(&self, _: u64, _: &[u8], _: bool) -> std::io::Result<()> {
        Err(std::io::ErrorKind::Unsupported.into())
    }
    fn flush(&self) -> std::io::Result<()> {
        Err(std::io::ErrorKind::Unsupported.into())
    }
}

#[derive(Default)]
struct Counters {
    commands: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
    errors: AtomicU64,
}

/// Per-device counters (what `srptadm stats` and the metrics endpoint show).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Commands the device executed.
    pub commands: u64,
    /// READ commands.
    pub reads: u64,
    /// WRITE commands.
    pub writes: u64,
    /// Bytes read by READ commands.
    pub read_bytes: u64,
    /// Bytes written by WRITE commands.
    pub write_bytes: u64,
    /// Commands that ended in CHECK CONDITION.
    pub errors: u64,
}

/// The changeable mode parameters (current values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModeState {
    /// Caching page WCE.
    pub wce: bool,
    /// Control page D_SENSE: report sense in descriptor format.
    pub d_sense: bool,
}

impl ModeState {
    fn bits(self) -> u8 {
        u8::from(self.wce) | u8::from(self.d_sense) << 1
    }

    fn from_bits(b: u8) -> ModeState {
        ModeState {
            wce: b & 1 != 0,
            d_sense: b & 2 != 0,
        }
    }
}

pub(crate) fn pad(s: &str, n: usize) -> Vec<u8> {
    let mut v: Vec<u8> = s
        .bytes()
        .filter(|b| b.is_ascii_graphic() || *b == b' ')
        .take(n)
        .collect();
    v.resize(n, b' ');
    v
}

/// Why [`Device::new`] refuses a configuration or its store.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The persistent reservation file exists but cannot be read.
    #[error("{}: {source}", path.display())]
    PrRead {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The persistent reservation file is not a saved PR state.
    #[error("{}: malformed PR state", path.display())]
    PrMalformed { path: std::path::PathBuf },
    /// A block size other than 512 or 4096.
    #[error("block size {0} unsupported (512 or 4096)")]
    BlockSize(u32),
    /// The store holds no whole number of blocks (or nothing).
    #[error("store size {size} is not a positive multiple of {block_size}")]
    StoreSize { size: u64, block_size: u32 },
    /// The store's I/O unit (O_DIRECT alignment) does not divide the block.
    #[error("block size {block_size} is not a multiple of the store's {min}-byte I/O unit")]
    IoUnit { block_size: u32, min: u32 },
    /// `queue_depth = 0`.
    #[error("queue depth 0 (at least 1)")]
    QueueDepth,
    /// Protection information asked for, and the store has the wrong
    /// amount of PI space.
    #[error("protection information needs {want} bytes of PI space in the store, it has {has}")]
    PiSpace { want: u64, has: u64 },
}

impl Device {
    /// Whether the store only touches memory (see [`Backend::never_blocks`]).
    pub fn never_blocks(&self) -> bool {
        self.backend.never_blocks()
    }

    /// The store behind the unit.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Refuses block sizes other than 512 and 4096 and stores whose size is
    /// not a multiple of the block size.
    pub fn new(config: DeviceConfig, backend: Arc<dyn Backend>) -> Result<Device, DeviceError> {
        let wce = config.write_cache;
        let pr = match &config.pr_file {
            Some(path) if path.exists() => {
                let text = std::fs::read_to_string(path).map_err(|source| DeviceError::PrRead {
                    path: path.clone(),
                    source,
                })?;
                crate::pr::PrState::from_text(&text)
                    .ok_or_else(|| DeviceError::PrMalformed { path: path.clone() })?
            }
            _ => Default::default(),
        };
        if config.block_size != 512 && config.block_size != 4096 {
            return Err(DeviceError::BlockSize(config.block_size));
        }
        if backend.size() % config.block_size as u64 != 0 || backend.size() == 0 {
            return Err(DeviceError::StoreSize {
                size: backend.size(),
                block_size: config.block_size,
            });
        }
        let min = backend.min_block_size().max(1);
        if config.block_size % min != 0 {
            return Err(DeviceError::IoUnit {
                block_size: config.block_size,
                min,
            });
        }
        if config.queue_depth == 0 {
            return Err(DeviceError::QueueDepth);
        }
        let want_pi = backend.size() / config.block_size as u64 * PI_LEN as u64;
        if config.protection.is_some() && backend.pi_size() != want_pi {
            return Err(DeviceError::PiSpace {
                want: want_pi,
                has: backend.pi_size(),
            });
        }
        Ok(Device {
            config,
            backend,
            io_lock: RwLock::new(()),
            pi_lock: RwLock::new(()),
            mode: AtomicU8::new(
                ModeState {
                    wce,
                    d_sense: false,
                }
                .bits(),
            ),
            reserved: AtomicBool::new(pr.is_reserved()),
            pr: std::sync::Mutex::new(pr),
            stats: Counters::default(),
            pass: None,
            cdrom: None,
        })
    }

    /// A pass-through unit ([`crate::passthrough`]): commands go to the
    /// device `handler` runs them on. From `config` it keeps the identity
    /// the handler's [`crate::passthrough::Identity`] overrides, the queue
    /// depth and the PR file; NACA is refused (`norm_aca` is cleared) and
    /// the block size, size and emulation options mean nothing.
    ///
    /// # Errors
    /// What [`Device::new`] says of the PR file and the queue depth.
    pub fn pass_through(
        mut config: DeviceConfig,
        handler: PassThrough,
    ) -> Result<Device, DeviceError> {
        config.norm_aca = false;
        config.protection = None;
        let size = config.block_size as u64;
        // Checked as an emulated unit of one block, then given no store.
        let mut dev = Device::new(config, Arc::new(crate::NullIo::new(size)))?;
        dev.backend = Arc::new(NoStore);
        dev.pass = Some(handler);
        Ok(dev)
    }

    /// A virtual CD-ROM unit ([`crate::vcdrom`]) over `cdrom`: from
    /// `config` it keeps the identity (vendor, product, revision, serial,
    /// NAA), the queue depth and the PR file; NACA and protection are
    /// cleared, and the block size, size and emulation options mean
    /// nothing (the medium has 2048-byte blocks).
    ///
    /// # Errors
    /// What [`Device::new`] says of the PR file and the queue depth.
    pub fn vcdrom(mut config: DeviceConfig, cdrom: crate::VCdrom) -> Result<Device, DeviceError> {
        config.norm_aca = false;
        config.protection = None;
        config.read_only = true;
        config.removable = true;
        let size = config.block_size as u64;
        let mut dev = Device::new(config, Arc::new(crate::NullIo::new(size)))?;
        dev.backend = Arc::new(NoStore);
        dev.cdrom = Some(cdrom);
        Ok(dev)
    }

    /// The virtual CD-ROM, for a `vcdrom` unit.
    pub fn vcdrom_handler(&self) -> Option<&crate::VCdrom> {
        self.cdrom.as_ref()
    }

    /// The pass-through handler, for a pass-through unit.
    pub fn pass_through_handler(&self) -> Option<&PassThrough> {
        self.pass.as_ref()
    }

    /// Counts a command a pass-through unit ran on its device.
    pub(crate) fn count_passed(&self, status: crate::Status) {
        self.stats.commands.fetch_add(1, Relaxed);
        if status == crate::Status::CheckCondition {
            self.stats.errors.fetch_add(1, Relaxed);
        }
    }

    /// Counters since the device was created.
    pub fn stats(&self) -> DeviceStats {
        let c = &self.stats;
        DeviceStats {
            commands: c.commands.load(Relaxed),
            reads: c.reads.load(Relaxed),
            writes: c.writes.load(Relaxed),
            read_bytes: c.read_bytes.load(Relaxed),
            write_bytes: c.write_bytes.load(Relaxed),
            errors: c.errors.load(Relaxed),
        }
    }

    /// Changes the capacity to `blocks`; the target raises CAPACITY DATA
    /// HAS CHANGED (use [`crate::Target::resize`]).
    pub(crate) fn resize(&self, blocks: u64) -> std::io::Result<()> {
        if blocks == 0 {
            return Err(std::io::ErrorKind::InvalidInput.into());
        }
        let _excl = self.io_lock.write().unwrap_or_else(|e| e.into_inner());
        self.backend.resize(blocks * self.config.block_size as u64)
    }

    /// The logical block size: the configured one, or a CD's 2048 bytes
    /// for a virtual CD-ROM.
    pub fn block_size(&self) -> u32 {
        match self.cdrom {
            Some(_) => crate::vcdrom::CD_BLOCK as u32,
            None => self.config.block_size,
        }
    }

    /// Whether the unit takes the command's protection fields (SBC-3
    /// 5.16, 5.18): READ(32)/WRITE(32) only on type 2 (else INVALID COMMAND
    /// OPERATION CODE); RDPROTECT/WRPROTECT other than 0 need PI, and on
    /// type 2 a 32-byte CDB (else INVALID FIELD IN CDB, as LIO answers).
    pub fn protect_supported(&self, cmd: &Command) -> Result<(), Sense> {
        let (Command::Read {
            protect, expect, ..
        }
        | Command::Write {
            protect, expect, ..
        }) = *cmd
        else {
            return Ok(());
        };
        let ty = self.config.protection;
        if expect.is_some() && ty != Some(PiType::Type2) {
            return Err(Sense::new(
                SenseKey::IllegalRequest,
                Asc::INVALID_COMMAND_OPERATION_CODE,
            ));
        }
        let refused = match ty {
            None => protect != 0,
            Some(PiType::Type2) => protect != 0 && expect.is_none(),
            Some(_) => false,
        };
        if refused {
            let byte = if expect.is_some() { 10 } else { 1 };
            return Err(Sense::invalid_field(byte, Some(7)));
        }
        Ok(())
    }

    /// Checks the tuples of `blocks` (data and PI side by side) of a
    /// command starting at `lba`.
    fn check_tuples(
        &self,
        ty: PiType,
        checks: Checks,
        expect: Option<Expected>,
        lba: u64,
        data: &[u8],
        pi: &[u8],
    ) -> Result<(), Sense> {
        let bs = self.config.block_size as usize;
        for (k, (b, t)) in data.chunks(bs).zip(pi.chunks(PI_LEN)).enumerate() {
            let want = Want::of(ty, expect, lba, k as u64);
            Tuple::parse(t).check(ty, checks, want, b, lba + k as u64)?;
        }
        Ok(())
    }

    /// Reads the tuples of `blocks` blocks from `lba`.
    fn read_tuples(&self, lba: u64, blocks: u64) -> Result<Vec<u8>, Sense> {
        let mut pi = vec![0u8; blocks as usize * PI_LEN];
        self.backend
            .read_pi(lba * PI_LEN as u64, &mut pi)
            .map_err(|_| Sense::new(SenseKey::MediumError, Asc::UNRECOVERED_READ_ERROR))?;
        Ok(pi)
    }

    fn write_tuples(&self, lba: u64, pi: &[u8], fua: bool) -> Result<(), Sense> {
        self.backend
            .write_pi(lba * PI_LEN as u64, pi, fua)
            .map_err(|_| Sense::new(SenseKey::MediumError, Asc::WRITE_ERROR))
    }

    /// The tuples the target generates for `data` (whole blocks) at `lba`.
    fn generate(&self, ty: PiType, expect: Option<Expected>, lba: u64, data: &[u8]) -> Vec<u8> {
        data.chunks(self.config.block_size as usize)
            .enumerate()
            .flat_map(|(k, b)| {
                let r = Want::generated_reference(ty, expect, lba, k as u64);
                Tuple::generate(b, r).emit()
            })
            .collect()
    }

    /// Holds off readers of a protected device while data and PI change.
    fn pi_write_guard(&self) -> Option<std::sync::RwLockWriteGuard<'_, ()>> {
        self.config
            .protection
            .map(|_| self.pi_lock.write().unwrap_or_else(|e| e.into_inner()))
    }

    /// Blocks of the store (of the disc in the drive, for a virtual
    /// CD-ROM; 0 without one).
    pub fn blocks(&self) -> u64 {
        match &self.cdrom {
            Some(cd) => cd.blocks(),
            None => self.backend.size() / self.config.block_size as u64,
        }
    }

    fn check_range(&self, lba: u64, blocks: u32) -> Result<(), Sense> {
        let end = lba.checked_add(blocks as u64);
        if end.is_none_or(|e| e > self.blocks()) {
            let mut s = Sense::new(SenseKey::IllegalRequest, Asc::LBA_OUT_OF_RANGE);
            s.information = Some(lba);
            return Err(s);
        }
        Ok(())
    }

    /// Runs a parsed command (REPORT LUNS and REQUEST SENSE are the
    /// target's). Returns data-in, or the sense of a CHECK CONDITION.
    pub fn execute(&self, cmd: &Command, cdb: &[u8], data_out: &[u8]) -> Result<Vec<u8>, Sense> {
        self.execute_into(cmd, cdb, data_out, None)
    }

    /// [`Device::execute`] with the transport's buffers: a READ's data is
    /// read by the store straight into `bufs` (the returned vector is then
    /// empty and [`Buffers::placed`] tells how much landed), a WRITE's
    /// data-out pieces are written from where they are. Other commands,
    /// and READs of a device with protection information, still return
    /// their data; the target copies it into the buffers.
    pub fn execute_into(
        &self,
        cmd: &Command,
        cdb: &[u8],
        data_out: &[u8],
        bufs: Option<&mut Buffers<'_, '_>>,
    ) -> Result<Vec<u8>, Sense> {
        // A closed store (a DRBD device while this host is secondary)
        // answers what needs no medium and refuses the rest; an open
        // one is held so that it does not close under the command.
        let held = self.backend.hold();
        let r = match held {
            Err(_) if cmd.uses_store() => Err(Sense::new(
                SenseKey::NotReady,
                Asc::LU_NOT_ACCESSIBLE_STANDBY,
            )),
            _ => self.execute_inner(cmd, cdb, data_out, bufs),
        };
        drop(held);
        let c = &self.stats;
        c.commands.fetch_add(1, Relaxed);
        match (cmd, &r) {
            (_, Err(_)) => {
                c.errors.fetch_add(1, Relaxed);
            }
            (Command::Read { blocks, .. }, Ok(_)) => {
                c.reads.fetch_add(1, Relaxed);
                c.read_bytes
                    .fetch_add(*blocks as u64 * self.config.block_size as u64, Relaxed);
            }
            (Command::Write { blocks, .. }, Ok(_)) => {
                c.writes.fetch_add(1, Relaxed);
                c.write_bytes
                    .fetch_add(*blocks as u64 * self.config.block_size as u64, Relaxed);
            }
            _ => {}
        }
        r
    }

    fn execute_inner(
        &self,
        cmd: &Command,
        cdb: &[u8],
        data_out: &[u8],
        bufs: Option<&mut Buffers<'_, '_>>,
    ) -> Result<Vec<u8>, Sense> {
        let bs = self.config.block_size as u64;
        match *cmd {
            Command::TestUnitReady | Command::StartStopUnit | Command::PreventAllow => {
                Ok(Vec::new())
            }
            Command::Inquiry { evpd, page, .. } => self.inquiry(evpd, page),
            Command::ModeSense {
                ten,
                dbd,
                pc,
                page,
                subpage,
                ..
            } => self.mode_sense(ten, dbd, pc, page, subpage),
            Command::ReadCapacity10 => {
                let last = (self.blocks() - 1).min(0xffff_ffff) as u32;
                let mut d = last.to_be_bytes().to_vec();
                d.extend_from_slice(&self.config.block_size.to_be_bytes());
                Ok(d)
            }
            Command::ReadCapacity16 { .. } => {
                let mut d = vec![0u8; 32];
                d[0..8].copy_from_slice(&(self.blocks() - 1).to_be_bytes());
                d[8..12].copy_from_slice(&self.config.block_size.to_be_bytes());
                if let Some(ty) = self.config.protection {
                    d[12] = (ty.p_type() << 1) | 0x01; // P_TYPE, PROT_EN
                }
                if self.config.thin {
                    // SBC-3 5.16.2: LBPME (an initiator may UNMAP), LBPRZ
                    // (unmapped blocks read as zeroes).
                    d[14] = 0xc0;
                }
                Ok(d)
            }
            Command::Read {
                lba,
                blocks,
                protect,
                expect,
                ..
            } => {
                self.protect_supported(cmd)?;
                self.check_range(lba, blocks)?;
                if blocks > MAX_TRANSFER_BLOCKS {
                    return Err(Sense::invalid_field(length_field(cdb), None));
                }
                let medium = |_| Sense::new(SenseKey::MediumError, Asc::UNRECOVERED_READ_ERROR);
                let len = (blocks as u64 * bs) as usize;
                let Some(ty) = self.config.protection else {
                    if let Some(bufs) = bufs {
                        // Only what the transport's buffers hold is read
                        // (an allocation length below the transfer length).
                        let want = len.min(bufs.capacity());
                        if bufs.wants_reference() && self.backend.memory().is_some() {
                            bufs.reference = Some((lba * bs, want));
                            bufs.placed = Some(want);
                            return Ok(Vec::new());
                        }
                        if bufs.has_data_in() {
                            self.backend
                                .read_vectored(lba * bs, &mut bufs.data_in_for(want))
                                .map_err(medium)?;
                            bufs.placed = Some(want);
                            return Ok(Vec::new());
                        }
                    }
                    return self.backend.read_vec(lba * bs, len).map_err(medium);
                };
                let mut buf = vec![0u8; len];
                let pi = {
                    let _pi = self.pi_lock.read().unwrap_or_else(|e| e.into_inner());
                    self.backend.read(lba * bs, &mut buf).map_err(|_| {
                        Sense::new(SenseKey::MediumError, Asc::UNRECOVERED_READ_ERROR)
                    })?;
                    self.read_tuples(lba, blocks as u64)?
                };
                // SBC-3 table 95: checked even with RDPROTECT 000b.
                let checks = Checks::of(protect).unwrap_or(Checks::ALL);
                self.check_tuples(ty, checks, expect, lba, &buf, &pi)?;
                if protect == 0 {
                    return Ok(buf);
                }
                let mut out = Vec::with_capacity(buf.len() + pi.len());
                for (b, t) in buf.chunks(bs as usize).zip(pi.chunks(PI_LEN)) {
                    out.extend_from_slice(b);
                    out.extend_from_slice(t);
                }
                Ok(out)
            }
            Command::Write {
                lba,
                blocks,
                fua,
                protect,
                expect,
            } => {
                let fua = self.durable(fua);
                self.protect_supported(cmd)?;
                self.writable()?;
                self.check_range(lba, blocks)?;
                if blocks > MAX_TRANSFER_BLOCKS {
                    return Err(Sense::invalid_field(length_field(cdb), None));
                }
                let len = (blocks as u64 * bs) as usize;
                let wire = if protect != 0 {
                    len + blocks as usize * PI_LEN
                } else {
                    len
                };
                // The transport sends what plan() asked for; fewer bytes is a
                // transport fault we refuse rather than write garbage.
                let short = || Sense::new(SenseKey::AbortedCommand, Asc::NO_ADDITIONAL);
                let gathered;
                let data = match bufs {
                    Some(b) if b.has_data_out() => {
                        let pieces = b.data_out_for(wire).ok_or_else(short)?;
                        if self.config.protection.is_none() {
                            let _shared = self.io_lock.read().unwrap_or_else(|e| e.into_inner());
                            self.backend
                                .write_vectored(lba * bs, &pieces, fua)
                                .map_err(|_| Sense::new(SenseKey::MediumError, Asc::WRITE_ERROR))?;
                            return Ok(Vec::new());
                        }
                        gathered = pieces.concat();
                        &gathered[..]
                    }
                    _ => data_out.get(..wire).ok_or_else(short)?,
                };
                let Some(ty) = self.config.protection else {
                    let _shared = self.io_lock.read().unwrap_or_else(|e| e.into_inner());
                    self.backend
                        .write(lba * bs, data, fua)
                        .map_err(|_| Sense::new(SenseKey::MediumError, Asc::WRITE_ERROR))?;
                    return Ok(Vec::new());
                };
                let (data, pi): (std::borrow::Cow<'_, [u8]>, Vec<u8>) = if protect == 0 {
                    (data.into(), self.generate(ty, expect, lba, data))
                } else {
                    // Split the interleaved data-out, checking each tuple
                    // before anything is written (SBC-3 table 101).
                    let mut d = Vec::with_capacity(len);
                    let mut p = Vec::with_capacity(blocks as usize * PI_LEN);
                    for c in data.chunks(bs as usize + PI_LEN) {
                        let (b, t) = c.split_at(bs as usize);
                        d.extend_from_slice(b);
                        p.extend_from_slice(t);
                    }
                    let checks = Checks::of(protect).unwrap_or(Checks::ALL);
                    self.check_tuples(ty, checks, expect, lba, &d, &p)?;
                    (d.into(), p)
                };
                let _shared = self.io_lock.read().unwrap_or_else(|e| e.into_inner());
                let _pi = self.pi_write_guard();
                self.backend
                    .write(lba * bs, &data, fua)
                    .map_err(|_| Sense::new(SenseKey::MediumError, Asc::WRITE_ERROR))?;
                self.write_tuples(lba, &pi, fua)?;
                Ok(Vec::new())
            }
            Command::SyncCache { lba, blocks } => {
                self.check_range(lba, blocks)?;
                if !self.config.nv_cache {
                    self.backend
                        .flush()
                        .map_err(|_| Sense::new(SenseKey::MediumError, Asc::WRITE_ERROR))?;
                }
                Ok(Vec::new())
            }
            Command::Verify {
                lba,
                blocks,
                bytchk,
            } => {
                // BYTCHK 0: a medium check, i.e. the blocks can be read;
                // 1: each block equals its part of the data-out; 3: each
                // block equals the one block of data-out.
                self.check_range(lba, blocks)?;
                let b = bs as usize;
                let want = match bytchk {
                    0 => None,
                    1 => Some(blocks as usize * b),
                    _ => Some(b),
                };
                if let Some(n) = want {
                    if data_out.len() < n {
                        return Err(Sense::new(SenseKey::AbortedCommand, Asc::NO_ADDITIONAL));
                    }
                }
                let mut buf = vec![0u8; b];
                for k in 0..blocks as usize {
                    let at = lba + k as u64;
                    let _pi = self.pi_lock.read().unwrap_or_else(|e| e.into_inner());
                    self.backend.read(at * bs, &mut buf).map_err(|_| {
                        Sense::new(SenseKey::MediumError, Asc::UNRECOVERED_READ_ERROR)
                    })?;
                    if let Some(ty) = self.config.protection {
                        // VRPROTECT 000b on a protected LU: guard and
                        // reference tag are checked (SBC-3 5.33).
                        let t = self.read_tuples(at, 1)?;
                        self.check_tuples(ty, Checks::ALL, None, at, &buf, &t)?;
                    }
                    let expect = match bytchk {
                        0 => continue,
                        1 => &data_out[k * b..(k + 1) * b],
                        _ => &data_out[..b],
                    };
                    if let Some(off) = buf.iter().zip(expect).position(|(x, y)| x != y) {
                        // SBC-3 5.33: INFORMATION = offset of the first
                        // differing byte in the data-out buffer (for 11b,
                        // counted as if the block were repeated).
                        let mut s = Sense::new(SenseKey::Miscompare, Asc::MISCOMPARE_DURING_VERIFY);
                        s.information = Some((k * b + off) as u64);
                        return Err(s);
                    }
                }
                Ok(Vec::new())
            }
            Command::WriteSame { lba, blocks, unmap } => {
                self.writable()?;
                if unmap && !self.config.thin {
                    return Err(Sense::invalid_field(1, Some(3)));
                }
                self.check_range(lba, blocks)?;
                if blocks > MAX_TRANSFER_BLOCKS {
                    return Err(Sense::invalid_field(length_field(cdb), None));
                }
                let Some(block) = data_out.get(..bs as usize) else {
                    return Err(Sense::new(SenseKey::AbortedCommand, Asc::NO_ADDITIONAL));
                };
                // SBC-3 5.45: with UNMAP the blocks may be deallocated
                // when that reads back as this data, i.e. zeroes (LBPRZ).
                let dealloc = unmap && block.iter().all(|&b| b == 0);
                self.fill(lba, blocks as u64, block, dealloc)?;
                Ok(Vec::new())
            }
            Command::Unmap { param_len } => {
                self.writable()?;
                if !self.config.thin {
                    return Err(Sense::new(
                        SenseKey::IllegalRequest,
                        Asc::INVALID_COMMAND_OPERATION_CODE,
                    ));
                }
                self.unmap(data_out.get(..param_len as usize).unwrap_or(data_out))?;
                Ok(Vec::new())
            }
            Command::CompareAndWrite { lba, blocks, fua } => {
                let fua = self.durable(fua);
                self.writable()?;
                self.check_range(lba, blocks)?;
                if blocks > MAX_CAW_BLOCKS {
                    return Err(Sense::invalid_field(13, None));
                }
                let len = (blocks as u64 * bs) as usize;
                let Some(data) = data_out.get(..2 * len) else {
                    return Err(Sense::new(SenseKey::AbortedCommand, Asc::NO_ADDITIONAL));
                };
                let _excl = self.io_lock.write().unwrap_or_else(|e| e.into_inner());
                let _pi = self.pi_write_guard();
                let mut cur = vec![0u8; len];
                self.backend
                    .read(lba * bs, &mut cur)
                    .map_err(|_| Sense::new(SenseKey::MediumError, Asc::UNRECOVERED_READ_ERROR))?;
                if let Some(off) = cur.iter().zip(&data[..len]).position(|(a, b)| a != b) {
                    // SBC-3 5.2: INFORMATION = offset of the first differing byte.
                    let mut s = Sense::new(SenseKey::Miscompare, Asc::MISCOMPARE_DURING_VERIFY);
                    s.information = Some(off as u64);
                    return Err(s);
                }
                self.backend
                    .write(lba * bs, &data[len..], fua)
                    .map_err(|_| Sense::new(SenseKey::MediumError, Asc::WRITE_ERROR))?;
                if let Some(ty) = self.config.protection {
                    self.write_tuples(lba, &self.generate(ty, None, lba, &data[len..]), fua)?;
                }
                Ok(Vec::new())
            }
            Command::ReportOpcodes {
                options, opcode, ..
            } => report_opcodes(
                options,
                opcode,
                self.config.protection == Some(PiType::Type2),
            ),
            Command::ModeSelect { ten, param_len } => {
                self.mode_select(ten, data_out.get(..param_len as usize).unwrap_or(data_out))?;
                Ok(Vec::new())
            }
            Command::RequestSense { .. }
            | Command::ReportLuns { .. }
            | Command::PrIn { .. }
            | Command::PrOut { .. }
            | Command::ReportTargetPortGroups { .. }
            | Command::SetTargetPortGroups { .. } => {
                // Target-level commands: they need the nexus and LUN map.
                Err(Sense::new(
                    SenseKey::IllegalRequest,
                    Asc::INVALID_COMMAND_OPERATION_CODE,
                ))
            }
        }
    }

    /// Whether a write must be on stable storage before it completes:
    /// FUA asked, or the write cache is off (caching page WCE=0, by
    /// configuration or MODE SELECT), which makes every write
    /// write-through (SBC-3 6.4.5).
    fn durable(&self, fua: bool) -> bool {
        !self.config.nv_cache && (fua || !self.mode_state().wce)
    }

    fn writable(&self) -> Result<(), Sense> {
        if self.config.read_only {
            return Err(Sense::new(SenseKey::DataProtect, Asc::WRITE_PROTECTED));
        }
        Ok(())
    }

    /// Writes `block` to every block of the range, up to 1 MiB per backend
    /// call. On a protected device each block gets its generated tuple, or
    /// all-ones PI when `unmapped` (SBC-3 4.7.4.5, LBPRZ).
    /// With `unmapped` (and a zero `block`) the store is first asked to
    /// deallocate the range ([`Backend::unmap`]); one that cannot gets
    /// zeroes written.
    fn fill(&self, lba: u64, blocks: u64, block: &[u8], unmapped: bool) -> Result<(), Sense> {
        let bs = block.len() as u64;
        if unmapped && blocks > 0 {
            let _shared = self.io_lock.read().unwrap_or_else(|e| e.into_inner());
            let _pi = self.pi_write_guard();
            match self.backend.unmap(lba * bs, blocks * bs) {
                Ok(()) => {
                    if self.config.protection.is_some() {
                        let mut done = 0;
                        while done < blocks {
                            let n = (1 << 17).min(blocks - done);
                            let ones = vec![0xff; n as usize * PI_LEN];
                            self.write_tuples(lba + done, &ones, false)?;
                            done += n;
                        }
                    }
                    if self.durable(false) {
                        self.backend
                            .flush()
                            .map_err(|_| Sense::new(SenseKey::MediumError, Asc::WRITE_ERROR))?;
                    }
                    return Ok(());
                }
                Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {}
                Err(_) => return Err(Sense::new(SenseKey::MediumError, Asc::WRITE_ERROR)),
            }
        }
        let per = (1 << 20) / bs;
        let chunk: Vec<u8> = block
            .iter()
            .copied()
            .cycle()
            .take((per.min(blocks) * bs) as usize)
            .collect();
        let fua = self.durable(false);
        let _shared = self.io_lock.read().unwrap_or_else(|e| e.into_inner());
        let mut done = 0;
        while done < blocks {
            let n = per.min(blocks - done);
            let at = lba + done;
            let _pi = self.pi_write_guard();
            self.backend
                .write(at * bs, &chunk[..(n * bs) as usize], fua)
                .map_err(|_| Sense::new(SenseKey::MediumError, Asc::WRITE_ERROR))?;
            if let Some(ty) = self.config.protection {
                let pi = if unmapped {
                    vec![0xff; n as usize * PI_LEN]
                } else {
                    self.generate(ty, None, at, &chunk[..(n * bs) as usize])
                };
                self.write_tuples(at, &pi, fua)?;
            }
            done += n;
        }
        Ok(())
    }

    /// SBC-3 5.28 UNMAP parameter list: 8-byte header, 16-byte descriptors.
    /// All descriptors are checked before any block is unmapped.
    fn unmap(&self, p: &[u8]) -> Result<(), Sense> {
        if p.is_empty() {
            return Ok(());
        }
        let bad_len = || Sense::new(SenseKey::IllegalRequest, Asc::PARAMETER_LIST_LENGTH_ERROR);
        if p.len() < 8 {
            return Err(bad_len());
        }
        let desc_len = u16::from_be_bytes([p[2], p[3]]) as usize;
        let descs = p.get(8..8 + desc_len).ok_or_else(bad_len)?;
        if descs.len() % 16 != 0 {
            return Err(bad_len());
        }
        if descs.len() / 16 > MAX_UNMAP_DESCRIPTORS as usize {
            return Err(Sense::new(
                SenseKey::IllegalRequest,
                Asc::INVALID_FIELD_IN_PARAMETER_LIST,
            ));
        }
        let ranges: Vec<(u64, u32)> = descs
            .chunks(16)
            .map(|d| {
                (
                    u64::from_be_bytes(d[0..8].try_into().unwrap_or([0; 8])),
                    u32::from_be_bytes(d[8..12].try_into().unwrap_or([0; 4])),
                )
            })
            .collect();
        for &(lba, n) in &ranges {
            self.check_range(lba, n)?;
        }
        let zero = vec![0u8; self.config.block_size as usize];
        for (lba, n) in ranges {
            self.fill(lba, n as u64, &zero, true)?;
        }
        Ok(())
    }

    pub(crate) fn inquiry(&self, evpd: bool, page: u8) -> Result<Vec<u8>, Sense> {
        let c = &self.config;
        if !evpd {
            // SPC-4 6.6.2 standard INQUIRY data, 36 bytes + version descriptors.
            let mut d = vec![0u8; 36];
            d[0] = 0x00; // connected, direct-access block device
            if c.removable {
                d[1] = 0x80; // RMB
            }
            d[2] = 0x06; // SPC-4
            d[3] = 0x02; // response data format 2
            if c.norm_aca {
                d[3] |= 0x20; // NORMACA
            }
            if c.protection.is_some() {
                d[5] |= 0x01; // PROTECT
            }
            d[7] = 0x02; // CMDQUE
            d[8..16].copy_from_slice(&pad(&c.vendor, 8));
            d[16..32].copy_from_slice(&pad(&c.product, 16));
            d[32..36].copy_from_slice(&pad(&c.revision, 4));
            d[4] = (d.len() - 5) as u8;
            return Ok(d);
        }
        let body: Vec<u8> = match page {
            0x00 => VPD_PAGES.to_vec(),
            0x80 => pad(&c.serial, c.serial.len().min(250)),
            0x83 => {
                // SPC-4 7.8.6: NAA designator (binary) and T10 vendor id (ASCII).
                let naa = (c.naa & 0x0fff_ffff_ffff_ffff) | 0x5000_0000_0000_0000;
                let mut b = vec![0x01, 0x03, 0x00, 0x08];
                b.extend_from_slice(&naa.to_be_bytes());
                let mut t10 = pad(&c.vendor, 8);
                t10.extend_from_slice(c.serial.as_bytes());
                t10.truncate(200);
                b.extend_from_slice(&[0x02, 0x01, 0x00, t10.len() as u8]);
                b.extend_from_slice(&t10);
                b
            }
            0x86 => {
                // SPC-4 7.8.7 Extended INQUIRY Data.
                let mut b = vec![0u8; 0x3c];
                if let Some(ty) = c.protection {
                    b[0] = ty.spt() << 3 | 0x04; // SPT, GRD_CHK
                    match ty {
                        PiType::Type1 => b[0] |= 0x01, // REF_CHK
                        // APP_CHK and REF_CHK: 32-byte CDBs carry both.
                        PiType::Type2 => b[0] |= 0x03,
                        PiType::Type3 => {}
                    }
                }
                b[1] = 0x07; // HEADSUP, ORDSUP, SIMPSUP
                if c.nv_cache {
                    b[2] = 0x02; // NV_SUP
                }
                b
            }
            0xb0 => {
                // SBC-3 6.5.3 block limits.
                let mut b = vec![0u8; 0x3c];
                b[0] = 0x01; // WSNZ
                b[1] = MAX_CAW_BLOCKS as u8;
                b[4..8].copy_from_slice(&MAX_TRANSFER_BLOCKS.to_be_bytes());
                // OPTIMAL TRANSFER LENGTH: the maximum, as LIO reports.
                // Linux's sd makes a valid optimal length the disk's
                // max_sectors, so 64 KiB here split every 1 MiB read into
                // sixteen commands (ib_srp reading from srptd sent 64 KiB
                // commands, and from LIO 512 KiB ones).
                b[8..12].copy_from_slice(&MAX_TRANSFER_BLOCKS.to_be_bytes());
                if c.thin {
                    b[16..20].copy_from_slice(&MAX_TRANSFER_BLOCKS.to_be_bytes()); // max unmap LBAs
                    b[20..24].copy_from_slice(&MAX_UNMAP_DESCRIPTORS.to_be_bytes());
                }
                b[32..40].copy_from_slice(&(MAX_TRANSFER_BLOCKS as u64).to_be_bytes()); // max write same
                b
            }
            0xb1 => {
                // SBC-3 6.5.2 block device characteristics: MEDIUM
                // ROTATION RATE 0001h non-rotating, 0000h not reported.
                let mut b = vec![0u8; 0x3c];
                let rate: u16 = if c.rotational { 0 } else { 1 };
                b[0..2].copy_from_slice(&rate.to_be_bytes());
                b
            }
            0xb2 => {
                // SBC-3 6.5.4: LBPU, LBPWS, LBPWS10, LBPRZ; thin provisioned.
                if c.thin {
                    vec![0, 0xe4, 0x02, 0] // threshold, LBPU|LBPWS|LBPWS10|LBPRZ, thin
                } else {
                    vec![0u8; 4]
                }
            }
            _ => return Err(Sense::invalid_field(2, None)),
        };
        let mut d = vec![0x00, page];
        d.extend_from_slice(&(body.len() as u16).to_be_bytes());
        d.extend_from_slice(&body);
        Ok(d)
    }

    /// SPC-4 5.9.1: whether `cmd` from `n` conflicts with a persistent
    /// reservation ([`crate::pr::PrState::conflicts`]).
    #[inline]
    pub(crate) fn pr_conflicts(&self, n: &crate::target::Nexus, cmd: &Command) -> bool {
        self.reserved.load(SeqCst) && self.pr_state().conflicts(n, cmd)
    }

    /// [`crate::pr::PrState::conflicts_passed`] for a unit that passes
    /// its commands on.
    #[inline]
    pub(crate) fn pr_conflicts_passed(
        &self,
        n: &crate::target::Nexus,
        cdb: &[u8],
        data_in: bool,
    ) -> bool {
        self.reserved.load(SeqCst) && self.pr_state().conflicts_passed(n, cdb, data_in)
    }

    /// The persistent reservation state, locked, for reading: a change
    /// goes through [`Device::with_pr_mut`].
    pub(crate) fn pr_state(&self) -> std::sync::MutexGuard<'_, crate::pr::PrState> {
        self.pr.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the persistent reservation state, which it may change.
    pub(crate) fn with_pr_mut<T>(&self, f: impl FnOnce(&mut crate::pr::PrState) -> T) -> T {
        let mut pr = self.pr_state();
        let out = f(&mut pr);
        self.reserved.store(pr.is_reserved(), SeqCst);
        out
    }

    /// Writes (APTPL set) or removes (APTPL clear) the PR state file.
    pub(crate) fn persist_pr(&self, st: &crate::pr::PrState) -> std::io::Result<()> {
        let Some(path) = &self.config.pr_file else {
            return Ok(());
        };
        if st.aptpl() {
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, st.to_text())?;
            std::fs::rename(&tmp, path)
        } else {
            match std::fs::remove_file(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        }
    }

    /// Current mode parameters.
    pub fn mode_state(&self) -> ModeState {
        ModeState::from_bits(self.mode.load(SeqCst))
    }

    fn mode_page(&self, page: u8, pc: u8) -> Vec<u8> {
        // pc: 0 current, 1 changeable, 2 default, 3 saved (SPC-4 6.11).
        let st = match pc {
            0 => self.mode_state(),
            1 => ModeState {
                wce: true,
                d_sense: true,
            }, // changeable mask
            _ => ModeState {
                wce: self.config.write_cache,
                d_sense: false,
            },
        };
        match page {
            0x08 => {
                // SBC-3 6.4.5 caching: WCE (byte 2 bit 2).
                let mut p = vec![0u8; 20];
                p[0] = 0x08;
                p[1] = 18;
                if st.wce {
                    p[2] = 0x04;
                }
                p
            }
            0x0a => {
                // SPC-4 7.5.8 control: D_SENSE (byte 2 bit 2), QERR 0.
                let mut p = vec![0u8; 12];
                p[0] = 0x0a;
                p[1] = 10;
                if st.d_sense {
                    p[2] = 0x04;
                }
                // ATO: the application tag is the client's; the target
                // never modifies it (not changeable).
                if self.config.protection.is_some() && pc != 1 {
                    p[5] |= 0x80;
                }
                p
            }
            _ => {
                // SPC-4 7.5.10 informational exceptions control: all off.
                let mut p = vec![0u8; 12];
                p[0] = 0x1c;
                p[1] = 10;
                p
            }
        }
    }

    /// SPC-4 6.9/6.10 MODE SELECT: only WCE and D_SENSE may change; every
    /// other byte of a page must equal its current value.
    fn mode_select(&self, ten: bool, p: &[u8]) -> Result<(), Sense> {
        let bad = |byte: usize| Sense {
            key: SenseKey::IllegalRequest,
            asc: Asc::INVALID_FIELD_IN_PARAMETER_LIST,
            field: Some(crate::sense::FieldPointer {
                in_cdb: false,
                byte: byte.min(0xffff) as u16,
                bit: None,
            }),
            information: None,
        };
        if p.is_empty() {
            return Ok(());
        }
        let hdr = if ten { 8 } else { 4 };
        if p.len() < hdr {
            return Err(Sense::new(
                SenseKey::IllegalRequest,
                Asc::PARAMETER_LIST_LENGTH_ERROR,
            ));
        }
        let bdl = if ten {
            u16::from_be_bytes([p[6], p[7]]) as usize
        } else {
            p[3] as usize
        };
        if bdl != 0 && bdl != 8 {
            return Err(bad(if ten { 6 } else { 3 }));
        }
        if bdl == 8 {
            let bd = p.get(hdr..hdr + 8).ok_or(Sense::new(
                SenseKey::IllegalRequest,
                Asc::PARAMETER_LIST_LENGTH_ERROR,
            ))?;
            if u32::from_be_bytes([bd[4], bd[5], bd[6], bd[7]]) != self.config.block_size {
                return Err(bad(hdr + 5));
            }
        }
        let mut new = self.mode_state();
        let mut off = hdr + bdl;
        while off < p.len() {
            let Some(&[code, len]) = p.get(off..off + 2).map(|s| [s[0], s[1]]).as_ref() else {
                return Err(Sense::new(
                    SenseKey::IllegalRequest,
                    Asc::PARAMETER_LIST_LENGTH_ERROR,
                ));
            };
            let page = code & 0x3f;
            if code & 0x40 != 0 || !matches!(page, 0x08 | 0x0a | 0x1c) {
                return Err(bad(off));
            }
            let cur = self.mode_page(page, 0);
            let got = p.get(off..off + 2 + len as usize).ok_or(Sense::new(
                SenseKey::IllegalRequest,
                Asc::PARAMETER_LIST_LENGTH_ERROR,
            ))?;
            if got.len() != cur.len() {
                return Err(bad(off + 1));
            }
            let mask = self.mode_page(page, 1);
            for i in 2..cur.len() {
                if (got[i] ^ cur[i]) & !mask[i] != 0 {
                    return Err(bad(off + i));
                }
            }
            match page {
                0x08 => new.wce = got[2] & 0x04 != 0,
                0x0a => new.d_sense = got[2] & 0x04 != 0,
                _ => {}
            }
            off += cur.len();
        }
        self.mode.store(new.bits(), SeqCst);
        Ok(())
    }

    fn mode_sense(
        &self,
        ten: bool,
        dbd: bool,
        pc: u8,
        page: u8,
        subpage: u8,
    ) -> Result<Vec<u8>, Sense> {
        if pc == 3 {
            return Err(Sense::new(
                SenseKey::IllegalRequest,
                Asc::SAVING_PARAMETERS_NOT_SUPPORTED,
            ));
        }
        if subpage != 0 && subpage != 0xff {
            return Err(Sense::invalid_field(3, None));
        }
        let pages: &[u8] = match page {
            0x08 => &[0x08],
            0x0a => &[0x0a],
            0x1c => &[0x1c],
            0x3f => &[0x08, 0x0a, 0x1c],
            _ => return Err(Sense::invalid_field(2, Some(5))),
        };
        let wp = if self.config.read_only { 0x80 } else { 0 };
        let mut bd = Vec::new();
        if !dbd {
            // SBC-3 6.4.2 short block descriptor.
            bd.extend_from_slice(&(self.blocks().min(0xffff_ffff) as u32).to_be_bytes());
            bd.extend_from_slice(&self.config.block_size.to_be_bytes());
        }
        let body: Vec<u8> = pages.iter().flat_map(|&p| self.mode_page(p, pc)).collect();
        let mut d = if ten {
            let mut h = vec![0u8; 8];
            h[3] = wp;
            h[6..8].copy_from_slice(&(bd.len() as u16).to_be_bytes());
            h
        } else {
            vec![0, 0, wp, bd.len() as u8]
        };
        d.extend_from_slice(&bd);
        d.extend_from_slice(&body);
        let mdl = d.len() - if ten { 2 } else { 1 };
        if ten {
            d[0..2].copy_from_slice(&(mdl as u16).to_be_bytes());
        } else {
            d[0] = mdl as u8;
        }
        Ok(d)
    }
}

/// SPC-4 6.35 REPORT SUPPORTED OPERATION CODES, from the opcode table;
/// READ(32)/WRITE(32) only on a type 2 unit (`variable`), the one kind
/// that accepts them.
fn report_opcodes(options: u8, opcode: u8, variable: bool) -> Result<Vec<u8>, Sense> {
    if options == 0 {
        let mut d = vec![0u8; 4];
        for &op in Opcode::ALL {
            if op == Opcode::VariableLength && !variable {
                continue;
            }
            let len = op.cdb_len().unwrap_or(0) as u16;
            let sas = op.service_actions();
            let entries: Vec<(u16, u8)> = if sas.is_empty() {
                vec![(0, 0)]
            } else {
                sas.iter().map(|&sa| (sa, 1)).collect()
            };
            for (sa, servactv) in entries {
                let [s0, s1] = sa.to_be_bytes();
                let [l0, l1] = len.to_be_bytes();
                d.extend_from_slice(&[u8::from(op), 0, s0, s1, 0, servactv, l0, l1]);
            }
        }
        let n = (d.len() - 4) as u32;
        d[0..4].copy_from_slice(&n.to_be_bytes());
        return Ok(d);
    }
    // Options 1: one opcode without service action.
    let op = Opcode::from(opcode);
    if !op.service_actions().is_empty() {
        return Err(Sense::invalid_field(2, None));
    }
    match op.cdb_len() {
        None => Ok(vec![0, 0x01, 0, 0]), // not supported
        Some(len) => {
            // CDB usage map: opcode, then every bit usable (coarse).
            let mut d = vec![0, 0x03, 0, len as u8, opcode];
            d.resize(d.len() + len - 2, 0xff);
            d.push(0x07);
            Ok(d)
        }
    }
}

const VPD_PAGES: [u8; 7] = [0x00, 0x80, 0x83, 0x86, 0xb0, 0xb1, 0xb2];

/// Byte of the TRANSFER LENGTH field for a read/write CDB.
fn length_field(cdb: &[u8]) -> u16 {
    let op = crate::opcode::Opcode::from(cdb.first().copied().unwrap_or(0));
    match op.cdb_len().unwrap_or(16) {
        10 => 7,
        12 => 6,
        32 => 28,
        _ => 10,
    }
}
