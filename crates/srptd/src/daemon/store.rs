//! Backing stores of srptd's devices: files and block devices opened (or
//! created) with the access a device needs, and the identity that names a
//! LU the same on every host that exports it.

use super::*;
use daemon_ctl::{bind_control, control_path, dir_of, SocketPath};

pub(super) fn fnv(s: &str) -> u64 {
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
pub(super) fn identity_key(usn: Option<&str>, name: &str, host: &str) -> String {
    match usn {
        Some(u) => format!("usn:{u}"),
        None => format!("{host}/{name}"),
    }
}

/// This host's identity for [`identity_key`]: the machine ID (systemd's
/// `/etc/machine-id`, or D-Bus's copy), else the host name, read once.
pub(super) fn host_id() -> &'static str {
    pub(super) static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
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
pub(super) type DeviceError = (std::ops::Range<usize>, &'static str, String);

/// The error of device `i` of `cfg`, naming file, line and key.
pub(super) fn device_error(
    cfg: &Config,
    i: usize,
    (span, key, message): DeviceError,
) -> ConfigError {
    cfg.error(span, format!("device[{i}].{key}"), message)
}

/// A device's store as a start opens it, and the file it created.
pub(super) struct Store {
    pub(super) backend: Arc<dyn scsi::Backend>,
    pub(super) created: Option<CreatedFile>,
}

/// A store of a given size that holds nothing: what `--check` gives
/// [`scsi::Device::new`] to judge a device's geometry by the rules a
/// start meets, without creating, growing or allocating its store.
pub(super) struct Geometry {
    pub(super) size: u64,
    pub(super) min_block_size: u32,
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

/// The machine's memory (`MemTotal` of /proc/meminfo), when it can be read.
fn memory_total() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = info.lines().find_map(|l| l.strip_prefix("MemTotal:"))?;
    kib.trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()?
        .checked_mul(1024)
}

/// Opens device `d`'s store as a start does: a fileio device's file
/// read-write unless `read_only` (O_DIRECT when `o_direct`), created at
/// `size` when missing and extended to it when shorter; a blockio
/// device's path with O_DIRECT. With `dry_run` (`--check`) nothing is
/// created, grown or allocated: a file the start would create is tried
/// as an unnamed file in its directory (O_TMPFILE, gone when closed), and
/// the store has the size the start would give it. Every reason a start
/// cannot open the store is an error here, with the fix.
pub(super) fn open_store(d: &DeviceSection, dry_run: bool) -> Result<Store, DeviceError> {
    use std::os::unix::fs::FileTypeExt;
    let bs = *d.block_size.get_ref();
    let size = match &d.size {
        Some(s) => Some(
            crate::config::parse_size(s.get_ref())
                .map_err(|m| (s.span(), "size", m.to_string()))?,
        ),
        None => None,
    };
    let handler = *d.handler.get_ref();
    if let Handler::Ram | Handler::NullIo = handler {
        let size = size.unwrap_or(0);
        let too_big = |m: String| {
            let span = d.size.as_ref().map_or(d.handler.span(), |s| s.span());
            (span, "size", m)
        };
        if handler == Handler::Ram {
            if let Some(total) = memory_total().filter(|t| size > *t) {
                return Err(too_big(format!(
                    "a RAM device of {} is more than this machine's memory ({}): lower `size`, \
                     or use vdisk_fileio",
                    rdma_types::units::format_size(size),
                    rdma_types::units::format_size(total)
                )));
            }
        }
        let backend: Arc<dyn scsi::Backend> = match (handler, dry_run) {
            (_, true) => Arc::new(Geometry {
                size,
                min_block_size: 1,
            }),
            (Handler::Ram, false) => Arc::new(srp_target::MemStore::new(size).map_err(|e| {
                too_big(format!(
                    "cannot commit {} of memory for this RAM device: {e}: lower `size`, free \
                     memory, or use vdisk_fileio",
                    rdma_types::units::format_size(size)
                ))
            })?),
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
                    create_file(d, path, size.unwrap_or(0), dry_run).map_err(|e| bad(e.to_string()))
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
        let io = file_io(d, f, path).map_err(|e| bad(e.to_string()))?;
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

/// Why a fileio image cannot be made or used as a device's store.
#[derive(Debug, thiserror::Error)]
pub(super) enum StoreError {
    /// The file system refuses O_DIRECT on the image.
    #[error("{}: O_DIRECT refused ({source}): set o_direct = false or keep the image on a file system with O_DIRECT", path.display())]
    DirectRefused {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The image opened but cannot serve as a store.
    #[error("{}: {source}", path.display())]
    Use {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The image cannot be created (or, dry run, could not be).
    #[error("cannot create {}: {source}", path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A fileio store over `f` (at `path`), buffered or O_DIRECT.
pub(super) fn file_io(
    d: &DeviceSection,
    f: std::fs::File,
    path: &Path,
) -> Result<scsi::FileIo, StoreError> {
    let path = path.to_path_buf();
    if d.o_direct {
        scsi::FileIo::direct(f, d.write_through, *d.block_size.get_ref())
            .map_err(|source| StoreError::DirectRefused { path, source })
    } else {
        scsi::FileIo::new(f, d.write_through).map_err(|source| StoreError::Use { path, source })
    }
}

/// Creates fileio image `path` of `size` bytes, as the store of `d`; with
/// `dry_run`, only tries: an unnamed file in its directory.
pub(super) fn create_file(
    d: &DeviceSection,
    path: &Path,
    size: u64,
    dry_run: bool,
) -> Result<Store, StoreError> {
    use std::os::unix::fs::OpenOptionsExt;
    let cannot = |source: std::io::Error| StoreError::Create {
        path: path.to_path_buf(),
        source,
    };
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

/// Device `d`'s identity (serial, NAA, vendor, product) as configured.
fn identity_of(d: &DeviceSection) -> scsi::DeviceConfig {
    let name = d.name.get_ref();
    let usn = d.usn.as_ref().map(|u| u.get_ref().as_str());
    let key = identity_key(usn, name, host_id());
    let mut cfg = scsi::DeviceConfig {
        block_size: *d.block_size.get_ref(),
        read_only: d.read_only,
        thin: d.thin,
        rotational: d.rotational,
        removable: d.removable,
        nv_cache: d.nv_cache,
        threads_num: d.threads_num.as_ref().map_or(0, |n| *n.get_ref()),
        threads_pool: match d.threads_pool_type {
            Some(crate::config::ThreadsPoolType::Shared) => scsi::ThreadsPool::Shared,
            Some(crate::config::ThreadsPoolType::PerInitiator) | None => {
                scsi::ThreadsPool::PerInitiator
            }
        },
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
    cfg
}

/// Device `d` over `backend`: its SCSI identity and geometry, checked as
/// [`scsi::Device::new`] checks them.
pub(super) fn device_on(
    d: &DeviceSection,
    backend: Arc<dyn scsi::Backend>,
) -> Result<scsi::Device, DeviceError> {
    scsi::Device::new(identity_of(d), backend)
        .map_err(|e| (d.block_size.span(), "block_size", e.to_string()))
}

/// Opens a pass-through device's sg or bsg node read-write (what a start
/// does, and `--check`): it must be a character device of the sg driver
/// (major 21) or of the block SCSI generic class (`/dev/bsg/H:C:T:L`) that
/// answers the version ioctl. The device gets the
/// configured vendor, product and usn over its own (see
/// `scsi::passthrough::Identity`).
pub(super) fn pass_through(d: &DeviceSection) -> Result<scsi::Device, DeviceError> {
    let file = d.filename.as_ref().ok_or_else(|| {
        let m = "handler pass-through needs a filename: the device's sg node (/dev/sgN) or bsg \
                 node (/dev/bsg/H:C:T:L)";
        (d.handler.span(), "filename", m.to_string())
    })?;
    let bad = |m: String| (file.span(), "filename", m);
    let sg = scsi::SgDevice::open(file.get_ref()).map_err(|e| {
        let fix = match &e {
            scsi::passthrough::SgOpenError::Open { source, .. } => match source.raw_os_error() {
                Some(libc::ENOENT) => ": no such node (modprobe sg; lsscsi -g names the device's)",
                Some(libc::EACCES | libc::EPERM) => ": run srptd as root or give it the node",
                Some(libc::ENXIO | libc::ENODEV) => ": the device behind it is gone",
                _ => "",
            },
            _ => "",
        };
        bad(format!("{e}{fix}"))
    })?;
    let identity = scsi::passthrough::Identity {
        vendor: d.t10_vendor_id.is_some(),
        product: d.t10_product_id.is_some(),
        serial: d.usn.is_some(),
    };
    let handler = scsi::PassThrough::new(Box::new(sg), identity);
    scsi::Device::pass_through(identity_of(d), handler)
        .map_err(|e| (d.handler.span(), "handler", e.to_string()))
}

/// A virtual CD-ROM with the ISO image `filename` in it (none, or an
/// empty file: no disc), opened read-only as a start does and `--check`
/// (which changes nothing); the configured identity is the unit's.
pub(super) fn vcdrom(d: &DeviceSection) -> Result<scsi::Device, DeviceError> {
    let image = d.filename.as_ref();
    let cd = scsi::VCdrom::new(image.map(|f| f.get_ref().as_path())).map_err(|e| {
        let fix = match &e {
            scsi::vcdrom::ImageError::Open { source, .. } => match source.raw_os_error() {
                Some(libc::ENOENT) => ": no such file (remove `filename` for a drive with no disc)",
                Some(libc::EACCES | libc::EPERM) => ": give srptd read access to it",
                _ => "",
            },
            _ => "",
        };
        let span = image.map_or(d.handler.span(), |f| f.span());
        (span, "filename", format!("{e}{fix}"))
    })?;
    scsi::Device::vcdrom(identity_of(d), cd)
        .map_err(|e| (d.handler.span(), "handler", e.to_string()))
}

/// Opens device `d` and builds it, as a start does; the image file it
/// created, if any, is removed when the returned guard is dropped unless
/// kept.
pub(super) fn build_device(
    d: &DeviceSection,
) -> Result<(Arc<scsi::Device>, Option<CreatedFile>), DeviceError> {
    if *d.handler.get_ref() == Handler::PassThrough {
        return Ok((Arc::new(pass_through(d)?), None));
    }
    if *d.handler.get_ref() == Handler::VCdrom {
        return Ok((Arc::new(vcdrom(d)?), None));
    }
    let store = open_store(d, false)?;
    let device = device_on(d, store.backend)?;
    Ok((Arc::new(device), store.created))
}

/// What [`build_device`] would meet, tried without creating or changing
/// anything.
/// A pass-through device's node is opened as a start opens it (and
/// closed again): opening an sg node changes nothing; so is a vcdrom's
/// image (read-only).
pub(super) fn probe_device(d: &DeviceSection) -> Result<(), DeviceError> {
    if *d.handler.get_ref() == Handler::PassThrough {
        return pass_through(d).map(drop);
    }
    if *d.handler.get_ref() == Handler::VCdrom {
        return vcdrom(d).map(drop);
    }
    if d.drbd_minor.is_some() {
        // A Secondary's DRBD device cannot be opened: only its geometry.
        let (size, min_block_size) = super::roles::drbd_geometry(d)?;
        return device_on(
            d,
            Arc::new(Geometry {
                size,
                min_block_size,
            }),
        )
        .map(drop);
    }
    device_on(d, open_store(d, true)?.backend).map(drop)
}

/// A file this process made (a device's image, the control socket),
/// removed when dropped unless kept, so that a start that fails leaves
/// nothing behind. Only the file made is removed, not one another
/// process has put at the path since.
pub struct CreatedFile {
    pub(super) path: PathBuf,
    /// Device and inode of the file made; `None` once kept.
    pub(super) id: Option<(u64, u64)>,
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

/// A LUN number the SCSI core cannot address.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("LUN {n}: {source}")]
pub struct LunNumberError {
    pub n: u32,
    #[source]
    pub source: scsi::lun::LunError,
}

pub(super) fn lun(n: u32) -> Result<scsi::Lun, LunNumberError> {
    scsi::Lun::new(n).map_err(|source| LunNumberError { n, source })
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
/// persisted), so there is nothing else to try. With `nicd` (the
/// targets run on the NIC daemon's NICs) the RoCE UDP addresses are the
/// daemon's and not tried.
pub fn preflight(cfg: &Config, nicd: bool) -> Result<Preflight, ConfigError> {
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
        if let Some(d) = &t.device {
            // The device must be there (its listen is tried at start).
            let spec: rdmacore::DeviceSpec = d
                .get_ref()
                .parse()
                .map_err(|m| cfg.error(d.span(), key(i, "device"), m))?;
            let core = rdmacore::RdmaCore::new()
                .map_err(|e| cfg.error(d.span(), key(i, "device"), e.to_string()))?;
            core.guid_of(&spec.name)
                .map_err(|e| cfg.error(d.span(), key(i, "device"), e.to_string()))?;
            continue;
        }
        if *t.iwarp.get_ref() {
            // The iWARP NIC listens on TCP: logins at rdma_cm_port.
            let (ip, port) = (*t.ip.get_ref(), t.rdma_cm_port);
            match std::net::TcpListener::bind((ip, port)) {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::AddrInUse => found.busy.push(cfg.error(
                    t.ip.span(),
                    key(i, "rdma_cm_port"),
                    format!("TCP {ip}:{port} is in use (is srptd running?): stop what holds it or choose another rdma_cm_port"),
                )),
                Err(e) if e.kind() == ErrorKind::AddrNotAvailable => {
                    return Err(cfg.error(
                        t.ip.span(),
                        key(i, "ip"),
                        format!("{ip} is not an address of this host ({e}): give one of its addresses for the iWARP NIC"),
                    ))
                }
                Err(e) => {
                    return Err(cfg.error(
                        t.ip.span(),
                        key(i, "ip"),
                        format!("cannot listen on TCP {ip}:{port}: {e}"),
                    ))
                }
            }
            // The NIC's own listener (QPs set up by the verbs alone).
            let verbs = iwarp_tcp::VERBS_PORT;
            if let Err(e) = std::net::TcpListener::bind((ip, verbs)) {
                if e.kind() == ErrorKind::AddrInUse {
                    found.busy.push(cfg.error(
                        t.ip.span(),
                        key(i, "ip"),
                        format!("TCP {ip}:{verbs}, the iWARP NIC's own port, is in use: another process (srptd? srp --iwarp?) has its iWARP NIC on {ip}: give this target its own address"),
                    ));
                }
            }
            continue;
        }
        if nicd {
            continue;
        }
        let (ip, port) = (*t.ip.get_ref(), *t.udp_port.get_ref());
        match std::net::UdpSocket::bind((ip, port)) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::AddrInUse => found.busy.push(cfg.error(
                t.udp_port.span(),
                key(i, "udp_port"),
                format!("UDP {ip}:{port} is in use (is srptd running, or the NIC daemon serving {ip}? `nicd --clients` lists its clients): stop what holds it, choose another udp_port, or drop --own-nic to share the daemon's NIC"),
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
