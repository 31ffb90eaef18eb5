//! The FUSE operations: one directory (inode 1) holding one regular file
//! per LUN. Each file gets an inode number of its own (2, 3, ...) that is
//! never used again, so a descriptor opened on a file that was removed
//! reaches nothing (`ENODEV`), never a device added later under its name.

use crate::lun::Lun;
use crate::{DirectIo, Options};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
    WriteFlags,
};
use std::ffi::OsStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::time::{Duration, SystemTime};

/// How long the kernel may cache an entry or attributes: a change
/// ([`crate::Mount::add`], `remove`, `resized`) also invalidates them at
/// once, so this only bounds how stale they get if that notice is lost.
pub(crate) const TTL: Duration = Duration::from_secs(1);
pub(crate) const FIRST_LUN_INO: u64 = 2;
/// Low bit of a file handle: opened for writing.
const FH_WRITABLE: u64 = 1;

/// The files of a mount, shared by the FUSE session and the [`crate::Mount`]
/// that adds and removes them.
pub(crate) struct Table {
    /// (inode, LUN), in the order they were added.
    luns: RwLock<Vec<(u64, Arc<Lun>)>>,
    /// The next inode number to give out.
    next_ino: AtomicU64,
}

impl Table {
    pub(crate) fn new(luns: Vec<Lun>) -> Table {
        let n = luns.len() as u64;
        Table {
            luns: RwLock::new(
                luns.into_iter()
                    .enumerate()
                    .map(|(i, l)| (FIRST_LUN_INO + i as u64, Arc::new(l)))
                    .collect(),
            ),
            next_ino: AtomicU64::new(FIRST_LUN_INO + n),
        }
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Vec<(u64, Arc<Lun>)>> {
        self.luns.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The inode of the file named `name`.
    pub(crate) fn ino_of(&self, name: &str) -> Option<u64> {
        self.read()
            .iter()
            .find(|(_, l)| l.name == name)
            .map(|(i, _)| *i)
    }

    /// Adds `lun` under a fresh inode; `false` if its name is taken.
    pub(crate) fn add(&self, lun: Lun) -> Option<u64> {
        let mut luns = self.luns.write().unwrap_or_else(|e| e.into_inner());
        if luns.iter().any(|(_, l)| l.name == lun.name) {
            return None;
        }
        let ino = self.next_ino.fetch_add(1, Ordering::Relaxed);
        luns.push((ino, Arc::new(lun)));
        Some(ino)
    }

    /// Removes the file `name`; its inode, if it had one.
    pub(crate) fn remove(&self, name: &str) -> Option<u64> {
        let mut luns = self.luns.write().unwrap_or_else(|e| e.into_inner());
        let at = luns.iter().position(|(_, l)| l.name == name)?;
        Some(luns.remove(at).0)
    }
}

pub(crate) struct BlockFs {
    table: Arc<Table>,
    read_only: bool,
    direct_io: DirectIo,
    uid: u32,
    gid: u32,
    born: SystemTime,
    next_fh: AtomicU64,
}

fn errno(e: i32) -> Errno {
    Errno::from_i32(e)
}

impl BlockFs {
    pub(crate) fn new(table: Arc<Table>, options: &Options) -> BlockFs {
        // SAFETY: geteuid/getegid have no preconditions and cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        BlockFs {
            table,
            read_only: options.read_only,
            direct_io: options.direct_io,
            uid,
            gid,
            born: SystemTime::now(),
            next_fh: AtomicU64::new(1),
        }
    }

    /// The LUN of inode `ino`: `ENODEV` for one that was removed (its
    /// device is gone), `ENOENT` for one there never was.
    fn lun(&self, ino: INodeNo) -> Result<Arc<Lun>, Errno> {
        if let Some((_, l)) = self.table.read().iter().find(|(i, _)| *i == ino.0) {
            return Ok(l.clone());
        }
        let issued = ino.0 >= FIRST_LUN_INO && ino.0 < self.table.next_ino.load(Ordering::Relaxed);
        Err(if issued { Errno::ENODEV } else { Errno::ENOENT })
    }

    fn root_attr(&self) -> FileAttr {
        self.attr(INodeNo::ROOT, FileType::Directory, 0o755, 0, 4096, 2)
    }

    fn lun_attr(&self, ino: u64, lun: &Lun) -> FileAttr {
        let perm = if self.read_only { 0o444 } else { 0o644 };
        self.attr(
            INodeNo(ino),
            FileType::RegularFile,
            perm,
            lun.size(),
            lun.block_size(),
            1,
        )
    }

    fn attr_of(&self, ino: INodeNo) -> Result<FileAttr, Errno> {
        if ino == INodeNo::ROOT {
            return Ok(self.root_attr());
        }
        let lun = self.lun(ino)?;
        Ok(self.lun_attr(ino.0, &lun))
    }

    fn attr(
        &self,
        ino: INodeNo,
        kind: FileType,
        perm: u16,
        size: u64,
        blksize: u32,
        nlink: u32,
    ) -> FileAttr {
        FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: self.born,
            mtime: self.born,
            ctime: self.born,
            crtime: self.born,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize,
            flags: 0,
        }
    }
}

impl Filesystem for BlockFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Let a direct-I/O file be mmapped too (Linux 6.6+); harmless if absent.
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent != INodeNo::ROOT {
            return reply.error(Errno::ENOENT);
        }
        let found = self
            .table
            .read()
            .iter()
            .find(|(_, l)| OsStr::new(&l.name) == name)
            .map(|(i, l)| self.lun_attr(*i, l));
        match found {
            Some(a) => reply.entry(&TTL, &a, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr_of(ino) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    /// Times may be "set" (ignored: touch works); size only to itself;
    /// owner and mode are fixed.
    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let attr = match self.attr_of(ino) {
            Ok(a) => a,
            Err(e) => return reply.error(e),
        };
        if mode.is_some_and(|m| m & 0o7777 != u32::from(attr.perm))
            || uid.is_some_and(|u| u != attr.uid)
            || gid.is_some_and(|g| g != attr.gid)
        {
            return reply.error(Errno::EPERM);
        }
        if size.is_some_and(|s| s != attr.size) {
            return reply.error(Errno::EINVAL);
        }
        reply.attr(&TTL, &attr)
    }

    // Only the mount's owner changes the directory: one file per device.

    fn mknod(
        &self,
        _r: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _m: u32,
        _u: u32,
        _d: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EPERM)
    }

    fn mkdir(&self, _r: &Request, _p: INodeNo, _n: &OsStr, _m: u32, _u: u32, reply: ReplyEntry) {
        reply.error(Errno::EPERM)
    }

    fn create(
        &self,
        _r: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _m: u32,
        _u: u32,
        _f: i32,
        reply: ReplyCreate,
    ) {
        reply.error(Errno::EPERM)
    }

    fn unlink(&self, _r: &Request, _p: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EPERM)
    }

    fn rmdir(&self, _r: &Request, _p: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EPERM)
    }

    fn rename(
        &self,
        _r: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _np: INodeNo,
        _nn: &OsStr,
        _f: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EPERM)
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if ino == INodeNo::ROOT {
            return reply.error(Errno::EISDIR);
        }
        if let Err(e) = self.lun(ino) {
            return reply.error(e);
        }
        let writable = flags.acc_mode() != OpenAccMode::O_RDONLY;
        if writable && self.read_only {
            return reply.error(Errno::EROFS);
        }
        let o_direct = flags.0 & libc::O_DIRECT != 0;
        let mut fopen = FopenFlags::empty();
        if o_direct || self.direct_io == DirectIo::Always {
            // Writes may run in parallel: partial blocks are serialised
            // by the LUN's read-modify-write lock, not by the inode lock.
            fopen |= FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES;
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed) << 1 | u64::from(writable);
        reply.opened(FileHandle(fh), fopen)
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.lun(ino).map(|l| l.read(offset, size)) {
            Ok(Ok(data)) => reply.data(&data),
            Ok(Err(e)) => reply.error(errno(e.errno())),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if self.read_only {
            return reply.error(Errno::EROFS);
        }
        match self.lun(ino).map(|l| l.write(offset, data)) {
            Ok(Ok(n)) => reply.written(n as u32),
            Ok(Err(e)) => reply.error(errno(e.errno())),
            Err(e) => reply.error(e),
        }
    }

    /// close(2) of a descriptor that could write: SYNCHRONIZE CACHE if
    /// anything was written since the last flush, so that data is on
    /// stable storage and a failure surfaces at close. A close after no
    /// writes sends nothing (a local disk does not flush then either), so
    /// it does not wait while a path is down.
    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        let lun = match self.lun(ino) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        if fh.0 & FH_WRITABLE == 0 {
            return reply.ok();
        }
        match lun.flush_if_written() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e.errno())),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.lun(ino).map(|l| l.flush()) {
            Ok(Ok(())) => reply.ok(),
            Ok(Err(e)) => reply.error(errno(e.errno())),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok()
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        reply.opened(FileHandle(0), FopenFlags::empty())
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        // Entry k is followed by offset k + 1.
        let luns = self.table.read();
        let entries = [
            (INodeNo::ROOT, FileType::Directory, "."),
            (INodeNo::ROOT, FileType::Directory, ".."),
        ]
        .into_iter()
        .chain(
            luns.iter()
                .map(|(i, l)| (INodeNo(*i), FileType::RegularFile, l.name.as_str())),
        );
        for (k, (ino, kind, name)) in entries.enumerate().skip(offset as usize) {
            if reply.add(ino, k as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok()
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let luns = self.table.read();
        let bsize = luns
            .iter()
            .map(|(_, l)| l.block_size())
            .max()
            .unwrap_or(512);
        let bytes: u64 = luns.iter().map(|(_, l)| l.size()).sum();
        let files = luns.len() as u64;
        reply.statfs(bytes / u64::from(bsize), 0, 0, files, 0, bsize, 255, bsize)
    }

    /// fallocate(2): PUNCH_HOLE|KEEP_SIZE unmaps, ZERO_RANGE writes zeroes,
    /// plain allocation inside the file is a no-op; nothing grows the file.
    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let lun = match self.lun(ino) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        if self.read_only {
            return reply.error(Errno::EROFS);
        }
        const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
        const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE;
        const ZERO: i32 = libc::FALLOC_FL_ZERO_RANGE;
        let keep = mode & KEEP != 0;
        let Some(end) = offset.checked_add(length) else {
            return reply.error(Errno::EFBIG);
        };
        if !keep && end > lun.size() {
            return reply.error(Errno::ENOSPC);
        }
        let r = match mode & !KEEP {
            0 => Ok(()),
            PUNCH if keep => lun.punch(offset, length),
            ZERO => lun.zero(offset, length),
            _ => return reply.error(errno(libc::EOPNOTSUPP)),
        };
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e.errno())),
        }
    }
}
