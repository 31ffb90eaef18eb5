//! Frames on a Unix stream socket, with the descriptors that come with
//! them (`SCM_RIGHTS`), for both ends.

use crate::proto::{ProtoError, MAX_FRAME};
use std::collections::VecDeque;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// Most descriptors taken from one `recvmsg` (a frame carries one).
const FDS_PER_READ: usize = 4;

/// Most received descriptors kept waiting for their frames: more is a
/// client sending descriptors with frames that take none.
const MAX_QUEUED_FDS: usize = 64;

/// Reads whole frames (length field stripped) and queues the
/// descriptors received with them, in order.
pub struct FrameReader {
    sock: UnixStream,
    buf: Vec<u8>,
    fds: VecDeque<OwnedFd>,
}

/// Why no frame came.
#[derive(Debug)]
pub enum ReadError {
    /// The peer closed the connection (between frames).
    Closed,
    /// The socket failed, or closed inside a frame.
    Io(io::Error),
    /// A length field out of range: the stream cannot be followed.
    Framing(ProtoError),
}

impl FrameReader {
    /// Reads from `sock`.
    pub fn new(sock: UnixStream) -> FrameReader {
        FrameReader {
            sock,
            buf: Vec::new(),
            fds: VecDeque::new(),
        }
    }

    /// The next descriptor received (the one of the frame that needs it:
    /// it came with the frame's first byte, so before the frame ended).
    pub fn take_fd(&mut self) -> Option<OwnedFd> {
        self.fds.pop_front()
    }

    /// The next frame, after its length field.
    ///
    /// # Errors
    /// See [`ReadError`].
    pub fn next(&mut self) -> Result<Vec<u8>, ReadError> {
        loop {
            if self.buf.len() >= 4 {
                let len = u32::from_le_bytes(self.buf[..4].try_into().expect("sized")) as usize;
                if !(crate::proto::HEADER - 4..=MAX_FRAME).contains(&len) {
                    return Err(ReadError::Framing(ProtoError::FrameLength(len)));
                }
                if self.buf.len() >= 4 + len {
                    let rest = self.buf.split_off(4 + len);
                    let mut f = std::mem::replace(&mut self.buf, rest);
                    f.drain(..4);
                    return Ok(f);
                }
            }
            let mut chunk = [0u8; 65536];
            let n = self.recv(&mut chunk).map_err(ReadError::Io)?;
            if n == 0 {
                return Err(if self.buf.is_empty() {
                    ReadError::Closed
                } else {
                    ReadError::Io(io::ErrorKind::UnexpectedEof.into())
                });
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// One `recvmsg`: bytes into `chunk`, descriptors onto the queue.
    fn recv(&mut self, chunk: &mut [u8]) -> io::Result<usize> {
        // u64 words keep the control buffer aligned for cmsghdr.
        let mut cbuf = [0u64; 16];
        // SAFETY: CMSG_SPACE only computes a size.
        let cspace = unsafe { libc::CMSG_SPACE((FDS_PER_READ * size_of::<i32>()) as u32) };
        assert!(cspace as usize <= size_of_val(&cbuf));
        let mut iov = libc::iovec {
            iov_base: chunk.as_mut_ptr().cast(),
            iov_len: chunk.len(),
        };
        // SAFETY: msghdr is plain data; zero is a valid empty header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = cspace as _;
        let n = loop {
            // SAFETY: `msg` points at `iov` (into `chunk`) and `cbuf`,
            // both valid for writes of the lengths given, and outlives
            // the call.
            let n =
                unsafe { libc::recvmsg(self.sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
            if n >= 0 {
                break n as usize;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        };
        // SAFETY: `msg` was filled by recvmsg; the CMSG macros walk the
        // control buffer within `msg_controllen`, and each SCM_RIGHTS
        // payload is an array of descriptors the kernel just installed in
        // this process, owned by nobody else.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(c).cast::<i32>();
                    let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                    for i in 0..bytes / size_of::<i32>() {
                        let fd = OwnedFd::from_raw_fd(data.add(i).read_unaligned());
                        if self.fds.len() < MAX_QUEUED_FDS {
                            self.fds.push_back(fd);
                        }
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        Ok(n)
    }
}

/// Writes `frame` to `sock`, with `fd` as `SCM_RIGHTS` on its first byte
/// when given.
///
/// # Errors
/// The socket's.
pub fn send_frame(sock: &UnixStream, frame: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    let Some(fd) = fd else {
        return (&mut &*sock).write_all(frame);
    };
    let mut cbuf = [0u64; 4];
    // SAFETY: CMSG_SPACE/CMSG_LEN only compute sizes.
    let (space, len) = unsafe {
        (
            libc::CMSG_SPACE(size_of::<i32>() as u32),
            libc::CMSG_LEN(size_of::<i32>() as u32),
        )
    };
    let mut iov = libc::iovec {
        iov_base: frame.as_ptr() as *mut _,
        iov_len: frame.len(),
    };
    // SAFETY: msghdr is plain data; zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: the control buffer holds CMSG_SPACE(4) bytes (checked
    // against its size), so the first header and its data fit in it.
    unsafe {
        assert!(space as usize <= size_of_val(&cbuf));
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = len as _;
        libc::CMSG_DATA(c)
            .cast::<i32>()
            .write_unaligned(fd.as_raw_fd());
    }
    let sent = loop {
        // SAFETY: `msg` points at `iov` (into `frame`, read only by the
        // kernel) and `cbuf`, valid for the lengths given.
        let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    (&mut &*sock).write_all(&frame[sent..])
}
