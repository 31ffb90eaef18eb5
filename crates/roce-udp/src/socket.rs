//! The datagram socket of one node address.

use crate::waker::Waker;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::time::Duration;

/// The IANA port of RoCEv2.
pub const ROCE_PORT: u16 = 4791;

/// Largest datagram we receive: IB MTU 4096 plus headers, rounded up.
const MAX_DATAGRAM: usize = 4096 + 256;

/// `UDP_NO_CHECK6_RX` from `linux/udp.h` (not in every libc).
const UDP_NO_CHECK6_RX: libc::c_int = 102;
/// `UDP_SEGMENT` (send-side segmentation offload) from `linux/udp.h`.
const UDP_SEGMENT: libc::c_int = 103;
/// `UDP_GRO` (receive coalescing) from `linux/udp.h`.
const UDP_GRO: libc::c_int = 104;
/// Most segments one GSO send may carry (the kernel's `UDP_MAX_SEGMENTS`).
const GSO_MAX_SEGMENTS: usize = 64;
/// Most bytes one GSO send may carry (below the 64 KiB IP length limit).
const GSO_MAX_BYTES: usize = 65_000;
/// Receive buffer size when the kernel may hand us coalesced segments.
const GRO_BUFFER: usize = 65_536;
/// Room for one control message holding an int, 8-byte aligned.
const CMSG_ROOM: usize = 32;

/// Counters of the socket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SocketStats {
    /// Datagrams sent.
    pub sent: u64,
    /// Datagrams the kernel refused to send (counted, not retried: the
    /// transport's retransmission covers them like wire loss).
    pub send_errors: u64,
    /// Datagrams received.
    pub received: u64,
    /// `sendmmsg` calls.
    pub send_calls: u64,
    /// `recvmmsg` calls that returned data.
    pub recv_calls: u64,
    /// Sends that carried several datagrams as one segmented (GSO) buffer.
    pub gso_sends: u64,
    /// Received buffers the kernel had coalesced from several datagrams.
    pub gro_buffers: u64,
}

/// One received datagram, in a buffer of the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// Sender address.
    pub src: SocketAddr,
    /// Bytes in the buffer.
    pub len: usize,
    /// Place of this datagram in a buffer the kernel coalesced (GRO): 0
    /// for the first or only one. Segments of one GSO send get IPv4
    /// Identifications 0, 1, 2, ... from an unconnected DF socket, so this
    /// is the Identification the sender's kernel gave the datagram when the
    /// whole send arrived as one buffer.
    pub segment: u16,
}

/// The `recvmmsg` headers of a receive batch, built once rather than per
/// call: a node polls its socket in a loop, and building 64 headers and two
/// vectors each time was 3 % of a 64 KiB WRITE stream's samples on both
/// ends, most of it on polls that found nothing. Each header points at its
/// buffer, name and control area, heap storage of the same socket that
/// does not move while the headers exist (they are rebuilt when it
/// grows). Between calls only what the kernel writes back (name and
/// control lengths) is reset, for the headers the last call filled.
#[derive(Default)]
struct RecvHeaders {
    msgs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
    /// Buffers and GRO setting the headers were built for.
    built_for: (usize, bool),
    /// Headers the last call filled.
    dirty: usize,
}

// SAFETY: the raw pointers in the headers refer to buffers owned by the
// same `RoceSocket` and are used only through its `&mut self`.
unsafe impl Send for RecvHeaders {}
// SAFETY: as for Send; `&RecvHeaders` reads nothing through the pointers.
unsafe impl Sync for RecvHeaders {}

impl std::fmt::Debug for RecvHeaders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvHeaders")
            .field("count", &self.msgs.len())
            .finish()
    }
}

/// A datagram to send in pieces the kernel gathers (iovecs): where it
/// goes and its bytes, piece by piece in order ([`RoceSocket::send_runs_gather`]).
pub trait Gather {
    /// The destination.
    fn dst(&self) -> SocketAddr;
    /// The pieces, in order (empty ones are skipped).
    fn pieces(&self) -> impl Iterator<Item = &[u8]>;
    /// The datagram's length: the pieces' lengths summed.
    fn len(&self) -> usize {
        self.pieces().map(<[u8]>::len).sum()
    }
    /// Calls `f` with each piece, in order: what a send gathers (empty
    /// ones may be left out). [`Gather::pieces`] without the empty ones,
    /// unless a type does it in a tighter loop.
    fn each_piece(&self, mut f: impl FnMut(&[u8])) {
        for p in self.pieces().filter(|p| !p.is_empty()) {
            f(p);
        }
    }
    /// How many datagrams it holds: more than one are the segments of one
    /// GSO buffer, each [`Gather::len`] bytes but a last that may be
    /// shorter, their pieces in order. Such a one needs a run of its own
    /// and at most [`RoceSocket::gso_run_room`] datagrams.
    fn count(&self) -> usize {
        1
    }
    /// Whether the datagram is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Gather for (SocketAddr, &[&[u8]]) {
    fn dst(&self) -> SocketAddr {
        self.0
    }
    fn pieces(&self) -> impl Iterator<Item = &[u8]> {
        self.1.iter().copied()
    }
}

/// The datagrams run `r` of `batch` holds.
fn datagrams<G: Gather>(batch: &[G], r: &std::ops::Range<usize>) -> usize {
    match r.len() {
        1 => batch[r.start].count(),
        _ => batch[r.clone()].iter().map(Gather::count).sum(),
    }
}

/// The `sendmmsg` arrays of a send, kept between calls so a send
/// allocates nothing once they have grown to a batch's size. Between calls
/// they are empty: no pointer outlives the call that made it.
#[derive(Default)]
struct SendScratch {
    addrs: Vec<SockAddr>,
    iovs: Vec<libc::iovec>,
    /// Per run: where its iovecs start and how many it has.
    spans: Vec<(usize, usize)>,
    cmsgs: Vec<[u64; CMSG_ROOM / 8]>,
    msgs: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers in the arrays are made and used within one
// `send_runs_gather` call (through `&mut RoceSocket`) and cleared before
// it returns.
unsafe impl Send for SendScratch {}
// SAFETY: as for Send; between calls the arrays are empty.
unsafe impl Sync for SendScratch {}

impl std::fmt::Debug for SendScratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendScratch").finish_non_exhaustive()
    }
}

/// A UDP socket bound to one node address.
#[derive(Debug)]
pub struct RoceSocket {
    sock: Socket,
    local: SocketAddr,
    stats: SocketStats,
    /// Receive buffers reused across batches.
    bufs: Vec<Vec<u8>>,
    /// Source addresses and control messages of a receive batch, reused
    /// (zeroed once: the kernel writes what each call reads).
    names: Vec<libc::sockaddr_storage>,
    cmsgs: Vec<[u64; CMSG_ROOM / 8]>,
    /// The message headers pointing at them.
    hdrs: RecvHeaders,
    /// The arrays of a send, reused.
    send: SendScratch,
    /// The kernel segments our sends (`UDP_SEGMENT`) and we use it.
    gso: bool,
    /// The kernel may coalesce received datagrams (`UDP_GRO` is on).
    gro: bool,
}

impl RoceSocket {
    /// Binds `addr` with the options described in the crate docs.
    ///
    /// # Errors
    /// The address is in use or not local, or an option was refused.
    pub fn bind(addr: SocketAddr) -> io::Result<RoceSocket> {
        RoceSocket::adopt(bound_socket(addr, false)?.into())
    }

    /// A handle on a socket made by [`bound_socket`] (in this process or,
    /// its descriptor passed over, another: a member of a
    /// [`crate::PortGroup`]), with the offloads set up as
    /// [`RoceSocket::bind`] sets them.
    ///
    /// # Errors
    /// The descriptor is not a bound IP socket.
    pub fn adopt(fd: std::os::fd::OwnedFd) -> io::Result<RoceSocket> {
        let sock = Socket::from(fd);
        sock.set_nonblocking(true)?;
        let fd = sock.as_raw_fd();
        // Offloads are optional: a kernel without them (before 4.18 / 5.0)
        // refuses the options and we send and receive one datagram at a time.
        let gso = set_int(fd, libc::IPPROTO_UDP, UDP_SEGMENT, 0).is_ok();
        let gro = set_int(fd, libc::IPPROTO_UDP, UDP_GRO, 1).is_ok();
        let local = sock
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("bound address is not IP"))?;
        Ok(RoceSocket::on(sock, local, gso, gro))
    }

    /// A handle on `sock`, bound at `local`, with fresh buffers and
    /// counters.
    fn on(sock: Socket, local: SocketAddr, gso: bool, gro: bool) -> RoceSocket {
        RoceSocket {
            sock,
            local,
            stats: SocketStats::default(),
            bufs: Vec::new(),
            names: Vec::new(),
            cmsgs: Vec::new(),
            hdrs: RecvHeaders::default(),
            send: SendScratch::default(),
            gso,
            gro,
        }
    }

    /// A second handle on the same socket (a duplicated descriptor), with
    /// its own receive buffers and counters: one thread may send through
    /// one handle while another receives through the other, neither
    /// waiting for a lock the other holds. Its offload settings start as
    /// this handle's.
    ///
    /// # Errors
    /// The descriptor could not be duplicated (out of descriptors).
    pub fn try_clone(&self) -> io::Result<RoceSocket> {
        let sock = self.sock.try_clone()?;
        Ok(RoceSocket::on(sock, self.local, self.gso, self.gro))
    }

    /// Whether sends are grouped into segmented (GSO) sends.
    pub fn gso(&self) -> bool {
        self.gso
    }

    /// Turns grouping of sends into GSO sends on or off (off sends every
    /// datagram on its own; on needs kernel support, see [`RoceSocket::gso`]).
    pub fn set_gso(&mut self, on: bool) {
        self.gso = on && set_int(self.sock.as_raw_fd(), libc::IPPROTO_UDP, UDP_SEGMENT, 0).is_ok();
    }

    /// Turns receive coalescing (`UDP_GRO`) on or off; returns whether it
    /// is on now.
    pub fn set_gro(&mut self, on: bool) -> bool {
        let ok = set_int(
            self.sock.as_raw_fd(),
            libc::IPPROTO_UDP,
            UDP_GRO,
            i32::from(on),
        )
        .is_ok();
        self.gro = on && ok;
        self.gro
    }

    /// How [`RoceSocket::send_runs`] will group `batch`: runs of
    /// consecutive datagrams to one destination, all of one size except a
    /// shorter last one, at most 64 datagrams and 65,000 bytes, sent as one
    /// segmented buffer. Without GSO every run is one datagram.
    ///
    /// The kernel gives the segments of one run IPv4 Identifications 0, 1,
    /// 2, … (an unconnected socket with DF set), where a lone datagram gets
    /// 0. A sender whose datagrams carry a checksum over the
    /// Identification (the RoCEv2 ICRC) must compute datagram `k` of a run
    /// with Identification `k`.
    pub fn gso_runs(&self, batch: &[(SocketAddr, &[u8])]) -> Vec<std::ops::Range<usize>> {
        let lens: Vec<(SocketAddr, usize)> = batch.iter().map(|(a, d)| (*a, d.len())).collect();
        self.gso_runs_by_len(&lens)
    }

    /// [`RoceSocket::gso_runs`] from each datagram's destination and
    /// length (for datagrams held in pieces, see
    /// [`RoceSocket::send_runs_vectored`]).
    pub fn gso_runs_by_len(&self, batch: &[(SocketAddr, usize)]) -> Vec<std::ops::Range<usize>> {
        let mut runs = Vec::new();
        self.gso_runs_into(batch.len(), |i| batch[i], &mut runs);
        runs
    }

    /// [`RoceSocket::gso_runs_by_len`] into `runs` (cleared first), the
    /// destination and length of datagram `i` of `count` given by `at(i)`:
    /// no allocation once `runs` has grown.
    pub fn gso_runs_into(
        &self,
        count: usize,
        at: impl Fn(usize) -> (SocketAddr, usize),
        runs: &mut Vec<std::ops::Range<usize>>,
    ) {
        runs.clear();
        let mut i = 0;
        while i < count {
            let (dst, size) = at(i);
            let mut j = i + 1;
            let mut bytes = size;
            if self.gso && size > 0 {
                while j < count && j - i < GSO_MAX_SEGMENTS {
                    let (d, len) = at(j);
                    if d != dst || len > size || bytes + len > GSO_MAX_BYTES || len == 0 {
                        break;
                    }
                    bytes += len;
                    j += 1;
                    if len < size {
                        break; // a shorter datagram ends the run
                    }
                }
            }
            runs.push(i..j);
            i = j;
        }
    }

    /// How many datagrams of `len` bytes one GSO buffer takes (1 without
    /// GSO): the most a [`Gather`] may hold.
    pub fn gso_run_room(&self, len: usize) -> usize {
        match self.gso && len > 0 {
            true => GSO_MAX_SEGMENTS.min(GSO_MAX_BYTES / len).max(1),
            false => 1,
        }
    }

    /// Sends `batch` grouped as `runs` (from [`RoceSocket::gso_runs`] on the
    /// same batch). Returns how many runs the kernel took, from the first; a
    /// full socket buffer stops early (the caller sends the remaining runs
    /// later, grouped the same way), a run the kernel refuses for another
    /// reason is counted as lost. A kernel that refuses segmentation itself
    /// turns GSO off for later batches.
    pub fn send_runs(
        &mut self,
        batch: &[(SocketAddr, &[u8])],
        runs: &[std::ops::Range<usize>],
    ) -> usize {
        let pieces: Vec<[&[u8]; 1]> = batch.iter().map(|(_, d)| [*d]).collect();
        let vectored: Vec<(SocketAddr, &[&[u8]])> = batch
            .iter()
            .zip(&pieces)
            .map(|((a, _), p)| (*a, &p[..]))
            .collect();
        self.send_runs_vectored(&vectored, runs)
    }

    /// [`RoceSocket::send_runs`] for datagrams held in pieces: datagram `i`
    /// is the concatenation of `batch[i].1`, which the kernel gathers
    /// (iovecs), so a sender need not copy headers and payload into one
    /// buffer. `runs` come from [`RoceSocket::gso_runs_by_len`] over the
    /// datagrams' total lengths; the segment size of a run is the length of
    /// its first datagram.
    pub fn send_runs_vectored(
        &mut self,
        batch: &[(SocketAddr, &[&[u8]])],
        runs: &[std::ops::Range<usize>],
    ) -> usize {
        self.send_runs_gather(batch, runs)
    }

    /// [`RoceSocket::send_runs_vectored`] for any datagrams that say where
    /// they go and hand over their pieces ([`Gather`]): the socket keeps
    /// the system call's arrays between calls, so a send allocates nothing.
    pub fn send_runs_gather<G: Gather>(
        &mut self,
        batch: &[G],
        runs: &[std::ops::Range<usize>],
    ) -> usize {
        let mut done = 0;
        while done < runs.len() {
            let chunk = &runs[done..runs.len().min(done + 64)];
            let n = self.send_chunk(batch, chunk);
            self.stats.send_calls += 1;
            let n = match n {
                Ok(n) => n,
                Err(err) => {
                    if err.kind() == io::ErrorKind::WouldBlock {
                        return done;
                    }
                    let segs = datagrams(batch, &chunk[0]);
                    if segs > 1
                        && matches!(
                            err.raw_os_error(),
                            Some(libc::EINVAL | libc::EIO | libc::EOPNOTSUPP | libc::ENOPROTOOPT)
                        )
                    {
                        self.gso = false;
                    }
                    self.stats.send_errors += segs as u64;
                    done += 1;
                    continue;
                }
            };
            for r in &chunk[..n] {
                let segs = datagrams(batch, r);
                self.stats.sent += segs as u64;
                if segs > 1 {
                    self.stats.gso_sends += 1;
                }
            }
            done += n;
        }
        done
    }

    /// One `sendmmsg` of up to 64 runs; how many the kernel took.
    fn send_chunk<G: Gather>(
        &mut self,
        batch: &[G],
        chunk: &[std::ops::Range<usize>],
    ) -> io::Result<usize> {
        let sc = &mut self.send;
        sc.addrs.clear();
        sc.addrs
            .extend(chunk.iter().map(|r| SockAddr::from(batch[r.start].dst())));
        // Every iovec is in place before any header points into the array.
        sc.iovs.clear();
        sc.spans.clear();
        for r in chunk {
            let at = sc.iovs.len();
            for d in &batch[r.clone()] {
                d.each_piece(|p| {
                    sc.iovs.push(libc::iovec {
                        iov_base: p.as_ptr() as *mut libc::c_void,
                        iov_len: p.len(),
                    })
                });
            }
            sc.spans.push((at, sc.iovs.len() - at));
        }
        sc.cmsgs.clear();
        sc.cmsgs.resize(chunk.len(), [0u64; CMSG_ROOM / 8]);
        sc.msgs.clear();
        for (k, r) in chunk.iter().enumerate() {
            // SAFETY: all-zero is a valid mmsghdr.
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            m.msg_hdr.msg_name = sc.addrs[k].as_ptr() as *mut libc::c_void;
            m.msg_hdr.msg_namelen = sc.addrs[k].len();
            let (at, count) = sc.spans[k];
            // SAFETY: `at + count <= iovs.len()`; an empty datagram has
            // no iovec and a one-past-the-end pointer that is never read.
            m.msg_hdr.msg_iov = unsafe { sc.iovs.as_mut_ptr().add(at) };
            m.msg_hdr.msg_iovlen = count as _;
            if r.len() > 1 || batch[r.start].count() > 1 {
                let seg = batch[r.start].len() as u16;
                let room = &mut sc.cmsgs[k];
                m.msg_hdr.msg_control = room.as_mut_ptr().cast();
                // SAFETY: CMSG_SPACE of a u16 fits CMSG_ROOM bytes.
                m.msg_hdr.msg_controllen = unsafe { libc::CMSG_SPACE(2) } as _;
                // SAFETY: msg_control points at CMSG_ROOM aligned bytes
                // that hold one header and its u16 payload.
                unsafe {
                    let c = libc::CMSG_FIRSTHDR(&m.msg_hdr);
                    (*c).cmsg_level = libc::IPPROTO_UDP;
                    (*c).cmsg_type = UDP_SEGMENT;
                    (*c).cmsg_len = libc::CMSG_LEN(2) as _;
                    std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), seg);
                }
            }
            sc.msgs.push(m);
        }
        // SAFETY: every pointer in msgs refers to addrs/iovs/cmsgs/batch,
        // which outlive the call; the count matches the vector length.
        let n = unsafe {
            libc::sendmmsg(
                self.sock.as_raw_fd(),
                sc.msgs.as_mut_ptr(),
                sc.msgs.len() as libc::c_uint,
                0,
            )
        };
        let r = if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        };
        // No pointer into the batch is kept past the call.
        sc.iovs.clear();
        sc.msgs.clear();
        r
    }

    /// The bound address (with the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Counters so far.
    pub fn stats(&self) -> SocketStats {
        self.stats
    }

    /// Sends a batch of datagrams with as few system calls as possible,
    /// each on its own (no segmentation offload). Returns how many the
    /// kernel took; a full socket buffer stops the batch early (the caller
    /// keeps the rest), other errors count the datagram as lost and go on.
    pub fn send_batch(&mut self, batch: &[(SocketAddr, &[u8])]) -> usize {
        let runs: Vec<std::ops::Range<usize>> = (0..batch.len()).map(|i| i..i + 1).collect();
        self.send_runs(batch, &runs)
    }

    /// Receives up to `max` datagrams without blocking and hands each to
    /// `f(received, bytes)` (a buffer the kernel coalesced is handed over
    /// datagram by datagram). Returns how many system-call buffers arrived.
    pub fn recv_batch(&mut self, max: usize, mut f: impl FnMut(Received, &[u8])) -> usize {
        let max = max.clamp(1, 64);
        let size = if self.gro { GRO_BUFFER } else { MAX_DATAGRAM };
        while self.bufs.len() < max {
            self.bufs.push(vec![0u8; size]);
        }
        let gro = self.gro;
        let hdrs = &mut self.hdrs;
        if hdrs.built_for != (self.bufs.len(), gro) {
            let count = self.bufs.len();
            // The iovecs are allocated at their final length before any
            // header points into them.
            hdrs.iovs = self
                .bufs
                .iter_mut()
                .map(|b| libc::iovec {
                    iov_base: b.as_mut_ptr().cast(),
                    iov_len: b.len(),
                })
                .collect();
            self.names.resize(count, zeroed_storage());
            self.cmsgs.resize(count, [0u64; CMSG_ROOM / 8]);
            let (names, cmsgs, iovs) = (&mut self.names, &mut self.cmsgs, &mut hdrs.iovs);
            hdrs.msgs = (0..count)
                .map(|i| {
                    // SAFETY: all-zero is a valid mmsghdr.
                    let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                    m.msg_hdr.msg_name = (&mut names[i] as *mut libc::sockaddr_storage).cast();
                    m.msg_hdr.msg_iov = &mut iovs[i];
                    m.msg_hdr.msg_iovlen = 1;
                    if gro {
                        m.msg_hdr.msg_control = cmsgs[i].as_mut_ptr().cast();
                    }
                    m
                })
                .collect();
            hdrs.built_for = (count, gro);
            // Lengths are set below, as after a call that filled them all.
            hdrs.dirty = count;
        }
        for m in &mut hdrs.msgs[..hdrs.dirty] {
            m.msg_hdr.msg_namelen =
                std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            m.msg_hdr.msg_controllen = if gro { CMSG_ROOM as _ } else { 0 };
            m.msg_hdr.msg_flags = 0;
        }
        let msgs = &mut hdrs.msgs;
        // SAFETY: buffers, names, control areas and iovecs outlive the call
        // and `max <= msgs.len()`; each header points at its own.
        let n = unsafe {
            libc::recvmmsg(
                self.sock.as_raw_fd(),
                msgs.as_mut_ptr(),
                max as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        hdrs.dirty = usize::try_from(n).unwrap_or(0).min(max);
        if n <= 0 {
            return 0;
        }
        self.stats.recv_calls += 1;
        let n = n as usize;
        for (i, m) in self.hdrs.msgs.iter().enumerate().take(n) {
            let len = (m.msg_len as usize).min(self.bufs[i].len());
            // SAFETY: the kernel filled msg_namelen bytes of a sockaddr_storage.
            let addr = unsafe { SockAddr::new(self.names[i], m.msg_hdr.msg_namelen) };
            let Some(src) = addr.as_socket() else {
                continue;
            };
            let seg = gro_segment_size(&m.msg_hdr).unwrap_or(len).max(1);
            if seg < len {
                self.stats.gro_buffers += 1;
            }
            let data = &self.bufs[i][..len];
            if data.is_empty() {
                // An empty datagram is still a datagram (junk to count).
                self.stats.received += 1;
                f(
                    Received {
                        src,
                        len: 0,
                        segment: 0,
                    },
                    data,
                );
                continue;
            }
            for (k, d) in data.chunks(seg).enumerate() {
                self.stats.received += 1;
                let r = Received {
                    src,
                    len: d.len(),
                    segment: k.min(u16::MAX as usize) as u16,
                };
                f(r, d);
            }
        }
        n
    }

    /// Sleeps until the socket is readable, `waker` fires, or `timeout`
    /// passes. Returns whether the socket is readable.
    ///
    /// # Errors
    /// `poll(2)` failed for a reason other than a signal.
    pub fn wait(&self, waker: Option<&Waker>, timeout: Duration) -> io::Result<bool> {
        wait_readable(self.sock.as_raw_fd(), waker, timeout)
    }
}

impl AsRawFd for RoceSocket {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.sock.as_raw_fd()
    }
}

/// Sleeps until `fd` is readable, `waker` fires, or `timeout` passes (with
/// microsecond resolution, so short timer deadlines do not turn into a
/// spin). Returns whether `fd` is readable. Lets a driver thread wait on a
/// node's socket without holding the lock that guards the node.
///
/// # Errors
/// `ppoll(2)` failed for a reason other than a signal.
pub fn wait_readable(
    fd: std::os::fd::RawFd,
    waker: Option<&Waker>,
    timeout: Duration,
) -> io::Result<bool> {
    wait_readable_or(fd, waker, &[], timeout)
}

/// [`wait_readable`] that also wakes when one of `also` is readable
/// (descriptors that say there is other work, such as a client's
/// doorbell; the caller empties them). Returns whether `fd` is.
///
/// # Errors
/// `ppoll` failed for another reason than a signal.
pub fn wait_readable_or(
    fd: std::os::fd::RawFd,
    waker: Option<&Waker>,
    also: &[std::os::fd::RawFd],
    timeout: Duration,
) -> io::Result<bool> {
    let pfd = |fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let mut fds = [pfd(-1); 2 + WAIT_ALSO_MAX];
    fds[0].fd = fd;
    fds[1].fd = waker.map_or(-1, |w| w.as_raw_fd());
    let n = 2 + also.len().min(WAIT_ALSO_MAX);
    for (slot, &a) in fds[2..n].iter_mut().zip(also) {
        slot.fd = a;
    }
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: fds holds n valid pollfd (a negative fd is ignored), ts a
    // valid timespec, and no signal mask is passed.
    let r = unsafe { libc::ppoll(fds.as_mut_ptr(), n as libc::nfds_t, &ts, std::ptr::null()) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(false)
        } else {
            Err(e)
        };
    }
    if let Some(w) = waker {
        if fds[1].revents != 0 {
            w.drain();
        }
    }
    Ok(fds[0].revents & libc::POLLIN != 0)
}

/// Most descriptors [`wait_readable_or`] watches beside the socket and
/// the waker (more are not watched: their owner must be woken another
/// way, or looked at by a bounded sleep).
pub const WAIT_ALSO_MAX: usize = 30;

/// The segment size of a coalesced receive (the `UDP_GRO` control
/// message), if the kernel attached one.
fn gro_segment_size(h: &libc::msghdr) -> Option<usize> {
    #[allow(clippy::unnecessary_cast)] // socklen_t on some targets
    let controllen = h.msg_controllen as usize;
    if h.msg_control.is_null() || controllen < std::mem::size_of::<libc::cmsghdr>() {
        return None;
    }
    // SAFETY: msg_control/msg_controllen describe the control area the
    // kernel filled; CMSG_FIRSTHDR/NXTHDR stay inside it.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            if (*c).cmsg_level == libc::IPPROTO_UDP && (*c).cmsg_type == UDP_GRO {
                let v = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
                return usize::try_from(v).ok().filter(|&v| v > 0);
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    None
}

/// An all-zero `sockaddr_storage` (a valid one: family unspecified).
fn zeroed_storage() -> libc::sockaddr_storage {
    // SAFETY: all-zero is a valid sockaddr_storage.
    unsafe { std::mem::zeroed() }
}

/// A UDP socket bound to `addr` with the options of the crate docs;
/// with `shared`, one of a `SO_REUSEPORT` group ([`crate::PortGroup`]):
/// every socket of the group must say so, and be made by one user.
///
/// # Errors
/// The address is in use or not local, or an option was refused.
pub(crate) fn bound_socket(addr: SocketAddr, shared: bool) -> io::Result<Socket> {
    let domain = if addr.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let sock = Socket::new(
        domain,
        Type::DGRAM.nonblocking().cloexec(),
        Some(Protocol::UDP),
    )?;
    let fd = sock.as_raw_fd();
    match addr.ip() {
        IpAddr::V4(_) => set_int(
            fd,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )?,
        IpAddr::V6(_) => {
            sock.set_only_v6(true)?;
            set_int(fd, libc::IPPROTO_UDP, UDP_NO_CHECK6_RX, 1)?;
        }
    }
    // Room for bursts of full-MTU packets. The kernel clamps the plain
    // option to net.core.rmem_max (often 208 KiB, a few dozen 4 KiB
    // packets); with CAP_NET_ADMIN the FORCE variants lift the clamp.
    const BUF: libc::c_int = 8 << 20;
    if set_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, BUF).is_err() {
        let _ = sock.set_recv_buffer_size(BUF as usize);
    }
    if set_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, BUF).is_err() {
        let _ = sock.set_send_buffer_size(BUF as usize);
    }
    if shared {
        sock.set_reuse_port(true)?;
    }
    sock.bind(&SockAddr::from(addr))?;
    Ok(sock)
}

pub(crate) fn set_int(
    fd: libc::c_int,
    level: libc::c_int,
    opt: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: passes a pointer to a live c_int and its size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn pair() -> (RoceSocket, RoceSocket) {
        let a = RoceSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let b = RoceSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        (a, b)
    }

    fn recv_all(s: &mut RoceSocket, want: usize) -> Vec<(SocketAddr, Vec<u8>)> {
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while got.len() < want && Instant::now() < deadline {
            s.wait(None, Duration::from_millis(100)).unwrap();
            s.recv_batch(64, |r, d| got.push((r.src, d.to_vec())));
        }
        got
    }

    #[test]
    fn batch_round_trip_preserves_order_and_sources() {
        let (mut a, mut b) = pair();
        let dst = b.local_addr();
        let payloads: Vec<Vec<u8>> = (0..150u32)
            .map(|i| i.to_be_bytes().repeat(1 + (i as usize % 300)))
            .collect();
        let batch: Vec<(SocketAddr, &[u8])> =
            payloads.iter().map(|p| (dst, p.as_slice())).collect();
        let mut sent = 0;
        while sent < batch.len() {
            sent += a.send_batch(&batch[sent..]);
        }
        let got = recv_all(&mut b, 150);
        assert_eq!(got.len(), 150);
        for (i, (src, data)) in got.iter().enumerate() {
            assert_eq!(*src, a.local_addr());
            assert_eq!(data, &payloads[i], "datagram {i}");
        }
        assert!(a.stats().send_calls < 150, "batched: {:?}", a.stats());
        assert!(b.stats().recv_calls < 150, "batched: {:?}", b.stats());
    }

    /// A clone is the same socket: what it sends leaves from the bound
    /// address, and what arrives is received through either handle.
    #[test]
    fn a_clone_sends_and_receives_as_the_same_socket() {
        let (a, mut b) = pair();
        let mut a2 = a.try_clone().unwrap();
        assert_eq!(a2.local_addr(), a.local_addr());
        let d: &[u8] = b"clone";
        assert_eq!(a2.send_batch(&[(b.local_addr(), d)]), 1);
        let got = recv_all(&mut b, 1);
        assert_eq!(got, vec![(a.local_addr(), d.to_vec())]);
        assert_eq!(b.send_batch(&[(a.local_addr(), d)]), 1);
        let mut a = a;
        assert_eq!(recv_all(&mut a, 1), vec![(b.local_addr(), d.to_vec())]);
        assert_eq!((a2.stats().sent, a.stats().received), (1, 1));
    }

    #[test]
    fn gso_runs_group_equal_sizes_to_one_peer_and_arrive_intact() {
        let (mut a, mut b) = pair();
        let (_c, c_addr) = {
            let c = RoceSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
            let addr = c.local_addr();
            (c, addr)
        };
        let dst = b.local_addr();
        // 40 full datagrams and a short one to b, then one to c, then 3 more
        // to b of another size.
        let mut payloads: Vec<(SocketAddr, Vec<u8>)> = (0..40u32)
            .map(|i| (dst, i.to_be_bytes().repeat(1000 / 4)))
            .collect();
        payloads.push((dst, vec![0xAB; 17]));
        payloads.push((c_addr, vec![0xCD; 1000]));
        for i in 0..3u8 {
            payloads.push((dst, vec![i; 600]));
        }
        let batch: Vec<(SocketAddr, &[u8])> =
            payloads.iter().map(|(d, p)| (*d, p.as_slice())).collect();
        let runs = a.gso_runs(&batch);
        if a.gso() {
            assert_eq!(runs, vec![0..41, 41..42, 42..45]);
        } else {
            assert_eq!(runs.len(), batch.len(), "no GSO: one run each");
        }
        let mut done = 0;
        let deadline = Instant::now() + Duration::from_secs(5);
        while done < runs.len() {
            assert!(Instant::now() < deadline);
            done += a.send_runs(&batch, &runs[done..]);
        }
        assert_eq!(a.stats().sent, 45);
        let mut got = Vec::new();
        let mut segments = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while got.len() < 44 && Instant::now() < deadline {
            b.wait(None, Duration::from_millis(100)).unwrap();
            b.recv_batch(64, |r, d| {
                got.push(d.to_vec());
                segments.push(r.segment);
            });
        }
        let want: Vec<Vec<u8>> = payloads
            .iter()
            .filter(|(d, _)| *d == dst)
            .map(|(_, p)| p.clone())
            .collect();
        assert_eq!(got, want, "every datagram, in order, byte for byte");
        println!("sender {:?}\nreceiver {:?}", a.stats(), b.stats());
        if a.gso() && b.gro && b.stats().gro_buffers > 0 {
            // Coalesced: each datagram knows its place in its send.
            assert_eq!(&segments[..41], &(0..41).collect::<Vec<u16>>()[..]);
            assert_eq!(&segments[41..], &[0, 1, 2]);
        }
        if a.gso() {
            assert_eq!(a.stats().gso_sends, 2, "{:?}", a.stats());
        }
    }

    #[test]
    fn datagrams_in_pieces_arrive_as_their_concatenation() {
        let mut a = RoceSocket::bind("127.0.160.1:0".parse().unwrap()).unwrap();
        let mut b = RoceSocket::bind("127.0.160.2:0".parse().unwrap()).unwrap();
        let dst = b.local_addr();
        // Header, payload (empty in some), trailer: 20 equal-size datagrams
        // (one GSO run) then a shorter one with an empty payload piece.
        let heads: Vec<Vec<u8>> = (0..21u8).map(|i| vec![i; 12]).collect();
        let bodies: Vec<Vec<u8>> = (0..21u32)
            .map(|i| {
                if i < 20 {
                    i.to_le_bytes().repeat(256)
                } else {
                    Vec::new()
                }
            })
            .collect();
        let tail = [0xEEu8; 4];
        let pieces: Vec<[&[u8]; 3]> = heads
            .iter()
            .zip(&bodies)
            .map(|(h, p)| [h.as_slice(), p.as_slice(), &tail[..]])
            .collect();
        let batch: Vec<(SocketAddr, &[&[u8]])> = pieces.iter().map(|p| (dst, &p[..])).collect();
        let lens: Vec<(SocketAddr, usize)> = pieces
            .iter()
            .map(|p| (dst, p.iter().map(|x| x.len()).sum()))
            .collect();
        let runs = a.gso_runs_by_len(&lens);
        if a.gso() {
            assert_eq!(runs, vec![0..21]);
        }
        let mut done = 0;
        let deadline = Instant::now() + Duration::from_secs(5);
        while done < runs.len() {
            assert!(Instant::now() < deadline);
            done += a.send_runs_vectored(&batch, &runs[done..]);
        }
        let got: Vec<Vec<u8>> = recv_all(&mut b, 21).into_iter().map(|(_, d)| d).collect();
        let want: Vec<Vec<u8>> = pieces.iter().map(|p| p.concat()).collect();
        assert_eq!(got, want, "each datagram is its pieces, in order");
    }

    #[test]
    fn receive_headers_are_reused_across_calls_and_gro_changes() {
        let mut a = RoceSocket::bind("127.0.160.3:0".parse().unwrap()).unwrap();
        let mut b = RoceSocket::bind("127.0.160.4:0".parse().unwrap()).unwrap();
        let mut c = RoceSocket::bind("127.0.160.5:0".parse().unwrap()).unwrap();
        let dst = b.local_addr();
        // Rounds of different sizes from two senders, with GRO turned off
        // and on between them: every datagram arrives whole, with its
        // sender, whatever the previous call left in the headers.
        for (round, gro) in [(0u8, true), (1, false), (2, true), (3, true)] {
            b.set_gro(gro);
            let mut want = Vec::new();
            for i in 0..(5 + round as usize * 7) {
                let from_c = i % 3 == 0;
                let data = vec![round * 16 + (i % 16) as u8; 100 + i * 13];
                let s = if from_c { &mut c } else { &mut a };
                assert_eq!(s.send_batch(&[(dst, &data[..])]), 1);
                want.push((s.local_addr(), data));
            }
            let got = recv_all(&mut b, want.len());
            let mut got_sorted = got.clone();
            got_sorted.sort();
            want.sort();
            assert_eq!(got_sorted, want, "round {round}");
        }
    }

    #[test]
    fn ipv4_sockets_send_with_df_so_the_kernel_uses_id_zero() {
        let (a, _b) = pair();
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: valid out-pointers for an int option.
        let r = unsafe {
            libc::getsockopt(
                a.sock.as_raw_fd(),
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(r, 0);
        assert_eq!(v, libc::IP_PMTUDISC_DO);
    }

    #[test]
    fn ipv6_sockets_accept_zero_checksums_option() {
        let s = match RoceSocket::bind("[::1]:0".parse().unwrap()) {
            Ok(s) => s,
            Err(e) => {
                rdma_testkit::need::WHOLE.skip(
                    &format!("IPv6 loopback: bind [::1]: {e}"),
                    "sysctl net.ipv6.conf.lo.disable_ipv6=0",
                );
                return;
            }
        };
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: valid out-pointers for an int option.
        let r = unsafe {
            libc::getsockopt(
                s.sock.as_raw_fd(),
                libc::IPPROTO_UDP,
                UDP_NO_CHECK6_RX,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(r, 0);
        assert_eq!(v, 1);
    }

    #[test]
    fn waker_interrupts_wait_and_idle_wait_times_out() {
        let (a, _b) = pair();
        let waker = std::sync::Arc::new(Waker::new().unwrap());
        let w2 = waker.clone();
        let t = std::thread::spawn(move || w2.wake());
        let start = Instant::now();
        // Without the wake this would sleep 10 s.
        let readable = a.wait(Some(&waker), Duration::from_secs(10)).unwrap();
        t.join().unwrap();
        assert!(!readable);
        assert!(start.elapsed() < Duration::from_secs(5));
        assert!(
            !a.wait(None, Duration::from_millis(1)).unwrap(),
            "nothing to read"
        );
    }

    #[test]
    fn two_sockets_cannot_share_an_address() {
        let a = RoceSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        assert!(RoceSocket::bind(a.local_addr()).is_err());
    }
}
