//! The control socket's protocol, version [`VERSION`].
//!
//! # Frames
//!
//! A Unix stream socket carries frames, each
//!
//! ```text
//! 0..4   length of the rest, u32 little-endian (at most MAX_FRAME)
//! 4      kind: 1 request, 2 response, 3 event
//! 5..9   sequence number, u32 little-endian (0 in an event)
//! 9..    body
//! ```
//!
//! A request's body is a [`Request`]; a response's (to the request of the
//! same sequence number, in any order: a `WaitCq` answers when it is
//! done) is a status byte (0 ok, 1 error) and a [`Reply`] or a
//! [`VerbsError`]; an event's is an [`Event`]. Every value is encoded by
//! [`Wire`]: integers little-endian, `bool` one byte (0 or 1), `Option`
//! a byte 0/1 and the value, `Vec` and strings a u32 count and the items,
//! a struct its fields in order, an enum a tag byte from its table below
//! and the variant's fields. A reader refuses an unknown tag, a bad value
//! or bytes left over ([`ProtoError`]).
//!
//! The first request of a connection is [`Request::Hello`] with
//! [`VERSION`]; the daemon answers another version with an error and
//! closes that connection. A [`Request::RegMr`] or [`Request::ReregMr`]
//! frame carries the buffer's memfd as `SCM_RIGHTS` ancillary data sent
//! with its first byte.
//!
//! # Handles
//!
//! Handles in requests and replies are the daemon's numbers for this
//! client, not the provider's: each names one object of this connection
//! and kind, and any other (another client's, a destroyed one's, one of
//! another kind or of an earlier daemon) is refused with `InvalidHandle`.
//! Contexts are the client's own and come back as they went in.
//!
//! # Rings in shared memory (version 2; layout version 1)
//!
//! Posts and polls over the socket cost system calls and a round trip
//! each. A client that says version 2 in its `Hello` gives the daemon an
//! eventfd, its doorbell ([`Request::Doorbell`]), and may then create
//! CQs, QPs and SRQs with rings ([`Request::CreateCqRing`],
//! [`Request::CreateQpRing`], [`Request::CreateSrqRing`]) in a memfd it
//! made (sealed against shrinking, as registered memory is) and passes
//! with the request. The request says where each ring is and how it is
//! cut ([`RingSpec`]); the daemon checks that and never reads the
//! header's copy. A ring, from its offset (see [`crate::ring`]):
//!
//! ```text
//! offset  size  field                                         written by
//! 0       8     magic "NRG1" (u32) | entry size << 32          client
//! 8       8     slots (u32) | capacity << 32                   client
//! 64      8     flags: 1 SLEEPING, 2 DEAD, 4 DELEGATED         daemon
//!                      8 RUNG, 16 WAITER                       client
//! 128     8     producer index (only grows)                    producer
//! 192     8     consumer index (only grows)                    consumer
//! 256     8     arm sequence (CQ: req_notify_cq)               client
//! 320     8     notified arm sequence (CQ, with a notice fd)   daemon
//! 4096    ...   entries; entry i at 4096 + (i % slots) * size
//! ```
//!
//! Every field is a little-endian u64 read and written as an 8-byte
//! atomic; the producer writes entries, then its index with release
//! ordering; the consumer reads the index with acquire ordering, copies
//! each entry out once and decodes the copy. An entry is a u32 length
//! and the [`Wire`] encoding of a `SendWr` or `RecvWr` (with the
//! client's handles, as in a post on the socket) or a
//! `WorkCompletion`. At most `capacity` entries are produced and not
//! consumed.
//!
//! Work queues: the client produces, the daemon consumes. After a post
//! the client writes its doorbell only when `SLEEPING` is set and it
//! is the first to set `RUNG` (the daemon clears `RUNG`, sets
//! `SLEEPING`, then looks at the producer index once more before it
//! sleeps; it clears both when it wakes). The daemon checks every entry as it checks a post on the
//! socket; a bad one, or a producer index more than `capacity` past its
//! own consumer index, kills the ring (`DEAD`, the QP in the error
//! state, a `QpFatal` event), and the client posts on the socket from
//! then on. A post on the socket to a QP or SRQ with a ring, and a
//! `ModifyQp`, are served after what the ring holds; an empty post waits
//! for exactly that. In each pass the daemon reads the SQ rings'
//! producer indices, then takes every receive ring, then the SQs up to
//! the indices read: a receive produced before a send is posted first.
//! A client that must know its receive (or inline
//! send) was taken sets `WAITER` and sleeps on the low 32 bits of the
//! consumer index (a futex); the daemon clears `WAITER` and wakes it
//! after it moves the index.
//!
//! CQs: the daemon produces (as completions arrive), the client
//! consumes. The ring's capacity is the CQ's depth: more completions
//! than that overrun it (`DEAD`, a `CqError` event). Bumping the arm
//! sequence arms the CQ for any completion: the next completion the
//! daemon moves after it sends [`Event::Completion`]. A solicited-only
//! arm is a [`Request::ReqNotifyCq`] on the socket and makes the ring
//! `DELEGATED` for good: completions stay in the daemon's CQ, and the
//! client polls them with [`Request::PollCq`] once its ring is empty.
//! A client that gave a completion eventfd
//! ([`Request::CompletionNotice`]) hears of it there instead: the daemon
//! writes the arm sequence it answers into the notified word, then
//! writes 1 to the eventfd; the client, woken, runs the CQ handler of
//! every ring whose notified word moved since it last looked. That skips
//! the event socket's two threads (the daemon's writer, the client's
//! reader) on every completion a consumer waits for by its handler.
//! A client waits for a ring CQ itself: it sets `WAITER` and sleeps on
//! the low 32 bits of the producer index (a futex the daemon wakes
//! after it moves a completion in); a `WaitCq` on the socket for a ring
//! CQ waits until the ring holds a completion.
//!
//! # The shared QP1
//!
//! [`Request::OpenGsi`], [`Request::GsiRegister`], [`Request::GsiListen`],
//! [`Request::GsiSend`] and [`Event::Mad`] (see [`crate::mads`]) came
//! after version 2's rings, without a new version: a daemon without them
//! answers them as malformed requests, and sends the event only to a
//! client that opened a GSI QP.
//!
//! # The completion eventfd
//!
//! [`Request::CompletionNotice`] and the ring's notified word came later
//! too, without a new version: a daemon without them answers the request
//! as malformed, and the client then hears of its ring CQs by
//! [`Event::Completion`] as before.
//!
//! # The SM's address
//!
//! [`Request::QueryPortSm`], [`Request::ModifyPortSm`] and
//! [`Reply::PortSm`] came later too, without a new version: they carry
//! `PortAttr::sm_gid` and `PortModify::sm_gid`, which `PortAttr` and
//! `PortModify` leave out on the wire (as version 2 had them), so an SA
//! client through the daemon finds the SM its port's SMA (the daemon's)
//! was set up by. A daemon without them answers them as malformed
//! requests.
//!
//! # QPs counted for their owner
//!
//! [`Request::CountQp`] and [`Request::CountMr`] came after the shared
//! ports, without a new version: a daemon without them answers them as
//! malformed requests, and a [`crate::Direct`] client then runs its QPs
//! uncounted, as before, and registers only memory the daemon can reach.
//!
//! # Versions
//!
//! A daemon of version 1 refuses a version 2 `Hello` and closes the
//! connection; the client then connects again saying version 1, and
//! every verb goes on the socket. A version 1 client is served as
//! before.

use rdma_types::{
    AccessFlags, Gid, Guid, Lid, Lkey, Mtu, Pkey, PkeyViolation, PortNum, Psn, Qkey, QpState,
    QpType, Qpn, Rkey, WcOpcode, WcStatus,
};
use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Mutex;
use verbs::{
    AhAttr, AhHandle, AltPath, AsyncEvent, AsyncEventKind, CaAttr, CaHandle, CqHandle, CqInit,
    Handle, MigState, MrHandle, MrInfo, MwBind, MwHandle, MwType, PdHandle, PkeyViolations,
    PortAttr, PortModify, PortState, QpAttr, QpCaps, QpHandle, QpInit, RecvWr, RemoteAddr,
    ResourceKind, SendFlags, SendOpcode, SendWr, Sge, SrqAttr, SrqHandle, UdDest, VerbsError,
    WcFlags, WorkCompletion,
};

/// The protocol version this build speaks: 2, the data path through
/// shared-memory rings ([`Request::Doorbell`] and the `Create*Ring`
/// requests). The daemon serves every version from [`OLDEST_VERSION`]
/// on.
pub const VERSION: u32 = 2;

/// The oldest version the daemon serves: 1, every verb on the socket.
pub const OLDEST_VERSION: u32 = 1;

/// The longest frame accepted (after its length field).
pub const MAX_FRAME: usize = 16 << 20;

/// Bytes before a frame's body.
pub const HEADER: usize = 9;

/// What is wrong with a frame or value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// The bytes end inside a value.
    #[error("truncated {0}")]
    Truncated(&'static str),
    /// A tag that names nothing in its table.
    #[error("unknown {what} tag {tag}")]
    UnknownTag {
        /// The table.
        what: &'static str,
        /// The tag read.
        tag: u8,
    },
    /// A value out of its range.
    #[error("bad {0}")]
    BadValue(&'static str),
    /// Bytes after the last value.
    #[error("{0} bytes after the message")]
    Trailing(usize),
    /// A frame longer than [`MAX_FRAME`] or shorter than its header.
    #[error("frame length {0} out of range")]
    FrameLength(usize),
}

type PResult<T> = core::result::Result<T, ProtoError>;

/// A frame's kind byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Client to daemon.
    Request = 1,
    /// Daemon to client, answering the request of its sequence number.
    Response = 2,
    /// Daemon to client, unasked.
    Event = 3,
}

/// Writes values.
#[derive(Debug, Default)]
pub struct Enc(pub Vec<u8>);

/// Reads values.
#[derive(Debug)]
pub struct Dec<'a>(pub &'a [u8]);

impl Dec<'_> {
    fn take(&mut self, n: usize, what: &'static str) -> PResult<&[u8]> {
        if self.0.len() < n {
            return Err(ProtoError::Truncated(what));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }

    /// Fails unless every byte was read.
    pub fn finish(&self) -> PResult<()> {
        match self.0.len() {
            0 => Ok(()),
            n => Err(ProtoError::Trailing(n)),
        }
    }
}

/// A value with a wire encoding (see the module docs).
pub trait Wire: Sized {
    /// Appends the encoding.
    fn put(&self, e: &mut Enc);
    /// Reads one value.
    fn get(d: &mut Dec<'_>) -> PResult<Self>;
}

macro_rules! wire_int {
    ($($t:ty),*) => {$(
        impl Wire for $t {
            fn put(&self, e: &mut Enc) {
                e.0.extend_from_slice(&self.to_le_bytes());
            }
            fn get(d: &mut Dec<'_>) -> PResult<Self> {
                let b = d.take(size_of::<$t>(), stringify!($t))?;
                Ok(<$t>::from_le_bytes(b.try_into().expect("sized")))
            }
        }
    )*};
}
wire_int!(u8, u16, u32, u64, i32);

/// A count: a u64 on the wire.
impl Wire for usize {
    fn put(&self, e: &mut Enc) {
        (*self as u64).put(e);
    }
    fn get(d: &mut Dec<'_>) -> PResult<Self> {
        usize::try_from(u64::get(d)?).map_err(|_| ProtoError::BadValue("count"))
    }
}

impl Wire for bool {
    fn put(&self, e: &mut Enc) {
        e.0.push(*self as u8);
    }
    fn get(d: &mut Dec<'_>) -> PResult<Self> {
        match u8::get(d)? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(ProtoError::BadValue("bool")),
        }
    }
}

impl<T: Wire> Wire for Option<T> {
    fn put(&self, e: &mut Enc) {
        match self {
            None => e.0.push(0),
            Some(v) => {
                e.0.push(1);
                v.put(e);
            }
        }
    }
    fn get(d: &mut Dec<'_>) -> PResult<Self> {
        Ok(if bool::get(d)? {
            Some(T::get(d)?)
        } else {
            None
        })
    }
}

/// A list: its count, then its items.
fn put_list<T: Wire>(items: &[T], e: &mut Enc) {
    (items.len() as u32).put(e);
    items.iter().for_each(|v| v.put(e));
}

fn get_list<T: Wire, C: FromIterator<T>>(d: &mut Dec<'_>) -> PResult<C> {
    let n = u32::get(d)? as usize;
    // Every item takes a byte at least: a count beyond the bytes left
    // is a lie, refused before allocating for it.
    if n > d.0.len() {
        return Err(ProtoError::Truncated("list"));
    }
    (0..n).map(|_| T::get(d)).collect()
}

impl<T: Wire> Wire for Vec<T> {
    fn put(&self, e: &mut Enc) {
        put_list(self, e);
    }
    fn get(d: &mut Dec<'_>) -> PResult<Self> {
        get_list(d)
    }
}

/// A work request's SGEs: on the wire as a `Vec` of them.
impl Wire for verbs::Sges {
    fn put(&self, e: &mut Enc) {
        put_list(self, e);
    }
    fn get(d: &mut Dec<'_>) -> PResult<Self> {
        get_list(d)
    }
}

impl Wire for String {
    fn put(&self, e: &mut Enc) {
        (self.len() as u32).put(e);
        e.0.extend_from_slice(self.as_bytes());
    }
    fn get(d: &mut Dec<'_>) -> PResult<Self> {
        let n = u32::get(d)? as usize;
        let b = d.take(n, "string")?;
        String::from_utf8(b.to_vec()).map_err(|_| ProtoError::BadValue("UTF-8 string"))
    }
}

impl<A: Wire, B: Wire> Wire for (A, B) {
    fn put(&self, e: &mut Enc) {
        self.0.put(e);
        self.1.put(e);
    }
    fn get(d: &mut Dec<'_>) -> PResult<Self> {
        Ok((A::get(d)?, B::get(d)?))
    }
}

impl Wire for Gid {
    fn put(&self, e: &mut Enc) {
        e.0.extend_from_slice(&self.0);
    }
    fn get(d: &mut Dec<'_>) -> PResult<Self> {
        Ok(Gid(d.take(16, "GID")?.try_into().expect("sized")))
    }
}

/// An address as 16 bytes, IPv4 mapped into IPv6.
impl Wire for IpAddr {
    fn put(&self, e: &mut Enc) {
        let v6 = match self {
            IpAddr::V4(a) => a.to_ipv6_mapped(),
            IpAddr::V6(a) => *a,
        };
        e.0.extend_from_slice(&v6.octets());
    }
    fn get(d: &mut Dec<'_>) -> PResult<Self> {
        let b: [u8; 16] = d.take(16, "IP address")?.try_into().expect("sized");
        Ok(std::net::Ipv6Addr::from(b).to_canonical())
    }
}

/// Tuple structs of one public field.
macro_rules! wire_newtype {
    ($($t:ident($inner:ty)),* $(,)?) => {$(
        impl Wire for $t {
            fn put(&self, e: &mut Enc) {
                self.0.put(e);
            }
            fn get(d: &mut Dec<'_>) -> PResult<Self> {
                Ok($t(<$inner>::get(d)?))
            }
        }
    )*};
}
wire_newtype!(
    Guid(u64),
    Lid(u16),
    Pkey(u16),
    PortNum(u8),
    Qkey(u32),
    Lkey(u32),
    Rkey(u32),
    SendFlags(u8),
    WcFlags(u8),
    CaHandle(Handle),
    PdHandle(Handle),
    CqHandle(Handle),
    QpHandle(Handle),
    SrqHandle(Handle),
    MrHandle(Handle),
    MwHandle(Handle),
    AhHandle(Handle),
);

/// Values kept as an integer with a checked constructor.
macro_rules! wire_via {
    ($($t:ty: $inner:ty, |$v:ident| $to:expr, |$w:ident| $from:expr;)*) => {$(
        impl Wire for $t {
            fn put(&self, e: &mut Enc) {
                let $v = self;
                <$inner>::put(&$to, e)
            }
            fn get(d: &mut Dec<'_>) -> PResult<Self> {
                let $w = <$inner>::get(d)?;
                $from.ok_or(ProtoError::BadValue(stringify!($t)))
            }
        }
    )*};
}
wire_via! {
    Qpn: u32, |v| v.value(), |w| Qpn::new(w).ok();
    Psn: u32, |v| v.value(), |w| Some(Psn::new(w & 0xff_ffff)).filter(|_| w <= 0xff_ffff);
    AccessFlags: u32, |v| v.bits(), |w| AccessFlags::from_bits(w);
    Mtu: u8, |v| *v as u8, |w| Mtu::from_code(w).ok();
}

/// Fieldless enums: one tag per variant.
macro_rules! wire_enum {
    ($($t:ident { $($var:ident = $tag:literal),* $(,)? })*) => {$(
        impl Wire for $t {
            fn put(&self, e: &mut Enc) {
                e.0.push(match self { $($t::$var => $tag),* });
            }
            fn get(d: &mut Dec<'_>) -> PResult<Self> {
                match u8::get(d)? {
                    $($tag => Ok($t::$var),)*
                    tag => Err(ProtoError::UnknownTag { what: stringify!($t), tag }),
                }
            }
        }
    )*};
}
wire_enum! {
    QpState { Reset = 0, Init = 1, Rtr = 2, Rts = 3, Sqd = 4, Sqe = 5, Err = 6 }
    QpType { Rc = 0, Uc = 1, Ud = 2, Smi = 3, Gsi = 4 }
    PortState { Down = 0, Init = 1, Active = 2 }
    MwType { Type1 = 1, Type2 = 2 }
    MigState { Migrated = 0, Rearm = 1, Armed = 2 }
    SendOpcode {
        Send = 0, SendWithImm = 1, SendWithInv = 2, RdmaWrite = 3, RdmaWriteWithImm = 4,
        RdmaRead = 5, AtomicCmpSwp = 6, AtomicFetchAdd = 7, LocalInv = 8, BindMw = 9,
    }
    ResourceKind { Ca = 0, Pd = 1, Cq = 2, Srq = 3, Qp = 4, Ah = 5, Mr = 6, Mw = 7 }
    AsyncEventKind {
        QpFatal = 0, PathMigrated = 1, CommEstablished = 2, SqDrained = 3, SrqLimitReached = 4,
        CqError = 5, PortActive = 6, PortDown = 7, LidChange = 8, PkeyChange = 9, SmChange = 10,
        CaRemoval = 11,
    }
    // libibverbs' numbers (enum ibv_wc_status, ibv_wc_opcode).
    WcStatus {
        Success = 0, LocLenErr = 1, LocQpOpErr = 2, LocEecOpErr = 3, LocProtErr = 4,
        WrFlushErr = 5, MwBindErr = 6, BadRespErr = 7, LocAccessErr = 8, RemInvReqErr = 9,
        RemAccessErr = 10, RemOpErr = 11, RetryExcErr = 12, RnrRetryExcErr = 13,
        LocRddViolErr = 14, RemInvRdReqErr = 15, RemAbortErr = 16, InvEecnErr = 17,
        InvEecStateErr = 18, FatalErr = 19, RespTimeoutErr = 20, GeneralErr = 21,
    }
    WcOpcode {
        Send = 0, RdmaWrite = 1, RdmaRead = 2, CompSwap = 3, FetchAdd = 4, BindMw = 5,
        LocalInv = 6, Recv = 128, RecvRdmaWithImm = 129,
    }
}

// `PortAttr` and `PortModify` as version 2 had them: the SM's GID goes
// in `QueryPortSm`/`ModifyPortSm` (see "The SM's address" above).
impl Wire for PortAttr {
    fn put(&self, e: &mut Enc) {
        self.port.put(e);
        self.state.put(e);
        self.max_mtu.put(e);
        self.active_mtu.put(e);
        self.lid.put(e);
        self.sm_lid.put(e);
        self.gids.put(e);
        self.pkeys.put(e);
    }
    fn get(d: &mut Dec<'_>) -> PResult<Self> {
        Ok(PortAttr {
            port: Wire::get(d)?,
            state: Wire::get(d)?,
            max_mtu: Wire::get(d)?,
            active_mtu: Wire::get(d)?,
            lid: Wire::get(d)?,
            sm_lid: Wire::get(d)?,
            sm_gid: None,
            gids: Wire::get(d)?,
            pkeys: Wire::get(d)?,
        })
    }
}

impl Wire for PortModify {
    fn put(&self, e: &mut Enc) {
        self.lid.put(e);
        self.lmc.put(e);
        self.sm_lid.put(e);
        self.sm_sl.put(e);
        self.state.put(e);
        self.pkeys.put(e);
        self.alias_guids.put(e);
    }
    fn get(d: &mut Dec<'_>) -> PResult<Self> {
        Ok(PortModify {
            lid: Wire::get(d)?,
            lmc: Wire::get(d)?,
            sm_lid: Wire::get(d)?,
            sm_gid: None,
            sm_sl: Wire::get(d)?,
            state: Wire::get(d)?,
            pkeys: Wire::get(d)?,
            alias_guids: Wire::get(d)?,
        })
    }
}

/// Structs: their fields in order.
macro_rules! wire_struct {
    ($($t:ident { $($f:ident),* $(,)? })*) => {$(
        impl Wire for $t {
            fn put(&self, e: &mut Enc) {
                $(self.$f.put(e);)*
            }
            fn get(d: &mut Dec<'_>) -> PResult<Self> {
                Ok($t { $($f: Wire::get(d)?,)* })
            }
        }
    )*};
}
wire_struct! {
    Handle { index, generation }
    CaAttr {
        guid, num_ports, max_qp, max_qp_wr, max_sge, max_cq, max_cqe, max_mr, max_pd,
        max_qp_rd_atom, max_srq, max_mw, max_inline_data, atomics,
    }
    CqInit { cqe }
    SrqAttr { max_wr, max_sge, limit }
    QpCaps { max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline }
    QpInit { qp_type, send_cq, recv_cq, srq, caps, sq_sig_all, port }
    AhAttr { dlid, port, grh, dgid, sgid_index, sl, hop_limit }
    QpAttr {
        state, port, pkey_index, qkey, access, path_mtu, dest_qpn, rq_psn, sq_psn, av,
        max_dest_rd_atomic, max_rd_atomic, min_rnr_timer, timeout, retry_cnt, rnr_retry,
        en_sqd_async_notify, alt_path, path_mig_state,
    }
    AltPath { av, port, pkey_index, timeout }
    MrInfo { handle, lkey, rkey, addr, len }
    Sge { addr, length, lkey }
    RemoteAddr { addr, rkey }
    UdDest { ah, remote_qpn, remote_qkey }
    MwBind { mw, rkey, mr, addr, len, access }
    SendWr {
        wr_id, opcode, sges, flags, imm, remote, compare_add, swap, ud, invalidate_rkey,
        bind_mw, pkey_index,
    }
    RecvWr { wr_id, sges }
    WorkCompletion {
        wr_id, status, opcode, byte_len, imm, invalidated_rkey, src_qp, pkey_index, slid,
        wc_flags, qp_ctx,
    }
    AsyncEvent { kind, ctx, port }
    PkeyViolations { count, latest }
    PkeyViolation { pkey, src_gid, dst_gid, src_qp, dest_qp }
}

/// What the daemon knows of a client from its socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// The daemon's number for the connection.
    pub id: u64,
    /// Process ID (`SO_PEERCRED`).
    pub pid: i32,
    /// Effective user ID.
    pub uid: u32,
    /// Effective group ID.
    pub gid: u32,
}

/// A client and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientReport {
    /// Who.
    pub peer: Peer,
    /// Objects it holds, by kind.
    pub objects: Vec<(ResourceKind, usize)>,
}

impl ClientReport {
    /// Objects it holds, all kinds.
    pub fn total(&self) -> usize {
        self.objects.iter().map(|(_, n)| n).sum()
    }
}

impl core::fmt::Display for ClientReport {
    /// `client 3: pid 1234 uid 0 gid 0: 1 CA, 1 PD, 2 CQ, 1 MR, 2 QP`.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let p = &self.peer;
        write!(
            f,
            "client {}: pid {} uid {} gid {}:",
            p.id, p.pid, p.uid, p.gid
        )?;
        if self.objects.is_empty() {
            return f.write_str(" nothing");
        }
        for (i, (kind, n)) in self.objects.iter().enumerate() {
            let sep = if i == 0 { " " } else { ", " };
            write!(f, "{sep}{n} {}", format!("{kind:?}").to_uppercase())?;
        }
        Ok(())
    }
}

wire_struct! {
    Peer { id, pid, uid, gid }
    ClientReport { peer, objects }
    LentPort { client, guid, block }
}

/// A member of a NIC's shared port lent to a client
/// ([`Request::LentPorts`]): the client runs the QPs of its block itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LentPort {
    /// The client (its [`Peer::id`]).
    pub client: u64,
    /// The NIC.
    pub guid: Guid,
    /// The block of QP numbers (`roce_udp::block_qpns`).
    pub block: u8,
}

/// Where a ring is in its memfd and how it is cut: what the create
/// request says, checked by [`RingSpec::check`] (the header's copy is
/// informational and never read by the daemon).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingSpec {
    /// Bytes from the memfd's start (a multiple of 4096).
    pub offset: u64,
    /// Bytes per entry (a power of two, 64..=[`crate::ring::MAX_ENTRY`]).
    pub entry_size: u32,
    /// Slots (a power of two, 1..=[`crate::ring::MAX_SLOTS`]).
    pub slots: u32,
    /// Most entries produced and not yet consumed (1..=slots).
    pub capacity: u32,
}

wire_struct! {
    RingSpec { offset, entry_size, slots, capacity }
}

/// Most distinct error texts [`interned`] keeps.
const MAX_TEXTS: usize = 4096;

/// The text an error gets, once 4096 distinct ones are kept, in
/// place of the daemon's (the one decoding that does not give back the
/// bytes it read).
pub const TEXTS_OVERFLOW: &str = "(an error text of nicd's: too many distinct ones to keep)";

/// The `&'static str` of an error decoded from the daemon: each distinct
/// text is kept once for the life of the process (the daemon's texts are
/// its provider's literals, a small set; past [`MAX_TEXTS`] of them, a
/// daemon that makes them up gets one text for all the others).
fn interned(s: String) -> &'static str {
    static TEXTS: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let mut t = TEXTS.lock().unwrap_or_else(|e| e.into_inner());
    let t = t.get_or_insert_with(HashSet::new);
    if let Some(k) = t.get(s.as_str()) {
        return k;
    }
    if t.len() >= MAX_TEXTS {
        return TEXTS_OVERFLOW;
    }
    let k: &'static str = Box::leak(s.into_boxed_str());
    t.insert(k);
    k
}

impl Wire for VerbsError {
    fn put(&self, e: &mut Enc) {
        use VerbsError::*;
        match self {
            NotSupported(s) => (0u8, s.to_string()).put(e),
            InvalidHandle => 1u8.put(e),
            NoSuchCa => 2u8.put(e),
            InvalidArgument(s) => (3u8, s.clone()).put(e),
            InvalidTransition { from, to } => (4u8, (*from, *to)).put(e),
            MissingAttribute { attr, from, to } => (5u8, (attr.to_string(), (*from, *to))).put(e),
            UnexpectedAttribute { attr, from, to } => {
                (6u8, (attr.to_string(), (*from, *to))).put(e)
            }
            Busy(s) => (7u8, s.to_string()).put(e),
            QueueFull => 8u8.put(e),
            OutOfResources(s) => (9u8, s.to_string()).put(e),
            InvalidState(s) => (10u8, *s).put(e),
            BadWr { index, cause } => {
                11u8.put(e);
                (*index as u64).put(e);
                cause.put(e);
            }
            Timeout => 12u8.put(e),
        }
    }
    fn get(d: &mut Dec<'_>) -> PResult<Self> {
        use VerbsError::*;
        Ok(match u8::get(d)? {
            0 => NotSupported(interned(String::get(d)?)),
            1 => InvalidHandle,
            2 => NoSuchCa,
            3 => InvalidArgument(String::get(d)?),
            4 => {
                let (from, to) = Wire::get(d)?;
                InvalidTransition { from, to }
            }
            5 => {
                let (attr, (from, to)): (String, _) = Wire::get(d)?;
                MissingAttribute {
                    attr: interned(attr),
                    from,
                    to,
                }
            }
            6 => {
                let (attr, (from, to)): (String, _) = Wire::get(d)?;
                UnexpectedAttribute {
                    attr: interned(attr),
                    from,
                    to,
                }
            }
            7 => Busy(interned(String::get(d)?)),
            8 => QueueFull,
            9 => OutOfResources(interned(String::get(d)?)),
            10 => InvalidState(Wire::get(d)?),
            11 => {
                let index = u64::get(d)? as usize;
                BadWr {
                    index,
                    cause: Box::new(VerbsError::get(d)?),
                }
            }
            12 => Timeout,
            tag => {
                return Err(ProtoError::UnknownTag {
                    what: "VerbsError",
                    tag,
                })
            }
        })
    }
}

/// Messages: enums of struct-like variants, each with its tag.
macro_rules! messages {
    ($(
        $(#[$m:meta])*
        pub enum $name:ident {
            $(
                $(#[$vm:meta])*
                $var:ident = $tag:literal { $($(#[$fm:meta])* $f:ident : $t:ty),* $(,)? }
            ),* $(,)?
        }
    )*) => {$(
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq)]
        pub enum $name {
            $(
                $(#[$vm])*
                $var { $($(#[$fm])* $f: $t),* },
            )*
        }
        impl Wire for $name {
            fn put(&self, e: &mut Enc) {
                match self {
                    $($name::$var { $($f),* } => {
                        e.0.push($tag);
                        $($f.put(e);)*
                    })*
                }
            }
            fn get(d: &mut Dec<'_>) -> PResult<Self> {
                match u8::get(d)? {
                    $($tag => Ok($name::$var { $($f: Wire::get(d)?),* }),)*
                    tag => Err(ProtoError::UnknownTag { what: stringify!($name), tag }),
                }
            }
        }
    )*};
}

messages! {
    /// Client to daemon: one per verb, and the hello.
    pub enum Request {
        /// The first request: the client's protocol version.
        Hello = 0 { version: u32 },
        /// `list_cas`.
        ListCas = 1 {},
        /// `open_ca`.
        OpenCa = 2 { guid: Guid, ctx: u64 },
        /// `query_ca`.
        QueryCa = 3 { ca: CaHandle },
        /// `close_ca`.
        CloseCa = 4 { ca: CaHandle },
        /// `query_port`.
        QueryPort = 5 { ca: CaHandle, port: PortNum },
        /// `modify_port`.
        ModifyPort = 6 { ca: CaHandle, port: PortNum, modify: PortModify },
        /// `take_pkey_violations`.
        TakePkeyViolations = 7 { ca: CaHandle, port: PortNum },
        /// `alloc_pd`.
        AllocPd = 8 { ca: CaHandle, ctx: u64 },
        /// `dealloc_pd`.
        DeallocPd = 9 { pd: PdHandle },
        /// `create_cq`.
        CreateCq = 10 { pd: PdHandle, init: CqInit, ctx: u64 },
        /// `destroy_cq`.
        DestroyCq = 11 { cq: CqHandle },
        /// `poll_cq` for up to `max` completions.
        PollCq = 12 { cq: CqHandle, max: u32 },
        /// `req_notify_cq`.
        ReqNotifyCq = 13 { cq: CqHandle, solicited_only: bool },
        /// `wait_cq`; answered when the wait ends (other requests of the
        /// connection are served meanwhile).
        WaitCq = 14 { cq: CqHandle, timeout_us: u64 },
        /// `create_srq`.
        CreateSrq = 15 { pd: PdHandle, attr: SrqAttr, ctx: u64 },
        /// `modify_srq`.
        ModifySrq = 16 { srq: SrqHandle, limit: u32 },
        /// `query_srq`.
        QuerySrq = 17 { srq: SrqHandle },
        /// `destroy_srq`.
        DestroySrq = 18 { srq: SrqHandle },
        /// `post_srq_recv`.
        PostSrqRecv = 19 { srq: SrqHandle, wrs: Vec<RecvWr> },
        /// `create_qp`.
        CreateQp = 20 { pd: PdHandle, init: QpInit, ctx: u64 },
        /// `qp_num`.
        QpNum = 21 { qp: QpHandle },
        /// `modify_qp`.
        ModifyQp = 22 { qp: QpHandle, attr: QpAttr },
        /// `query_qp`.
        QueryQp = 23 { qp: QpHandle },
        /// `destroy_qp`.
        DestroyQp = 24 { qp: QpHandle },
        /// `create_ah`.
        CreateAh = 25 { pd: PdHandle, attr: AhAttr },
        /// `destroy_ah`.
        DestroyAh = 26 { ah: AhHandle },
        /// `reg_mr` of `[addr, addr+len)` in the buffer of `buf_len` bytes
        /// at `buf_addr` whose memfd the frame carries.
        RegMr = 27 {
            pd: PdHandle, buf_addr: u64, buf_len: u64, addr: u64, len: u64,
            access: AccessFlags, ctx: u64,
        },
        /// `rereg_mr`, the buffer's memfd in the frame.
        ReregMr = 28 {
            mr: MrHandle, buf_addr: u64, buf_len: u64, addr: u64, len: u64, access: AccessFlags,
        },
        /// `dereg_mr`.
        DeregMr = 29 { mr: MrHandle },
        /// `alloc_mw`.
        AllocMw = 30 { pd: PdHandle, kind: MwType, ctx: u64 },
        /// `bind_mw`.
        BindMw = 31 { qp: QpHandle, bind: MwBind },
        /// `dealloc_mw`.
        DeallocMw = 32 { mw: MwHandle },
        /// `post_send`.
        PostSend = 33 { qp: QpHandle, wrs: Vec<SendWr> },
        /// `post_recv`.
        PostRecv = 34 { qp: QpHandle, wrs: Vec<RecvWr> },
        /// The daemon's clients and what each holds (root and the
        /// daemon's user only).
        Clients = 35 {},
        /// Version 2: the client's doorbell, an eventfd the frame carries
        /// (written after a post when a ring's flags say the daemon
        /// sleeps). Sent once, before any ring is made.
        Doorbell = 36 {},
        /// Version 2: `create_cq` with its completions in `ring` of the
        /// memfd of `len` bytes the frame carries.
        CreateCqRing = 37 { pd: PdHandle, init: CqInit, ctx: u64, len: u64, ring: RingSpec },
        /// Version 2: `create_qp` with its SQ (and RQ, without an SRQ) in
        /// rings of the memfd of `len` bytes the frame carries.
        CreateQpRing = 38 {
            pd: PdHandle, init: QpInit, ctx: u64, len: u64, sq: RingSpec, rq: Option<RingSpec>,
        },
        /// Version 2: `create_srq` with its receives in `ring` of the
        /// memfd of `len` bytes the frame carries.
        CreateSrqRing = 39 { pd: PdHandle, attr: SrqAttr, ctx: u64, len: u64, ring: RingSpec },
        /// `create_qp` of a GSI QP (QP1) of port 1 of the PD's CA: the
        /// client's place at the port's shared QP1 (see
        /// [`crate::mads`]), answered with a QP handle the client serves
        /// itself: its sends are [`Request::GsiSend`]s, its receives
        /// [`Event::Mad`]s.
        OpenGsi = 40 { pd: PdHandle, ctx: u64 },
        /// `gsi_register`: unsolicited requests of `methods` of `class`,
        /// `version` come to this client (`serve`) or no longer.
        GsiRegister = 41 { qp: QpHandle, class: u8, version: u8, methods: Vec<u8>, serve: bool },
        /// `gsi_listen`: CM REQs for `service_id` come to this client
        /// (`listen`) or no longer.
        GsiListen = 42 { qp: QpHandle, service_id: u64, listen: bool },
        /// A MAD (256 bytes) to QP1 of the port at `dgid`, sent with
        /// P_Key index `pkey_index` (a post on the client's GSI QP).
        GsiSend = 43 { qp: QpHandle, dgid: Gid, pkey_index: u16, mad: Vec<u8> },
        /// A NIC at `ip` served from now on (root and the daemon's user
        /// only), answered with its GUID (one [`Reply::Guids`]); one the
        /// daemon serves already is named.
        AddNic = 44 { ip: IpAddr },
        /// `query_port` with where the port's master SM answers
        /// ([`Reply::PortSm`]).
        QueryPortSm = 45 { ca: CaHandle, port: PortNum },
        /// `modify_port` with where the master SM answers.
        ModifyPortSm = 46 { ca: CaHandle, port: PortNum, modify: PortModify, sm_gid: Option<Gid> },
        /// [`Request::AddNic`] on a given fabric (`ib`: a managed
        /// subnet's port, whose SMA the daemon runs; else RoCE), answered
        /// the same way. A NIC the daemon serves already is named to any
        /// client when it is on that fabric, and refused in words when
        /// it is on the other.
        AddNicOn = 47 { ip: IpAddr, ib: bool },
        /// Version 2: the client's completion eventfd, which the frame
        /// carries. From then on a ring CQ armed through its arm word is
        /// answered there ([`crate::ring`]'s notified word, then a write
        /// to the eventfd) instead of with [`Event::Completion`]. Sent
        /// once, after the [`Request::Doorbell`] and before any ring is
        /// made.
        CompletionNotice = 48 {},
        /// A member of the shared port of the client's CA `ca`, for QPs
        /// whose transport the client runs itself: answered with
        /// [`Reply::SharedPort`], the member's socket in the frame (see
        /// [`crate::shared`]). Refused where the daemon lends none (an
        /// `ib` port, a daemon without shared ports).
        SharePort = 49 { ca: CaHandle },
        /// The members of shared ports lent now, and to whom (root and
        /// the daemon's user only).
        LentPorts = 50 {},
        /// A QP of the client's own transport (a [`crate::Direct`]
        /// client's, on its block of a shared port) under the client's
        /// PD `pd`, counted here: against the client's QP limit, in what
        /// [`Request::Clients`] lists, released with the client. Answered
        /// with [`Reply::Qp`], a handle that [`Request::DestroyQp`] ends
        /// and no other verb takes (the QP is not the daemon's).
        CountQp = 51 { pd: PdHandle },
        /// A registration of `len` bytes of the client's own memory in
        /// its own node (a [`crate::Direct`] client's, of memory the
        /// daemon cannot reach) under the client's PD `pd`, counted here
        /// as [`Request::CountQp`] counts a QP: against the client's
        /// registered-memory limit. Answered with [`Reply::Mr`], a handle
        /// (no keys: the daemon holds no registration) that
        /// [`Request::DeregMr`] ends and no other verb takes.
        CountMr = 52 { pd: PdHandle, len: u64 },
    }

    /// Daemon to client: what a request returns.
    pub enum Reply {
        /// Nothing (the verb returns `()`).
        Unit = 0 {},
        /// The daemon's version and process ID.
        Hello = 1 { version: u32, pid: u32 },
        /// CA GUIDs.
        Guids = 2 { guids: Vec<Guid> },
        /// A CA.
        Ca = 3 { ca: CaHandle },
        /// CA attributes.
        CaAttr = 4 { attr: CaAttr },
        /// Port attributes.
        PortAttr = 5 { attr: PortAttr },
        /// P_Key violations.
        PkeyViolations = 6 { v: Option<PkeyViolations> },
        /// A PD.
        Pd = 7 { pd: PdHandle },
        /// A CQ.
        Cq = 8 { cq: CqHandle },
        /// Completions polled.
        Wcs = 9 { wcs: Vec<WorkCompletion> },
        /// An SRQ.
        Srq = 10 { srq: SrqHandle },
        /// SRQ attributes.
        SrqAttr = 11 { attr: SrqAttr },
        /// A QP.
        Qp = 12 { qp: QpHandle },
        /// A QP number.
        Qpn = 13 { qpn: Qpn },
        /// QP attributes.
        QpAttr = 14 { attr: QpAttr },
        /// An AH.
        Ah = 15 { ah: AhHandle },
        /// A registration.
        Mr = 16 { info: MrInfo },
        /// A window and its first R_Key.
        Mw = 17 { mw: MwHandle, rkey: Rkey },
        /// An R_Key.
        Rkey = 18 { rkey: Rkey },
        /// The daemon's clients.
        Clients = 19 { clients: Vec<ClientReport> },
        /// Port attributes and the master SM's GID (`PortAttr::sm_gid`).
        PortSm = 20 { attr: PortAttr, sm_gid: Option<Gid> },
        /// A member of a shared port (its socket in the frame): the block
        /// of QP numbers it receives, `first_qpn..end_qpn`.
        SharedPort = 21 { block: u8, first_qpn: u32, end_qpn: u32 },
        /// What [`Request::LentPorts`] asked for.
        Lent = 22 { lent: Vec<LentPort> },
    }

    /// Daemon to client: a callback of the provider, for the handler of
    /// the client's CA `ca` (the CA handle the daemon gave).
    pub enum Event {
        /// `on_completion`.
        Completion = 0 { ca: CaHandle, cq_ctx: u64 },
        /// `on_async_event`.
        Async = 1 { ca: CaHandle, event: AsyncEvent },
        /// `on_destroyed`.
        Destroyed = 2 { ca: CaHandle, kind: ResourceKind, ctx: u64 },
        /// A MAD for the client's GSI QP `qp` (a receive on it): from the
        /// port at `sgid`, in the partition of P_Key index `pkey_index`.
        Mad = 3 { ca: CaHandle, qp: QpHandle, sgid: Gid, pkey_index: u16, mad: Vec<u8> },
    }
}

/// A response body: the reply or the verb's error.
pub type Answer = core::result::Result<Reply, VerbsError>;

impl Wire for Answer {
    fn put(&self, e: &mut Enc) {
        match self {
            Ok(r) => {
                e.0.push(0);
                r.put(e);
            }
            Err(v) => {
                e.0.push(1);
                v.put(e);
            }
        }
    }
    fn get(d: &mut Dec<'_>) -> PResult<Self> {
        Ok(match u8::get(d)? {
            0 => Ok(Reply::get(d)?),
            1 => Err(VerbsError::get(d)?),
            tag => {
                return Err(ProtoError::UnknownTag {
                    what: "answer",
                    tag,
                })
            }
        })
    }
}

/// A whole frame, length field included.
pub fn frame(kind: Kind, seq: u32, body: &impl Wire) -> Vec<u8> {
    let mut e = Enc(Vec::with_capacity(64));
    e.0.extend_from_slice(&[0; 4]);
    e.0.push(kind as u8);
    seq.put(&mut e);
    body.put(&mut e);
    let len = (e.0.len() - 4) as u32;
    e.0[..4].copy_from_slice(&len.to_le_bytes());
    e.0
}

/// A frame's kind, sequence number and body (after its length field).
///
/// # Errors
/// A frame shorter than its header or of an unknown kind.
pub fn split(frame: &[u8]) -> PResult<(Kind, u32, &[u8])> {
    if frame.len() < HEADER - 4 {
        return Err(ProtoError::FrameLength(frame.len()));
    }
    let kind = match frame[0] {
        1 => Kind::Request,
        2 => Kind::Response,
        3 => Kind::Event,
        tag => {
            return Err(ProtoError::UnknownTag {
                what: "frame kind",
                tag,
            })
        }
    };
    let seq = u32::from_le_bytes(frame[1..5].try_into().expect("sized"));
    Ok((kind, seq, &frame[5..]))
}

/// Decodes a whole body as one `T`.
///
/// # Errors
/// See [`ProtoError`].
pub fn decode<T: Wire>(body: &[u8]) -> PResult<T> {
    let mut d = Dec(body);
    let v = T::get(&mut d)?;
    d.finish()?;
    Ok(v)
}

#[cfg(test)]
mod tests;
