//! Frames on a Unix stream socket, with the descriptors that come with
//! them (`SCM_RIGHTS`), for both ends.

use crate::proto::{ProtoError, MAX_FRAME};
use nix::errno::Errno;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
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
        let mut cmsg = nix::cmsg_space!([RawFd; FDS_PER_READ]);
        let mut iov = [IoSliceMut::new(chunk)];
        let msg = loop {
            match recvmsg::<()>(
                self.sock.as_raw_fd(),
                &mut iov,
                Some(&mut cmsg),
                MsgFlags::MSG_CMSG_CLOEXEC,
            ) {
                Err(Errno::EINTR) => continue,
                r => break r?,
            }
        };
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(fds) = c {
                for fd in fds {
                    // SAFETY: the kernel just installed this descriptor in
                    // this process for this message; nobody else owns it.
                    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                    if self.fds.len() < MAX_QUEUED_FDS {
                        self.fds.push_back(fd);
                    }
                }
            }
        }
        Ok(msg.bytes)
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
    let fds = [fd.as_raw_fd()];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let iov = [IoSlice::new(frame)];
    let sent = loop {
        match sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None) {
            Err(Errno::EINTR) => continue,
            r => break r?,
        }
    };
    (&mut &*sock).write_all(&frame[sent..])
}
