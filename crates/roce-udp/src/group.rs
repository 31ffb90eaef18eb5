//! One RoCEv2 port shared by processes: a `SO_REUSEPORT` group of
//! sockets on one address, and a classic BPF program that gives each
//! datagram to the socket of its destination QP number's block.
//!
//! A QP number is 24 bits; its top 8 name its block ([`qpn_block`],
//! [`block_qpns`]). Member `k` of a group is the `k`-th socket that
//! joined it (the kernel numbers a group's sockets in the order they
//! join), and takes the datagrams for block `k`. Member 0 is the
//! owner's (QP1 and every QP number of block 0) and takes anything else
//! too: a block lent to nobody, a datagram too short to name a QP.
//! Members are never closed while the group lives, so the numbering
//! holds; a member given back is lent again, after its queue is
//! drained, to the next process that asks.
//!
//! The NIC daemon keeps a group per address and lends a member, with a
//! block of QP numbers, to each client that runs its QPs' transport
//! itself; the kernel's steering is then all the routing there is.

use crate::socket::bound_socket;
use socket2::Socket;
use std::io;
use std::net::SocketAddr;
use std::ops::Range;
use std::os::fd::{AsRawFd, OwnedFd};

/// Bits of a QP number below its block.
pub const QPN_BLOCK_BITS: u32 = 16;

/// Blocks of QP numbers, so members of a group at most.
pub const QPN_BLOCKS: usize = 1 << (24 - QPN_BLOCK_BITS);

/// The block of QP number `qpn`.
pub fn qpn_block(qpn: u32) -> u8 {
    ((qpn & 0xff_ffff) >> QPN_BLOCK_BITS) as u8
}

/// The QP numbers of block `block`.
pub fn block_qpns(block: u8) -> Range<u32> {
    let first = u32::from(block) << QPN_BLOCK_BITS;
    first..first + (1 << QPN_BLOCK_BITS)
}

struct Member {
    sock: Socket,
    lent: bool,
}

/// The sockets of one address and port, and who holds which.
pub struct PortGroup {
    addr: SocketAddr,
    members: Vec<Member>,
    /// An abstract Unix socket named after the address: the kernel lets
    /// any socket of the same user join a `SO_REUSEPORT` group, so a
    /// second group owner on the address (another NIC daemon) would
    /// share our datagrams; binding this name first makes it fail
    /// instead. Released with the process, in its network namespace.
    _guard: std::os::unix::net::UnixDatagram,
}

impl std::fmt::Debug for PortGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortGroup")
            .field("addr", &self.addr)
            .field("members", &self.members.len())
            .field("lent", &self.lent())
            .finish()
    }
}

impl PortGroup {
    /// Binds member 0 at `addr` (port 0 picks one) with a program that
    /// steers everything to it.
    ///
    /// # Errors
    /// The address is in use (`AddrInUse`: by a socket outside any group,
    /// another process's group, or another user's) or not local; sockets
    /// of an earlier group of ours hold it still (`ResourceBusy`: try
    /// again once they are closed); the kernel refused the program.
    pub fn bind(addr: SocketAddr) -> io::Result<PortGroup> {
        let guard = (addr.port() != 0).then(|| guard(addr)).transpose()?;
        let sock = bound_socket(addr, true)?;
        let addr = sock
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("bound address is not IP"))?;
        let guard = match guard {
            Some(g) => g,
            // The kernel picked the port: named now (nobody else can
            // have it yet but a socket of this group).
            None => self::guard(addr)?,
        };
        alone(&sock, addr)?;
        let g = PortGroup {
            addr,
            members: vec![Member { sock, lent: true }],
            _guard: guard,
        };
        g.steer()?;
        Ok(g)
    }

    /// The address every member is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// A descriptor of member 0, the owner's socket (for
    /// [`crate::RoceSocket::adopt`]).
    ///
    /// # Errors
    /// Out of descriptors.
    pub fn owner(&self) -> io::Result<OwnedFd> {
        Ok(self.members[0].sock.try_clone()?.into())
    }

    /// Lends a member: its block and a descriptor of its socket. A member
    /// given back before is lent first (its queued datagrams dropped);
    /// else a new one joins.
    ///
    /// # Errors
    /// Every block is lent (`QPN_BLOCKS - 1` at once), the socket cannot
    /// be made, or the program not replaced.
    pub fn lend(&mut self) -> io::Result<(u8, OwnedFd)> {
        let k = match self.members.iter().position(|m| !m.lent) {
            Some(k) => {
                drain(&self.members[k].sock);
                k
            }
            None if self.members.len() < QPN_BLOCKS => {
                let sock = bound_socket(self.addr, true)?;
                self.members.push(Member { sock, lent: false });
                self.members.len() - 1
            }
            None => {
                return Err(io::Error::other(format!(
                    "all {} QP number blocks of {} are lent",
                    QPN_BLOCKS - 1,
                    self.addr
                )))
            }
        };
        let fd: OwnedFd = self.members[k].sock.try_clone()?.into();
        self.members[k].lent = true;
        if let Err(e) = self.steer() {
            self.members[k].lent = false;
            return Err(e);
        }
        Ok((k as u8, fd))
    }

    /// Takes member `block` back: its datagrams go to member 0 from now
    /// on. Nothing for block 0 or a block not lent.
    ///
    /// # Errors
    /// The kernel refused the new program (the block stays steered to the
    /// member, which nobody reads).
    pub fn give_back(&mut self, block: u8) -> io::Result<()> {
        match self.members.get_mut(usize::from(block)) {
            Some(m) if block != 0 && m.lent => {
                m.lent = false;
                self.steer()
            }
            _ => Ok(()),
        }
    }

    /// The blocks lent now (0, the owner's, among them).
    pub fn lent(&self) -> Vec<u8> {
        (self.members.iter().enumerate())
            .filter(|(_, m)| m.lent)
            .map(|(k, _)| k as u8)
            .collect()
    }

    /// Attaches the program for the blocks lent now.
    fn steer(&self) -> io::Result<()> {
        let to: Vec<(u8, u32)> = (self.lent().into_iter())
            .filter(|&k| k != 0)
            .map(|k| (k, u32::from(k)))
            .collect();
        attach(&self.members[0].sock, &program(&to))
    }
}

/// The guard of a group's address: an abstract Unix socket only one
/// process binds at a time.
fn guard(addr: SocketAddr) -> io::Result<std::os::unix::net::UnixDatagram> {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("roce-udp port group {addr}");
    let a = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    std::os::unix::net::UnixDatagram::bind_addr(&a).map_err(|e| match e.kind() {
        io::ErrorKind::AddrInUse => io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("{addr} is shared by another process already (its port group)"),
        ),
        _ => e,
    })
}

/// Whether `sock`, just bound at `addr`, is its group's only member: a
/// socket of an earlier group of ours (a client of a daemon that went
/// holds its member until it closes its NIC) would have it join that
/// group, under that group's program. With everything steered to member
/// 0, a probe comes back to `sock` only when it is member 0: the kernel
/// appends a newcomer, so it is not, in a group with others.
fn alone(sock: &Socket, addr: SocketAddr) -> io::Result<()> {
    attach(sock, &program(&[]))?;
    let probe_from = std::net::UdpSocket::bind(SocketAddr::new(addr.ip(), 0))?;
    let mut d = vec![0u8; 12];
    d.extend_from_slice(&rand_tag());
    probe_from.send_to(&d, addr)?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
    let mut buf = [0u8; 64];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                format!(
                    "{addr} is still held by sockets of an earlier port group (clients of a NIC \
                     daemon that went keep theirs until they close their NICs): try again once \
                     they have"
                ),
            ));
        }
        if !crate::wait_readable(sock.as_raw_fd(), None, left)? {
            continue;
        }
        // SAFETY: reads into a live stack buffer of its length.
        let n = unsafe {
            libc::recv(
                sock.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n == d.len() as isize && buf[..d.len()] == d[..] {
            return Ok(());
        }
    }
}

/// Four bytes that differ from process to process and call to call.
fn rand_tag() -> [u8; 4] {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    (h.finish() as u32).to_be_bytes()
}

/// Drops what waits in `sock`'s queue.
fn drain(sock: &Socket) {
    let mut buf = [0u8; 64];
    // SAFETY: reads into a live stack buffer of its length.
    while unsafe {
        libc::recv(
            sock.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT | libc::MSG_TRUNC,
        )
    } >= 0
    {}
}

const fn insn(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

// Classic BPF opcodes (linux/filter.h).
const LD_W_ABS: u16 = 0x20; // BPF_LD (0) | BPF_W (0) | BPF_ABS (0x20)
const ALU_AND_K: u16 = 0x04 | 0x50; // BPF_ALU | BPF_AND | BPF_K
const ALU_RSH_K: u16 = 0x04 | 0x70; // BPF_ALU | BPF_RSH | BPF_K
const JEQ_K: u16 = 0x05 | 0x10; // BPF_JMP | BPF_JEQ | BPF_K
const RET_K: u16 = 0x06; // BPF_RET | BPF_K

/// The steering program: the datagram's destination QP number (BTH bytes
/// 5..8; the program sees the UDP payload), its block, and the member
/// `to` gives that block, else member 0. A datagram too short to load
/// from ends the program with 0, member 0 too.
fn program(to: &[(u8, u32)]) -> Vec<libc::sock_filter> {
    let mut p = vec![
        insn(LD_W_ABS, 0, 0, 4),
        insn(ALU_AND_K, 0, 0, 0xff_ffff),
        insn(ALU_RSH_K, 0, 0, QPN_BLOCK_BITS),
    ];
    for &(block, member) in to {
        p.push(insn(JEQ_K, 0, 1, u32::from(block)));
        p.push(insn(RET_K, 0, 0, member));
    }
    p.push(insn(RET_K, 0, 0, 0));
    p
}

fn attach(sock: &Socket, prog: &[libc::sock_filter]) -> io::Result<()> {
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr().cast_mut(),
    };
    // SAFETY: `fprog` points at `prog`, which outlives the call; the
    // kernel copies the program.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RoceSocket;
    use std::time::{Duration, Instant};

    /// A datagram whose BTH names `qpn` (12 bytes of BTH, then `tag`).
    fn datagram(qpn: u32, tag: u8) -> Vec<u8> {
        let mut d = vec![0u8; 13];
        d[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
        d[12] = tag;
        d
    }

    fn tags(s: &mut RoceSocket, want: usize) -> Vec<u8> {
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while got.len() < want && Instant::now() < deadline {
            s.wait(None, Duration::from_millis(50)).unwrap();
            s.recv_batch(64, |_, d| got.push(d.get(12).copied().unwrap_or(0xff)));
        }
        got
    }

    fn quiet(s: &mut RoceSocket) -> bool {
        let mut n = 0;
        s.recv_batch(64, |_, _| n += 1);
        n == 0
    }

    #[test]
    fn blocks_are_numbered_and_ranged() {
        assert_eq!(qpn_block(0x01_0005), 1);
        assert_eq!(qpn_block(0x1ff_ffff), 0xff);
        assert_eq!(block_qpns(2), 0x2_0000..0x3_0000);
        assert_eq!(QPN_BLOCKS, 256);
    }

    #[test]
    fn each_datagram_reaches_the_member_of_its_qp_number_block() {
        let mut g = PortGroup::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = g.local_addr();
        let mut owner = RoceSocket::adopt(g.owner().unwrap()).unwrap();
        let (b1, f1) = g.lend().unwrap();
        let (b2, f2) = g.lend().unwrap();
        assert_eq!((b1, b2), (1, 2));
        assert_eq!(g.lent(), vec![0, 1, 2]);
        let mut m1 = RoceSocket::adopt(f1).unwrap();
        let mut m2 = RoceSocket::adopt(f2).unwrap();
        assert_eq!(m1.local_addr(), addr);

        let mut tx = RoceSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let sends = [
            datagram(1, 10),         // QP1: the owner's
            datagram(0x00_0123, 11), // block 0
            datagram(0x01_0042, 12), // block 1
            datagram(0x02_ffff, 13), // block 2
            datagram(0x07_0001, 14), // lent to nobody: the owner
            vec![1, 2, 3],           // too short to name a QP
        ];
        let batch: Vec<(SocketAddr, &[u8])> = sends.iter().map(|d| (addr, &d[..])).collect();
        assert_eq!(tx.send_batch(&batch), batch.len());
        let mut o = tags(&mut owner, 4);
        o.sort();
        // The short one has no tag byte: 0xff.
        assert_eq!(o, vec![10, 11, 14, 0xff]);
        assert_eq!(tags(&mut m1, 1), vec![12]);
        assert_eq!(tags(&mut m2, 1), vec![13]);
    }

    #[test]
    fn a_member_given_back_stops_receiving_and_is_lent_again_empty() {
        let mut g = PortGroup::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = g.local_addr();
        let mut owner = RoceSocket::adopt(g.owner().unwrap()).unwrap();
        let (b1, f1) = g.lend().unwrap();
        let mut m1 = RoceSocket::adopt(f1).unwrap();
        let mut tx = RoceSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let d = datagram(0x01_0001, 20);
        assert_eq!(tx.send_batch(&[(addr, &d[..])]), 1);
        assert_eq!(tags(&mut m1, 1), vec![20]);
        // Queued but never read when it is given back.
        let d = datagram(0x01_0002, 21);
        assert_eq!(tx.send_batch(&[(addr, &d[..])]), 1);
        assert!(
            m1.wait(None, Duration::from_secs(5)).unwrap(),
            "queued for m1"
        );
        g.give_back(b1).unwrap();
        assert_eq!(g.lent(), vec![0]);
        let d = datagram(0x01_0003, 22);
        assert_eq!(tx.send_batch(&[(addr, &d[..])]), 1);
        assert_eq!(tags(&mut owner, 1), vec![22]);
        drop(m1);
        // Lent again: the same member, its old datagram gone.
        let (again, f) = g.lend().unwrap();
        assert_eq!(again, b1);
        let mut m = RoceSocket::adopt(f).unwrap();
        assert!(quiet(&mut m));
        let d = datagram(0x01_0004, 23);
        assert_eq!(tx.send_batch(&[(addr, &d[..])]), 1);
        assert_eq!(tags(&mut m, 1), vec![23]);
        assert!(quiet(&mut owner));
    }

    #[test]
    fn neither_a_plain_socket_nor_a_second_group_takes_a_groups_address() {
        let g = PortGroup::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let e = RoceSocket::bind(g.local_addr()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
        // A second group of the same user would join ours: refused.
        let e = PortGroup::bind(g.local_addr()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
        assert!(e.to_string().contains("another process"), "{e}");
        // Free again once the group is gone.
        let at = g.local_addr();
        drop(g);
        PortGroup::bind(at).unwrap();
    }

    #[test]
    fn a_member_left_of_an_earlier_group_keeps_a_new_group_off_the_port() {
        let mut g = PortGroup::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let at = g.local_addr();
        let (_, kept) = g.lend().unwrap();
        // The owner went; a client still holds its member.
        drop(g);
        let e = PortGroup::bind(at).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ResourceBusy);
        assert!(e.to_string().contains("earlier port group"), "{e}");
        drop(kept);
        let mut g = PortGroup::bind(at).unwrap();
        let mut owner = RoceSocket::adopt(g.owner().unwrap()).unwrap();
        let (b, _m) = g.lend().unwrap();
        assert_eq!(b, 1);
        let mut tx = RoceSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let d = datagram(1, 30);
        assert_eq!(tx.send_batch(&[(at, &d[..])]), 1);
        assert_eq!(tags(&mut owner, 1), vec![30]);
    }
}
