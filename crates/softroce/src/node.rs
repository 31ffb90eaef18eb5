//! One soft RoCE node: socket, QP table, address handles, capture, faults.

use rdma_sim::{FaultConfig, FaultInjector, Payload as SimPayload};
use rdma_types::{Gid, Instant, Pkey, PkeyViolation, QpType, Qpn};
use rdma_wire::pcap::{LinkType, PcapWriter};
use rdma_wire::{
    icrc, IbRepr, IpRepr, Kind, Opcode, Position, RoceRepr, Syndrome, UdpChecksum, UdpRepr,
};
use roce::{Completion, Memory, Packet, Payload, Qp, QpConfig, QpCounters, QpEvent};
use roce_udp::{Gather, RoceSocket, Waker};
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
    /// A socket bound already (a member of a `roce_udp::PortGroup`, whose
    /// descriptor another process may have passed over) to use instead
    /// of binding `bind`; the node uses a duplicate of it.
    pub socket: Option<Arc<std::os::fd::OwnedFd>>,
    /// The QP numbers the node hands out (QP0 and QP1 aside): all of them,
    /// or the block of a port group's member (`roce_udp::block_qpns`).
    pub qpns: std::ops::Range<u32>,
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
            socket: None,
            qpns: 0..Qpn::MASK + 1,
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
        // The first half of the numbers (0x100..0x800000 of all of them):
        // room to count up without wrapping soon.
        let span = u64::from((self.qpns.end - self.qpns.start) / 2).max(0x200) - 0x100;
        self.first_qpn = self.qpns.start + 0x100 + (h.finish() % span) as u32;
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
/// engine's buffer -- then pad and ICRC. Or (`count` > 1) consecutive
/// middle packets of one message, and maybe its last, sent as one GSO
/// buffer: their BTHs one after the other in `head`, then their ICRCs;
/// their payloads one after the other in `payload`, `each` bytes but the
/// last's; the last's pad in `tail`.
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
    tail_len: u8,
    /// A plain RC ACK (no NAK): nothing waits on it but the peer's
    /// send completions, so it may wait for a packet to ride with.
    ack: bool,
    /// How many datagrams (1 to 64).
    count: u8,
    /// The payload bytes of each datagram of several but the last.
    each: u16,
}

// Each datagram's `Out` is moved several times (built, batched, sorted,
// recycled): past 128 bytes those moves become memcpy calls (at 136
// bytes, +377 instructions a 4 KiB soft RoCE I/O under callgrind).
const _: () = assert!(std::mem::size_of::<Out>() <= 128);

impl Out {
    /// The length of each datagram (of several: but the last, which may
    /// be shorter).
    fn len(&self) -> usize {
        match usize::from(self.count) {
            1 => self.head_len + self.payload.len() + usize::from(self.tail_len),
            _ => self.head_len + usize::from(self.each) + rdma_wire::ICRC_LEN,
        }
    }

    /// The length of the last datagram.
    fn last_len(&self) -> usize {
        let rest = self.payload.len() - (usize::from(self.count) - 1) * usize::from(self.each);
        self.head_len + rest + usize::from(self.tail_len)
    }

    /// Datagram `i`'s pieces: headers, payload, pad, ICRC (of one
    /// datagram: pad and ICRC in one).
    fn parts(&self, i: usize) -> [&[u8]; 4] {
        if usize::from(self.count) == 1 {
            return [
                &self.head[..self.head_len],
                &self.payload[..],
                &self.tail[..usize::from(self.tail_len)],
                &[],
            ];
        }
        let (h, each) = (self.head_len, usize::from(self.each));
        let end = match i + 1 == usize::from(self.count) {
            true => self.payload.len(),
            false => (i + 1) * each,
        };
        let pad = match i + 1 == usize::from(self.count) {
            true => &self.tail[..usize::from(self.tail_len) - rdma_wire::ICRC_LEN],
            false => &[],
        };
        [
            &self.head[i * h..(i + 1) * h],
            &self.payload[i * each..end],
            pad,
            &self.head[self.icrc_at(i)],
        ]
    }

    /// Where datagram `i`'s ICRC is: in `tail` (one datagram), else in
    /// `head` after the BTHs.
    fn icrc_at(&self, i: usize) -> std::ops::Range<usize> {
        let end = match usize::from(self.count) {
            1 => usize::from(self.tail_len),
            n => n * self.head_len + (i + 1) * rdma_wire::ICRC_LEN,
        };
        end - rdma_wire::ICRC_LEN..end
    }

    fn icrc(&self, i: usize) -> u32 {
        let at = self.icrc_at(i);
        let t = match usize::from(self.count) {
            1 => &self.tail[at],
            _ => &self.head[at],
        };
        u32::from_le_bytes([t[0], t[1], t[2], t[3]])
    }

    fn set_icrc(&mut self, i: usize, icrc: u32) {
        let at = self.icrc_at(i);
        let t = match usize::from(self.count) {
            1 => &mut self.tail[at],
            _ => &mut self.head[at],
        };
        t.copy_from_slice(&icrc.to_le_bytes());
    }

    /// Each datagram as one buffer (for the fault injector); the payload
    /// buffer is handed back.
    fn flatten(self, mut each: impl FnMut(OutDatagram)) -> (u32, Payload) {
        for i in 0..usize::from(self.count) {
            each(OutDatagram {
                dst: self.dst,
                data: self.parts(i).concat(),
            });
        }
        (self.qpn, self.payload)
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
            tail_len: rdma_wire::ICRC_LEN as u8,
            ack: false,
            count: 1,
            each: 0,
        })
    }
}

impl Gather for Out {
    fn dst(&self) -> SocketAddr {
        self.dst
    }
    fn pieces(&self) -> impl Iterator<Item = &[u8]> {
        (0..usize::from(self.count)).flat_map(|i| self.parts(i))
    }
    fn len(&self) -> usize {
        Out::len(self)
    }
    fn count(&self) -> usize {
        usize::from(self.count)
    }
    fn each_piece(&self, mut f: impl FnMut(&[u8])) {
        let n = usize::from(self.count);
        if n == 1 {
            f(&self.head[..self.head_len]);
            if !self.payload.is_empty() {
                f(&self.payload);
            }
            f(&self.tail[..usize::from(self.tail_len)]);
            return;
        }
        // All but the last: BTH, payload, ICRC.
        let (h, each) = (self.head_len, usize::from(self.each));
        let (bths, icrcs) = self.head.split_at(n * h);
        for ((b, p), c) in bths
            .chunks_exact(h)
            .zip(self.payload.chunks_exact(each))
            .zip(icrcs.chunks_exact(rdma_wire::ICRC_LEN))
            .take(n - 1)
        {
            f(b);
            f(p);
            f(c);
        }
        for p in self.parts(n - 1) {
            if !p.is_empty() {
                f(p);
            }
        }
    }
}

/// Datagrams taken out of a node to be sent without its lock
/// ([`Node::take_batch`]): in the order the engines produced them, grouped
/// into the runs the socket sends as one GSO buffer each.
pub(crate) struct TxBatch {
    outs: Vec<Out>,
    runs: Vec<std::ops::Range<usize>>,
    /// Runs the kernel took (from the first).
    sent_runs: usize,
    gso_sends: u64,
    /// The kernel refused segmentation on this send.
    gso_off: bool,
}

impl TxBatch {
    /// Whether there is nothing to send.
    pub(crate) fn is_empty(&self) -> bool {
        self.outs.is_empty()
    }

    /// Whether every packet is a plain RC ACK (none: false).
    pub(crate) fn only_acks(&self) -> bool {
        !self.outs.is_empty() && self.outs.iter().all(|o| o.ack)
    }

    /// Sends the batch through `sock` (a handle on the node's socket). A
    /// full socket buffer is retried a bounded number of times, then the
    /// rest is dropped like a congested wire; retransmission recovers RC.
    pub(crate) fn send(&mut self, sock: &mut RoceSocket) {
        if self.outs.is_empty() {
            return;
        }
        let (gso_before, gso_was) = (sock.stats().gso_sends, sock.gso());
        let mut done = 0;
        for _ in 0..64 {
            done += sock.send_runs_gather(&self.outs, &self.runs[done..]);
            if done == self.runs.len() {
                break;
            }
            let _ = sock.wait(None, std::time::Duration::from_micros(100));
        }
        self.sent_runs = done;
        self.gso_sends = sock.stats().gso_sends - gso_before;
        self.gso_off = gso_was && !sock.gso();
    }
}

/// Room for the BTH and the longest extension-header list.
const HEAD_ROOM: usize = 64;

/// The last packet a QP built, when it was a middle packet of a message
/// (RC or UC SEND or RDMA WRITE Middle: a BTH and a path MTU of payload):
/// the message's next middle packets differ from it only in PSN and
/// AckReq ([`Qp::poll_middles`], [`Qp::poll_middle_responses`]), so they
/// are sent from its header without being built, to the same peer, as
/// many in one [`Out`] as a GSO buffer takes (`room`), their ICRC starting
/// from the state after the IP and UDP headers and the BTH's first eight
/// bytes.
struct Middle {
    bth: [u8; rdma_wire::bth::HEADER_LEN],
    dst: SocketAddr,
    /// The ICRC state after the shared headers, for `ib_len` bytes (BTH
    /// through pad).
    crc: icrc::SharedBthHead,
    ib_len: usize,
    room: usize,
    /// The opcode of the message's last packet.
    last: Opcode,
    /// READ response packets ([`Qp::poll_middle_responses`]), not requests.
    responses: bool,
}

impl Middle {
    /// The middle packets' header from `out` (the last packet built), if
    /// it is the first or a middle packet of an RC or UC SEND or WRITE or
    /// of an RDMA READ response (the same opcode family, SE and pad clear,
    /// no RETH or AETH: a first packet is a path MTU too); `room` tells
    /// how many datagrams of a length fit one GSO buffer.
    fn of(
        out: &Out,
        opcode: Opcode,
        room: impl FnOnce(usize) -> usize,
        state: impl FnOnce(usize) -> Option<u32>,
    ) -> Option<Middle> {
        const BTH: usize = rdma_wire::bth::HEADER_LEN;
        let info = opcode.info()?;
        if !matches!(info.position, Position::First | Position::Middle)
            || !matches!(
                info.kind,
                Kind::Send | Kind::RdmaWrite | Kind::RdmaReadResponse
            )
        {
            return None;
        }
        let same = |position| Opcode::find(info.transport, info.kind, position, false, false);
        let (middle, last) = (same(Position::Middle)?, same(Position::Last)?);
        let mut bth: [u8; BTH] = out.head.get(..BTH)?.try_into().ok()?;
        let mut b = rdma_wire::bth::BthPacket::new_unchecked(&mut bth[..]);
        let (mig_req, tver) = (b.mig_req(), b.tver());
        b.set_opcode(middle);
        b.set_flags(false, mig_req, 0, tver);
        let ib_len = BTH + out.payload.len();
        Some(Middle {
            bth,
            dst: out.dst,
            crc: icrc::SharedBthHead::new(state(ib_len)?, &bth)?,
            ib_len,
            room: room(ib_len + rdma_wire::ICRC_LEN),
            last,
            responses: info.kind == Kind::RdmaReadResponse,
        })
    }
}

/// The datagrams of middle packets `run` of QP `qpn` (and the message's
/// last, when the run `ends` it) from the header of the packet before
/// them (`m`), their headers and ICRCs in `head` (a header buffer of an
/// earlier batch); `state` gives the ICRC state for another length than
/// `m`'s (a last packet's). `None` if it has none.
fn middles_out(
    m: &Middle,
    qpn: u32,
    mut head: Vec<u8>,
    run: roce::MiddleRun,
    mut state: impl FnMut(usize) -> Option<u32>,
) -> Option<Out> {
    const BTH: usize = rdma_wire::bth::HEADER_LEN;
    let n = run.count;
    let room = HEAD_ROOM.max(n * (BTH + rdma_wire::ICRC_LEN));
    if head.len() < room {
        head.resize(room, 0);
    }
    let (bths, icrcs) = head.split_at_mut(n * BTH);
    let mut psn = run.psn;
    let mut pad = 0;
    for (i, ((h, c), payload)) in bths
        .chunks_exact_mut(BTH)
        .zip(icrcs.chunks_exact_mut(rdma_wire::ICRC_LEN))
        .zip(run.payload.chunks(run.each.max(1)))
        .enumerate()
    {
        h.copy_from_slice(&m.bth);
        let mut bth = rdma_wire::bth::BthPacket::new_unchecked(&mut *h);
        bth.set_psn(psn);
        bth.set_ack_req(run.ack_req >> i & 1 == 1);
        psn = psn.next();
        let crc = if run.ends && i + 1 == n {
            pad = payload.len().wrapping_neg() & 3;
            let (mig_req, tver) = (bth.mig_req(), bth.tver());
            bth.set_opcode(m.last);
            bth.set_flags(run.solicited, mig_req, pad as u8, tver);
            let zeros = [0u8; 3];
            let parts = [&h[..], payload, &zeros[..pad]];
            icrc::finish_vectored(state(BTH + payload.len() + pad)?, &parts).ok()?
        } else if BTH + payload.len() == m.ib_len {
            m.crc.finish(h, &[payload])?
        } else {
            icrc::finish_vectored(state(BTH + payload.len())?, &[h, payload]).ok()?
        };
        c.copy_from_slice(&crc.to_le_bytes());
    }
    let mut out = Out {
        dst: m.dst,
        qpn,
        head,
        head_len: BTH,
        payload: run.payload,
        tail: [0u8; 3 + rdma_wire::ICRC_LEN],
        tail_len: (pad + rdma_wire::ICRC_LEN) as u8,
        ack: false,
        count: u8::try_from(n).ok()?,
        each: u16::try_from(run.each).ok()?,
    };
    if n == 1 {
        // One datagram keeps its ICRC in the tail, after the pad.
        let crc = u32::from_le_bytes(out.head[BTH..BTH + 4].try_into().ok()?);
        out.set_icrc(0, crc);
    }
    Some(out)
}

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
    /// Where `next_qpn` counts (`NodeConfig::qpns`, from 2).
    qpns: std::ops::Range<u32>,
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
    /// The GSO runs of a sent batch, for the next one.
    spare_runs: Vec<std::ops::Range<usize>>,
    /// QPs changed since the last build outside a receive round (posts,
    /// state changes, new engines) or left at their send budget: what a
    /// posting thread's send builds ([`Node::take_batch`]).
    touched: Vec<u32>,
    /// The list's other buffer, swapped in while one is walked.
    touched_spare: Vec<u32>,
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

    /// The CRC state after the IP and UDP headers (Identification 0) of
    /// an IB part of `ib_len` bytes sent to `peer` by `local`.
    fn tx_state(&mut self, local: SocketAddr, peer: SocketAddr, ib_len: usize) -> Option<u32> {
        self.entry(local, peer, false, ib_len).map(|e| e.state)
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
pub(crate) const RX_BUDGET: usize = 64;

impl Node {
    /// Binds the node's socket and opens its capture file.
    ///
    /// # Errors
    /// The address cannot be bound, or the capture file cannot be created.
    pub fn bind(cfg: NodeConfig) -> io::Result<Node> {
        let mut sock = match &cfg.socket {
            Some(fd) => RoceSocket::adopt(fd.try_clone()?)?,
            None => RoceSocket::bind(cfg.bind)?,
        };
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
            next_qpn: (cfg.first_qpn & Qpn::MASK).clamp(cfg.qpns.start.max(2), cfg.qpns.end - 1),
            qpns: cfg.qpns.start.max(2)..cfg.qpns.end,
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
            spare_runs: Vec::new(),
            touched: Vec::new(),
            touched_spare: Vec::new(),
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
        cfg.qpn = Qpn::from_bits(self.free_qpn());
        self.insert(cfg, mem)
    }

    /// Reserves a QP number for a QP created later with
    /// [`Node::create_qp_at`]: verbs create a QP (and report its number)
    /// long before modify-QP to RTR gives what the engine is built from.
    pub fn reserve_qpn(&mut self) -> Qpn {
        let qpn = self.free_qpn();
        self.reserved.insert(qpn);
        Qpn::from_bits(qpn)
    }

    /// The next number of [`NodeConfig::qpns`] neither in use nor
    /// reserved, counting on from the last one handed out.
    fn free_qpn(&mut self) -> u32 {
        let step = |n: u32, r: &std::ops::Range<u32>| if n + 1 >= r.end { r.start } else { n + 1 };
        while self.qps.contains_key(&self.next_qpn) || self.reserved.contains(&self.next_qpn) {
            self.next_qpn = step(self.next_qpn, &self.qpns);
        }
        let qpn = self.next_qpn;
        self.next_qpn = step(qpn, &self.qpns);
        qpn
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
        self.touch(qpn.value());
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
        let n = qp.0.value();
        if !self.qps.contains_key(&n) {
            return None;
        }
        // Whatever is done to it may give it something to send.
        self.touch(n);
        self.qps.get_mut(&n).map(|s| &mut s.qp)
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
        self.more = false;
        let mut busy = self.receive(now);
        busy |= self.fire_timers(now);
        busy |= self.transmit(now);
        self.collect();
        busy
    }

    /// The rest of a round once a receive batch is delivered: timers fired,
    /// what the QPs have to send built into the outgoing batch (not sent:
    /// [`Node::take_batch`]), completions collected. A driver that received
    /// without the node's lock first calls [`Node::begin_round`].
    pub(crate) fn after_receive(&mut self, now: Instant) -> bool {
        let busy = self.fire_timers(now);
        let busy = self.build_out(now) | busy;
        self.collect();
        busy
    }

    /// Fires the QPs' due timers; whether any was.
    fn fire_timers(&mut self, now: Instant) -> bool {
        let mut busy = false;
        for s in self.qps.values_mut() {
            if s.qp.poll_timeout().is_some_and(|t| t <= now) {
                s.qp.handle_timeout(now);
                busy = true;
            }
        }
        busy
    }

    // Not inlined, as `receive`, so callgrind can name the send path of
    // `poll` (send_path bench): what the QPs have to send, built and sent.
    #[inline(never)]
    fn transmit(&mut self, now: Instant) -> bool {
        let produced = self.build_out(now);
        self.flush_out(now);
        produced
    }

    /// Starts a round that a driver received for without the node's lock:
    /// notes its batch (`buffers` system-call buffers, `gro` of them
    /// coalesced), a full one meaning more may be waiting.
    pub(crate) fn begin_round(&mut self, buffers: usize, gro: u64) {
        self.more = false;
        self.received(buffers, gro);
    }

    /// Whether the last round stopped at a budget (a full receive batch,
    /// or a QP with more to send than one round sends).
    pub fn has_more(&self) -> bool {
        self.more
    }

    /// What the QPs have to send now, with what an earlier round built,
    /// taken out of the node as a batch to send without its lock
    /// ([`TxBatch::send`], then [`Node::finish_batch`]): framed, through
    /// the fault injector, grouped into GSO runs with their segments'
    /// ICRCs corrected. Completions and events that came of it (a UD
    /// send's, a failed WR's) are collected.
    pub(crate) fn take_batch(&mut self, now: Instant) -> TxBatch {
        self.build_pending(now);
        self.prepare_batch(now)
    }

    /// What posts since the last build made to send, built into the
    /// outgoing batch (not taken out: [`Node::take_batch`]), and their
    /// completions collected.
    pub(crate) fn build_pending(&mut self, now: Instant) {
        self.build_touched(now);
    }

    /// Whether the outgoing batch holds packets and all are plain RC ACKs
    /// ([`Node::build_pending`] first), which may wait a little for a
    /// packet to ride with.
    pub(crate) fn only_acks_out(&self) -> bool {
        !self.out.is_empty() && self.out.iter().all(|o| o.ack)
    }

    /// Whether QPs are left with something to build (stopped at their
    /// send budget, or changed since the last build).
    pub(crate) fn has_touched(&self) -> bool {
        !self.touched.is_empty()
    }

    /// Whether QPs got completions or events not yet taken by
    /// [`Node::take_ready`].
    pub(crate) fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// A second handle on the node's socket, for a driver that sends or
    /// receives without the node's lock.
    ///
    /// # Errors
    /// The descriptor could not be duplicated.
    pub(crate) fn socket_handle(&self) -> io::Result<RoceSocket> {
        self.sock.try_clone()
    }

    /// Moves the engines' completions and events to their QPs' queues and
    /// notes the QPs that have new ones.
    fn collect(&mut self) {
        for (qpn, s) in self.qps.iter_mut() {
            collect_slot(*qpn, s, &mut self.ready);
        }
    }

    /// [`Node::collect`] for the QPs numbered in `qpns`.
    fn collect_from(&mut self, qpns: &[u32]) {
        for qpn in qpns {
            if let Some(s) = self.qps.get_mut(qpn) {
                collect_slot(*qpn, s, &mut self.ready);
            }
        }
    }

    // Not inlined into `poll` (one call per round, no measurable cost) so
    // `callgrind --toggle-collect` can name each path (send_path bench).
    #[inline(never)]
    fn receive(&mut self, now: Instant) -> bool {
        let (local, up) = (self.local, self.link_up);
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
        let gro_before = sock.stats().gro_buffers;
        // Each datagram is handled in the socket's own buffer: no copy.
        let n = sock.recv_batch(RX_BUDGET, |r, data| {
            let rx = Rx {
                qps: &mut *qps,
                stats: &mut *stats,
                header_crcs: &mut *header_crcs,
                partitions: &mut *partitions,
                ready: &mut *ready,
                pcap: pcap.as_mut(),
            };
            deliver_if_up(now, r, local, up, data, rx);
        });
        let gro = sock.stats().gro_buffers - gro_before;
        self.received(n, gro);
        n > 0
    }

    /// Hands one received datagram to its QP (ICRC, P_Key and headers
    /// checked): what a driver that receives without the node's lock does
    /// with each datagram once it holds the lock again.
    pub(crate) fn deliver_one(&mut self, now: Instant, r: roce_udp::Received, data: &[u8]) {
        let (local, up) = (self.local, self.link_up);
        let rx = Rx {
            qps: &mut self.qps,
            stats: &mut self.stats,
            header_crcs: &mut self.header_crcs,
            partitions: &mut self.partitions,
            ready: &mut self.ready,
            pcap: self.pcap.as_mut(),
        };
        deliver_if_up(now, r, local, up, data, rx);
    }

    /// Notes a receive batch: `buffers` system-call buffers, `gro` of them
    /// coalesced. A full batch means more may be waiting ([`Node::has_more`]).
    pub(crate) fn received(&mut self, buffers: usize, gro: u64) {
        self.stats.rx_gro_buffers += gro;
        self.more |= buffers >= RX_BUDGET;
    }

    /// Builds what the QPs have to send now into the outgoing batch.
    fn build_out(&mut self, now: Instant) -> bool {
        let mut keys = std::mem::take(&mut self.tx_keys);
        keys.clear();
        keys.extend(self.qps.keys().copied());
        // Every QP is looked at: none is left over from posts.
        self.touched.clear();
        if keys.is_empty() {
            self.tx_keys = keys;
            return false;
        }
        let start = (self.rr as usize) % keys.len();
        self.rr = self.rr.wrapping_add(1);
        let mut produced = false;
        // The engine builds each packet in this one slot.
        let mut pkt = Packet::default();
        for &k in keys[start..].iter().chain(&keys[..start]) {
            produced |= self.build_qp(k, now, &mut pkt);
        }
        self.tx_keys = keys;
        produced
    }

    /// [`Node::build_out`] for the QPs changed since the last build
    /// ([`Node::qp_mut`], a new engine) only, and their completions
    /// collected: what a post can have made, at a cost that does not grow
    /// with the node's other QPs. Packets a receive round makes are built
    /// by the round itself, for every QP.
    fn build_touched(&mut self, now: Instant) {
        if self.touched.is_empty() {
            return;
        }
        let spare = std::mem::take(&mut self.touched_spare);
        let mut list = std::mem::replace(&mut self.touched, spare);
        let mut pkt = Packet::default();
        for &k in &list {
            self.build_qp(k, now, &mut pkt);
        }
        self.collect_from(&list);
        list.clear();
        self.touched_spare = list;
    }

    /// Builds what QP `k` has to send now (up to its budget) into the
    /// outgoing batch, each packet in `pkt`; whether it built any. A QP
    /// stopped at its budget stays touched ([`Node::has_more`]).
    fn build_qp(&mut self, k: u32, now: Instant, pkt: &mut Packet<Payload>) -> bool {
        let local = self.local;
        let Some(slot) = self.qps.get_mut(&k) else {
            return false;
        };
        let mut produced = false;
        let mut built = 0;
        let mut middle: Option<Middle> = None;
        while built < TX_BUDGET_PER_QP {
            if let Some(m) = &middle {
                let most = m.room.min(TX_BUDGET_PER_QP - built);
                let run = match m.responses {
                    true => slot.qp.poll_middle_responses(&mut *slot.mem, most),
                    false => slot.qp.poll_middles(now, &mut *slot.mem, most),
                };
                if let Some(run) = run {
                    built += run.count;
                    let head = self.spare.pop().unwrap_or_default();
                    match middles_out(m, k, head, run, |len| {
                        self.header_crcs.tx_state(local, m.dst, len)
                    }) {
                        Some(o) => self.out.push(o),
                        None => self.stats.tx_frame_errors += 1,
                    }
                    continue;
                }
                middle = None;
            }
            if !slot.qp.poll_transmit_into(now, &mut *slot.mem, pkt) {
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
            let ack = ib.bth.opcode == Opcode::RcAcknowledge
                && matches!(ib.ext.aeth, Some(a) if matches!(a.syndrome, Syndrome::Ack(_)));
            let opcode = ib.bth.opcode;
            let out = Out {
                dst,
                qpn: k,
                head,
                head_len,
                payload: std::mem::take(&mut pkt.payload),
                tail,
                tail_len: (pad + rdma_wire::ICRC_LEN) as u8,
                ack,
                count: 1,
                each: 0,
            };
            // A capture wants every packet built in full.
            if self.pcap.is_none() {
                let sock = &self.sock;
                middle = Middle::of(
                    &out,
                    opcode,
                    |len| sock.gso_run_room(len),
                    |len| self.header_crcs.tx_state(local, dst, len),
                );
            }
            self.out.push(out);
        }
        // At its budget the QP may have more for the next round.
        if built == TX_BUDGET_PER_QP {
            self.more = true;
            self.touch(k);
        }
        produced
    }

    /// Notes that QP `n` may have something to send or complete.
    fn touch(&mut self, n: u32) {
        if !self.touched.contains(&n) {
            self.touched.push(n);
        }
    }

    /// Sends the outgoing batch through the node's own socket.
    fn flush_out(&mut self, now: Instant) {
        let mut batch = self.prepare_batch(now);
        if !batch.is_empty() {
            batch.send(&mut self.sock);
        }
        self.finish_batch(batch);
    }

    /// The outgoing batch taken out of the node, ready to send: dropped
    /// while the link is down, through the fault injector, grouped into
    /// GSO runs with each segment's ICRC corrected for its IPv4
    /// Identification.
    fn prepare_batch(&mut self, now: Instant) -> TxBatch {
        let mut batch = TxBatch {
            outs: Vec::new(),
            runs: Vec::new(),
            sent_runs: 0,
            gso_sends: 0,
            gso_off: false,
        };
        if self.out.is_empty() && self.faults.is_none() {
            return batch;
        }
        batch.outs = std::mem::take(&mut self.out);
        if !self.link_up {
            self.stats.link_down_drops +=
                batch.outs.iter().map(|o| u64::from(o.count)).sum::<u64>();
            let outs = std::mem::take(&mut batch.outs);
            self.recycle(outs);
            return batch;
        }
        if let Some(f) = self.faults.as_mut() {
            for o in batch.outs.drain(..) {
                let (qpn, payload) = o.flatten(|d| {
                    f.push(now, d);
                });
                if let (Some(s), Payload::Owned(b)) = (self.qps.get_mut(&qpn), payload) {
                    s.qp.recycle_payload(b);
                }
            }
            while let Some(d) = f.pop_ready(now) {
                batch.outs.extend(Out::from_flat(d));
            }
        }
        if batch.outs.is_empty() {
            return batch;
        }
        // Plain ACKs go last (each QP's ACKs and each QP's requests keep
        // their order: two sequences that never wait on each other). A
        // request and the shorter ACK after it to the same peer then ride
        // one GSO send (a run may end in one shorter datagram) and reach
        // the peer as one buffer, not two it may wake for one by one.
        if batch.outs.iter().skip_while(|o| !o.ack).any(|o| !o.ack) {
            batch.outs.sort_by_key(|o| o.ack);
        }
        batch.runs = std::mem::take(&mut self.spare_runs);
        let outs = &batch.outs;
        // A group of middle packets is a run of its own (length 0 here).
        self.sock.gso_runs_into(
            outs.len(),
            |i| match outs[i].count {
                1 => (outs[i].dst, outs[i].len()),
                _ => (outs[i].dst, 0),
            },
            &mut batch.runs,
        );
        // Segment k of a GSO send leaves with IPv4 Identification k; its
        // ICRC was computed for 0. A run's segments have one length, but
        // for a shorter last one.
        for run in &batch.runs {
            let segs = &mut batch.outs[run.clone()];
            if (segs.len() == 1 && segs[0].count == 1) || !segs[0].dst.is_ipv4() {
                continue;
            }
            // The corrections are kept with the header CRC state of each
            // (peer, length) that `build_out` used.
            let (local, dst) = (self.local, segs[0].dst);
            let mut delta_for = |len| self.header_crcs.entry(local, dst, false, len)?.ident;
            let ib_len = |o: &Out| o.len().saturating_sub(rdma_wire::ICRC_LEN);
            let first_len = ib_len(&segs[0]);
            let Some(delta) = delta_for(first_len) else {
                continue;
            };
            if let [group] = segs {
                // Packets of one message, all of one length but for a
                // shorter last.
                let n = usize::from(group.count);
                let last = group.last_len().saturating_sub(rdma_wire::ICRC_LEN);
                let last_delta = match last == first_len {
                    true => Some(delta.delta(n as u16 - 1)),
                    false => delta_for(last).map(|other| other.delta(n as u16 - 1)),
                };
                let at = group.icrc_at(n - 1);
                if let Some(d) = last_delta {
                    group.set_icrc(n - 1, group.icrc(n - 1) ^ d);
                }
                let icrcs = &mut group.head[n * group.head_len..at.start];
                for (c, d) in icrcs
                    .chunks_exact_mut(rdma_wire::ICRC_LEN)
                    .zip(delta.deltas())
                    .skip(1)
                {
                    let icrc = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) ^ d;
                    c.copy_from_slice(&icrc.to_le_bytes());
                }
                continue;
            }
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
                o.set_icrc(0, o.icrc(0) ^ d);
            }
        }
        batch
    }

    /// Counts what a batch sent and gives its buffers back (a batch from
    /// [`Node::take_batch`], sent or not).
    pub(crate) fn finish_batch(&mut self, mut batch: TxBatch) {
        let runs = &batch.runs[..batch.sent_runs];
        let outs = &batch.outs;
        // A run of several datagrams is several entries or one group.
        self.stats.tx_packets += runs
            .iter()
            .map(|r| match r.len() {
                1 => u64::from(outs[r.start].count),
                n => n as u64,
            })
            .sum::<u64>();
        self.stats.tx_gso_sends += batch.gso_sends;
        if batch.gso_off {
            // The kernel refused segmentation: later batches go unsegmented.
            self.sock.set_gso(false);
        }
        let outs = std::mem::take(&mut batch.outs);
        self.recycle(outs);
        if batch.runs.capacity() > self.spare_runs.capacity() {
            self.spare_runs = batch.runs;
        }
    }

    /// Gives sent (or dropped) datagrams' buffers back: payloads to their
    /// QP's engine, headers to the spare list; the emptied batch becomes
    /// the next one (its capacity kept) unless another was begun meanwhile.
    fn recycle(&mut self, mut batch: Vec<Out>) {
        for o in batch.drain(..) {
            // A lent payload releases its region here; only an engine's
            // buffer goes back to its QP.
            if let Payload::Owned(b) = o.payload {
                if let Some(s) = self.qps.get_mut(&o.qpn) {
                    s.qp.recycle_payload(b);
                }
            }
            if self.spare.len() < SPARE_BUFFERS {
                self.spare.push(o.head);
            }
        }
        if self.out.is_empty() && batch.capacity() > self.out.capacity() {
            self.out = batch;
        }
    }
}

/// Moves QP `qpn`'s completions and events from its engine to its queues,
/// and notes it in `ready` when it got new ones.
fn collect_slot(qpn: u32, s: &mut Slot, ready: &mut Vec<QpHandle>) {
    let before = (s.completions.len(), s.events.len());
    while let Some(c) = s.qp.poll_completion() {
        s.completions.push_back((c, None));
    }
    while let Some(e) = s.qp.poll_event() {
        s.events.push_back(e);
    }
    // Ready for a new completion or a new event alike: an event with no
    // completion (the responder's QP fatal) must not wait for some later
    // completion to be delivered.
    if (s.completions.len(), s.events.len()) != before {
        let h = QpHandle(Qpn::from_bits(qpn));
        if !ready.contains(&h) {
            ready.push(h);
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

/// Counts a received datagram and delivers it, or drops it while the
/// link is down.
fn deliver_if_up(
    now: Instant,
    r: roce_udp::Received,
    local: SocketAddr,
    up: bool,
    data: &[u8],
    rx: Rx<'_>,
) {
    rx.stats.rx_datagrams += 1;
    if up {
        deliver(now, r, local, data, rx);
    } else {
        rx.stats.link_down_drops += 1;
    }
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
