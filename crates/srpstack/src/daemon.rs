//! The SRP target daemon: a [`Config`] brought to life on a soft RoCE NIC,
//! a control socket for `srptadm`, and a metrics endpoint.
//!
//! [`Daemon::start`] builds the devices, the LUN maps (default set and
//! security groups) and one SRP target port per `[[target]]`, each on its
//! own soft RoCE NIC, all over one SCSI target, and serves logins by RDMA
//! CM and IB CM. Each port counts what it executes per LUN; `show` and
//! the metrics name the target, the LUN and its device.
//! [`Daemon::handle`] executes one admin [`Request`]; every change goes to
//! the running configuration too, so `write-config` saves what runs (as
//! `scstadmin -write_config` does). LUN map changes raise REPORTED LUNS
//! DATA HAS CHANGED on the affected nexuses and send SRP_AER_REQ to every
//! channel. Every request is logged as a [`crate::log::Record`]: changes
//! and refusals at info and warn level, queries at debug level.
//!
//! The control socket is created mode 0600 and also checks the peer's
//! credentials: only the daemon's own user may use it.
//!
//! [`preflight`] (`srptd --check`, and `srptd` before it makes
//! anything) tries what a start opens and binds, device files with the
//! access they need included, so that a configuration it passes does not
//! fail to start for a path or an address; what still fails at start
//! (no subnet manager, a race) names file, line and key, and takes back
//! the image files and the control socket it made.

use crate::config::{
    check_initiator, Config, ConfigError, DeviceSection, GroupSection, Handler, LunEntry,
};
use rdma_types::Guid;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use srp_target::TargetPort;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use toml::Spanned;

/// One admin request, as JSON on the control socket (`{"cmd": "..."}`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum Request {
    /// Target name, address, parameters, state.
    Show,
    /// Channels with credits and commands in flight.
    Sessions,
    /// Devices with handler, size and counters.
    Devices,
    /// The default LUNs and the groups.
    Luns,
    /// Adds a device given as a `[[device]]` table body in TOML.
    AddDevice {
        toml: String,
    },
    RemoveDevice {
        name: String,
    },
    /// Grows a device to `size` (K/M/G/T suffixes): CAPACITY DATA HAS
    /// CHANGED for every nexus that sees it and SRP_AER_REQ to its
    /// initiators (SCST's `resync_size`).
    Resize {
        device: String,
        size: String,
    },
    /// Maps a device; `group` absent means the default LUNs.
    AddLun {
        group: Option<String>,
        lun: u32,
        device: String,
    },
    RemoveLun {
        group: Option<String>,
        lun: u32,
    },
    AddGroup {
        name: String,
    },
    RemoveGroup {
        name: String,
    },
    AddInitiator {
        group: String,
        initiator: String,
    },
    RemoveInitiator {
        group: String,
        initiator: String,
    },
    /// Accept logins on `target` (a name or address), or on every target.
    Enable {
        #[serde(default)]
        target: Option<String>,
    },
    /// Refuse logins on `target`, or on every target, and log its
    /// initiators out.
    Disable {
        #[serde(default)]
        target: Option<String>,
    },
    /// Saves the running configuration (to the file it was loaded from
    /// when `path` is absent).
    WriteConfig {
        path: Option<PathBuf>,
    },
    /// Re-reads the configuration file and applies what changed in
    /// devices, LUN maps, groups and `enabled`, without dropping sessions.
    Reload,
    /// Changes the log threshold while running (SCST's `trace_level`).
    SetLogLevel {
        level: crate::log::Level,
    },
}

impl Request {
    /// The event a successful request is logged as, and whether it
    /// changed anything (queries are logged at debug level).
    fn event(&self) -> (&'static str, bool) {
        match self {
            Request::Show | Request::Sessions | Request::Devices | Request::Luns => {
                ("admin_query", false)
            }
            Request::AddDevice { .. } => ("device_added", true),
            Request::RemoveDevice { .. } => ("device_removed", true),
            Request::Resize { .. } => ("device_resized", true),
            Request::AddLun { .. } => ("lun_added", true),
            Request::RemoveLun { .. } => ("lun_removed", true),
            Request::AddGroup { .. } => ("group_added", true),
            Request::RemoveGroup { .. } => ("group_removed", true),
            Request::AddInitiator { .. } => ("initiator_added", true),
            Request::RemoveInitiator { .. } => ("initiator_removed", true),
            Request::Enable { .. } => ("target_enabled", true),
            Request::Disable { .. } => ("target_disabled", true),
            Request::WriteConfig { .. } => ("config_written", true),
            Request::Reload => ("reloaded", true),
            Request::SetLogLevel { .. } => ("log_level_set", true),
        }
    }
}

/// The running daemon.
pub struct Daemon {
    cfg: Mutex<Config>,
    cfg_path: Option<PathBuf>,
    scsi: Arc<scsi::Target>,
    devices: Mutex<BTreeMap<String, Arc<scsi::Device>>>,
    /// One per `[[target]]`, in the file's order.
    targets: Vec<TargetRt>,
    log: crate::log::Log,
}

/// One target port at work: its NIC, the port, its CM agent and I/O
/// controller. The SCSI target behind it is the daemon's, shared.
struct TargetRt {
    port: Arc<TargetPort>,
    guid: Guid,
    nic: Arc<rnic::softroce::SoftRoce>,
    /// The access layer the target port reaches the NIC through: it
    /// counts every verbs object the port holds.
    access: rdma_access::resource::AccessLayer,
    /// The access layer's client the CM agent is tracked in: its CM ids
    /// (connections and listens), MAD agents and SA subscriptions, and
    /// (soft RoCE fabric) its QP1 objects. Closed first at shutdown.
    cm: Arc<rdma_access::resource::TrackedProvider>,
    /// The I/O controller offered to discovery, and the DM agent (dropped
    /// in this order).
    _dm: (rdma_access::dm::IocHandle, rdma_access::dm::DmService),
    /// The port's SMA and MAD driver in the `ib` fabric.
    ib_port: Option<crate::ib::IbPort>,
}

/// What `srptd` says about one running target when it starts.
#[derive(Debug, Clone)]
pub struct TargetSummary {
    /// The target name (port GID, SCST style).
    pub name: String,
    /// The CA GUID: id_ext, ioc_guid and IB CM service ID.
    pub guid: Guid,
    /// The LID the SM gave the port (`ib` fabric).
    pub lid: Option<u16>,
}

/// The limits an I/O controller profile advertises.
fn tcfg_summary(t: &crate::config::TargetSection) -> crate::IocLimits {
    crate::IocLimits {
        send_queue_depth: (*t.srpt_srq_size.get_ref()).min(u16::MAX as u32) as u16,
        send_size: *t.srp_max_req_size.get_ref(),
        rdma_size: *t.srp_max_rdma_size.get_ref(),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What a device's identity (its NAA designator, and its serial unless
/// `usn` sets it) is derived from, stable across restarts. With `usn`,
/// the usn alone: two hosts exporting one shared disk give it the same
/// usn and so the same NAA, and multipath joins their paths. Without, the
/// host's identity and the device name: two srptd on one host exporting
/// an image under one name are paths to one LU, while two hosts' default
/// `ram0` are two LUs. (SCST derives the IDs from the name alone, and asks
/// for `scst_vdisk_ID` to differ per host; dm-multipath on an initiator
/// that sees two hosts with equal IDs would join two different disks.)
fn identity_key(usn: Option<&str>, name: &str, host: &str) -> String {
    match usn {
        Some(u) => format!("usn:{u}"),
        None => format!("{host}/{name}"),
    }
}

/// This host's identity for [`identity_key`]: the machine ID (systemd's
/// `/etc/machine-id`, or D-Bus's copy), else the host name, read once.
fn host_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        ["/etc/machine-id", "/var/lib/dbus/machine-id"]
            .iter()
            .find_map(|p| {
                let id = std::fs::read_to_string(p).ok()?.trim().to_string();
                (!id.is_empty()).then_some(id)
            })
            .or_else(|| {
                let mut buf = [0u8; 256];
                // SAFETY: gethostname writes at most buf.len() bytes.
                let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
                (r == 0).then(|| {
                    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
                    String::from_utf8_lossy(&buf[..end]).into_owned()
                })
            })
            .unwrap_or_default()
    })
}

/// Why a device cannot be opened: the span and the key (in its
/// `[[device]]` table) at fault, and what to do about it.
type DeviceError = (std::ops::Range<usize>, &'static str, String);

/// The error of device `i` of `cfg`, naming file, line and key.
fn device_error(cfg: &Config, i: usize, (span, key, message): DeviceError) -> ConfigError {
    cfg.error(span, format!("device[{i}].{key}"), message)
}

/// A device's store as a start opens it, and the file it created.
struct Store {
    backend: Arc<dyn scsi::Backend>,
    created: Option<CreatedFile>,
}

/// A store of a given size that holds nothing: what `--check` gives
/// [`scsi::Device::new`] to judge a device's geometry by the rules a
/// start meets, without creating, growing or allocating its store.
struct Geometry {
    size: u64,
    min_block_size: u32,
}

impl scsi::Backend for Geometry {
    fn size(&self) -> u64 {
        self.size
    }
    fn min_block_size(&self) -> u32 {
        self.min_block_size
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

/// The directory a path's file is (or would be) in.
fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Opens device `d`'s store as a start does: a fileio device's file
/// read-write unless `read_only` (O_DIRECT when `o_direct`), created at
/// `size` when missing and extended to it when shorter; a blockio
/// device's path with O_DIRECT. With `dry_run` (`--check`) nothing is
/// created, grown or allocated: a file the start would create is tried
/// as an unnamed file in its directory (O_TMPFILE, gone when closed), and
/// the store has the size the start would give it. Every reason a start
/// cannot open the store is an error here, with the fix.
fn open_store(d: &DeviceSection, dry_run: bool) -> Result<Store, DeviceError> {
    use std::os::unix::fs::FileTypeExt;
    let bs = *d.block_size.get_ref();
    let size = match &d.size {
        Some(s) => Some(crate::config::parse_size(s.get_ref()).map_err(|m| (s.span(), "size", m))?),
        None => None,
    };
    let handler = *d.handler.get_ref();
    if let Handler::Ram | Handler::NullIo = handler {
        let size = size.unwrap_or(0);
        let backend: Arc<dyn scsi::Backend> = match (handler, dry_run) {
            (_, true) => Arc::new(Geometry {
                size,
                min_block_size: 1,
            }),
            (Handler::Ram, false) => Arc::new(scsi::Ram::new(size)),
            _ => Arc::new(scsi::NullIo::new(size)),
        };
        return Ok(Store {
            backend,
            created: None,
        });
    }
    let file = d.filename.as_ref().ok_or_else(|| {
        let m = format!("handler {} needs a filename", handler.name());
        (d.handler.span(), "filename", m)
    })?;
    let (path, bad) = (file.get_ref(), |m: String| (file.span(), "filename", m));
    let shown = path.display();
    // A start creates a missing fileio image and extends a shorter one.
    let grows = handler == Handler::FileIo && !d.read_only && size.is_some();
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let dir = dir_of(path);
            if !dir.exists() {
                return Err(bad(format!(
                    "directory {} does not exist: create it (mkdir -p {}) or fix the path",
                    dir.display(),
                    dir.display()
                )));
            }
            return match (handler, grows) {
                (Handler::FileIo, true) => {
                    create_file(d, path, size.unwrap_or(0), dry_run).map_err(bad)
                }
                (Handler::FileIo, false) if d.read_only => Err(bad(format!(
                    "{shown} does not exist: a read_only device needs an existing file"
                ))),
                (Handler::FileIo, false) => Err(bad(format!(
                    "{shown} does not exist: create it, or set `size` and srptd creates it"
                ))),
                _ => Err(bad(format!(
                    "{shown} does not exist: vdisk_blockio opens an existing block device or file and creates none"
                ))),
            };
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
            return Err(bad(format!(
                "{shown}: a part of the path is not a directory: fix the path"
            )))
        }
        Err(e) => return Err(bad(format!("cannot open {shown}: {e}"))),
    };
    let kind = meta.file_type();
    if kind.is_dir() {
        return Err(bad(format!(
            "{shown} is a directory: name a file in it, e.g. {}",
            path.join(format!("{}.img", d.name.get_ref())).display()
        )));
    }
    if kind.is_block_device() && handler == Handler::FileIo {
        return Err(bad(format!(
            "{shown} is a block device: use handler = \"vdisk_blockio\""
        )));
    }
    if !kind.is_file() && !kind.is_block_device() {
        return Err(bad(format!(
            "{shown} is not a regular file or block device: name an image file or a disk"
        )));
    }
    let open_error = |e: std::io::Error| {
        let how = if d.read_only {
            "for reading"
        } else {
            "read-write"
        };
        let fix = match e.raw_os_error() {
            Some(libc::EACCES | libc::EPERM | libc::EROFS | libc::ETXTBSY) if !d.read_only => {
                ": make it writable or set read_only = true"
            }
            _ => "",
        };
        bad(format!("cannot open {shown} {how}: {e}{fix}"))
    };
    let (backend, len): (Arc<dyn scsi::Backend>, u64) = if handler == Handler::BlockIo {
        // A regular file is aligned to the LU's block size; a block
        // device to its own logical block size, which the LU's must be a
        // multiple of (checked by scsi::Device::new).
        let b = scsi::BlockIo::open(path, d.read_only, bs as usize).map_err(open_error)?;
        let len = scsi::Backend::size(&b);
        (Arc::new(b), len)
    } else {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(!d.read_only)
            .open(path)
            .map_err(open_error)?;
        let len = match size {
            Some(s) if grows && meta.len() < s => s,
            _ => meta.len(),
        };
        if len == 0 {
            return Err(bad(match d.read_only {
                true => format!("{shown} is empty: give it a length (truncate -s)"),
                false => format!("{shown} is empty: set `size` and srptd extends it"),
            }));
        }
        if !dry_run && len > meta.len() {
            f.set_len(len)
                .map_err(|e| bad(format!("cannot extend {shown} to {len} bytes: {e}")))?;
        }
        let io = file_io(d, f, path).map_err(bad)?;
        match dry_run {
            true => {
                let min_block_size = scsi::Backend::min_block_size(&io);
                (
                    Arc::new(Geometry {
                        size: len,
                        min_block_size,
                    }),
                    len,
                )
            }
            false => (Arc::new(io), len),
        }
    };
    if len % bs as u64 != 0 || len == 0 {
        return Err(bad(format!(
            "{shown} holds {len} bytes, not a positive multiple of block_size {bs}: resize it (truncate -s) or change block_size"
        )));
    }
    Ok(Store {
        backend,
        created: None,
    })
}

/// A fileio store over `f` (at `path`), buffered or O_DIRECT.
fn file_io(d: &DeviceSection, f: std::fs::File, path: &Path) -> Result<scsi::FileIo, String> {
    let path = path.display();
    if d.o_direct {
        scsi::FileIo::direct(f, d.write_through, *d.block_size.get_ref()).map_err(|e| {
            format!("{path}: O_DIRECT refused ({e}): set o_direct = false or keep the image on a file system with O_DIRECT")
        })
    } else {
        scsi::FileIo::new(f, d.write_through).map_err(|e| format!("{path}: {e}"))
    }
}

/// Creates fileio image `path` of `size` bytes, as the store of `d`; with
/// `dry_run`, only tries: an unnamed file in its directory.
fn create_file(d: &DeviceSection, path: &Path, size: u64, dry_run: bool) -> Result<Store, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let cannot = |e: std::io::Error| format!("cannot create {}: {e}", path.display());
    let mut open = std::fs::OpenOptions::new();
    open.read(true).write(true);
    if !dry_run {
        let f = open.create_new(true).open(path).map_err(cannot)?;
        // Removed again if the start fails from here on.
        let created = CreatedFile::new(path);
        f.set_len(size).map_err(cannot)?;
        return Ok(Store {
            backend: Arc::new(file_io(d, f, path)?),
            created: Some(created),
        });
    }
    let dir = dir_of(path);
    let min_block_size = match open.custom_flags(libc::O_TMPFILE).open(dir) {
        Ok(f) => scsi::Backend::min_block_size(&file_io(d, f, path)?),
        // A file system without unnamed files: ask for the access a
        // create needs, and O_DIRECT is seen at start.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)
            ) =>
        {
            let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(dir.as_os_str()))
                .map_err(|_| cannot(e))?;
            // SAFETY: c is a valid NUL-terminated path.
            if unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
                return Err(cannot(std::io::Error::last_os_error()));
            }
            if d.o_direct {
                *d.block_size.get_ref()
            } else {
                1
            }
        }
        Err(e) => return Err(cannot(e)),
    };
    Ok(Store {
        backend: Arc::new(Geometry {
            size,
            min_block_size,
        }),
        created: None,
    })
}

/// Device `d` over `backend`: its SCSI identity and geometry, checked as
/// [`scsi::Device::new`] checks them.
fn device_on(
    d: &DeviceSection,
    backend: Arc<dyn scsi::Backend>,
) -> Result<scsi::Device, DeviceError> {
    let name = d.name.get_ref();
    let bs = *d.block_size.get_ref();
    let usn = d.usn.as_ref().map(|u| u.get_ref().as_str());
    let key = identity_key(usn, name, host_id());
    let mut cfg = scsi::DeviceConfig {
        block_size: bs,
        read_only: d.read_only,
        thin: d.thin,
        rotational: d.rotational,
        serial: usn.map_or_else(|| format!("{:08x}", fnv(&key) as u32), str::to_string),
        naa: 0x5001_4050_0000_0000 | (fnv(&key) & 0xf_ffff_ffff),
        ..Default::default()
    };
    if let Some(v) = &d.t10_vendor_id {
        cfg.vendor = v.get_ref().clone();
    }
    if let Some(p) = &d.t10_product_id {
        cfg.product = p.get_ref().clone();
    }
    scsi::Device::new(cfg, backend).map_err(|e| (d.block_size.span(), "block_size", e))
}

/// Opens device `d` and builds it, as a start does; the image file it
/// created, if any, is removed when the returned guard is dropped unless
/// kept.
fn build_device(
    d: &DeviceSection,
) -> Result<(Arc<scsi::Device>, Option<CreatedFile>), DeviceError> {
    let store = open_store(d, false)?;
    let device = device_on(d, store.backend)?;
    Ok((Arc::new(device), store.created))
}

/// What [`build_device`] would meet, tried without creating or changing
/// anything.
fn probe_device(d: &DeviceSection) -> Result<(), DeviceError> {
    device_on(d, open_store(d, true)?.backend).map(drop)
}

/// A file this process made (a device's image, the control socket),
/// removed when dropped unless kept, so that a start that fails leaves
/// nothing behind. Only the file made is removed, not one another
/// process has put at the path since.
pub struct CreatedFile {
    path: PathBuf,
    /// Device and inode of the file made; `None` once kept.
    id: Option<(u64, u64)>,
}

impl CreatedFile {
    /// Takes charge of `path`, which this process has just made.
    pub fn new(path: &Path) -> CreatedFile {
        use std::os::unix::fs::MetadataExt;
        let id = std::fs::symlink_metadata(path)
            .ok()
            .map(|m| (m.dev(), m.ino()));
        CreatedFile {
            path: path.into(),
            id,
        }
    }

    /// Leaves the file in place.
    pub fn keep(mut self) {
        self.id = None;
    }
}

impl Drop for CreatedFile {
    fn drop(&mut self) {
        use std::os::unix::fs::MetadataExt;
        let Some(id) = self.id else { return };
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == id) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn lun(n: u32) -> Result<scsi::Lun, String> {
    scsi::Lun::new(n).map_err(|e| format!("LUN {n}: {e}"))
}

fn spanned<T>(v: T) -> Spanned<T> {
    Spanned::new(0..0, v)
}

/// The soft RoCE NIC's counters by name, for `show` and the metrics.
fn nic_counters(c: &rnic::softroce::SoftCaCounters) -> [(&'static str, u64); 9] {
    [
        ("packets_sent", c.tx_packets),
        ("datagrams_received", c.rx_datagrams),
        ("bad_icrc", c.rx_bad_icrc),
        ("retransmits", c.retransmits),
        ("retransmit_timeouts", c.timeouts),
        ("duplicate_requests", c.duplicates),
        ("out_of_sequence", c.out_of_sequence),
        ("sequence_naks_received", c.seq_naks_received),
        ("pkey_violations", c.pkey_violations),
    ]
}

impl TargetRt {
    /// Starts target `t` (the `n`th) on its own soft RoCE NIC, over the
    /// shared SCSI target. An error names the span and key (in the
    /// target's table) it belongs to.
    fn start(
        t: &crate::config::TargetSection,
        n: u32,
        scsi: &Arc<scsi::Target>,
        log: crate::log::Log,
    ) -> Result<TargetRt, (std::ops::Range<usize>, &'static str, String)> {
        // What fails here fails on the port's NIC, at its address, unless
        // said otherwise.
        let nic_err = |m: String| (t.ip.span(), "ip", m);
        let ib = t.fabric == crate::ib::Fabric::Ib;
        // Every port has its own GUID, from its address (crate::ib): on a
        // managed subnet the SM keys LIDs by it, and in either mode it is
        // the target port ID (id_ext and ioc_guid, as ib_srpt's are its
        // HCA's GUID), which Linux ib_srp keeps unique per initiator port:
        // two targets with one ID cannot both be logged in to.
        let guid = crate::ib::ib_guid(*t.ip.get_ref());
        let provider = rnic::softroce::SoftRoce::new(
            vec![rnic::softroce::SoftCa {
                guid,
                ip: *t.ip.get_ref(),
            }],
            *t.udp_port.get_ref(),
        );
        // MAD transaction IDs of this process's agents, apart per target.
        let tid_base = (std::process::id() << 8) | (n & 0xff);
        // Target port ID = id_ext then ioc_guid, both the CA GUID (ib_srpt).
        let chan = srp::initiator::ChannelConfig::new(0, guid, guid.0, guid);
        let mut tcfg = srp::target::TargetConfig::new(chan.target_port_id(), "srptd");
        tcfg.max_req_size = *t.srp_max_req_size.get_ref();
        tcfg.max_rsp_size = *t.srp_max_rsp_size.get_ref();
        tcfg.max_rdma_size = *t.srp_max_rdma_size.get_ref();
        tcfg.srq_size = *t.srpt_srq_size.get_ref();
        tcfg.sq_size = *t.srpt_sq_size.get_ref();
        tcfg.max_channels = *t.max_channels.get_ref() as usize;
        tcfg.enabled = t.enabled;
        let nic = provider.clone();
        // The target port and the CM agent reach the NIC through clients
        // of the access layer, which track every verbs object they make
        // and, for the CM agent, its CM ids, MAD agents and subscriptions.
        let access = rdma_access::resource::AccessLayer::new(provider.clone());
        let cm = access.client("cm").into_provider();
        // The ib personality is set before the CA is first opened: the
        // port, its SMA and MAD driver start here, and the SM's sweep
        // brings it ACTIVE (waited for at the end, once everything serves).
        let ib_port = if ib {
            let ip = *t.ip.get_ref();
            let port = crate::ib::IbPort::start(
                provider.clone(),
                guid,
                ip,
                &format!("srptd {ip}"),
                true,
                tid_base,
            )
            .map_err(nic_err)?;
            Some(port)
        } else {
            None
        };
        let port = Arc::new(
            TargetPort::start(
                access.client("srp target").into_provider(),
                guid,
                tcfg,
                scsi.clone(),
                srp_target::PortOptions {
                    // Checked when the file was read.
                    pkeys: t
                        .pkey
                        .get_ref()
                        .pkeys()
                        .map_err(|m| (t.pkey.span(), "pkey", m))?,
                    login_timeout: Duration::from_millis(*t.login_timeout_ms.get_ref()),
                    max_pending_logins: *t.max_pending_logins.get_ref() as usize,
                    max_pending_per_initiator: *t.max_pending_per_initiator.get_ref() as usize,
                    keepalive: Some(*t.keepalive_ms.get_ref())
                        .filter(|&ms| ms > 0)
                        .map(Duration::from_millis),
                    ..Default::default()
                },
            )
            .map_err(|e| nic_err(format!("start the target port: {e}")))?,
        );
        // SCST's rel_tgt_id: the port's relative port identifier (VPD 83h,
        // PR READ FULL STATUS), fixed before any command numbers it.
        scsi.set_relative_port_id(port.name(), *t.rel_tgt_id.get_ref())
            .map_err(|e| (t.rel_tgt_id.span(), "rel_tgt_id", e.to_string()))?;
        // On the ib fabric the port's node started the agent on the NIC
        // (the tree adopts its QP0/QP1 objects; its CM ids, MAD agents
        // and subscriptions hang under them).
        let agent = match &ib_port {
            Some(p) => p.agent().clone(),
            None => rdma_access::CmAgent::start(cm.clone(), guid, tid_base)
                .map_err(|e| nic_err(format!("start the CM agent on {}: {e}", t.ip.get_ref())))?,
        };
        agent
            .track_in(cm.client())
            .map_err(|e| nic_err(format!("track the CM agent: {e}")))?;
        // Discovery: the device management agent offers the target as an
        // SRP I/O controller, as ib_srpt does (srp_daemon, `srp discover`).
        let dm = rdma_access::dm::DmService::start(&agent)
            .map_err(|e| nic_err(format!("start the DM agent: {e}")))?;
        let ioc = dm
            .register_ioc(crate::srp_ioc(guid, &tcfg_summary(t)))
            .map_err(|e| nic_err(format!("register the I/O controller: {e}")))?;
        let listen = crate::Listen {
            // 0 turns RDMA CM off (ib_srpt), it does not mean port 0.
            rdma_cm_port: (t.rdma_cm_port != 0).then_some(t.rdma_cm_port),
            // ib_srpt listens on the ioc_guid.
            ib_service_id: t.ib_cm.then_some(guid.0),
        };
        crate::serve_cm(agent, port.clone(), listen, log);
        // Everything serves: now the SM may bring the port up (a trap 64
        // subscriber then finds the I/O controller at once).
        if let Some(p) = &ib_port {
            let wait = *t.sm_wait_ms.get_ref();
            p.wait_active(std::time::Duration::from_millis(wait))
                .map_err(|m| (t.sm_wait_ms.span(), "sm_wait_ms", m))?;
        }
        Ok(TargetRt {
            port,
            guid,
            nic,
            access,
            cm,
            _dm: (ioc, dm),
            ib_port,
        })
    }

    /// The LID the SM gave the port (`ib` fabric only).
    fn lid(&self) -> Option<u16> {
        self.ib_port.as_ref().map(|p| p.lid())
    }
}

impl Daemon {
    /// Builds everything `cfg` describes and starts serving logins on
    /// every target. `log` takes a record per event. An error names the
    /// file, line and key it comes from, and the image files this start
    /// created are removed again ([`preflight`] finds most such errors
    /// before anything is made).
    pub fn start(
        cfg: Config,
        cfg_path: Option<PathBuf>,
        log: crate::log::Log,
    ) -> Result<Arc<Daemon>, ConfigError> {
        let scsi = Arc::new(scsi::Target::new());
        let mut devices = BTreeMap::new();
        let mut created = Vec::new();
        for (i, d) in cfg.devices.iter().enumerate() {
            let (device, made) = build_device(d).map_err(|e| device_error(&cfg, i, e))?;
            created.extend(made);
            devices.insert(d.name.get_ref().clone(), device);
        }
        let lun_at = |l: &LunEntry, at: String| {
            lun(*l.lun.get_ref()).map_err(|m| cfg.error(l.lun.span(), at, m))
        };
        for (j, l) in cfg.luns.iter().enumerate() {
            let n = lun_at(l, format!("lun[{j}].lun"))?;
            scsi.add_lun(None, n, devices[l.device.get_ref()].clone());
        }
        for (k, g) in cfg.groups.iter().enumerate() {
            let name = g.name.get_ref();
            scsi.add_group(name);
            for i in &g.initiators {
                scsi.add_initiator(name, i.get_ref());
            }
            for (j, l) in g.luns.iter().enumerate() {
                let n = lun_at(l, format!("group[{k}].lun[{j}].lun"))?;
                scsi.add_lun(Some(name), n, devices[l.device.get_ref()].clone());
            }
        }
        let mut targets = Vec::new();
        for (i, t) in cfg.targets.iter().enumerate() {
            let rt = TargetRt::start(t, i as u32, &scsi, log.clone())
                .map_err(|(span, k, m)| cfg.error(span, format!("{}.{k}", cfg.target_key(i)), m))?;
            targets.push(rt);
        }
        created.into_iter().for_each(CreatedFile::keep);
        Ok(Arc::new(Daemon {
            cfg: Mutex::new(cfg),
            cfg_path,
            scsi,
            devices: Mutex::new(devices),
            targets,
            log,
        }))
    }

    /// The running targets, in the configuration's order.
    pub fn targets(&self) -> Vec<TargetSummary> {
        self.targets
            .iter()
            .map(|t| TargetSummary {
                name: t.port.name().to_string(),
                guid: t.guid,
                lid: t.lid(),
            })
            .collect()
    }

    /// The first target's port.
    pub fn port(&self) -> &Arc<TargetPort> {
        &self.targets[0].port
    }

    /// The targets `which` names (a target name or address), or all.
    fn select(&self, which: Option<&str>) -> Result<Vec<(usize, &TargetRt)>, String> {
        let cfg = lock(&self.cfg);
        let all = self.targets.iter().enumerate();
        let Some(w) = which else {
            return Ok(all.collect());
        };
        let hit: Vec<_> = all
            .filter(|(i, t)| t.port.name() == w || cfg.targets[*i].ip.get_ref().to_string() == w)
            .collect();
        if hit.is_empty() {
            return Err(format!("no target `{w}` (give its name or address)"));
        }
        Ok(hit)
    }

    /// Enables or disables the targets `which` names, or all.
    fn set_enabled(&self, which: Option<String>, on: bool) -> Result<Value, String> {
        let hit = self.select(which.as_deref())?;
        let mut names = Vec::new();
        let mut cfg = lock(&self.cfg);
        for (i, t) in hit {
            t.port.set_enabled(on);
            cfg.targets[i].enabled = on;
            names.push(t.port.name().to_string());
        }
        Ok(json!({ "enabled": on, "targets": names }))
    }

    /// Tells every target's channels the LUN maps changed (SRP_AER_REQ);
    /// returns how many were told.
    fn luns_changed(&self) -> usize {
        self.targets
            .iter()
            .map(|t| t.port.notify(srp::target::AerEvent::LunsChanged))
            .sum()
    }

    /// The running configuration.
    pub fn config(&self) -> Config {
        lock(&self.cfg).clone()
    }

    /// Executes one admin request and logs it; `Err` is the message for
    /// the user.
    pub fn handle(&self, req: Request) -> Result<Value, String> {
        use crate::log::{Level, Record};
        let (event, changes) = req.event();
        let asked = serde_json::to_value(&req).unwrap_or(Value::Null);
        let cmd = asked["cmd"].as_str().unwrap_or("?").to_string();
        let reload = matches!(req, Request::Reload);
        let r = self.execute(req);
        let record = match &r {
            // The SIGHUP and `srptadm reload` lines scripts look for.
            Ok(v) if reload => Record::info(event, format!("reloaded: {v}")).fields_of(v),
            Err(e) if reload => Record::warn(
                "reload_refused",
                format!("reload refused, configuration unchanged: {e}"),
            )
            .field("error", e),
            Ok(v) => Record::new(
                if changes { Level::Info } else { Level::Debug },
                event,
                format!(
                    "{cmd} {}: {}",
                    args_of(&asked),
                    if changes { v.to_string() } else { "ok".into() }
                ),
            )
            .fields_of(&asked)
            .fields_of(if changes { v } else { &Value::Null }),
            Err(e) => Record::warn(
                "admin_refused",
                format!("{cmd} {} refused: {e}", args_of(&asked)),
            )
            .fields_of(&asked)
            .field("error", e),
        };
        self.log.emit(record);
        r
    }

    fn execute(&self, req: Request) -> Result<Value, String> {
        match req {
            Request::Show => Ok(self.show()),
            Request::Sessions => Ok(self.sessions()),
            Request::Devices => Ok(self.devices()),
            Request::Luns => Ok(self.luns()),
            Request::AddDevice { toml } => self.add_device(&toml),
            Request::RemoveDevice { name } => self.remove_device(&name),
            Request::Resize { device, size } => self.resize(&device, &size),
            Request::AddLun { group, lun, device } => self.add_lun(group, lun, device),
            Request::RemoveLun { group, lun } => self.remove_lun(group, lun),
            Request::AddGroup { name } => self.edit(|c| {
                if c.groups.iter().any(|g| g.name.get_ref() == &name) {
                    return Err(format!("group `{name}` exists"));
                }
                c.groups.push(GroupSection {
                    name: spanned(name.clone()),
                    initiators: Vec::new(),
                    luns: Vec::new(),
                });
                self.scsi.add_group(&name);
                Ok(json!({ "added": name }))
            }),
            Request::RemoveGroup { name } => self.edit(|c| {
                let i = c
                    .groups
                    .iter()
                    .position(|g| g.name.get_ref() == &name)
                    .ok_or_else(|| format!("no group `{name}`"))?;
                c.groups.remove(i);
                self.scsi.remove_group(&name);
                self.luns_changed();
                Ok(json!({ "removed": name }))
            }),
            Request::AddInitiator { group, initiator } => self.edit(|c| {
                check_initiator(&initiator)?;
                let g = group_mut(c, &group)?;
                if g.initiators.iter().any(|i| i.get_ref() == &initiator) {
                    return Err(format!("`{initiator}` is already in group `{group}`"));
                }
                g.initiators.push(spanned(initiator.clone()));
                self.scsi.add_initiator(&group, &initiator);
                self.luns_changed();
                Ok(json!({ "group": group, "added": initiator }))
            }),
            Request::RemoveInitiator { group, initiator } => self.edit(|c| {
                let g = group_mut(c, &group)?;
                let i = g
                    .initiators
                    .iter()
                    .position(|i| i.get_ref() == &initiator)
                    .ok_or_else(|| format!("`{initiator}` is not in group `{group}`"))?;
                g.initiators.remove(i);
                self.scsi.remove_initiator(&group, &initiator);
                self.luns_changed();
                Ok(json!({ "group": group, "removed": initiator }))
            }),
            Request::Enable { target } => self.set_enabled(target, true),
            Request::Disable { target } => self.set_enabled(target, false),
            Request::SetLogLevel { level } => {
                let was = self.log.set_level(level);
                Ok(json!({ "log_level": level, "was": was }))
            }
            Request::Reload => {
                let path = self
                    .cfg_path
                    .clone()
                    .ok_or("srptd was not started from a configuration file")?;
                let next = Config::load(&path).map_err(|e| e.to_string())?;
                self.reload(next)
            }
            Request::WriteConfig { path } => {
                let path = path
                    .or_else(|| self.cfg_path.clone())
                    .ok_or("no file given and srptd was not started from one")?;
                let text = lock(&self.cfg).to_toml();
                let tmp = path.with_extension("tmp-srptd");
                std::fs::write(&tmp, &text)
                    .and_then(|()| std::fs::rename(&tmp, &path))
                    .map_err(|e| format!("write {}: {e}", path.display()))?;
                Ok(json!({ "written": path }))
            }
        }
    }

    /// Applies `next` to the running target: new devices are opened, LUN
    /// maps, groups and their initiators change to what `next` says (unit
    /// attentions and SRP_AER_REQ as for `srptadm` changes), `enabled` is
    /// followed. Sessions stay up. Refused as a whole, with nothing
    /// changed, when a device that stays mapped changed its definition;
    /// target parameters that need a restart are kept and named.
    pub fn reload(&self, next: Config) -> Result<Value, String> {
        use std::collections::{BTreeMap, BTreeSet};
        let mut cfg = lock(&self.cfg);
        let text = |d: &DeviceSection| toml::to_string(d).unwrap_or_default();
        let old_devs: BTreeMap<String, String> = cfg
            .devices
            .iter()
            .map(|d| (d.name.get_ref().clone(), text(d)))
            .collect();
        let maps = |c: &Config| -> BTreeMap<Option<String>, BTreeMap<u32, String>> {
            let set = |ls: &[LunEntry]| {
                ls.iter()
                    .map(|l| (*l.lun.get_ref(), l.device.get_ref().clone()))
                    .collect::<BTreeMap<_, _>>()
            };
            let mut m = BTreeMap::new();
            m.insert(None, set(&c.luns));
            for g in &c.groups {
                m.insert(Some(g.name.get_ref().clone()), set(&g.luns));
            }
            m
        };
        let (old_maps, new_maps) = (maps(&cfg), maps(&next));
        // A changed device must not be mapped before or after.
        let mut changed = Vec::new();
        for d in &next.devices {
            let name = d.name.get_ref();
            if old_devs.get(name).is_some_and(|t| *t != text(d)) {
                changed.push(name.clone());
            }
        }
        let mapped = |m: &BTreeMap<Option<String>, BTreeMap<u32, String>>, dev: &str| {
            m.values().any(|s| s.values().any(|d| d == dev))
        };
        if let Some(d) = changed
            .iter()
            .find(|d| mapped(&old_maps, d) || mapped(&new_maps, d))
        {
            return Err(format!(
                "reload refused: device `{d}` changed while mapped; unmap it first or restart srptd"
            ));
        }
        // Open new and changed devices before touching any map.
        let (mut opened, mut created) = (BTreeMap::new(), Vec::new());
        for (i, d) in next.devices.iter().enumerate() {
            let name = d.name.get_ref();
            if !old_devs.contains_key(name) || changed.contains(name) {
                let (device, made) =
                    build_device(d).map_err(|e| device_error(&next, i, e).to_string())?;
                created.extend(made);
                opened.insert(name.clone(), device);
            }
        }
        created.into_iter().for_each(CreatedFile::keep);
        let mut devices = lock(&self.devices);
        devices.extend(opened);
        let mut lun_changes = 0;
        // Unmap what goes or changes, then map what comes.
        for (group, old) in &old_maps {
            let new = new_maps.get(group);
            for (n, dev) in old {
                if new.and_then(|m| m.get(n)) != Some(dev) {
                    self.scsi.remove_lun(group.as_deref(), lun(*n)?);
                    lun_changes += 1;
                }
            }
        }
        let old_groups: BTreeSet<&String> = cfg.groups.iter().map(|g| g.name.get_ref()).collect();
        let new_groups: BTreeSet<&String> = next.groups.iter().map(|g| g.name.get_ref()).collect();
        for g in old_groups.difference(&new_groups) {
            self.scsi.remove_group(g);
            lun_changes += 1;
        }
        for g in &next.groups {
            let name = g.name.get_ref();
            self.scsi.add_group(name);
            let old_inits: Vec<String> = cfg
                .groups
                .iter()
                .find(|o| o.name.get_ref() == name)
                .map(|o| o.initiators.iter().map(|i| i.get_ref().clone()).collect())
                .unwrap_or_default();
            let new_inits: Vec<String> = g.initiators.iter().map(|i| i.get_ref().clone()).collect();
            for i in old_inits.iter().filter(|i| !new_inits.contains(i)) {
                self.scsi.remove_initiator(name, i);
                lun_changes += 1;
            }
            for i in new_inits.iter().filter(|i| !old_inits.contains(i)) {
                self.scsi.add_initiator(name, i);
                lun_changes += 1;
            }
        }
        for (group, new) in &new_maps {
            let old = old_maps.get(group);
            for (n, dev) in new {
                if old.and_then(|m| m.get(n)) != Some(dev) {
                    let d = devices
                        .get(dev)
                        .cloned()
                        .ok_or_else(|| format!("no device `{dev}`"))?;
                    self.scsi.add_lun(group.as_deref(), lun(*n)?, d);
                    lun_changes += 1;
                }
            }
        }
        let kept: BTreeSet<String> = next
            .devices
            .iter()
            .map(|d| d.name.get_ref().clone())
            .collect();
        devices.retain(|name, _| kept.contains(name));
        drop(devices);
        // Target parameters: only `enabled` changes live, per target; a
        // target added or removed needs a restart.
        let mut restart = Vec::new();
        let key = |s: &crate::config::TargetSection| {
            toml::to_string(&{
                let mut s = s.clone();
                s.enabled = true;
                s
            })
            .unwrap_or_default()
        };
        if cfg.targets.len() != next.targets.len() {
            restart.push(format!(
                "{} targets instead of {}",
                next.targets.len(),
                cfg.targets.len()
            ));
        }
        let mut applied = next;
        let mut enabled = Vec::new();
        let new_targets = std::mem::take(&mut applied.targets);
        applied.targets = cfg.targets.clone();
        for (i, (t, rt)) in new_targets.iter().zip(&self.targets).enumerate() {
            if key(&applied.targets[i]) != key(t) {
                restart.push(format!(
                    "{} parameters other than enabled",
                    applied.target_key(i)
                ));
            }
            if t.enabled != rt.port.enabled() {
                rt.port.set_enabled(t.enabled);
            }
            applied.targets[i].enabled = t.enabled;
            enabled.push(t.enabled);
        }
        *cfg = applied;
        drop(cfg);
        let told = if lun_changes > 0 {
            self.luns_changed()
        } else {
            0
        };
        Ok(json!({
            "lun_map_changes": lun_changes,
            "aer_sent": told,
            // One target: its state, as before several were possible.
            "enabled": if enabled.len() == 1 { json!(enabled[0]) } else { json!(enabled) },
            "needs_restart": restart,
        }))
    }

    /// Runs `f` on a copy of the configuration; keeps the copy if `f`
    /// succeeds (it applies the change to the running target itself).
    fn edit(&self, f: impl FnOnce(&mut Config) -> Result<Value, String>) -> Result<Value, String> {
        let mut cfg = lock(&self.cfg);
        let mut next = cfg.clone();
        let v = f(&mut next)?;
        *cfg = next;
        Ok(v)
    }

    /// Every target's state; the first target's fields also at the top
    /// level, where they were before a file could have several.
    fn show(&self) -> Value {
        let all: Vec<Value> = (0..self.targets.len())
            .map(|i| self.show_target(i))
            .collect();
        let mut v = all[0].clone();
        if let Value::Object(m) = &mut v {
            m.insert("log_level".into(), json!(self.log.level()));
            m.insert("targets".into(), Value::Array(all));
        }
        v
    }

    fn show_target(&self, i: usize) -> Value {
        let c = lock(&self.cfg);
        let (t, rt) = (&c.targets[i], &self.targets[i]);
        let guid = rt.guid.0;
        let mut v = json!({
            "target": rt.port.name(),
            "id_ext": format!("{guid:016x}"),
            "ioc_guid": format!("{guid:016x}"),
            "ip": t.ip.get_ref().to_string(),
            "udp_port": t.udp_port.get_ref(),
            "rdma_cm_port": t.rdma_cm_port,
            "fabric": t.fabric,
            "lid": rt.lid(),
            "ib_cm_service_id": t.ib_cm.then(|| format!("{guid:016x}")),
            "enabled": rt.port.enabled(),
            "rel_tgt_id": t.rel_tgt_id.get_ref(),
            "srp_max_req_size": t.srp_max_req_size.get_ref(),
            "srp_max_rsp_size": t.srp_max_rsp_size.get_ref(),
            "srp_max_rdma_size": t.srp_max_rdma_size.get_ref(),
            "srpt_srq_size": t.srpt_srq_size.get_ref(),
            "srpt_sq_size": t.srpt_sq_size.get_ref(),
            "max_channels": t.max_channels.get_ref(),
            "login_timeout_ms": t.login_timeout_ms.get_ref(),
            "max_pending_logins": t.max_pending_logins.get_ref(),
            "max_pending_per_initiator": t.max_pending_per_initiator.get_ref(),
            "keepalive_ms": t.keepalive_ms.get_ref(),
            "pkey": t.pkey.get_ref(),
            "sessions": rt.port.sessions().len(),
            "channels": channel_phases(&rt.port.sessions()),
            "verbs_objects": rt.access.live_total(),
            "cm_ids": rt.access.live(rdma_access::resource::Kind::CmId),
            "mad_agents": rt.access.live(rdma_access::resource::Kind::MadAgent),
            "sa_subscriptions": rt.access.live(rdma_access::resource::Kind::SaSubscription),
        });
        drop(c);
        if let Value::Object(m) = &mut v {
            if let Some(c) = rt.nic.counters(rt.guid) {
                for (k, n) in nic_counters(&c) {
                    m.insert(format!("nic_{k}"), json!(n));
                }
            }
            m.insert("lun_stats".into(), self.lun_stats_json(rt));
        }
        v
    }

    /// A target's per-LUN counters, each with the name of its device
    /// (rows of a device removed since are left out).
    fn lun_stats(&self, rt: &TargetRt) -> Vec<(String, srp_target::LunStats)> {
        let devs = lock(&self.devices);
        rt.port
            .lun_stats()
            .into_iter()
            .filter_map(|s| {
                let name = devs.iter().find(|(_, d)| Arc::ptr_eq(d, &s.device))?.0;
                Some((name.clone(), s))
            })
            .collect()
    }

    fn lun_stats_json(&self, rt: &TargetRt) -> Value {
        self.lun_stats(rt)
            .into_iter()
            .map(|(device, s)| {
                let c = s.counters;
                json!({
                    "lun": s.lun.value(),
                    "device": device,
                    "commands": c.commands,
                    "reads": c.reads,
                    "writes": c.writes,
                    "read_bytes": c.read_bytes,
                    "write_bytes": c.write_bytes,
                    "errors": c.errors,
                    "tmfs": c.tmfs,
                })
            })
            .collect()
    }

    fn sessions(&self) -> Value {
        let v: Vec<Value> = self
            .targets
            .iter()
            .flat_map(|t| t.port.sessions().into_iter().map(move |s| (t.port.name(), s)))
            .map(|(target, s)| {
                json!({
                    "target": target,
                    "conn": s.conn.0,
                    "initiator": s.initiator,
                    "luns": self.scsi.visible_luns(&s.initiator).iter().map(|l| l.value()).collect::<Vec<_>>(),
                    "window": s.window,
                    "credits": s.credits,
                    "in_flight": s.in_flight,
                    "commands": s.cmds,
                    "tmfs": s.tmfs,
                    "aers": s.aers,
                    "closing": s.closing,
                    "state": s.phase.as_str(),
                    "memory_bytes": s.memory,
                    "keepalives": s.keepalives,
                    "pkey": s.pkey.0,
                })
            })
            .collect();
        Value::Array(v)
    }

    fn devices(&self) -> Value {
        let cfg = lock(&self.cfg);
        let devs = lock(&self.devices);
        let v: Vec<Value> = cfg
            .devices
            .iter()
            .filter_map(|d| {
                let dev = devs.get(d.name.get_ref())?;
                let s = dev.stats();
                Some(json!({
                    "name": d.name.get_ref(),
                    "handler": d.handler.get_ref().name(),
                    "filename": d.filename.as_ref().map(|f| f.get_ref().display().to_string()),
                    "size": dev.blocks() * dev.block_size() as u64,
                    "block_size": dev.block_size(),
                    "read_only": d.read_only,
                    "rotational": d.rotational,
                    "write_through": d.write_through,
                    "o_direct": d.o_direct,
                    "serial": dev.config.serial,
                    "naa": format!("{:016x}", dev.config.naa),
                    "stats": {
                        "commands": s.commands, "reads": s.reads, "writes": s.writes,
                        "read_bytes": s.read_bytes, "write_bytes": s.write_bytes,
                        "errors": s.errors,
                    },
                }))
            })
            .collect();
        Value::Array(v)
    }

    fn luns(&self) -> Value {
        let cfg = lock(&self.cfg);
        let map = |ls: &[LunEntry]| -> Vec<Value> {
            ls.iter()
                .map(|l| json!({ "lun": l.lun.get_ref(), "device": l.device.get_ref() }))
                .collect()
        };
        json!({
            "default": map(&cfg.luns),
            "groups": cfg.groups.iter().map(|g| json!({
                "name": g.name.get_ref(),
                "initiators": g.initiators.iter().map(|i| i.get_ref().clone()).collect::<Vec<_>>(),
                "luns": map(&g.luns),
            })).collect::<Vec<_>>(),
        })
    }

    fn add_device(&self, text: &str) -> Result<Value, String> {
        let d: DeviceSection =
            toml::from_str(text).map_err(|e| format!("device: {}", e.message().trim()))?;
        let name = d.name.get_ref().clone();
        let mut cfg = lock(&self.cfg);
        let mut next = cfg.clone();
        next.devices.push(d.clone());
        next.check()
            .map_err(|e| format!("{}: {}", e.key, e.message))?;
        // The table came in the request, not from the file: no line.
        let (dev, made) = build_device(&d).map_err(|(_, key, m)| format!("{key}: {m}"))?;
        made.into_iter().for_each(CreatedFile::keep);
        lock(&self.devices).insert(name.clone(), dev);
        *cfg = next;
        Ok(json!({ "added": name }))
    }

    fn remove_device(&self, name: &str) -> Result<Value, String> {
        self.edit(|c| {
            let i = c
                .devices
                .iter()
                .position(|d| d.name.get_ref() == name)
                .ok_or_else(|| format!("no device `{name}`"))?;
            let used = |ls: &[LunEntry]| {
                ls.iter()
                    .find(|l| l.device.get_ref() == name)
                    .map(|l| *l.lun.get_ref())
            };
            if let Some(l) = used(&c.luns) {
                return Err(format!(
                    "device `{name}` is mapped at default LUN {l}; remove the LUN first"
                ));
            }
            for g in &c.groups {
                if let Some(l) = used(&g.luns) {
                    return Err(format!(
                        "device `{name}` is mapped at LUN {l} of group `{}`; remove the LUN first",
                        g.name.get_ref()
                    ));
                }
            }
            c.devices.remove(i);
            lock(&self.devices).remove(name);
            Ok(json!({ "removed": name }))
        })
    }

    /// Grows device `name` to `size`. Shrinking is refused: SCST allows
    /// it, but blocks past the new end would be lost while initiators may
    /// still hold them in use (file systems, partition tables); remove the
    /// LUN and map a smaller device instead. The device must be mapped:
    /// the SCSI core resizes through a LUN, raising the unit attention on
    /// every nexus that reaches the device by any LUN.
    fn resize(&self, name: &str, size: &str) -> Result<Value, String> {
        self.edit(|c| {
            let bytes = crate::config::parse_size(size)?;
            let d = c
                .devices
                .iter_mut()
                .find(|d| d.name.get_ref() == name)
                .ok_or_else(|| format!("no device `{name}`"))?;
            let handler = *d.handler.get_ref();
            let dev = lock(&self.devices)
                .get(name)
                .cloned()
                .ok_or_else(|| format!("no device `{name}`"))?;
            let bs = u64::from(dev.block_size());
            let was = dev.blocks() * bs;
            if bytes == 0 || bytes % bs != 0 {
                return Err(format!(
                    "device `{name}`: size {bytes} is not a positive multiple of its block size {bs}"
                ));
            }
            if bytes < was {
                return Err(format!(
                    "device `{name}`: shrinking from {was} to {bytes} bytes is refused (data past the new end would be lost); unmap it and add a smaller device"
                ));
            }
            if bytes == was {
                return Ok(json!({ "device": name, "size": bytes, "was": was, "aer_sent": 0 }));
            }
            if handler != Handler::Ram {
                return Err(format!(
                    "device `{name}`: a {} device cannot be resized (only ram devices can)",
                    handler.name()
                ));
            }
            let mapped = c
                .luns
                .iter()
                .map(|l| (None, l))
                .chain(
                    c.groups
                        .iter()
                        .flat_map(|g| g.luns.iter().map(move |l| (Some(g.name.get_ref()), l))),
                )
                .find(|(_, l)| l.device.get_ref() == name)
                .map(|(g, l)| (g.cloned(), *l.lun.get_ref()));
            let Some((group, n)) = mapped else {
                return Err(format!(
                    "device `{name}` is not mapped at any LUN; map it first, or remove it and add it with the new size"
                ));
            };
            self.scsi
                .resize(group.as_deref(), lun(n)?, bytes / bs)
                .map_err(|e| format!("device `{name}`: resize: {e}"))?;
            d.size = Some(spanned(size.trim().to_string()));
            let told: usize = self
                .targets
                .iter()
                .map(|t| t.port.capacity_changed(&dev))
                .sum();
            Ok(json!({ "device": name, "size": bytes, "was": was, "aer_sent": told }))
        })
    }

    fn add_lun(&self, group: Option<String>, n: u32, device: String) -> Result<Value, String> {
        self.edit(|c| {
            let l = lun(n)?;
            let entry = LunEntry {
                lun: spanned(n),
                device: spanned(device.clone()),
            };
            match &group {
                Some(g) => group_mut(c, g)?.luns.push(entry),
                None => c.luns.push(entry),
            }
            c.check().map_err(|e| format!("{}: {}", e.key, e.message))?;
            let dev = lock(&self.devices)
                .get(&device)
                .cloned()
                .ok_or_else(|| format!("no device `{device}`"))?;
            self.scsi.add_lun(group.as_deref(), l, dev);
            let told = self.luns_changed();
            Ok(json!({ "group": group, "lun": n, "device": device, "aer_sent": told }))
        })
    }

    fn remove_lun(&self, group: Option<String>, n: u32) -> Result<Value, String> {
        self.edit(|c| {
            let l = lun(n)?;
            let luns = match &group {
                Some(g) => &mut group_mut(c, g)?.luns,
                None => &mut c.luns,
            };
            let i =
                luns.iter()
                    .position(|e| *e.lun.get_ref() == n)
                    .ok_or_else(|| match &group {
                        Some(g) => format!("group `{g}` has no LUN {n}"),
                        None => format!("no default LUN {n}"),
                    })?;
            luns.remove(i);
            self.scsi.remove_lun(group.as_deref(), l);
            let told = self.luns_changed();
            Ok(json!({ "group": group, "removed_lun": n, "aer_sent": told }))
        })
    }

    /// Prometheus text exposition of the counters. Series of a target
    /// carry its name as the `target` label.
    pub fn metrics(&self) -> String {
        type Rows = Vec<(String, u64)>;
        let mut out = String::new();
        let mut metric = |name: &str, help: &str, kind: &str, rows: Rows| {
            out += &format!("# HELP {name} {help}\n# TYPE {name} {kind}\n");
            for (labels, v) in rows {
                out += &format!("{name}{labels} {v}\n");
            }
        };
        let names: Vec<String> = self
            .targets
            .iter()
            .map(|t| t.port.name().to_string())
            .collect();
        // One row per target: `f(target)`, labelled with its name.
        let per_target = |f: &dyn Fn(&TargetRt) -> u64| -> Rows {
            self.targets
                .iter()
                .zip(&names)
                .map(|(t, n)| (format!("{{target=\"{n}\"}}"), f(t)))
                .collect()
        };
        let nics: Vec<Option<[(&str, u64); 9]>> = self
            .targets
            .iter()
            .map(|t| t.nic.counters(t.guid).map(|c| nic_counters(&c)))
            .collect();
        for k in 0..9 {
            let Some(key) = nics.iter().flatten().next().map(|c| c[k].0) else {
                break;
            };
            let rows = nics
                .iter()
                .zip(&names)
                .filter_map(|(c, n)| Some((format!("{{target=\"{n}\"}}"), c.as_ref()?[k].1)))
                .collect();
            metric(
                &format!("srptd_nic_{key}_total"),
                "What the target's soft RoCE NIC counted since it was opened.",
                "counter",
                rows,
            );
        }
        metric(
            "srptd_verbs_objects",
            "Objects the target port (PDs, CQs, QPs, MRs, ...) and its CM agent (CM ids, MAD agents, SA subscriptions) hold through the access layer.",
            "gauge",
            per_target(&|t| t.access.live_total().max(0) as u64),
        );
        metric(
            "srptd_target_enabled",
            "Whether the target accepts logins.",
            "gauge",
            per_target(&|t| t.port.enabled() as u64),
        );
        let sessions: Vec<(&String, srp_target::SessionInfo)> = self
            .targets
            .iter()
            .zip(&names)
            .flat_map(|(t, n)| t.port.sessions().into_iter().map(move |s| (n, s)))
            .collect();
        metric(
            "srptd_channels",
            "Logged-in SRP channels.",
            "gauge",
            // From the sessions listed above, not a second walk of each port.
            per_target(&|t| {
                sessions
                    .iter()
                    .filter(|(n, _)| **n == t.port.name())
                    .count() as u64
            }),
        );
        let per = |f: fn(&srp_target::SessionInfo) -> u64| {
            sessions
                .iter()
                .map(|(t, s)| {
                    (
                        format!(
                            "{{target=\"{t}\",initiator=\"{}\",conn=\"{}\"}}",
                            s.initiator, s.conn.0
                        ),
                        f(s),
                    )
                })
                .collect::<Vec<_>>()
        };
        metric(
            "srptd_channel_commands_total",
            "SRP_CMDs accepted.",
            "counter",
            per(|s| s.cmds),
        );
        metric(
            "srptd_channel_tmfs_total",
            "SRP_TSK_MGMTs accepted.",
            "counter",
            per(|s| s.tmfs),
        );
        metric(
            "srptd_channel_aers_total",
            "SRP_AER_REQs sent.",
            "counter",
            per(|s| s.aers),
        );
        metric(
            "srptd_channel_credits",
            "Credits the initiator holds.",
            "gauge",
            per(|s| s.credits as u64),
        );
        metric(
            "srptd_channel_in_flight",
            "Commands in flight.",
            "gauge",
            per(|s| s.in_flight as u64),
        );
        let luns: Vec<(String, srp_target::LunCounters)> = self
            .targets
            .iter()
            .zip(&names)
            .flat_map(|(t, n)| {
                self.lun_stats(t).into_iter().map(move |(device, s)| {
                    (
                        format!(
                            "{{target=\"{n}\",lun=\"{}\",device=\"{device}\"}}",
                            s.lun.value()
                        ),
                        s.counters,
                    )
                })
            })
            .collect();
        type Counter = fn(&srp_target::LunCounters) -> u64;
        let lun_series: [(&str, &str, Counter); 7] = [
            (
                "commands",
                "SRP_CMDs the target executed at the LUN.",
                |c| c.commands,
            ),
            ("reads", "READs at the LUN that ended GOOD.", |c| c.reads),
            ("writes", "WRITEs at the LUN that ended GOOD.", |c| c.writes),
            ("read_bytes", "Data-in bytes of those READs.", |c| {
                c.read_bytes
            }),
            ("write_bytes", "Data-out bytes of those WRITEs.", |c| {
                c.write_bytes
            }),
            (
                "errors",
                "Commands at the LUN that ended in CHECK CONDITION.",
                |c| c.errors,
            ),
            (
                "tmfs",
                "Task management functions addressed to the LUN.",
                |c| c.tmfs,
            ),
        ];
        for (name, help, f) in lun_series {
            let rows = luns.iter().map(|(l, c)| (l.clone(), f(c))).collect();
            metric(&format!("srptd_lun_{name}_total"), help, "counter", rows);
        }
        let devs: Vec<(String, scsi::DeviceStats)> = lock(&self.devices)
            .iter()
            .map(|(n, d)| (format!("{{device=\"{n}\"}}"), d.stats()))
            .collect();
        let col = |f: fn(&scsi::DeviceStats) -> u64| {
            devs.iter().map(|(l, s)| (l.clone(), f(s))).collect()
        };
        metric(
            "srptd_device_commands_total",
            "Commands a device executed.",
            "counter",
            col(|s| s.commands),
        );
        metric(
            "srptd_device_read_bytes_total",
            "Bytes read.",
            "counter",
            col(|s| s.read_bytes),
        );
        metric(
            "srptd_device_write_bytes_total",
            "Bytes written.",
            "counter",
            col(|s| s.write_bytes),
        );
        metric(
            "srptd_device_errors_total",
            "Commands ended in CHECK CONDITION.",
            "counter",
            col(|s| s.errors),
        );
        out
    }

    /// Logs every initiator out and waits (bounded) until the channels
    /// are gone: every command the target acknowledged has completed. Then
    /// closes the CM agent's client (its connections disconnected, listens
    /// ended, subscriptions deleted, MAD agents unregistered, then its QP1
    /// objects) and stops the target port, releasing its verbs objects.
    /// Returns the channels still open at the deadline and the objects
    /// left (both 0 after a clean stop).
    pub fn shutdown(&self, within: std::time::Duration) -> (usize, i64) {
        for t in &self.targets {
            t.port.logout_all(srp::wire::TLogoutReason::NoReason);
        }
        let end = std::time::Instant::now() + within;
        let left = loop {
            let left: usize = self.targets.iter().map(|t| t.port.sessions().len()).sum();
            if left == 0 || std::time::Instant::now() >= end {
                break left;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        for t in &self.targets {
            t.cm.client().close();
            t.port.stop();
        }
        (
            left,
            self.targets.iter().map(|t| t.access.live_total()).sum(),
        )
    }
}

/// A request's arguments for a log line: its JSON without `cmd`.
fn args_of(asked: &Value) -> String {
    match asked {
        Value::Object(m) => {
            let mut m = m.clone();
            m.remove("cmd");
            Value::Object(m).to_string()
        }
        v => v.to_string(),
    }
}

fn group_mut<'a>(c: &'a mut Config, name: &str) -> Result<&'a mut GroupSection, String> {
    c.groups
        .iter_mut()
        .find(|g| g.name.get_ref() == name)
        .ok_or_else(|| format!("no group `{name}`"))
}

/// The effective user ID of a socket's peer.
fn peer_uid(s: &UnixStream) -> Option<u32> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred and len are valid for writes of the sizes given.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(cred.uid)
}

/// What is at a control socket's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SocketPath {
    /// Nothing: binding creates the socket.
    Free,
    /// A socket nobody listens on (left by a daemon that died): binding
    /// replaces it.
    Stale,
    /// A socket a daemon listens on.
    Listening,
}

/// What is at `path`, or why no control socket can be bound there: a
/// path too long for a socket address, a directory that does not exist
/// or is not one, a file that is not a socket.
fn control_path(path: &Path) -> std::io::Result<SocketPath> {
    use std::io::{Error, ErrorKind};
    use std::os::unix::fs::FileTypeExt;
    let shown = path.display();
    if std::os::unix::net::SocketAddr::from_pathname(path).is_err() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "{shown} is {} bytes long, more than a Unix socket address holds (107): choose a shorter path",
                path.as_os_str().len()
            ),
        ));
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => Err(Error::new(
            ErrorKind::AlreadyExists,
            format!("{shown} exists and is not a socket: remove it or choose another path"),
        )),
        Ok(_) if UnixStream::connect(path).is_ok() => Ok(SocketPath::Listening),
        Ok(_) => Ok(SocketPath::Stale),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            let dir = dir_of(path);
            match std::fs::metadata(dir) {
                Ok(_) => Ok(SocketPath::Free),
                Err(e) if e.kind() == ErrorKind::NotFound => Err(Error::new(
                    ErrorKind::NotFound,
                    format!(
                        "directory {} does not exist: create it or choose another path",
                        dir.display()
                    ),
                )),
                Err(e) => Err(e),
            }
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => Err(Error::new(
            e.kind(),
            format!("{shown}: a part of the path is not a directory: choose another path"),
        )),
        Err(e) => Err(e),
    }
}

/// Binds the control socket at `path` with mode 0600, replacing a stale
/// socket file (one nobody listens on) but nothing else.
pub fn bind_control(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    match control_path(path)? {
        SocketPath::Free => {}
        SocketPath::Stale => std::fs::remove_file(path)?,
        SocketPath::Listening => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!("{}: another daemon is listening", path.display()),
            ))
        }
    }
    // SAFETY: umask only changes this process's file creation mask.
    let old = unsafe { libc::umask(0o177) };
    let l = UnixListener::bind(path);
    // SAFETY: as above, restoring the previous mask.
    unsafe { libc::umask(old) };
    let l = l?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// What [`preflight`] found in use: what another running srptd explains
/// (`--check` of the file of one that runs finds its own sockets), and
/// what keeps a second one from starting.
#[derive(Debug, Default)]
pub struct Preflight {
    /// Each in use, at its key.
    pub busy: Vec<ConfigError>,
}

/// Tries everything a start of `cfg` opens or binds, without creating or
/// changing anything: every device's store with the access and flags the
/// device needs (see `open_store`) and its geometry, the control socket
/// (its path, its directory, a socket bound there and removed), each
/// target's RoCE UDP address and the metrics address. An error names
/// file, line and key, and what to do; ports and sockets in use are
/// returned instead. srptd runs no log file, pid file or persistent
/// reservation state file (logs go to standard output, APTPL is not
/// persisted), so there is nothing else to try.
pub fn preflight(cfg: &Config) -> Result<Preflight, ConfigError> {
    use std::io::ErrorKind;
    for (i, d) in cfg.devices.iter().enumerate() {
        probe_device(d).map_err(|e| device_error(cfg, i, e))?;
    }
    let mut found = Preflight::default();
    let key = |i: usize, k: &str| format!("{}.{k}", cfg.target_key(i));
    let sock = &cfg.target().control_socket;
    let path = sock.get_ref();
    let cannot = |m: String| cfg.error(sock.span(), key(0, "control_socket"), m);
    match control_path(path).map_err(|e| cannot(e.to_string()))? {
        SocketPath::Free => {
            bind_control(path).map_err(|e| {
                let dir = dir_of(path).display();
                cannot(format!(
                    "cannot create a socket in {dir}: {e}: choose another path"
                ))
            })?;
            let _ = std::fs::remove_file(path);
        }
        SocketPath::Stale => {}
        SocketPath::Listening => found.busy.push(cannot(format!(
            "a daemon listens on {} (is srptd running?): stop it or choose another path",
            path.display()
        ))),
    }
    for (i, t) in cfg.targets.iter().enumerate() {
        let (ip, port) = (*t.ip.get_ref(), *t.udp_port.get_ref());
        match std::net::UdpSocket::bind((ip, port)) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::AddrInUse => found.busy.push(cfg.error(
                t.udp_port.span(),
                key(i, "udp_port"),
                format!("UDP {ip}:{port} is in use (is srptd running?): stop what holds it or choose another udp_port"),
            )),
            Err(e) if e.kind() == ErrorKind::AddrNotAvailable => {
                return Err(cfg.error(
                    t.ip.span(),
                    key(i, "ip"),
                    format!("{ip} is not an address of this host ({e}): give one of its addresses"),
                ))
            }
            Err(e) => {
                return Err(cfg.error(
                    t.udp_port.span(),
                    key(i, "udp_port"),
                    format!("cannot bind UDP {ip}:{port}: {e}"),
                ))
            }
        }
    }
    if let Some(m) = &cfg.target().metrics {
        let addr = m.get_ref().0;
        let at = |msg: String| cfg.error(m.span(), key(0, "metrics"), msg);
        match std::net::TcpListener::bind(addr) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::AddrInUse => found.busy.push(at(format!(
                "TCP {addr} is in use: stop what holds it or choose another port"
            ))),
            Err(e) if e.kind() == ErrorKind::AddrNotAvailable => {
                return Err(at(format!(
                    "{} is not an address of this host ({e}): give one of its addresses, or a bare port for 127.0.0.1",
                    addr.ip()
                )))
            }
            Err(e) => return Err(at(format!("cannot listen on {addr}: {e}"))),
        }
    }
    Ok(found)
}

/// Serves the control socket: one JSON request per line, one JSON answer
/// per line (`{"ok": true, "data": ...}` or `{"ok": false, "error": ...}`).
pub fn serve_control(daemon: Arc<Daemon>, listener: UnixListener) -> std::thread::JoinHandle<()> {
    serve_lines(listener, "srptd", move |line| {
        match serde_json::from_str::<Request>(line) {
            Ok(req) => match daemon.handle(req) {
                Ok(data) => json!({ "ok": true, "data": data }),
                Err(e) => json!({ "ok": false, "error": e }),
            },
            Err(e) => json!({ "ok": false, "error": format!("bad request: {e}") }),
        }
    })
}

/// Serves a control socket whose requests and answers are lines of JSON:
/// `answer` turns each request line into its answer. Only the daemon's own
/// user may connect (`who` names the daemon in the refusal).
pub fn serve_lines(
    listener: UnixListener,
    who: &'static str,
    answer: impl Fn(&str) -> Value + Send + Sync + 'static,
) -> std::thread::JoinHandle<()> {
    let answer = Arc::new(answer);
    std::thread::spawn(move || {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            if peer_uid(&conn) != Some(me) {
                let _ = writeln!(
                    conn,
                    "{}",
                    json!({"ok": false, "error": format!("permission denied: not the owner of {who}")})
                );
                continue;
            }
            let answer = answer.clone();
            std::thread::spawn(move || {
                let Ok(read) = conn.try_clone() else { return };
                for line in BufReader::new(read).lines().take(10_000) {
                    let Ok(line) = line else { return };
                    if writeln!(conn, "{}", answer(&line)).is_err() {
                        return;
                    }
                }
            });
        }
    })
}

/// Serves `GET /metrics` in the Prometheus text format on `addr`.
pub fn serve_metrics(
    daemon: Arc<Daemon>,
    addr: std::net::SocketAddr,
) -> std::io::Result<(std::net::SocketAddr, std::thread::JoinHandle<()>)> {
    use std::io::Read;
    let l = std::net::TcpListener::bind(addr)?;
    let local = l.local_addr()?;
    let t = std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut c) = conn else { continue };
            let _ = c.set_read_timeout(Some(std::time::Duration::from_secs(2)));
            let mut buf = [0u8; 2048];
            let n = c.read(&mut buf).unwrap_or(0);
            let req = String::from_utf8_lossy(&buf[..n]);
            let (status, body) = if req.starts_with("GET /metrics ") {
                ("200 OK", daemon.metrics())
            } else {
                ("404 Not Found", "try /metrics\n".to_string())
            };
            let _ = write!(
                c,
                "HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    Ok((local, t))
}

/// A client of the control socket (what `srptadm` uses).
pub fn request(path: &Path, req: &Request) -> Result<Value, String> {
    request_to(path, "srptd", req)
}

/// Sends one request line to the control socket of daemon `who` at `path`
/// and returns its answer's data (or its error).
pub fn request_to(path: &Path, who: &str, req: &impl Serialize) -> Result<Value, String> {
    let mut s =
        UnixStream::connect(path).map_err(|e| format!("connect to {}: {e}", path.display()))?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(120)))
        .map_err(|e| e.to_string())?;
    let line = serde_json::to_string(req).map_err(|e| e.to_string())?;
    writeln!(s, "{line}").map_err(|e| format!("send to {}: {e}", path.display()))?;
    let mut answer = String::new();
    BufReader::new(&s)
        .read_line(&mut answer)
        .map_err(|e| format!("read from {}: {e}", path.display()))?;
    let v: Value =
        serde_json::from_str(&answer).map_err(|e| format!("bad answer from {who}: {e}"))?;
    if v["ok"] == json!(true) {
        Ok(v["data"].clone())
    } else {
        Err(v["error"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| format!("{who} refused without a reason")))
    }
}

/// A port's channels by state: `{"pending": n, "live": n, "closing": n}`,
/// with the memory the port holds for them.
fn channel_phases(sessions: &[srp_target::SessionInfo]) -> Value {
    let count = |p: srp_target::ChannelPhase| sessions.iter().filter(|s| s.phase == p).count();
    json!({
        "pending": count(srp_target::ChannelPhase::Pending),
        "live": count(srp_target::ChannelPhase::Live),
        "closing": count(srp_target::ChannelPhase::Closing),
        "memory_bytes": sessions.iter().map(|s| s.memory).sum::<usize>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_identity_is_per_host_unless_the_usn_names_it() {
        let naa = |usn, name, host| fnv(&identity_key(usn, name, host)) & 0xf_ffff_ffff;
        // One host: one name is one LU, across restarts and processes.
        assert_eq!(naa(None, "ram0", "h1"), naa(None, "ram0", "h1"));
        assert_ne!(naa(None, "ram0", "h1"), naa(None, "ram1", "h1"));
        // Two hosts' default ram0 are two LUs.
        assert_ne!(naa(None, "ram0", "h1"), naa(None, "ram0", "h2"));
        // A usn makes a shared disk one LU whatever its names and hosts,
        // and differs from a device named like it.
        assert_eq!(
            naa(Some("shared7"), "a", "h1"),
            naa(Some("shared7"), "b", "h2")
        );
        assert_ne!(naa(Some("ram0"), "ram0", "h1"), naa(None, "ram0", "h1"));
        assert!(!host_id().is_empty(), "no machine ID and no host name");
    }
}
