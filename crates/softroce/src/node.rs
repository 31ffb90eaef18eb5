//! One soft RoCE node: socket, QP table, address handles, capture, faults.

use rdma_sim::{FaultConfig, FaultInjector, Payload as SimPayload};
use rdma_types::{Gid, Instant, Pkey, PkeyViolation, QpType, Qpn};
use rdma_wire::pcap::{LinkType, PcapWriter};
use rdma_wire::{icrc, IbRepr, IpRepr, RoceRepr, UdpChecksum, UdpRepr};
use roce::{Completion, Memory, Packet, Payload, Qp, QpConfig, QpCounters, QpEvent};
use roce_udp::{RoceSocket, Waker};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// How to set up a node.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Local address to bind (port 4791 for interop; tests use others).
    pub bind: SocketAddr,
    /// Write every packet sent and received to this pcap file.
    pub capture: Option<PathBuf>,
    /// Inject faults on the send path.
    pub faults: Option<FaultConfig>,
    /// The first QP number handed out (after QP0/QP1).
    pub first_qpn: u32,
    /// Send runs of equal-size packets to one peer as one segmented (GSO)
    /// send, where the kernel can. Default on; off for A/B measurements,
    /// or a peer path that mishandles it (binaries map `SOFTROCE_GSO=0`
    /// onto it and `gro`: [`gso_from_env`]).
    pub gso: bool,
    /// Let the kernel coalesce received packets of one GSO send (GRO).
    pub gro: bool,
}

impl NodeConfig {
    /// A node on `bind` with no capture and no faults.
    pub fn new(bind: SocketAddr) -> NodeConfig {
        NodeConfig {
            bind,
            capture: None,
            faults: None,
            first_qpn: 0x11,
            gso: true,
            gro: true,
        }
    }

    /// Starts QP numbers at a place that differs from process to process.
    /// A peer's IB CM remembers (CA GUID, QPN) of connections in timewait
    /// and rejects a REQ that repeats one as a stale connection (IBA
    /// 12.9.8.3.1); a restarted process that numbered its QPs from 0x11
    /// again would be refused for the whole timewait.
    pub fn with_random_first_qpn(mut self) -> NodeConfig {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        // 0x100..0x800000: room to count up without wrapping soon.
        self.first_qpn = 0x100 + (h.finish() % 0x7f_ff00) as u32;
        self
    }
}

/// The environment variable binaries map onto [`NodeConfig::gso`] and
/// [`NodeConfig::gro`] ([`gso_from_env`]).
pub const GSO_ENV: &str = "SOFTROCE_GSO";

/// For binaries: whether UDP GSO and GRO stay on as `SOFTROCE_GSO` says
/// (on unless it is `0`), for [`NodeConfig::gso`] and [`NodeConfig::gro`].
/// The library itself never reads the environment.
pub fn gso_from_env() -> bool {
    gso_from_var(std::env::var_os(GSO_ENV).as_deref())
}

/// What a value of `SOFTROCE_GSO` means (`None`: unset): on unless `0`.
pub fn gso_from_var(value: Option<&std::ffi::OsStr>) -> bool {
    value.is_none_or(|v| v != "0")
}

/// Counters of a node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// Datagrams received.
    pub rx_datagrams: u64,
    /// Packets handed to a QP.
    pub rx_delivered: u64,
    /// Dropped: the ICRC did not verify.
    pub rx_bad_icrc: u64,
    /// Dropped: headers did not parse.
    pub rx_malformed: u64,
    /// Dropped: no such QP.
    pub rx_unknown_qp: u64,
    /// Of the delivered IPv4 packets, those whose sender used a non-zero
    /// IPv4 Identification (Linux rxe does), recovered from the ICRC.
    pub rx_ipv4_id_recovered: u64,
    /// Packets sent to the socket.
    pub tx_packets: u64,
    /// Packets the engine produced that could not be framed (too long).
    pub tx_frame_errors: u64,
    /// Datagrams dropped (sent or received) while the link was down.
    pub link_down_drops: u64,
    /// Segmented (GSO) sends, each several packets to one peer.
    pub tx_gso_sends: u64,
    /// Received buffers the kernel had coalesced from several packets.
    pub rx_gro_buffers: u64,
    /// Dropped: the P_Key matched no entry of the port's table, or not
    /// the key of the QP it was for (see [`Node::set_pkeys`]).
    pub rx_pkey_violations: u64,
}

/// A QP of the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QpHandle(pub Qpn);

/// An address handle: where UD packets go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AhId(pub u32);

struct Slot {
    qp: Qp,
    mem: Box<dyn Memory + Send>,
    /// RC/UC: the peer's UDP address.
    remote: Option<SocketAddr>,
    /// With the P_Key of the packet a datagram receive came in (the
    /// verbs report its table index for GSI, IBA 11.4.2.1).
    completions: VecDeque<(Completion, Option<Pkey>)>,
    events: VecDeque<QpEvent>,
}

/// One datagram to send, in the pieces the socket gathers (iovecs): the
/// BTH and extension headers, the payload -- registered memory itself when
/// the engine lent it (kept alive by the packet until sent), else the
/// engine's buffer -- then pad and ICRC.
struct Out {
    dst: SocketAddr,
    /// The QP whose payload buffer this is, to give it back once sent.
    qpn: u32,
    /// The headers are the first `head_len` bytes (the buffer keeps its
    /// length between uses: no zeroing per packet).
    head: Vec<u8>,
    head_len: usize,
    payload: Payload,
    /// Pad (0-3 zero bytes) then the ICRC; `tail_len` bytes are used.
    tail: [u8; 3 + rdma_wire::ICRC_LEN],
    tail_len: usize,
}

impl Out {
    fn len(&self) -> usize {
        self.head_len + self.payload.len() + self.tail_len
    }

    fn parts(&self) -> [&[u8]; 3] {
        [
            &self.head[..self.head_len],
            &self.payload[..],
            &self.tail[..self.tail_len],
        ]
    }

    fn icrc(&self) -> u32 {
        let t = &self.tail[self.tail_len - rdma_wire::ICRC_LEN..self.tail_len];
        u32::from_le_bytes([t[0], t[1], t[2], t[3]])
    }

    fn set_icrc(&mut self, icrc: u32) {
        let n = self.tail_len;
        self.tail[n - rdma_wire::ICRC_LEN..n].copy_from_slice(&icrc.to_le_bytes());
    }

    /// The datagram as one buffer (for the fault injector); the payload
    /// buffer is handed back.
    fn flatten(mut self) -> (OutDatagram, u32, Payload) {
        let mut data = std::mem::take(&mut self.head);
        data.truncate(self.head_len);
        data.extend_from_slice(&self.payload);
        data.extend_from_slice(&self.tail[..self.tail_len]);
        let d = OutDatagram {
            dst: self.dst,
            data,
        };
        (d, self.qpn, self.payload)
    }

    /// A whole datagram (from the fault injector) as pieces.
    fn from_flat(d: OutDatagram) -> Option<Out> {
        let head = d.data;
        let at = head.len().checked_sub(rdma_wire::ICRC_LEN)?;
        let mut tail = [0u8; 3 + rdma_wire::ICRC_LEN];
        tail[..rdma_wire::ICRC_LEN].copy_from_slice(&head[at..]);
        Some(Out {
            dst: d.dst,
            qpn: u32::MAX,
            head,
            head_len: at,
            payload: Payload::default(),
            tail,
            tail_len: rdma_wire::ICRC_LEN,
        })
    }
}

/// Room for the BTH and the longest extension-header list.
const HEAD_ROOM: usize = 64;

/// A datagram waiting in the fault injector.
#[derive(Clone)]
struct OutDatagram {
    dst: SocketAddr,
    data: Vec<u8>,
}

impl SimPayload for OutDatagram {
    fn bit_len(&self) -> u64 {
        self.data.bit_len()
    }
    fn flip_bit(&mut self, bit: u64) {
        self.data.flip_bit(bit);
    }
}

/// One soft RoCE node. Not thread-safe by itself: wrap it in a lock and
/// drive it from one thread.
pub struct Node {
    sock: RoceSocket,
    local: SocketAddr,
    qps: BTreeMap<u32, Slot>,
    /// Numbers handed out by `reserve_qpn` whose QP does not exist yet.
    reserved: std::collections::BTreeSet<u32>,
    next_qpn: u32,
    /// Address handles: where a datagram goes, and for one made by
    /// [`Node::ah_in_partition`] the P_Key it leaves with.
    ahs: Vec<(SocketAddr, Option<Pkey>)>,
    /// [`Node::ah_in_partition`]'s handles by (handle, P_Key).
    ah_partitions: HashMap<(u32, u16), u32>,
    /// The port's P_Key table and what it refused.
    partitions: Partitions,
    waker: Arc<Waker>,
    /// Unbuffered, so a capture is complete on disk at any moment.
    pcap: Option<PcapWriter<File>>,
    faults: Option<FaultInjector<OutDatagram>>,
    /// False while the link is cut: nothing goes out or comes in.
    link_up: bool,
    out: Vec<Out>,
    stats: NodeStats,
    retired: QpCounters,
    /// Round-robin start for fairness between QPs.
    rr: u32,
    /// QPs that got completions since the last `take_ready`.
    ready: Vec<QpHandle>,
    /// Header buffers of sent batches, for the next ones.
    spare: Vec<Vec<u8>>,
    /// QP numbers of a transmit round, kept for the next round (a poll
    /// allocates nothing when there is nothing to do).
    tx_keys: Vec<u32>,
    /// The last round stopped at a budget ([`Node::has_more`]).
    more: bool,
    /// ICRC states of the IP and UDP headers by peer and length.
    header_crcs: HeaderCrcs,
}

/// The ICRC of a datagram starts with its IP and UDP headers, which are
/// the same for every packet of one length to or from one peer (the IPv4
/// Identification aside: a correction per value). Their CRC state is kept
/// for the few (peer, direction, length) in use -- a data stream has one
/// or two lengths and its ACKs one -- and the packets hash only their IB
/// part.
#[derive(Default)]
struct HeaderCrcs {
    entries: Vec<HeaderCrc>,
    /// Next entry to replace once full.
    next: usize,
}

struct HeaderCrc {
    peer: SocketAddr,
    rx: bool,
    ib_len: usize,
    /// CRC state after the headers with IPv4 Identification 0.
    state: u32,
    /// IPv4: the correction for another Identification.
    ident: Option<icrc::Ipv4IdentDelta>,
}

/// (peer, direction, length) triples kept.
const HEADER_CRCS: usize = 16;

impl HeaderCrcs {
    /// The entry for an IB part of `ib_len` bytes sent to (`rx` false) or
    /// received from (`rx` true) `peer` by `local`, made on first use.
    /// `None` if the addresses' families differ or the length does not fit.
    fn entry(
        &mut self,
        local: SocketAddr,
        peer: SocketAddr,
        rx: bool,
        ib_len: usize,
    ) -> Option<&HeaderCrc> {
        let i = match self
            .entries
            .iter()
            .position(|e| e.ib_len == ib_len && e.peer == peer && e.rx == rx)
        {
            Some(i) => i,
            None => {
                let (src, dst) = if rx { (peer, local) } else { (local, peer) };
                let ip = IpRepr::rocev2(src.ip(), dst.ip(), 8 + ib_len + rdma_wire::ICRC_LEN)?;
                let udp = UdpRepr {
                    src_port: src.port(),
                    dst_port: dst.port(),
                    checksum: UdpChecksum::None,
                };
                let e = HeaderCrc {
                    peer,
                    rx,
                    ib_len,
                    state: icrc::header_state(&ip, &udp, ib_len).ok()?,
                    ident: match ip {
                        IpRepr::V4(_) => icrc::Ipv4IdentDelta::for_ib_len(ib_len),
                        IpRepr::V6(_) => None,
                    },
                };
                if self.entries.len() < HEADER_CRCS {
                    self.entries.push(e);
                    self.entries.len() - 1
                } else {
                    let i = self.next;
                    self.next = (self.next + 1) % HEADER_CRCS;
                    self.entries[i] = e;
                    i
                }
            }
        };
        Some(&self.entries[i])
    }

    /// The ICRC of `parts` (BTH through pad) sent to (`rx` false) or
    /// received from (`rx` true) `peer` by `local`, with IPv4
    /// Identification `ident`. `None` if the lengths do not fit.
    fn icrc(
        &mut self,
        local: SocketAddr,
        peer: SocketAddr,
        rx: bool,
        ident: u16,
        parts: &[&[u8]],
    ) -> Option<u32> {
        let ib_len: usize = parts.iter().map(|p| p.len()).sum();
        let e = self.entry(local, peer, rx, ib_len)?;
        let crc = icrc::finish_vectored(e.state, parts).ok()?;
        Some(match (ident, &e.ident) {
            (0, _) | (_, None) => crc,
            (k, Some(d)) => crc ^ d.delta(k),
        })
    }
}

/// The port's P_Key table (IBA 10.9.1) and the violations it counted
/// since the last look.
struct Partitions {
    table: Vec<Pkey>,
    local: Gid,
    unreported: u64,
    last: Option<PkeyViolation>,
}

impl Partitions {
    fn new(local: SocketAddr) -> Partitions {
        Partitions {
            table: vec![Pkey::DEFAULT],
            local: Gid::from_ip(local.ip()),
            unreported: 0,
            last: None,
        }
    }

    /// IBA 10.9.3: a packet for QP0 is not partitioned (SMPs); any other
    /// must carry a key matching an entry of the table by the membership
    /// rule, and one for a QP other than QP1 must match that QP's key too
    /// (QP1 takes every partition of the port: a GMP carries its
    /// sender's). A refusal is remembered for the trap.
    fn admit(&mut self, src: SocketAddr, ib: &IbRepr<'_>, qp: Option<&QpConfig>) -> bool {
        let (pkey, dest_qp) = (ib.bth.pkey, ib.bth.dest_qp);
        if dest_qp == Qpn::SMI {
            return true;
        }
        let own = match qp {
            Some(c) if c.qp_type != QpType::Gsi => pkey.matches(c.pkey),
            _ => true,
        };
        if own && self.table.iter().any(|k| k.matches(pkey)) {
            return true;
        }
        let src_qp = match (ib.ext.deth, qp) {
            (Some(d), _) => Some(d.src_qp),
            (None, Some(c)) if !c.qp_type.is_datagram() => Some(c.dest_qpn),
            _ => None,
        };
        self.unreported += 1;
        self.last = Some(PkeyViolation {
            pkey,
            src_gid: Gid::from_ip(src.ip()),
            dst_gid: self.local,
            src_qp,
            dest_qp,
        });
        false
    }
}

/// Datagram buffers kept for reuse (a few batches' worth).
const SPARE_BUFFERS: usize = 256;

/// Packets a QP may emit per poll: bounded work, fair between QPs.
const TX_BUDGET_PER_QP: usize = 64;
/// Datagrams received per poll.
const RX_BUDGET: usize = 64;

impl Node {
    /// Binds the node's socket and opens its capture file.
    ///
    /// # Errors
    /// The address cannot be bound, or the capture file cannot be created.
    pub fn bind(cfg: NodeConfig) -> io::Result<Node> {
        let mut sock = RoceSocket::bind(cfg.bind)?;
        if !cfg.gso {
            sock.set_gso(false);
        }
        if !cfg.gro {
            sock.set_gro(false);
        }
        let local = sock.local_addr();
        let pcap = match &cfg.capture {
            Some(path) => Some(PcapWriter::new(File::create(path)?, LinkType::Raw)?),
            None => None,
        };
        Ok(Node {
            sock,
            local,
            qps: BTreeMap::new(),
            reserved: std::collections::BTreeSet::new(),
            next_qpn: (cfg.first_qpn & Qpn::MASK).max(2),
            ahs: Vec::new(),
            ah_partitions: HashMap::new(),
            partitions: Partitions::new(local),
            waker: Arc::new(Waker::new()?),
            pcap,
            faults: cfg.faults.map(FaultInjector::new),
            link_up: true,
            out: Vec::new(),
            stats: NodeStats::default(),
            retired: QpCounters::default(),
            rr: 0,
            ready: Vec::new(),
            spare: Vec::new(),
            tx_keys: Vec::new(),
            more: false,
            header_crcs: HeaderCrcs::default(),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Counters so far.
    pub fn stats(&self) -> NodeStats {
        self.stats
    }

    /// QPs that got completions since the last call (for CQ callbacks).
    pub fn take_ready(&mut self) -> Vec<QpHandle> {
        std::mem::take(&mut self.ready)
    }

    /// The socket's descriptor, for a driver thread that waits on it with
    /// [`roce_udp::wait_readable`] without holding the node's lock.
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.sock)
    }

    /// A waker other threads use to interrupt [`Node::wait`].
    pub fn waker(&self) -> Arc<Waker> {
        self.waker.clone()
    }

    /// Replaces the port's P_Key table (empty slots, P_Key 0, are left
    /// out; nothing left: the default P_Key alone, a RoCE port's table).
    /// From now on a received packet for any QP but QP0 whose P_Key
    /// matches no entry (IBA 10.9.3: same partition, one side a full
    /// member), or for a QP other than QP1 not that QP's own key, is
    /// dropped and counted (`rx_pkey_violations`, and
    /// [`Node::take_pkey_violations`]). A QP's own key is the driver's to
    /// keep in step with the table ([`Qp::update_config`]).
    pub fn set_pkeys(&mut self, table: &[Pkey]) {
        let t = &mut self.partitions.table;
        t.clear();
        t.extend(table.iter().copied().filter(|k| k.is_valid()));
        if t.is_empty() {
            t.push(Pkey::DEFAULT);
        }
    }

    /// The port's P_Key table.
    pub fn pkeys(&self) -> &[Pkey] {
        &self.partitions.table
    }

    /// The P_Key violations counted since the last call, and the latest
    /// of them (for a trap); `None` if there were none.
    pub fn take_pkey_violations(&mut self) -> Option<(u64, PkeyViolation)> {
        let p = &mut self.partitions;
        let last = p.last.take()?;
        Some((std::mem::take(&mut p.unreported), last))
    }

    /// Creates a QP with the next free number (QP0 and QP1 are created with
    /// [`Node::create_special_qp`]). `cfg.qpn` is overwritten.
    pub fn create_qp(&mut self, mut cfg: QpConfig, mem: Box<dyn Memory + Send>) -> QpHandle {
        while self.qps.contains_key(&self.next_qpn)
            || self.reserved.contains(&self.next_qpn)
            || self.next_qpn < 2
        {
            self.next_qpn = (self.next_qpn + 1) & Qpn::MASK;
        }
        let qpn = Qpn::from_bits(self.next_qpn);
        self.next_qpn = (self.next_qpn + 1) & Qpn::MASK;
        cfg.qpn = qpn;
        self.insert(cfg, mem)
    }

    /// Reserves a QP number for a QP created later with
    /// [`Node::create_qp_at`]: verbs create a QP (and report its number)
    /// long before modify-QP to RTR gives what the engine is built from.
    pub fn reserve_qpn(&mut self) -> Qpn {
        while self.qps.contains_key(&self.next_qpn)
            || self.reserved.contains(&self.next_qpn)
            || self.next_qpn < 2
        {
            self.next_qpn = (self.next_qpn + 1) & Qpn::MASK;
        }
        let qpn = self.next_qpn;
        self.next_qpn = (self.next_qpn + 1) & Qpn::MASK;
        self.reserved.insert(qpn);
        Qpn::from_bits(qpn)
    }

    /// Reserves `qpn` itself (a QP moved back to RESET keeps its number
    /// while its engine is gone). False if it is in use or reserved.
    pub fn reserve_qpn_exact(&mut self, qpn: Qpn) -> bool {
        let n = qpn.value();
        !self.qps.contains_key(&n) && self.reserved.insert(n)
    }

    /// Gives back a number from [`Node::reserve_qpn`] that was never used.
    pub fn release_qpn(&mut self, qpn: Qpn) {
        self.reserved.remove(&qpn.value());
    }

    /// Creates (or re-creates, replacing the engine) the QP numbered
    /// `cfg.qpn`, which must be reserved, special (0 or 1), or this QP's.
    ///
    /// # Errors
    /// The number belongs to nobody that may use it.
    pub fn create_qp_at(
        &mut self,
        cfg: QpConfig,
        mem: Box<dyn Memory + Send>,
    ) -> io::Result<QpHandle> {
        let n = cfg.qpn.value();
        let remote = self.qps.get(&n).and_then(|s| s.remote);
        if !(n <= 1 || self.reserved.remove(&n) || self.qps.contains_key(&n)) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("QP number {n:#x} is not reserved"),
            ));
        }
        let h = self.insert(cfg, mem);
        if let Some(r) = remote {
            self.set_remote(h, r);
        }
        Ok(h)
    }

    /// Creates QP0 or QP1 (`cfg.qpn` says which).
    ///
    /// # Errors
    /// It exists already, or `cfg.qpn` is not 0 or 1.
    pub fn create_special_qp(
        &mut self,
        cfg: QpConfig,
        mem: Box<dyn Memory + Send>,
    ) -> io::Result<QpHandle> {
        let n = cfg.qpn.value();
        if n > 1 || self.qps.contains_key(&n) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("QP{n} exists or is not special"),
            ));
        }
        Ok(self.insert(cfg, mem))
    }

    fn insert(&mut self, cfg: QpConfig, mem: Box<dyn Memory + Send>) -> QpHandle {
        let qpn = cfg.qpn;
        self.qps.insert(
            qpn.value(),
            Slot {
                qp: Qp::new(cfg),
                mem,
                remote: None,
                completions: VecDeque::new(),
                events: VecDeque::new(),
            },
        );
        QpHandle(qpn)
    }

    /// Sets where an RC/UC QP's packets go (its peer node's address).
    pub fn set_remote(&mut self, qp: QpHandle, remote: SocketAddr) {
        if let Some(s) = self.qps.get_mut(&qp.0.value()) {
            s.remote = Some(remote);
        }
    }

    /// Connects RC/UC QP `qa` of node `a` with QP `qb` of node `b` (each
    /// the other's destination QPN and address) and moves both to RTS: two
    /// nodes in one process, as tests, benches and tools pair them.
    pub fn connect_pair(a: &mut Node, qa: QpHandle, b: &mut Node, qb: QpHandle) {
        let (addr_a, addr_b) = (a.local_addr(), b.local_addr());
        for (n, q, peer, peer_addr) in [(a, qa, qb, addr_b), (b, qb, qa, addr_a)] {
            n.set_remote(q, peer_addr);
            if let Some(qp) = n.qp_mut(q) {
                qp.update_config(|c| c.dest_qpn = peer.0);
                qp.set_rts();
            }
        }
    }

    /// Destroys a QP; packets for it are dropped from now on.
    pub fn destroy_qp(&mut self, qp: QpHandle) -> bool {
        match self.qps.remove(&qp.0.value()) {
            Some(slot) => {
                self.retired += slot.qp.counters();
                true
            }
            None => false,
        }
    }

    /// The counters of every QP destroyed so far, summed (a live QP's are
    /// in [`Qp::counters`]): totals that survive connections coming and
    /// going.
    pub fn retired_qp_counters(&self) -> QpCounters {
        self.retired
    }

    /// The engine of a QP (to post work, change state, read counters).
    pub fn qp_mut(&mut self, qp: QpHandle) -> Option<&mut Qp> {
        self.qps.get_mut(&qp.0.value()).map(|s| &mut s.qp)
    }

    /// Creates an address handle for UD sends.
    pub fn create_ah(&mut self, dst: SocketAddr) -> AhId {
        self.ahs.push((dst, None));
        AhId(self.ahs.len() as u32 - 1)
    }

    /// The handle of `ah`'s destination whose datagrams leave with P_Key
    /// `pkey` rather than their QP's: a GSI send names its partition per
    /// work request (IBA 11.4.1.1), a response the request's. Made once
    /// per pair and kept; `None` for an unknown handle.
    pub fn ah_in_partition(&mut self, ah: AhId, pkey: Pkey) -> Option<AhId> {
        let (dst, _) = *self.ahs.get(ah.0 as usize)?;
        let n = self.ahs.len() as u32;
        let id = *self.ah_partitions.entry((ah.0, pkey.0)).or_insert(n);
        if id == n {
            self.ahs.push((dst, Some(pkey)));
        }
        Some(AhId(id))
    }

    /// The next completion of a QP.
    pub fn poll_completion(&mut self, qp: QpHandle) -> Option<Completion> {
        self.poll_completion_with_pkey(qp).map(|(c, _)| c)
    }

    /// The next completion of a QP and, for a receive of a datagram QP
    /// (UD, GSI), the P_Key its packet carried.
    pub fn poll_completion_with_pkey(
        &mut self,
        qp: QpHandle,
    ) -> Option<(Completion, Option<Pkey>)> {
        let s = self.qps.get_mut(&qp.0.value())?;
        s.completions
            .pop_front()
            .or_else(|| s.qp.poll_completion().map(|c| (c, None)))
    }

    /// The next asynchronous event of a QP.
    pub fn poll_event(&mut self, qp: QpHandle) -> Option<QpEvent> {
        let s = self.qps.get_mut(&qp.0.value())?;
        s.events.pop_front().or_else(|| s.qp.poll_event())
    }

    /// The earliest deadline among QP timers and held (delayed) datagrams.
    pub fn next_deadline(&self) -> Option<Instant> {
        let timers = self.qps.values().filter_map(|s| s.qp.poll_timeout());
        let held = self.faults.as_ref().and_then(|f| f.next_release());
        timers.chain(held).min()
    }

    /// Sleeps until a datagram arrives, the waker fires, or `timeout`.
    ///
    /// # Errors
    /// `poll(2)` failed.
    pub fn wait(&self, timeout: std::time::Duration) -> io::Result<bool> {
        self.sock.wait(Some(&self.waker), timeout)
    }

    /// Cuts or restores the link: while it is down every datagram offered
    /// or received is dropped (and counted), and datagrams the fault
    /// injector held back are lost, as on a pulled cable.
    pub fn set_link_up(&mut self, up: bool) {
        self.link_up = up;
        if let Some(f) = self.faults.as_mut() {
            f.set_link_up(up);
        }
    }

    /// One bounded round of work at `now`: receive, transmit, timers.
    /// Returns whether anything happened.
    pub fn poll(&mut self, now: Instant) -> bool {
        let busy = self.round(now);
        self.flush_out(now);
        busy
    }

    /// As [`Node::poll`], but when the round made completions to deliver,
    /// what it made to send (the ACKs of what it received) stays in the
    /// node until [`Node::send_posted`]: the driver thread calls that once
    /// it has handed the completions over, so an ACK leaves in one batch
    /// with what the consumer posted in answer (a target's ACK of a
    /// command with the command's data and response), and the peer wakes
    /// once for all of them, not once for the ACK and again for the rest.
    pub fn poll_holding(&mut self, now: Instant) -> bool {
        let busy = self.round(now);
        if self.ready.is_empty() {
            self.flush_out(now);
        }
        busy
    }

    /// Receive, timers, and what the QPs have to send built into the
    /// outgoing batch (not sent); completions collected.
    fn round(&mut self, now: Instant) -> bool {
        self.more = false;
        let mut busy = self.receive(now);
        for s in self.qps.values_mut() {
            if s.qp.poll_timeout().is_some_and(|t| t <= now) {
                s.qp.handle_timeout(now);
                busy = true;
            }
        }
        busy |= self.build_out(now);
        self.collect();
        busy
    }

    /// Whether the last [`Node::poll_holding`] stopped at a budget (a full
    /// receive batch, or a QP with more to send than one round sends).
    pub fn has_more(&self) -> bool {
        self.more
    }

    /// What a posting thread does so the driver thread need not wake for
    /// it (as Linux siw sends from `post_send`): transmits what the QPs
    /// have to send now. Returns whether completions or events came of it
    /// (the driver thread delivers those).
    pub fn send_posted(&mut self, now: Instant) -> bool {
        self.transmit(now);
        self.collect();
        !self.ready.is_empty()
    }

    /// Moves the engines' completions and events to their QPs' queues and
    /// notes the QPs that have new ones.
    fn collect(&mut self) {
        for (qpn, s) in self.qps.iter_mut() {
            let before = (s.completions.len(), s.events.len());
            while let Some(c) = s.qp.poll_completion() {
                s.completions.push_back((c, None));
            }
            while let Some(e) = s.qp.poll_event() {
                s.events.push_back(e);
            }
            // Ready for a new completion or a new event alike: an event
            // with no completion (the responder's QP fatal) must not wait
            // for some later completion to be delivered.
            if (s.completions.len(), s.events.len()) != before {
                let h = QpHandle(Qpn::from_bits(*qpn));
                if !self.ready.contains(&h) {
                    self.ready.push(h);
                }
            }
        }
    }

    // Not inlined into `poll` (one call per round, no measurable cost) so
    // `callgrind --toggle-collect` can name each path (send_path bench).
    #[inline(never)]
    fn receive(&mut self, now: Instant) -> bool {
        let local = self.local;
        let up = self.link_up;
        let Node {
            sock,
            qps,
            stats,
            pcap,
            header_crcs,
            partitions,
            ready,
            ..
        } = self;
        // Each datagram is handled in the socket's own buffer: no copy.
        let gro_before = sock.stats().gro_buffers;
        let n = sock.recv_batch(RX_BUDGET, |r, data| {
            stats.rx_datagrams += 1;
            if up {
                let rx = Rx {
                    qps: &mut *qps,
                    stats: &mut *stats,
                    header_crcs: &mut *header_crcs,
                    partitions: &mut *partitions,
                    ready: &mut *ready,
                    pcap: pcap.as_mut(),
                };
                deliver(now, r, local, data, rx);
            } else {
                stats.link_down_drops += 1;
            }
        });
        stats.rx_gro_buffers += sock.stats().gro_buffers - gro_before;
        self.more |= n >= RX_BUDGET;
        n > 0
    }

    #[inline(never)]
    fn transmit(&mut self, now: Instant) -> bool {
        let produced = self.build_out(now);
        self.flush_out(now);
        produced
    }

    /// Builds what the QPs have to send now into the outgoing batch.
    fn build_out(&mut self, now: Instant) -> bool {
        let local = self.local;
        let mut keys = std::mem::take(&mut self.tx_keys);
        keys.clear();
        keys.extend(self.qps.keys().copied());
        if keys.is_empty() {
            self.tx_keys = keys;
            return false;
        }
        let start = (self.rr as usize) % keys.len();
        self.rr = self.rr.wrapping_add(1);
        let mut produced = false;
        // The engine builds each packet in this one slot.
        let mut pkt = Packet::default();
        for k in keys[start..].iter().chain(&keys[..start]) {
            let Some(slot) = self.qps.get_mut(k) else {
                continue;
            };
            let mut built = 0;
            for _ in 0..TX_BUDGET_PER_QP {
                if !slot.qp.poll_transmit_into(now, &mut *slot.mem, &mut pkt) {
                    break;
                }
                built += 1;
                produced = true;
                let dst = match pkt.ud_dest {
                    Some(ud) => self.ahs.get(ud.ah as usize).map(|&(dst, pkey)| {
                        if let Some(k) = pkey {
                            pkt.bth.pkey = k;
                        }
                        dst
                    }),
                    None => slot.remote,
                };
                let Some(dst) = dst else {
                    self.stats.tx_frame_errors += 1;
                    continue;
                };
                // The IP and UDP headers are built only for a capture: the
                // socket adds the real ones, and the ICRC's share of them
                // comes from `header_crcs` (which refuses a family
                // mismatch).
                let ib = pkt.ib_repr();
                if let Some(p) = self.pcap.as_mut() {
                    let Some(roce) = framing(local, dst, ib) else {
                        self.stats.tx_frame_errors += 1;
                        continue;
                    };
                    let mut ip_packet = vec![0u8; roce.buffer_len()];
                    if let Ok(n) = roce.emit(&mut ip_packet) {
                        let _ = p.write_packet(now, &ip_packet[..n]);
                    }
                }
                // What the socket sends: BTH onward plus ICRC, gathered
                // from a header buffer of an earlier batch, the payload
                // buffer the engine filled and the pad + ICRC bytes.
                let mut head = self.spare.pop().unwrap_or_default();
                if head.len() < HEAD_ROOM {
                    head.resize(HEAD_ROOM, 0);
                }
                let Ok(head_len) = ib.emit_headers(&mut head) else {
                    self.stats.tx_frame_errors += 1;
                    continue;
                };
                let pad = usize::from(ib.bth.pad_count & 3);
                let mut tail = [0u8; 3 + rdma_wire::ICRC_LEN];
                let parts: [&[u8]; 3] = [&head[..head_len], &pkt.payload[..], &tail[..pad]];
                // Identification 0; GSO segments are corrected in flush_out.
                let Some(crc) = self.header_crcs.icrc(local, dst, false, 0, &parts) else {
                    self.stats.tx_frame_errors += 1;
                    continue;
                };
                tail[pad..pad + rdma_wire::ICRC_LEN].copy_from_slice(&crc.to_le_bytes());
                self.out.push(Out {
                    dst,
                    qpn: *k,
                    head,
                    head_len,
                    payload: std::mem::take(&mut pkt.payload),
                    tail,
                    tail_len: pad + rdma_wire::ICRC_LEN,
                });
            }
            // At its budget the QP may have more for the next round.
            self.more |= built == TX_BUDGET_PER_QP;
        }
        self.tx_keys = keys;
        produced
    }

    fn flush_out(&mut self, now: Instant) {
        if self.out.is_empty() && self.faults.is_none() {
            return;
        }
        let mut batch = std::mem::take(&mut self.out);
        if !self.link_up {
            self.stats.link_down_drops += batch.len() as u64;
            self.recycle(batch);
            return;
        }
        if let Some(f) = self.faults.as_mut() {
            for o in batch.drain(..) {
                let (d, qpn, payload) = o.flatten();
                f.push(now, d);
                if let (Some(s), Payload::Owned(b)) = (self.qps.get_mut(&qpn), payload) {
                    s.qp.recycle_payload(b);
                }
            }
            while let Some(d) = f.pop_ready(now) {
                batch.extend(Out::from_flat(d));
            }
        }
        if batch.is_empty() {
            self.out = batch;
            return;
        }
        let lens: Vec<(SocketAddr, usize)> = batch.iter().map(|o| (o.dst, o.len())).collect();
        let runs = self.sock.gso_runs_by_len(&lens);
        // Segment k of a GSO send leaves with IPv4 Identification k; its
        // ICRC was computed for 0. A run's segments have one length, but
        // for a shorter last one.
        for run in runs.iter().filter(|r| r.len() > 1) {
            let segs = &mut batch[run.clone()];
            if !segs[0].dst.is_ipv4() {
                continue;
            }
            // The corrections are kept with the header CRC state of each
            // (peer, length) that `transmit` used.
            let (local, dst) = (self.local, segs[0].dst);
            let mut delta_for = |len| self.header_crcs.entry(local, dst, false, len)?.ident;
            let ib_len = |o: &Out| o.len().saturating_sub(rdma_wire::ICRC_LEN);
            let first_len = ib_len(&segs[0]);
            let Some(delta) = delta_for(first_len) else {
                continue;
            };
            for (k, (o, d)) in segs.iter_mut().zip(delta.deltas()).enumerate().skip(1) {
                let len = ib_len(o);
                let d = if len == first_len {
                    d
                } else {
                    match delta_for(len) {
                        Some(other) => other.delta(k as u16),
                        None => continue,
                    }
                };
                o.set_icrc(o.icrc() ^ d);
            }
        }
        let parts: Vec<[&[u8]; 3]> = batch.iter().map(Out::parts).collect();
        let refs: Vec<(SocketAddr, &[&[u8]])> = batch
            .iter()
            .zip(&parts)
            .map(|(o, p)| (o.dst, &p[..]))
            .collect();
        let gso_before = self.sock.stats().gso_sends;
        let mut done = 0;
        // A full socket buffer: retry a bounded number of times, then drop
        // the rest like a congested wire; retransmission recovers RC.
        for _ in 0..64 {
            done += self.sock.send_runs_vectored(&refs, &runs[done..]);
            if done == runs.len() {
                break;
            }
            let _ = self.sock.wait(None, std::time::Duration::from_micros(100));
        }
        self.stats.tx_packets += runs[..done].iter().map(|r| r.len() as u64).sum::<u64>();
        self.stats.tx_gso_sends += self.sock.stats().gso_sends - gso_before;
        drop(refs);
        drop(parts);
        self.recycle(batch);
    }

    /// Gives sent (or dropped) datagrams' buffers back: payloads to their
    /// QP's engine, headers to the spare list; the emptied batch becomes
    /// the next one (its capacity kept).
    fn recycle(&mut self, mut batch: Vec<Out>) {
        for o in batch.drain(..) {
            // A lent payload releases its region here.
            if let (Some(s), Payload::Owned(b)) = (self.qps.get_mut(&o.qpn), o.payload) {
                s.qp.recycle_payload(b);
            }
            if self.spare.len() < SPARE_BUFFERS {
                self.spare.push(o.head);
            }
        }
        if self.out.is_empty() {
            self.out = batch;
        }
    }
}

/// What receiving a datagram touches of the node.
struct Rx<'a> {
    qps: &'a mut BTreeMap<u32, Slot>,
    stats: &'a mut NodeStats,
    header_crcs: &'a mut HeaderCrcs,
    partitions: &'a mut Partitions,
    ready: &'a mut Vec<QpHandle>,
    pcap: Option<&'a mut PcapWriter<File>>,
}

/// Parses, ICRC-checks, P_Key-checks and dispatches one datagram.
fn deliver(now: Instant, r: roce_udp::Received, local: SocketAddr, data: &[u8], rx: Rx<'_>) {
    let Rx {
        qps,
        stats,
        header_crcs,
        partitions,
        ready,
        pcap,
    } = rx;
    let src = r.src;
    let Some(mut ip) = IpRepr::rocev2(src.ip(), local.ip(), 8 + data.len()) else {
        stats.rx_malformed += 1;
        return;
    };
    let udp = UdpRepr {
        src_port: src.port(),
        dst_port: local.port(),
        checksum: UdpChecksum::None,
    };
    let ib = match IbRepr::parse(data) {
        Ok(ib) => ib,
        Err(_) => {
            stats.rx_malformed += 1;
            return;
        }
    };
    // IbRepr::parse checked there is room for the ICRC.
    let body = &data[..data.len() - rdma_wire::ICRC_LEN];
    let carried = icrc::trailer(data).unwrap_or(0);
    // Segment k of a buffer the kernel coalesced left its sender (one of
    // ours, sending with GSO) with IPv4 Identification k.
    let ident = if matches!(ip, IpRepr::V4(_)) {
        r.segment
    } else {
        0
    };
    if header_crcs.icrc(local, src, true, ident, &[body]) == Some(carried) {
        if let IpRepr::V4(v4) = &mut ip {
            v4.ident = ident;
        }
    } else {
        // A Linux sender picks a non-zero IPv4 ID that the socket does
        // not show; solve for it (exactly one can match).
        let Some(id) = icrc::recover_ipv4_ident(&ip, &udp, body, carried) else {
            stats.rx_bad_icrc += 1;
            return;
        };
        if let IpRepr::V4(v4) = &mut ip {
            v4.ident = id;
        }
        // The solution is checked by the ordinary computation.
        if icrc::compute(&ip, &udp, body) != Ok(carried) {
            stats.rx_bad_icrc += 1;
            return;
        }
        stats.rx_ipv4_id_recovered += 1;
    }
    let roce = RoceRepr { ip, udp, ib };
    if let Some(p) = pcap {
        let mut buf = vec![0u8; roce.buffer_len()];
        if let Ok(n) = roce.emit(&mut buf) {
            let _ = p.write_packet(now, &buf[..n]);
        }
    }
    let dest_qp = roce.ib.bth.dest_qp;
    let slot = qps.get_mut(&dest_qp.value());
    if !partitions.admit(src, &roce.ib, slot.as_ref().map(|s| s.qp.config())) {
        stats.rx_pkey_violations += 1;
        return;
    }
    let Some(slot) = slot else {
        stats.rx_unknown_qp += 1;
        return;
    };
    // Only datagram receives carry the GRH area; building it is
    // per-packet work a connected QP does not need.
    let datagram = slot.qp.config().qp_type.is_datagram();
    let grh = datagram.then(|| roce.ip.grh_area());
    let pkt = Packet::from_ib(&roce.ib, grh);
    stats.rx_delivered += 1;
    slot.qp.handle_packet(now, &pkt, &mut *slot.mem);
    if datagram {
        // The receive it completed (one at most) keeps the packet's P_Key.
        let before = slot.completions.len();
        while let Some(c) = slot.qp.poll_completion() {
            let pkey = c.is_recv.then_some(roce.ib.bth.pkey);
            slot.completions.push_back((c, pkey));
        }
        let h = QpHandle(dest_qp);
        if slot.completions.len() != before && !ready.contains(&h) {
            ready.push(h);
        }
    }
}

/// The RoCEv2 framing of an outgoing engine packet from our socket.
fn framing(local: SocketAddr, dst: SocketAddr, ib: IbRepr<'_>) -> Option<RoceRepr<'_>> {
    Some(RoceRepr {
        ip: IpRepr::rocev2(local.ip(), dst.ip(), 0)?,
        udp: UdpRepr {
            // The ICRC covers the source port: it must be the one the socket
            // really sends from (rxe varies it per QP; we have one socket).
            src_port: local.port(),
            dst_port: dst.port(),
            checksum: UdpChecksum::None,
        },
        ib,
    })
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("local", &self.local)
            .field("qps", &self.qps.len())
            .field("stats", &self.stats)
            .finish()
    }
}
