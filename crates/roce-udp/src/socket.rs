//! The datagram socket of one node address.

use crate::waker::Waker;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io;
use std::mem::MaybeUninit;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::time::Duration;

/// The IANA port of RoCEv2.
pub const ROCE_PORT: u16 = 4791;

/// Largest datagram we receive: IB MTU 4096 plus headers, rounded up.
const MAX_DATAGRAM: usize = 4096 + 256;

/// `UDP_NO_CHECK6_RX` from `linux/udp.h` (not in every libc).
const UDP_NO_CHECK6_RX: libc::c_int = 102;

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
}

/// One received datagram, in a buffer of the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// Sender address.
    pub src: SocketAddr,
    /// Bytes in the buffer.
    pub len: usize,
}

/// A UDP socket bound to one node address.
#[derive(Debug)]
pub struct RoceSocket {
    sock: Socket,
    local: SocketAddr,
    stats: SocketStats,
    /// Receive buffers reused across batches.
    bufs: Vec<Vec<u8>>,
}

impl RoceSocket {
    /// Binds `addr` with the options described in the crate docs.
    ///
    /// # Errors
    /// The address is in use or not local, or an option was refused.
    pub fn bind(addr: SocketAddr) -> io::Result<RoceSocket> {
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
        sock.bind(&SockAddr::from(addr))?;
        let local = sock
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("bound address is not IP"))?;
        Ok(RoceSocket {
            sock,
            local,
            stats: SocketStats::default(),
            bufs: Vec::new(),
        })
    }

    /// The bound address (with the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Counters so far.
    pub fn stats(&self) -> SocketStats {
        self.stats
    }

    /// Sends a batch of datagrams with as few system calls as possible.
    /// Returns how many the kernel took; a full socket buffer stops the batch
    /// early (the caller keeps the rest), other errors count the datagram as
    /// lost and go on.
    pub fn send_batch(&mut self, batch: &[(SocketAddr, &[u8])]) -> usize {
        let mut done = 0;
        while done < batch.len() {
            let chunk = &batch[done..batch.len().min(done + 64)];
            let addrs: Vec<SockAddr> = chunk.iter().map(|(a, _)| SockAddr::from(*a)).collect();
            let mut iovs: Vec<libc::iovec> = chunk
                .iter()
                .map(|(_, d)| libc::iovec {
                    iov_base: d.as_ptr() as *mut libc::c_void,
                    iov_len: d.len(),
                })
                .collect();
            let mut msgs: Vec<libc::mmsghdr> = (0..chunk.len())
                .map(|i| {
                    // SAFETY: all-zero is a valid mmsghdr.
                    let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                    m.msg_hdr.msg_name = addrs[i].as_ptr() as *mut libc::c_void;
                    m.msg_hdr.msg_namelen = addrs[i].len();
                    m.msg_hdr.msg_iov = &mut iovs[i];
                    m.msg_hdr.msg_iovlen = 1;
                    m
                })
                .collect();
            // SAFETY: every pointer in msgs refers to addrs/iovs/batch, which
            // outlive the call; the count matches the vector length.
            let n = unsafe {
                libc::sendmmsg(
                    self.sock.as_raw_fd(),
                    msgs.as_mut_ptr(),
                    msgs.len() as libc::c_uint,
                    0,
                )
            };
            self.stats.send_calls += 1;
            if n < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::WouldBlock {
                    return done;
                }
                // The first datagram of the chunk failed (unreachable, too
                // big): drop it like the wire would and carry on.
                self.stats.send_errors += 1;
                done += 1;
                continue;
            }
            let n = n as usize;
            self.stats.sent += n as u64;
            done += n;
            if n < chunk.len() {
                // Partial: the next one errored or would block; retry it in
                // the next loop round, which classifies the error.
                continue;
            }
        }
        done
    }

    /// Receives up to `max` datagrams without blocking and hands each to
    /// `f(received, bytes)`. Returns how many arrived.
    pub fn recv_batch(&mut self, max: usize, mut f: impl FnMut(Received, &[u8])) -> usize {
        let max = max.clamp(1, 64);
        while self.bufs.len() < max {
            self.bufs.push(vec![0u8; MAX_DATAGRAM]);
        }
        let mut names: Vec<MaybeUninit<libc::sockaddr_storage>> = vec![MaybeUninit::zeroed(); max];
        let mut iovs: Vec<libc::iovec> = self.bufs[..max]
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            })
            .collect();
        let mut msgs: Vec<libc::mmsghdr> = (0..max)
            .map(|i| {
                // SAFETY: all-zero is a valid mmsghdr.
                let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                m.msg_hdr.msg_name = names[i].as_mut_ptr().cast();
                m.msg_hdr.msg_namelen =
                    std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                m.msg_hdr.msg_iov = &mut iovs[i];
                m.msg_hdr.msg_iovlen = 1;
                m
            })
            .collect();
        // SAFETY: buffers, names and iovecs outlive the call and match `max`.
        let n = unsafe {
            libc::recvmmsg(
                self.sock.as_raw_fd(),
                msgs.as_mut_ptr(),
                max as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n <= 0 {
            return 0;
        }
        self.stats.recv_calls += 1;
        let n = n as usize;
        for (i, m) in msgs.iter().enumerate().take(n) {
            let len = (m.msg_len as usize).min(MAX_DATAGRAM);
            // SAFETY: the kernel filled msg_namelen bytes of a sockaddr_storage.
            let addr = unsafe { SockAddr::new(names[i].assume_init(), m.msg_hdr.msg_namelen) };
            let Some(src) = addr.as_socket() else {
                continue;
            };
            self.stats.received += 1;
            f(Received { src, len }, &self.bufs[i][..len]);
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
    let mut fds = [
        libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: waker.map_or(-1, |w| w.as_raw_fd()),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: fds is a valid array of two pollfd (a negative fd is
    // ignored), ts a valid timespec, and no signal mask is passed.
    let r = unsafe { libc::ppoll(fds.as_mut_ptr(), 2, &ts, std::ptr::null()) };
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

fn set_int(
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
                eprintln!(
                    "SKIPPED ipv6_sockets_accept_zero_checksums_option: no IPv6 loopback ({e})"
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
