//! The system calls of the kernel's user MAD interface: open a port's
//! `/dev/infiniband/umadN`, register and unregister agents (ioctls),
//! `write` a header plus MAD, `read` one (non-blocking). What the bytes
//! mean is `crate::umad`.

use super::{set_nonblocking, Errno};
use crate::umad::{find_umad, reg_agent_id, reg_request, UmadError, REG_LEN, SYSFS_UMAD};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::raw::c_void;
use std::path::Path;

/// `IB_IOCTL_MAGIC`.
const MAGIC: u64 = 0x1b;
/// `_IOWR(IB_IOCTL_MAGIC, 4, struct ib_user_mad_reg_req2)`.
const REGISTER_AGENT2: u64 = (3 << 30) | ((REG_LEN as u64) << 16) | (MAGIC << 8) | 4;
/// `_IOW(IB_IOCTL_MAGIC, 2, __u32)`.
const UNREGISTER_AGENT: u64 = (1 << 30) | (4 << 16) | (MAGIC << 8) | 2;

/// One port's umad file.
pub(crate) struct UmadFile {
    fd: OwnedFd,
    path: String,
}

impl UmadFile {
    /// Opens the umad device of `port` of `ibdev`, non-blocking.
    pub(crate) fn open(ibdev: &str, port: u8) -> Result<UmadFile, UmadError> {
        let name = find_umad(Path::new(SYSFS_UMAD), ibdev, port)?;
        let path = format!("/dev/infiniband/{name}");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| UmadError::of_open(&path, &e))?;
        let fd = OwnedFd::from(f);
        set_nonblocking(fd.as_raw_fd()).map_err(|e| UmadError::Io {
            what: "make non-blocking",
            path: path.clone(),
            reason: e.to_string(),
        })?;
        Ok(UmadFile { fd, path })
    }

    /// The descriptor, readable when a MAD waits.
    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The device file's path.
    pub(crate) fn path(&self) -> &str {
        &self.path
    }

    /// Registers an agent for `class`/`version` serving `methods`; its ID.
    pub(crate) fn register(&self, class: u8, version: u8, methods: &[u8]) -> Result<u32, Errno> {
        let mut req = reg_request(class, version, methods);
        // SAFETY: the ioctl reads and writes back `REG_LEN` bytes, the
        // size its number encodes, of a live local array.
        let rc = unsafe {
            libc::ioctl(
                self.fd(),
                REGISTER_AGENT2 as libc::c_ulong,
                req.as_mut_ptr().cast::<c_void>(),
            )
        };
        if rc < 0 {
            return Err(Errno::last(libc::EINVAL));
        }
        Ok(reg_agent_id(&req))
    }

    /// Unregisters agent `id`.
    pub(crate) fn unregister(&self, id: u32) -> Result<(), Errno> {
        let mut id = id;
        // SAFETY: the ioctl reads 4 bytes, a live local u32.
        let rc = unsafe {
            libc::ioctl(
                self.fd(),
                UNREGISTER_AGENT as libc::c_ulong,
                (&mut id as *mut u32).cast::<c_void>(),
            )
        };
        if rc < 0 {
            return Err(Errno::last(libc::EINVAL));
        }
        Ok(())
    }

    /// Writes one header plus MAD.
    pub(crate) fn send(&self, bytes: &[u8]) -> Result<(), Errno> {
        // SAFETY: writes `bytes.len()` bytes of a live slice.
        let rc = unsafe { libc::write(self.fd(), bytes.as_ptr().cast::<c_void>(), bytes.len()) };
        if rc < 0 {
            return Err(Errno::last(libc::EIO));
        }
        Ok(())
    }

    /// Reads one header plus MAD into `buf`: its length, `None` when
    /// nothing waits (or the read failed: the error is `Err`).
    pub(crate) fn recv(&self, buf: &mut [u8]) -> Result<Option<usize>, Errno> {
        // SAFETY: the kernel writes at most `buf.len()` bytes into it.
        let rc = unsafe { libc::read(self.fd(), buf.as_mut_ptr().cast::<c_void>(), buf.len()) };
        if rc < 0 {
            let e = Errno::last(libc::EIO);
            if e.0 == libc::EAGAIN || e.0 == libc::EWOULDBLOCK {
                return Ok(None);
            }
            return Err(e);
        }
        Ok(Some(rc as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ioctl numbers as `<linux/ioctl.h>` makes them on x86-64 and
    /// arm64 (direction in bits 30-31, size 16-29, type 8-15, number
    /// 0-7).
    #[test]
    fn ioctl_numbers_are_the_uapis() {
        assert_eq!(REGISTER_AGENT2, 0xc028_1b04);
        assert_eq!(UNREGISTER_AGENT, 0x4004_1b02);
    }
}
